//! The session memory: a running summary of the whole session in the nine sections of a
//! level-2 summary, updated by the summarizer in the background every few turns
//! (`compaction.memory`), so that a compaction can replace the part of the history the memory
//! covers at once, with no model call inside the turn.
//!
//! What the memory has absorbed is a prefix of the history, up to its *frontier*: the last
//! message the update saw, named by its index and an identity the in-place passes keep
//! (microcompact, dedup and trim rewrite tool outputs and strip reasoning, never a tool call
//! id or a user's or the assistant's text). A compaction that removes messages past the
//! frontier hands them to the *queue* first: a durable object per segment in the journal's
//! store (S3 or the local directory), written and acknowledged before the history is
//! rewritten. The next update absorbs the queued segments and the history past the frontier,
//! makes the new memory durable (archived, and its head object written) and only then deletes
//! the queued segments it absorbed. A restarted agent reads the newest head and the queue.
//!
//! Layout beside the journal's entries: `memory/head-<epoch>` (the memory, its frontier and
//! its version; the journal's epoch keeps a fenced writer's late head from winning) and
//! `memory/queue/<epoch>-<seq>` (one segment each, JSON).
//!
//! The session drives it from `session/memory_updates.rs`: it opens the memory, starts the
//! updates and queues what its compactions remove.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use xxhash_rust::xxh3::Xxh3;

use crate::ccr::Store;
use crate::compact::archive::{archive_all, segment_text};
use crate::compact::summarize::{
    MemoryCover, SECTIONS, SummarizeError, SummaryRequest, is_refusal, missing_sections, transcript,
};
use crate::compact::{Summarizer, summarize};
use crate::history::{Message, Role};
use crate::journal::{JournalError, ObjectStore};
use crate::metrics::{Metrics, OutcomeLabels, gauge_value};
use crate::provider::Usage;

/// Prefix of the memory's head objects.
pub const HEAD_PREFIX: &str = "memory/head-";
/// Prefix of the queued segments.
pub const QUEUE_PREFIX: &str = "memory/queue/";
/// The phrase every update request carries (and a simulator can route on).
pub const UPDATE_PHRASE: &str = "Update the session memory";
/// An update's transcript is at most this share of the summarizer's window (as level 2).
const TRANSCRIPT_SHARE: f64 = 0.5;

/// The identity of a message that the in-place passes keep: a tool result by its call, any
/// other message by its role, text and tool calls (not its reasoning, which trim strips).
pub fn identity(m: &Message) -> u64 {
    let mut h = Xxh3::new();
    h.update(m.role.as_str().as_bytes());
    h.update(&[0]);
    if m.role == Role::Tool {
        h.update(m.tool_call_id.as_deref().unwrap_or_default().as_bytes());
        h.update(&[0]);
        h.update(m.name.as_deref().unwrap_or_default().as_bytes());
    } else {
        h.update(m.content.as_bytes());
        for c in &m.tool_calls {
            h.update(&[0]);
            h.update(c.id.as_bytes());
            h.update(&[0]);
            h.update(c.name.as_bytes());
            h.update(&[0]);
            h.update(c.arguments.as_bytes());
        }
    }
    h.digest()
}

/// The last message an update absorbed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frontier {
    /// Its index in the history when the update took its snapshot.
    pub index: usize,
    /// Its [`identity`].
    pub id: u64,
    /// The identity of the message before it: two replies alike ("ok") are told apart by
    /// what they answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<u64>,
}

impl Frontier {
    pub fn of(history: &[Message], index: usize) -> Option<Self> {
        history.get(index).map(|m| Self {
            index,
            id: identity(m),
            prev: index
                .checked_sub(1)
                .and_then(|p| history.get(p))
                .map(identity),
        })
    }

    fn is_at(&self, history: &[Message], ix: usize) -> bool {
        history
            .get(ix)
            .is_some_and(|m| !m.is_system() && identity(m) == self.id)
            && self.prev.is_none_or(|p| {
                ix.checked_sub(1)
                    .and_then(|i| history.get(i))
                    .is_some_and(|m| identity(m) == p)
            })
    }

    /// Where the frontier is in `history` now: at its index if that message is still
    /// there, else the first message of that identity (a compaction shifted it), else
    /// nowhere (a compaction removed it).
    pub fn locate(&self, history: &[Message]) -> Option<usize> {
        if self.is_at(history, self.index) {
            return Some(self.index);
        }
        (0..history.len()).find(|ix| self.is_at(history, *ix))
    }
}

/// One version of the memory, as its head object holds it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MemoryDoc {
    pub version: u64,
    /// The nine sections.
    pub text: String,
    /// Archive key of the text (as a one-message segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontier: Option<Frontier>,
    /// The session's turn count at the snapshot.
    pub covered_turn: u64,
    /// Seconds since the Unix epoch.
    pub updated_at: u64,
}

/// A segment removed by a compaction, waiting for the memory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct QueuedSegment {
    pub name: String,
    pub messages: Vec<Message>,
}

/// Why an update's answer is not a memory.
pub fn check_memory(text: &str) -> Result<(), String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty".into());
    }
    if is_refusal(t) {
        return Err("refusal".into());
    }
    let missing = missing_sections(t);
    if !missing.is_empty() {
        return Err(format!("missing sections: {}", missing.join(", ")));
    }
    Ok(())
}

/// The instructions of an update.
pub fn update_instructions() -> String {
    let mut out = format!(
        "{UPDATE_PHRASE}: it is the running record of a whole working session, read instead \
         of the conversation once older messages are dropped. Merge the current memory (if \
         any) and the new transcript into the updated memory. Write plain text with exactly \
         these nine numbered sections, in this order:\n"
    );
    for (n, s) in SECTIONS.iter().enumerate() {
        out.push_str(&format!("{}. {s}\n", n + 1));
    }
    out.push_str(
        "Keep what the current memory says unless the new transcript changes it. Quote every \
         user message in section 6 word for word. Keep file paths, identifiers, commands, \
         error messages and numbers exact. Keep every <<ccr:KEY>> marker you see. Section 9 \
         may say \"none\".",
    );
    out
}

/// What an update works from, taken while the session holds still.
pub struct Snapshot {
    /// Queued segments, oldest first.
    pub queued: Vec<QueuedSegment>,
    /// History messages past the frontier.
    pub fresh: Vec<Message>,
    pub frontier: Option<Frontier>,
    pub turn: u64,
}

/// Shared between the session and its background update.
#[derive(Default)]
struct Inner {
    doc: Option<MemoryDoc>,
    queue: Vec<QueuedSegment>,
    updating: bool,
    updates: u64,
    failures: u64,
    last_error: Option<String>,
    /// The last failure not yet reported to a turn.
    unreported_error: Option<String>,
    from_memory: u64,
    next_seq: u64,
    /// Tokens of update calls the session has not counted yet.
    usage: Usage,
    /// Model of those calls.
    model: Option<String>,
}

/// The session memory and its queue.
pub struct SessionMemory {
    objects: Arc<dyn ObjectStore>,
    store: Arc<dyn Store>,
    epoch: u64,
    metrics: Arc<Metrics>,
    inner: Mutex<Inner>,
    changed: Notify,
}

/// Whether stand-in `m` holds the memory `text` as its summary: its summarizer's text ends
/// with it, or, when its sections were cut to fit, it names the archived whole.
fn stands_in_for(m: &Message, text: &str) -> bool {
    use crate::compact::{ledger, sections};
    let own = sections::summarizer_text(&m.content);
    ledger::without_section(&own).ends_with(text)
        || m.meta
            .archived
            .contains(&sections::summary_key(text).as_str().to_owned())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(e.to_string())
}

impl SessionMemory {
    /// Reads the newest head and the queue from `objects`.
    pub async fn open(
        objects: Arc<dyn ObjectStore>,
        store: Arc<dyn Store>,
        epoch: u64,
        metrics: Arc<Metrics>,
    ) -> Result<Self, JournalError> {
        let mut heads = objects.list(HEAD_PREFIX).await?;
        heads.sort();
        let mut doc = None;
        for name in heads.iter().rev() {
            match objects.get(name).await? {
                Some(b) => match serde_json::from_slice::<MemoryDoc>(&b) {
                    Ok(d) => {
                        doc = Some(d);
                        break;
                    }
                    Err(e) => tracing::warn!(%name, "memory head unreadable, skipped: {e}"),
                },
                None => continue,
            }
        }
        let mut names = objects.list(QUEUE_PREFIX).await?;
        names.sort();
        let mut queue = Vec::new();
        for name in names {
            if let Some(b) = objects.get(&name).await? {
                match serde_json::from_slice::<Vec<Message>>(&b) {
                    Ok(messages) => queue.push(QueuedSegment { name, messages }),
                    Err(e) => tracing::warn!(%name, "queued memory segment unreadable: {e}"),
                }
            }
        }
        let m = Self {
            objects,
            store,
            epoch,
            metrics,
            inner: Mutex::new(Inner {
                doc,
                queue,
                ..Inner::default()
            }),
            changed: Notify::new(),
        };
        m.publish();
        Ok(m)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn doc(&self) -> Option<MemoryDoc> {
        self.lock().doc.clone()
    }

    pub fn queue_len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn updating(&self) -> bool {
        self.lock().updating
    }

    /// Waits until no update runs (tests, shutdown).
    pub async fn idle(&self) {
        loop {
            let wait = self.changed.notified();
            if !self.updating() {
                return;
            }
            wait.await;
        }
    }

    /// Waits up to `timeout` for a change (an update's end).
    pub async fn changed(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.changed.notified()).await;
    }

    fn publish(&self) {
        let (queue, messages) = {
            let i = self.lock();
            (
                i.queue.len(),
                i.queue.iter().map(|q| q.messages.len()).sum::<usize>(),
            )
        };
        self.metrics.memory_queue_segments.set(gauge_value(queue));
        self.metrics
            .memory_queue_messages
            .set(gauge_value(messages));
    }

    /// The memory's cover of `history[start..end)`: from `start` to just past the frontier
    /// (snapped back so no tool result is separated from its call), when it reaches past
    /// `start`.
    pub fn cover(&self, history: &[Message], start: usize, end: usize) -> Option<MemoryCover> {
        let doc = self.doc()?;
        let f = doc.frontier?.locate(history)?;
        let mut e = (f + 1).min(end);
        while e > start && history.get(e).is_some_and(|m| m.role == Role::Tool) {
            e -= 1;
        }
        (e > start).then_some(MemoryCover {
            text: doc.text,
            end: e,
        })
    }

    /// Messages of `history` the memory covers, from its start.
    pub fn covered_messages(&self, history: &[Message]) -> u64 {
        self.doc()
            .and_then(|d| d.frontier)
            .and_then(|f| f.locate(history))
            .map_or(0, |f| f as u64 + 1)
    }

    /// Counts a compaction that used the memory, and moves the frontier onto the memory's
    /// message when the compaction removed the frontier's.
    pub fn used_by_compaction(&self, history: &[Message]) {
        let mut i = self.lock();
        i.from_memory += 1;
        let Some(doc) = i.doc.as_mut() else {
            return;
        };
        let lost = doc.frontier.is_none_or(|f| f.locate(history).is_none());
        if lost {
            let text = doc.text.trim();
            doc.frontier = history
                .iter()
                .position(|m| m.meta.is_summary && stands_in_for(m, text))
                .and_then(|ix| Frontier::of(history, ix));
        }
        drop(i);
        self.metrics.memory_compactions.inc();
    }

    /// Hands the messages a compaction removed past the frontier to the queue, durably.
    /// `before` is the history before the compaction, `after` after it. `Ok` once the
    /// segment is acknowledged by the store (or there was nothing to queue).
    pub async fn enqueue_removed(
        &self,
        before: &[Message],
        after: &[Message],
    ) -> Result<usize, JournalError> {
        let frontier = self
            .doc()
            .and_then(|d| d.frontier)
            .and_then(|f| f.locate(before));
        let mut kept: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        for m in after {
            *kept.entry(identity(m)).or_default() += 1;
        }
        // From the end: a compaction keeps the tail, so what is kept matches the newest
        // messages of an identity (replies alike, "ok", are many).
        let mut removed = Vec::new();
        for (ix, m) in before.iter().enumerate().rev() {
            let id = identity(m);
            match kept.get_mut(&id) {
                Some(n) if *n > 0 => *n -= 1,
                _ if m.is_system() => {}
                _ if frontier.is_some_and(|f| ix <= f) => {}
                _ => removed.push(m.clone()),
            }
        }
        if removed.is_empty() {
            return Ok(0);
        }
        removed.reverse();
        let seq = {
            let mut i = self.lock();
            i.next_seq += 1;
            i.next_seq
        };
        let name = format!(
            "{QUEUE_PREFIX}{:020}-{:020}-{:016x}",
            self.epoch,
            seq,
            fastrand::u64(..)
        );
        let body = serde_json::to_vec(&removed).map_err(unavailable)?;
        self.objects.put(&name, body).await?;
        let n = removed.len();
        self.lock().queue.push(QueuedSegment {
            name,
            messages: removed,
        });
        self.metrics.memory_queued_segments.inc();
        self.publish();
        Ok(n)
    }

    /// What an update would absorb now, or `None` when it is not due (or one runs).
    /// `turns` is the session's turn count, `chars_per_token` its ratio.
    pub fn snapshot(
        &self,
        history: &[Message],
        turns: u64,
        policy: &cairn_crds::policy::Memory,
        chars_per_token: f64,
    ) -> Option<Snapshot> {
        let i = self.lock();
        if i.updating {
            return None;
        }
        let from = i
            .doc
            .as_ref()
            .and_then(|d| d.frontier)
            .and_then(|f| f.locate(history))
            .map_or(0, |f| f + 1);
        let fresh: Vec<Message> = history
            .get(from..)
            .unwrap_or_default()
            .iter()
            .filter(|m| !m.is_system())
            .cloned()
            .collect();
        if fresh.is_empty() && i.queue.is_empty() {
            return None;
        }
        let covered_turn = i.doc.as_ref().map_or(0, |d| d.covered_turn);
        let by_turns = turns.saturating_sub(covered_turn) >= u64::from(policy.every_turns);
        let fresh_bytes: usize = fresh.iter().map(Message::weight).sum();
        let by_tokens = policy.every_tokens > 0
            && (fresh_bytes as f64 / chars_per_token.max(1.0)) as u64 >= policy.every_tokens;
        // Queued segments are absorbed at once: they are what the history no longer holds.
        if !(by_turns || by_tokens || !i.queue.is_empty()) {
            return None;
        }
        let last = history.len().checked_sub(1)?;
        Some(Snapshot {
            queued: i.queue.clone(),
            fresh,
            frontier: Frontier::of(history, last),
            turn: turns,
        })
    }

    /// Marks an update as running; `false` when one already is.
    pub fn begin(&self) -> bool {
        let mut i = self.lock();
        if i.updating {
            return false;
        }
        i.updating = true;
        true
    }

    /// Runs one update: the summarizer merges the memory with the snapshot, the result is
    /// checked, archived and its head written, then the absorbed segments leave the queue.
    /// Call after [`SessionMemory::begin`]. Never panics; a failure is logged, counted and
    /// kept for the status.
    pub async fn update(
        self: Arc<Self>,
        snapshot: Snapshot,
        summarizer: crate::session::summarizer::ProviderSummarizer,
    ) {
        let result = self.try_update(&snapshot, &summarizer).await;
        let used = summarizer.take_usage();
        let mut i = self.lock();
        i.updating = false;
        i.usage.add(&used);
        if used != Usage::default() {
            i.model = Some(summarizer.model().to_owned());
        }
        let outcome = match result {
            Ok(doc) => {
                tracing::info!(
                    version = doc.version,
                    bytes = doc.text.len(),
                    absorbed_segments = snapshot.queued.len(),
                    absorbed_messages = snapshot.fresh.len(),
                    "session memory updated"
                );
                let absorbed: Vec<&str> = snapshot.queued.iter().map(|q| q.name.as_str()).collect();
                i.queue.retain(|q| !absorbed.contains(&q.name.as_str()));
                i.doc = Some(doc);
                i.updates += 1;
                i.last_error = None;
                "ok"
            }
            Err((label, e)) => {
                tracing::warn!(reason = label, "session memory update failed: {e}");
                i.failures += 1;
                i.last_error = Some(e.clone());
                i.unreported_error = Some(e);
                label
            }
        };
        drop(i);
        self.metrics
            .memory_updates
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        self.publish();
        self.changed.notify_waiters();
    }

    async fn try_update(
        &self,
        snapshot: &Snapshot,
        summarizer: &crate::session::summarizer::ProviderSummarizer,
    ) -> Result<MemoryDoc, (&'static str, String)> {
        let previous = self.doc();
        let instructions = update_instructions();
        let current = previous
            .as_ref()
            .map_or("(none yet: this is the first update)".to_owned(), |d| {
                d.text.clone()
            });
        let messages: Vec<&Message> = snapshot
            .queued
            .iter()
            .flat_map(|q| q.messages.iter())
            .chain(snapshot.fresh.iter())
            .collect();
        let window = summarizer.window_chars();
        let budget = ((window as f64 * TRANSCRIPT_SHARE) as usize)
            .saturating_sub(instructions.len() + current.len());
        if budget < summarize::MIN_INPUT_CHARS {
            return Err((
                "window_too_small",
                SummarizeError::WindowTooSmall {
                    window_chars: window,
                }
                .to_string(),
            ));
        }
        let body = transcript(&messages, budget, self.store.as_ref()).await;
        let request = SummaryRequest {
            instructions,
            transcript: format!(
                "CURRENT SESSION MEMORY:\n{current}\n\nNEW TRANSCRIPT (since the memory was last updated):\n{body}"
            ),
            attempt: 1,
        };
        let text = summarizer
            .summarize(&request)
            .await
            .map_err(|e| ("failed", e.to_string()))?;
        check_memory(&text).map_err(|why| {
            (
                "rejected",
                format!("the summarizer's memory was rejected: {why}"),
            )
        })?;
        let text = text.trim().to_owned();
        // Archived as a one-message segment: the text may quote markers.
        let archived = segment_text(&[Message::user(text.clone())]);
        let key = archive_all(self.store.as_ref(), &[archived.as_bytes()])
            .await
            .map_err(|e| ("archive", format!("the memory could not be archived: {e}")))?
            .first()
            .map(|k| k.as_str().to_owned());
        let doc = MemoryDoc {
            version: previous.as_ref().map_or(0, |d| d.version) + 1,
            text,
            key,
            frontier: snapshot.frontier,
            covered_turn: snapshot.turn,
            updated_at: now_secs(),
        };
        let head = format!("{HEAD_PREFIX}{:020}", self.epoch);
        let body = serde_json::to_vec(&doc).map_err(|e| ("head", e.to_string()))?;
        self.objects.put(&head, body).await.map_err(|e| {
            (
                "head",
                format!("the memory's head could not be written: {e}"),
            )
        })?;
        // Durable now: the absorbed segments may go, and so may older epochs' heads.
        for q in &snapshot.queued {
            if let Err(e) = self.objects.delete(&q.name).await {
                tracing::warn!(name = %q.name, "absorbed memory segment not deleted (absorbed again later): {e}");
            }
        }
        if let Ok(names) = self.objects.list(HEAD_PREFIX).await {
            for n in names.into_iter().filter(|n| *n < head) {
                let _ = self.objects.delete(&n).await;
            }
        }
        Ok(doc)
    }

    /// Tokens of update calls not yet counted by the session, and their model.
    pub fn take_usage(&self) -> Option<(Usage, String)> {
        let mut i = self.lock();
        let u = std::mem::take(&mut i.usage);
        let model = i.model.clone()?;
        (u != Usage::default()).then_some((u, model))
    }

    /// The last failure, once, for a notice.
    pub fn take_unreported_error(&self) -> Option<String> {
        self.lock().unreported_error.take()
    }

    /// `status.session.memory`.
    pub fn stats(&self, history: &[Message], turns: u64) -> cairn_crds::session::MemoryStats {
        let covered = self.covered_messages(history);
        let i = self.lock();
        let now = now_secs();
        cairn_crds::session::MemoryStats {
            version: i.doc.as_ref().map_or(0, |d| d.version),
            updated_at: i
                .doc
                .as_ref()
                .map(|d| cairn_crds::time::rfc3339(UNIX_EPOCH + Duration::from_secs(d.updated_at))),
            age_seconds: i.doc.as_ref().map(|d| now.saturating_sub(d.updated_at)),
            covered_turn: i.doc.as_ref().map_or(0, |d| d.covered_turn),
            turns_behind: turns.saturating_sub(i.doc.as_ref().map_or(0, |d| d.covered_turn)),
            covered_messages: covered,
            bytes: i.doc.as_ref().map_or(0, |d| d.text.len() as u64),
            key: i.doc.as_ref().and_then(|d| d.key.clone()),
            queue_segments: i.queue.len() as u64,
            queue_messages: i.queue.iter().map(|q| q.messages.len() as u64).sum(),
            updating: i.updating,
            updates: i.updates,
            failures: i.failures,
            last_error: i.last_error.clone(),
            compactions_from_memory: i.from_memory,
        }
    }
}

/// The summarizer of a compaction with the session memory standing by: the memory covers
/// what it can, the inner summarizer writes level 2 for the rest.
pub struct WithMemory<'a> {
    pub inner: &'a dyn Summarizer,
    pub memory: &'a SessionMemory,
}

#[async_trait::async_trait]
impl Summarizer for WithMemory<'_> {
    fn window_chars(&self) -> usize {
        self.inner.window_chars()
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        self.inner.summarize(request).await
    }

    fn memory_cover(&self, history: &[Message], start: usize, end: usize) -> Option<MemoryCover> {
        self.memory.cover(history, start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sections() -> String {
        SECTIONS
            .iter()
            .enumerate()
            .map(|(n, s)| format!("{}. {s}\nsomething\n", n + 1))
            .collect()
    }

    #[test]
    fn a_memory_needs_its_nine_sections_and_no_refusal() {
        assert!(check_memory(&sections()).is_ok());
        assert!(check_memory("  ").is_err());
        let refusal = format!("I'm sorry, I cannot do that. {}", sections());
        assert_eq!(check_memory(&refusal), Err("refusal".into()));
        let partial = sections().replace("Pending tasks", "Later");
        assert!(
            check_memory(&partial)
                .err()
                .is_some_and(|e| e.contains("Pending tasks"))
        );
        let i = update_instructions();
        for s in SECTIONS {
            assert!(i.contains(s));
        }
    }

    #[test]
    fn identity_survives_the_in_place_passes() {
        let mut tool = Message::tool("c1", "a long output");
        let id = identity(&tool);
        tool.content = "[stub]".into();
        assert_eq!(identity(&tool), id, "microcompact rewrites tool outputs");
        let mut a = Message::assistant("done");
        a.reasoning = Some("thinking".into());
        let id = identity(&a);
        a.reasoning = None;
        assert_eq!(identity(&a), id, "trim strips reasoning");
        assert_ne!(identity(&Message::user("done")), id);
    }

    #[tokio::test]
    async fn a_compaction_that_removes_only_absorbed_messages_queues_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let objects: Arc<dyn ObjectStore> =
            Arc::new(crate::storage::DirObjects::open(dir.path()).expect("dir objects"));
        let store: Arc<dyn Store> = Arc::new(crate::ccr::MemoryStore::new());
        let m = SessionMemory::open(
            Arc::clone(&objects),
            Arc::clone(&store),
            1,
            Arc::new(Metrics::new()),
        )
        .await
        .expect("open");
        let mut h = vec![Message::system("s")];
        for i in 0..10 {
            h.push(Message::user(format!("note {i}")));
            h.push(Message::assistant("ok"));
        }
        m.lock().doc = Some(MemoryDoc {
            version: 1,
            text: "memory".into(),
            key: None,
            frontier: Frontier::of(&h, 12),
            covered_turn: 6,
            updated_at: 0,
        });
        // The memory covers [1, 13); the compaction replaced [1, 11) and kept the rest.
        let mut after = vec![h[0].clone(), Message::user("memory")];
        after.extend(h[11..].iter().cloned());
        assert_eq!(m.enqueue_removed(&h, &after).await.expect("queued"), 0);
        assert_eq!(m.queue_len(), 0);
        // One that also removed [13, 15), past the frontier, queues those two.
        let mut after = vec![h[0].clone(), Message::user("summary")];
        after.extend(h[15..].iter().cloned());
        assert_eq!(m.enqueue_removed(&h, &after).await.expect("queued"), 2);
        let q = m.lock().queue.clone();
        assert_eq!(q[0].messages, h[13..15].to_vec());
        // A restart finds the queued segment in the local directory.
        let reopened = SessionMemory::open(objects, store, 2, Arc::new(Metrics::new()))
            .await
            .expect("reopen");
        assert_eq!(reopened.lock().queue.clone(), q);
        // The frontier of an "ok" is told from the other "ok"s by what it answered.
        let f = Frontier::of(&h, 12).expect("frontier");
        assert_eq!(f.locate(&after), None);
        let shifted: Vec<Message> = std::iter::once(h[0].clone())
            .chain(h[5..].iter().cloned())
            .collect();
        assert_eq!(f.locate(&shifted), Some(8));
    }

    #[test]
    fn the_frontier_is_found_after_a_shift_and_lost_after_a_removal() {
        let h: Vec<Message> = vec![
            Message::system("s"),
            Message::user("one"),
            Message::assistant("two"),
            Message::user("three"),
        ];
        let f = Frontier::of(&h, 2).expect("there");
        assert_eq!(f.locate(&h), Some(2));
        let shifted = vec![
            h[0].clone(),
            Message::user("summary"),
            h[1].clone(),
            h[2].clone(),
        ];
        assert_eq!(f.locate(&shifted), Some(3));
        // Without the message it answered it is not trusted: the memory counts as stale.
        let cut = vec![h[0].clone(), h[2].clone(), h[3].clone()];
        assert_eq!(f.locate(&cut), None);
        let removed = vec![h[0].clone(), h[3].clone()];
        assert_eq!(f.locate(&removed), None);
    }
}
