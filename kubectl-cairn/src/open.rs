//! `kubectl cairn open`: the session page on a loopback port. Each request the browser makes
//! goes to the agent through its own port-forward, with the session's token added here, so
//! the browser never holds the token and a caller the cluster denies the token Secret gets no
//! page at all. Only the page and the read-only routes it uses pass ([`page_request`]); a
//! request naming another host (a DNS-rebinding page in the same browser) is refused. The
//! page's fleet list (`/v1/fleet`) is answered here, not by the agent: the sessions of the
//! namespace as the caller's own credentials may list them (none for a caller who may not).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use cairn_crds::session::AgentSession;
use kube::Api;
use serde_json::{Value, json};

use crate::{AgentRequest, Attempt, Cluster, Error, Target};

/// Why a browser request is not passed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not `127.0.0.1:PORT` or `localhost:PORT`.
    Host,
    /// Not GET.
    Method,
    /// Not the page or a route it reads.
    Route,
}

impl Refusal {
    fn status(self) -> u16 {
        match self {
            Self::Host => 403,
            Self::Method => 405,
            Self::Route => 404,
        }
    }

    fn message(self) -> &'static str {
        match self {
            Self::Host => "kubectl cairn open answers only for 127.0.0.1 and localhost",
            Self::Method => "kubectl cairn open passes only GET requests",
            Self::Route => "kubectl cairn open passes only the session page and what it reads",
        }
    }
}

/// What a browser request that passes is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageRoute {
    /// A request to the session's agent.
    Agent(AgentRequest),
    /// The fleet list, answered with the caller's credentials.
    Fleet,
}

/// What a browser's `method path` (path and query) sent with `Host: host` to the local
/// `port` is for: the page (`/` is the page too), the session, its context report or a
/// `why`, and a recall go to the agent; `/v1/fleet` is the fleet list.
pub fn page_request(
    method: &http::Method,
    path: &str,
    host: Option<&str>,
    port: u16,
) -> Result<PageRoute, Refusal> {
    let local = [format!("127.0.0.1:{port}"), format!("localhost:{port}")];
    if !host.is_some_and(|h| local.iter().any(|l| l == h)) {
        return Err(Refusal::Host);
    }
    if method != http::Method::GET {
        return Err(Refusal::Method);
    }
    let route = path.split('?').next().unwrap_or_default();
    let path = match route {
        "/v1/fleet" => return Ok(PageRoute::Fleet),
        "/" => "/ui",
        "/ui" | "/v1/session" | "/v1/session/context" => path,
        r if r.starts_with("/v1/recall/") && !r["/v1/recall/".len()..].contains('/') => path,
        _ => return Err(Refusal::Route),
    };
    Ok(PageRoute::Agent(AgentRequest {
        method: http::Method::GET,
        path: path.to_owned(),
        body: None,
    }))
}

/// One session of the fleet list: what its status says.
fn fleet_row(s: &AgentSession) -> Value {
    let status = s.status.as_ref();
    let stats = status.and_then(|st| st.session.as_ref());
    json!({
        "name": s.metadata.name,
        "phase": status.and_then(|st| st.phase).map(|p| p.as_str()),
        "turns": stats.map(|x| x.turns),
        "utilization": stats.map(|x| x.utilization),
        "historyBytes": stats.map(|x| x.history_bytes),
        "compactions": stats.map(|x| x.compactions),
        "recoveries": stats.map(|x| x.recoveries),
    })
}

/// The agent's headers the browser needs (the page's type and policy).
const PASSED: [http::HeaderName; 5] = [
    http::header::CONTENT_TYPE,
    http::header::CONTENT_SECURITY_POLICY,
    http::header::X_CONTENT_TYPE_OPTIONS,
    http::header::REFERRER_POLICY,
    http::header::CACHE_CONTROL,
];

impl Cluster {
    /// Serves the page of the session `target` names ([`Cluster::target`]: a caller who
    /// cannot read the session or its token gets no page) on `listener` until the process
    /// ends.
    pub async fn serve_page(
        self,
        target: Target,
        listener: tokio::net::TcpListener,
    ) -> Result<(), Error> {
        let port = listener
            .local_addr()
            .map_err(|e| Error::Config(format!("the local port: {e}")))?
            .port();
        let shared = Arc::new((self, target));
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                let service = service_fn(move |request: http::Request<Incoming>| {
                    let shared = Arc::clone(&shared);
                    async move {
                        let (cluster, target) = &*shared;
                        Ok::<_, Infallible>(cluster.answer(target, port, &request).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    /// The sessions of `namespace` as the caller may list them.
    async fn fleet(&self, namespace: &str) -> Result<Value, Error> {
        let sessions: Api<AgentSession> = Api::namespaced(self.client.clone(), namespace);
        let list = sessions
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| {
                Error::from_kube(
                    e,
                    Attempt {
                        verb: "list",
                        resource: "agentsessions.cairn.dev",
                        namespace,
                        name: "",
                    },
                )
            })?;
        Ok(json!({
            "namespace": namespace,
            "sessions": list.items.iter().map(fleet_row).collect::<Vec<_>>(),
        }))
    }

    async fn answer<B>(
        &self,
        target: &Target,
        port: u16,
        request: &http::Request<B>,
    ) -> http::Response<Full<Bytes>> {
        let host = request
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok());
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
        let plain = |status: u16, text: String| {
            let mut r = http::Response::new(Full::new(Bytes::from(text)));
            *r.status_mut() =
                http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        };
        let agent_request = match page_request(request.method(), path, host, port) {
            Ok(PageRoute::Agent(r)) => r,
            Ok(PageRoute::Fleet) => {
                return match self.fleet(&target.namespace).await {
                    Ok(fleet) => {
                        let mut r = http::Response::new(Full::new(Bytes::from(fleet.to_string())));
                        r.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/json"),
                        );
                        r
                    }
                    Err(e @ (Error::Forbidden { .. } | Error::Unauthenticated(_))) => {
                        plain(403, format!("kubectl cairn: {e}"))
                    }
                    Err(e) => plain(502, format!("kubectl cairn: {e}")),
                };
            }
            Err(refusal) => return plain(refusal.status(), refusal.message().to_owned()),
        };
        match self.exchange(target, &agent_request).await {
            Ok(answer) => {
                let mut r = http::Response::new(Full::new(answer.body));
                *r.status_mut() = http::StatusCode::from_u16(answer.status)
                    .unwrap_or(http::StatusCode::BAD_GATEWAY);
                for name in PASSED {
                    if let Some(v) = answer.headers.get(&name) {
                        r.headers_mut().insert(name, v.clone());
                    }
                }
                r
            }
            Err(e) => plain(502, format!("kubectl cairn: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: http::Method = http::Method::GET;

    #[test]
    fn only_the_page_and_its_read_routes_pass_for_the_local_host() {
        let host = Some("127.0.0.1:8123");
        let path = |p: &str| match page_request(&GET, p, host, 8123) {
            Ok(PageRoute::Agent(r)) => Ok(r.path),
            Ok(PageRoute::Fleet) => Ok("fleet".into()),
            Err(e) => Err(e),
        };
        assert_eq!(path("/").as_deref(), Ok("/ui"));
        assert_eq!(path("/ui").as_deref(), Ok("/ui"));
        assert_eq!(path("/v1/fleet").as_deref(), Ok("fleet"));
        assert_eq!(path("/v1/session").as_deref(), Ok("/v1/session"));
        assert_eq!(
            path("/v1/session/context?why=src%2Fa.rs").as_deref(),
            Ok("/v1/session/context?why=src%2Fa.rs")
        );
        assert_eq!(
            path("/v1/recall/0123456789abcdef").as_deref(),
            Ok("/v1/recall/0123456789abcdef")
        );
        for refused in [
            "/v1/responses",
            "/v1/session/compact",
            "/v1/session/rewind",
            "/v1/recall/a/b",
            "/metrics",
        ] {
            assert_eq!(path(refused), Err(Refusal::Route), "{refused}");
        }
        assert_eq!(
            page_request(&http::Method::POST, "/v1/session", host, 8123),
            Err(Refusal::Method)
        );
        assert!(matches!(
            page_request(&GET, "/ui", Some("localhost:8123"), 8123),
            Ok(PageRoute::Agent(r)) if r.path == "/ui"
        ));
        assert_eq!(
            page_request(&GET, "/v1/fleet", Some("evil.example:8123"), 8123),
            Err(Refusal::Host)
        );
        for host in [None, Some("evil.example:8123"), Some("127.0.0.1:9999")] {
            assert_eq!(
                page_request(&GET, "/ui", host, 8123),
                Err(Refusal::Host),
                "{host:?}"
            );
        }
    }
}
