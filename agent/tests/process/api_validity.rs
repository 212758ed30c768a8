//! One check of a request's validity, on the real `cairn-agent serve`: an empty user message
//! is a 400 `empty_message` on the Responses and Chat Completions APIs, streamed or not, and
//! the provider (cairn-sim) receives nothing.

use cairn_sim::{ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_user_message_is_refused_on_every_api_and_never_sent() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("empty.yaml");
    std::fs::write(
        &config,
        config_yaml("empty", &format!("{}/v1", sim.url()), 200_000, ""),
    )
    .expect("config");
    let env = storage_env(&dir.path().join("data"), None);
    let agent = AgentProcess::start(&config, &env, &dir.path().join("agent.log"));
    let api = agent.api();

    // (what, Responses input, Chat Completions messages)
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "empty string",
            json!([{"role": "user", "content": ""}]),
            json!([{"role": "user", "content": ""}]),
        ),
        (
            "blank string",
            json!([{"role": "user", "content": "   \n\t"}]),
            json!([{"role": "user", "content": "   \n\t"}]),
        ),
        (
            "no parts",
            json!([{"role": "user", "content": []}]),
            json!([{"role": "user", "content": []}]),
        ),
        (
            "an empty text part",
            json!([{"role": "user", "content": [{"type": "input_text", "text": ""}]}]),
            json!([{"role": "user", "content": [{"type": "text", "text": ""}]}]),
        ),
        (
            "after a system message",
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": " "}]),
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": " "}]),
        ),
        (
            "the input string",
            json!(""),
            json!([{"role": "user", "content": ""}]),
        ),
    ];
    for (what, input, messages) in &cases {
        for stream in [false, true] {
            for (path, body) in [
                (
                    "/v1/responses",
                    json!({"model": MODEL, "input": input, "stream": stream}),
                ),
                (
                    "/v1/chat/completions",
                    json!({"model": MODEL, "messages": messages, "stream": stream}),
                ),
            ] {
                let at = format!("{what} on {path} (stream: {stream})");
                let r = api.send(path, &body).await;
                assert_eq!(r.status().as_u16(), 400, "{at}");
                let ct = r
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                assert!(ct.starts_with("application/json"), "{at}: {ct}");
                let v: Value = r.json().await.expect("JSON error");
                assert_eq!(v["error"]["code"], "empty_message", "{at}: {v}");
                assert_eq!(v["error"]["type"], "invalid_request_error", "{at}: {v}");
                assert!(v["error"]["param"].is_null(), "{at}: {v}");
                assert!(
                    v["error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("empty")),
                    "{at}: {v}"
                );
            }
        }
    }
    assert!(sim.requests().is_empty(), "the provider received nothing");
    assert_eq!(api.session().await["stats"]["turns"], 0);

    // The same agent answers a question: the refusals left the session as it was.
    sim.push_reply(ScriptedReply::text("an answer"));
    let (status, body) = api.turn("a real question").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output_text(&body), "an answer");
    assert_eq!(sim.requests().len(), 1);
}
