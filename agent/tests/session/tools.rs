//! The tool-call loop of a turn against cairn-sim: the built-in `compress` tool, the
//! stagnation guard, unknown tools, and output-token escalation.

use cairn_agent::ccr::{Key, extract_markers};
use cairn_agent::history::{Message, Role, ToolCall};
use cairn_sim::{ScriptedReply, Sim, Stop};
use serde_json::json;

use crate::support::agent::*;

async fn session(sim: &Sim, dir: &std::path::Path, extra: &str) -> Built {
    let env = storage_env(dir, None);
    let yaml = config_yaml("tools", &format!("{}/v1", sim.url()), 200_000, extra)
        .replace("maxOutputTokens: 1000", "maxOutputTokens: 64000");
    build_session(&yaml, &env, "a").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_tool_calls_three_times_in_a_row_stop_the_loop() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let mut built = session(&sim, dir.path(), "").await;
    for _ in 0..5 {
        sim.push_reply(ScriptedReply::tool_call(
            "recall",
            json!({"key": "0123456789abcdef"}),
        ));
    }
    let out = built
        .session
        .turn(vec![Message::user("find it")])
        .await
        .expect("turn");
    assert_eq!(out.stopped, Some("stagnation"));
    assert_eq!(out.rounds, 3);
    assert!(out.notices.iter().any(|n| n.kind == "tools"));
    // Every call got its result: the history stays valid for the next request.
    let h = built.session.history();
    let calls = h.iter().filter(|m| !m.tool_calls.is_empty()).count();
    let results = h.iter().filter(|m| m.role == Role::Tool).count();
    assert_eq!((calls, results), (3, 3));
    assert!(
        h.iter()
            .any(|m| m.content.contains("no <<ccr:0123456789abcdef>>")
                || m.content.contains("0123456789abcdef"))
    );
    // The next turn works as usual.
    let out = built
        .session
        .turn(vec![Message::user("next")])
        .await
        .expect("turn");
    assert_eq!(out.text, "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compress_shrinks_an_earlier_tool_result_in_place_and_unknown_tools_get_an_error() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let mut built = session(&sim, dir.path(), "").await;
    let log: String = (0..2_000)
        .map(|i| {
            if i == 1_500 {
                "ERROR: disk full at step 1500\n".to_string()
            } else {
                format!("step {i}: ok\n")
            }
        })
        .collect();
    built
        .session
        .replace_history(vec![
            Message::user("run it"),
            Message::assistant_calls(
                "",
                vec![ToolCall {
                    id: "c9".into(),
                    name: "bash".into(),
                    arguments: "{}".into(),
                }],
            ),
            Message::tool("c9", log.clone()),
        ])
        .await
        .expect("seed");
    sim.push_reply(ScriptedReply::tool_call(
        "compress",
        json!({"tool_call_id": "c9"}),
    ));
    sim.push_reply(ScriptedReply::tool_call("read_file", json!({"path": "x"})));
    sim.push_reply(ScriptedReply::text("done"));
    let out = built
        .session
        .turn(vec![Message::user("shrink it")])
        .await
        .expect("turn");
    assert_eq!(out.text, "done");
    assert_eq!(out.rounds, 3);
    let h = built.session.history();
    let result = h
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("c9"))
        .expect("result");
    assert!(
        result.content.len() < log.len() / 4,
        "compressed: {}",
        result.content.len()
    );
    assert!(
        result.content.contains("ERROR: disk full at step 1500"),
        "errors are kept"
    );
    let key = Key::of(log.as_bytes());
    assert_eq!(extract_markers(&result.content), vec![key]);
    assert_eq!(
        built.storage.store.fetch(&key).await.unwrap().as_deref(),
        Some(log.as_bytes())
    );
    let unknown = h
        .iter()
        .rev()
        .find(|m| m.role == Role::Tool)
        .expect("tool result");
    assert!(
        unknown.content.contains("unknown tool"),
        "{}",
        unknown.content
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_at_the_output_limit_is_continued_with_a_doubled_limit() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let mut built = session(&sim, dir.path(), "").await;
    sim.push_reply(ScriptedReply {
        text: "the first half".into(),
        stop: Some(Stop::MaxTokens),
        ..Default::default()
    });
    sim.push_reply(ScriptedReply::text(" and the rest"));
    let out = built
        .session
        .turn(vec![Message::user("write a lot")])
        .await
        .expect("turn");
    assert_eq!(out.text, "the first half and the rest");
    assert!(out.notices.iter().any(|n| n.kind == "escalation"));
    let reqs = sim.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].max_tokens, 8_192);
    assert_eq!(reqs[1].max_tokens, 16_384);
    assert!(reqs[1].contains("Resume DIRECTLY"));
}

/// `tool_choice: required` holds until the session's own tools have run: the first call of
/// the turn sends it, the next one `none`, and the model's answer ends the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_tool_choice_is_met_by_the_first_round_of_own_tools() {
    use cairn_agent::provider::{Controls, ToolChoice};
    use cairn_agent::session::TurnOptions;
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let mut built = session(&sim, dir.path(), "").await;
    sim.push_reply(ScriptedReply::tool_call(
        "recall",
        json!({"key": "0123456789abcdef"}),
    ));
    sim.push_reply(ScriptedReply::text("nothing archived under that key"));
    let before = sim.requests().len();
    let options = TurnOptions {
        controls: Controls {
            tool_choice: ToolChoice::Required,
            ..Controls::default()
        },
        ..TurnOptions::default()
    };
    let out = built
        .session
        .turn_with_options(vec![Message::user("find it")], options, None)
        .await
        .expect("turn");
    assert_eq!(out.rounds, 2);
    assert_eq!(out.stopped, None);
    assert_eq!(out.text, "nothing archived under that key");
    let choices: Vec<serde_json::Value> = sim.requests()[before..]
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(&r.body).expect("body")["tool_choice"].clone()
        })
        .collect();
    assert_eq!(choices, vec![json!("required"), json!("none")]);
    // The next turn is back to the default: no tool_choice sent.
    let out = built
        .session
        .turn(vec![Message::user("next")])
        .await
        .expect("turn");
    assert_eq!(out.text, "ok");
    let last: serde_json::Value =
        serde_json::from_str(&sim.requests().pop().expect("request").body).expect("body");
    assert!(last.get("tool_choice").is_none(), "{last}");
}
