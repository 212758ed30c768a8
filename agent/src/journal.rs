//! The session journal's writer: an append-only log of history changes, written before a turn
//! is acknowledged, from which a restarted agent rebuilds the exact history. The format (entry
//! and claim names, fencing tokens, entries as splices of their base), the rebuild from a
//! listing and the [`ObjectStore`] port are the engine's (`cairn_engine::journal`, re-exported
//! here); this module holds the writer, [`Journal`], which runs on any of the storage port's
//! backends (`crate::storage`: a local directory or S3).
//!
//! # Unknown outcomes
//!
//! The outcome of a write whose request was sent is unknown until something answers it: a
//! lost or timed-out response, an error after the store acted, a cancelled writer. Three
//! rules keep the journal and the writer's memory in agreement through them:
//!
//! - **No name is written twice with different content.** A sequence number is spent as soon
//!   as its entry is sent, whatever happens to it; a claim is completed under a second name.
//!   A request that lands late can only repeat what its name already holds.
//! - **An entry names its base.** The next entry builds on the last entry *known* to be in
//!   the journal, so one whose outcome stayed unknown and that lands later is off the chain:
//!   a rebuild never meets two candidates for one position.
//! - **A failed write is read back** before the writer answers. Found: it landed (and counts
//!   once the claims check confirms it). Not found: a request still in flight could land
//!   later, so the writer seals it off — an entry with the head's history, on the head — and
//!   only once that is confirmed was it not written. No answer: the outcome stays unknown, and
//!   nothing else is written until a read-back settles it ([`Journal::resolve`]); the caller
//!   takes the history the journal then holds.
//!
//! # Fencing
//!
//! At most one agent writes a session's journal. A writer takes a fencing token — an *epoch*
//! (highest existing + 1) and a nonce that orders two claims of one epoch, the later first
//! ([`Token`]): it writes the claim object `claims/e<epoch>n<nonce>.json` naming itself, then
//! lists the journal and completes the claim with `start_seq` = the next free sequence number
//! (`claims/e<epoch>n<nonce>-start.json`). After every entry it writes, a writer lists
//! `claims/`: if a higher token exists, it has been replaced, fails the write and never
//! writes again ([`JournalError::Fenced`]). A reader ignores every entry of token `t` whose
//! seq is at or beyond the `start_seq` of a completed claim with a higher token. Together: an
//! entry acknowledged by a writer that checked the claims after writing it was listed by the
//! next claimant before that claimant completed its claim (read-after-write and
//! list-after-write consistency, which S3 provides), so it is below the new `start_seq` and
//! stays valid; whatever a replaced writer writes later is ignored. A claims check that
//! fails after the entry landed leaves the entry in the journal, unconfirmed; the next check
//! that succeeds confirms it (a claimant that appears after that check lists it). No
//! conditional write is needed. In a cluster a Kubernetes Lease additionally keeps two pods
//! from running turns at once (see `cluster`); its holder still takes an epoch here.
//!
//! # Size
//!
//! The next entry is a checkpoint when the live journal (the chain's checkpoint and the
//! deltas since) would otherwise exceed 1.5 checkpoints plus [`CHECKPOINT_SLACK`] (a
//! checkpoint's size counts its state, whose replay ledger a delta only extends:
//! [`Entry::replay_at`]); once a
//! checkpoint is confirmed, every entry before it is deleted. A checkpoint carries the rewind
//! levels ([`REWIND_LEVELS`] at most): the newest as a splice of its history, the older ones
//! whole, so rewinds survive the collection. With the session's archive
//! ([`Journal::open_archiving`]) an undo record names an archived segment of the messages
//! it restores instead of holding them, so the journal stays within 1.5 × the history + a
//! constant; without one, within 1.5 × (history + what the levels would bring back) + a
//! constant.

use std::sync::Arc;

use serde::Serialize;

pub use cairn_engine::journal::*;

use crate::ccr::Store;
use crate::compact::archive::segment_text;
use crate::history::Message;

/// Entries on a chain after which the next one is a checkpoint whatever the sizes, so a
/// rebuild fetches a bounded number of objects.
pub const CHECKPOINT_EVERY: u64 = 64;
/// Bytes of deltas allowed past the size rule, so a small history is not checkpointed on
/// every turn.
pub const CHECKPOINT_SLACK: u64 = 64 * 1024;
/// Serialized bytes of an entry besides its messages and state (names, records), for the
/// size rule.
const ENTRY_OVERHEAD: u64 = 512;

/// Serialized size of a message, for the size rule.
/// Serialized bytes of `v`.
fn json_len<T: Serialize>(v: &T) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

fn undo_bytes(stored: &StoredUndo) -> u64 {
    stored.pre.iter().map(json_len::<Message>).sum()
}

/// Bytes an undo record adds to an entry: its messages, or its segment's key.
fn record_bytes(stored: &StoredUndo) -> u64 {
    undo_bytes(stored) + if stored.archived.is_some() { 256 } else { 64 }
}

/// A token of `epoch`, claimed now.
fn claim_token(epoch: u64) -> Token {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Token::claimed(epoch, millis, fastrand::u16(..))
}

/// What the journal holds, as far as its writer knows.
#[derive(Clone, Debug, Default)]
struct View {
    history: Vec<Message>,
    /// Serialized size of each message of `history`.
    sizes: Vec<u64>,
    state: PersistedState,
    /// The rewind levels; every one below the newest is stored whole once a write has run
    /// (see [`Journal::write_synced`]).
    undos: UndoStack<Level>,
    chain: Chain,
}

/// How a landed entry changes the [`View`]: the splice of the history (which moves the kept
/// messages rather than copying them) and the rest.
struct Next {
    at: usize,
    messages: Vec<Message>,
    tail: Option<[usize; 2]>,
    sizes: Vec<u64>,
    state: PersistedState,
    undos: UndoUpdate,
    chain: Chain,
}

/// How a landed entry changes the rewind levels: a rewind pops the newest, a compaction
/// pushes its own; a checkpoint may store the levels anew (oldest first).
struct UndoUpdate {
    pop: bool,
    push: Option<Level>,
    stored: Option<Vec<StoredUndo>>,
}

impl View {
    fn apply(&mut self, next: Next) {
        let kept: Vec<Message> = match next.tail {
            Some([a, b]) => self.history.drain(a..b).collect(),
            None => Vec::new(),
        };
        self.history.truncate(next.at);
        self.history.extend(next.messages);
        self.history.extend(kept);
        self.sizes = next.sizes;
        self.state = next.state;
        if next.undos.pop {
            self.undos.pop();
        }
        if let Some(level) = next.undos.push {
            self.undos.push(level);
        }
        if let Some(stored) = next.undos.stored {
            for (level, s) in self.undos.iter_mut().zip(stored) {
                level.stored = s;
            }
        }
        self.chain = next.chain;
    }
}

/// A write whose outcome is not settled.
enum Pending {
    /// The entry was sent; whether it landed is unknown. `next` is what it changes if it did.
    Sent {
        seq: u64,
        name: String,
        body: Vec<u8>,
        next: Box<Next>,
    },
    /// The entry landed; the claims check that makes it count has not completed.
    Unconfirmed,
}

/// One change of the history, as the session hands it to [`Journal::write`].
#[derive(Clone, Debug, Default)]
pub struct Change {
    pub state: PersistedState,
    pub compactions: Vec<CompactionRecord>,
    /// This change compacted: how to undo it.
    pub undo: Option<Undo>,
    /// This change undoes the compaction that [`Journal::rewindable`] names (the newest
    /// rewind level).
    pub rewinds: bool,
    /// The session state changed without the history (a reset learned cap): written even
    /// when nothing else changed.
    pub persist_state: bool,
}

/// The journal of one session, owned by its single writer.
pub struct Journal {
    objects: Arc<dyn ObjectStore>,
    holder: String,
    token: Token,
    next_seq: u64,
    view: View,
    pending: Option<Pending>,
    fenced: Option<JournalError>,
    /// Entries below this seq are superseded by a checkpoint and are deleted once this
    /// writer's ownership is confirmed.
    collect_below: Option<u64>,
    /// The deletion of superseded entries, running beside the writes (at most one at a
    /// time): a turn does not wait for it. It yields the seq to retry below when it could
    /// not delete everything.
    collecting: Option<tokio::task::JoinHandle<Option<u64>>>,
    /// Where the replaced messages of a compaction are archived, so entries name a key
    /// instead of carrying them (`None`: inline).
    segments: Option<Arc<dyn Store>>,
}

impl Journal {
    /// Takes a new epoch and rebuilds the history. Any earlier writer is fenced from here on.
    /// Undo records stay inline in the entries.
    pub async fn open(
        objects: Arc<dyn ObjectStore>,
        holder: impl Into<String>,
    ) -> Result<(Self, Rebuilt), JournalError> {
        Self::open_with(objects, holder, None).await
    }

    /// [`Journal::open`] with the session's archive: the messages a compaction replaced (its
    /// rewind target) are archived as a segment and entries carry only its key, so the
    /// journal stays within a small multiple of the history however much a rewind would
    /// bring back.
    pub async fn open_archiving(
        objects: Arc<dyn ObjectStore>,
        holder: impl Into<String>,
        archive: Arc<dyn Store>,
    ) -> Result<(Self, Rebuilt), JournalError> {
        Self::open_with(objects, holder, Some(archive)).await
    }

    async fn open_with(
        objects: Arc<dyn ObjectStore>,
        holder: impl Into<String>,
        segments: Option<Arc<dyn Store>>,
    ) -> Result<(Self, Rebuilt), JournalError> {
        let holder = holder.into();
        let claims = objects.list("claims/").await?;
        let epoch = claims
            .iter()
            .filter_map(|n| parse_claim(n))
            .map(|t| t.epoch)
            .max()
            .unwrap_or(0)
            + 1;
        let token = claim_token(epoch);
        let pending = Claim {
            epoch,
            holder: holder.clone(),
            start_seq: None,
        };
        objects
            .put(
                &claim_name(token),
                serde_json::to_vec(&pending).unwrap_or_default(),
            )
            .await?;
        let rebuilt = rebuild_with(objects.as_ref(), segments.as_deref()).await?;
        let next_seq = rebuilt.last_seq.map_or(0, |s| s + 1);
        let done = Claim {
            start_seq: Some(next_seq),
            ..pending
        };
        objects
            .put(
                &start_claim_name(token),
                serde_json::to_vec(&done).unwrap_or_default(),
            )
            .await?;
        tracing::info!(
            epoch,
            next_seq,
            entries = rebuilt.entries,
            "journal: epoch claimed"
        );
        let view = View {
            sizes: rebuilt.history.iter().map(json_len).collect(),
            history: rebuilt.history.clone(),
            state: rebuilt.state.clone(),
            undos: rebuilt.undos.clone(),
            chain: rebuilt.chain.clone(),
        };
        Ok((
            Self {
                objects,
                holder,
                token,
                next_seq,
                view,
                pending: None,
                fenced: None,
                collect_below: rebuilt.garbage_below,
                collecting: None,
                segments,
            },
            rebuilt,
        ))
    }

    pub fn epoch(&self) -> u64 {
        self.token.epoch
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Set once another agent took the session over.
    pub fn fenced(&self) -> Option<&JournalError> {
        self.fenced.as_ref()
    }

    pub fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.objects
    }

    /// The history the journal holds, as far as this writer knows: what a restart rebuilds
    /// once [`Journal::settled`].
    pub fn history(&self) -> &[Message] {
        &self.view.history
    }

    /// The session state of the last entry the journal holds.
    pub fn state(&self) -> &PersistedState {
        &self.view.state
    }

    /// The compaction the next rewind undoes: the seq of its entry and how.
    pub fn rewindable(&self) -> Option<&Level> {
        self.view.undos.top()
    }

    /// How many rewinds in a row the journal can undo (at most [`REWIND_LEVELS`]).
    pub fn rewind_levels(&self) -> usize {
        self.view.undos.len()
    }

    /// False while the outcome of a write is unknown or unconfirmed.
    pub fn settled(&self) -> bool {
        self.pending.is_none()
    }

    /// Settles an unsettled write: reads a sent entry back (found: it landed and
    /// [`Journal::history`] is its history; not found: it was not written), then confirms a
    /// landed one with a claims check. On an error the outcome stays unsettled (but
    /// [`Journal::history`] reflects whatever was learnt).
    pub async fn resolve(&mut self) -> Result<(), JournalError> {
        if let Some(f) = &self.fenced {
            return Err(clone_fenced(f));
        }
        if let Some(Pending::Sent { seq, .. }) = &self.pending {
            let seq = *seq;
            match self.read_back().await {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(e @ (JournalError::Corrupt { .. } | JournalError::Fenced { .. })) => {
                    return Err(e);
                }
                Err(e) => {
                    return Err(JournalError::Unsettled(format!(
                        "whether entry {seq} was written is unknown: {e}"
                    )));
                }
            }
        }
        if matches!(self.pending, Some(Pending::Unconfirmed)) {
            self.confirm().await.map_err(|e| match e {
                JournalError::Unconfirmed(cause) => JournalError::Unsettled(format!(
                    "the last entry is written but not confirmed: {cause}"
                )),
                other => other,
            })?;
        }
        Ok(())
    }

    /// Writes the change that turns [`Journal::history`] into `history`, and confirms that
    /// this agent still owns the session. Returns the entry's seq, or `None` when there was
    /// nothing to write. On an error, [`Journal::history`] is what the journal holds
    /// ([`JournalError::outcome_unknown`]: as far as is known) and nothing more is written
    /// until [`Journal::resolve`] has settled it.
    pub async fn write(
        &mut self,
        history: &[Message],
        change: Change,
    ) -> Result<Option<u64>, JournalError> {
        self.write_synced(history, 0, change).await
    }

    /// [`Journal::write`] for a history whose first `synced` messages are known to equal the
    /// journal's (the writer tracked every change since the last write): only the rest is
    /// compared.
    pub async fn write_synced(
        &mut self,
        history: &[Message],
        synced: usize,
        change: Change,
    ) -> Result<Option<u64>, JournalError> {
        if let Some(f) = &self.fenced {
            return Err(clone_fenced(f));
        }
        match &self.pending {
            Some(Pending::Sent { seq, .. }) => {
                return Err(JournalError::Unsettled(format!(
                    "whether entry {seq} was written is unknown"
                )));
            }
            Some(Pending::Unconfirmed) => self.resolve().await?,
            None => {}
        }
        // A seq spent past the chain's head (a write read back as not written) could still
        // land late and become the newest entry; any entry written after it leaves it off
        // the chain, so one is written even when nothing changed.
        let spent = self.next_seq > self.view.chain.head.map_or(0, |h| h + 1);
        let held = self.view.history.as_slice();
        let synced = synced.min(held.len()).min(history.len());
        debug_assert!(
            history[..synced] == held[..synced],
            "the history's first {synced} messages were claimed to be journaled and are not"
        );
        if history.len() == held.len()
            && history[synced..] == held[synced..]
            && change.undo.is_none()
            && !change.rewinds
            && !change.persist_state
            && !spent
        {
            return Ok(None);
        }
        // The replaced messages are archived before any entry names them.
        let new_undo = match &change.undo {
            Some(u) => Some(self.store_undo(encode_undo(u, history)).await),
            None => None,
        };
        // The levels that stay below the newest are stored whole before a checkpoint carries
        // them: their splices' entries go once it is written.
        let levels = self.view.undos.len();
        let older = if change.undo.is_some() && !change.rewinds {
            levels
        } else {
            levels.saturating_sub(1)
        };
        let mut whole = Vec::new();
        for (i, level) in self.view.undos.iter().enumerate().take(older) {
            if !level.stored.is_whole() {
                whole.push((i, self.store_undo(whole_undo(&level.undo)).await));
            }
        }
        for (i, stored) in whole {
            if let Some(level) = self.view.undos.iter_mut().nth(i) {
                level.stored = stored;
            }
        }
        let seq = self.next_seq;
        let (body, full, next) = self.prepare(seq, history, synced, change, new_undo)?;
        let name = entry_name(self.token, seq, full);
        // Spent whatever happens next: a sequence number is never sent twice.
        self.next_seq += 1;
        self.pending = Some(Pending::Sent {
            seq,
            name: name.clone(),
            body: body.clone(),
            next: Box::new(next),
        });
        match self
            .objects
            .put(&name, body)
            .await
            .map_err(JournalError::from)
        {
            Ok(()) => self.land(),
            Err(e) => {
                tracing::warn!(seq, error = %e, "journal: write failed; reading it back");
                match self.read_back().await {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(JournalError::Unavailable(format!(
                            "{e} (read back: not written, and sealed off)"
                        )));
                    }
                    Err(c @ (JournalError::Corrupt { .. } | JournalError::Fenced { .. })) => {
                        return Err(c);
                    }
                    Err(g) => {
                        return Err(JournalError::Unknown(format!("{e}; reading it back: {g}")));
                    }
                }
            }
        }
        self.confirm().await?;
        Ok(Some(seq))
    }

    /// An undo record as the journal will store it: with an archive, its messages go there
    /// first and the record names the key; if that write fails they stay inline (larger,
    /// never lost).
    async fn store_undo(&self, inline: StoredUndo) -> StoredUndo {
        let bytes = undo_bytes(&inline);
        let Some(store) = &self.segments else {
            return inline;
        };
        if bytes < UNDO_ARCHIVE_MIN_BYTES {
            return inline;
        }
        let text = segment_text(&inline.pre);
        match store.archive(text.as_bytes()).await {
            Ok(key) => StoredUndo {
                archived: Some(ArchivedUndo {
                    key: key.to_string(),
                    messages: inline.pre.len(),
                    bytes,
                }),
                pre: Vec::new(),
                ..inline
            },
            Err(e) => {
                tracing::warn!(error = %e, bytes, "journal: archiving the rewind target failed; the entry carries it inline");
                inline
            }
        }
    }

    /// The entry for `history` (a delta on the chain's head, or a checkpoint when the size
    /// rule asks for one), its body and what it changes once it has landed.
    fn prepare(
        &self,
        seq: u64,
        history: &[Message],
        synced: usize,
        mut change: Change,
        new_undo: Option<StoredUndo>,
    ) -> Result<(Vec<u8>, bool, Next), JournalError> {
        let old = &self.view;
        let (at, range, tail) = diff_from(&old.history, history, synced);
        let delta = &history[range];
        let delta_sizes: Vec<u64> = delta.iter().map(json_len).collect();
        let mut sizes = Vec::with_capacity(history.len());
        sizes.extend_from_slice(&old.sizes[..at]);
        sizes.extend_from_slice(&delta_sizes);
        if let Some([a, b]) = tail {
            sizes.extend_from_slice(&old.sizes[a..b]);
        }
        let rewinds = change.rewinds.then(|| old.undos.top().map_or(0, |l| l.seq));
        // The rewind levels once this entry has landed (oldest first).
        let mut after: Vec<(u64, &Undo, &StoredUndo)> = old
            .undos
            .iter()
            .map(|l| (l.seq, &l.undo, &l.stored))
            .collect();
        if change.rewinds {
            after.pop();
        }
        if let (Some(u), Some(stored)) = (&change.undo, &new_undo) {
            after.push((seq, u, stored));
            if after.len() > REWIND_LEVELS {
                after.remove(0);
            }
        }
        // How a checkpoint stores them: the newest as a splice of the history (or its
        // archived segment), the others whole.
        let newest = match (&new_undo, after.last()) {
            (Some(stored), _) => Some(stored.clone()),
            (None, Some((_, u, known))) => Some(carry_undo(u, history, Some(known))),
            (None, None) => None,
        };
        let older: Vec<CarriedUndo> = after[..after.len().saturating_sub(1)]
            .iter()
            .map(|(seq, u, stored)| CarriedUndo {
                seq: *seq,
                undo: if stored.is_whole() {
                    (*stored).clone()
                } else {
                    whole_undo(u)
                },
            })
            .collect();
        let rewind_bytes = newest.as_ref().map_or(0, record_bytes)
            + older.iter().map(|c| record_bytes(&c.undo)).sum::<u64>();
        // The state (with the whole replay ledger) is part of what a checkpoint writes.
        let checkpoint_size =
            sizes.iter().sum::<u64>() + rewind_bytes + json_len(&change.state) + ENTRY_OVERHEAD;
        let delta_size = delta_sizes.iter().sum::<u64>()
            + new_undo.as_ref().map_or(0, record_bytes)
            + ENTRY_OVERHEAD;
        let full = old.chain.head.is_none()
            || (at == 0 && tail.is_none())
            || old.chain.deltas + 1 >= CHECKPOINT_EVERY
            || old.chain.live_bytes() + delta_size > checkpoint_size * 3 / 2 + CHECKPOINT_SLACK;
        // A delta carries the ledger items after those it shares with its base.
        let kept = old
            .state
            .replay
            .items
            .iter()
            .zip(&change.state.replay.items)
            .take_while(|(a, b)| a == b)
            .count();
        let replay_at = (!full && kept > 0).then_some(kept);
        let whole_ledger = replay_at.map(|at| {
            let suffix = change.state.replay.items.split_off(at);
            std::mem::replace(&mut change.state.replay.items, suffix)
        });
        let out = if full {
            EntryOut {
                epoch: self.token.epoch,
                seq,
                holder: &self.holder,
                base: None,
                at: 0,
                messages: history,
                tail: None,
                state: &change.state,
                replay_at: None,
                compactions: &change.compactions,
                undo: newest.clone(),
                older_undos: &older,
                rewinds,
            }
        } else {
            EntryOut {
                epoch: self.token.epoch,
                seq,
                holder: &self.holder,
                base: old.chain.head,
                at,
                messages: delta,
                tail,
                state: &change.state,
                replay_at,
                compactions: &change.compactions,
                undo: new_undo.clone(),
                older_undos: &[],
                rewinds,
            }
        };
        let body = serde_json::to_vec(&out).map_err(|e| JournalError::Corrupt {
            name: "new entry".into(),
            reason: e.to_string(),
        })?;
        if let Some(mut items) = whole_ledger {
            items.append(&mut change.state.replay.items);
            change.state.replay.items = items;
        }
        let mut chain = old.chain.clone();
        chain.add(seq, body.len() as u64, full);
        let undos = UndoUpdate {
            pop: change.rewinds,
            push: match (change.undo, new_undo) {
                (Some(undo), Some(stored)) => Some(Level { seq, undo, stored }),
                _ => None,
            },
            // A checkpoint may have moved a level inline or stored it whole.
            stored: full.then(|| older.into_iter().map(|c| c.undo).chain(newest).collect()),
        };
        let next = Next {
            at,
            messages: delta.to_vec(),
            tail,
            sizes,
            state: change.state,
            undos,
            chain,
        };
        Ok((body, full, next))
    }

    /// The sent entry landed: the journal holds its history.
    fn land(&mut self) {
        if let Some(Pending::Sent { seq, next, .. }) = self.pending.take() {
            if next.chain.checkpoint.is_some_and(|(s, _)| s == seq) {
                self.collect_below = Some(seq);
            }
            self.view.apply(*next);
            self.pending = Some(Pending::Unconfirmed);
        }
    }

    /// Whether the sent entry is in the store: `true` (it landed) or `false` (it is not, and
    /// never will count: see [`Journal::seal`]). On an error it stays unknown.
    async fn read_back(&mut self) -> Result<bool, JournalError> {
        let Some(Pending::Sent { name, body, .. }) = &self.pending else {
            return Ok(true);
        };
        match self.objects.get(name).await? {
            Some(found) if found == *body => {
                self.land();
                Ok(true)
            }
            Some(_) => Err(JournalError::Corrupt {
                name: name.clone(),
                reason: "holds another entry than the one written under its name".into(),
            }),
            None => {
                self.seal().await?;
                Ok(false)
            }
        }
    }

    /// After a read-back found nothing: a request still in flight may land later, so
    /// "not written" holds only once an entry after it is in the journal and confirmed. The
    /// seal holds the head's history and builds on the head, which leaves the missing entry
    /// off the chain whenever it lands. On success nothing is pending; if the seal landed
    /// but is not confirmed, it is what is pending; otherwise the sent entry still is.
    async fn seal(&mut self) -> Result<(), JournalError> {
        let seq = self.next_seq;
        let change = Change {
            state: self.view.state.clone(),
            ..Change::default()
        };
        let (body, full, next) = self.prepare(
            seq,
            &self.view.history,
            self.view.history.len(),
            change,
            None,
        )?;
        let name = entry_name(self.token, seq, full);
        self.next_seq += 1;
        if let Err(e) = self
            .objects
            .put(&name, body.clone())
            .await
            .map_err(JournalError::from)
        {
            // A seal that lands late only repeats the head: harmless either way.
            match self.objects.get(&name).await.map_err(JournalError::from) {
                Ok(Some(found)) if found == body => {}
                Ok(_) => return Err(JournalError::Unavailable(format!("sealing: {e}"))),
                Err(g) => {
                    return Err(JournalError::Unavailable(format!(
                        "sealing: {e}; reading it back: {g}"
                    )));
                }
            }
        }
        if full {
            self.collect_below = Some(seq);
        }
        self.view.apply(next);
        self.pending = Some(Pending::Unconfirmed);
        self.confirm().await
    }

    /// The claims check after a landed entry; superseded entries are collected once it passed.
    async fn confirm(&mut self) -> Result<(), JournalError> {
        match self.check_fence().await {
            Ok(()) => {
                self.pending = None;
                self.collect().await;
                Ok(())
            }
            Err(f @ JournalError::Fenced { .. }) => Err(f),
            Err(e) => Err(JournalError::Unconfirmed(e.to_string())),
        }
    }

    /// Starts deleting the entries a confirmed checkpoint superseded, in the background: a
    /// turn never waits for it (on S3 it is a LIST and a DELETE per entry). Best effort:
    /// what cannot be deleted now is deleted after a later confirmed write. One deletion
    /// runs at a time; a checkpoint confirmed meanwhile is collected by the next write.
    async fn collect(&mut self) {
        if let Some(running) = &self.collecting {
            if !running.is_finished() {
                return;
            }
            if let Some(done) = self.collecting.take() {
                self.retry_below(done.await);
            }
        }
        self.start_collecting();
    }

    fn start_collecting(&mut self) {
        if let Some(below) = self.collect_below.take() {
            let objects = Arc::clone(&self.objects);
            self.collecting = Some(tokio::spawn(delete_superseded(objects, below)));
        }
    }

    fn retry_below(&mut self, outcome: Result<Option<u64>, tokio::task::JoinError>) {
        if let Ok(Some(retry)) = outcome {
            self.collect_below = Some(self.collect_below.map_or(retry, |b| b.max(retry)));
        }
    }

    /// Waits until every confirmed checkpoint's superseded entries are deleted, or a
    /// deletion failed (retried after the next confirmed write).
    pub async fn collected(&mut self) {
        if let Some(running) = self.collecting.take() {
            let outcome = running.await;
            let failed = matches!(outcome, Ok(Some(_)));
            self.retry_below(outcome);
            if failed {
                return;
            }
        }
        // Only a confirmed writer deletes.
        if self.pending.is_none() && self.fenced.is_none() {
            self.start_collecting();
        }
        if let Some(running) = self.collecting.take() {
            let outcome = running.await;
            self.retry_below(outcome);
        }
    }

    /// Fails (and stays failed) when a newer epoch has been claimed.
    pub async fn check_fence(&mut self) -> Result<(), JournalError> {
        if let Some(f) = &self.fenced {
            return Err(clone_fenced(f));
        }
        let names = self.objects.list("claims/").await?;
        let newest = names
            .iter()
            .filter_map(|n| parse_claim(n))
            .filter(|t| *t > self.token)
            .max();
        if let Some(by_token) = newest {
            let by_epoch = by_token.epoch;
            let by = match self.objects.get(&claim_name(by_token)).await {
                Ok(Some(b)) => serde_json::from_slice::<Claim>(&b)
                    .map(|c| c.holder)
                    .unwrap_or_else(|_| "another agent".into()),
                _ => "another agent".into(),
            };
            let err = JournalError::Fenced {
                holder: self.holder.clone(),
                epoch: self.token.epoch,
                by,
                by_epoch,
            };
            tracing::error!(error = %err, "journal: fenced");
            self.fenced = Some(clone_fenced(&err));
            return Err(err);
        }
        Ok(())
    }
}

/// Deletes every entry below `below`; `Some(below)` when some could not be deleted.
async fn delete_superseded(objects: Arc<dyn ObjectStore>, below: u64) -> Option<u64> {
    let names = match objects.list("e").await.map_err(JournalError::from) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "journal: listing superseded entries");
            return Some(below);
        }
    };
    let old: Vec<String> = names
        .into_iter()
        .filter(|n| parse_entry_name(n).is_some_and(|(_, seq, _)| seq < below))
        .collect();
    let mut failed = Vec::new();
    for batch in old.chunks(8) {
        let results = futures::future::join_all(batch.iter().map(|n| objects.delete(n))).await;
        failed.extend(
            results
                .into_iter()
                .filter_map(Result::err)
                .map(JournalError::from),
        );
    }
    match failed.first() {
        None => {
            tracing::debug!(
                below,
                deleted = old.len(),
                "journal: superseded entries deleted"
            );
            None
        }
        Some(e) => {
            tracing::warn!(error = %e, "journal: deleting superseded entries");
            Some(below)
        }
    }
}

fn clone_fenced(e: &JournalError) -> JournalError {
    match e {
        JournalError::Fenced {
            holder,
            epoch,
            by,
            by_epoch,
        } => JournalError::Fenced {
            holder: holder.clone(),
            epoch: *epoch,
            by: by.clone(),
            by_epoch: *by_epoch,
        },
        other => JournalError::Unavailable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_engine::testing::{MemObjects as Mem, ObjectFault as Fault};

    fn users(msgs: &[&str]) -> Vec<Message> {
        msgs.iter().map(|m| Message::user(*m)).collect()
    }

    fn change() -> Change {
        Change::default()
    }

    async fn open(objects: &Arc<Mem>, holder: &str) -> (Journal, Rebuilt) {
        let o: Arc<dyn ObjectStore> = objects.clone();
        Journal::open(o, holder).await.unwrap()
    }

    async fn rebuilt(objects: &Arc<Mem>) -> Vec<Message> {
        rebuild(objects.as_ref()).await.unwrap().history
    }

    #[tokio::test]
    async fn a_failed_claim_that_lands_late_does_not_fence_the_claim_after_it() {
        let objects = Arc::new(Mem::default());
        // A claim whose write timed out, held somewhere while its opener retried.
        let ghost = claim_token(1);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let (mut a, _) = open(&objects, "a").await;
        assert_eq!(a.epoch(), 1, "the ghost had not landed at the retry");
        let pending = Claim {
            epoch: 1,
            holder: "a".into(),
            start_seq: None,
        };
        objects.raw_put(&claim_name(ghost), serde_json::to_vec(&pending).unwrap());
        a.write(&users(&["after the ghost"]), change())
            .await
            .unwrap();
        assert_eq!(rebuilt(&objects).await, users(&["after the ghost"]));
    }

    /// The name and body of entry `seq`.
    fn entry_of(objects: &Mem, seq: u64) -> (String, Vec<u8>) {
        let o = objects.objects.lock().unwrap();
        o.iter()
            .find(|(n, _)| parse_entry_name(n).is_some_and(|(_, s, _)| s == seq))
            .map(|(n, b)| (n.clone(), b.clone()))
            .unwrap()
    }

    fn ledger(n: u64) -> crate::replay::Ledger {
        crate::replay::Ledger {
            items: (0..n)
                .map(|i| crate::replay::Held {
                    fingerprint: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    kind: crate::replay::Kind::User,
                    raw: None,
                    output: i % 2 == 1,
                    id: (i % 2 == 1).then(|| format!("msg_{i:032}")),
                })
                .collect(),
            responses: vec![format!("resp_{n}")],
        }
    }

    #[tokio::test]
    async fn a_delta_carries_only_the_new_ledger_items_and_the_rebuild_joins_them() {
        let objects = Arc::new(Mem::default());
        let (mut j, _) = open(&objects, "a").await;
        let mut history = Vec::new();
        let mut bodies = Vec::new();
        for turn in 1..=8u64 {
            history.push(Message::user(format!("question {turn}")));
            let mut c = change();
            c.state.replay = ledger(turn * 200);
            let seq = j.write(&history, c).await.unwrap().unwrap();
            let (name, body) = entry_of(&objects, seq);
            if parse_entry_name(&name).is_some_and(|(_, _, full)| !full) {
                bodies.push(body.len());
            }
            assert_eq!(
                j.state().replay,
                ledger(turn * 200),
                "the live view is whole"
            );
        }
        // Each delta carries its 200 new items, not the growing ledger (a checkpoint
        // carries it whole).
        assert!(bodies.len() >= 4, "{bodies:?}");
        let (first, deltas) = (bodies[0], &bodies[1..]);
        for d in deltas {
            assert!(
                d.abs_diff(first) < first / 4,
                "entry sizes {bodies:?}: a delta grew with the ledger"
            );
        }
        let r = rebuild(objects.as_ref()).await.unwrap();
        assert_eq!(r.state.replay, ledger(1600));
        // A ledger that went back (a failed turn's input taken out) is spliced too.
        history.push(Message::user("after"));
        let mut c = change();
        c.state.replay = ledger(1500);
        j.write(&history, c).await.unwrap();
        assert_eq!(
            rebuild(objects.as_ref()).await.unwrap().state.replay,
            ledger(1500)
        );
        // An entry that claims more of its base than the base holds is corrupt, not guessed.
        // (A large ledger does not make every entry a checkpoint: one of the next few is a
        // delta.)
        let mut tries = 0;
        let (name, mut entry) = loop {
            tries += 1;
            assert!(tries <= 4, "every entry was a checkpoint");
            let mut c = change();
            c.state.replay = ledger(1500 + history.len() as u64);
            history.push(Message::user("more"));
            let seq = j.write(&history, c).await.unwrap().unwrap();
            let (name, body) = entry_of(&objects, seq);
            let entry: Entry = serde_json::from_slice(&body).unwrap();
            if !entry.is_checkpoint() {
                break (name, entry);
            }
        };
        assert!(
            entry.replay_at.is_some_and(|n| n >= 1500),
            "{:?}",
            entry.replay_at
        );
        entry.replay_at = Some(5000);
        objects.raw_put(&name, serde_json::to_vec(&entry).unwrap());
        let err = rebuild(objects.as_ref()).await.unwrap_err();
        assert!(err.to_string().contains("replay items"), "{err}");
    }

    #[tokio::test]
    async fn splices_replay_and_stale_epochs_are_ignored() {
        let objects = Arc::new(Mem::default());
        let (mut a, r) = open(&objects, "a").await;
        assert!(r.history.is_empty());
        a.write(&users(&["1", "2"]), change()).await.unwrap();
        a.write(&users(&["1", "x"]), change()).await.unwrap();
        let (mut b, r) = open(&objects, "b").await;
        assert_eq!(r.history, users(&["1", "x"]));
        // The replaced writer's next write is refused and ignored by readers.
        let err = a.write(&users(&["1", "x", "late"]), change()).await;
        assert_eq!(err.unwrap_err().label(), "fenced");
        assert!(a.write(&users(&["later"]), change()).await.is_err());
        b.write(&users(&["1", "x", "y"]), change()).await.unwrap();
        assert_eq!(rebuilt(&objects).await, users(&["1", "x", "y"]));
    }

    #[tokio::test]
    async fn two_claims_of_the_same_epoch_leave_one_writer() {
        let objects = Arc::new(Mem::default());
        let (mut a, _) = open(&objects, "a").await;
        // Another agent that started at the same moment picked the same epoch.
        let rival = Token {
            epoch: a.epoch(),
            nonce: if a.token.nonce == u64::MAX {
                0
            } else {
                u64::MAX
            },
        };
        let claim = Claim {
            epoch: rival.epoch,
            holder: "b".into(),
            start_seq: Some(0),
        };
        objects.raw_put(
            &start_claim_name(rival),
            serde_json::to_vec(&claim).unwrap(),
        );
        let a_loses = rival > a.token;
        let r = a.write(&users(&["from a"]), change()).await;
        assert_eq!(r.is_err(), a_loses, "{r:?}");
        assert_eq!(rebuilt(&objects).await.is_empty(), a_loses);
    }

    #[tokio::test]
    async fn a_lost_answer_is_read_back_and_counts() {
        let objects = Arc::new(Mem::default());
        let (mut a, _) = open(&objects, "a").await;
        a.write(&users(&["1"]), change()).await.unwrap();
        objects.fail("put", Fault::Lose);
        a.write(&users(&["1", "2"]), change()).await.unwrap();
        assert_eq!(a.history(), users(&["1", "2"]).as_slice());
        assert_eq!(rebuilt(&objects).await, users(&["1", "2"]));
    }

    #[tokio::test]
    async fn a_refused_write_is_not_written_and_its_seq_is_not_reused() {
        let objects = Arc::new(Mem::default());
        let (mut a, _) = open(&objects, "a").await;
        a.write(&users(&["1"]), change()).await.unwrap();
        objects.fail("put", Fault::Refuse);
        let e = a.write(&users(&["s"]), change()).await.unwrap_err();
        assert_eq!(e.label(), "unavailable", "{e}");
        assert!(a.settled());
        assert_eq!(a.history(), users(&["1"]).as_slice());
        let seq = a.write(&users(&["1", "2"]), change()).await.unwrap();
        assert_eq!(
            seq,
            Some(3),
            "seq 1 went to the refused write, 2 to its seal"
        );
        assert_eq!(rebuilt(&objects).await, users(&["1", "2"]));
    }

    #[tokio::test]
    async fn an_unknown_outcome_is_settled_before_the_next_write() {
        // The compaction lands, its answer and the read-back fail: unknown.
        let objects = Arc::new(Mem::default());
        let (mut a, _) = open(&objects, "a").await;
        a.write(&users(&["1", "2", "3"]), change()).await.unwrap();
        objects.fail("put", Fault::Lose);
        objects.fail("get", Fault::Refuse);
        let e = a.write(&users(&["s"]), change()).await.unwrap_err();
        assert!(e.outcome_unknown(), "{e}");
        assert!(!a.settled());
        let e = a.write(&users(&["1", "2", "3", "4"]), change()).await;
        assert_eq!(e.unwrap_err().label(), "unsettled");
        a.resolve().await.unwrap();
        assert!(a.settled());
        assert_eq!(a.history(), users(&["s"]).as_slice());
        a.write(&users(&["s", "4"]), change()).await.unwrap();
        assert_eq!(rebuilt(&objects).await, users(&["s", "4"]));
    }

    #[tokio::test]
    async fn a_landed_entry_with_a_failed_claims_check_is_unconfirmed_then_confirmed() {
        let objects = Arc::new(Mem::default());
        let (mut a, _) = open(&objects, "a").await;
        a.write(&users(&["1", "2"]), change()).await.unwrap();
        objects.fail("list-claims", Fault::Refuse);
        let e = a.write(&users(&["s"]), change()).await.unwrap_err();
        assert_eq!(e.label(), "unconfirmed", "{e}");
        assert_eq!(
            a.history(),
            users(&["s"]).as_slice(),
            "it is in the journal"
        );
        a.write(&users(&["s", "3"]), change()).await.unwrap();
        assert_eq!(rebuilt(&objects).await, users(&["s", "3"]));
    }

    #[tokio::test]
    async fn an_entry_that_lands_late_is_off_the_chain() {
        let objects = Arc::new(Mem::default());
        let (mut a, _) = open(&objects, "a").await;
        a.write(&users(&["1", "2", "3"]), change()).await.unwrap();
        // Refused as far as the writer can tell: read back, not there.
        objects.fail("put", Fault::Refuse);
        a.write(&users(&["s"]), change()).await.unwrap_err();
        let late = Entry {
            epoch: a.epoch(),
            seq: 1,
            holder: "a".into(),
            base: Some(0),
            at: 0,
            messages: users(&["s"]),
            tail: None,
            state: PersistedState::default(),
            replay_at: None,
            compactions: vec![],
            undo: None,
            older_undos: vec![],
            rewinds: None,
        };
        a.write(&users(&["1", "2", "3", "4"]), change())
            .await
            .unwrap();
        // ...and then it lands after all.
        objects.raw_put(
            &entry_name(a.token, 1, false),
            serde_json::to_vec(&late).unwrap(),
        );
        assert_eq!(rebuilt(&objects).await, users(&["1", "2", "3", "4"]));
    }

    #[tokio::test]
    async fn a_journal_of_the_first_format_with_a_reused_seq_opens() {
        // The first format reused a seq after a failed claims check: a checkpoint that did
        // not count and the delta that did, under two names.
        let objects = Arc::new(Mem::default());
        let t = Token { epoch: 1, nonce: 7 };
        let legacy = |seq: u64, at: usize, msgs: &[&str]| {
            serde_json::json!({"epoch": 1, "seq": seq, "holder": "old", "at": at,
                "messages": users(msgs), "state": {}})
        };
        let put = |name: String, v: serde_json::Value| {
            objects.raw_put(&name, serde_json::to_vec(&v).unwrap());
        };
        put(entry_name(t, 0, true), legacy(0, 0, &["1", "2"]));
        put(entry_name(t, 1, true), legacy(1, 0, &["s"]));
        put(entry_name(t, 1, false), legacy(1, 2, &["3"]));
        put(entry_name(t, 2, false), legacy(2, 3, &["4"]));
        assert_eq!(rebuilt(&objects).await, users(&["1", "2", "3", "4"]));
        let (_, r) = open(&objects, "new").await;
        assert_eq!(r.history, users(&["1", "2", "3", "4"]));
    }

    #[tokio::test]
    async fn checkpoints_collect_superseded_entries_and_keep_the_rewind() {
        let objects = Arc::new(Mem::default());
        let (mut a, _) = open(&objects, "a").await;
        let big = "x".repeat(40_000);
        let mut h: Vec<Message> = Vec::new();
        for i in 0..12 {
            h.push(Message::user(format!("{i}{big}")));
            a.write(&h, change()).await.unwrap();
        }
        let pre = h.clone();
        let post = vec![Message::user("summary"), h[11].clone()];
        let compact = || Change {
            undo: Some(Undo {
                pre: pre.clone(),
                post_len: 2,
            }),
            ..change()
        };
        let stored = || -> u64 {
            objects
                .objects
                .lock()
                .unwrap()
                .iter()
                .filter(|(n, _)| n.starts_with('e'))
                .map(|(_, b)| b.len() as u64)
                .sum()
        };
        let history_bytes = pre.iter().map(json_len).sum::<u64>();
        for _ in 0..30 {
            a.write(&post, compact()).await.unwrap();
            let rewind = Change {
                rewinds: true,
                ..change()
            };
            a.write(&pre, rewind).await.unwrap();
            a.collected().await;
            assert!(
                stored() <= 3 * history_bytes + CHECKPOINT_SLACK + 8 * ENTRY_OVERHEAD,
                "{} bytes for a {history_bytes}-byte history",
                stored()
            );
        }
        a.write(&post, compact()).await.unwrap();
        a.collected().await;
        let entries = objects
            .names()
            .iter()
            .filter(|n| n.starts_with('e'))
            .count();
        assert!(entries < 8, "superseded entries are deleted: {entries}");
        let (b, r) = open(&objects, "b").await;
        assert_eq!(r.history, post);
        let undo = &b
            .rewindable()
            .expect("rewind survives the checkpoints")
            .undo;
        assert_eq!(undo.pre, pre);
    }

    /// The history a rewind of the newest level gives, as the session computes it.
    fn rewound(j: &Journal, history: &[Message]) -> Vec<Message> {
        let undo = &j.rewindable().expect("a level to rewind").undo;
        let mut out = undo.pre.clone();
        out.extend_from_slice(&history[undo.post_len.min(history.len())..]);
        out
    }

    /// Issue 35: two rewinds undo two compactions, each back to the history before it, and
    /// the levels survive a restart from deltas and from a checkpoint.
    #[tokio::test]
    async fn rewinds_undo_compactions_newest_first_across_restarts() {
        for checkpoint in [false, true] {
            let objects = Arc::new(Mem::default());
            let (mut a, _) = open(&objects, "a").await;
            let h0 = users(&["sys", "1", "2", "3", "4"]);
            a.write(&h0, change()).await.unwrap();
            let h1 = users(&["sys", "s1", "4"]);
            let c1 = Change {
                undo: Some(Undo {
                    pre: h0.clone(),
                    post_len: h1.len(),
                }),
                ..change()
            };
            a.write(&h1, c1).await.unwrap();
            let mut h1b = h1.clone();
            h1b.extend(users(&["5", "6"]));
            a.write(&h1b, change()).await.unwrap();
            let h2 = users(&["sys", "s2", "6"]);
            let c2 = Change {
                undo: Some(Undo {
                    pre: h1b.clone(),
                    post_len: h2.len(),
                }),
                ..change()
            };
            a.write(&h2, c2).await.unwrap();
            assert_eq!(a.rewind_levels(), 2);
            let mut h = h2.clone();
            if checkpoint {
                // Enough entries that a checkpoint supersedes the compactions' entries.
                for i in 0..CHECKPOINT_EVERY + 2 {
                    h.push(Message::user(format!("t{i}")));
                    a.write(&h, change()).await.unwrap();
                }
                a.collected().await;
                assert!(
                    objects
                        .names()
                        .iter()
                        .all(|n| !n.contains("-s000000000001")),
                    "the first compaction's entry is collected"
                );
            }
            drop(a);
            let (mut b, r) = open(&objects, "b").await;
            assert_eq!(r.history, h);
            assert_eq!(b.rewind_levels(), 2, "checkpoint: {checkpoint}");
            let back1 = rewound(&b, &h);
            let mut want = h1b.clone();
            want.extend_from_slice(&h[h2.len()..]);
            assert_eq!(back1, want);
            let rewind = || Change {
                rewinds: true,
                ..change()
            };
            b.write(&back1, rewind()).await.unwrap();
            assert_eq!(b.rewind_levels(), 1);
            drop(b);
            let (mut c, r) = open(&objects, "c").await;
            assert_eq!(r.history, back1);
            assert_eq!(c.rewind_levels(), 1);
            let back0 = rewound(&c, &back1);
            let mut want = h0.clone();
            want.extend_from_slice(&back1[h1.len()..]);
            assert_eq!(back0, want);
            c.write(&back0, rewind()).await.unwrap();
            assert_eq!(c.rewind_levels(), 0);
            drop(c);
            let (d, r) = open(&objects, "d").await;
            assert_eq!(r.history, back0);
            assert!(d.rewindable().is_none());
        }
    }

    /// The stack holds at most [`REWIND_LEVELS`]: the oldest is dropped, also across a
    /// checkpoint and a restart.
    #[tokio::test]
    async fn the_rewind_levels_are_bounded() {
        let objects = Arc::new(Mem::default());
        let (mut a, _) = open(&objects, "a").await;
        let mut h = users(&["sys"]);
        let mut pres = Vec::new();
        for i in 0..REWIND_LEVELS + 3 {
            h.push(Message::user(format!("turn {i}")));
            a.write(&h, change()).await.unwrap();
            let pre = h.clone();
            h = vec![h[0].clone(), Message::assistant(format!("summary {i}"))];
            let c = Change {
                undo: Some(Undo {
                    pre: pre.clone(),
                    post_len: h.len(),
                }),
                ..change()
            };
            a.write(&h, c).await.unwrap();
            pres.push(pre);
            assert_eq!(a.rewind_levels(), (i + 1).min(REWIND_LEVELS));
        }
        drop(a);
        let (mut b, _) = open(&objects, "b").await;
        assert_eq!(b.rewind_levels(), REWIND_LEVELS);
        for want in pres.iter().rev().take(REWIND_LEVELS) {
            let back = rewound(&b, &h);
            assert_eq!(&back[..want.len()], want.as_slice());
            h = back;
            b.write(
                &h,
                Change {
                    rewinds: true,
                    ..change()
                },
            )
            .await
            .unwrap();
        }
        assert!(b.rewindable().is_none(), "the oldest levels were dropped");
    }
}
