//! Journal invariants over random interleavings of writers on one session: a rebuild gives
//! exactly the history made of the acknowledged entries, a replaced writer never gets an
//! entry acknowledged again, and splices replay byte for byte.

use std::sync::Arc;

use cairn_agent::history::{Message, to_jsonl};
use cairn_agent::journal::{Change, DirObjects, Journal, ObjectStore, rebuild};
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
