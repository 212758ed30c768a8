//! Where a piece of text went: `kubectl cairn context --why TEXT` (`GET
//! /v1/session/context?why=TEXT`).
//!
//! The text is looked up in what the history sends (content, reasoning, tool-call
//! arguments), then in the archived originals its `<<ccr:KEY>>` markers name, following
//! markers inside those originals too, up to [`MAX_DEPTH`] reads deep. Each place says how
//! to get there:
//!
//! - `kept`: a message the history still sends;
//! - `summary`: a level-2 summary or session memory (with the number and heading of the
//!   summary's section the text stands in), or a level-3 notice; `markers` are the stand-in's
//!   own, whose recall gives what it replaced;
//! - `ledger`: the ledger section of such a stand-in (a file, command, error or request);
//! - `archived`: an archived original; `recall` of its `marker` returns it, and `via` lists
//!   the markers followed from the history to reach it, outermost first.
//!
//! Found nowhere means neither the history nor anything its markers reach holds the text:
//! the text never entered the session (or was cut before it was journaled), since every
//! byte a compaction removes is archived before a marker names it.
//!
//! The search is case-sensitive and literal. An archived segment (JSON Lines, see
//! [`crate::compact::archive::segment_text`]) is searched as the messages it holds, so
//! escaped text is found as the model would recall it.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::ccr::{Key, Store, extract_markers};
use crate::compact::archive::parse_segment;
use crate::compact::ledger;
use crate::compact::summarize::SECTIONS;
use crate::history::Message;

/// Archived originals read from the history down (each compaction that replaces an earlier
/// stand-in adds one).
pub const MAX_DEPTH: usize = 8;
/// Places reported at most; a text found more often says so in `truncated`.
pub const MAX_PLACES: usize = 64;

/// One place the text is.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "where", rename_all = "camelCase")]
pub enum Place {
    #[serde(rename_all = "camelCase")]
    Kept {
        /// Index in the history.
        message: usize,
        role: &'static str,
    },
    #[serde(rename_all = "camelCase")]
    Summary {
        message: usize,
        /// The summary's section (1-9) the text is under, with its heading; none in a
        /// level-3 notice or before the first heading.
        #[serde(skip_serializing_if = "Option::is_none")]
        section: Option<u8>,
        #[serde(skip_serializing_if = "Option::is_none")]
        heading: Option<&'static str>,
        /// The stand-in's markers: recall gives what it replaced.
        markers: Vec<String>,
    },
    #[serde(rename_all = "camelCase")]
    Ledger {
        message: usize,
        markers: Vec<String>,
    },
    #[serde(rename_all = "camelCase")]
    Archived {
        /// `<<ccr:KEY>>`: `recall` returns the original.
        marker: String,
        /// Markers followed from the history to this original, outermost first (the last
        /// is `marker` itself).
        via: Vec<String>,
        /// When the original is a segment of messages: the index of the message in it.
        #[serde(skip_serializing_if = "Option::is_none")]
        segment_message: Option<usize>,
    },
}

/// The answer to `--why TEXT`.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    pub text: String,
    pub places: Vec<Place>,
    /// More places than [`MAX_PLACES`] hold the text.
    pub truncated: bool,
    /// Markers the archive did not answer for (not stored, or a read that failed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// Where `text` is in `history` and in the archived originals its markers reach.
pub async fn why(history: &[Message], text: &str, store: &dyn Store) -> Why {
    let mut out = Why {
        text: text.to_owned(),
        places: Vec::new(),
        truncated: false,
        unreadable: Vec::new(),
    };
    let mut next: Vec<(Key, Vec<Key>)> = Vec::new();
    for (i, m) in history.iter().enumerate() {
        if let Some(place) = in_message(i, m, text) {
            out.push(place);
        }
        next.extend(markers_of(m).into_iter().map(|k| (k, vec![k])));
    }
    let mut read: BTreeSet<Key> = BTreeSet::new();
    for _ in 0..MAX_DEPTH {
        let level: Vec<(Key, Vec<Key>)> = std::mem::take(&mut next)
            .into_iter()
            .filter(|(k, _)| read.insert(*k))
            .collect();
        if level.is_empty() {
            break;
        }
        let keys: Vec<Key> = level.iter().map(|(k, _)| *k).collect();
        for ((key, via), got) in level.into_iter().zip(store.fetch_many(&keys).await) {
            let Ok(Some(bytes)) = got else {
                out.unreadable.push(key.marker());
                continue;
            };
            let original = String::from_utf8_lossy(&bytes);
            let (found, inner) = in_original(&original, text);
            if let Some(segment_message) = found {
                out.push(Place::Archived {
                    marker: key.marker(),
                    via: via.iter().map(Key::marker).collect(),
                    segment_message,
                });
            }
            for k in inner {
                let mut path = via.clone();
                path.push(k);
                next.push((k, path));
            }
        }
    }
    out
}

impl Why {
    fn push(&mut self, place: Place) {
        if self.places.len() < MAX_PLACES {
            self.places.push(place);
        } else {
            self.truncated = true;
        }
    }
}

fn markers_of(m: &Message) -> Vec<Key> {
    let mut out: Vec<Key> = Vec::new();
    for t in m.sent_texts() {
        for k in extract_markers(t) {
            if !out.contains(&k) {
                out.push(k);
            }
        }
    }
    out
}

/// Where in message `i` the text is, if it is.
fn in_message(i: usize, m: &Message, text: &str) -> Option<Place> {
    if !m.meta.is_summary {
        return m
            .sent_texts()
            .any(|t| t.contains(text))
            .then_some(Place::Kept {
                message: i,
                role: m.role.as_str(),
            });
    }
    let markers = || markers_of(m).iter().map(Key::marker).collect();
    let own = ledger::without_section(&m.content);
    if let Some(at) = own.find(text) {
        let section = section_at(own, at);
        return Some(Place::Summary {
            message: i,
            section: section.map(|(n, _)| n),
            heading: section.map(|(_, h)| h),
            markers: markers(),
        });
    }
    let section = &m.content[own.len()..];
    let in_ledger = !section.is_empty()
        && (section.contains(text) || section.contains(ledger::one_line(text).as_ref()));
    in_ledger.then(|| Place::Ledger {
        message: i,
        markers: markers(),
    })
}

/// The summary section (number, heading) whose heading comes last before byte `at`.
fn section_at(summary: &str, at: usize) -> Option<(u8, &'static str)> {
    let before = summary[..at].to_lowercase();
    SECTIONS
        .iter()
        .enumerate()
        .filter_map(|(n, h)| before.rfind(&h.to_lowercase()).map(|pos| (pos, n, *h)))
        .max_by_key(|(pos, _, _)| *pos)
        .and_then(|(_, n, h)| u8::try_from(n + 1).ok().map(|n| (n, h)))
}

/// Whether an original holds the text (`Some(Some(i))`: message `i` of a segment,
/// `Some(None)`: the original as a whole), and the markers inside it.
fn in_original(original: &str, text: &str) -> (Option<Option<usize>>, Vec<Key>) {
    if original.starts_with('{')
        && let Ok(messages) = parse_segment(original)
        && !messages.is_empty()
    {
        let found = messages
            .iter()
            .position(|m| m.sent_texts().any(|t| t.contains(text)))
            .map(Some);
        let mut inner: Vec<Key> = Vec::new();
        for m in &messages {
            for k in markers_of(m) {
                if !inner.contains(&k) {
                    inner.push(k);
                }
            }
        }
        return (found, inner);
    }
    let found = original.contains(text).then_some(None);
    (found, extract_markers(original))
}

/// The answer (its JSON) as lines for a person: `kubectl cairn context --why` prints it.
pub fn describe(answer: &serde_json::Value) -> String {
    use serde_json::Value;
    use std::fmt::Write as _;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let list = |v: &Value, k: &str| -> Vec<String> {
        v.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect()
    };
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
    let mut out = String::new();
    let places = answer
        .get("places")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let needle = text(answer, "text");
    if places.is_empty() {
        let _ = writeln!(
            out,
            "{needle:?}: nowhere: neither the history nor anything its markers recall holds it"
        );
    } else {
        let _ = writeln!(out, "{needle:?}:");
    }
    for p in &places {
        let message = num(p, "message").unwrap_or(0);
        let recall = |markers: Vec<String>| match markers.first() {
            Some(m) => format!("; recall {m} for what it replaced"),
            None => String::new(),
        };
        let line = match p.get("where").and_then(Value::as_str) {
            Some("kept") => format!("kept: message {message} ({})", text(p, "role")),
            Some("summary") => {
                match (num(p, "section"), p.get("heading").and_then(Value::as_str)) {
                    (Some(n), Some(h)) => format!(
                        "summarized: message {message}, section {n} ({h}){}",
                        recall(list(p, "markers"))
                    ),
                    _ => format!(
                        "in the compaction notice or summary of message {message}{}",
                        recall(list(p, "markers"))
                    ),
                }
            }
            Some("ledger") => format!(
                "in the ledger of message {message}{}",
                recall(list(p, "markers"))
            ),
            Some("archived") => {
                let via = list(p, "via");
                let inside = match num(p, "segmentMessage") {
                    Some(i) => format!(" (message {i} of the segment)"),
                    None => String::new(),
                };
                format!(
                    "archived under {}{inside}: recall it; reached through {}",
                    text(p, "marker"),
                    via.join(" -> ")
                )
            }
            _ => continue,
        };
        let _ = writeln!(out, "  {line}");
    }
    if answer.get("truncated").and_then(Value::as_bool) == Some(true) {
        let _ = writeln!(
            out,
            "  (more places than {MAX_PLACES}: the first are shown)"
        );
    }
    for m in list(answer, "unreadable") {
        let _ = writeln!(out, "  the archive did not answer for {m}");
    }
    out
}
