//! Prompt caching and cost against cairn-sim speaking each provider's cache fields: the
//! request prefix (tools, system prompt, earlier turns) is byte-stable turn to turn, the
//! breakpoints sit where each provider documents them, the cache reads and writes the
//! simulator reports land in usage, status and metrics, and the cost of the session model
//! and of a separate summarizer model match a hand computation from the recorded usage.

use cairn_agent::history::Message;
use cairn_agent::metrics::{CostLabels, ModelTokenLabels, TokenLabels};
use cairn_sim::{RecordedRequest, ScriptedReply, Sim, Wire};
use serde_json::Value;

use crate::support::agent::*;

const TURNS: usize = 20;

fn kind_yaml(kind: &str) -> &'static str {
    match kind {
        "anthropic" => "claude-sonnet-4-5",
        "bedrock" => "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "gemini" => "gemini-2.5-pro",
        _ => "gpt-5",
    }
}

fn session_yaml(kind: &str, sim: &Sim, extra: &str) -> String {
    let base = match kind {
        "openai" | "openai-responses" => format!("{}/v1", sim.url()),
        _ => sim.url(),
    };
    format!(
        "name: cache-{kind}\nnamespace: tests\nprovider:\n  kind: {kind}\n  model: {}\n  baseUrl: {base}\n  region: us-east-1\ncontextWindow: 200000\nmaxOutputTokens: 1000\nsystemPrompt: You are a test agent. Answer every question about the numbers in full.\n{extra}",
        kind_yaml(kind)
    )
}

/// The body without its cache markers (they move to the newest block every turn; the
/// providers leave them out of the cached prefix).
fn unmarked(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| *k != "cache_control")
                .map(|(k, v)| (k.clone(), unmarked(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|b| b.get("cachePoint").is_none())
                .map(unmarked)
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The parts of a body that lead the prompt (tools, system prompt), and the conversation.
fn split(r: &RecordedRequest) -> (Vec<String>, Vec<Value>) {
    let v: Value = serde_json::from_str(&r.body).expect("json body");
    let v = unmarked(&v);
    let (fixed, turns): (&[&str], &str) = match r.wire {
        Wire::Anthropic => (&["tools", "system"], "messages"),
        Wire::Bedrock => (&["toolConfig", "system"], "messages"),
        Wire::Gemini => (&["tools", "systemInstruction"], "contents"),
        Wire::OpenaiResponses => (&["tools", "instructions"], "input"),
        Wire::OpenaiChat => (&["tools"], "messages"),
    };
    let fixed = fixed.iter().map(|k| v[*k].to_string()).collect();
    let turns = v[turns].as_array().cloned().unwrap_or_default();
    (fixed, turns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefix_is_byte_stable_breakpoints_sit_where_documented_and_cache_tokens_are_counted() {
    for kind in [
        "anthropic",
        "bedrock",
        "openai",
        "openai-responses",
        "gemini",
    ] {
        let sim = Sim::start().await.expect("sim");
        sim.enable_prompt_cache();
        let dir = tempfile::tempdir().expect("dir");
        let env = storage_env(dir.path(), None);
        let mut built = build_session(&session_yaml(kind, &sim, ""), &env, "test").await;
        let mut output_tokens = 0;
        for i in 0..TURNS {
            let answer = format!("Answer {i}: the number {i} squared is {}.", i * i);
            output_tokens += (answer.chars().count() as u64).div_ceil(4);
            sim.push_reply(ScriptedReply::text(answer));
            built
                .session
                .turn(vec![Message::user(format!("What is {i} squared?"))])
                .await
                .unwrap_or_else(|e| panic!("{kind} turn {i}: {e}"));
        }
        let seen = sim.requests();
        assert_eq!(seen.len(), TURNS, "{kind}");
        assert!(seen.iter().all(|r| r.outcome == "ok"), "{kind}");

        // The prefix: the same tools and system bytes every turn, and every earlier turn as
        // it was sent before.
        let (fixed0, _) = split(&seen[0]);
        for w in seen.windows(2) {
            let (fixed_a, turns_a) = split(&w[0]);
            let (fixed_b, turns_b) = split(&w[1]);
            assert_eq!(
                fixed_b, fixed0,
                "{kind}: request {} changed the prefix",
                w[1].seq
            );
            assert_eq!(fixed_a, fixed0, "{kind}");
            assert!(turns_b.len() > turns_a.len(), "{kind}");
            assert_eq!(
                turns_b[..turns_a.len()],
                turns_a[..],
                "{kind}: request {} rewrote an earlier turn",
                w[1].seq
            );
        }

        // Breakpoints where the provider documents them; none for the automatic caches.
        for r in &seen {
            let v: Value = serde_json::from_str(&r.body).expect("json");
            match r.wire {
                Wire::Anthropic => {
                    let tools = v["tools"].as_array().map_or(0, Vec::len);
                    let turns = v["messages"].as_array().expect("messages");
                    let last = turns.len() - 1;
                    let blocks = turns[last]["content"].as_array().map_or(0, Vec::len);
                    assert_eq!(
                        r.cache_breakpoints,
                        [
                            format!("tools[{}]", tools - 1),
                            "system[0]".to_string(),
                            format!("messages[{last}].content[{}]", blocks - 1),
                        ],
                        "{kind}"
                    );
                }
                Wire::Bedrock => {
                    let tools = v["toolConfig"]["tools"].as_array().map_or(0, Vec::len);
                    let turns = v["messages"].as_array().expect("messages");
                    let last = turns.len() - 1;
                    let blocks = turns[last]["content"].as_array().map_or(0, Vec::len);
                    assert_eq!(
                        r.cache_breakpoints,
                        [
                            format!("toolConfig.tools[{}]", tools - 1),
                            "system[1]".to_string(),
                            format!("messages[{last}].content[{}]", blocks - 1),
                        ],
                        "{kind}"
                    );
                }
                _ => {
                    assert!(r.cache_breakpoints.is_empty(), "{kind}");
                    assert!(
                        !r.contains("cache_control") && !r.contains("cachePoint"),
                        "{kind}: {}",
                        r.body
                    );
                }
            }
        }

        // The cache: from the second turn on, the whole previous prompt is read (Anthropic,
        // Bedrock: what the previous request read and wrote), or a growing shared prefix.
        assert_eq!(seen[0].cache_read_tokens, 0, "{kind}");
        for w in seen.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            match b.wire {
                Wire::Anthropic | Wire::Bedrock => {
                    assert_eq!(
                        b.cache_read_tokens,
                        a.cache_read_tokens + a.cache_write_tokens,
                        "{kind}: request {}",
                        b.seq
                    );
                    assert!(b.cache_write_tokens > 0, "{kind}");
                }
                _ => {
                    assert!(b.cache_read_tokens > a.cache_read_tokens, "{kind}");
                    assert_eq!(b.cache_write_tokens, 0, "{kind}");
                }
            }
        }

        // Usage, status and metrics carry what the simulator reported.
        let read: u64 = seen.iter().map(|r| r.cache_read_tokens).sum();
        let write: u64 = seen.iter().map(|r| r.cache_write_tokens).sum();
        let input: u64 = seen.iter().map(|r| r.estimated_tokens).sum();
        let stats = built.session.stats();
        assert_eq!(stats.tokens.cache_read, read, "{kind}");
        assert_eq!(stats.tokens.cache_write, write, "{kind}");
        assert_eq!(stats.tokens.input, input, "{kind}: all prompt tokens");
        assert_eq!(stats.tokens.output, output_tokens, "{kind}");
        assert_eq!(stats.tokens.model.as_deref(), Some(kind_yaml(kind)));
        let metrics = built.session.metrics();
        assert_eq!(
            metrics
                .tokens
                .get(&TokenLabels {
                    kind: "cache_read",
                    client: "session"
                })
                .map_or(0, |c| c.get()),
            read,
            "{kind}"
        );
        assert_eq!(
            metrics
                .model_tokens
                .get(&ModelTokenLabels {
                    model: kind_yaml(kind).into(),
                    kind: "cache_write"
                })
                .map_or(0, |c| c.get()),
            write,
            "{kind}"
        );
        let status = serde_json::to_value(&stats).expect("status");
        assert_eq!(status["tokens"]["cacheRead"], read, "{kind}");
        assert_eq!(status["tokens"]["cacheWrite"], write, "{kind}");
        assert!(
            status["costUSD"]["session"].as_f64().unwrap_or(0.0) > 0.0,
            "{kind}"
        );

        // Journaled: the next holder reports the same.
        let reopened = build_session(&session_yaml(kind, &sim, ""), &env, "other").await;
        let again = reopened.session.stats();
        assert_eq!(again.tokens, stats.tokens, "{kind}");
        assert_eq!(again.cost_usd, stats.cost_usd, "{kind}");
    }
}

/// A summary with the nine sections, long enough for the quality gate.
fn summary_text() -> String {
    let mut s = String::new();
    for (n, sec) in cairn_agent::compact::summarize::SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe user asked twelve questions about the numbers; all answered.\n",
            n + 1
        ));
    }
    while s.len() < 2_500 {
        s.push_str("Details: every answer was given in full; nothing is pending.\n");
    }
    s
}

/// USD of the recorded requests at `prices` (input, output, cache read, cache write per
/// million tokens), each reply `out` tokens long.
fn hand_cost(seen: &[RecordedRequest], out: &[u64], prices: [f64; 4]) -> f64 {
    seen.iter()
        .zip(out)
        .map(|(r, o)| {
            let uncached = r.estimated_tokens - r.cache_read_tokens - r.cache_write_tokens;
            (uncached as f64 * prices[0]
                + *o as f64 * prices[1]
                + r.cache_read_tokens as f64 * prices[2]
                + r.cache_write_tokens as f64 * prices[3])
                / 1e6
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_model_and_the_summarizer_model_report_tokens_and_cost_apart() {
    const SONNET: [f64; 4] = [3.0, 15.0, 0.3, 3.75];
    const HAIKU: [f64; 4] = [1.0, 5.0, 0.1, 1.25];
    let session_sim = Sim::start().await.expect("sim");
    let summarizer_sim = Sim::start().await.expect("sim");
    session_sim.enable_prompt_cache();
    summarizer_sim.enable_prompt_cache();
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let extra = format!(
        "compaction:\n  summarizer:\n    provider: anthropic\n    model: claude-haiku-4-5\n    baseUrl: {}\n",
        summarizer_sim.url()
    );
    let yaml = session_yaml("anthropic", &session_sim, &extra);
    let mut built = build_session(&yaml, &env, "test").await;
    let mut session_out = Vec::new();
    for i in 0..3 {
        let answer = format!("Answer {i}.");
        session_out.push((answer.chars().count() as u64).div_ceil(4));
        session_sim.push_reply(ScriptedReply::text(answer));
        built
            .session
            .turn(vec![Message::user(format!("Question {i}?"))])
            .await
            .expect("turn");
    }
    let mut history = built.session.history().to_vec();
    history.extend(padded_history(12));
    built.session.replace_history(history).await.expect("seed");
    for _ in 0..6 {
        summarizer_sim.push_reply(ScriptedReply::text(summary_text()));
    }
    let out = built.session.compact_now(None).await.expect("compaction");
    assert_eq!(out.level, Some(2), "{out:?}");
    let answer = "After the summary.".to_string();
    session_out.push((answer.chars().count() as u64).div_ceil(4));
    session_sim.push_reply(ScriptedReply::text(answer));
    built
        .session
        .turn(vec![Message::user("And now?")])
        .await
        .expect("turn");

    let session_seen = session_sim.requests();
    let summarizer_seen: Vec<_> = summarizer_sim
        .requests()
        .into_iter()
        .filter(|r| r.outcome == "ok")
        .collect();
    assert_eq!(session_seen.len(), 4);
    assert!(!summarizer_seen.is_empty());
    // The summary request is cached too: the summarizer's breakpoints are on its prompt.
    assert!(
        summarizer_seen
            .iter()
            .all(|r| !r.cache_breakpoints.is_empty())
    );
    // The summary after the compaction carries its own breakpoint.
    let last = session_seen.last().expect("request");
    assert!(
        last.cache_breakpoints.len() == 4,
        "tools, system, summary, tail: {:?}",
        last.cache_breakpoints
    );
    let summary_out = (summary_text().chars().count() as u64).div_ceil(4);
    let summarizer_out = vec![summary_out; summarizer_seen.len()];

    let stats = built.session.stats();
    let summarizer = stats.tokens.summarizer.clone().expect("summarizer tokens");
    assert_eq!(summarizer.model.as_deref(), Some("claude-haiku-4-5"));
    assert_eq!(
        summarizer.input,
        summarizer_seen
            .iter()
            .map(|r| r.estimated_tokens)
            .sum::<u64>()
    );
    assert_eq!(summarizer.output, summarizer_out.iter().sum::<u64>());
    assert_eq!(
        summarizer.cache_write,
        summarizer_seen
            .iter()
            .map(|r| r.cache_write_tokens)
            .sum::<u64>()
    );
    assert_eq!(stats.tokens.model.as_deref(), Some("claude-sonnet-4-5"));
    assert_eq!(
        stats.tokens.input,
        session_seen.iter().map(|r| r.estimated_tokens).sum::<u64>()
    );
    assert_eq!(stats.tokens.output, session_out.iter().sum::<u64>());

    let cost = stats.cost_usd.clone().expect("cost");
    let want_session = hand_cost(&session_seen, &session_out, SONNET);
    let want_summarizer = hand_cost(&summarizer_seen, &summarizer_out, HAIKU);
    assert!(
        (cost.session - want_session).abs() < 2e-6,
        "{} vs {want_session}",
        cost.session
    );
    assert!(
        (cost.summarizer - want_summarizer).abs() < 2e-6,
        "{} vs {want_summarizer}",
        cost.summarizer
    );
    assert!((cost.total - (want_session + want_summarizer)).abs() < 3e-6);
    assert!(cost.unpriced.is_empty());
    let metrics = built.session.metrics();
    let metered = metrics
        .cost_usd
        .get(&CostLabels {
            client: "summarizer",
            model: "claude-haiku-4-5".into(),
        })
        .map_or(0.0, |c| c.get());
    assert!((metered - want_summarizer).abs() < 1e-9, "{metered}");
    let status = serde_json::to_value(&stats).expect("status");
    assert!(
        status["costUSD"]["summarizer"].as_f64().is_some(),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_warns_or_suspends_as_the_policy_says() {
    for action in ["warn", "suspend"] {
        let sim = Sim::start().await.expect("sim");
        let dir = tempfile::tempdir().expect("dir");
        let env = storage_env(dir.path(), None);
        let extra =
            format!("budget:\n  maxCostUSD: 0.0001\ncompaction:\n  onBudgetExceeded: {action}\n");
        let mut built = build_session(&session_yaml("anthropic", &sim, &extra), &env, "test").await;
        let before = built
            .session
            .stats()
            .cost_usd
            .expect("a budget is reported");
        assert_eq!(
            (before.max_usd, before.budget_exceeded),
            (Some(0.0001), false)
        );
        // Some 20 tokens in and a few out at 3 and 15 USD per million cost more than 0.0001.
        sim.push_reply(ScriptedReply::text("x".repeat(200)));
        built
            .session
            .turn(vec![Message::user("Spend.")])
            .await
            .expect("the first turn runs");
        let after = built.session.stats().cost_usd.expect("cost");
        assert!(after.budget_exceeded, "{after:?}");
        assert_eq!(after.on_budget_exceeded.as_deref(), Some(action));
        let next = built.session.turn(vec![Message::user("Again?")]).await;
        match action {
            "warn" => assert!(next.is_ok(), "{next:?}"),
            _ => {
                let e = next.expect_err("a suspended session refuses turns");
                assert_eq!(e.label(), "budget_exceeded");
                assert!(e.to_string().contains("maxCostUSD"), "{e}");
                assert_eq!(sim.requests().len(), 1, "nothing was sent");
            }
        }
    }
}
