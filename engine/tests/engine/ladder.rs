//! The compaction ladder end to end: levels 1-3, the verbatim budget, the circuit breaker,
//! the archive-before-loss rule with a failing store, and per-session isolation.

use cairn_crds::EffectivePolicy;
use cairn_engine::ccr::{Key, MemoryStore, Store, extract_markers};
use cairn_engine::compact::archive::parse_segment;
use cairn_engine::compact::ladder::{LadderContext, NotRun};
use cairn_engine::compact::pairing;
use cairn_engine::compact::summarize::SECTIONS;
use cairn_engine::compact::{
    BudgetInputs, SessionState, SummarizeError, Summarizer, SummaryVerdict, Trigger, compact,
};
use cairn_engine::history::{self, Message, Role};
use cairn_engine::testing::*;

fn ctx<'a>(
    policy: &'a EffectivePolicy,
    window: u64,
    store: &'a dyn Store,
    summarizer: Option<&'a dyn Summarizer>,
    trigger: Trigger,
) -> LadderContext<'a> {
    LadderContext {
        policy,
        inputs: BudgetInputs {
            context_window: window,
            payload_cap: None,
            reserve_bytes: 0,
        },
        store,
        summarizer,
        trigger,
        budget_ratio: None,
        target: None,
    }
}

/// Window (tokens) such that the default budget (0.6 × 4 chars) is `bytes`.
fn window_for(bytes: usize) -> u64 {
    (bytes as f64 / 2.4) as u64 + 13_000
}

#[tokio::test]
async fn under_budget_nothing_runs() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut h = session(50_000);
    let before = h.clone();
    let mut st = SessionState::new();
    let out = compact(
        &mut h,
        &ctx(&policy, 200_000, &store, None, Trigger::Auto),
        &mut st,
    )
    .await;
    assert_eq!(out.not_run, Some(NotRun::NotNeeded));
    assert_eq!(h, before);
    assert!(store.is_empty());
}

#[tokio::test]
async fn level1_alone_can_converge_and_is_reported() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut h = session(400_000);
    let before = h.clone();
    let w = history::weight(&h);
    let mut st = SessionState::new();
    let summarizer = ScriptedSummarizer::good();
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(w * 3 / 4),
            &store,
            Some(&summarizer),
            Trigger::Auto,
        ),
        &mut st,
    )
    .await;
    assert!(out.met, "{out:?}");
    assert_eq!(out.level, Some(1));
    assert_eq!(summarizer.calls(), 0);
    let trim = out
        .reports
        .iter()
        .find(|r| r.level() == Some(1))
        .expect("trim report");
    assert!(trim.bytes_after < trim.bytes_before && !trim.archived.is_empty());
    assert!(lost_texts(&before, &h, &store).await.is_empty());
    // System and user messages untouched.
    let users = |h: &[Message]| {
        h.iter()
            .filter(|m| m.role != Role::Tool && m.role != Role::Assistant)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(users(&h), users(&before));
}

#[tokio::test]
async fn level2_summarizes_the_middle_and_archives_it() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut h = session(600_000);
    let before = h.clone();
    let mut st = SessionState::new();
    let summarizer = ScriptedSummarizer::good();
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(120_000),
            &store,
            Some(&summarizer),
            Trigger::Auto,
        ),
        &mut st,
    )
    .await;
    assert!(out.met, "{out:?}");
    assert_eq!(out.level, Some(2));
    assert_eq!(st.skip_level2, 0);
    let req = summarizer.requests.lock().expect("lock")[0].clone();
    for s in SECTIONS {
        assert!(req.instructions.contains(s));
    }
    // Input budgeted to half the summarizer's window.
    assert!(
        req.transcript.len() <= 200_000 + 20_000,
        "{}",
        req.transcript.len()
    );
    assert!(h[0].is_system() && h[0] == before[0]);
    let summary = &h[1];
    assert_eq!(summary.role, Role::User);
    assert!(summary.meta.is_summary);
    let key = extract_markers(&summary.content)[0];
    let seg = store.fetch(&key).await.expect("ok").expect("archived");
    let msgs = parse_segment(&String::from_utf8(seg).expect("utf8")).expect("segment");
    assert!(msgs.len() > 10);
    assert_eq!(
        msgs[0], before[1],
        "the segment starts after the system prefix"
    );
    assert!(pairing::is_valid(&h));
    // The tail starts right after the summary and does not begin with a tool result.
    assert_ne!(h[2].role, Role::Tool);
    assert!(lost_texts(&before, &h, &store).await.is_empty());
}

#[tokio::test]
async fn level2_retries_once_then_falls_through_to_level3() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let base = session(600_000);

    // A refusal then a good summary: applied on the retry.
    let mut h = base.clone();
    let s = ScriptedSummarizer::new(vec![Ok(
        "I'm sorry, I can't summarize this conversation.".into()
    )]);
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(120_000),
            &store,
            Some(&s),
            Trigger::Auto,
        ),
        &mut SessionState::new(),
    )
    .await;
    assert_eq!(s.calls(), 2);
    assert_eq!(s.requests.lock().expect("lock")[1].attempt, 2);
    assert_eq!(out.level, Some(2));

    // Empty then too short: rejected, level 3 truncates truthfully.
    let mut h = base.clone();
    let s = ScriptedSummarizer::new(vec![Ok("   ".into()), Ok("done.".into())]);
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(120_000),
            &store,
            Some(&s),
            Trigger::Auto,
        ),
        &mut SessionState::new(),
    )
    .await;
    assert_eq!(s.calls(), 2);
    assert_eq!(out.level, Some(3));
    assert!(out.met);
    let notes: Vec<&String> = out.reports.iter().flat_map(|r| r.notes.iter()).collect();
    assert!(notes.iter().any(|n| n.contains("too_short")), "{notes:?}");
    let notice = &h[1];
    assert!(
        notice.content.contains("truncated, not summarized"),
        "{}",
        notice.content
    );
    assert!(lost_texts(&base, &h, &store).await.is_empty());

    // Long enough but without the nine sections, twice: rejected like any bad summary, and
    // level 3 truncates; with the sections on the retry, level 2 applies.
    let prose = "The user asked to fix the build; the failing test was parse_config. ".repeat(60);
    let mut h = base.clone();
    let s = ScriptedSummarizer::new(vec![Ok(prose.clone()), Ok(prose.clone())]);
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(120_000),
            &store,
            Some(&s),
            Trigger::Auto,
        ),
        &mut SessionState::new(),
    )
    .await;
    assert_eq!(s.calls(), 2);
    assert_eq!(out.level, Some(3));
    let notes: Vec<&String> = out.reports.iter().flat_map(|r| r.notes.iter()).collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("summary attempt 2 rejected: missing_sections")),
        "{notes:?}"
    );
    assert!(lost_texts(&base, &h, &store).await.is_empty());
    let mut h = base.clone();
    let s = ScriptedSummarizer::new(vec![Ok(prose)]);
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(120_000),
            &store,
            Some(&s),
            Trigger::Auto,
        ),
        &mut SessionState::new(),
    )
    .await;
    assert_eq!((s.calls(), out.level), (2, Some(2)));

    // A failing summarizer: straight to level 3.
    let mut h = base.clone();
    let s = ScriptedSummarizer::new(vec![Err(SummarizeError::Failed("HTTP 500".into()))]);
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(120_000),
            &store,
            Some(&s),
            Trigger::Auto,
        ),
        &mut SessionState::new(),
    )
    .await;
    assert_eq!(s.calls(), 1);
    assert_eq!(out.level, Some(3));
}

#[tokio::test]
async fn non_converging_summary_skips_level2_for_the_next_two_compactions() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let s = ScriptedSummarizer::good();
    // The recent tail alone, each message cut to its floor, is larger than the budget (a
    // call's arguments are never cut): the summary cannot converge.
    let session = |bytes| {
        let mut h = session(bytes);
        h.extend(heavy_call_turn(200_000));
        h
    };
    let mut h = session(900_000);
    let out = compact(
        &mut h,
        &ctx(&policy, window_for(60_000), &store, Some(&s), Trigger::Auto),
        &mut st,
    )
    .await;
    assert_eq!(s.calls(), 1);
    assert_eq!(out.level, Some(3));
    assert_eq!(st.skip_level2, 2);
    for left in [1, 0] {
        let mut h = session(900_000);
        compact(
            &mut h,
            &ctx(&policy, window_for(60_000), &store, Some(&s), Trigger::Auto),
            &mut st,
        )
        .await;
        assert_eq!(s.calls(), 1, "level 2 skipped");
        assert_eq!(st.skip_level2, left);
    }
}

/// One auto compaction of a fresh 600 KB session to 120 KB: nothing is lost, and returns
/// the outcome.
async fn compact_a_session(
    store: &MemoryStore,
    summarizer: &ScriptedSummarizer,
    st: &mut SessionState,
) -> cairn_engine::compact::CompactionOutcome {
    let policy = EffectivePolicy::default();
    let mut h = session(600_000);
    let before = h.clone();
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(120_000),
            store,
            Some(summarizer),
            Trigger::Auto,
        ),
        st,
    )
    .await;
    assert!(lost_texts(&before, &h, store).await.is_empty());
    out
}

/// A summary long enough but without the nine sections never replaces its segment: the gate
/// rejects it, the rejection is counted with its reason, level 3 runs with its archive, and
/// level 2 backs off for 1, 2, 4, ... compactions until a summary passes.
#[tokio::test]
async fn a_sectionless_summary_is_rejected_counted_and_backs_level2_off() {
    let store = MemoryStore::new();
    let prose = "The user and the assistant talked about the build at length. ".repeat(60);
    let s = ScriptedSummarizer::new(vec![Ok(prose); 4]);
    let mut st = SessionState::new();
    // Rejected twice (both tries): level 3, counted, backed off for one compaction.
    let out = compact_a_session(&store, &s, &mut st).await;
    assert_eq!(s.calls(), 2);
    assert_eq!(out.level, Some(3));
    assert_eq!(
        out.summary,
        Some(SummaryVerdict::Rejected("missing_sections"))
    );
    assert_eq!(st.summaries.rejected, 1);
    assert_eq!(
        st.summaries.last_rejection.as_deref(),
        Some("missing_sections")
    );
    assert_eq!(st.skip_level2, 1);
    // The next compaction skips level 2.
    let out = compact_a_session(&store, &s, &mut st).await;
    assert_eq!(s.calls(), 2, "level 2 skipped");
    assert!(out.level2_skipped && out.summary.is_none());
    assert_eq!(out.level, Some(3));
    assert_eq!((st.summaries.skipped, st.skip_level2), (1, 0));
    // Rejected again: backed off for two.
    compact_a_session(&store, &s, &mut st).await;
    assert_eq!(s.calls(), 4);
    assert_eq!((st.summaries.rejected, st.skip_level2), (2, 2));
    for _ in 0..2 {
        compact_a_session(&store, &s, &mut st).await;
    }
    assert_eq!((s.calls(), st.summaries.skipped), (4, 3));
    // The script is spent: the next summary is well formed, passes, and ends the backoff.
    let out = compact_a_session(&store, &s, &mut st).await;
    assert_eq!(out.summary, Some(SummaryVerdict::Accepted));
    assert_eq!(out.level, Some(2));
    assert_eq!((st.summaries.accepted, st.summary_failures_in_row), (1, 0));
}

#[tokio::test]
async fn level3_keeps_system_verbatim_and_tail_and_shrinks_largest_first() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy {
        min_keep_recent: 4,
        ..EffectivePolicy::default()
    };
    let mut pinned = Message::user("Pinned: the deploy key lives in vault path secret/deploy.");
    pinned.meta.preserve_verbatim = true;
    let mut h = vec![Message::system("sys prompt"), Message::user("start")];
    h.push(pinned.clone());
    h.extend(session(200_000).into_iter().skip(1));
    h.push(Message::user(tool_output(0, 1, 60_000)));
    h.push(Message::assistant(tool_output(2, 2, 30_000)));
    let before = h.clone();
    let mut st = SessionState::new();
    let out = compact(
        &mut h,
        &ctx(&policy, window_for(20_000), &store, None, Trigger::Auto),
        &mut st,
    )
    .await;
    assert!(out.met, "{out:?}");
    assert_eq!(out.level, Some(3));
    assert_eq!(st.level3_compactions, 1);
    assert_eq!(h[0], before[0]);
    assert_eq!(h[1].role, Role::User);
    assert!(h[1].content.contains("truncated, not summarized"));
    assert!(h.contains(&pinned), "verbatim survives");
    assert!(pairing::is_valid(&h));
    // The largest recent message was cut first; that sufficed, so the second stays whole.
    let last = &h[h.len() - 1];
    let user = &h[h.len() - 2];
    let shape: Vec<(Role, usize)> = h.iter().map(|m| (m.role, m.content.len())).collect();
    assert!(user.content.len() < 60_000, "{shape:?}");
    assert_eq!(last.content, before[before.len() - 1].content, "{shape:?}");
    assert!(lost_texts(&before, &h, &store).await.is_empty());
}

#[tokio::test]
async fn level3_reports_the_floor_when_the_budget_cannot_be_met() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut h = vec![Message::system("s".repeat(50_000)), Message::user("hi")];
    let mut st = SessionState::new();
    let out = compact(
        &mut h,
        &ctx(&policy, window_for(10_000), &store, None, Trigger::Auto),
        &mut st,
    )
    .await;
    assert!(!out.met);
    assert!(
        out.reports
            .iter()
            .any(|r| r.notes.iter().any(|n| n.contains("floor")))
    );
    assert_eq!(h[0].content.len(), 50_000, "system messages never altered");
}

#[tokio::test]
async fn circuit_breaker_opens_after_three_failures_and_resets_on_success() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let impossible = || vec![Message::system("s".repeat(50_000)), Message::user("hi")];
    for n in 1..=3 {
        let mut h = impossible();
        let out = compact(
            &mut h,
            &ctx(&policy, window_for(10_000), &store, None, Trigger::Auto),
            &mut st,
        )
        .await;
        assert!(!out.met);
        assert_eq!(out.breaker_opened, n == 3);
    }
    assert!(st.auto_compaction_disabled());
    let mut h = impossible();
    let out = compact(
        &mut h,
        &ctx(&policy, window_for(10_000), &store, None, Trigger::Auto),
        &mut st,
    )
    .await;
    assert_eq!(out.not_run, Some(NotRun::CircuitOpen));
    // Manual compaction still runs, and a success closes the breaker.
    let mut h = session(100_000);
    let out = compact(
        &mut h,
        &ctx(&policy, 200_000, &store, None, Trigger::Manual),
        &mut st,
    )
    .await;
    assert!(out.met && out.not_run.is_none());
    assert!(!st.auto_compaction_disabled());
    assert_eq!(st.consecutive_failures, 0);
}

#[tokio::test]
async fn failing_store_makes_every_lossy_step_a_no_op() {
    let policy = EffectivePolicy::default();
    let mut h = session(600_000);
    let before = h.clone();
    let s = ScriptedSummarizer::good();
    let mut st = SessionState::new();
    let out = compact(
        &mut h,
        &ctx(
            &policy,
            window_for(60_000),
            &FailingStore,
            Some(&s),
            Trigger::Auto,
        ),
        &mut st,
    )
    .await;
    assert_eq!(h, before, "nothing dropped without an archived original");
    assert!(!out.met);
    assert!(
        out.reports
            .iter()
            .filter(|r| r.pass.level().is_some())
            .all(|r| r.archive_error == Some("unavailable"))
    );
    assert!(out.reports.iter().all(|r| r.archived.is_empty()));
}

#[tokio::test]
async fn two_sessions_in_one_process_share_nothing() {
    let store_a = MemoryStore::new();
    let store_b = MemoryStore::new();
    let tight = EffectivePolicy {
        budget_ratio: 0.2,
        ..EffectivePolicy::default()
    };
    let loose = EffectivePolicy::default();
    let mut a = SessionState::new();
    let mut b = SessionState::new();
    a.learn_payload_cap(100_000);
    a.chars_per_token.observe(300_000, 100_000);
    let (mut ha, mut hb) = (session(300_000), session(300_000));
    let hb_before = hb.clone();
    let sa = ScriptedSummarizer::good();
    let ca = ctx(&tight, 200_000, &store_a, Some(&sa), Trigger::Auto);
    let mut cb = ctx(&loose, 200_000, &store_b, None, Trigger::Auto);
    cb.inputs.payload_cap = None;
    let (oa, ob) = tokio::join!(compact(&mut ha, &ca, &mut a), compact(&mut hb, &cb, &mut b));
    assert!(oa.met && oa.level.is_some());
    assert_eq!(
        ob.not_run,
        Some(NotRun::NotNeeded),
        "b's budget is not a's learned cap"
    );
    assert_eq!(hb, hb_before);
    assert_eq!(b, SessionState::new());
    assert!(store_b.is_empty());
    assert!(oa.target < 100_000 && ob.target == 480_000);
    let _ = Key::of(b"");
}
