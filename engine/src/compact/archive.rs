//! How passes talk to the archive: stage, archive every original, then swap.
//!
//! Whole segments of messages (dropped by levels 2 and 3 or by recovery) are archived as JSON
//! Lines in which every `<` inside a string is written `\u003c`. The text parses back to the
//! exact messages, and it carries no literal `<<ccr:` even when the messages quote markers of
//! earlier archives, so the store's no-nesting rule never refuses a segment.

use std::collections::HashSet;
use std::io;

use serde::Serialize;

use crate::ccr::{Archivable, ArchiveError, Hashed, Key, Store, extract_markers};
use crate::history::Message;

/// Archives every original and returns its key, one per original, in order. Either all are
/// stored, or the first error is returned and the caller must leave its history untouched.
/// Markers are built from the keys the store returns, after archiving, so each original is
/// hashed once.
pub async fn archive_all(store: &dyn Store, originals: &[&[u8]]) -> Result<Vec<Key>, ArchiveError> {
    let checked = originals
        .iter()
        .map(|o| Archivable::check(o))
        .collect::<Result<Vec<_>, _>>()?;
    archive_all_checked(store, &checked).await
}

/// [`archive_all`] for originals whose marker check the pass already made. Each original is
/// hashed once, repeated content is written once, and the writes of the batch run
/// concurrently (as many in flight as the store allows).
pub async fn archive_all_checked(
    store: &dyn Store,
    originals: &[Archivable<'_>],
) -> Result<Vec<Key>, ArchiveError> {
    let hashed: Vec<Hashed<'_>> = originals.iter().map(|o| o.hash()).collect();
    let keys: Vec<Key> = hashed.iter().map(|h| h.key()).collect();
    let mut seen = HashSet::with_capacity(hashed.len());
    let batch: Vec<Hashed<'_>> = hashed
        .into_iter()
        .filter(|h| seen.insert(h.key()))
        .collect();
    store.put_batch(&batch).await?;
    Ok(keys)
}

/// `keys` without repetitions, in order of first appearance (for reports).
pub fn distinct(keys: &[Key]) -> Vec<Key> {
    let mut seen = HashSet::with_capacity(keys.len());
    keys.iter().copied().filter(|k| seen.insert(*k)).collect()
}

/// JSON Lines of `messages` with `<` escaped inside strings (see the module comment).
pub fn segment_text(messages: &[Message]) -> String {
    let mut out = Vec::new();
    for m in messages {
        let mut ser = serde_json::Serializer::with_formatter(&mut out, EscapeLt);
        // Plain structs with string keys always serialize.
        if m.serialize(&mut ser).is_ok() {
            out.push(b'\n');
        }
    }
    // The serializer writes valid UTF-8 and the escaping only adds ASCII.
    String::from_utf8(out).unwrap_or_default()
}

/// The messages of an archived segment.
pub fn parse_segment(text: &str) -> Result<Vec<Message>, crate::history::HistoryError> {
    crate::history::parse_jsonl(text)
}

struct EscapeLt;

impl serde_json::ser::Formatter for EscapeLt {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some(pos) = rest.find('<') {
            writer.write_all(&rest.as_bytes()[..pos])?;
            writer.write_all(b"\\u003c")?;
            rest = &rest[pos + 1..];
        }
        writer.write_all(rest.as_bytes())
    }
}

/// Every archive key a history refers to: markers in content and reasoning, and the keys in
/// each message's `meta.archived`.
pub fn referenced_keys(messages: &[Message]) -> Vec<Key> {
    let mut out: Vec<Key> = Vec::new();
    for m in messages {
        let mut push = |k: Key| {
            if !out.contains(&k) {
                out.push(k);
            }
        };
        extract_markers(&m.content).into_iter().for_each(&mut push);
        if let Some(r) = &m.reasoning {
            extract_markers(r).into_iter().for_each(&mut push);
        }
        m.meta
            .archived
            .iter()
            .filter_map(|k| Key::parse(k))
            .for_each(&mut push);
    }
    out
}

/// Adds `key` to a message's archived list once.
pub fn note_archived(m: &mut Message, key: &Key) {
    let k = key.as_str();
    if !m.meta.archived.iter().any(|a| a == k) {
        m.meta.archived.push(k.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::MemoryStore;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A store whose writes take a while, recording how many overlap and what was written.
    struct SlowStore {
        bound: usize,
        now: AtomicUsize,
        peak: AtomicUsize,
        written: Mutex<Vec<Key>>,
        fail: Option<Key>,
    }

    impl SlowStore {
        fn new(bound: usize, fail: Option<Key>) -> Self {
            Self {
                bound,
                now: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                written: Mutex::new(Vec::new()),
                fail,
            }
        }
    }

    #[async_trait::async_trait]
    impl Store for SlowStore {
        async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            if Some(original.key()) == self.fail {
                return Err(ArchiveError::Unavailable("refused".into()));
            }
            self.written.lock().expect("lock").push(original.key());
            Ok(())
        }
        async fn fetch(&self, _: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
            Ok(None)
        }
        fn in_flight(&self) -> usize {
            self.bound
        }
    }

    #[tokio::test]
    async fn a_batch_is_written_concurrently_within_the_bound_and_each_key_once() {
        let texts: Vec<String> = (0..40).map(|i| format!("original {}", i % 25)).collect();
        let originals: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
        let store = SlowStore::new(6, None);
        let keys = archive_all(&store, &originals).await.expect("stored");
        assert_eq!(keys.len(), 40);
        for (k, t) in keys.iter().zip(&texts) {
            assert_eq!(*k, Key::of(t.as_bytes()));
        }
        let written = store.written.lock().expect("lock").clone();
        assert_eq!(written.len(), 25, "repeated content is written once");
        assert_eq!(distinct(&written).len(), 25);
        let peak = store.peak.load(Ordering::SeqCst);
        assert!(peak > 1 && peak <= 6, "peak in flight {peak}");
    }

    #[tokio::test]
    async fn one_refused_write_fails_the_whole_batch() {
        let texts: Vec<String> = (0..20).map(|i| format!("original {i}")).collect();
        let originals: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
        let store = SlowStore::new(4, Some(Key::of(texts[13].as_bytes())));
        assert!(matches!(
            archive_all(&store, &originals).await,
            Err(ArchiveError::Unavailable(_))
        ));
    }

    #[tokio::test]
    async fn segment_with_markers_archives_and_round_trips() {
        let k = Key::of(b"x");
        let msgs = vec![
            Message::user(format!("look at {} <b>", k.marker())),
            Message::tool("c1", "a < b"),
        ];
        let text = segment_text(&msgs);
        assert!(!text.contains("<<ccr:"));
        let store = MemoryStore::new();
        let keys = archive_all(&store, &[text.as_bytes()])
            .await
            .expect("stored");
        let back = store.fetch(&keys[0]).await.expect("ok").expect("present");
        let parsed = parse_segment(&String::from_utf8(back).expect("utf8")).expect("parses");
        assert_eq!(parsed, msgs);
    }
}
