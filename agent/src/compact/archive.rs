//! How passes talk to the archive: stage, archive every original, then swap.
//!
//! Whole segments of messages (dropped by levels 2 and 3 or by recovery) are archived as JSON
//! Lines in which every `<` inside a string is written `\u003c`. The text parses back to the
//! exact messages, and it carries no literal `<<ccr:` even when the messages quote markers of
//! earlier archives, so the store's no-nesting rule never refuses a segment.

use std::io;

use serde::Serialize;

use crate::ccr::{Archivable, ArchiveError, Key, Store, extract_markers};
use crate::history::Message;

/// Archives every original and returns its key, one per original, in order. Either all are
/// stored, or the first error is returned and the caller must leave its history untouched.
/// Markers are built from the keys the store returns, after archiving, so each original is
/// hashed once (by the store).
pub async fn archive_all(store: &dyn Store, originals: &[&[u8]]) -> Result<Vec<Key>, ArchiveError> {
    let checked = originals
        .iter()
        .map(|o| Archivable::check(o))
        .collect::<Result<Vec<_>, _>>()?;
    archive_all_checked(store, &checked).await
}

/// [`archive_all`] for originals whose marker check the pass already made.
pub async fn archive_all_checked(
    store: &dyn Store,
    originals: &[Archivable<'_>],
) -> Result<Vec<Key>, ArchiveError> {
    let mut keys: Vec<Key> = Vec::with_capacity(originals.len());
    for original in originals {
        keys.push(store.archive_checked(*original).await?);
    }
    Ok(keys)
}

/// `keys` without repetitions, in order of first appearance (for reports).
pub fn distinct(keys: &[Key]) -> Vec<Key> {
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
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
