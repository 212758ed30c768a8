//! `engine: provider` against cairn-sim, which implements the providers' server-side context
//! management as their documentation describes it: Anthropic's cleared tool results are
//! mirrored as stubs whose originals stay recallable; a provider family without server-side
//! context management reports the setting as unsupported and gets no such request field.

use cairn_agent::server::AppState;
use cairn_sim::{ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;

fn read_tool() -> Value {
    json!([{
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    }])
}

/// A file of about 3.9 KB (under the compression threshold: it enters the history whole).
fn file(name: &str) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < 3_900 {
        s.push_str(&format!("{name} line {i}: the quick brown fox {}\n", i * 7));
        i += 1;
    }
    s
}

fn yaml(kind: &str, base: &str, name: &str, extra: &str) -> String {
    format!(
        "name: {name}\nnamespace: tests\nprovider:\n  kind: {kind}\n  model: claude-sonnet-4-5\n  baseUrl: {base}\ncontextWindow: 200000\nmaxOutputTokens: 1000\nsystemPrompt: You are a test agent.\n{extra}"
    )
}

fn call_id(v: &Value) -> String {
    v["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .and_then(|c| c["call_id"].as_str())
        .unwrap_or_else(|| panic!("no function_call in {v}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_context_edits_are_mirrored_and_the_cleared_originals_stay_recallable() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let extra = "compaction:\n  engine: provider\n  providerEngine: {triggerInputTokens: 2000, keepToolUses: 1}\n";
    let built = build_session(&yaml("anthropic", &sim.url(), "edits", extra), &env, "t").await;
    assert!(built.session.stats().unsupported.is_empty());
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    let files: Vec<String> = ["a.rs", "b.rs", "c.rs"].iter().map(|n| file(n)).collect();
    for n in ["a.rs", "b.rs", "c.rs"] {
        sim.push_reply(ScriptedReply::tool_call("read_file", json!({"path": n})));
    }
    sim.push_reply(ScriptedReply::text("all three read"));
    let (s, mut last) = api
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": "read a, b and c", "tools": read_tool()}),
        )
        .await;
    assert_eq!(s, 200, "{last}");
    let mut ratios = Vec::new();
    for f in &files {
        let id = call_id(&last);
        let (s, v) = api
            .post(
                "/v1/responses",
                json!({"model": MODEL, "previous_response_id": last["id"], "tools": read_tool(),
                       "input": [{"type": "function_call_output", "call_id": id, "output": f}]}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        ratios.push(api.session().await["stats"]["bytesPerToken"].as_f64());
        last = v;
    }
    assert_eq!(output_text(&last), "all three read");

    let reqs = sim.requests();
    assert_eq!(reqs.len(), 4);
    for r in &reqs {
        assert_eq!(r.outcome, "ok", "request {}: {}", r.seq, r.outcome);
        // Every tool-loop request carries the edit with the policy's numbers (and the beta
        // header: the simulator refuses the field without it).
        let body: Value = serde_json::from_str(&r.body).expect("json");
        let edit = &body["context_management"]["edits"][0];
        assert_eq!(edit["type"], "clear_tool_uses_20250919", "{}", r.body);
        assert_eq!(
            edit["trigger"],
            json!({"type": "input_tokens", "value": 2000})
        );
        assert_eq!(edit["keep"], json!({"type": "tool_uses", "value": 1}));
    }
    // The third request crossed the trigger: the server cleared a.rs's result. The fourth
    // carries the local mirror of that: a stub with a marker instead of a.rs.
    let first_line = files[0].lines().next().expect("line");
    assert!(reqs[2].contains(first_line));
    assert!(
        !reqs[3].contains(first_line),
        "the cleared result is a stub locally"
    );
    let keys = cairn_agent::ccr::extract_markers(&reqs[3].body);
    assert!(!keys.is_empty(), "the stub carries a marker");
    let mut recalled = false;
    for k in &keys {
        let (status, back) = api.get(&format!("/v1/recall/{}", k.as_str())).await;
        recalled |= status == 200 && back == files[0].as_bytes();
    }
    assert!(recalled, "the cleared original is recallable byte for byte");
    // The newest result is kept whole.
    let newest = files[2].lines().next().expect("line");
    assert!(reqs[3].contains(newest));
    // The reply to the edited request did not calibrate the bytes per token.
    // (The second request was not edited and calibrated it; the third and fourth were.)
    assert!(ratios[0].is_some());
    assert_eq!(ratios[0], ratios[1], "the edited turn skipped calibration");
    assert_eq!(ratios[1], ratios[2], "the edited turn skipped calibration");
    assert!(
        reqs[3].contains("cleared by the provider"),
        "{}",
        reqs[3].body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_without_server_side_context_management_reports_the_setting() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml(
        "noengine",
        &format!("{}/v1", sim.url()),
        200_000,
        "compaction:\n  engine: provider\n",
    );
    let built = build_session(&yaml, &env, "t").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let (s, v) = api.turn("hello").await;
    assert_eq!(s, 200, "{v}");
    let session = api.session().await;
    let unsupported = session["stats"]["unsupported"]
        .as_array()
        .unwrap_or_else(|| panic!("no unsupported settings: {session}"));
    assert_eq!(unsupported.len(), 1);
    assert_eq!(unsupported[0]["field"], "engine");
    assert!(
        unsupported[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("openai-compatible")),
        "{session}"
    );
    // Nothing the server would not understand is sent.
    assert!(
        sim.requests()
            .iter()
            .all(|r| !r.contains("context_management"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_compaction_items_stand_in_the_history_and_the_replaced_segment_is_recallable() {
    use cairn_agent::history::Message;
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let yaml = format!(
        "name: compaction\nnamespace: tests\nprovider:\n  kind: openai-responses\n  model: gpt-5-mini\n  baseUrl: {}/v1\ncontextWindow: 200000\nmaxOutputTokens: 1000\nsystemPrompt: You are a test agent.\ncompaction:\n  engine: provider\n  providerEngine: {{compactThresholdTokens: 1000}}\n",
        sim.url()
    );
    let mut built = build_session(&yaml, &env, "t").await;
    assert!(built.session.stats().unsupported.is_empty());
    let big = file("notes.md").repeat(2);
    let marker_line = big.lines().next().expect("line").to_owned();
    sim.push_reply(ScriptedReply::text("noted"));
    let out = built
        .session
        .turn(vec![Message::user(big.clone())])
        .await
        .expect("turn");
    assert_eq!(out.text, "noted");
    let reqs = sim.requests();
    let body: Value = serde_json::from_str(&reqs[0].body).expect("json");
    assert_eq!(
        body["context_management"],
        json!([{"type": "compaction", "compact_threshold": 1000}])
    );
    // The server compacted the input: its item now stands for it in the history.
    let history = built.session.history().to_vec();
    let item = history
        .iter()
        .find_map(|m| m.provider_item.clone())
        .expect("the compaction item is kept");
    assert_eq!(item["type"], "compaction");
    assert!(
        history.iter().all(|m| !m.content.contains(&marker_line)),
        "the compacted segment left the history"
    );

    // The next request sends the item back verbatim in its place.
    sim.push_reply(ScriptedReply::text("still here"));
    built
        .session
        .turn(vec![Message::user("and now?")])
        .await
        .expect("turn");
    let reqs = sim.requests();
    let body: Value = serde_json::from_str(&reqs[1].body).expect("json");
    let input = body["input"].as_array().expect("input");
    assert_eq!(input[0], item, "the opaque item, byte for byte, first");
    assert!(!reqs[1].contains(&marker_line));

    // The replaced segment is recallable: the first message's marker gives it back.
    let stub = history
        .iter()
        .find(|m| m.provider_item.is_some())
        .expect("stub");
    let back = cairn_agent::ccr::recall(built.session.store().as_ref(), &stub.content)
        .await
        .expect("recall");
    let segment = String::from_utf8(back.output).expect("utf-8");
    let messages = cairn_agent::history::parse_jsonl(&segment).expect("a segment of messages");
    assert!(messages.iter().any(|m| m.content == big), "{segment:.200}");

    // The item survives a restart (it is journaled with the history).
    drop(built);
    let again = build_session(&yaml, &env, "t2").await;
    assert!(
        again
            .session
            .history()
            .iter()
            .any(|m| m.provider_item.as_ref() == Some(&item))
    );
}
