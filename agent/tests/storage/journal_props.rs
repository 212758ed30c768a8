//! Journal invariants over random interleavings of writers on one session: a rebuild gives
//! exactly the history made of the acknowledged entries, a replaced writer never gets an
//! entry acknowledged again, and splices replay byte for byte.

use std::sync::Arc;

use cairn_agent::ccr::{MemoryStore, Store};
use cairn_agent::history::{Message, to_jsonl};
use cairn_agent::journal::{Change, Journal, REWIND_LEVELS, Undo, rebuild};
use cairn_agent::storage::{DirObjects, ObjectStore};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// A new writer takes the session over.
    Open,
    /// Writer `w` (index among those opened, modulo) splices: keep `keep` (modulo len + 1)
    /// messages, append `add` new ones.
    Write { w: usize, keep: usize, add: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Open),
        6 => (0usize..4, 0usize..8, 0usize..3).prop_map(|(w, keep, add)| Op::Write { w, keep, add }),
    ]
}

struct Writer {
    journal: Journal,
    /// What this writer believes the history is.
    view: Vec<Message>,
    fenced: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn rebuild_is_exactly_the_acknowledged_history(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let objects: Arc<dyn ObjectStore> = Arc::new(DirObjects::open(dir.path()).unwrap());
            let mut writers: Vec<Writer> = Vec::new();
            let mut acknowledged: Vec<Message> = Vec::new();
            let mut counter = 0;
            for op in ops {
                match op {
                    Op::Open => {
                        let (journal, rebuilt) = Journal::open(objects.clone(), format!("w{}", writers.len())).await.unwrap();
                        prop_assert_eq!(to_jsonl(&rebuilt.history), to_jsonl(&acknowledged));
                        writers.push(Writer { journal, view: rebuilt.history, fenced: false });
                    }
                    Op::Write { w, keep, add } => {
                        if writers.is_empty() {
                            continue;
                        }
                        let i = w % writers.len();
                        let newest = writers.len() - 1;
                        let wr = &mut writers[i];
                        let at = keep % (wr.view.len() + 1);
                        let messages: Vec<Message> = (0..add).map(|_| { counter += 1; Message::user(format!("m{counter}")) }).collect();
                        let mut next = wr.view[..at].to_vec();
                        next.extend(messages);
                        match wr.journal.write(&next, Change::default()).await {
                            // Nothing changed, nothing written.
                            Ok(None) => prop_assert_eq!(to_jsonl(&next), to_jsonl(&wr.view)),
                            Ok(Some(_)) => {
                                prop_assert!(i == newest && !wr.fenced, "only the newest writer is acknowledged");
                                wr.view = next;
                                acknowledged = wr.view.clone();
                            }
                            Err(e) => {
                                prop_assert_eq!(e.label(), "fenced");
                                prop_assert!(i != newest);
                                wr.fenced = true;
                            }
                        }
                    }
                }
            }
            let r = rebuild(objects.as_ref()).await.unwrap();
            prop_assert_eq!(to_jsonl(&r.history), to_jsonl(&acknowledged));
            Ok(())
        })?;
    }
}

#[derive(Clone, Debug)]
enum Edit {
    /// A turn: messages of these sizes are added.
    Turn(Vec<usize>),
    /// A compaction: everything but the first message and the last `keep` becomes one summary.
    Compact { keep: usize },
    /// Undoes the newest compaction not yet undone, keeping what came after it.
    Rewind,
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        5 => proptest::collection::vec(1usize..6_000, 1..4).prop_map(Edit::Turn),
        2 => (0usize..4).prop_map(|keep| Edit::Compact { keep }),
        2 => Just(Edit::Rewind),
    ]
}

/// Records a compaction whose history before was `pre` as the newest rewind level (the
/// oldest dropped past [`REWIND_LEVELS`]); the change that journals it.
fn compacted(pre: Vec<Message>, history: &[Message], levels: &mut Vec<Undo>) -> Change {
    let undo = Undo {
        pre,
        post_len: history.len(),
    };
    levels.push(undo.clone());
    if levels.len() > REWIND_LEVELS {
        levels.remove(0);
    }
    Change {
        undo: Some(undo),
        ..Change::default()
    }
}

/// Undoes the newest compaction in `levels`, keeping what came after it; the change that
/// journals it, or `None` with nothing to rewind.
fn rewound(history: &mut Vec<Message>, levels: &mut Vec<Undo>) -> Option<Change> {
    let undo = levels.pop()?;
    let after = history.split_off(undo.post_len.min(history.len()));
    *history = undo.pre;
    history.extend(after);
    Some(Change {
        rewinds: true,
        ..Change::default()
    })
}

fn stored_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with('e'))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Issue 13, defect 4: whatever the turns, compactions and rewinds, the journal stays
    /// within 3 × the history plus a constant (the messages a rewind would restore are in
    /// the archive, named by key), and a restart rebuilds the history and its rewind levels.
    /// Issue 35: rewinds undo compactions newest first, at most `REWIND_LEVELS` deep.
    #[test]
    fn journal_size_stays_bounded(edits in proptest::collection::vec(edit(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let objects: Arc<dyn ObjectStore> = Arc::new(DirObjects::open(dir.path()).unwrap());
            let archive: Arc<dyn Store> = Arc::new(MemoryStore::new());
            let (mut journal, _) =
                Journal::open_archiving(objects.clone(), "w", archive.clone()).await.unwrap();
            let mut history: Vec<Message> = Vec::new();
            // The rewind levels, oldest first.
            let mut levels: Vec<Undo> = Vec::new();
            let mut n = 0;
            for e in edits {
                let change = match e {
                    Edit::Turn(sizes) => {
                        for size in sizes {
                            n += 1;
                            history.push(Message::user(format!("{n} {}", "y".repeat(size))));
                        }
                        Change::default()
                    }
                    Edit::Compact { keep } => {
                        if history.len() < keep + 3 {
                            continue;
                        }
                        let pre = history.clone();
                        let tail = history.split_off(history.len() - keep);
                        history.truncate(1);
                        n += 1;
                        history.push(Message::assistant(format!("summary {n}")));
                        history.extend(tail);
                        compacted(pre, &history, &mut levels)
                    }
                    Edit::Rewind => {
                        let Some(change) = rewound(&mut history, &mut levels) else { continue };
                        change
                    }
                };
                journal.write(&history, change).await.unwrap();
                // Superseded entries are deleted beside the writes.
                journal.collected().await;
                let history_bytes = to_jsonl(&history).len() as u64;
                let rewind_bytes = levels.last().map_or(0, |u| to_jsonl(&u.pre).len() as u64);
                let bound = 3 * history_bytes + 128 * 1024;
                let stored = stored_bytes(dir.path());
                prop_assert!(
                    stored <= bound,
                    "{} journal bytes for a {}-byte history ({}-byte rewind target)",
                    stored, history_bytes, rewind_bytes
                );
            }
            let (reopened, rebuilt) = Journal::open_archiving(objects, "r", archive).await.unwrap();
            prop_assert_eq!(to_jsonl(&rebuilt.history), to_jsonl(&history));
            prop_assert_eq!(reopened.rewind_levels(), levels.len());
            prop_assert_eq!(
                rebuilt.undos.iter().map(|l| to_jsonl(&l.undo.pre)).collect::<Vec<_>>(),
                levels.iter().map(|u| to_jsonl(&u.pre)).collect::<Vec<_>>()
            );
            Ok(())
        })?;
    }
}

/// The rewind target of a compaction lives in the archive; an archive that lost it (a
/// retention rule, a wiped cache-only store) costs the rewind, never the journal.
#[tokio::test]
async fn an_archived_rewind_target_survives_a_restart_and_its_loss_only_costs_the_rewind() {
    let dir = tempfile::tempdir().unwrap();
    let objects: Arc<dyn ObjectStore> = Arc::new(DirObjects::open(dir.path()).unwrap());
    let archive: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (mut journal, _) = Journal::open_archiving(objects.clone(), "w", archive.clone())
        .await
        .unwrap();
    let pre: Vec<Message> = (0..40)
        .map(|i| Message::user(format!("{i} {}", "z".repeat(20_000))))
        .collect();
    journal.write(&pre, Change::default()).await.unwrap();
    let post = vec![
        pre[0].clone(),
        Message::assistant("summary"),
        pre[39].clone(),
    ];
    let undo = Undo {
        pre: pre.clone(),
        post_len: post.len(),
    };
    journal
        .write(
            &post,
            Change {
                undo: Some(undo.clone()),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    // A few more turns, so a checkpoint carries the target on.
    let mut history = post.clone();
    for i in 0..70 {
        history.push(Message::user(format!("turn {i}")));
        journal.write(&history, Change::default()).await.unwrap();
    }
    let stored = stored_bytes(dir.path());
    let h = to_jsonl(&history).len() as u64;
    assert!(
        stored <= 3 * h + 128 * 1024,
        "{stored} journal bytes for a {h}-byte history"
    );
    drop(journal);

    let (reopened, rebuilt) = Journal::open_archiving(objects.clone(), "r", archive)
        .await
        .unwrap();
    assert_eq!(to_jsonl(&rebuilt.history), to_jsonl(&history));
    let back = &reopened
        .rewindable()
        .expect("the rewind target is read from the archive")
        .undo;
    assert_eq!(to_jsonl(&back.pre), to_jsonl(&pre));
    drop(reopened);

    // The archive lost it: the journal still opens, with nothing to rewind.
    let empty: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (lost, rebuilt) = Journal::open_archiving(objects, "s", empty).await.unwrap();
    assert_eq!(to_jsonl(&rebuilt.history), to_jsonl(&history));
    assert!(lost.rewindable().is_none());
}

#[derive(Clone, Debug)]
enum Step {
    /// A turn: a request, a call that reads file `file` or runs a command on it, its result
    /// (an error line first when it `fails`) of about `size` bytes.
    Turn {
        file: u8,
        command: bool,
        fails: bool,
        size: usize,
    },
    /// The ladder to `percent` of the history: through level 2 with a summarizer, else
    /// level 3.
    Compact { percent: usize, summarize: bool },
    /// Undoes the newest compaction not yet undone, keeping what came after it.
    Rewind,
    /// The agent restarts: a new writer rebuilds the history and its rewind levels.
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..12, any::<bool>(), any::<bool>(), 100usize..8_000).prop_map(
            |(file, command, fails, size)| Step::Turn { file, command, fails, size }
        ),
        3 => (5usize..60, any::<bool>()).prop_map(|(percent, summarize)| Step::Compact { percent, summarize }),
        1 => Just(Step::Rewind),
        1 => Just(Step::Restart),
    ]
}

/// Every original the archive holds that `history` reaches through markers, read ahead for
/// the probe (which is synchronous), following markers inside segments.
async fn reachable_originals(
    history: &[Message],
    archive: &dyn Store,
) -> std::collections::BTreeMap<cairn_agent::ccr::Key, Vec<u8>> {
    use cairn_agent::ccr::extract_markers;
    let mut out = std::collections::BTreeMap::new();
    let texts = |m: &Message| {
        let mut t = vec![m.content.clone()];
        t.extend(m.reasoning.clone());
        t.extend(m.tool_calls.iter().map(|c| c.arguments.clone()));
        t
    };
    let mut next: Vec<cairn_agent::ccr::Key> = history
        .iter()
        .flat_map(texts)
        .flat_map(|t| extract_markers(&t))
        .collect();
    while let Some(key) = next.pop() {
        if out.contains_key(&key) {
            continue;
        }
        let Ok(Some(bytes)) = archive.fetch(&key).await else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        next.extend(extract_markers(&text));
        if let Ok(messages) = cairn_agent::compact::archive::parse_segment(&text) {
            next.extend(
                messages
                    .iter()
                    .flat_map(texts)
                    .flat_map(|t| extract_markers(&t)),
            );
        }
        out.insert(key, bytes);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24)
    ))]

    /// The artifact ledger's guarantee across the journal: whatever the turns, compactions
    /// (levels 2 and 3 of the real ladder), rewinds and restarts, every file, command, error
    /// and request that entered the history is in the history or reachable through its
    /// markers, and a restart rebuilds the history with its ledgers byte for byte.
    #[test]
    fn every_artifact_stays_within_reach_across_compactions_rewinds_and_restarts(
        steps in proptest::collection::vec(step(), 1..30)
    ) {
        use cairn_agent::compact::{BudgetInputs, LadderContext, SessionState, Trigger, compact};
        use cairn_engine::artifacts::Category;
        use cairn_engine::compact::probe::retention;
        use cairn_engine::testing::ScriptedSummarizer;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let objects: Arc<dyn ObjectStore> = Arc::new(DirObjects::open(dir.path()).unwrap());
            let archive: Arc<dyn Store> = Arc::new(MemoryStore::new());
            let (mut journal, _) =
                Journal::open_archiving(objects.clone(), "w0", archive.clone()).await.unwrap();
            let policy = cairn_crds::EffectivePolicy { min_keep_recent: 2, ..Default::default() };
            let summarizer = ScriptedSummarizer::good();
            let mut state = SessionState::new();
            let mut history = vec![Message::system("You are a coding agent.")];
            journal.write(&history, Change::default()).await.unwrap();
            let mut entered: Vec<Message> = Vec::new();
            let mut levels: Vec<Undo> = Vec::new();
            let mut n = 0usize;
            for s in steps {
                let change = match s {
                    Step::Turn { file, command, fails, size } => {
                        n += 1;
                        let (tool, args) = if command {
                            ("bash", serde_json::json!({"command": format!("cargo test -p m{file}")}))
                        } else {
                            ("read_file", serde_json::json!({"path": format!("src/m{file}.rs")}))
                        };
                        let id = format!("c{n}");
                        let mut result = String::new();
                        if fails {
                            result.push_str(&format!("error[E0308]: mismatched types in step {n}\n"));
                        }
                        result.push_str(&format!("line of output {n}\n").repeat(size / 20 + 1));
                        let mut out = Message::tool(id.clone(), result);
                        out.name = Some(tool.into());
                        let turn = vec![
                            Message::user(format!("request {n}: look at m{file}")),
                            Message::assistant_calls(
                                format!("Looking at m{file}."),
                                vec![cairn_agent::history::ToolCall {
                                    id,
                                    name: tool.into(),
                                    arguments: args.to_string(),
                                }],
                            ),
                            out,
                        ];
                        entered.extend(turn.iter().cloned());
                        history.extend(turn);
                        Change::default()
                    }
                    Step::Compact { percent, summarize } => {
                        let pre = history.clone();
                        let ctx = LadderContext {
                            policy: &policy,
                            inputs: BudgetInputs { context_window: 1_000_000, payload_cap: None, reserve_bytes: 0 },
                            store: archive.as_ref(),
                            summarizer: summarize.then_some(&summarizer as _),
                            trigger: Trigger::Manual,
                            budget_ratio: None,
                            target: Some(cairn_agent::history::weight(&history) * percent / 100),
                        };
                        compact(&mut history, &ctx, &mut state).await;
                        if to_jsonl(&history) == to_jsonl(&pre) {
                            continue;
                        }
                        compacted(pre, &history, &mut levels)
                    }
                    Step::Rewind => {
                        let Some(change) = rewound(&mut history, &mut levels) else { continue };
                        change
                    }
                    Step::Restart => {
                        let (reopened, rebuilt) = Journal::open_archiving(
                            objects.clone(), format!("w{n}-{}", levels.len()), archive.clone(),
                        ).await.unwrap();
                        prop_assert_eq!(to_jsonl(&rebuilt.history), to_jsonl(&history));
                        journal = reopened;
                        history = rebuilt.history;
                        levels = rebuilt.undos.iter().map(|l| l.undo.clone()).collect();
                        continue;
                    }
                };
                journal.write(&history, change).await.unwrap();
                let originals = reachable_originals(&history, archive.as_ref()).await;
                let r = retention(&entered, &history, &|k| originals.get(k).cloned());
                for c in Category::ALL {
                    let t = r.tally(c);
                    prop_assert_eq!(t.reachable, t.total, "{}: lost {:?}", c.label(), &r.lost);
                }
            }
            let (_, rebuilt) = Journal::open_archiving(objects, "last", archive).await.unwrap();
            prop_assert_eq!(to_jsonl(&rebuilt.history), to_jsonl(&history));
            Ok(())
        })?;
    }
}
