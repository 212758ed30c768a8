//! Tool results are compressed as they enter the history (cairn-sim as the model, moto as
//! the archive): a 2 MB log from a client's tool reaches the model compressed with every
//! error line, its original recallable byte for byte; a 10 MB result is cut to the
//! `maxResultBytes` ceiling on entry, so no request the model server records exceeds the
//! payload cap; the counters show both.

use cairn_agent::server::{AppState, router};
use cairn_sim::{ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;
use crate::support::moto::Moto;

/// 1 MiB: the request-body ceiling of the network path in this test.
const PAYLOAD_CAP: u64 = 1024 * 1024;

/// The agent's API with a body limit large enough for a 10 MB function output.
async fn serve_large(state: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router(state, 64 << 20)).await;
    });
    format!("http://{addr}")
}

fn bash_tool() -> Value {
    json!([{
        "type": "function",
        "name": "bash",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
    }])
}

/// A build log of at least `bytes`, with an error line every 4,001 lines.
fn build_log(bytes: usize) -> (String, Vec<String>) {
    let mut log = String::with_capacity(bytes + 200);
    let mut errors = Vec::new();
    let mut i = 0u64;
    while log.len() < bytes {
        log.push_str(&format!(
            "2026-01-01T10:{:02}:{:02}Z INFO  worker-{} step {i} finished in {} ms\n",
            i / 60 % 60,
            i % 60,
            i % 8,
            i % 97
        ));
        if i % 4_001 == 2_000 {
            let e = format!("2026-01-01T10:00:00Z ERROR test case_{i} failed: connection refused");
            log.push_str(&e);
            log.push('\n');
            errors.push(e);
        }
        i += 1;
    }
    (log, errors)
}

/// Runs one client tool round: the model calls `bash`, the client answers with `output`,
/// the model answers. Returns the call id.
async fn client_round(api: &Api, sim: &Sim, output: &str, answer: &str) -> String {
    sim.push_reply(ScriptedReply::tool_call(
        "bash",
        json!({"cmd": "make test"}),
    ));
    sim.push_reply(ScriptedReply::text(answer));
    let (status, first) = api
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": "run the tests", "tools": bash_tool()}),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    let call = first["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .unwrap_or_else(|| panic!("no function_call in {first}"))
        .clone();
    let call_id = call["call_id"].as_str().expect("call id").to_owned();
    let (status, second) = api
        .post(
            "/v1/responses",
            json!({"model": MODEL, "previous_response_id": first["id"], "tools": bash_tool(),
                   "input": [{"type": "function_call_output", "call_id": call_id, "output": output}]}),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(output_text(&second), answer);
    call_id
}

fn markers(text: &str) -> Vec<String> {
    cairn_agent::ccr::extract_markers(text)
        .iter()
        .map(|k| k.as_str().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tool_results_are_compressed_on_entry_and_never_break_the_payload_cap() {
    let sim = Sim::start().await.expect("sim");
    let moto = Moto::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), Some(&moto.endpoint));
    let yaml = config_yaml(
        "entry",
        &format!("{}/v1", sim.url()),
        1_000_000,
        &format!("payloadCap: {PAYLOAD_CAP}B\n"),
    );
    let built = build_session(&yaml, &env, "test").await;
    let api = Api::new(serve_large(AppState::new(built.session, TOKEN)).await);

    // A 2 MB log under the default policy: compressed on entry, every error line kept.
    let (log, errors) = build_log(2 * 1024 * 1024);
    assert!(errors.len() >= 5);
    client_round(&api, &sim, &log, "two tests failed").await;
    let reqs = sim.requests();
    let sent = &reqs[1];
    assert!(
        sent.bytes < 300 * 1024,
        "the request after the 2 MB log is {} bytes",
        sent.bytes
    );
    for e in &errors {
        assert!(sent.contains(e), "error line missing from the request: {e}");
    }
    let keys = markers(&sent.body);
    assert!(!keys.is_empty(), "the compressed log carries its marker");
    let (status, back) = api.get(&format!("/v1/recall/{}", keys[0])).await;
    assert_eq!(status, 200);
    assert_eq!(
        back,
        log.as_bytes(),
        "the original is recallable byte for byte"
    );

    // A 10 MB log: compressed on entry too; no request exceeds the cap.
    let (huge, _) = build_log(10_000_000);
    client_round(&api, &sim, &huge, "that was a long log").await;
    let reqs = sim.requests();
    assert_eq!(reqs.len(), 4);
    assert_under_cap(&sim);

    // The counters: bytes in and out per strategy.
    let session = api.session().await;
    let log_stats = &session["stats"]["compression"]["strategies"]["log"];
    assert_eq!(log_stats["compressed"].as_u64(), Some(2), "{session}");
    assert_eq!(
        log_stats["bytesIn"].as_u64(),
        Some((log.len() + huge.len()) as u64)
    );
    assert!(
        log_stats["bytesOut"].as_u64() < Some(300 * 1024),
        "{session}"
    );
}

fn assert_under_cap(sim: &Sim) {
    for r in &sim.requests() {
        assert!(
            r.bytes < PAYLOAD_CAP,
            "request {} is {} bytes, over the cap of {PAYLOAD_CAP}",
            r.seq,
            r.bytes
        );
        assert_eq!(r.outcome, "ok");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ceiling_cuts_a_10_mb_result_on_entry_even_with_compression_off() {
    let sim = Sim::start().await.expect("sim");
    let moto = Moto::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), Some(&moto.endpoint));
    let yaml = config_yaml(
        "ceiling",
        &format!("{}/v1", sim.url()),
        1_000_000,
        &format!("payloadCap: {PAYLOAD_CAP}B\ncompaction:\n  compression: {{mode: \"off\"}}\n"),
    );
    let built = build_session(&yaml, &env, "test").await;
    let api = Api::new(serve_large(AppState::new(built.session, TOKEN)).await);

    let huge: String = (0..640_000u64)
        .map(|i| format!("{:016x}\n", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    assert!(huge.len() >= 10_000_000);
    client_round(&api, &sim, &huge, "that was a lot of hex").await;
    assert_under_cap(&sim);
    let reqs = sim.requests();
    let last = &reqs[1];
    let head_line = huge.lines().next().expect("a line");
    assert!(last.contains(head_line), "the preview keeps the head");
    let keys = markers(&last.body);
    let mut recalled = false;
    for k in &keys {
        let (status, back) = api.get(&format!("/v1/recall/{k}")).await;
        recalled |= status == 200 && back == huge.as_bytes();
    }
    assert!(recalled, "the 10 MB original is recallable byte for byte");
    // The history holds the preview, not the 10 MB.
    let session = api.session().await;
    assert!(
        session["stats"]["historyBytes"].as_u64() < Some(300 * 1024),
        "{session}"
    );
    let ceiling = &session["stats"]["compression"]["strategies"]["ceiling"];
    assert_eq!(ceiling["compressed"].as_u64(), Some(1), "{session}");
    assert_eq!(ceiling["bytesIn"].as_u64(), Some(huge.len() as u64));
    assert!(ceiling["bytesOut"].as_u64() <= Some(256 * 1024));
}
