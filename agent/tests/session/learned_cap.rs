//! A learned payload cap has a way back: a rejection too small to be a body-size limit is a
//! floor diagnosis and teaches nothing; a changed `spec.payloadCap` resets what was learned;
//! `POST /v1/session/reset-payload-cap` and `cairn-agent reset-payload-cap` reset it by
//! hand (journaled, so a restart keeps the reset). The tool-result budgets that recovery
//! halved are restored once the recovered turn succeeded.

use std::sync::Arc;

use cairn_agent::config::{ConfigFile, Live};
use cairn_agent::history::Message;
use cairn_agent::server::AppState;
use cairn_sim::{Fault, ScriptedReply, Sim};
use serde_json::json;

use crate::support::agent::*;

fn rejected() -> Fault {
    Fault::Status {
        status: 413,
        retry_after: None,
    }
}

/// A 30 KB question: a rejection of it is plausible evidence of a body-size limit.
fn big_question(tag: &str) -> String {
    let mut s = format!("{tag}: please summarise these rows.\n");
    let mut i = 0;
    while s.len() < 30_000 {
        s.push_str(&format!("row {i}: {}\n", i * 7919 % 100_003));
        i += 1;
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_of_a_tiny_request_is_a_floor_diagnosis_not_a_cap() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("tiny", &format!("{}/v1", sim.url()), 100_000, "");
    let mut s = build_session(&yaml, &env, "a").await.session;
    sim.push_fault(rejected());
    let r = s.turn(vec![Message::user("a short question")]).await;
    let request = sim.requests()[0].bytes;
    assert!(request < 4_000, "the rejected request was {request} bytes");
    assert_eq!(
        s.stats().learned_payload_cap,
        None,
        "a {request}-byte rejection taught a cap ({r:?})"
    );
    match r {
        Err(e) => assert_eq!(e.label(), "floor", "{e}"),
        Ok(o) => panic!("expected a floor diagnosis, the turn answered {o:?}"),
    }
    // Later turns are not compacted down to a bogus cap.
    sim.push_reply(ScriptedReply::text("fine"));
    let out = s.turn(vec![Message::user("again")]).await.expect("turn");
    assert!(
        out.notices.iter().all(|n| n.kind != "compaction"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_budgets_come_back_and_a_changed_spec_cap_resets_the_learned_one() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let base_url = format!("{}/v1", sim.url());
    let yaml = config_yaml("spec", &base_url, 100_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let mut s = built.session;

    sim.push_fault(rejected());
    sim.push_reply(ScriptedReply::text("recovered"));
    let out = s
        .turn(vec![Message::user(big_question("t1"))])
        .await
        .expect("recovered turn");
    assert_eq!(out.text, "recovered");
    assert!(
        out.notices.iter().any(|n| n.kind == "learned_cap"),
        "{out:?}"
    );
    let learned = s.stats().learned_payload_cap.expect("a cap was learned");
    assert_eq!(
        s.state().tool_budget_halvings,
        0,
        "the halved tool-result budgets stay halved after the recovery succeeded"
    );

    // The platform team sets spec.payloadCap: what was learned under the old setting goes.
    let cfg = ConfigFile::parse(
        &config_yaml("spec", &base_url, 100_000, "payloadCap: 1MB\n"),
        "test",
    )
    .expect("config");
    let live = Live::resolve(&cfg.spec, cfg.policy.as_ref(), None).expect("live");
    built.live_tx.send_replace(Arc::new(live));
    sim.push_reply(ScriptedReply::text("next"));
    let out = s.turn(vec![Message::user("next")]).await.expect("turn");
    assert_eq!(
        s.stats().learned_payload_cap,
        None,
        "the cap of {learned} learned before spec.payloadCap changed is still in force"
    );
    assert!(
        out.notices
            .iter()
            .any(|n| n.kind == "learned_cap" && n.message.contains("reset")),
        "{out:?}"
    );
    drop(s);
    let again = build_session(
        &config_yaml("spec", &base_url, 100_000, "payloadCap: 1MB\n"),
        &env,
        "b",
    )
    .await
    .session;
    assert_eq!(
        again.stats().learned_payload_cap,
        None,
        "the reset is journaled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_cap_changed_while_the_agent_was_down_resets_the_learned_one() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let base_url = format!("{}/v1", sim.url());
    let mut s = build_session(&config_yaml("down", &base_url, 100_000, ""), &env, "a")
        .await
        .session;
    sim.push_fault(rejected());
    sim.push_reply(ScriptedReply::text("recovered"));
    s.turn(vec![Message::user(big_question("t1"))])
        .await
        .expect("recovered turn");
    let learned = s.stats().learned_payload_cap.expect("a cap was learned");
    drop(s);

    // The same setting at the restart: the learned cap stays.
    let s = build_session(&config_yaml("down", &base_url, 100_000, ""), &env, "b")
        .await
        .session;
    assert_eq!(s.stats().learned_payload_cap, Some(learned));
    drop(s);

    // The platform team set spec.payloadCap while no agent ran.
    let yaml = config_yaml("down", &base_url, 100_000, "payloadCap: 1MB\n");
    let mut s = build_session(&yaml, &env, "c").await.session;
    assert_eq!(
        s.stats().learned_payload_cap,
        None,
        "the cap of {learned} bytes learned under the old setting survived the restart"
    );
    sim.push_reply(ScriptedReply::text("next"));
    let out = s.turn(vec![Message::user("next")]).await.expect("turn");
    assert!(
        out.notices
            .iter()
            .any(|n| n.kind == "learned_cap" && n.message.contains("reset")),
        "the reset is told with the next turn: {out:?}"
    );
    drop(s);
    let s = build_session(&yaml, &env, "d").await.session;
    assert_eq!(
        s.stats().learned_payload_cap,
        None,
        "the reset is journaled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_learned_cap_is_reset_through_the_api_and_the_cli() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let base_url = format!("{}/v1", sim.url());
    let yaml = config_yaml("reset", &base_url, 100_000, "");

    // Through the API.
    let built = build_session(&yaml, &env, "a").await;
    let state = AppState::new(built.session, TOKEN);
    let api = Api::new(serve(state.clone()).await);
    sim.push_fault(rejected());
    let (status, body) = api.turn(&big_question("t1")).await;
    assert_eq!(status, 200, "{body}");
    let learned = api.session().await["stats"]["learnedPayloadCap"].clone();
    assert!(learned.is_u64(), "{learned}");
    let (status, body) = api.post("/v1/session/reset-payload-cap", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["previous"], learned, "{body}");
    assert_eq!(body["learnedPayloadCap"], json!(null), "{body}");
    assert_eq!(
        api.session().await["stats"]["learnedPayloadCap"],
        json!(null)
    );
    drop(state);
    drop(api);

    // Learn one again, then reset it with the CLI on the session's journal.
    let mut s = build_session(&yaml, &env, "b").await.session;
    assert_eq!(
        s.stats().learned_payload_cap,
        None,
        "the API reset is journaled"
    );
    sim.push_fault(rejected());
    s.turn(vec![Message::user(big_question("t2"))])
        .await
        .expect("recovered");
    assert!(s.stats().learned_payload_cap.is_some());
    drop(s);
    let config = dir.path().join("reset.yaml");
    std::fs::write(&config, &yaml).expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cairn-agent"))
        .args(["reset-payload-cap", "--config"])
        .arg(&config)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("cairn-agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = build_session(&yaml, &env, "c").await.session;
    assert_eq!(
        s.stats().learned_payload_cap,
        None,
        "the CLI reset is journaled"
    );
}
