//! What the gateway adds to a request, on loopback, against an in-process upstream that
//! answers at once (so the figures are the gateway's own cost, not a model's):
//!
//! - `gateway/non_streamed/{direct,through_gateway}` — one non-streamed
//!   `POST /v1/chat/completions` (a 1 KiB body each way), criterion's estimate; then p50 and
//!   p99 of 2,000 sequential requests each way and the difference.
//! - SSE pass-through: the upstream sends 200 deltas 2 ms apart, each carrying the time it was
//!   written; the client notes when it reads it. Per delta, the delivery time direct and
//!   through the gateway; the gateway's share is the difference (p50, p99).
//!
//! The gateway runs with a fixed table of sessions ([`StaticDirectory`]): authentication
//! (the constant-time token compare, the cached token) and forwarding are the production
//! code; only the reflector lookup is a table lookup instead.
//!
//! `cargo bench -p cairn-gateway --bench forward`

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use cairn_gateway::config::Settings;
use cairn_gateway::directory::{Directory, StaticDirectory};
use cairn_gateway::server::Gateway;
use criterion::Criterion;
use futures::StreamExt;

const TOKEN: &str = "bench-token-0123456789";

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn micros_since_epoch() -> u64 {
    epoch().elapsed().as_micros() as u64
}

async fn upstream() -> String {
    let reply = format!(
        r#"{{"id":"c1","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"{}"}},"finish_reason":"stop"}}]}}"#,
        "x".repeat(1024)
    );
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(move |_b: axum::body::Bytes| {
                let reply = reply.clone();
                async move { ([("content-type", "application/json")], reply) }
            }),
        )
        .route(
            "/v1/responses",
            post(|| async {
                let s = futures::stream::unfold(0u32, |n| async move {
                    if n == 200 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    let ev = format!("data: {}\n\n", micros_since_epoch());
                    Some((Ok::<_, std::io::Error>(ev), n + 1))
                });
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(s))
                    .unwrap_or_default()
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

async fn gateway(upstream: &str) -> String {
    let dir: Arc<dyn Directory> = Arc::new(StaticDirectory::new([(
        "ns".to_string(),
        "s".to_string(),
        upstream.to_string(),
        TOKEN.to_string(),
    )]));
    let gw = Gateway::new(dir, Settings::default(), None, None).expect("gateway");
    let api = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/ns/s", api.local_addr().expect("addr"));
    tokio::spawn(cairn_gateway::run::serve(
        gw,
        api,
        metrics,
        std::future::pending(),
    ));
    url
}

fn body() -> String {
    format!(
        r#"{{"model":"m-1","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "y".repeat(1024)
    )
}

async fn one(http: &reqwest::Client, base: &str, body: &str) {
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await.expect("body");
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn latencies(http: &reqwest::Client, base: &str, n: usize) -> Vec<f64> {
    let body = body();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        one(http, base, &body).await;
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    v.sort_by(f64::total_cmp);
    v
}

/// Per delta: milliseconds from the upstream writing it to the client reading it.
async fn deliveries(http: &reqwest::Client, base: &str) -> Vec<f64> {
    let r = http
        .post(format!("{base}/v1/responses"))
        .bearer_auth(TOKEN)
        .body("{}")
        .send()
        .await
        .expect("send");
    let mut s = r.bytes_stream();
    let mut v = Vec::new();
    let mut buf = String::new();
    while let Some(chunk) = s.next().await {
        let now = micros_since_epoch();
        buf.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        while let Some(end) = buf.find("\n\n") {
            let ev: String = buf.drain(..end + 2).collect();
            if let Some(sent) = ev
                .trim()
                .strip_prefix("data: ")
                .and_then(|t| t.parse::<u64>().ok())
            {
                v.push(now.saturating_sub(sent) as f64 / 1000.0);
            }
        }
    }
    v
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (direct, through) = rt.block_on(async {
        let up = upstream().await;
        let gw = gateway(&up).await;
        (up, gw)
    });
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .expect("client");
    // Warm both connection pools.
    rt.block_on(async {
        latencies(&http, &direct, 50).await;
        latencies(&http, &through, 50).await;
    });

    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(5));
    let mut g = c.benchmark_group("gateway/non_streamed");
    let b = body();
    g.bench_function("direct", |bn| {
        bn.iter(|| rt.block_on(one(&http, &direct, &b)))
    });
    g.bench_function("through_gateway", |bn| {
        bn.iter(|| rt.block_on(one(&http, &through, &b)))
    });
    g.finish();

    let (d, t) = rt.block_on(async {
        (
            latencies(&http, &direct, 2000).await,
            latencies(&http, &through, 2000).await,
        )
    });
    println!(
        "non-streamed, 2000 requests each: direct p50 {:.3} ms p99 {:.3} ms; through the gateway p50 {:.3} ms p99 {:.3} ms; added p50 {:.3} ms p99 {:.3} ms",
        percentile(&d, 0.5),
        percentile(&d, 0.99),
        percentile(&t, 0.5),
        percentile(&t, 0.99),
        percentile(&t, 0.5) - percentile(&d, 0.5),
        percentile(&t, 0.99) - percentile(&d, 0.99),
    );

    let (mut d, mut t) = rt.block_on(async {
        (
            deliveries(&http, &direct).await,
            deliveries(&http, &through).await,
        )
    });
    d.sort_by(f64::total_cmp);
    t.sort_by(f64::total_cmp);
    println!(
        "SSE, {} / {} deltas: delivery direct p50 {:.3} ms p99 {:.3} ms; through the gateway p50 {:.3} ms p99 {:.3} ms; the gateway's share p50 {:.3} ms p99 {:.3} ms",
        d.len(),
        t.len(),
        percentile(&d, 0.5),
        percentile(&d, 0.99),
        percentile(&t, 0.5),
        percentile(&t, 0.99),
        percentile(&t, 0.5) - percentile(&d, 0.5),
        percentile(&t, 0.99) - percentile(&d, 0.99),
    );
    c.final_summary();
}
