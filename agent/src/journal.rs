//! The session journal: an append-only log of history changes, written before a turn is
//! acknowledged, from which a restarted agent rebuilds the exact history.
//!
//! Every entry is one object `e<epoch>n<nonce>-s<seq>.json` under the session's `journal/` prefix
//! (S3: `<prefix>/<namespace>/<session>/journal/`, or a local directory). An entry is a
//! splice: "keep the first `at` messages, then these". A turn that only added messages
//! writes only those; a compaction rewrites from the first message it changed. Replaying the
//! valid entries in `seq` order gives the history byte for byte, with its summaries and
//! archive markers.
//!
//! # Fencing
//!
//! At most one agent writes a session's journal. A writer takes a fencing token — an *epoch*
//! (highest existing + 1) and a random nonce that orders two claims of one epoch made at the
//! same moment: it writes the claim object `claims/e<epoch>n<nonce>.json` naming itself, then
//! lists the journal and completes the claim with `start_seq` = the next free sequence number.
//! After every entry it writes, a writer lists `claims/`: if a higher token exists, it has
//! been replaced, fails the write and never writes again ([`JournalError::Fenced`]). A reader
//! ignores every entry of token `t` whose seq is at or beyond the `start_seq` of a completed
//! claim with a higher token. Together: an entry acknowledged by a writer that checked the
//! claims after writing it was listed by the next claimant before that claimant completed
//! its claim (read-after-write and list-after-write consistency, which S3 provides), so it is
//! below the new `start_seq` and stays valid; whatever a replaced writer writes later is
//! ignored. No conditional write is needed. In a cluster a Kubernetes Lease additionally keeps
//! two pods from running turns at once (see `kube`); its holder still takes an epoch here.

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;
use serde::{Deserialize, Serialize};

use crate::compact::SessionState;
use crate::history::Message;

/// Entries written after which a full checkpoint (an entry with `at = 0`) is written, so a
/// rebuild fetches a bounded number of objects.
pub const CHECKPOINT_EVERY: u64 = 64;

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal store unavailable: {0}")]
    Unavailable(String),
    #[error(
        "this agent ({holder}, epoch {epoch}) no longer owns the session: {by} took it over with epoch {by_epoch}; it stops writing"
    )]
    Fenced {
        holder: String,
        epoch: u64,
        by: String,
        by_epoch: u64,
    },
    #[error("journal object {name} is corrupt: {reason}")]
    Corrupt { name: String, reason: String },
    #[error("journal I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("journal has no compaction to undo")]
    NothingToRewind,
}

impl JournalError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Fenced { .. } => "fenced",
            Self::Corrupt { .. } => "corrupt",
            Self::Io(_) => "io",
            Self::NothingToRewind => "nothing_to_rewind",
        }
    }
}

/// Where journal objects live. Names are relative to the session's journal prefix.
#[async_trait]
pub trait ObjectStore: Send + Sync {
    /// Stores `body` under `name`; returns only once it is durable.
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), JournalError>;
    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, JournalError>;
    /// Names starting with `prefix`, in any order.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, JournalError>;
}

/// Journal objects in a local directory (the embedded default without S3).
pub struct DirObjects {
    root: PathBuf,
}

impl DirObjects {
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, JournalError> {
        let root = root.into();
        std::fs::create_dir_all(root.join("claims"))?;
        Ok(Self { root })
    }
}

#[async_trait]
impl ObjectStore for DirObjects {
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), JournalError> {
        let path = self.root.join(name);
        let tmp = self
            .root
            .join(format!(".tmp-{}-{}", std::process::id(), fastrand::u64(..)));
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            if let Some(parent) = path.parent()
                && let Ok(d) = std::fs::File::open(parent)
            {
                let _ = d.sync_all();
            }
            Ok(())
        })
        .await
        .map_err(|e| JournalError::Unavailable(e.to_string()))??;
        Ok(())
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, JournalError> {
        match tokio::fs::read(self.root.join(name)).await {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, JournalError> {
        let (dir, file_prefix, rel) = match prefix.rsplit_once('/') {
            Some((d, f)) => (self.root.join(d), f.to_owned(), format!("{d}/")),
            None => (self.root.clone(), prefix.to_owned(), String::new()),
        };
        let mut out = Vec::new();
        let mut rd = match tokio::fs::read_dir(&dir).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        while let Some(e) = rd.next_entry().await? {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&file_prefix)
                && !name.starts_with(".tmp-")
                && name.ends_with(".json")
            {
                out.push(format!("{rel}{name}"));
            }
        }
        Ok(out)
    }
}

/// Journal objects in S3, under `<prefix>/<namespace>/<session>/journal/`.
pub struct S3Objects {
    client: Client,
    bucket: String,
    prefix: String,
}

impl S3Objects {
    /// `journal_prefix` is [`crate::ccr::SessionScope::journal_prefix`].
    pub fn new(client: Client, bucket: &str, journal_prefix: String) -> Self {
        Self {
            client,
            bucket: bucket.to_owned(),
            prefix: journal_prefix,
        }
    }
}

fn s3_err<E: std::error::Error>(e: E) -> JournalError {
    JournalError::Unavailable(DisplayErrorContext(e).to_string())
}

#[async_trait]
impl ObjectStore for S3Objects {
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), JournalError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(format!("{}{name}", self.prefix))
            .content_type("application/json")
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(s3_err)?;
        Ok(())
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, JournalError> {
        match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(format!("{}{name}", self.prefix))
            .send()
            .await
        {
            Ok(out) => {
                let body = out.body.collect().await.map_err(s3_err)?;
                Ok(Some(body.into_bytes().to_vec()))
            }
            Err(e) => {
                if e.as_service_error().is_some_and(|s| s.is_no_such_key()) {
                    Ok(None)
                } else {
                    Err(s3_err(e))
                }
            }
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, JournalError> {
        let full = format!("{}{prefix}", self.prefix);
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&full)
                .set_continuation_token(token)
                .send()
                .await
                .map_err(s3_err)?;
            for o in page.contents() {
                if let Some(k) = o.key().and_then(|k| k.strip_prefix(&self.prefix)) {
                    out.push(k.to_owned());
                }
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_owned()),
                _ => break,
            }
        }
        Ok(out)
    }
}

/// The parts of [`SessionState`] that outlive a restart.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PersistedState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_payload_cap: Option<u64>,
    #[serde(default)]
    pub payload_notice_injected: bool,
    #[serde(default)]
    pub large_history_warned: bool,
    #[serde(default)]
    pub consecutive_failures: u32,
    #[serde(default)]
    pub skip_level2: u32,
    #[serde(default)]
    pub tool_budget_halvings: u32,
    #[serde(default)]
    pub compactions: u64,
    #[serde(default)]
    pub level3_compactions: u64,
    #[serde(default)]
    pub recoveries: u64,
    #[serde(default)]
    pub turns: u64,
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// The window a server named, and the `model@configured-window` it was learned for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_window: Option<(u64, String)>,
    /// The calibrated bytes per token and how many counts it rests on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chars_per_token: Option<(f64, u32)>,
    #[serde(default)]
    pub truncated_replies: u64,
}

impl PersistedState {
    pub fn capture(state: &SessionState, turns: u64, tokens: [u64; 3]) -> Self {
        Self {
            learned_payload_cap: state.learned_payload_cap,
            payload_notice_injected: state.payload_notice_injected,
            large_history_warned: state.large_history_warned,
            consecutive_failures: state.consecutive_failures,
            skip_level2: state.skip_level2,
            tool_budget_halvings: state.tool_budget_halvings,
            compactions: state.compactions,
            level3_compactions: state.level3_compactions,
            recoveries: state.recoveries,
            turns,
            input_tokens: tokens[0],
            output_tokens: tokens[1],
            cache_read_tokens: tokens[2],
            learned_window: state.learned_window.zip(state.learned_window_basis.clone()),
            chars_per_token: (state.chars_per_token.samples() > 0)
                .then(|| (state.chars_per_token.get(), state.chars_per_token.samples())),
            truncated_replies: state.truncated_replies,
        }
    }

    pub fn restore_into(&self, state: &mut SessionState) {
        state.learned_payload_cap = self.learned_payload_cap;
        state.payload_notice_injected = self.payload_notice_injected;
        state.large_history_warned = self.large_history_warned;
        state.consecutive_failures = self.consecutive_failures;
        state.skip_level2 = self.skip_level2;
        state.tool_budget_halvings = self.tool_budget_halvings;
        state.compactions = self.compactions;
        state.level3_compactions = self.level3_compactions;
        state.recoveries = self.recoveries;
        state.truncated_replies = self.truncated_replies;
        if let Some((w, basis)) = &self.learned_window {
            state.learned_window = Some(*w);
            state.learned_window_basis = Some(basis.clone());
        }
        if let Some((v, n)) = self.chars_per_token {
            state.chars_per_token = crate::tokens::CharsPerToken::restored(v, n);
        }
    }
}

/// A compaction recorded with the entry that persisted its result.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompactionRecord {
    /// `auto`, `preflight`, `manual` or `recovery`.
    pub trigger: String,
    /// Highest ladder level that ran (0 for recovery without a ladder level).
    pub level: u8,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Archive keys written by the compaction.
    #[serde(default)]
    pub archived: Vec<String>,
}

/// How to undo the compactions of one entry: `pre` is the history just before the first of
/// them; everything from `post_len` on in the entry's result was added after the last.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Undo {
    pub pre: Vec<Message>,
    pub post_len: usize,
}

/// One journal object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Entry {
    pub epoch: u64,
    pub seq: u64,
    pub holder: String,
    /// Messages kept from the previous history.
    pub at: usize,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub state: PersistedState,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compactions: Vec<CompactionRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<Undo>,
    /// This entry undoes the compactions of entry `rewinds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewinds: Option<u64>,
}

/// An epoch claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Claim {
    pub epoch: u64,
    pub holder: String,
    /// `None` while the claimant is still reading the journal.
    pub start_seq: Option<u64>,
}

/// A writer's fencing token: its epoch, and a random nonce that orders two claims of the
/// same epoch (two agents starting at the same moment both pick highest + 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token {
    pub epoch: u64,
    pub nonce: u32,
}

impl Token {
    fn name(self) -> String {
        format!("e{:010}n{:08x}", self.epoch, self.nonce)
    }

    fn parse(s: &str) -> Option<Self> {
        let (e, n) = s.strip_prefix('e')?.split_once('n')?;
        if e.len() != 10 || n.len() != 8 {
            return None;
        }
        Some(Self {
            epoch: e.parse().ok()?,
            nonce: u32::from_str_radix(n, 16).ok()?,
        })
    }
}

fn entry_name(token: Token, seq: u64, full: bool) -> String {
    format!(
        "{}-s{seq:012}{}.json",
        token.name(),
        if full { "-full" } else { "" }
    )
}

fn parse_entry_name(name: &str) -> Option<(Token, u64, bool)> {
    let rest = name.strip_suffix(".json")?;
    let (rest, full) = match rest.strip_suffix("-full") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    let (t, s) = rest.split_once("-s")?;
    Some((Token::parse(t)?, s.parse().ok()?, full))
}

fn claim_name(token: Token) -> String {
    format!("claims/{}.json", token.name())
}

fn parse_claim(name: &str) -> Option<Token> {
    Token::parse(name.strip_prefix("claims/")?.strip_suffix(".json")?)
}

/// What a rebuild found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rebuilt {
    pub history: Vec<Message>,
    pub state: PersistedState,
    /// Valid entries replayed (from the last checkpoint on).
    pub entries: u64,
    /// Seq of the last valid entry.
    pub last_seq: Option<u64>,
    /// The last entry with compactions, when they have not been undone: its seq and undo
    /// record.
    pub rewindable: Option<(u64, Undo)>,
}

/// The journal of one session, owned by its single writer.
pub struct Journal {
    objects: Arc<dyn ObjectStore>,
    holder: String,
    token: Token,
    next_seq: u64,
    since_checkpoint: u64,
    fenced: Option<JournalError>,
}

impl Journal {
    /// Takes a new epoch and rebuilds the history. Any earlier writer is fenced from here on.
    pub async fn open(
        objects: Arc<dyn ObjectStore>,
        holder: impl Into<String>,
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
        let token = Token {
            epoch,
            nonce: fastrand::u32(..),
        };
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
        let rebuilt = rebuild(objects.as_ref()).await?;
        let next_seq = rebuilt.last_seq.map_or(0, |s| s + 1);
        let done = Claim {
            start_seq: Some(next_seq),
            ..pending
        };
        objects
            .put(
                &claim_name(token),
                serde_json::to_vec(&done).unwrap_or_default(),
            )
            .await?;
        tracing::info!(
            epoch,
            next_seq,
            entries = rebuilt.entries,
            "journal: epoch claimed"
        );
        Ok((
            Self {
                objects,
                holder,
                token,
                next_seq,
                since_checkpoint: rebuilt.entries,
                fenced: None,
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

    /// True when the next entry should be a full checkpoint.
    pub fn checkpoint_due(&self) -> bool {
        self.since_checkpoint >= CHECKPOINT_EVERY
    }

    /// Writes one entry and confirms this agent still owns the session. `entry.epoch`,
    /// `seq` and `holder` are filled in here.
    pub async fn append(&mut self, mut entry: Entry) -> Result<u64, JournalError> {
        if let Some(f) = &self.fenced {
            return Err(clone_fenced(f));
        }
        entry.epoch = self.token.epoch;
        entry.seq = self.next_seq;
        entry.holder.clone_from(&self.holder);
        let full = entry.at == 0;
        let body = serde_json::to_vec(&entry).map_err(|e| JournalError::Corrupt {
            name: "new entry".into(),
            reason: e.to_string(),
        })?;
        self.objects
            .put(&entry_name(self.token, entry.seq, full), body)
            .await?;
        // The entry may already be visible to the next claimant; it is kept only if it came
        // before that claim, which is exactly when no newer claim is visible yet.
        self.check_fence().await?;
        self.next_seq += 1;
        self.since_checkpoint = if full { 0 } else { self.since_checkpoint + 1 };
        Ok(entry.seq)
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

/// Replays the valid entries of a journal.
pub async fn rebuild(objects: &dyn ObjectStore) -> Result<Rebuilt, JournalError> {
    let mut bounds: BTreeMap<Token, u64> = BTreeMap::new();
    for name in objects.list("claims/").await? {
        let Some(token) = parse_claim(&name) else {
            continue;
        };
        if let Some(body) = objects.get(&name).await?
            && let Ok(c) = serde_json::from_slice::<Claim>(&body)
            && let Some(start) = c.start_seq
        {
            bounds.insert(token, start);
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
    for name in objects.list("e").await? {
        let Some((token, seq, full)) = parse_entry_name(&name) else {
            continue;
        };
        if seq >= limit_for(token) {
            continue;
        }
        match valid.get(&seq) {
            Some((t, _, _)) if *t >= token => {}
            _ => {
                valid.insert(seq, (token, full, name));
            }
        }
    }
    let start = valid
        .iter()
        .rev()
        .find(|(_, (_, full, _))| *full)
        .map_or(0, |(s, _)| *s);
    let mut out = Rebuilt::default();
    let mut rewindable: Option<(u64, Undo)> = None;
    for (seq, (_, _, name)) in valid.range(start..) {
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
        if entry.at > out.history.len() {
            return Err(JournalError::Corrupt {
                name: name.clone(),
                reason: format!(
                    "keeps {} messages of a {}-message history",
                    entry.at,
                    out.history.len()
                ),
            });
        }
        out.history.truncate(entry.at);
        out.history.extend(entry.messages);
        if let Some(u) = entry.undo {
            rewindable = Some((*seq, u));
        }
        if entry.rewinds.is_some() {
            rewindable = None;
        }
        out.state = entry.state;
        out.entries += 1;
        out.last_seq = Some(*seq);
    }
    out.rewindable = rewindable;
    // Entries older than the checkpoint are not replayed; their seq still counts.
    if let Some((last, _)) = valid.iter().next_back() {
        out.last_seq = Some(*last);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: usize, msgs: &[&str]) -> Entry {
        Entry {
            epoch: 0,
            seq: 0,
            holder: String::new(),
            at,
            messages: msgs.iter().map(|m| Message::user(*m)).collect(),
            state: PersistedState::default(),
            compactions: vec![],
            undo: None,
            rewinds: None,
        }
    }

    #[test]
    fn names_round_trip() {
        let t = Token {
            epoch: 3,
            nonce: 0xdead_beef,
        };
        assert_eq!(
            parse_entry_name(&entry_name(t, 17, true)),
            Some((t, 17, true))
        );
        assert_eq!(
            parse_entry_name(&entry_name(t, 0, false)),
            Some((t, 0, false))
        );
        assert_eq!(parse_claim(&claim_name(t)), Some(t));
        assert_eq!(parse_entry_name(&claim_name(t)), None);
        assert_eq!(parse_claim("claims/e1.json"), None);
    }

    #[tokio::test]
    async fn splices_replay_and_stale_epochs_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let objects: Arc<dyn ObjectStore> = Arc::new(DirObjects::open(dir.path()).unwrap());
        let (mut a, r) = Journal::open(objects.clone(), "a").await.unwrap();
        assert!(r.history.is_empty());
        a.append(entry(0, &["1", "2"])).await.unwrap();
        a.append(entry(1, &["x"])).await.unwrap();
        let (mut b, r) = Journal::open(objects.clone(), "b").await.unwrap();
        assert_eq!(r.history, vec![Message::user("1"), Message::user("x")]);
        // The replaced writer's next write is refused and ignored by readers.
        let err = a.append(entry(2, &["late"])).await.unwrap_err();
        assert_eq!(err.label(), "fenced");
        assert!(a.append(entry(2, &["later"])).await.is_err());
        b.append(entry(2, &["y"])).await.unwrap();
        let r = rebuild(objects.as_ref()).await.unwrap();
        assert_eq!(
            r.history,
            vec![Message::user("1"), Message::user("x"), Message::user("y")]
        );
    }

    #[tokio::test]
    async fn two_claims_of_the_same_epoch_leave_one_writer() {
        let dir = tempfile::tempdir().unwrap();
        let objects: Arc<dyn ObjectStore> = Arc::new(DirObjects::open(dir.path()).unwrap());
        let (mut a, _) = Journal::open(objects.clone(), "a").await.unwrap();
        // Another agent that started at the same moment picked the same epoch.
        let rival = Token {
            epoch: a.epoch(),
            nonce: if a.token.nonce == u32::MAX {
                0
            } else {
                u32::MAX
            },
        };
        let claim = Claim {
            epoch: rival.epoch,
            holder: "b".into(),
            start_seq: Some(0),
        };
        objects
            .put(&claim_name(rival), serde_json::to_vec(&claim).unwrap())
            .await
            .unwrap();
        let a_loses = rival > a.token;
        let r = a.append(entry(0, &["from a"])).await;
        assert_eq!(r.is_err(), a_loses, "{r:?}");
        let rebuilt = rebuild(objects.as_ref()).await.unwrap();
        assert_eq!(rebuilt.history.is_empty(), a_loses);
    }
}
