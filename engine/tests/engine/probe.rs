//! The retention probe: what a session touched (files, commands, errors, requests), and how
//! much of it a compaction keeps in sight or within recall.

use std::collections::{BTreeMap, BTreeSet};

use cairn_crds::EffectivePolicy;
use cairn_engine::artifacts::{self, Artifact, Category};
use cairn_engine::ccr::{Key, MemoryStore, Store, extract_markers};
use cairn_engine::compact::archive::{parse_segment, segment_text};
use cairn_engine::compact::emergency::emergency;
use cairn_engine::compact::probe::{Retention, Snapshot, retention, score};
use cairn_engine::compact::{PassReport, Trigger, pairing};
use cairn_engine::history::{self, Message};
use cairn_engine::testing::*;
use proptest::prelude::*;

fn art(category: Category, text: &str) -> Artifact {
    Artifact {
        category,
        text: text.into(),
    }
}

fn calls_of(args: &[&str]) -> Message {
    let calls = args
        .iter()
        .enumerate()
        .map(|(i, a)| call(&format!("c{i}"), "tool", a))
        .collect();
    Message::assistant_calls("", calls)
}

fn errors_of(content: &str) -> Vec<Artifact> {
    artifacts::of_message(&Message::tool("c1", content))
}

#[test]
fn every_file_key_names_a_file() {
    let m = calls_of(&[
        r#"{"path":"src/a.rs"}"#,
        r#"{"file_path":"/repo/b.rs","content":"x"}"#,
        r#"{"filename":"c.txt"}"#,
        r#"{"file":"  d.md  "}"#,
        r#"{"paths":["e.rs","f.rs",3],"files":["g.rs"]}"#,
        r#"{"edits":[{"file_path":"nested/h.rs","old":"a","new":"b"}]}"#,
        r#"{"path":"src/a.rs","file":{"not":"a string"},"name":"not a file"}"#,
    ]);
    let files: Vec<String> = artifacts::of_message(&m)
        .into_iter()
        .inspect(|a| assert_eq!(a.category, Category::Files))
        .map(|a| a.text)
        .collect();
    assert_eq!(
        files,
        [
            "src/a.rs",
            "/repo/b.rs",
            "c.txt",
            "d.md",
            "g.rs",
            "e.rs",
            "f.rs",
            "nested/h.rs"
        ],
        "distinct within the message, trimmed, calls in order, keys sorted"
    );
}

#[test]
fn every_command_key_names_a_command() {
    let m = calls_of(&[
        r#"{"command":"cargo test 2>&1 | tail -200"}"#,
        r#"{"cmd":["git","status","--short"]}"#,
        r#"{"script":"set -e\nmake"}"#,
        r#"{"command":["ls",7]}"#,
        r#"{"cmd":""}"#,
    ]);
    assert_eq!(
        artifacts::of_message(&m),
        vec![
            art(Category::Commands, "cargo test 2>&1 | tail -200"),
            art(Category::Commands, "git status --short"),
            art(Category::Commands, "set -e\nmake"),
        ]
    );
    assert_eq!(Category::Commands.label(), "commands");
    assert_eq!(
        Category::ALL.map(Category::label),
        ["files", "commands", "errors", "requests"]
    );
}

#[test]
fn invalid_json_arguments_name_nothing() {
    let m = calls_of(&[
        r#"{"path":"src/a.rs""#,
        "path=src/b.rs",
        "",
        r#""src/c.rs""#,
    ]);
    assert!(artifacts::of_message(&m).is_empty());
}

#[test]
fn an_error_result_gives_its_error_lines() {
    let cases = [
        (
            "Error: file not found: src/x.rs\nmore",
            Some("Error: file not found: src/x.rs"),
        ),
        (
            "\n\n   error: could not compile `cairn`  \n",
            Some("error: could not compile `cairn`"),
        ),
        (
            "ERROR 1045 (28000): Access denied",
            Some("ERROR 1045 (28000): Access denied"),
        ),
        (
            "fatal: not a git repository",
            Some("fatal: not a git repository"),
        ),
        (
            "panic: runtime error: index out of range",
            Some("panic: runtime error: index out of range"),
        ),
        (
            "thread 'main' panicked at src/main.rs:2:5:\nboom",
            Some("thread 'main' panicked at src/main.rs:2:5:"),
        ),
        (
            "Traceback (most recent call last):\n  File \"x.py\"",
            Some("Traceback (most recent call last):"),
        ),
        (
            "   Compiling cairn v0.1.0\nerror[E0425]: cannot find value `x`\nwarning: unused\nerror: aborting",
            Some("error[E0425]: cannot find value `x`\nerror: aborting"),
        ),
        (
            "running 3 tests\n  error: bad input\n",
            Some("error: bad input"),
        ),
        // Not errors: a later line must start like a tool's diagnostic.
        ("running 3 tests\ntest result: ok. 0 errors", None),
        ("fn f() -> Result<(), Error> {}", None),
        ("log: an error: happened mid-line", None),
        ("", None),
    ];
    for (content, want) in cases {
        let got = errors_of(content);
        let want: Vec<Artifact> = want
            .into_iter()
            .flat_map(str::lines)
            .map(|w| art(Category::Errors, w))
            .collect();
        assert_eq!(got, want, "{content:?}");
    }
    // Cut to 200 bytes on a character boundary.
    let long = format!("error: {}", "é".repeat(300));
    let got = errors_of(&long);
    assert!(got[0].text.len() <= 200 && got[0].text.len() >= 199);
    assert!(long.starts_with(&got[0].text));
}

#[test]
fn a_user_message_is_a_request_trimmed_and_cut() {
    let m = Message::user("  please fix the build  \n");
    assert_eq!(
        artifacts::of_message(&m),
        vec![art(Category::Requests, "please fix the build")]
    );
    // 300 bytes after the spaces: its head and tail, 200 bytes in all, on char boundaries.
    let long = format!("  {}{}", "ü".repeat(100), "ß".repeat(50));
    let got = artifacts::of_message(&Message::user(long.clone()));
    assert_eq!(
        got[0].text,
        format!(
            "{}{}{}",
            "ü".repeat(64),
            artifacts::REQUEST_GAP,
            "ß".repeat(32)
        )
    );
    assert!(got[0].text.len() <= artifacts::MAX_TEXT);
    // The message itself shows its request, though not in one piece.
    let h = [Message::user(long)];
    assert_eq!(cairn_engine::compact::probe::in_sight(&got, &h), vec![true]);
    assert!(artifacts::of_message(&Message::user(" \n ")).is_empty());
}

#[test]
fn summaries_notices_and_system_messages_yield_nothing() {
    let mut notice = Message::user("[cairn: the conversation outgrew the model's context window]");
    notice.meta.is_summary = true;
    let mut summary = calls_of(&[r#"{"path":"src/a.rs"}"#]);
    summary.meta.is_summary = true;
    let mut tool = Message::tool("c1", "error: summarized away");
    tool.meta.is_summary = true;
    for m in [
        notice,
        summary,
        tool,
        Message::system("error: you are a coding agent"),
    ] {
        assert!(artifacts::of_message(&m).is_empty(), "{m:?}");
    }
    let h = vec![
        Message::system("be brief"),
        Message::user("read a"),
        calls_of(&[r#"{"path":"a.rs"}"#, r#"{"path":"a.rs"}"#]),
        Message::tool("c0", "error: no such file"),
        Message::tool("c1", "error: no such file"),
        Message::user("read a"),
    ];
    assert_eq!(
        artifacts::of_history(&h),
        BTreeSet::from([
            art(Category::Files, "a.rs"),
            art(Category::Errors, "error: no such file"),
            art(Category::Requests, "read a"),
        ])
    );
}

/// The synthetic coding session, with every third shell run failing to compile.
fn failing_session(bytes: usize) -> Vec<Message> {
    let mut h = session(bytes);
    let runs = h.iter_mut().filter(|m| m.name.as_deref() == Some("bash"));
    for (n, m) in runs.enumerate().filter(|(n, _)| n.is_multiple_of(3)) {
        m.content = format!(
            "   Compiling cairn v0.1.0\nerror[E0308]: mismatched types in run {n}\n{}",
            m.content
        );
    }
    h
}

/// The originals a pass archived, collected from the store (the probe itself is synchronous).
async fn archived_by(reports: &[&PassReport], store: &dyn Store) -> BTreeMap<Key, Vec<u8>> {
    let mut out = BTreeMap::new();
    for k in reports.iter().flat_map(|r| r.archived.iter()) {
        if let Some(bytes) = store.fetch(k).await.expect("memory store reads") {
            out.insert(*k, bytes);
        }
    }
    out
}

fn lookup(map: &BTreeMap<Key, Vec<u8>>) -> impl Fn(&Key) -> Option<Vec<u8>> + '_ {
    |k| map.get(k).cloned()
}

fn show(label: &str, r: &Retention) {
    eprintln!(
        "{label}: score {:.3}, reachable {:.3}",
        r.score(),
        r.reachable_share()
    );
    for c in Category::ALL {
        let t = r.tally(c);
        eprintln!(
            "  {:<9} total {:>3}  present {:>3}  reachable {:>3}",
            c.label(),
            t.total,
            t.present,
            t.reachable
        );
    }
}

#[test]
fn without_compaction_everything_is_present() {
    let h = failing_session(200_000);
    let r = retention(&h, &h, &|_| None);
    show("no compaction", &r);
    for c in Category::ALL {
        let t = r.tally(c);
        assert!(t.total > 0, "{}", c.label());
        assert_eq!(
            (t.present, t.reachable),
            (t.total, t.total),
            "{}",
            c.label()
        );
    }
    assert_eq!(r.score(), 1.0);
    assert_eq!(r.reachable_share(), 1.0);
    assert!(r.lost.is_empty());
    // Nothing at stake scores 1.0 too.
    let empty = retention(&[], &h, &|_| None);
    assert_eq!((empty.score(), empty.reachable_share()), (1.0, 1.0));
}

#[tokio::test]
async fn level3_keeps_the_removed_part_within_recall() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let before = failing_session(300_000);
    let mut h = before.clone();
    let (report, met) = emergency(&mut h, &policy, 60_000, Trigger::Auto, &store).await;
    assert!(met, "{report:?}");
    assert!(report.removed > 0);
    let map = archived_by(&[&report], &store).await;
    let r = retention(&before, &h, &lookup(&map));
    show("level 3 at 60000 bytes", &r);
    for c in Category::ALL {
        let t = r.tally(c);
        assert_eq!(t.reachable, t.total, "{}: {:?}", c.label(), r.lost);
    }
    assert!(r.lost.is_empty());
    assert_eq!(r.reachable_share(), 1.0);
    assert_eq!(
        (r.files.present, r.errors.present),
        (r.files.total, r.errors.total),
        "the notice's ledger shows what the removed messages touched"
    );

    // Through the notice's marker alone (its ledger section taken away): every artifact of
    // the removed messages comes back.
    let h = without_sections(&h);
    let r = retention(&before, &h, &|_| None);
    assert!(r.requests.present < r.requests.total);
    assert!(r.score() < 1.0, "{}", r.score());
    let notice = h
        .iter()
        .find(|m| m.meta.is_summary)
        .expect("level 3 leaves a notice");
    let key = extract_markers(&notice.content)[0];
    let segment_only: BTreeMap<Key, Vec<u8>> =
        BTreeMap::from([(key, map.get(&key).expect("segment archived").clone())]);
    let segment = String::from_utf8(segment_only[&key].clone()).expect("utf8");
    let removed = parse_segment(&segment).expect("a segment");
    assert_eq!(removed.len(), report.removed);
    let removed_artifacts = artifacts::of_history(&removed);
    assert!(!removed_artifacts.is_empty());
    let r = retention(&before, &h, &lookup(&segment_only));
    for a in &r.lost {
        assert!(!removed_artifacts.contains(a), "removed yet lost: {a:?}");
    }
    // Without the archive, what is not in sight is lost.
    let r = retention(&before, &h, &|_| None);
    assert_eq!(r.reachable_share(), r.score());
    assert!(r.lost.iter().any(|a| removed_artifacts.contains(a)));
}

#[tokio::test]
async fn markers_inside_archived_segments_are_followed() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let before = failing_session(300_000);
    let mut h = before.clone();
    let (first, _) = emergency(&mut h, &policy, 120_000, Trigger::Auto, &store).await;
    // Only the markers lead to what the notices replaced: their ledger sections (which a
    // second notice would carry forward) are taken away.
    let mut h = without_sections(&h);
    // A shorter tail the second time, so the first notice is truncated too.
    let short = EffectivePolicy {
        min_keep_recent: 2,
        ..EffectivePolicy::default()
    };
    let (second, met) = emergency(&mut h, &short, 8_000, Trigger::Auto, &store).await;
    assert!(
        met && first.removed > 0 && second.removed > 0,
        "{first:?}\n{second:?}"
    );
    // The first notice now sits inside the second segment, its marker escaped there.
    assert!(
        !h.iter()
            .any(|m| m.content.contains(&first.archived[0].marker()))
    );
    let map = archived_by(&[&first, &second], &store).await;
    let h = without_sections(&h);
    let r = retention(&before, &h, &lookup(&map));
    show("level 3 twice (120000, then 8000 bytes keeping 2)", &r);
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    assert!(r.score() < r.reachable_share());
    // Without the first segment, what only it held is lost: the nesting was followed.
    let mut second_only = map.clone();
    second_only.remove(&first.archived[0]);
    let r = retention(&before, &h, &lookup(&second_only));
    assert!(!r.lost.is_empty());
}

#[test]
fn escaped_and_argv_artifacts_are_found_in_a_segment() {
    // A path with `<` (escaped in a segment) and an argv command (never a substring).
    let removed = vec![
        Message::user("look at the generics"),
        Message::assistant_calls(
            "",
            vec![
                call("c1", "read_file", r#"{"path":"src/<gen>.rs"}"#),
                call("c2", "bash", r#"{"cmd":["rg","-n","T<U>"]}"#),
            ],
        ),
        Message::tool("c1", "fn f<T>() {}"),
        Message::tool("c2", "error: regex parse error"),
    ];
    let segment = segment_text(&removed);
    assert!(!segment.contains("src/<gen>.rs"));
    let key = Key::of(segment.as_bytes());
    let mut notice = Message::user(format!("[cairn: truncated; recall {}]", key.marker()));
    notice.meta.is_summary = true;
    let after = vec![notice, Message::user("next")];
    let map = BTreeMap::from([(key, segment.into_bytes())]);
    let mut before = removed.clone();
    before.push(Message::user("next"));
    let r = retention(&before, &after, &lookup(&map));
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    assert_eq!(r.files.reachable, 1);
    assert_eq!(r.commands.reachable, 1);
    assert_eq!(r.requests.present, 1);
    assert_eq!(r.requests.reachable, 2);
    // A marker only in `meta.archived` is not one the model can see.
    let mut hidden = Message::user("next");
    hidden.meta.archived.push(key.as_str().into());
    let r = retention(&before, &[hidden], &lookup(&map));
    assert_eq!(r.lost.len(), 4);
}

#[derive(Clone, Debug)]
enum Op {
    User(usize),
    Assistant(usize),
    Calls(Vec<(u8, usize, bool)>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..1_500).prop_map(Op::User),
        2 => (0usize..4_000).prop_map(Op::Assistant),
        5 => proptest::collection::vec((0u8..6, 0usize..6_000, any::<bool>()), 1..4)
            .prop_map(Op::Calls),
    ]
}

/// A small valid history: every call answered right after it, some results errors.
fn build(ops: &[Op]) -> Vec<Message> {
    let mut h = vec![Message::system("You are a coding agent.")];
    h.push(Message::user("Start the task."));
    for (n, op) in ops.iter().enumerate() {
        match op {
            Op::User(size) => h.push(Message::user(format!(
                "request {n}: {}",
                "please continue with ünïcode. ".repeat(size / 30 + 1)
            ))),
            Op::Assistant(size) => h.push(Message::assistant(format!(
                "assistant {n}: {}",
                tool_output(3, n, *size)
            ))),
            Op::Calls(calls) => {
                let args = |k: usize, kind: u8| match kind {
                    0 => format!(r#"{{"path":"src/f{n}_{k}.rs"}}"#),
                    1 => format!(r#"{{"file_path":"src/<g{n}>.rs","old":"a","new":"b"}}"#),
                    2 => format!(r#"{{"paths":["a{n}.rs","b{k}.rs"]}}"#),
                    3 => format!(r#"{{"command":"cargo test -p crate{n} 2>&1"}}"#),
                    4 => format!(r#"{{"cmd":["rg","-n","needle{n}","src/"]}}"#),
                    _ => "{not json".to_string(),
                };
                let tool_calls = calls
                    .iter()
                    .enumerate()
                    .map(|(k, (kind, _, _))| call(&format!("c{n}_{k}"), "tool", &args(k, *kind)))
                    .collect();
                h.push(Message::assistant_calls(format!("step {n}"), tool_calls));
                for (k, (kind, size, failed)) in calls.iter().enumerate() {
                    let mut body = tool_output(usize::from(*kind), n * 10 + k, *size);
                    if *failed {
                        body = format!("error[E0{n:03}]: failure {n}.{k}\n{body}");
                    }
                    h.push(Message::tool(format!("c{n}_{k}"), body));
                }
            }
        }
    }
    h.push(Message::user("What is left?"));
    h
}

/// The ladder's context for the synthetic session of `bytes`: an automatic compaction to
/// `target`, with `summarizer` or without one.
fn ladder<'a>(
    policy: &'a EffectivePolicy,
    store: &'a MemoryStore,
    summarizer: Option<&'a ScriptedSummarizer>,
    bytes: usize,
    target: usize,
) -> cairn_engine::compact::LadderContext<'a> {
    cairn_engine::compact::LadderContext {
        policy,
        inputs: cairn_engine::compact::BudgetInputs {
            context_window: (bytes / 4) as u64,
            payload_cap: None,
            reserve_bytes: 0,
        },
        store,
        summarizer: summarizer.map(|s| s as _),
        trigger: Trigger::Auto,
        budget_ratio: None,
        target: Some(target),
    }
}

/// `h` with each stand-in's ledger (its section or blocks and its entries) taken away, so only its
/// markers reach what it replaced.
fn without_sections(h: &[Message]) -> Vec<Message> {
    h.iter()
        .map(|m| {
            let mut m = m.clone();
            let own = cairn_engine::compact::sections::summarizer_text(&m.content);
            m.content = cairn_engine::compact::ledger::without_section(&own).to_owned();
            m.meta.ledger.clear();
            m.meta.ledger_folded = 0;
            m
        })
        .collect()
}

/// One row of the retention tables in docs/benchmarks.md.
fn row(bytes: usize, level: u8, r: &Retention) {
    let cell = |c: Category| {
        let t = r.tally(c);
        format!("{}/{}", t.present, t.total)
    };
    eprintln!(
        "| {} KB | {level} | {:.2} | {} | {} | {} | {} | {:.2} |",
        bytes / 1000,
        r.score(),
        cell(Category::Files),
        cell(Category::Commands),
        cell(Category::Errors),
        cell(Category::Requests),
        r.reachable_share()
    );
}

/// A summary that does not bring the history under the target: level 3 follows, and the
/// summary's ledger section, written before level 3 runs, keeps what it replaced in sight
/// (level 3 keeps it, or carries its entries into its own notice).
#[tokio::test]
async fn after_a_summary_that_does_not_converge_level_3_keeps_its_ledger_in_sight() {
    use cairn_engine::compact::ledger::HEADING;
    use cairn_engine::compact::sections::BLOCK_OPEN;
    use cairn_engine::compact::state::SummaryVerdict;
    use cairn_engine::compact::{SessionState, compact};
    // A kept tail that cannot shrink under the target (a call's arguments are never cut).
    let policy = EffectivePolicy::default();
    let summarizer = ScriptedSummarizer::new(vec![Ok(well_formed_summary(40_000))]);
    let bytes = 1_000_000;
    let mut before = failing_session(bytes);
    before.extend(heavy_call_turn(60_000));
    let store = MemoryStore::new();
    let mut h = before.clone();
    let mut state = SessionState::new();
    let ctx = ladder(&policy, &store, Some(&summarizer), bytes, 50_000);
    let out = compact(&mut h, &ctx, &mut state).await;
    assert_eq!(
        (out.summary, out.level, out.met),
        (Some(SummaryVerdict::Accepted), Some(3), true),
        "{out:?}"
    );
    assert!(
        h.iter()
            .any(|m| m.content.contains(HEADING) || m.content.contains(BLOCK_OPEN))
    );
    let q = out.quality.expect("scored");
    for c in [q.files, q.commands, q.errors] {
        assert!(c.at_stake > 0);
        assert_eq!(c.in_sight, c.at_stake, "{q:?}");
    }
}

/// `compaction.quality.minScore` above what a level-3 compaction reaches: level 3 runs
/// again with a wider ledger section (cutting its kept tail further, within the target) and
/// the compaction is scored again; what it reaches is noted, and one that stays below is
/// counted and reported.
#[tokio::test]
async fn a_min_score_above_the_score_widens_the_ledger_and_is_reported() {
    use cairn_engine::compact::ledger::HEADING;
    use cairn_engine::compact::{SessionState, compact};
    let bytes = 1_000_000;
    let before = failing_session(bytes);
    let run = |target: usize, min_score: Option<f64>| {
        let before = before.clone();
        async move {
            let mut policy = EffectivePolicy::default();
            policy.quality.min_score = min_score;
            let store = MemoryStore::new();
            let mut h = before;
            let mut state = SessionState::new();
            let ctx = ladder(&policy, &store, None, bytes, target);
            let out = compact(&mut h, &ctx, &mut state).await;
            let section = h
                .iter()
                .find(|m| m.meta.is_summary)
                .and_then(|m| m.content.find(HEADING).map(|at| m.content.len() - at))
                .unwrap_or(0);
            (out, state, section)
        }
    };
    let notes = |out: &cairn_engine::compact::CompactionOutcome| -> Vec<String> {
        out.reports.iter().flat_map(|r| r.notes.clone()).collect()
    };

    // At a 40th of the history the section (at most a quarter of the target) shows all
    // that level 3 replaced: nothing to widen.
    let target = bytes / 40;
    let (plain, _, plain_section) = run(target, None).await;
    let first = plain.quality.clone().expect("scored");
    assert_eq!(plain.level, Some(3));
    assert!(plain_section > 0);
    assert_eq!(first.score, 1.0, "{first:?}");
    let (strict, state, _) = run(target, Some(1.0)).await;
    assert!(strict.met, "{strict:?}");
    assert_eq!(strict.quality, plain.quality);
    assert_eq!(
        (strict.below_min_score, state.quality.below_min_score),
        (None, 0)
    );

    // At a 400th even all the room left cannot show it all: reported, counted.
    let target = bytes / 400;
    let (plain, _, _) = run(target, None).await;
    let (strict, state, _) = run(target, Some(1.0)).await;
    let first = plain.quality.clone().expect("scored");
    let best = strict.quality.clone().expect("scored");
    eprintln!(
        "level 3 at {target} bytes: score {:.3}, {:.3} widened",
        first.score, best.score
    );
    assert!(
        best.score >= first.score && best.score < 1.0,
        "{first:?} -> {best:?}"
    );
    assert_eq!(strict.met, plain.met);
    assert_eq!(strict.below_min_score, Some(1.0));
    assert_eq!(state.quality.below_min_score, 1);
    assert!(
        notes(&strict)
            .iter()
            .any(|n| n.contains("stays below quality.minScore 1 ")),
        "{:?}",
        notes(&strict)
    );
}

/// A compaction is scored on what it replaced or removed: the artifacts of messages it left
/// unchanged are not at stake, and with nothing at stake the score is 1.
#[test]
fn a_score_counts_only_what_the_compaction_replaced() {
    let h = failing_session(200_000);
    let snapshot = Snapshot::of(&h);
    assert!(snapshot.at_stake(&h).is_empty(), "nothing replaced");
    let nothing = score(&[], &h, 0);
    assert_eq!((nothing.score, nothing.files.at_stake), (1.0, 0));

    // The older half dropped without a trace: at stake exactly what only it held.
    let half = h.len() / 2;
    let kept = h[half..].to_vec();
    let stake = snapshot.at_stake(&kept);
    let older: BTreeSet<Artifact> = artifacts::of_history(&h[..half]);
    assert_eq!(stake.iter().cloned().collect::<BTreeSet<_>>(), older);
    let q = score(&stake, &kept, 3);
    let in_sight_before = retention(&h, &kept, &|_| None);
    // Whatever of the older half the newer half names again stays in sight.
    for (c, s) in [
        (Category::Files, q.files),
        (Category::Commands, q.commands),
        (Category::Errors, q.errors),
        (Category::Requests, q.requests),
    ] {
        let t = in_sight_before.tally(c);
        let newer_only = t.total - s.at_stake as usize;
        assert_eq!(
            s.in_sight as usize + newer_only,
            t.present,
            "{}: {q:?}",
            c.label()
        );
    }
    assert!(
        q.score < 1.0,
        "dropping half a session loses sight of something: {q:?}"
    );

    // A message changed in place puts its artifacts at stake.
    let mut changed = h.clone();
    let i = changed
        .iter()
        .position(|m| !m.tool_calls.is_empty())
        .expect("a call");
    changed[i].tool_calls[0].arguments = "{}".into();
    let stake = snapshot.at_stake(&changed);
    assert_eq!(
        stake.iter().cloned().collect::<BTreeSet<_>>(),
        artifacts::of_message(&h[i])
            .into_iter()
            .collect::<BTreeSet<_>>()
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn level3_loses_no_artifact(
        ops in proptest::collection::vec(op(), 1..25),
        percent in 1usize..100,
        keep in 1u32..10,
    ) {
        let before = build(&ops);
        prop_assert!(pairing::is_valid(&before));
        let target = history::weight(&before) * percent / 100;
        let policy = EffectivePolicy { min_keep_recent: keep, ..EffectivePolicy::default() };
        let store = MemoryStore::new();
        let mut h = before.clone();
        let map = super::rt().block_on(async {
            let (report, _) = emergency(&mut h, &policy, target, Trigger::Auto, &store).await;
            archived_by(&[&report], &store).await
        });
        let r = retention(&before, &h, &lookup(&map));
        for c in Category::ALL {
            let t = r.tally(c);
            prop_assert_eq!(t.reachable, t.total, "{}: lost {:?}", c.label(), &r.lost);
            prop_assert!(t.present <= t.reachable && t.reachable <= t.total);
        }
        prop_assert!(r.lost.is_empty());
        prop_assert!(r.score() <= r.reachable_share());
    }
}

/// The probe at each ladder level on the synthetic coding session at three sizes: every
/// level keeps every artifact within recall (reachable 100 %), and the table of what stays in
/// sight is printed (`cargo test -p cairn-engine --test engine level_by_level -- --nocapture`;
/// the figures are in docs/benchmarks.md).
#[tokio::test]
async fn level_by_level_every_artifact_stays_within_recall() {
    use cairn_engine::compact::{summarize, trim};
    let policy = EffectivePolicy::default();
    eprintln!("| history | level | score | files | commands | errors | requests | reachable |");
    eprintln!("|---|---|---|---|---|---|---|---|");
    for bytes in [200_000, 1_000_000, 4_000_000] {
        let before = failing_session(bytes);
        for level in 1..=3u8 {
            let store = MemoryStore::new();
            let mut h = before.clone();
            let report = match level {
                1 => trim::trim(&mut h, &policy, Trigger::Auto, &store).await,
                2 => {
                    let summarizer = ScriptedSummarizer::good();
                    summarize::summarize(&mut h, &policy, Trigger::Auto, &summarizer, &store)
                        .await
                        .0
                }
                _ => {
                    emergency(&mut h, &policy, bytes / 10, Trigger::Auto, &store)
                        .await
                        .0
                }
            };
            assert!(report.is_change(), "level {level} at {bytes}: {report:?}");
            let map = archived_by(&[&report], &store).await;
            let r = retention(&before, &h, &lookup(&map));
            row(bytes, level, &r);
            for c in Category::ALL {
                let t = r.tally(c);
                assert_eq!(
                    t.reachable,
                    t.total,
                    "level {level} at {bytes}: {} lost {:?}",
                    c.label(),
                    r.lost
                );
            }
        }
    }
}

/// The whole ladder (whose stand-ins carry the artifact ledger) at a target that takes it to
/// level 2 with the scripted summarizer, and to level 3 without a summarizer: every file,
/// command and error of the history stays in sight, in a kept message or in the ledger
/// section, and every artifact within recall. A second compaction of the compacted history
/// carries the first one's ledger forward. The table is in docs/benchmarks.md.
#[tokio::test]
async fn with_the_ledger_every_file_command_and_error_stays_in_sight() {
    use cairn_engine::compact::ledger::HEADING;
    use cairn_engine::compact::sections::BLOCK_OPEN;
    use cairn_engine::compact::{LadderContext, SessionState, compact, trim};
    let policy = EffectivePolicy::default();
    let summarizer = ScriptedSummarizer::good();
    for bytes in [200_000, 1_000_000, 4_000_000] {
        let before = failing_session(bytes);
        // Level 2 runs at three fifths of what level 1 leaves; level 3 (no summarizer) at a
        // tenth of the history.
        let mut trimmed = before.clone();
        trim::trim(&mut trimmed, &policy, Trigger::Auto, &MemoryStore::new()).await;
        let after_trim = history::weight(&trimmed);
        for (level, with_summarizer, target) in
            [(2u8, true, after_trim * 3 / 5), (3, false, bytes / 10)]
        {
            let store = MemoryStore::new();
            let mut h = before.clone();
            let mut state = SessionState::new();
            let ctx = ladder(
                &policy,
                &store,
                with_summarizer.then_some(&summarizer),
                bytes,
                target,
            );
            let out = compact(&mut h, &ctx, &mut state).await;
            assert_eq!(out.level, Some(level), "{bytes}: {out:?}");
            assert!(out.met, "the ledger never costs the target: {out:?}");
            // Level 2 fills the summary's sections, level 3 writes its notice's section.
            let written = if level == 2 { BLOCK_OPEN } else { HEADING };
            assert!(h.iter().any(|m| m.content.contains(written)));
            let reports: Vec<&PassReport> = out.reports.iter().collect();
            let map = archived_by(&reports, &store).await;
            let r = retention(&before, &h, &lookup(&map));
            row(bytes, level, &r);
            // The compaction's own score: what it replaced, in sight (files, commands and
            // errors all of it, with the ledger).
            let q = out
                .quality
                .clone()
                .expect("a compaction that changed the history is scored");
            assert_eq!(q.level, level);
            for c in [q.files, q.commands, q.errors] {
                assert!(c.at_stake > 0, "{q:?}");
                assert_eq!(c.in_sight, c.at_stake, "{bytes} level {level}: {q:?}");
            }
            assert!(q.requests.in_sight <= q.requests.at_stake);
            assert!(q.score > 0.0 && q.score <= 1.0, "{q:?}");
            assert_eq!(state.quality.last.as_ref(), Some(&q));
            assert_eq!(state.quality.scored, 1);
            // What scoring costs the compaction: the snapshot before, the score after.
            let started = std::time::Instant::now();
            let snapshot = Snapshot::of(&before);
            let snapped = started.elapsed();
            let again = score(&snapshot.at_stake(&h), &h, level);
            let scored = started.elapsed() - snapped;
            assert_eq!(again, q);
            eprintln!(
                "  compaction score {:.2} (of what it replaced); snapshot of {} messages {:.2} ms, score {:.2} ms",
                q.score,
                before.len(),
                snapped.as_secs_f64() * 1e3,
                scored.as_secs_f64() * 1e3
            );
            for c in [Category::Files, Category::Commands, Category::Errors] {
                let t = r.tally(c);
                assert_eq!(
                    t.present,
                    t.total,
                    "{bytes} level {level}: {} {:?}",
                    c.label(),
                    r.lost
                );
            }
            assert_eq!(r.reachable_share(), 1.0, "{:?}", r.lost);

            // Compacted again, harder: the first stand-in's ledger is carried forward.
            let again = LadderContext {
                target: Some(target / 2),
                summarizer: None,
                ..ctx
            };
            let out = compact(&mut h, &again, &mut state).await;
            assert!(out.met, "{out:?}");
            let r = retention(&before, &h, &|_| None);
            for c in [Category::Files, Category::Commands, Category::Errors] {
                let t = r.tally(c);
                assert_eq!(
                    t.present,
                    t.total,
                    "second pass at {bytes}: {} {:?}",
                    c.label(),
                    r.lost
                );
            }
        }
    }
}

#[test]
fn a_short_room_shows_files_and_commands_first_and_counts_the_rest() {
    use cairn_engine::compact::ledger::section;
    let mut entries = vec![art(Category::Files, "src/a.rs")];
    // Each ends with a period, so none is a prefix of another.
    entries.extend((0..50).map(|n| art(Category::Errors, &format!("error: failure number {n}."))));
    entries.push(art(Category::Commands, "cargo test"));
    let marker = "<<ccr:0123456789abcdef>>";
    let s = section(&entries, 3, Some(marker), 400);
    assert!(s.len() <= 400, "{}", s.len());
    assert!(
        s.contains("file src/a.rs\n") && s.contains("command cargo test\n"),
        "{s}"
    );
    assert!(
        s.contains("error: failure number 49."),
        "the newest errors: {s}"
    );
    assert!(!s.contains("error: failure number 0.\n"), "{s}");
    let shown = s.lines().filter(|l| l.starts_with("error ")).count();
    assert!(
        s.contains(&format!(
            "{} more not shown: recall {marker}",
            50 - shown + 3
        )),
        "the rest is counted with the marker: {s}"
    );
    assert_eq!(
        section(&entries, 0, Some(marker), 60),
        "",
        "no room for the heading"
    );
}

#[test]
fn a_stand_ins_own_text_is_its_content_without_the_section() {
    use cairn_engine::compact::ledger::{section, without_section};
    let own = "[cairn: summary of 4 earlier messages]\n\nThe memory text.";
    let with = format!(
        "{own}{}",
        section(&[art(Category::Files, "a.rs")], 0, None, 1_000)
    );
    assert_ne!(with, own);
    assert_eq!(without_section(&with), own);
    assert_eq!(without_section(own), own);
}
