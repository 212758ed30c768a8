//! The escaped JSON of a request body's long texts, kept from one request to the next.
//!
//! A turn resends the whole conversation, and almost all of it is the same text as last
//! time: messages are not edited once they are in the history (compaction replaces them).
//! Escaping that text for JSON is most of the cost of building a multi-megabyte body, so
//! each provider client keeps, per text of at least [`CACHED_MIN`] bytes, the escaped
//! string it produced, found again by a keyed 128-bit hash of the text and its length.
//!
//! - The bytes are exactly what `serde_json` writes for the text (the cache stores
//!   `serde_json`'s own output), so a body serializes identically with or without it.
//! - After each body, the entries that body did not use are dropped: the cache holds at
//!   most one body's long texts, so it is bounded by the largest request the session sends.
//! - The hash is seeded per client from the process's random state, so a text cannot be
//!   crafted to collide with another.
//!
//! Body types opt their text fields in with `#[serde(serialize_with = "wire_cache::text")]`
//! (or [`opt_text`]); outside [`WireCache::to_vec`] those fields serialize as plain strings.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};

use serde::ser::{Error as _, Serialize, Serializer};
use serde_json::value::RawValue;
use xxhash_rust::xxh3::xxh3_128_with_seed;

/// Texts shorter than this are escaped every time: hashing and looking them up costs about
/// what escaping them does.
pub const CACHED_MIN: usize = 1024;

type Key = (u128, usize);

struct Entry {
    json: Box<RawValue>,
    /// The last body that used this entry.
    body: u64,
}

#[derive(Default)]
struct Entries {
    map: HashMap<Key, Entry>,
    bodies: u64,
    /// Length of the last body: the next one is written into a buffer of about that size,
    /// so it is not copied again and again as it grows.
    last_len: usize,
}

/// The cache while one body is being serialized on this thread.
struct Active {
    seed: u64,
    entries: Entries,
}

thread_local! {
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// The buffer size for the body being serialized: the last body's length and a little more.
fn entries_len_hint() -> usize {
    ACTIVE.with(|a| {
        a.borrow()
            .as_ref()
            .map_or(0, |a| a.entries.last_len + a.entries.last_len / 16 + 256)
    })
}

/// One provider client's cache of escaped texts.
pub struct WireCache {
    seed: u64,
    entries: Mutex<Entries>,
}

impl Default for WireCache {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for WireCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireCache")
            .field("texts", &self.len())
            .finish_non_exhaustive()
    }
}

impl WireCache {
    pub fn new() -> Self {
        Self {
            seed: std::collections::hash_map::RandomState::new().hash_one(0x63_61_69_72_6e_u64),
            entries: Mutex::new(Entries::default()),
        }
    }

    /// Serializes `body` as `serde_json::to_vec` does, reusing the escaped texts of the
    /// previous body and keeping only those this body used.
    pub fn to_vec<T: Serialize + ?Sized>(&self, body: &T) -> serde_json::Result<Vec<u8>> {
        let mut guard = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut entries = std::mem::take(&mut *guard);
        entries.bodies += 1;
        ACTIVE.with(|a| {
            *a.borrow_mut() = Some(Active {
                seed: self.seed,
                entries,
            })
        });
        let mut out = Vec::with_capacity(entries_len_hint());
        let written = serde_json::to_writer(&mut out, body).map(|()| out);
        let mut entries = ACTIVE
            .with(|a| a.borrow_mut().take())
            .map(|a| a.entries)
            .unwrap_or_default();
        let body = entries.bodies;
        entries.map.retain(|_, e| e.body == body);
        if let Ok(out) = &written {
            entries.last_len = out.len();
        }
        *guard = entries;
        written
    }

    /// How many escaped texts the cache holds.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `serialize_with` for a text field of a body: the cached escaped string inside
/// [`WireCache::to_vec`], a plain string otherwise.
pub(crate) fn text<S: Serializer>(text: &&str, s: S) -> Result<S::Ok, S::Error> {
    if text.len() < CACHED_MIN {
        return s.serialize_str(text);
    }
    ACTIVE.with(|active| {
        let mut active = active.borrow_mut();
        let Some(active) = active.as_mut() else {
            return s.serialize_str(text);
        };
        let key = (xxh3_128_with_seed(text.as_bytes(), active.seed), text.len());
        let body = active.entries.bodies;
        let entry = match active.entries.map.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Entry {
                json: serde_json::value::to_raw_value(*text).map_err(S::Error::custom)?,
                body,
            }),
        };
        entry.body = body;
        entry.json.serialize(s)
    })
}

/// [`text`] for an optional field.
pub(crate) fn opt_text<S: Serializer>(value: &Option<&str>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(t) => text(t, s),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Body<'a> {
        #[serde(serialize_with = "super::text")]
        a: &'a str,
        #[serde(serialize_with = "super::opt_text")]
        b: Option<&'a str>,
        parts: Vec<Part<'a>>,
    }

    #[derive(serde::Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Part<'a> {
        Text {
            #[serde(serialize_with = "super::text")]
            text: &'a str,
        },
    }

    fn long(seed: &str) -> String {
        format!(
            "{seed} \"quoted\"\n\ttab \\ back \u{1} ctl é ✓ {}",
            "x".repeat(2000)
        )
    }

    #[test]
    fn bodies_are_byte_identical_to_serde_json_and_unused_texts_are_dropped() {
        let cache = WireCache::new();
        let (one, two, three) = (long("one"), long("two"), long("three"));
        let first = Body {
            a: &one,
            b: Some(&two),
            parts: vec![Part::Text { text: &three }, Part::Text { text: "short" }],
        };
        let plain = serde_json::to_vec(&first).unwrap();
        assert_eq!(cache.to_vec(&first).unwrap(), plain);
        assert_eq!(cache.len(), 3, "the short text is not cached");
        // The same body again comes from the cache, byte for byte.
        assert_eq!(cache.to_vec(&first).unwrap(), plain);
        assert_eq!(cache.len(), 3);

        let four = long("four");
        let next = Body {
            a: &one,
            b: None,
            parts: vec![Part::Text { text: &four }],
        };
        assert_eq!(
            cache.to_vec(&next).unwrap(),
            serde_json::to_vec(&next).unwrap()
        );
        assert_eq!(cache.len(), 2, "only the texts of the last body stay");
    }

    #[test]
    fn a_text_that_changed_is_escaped_again() {
        let cache = WireCache::new();
        let mut text = long("a");
        let body = |t: &str| {
            serde_json::to_vec(&Body {
                a: t,
                b: None,
                parts: vec![],
            })
            .unwrap()
        };
        let cached = |t: &str| {
            cache
                .to_vec(&Body {
                    a: t,
                    b: None,
                    parts: vec![],
                })
                .unwrap()
        };
        assert_eq!(cached(&text), body(&text));
        text.replace_range(10..11, "Z");
        assert_eq!(cached(&text), body(&text));
        text.push('!');
        assert_eq!(cached(&text), body(&text));
    }

    #[test]
    fn outside_to_vec_the_fields_are_plain_strings() {
        let one = long("plain");
        let body = Body {
            a: &one,
            b: Some("b"),
            parts: vec![],
        };
        let value = serde_json::to_value(&body).unwrap();
        assert_eq!(value["a"], serde_json::Value::String(one.clone()));
        assert_eq!(value["b"], "b");
    }
}
