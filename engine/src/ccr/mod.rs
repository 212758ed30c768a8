//! CCR — compress, cache, recall. Every lossy step first stores the original here, content
//! addressed, and leaves a `<<ccr:KEY>>` marker; `recall` brings the exact bytes back.
//!
//! This module holds the addressing scheme and the [`Store`] trait the compaction engine
//! uses, and [`ObjectArchive`], a store over the storage port's named objects; the tiers
//! (local directory, S3, layered) implement it in the agent.

mod objects;
pub mod recall;
pub mod stats;

use std::collections::HashMap;
use std::fmt;
use std::sync::{LazyLock, Mutex};

use async_trait::async_trait;
use memchr::memmem;
use sha2::{Digest, Sha256};

pub use objects::ObjectArchive;
pub use recall::{RecallError, Recalled, extract_keys, recall};
pub use stats::{ArchiveCounters, ArchiveReport, ArchiveSnapshot, CompressionCounters, StoreUsage};

/// Prefix of a marker; a marker is `<<ccr:` + 16 lowercase hex + `>>`.
pub const MARKER_OPEN: &str = "<<ccr:";
pub const MARKER_CLOSE: &str = ">>";
/// Hex characters in a key (the first 64 bits of the SHA-256 of the content).
pub const KEY_LEN: usize = 16;

/// A validated archive key: exactly 16 lowercase hex characters. Only a `Key` is ever used to
/// form a file path or an object name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key([u8; KEY_LEN]);

impl Key {
    /// The key of `content`.
    pub fn of(content: &[u8]) -> Self {
        let digest = Sha256::digest(content);
        let hex = hex::encode(&digest[..KEY_LEN / 2]);
        let mut out = [0u8; KEY_LEN];
        out.copy_from_slice(hex.as_bytes());
        Self(out)
    }

    /// Parses a canonical key (exactly 16 lowercase hex characters, nothing else).
    pub fn parse(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() != KEY_LEN || !b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let mut out = [0u8; KEY_LEN];
        out.copy_from_slice(b);
        Some(Self(out))
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII hex is ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// `<<ccr:KEY>>`.
    pub fn marker(&self) -> String {
        format!("{MARKER_OPEN}{}{MARKER_CLOSE}", self.as_str())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.as_str())
    }
}

/// Canonical markers in `text`, distinct, in order of first appearance. Strict: exactly
/// `<<ccr:` + 16 lowercase hex + `>>`.
pub fn extract_markers(text: &str) -> Vec<Key> {
    let mut out: Vec<Key> = Vec::new();
    for key in markers_in(text.as_bytes()) {
        if !out.contains(&key) {
            out.push(key);
        }
    }
    out
}

/// Every canonical marker in `content`, in order, repetitions included. A marker is ASCII, so
/// it reads the same in non-UTF-8 bytes. The search for `<<ccr:` is vectorised: the archive
/// scans every original before storing it, so this is on the compaction hot path.
fn markers_in(content: &[u8]) -> impl Iterator<Item = Key> + '_ {
    static OPEN: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(MARKER_OPEN.as_bytes()));
    OPEN.find_iter(content).filter_map(move |pos| {
        let after = &content[pos + MARKER_OPEN.len()..];
        let hex = after.get(..KEY_LEN)?;
        if !after[KEY_LEN..].starts_with(MARKER_CLOSE.as_bytes()) {
            return None;
        }
        Key::parse(std::str::from_utf8(hex).ok()?)
    })
}

/// True when `text` carries at least one canonical marker.
pub fn has_marker(text: &str) -> bool {
    has_marker_bytes(text.as_bytes())
}

/// Why the archive could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The content already carries a marker: archiving it again would nest archives.
    #[error("content already carries a ccr marker; refusing to archive it again")]
    AlreadyArchived,
    /// The durable tier could not be reached or refused the write; nothing was stored.
    #[error("archive store unavailable: {0}")]
    Unavailable(String),
    /// The stored object is not what its key says (corruption or tampering).
    #[error("archived object {0} does not match its key")]
    Corrupt(Key),
    #[error("archive I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl ArchiveError {
    /// Short stable label for metrics and events.
    pub fn label(&self) -> &'static str {
        match self {
            Self::AlreadyArchived => "already_archived",
            Self::Unavailable(_) => "unavailable",
            Self::Corrupt(_) => "corrupt",
            Self::Io(_) => "io",
        }
    }
}

/// The store's own failures keep their text: what was unavailable, or the I/O error.
impl From<crate::storage::ObjectError> for ArchiveError {
    fn from(e: crate::storage::ObjectError) -> Self {
        match e {
            crate::storage::ObjectError::Unavailable(s) => Self::Unavailable(s),
            crate::storage::ObjectError::Io(e) => Self::Io(e),
        }
    }
}

/// Originals of one pass a store writes (or reads) at once when the session sets no
/// `archive.maxInFlight`.
pub const DEFAULT_IN_FLIGHT: usize = cairn_crds::session::DEFAULT_ARCHIVE_MAX_IN_FLIGHT as usize;

/// Durable, content-addressed storage of originals, scoped to one session.
///
/// `archive` returns only after the bytes are durably stored: a caller may emit the key's
/// marker (and drop the original) only on `Ok`.
#[async_trait]
pub trait Store: Send + Sync {
    /// Stores `content` verbatim and returns its key. Idempotent: the same content gives the
    /// same key. Refuses content that already carries a marker.
    async fn archive(&self, content: &[u8]) -> Result<Key, ArchiveError> {
        self.archive_checked(Archivable::check(content)?).await
    }

    /// [`Store::archive`] for content whose marker check is already done: a pass that had to
    /// scan a multi-megabyte original anyway hands its proof over instead of scanning twice.
    async fn archive_checked(&self, content: Archivable<'_>) -> Result<Key, ArchiveError> {
        let original = content.hash();
        self.put_hashed(original).await?;
        Ok(original.key())
    }

    /// Stores one original under the key it was hashed to; `Ok` only once it is durable.
    async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError>;

    /// Stores every original of a batch of distinct keys; `Ok` only once each is durable. On
    /// an error some may have been stored and others not: the caller emits no marker of the
    /// batch. The default keeps up to [`Store::in_flight`] writes in flight at once.
    async fn put_batch(&self, originals: &[Hashed<'_>]) -> Result<(), ArchiveError> {
        use futures::{StreamExt, TryStreamExt};
        match originals {
            [] => Ok(()),
            [one] => self.put_hashed(*one).await,
            many => {
                let mut writes = Vec::with_capacity(many.len());
                for o in many {
                    writes.push(self.put_hashed(*o));
                }
                futures::stream::iter(writes)
                    .buffer_unordered(self.in_flight())
                    .try_collect::<()>()
                    .await
            }
        }
    }

    /// The original bytes of `key`, or `None` when this session's archive has no such key.
    async fn fetch(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError>;

    /// [`Store::fetch`] of several keys, answers in the order of `keys`, up to
    /// [`Store::in_flight`] reads at once.
    async fn fetch_many(&self, keys: &[Key]) -> Vec<Result<Option<Vec<u8>>, ArchiveError>> {
        use futures::StreamExt;
        let mut reads = Vec::with_capacity(keys.len());
        for k in keys {
            reads.push(self.fetch(k));
        }
        futures::stream::iter(reads)
            .buffered(self.in_flight())
            .collect()
            .await
    }

    /// Writes or reads of one pass this store keeps in flight at once (at least 1).
    fn in_flight(&self) -> usize {
        DEFAULT_IN_FLIGHT
    }
}

/// An original together with its key: hashed once, by [`Archivable::hash`], so a batch can
/// drop repeated content before anything is written.
#[derive(Clone, Copy, Debug)]
pub struct Hashed<'a> {
    key: Key,
    bytes: &'a [u8],
}

impl<'a> Hashed<'a> {
    /// `bytes` with the key already computed and the marker check already done by a caller
    /// that had to do both anyway (compression plans on the whole original).
    pub(crate) fn checked(key: Key, bytes: &'a [u8]) -> Self {
        debug_assert!(key == Key::of(bytes) && !has_marker_bytes(bytes));
        Self { key, bytes }
    }

    pub fn key(self) -> Key {
        self.key
    }

    pub fn bytes(self) -> &'a [u8] {
        self.bytes
    }
}

/// Bytes known to carry no marker, so a store may archive them without nesting archives. The
/// only way to get one is [`Archivable::check`].
#[derive(Clone, Copy, Debug)]
pub struct Archivable<'a>(&'a [u8]);

impl<'a> Archivable<'a> {
    /// Scans `content` once; refuses it when it already carries a marker.
    pub fn check(content: &'a [u8]) -> Result<Self, ArchiveError> {
        if has_marker_bytes(content) {
            return Err(ArchiveError::AlreadyArchived);
        }
        Ok(Self(content))
    }

    pub fn bytes(self) -> &'a [u8] {
        self.0
    }

    /// Computes the key (SHA-256 of the content).
    pub fn hash(self) -> Hashed<'a> {
        Hashed {
            key: Key::of(self.0),
            bytes: self.0,
        }
    }
}

/// [`has_marker`] over raw bytes, so large originals are scanned without a lossy copy.
pub fn has_marker_bytes(content: &[u8]) -> bool {
    markers_in(content).next().is_some()
}

/// An in-process store: for tests and for sessions that run without any archive configured
/// (its contents die with the process, which `cairn-agent` reports at start-up).
#[derive(Default)]
pub struct MemoryStore {
    entries: Mutex<HashMap<Key, Vec<u8>>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError> {
        self.put_batch(&[original]).await
    }

    /// In memory there is nothing to wait for: one lock for the whole batch.
    async fn put_batch(&self, originals: &[Hashed<'_>]) -> Result<(), ArchiveError> {
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| ArchiveError::Unavailable("memory store lock poisoned".into()))?;
        for o in originals {
            entries.entry(o.key).or_insert_with(|| o.bytes.to_vec());
        }
        Ok(())
    }

    async fn fetch(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        let entries = self
            .entries
            .lock()
            .map_err(|_| ArchiveError::Unavailable("memory store lock poisoned".into()))?;
        Ok(entries.get(key).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_first_16_hex_of_sha256() {
        // sha256("") = e3b0c44298fc1c149afbf4c8996fb924...
        assert_eq!(Key::of(b"").as_str(), "e3b0c44298fc1c14");
        assert_eq!(Key::of(b"").marker(), "<<ccr:e3b0c44298fc1c14>>");
    }

    #[test]
    fn parse_is_strict() {
        assert!(Key::parse("e3b0c44298fc1c14").is_some());
        for bad in [
            "E3B0C44298FC1C14",
            "e3b0c44298fc1c1",
            "e3b0c44298fc1c145",
            "e3b0c44298fc1c1g",
            "../../etc/passw",
        ] {
            assert!(Key::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn markers_are_distinct_in_order() {
        let a = Key::of(b"a");
        let b = Key::of(b"b");
        let text = format!(
            "x {} y {} z {} <<ccr:NOTAKEY0000000>> <<ccr:{}",
            a.marker(),
            b.marker(),
            a.marker(),
            a
        );
        assert_eq!(extract_markers(&text), vec![a, b]);
    }

    #[tokio::test]
    async fn memory_store_round_trip_and_refusal() {
        let s = MemoryStore::new();
        let k = s.archive(b"\xff\x00bytes").await.expect("stored");
        assert_eq!(s.archive(b"\xff\x00bytes").await.expect("stored"), k);
        assert_eq!(s.len(), 1);
        assert_eq!(
            s.fetch(&k).await.expect("ok").as_deref(),
            Some(&b"\xff\x00bytes"[..])
        );
        let marked = format!("see {}", k.marker());
        assert!(matches!(
            s.archive(marked.as_bytes()).await,
            Err(ArchiveError::AlreadyArchived)
        ));
    }
}
