//! The gateway's own HTTP behaviour against a local upstream server: a stream in flight at
//! SIGTERM time is finished before the gateway exits, the body limit answers 413 without
//! reaching the session, the session's token replaces the caller's bearer upstream and
//! hop-by-hop headers stay on their hop. The sessions come from a fixed table
//! (`StaticDirectory`); the cluster tests cover the reflector.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use cairn_gateway::config::Settings;
use cairn_gateway::directory::{Directory, StaticDirectory};
use cairn_gateway::server::Gateway;
use futures::StreamExt;

const TOKEN: &str = "session-token-42";

type Seen = Arc<Mutex<Vec<HeaderMap>>>;

async fn upstream(seen: Seen) -> String {
    let app = Router::new()
        .route(
            "/v1/responses",
            post(|| async {
                // Five events 300 ms apart: a stream still running when SIGTERM arrives.
                let s = futures::stream::unfold(0u32, |n| async move {
                    if n == 5 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Some((Ok::<_, std::io::Error>(format!("data: {n}\n\n")), n + 1))
                });
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(s))
                    .unwrap_or_default()
            }),
        )
        .route(
            "/v1/session",
            get(move |h: HeaderMap| {
                let seen = Arc::clone(&seen);
                async move {
                    if let Ok(mut s) = seen.lock() {
                        s.push(h);
                    }
                    (
                        [("connection", "x-upstream-hop"), ("x-upstream-hop", "1")],
                        "{}",
                    )
                }
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_stream_in_flight_and_limits_and_headers_hold() {
    let seen: Seen = Arc::default();
    let up = upstream(Arc::clone(&seen)).await;
    let dir: Arc<dyn Directory> = Arc::new(StaticDirectory::new([(
        "ns".to_string(),
        "s".to_string(),
        up,
        TOKEN.to_string(),
    )]));
    let settings = Settings {
        max_body_bytes: 1024,
        ..Settings::default()
    };
    let gw = Gateway::new(dir, settings, None, None).expect("gateway");
    let api = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}/ns/s/v1", api.local_addr().expect("addr"));
    let mbase = format!("http://{}", metrics.local_addr().expect("addr"));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cairn_gateway::run::serve(
        Arc::clone(&gw),
        api,
        metrics,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let http = reqwest::Client::new();
    let ready = http
        .get(format!("{mbase}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);

    // The caller's bearer is replaced by the session's; hop-by-hop headers stay behind.
    let r = http
        .get(format!("{base}/session"))
        .bearer_auth(TOKEN)
        .header("connection", "x-caller-hop")
        .header("x-caller-hop", "1")
        .header("x-end-to-end", "1")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers().get("x-upstream-hop").is_none(),
        "{:?}",
        r.headers()
    );
    let h = seen.lock().expect("seen")[0].clone();
    assert_eq!(
        h.get("authorization").and_then(|v| v.to_str().ok()),
        Some("Bearer session-token-42")
    );
    assert!(h.get("x-caller-hop").is_none(), "{h:?}");
    assert_eq!(
        h.get("x-end-to-end").and_then(|v| v.to_str().ok()),
        Some("1")
    );

    // Over the body limit: 413 in the OpenAI shape, the session never sees it.
    let r = http
        .post(format!("{base}/chat/completions"))
        .bearer_auth(TOKEN)
        .body("x".repeat(4096))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 413);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "request_too_large", "{body}");

    // A stream in flight when the shutdown starts is finished, then the gateway exits.
    let r = http
        .post(format!("{base}/responses"))
        .bearer_auth(TOKEN)
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()
            .get("x-accel-buffering")
            .and_then(|v| v.to_str().ok()),
        Some("no")
    );
    let mut stream = r.bytes_stream();
    let first = stream.next().await.expect("first event").expect("bytes");
    assert_eq!(&first[..], b"data: 0\n\n");
    assert!(stop_tx.send(()).is_ok());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(gw.shutting_down.load(std::sync::atomic::Ordering::Relaxed));
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.expect("the stream is not cut"));
    }
    assert_eq!(
        String::from_utf8_lossy(&rest),
        "data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n"
    );
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the gateway exits after draining")
        .expect("join")
        .expect("serve");
    assert!(
        http.get(format!("{mbase}/readyz")).send().await.is_err(),
        "no longer listening"
    );
}
