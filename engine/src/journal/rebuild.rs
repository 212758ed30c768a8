//! The rebuild: which entries of a listing are valid, the chain of bases from the newest back
//! to a checkpoint, and the history, state and rewind target it replays to.

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};

use futures::{StreamExt, TryStreamExt};

use super::entry::{Entry, PersistedState, StoredUndo, Undo};
use super::names::{Claim, Token, parse_claim, parse_entry_name};
use super::splice::{decode_undo, splice};
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
    /// The last entry with compactions, when they have not been undone: its seq and undo
    /// record.
    pub rewindable: Option<(u64, Undo)>,
    /// How the rewind target is stored.
    pub rewind_stored: Option<StoredUndo>,
    /// Where the rebuilt chain stands: the base and size rule of the next entry.
    pub chain: Chain,
    /// Entries older than the chain's checkpoint are still there.
    pub garbage_below: Option<u64>,
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
    // The last undo record, with the entry's name and its history up to the record's
    // `post_len` (what the record splices).
    let mut last_undo: Option<(u64, String, StoredUndo, Vec<Message>)> = None;
    for (seq, name, entry, bytes) in chain {
        let corrupt = |reason: String| JournalError::Corrupt {
            name: name.clone(),
            reason,
        };
        out.history =
            splice(&out.history, entry.at, &entry.messages, entry.tail).map_err(corrupt)?;
        out.chain.add(seq, bytes, entry.is_checkpoint());
        if let Some(u) = entry.undo {
            let post = &out.history[..u.post_len.min(out.history.len())];
            last_undo = Some((seq, name.clone(), u, post.to_vec()));
        }
        if entry.rewinds.is_some() {
            last_undo = None;
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
    if let Some((seq, name, stored, post)) = last_undo
        && let Some(undo) = load_undo(stored.clone(), &post, segments, &name).await?
    {
        out.rewindable = Some((seq, undo));
        out.rewind_stored = Some(stored);
    }
    if let (Some(low), Some((start, _))) = (lowest, out.chain.checkpoint)
        && low < start
    {
        out.garbage_below = Some(start);
    }
    Ok(out)
}
