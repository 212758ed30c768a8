//! The agent end to end, in process, against real parts: cairn-sim as the provider, moto as
//! S3, nginx as the body-size-limiting proxy, and the HTTP API on a real socket.

use std::time::Duration;

use cairn_agent::ccr::Key;
use cairn_agent::history::{self, Message, ToolCall};
use cairn_agent::server::AppState;
use cairn_sim::nginx::{Middlebox, MiddleboxConfig};
use cairn_sim::{Fault, ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;
use crate::support::moto::Moto;

fn data_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// A 20-KB user message that is different every turn.
fn big_prompt(turn: usize) -> String {
    let mut s = format!("turn {turn}: please look at these numbers and answer ok.\n");
    let mut i = 0;
    while s.len() < 20_000 {
        s.push_str(&format!(
            "row {turn}-{i}: value {}\n",
            (turn * 7919 + i * 104_729) % 1_000_003
        ));
        i += 1;
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_session_crosses_the_window_several_times_and_keeps_answering() {
    let moto = Moto::start().await;
    let sim = Sim::start().await.expect("sim");
    // Window of the model: 40k tokens (~160 KB); every turn adds ~20 KB.
    sim.set_window(MODEL, 40_000);
    let dir = data_dir();
    let env = storage_env(dir.path(), Some(&moto.endpoint));
    let yaml = config_yaml("long", &format!("{}/v1", sim.url()), 40_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    let turns = 20;
    for t in 0..turns {
        let (status, body) = api.turn(&big_prompt(t)).await;
        assert_eq!(status, 200, "turn {t}: {body}");
        assert_eq!(output_text(&body), "ok", "turn {t}: {body}");
    }
    let session = api.session().await;
    let stats = &session["stats"];
    assert_eq!(stats["turns"], json!(turns));
    // 20 × 20 KB is 2.5 windows' worth of budget: the ladder ran several times.
    assert!(stats["compactions"].as_u64().unwrap_or(0) >= 3, "{session}");
    // Every request the provider saw fitted its window, and the last one carries the last
    // question.
    let requests: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.contains("please look at these numbers"))
        .collect();
    assert!(
        requests.iter().all(|r| r.outcome == "ok"),
        "an overflow reached the provider"
    );
    let last = requests.last().expect("requests");
    assert!(last.contains(&format!("turn {}: please", turns - 1)));
    assert!(last.estimated_tokens < 40_000);
}

/// A history with one large tool output, old enough to be microcompacted.
fn history_with_tool_output(log: &str) -> Vec<Message> {
    vec![
        Message::user("read the build log"),
        Message::assistant_calls(
            "",
            vec![ToolCall {
                id: "c1".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"build.log"}"#.into(),
            }],
        ),
        Message::tool("c1", log),
        Message::assistant("The build log is read."),
    ]
}

fn build_log() -> String {
    let mut s = String::new();
    for i in 0..600 {
        s.push_str(&format!(
            "[{i:04}] compiling module_{i} ... ok (0.{i:03}s)\n"
        ));
    }
    s.push_str("error[E0308]: mismatched types in module_599\n");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_of_an_archived_tool_output_is_identical_through_the_tool_and_the_api() {
    let moto = Moto::start().await;
    let sim = Sim::start().await.expect("sim");
    let dir = data_dir();
    let env = storage_env(dir.path(), Some(&moto.endpoint));
    let policy = "compaction:\n  microcompact:\n    truncateAfterTurns: 1\n    summarizeAfterTurns: 50\n    minContentChars: 1000\n";
    let yaml = config_yaml("recall", &format!("{}/v1", sim.url()), 200_000, policy);
    let mut built = build_session(&yaml, &env, "a").await;
    let log = build_log();
    built
        .session
        .replace_history(history_with_tool_output(&log))
        .await
        .expect("seed");
    let key = Key::of(log.as_bytes());
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    // Turn 1: the old tool output is microcompacted to a preview carrying its marker.
    let (status, body) = api.turn("summarise the log").await;
    assert_eq!(status, 200, "{body}");
    let first = sim.requests().pop().expect("request");
    assert!(
        first.contains(&key.marker()),
        "the request carries the marker"
    );
    assert!(
        !first.contains("[0300] compiling module_300"),
        "the middle of the log was cut"
    );

    // Turn 2: the model recalls it.
    sim.push_reply(ScriptedReply::tool_call(
        "recall",
        json!({"key": key.marker()}),
    ));
    sim.push_reply(ScriptedReply::text("found the error"));
    let (status, body) = api.turn("what exactly failed?").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output_text(&body), "found the error");
    let after_tool = sim.requests().pop().expect("request");
    let sent: Value = serde_json::from_str(&after_tool.body).expect("request json");
    let recalled = sent["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("tool result")
        .to_owned();
    assert_eq!(recalled, log, "the recall tool returned the original");

    let (status, bytes) = api.get(&format!("/v1/recall/{}", key.as_str())).await;
    assert_eq!(status, 200);
    assert_eq!(
        bytes,
        log.as_bytes(),
        "GET /v1/recall returned the original"
    );
    let (status, _) = api.get("/v1/recall/0123456789abcdef").await;
    assert_eq!(status, 404);
    let (status, _) = api.get("/v1/recall/not-a-key").await;
    assert_eq!(status, 400);

    // The pass counters are part of the session's status and survive a restart.
    let passes = api.session().await["stats"]["passes"].clone();
    assert!(
        passes["microcompacted"].as_u64().unwrap_or(0) > 0,
        "{passes}"
    );
    let reopened = build_session(&yaml, &env, "b").await;
    let stats = serde_json::to_value(reopened.session.stats()).expect("stats");
    assert_eq!(stats["passes"], passes, "rebuilt from the journal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_413_from_nginx_is_recovered_in_one_retry_thanks_to_the_learned_cap() {
    let sim = Sim::start().await.expect("sim");
    let nginx = Middlebox::start(
        sim.addr(),
        &MiddleboxConfig {
            limit: "64k".into(),
            block_at: 10_000_000,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = data_dir();
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml(
        "payload",
        &format!("{}/v1", nginx.url("/limit")),
        200_000,
        "",
    );
    let mut built = build_session(&yaml, &env, "a").await;
    built
        .session
        .replace_history(padded_history(10))
        .await
        .expect("seed");
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    let (status, body) = api.turn("and now?").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output_text(&body), "ok");
    let access = nginx.access_log();
    let statuses: Vec<&str> = access
        .lines()
        .filter_map(|l| {
            l.split('"')
                .nth(2)
                .and_then(|s| s.split_whitespace().next())
        })
        .collect();
    assert_eq!(statuses.first(), Some(&"413"), "{access}");
    assert!(
        statuses[1..].iter().all(|s| *s == "200"),
        "one rejection, then everything fits (summaries included): {access} {body}"
    );
    let asked = sim
        .requests()
        .into_iter()
        .filter(|r| r.contains("and now?"))
        .count();
    assert_eq!(asked, 1, "the turn's request was retried exactly once");
    let notices = body["cairn"]["notices"].as_array().expect("notices");
    assert!(notices.iter().any(|n| n["kind"] == "learned_cap"), "{body}");
    let cap = api.session().await["stats"]["learnedPayloadCap"]
        .as_u64()
        .expect("learned cap");
    assert!(
        (60_000..90_000).contains(&cap),
        "¾ of a ~100 KB request: {cap}"
    );

    // The next turn stays under the learned cap from the start: no rejection.
    let (status, body) = api.turn(&"x".repeat(5_000)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !nginx
            .access_log()
            .lines()
            .skip(2)
            .any(|l| l.contains("\" 413 "))
    );
}

/// A summary with the nine sections, long enough for the quality gate.
fn summary_text() -> String {
    let mut s = String::new();
    for (n, sec) in cairn_agent::compact::summarize::SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe user asked about the build; module_599 fails with E0308.\n",
            n + 1
        ));
    }
    while s.len() < 2_500 {
        s.push_str("Details: the failing build step is module_599; types mismatch.\n");
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_the_identical_history_and_rewind_undoes_a_compaction() {
    let moto = Moto::start().await;
    let sim = Sim::start().await.expect("sim");
    let dir = data_dir();
    let env = storage_env(dir.path(), Some(&moto.endpoint));
    let yaml = config_yaml("rebuild", &format!("{}/v1", sim.url()), 200_000, "");
    let mut built = build_session(&yaml, &env, "a").await;
    let log = build_log();
    let mut seed = history_with_tool_output(&log);
    seed.extend(padded_history(8));
    built.session.replace_history(seed).await.expect("seed");
    for t in 0..3 {
        built
            .session
            .turn(vec![Message::user(format!("turn {t}"))])
            .await
            .expect("turn");
    }
    let before = history::to_jsonl(built.session.history());
    sim.push_reply(ScriptedReply::text(summary_text()));
    let out = built
        .session
        .compact_now(Some("keep the build errors".into()))
        .await
        .expect("compact");
    assert!(out.bytes_after < out.bytes_before, "{out:?}");
    let compacted = history::to_jsonl(built.session.history());
    assert!(cairn_agent::ccr::has_marker(&compacted));
    built
        .session
        .turn(vec![Message::user("after the compaction")])
        .await
        .expect("turn");
    let latest = history::to_jsonl(built.session.history());
    drop(built);

    // A new process (here: a new session over the same storage) rebuilds it byte for byte.
    let mut again = build_session(&yaml, &env, "b").await;
    assert_eq!(history::to_jsonl(again.session.history()), latest);

    // Rewind: the history before the compaction, plus what came after it.
    again.session.rewind().await.expect("rewind");
    let rewound = history::to_jsonl(again.session.history());
    assert!(
        rewound.starts_with(&before),
        "the pre-compaction history is back"
    );
    assert!(rewound.contains("after the compaction"));
    assert!(
        again.session.rewind().await.is_err(),
        "one compaction, one rewind"
    );
    drop(again);
    let third = build_session(&yaml, &env, "c").await;
    assert_eq!(history::to_jsonl(third.session.history()), rewound);
}

/// A manual compaction, summarized by the simulator, that shrinks the history.
async fn compact_shrinks(sim: &Sim, session: &mut cairn_agent::session::Session) {
    sim.push_reply(ScriptedReply::text(summary_text()));
    let out = session.compact_now(None).await.expect("compact");
    assert!(out.bytes_after < out.bytes_before, "{out:?}");
}

/// Issue 35: rewinds in a row undo compactions newest first, each back to the history
/// before it, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rewinds_undo_two_compactions_across_a_restart() {
    let moto = Moto::start().await;
    let sim = Sim::start().await.expect("sim");
    let dir = data_dir();
    let env = storage_env(dir.path(), Some(&moto.endpoint));
    let yaml = config_yaml("rewind2", &format!("{}/v1", sim.url()), 200_000, "");
    let mut built = build_session(&yaml, &env, "a").await;
    let log = build_log();
    let mut seed = history_with_tool_output(&log);
    seed.extend(padded_history(8));
    built.session.replace_history(seed).await.expect("seed");
    let before_first = history::to_jsonl(built.session.history());
    compact_shrinks(&sim, &mut built.session).await;
    for t in 0..6 {
        built
            .session
            .turn(vec![Message::user(format!(
                "turn {t}: {}",
                "w".repeat(6_000)
            ))])
            .await
            .expect("turn");
    }
    let before_second = history::to_jsonl(built.session.history());
    compact_shrinks(&sim, &mut built.session).await;
    assert_eq!(built.session.rewind_levels(), 2);
    let latest = history::to_jsonl(built.session.history());
    drop(built);

    let mut again = build_session(&yaml, &env, "b").await;
    assert_eq!(history::to_jsonl(again.session.history()), latest);
    assert_eq!(
        again.session.rewind_levels(),
        2,
        "the levels survive a restart"
    );
    again.session.rewind().await.expect("first rewind");
    assert_eq!(
        history::to_jsonl(again.session.history()),
        before_second,
        "the first rewind gives the history before the second compaction"
    );
    assert_eq!(again.session.rewind_levels(), 1);
    drop(again);

    let mut third = build_session(&yaml, &env, "c").await;
    assert_eq!(third.session.rewind_levels(), 1);
    third.session.rewind().await.expect("second rewind");
    let back = history::to_jsonl(third.session.history());
    assert!(
        back.starts_with(&before_first),
        "the second rewind gives the history before the first compaction"
    );
    assert!(back.contains("turn 5: "), "plus what came after it");
    assert!(
        third.session.rewind().await.is_err(),
        "two compactions, two rewinds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_down_fails_the_turn_clearly_and_leaves_the_history_unchanged() {
    let moto = Moto::start().await;
    let sim = Sim::start().await.expect("sim");
    let dir = data_dir();
    let env = storage_env(dir.path(), Some(&moto.endpoint));
    let yaml = config_yaml("s3down", &format!("{}/v1", sim.url()), 200_000, "");
    let mut built = build_session(&yaml, &env, "a").await;
    built
        .session
        .turn(vec![Message::user("hello")])
        .await
        .expect("turn");
    let before = built.session.history().to_vec();
    drop(moto);
    let err = built
        .session
        .turn(vec![Message::user("are you there?")])
        .await
        .expect_err("S3 is down");
    // Nothing answers, not even the read-back of the write: its outcome is unknown, and the
    // history stays what the journal is known to hold.
    assert_eq!(err.label(), "journal_unknown", "{err}");
    assert!(err.to_string().contains("unknown"), "{err}");
    assert_eq!(built.session.history(), before.as_slice());
    let again = built
        .session
        .turn(vec![Message::user("still there?")])
        .await
        .expect_err("S3 is still down");
    assert!(
        again.to_string().contains("not settled"),
        "nothing is written before the unknown outcome is settled: {again}"
    );
    assert_eq!(built.session.history(), before.as_slice());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_at_a_time_auth_and_validation() {
    let sim = Sim::start().await.expect("sim");
    let dir = data_dir();
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("http", &format!("{}/v1", sim.url()), 200_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    sim.push_fault(Fault::Latency { ms: 1_500 });
    let slow = {
        let api = api.clone();
        tokio::spawn(async move { api.turn("slow one").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = api.turn("impatient").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "session_busy");
    let (status, _) = slow.await.expect("join");
    assert_eq!(status, 200);

    // A connection per request: a pooled connection the agent has just closed (idle past its
    // header timeout, or after refusing an oversized body unread) fails when it is reused.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = |p: &str| format!("{}{p}", api.base);
    let r = http
        .post(url("/v1/responses"))
        .json(&json!({"input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = http
        .get(url("/v1/session"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(
        http.get(url("/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        http.get(url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let r = http
        .post(url("/v1/responses"))
        .bearer_auth(TOKEN)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_json");
    let (status, v) = api
        .post(
            "/v1/responses",
            json!({"input": [{"role": "assistant", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    let r = http
        .post(url("/v1/responses"))
        .bearer_auth(TOKEN)
        .body(vec![b' '; 2 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "body_too_large");
    let (status, v) = api
        .post("/v1/session/compact", json!({"instruction": 5}))
        .await;
    assert_eq!(status, 400, "{v}");
    let (status, v) = api
        .post("/v1/session/compact", json!({"instruction": "keep names"}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["trigger"], "manual");
    // Nothing in this short history could be compacted, so there is nothing to undo.
    let (status, v) = api.post("/v1/session/rewind", json!({})).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "nothing_to_rewind");
    let metrics = http
        .get(url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("cairn_agent_turns_total{outcome=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_agent_request_bytes_count"),
        "{metrics}"
    );
    // Only families dashboards read, under their listed series names and types. A family
    // with no series yet is left out, so this is the list less what the test never touched.
    let exposed = cairn_agent::metrics::exposed_families(&metrics);
    let listed: Vec<String> = include_str!("../data/metrics-series.txt")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| exposed.iter().any(|e| e == l))
        .map(str::to_owned)
        .collect();
    assert_eq!(exposed, listed, "{metrics}");
    for family in [
        "cairn_agent_turns_total counter",
        "cairn_agent_tokens_total counter",
        "cairn_agent_history_bytes gauge",
        "cairn_agent_request_bytes histogram",
        "cairn_agent_turn_seconds histogram",
        "cairn_agent_archive_puts_total counter",
    ] {
        assert!(exposed.iter().any(|e| e == family), "{family}\n{metrics}");
    }
}
