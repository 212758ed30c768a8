//! The official OpenAI Python SDK drives a served session through `/v1/responses`,
//! non-streaming and streaming. The SDK is installed with pip when it is missing.

use std::process::Command;

use cairn_sim::{ScriptedReply, Sim};

use crate::support::agent::*;

const SCRIPT: &str = r#"
import os, sys
from openai import OpenAI

client = OpenAI(base_url=os.environ["BASE"] + "/v1", api_key=os.environ["TOKEN"])

r = client.responses.create(model="m-1", input="first question")
print("NONSTREAM=" + r.output_text)
print("STATUS=" + r.status)
print("USAGE=" + str(r.usage.input_tokens > 0))

r = client.responses.create(
    model="m-1",
    input=[{"role": "user", "content": [{"type": "input_text", "text": "second question"}]}],
)
print("ITEMS=" + r.output_text)

text = ""
final = None
types = []
stream = client.responses.create(model="m-1", input="third question", stream=True)
for event in stream:
    types.append(event.type)
    if event.type == "response.output_text.delta":
        text += event.delta
    elif event.type == "response.completed":
        final = event.response.output_text
print("STREAM=" + text)
print("FINAL=" + str(final))
print("TYPES=" + ",".join(types))

try:
    OpenAI(base_url=os.environ["BASE"] + "/v1", api_key="wrong").responses.create(model="m-1", input="x")
    print("AUTH=accepted")
except Exception as e:
    print("AUTH=" + type(e).__name__)
"#;

fn ensure_sdk() {
    let have = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        let ok = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "openai"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pip install openai failed");
    }
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= line in:\n{out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdk_drives_a_session() {
    ensure_sdk();
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("sdk.yaml");
    std::fs::write(
        &config,
        config_yaml("sdk", &format!("{}/v1", sim.url()), 200_000, ""),
    )
    .expect("config");
    let env = storage_env(dir.path(), None);
    let agent = AgentProcess::start(&config, &env, &dir.path().join("agent.log"));

    sim.push_reply(ScriptedReply::text("answer one"));
    sim.push_reply(ScriptedReply::text("answer two"));
    let long = "streamed answer ".repeat(60);
    sim.push_reply(ScriptedReply::text(long.clone()));

    let base = agent.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(["-c", SCRIPT])
            .env("BASE", base)
            .env("TOKEN", TOKEN)
            .output()
            .expect("python3")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    assert_eq!(line(&stdout, "NONSTREAM"), "answer one");
    assert_eq!(line(&stdout, "STATUS"), "completed");
    assert_eq!(line(&stdout, "USAGE"), "True");
    assert_eq!(line(&stdout, "ITEMS"), "answer two");
    assert_eq!(line(&stdout, "STREAM"), long.as_str());
    assert_eq!(line(&stdout, "FINAL"), long.as_str());
    let types = line(&stdout, "TYPES");
    assert!(
        types.starts_with("response.created,response.in_progress"),
        "{types}"
    );
    assert!(types.ends_with("response.completed"), "{types}");
    assert!(
        types.matches("response.output_text.delta").count() > 1,
        "{types}"
    );
    assert_eq!(line(&stdout, "AUTH"), "AuthenticationError");

    // The three turns reached the provider in order, with the session's history.
    let last = sim.requests().pop().expect("requests");
    assert!(last.contains("first question") && last.contains("second question"));
}
