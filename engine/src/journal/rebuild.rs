//! The rebuild: which entries of a listing are valid, the chain of bases from the newest back
//! to a checkpoint, and the history, state and rewind levels it replays to.

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};

use futures::{StreamExt, TryStreamExt};

use super::entry::{Entry, PersistedState, StoredUndo, Undo};
use super::names::{Claim, Token, parse_claim, parse_entry_name};
use super::splice::{decode_undo, splice};
use super::undo::{Level, UndoStack};
use super::{JournalError, ObjectStore};
use crate::ccr::{Key, Store};
use crate::compact::archive::parse_segment;
use crate::history::Message;

/// Claim objects a rebuild reads at once.
const CLAIM_READS_IN_FLIGHT: usize = 16;

/// Where the chain of a rebuilt (or written) history stands.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chain {
    /// Seq of the newest entry on the chain: the base of the next.
    pub head: Option<u64>,
    /// Seq and size of the chain's checkpoint.
    pub checkpoint: Option<(u64, u64)>,
    /// Entries and bytes on the chain after the checkpoint.
    pub deltas: u64,
    pub delta_bytes: u64,
}

impl Chain {
    /// Bytes of the live journal: the checkpoint and the deltas since.
    pub fn live_bytes(&self) -> u64 {
        self.checkpoint.map_or(0, |(_, b)| b) + self.delta_bytes
    }

    /// Entry `seq` of `bytes` joined the chain as its head.
    pub fn add(&mut self, seq: u64, bytes: u64, checkpoint: bool) {
        self.head = Some(seq);
        if checkpoint {
            self.checkpoint = Some((seq, bytes));
            self.deltas = 0;
            self.delta_bytes = 0;
        } else {
            self.deltas += 1;
            self.delta_bytes += bytes;
        }
    }
}

/// What a rebuild found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rebuilt {
    pub history: Vec<Message>,
    pub state: PersistedState,
    /// Entries replayed (the chain from its checkpoint on).
    pub entries: u64,
    /// Seq of the newest valid entry.
    pub last_seq: Option<u64>,
    /// The compactions a rewind can undo, newest on top: entries that compacted, less those
    /// a rewind undid, at most [`super::REWIND_LEVELS`]. A level whose archived record is
    /// gone ends the stack there (the levels below it are out of reach).
    pub undos: UndoStack<Level>,
    /// Where the rebuilt chain stands: the base and size rule of the next entry.
    pub chain: Chain,
    /// Entries older than the chain's checkpoint are still there.
    pub garbage_below: Option<u64>,
}

impl Rebuilt {
    /// The compaction the next rewind undoes.
    pub fn rewindable(&self) -> Option<&Level> {
        self.undos.top()
    }
}

/// Reads an undo back: inline, or its segment from the archive. `Ok(None)`: the archive no
/// longer has the segment (or none is configured), so there is nothing to rewind to.
async fn load_undo(
    stored: StoredUndo,
    post: &[Message],
    segments: Option<&dyn Store>,
    name: &str,
) -> Result<Option<Undo>, JournalError> {
    let corrupt = |reason: String| JournalError::Corrupt {
        name: name.to_owned(),
        reason,
    };
    let Some(archived) = stored.archived.clone() else {
        return decode_undo(stored, post).map(Some).map_err(corrupt);
    };
    let Some(store) = segments else {
        tracing::warn!(key = %archived.key, "journal: the rewind target is archived and no archive is configured; rewind is unavailable");
        return Ok(None);
    };
    let Some(key) = Key::parse(&archived.key) else {
        return Err(corrupt(format!(
            "undo names an invalid archive key {:?}",
            archived.key
        )));
    };
    let bytes = match store.fetch(&key).await {
        Ok(Some(b)) => b,
        Ok(None) => {
            tracing::warn!(key = %archived.key, "journal: the archive no longer holds the rewind target; rewind is unavailable");
            return Ok(None);
        }
        Err(e) => {
            return Err(JournalError::Unavailable(format!(
                "reading the rewind target {} from the archive: {e}",
                archived.key
            )));
        }
    };
    let messages = std::str::from_utf8(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|t| parse_segment(t).map_err(|e| e.to_string()))
        .map_err(|e| corrupt(format!("archived rewind target {}: {e}", archived.key)))?;
    if messages.len() != archived.messages {
        return Err(corrupt(format!(
            "archived rewind target {} holds {} messages, the entry says {}",
            archived.key,
            messages.len(),
            archived.messages
        )));
    }
    let inline = StoredUndo {
        pre: messages,
        archived: None,
        ..stored
    };
    decode_undo(inline, post).map(Some).map_err(corrupt)
}

/// Replays the valid entries of a journal: the chain of bases from the newest valid entry
/// back to a checkpoint. A rewind target that was archived is not read (no archive given).
pub async fn rebuild(objects: &dyn ObjectStore) -> Result<Rebuilt, JournalError> {
    rebuild_with(objects, None).await
}

/// [`rebuild`], reading an archived rewind target from `segments`.
pub async fn rebuild_with(
    objects: &dyn ObjectStore,
    segments: Option<&dyn Store>,
) -> Result<Rebuilt, JournalError> {
    let mut bounds: BTreeMap<Token, u64> = BTreeMap::new();
    let claims: Vec<(Token, String)> = objects
        .list("claims/")
        .await?
        .into_iter()
        .filter_map(|name| parse_claim(&name).map(|t| (t, name)))
        .collect();
    // The claims are independent of each other: read concurrently, in order.
    let mut reads = Vec::with_capacity(claims.len());
    for (_, name) in &claims {
        reads.push(objects.get(name));
    }
    let bodies: Vec<Option<Vec<u8>>> = futures::stream::iter(reads)
        .buffered(CLAIM_READS_IN_FLIGHT)
        .try_collect()
        .await?;
    for ((token, _), body) in claims.into_iter().zip(bodies) {
        if let Some(body) = body
            && let Ok(c) = serde_json::from_slice::<Claim>(&body)
            && let Some(start) = c.start_seq
        {
            let bound = bounds.entry(token).or_insert(start);
            *bound = (*bound).min(start);
        }
    }
    // An entry of token t is valid below the smallest start_seq of any later completed claim.
    let limit_for = |token: Token| {
        bounds
            .range((Excluded(token), Unbounded))
            .map(|(_, s)| *s)
            .min()
            .unwrap_or(u64::MAX)
    };
    let mut valid: BTreeMap<u64, (Token, bool, String)> = BTreeMap::new();
    let mut lowest: Option<u64> = None;
    for name in objects.list("e").await? {
        let Some((token, seq, full)) = parse_entry_name(&name) else {
            continue;
        };
        lowest = Some(lowest.map_or(seq, |l| l.min(seq)));
        if seq >= limit_for(token) {
            continue;
        }
        // One writer never sends a seq twice; two names for one (token, seq) exist only in
        // journals of the first format, where the delta was the write that counted.
        let better = match valid.get(&seq) {
            None => true,
            Some((t, f, _)) => token > *t || (token == *t && *f && !full),
        };
        if better {
            valid.insert(seq, (token, full, name));
        }
    }
    let mut chain: Vec<(u64, String, Entry, u64)> = Vec::new();
    let mut next = valid.keys().next_back().copied();
    while let Some(seq) = next {
        let Some((_, _, name)) = valid.get(&seq) else {
            let from = chain.last().map(|c| c.1.clone()).unwrap_or_default();
            return Err(JournalError::Corrupt {
                name: from,
                reason: format!("builds on entry {seq}, which the journal does not hold"),
            });
        };
        let body = objects
            .get(name)
            .await?
            .ok_or_else(|| JournalError::Corrupt {
                name: name.clone(),
                reason: "listed but missing".into(),
            })?;
        let entry: Entry = serde_json::from_slice(&body).map_err(|e| JournalError::Corrupt {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        next = match entry.base {
            Some(b) if b < seq => Some(b),
            Some(b) => {
                return Err(JournalError::Corrupt {
                    name: name.clone(),
                    reason: format!("builds on entry {b}, which is not older"),
                });
            }
            None if entry.is_checkpoint() => None,
            None => valid.range(..seq).next_back().map(|(s, _)| *s),
        };
        chain.push((seq, name.clone(), entry, body.len() as u64));
    }
    chain.reverse();
    let mut out = Rebuilt::default();
    // The rewind levels, oldest first: the entry's seq and name, its record and, for a
    // record that splices the entry's history, that history up to the record's `post_len`.
    let mut undos: UndoStack<(u64, String, StoredUndo, Vec<Message>)> = UndoStack::default();
    for (seq, name, entry, bytes) in chain {
        let corrupt = |reason: String| JournalError::Corrupt {
            name: name.clone(),
            reason,
        };
        out.history =
            splice(&out.history, entry.at, &entry.messages, entry.tail).map_err(corrupt)?;
        out.chain.add(seq, bytes, entry.is_checkpoint());
        if entry.is_checkpoint() {
            // A checkpoint carries the levels left after it: `rewinds` is already applied.
            // The older records are whole; one that is not fails to read against nothing.
            undos = entry
                .older_undos
                .into_iter()
                .map(|c| (c.seq, name.clone(), c.undo, Vec::new()))
                .collect();
        } else if entry.rewinds.is_some() {
            undos.pop();
        }
        if let Some(u) = entry.undo {
            let post = if u.is_whole() {
                Vec::new()
            } else {
                out.history[..u.post_len.min(out.history.len())].to_vec()
            };
            undos.push((seq, name.clone(), u, post));
        }
        let mut state = entry.state;
        if let Some(kept) = entry.replay_at {
            let base = &out.state.replay.items;
            let Some(prefix) = base.get(..kept) else {
                return Err(corrupt(format!(
                    "keeps {kept} replay items of a base that holds {}",
                    base.len()
                )));
            };
            let mut items = prefix.to_vec();
            items.append(&mut state.replay.items);
            state.replay.items = items;
        }
        out.state = state;
        out.entries += 1;
        out.last_seq = Some(seq);
    }
    // Newest first: a level the archive lost ends the stack.
    let mut levels = Vec::with_capacity(undos.len());
    for (seq, name, stored, post) in undos.into_vec().into_iter().rev() {
        match load_undo(stored.clone(), &post, segments, &name).await? {
            Some(undo) => levels.push(Level { seq, undo, stored }),
            None => break,
        }
    }
    out.undos = levels.into_iter().rev().collect();
    if let (Some(low), Some((start, _))) = (lowest, out.chain.checkpoint)
        && low < start
    {
        out.garbage_below = Some(start);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{CarriedUndo, REWIND_LEVELS, encode_undo, entry_name, whole_undo};
    use crate::testing::MemObjects;

    fn users(msgs: &[&str]) -> Vec<Message> {
        msgs.iter().map(|m| Message::user(*m)).collect()
    }

    /// Writes entries as the writer would: each a checkpoint of the whole history, or a delta
    /// on the one before.
    struct Log {
        objects: MemObjects,
        seq: u64,
        history: Vec<Message>,
    }

    impl Log {
        fn new() -> Self {
            Self {
                objects: MemObjects::default(),
                seq: 0,
                history: Vec::new(),
            }
        }

        fn put(&mut self, entry: Entry) {
            let full = entry.is_checkpoint();
            let name = entry_name(Token::claimed(1, 1, 0), entry.seq, full);
            self.objects
                .raw_put(&name, serde_json::to_vec(&entry).unwrap());
            self.seq += 1;
        }

        fn entry(&self, history: &[Message]) -> Entry {
            let (at, range, tail) = super::super::diff(&self.history, history);
            Entry {
                epoch: 1,
                seq: self.seq,
                holder: "t".into(),
                base: self.seq.checked_sub(1),
                at,
                messages: history[range].to_vec(),
                tail,
                state: PersistedState::default(),
                replay_at: None,
                compactions: Vec::new(),
                undo: None,
                older_undos: Vec::new(),
                rewinds: None,
            }
        }

        /// A turn that sets the history.
        fn turn(&mut self, history: Vec<Message>) {
            let e = self.entry(&history);
            self.put(e);
            self.history = history;
        }

        /// A compaction to `post` of the current history.
        fn compact(&mut self, post: Vec<Message>) -> Undo {
            let undo = Undo {
                pre: self.history.clone(),
                post_len: post.len(),
            };
            let mut e = self.entry(&post);
            e.undo = Some(encode_undo(&undo, &post));
            self.put(e);
            self.history = post;
            undo
        }

        /// A rewind to `history`.
        fn rewind(&mut self, history: Vec<Message>, of: u64) {
            let mut e = self.entry(&history);
            e.rewinds = Some(of);
            self.put(e);
            self.history = history;
        }
    }

    #[tokio::test]
    async fn rewinds_pop_the_levels_newest_first() {
        let mut log = Log::new();
        let h0 = users(&["sys", "a", "b", "c", "d"]);
        log.turn(h0.clone());
        let first = log.compact(users(&["sys", "s1", "d"]));
        let mut h1 = log.history.clone();
        h1.extend(users(&["e", "f"]));
        log.turn(h1.clone());
        let second = log.compact(users(&["sys", "s2", "f"]));
        let r = rebuild(&log.objects).await.unwrap();
        assert_eq!(r.undos.len(), 2);
        assert_eq!(r.rewindable().unwrap().undo, second);
        assert_eq!(r.undos.iter().next().unwrap().undo, first);
        // One rewind: the level below is next.
        log.rewind(second.pre.clone(), 3);
        let r = rebuild(&log.objects).await.unwrap();
        assert_eq!(r.history, h1);
        assert_eq!(r.undos.len(), 1);
        assert_eq!(r.rewindable().unwrap().undo, first);
        log.rewind(first.pre.clone(), 1);
        let r = rebuild(&log.objects).await.unwrap();
        assert!(r.undos.is_empty());
    }

    #[tokio::test]
    async fn a_checkpoint_carries_the_levels_and_an_old_one_is_a_stack_of_one() {
        let mut log = Log::new();
        let old = users(&["sys", "a", "b"]);
        let newer = users(&["sys", "s1", "c", "d"]);
        let now = users(&["sys", "s2", "e"]);
        let u1 = Undo {
            pre: old.clone(),
            post_len: 2,
        };
        let u2 = Undo {
            pre: newer.clone(),
            post_len: 2,
        };
        // A checkpoint of the first format: one record, no older ones.
        let mut e = log.entry(&now);
        e.base = None;
        e.at = 0;
        e.messages = now.clone();
        e.tail = None;
        e.undo = Some(encode_undo(&u2, &now));
        log.put(e);
        log.history = now.clone();
        let r = rebuild(&log.objects).await.unwrap();
        assert_eq!(r.undos.len(), 1);
        assert_eq!(r.rewindable().unwrap().undo, u2);

        // A checkpoint with an older level, after a rewind (which it has applied already).
        let mut e = log.entry(&now);
        e.base = None;
        e.at = 0;
        e.messages = now.clone();
        e.tail = None;
        e.rewinds = Some(0);
        e.undo = Some(encode_undo(&u2, &now));
        e.older_undos = vec![CarriedUndo {
            seq: 0,
            undo: whole_undo(&u1),
        }];
        log.put(e);
        let r = rebuild(&log.objects).await.unwrap();
        assert_eq!(r.history, now);
        let levels: Vec<&Undo> = r.undos.iter().map(|l| &l.undo).collect();
        assert_eq!(levels, vec![&u1, &u2]);

        // An older record that still splices an entry the checkpoint superseded is corrupt.
        let mut e = log.entry(&now);
        e.base = None;
        e.at = 0;
        e.messages = now.clone();
        e.tail = None;
        e.older_undos = vec![CarriedUndo {
            seq: 0,
            undo: encode_undo(&u1, &users(&["sys", "s0"])),
        }];
        log.put(e);
        let err = rebuild(&log.objects).await.unwrap_err();
        assert_eq!(err.label(), "corrupt", "{err}");
    }

    #[tokio::test]
    async fn the_stack_holds_at_most_the_bound() {
        let mut log = Log::new();
        log.turn(users(&["sys", "x"]));
        let mut undos = Vec::new();
        for i in 0..REWIND_LEVELS + 3 {
            let mut h = log.history.clone();
            h.push(Message::user(format!("turn {i}")));
            log.turn(h);
            undos.push(log.compact(users(&["sys", &format!("summary {i}")])));
        }
        let r = rebuild(&log.objects).await.unwrap();
        assert_eq!(r.undos.len(), REWIND_LEVELS);
        let kept: Vec<&Undo> = r.undos.iter().map(|l| &l.undo).collect();
        let newest: Vec<&Undo> = undos[3..].iter().collect();
        assert_eq!(kept, newest);
    }
}
