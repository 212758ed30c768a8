//! Shutdown is bounded: a SIGTERM while the provider stalls aborts the turn in flight before
//! the pod's grace period (`CAIRN_TERMINATION_GRACE_SECONDS`, which the operator sets to
//! the pod's `terminationGracePeriodSeconds`) runs out. The aborted turn is not
//! acknowledged (503 `shutting_down`) and its input is dropped from the journal, so the
//! restarted agent goes on from the last acknowledged turn.

use std::time::{Duration, Instant};

use cairn_sim::{Fault, ScriptedReply, Sim};
use serde_json::Value;

use crate::support::agent::*;

const GRACE_SECS: u64 = 8;

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
async fn sigterm_during_a_provider_stall_aborts_the_turn_within_the_grace_period() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("shutdown.yaml");
    std::fs::write(
        &config,
        config_yaml("shutdown", &format!("{}/v1", sim.url()), 200_000, ""),
    )
    .expect("config");
    let mut env = storage_env(&dir.path().join("data"), None);
    env.push((
        "CAIRN_TERMINATION_GRACE_SECONDS".into(),
        GRACE_SECS.to_string(),
    ));

    let mut agent = AgentProcess::start(&config, &env, &dir.path().join("first.log"));
    let api = agent.api();
    let (status, body) = api.turn("remember the tide tables").await;
    assert_eq!(status, 200, "{body}");

    // The provider goes silent for 90 s.
    sim.push_reply(ScriptedReply::text("never sent"));
    sim.push_fault(Fault::Latency { ms: 90_000 });
    let in_flight = {
        let api = api.clone();
        tokio::spawn(async move { api.turn("the stalled question").await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sim
        .requests()
        .iter()
        .any(|r| r.contains("the stalled question"))
    {
        assert!(
            Instant::now() < deadline,
            "the turn never reached the provider"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let signalled = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &agent.child.id().to_string()])
        .status();
    let exit = loop {
        if let Some(status) = agent.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(30),
            "the agent was still running 30 s after SIGTERM: {}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(GRACE_SECS),
        "the agent took {took:?} to exit, the grace period is {GRACE_SECS} s: {}",
        agent.log()
    );
    assert!(exit.success(), "{exit}: {}", agent.log());
    let (status, body) = in_flight.await.expect("client task");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");

    // The next incarnation continues from the last acknowledged turn.
    let second = AgentProcess::start(&config, &env, &dir.path().join("second.log"));
    let api = second.api();
    assert_eq!(api.session().await["stats"]["turns"], 1);
    sim.push_reply(ScriptedReply::text("ok"));
    let (status, body) = api.turn("what about the tides?").await;
    assert_eq!(status, 200, "{body}");
    let last = sim.requests().pop().expect("a request");
    assert!(last.contains("remember the tide tables"));
    assert!(
        !last.contains("the stalled question"),
        "the aborted turn's input is not part of the conversation"
    );
    let roles = roles(&last.body);
    assert!(
        !roles.windows(2).any(|w| w[0] == "user" && w[1] == "user"),
        "two user messages in a row: {roles:?}"
    );
}
