//! A client of a non-streamed turn that goes away mid-turn does not cancel the turn: it runs
//! to the end and is journaled, as a streamed turn is. The next provider request therefore
//! carries the earlier question and its answer, never two user messages in a row.

use std::time::{Duration, Instant};

use cairn_agent::server::AppState;
use cairn_sim::{Fault, ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;

/// Roles of the messages of a recorded Chat Completions request.
fn roles(body: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(body).expect("request JSON");
    v["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streamed_turn_whose_client_left_is_finished_and_journaled() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("gone", &format!("{}/v1", sim.url()), 100_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let base = serve(AppState::new(built.session, TOKEN)).await;
    let api = Api::new(base.clone());

    // The provider takes 1.5 s; the client gives up after 300 ms and closes the connection.
    sim.push_reply(ScriptedReply::text("the first answer"));
    sim.push_fault(Fault::Latency { ms: 1_500 });
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let gone = impatient
        .post(format!("{base}/v1/responses"))
        .bearer_auth(TOKEN)
        .json(&json!({"model": MODEL, "input": "first question"}))
        .send()
        .await;
    assert!(gone.is_err(), "the client was meant to time out");

    // The turn goes on without its client and releases the session when it is journaled.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = api.session().await;
        if s["status"] == "idle" && s["stats"]["turns"] == json!(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned turn never finished: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    sim.push_reply(ScriptedReply::text("the second answer"));
    let (status, body) = api.turn("second question").await;
    assert_eq!(status, 200, "{body}");
    let last = sim.requests().pop().expect("a request");
    assert!(
        last.contains("first question") && last.contains("the first answer"),
        "the abandoned turn is part of the conversation"
    );
    let roles = roles(&last.body);
    assert!(
        !roles.windows(2).any(|w| w[0] == "user" && w[1] == "user"),
        "two user messages in a row: {roles:?}"
    );
    assert_eq!(api.session().await["stats"]["turns"], json!(2));
}
