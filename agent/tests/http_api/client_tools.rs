//! Client function tools on `POST /v1/responses`, through every provider family cairn-sim
//! speaks: the model's call of a client tool ends the turn as a `function_call` output item
//! (streamed as the OpenAI SDKs parse it), the client's `function_call_output` goes back to
//! the provider as that family's tool result, and built-in tools still run inside the turn.

use cairn_agent::server::AppState;
use cairn_crds::ProviderKind;
use cairn_sim::{ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;

fn yaml(kind: ProviderKind, sim: &Sim, name: &str) -> String {
    let base = match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses | ProviderKind::OpenaiCompatible => {
            format!("{}/v1", sim.url())
        }
        _ => sim.url(),
    };
    format!(
        "name: {name}\nnamespace: tests\nprovider:\n  kind: {}\n  model: {MODEL}\n  baseUrl: {base}\n  region: us-east-1\ncontextWindow: 200000\nmaxOutputTokens: 1000\nsystemPrompt: You are a test agent.\n",
        kind.as_str()
    )
}

fn read_tool() -> Value {
    json!([{
        "type": "function",
        "name": "read_file",
        "description": "Read a file by line range.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        "strict": true
    }])
}

/// The events of an SSE body: (type, data).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter_map(|frame| {
            let mut ty = None;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(t) = line.strip_prefix("event:") {
                    ty = Some(t.trim().to_owned());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim_start());
                }
            }
            Some((ty?, serde_json::from_str(&data).ok()?))
        })
        .collect()
}

async fn post_stream(api: &Api, body: Value) -> Vec<(String, Value)> {
    let r = api
        .http
        .post(format!("{}/v1/responses", api.base))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    events(&r.text().await.expect("body"))
}

/// The Response object of a turn, streamed or not, with the streamed events checked.
async fn respond(api: &Api, body: Value, stream: bool) -> Value {
    if !stream {
        let (status, v) = api.post("/v1/responses", body).await;
        assert_eq!(status, 200, "{v}");
        return v;
    }
    let mut body = body;
    body["stream"] = json!(true);
    events_checked(&post_stream(api, body).await)
}

/// Checks the function-call events the OpenAI SDKs parse and returns the final Response.
fn events_checked(ev: &[(String, Value)]) -> Value {
    let (last, data) = ev.last().expect("events");
    assert_eq!(last, "response.completed", "{ev:?}");
    let response = data["response"].clone();
    for call in response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "function_call")
    {
        let id = &call["id"];
        let added = ev
            .iter()
            .find(|(t, d)| t == "response.output_item.added" && d["item"]["id"] == *id)
            .expect("output_item.added of the call");
        assert_eq!(added.1["item"]["type"], "function_call");
        assert_eq!(added.1["item"]["call_id"], call["call_id"]);
        let args: String = ev
            .iter()
            .filter(|(t, d)| t == "response.function_call_arguments.delta" && d["item_id"] == *id)
            .filter_map(|(_, d)| d["delta"].as_str())
            .collect();
        assert_eq!(args, call["arguments"].as_str().unwrap());
        let done = ev
            .iter()
            .find(|(t, d)| t == "response.function_call_arguments.done" && d["item_id"] == *id)
            .expect("arguments.done");
        assert_eq!(done.1["arguments"], call["arguments"]);
        assert!(
            ev.iter().any(|(t, d)| t == "response.output_item.done"
                && d["item"]["id"] == *id
                && d["item"]["arguments"] == call["arguments"]),
            "output_item.done of the call"
        );
    }
    for (i, (_, d)) in ev.iter().enumerate() {
        assert_eq!(d["sequence_number"], json!(i));
    }
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_provider_family_round_trips_a_client_tool_call_streamed_and_not() {
    let sim = Sim::start().await.expect("sim");
    for kind in ProviderKind::ALL {
        for stream in [false, true] {
            sim.reset();
            let dir = tempfile::tempdir().expect("tempdir");
            let env = storage_env(dir.path(), None);
            let name = format!("tools-{}-{stream}", kind.as_str());
            let built = build_session(&yaml(kind, &sim, &name), &env, "t").await;
            let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

            sim.push_reply(ScriptedReply::tool_call(
                "read_file",
                json!({"path": "src/main.rs"}),
            ));
            sim.push_reply(ScriptedReply::text("main.rs prints hello"));
            let first = respond(
                &api,
                json!({"model": MODEL, "input": "what does main.rs do?", "tools": read_tool(),
                       "instructions": "Answer in one sentence."}),
                stream,
            )
            .await;
            let what = format!("{kind:?} stream={stream}");
            assert_eq!(first["status"], "completed", "{what}: {first}");
            let output = first["output"].as_array().unwrap();
            let call = output
                .iter()
                .find(|o| o["type"] == "function_call")
                .unwrap_or_else(|| panic!("{what}: no function_call in {first}"));
            assert_eq!(call["name"], "read_file", "{what}");
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(args, json!({"path": "src/main.rs"}), "{what}");
            let call_id = call["call_id"].as_str().unwrap().to_owned();
            assert!(!call_id.is_empty());
            // The turn ended at the client's call: one model request so far, which offered
            // the client's tool beside the built-in ones and carried the instructions.
            let reqs = sim.requests();
            assert_eq!(reqs.len(), 1, "{what}");
            assert!(reqs[0].contains("read_file") && reqs[0].contains("recall"));
            assert!(reqs[0].contains("Answer in one sentence."), "{what}");

            let source = "fn main() { println!(\"hello\"); }";
            let second = respond(
                &api,
                json!({"model": MODEL, "previous_response_id": first["id"], "tools": read_tool(),
                       "input": [{"type": "function_call_output", "call_id": call_id, "output": source}]}),
                stream,
            )
            .await;
            assert_eq!(second["status"], "completed", "{what}: {second}");
            assert_eq!(
                second["output"][0]["content"][0]["text"], "main.rs prints hello",
                "{what}"
            );
            let reqs = sim.requests();
            assert_eq!(reqs.len(), 2, "{what}");
            // The output went back as this family's tool result, bound to the call.
            let body: Value = serde_json::from_str(&reqs[1].body).unwrap();
            let text = body.to_string();
            assert!(text.contains("println!"), "{what}: {text}");
            if kind != ProviderKind::Gemini {
                assert!(text.contains(&call_id), "{what}: the call id is missing");
            }
            // The instructions applied to the first response only.
            assert!(!reqs[1].contains("Answer in one sentence."), "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_tools_run_inside_the_turn_and_a_mixed_reply_hands_over_the_client_calls() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let built = build_session(&yaml(ProviderKind::Openai, &sim, "mixed"), &env, "t").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    // A built-in call first (run inside the turn), then the client's.
    sim.push_reply(ScriptedReply::tool_call(
        "recall",
        json!({"key": "0000000000000000"}),
    ));
    sim.push_reply(ScriptedReply::tool_call("read_file", json!({"path": "a"})));
    let (status, v) = api
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": "go", "tools": read_tool()}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["cairn"]["rounds"], 2);
    let kinds: Vec<&str> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["function_call"]);
    assert_eq!(v["output"][0]["name"], "read_file");
    assert_eq!(sim.requests().len(), 2);

    // GET /v1/responses/{id} finds it.
    let (s, body) = api
        .get(&format!("/v1/responses/{}", v["id"].as_str().unwrap()))
        .await;
    assert_eq!(s, 200);
    let got: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(got["output"], v["output"]);
    let (s, _) = api.get("/v1/responses/resp_nope").await;
    assert_eq!(s, 404);

    // A stale or unknown previous_response_id changes nothing.
    let out = json!([{"type": "function_call_output", "call_id": v["output"][0]["call_id"], "output": "x"}]);
    let (s, e) = api
        .post(
            "/v1/responses",
            json!({"input": out, "previous_response_id": "resp_unknown"}),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["code"], "previous_response_not_found");
    sim.push_reply(ScriptedReply::text("ok"));
    let (s, next) = api
        .post(
            "/v1/responses",
            json!({"input": out, "previous_response_id": v["id"], "tools": read_tool()}),
        )
        .await;
    assert_eq!(s, 200, "{next}");
    let (s, e) = api
        .post(
            "/v1/responses",
            json!({"input": "again", "previous_response_id": v["id"]}),
        )
        .await;
    assert_eq!(s, 409, "{e}");
    assert_eq!(e["error"]["code"], "stale_response");
    assert_eq!(sim.requests().len(), 3);

    // Fields the session cannot honour are refused by name.
    let (s, e) = api
        .post("/v1/responses", json!({"input": "x", "background": true}))
        .await;
    assert_eq!(s, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("background")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reply_mixing_built_in_and_client_calls_runs_the_built_in_and_hands_over_the_rest() {
    let sim = Sim::start().await.expect("sim");
    for kind in ProviderKind::ALL {
        sim.reset();
        let dir = tempfile::tempdir().expect("tempdir");
        let env = storage_env(dir.path(), None);
        let name = format!("parallel-{}", kind.as_str());
        let built = build_session(&yaml(kind, &sim, &name), &env, "t").await;
        let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
        let what = format!("{kind:?}");

        sim.push_reply(ScriptedReply::tool_calls(vec![
            ("recall".into(), json!({"key": "0123456789abcdef"})),
            ("read_file".into(), json!({"path": "a"})),
            ("read_file".into(), json!({"path": "b"})),
        ]));
        let (s, v) = api
            .post(
                "/v1/responses",
                json!({"model": MODEL, "input": "read a and b", "tools": read_tool()}),
            )
            .await;
        assert_eq!(s, 200, "{what}: {v}");
        assert_eq!(v["cairn"]["rounds"], 1, "{what}");
        let calls: Vec<Value> = v["output"].as_array().unwrap().clone();
        assert_eq!(calls.len(), 2, "{what}: {v}");
        let paths: Vec<Value> = calls
            .iter()
            .map(|c| {
                serde_json::from_str::<Value>(c["arguments"].as_str().unwrap()).unwrap()["path"]
                    .clone()
            })
            .collect();
        assert_eq!(paths, [json!("a"), json!("b")], "{what}");
        assert_ne!(calls[0]["call_id"], calls[1]["call_id"]);

        // The outputs of both, and the built-in's result, reach the provider with the next
        // request, each bound to its call.
        sim.push_reply(ScriptedReply::tool_calls(vec![
            ("read_file".into(), json!({"path": "c"})),
            ("read_file".into(), json!({"path": "d"})),
        ]));
        let outputs: Vec<Value> = calls
            .iter()
            .map(|c| json!({"type": "function_call_output", "call_id": c["call_id"], "output": format!("OUTPUT-{}", c["call_id"].as_str().unwrap())}))
            .collect();
        let (s, v2) = api
            .post(
                "/v1/responses",
                json!({"model": MODEL, "input": outputs, "previous_response_id": v["id"],
                       "tools": read_tool(), "parallel_tool_calls": false}),
            )
            .await;
        assert_eq!(s, 200, "{what}: {v2}");
        let body = &sim.requests()[1].body;
        for c in &calls {
            assert!(
                body.contains(&format!("OUTPUT-{}", c["call_id"].as_str().unwrap())),
                "{what}"
            );
        }
        // parallel_tool_calls: false holds even where the provider has no such setting.
        let out = v2["output"].as_array().unwrap();
        assert_eq!(out.len(), 1, "{what}: {v2}");
        assert!(
            out[0]["arguments"].as_str().unwrap().contains("\"c\""),
            "{what}"
        );
        if matches!(
            kind,
            ProviderKind::Openai | ProviderKind::OpenaiResponses | ProviderKind::OpenaiCompatible
        ) {
            assert!(body.contains("\"parallel_tool_calls\":false"), "{what}");
        }
        if kind == ProviderKind::Anthropic {
            assert!(
                body.contains("\"disable_parallel_tool_use\":true"),
                "{what}"
            );
        }
    }
}

/// Where each family's request carries the JSON Schema and the effort.
fn format_and_effort(kind: ProviderKind, body: &Value) -> (Value, Value) {
    let at = |p: &str| body.pointer(p).cloned().unwrap_or(Value::Null);
    match kind {
        ProviderKind::Openai | ProviderKind::OpenaiCompatible => (
            at("/response_format/json_schema/schema"),
            at("/reasoning_effort"),
        ),
        ProviderKind::OpenaiResponses => (at("/text/format/schema"), at("/reasoning/effort")),
        ProviderKind::Anthropic => (
            at("/output_config/format/schema"),
            at("/output_config/effort"),
        ),
        ProviderKind::Gemini => (
            at("/generationConfig/responseJsonSchema"),
            at("/generationConfig/thinkingConfig/thinkingLevel"),
        ),
        ProviderKind::Bedrock => (Value::Null, Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_format_and_an_effort_reach_every_family_that_has_them_and_the_others_refuse()
{
    let sim = Sim::start().await.expect("sim");
    let schema = json!({"type": "object", "properties": {"answer_count": {"type": "integer"}},
                        "required": ["answer_count"], "additionalProperties": false});
    for kind in ProviderKind::ALL {
        sim.reset();
        let dir = tempfile::tempdir().expect("tempdir");
        let env = storage_env(dir.path(), None);
        let name = format!("format-{}", kind.as_str());
        let built = build_session(&yaml(kind, &sim, &name), &env, "t").await;
        let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
        let responses = json!({"model": MODEL, "input": "how many?",
            "text": {"format": {"type": "json_schema", "name": "count", "schema": schema, "strict": true}},
            "reasoning": {"effort": "low"}});
        // Chat Completions resends the conversation: the first turn, then the new question.
        let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "how many?"},
                {"role": "assistant", "content": "{\"answer_count\": 3}"},
                {"role": "user", "content": "and now?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "count", "schema": schema}},
            "reasoning_effort": "low"});
        if kind == ProviderKind::Bedrock {
            for (path, body) in [
                ("/v1/responses", &responses),
                ("/v1/chat/completions", &chat),
            ] {
                let (status, v) = api.post(path, body.clone()).await;
                assert_eq!(status, 400, "{path}: {v}");
                assert_eq!(v["error"]["code"], "unsupported_by_provider", "{v}");
                assert!(v["error"]["message"].as_str().unwrap().contains("bedrock"));
            }
            assert!(
                sim.requests().is_empty(),
                "nothing is sent for a refused setting"
            );
            continue;
        }
        sim.push_reply(ScriptedReply::text("{\"answer_count\": 3}"));
        let (status, v) = api.post("/v1/responses", responses).await;
        assert_eq!(status, 200, "{kind:?}: {v}");
        assert_eq!(v["text"]["format"]["name"], "count", "echoed: {v}");
        assert_eq!(v["reasoning"]["effort"], "low");
        let out: Value =
            serde_json::from_str(v["output"][0]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(out["answer_count"], 3);
        sim.push_reply(ScriptedReply::text("{\"answer_count\": 4}"));
        let (status, v) = api.post("/v1/chat/completions", chat).await;
        assert_eq!(status, 200, "{kind:?}: {v}");
        let reqs = sim.requests();
        assert_eq!(reqs.len(), 2, "{kind:?}");
        for r in &reqs {
            let body: Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(
                format_and_effort(kind, &body),
                (schema.clone(), json!("low")),
                "{kind:?}: {body}"
            );
        }
    }
    // Anthropic constrains output by a schema only.
    sim.reset();
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let built = build_session(
        &yaml(ProviderKind::Anthropic, &sim, "json-object"),
        &env,
        "t",
    )
    .await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let (status, v) = api
        .post(
            "/v1/responses",
            json!({"input": "x", "text": {"format": {"type": "json_object"}}}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("json_schema")
    );
    assert!(sim.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_outlive_a_restart_and_only_the_recent_ones_are_kept() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = yaml(ProviderKind::Openai, &sim, "stored");
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let mut ids = Vec::new();
    for i in 0..3 {
        sim.push_reply(ScriptedReply::text(format!("answer {i}")));
        let (s, v) = api
            .post("/v1/responses", json!({"input": format!("question {i}")}))
            .await;
        assert_eq!(s, 200, "{v}");
        ids.push(v);
    }
    sim.push_reply(ScriptedReply::text("not kept"));
    let (_, unstored) = api
        .post("/v1/responses", json!({"input": "q", "store": false}))
        .await;

    // Another agent process takes the session over from the same storage.
    let reopened = build_session(&yaml, &env, "b").await;
    let api = Api::new(serve(AppState::new(reopened.session, TOKEN)).await);
    for v in &ids {
        let (s, body) = api
            .get(&format!("/v1/responses/{}", v["id"].as_str().unwrap()))
            .await;
        assert_eq!(s, 200, "{v}");
        let got: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(got, *v, "the stored Response object, as it was answered");
    }
    let (s, _) = api
        .get(&format!(
            "/v1/responses/{}",
            unstored["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(s, 404, "store: false is not kept");
    // An id the session cannot have issued never reaches the store.
    for bad in ["resp_..%2F..%2Fclaims", "resp_0123"] {
        let (s, _) = api.get(&format!("/v1/responses/{bad}")).await;
        assert_eq!(s, 404, "{bad}");
    }
    // The newest RECENT_RESPONSES are kept, the older ones deleted from the store.
    let recent = cairn_agent::server::RECENT_RESPONSES;
    for i in 0..recent {
        sim.push_reply(ScriptedReply::text(format!("more {i}")));
        let (s, v) = api
            .post("/v1/responses", json!({"input": format!("more {i}")}))
            .await;
        assert_eq!(s, 200, "{v}");
    }
    let stored = stored_responses(dir.path());
    assert!(
        (1..=recent).contains(&stored),
        "{stored} stored responses for a limit of {recent}"
    );
    let (s, _) = api
        .get(&format!("/v1/responses/{}", ids[0]["id"].as_str().unwrap()))
        .await;
    assert_eq!(s, 404, "the oldest was evicted");
}

/// Files in every `responses` directory under `root`.
fn stored_responses(root: &std::path::Path) -> usize {
    let mut n = 0;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if d.file_name().is_some_and(|f| f == "responses") {
                n += 1;
            }
        }
    }
    n
}
