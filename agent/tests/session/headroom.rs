//! The headroom tiers do what the CRD says: at or below `blockingBufferTokens` a request is
//! never sent (compact first, no matter what — circuit breaker open or not — and refuse when
//! that cannot make room); at or below `warningBufferTokens` a turn carries a `warning`
//! notice and `cairn_agent_headroom_warnings_total` counts it, and `status.session.headroom`
//! reports the tier for the operator's condition and Event.

use cairn_agent::history::Message;
use cairn_agent::session::Session;
use cairn_sim::{ScriptedReply, Sim};

use crate::support::agent::*;

/// A 10,000-token window with small buffers: warn at 4,000 tokens left, compact at 3,000,
/// block at 2,000. The budget is the whole window so only the headroom tiers decide.
async fn session(sim: &Sim, dir: &std::path::Path, system_prompt_bytes: usize) -> Session {
    let prompt = "The system prompt of this test, which no compaction may touch. "
        .repeat(system_prompt_bytes / 32 + 1);
    let prompt = &prompt[..system_prompt_bytes];
    let yaml = format!(
        "name: headroom\nnamespace: tests\nprovider:\n  kind: openai-compatible\n  model: {MODEL}\n  baseUrl: {}/v1\ncontextWindow: 10000\nmaxOutputTokens: 1000\nsystemPrompt: \"{prompt}\"\ncompaction:\n  budgetRatio: 1.0\n  autoCompact: {{warningBufferTokens: 4000, bufferTokens: 3000, blockingBufferTokens: 2000}}\n",
        sim.url()
    );
    let env = storage_env(dir, None);
    build_session(&yaml, &env, "a").await.session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_the_blocking_buffer_is_never_sent_breaker_open_or_not() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    // ~8,250 tokens of system prompt: about 1,500 tokens of headroom, inside the blocking
    // buffer, and nothing compaction may shrink.
    let mut s = session(&sim, dir.path(), 33_000).await;
    // Four turns: the failed compactions open the circuit breaker on the way; none of the
    // requests may reach the provider.
    for turn in 1..=4 {
        sim.push_reply(ScriptedReply::text("sent anyway"));
        let r = s
            .turn(vec![Message::user(format!("question {turn}"))])
            .await;
        assert!(
            sim.requests().is_empty(),
            "turn {turn} was sent with the headroom in the blocking buffer ({r:?})"
        );
        match r {
            Err(e) => {
                assert_eq!(e.label(), "context_full", "turn {turn}: {e}");
                assert!(e.to_string().contains("blockingBufferTokens"), "{e}");
            }
            Ok(o) => panic!("turn {turn} answered: {o:?}"),
        }
    }
    assert!(
        s.state().auto_compaction_disabled(),
        "the breaker opened on the way"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warning_tier_gives_a_notice_and_counts_it() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    // ~6,000 tokens of system prompt: about 3,600 tokens of headroom, a warning.
    let mut s = session(&sim, dir.path(), 24_000).await;
    sim.push_reply(ScriptedReply::text("fine"));
    let out = s
        .turn(vec![Message::user("a question")])
        .await
        .expect("turn");
    assert_eq!(out.text, "fine");
    let warnings: Vec<_> = out
        .notices
        .iter()
        .filter(|n| n.kind == "warning" && n.message.contains("headroom"))
        .collect();
    assert_eq!(warnings.len(), 1, "{:?}", out.notices);
    assert!(
        warnings[0].message.contains("warningBufferTokens"),
        "{warnings:?}"
    );
    let metrics = s.metrics().render(None);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("cairn_agent_headroom_warnings_total") && l.ends_with(" 1")),
        "{metrics}"
    );
    // status.session carries the tier; the operator's ContextHeadroom condition and its
    // Warning Event follow it.
    let h = s.stats().headroom.expect("headroom reported");
    assert_eq!(h.tier, "Warning", "{h:?}");
    assert!(h.tokens_left > 2_000 && h.tokens_left <= 4_000, "{h:?}");
    assert_eq!(h.warning_buffer_tokens, 4_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plenty_of_headroom_is_reported_as_ok() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = session(&sim, dir.path(), 1_000).await;
    sim.push_reply(ScriptedReply::text("fine"));
    s.turn(vec![Message::user("a question")])
        .await
        .expect("turn");
    let h = s.stats().headroom.expect("headroom reported");
    assert_eq!(h.tier, "Ok", "{h:?}");
    assert!(h.tokens_left > 4_000, "{h:?}");
}
