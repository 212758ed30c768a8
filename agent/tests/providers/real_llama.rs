//! Against a real model server: llama.cpp's `llama-server` with SmolLM2-135M-Instruct and a
//! small context (2,048 and 1,024 tokens), its own tokenizer (1.6–1.8 bytes per token on
//! logs, far from the usual 4) and its own error bodies. The served session must answer every
//! turn whatever `contextWindow` says, learn the real window from the server's numbers, never
//! resend a rejected request unchanged, and say so when a reply was cut by a full context.
//!
//! Model output is real and varies: the tests assert properties (status codes, sizes, what
//! the server counted, notices), never text.

use std::path::Path;
use std::time::Duration;

use cairn_tests::harness::llama::Recorded;
use cairn_tests::harness::{LlamaServer, RecordingProxy};
use serde_json::json;

use crate::support::agent::*;

/// Prose of about `bytes` bytes, different for every `seed`.
fn prose(seed: usize, bytes: usize) -> String {
    const WORDS: [&str; 24] = [
        "the",
        "cluster",
        "operator",
        "reconciles",
        "sessions",
        "while",
        "a",
        "proxy",
        "limits",
        "request",
        "bodies",
        "and",
        "every",
        "archive",
        "keeps",
        "originals",
        "so",
        "nothing",
        "is",
        "lost",
        "when",
        "context",
        "windows",
        "fill",
    ];
    let mut s = format!("Note {seed}: ");
    let mut i = seed;
    while s.len() < bytes {
        i = i.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        s.push_str(WORDS[(i >> 16) % WORDS.len()]);
        s.push(if (i >> 8).is_multiple_of(11) {
            '.'
        } else {
            ' '
        });
    }
    s.push_str("\nSummarize this note in one sentence.");
    s
}

fn config(kind: &str, base_url: &str, window: Option<u64>) -> String {
    config_with(kind, base_url, window, &Summaries::Session)
}

/// Who writes a session's level-2 summaries.
#[derive(Clone)]
enum Summaries {
    /// Level 2 off (each summary is a model call the runs that test the summarizer pay for
    /// the others).
    Off,
    /// The session's own server.
    Session,
    /// A dedicated 8,192-token server at this base URL: a 2,048-token window cannot hold the
    /// summary instructions and a transcript.
    Dedicated(String),
}

/// A session spec.
fn config_with(kind: &str, base_url: &str, window: Option<u64>, summaries: &Summaries) -> String {
    let window = window
        .map(|w| format!("contextWindow: {w}\n"))
        .unwrap_or_default();
    let compaction = match summaries {
        Summaries::Session => String::new(),
        Summaries::Dedicated(url) => format!(
            "compaction:\n  summarizer:\n    provider: openai-compatible\n    model: smollm2-135m-instruct\n    baseUrl: {url}/v1\n    contextWindow: 8192\n"
        ),
        Summaries::Off => "compaction:\n  summarizer: {enabled: false}\n".to_owned(),
    };
    format!(
        "name: llama\nnamespace: tests\nprovider:\n  kind: {kind}\n  model: smollm2-135m-instruct\n  baseUrl: {base_url}\n{window}maxOutputTokens: 48\nsystemPrompt: You are a concise assistant.\n{compaction}"
    )
}

/// Model calls (not health checks) the proxy saw.
pub(crate) fn calls(proxy: &RecordingProxy) -> Vec<Recorded> {
    proxy
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/"))
        .collect()
}

/// Every rejected request (a 4xx: an overflow, a payload cap) was followed by a different
/// one: no attempt resent the same bytes. A 5xx is the server's failure, which the retry
/// policy may resend as it was.
pub(crate) fn assert_no_unchanged_resend(log: &[Recorded]) {
    for pair in log.windows(2) {
        if (400..500).contains(&pair[0].status) {
            assert_ne!(
                pair[0].sha256, pair[1].sha256,
                "a rejected request ({} bytes, {}) was resent unchanged",
                pair[0].bytes, pair[0].answer_head
            );
        }
    }
}

struct Run {
    kind: &'static str,
    window: Option<u64>,
    turns: usize,
    /// Level-2 summaries: a dedicated server in the first run of each server size, else off.
    summaries: Summaries,
}

/// Drives one served session for `run.turns` turns of 3–5 KB and checks the promises.
async fn drive(server: &LlamaServer, dir: &Path, run: &Run) {
    let proxy = RecordingProxy::start(&server.url).await.expect("proxy");
    let base = format!("{}/v1", proxy.url);
    let data = dir.join(format!(
        "{}-{}-{}",
        run.kind,
        server.ctx_size,
        run.window.map_or("unset".into(), |w| w.to_string())
    ));
    std::fs::create_dir_all(&data).expect("dir");
    let cfg = data.join("session.yaml");
    std::fs::write(
        &cfg,
        config_with(run.kind, &base, run.window, &run.summaries),
    )
    .expect("config");
    let mut env = storage_env(&data, None);
    // llama-server wants no key; cairn's Anthropic client insists on one.
    env.push(("ANTHROPIC_API_KEY".into(), "sk-none".into()));
    env.push(("CAIRN_SUMMARIZER_API_KEY".into(), "sk-none".into()));
    let agent = AgentProcess::start(&cfg, &env, &data.join("agent.log"));
    let api = patient(&agent);
    let mut first_overflow = None;
    for turn in 0..run.turns {
        let before = calls(&proxy).len();
        let size = 3_000 + (turn * 1_237) % 2_000;
        let (status, body) = api.turn(&prose(turn, size)).await;
        let during = &calls(&proxy)[before..];
        assert_eq!(
            status,
            200,
            "{} ctx {} window {:?}: turn {turn} failed: {body}\nagent log tail:\n{}",
            run.kind,
            server.ctx_size,
            run.window,
            tail(&agent.log())
        );
        let rejected = during.iter().filter(|r| r.status >= 400).count();
        if rejected > 0 && first_overflow.is_none() {
            first_overflow = Some(turn);
        } else if first_overflow.is_some() {
            assert!(
                rejected <= 1,
                "turn {turn} needed {rejected} retries after the first overflow (turn {first_overflow:?})"
            );
        }
        let view = api.session().await;
        let recent = view["recent"].as_array().cloned().unwrap_or_default();
        let roles: Vec<&str> = recent.iter().filter_map(|m| m["role"].as_str()).collect();
        assert!(
            roles.ends_with(&["user", "assistant"]),
            "the newest exchange is kept: {roles:?}"
        );
    }
    let log = calls(&proxy);
    assert_no_unchanged_resend(&log);
    let view = api.session().await;
    let stats = &view["stats"];
    let effective = stats["effectiveContextWindow"].as_u64().unwrap_or(0);
    assert!(
        effective <= u64::from(server.ctx_size),
        "the session budgets against the server's window: {stats}"
    );
    if run.window.is_none_or(|w| w > u64::from(server.ctx_size)) {
        assert_eq!(
            stats["learnedContextWindow"].as_u64(),
            Some(u64::from(server.ctx_size)),
            "GET /v1/session shows the learned window: {stats}"
        );
    }
    // Calibrated from the server's counts, not the assumed 4 (llama.cpp's SmolLM2 template
    // does not render the tool catalog, so the ratio over everything cairn sends is high).
    let ratio = stats["bytesPerToken"].as_f64().unwrap_or(0.0);
    assert!(
        (1.0..=8.0).contains(&ratio) && (ratio - 4.0).abs() > 0.05,
        "the ratio follows the server's own count: {ratio}"
    );
    if let Summaries::Dedicated(_) = run.summaries {
        // Level 2 ran on the real model: each summary accepted or rejected by the gate (the
        // nine sections), counted alike in status and metrics. On the 1,024-token server a
        // turn of 3-5 KB fills the window by itself: level 3 empties the history before
        // level 2 would find anything to summarize.
        let summaries = &stats["summaries"];
        let n = |k: &str| summaries[k].as_u64().unwrap_or(0);
        assert!(
            server.ctx_size < 2_048 || n("accepted") + n("rejected") >= 1,
            "no level-2 summary came back from the real model: {stats}"
        );
        let metrics = String::from_utf8(api.get("/metrics").await.1).unwrap_or_default();
        for outcome in ["accepted", "rejected", "failed", "skipped"] {
            let counted: f64 = metrics
                .lines()
                .filter(|l| {
                    l.starts_with("cairn_agent_summaries_total")
                        && l.contains(&format!("outcome=\"{outcome}\""))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            assert_eq!(counted as u64, n(outcome), "{outcome}: {stats}\n{metrics}");
        }
        eprintln!(
            "{} ctx {}: level-2 summaries {summaries}",
            run.kind, server.ctx_size
        );
    }
    eprintln!(
        "{} ctx {} window {:?}: {} turns, {} model calls, {} rejected, first overflow at turn {first_overflow:?}, {ratio} bytes/token",
        run.kind,
        server.ctx_size,
        run.window,
        run.turns,
        log.len(),
        log.iter().filter(|r| r.status >= 400).count()
    );
}

/// A client that waits as long as a 135M model on two busy cores may need for one turn.
fn patient(agent: &AgentProcess) -> Api {
    Api {
        base: agent.url.clone(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()
            .expect("client"),
    }
}

/// The real-model tests run two at a time: each server computes on one thread
/// (`tests/src/harness/llama.rs`), so two of them keep both cores busy, and a third would
/// only slow the two down.
pub(crate) static MODEL_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Waits for one of the two [`MODEL_SLOTS`].
pub(crate) async fn model_slot() -> tokio::sync::SemaphorePermit<'static> {
    MODEL_SLOTS
        .acquire()
        .await
        .expect("the semaphore is never closed")
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn logs_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn full_matrix() -> bool {
    std::env::var("CAIRN_LLAMA_FULL_MATRIX").is_ok_and(|v| v == "1")
}

/// Turns each served session runs (`CAIRN_LLAMA_TURNS` overrides): a turn of 3–5 KB is
/// about half of a 2,048-token window, so from the third turn on every turn compacts, and a
/// run is some ten compactions in a row, each with at most one retry. A turn costs ~15 s of
/// one core on the real model; twelve keep the lane inside CI's budget on a slow machine
/// (docs/benchmarks.md, "The llama lane").
fn turns() -> usize {
    std::env::var("CAIRN_LLAMA_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

/// The window settings one API family runs with on a server of `ctx` tokens: the
/// OpenAI-compatible client every setting (unset, too high, right); the other two families
/// unset (for this unknown model that is the default of 32,768 tokens: too high) and set
/// right. `CAIRN_LLAMA_FULL_MATRIX=1` adds the explicit 32,768 for them too.
fn matrix(ctx: u64, kind: &'static str) -> Vec<(&'static str, Option<u64>)> {
    let windows: &[Option<u64>] = if kind == "openai-compatible" || full_matrix() {
        &[None, Some(32_768), Some(ctx)]
    } else {
        &[None, Some(ctx)]
    };
    windows.iter().map(|w| (kind, *w)).collect()
}

/// Every run of `runs` against one server of `ctx` tokens. With `summaries`, the first run
/// writes its level-2 summaries on a dedicated 8,192-token server; the others have level 2
/// off.
async fn converge_on(ctx: u32, runs: Vec<(&'static str, Option<u64>)>, summaries: bool) {
    let _slot = model_slot().await;
    let dir = logs_dir();
    let server = LlamaServer::start(dir.path(), ctx).expect("llama-server");
    let summarizer =
        summaries.then(|| LlamaServer::start(dir.path(), 8_192).expect("summarizer llama-server"));
    for (i, (kind, window)) in runs.into_iter().enumerate() {
        let run = Run {
            kind,
            window,
            turns: turns(),
            summaries: match &summarizer {
                Some(s) if i == 0 => Summaries::Dedicated(s.url.clone()),
                _ => Summaries::Off,
            },
        };
        drive(&server, dir.path(), &run).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_sessions_converge_on_a_2048_token_server_chat_completions() {
    converge_on(2_048, matrix(2_048, "openai-compatible"), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_sessions_converge_on_a_2048_token_server_responses() {
    converge_on(2_048, matrix(2_048, "openai-responses"), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_sessions_converge_on_a_2048_token_server_messages() {
    converge_on(2_048, matrix(2_048, "anthropic"), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_sessions_converge_on_a_1024_token_server() {
    let mut runs = matrix(1_024, "openai-compatible");
    if full_matrix() {
        runs.extend(matrix(1_024, "openai-responses"));
        runs.extend(matrix(1_024, "anthropic"));
    }
    converge_on(1_024, runs, true).await;
}

/// `cairn-agent run` with a 41 KB history of logs and tool round trips: one overflow, then
/// success at the first recovery attempt, with the server's numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_recovers_a_41kb_history_at_the_first_attempt() {
    let _slot = model_slot().await;
    let dir = logs_dir();
    let server = LlamaServer::start(dir.path(), 2_048).expect("llama-server");
    let proxy = RecordingProxy::start(&server.url).await.expect("proxy");
    let data = dir.path().join("run");
    std::fs::create_dir_all(&data).expect("dir");
    let cfg = data.join("session.yaml");
    std::fs::write(
        &cfg,
        config("openai-compatible", &format!("{}/v1", proxy.url), None),
    )
    .expect("config");
    let history = data.join("history.jsonl");
    let mut lines = Vec::new();
    let mut bytes = 0;
    let mut i = 0;
    while bytes < 41_000 {
        let log: String = (0..40)
            .map(|n| format!("2026-11-30T08:{:02}:{:02}Z INFO request_id={:08x} path=/v1/items/{} status=200 latency_ms={}\n", (i + n) % 60, n % 60, i * 977 + n, n * 7, n % 311))
            .collect();
        let call = json!({"role": "assistant", "content": "", "tool_calls": [{"id": format!("c{i}"), "name": "bash", "arguments": format!("{{\"command\":\"tail -40 /var/log/app-{i}.log\"}}")}]});
        let result = json!({"role": "tool", "content": log, "tool_call_id": format!("c{i}")});
        let user = json!({"role": "user", "content": format!("Check the log of service {i}.")});
        let answer = json!({"role": "assistant", "content": format!("Service {i} answered every request with 200.")});
        for v in [user, call, result, answer] {
            let l = v.to_string();
            bytes += l.len();
            lines.push(l);
        }
        i += 1;
    }
    std::fs::write(&history, lines.join("\n") + "\n").expect("history");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cairn-agent"))
        .args(["run", "--config"])
        .arg(&cfg)
        .arg("--history")
        .arg(&history)
        .args(["--prompt", "Which services answered with errors?"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OPENAI_API_KEY", "none")
        .envs(storage_env(&data, None))
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run failed: {stderr}");
    let log = calls(&proxy);
    let statuses: Vec<u16> = log.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        vec![400, 200],
        "one overflow, then success at the first attempt: {stderr}"
    );
    assert!(
        log[0].answer_head.contains("n_prompt_tokens"),
        "{}",
        log[0].answer_head
    );
    assert!(log[1].bytes < log[0].bytes, "the retry is smaller");
    assert!(
        stderr.contains("[learned_window]") && stderr.contains("2048 tokens"),
        "the notice names the server's numbers: {stderr}"
    );
}

/// A reply cut because the context filled during generation is never silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_by_a_full_context_is_reported() {
    let _slot = model_slot().await;
    let dir = logs_dir();
    // A small context fills within a few hundred generated tokens.
    let server = LlamaServer::start(dir.path(), 512).expect("llama-server");
    let proxy = RecordingProxy::start(&server.url).await.expect("proxy");
    let data = dir.path().join("full");
    std::fs::create_dir_all(&data).expect("dir");
    let cfg = data.join("session.yaml");
    // The session believes 32,768 tokens and may write 8,192: the 512-token context fills
    // long before that.
    let yaml = config("openai-compatible", &format!("{}/v1", proxy.url), None)
        .replace("maxOutputTokens: 48", "maxOutputTokens: 8192");
    std::fs::write(&cfg, yaml).expect("config");
    let agent = AgentProcess::start(&cfg, &storage_env(&data, None), &data.join("agent.log"));
    let api = patient(&agent);
    let mut seen = false;
    for attempt in 0..6 {
        let (status, body) = api
            .post(
                "/v1/responses",
                json!({"model": MODEL, "input": format!("Write a very long story about a lighthouse keeper, chapter after chapter, never stopping. Version {attempt}.")}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let notices = body["cairn"]["notices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if notices.iter().any(|n| n["kind"] == "truncated") {
            seen = true;
            assert_eq!(body["status"], "incomplete", "{body}");
            break;
        }
        // The model ended its story on its own: ask again.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        seen,
        "no truncation notice; agent log:\n{}",
        tail(&agent.log())
    );
    let view = api.session().await;
    assert!(
        view["stats"]["truncatedReplies"].as_u64().unwrap_or(0) >= 1,
        "{view}"
    );
    assert_no_unchanged_resend(&calls(&proxy));
    let metrics = String::from_utf8(api.get("/metrics").await.1).unwrap_or_default();
    assert!(
        metrics.contains("cairn_agent_truncated_replies_total"),
        "{metrics}"
    );
}

/// The retention probe with the real model writing level 2: the synthetic coding session
/// (reads, shell runs, every third run failing to compile), compacted by hand with
/// `summarizer.structured` (the server fills the nine sections under the `json_schema`
/// output format). The summary passes the quality gate; the table row of what stays in sight
/// with cairn's sections and ledger and without them (the summary alone) is printed
/// (docs/benchmarks.md, `cargo test -p cairn-agent --test providers structured_level_2 --
/// --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_model_writes_a_structured_level_2_summary_and_the_probe_scores_it() {
    use cairn_engine::artifacts::Category;
    use cairn_engine::compact::ledger::without_section;
    use cairn_engine::compact::probe::retention;
    use cairn_engine::compact::state::SummaryVerdict;
    // The summary is about 1,100 tokens sampled under the schema's grammar: some 250 s on a
    // quiet 2-core machine (docs/benchmarks.md), over the default 300 s call deadline beside
    // the other lanes. The deadline is sized for a loaded machine.
    const CALL_SECONDS: u32 = 900;
    let _slot = model_slot().await;
    let dir = logs_dir();
    let server = LlamaServer::start(dir.path(), 8_192).expect("llama-server");
    let yaml = format!(
        "name: probe\nnamespace: tests\nprovider:\n  kind: openai-compatible\n  model: smollm2-135m-instruct\n  baseUrl: {}/v1\ncontextWindow: 8192\nmaxOutputTokens: 2048\nsystemPrompt: You are a concise assistant.\ncompaction:\n  minKeepRecent: 2\n  summarizer:\n    structured: true\n  timeouts:\n    providerCallSeconds: {CALL_SECONDS}\n    turnSeconds: {CALL_SECONDS}\n",
        server.url
    );
    let env = storage_env(dir.path(), None);
    let mut built = build_session(&yaml, &env, "probe").await;
    assert!(built.session.stats().unsupported.is_empty());
    let mut before = cairn_engine::testing::session(60_000);
    let runs = before
        .iter_mut()
        .filter(|m| m.name.as_deref() == Some("bash"));
    for (n, m) in runs.enumerate().filter(|(n, _)| n.is_multiple_of(3)) {
        m.content = format!(
            "   Compiling cairn v0.1.0\nerror[E0308]: mismatched types in run {n}\n{}",
            m.content
        );
    }
    // A short last exchange: the two messages the compaction keeps.
    before.push(cairn_agent::history::Message::user(
        "Is the build fixed now?",
    ));
    before.push(cairn_agent::history::Message::assistant(
        "Not yet: module 3 still fails.",
    ));
    built
        .session
        .replace_history(before.clone())
        .await
        .expect("seed");
    let out = built.session.compact_now(None).await.expect("a compaction");
    let stats = built.session.stats();
    assert_eq!(
        (out.summary, stats.summaries.accepted),
        (Some(SummaryVerdict::Accepted), 1),
        "the real model's structured summary passed the gate: {out:?}\n{:?}",
        stats.summaries
    );
    // Level 3 follows when the summary and the kept tail still exceed the target.
    let level = out.level.unwrap_or(0);
    assert!(level >= 2, "{out:?}");
    let after = built.session.history().to_vec();
    let summary = after
        .iter()
        .find(|m| m.meta.is_summary)
        .expect("the summary");
    for heading in cairn_agent::compact::summarize::SECTIONS {
        assert!(
            summary.content.contains(heading),
            "{heading}: {}",
            summary.content
        );
    }
    let q = out.quality.clone().expect("scored");
    let alone: Vec<_> = after
        .iter()
        .map(|m| {
            let mut m = m.clone();
            let own = cairn_engine::compact::sections::summarizer_text(&m.content);
            m.content = without_section(&own).to_owned();
            m
        })
        .collect();
    for (label, history) in [("with cairn's sections", &after), ("summary alone", &alone)] {
        let r = retention(&before, history, &|_| None);
        let cell = |c: Category| {
            let t = r.tally(c);
            format!("{}/{}", t.present, t.total)
        };
        eprintln!(
            "| 60 KB | {level} (SmolLM2-135M summary, structured) | {label} | {:.2} | {} | {} | {} | {} |",
            r.score(),
            cell(Category::Files),
            cell(Category::Commands),
            cell(Category::Errors),
            cell(Category::Requests),
        );
    }
    eprintln!("compaction's own score {:.2}: {q:?}", q.score);
    for c in [q.files, q.commands, q.errors] {
        assert_eq!(c.in_sight, c.at_stake, "with the ledger: {q:?}");
    }
}
