//! The agent's HTTP listener: the axum router behind hyper, with the bounds `axum::serve`
//! does not set. Idle clients cannot hold the agent: a connection must send its request
//! headers within [`Limits::header_timeout`] of becoming idle (on a new connection and
//! between two requests of a kept-alive one: hyper runs one timer for both), and at most
//! [`Limits::max_connections`] connections are kept. At the limit a new connection closes
//! the one idle longest (no request in flight, no response still streaming); when every
//! connection is busy, the new one is refused. So a liveness probe still gets through when
//! a thousand idle sockets would otherwise exhaust the process's file descriptors.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Default of `CAIRN_HTTP_HEADER_TIMEOUT_SECS`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `CAIRN_HTTP_MAX_CONNECTIONS`: well under the usual fd limit of 1,024, which
/// the agent also needs for S3, the provider and its files.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Pause after a failed `accept` (out of file descriptors, typically) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Bounds of the listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest a connection may take to send a request's headers after it became idle; it
    /// also closes kept-alive connections idle that long.
    pub header_timeout: Duration,
    /// Connections kept at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// A limit variable that is set but not a positive number.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{name} must be a positive integer, not {value:?}")]
pub struct LimitsError {
    pub name: &'static str,
    pub value: String,
}

impl Limits {
    /// `CAIRN_HTTP_HEADER_TIMEOUT_SECS` and `CAIRN_HTTP_MAX_CONNECTIONS`, defaults filled in.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Self, LimitsError> {
        let positive = |name: &'static str| -> Result<Option<u64>, LimitsError> {
            match env(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Some(n)),
                    _ => Err(LimitsError { name, value: v }),
                },
            }
        };
        let d = Self::default();
        Ok(Self {
            header_timeout: positive("CAIRN_HTTP_HEADER_TIMEOUT_SECS")?
                .map_or(d.header_timeout, Duration::from_secs),
            max_connections: positive("CAIRN_HTTP_MAX_CONNECTIONS")?
                .map_or(d.max_connections, |n| {
                    usize::try_from(n).unwrap_or(usize::MAX)
                }),
        })
    }
}

/// One open connection as the limit sees it.
struct Conn {
    /// Requests whose response has not been sent completely.
    in_flight: AtomicUsize,
    /// Milliseconds since the listener started at which the connection last became idle.
    idle_since_ms: AtomicU64,
    /// Fired to close the connection at once (evicted).
    close: CancellationToken,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    conns: HashMap<u64, Arc<Conn>>,
}

struct Shared {
    registry: Mutex<Registry>,
    started: Instant,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // The map stays consistent under a panic elsewhere: it only holds Arcs.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Closes the connection idle longest; false when every connection is busy.
    fn evict_oldest_idle(&self) -> bool {
        let registry = self.lock();
        let oldest = registry
            .conns
            .values()
            .filter(|c| c.in_flight.load(Ordering::SeqCst) == 0 && !c.close.is_cancelled())
            .min_by_key(|c| c.idle_since_ms.load(Ordering::SeqCst));
        match oldest {
            Some(c) => {
                c.close.cancel();
                true
            }
            None => false,
        }
    }

    /// Open connections not already being closed.
    fn open(&self) -> usize {
        self.lock()
            .conns
            .values()
            .filter(|c| !c.close.is_cancelled())
            .count()
    }
}

/// Counts a request as in flight until its response body is dropped (sent or abandoned).
struct InFlight {
    conn: Arc<Conn>,
    shared: Arc<Shared>,
}

impl InFlight {
    fn new(conn: Arc<Conn>, shared: Arc<Shared>) -> Self {
        conn.in_flight.fetch_add(1, Ordering::SeqCst);
        Self { conn, shared }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .idle_since_ms
            .store(self.shared.now_ms(), Ordering::SeqCst);
        self.conn.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request counted as in flight while it streams.
struct Tracked {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting, lets the
/// open connections finish their requests and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared {
        registry: Mutex::new(Registry::default()),
        started: Instant::now(),
    });
    let graceful = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors (or a connection reset before it was taken): make
                // room and try again rather than stop serving.
                tracing::warn!(error = %e, "accepting a connection");
                shared.evict_oldest_idle();
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if shared.open() >= limits.max_connections && !shared.evict_oldest_idle() {
            tracing::warn!(
                limit = limits.max_connections,
                "connection limit reached and every connection is busy; refusing a connection"
            );
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let conn = Arc::new(Conn {
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(shared.now_ms()),
            close: CancellationToken::new(),
        });
        let id = {
            let mut r = shared.lock();
            r.next_id += 1;
            let id = r.next_id;
            r.conns.insert(id, Arc::clone(&conn));
            id
        };
        let shared = Arc::clone(&shared);
        let router = router.clone();
        let graceful = graceful.clone();
        tasks.spawn(async move {
            serve_connection(stream, router, limits, &conn, &shared, &graceful).await;
            shared.lock().conns.remove(&id);
        });
    }
    drop(listener);
    graceful.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    router: Router,
    limits: Limits,
    conn: &Arc<Conn>,
    shared: &Arc<Shared>,
    graceful: &CancellationToken,
) {
    let service = {
        let conn = Arc::clone(conn);
        let shared = Arc::clone(shared);
        tower::service_fn(move |request: hyper::Request<Incoming>| {
            let guard = InFlight::new(Arc::clone(&conn), Arc::clone(&shared));
            let router = router.clone();
            async move {
                let response = router.oneshot(request).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(Tracked {
                        inner: body,
                        _guard: guard,
                    })
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let connection =
        builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        r = connection.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "connection ended");
            }
        }
        () = conn.close.cancelled() => {}
        () = graceful.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection.as_mut() => {}
                () = conn.close.cancelled() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_from_the_environment() {
        assert_eq!(Limits::from_env(|_| None), Ok(Limits::default()));
        let l = Limits::from_env(|k| match k {
            "CAIRN_HTTP_HEADER_TIMEOUT_SECS" => Some("5".into()),
            "CAIRN_HTTP_MAX_CONNECTIONS" => Some("64".into()),
            _ => None,
        })
        .expect("valid");
        assert_eq!(
            (l.header_timeout, l.max_connections),
            (Duration::from_secs(5), 64)
        );
        for bad in ["0", "-1", "ten"] {
            let e = Limits::from_env(|k| (k == "CAIRN_HTTP_MAX_CONNECTIONS").then(|| bad.into()));
            assert!(e.is_err(), "{bad}");
        }
    }
}
