//! `cairn-agent context --config F` beside a running `cairn-agent serve` of the same
//! session, against cairn-sim: it reads the session the serving agent journaled (a
//! compaction's summary, the turns since) and prints the endpoint's report — the same JSON
//! as `GET /v1/session/context`, the same exact body as `?view=request`, which is the body
//! cairn-sim then receives for that turn — without sending anything to the provider and
//! without fencing the serving agent.

use std::path::Path;
use std::process::{Command, Output};

use cairn_sim::{ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;

fn context(config: &Path, env: &[(String, String)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn-agent"))
        .args(["context", "--config"])
        .arg(config)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OPENAI_API_KEY", "sk-sim")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("cairn-agent context")
}

fn ok(out: &Output) -> &[u8] {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    &out.stdout
}

/// A summary with the nine sections, long enough for the quality gate.
fn summary() -> String {
    let mut s = String::new();
    for (n, sec) in cairn_agent::compact::summarize::SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe build of module_7 fails with E0308.\n",
            n + 1
        ));
    }
    while s.len() < 2_500 {
        s.push_str("Details: the failing build step is module_7.\n");
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_prints_the_endpoints_report_from_the_journal_without_sending_or_fencing() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let config = dir.path().join("session.yaml");
    std::fs::write(
        &config,
        config_yaml(
            "inspected",
            &format!("{}/v1", sim.url()),
            200_000,
            "compaction:\n  minKeepRecent: 2\n",
        ),
    )
    .expect("config");
    let agent = AgentProcess::start(&config, &env, &dir.path().join("agent.log"));
    let api = agent.api();
    for i in 0..6 {
        sim.push_reply(ScriptedReply::text(format!(
            "answer {i}: {}",
            "the build of module_7 fails. ".repeat(40)
        )));
        let (status, body) = api
            .turn(&format!(
                "question {i}: why does module_7 fail? {}",
                "x".repeat(800)
            ))
            .await;
        assert_eq!(status, 200, "turn {i}: {body}");
    }
    sim.push_reply(ScriptedReply::text(summary()));
    let (status, body) = api.post("/v1/session/compact", json!({})).await;
    assert_eq!(status, 200, "compaction: {body}");
    sim.push_reply(ScriptedReply::text("noted"));
    let (status, body) = api.turn("after the compaction").await;
    assert_eq!(status, 200, "{body}");

    let input = "final question about module_7";
    let query = input.replace(' ', "%20");
    let (status, endpoint) = api.get(&format!("/v1/session/context?input={query}")).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&endpoint));
    let endpoint: Value = serde_json::from_slice(&endpoint).expect("endpoint JSON");
    let (status, endpoint_body) = api
        .get(&format!("/v1/session/context?view=request&input={query}"))
        .await;
    assert_eq!(status, 200);
    assert!(
        endpoint["summaries"]["count"].as_u64() >= Some(1),
        "{endpoint}"
    );

    let seen = sim.requests().len();
    let json = context(&config, &env, &["--json", "--input", input]);
    let report: Value = serde_json::from_slice(ok(&json)).expect("CLI JSON");
    assert_eq!(report, endpoint, "the CLI's report is the endpoint's");
    let body = context(&config, &env, &["--view", "request", "--input", input]);
    assert!(
        ok(&body) == endpoint_body.as_slice(),
        "the CLI's request is the endpoint's:\n{}\n---\n{}",
        String::from_utf8_lossy(&body.stdout),
        String::from_utf8_lossy(&endpoint_body)
    );
    let table = context(&config, &env, &["--input", input]);
    let table = String::from_utf8_lossy(ok(&table)).into_owned();
    eprintln!("{table}");
    for needle in [
        format!(
            "{:<36} {:>10}",
            "total",
            report["bodyBytes"].as_u64().unwrap_or(0)
        ),
        "summaries".to_owned(),
        "messages: user".to_owned(),
        "headroom: normal".to_owned(),
    ] {
        assert!(table.contains(&needle), "no {needle:?} in:\n{table}");
    }
    assert_eq!(
        sim.requests().len(),
        seen,
        "cairn-agent context sent nothing to the provider"
    );

    // The serving agent still owns its session, and the next request is what was shown.
    sim.push_reply(ScriptedReply::text("module_7 has a type mismatch"));
    let (status, out) = api.turn(input).await;
    assert_eq!(status, 200, "the serving agent was not fenced: {out}");
    let sent = sim.requests().pop().expect("the turn reached cairn-sim");
    assert!(
        body.stdout == sent.body.as_bytes(),
        "cairn-agent context --view request is the body cairn-sim received:\n{}\n---\n{}",
        String::from_utf8_lossy(&body.stdout),
        sent.body
    );
    let (_, view) = api.get("/v1/session").await;
    let view: Value = serde_json::from_slice(&view).expect("session JSON");
    assert_eq!(view["status"], "idle", "{view}");

    // Bad input is a clear error with the documented exit code.
    let missing = context(&dir.path().join("nope.yaml"), &env, &[]);
    assert_eq!(missing.status.code(), Some(2));
    let bad = context(&config, &env, &["--view", "everything"]);
    assert_eq!(bad.status.code(), Some(2));
}
