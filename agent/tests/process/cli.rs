//! `cairn-agent run` and `cairn-agent recall` as a script would use them: answer on stdout,
//! notices on stderr, the documented exit codes, the local directory as the default store.

use std::path::Path;
use std::process::{Command, Output};

use cairn_agent::ccr::Key;
use cairn_agent::history::{Message, ToolCall, to_jsonl};
use cairn_sim::nginx::{Middlebox, MiddleboxConfig};
use cairn_sim::{Fault, ScriptedReply, Sim};

use crate::support::agent::*;

async fn cairn(args: Vec<String>, data: &Path) -> Output {
    let data = data.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_cairn-agent"))
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("XDG_DATA_HOME", &data)
            .env("OPENAI_API_KEY", "sk-sim")
            .output()
            .expect("cairn-agent")
    })
    .await
    .expect("join")
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_answers_on_stdout_and_recall_prints_the_original() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = "compaction:\n  microcompact:\n    truncateAfterTurns: 1\n    summarizeAfterTurns: 50\n    minContentChars: 1000\n";
    let config = dir.path().join("s.yaml");
    std::fs::write(
        &config,
        config_yaml("cli", &format!("{}/v1", sim.url()), 200_000, policy),
    )
    .unwrap();
    let log: String = (0..400)
        .map(|i| format!("line {i}: test case_{i} passed\n"))
        .collect();
    let history = vec![
        Message::user("run the tests"),
        Message::assistant_calls(
            "",
            vec![ToolCall {
                id: "t1".into(),
                name: "bash".into(),
                arguments: r#"{"cmd":"cargo test"}"#.into(),
            }],
        ),
        Message::tool("t1", log.clone()),
        Message::assistant("All tests passed."),
    ];
    let hist = dir.path().join("h.jsonl");
    std::fs::write(&hist, to_jsonl(&history)).unwrap();

    sim.push_reply(ScriptedReply::text("the answer"));
    let out = cairn(
        vec![
            "run".into(),
            "--config".into(),
            s(&config),
            "--history".into(),
            s(&hist),
            "--prompt".into(),
            "how many passed?".into(),
        ],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "the answer\n");
    assert!(
        text(&out.stderr).contains("local directory"),
        "{}",
        text(&out.stderr)
    );
    let req = sim.requests().pop().expect("request");
    assert!(req.contains("how many passed?") && req.contains("run the tests"));
    // The history's old tool output was archived on the way.
    let key = Key::of(log.as_bytes());
    assert!(req.contains(&key.marker()));

    let out = cairn(
        vec!["recall".into(), key.marker(), "--config".into(), s(&config)],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout, log.as_bytes());
    let out = cairn(
        vec![
            "recall".into(),
            "ffffffffffffffff".into(),
            "--config".into(),
            s(&config),
        ],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let out = cairn(
        vec![
            "recall".into(),
            "nonsense".into(),
            "--config".into(),
            s(&config),
        ],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));

    // The prompt from a file; the journal carries the session on.
    let prompt = dir.path().join("p.txt");
    std::fs::write(&prompt, "and the slowest?").unwrap();
    let out = cairn(
        vec![
            "run".into(),
            "--config".into(),
            s(&config),
            "--prompt-file".into(),
            s(&prompt),
        ],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let req = sim.requests().pop().expect("request");
    assert!(req.contains("and the slowest?") && req.contains("how many passed?"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_bad_input_provider_failure_and_floor() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("s.yaml");
    std::fs::write(
        &config,
        config_yaml("codes", &format!("{}/v1", sim.url()), 200_000, ""),
    )
    .unwrap();
    let run = |extra: Vec<String>| {
        let mut a = vec!["run".to_string(), "--config".into(), s(&config)];
        a.extend(extra);
        a
    };

    let out = cairn(
        vec![
            "run".into(),
            "--config".into(),
            "/nonexistent.yaml".into(),
            "--prompt".into(),
            "x".into(),
        ],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"role\":\"robot\"}\n").unwrap();
    let out = cairn(
        run(vec![
            "--history".into(),
            s(&bad),
            "--prompt".into(),
            "x".into(),
        ]),
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("history line 1"),
        "{}",
        text(&out.stderr)
    );
    let out = cairn(run(vec!["--prompt".into(), "  ".into()]), dir.path()).await;
    assert_eq!(out.status.code(), Some(2));

    // An authentication failure is not something recovery may touch.
    sim.push_fault(Fault::Status {
        status: 401,
        retry_after: None,
    });
    let out = cairn(run(vec!["--prompt".into(), "hello".into()]), dir.path()).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("401"));
    assert!(out.stdout.is_empty());

    // A system prompt larger than the proxy's limit: no compaction can help.
    let nginx = Middlebox::start(
        sim.addr(),
        &MiddleboxConfig {
            limit: "16k".into(),
            block_at: 10_000_000,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let floor = dir.path().join("floor.yaml");
    let yaml = config_yaml("floor", &format!("{}/v1", nginx.url("/limit")), 200_000, "").replace(
        "systemPrompt: You are a test agent.",
        &format!("systemPrompt: {}", "rule. ".repeat(4_000)),
    );
    std::fs::write(&floor, yaml).unwrap();
    let out = cairn(
        vec![
            "run".into(),
            "--config".into(),
            s(&floor),
            "--prompt".into(),
            "hi".into(),
        ],
        dir.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("system prompt and tool catalog alone"),
        "{}",
        text(&out.stderr)
    );
}
