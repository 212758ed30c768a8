//! No cut hides an error: every pass that cuts a tool result in place keeps the error lines
//! of what it cut in the text the model still sees. The tool results are output recorded
//! from real tools (`engine/tests/fixtures/tool_output`).

use std::time::Duration;

use cairn_crds::EffectivePolicy;
use cairn_crds::session::CompactionScore;
use cairn_engine::artifacts::{self, Artifact, Category};
use cairn_engine::ccr::MemoryStore;
use cairn_engine::compact::ladder::LadderContext;
use cairn_engine::compact::{
    BudgetInputs, SessionState, Summarizer, Trigger, compact, dedup, microcompact, mirror,
};
use cairn_engine::history::{Message, Role};
use cairn_engine::testing::*;
use proptest::prelude::*;

/// Failure output recorded from cargo, pytest and go; in the first two the first error
/// line is not the result's first line.
pub const RECORDED: [&str; 5] = [
    include_str!("../fixtures/tool_output/cargo_build.txt"),
    include_str!("../fixtures/tool_output/cargo_test.txt"),
    include_str!("../fixtures/tool_output/pytest.txt"),
    include_str!("../fixtures/tool_output/pytest_fail.txt"),
    include_str!("../fixtures/tool_output/go_test.txt"),
];

/// The error lines of every tool result of `history`.
fn error_lines(history: &[Message]) -> Vec<String> {
    history
        .iter()
        .flat_map(artifacts::of_message)
        .filter(|a| a.category == Category::Errors)
        .map(|a| a.text)
        .collect()
}

fn shows(history: &[Message], line: &str) -> bool {
    history.iter().any(|m| m.content.contains(line))
}

/// A session that runs each recorded command in turn, each result followed by more turns.
fn runs(outputs: &[&str]) -> Vec<Message> {
    let mut h = vec![
        Message::system("you are a coding agent"),
        Message::user("fix the build"),
    ];
    for (i, out) in outputs.iter().enumerate() {
        let id = format!("run{i}");
        h.push(Message::assistant_calls(
            "",
            vec![call(&id, "bash", r#"{"command":"make check"}"#)],
        ));
        h.push(Message::tool(&id, *out));
    }
    for i in 0..6 {
        let id = format!("later{i}");
        h.push(Message::assistant_calls(
            "",
            vec![call(&id, "bash", r#"{"command":"ls"}"#)],
        ));
        h.push(Message::tool(&id, "Cargo.toml\nsrc\n"));
    }
    h.push(Message::assistant("done"));
    h
}

#[tokio::test]
async fn microcompact_keeps_every_error_line_of_what_it_cuts() {
    let mut policy = EffectivePolicy::default();
    // Real failure output is a few kilobytes: previews that cut its middle.
    policy.microcompact.min_content_chars = 400;
    policy.microcompact.head_chars = 120;
    policy.microcompact.tail_chars = 60;
    policy.microcompact.truncate_after_turns = 2;
    policy.microcompact.summarize_after_turns = 20;
    policy.microcompact.cache_horizon_turns = 0;
    let store = MemoryStore::new();
    let mut h = runs(&RECORDED);
    let wanted = error_lines(&h);
    assert!(wanted.len() >= 10, "{wanted:?}");
    let r = microcompact::microcompact(&mut h, &policy, None, &store).await;
    assert!(r.changed >= 4, "previews were cut: {r:?}");
    for line in &wanted {
        assert!(shows(&h, line), "preview hides {line}");
    }
    // Later the previews become stubs, and idle clears whatever is left.
    policy.microcompact.summarize_after_turns = 3;
    let r = microcompact::microcompact(&mut h, &policy, None, &store).await;
    assert!(r.changed >= 4, "stubs were cut: {r:?}");
    let idle =
        microcompact::microcompact(&mut h, &policy, Some(Duration::from_secs(7200)), &store).await;
    assert!(
        h.iter()
            .filter(|m| m.content.starts_with("[cairn: tool result"))
            .count()
            >= 5
    );
    for line in &wanted {
        assert!(shows(&h, line), "stub hides {line}: {idle:?}");
    }
}

#[tokio::test]
async fn dedup_keeps_every_error_line_of_the_reads_it_stubs() {
    let policy = EffectivePolicy::default();
    let store = MemoryStore::new();
    let mut h = vec![Message::user("why does CI fail?")];
    for round in 0..2 {
        for (i, out) in RECORDED.iter().enumerate() {
            let id = format!("read{round}-{i}");
            let args = format!(r#"{{"path":"logs/run{i}.log"}}"#);
            h.push(Message::assistant_calls(
                "",
                vec![call(&id, "read_file", &args)],
            ));
            h.push(Message::tool(&id, *out));
        }
    }
    let wanted = error_lines(&h[..=RECORDED.len() * 2]);
    let r = dedup::dedup_reads(&mut h, &policy, &store).await;
    assert_eq!(r.changed, RECORDED.len(), "{r:?}");
    for m in &h[..=RECORDED.len() * 2] {
        if m.content.starts_with("[cairn: earlier read") {
            assert!(
                m.content
                    .contains("[cairn: error lines of the archived original]")
            );
        }
    }
    for line in &wanted {
        // Each line shows twice over: in the later read and beside the earlier one's stub.
        let times = h
            .iter()
            .filter(|m| m.content.contains(line.as_str()))
            .count();
        assert!(times >= 2, "dedup stub hides {line}");
    }
}

/// What a pass put at stake and kept in sight, counted here independently of the probe: for
/// each message of `input` that `output` does not hold unchanged, what the original held
/// (its artifacts and those its ledger recorded of earlier cuts), and whether `output`
/// still shows each verbatim. Per category (files, commands, errors, requests):
/// `(at_stake, in_sight)`.
fn outside_count(input: &[Message], output: &[Message]) -> [(u64, u64); 4] {
    let unchanged = |m: &Message| {
        output.iter().any(|o| {
            o.role == m.role
                && o.content == m.content
                && o.reasoning == m.reasoning
                && o.tool_call_id == m.tool_call_id
                && o.tool_calls.len() == m.tool_calls.len()
                && o.tool_calls
                    .iter()
                    .zip(&m.tool_calls)
                    .all(|(a, b)| a.id == b.id && a.name == b.name && a.arguments == b.arguments)
        })
    };
    let mut stake: Vec<Artifact> = Vec::new();
    for m in input.iter().filter(|m| !unchanged(m)) {
        let mut held = artifacts::of_message(m);
        if !m.meta.is_summary {
            held.extend(m.meta.ledger.iter().cloned());
        }
        for a in held {
            if !stake.contains(&a) {
                stake.push(a);
            }
        }
    }
    let shown: Vec<&str> = output
        .iter()
        .flat_map(|m| {
            std::iter::once(m.content.as_str())
                .chain(m.reasoning.as_deref())
                .chain(m.tool_calls.iter().map(|c| c.arguments.as_str()))
        })
        .collect();
    // A long request is its head and tail: a user message whose head and tail are the same
    // shows it, though not in one piece.
    let asked: Vec<Artifact> = output
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(artifacts::of_message)
        .collect();
    let mut out = [(0u64, 0u64); 4];
    for a in stake {
        let slot = &mut out[Category::ALL
            .iter()
            .position(|c| *c == a.category)
            .unwrap_or(0)];
        slot.0 += 1;
        slot.1 +=
            u64::from(shown.iter().any(|t| t.contains(a.text.as_str())) || asked.contains(&a));
    }
    out
}

fn matches_outside(q: &CompactionScore, outside: [(u64, u64); 4]) -> Result<(), String> {
    let reported: Vec<(u64, u64)> = q
        .categories()
        .iter()
        .map(|(_, c)| (c.at_stake, c.in_sight))
        .collect();
    if reported != outside {
        return Err(format!("reported {reported:?}, counted {outside:?}"));
    }
    let shares: Vec<f64> = outside
        .iter()
        .filter(|(stake, _)| *stake > 0)
        .map(|(stake, sight)| *sight as f64 / *stake as f64)
        .collect();
    let want = if shares.is_empty() {
        1.0
    } else {
        shares.iter().sum::<f64>() / shares.len() as f64
    };
    if (q.score - want).abs() > 1e-9 {
        return Err(format!("score {} against {want}", q.score));
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Step {
    /// A user request, long ones past what an artifact keeps.
    Ask(usize),
    /// A command whose result is recorded failure output behind `noise` bytes of progress.
    Run {
        output: usize,
        noise: usize,
    },
    /// A read of one of a few files.
    Read {
        file: usize,
        size: usize,
    },
    Say(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0usize..400).prop_map(Step::Ask),
        4 => (0..RECORDED.len(), 0usize..9_000).prop_map(|(output, noise)| Step::Run { output, noise }),
        3 => (0usize..4, 100usize..6_000).prop_map(|(file, size)| Step::Read { file, size }),
        1 => (10usize..2_000).prop_map(Step::Say),
    ]
}

fn session_of(steps: &[Step]) -> Vec<Message> {
    let mut h = vec![
        Message::system("You are a coding agent."),
        Message::user("Start."),
    ];
    for (n, s) in steps.iter().enumerate() {
        let id = format!("c{n}");
        match s {
            Step::Ask(len) => h.push(Message::user(format!(
                "request {n}: make the tests pass{}",
                " and keep the API".repeat(len / 17)
            ))),
            Step::Run { output, noise } => {
                let command = format!(r#"{{"command":"make check-{n}"}}"#);
                h.push(Message::assistant_calls(
                    "",
                    vec![call(&id, "bash", &command)],
                ));
                let progress = tool_output(1, n, *noise);
                h.push(Message::tool(
                    &id,
                    format!("{progress}\n{}", RECORDED[*output]),
                ));
            }
            Step::Read { file, size } => {
                let path = format!(r#"{{"path":"src/module{file}.rs"}}"#);
                h.push(Message::assistant_calls(
                    "",
                    vec![call(&id, "read_file", &path)],
                ));
                h.push(Message::tool(&id, tool_output(3, *file, *size)));
            }
            Step::Say(len) => h.push(Message::assistant(format!(
                "working on it {n} {}",
                "x".repeat(*len)
            ))),
        }
    }
    h
}

#[derive(Clone, Debug)]
enum Cut {
    Microcompact { idle: bool },
    Dedup,
    Mirror { cleared: usize },
    Ladder { window_tokens: u64, summary: bool },
}

fn cut() -> impl Strategy<Value = Cut> {
    prop_oneof![
        3 => any::<bool>().prop_map(|idle| Cut::Microcompact { idle }),
        2 => Just(Cut::Dedup),
        1 => (1usize..6).prop_map(|cleared| Cut::Mirror { cleared }),
        3 => (2_000u64..40_000, any::<bool>()).prop_map(|(window_tokens, summary)| Cut::Ladder { window_tokens, summary }),
    ]
}

proptest! {
    // 64 cases by default; `PROPTEST_CASES=500` for a deeper run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_cut_is_scored_as_an_outside_count_finds_it(
        steps in proptest::collection::vec(step(), 1..24),
        cuts in proptest::collection::vec(cut(), 1..6),
    ) {
        let rt = super::rt();
        let store = MemoryStore::new();
        let mut policy = EffectivePolicy::default();
        policy.microcompact.min_content_chars = 1_000;
        policy.microcompact.cache_horizon_turns = 0;
        let mut state = SessionState::new();
        let summarizer = ScriptedSummarizer::good();
        let mut h = session_of(&steps);
        for c in cuts {
            let input = h.clone();
            let quality = match c {
                Cut::Microcompact { idle } => {
                    let idle_for = idle.then(|| Duration::from_secs(3 * 3600));
                    let r = rt.block_on(microcompact::microcompact(&mut h, &policy, idle_for, &store));
                    prop_assert_eq!(r.quality.is_some(), r.is_change());
                    r.quality
                }
                Cut::Dedup => {
                    let r = rt.block_on(dedup::dedup_reads(&mut h, &policy, &store));
                    prop_assert_eq!(r.quality.is_some(), r.is_change());
                    r.quality
                }
                Cut::Mirror { cleared } => {
                    let m = rt.block_on(mirror::mirror_cleared_tool_uses(&mut h, cleared, 2, &[], &store));
                    prop_assert_eq!(m.quality.is_some(), m.stubbed > 0);
                    m.quality
                }
                Cut::Ladder { window_tokens, summary } => {
                    let ctx = LadderContext {
                        policy: &policy,
                        inputs: BudgetInputs { context_window: window_tokens, payload_cap: None, reserve_bytes: 0 },
                        store: &store,
                        summarizer: summary.then_some(&summarizer as &dyn Summarizer),
                        trigger: Trigger::Auto,
                        budget_ratio: None,
                        target: None,
                    };
                    let out = rt.block_on(compact(&mut h, &ctx, &mut state));
                    out.quality
                }
            };
            if let Some(q) = quality {
                let outside = outside_count(&input, &h);
                if let Err(e) = matches_outside(&q, outside) {
                    prop_assert!(false, "{:?}: {}", c, e);
                }
            } else {
                prop_assert_eq!(&input, &h, "a pass that changed the history is scored");
            }
        }
    }
}

/// A session whose commands fail with recorded tool output behind progress lines (so the
/// error is never on the first line), with short user requests between them.
fn failing_runs(turns: usize) -> Vec<Message> {
    let mut h = vec![
        Message::system("You are a coding agent."),
        Message::user("Start."),
    ];
    for n in 0..turns {
        if n % 4 == 0 {
            h.push(Message::user(format!(
                "request {n}: now make check-{n} pass"
            )));
        }
        let id = format!("c{n}");
        let command = format!(r#"{{"command":"make check-{n}"}}"#);
        h.push(Message::assistant_calls(
            "",
            vec![call(&id, "bash", &command)],
        ));
        let progress = tool_output(1, n, 4_000);
        h.push(Message::tool(
            &id,
            format!("{progress}\n{}", RECORDED[n % RECORDED.len()]),
        ));
        let read = format!(r#"{{"path":"src/module{n}.rs"}}"#);
        let rid = format!("r{n}");
        h.push(Message::assistant_calls(
            "",
            vec![call(&rid, "read_file", &read)],
        ));
        h.push(Message::tool(&rid, tool_output(3, n, 3_000)));
        h.push(Message::assistant(format!("step {n} done")));
    }
    h
}

/// With a careless summarizer (nine sections that name nothing of the session), at a
/// generous target, what each level keeps in sight of everything the history touched.
#[tokio::test]
async fn a_careless_summary_still_leaves_files_commands_errors_and_requests_in_sight() {
    use cairn_engine::compact::probe::retention;
    use cairn_engine::compact::{Retention, trim};
    use cairn_engine::history;
    let policy = EffectivePolicy::default();
    let summarizer = ScriptedSummarizer::good();
    let share = |r: &Retention, c: Category| {
        let t = r.tally(c);
        if t.total == 0 {
            1.0
        } else {
            t.present as f64 / t.total as f64
        }
    };
    for turns in [24, 120] {
        let before = failing_runs(turns);
        let bytes = history::weight(&before);
        let mut trimmed = before.clone();
        trim::trim(&mut trimmed, &policy, Trigger::Auto, &MemoryStore::new()).await;
        let r = retention(&before, &trimmed, &|_| None);
        let after_trim = history::weight(&trimmed);
        let mut rows = vec![(1u8, r)];
        for (level, with_summarizer, target) in
            [(2u8, true, after_trim * 3 / 5), (3, false, bytes / 8)]
        {
            let store = MemoryStore::new();
            let mut h = before.clone();
            let mut state = SessionState::new();
            let ctx = LadderContext {
                policy: &policy,
                inputs: BudgetInputs {
                    context_window: (bytes / 4) as u64,
                    payload_cap: None,
                    reserve_bytes: 0,
                },
                store: &store,
                summarizer: with_summarizer.then_some(&summarizer as &dyn Summarizer),
                trigger: Trigger::Auto,
                budget_ratio: None,
                target: Some(target),
            };
            let out = compact(&mut h, &ctx, &mut state).await;
            assert_eq!(out.level, Some(level), "{out:?}");
            assert!(out.met, "{out:?}");
            rows.push((level, retention(&before, &h, &|_| None)));
        }
        for (level, r) in &rows {
            eprintln!(
                "{} KB level {level}: files {:.2} commands {:.2} errors {:.2} requests {:.2}",
                bytes / 1000,
                share(r, Category::Files),
                share(r, Category::Commands),
                share(r, Category::Errors),
                share(r, Category::Requests),
            );
            let floor = if *level == 3 { 0.8 } else { 0.95 };
            for c in [Category::Files, Category::Commands, Category::Errors] {
                assert!(
                    share(r, c) >= floor,
                    "{bytes} level {level} {c:?}: {:?}",
                    r.lost
                );
            }
            if *level == 2 {
                assert!(share(r, Category::Requests) >= 0.9, "{:?}", r.lost);
            }
        }
    }
}
