//! Output steering against cairn-sim: the verbosity directive follows the system prompt in
//! every request, byte for byte, and effort routing lowers the reasoning effort of trivial
//! prompts only, never over the client's own choice.

use cairn_agent::history::Message;
use cairn_agent::provider::Effort;
use cairn_agent::session::TurnOptions;
use cairn_sim::{ScriptedReply, Sim};
use serde_json::Value;

use crate::support::agent::*;

fn yaml(sim: &Sim, output: &str) -> String {
    format!(
        "name: steer\nnamespace: tests\nprovider:\n  kind: openai-responses\n  model: gpt-5\n  baseUrl: {}/v1\ncontextWindow: 200000\nmaxOutputTokens: 1000\nsystemPrompt: You are a test agent.\ncompaction:\n  output:\n{output}",
        sim.url()
    )
}

fn effort(body: &Value) -> Option<&str> {
    body.pointer("/reasoning/effort").and_then(Value::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbosity_and_effort_routing_show_in_the_requests_and_stay_byte_stable() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let mut built = build_session(
        &yaml(&sim, "    verbosity: minimal\n    effortRouting: true\n"),
        &env,
        "test",
    )
    .await;
    let inputs = [
        "What is 2 + 2?",
        "Review this function:\n```rust\nfn add(a: i32, b: i32) -> i32 { a - b }\n```",
        "Thanks, and 3 + 3?",
    ];
    for input in inputs {
        sim.push_reply(ScriptedReply::text("ok"));
        built
            .session
            .turn(vec![Message::user(input)])
            .await
            .expect("turn");
    }
    // The client's own choice stands, even on a trivial prompt.
    sim.push_reply(ScriptedReply::text("ok"));
    let mut options = TurnOptions::default();
    options.controls.effort = Some(Effort::High);
    built
        .session
        .turn_with_options(vec![Message::user("And 4 + 4?")], options, None)
        .await
        .expect("turn");

    let seen = sim.requests();
    assert_eq!(seen.len(), 4);
    let bodies: Vec<Value> = seen
        .iter()
        .map(|r| serde_json::from_str(&r.body).expect("json"))
        .collect();
    let directive = cairn_agent::steering::directive(cairn_crds::policy::Verbosity::Minimal)
        .expect("minimal has a directive");
    let prompt = format!("You are a test agent.\n\n{directive}");
    let system = |b: &Value| -> String {
        // The system prompt travels as the first input item or as `instructions`.
        b.pointer("/input/0/content")
            .and_then(Value::as_str)
            .or_else(|| b.get("instructions").and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned()
    };
    for b in &bodies {
        assert_eq!(system(b), prompt, "{b}");
    }
    assert_eq!(
        bodies.iter().map(effort).collect::<Vec<_>>(),
        [Some("low"), None, Some("low"), Some("high")]
    );

    // full: no directive at all; routing off: no effort sent.
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let mut built = build_session(&yaml(&sim, "    verbosity: full\n"), &env, "test").await;
    sim.push_reply(ScriptedReply::text("ok"));
    built
        .session
        .turn(vec![Message::user("What is 2 + 2?")])
        .await
        .expect("turn");
    let r = sim.requests().pop().expect("request");
    let b: Value = serde_json::from_str(&r.body).expect("json");
    assert_eq!(system(&b), "You are a test agent.");
    assert_eq!(effort(&b), None);
    assert!(!r.contains("Answer"), "{}", r.body);
}
