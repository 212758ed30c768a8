//! The HTTP server bounds what idle clients can hold: a connection must send its request
//! headers within the header timeout, which also bounds how long a kept-alive connection
//! may sit idle between requests, and the number of connections is limited, the oldest idle ones making room
//! for new ones. So with the agent at the usual fd limit of 1,024, 1,100 idle sockets do not
//! stop `/healthz` (the liveness probe) or the API from answering.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cairn_sim::Sim;

use crate::support::agent::*;

const IDLE_SOCKETS: usize = 1_100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_under_1100_idle_sockets_and_slow_headers_are_cut() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("limits.yaml");
    std::fs::write(
        &config,
        config_yaml("limits", &format!("{}/v1", sim.url()), 200_000, ""),
    )
    .expect("config");
    let mut env = storage_env(&dir.path().join("data"), None);
    env.push(("CAIRN_HTTP_HEADER_TIMEOUT_SECS".into(), "2".into()));
    // The agent runs with the fd limit most hosts give a process; the test itself keeps
    // its own (higher) limit for the client sockets.
    let agent = AgentProcess::start_wrapped(
        &config,
        &env,
        &dir.path().join("agent.log"),
        &["bash", "-c", "ulimit -n 1024 && exec \"$0\" \"$@\""],
    );
    let addr = agent.url.trim_start_matches("http://").to_owned();

    // 1,100 idle sockets that never send a byte.
    let addr_idle = addr.clone();
    let idle = tokio::task::spawn_blocking(move || {
        (0..IDLE_SOCKETS)
            .filter_map(|_| TcpStream::connect(&addr_idle).ok())
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    assert!(
        idle.len() >= 1_000,
        "only {} idle sockets connected",
        idle.len()
    );

    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .expect("client");
    for path in ["/healthz", "/v1/session"] {
        let started = Instant::now();
        let r = probe
            .get(format!("http://{addr}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{path} did not answer within {:?} under {} idle sockets: {e}",
                    started.elapsed(),
                    idle.len()
                )
            });
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let (status, body) = agent.api().turn("still there?").await;
    assert_eq!(status, 200, "{body}");
    drop(idle);

    // A client that sends half a request line and then nothing is cut off.
    let mut slow = TcpStream::connect(&addr).expect("connect");
    slow.write_all(b"GET /healthz HT").expect("write");
    slow.set_read_timeout(Some(Duration::from_secs(8)))
        .expect("timeout");
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let n = slow.read(&mut buf).unwrap_or_else(|e| {
        panic!(
            "a connection with incomplete headers was still open after {:?}: {e}",
            started.elapsed()
        )
    });
    assert!(
        n == 0 || String::from_utf8_lossy(&buf[..n]).contains(" 408 "),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // Closed by the 2 s header timeout (under 3x of it on a loaded machine), well before the
    // client's own 8 s read timeout.
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "{:?}",
        started.elapsed()
    );

    // A kept-alive connection that answered a request and then sits idle is closed too.
    let mut kept = TcpStream::connect(&addr).expect("connect");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
        .expect("write");
    kept.set_read_timeout(Some(Duration::from_secs(8)))
        .expect("timeout");
    let mut answer = Vec::new();
    while !String::from_utf8_lossy(&answer).ends_with("ok") {
        let n = kept.read(&mut buf).expect("the answer");
        assert!(n > 0, "closed before answering");
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    let idle_from = Instant::now();
    match kept.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) => panic!(
            "an idle kept-alive connection was still open after {:?}: {e}",
            idle_from.elapsed()
        ),
    }
    assert!(
        idle_from.elapsed() < Duration::from_secs(7),
        "{:?}",
        idle_from.elapsed()
    );
}
