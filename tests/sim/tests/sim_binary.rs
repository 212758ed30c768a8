//! The `cairn-sim` binary over plain HTTP: it prints its address, loads a script, answers in
//! each wire format, applies header faults and records requests for assertions.

// Test helpers outside `#[test]` functions are test code too (STYLE: tests may unwrap).
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

struct Running {
    child: Child,
    url: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(script: &str) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.yaml");
    std::fs::write(&path, script).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn-sim"))
        .args(["--listen", "127.0.0.1:0", "--script"])
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("cairn-sim listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    Running { child, url }
}

#[tokio::test]
async fn binary_serves_scripted_replies_and_records_requests() {
    let sim = start(
        "replies:\n  - text: scripted hello\n  - tool_call: {name: grep, arguments: {q: x}}\nwindows: {tiny: 50}\n",
    );
    let http = reqwest::Client::new();
    let msg = |model: &str, text: &str| {
        json!({"model": model, "max_tokens": 100,
               "messages": [{"role": "user", "content": text}]})
    };

    let r: Value = http
        .post(format!("{}/v1/messages", sim.url))
        .header("x-api-key", "k")
        .json(&msg("claude-x", "hello MARKER-1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["content"][0]["text"], "scripted hello");
    assert_eq!(r["stop_reason"], "end_turn");

    let r: Value = http
        .post(format!("{}/v1/chat/completions", sim.url))
        .bearer_auth("k")
        .json(&json!({"model": "gpt-5", "messages": [{"role": "user", "content": "go"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"q\":\"x\"}"
    );

    // Over the scripted window: Anthropic's own overflow error.
    let resp = http
        .post(format!("{}/v1/messages", sim.url))
        .header("x-api-key", "k")
        .json(&msg("tiny", &"w".repeat(400)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long: ")
    );

    // No credentials, then a bad body, then a header fault.
    let resp = http
        .post(format!("{}/v1/messages", sim.url))
        .json(&msg("claude-x", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = http
        .post(format!("{}/v1/chat/completions", sim.url))
        .bearer_auth("k")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = http
        .post(format!(
            "{}/v1beta/models/gemini-2.5-pro:generateContent",
            sim.url
        ))
        .header("x-goog-api-key", "k")
        .header("x-sim-fault", "429:3")
        .json(&json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "3");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED");

    // Admin: more script over HTTP, then the request log.
    let resp = http
        .post(format!("{}/_sim/script", sim.url))
        .body(r#"{"replies":[{"text":"from admin"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let r: Value = http
        .post(format!(
            "{}/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse",
            sim.url
        ))
        .header("authorization", "AWS4-HMAC-SHA256 Credential=x")
        .json(&json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["output"]["message"]["content"][0]["text"], "from admin");

    let log: Vec<Value> = http
        .get(format!("{}/_sim/requests?contains=MARKER-1", sim.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let outcomes: Vec<&str> = log.iter().map(|r| r["outcome"].as_str().unwrap()).collect();
    assert_eq!(
        outcomes,
        [
            "ok",
            "ok",
            "overflow",
            "unauthorized",
            "bad_request",
            "fault:429",
            "ok"
        ]
    );
    assert_eq!(log[0]["contains"], true);
    assert_eq!(log[1]["contains"], false);
    assert_eq!(log[0]["messages"], 1);
    assert_eq!(
        log[6]["model"],
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    );
    assert_eq!(log[6]["auth"], "aws4-hmac-sha256");
    assert!(log[2]["bytes"].as_u64().unwrap() > 400);
    assert!(log.iter().all(|r| r.get("body").is_none()));
}
