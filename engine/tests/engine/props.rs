//! Property tests over random histories: the invariants every pass must keep.

use std::time::Duration;

use cairn_crds::EffectivePolicy;
use cairn_engine::ccr::{Key, MemoryStore};
use cairn_engine::compact::ladder::LadderContext;
use cairn_engine::compact::state::ToolResultLimits;
use cairn_engine::compact::{
    BudgetInputs, SessionState, SummarizeError, Summarizer, Trigger, budget, compact, dedup,
    microcompact, pairing,
};
use cairn_engine::history::{Message, Role};
use cairn_engine::testing::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum ResultMode {
    Normal,
    Missing,
    Displaced,
    Duplicated,
}

#[derive(Clone, Debug)]
enum Op {
    User(usize),
    VerbatimUser(usize),
    QuotesMarker,
    Assistant {
        size: usize,
        reasoning: Option<usize>,
    },
    Calls(Vec<(usize, usize, ResultMode)>),
    Orphan(usize),
    System(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let mode = prop_oneof![
        6 => Just(ResultMode::Normal),
        1 => Just(ResultMode::Missing),
        1 => Just(ResultMode::Displaced),
        1 => Just(ResultMode::Duplicated),
    ];
    prop_oneof![
        4 => (1usize..3_000).prop_map(Op::User),
        1 => (100usize..6_000).prop_map(Op::VerbatimUser),
        1 => Just(Op::QuotesMarker),
        4 => (0usize..8_000, proptest::option::of(10usize..3_000))
            .prop_map(|(size, reasoning)| Op::Assistant { size, reasoning }),
        6 => proptest::collection::vec((0usize..8, 0usize..12_000, mode), 1..4).prop_map(Op::Calls),
        1 => (1usize..2_000).prop_map(Op::Orphan),
        1 => (10usize..500).prop_map(Op::System),
    ]
}

fn build(ops: &[Op]) -> Vec<Message> {
    let mut h = vec![
        Message::system("You are a coding agent."),
        Message::user("Start the task."),
    ];
    let mut displaced: Vec<Message> = Vec::new();
    let mut n = 0usize;
    for op in ops {
        n += 1;
        match op {
            Op::User(s) => {
                h.push(Message::user(format!(
                    "user {n}: {}",
                    "please continue. ".repeat(s / 17 + 1)
                )));
                h.append(&mut displaced);
            }
            Op::VerbatimUser(s) => {
                let mut m = Message::user(tool_output(2, n, *s));
                m.meta.preserve_verbatim = true;
                h.push(m);
            }
            Op::QuotesMarker => h.push(Message::user(format!(
                "user {n}: what was in {} again?",
                Key::of(format!("x{n}").as_bytes()).marker()
            ))),
            Op::Assistant { size, reasoning } => {
                let mut m =
                    Message::assistant(format!("assistant {n}: {}", tool_output(3, n, *size)));
                m.reasoning = reasoning.map(|r| format!("reasoning {n} {}", "hmm ".repeat(r / 4)));
                h.push(m);
            }
            Op::Calls(calls) => {
                let tool_calls = calls
                    .iter()
                    .enumerate()
                    .map(|(k, (file, _, _))| {
                        if k % 2 == 0 {
                            call(
                                &format!("c{n}_{k}"),
                                "read_file",
                                &format!("{{\"path\":\"src/f{file}.rs\"}}"),
                            )
                        } else {
                            call(&format!("c{n}_{k}"), "bash", "{\"command\":\"cargo test\"}")
                        }
                    })
                    .collect();
                h.push(Message::assistant_calls("", tool_calls));
                for (k, (file, size, mode)) in calls.iter().enumerate() {
                    let mut r =
                        Message::tool(format!("c{n}_{k}"), tool_output(*file, n * 10 + k, *size));
                    r.name = Some(if k % 2 == 0 { "read_file" } else { "bash" }.into());
                    match mode {
                        ResultMode::Normal => h.push(r),
                        ResultMode::Missing => {}
                        ResultMode::Displaced => displaced.push(r),
                        ResultMode::Duplicated => {
                            h.push(r.clone());
                            r.content.push_str("\n(second copy)");
                            h.push(r);
                        }
                    }
                }
            }
            Op::Orphan(s) => h.push(Message::tool(format!("gone{n}"), tool_output(0, n, *s))),
            Op::System(s) => h.push(Message::system(format!(
                "system note {n}: {}",
                "rule. ".repeat(s / 6 + 1)
            ))),
        }
    }
    h.append(&mut displaced);
    h
}

fn systems(h: &[Message]) -> Vec<Message> {
    h.iter().filter(|m| m.is_system()).cloned().collect()
}

/// Summarizers the pipeline may meet: good, refusing, failing, or none at all.
fn summarizer(kind: u8) -> Option<ScriptedSummarizer> {
    match kind % 4 {
        0 => Some(ScriptedSummarizer::good()),
        1 => Some(ScriptedSummarizer::new(vec![
            Ok("I cannot do that.".into()),
            Ok("".into()),
        ])),
        2 => Some(ScriptedSummarizer::new(vec![Err(SummarizeError::Failed(
            "down".into(),
        ))])),
        _ => None,
    }
}

proptest! {
    // 64 cases by default; `PROPTEST_CASES=1000` for a deeper run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn pairing_repair_yields_valid_pairing(ops in proptest::collection::vec(op(), 0..30)) {
        let original = build(&ops);
        for mode in [pairing::OrphanMode::Remove, pairing::OrphanMode::ToUser] {
            let mut h = original.clone();
            pairing::repair(&mut h, mode);
            prop_assert!(pairing::is_valid(&h));
            prop_assert_eq!(systems(&h), systems(&original));
            let again = h.clone();
            let second = pairing::repair(&mut h, mode);
            prop_assert!(!second.is_change());
            prop_assert_eq!(&h, &again);
        }
        // The archived variant loses nothing.
        let store = MemoryStore::new();
        let mut h = original.clone();
        super::rt().block_on(async {
            pairing::repair_archived(&mut h, &store, Trigger::Turn).await;
        });
        prop_assert!(pairing::is_valid(&h));
        let lost = super::rt().block_on(lost_texts(&original, &h, &store));
        prop_assert!(lost.is_empty(), "lost {} texts", lost.len());
    }

    #[test]
    fn microcompact_is_idempotent(ops in proptest::collection::vec(op(), 0..30), idle in any::<bool>()) {
        let store = MemoryStore::new();
        let policy = EffectivePolicy::default();
        let idle_for = idle.then(|| Duration::from_secs(3 * 3600));
        let mut h = build(&ops);
        pairing::repair(&mut h, pairing::OrphanMode::ToUser);
        let original = h.clone();
        let rt = super::rt();
        rt.block_on(microcompact::microcompact(&mut h, &policy, idle_for, &store));
        let once = h.clone();
        let second = rt.block_on(microcompact::microcompact(&mut h, &policy, idle_for, &store));
        prop_assert!(!second.is_change());
        prop_assert_eq!(&h, &once);
        prop_assert!(pairing::is_valid(&h));
        let lost = rt.block_on(lost_texts(&original, &h, &store));
        prop_assert!(lost.is_empty(), "lost {} texts", lost.len());
    }

    #[test]
    fn tool_result_budget_is_bounded_and_byte_stable(
        ops in proptest::collection::vec(op(), 0..30),
        per_result in 1_000usize..20_000,
        extra in 0usize..30_000,
    ) {
        let store = MemoryStore::new();
        let mut h = build(&ops);
        pairing::repair(&mut h, pairing::OrphanMode::ToUser);
        let limits = ToolResultLimits { per_result, per_turn: per_result + extra };
        let rt = super::rt();
        let (a, _) = rt.block_on(budget::apply(&h, limits, &store));
        let (b, _) = rt.block_on(budget::apply(&h, limits, &store));
        prop_assert_eq!(&a, &b);
        for m in a.iter().filter(|m| m.role == Role::Tool && !m.meta.preserve_verbatim) {
            if !cairn_engine::ccr::has_marker(&m.content) || m.content.contains("omitted; full original") {
                prop_assert!(m.content.len() <= per_result, "{} > {}", m.content.len(), per_result);
            }
        }
        let lost = rt.block_on(lost_texts(&h, &a, &store));
        prop_assert!(lost.is_empty());
    }

    #[test]
    fn the_pipeline_keeps_every_invariant(
        ops in proptest::collection::vec(op(), 1..40),
        window in 2_000u64..80_000,
        kind in any::<u8>(),
        keep in 1u32..12,
    ) {
        // Every batch written concurrently, finishing out of order.
        let store = ConcurrentStore::default();
        let policy = EffectivePolicy { min_keep_recent: keep, ..EffectivePolicy::default() };
        let original = build(&ops);
        let summ = summarizer(kind);
        let mut state = SessionState::new();
        let rt = super::rt();
        let mut h = original.clone();
        let out = rt.block_on(async {
            pairing::repair_archived(&mut h, &store, Trigger::Turn).await;
            assert!(pairing::is_valid(&h));
            microcompact::microcompact(&mut h, &policy, None, &store).await;
            assert!(pairing::is_valid(&h));
            dedup::dedup_reads(&mut h, &policy, &store).await;
            assert!(pairing::is_valid(&h));
            let ctx = LadderContext {
                policy: &policy,
                inputs: BudgetInputs { context_window: window, payload_cap: None, reserve_bytes: 0 },
                store: &store,
                summarizer: summ.as_ref().map(|s| s as &dyn Summarizer),
                trigger: Trigger::Auto,
                budget_ratio: None,
            target: None,
            };
            compact(&mut h, &ctx, &mut state).await
        });
        prop_assert!(pairing::is_valid(&h));
        prop_assert_eq!(systems(&h), systems(&original), "system messages never dropped or altered");
        if out.level.is_some_and(|l| l >= 2) {
            let first = h.iter().find(|m| !m.is_system());
            prop_assert!(first.is_some_and(|m| m.role == Role::User), "first non-system is a user message");
        }
        let floor_reported = out.reports.iter().any(|r| r.notes.iter().any(|n| n.contains("floor")));
        prop_assert!(out.met || floor_reported, "target {} after {}", out.target, out.bytes_after);
        prop_assert_eq!(out.bytes_after, cairn_engine::history::weight(&h));
        let lost = rt.block_on(lost_texts(&original, &h, &store));
        prop_assert!(lost.is_empty(), "lost {} texts, e.g. {:?}", lost.len(), lost.first().map(|t| t.chars().take(80).collect::<String>()));
    }
}
