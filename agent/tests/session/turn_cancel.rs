//! A turn cancelled while its request is with the provider (the caller went away, the process
//! is shutting down) leaves the session's history whole: each request is sent from the
//! history itself with that request's tool-result cuts, and those are undone even when the
//! call never returns.

use std::time::Duration;

use cairn_agent::history::{Message, ToolCall};
use cairn_sim::{Fault, ScriptedReply, Sim};

use crate::support::agent::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_cancelled_mid_call_leaves_the_history_whole() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("cancel", &format!("{}/v1", sim.url()), 200_000, "");
    let mut session = build_session(&yaml, &env, "a").await.session;

    // A recent 50 KB tool result: over the default 20,000-char per-result budget, so every
    // request carries it cut to a preview, while the history keeps it whole.
    let full: String = (0..2_000)
        .map(|i| format!("line {i:05} of the build log\n"))
        .collect();
    session
        .replace_history(vec![
            Message::system("You are a test agent."),
            Message::user("build it"),
            Message::assistant_calls(
                "",
                vec![ToolCall {
                    id: "c1".into(),
                    name: "bash".into(),
                    arguments: r#"{"command":"make"}"#.into(),
                }],
            ),
            Message::tool("c1", full.clone()),
        ])
        .await
        .expect("seed");

    sim.push_reply(ScriptedReply::text("never seen"));
    sim.push_fault(Fault::Stall { ms: 5_000 });
    let cancelled = tokio::time::timeout(
        Duration::from_millis(700),
        session.turn(vec![Message::user("q1")]),
    )
    .await;
    assert!(cancelled.is_err(), "the turn should still be waiting");
    let sent = sim.requests();
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].bytes < full.len() as u64,
        "the request carried the cut result"
    );
    let tool = session
        .history()
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("c1"))
        .expect("tool result");
    assert_eq!(tool.content, full, "the history kept the whole result");

    // The session goes on: the next request is cut the same way, the history stays whole.
    sim.push_reply(ScriptedReply::text("done"));
    let out = session.turn(vec![Message::user("q2")]).await.expect("turn");
    assert_eq!(out.text, "done");
    let last = sim.requests().pop().expect("request");
    assert!(last.contains("q2") && !last.contains("line 01000 of the build log"));
    let tool = session
        .history()
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("c1"))
        .expect("tool result");
    assert_eq!(tool.content, full);
}
