//! `recall`: turn whatever the model pasted back into keys, and keys into originals.
//!
//! Models rarely echo a marker exactly. They upper-case it, drop the angle brackets, add
//! spaces, wrap it in back-ticks or quotes, or pass JSON (`{"key": ...}`, `{"markers": [...]}`).
//! All of those are accepted. A bare 16-hex string is accepted only when the whole input is
//! made of keys: inside prose it is far more likely a commit hash or a checksum than a key.
//! Every candidate is normalised and validated as a [`Key`] before it reaches a store, so no
//! path or object name is ever formed from raw input.

use super::{ArchiveError, KEY_LEN, Key, Store};

/// JSON fields whose string (or array of strings) values are keys or markers.
const KEY_FIELDS: [&str; 6] = ["keys", "key", "markers", "marker", "ccr", "id"];

/// Keys in `text`, distinct, in order of first appearance.
pub fn extract_keys(text: &str) -> Vec<Key> {
    let mut found: Vec<(usize, Key)> = Vec::new();
    scan_markers(text, &mut found);
    scan_json_fields(text, &mut found);
    if found.is_empty() {
        scan_bare_keys(text, &mut found);
    }
    found.sort_by_key(|(pos, _)| *pos);
    let mut out: Vec<Key> = Vec::new();
    for (_, key) in found {
        if !out.contains(&key) {
            out.push(key);
        }
    }
    out
}

/// `ccr` `:` 16 hex, case-insensitive, with spaces allowed around the colon and between hex
/// digits; whatever wraps it (`<<`, `<`, back-ticks, quotes) does not matter.
fn scan_markers(text: &str, out: &mut Vec<(usize, Key)>) {
    let b = text.as_bytes();
    let mut i = 0;
    while i + 3 <= b.len() {
        if !b[i..i + 3].eq_ignore_ascii_case(b"ccr") || (i > 0 && is_word(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut j = skip_spaces(b, i + 3);
        if b.get(j) != Some(&b':') {
            i += 1;
            continue;
        }
        j = skip_spaces(b, j + 1);
        if let Some(key) = hex_run(b, j) {
            out.push((i, key));
        }
        i += 1;
    }
}

/// 16 hex digits starting at `start`, single spaces allowed between them, not followed by
/// another word character.
fn hex_run(b: &[u8], start: usize) -> Option<Key> {
    let mut hex = [0u8; KEY_LEN];
    let mut n = 0;
    let mut j = start;
    while n < KEY_LEN {
        match b.get(j) {
            Some(c) if c.is_ascii_hexdigit() => {
                hex[n] = c.to_ascii_lowercase();
                n += 1;
                j += 1;
            }
            Some(b' ') if n > 0 && b.get(j + 1).is_some_and(u8::is_ascii_hexdigit) => j += 1,
            _ => return None,
        }
    }
    if b.get(j).is_some_and(|c| is_word(*c)) {
        return None;
    }
    Key::parse(std::str::from_utf8(&hex).ok()?)
}

/// `"field": "value"` and `"field": ["v1", "v2"]` for the key-carrying fields, anywhere in
/// the text (whole JSON documents and JSON embedded in prose alike). Single quotes are
/// accepted too, as in a Python dict.
fn scan_json_fields(text: &str, out: &mut Vec<(usize, Key)>) {
    let b = text.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c != b'"' && c != b'\'' {
            continue;
        }
        let Some(field) = KEY_FIELDS.iter().find(|f| {
            b.get(i + 1..i + 1 + f.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(f.as_bytes()))
                && b.get(i + 1 + f.len()) == Some(&c)
        }) else {
            continue;
        };
        let mut j = skip_ws(b, i + 2 + field.len());
        if b.get(j) != Some(&b':') {
            continue;
        }
        j = skip_ws(b, j + 1);
        match b.get(j) {
            Some(b'[') => {
                j += 1;
                loop {
                    j = skip_ws(b, j);
                    let Some((value, end)) = quoted(text, j) else {
                        break;
                    };
                    if let Some(key) = normalise_candidate(value) {
                        out.push((i, key));
                    }
                    j = skip_ws(b, end);
                    if b.get(j) == Some(&b',') {
                        j += 1;
                    } else {
                        break;
                    }
                }
            }
            _ => {
                if let Some((value, _)) = quoted(text, j)
                    && let Some(key) = normalise_candidate(value)
                {
                    out.push((i, key));
                }
            }
        }
    }
}

/// The contents of a quoted string starting at `start`, and the index after its closing quote.
fn quoted(text: &str, start: usize) -> Option<(&str, usize)> {
    let b = text.as_bytes();
    let q = *b.get(start)?;
    if q != b'"' && q != b'\'' {
        return None;
    }
    // Keys and markers never contain escapes or quotes, and values longer than a spaced-out
    // marker cannot be one.
    let rest = text.get(start + 1..)?;
    let len = rest.bytes().take(64).position(|c| c == q)?;
    Some((&rest[..len], start + 2 + len))
}

/// The whole input is nothing but keys (bare or marker-like), separated by whitespace,
/// commas or semicolons and optionally wrapped in quotes, back-ticks or brackets.
fn scan_bare_keys(text: &str, out: &mut Vec<(usize, Key)>) {
    let mut keys = Vec::new();
    let mut offset = 0;
    for token in text.split(|c: char| c.is_whitespace() || c == ',' || c == ';') {
        let pos = offset;
        offset += token.len() + 1;
        let token = token.trim_matches(|c: char| "`'\"[](){}<>".contains(c));
        if token.is_empty() || token.chars().all(|c| c == '`') {
            continue;
        }
        match normalise_candidate(token) {
            Some(key) => keys.push((pos, key)),
            None => return,
        }
    }
    out.extend(keys);
}

/// A single value that should be a key: wrappers, spaces and a `ccr:` prefix are removed,
/// hex is lower-cased, then the result must be exactly a key.
fn normalise_candidate(value: &str) -> Option<Key> {
    let compact: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    let mut s = compact.trim_matches(|c: char| "`'\"<>[]()".contains(c));
    if let Some(prefix) = s.get(..4)
        && prefix.eq_ignore_ascii_case("ccr:")
    {
        s = &s[4..];
    }
    if s.len() != KEY_LEN || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    Key::parse(&s.to_ascii_lowercase())
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn skip_spaces(b: &[u8], mut j: usize) -> usize {
    while b.get(j).is_some_and(|c| *c == b' ' || *c == b'\t') {
        j += 1;
    }
    j
}

fn skip_ws(b: &[u8], mut j: usize) -> usize {
    while b.get(j).is_some_and(u8::is_ascii_whitespace) {
        j += 1;
    }
    j
}

/// Why nothing could be recalled.
#[derive(Debug, thiserror::Error)]
pub enum RecallError {
    #[error("no ccr key found; pass a marker like <<ccr:0123456789abcdef>> or its 16-hex key")]
    NoKey,
    #[error(transparent)]
    Store(#[from] ArchiveError),
}

impl RecallError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoKey => "no_key",
            Self::Store(e) => e.label(),
        }
    }
}

/// The answer to a recall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recalled {
    /// One key found: the original, byte-identical. Otherwise labelled sections.
    pub output: Vec<u8>,
    pub found: Vec<Key>,
    pub missing: Vec<Key>,
}

/// Resolves every key in `text` against `store` (which only sees this session's archive).
pub async fn recall(store: &dyn Store, text: &str) -> Result<Recalled, RecallError> {
    let keys = extract_keys(text);
    match keys.as_slice() {
        [] => Err(RecallError::NoKey),
        [key] => Ok(match store.fetch(key).await? {
            Some(bytes) => Recalled {
                output: bytes,
                found: vec![*key],
                missing: vec![],
            },
            None => Recalled {
                output: miss_label(key).into_bytes(),
                found: vec![],
                missing: vec![*key],
            },
        }),
        keys => {
            let mut out = Recalled {
                output: Vec::new(),
                found: vec![],
                missing: vec![],
            };
            // Independent reads: fetched concurrently, reported in the order asked.
            let fetched = store.fetch_many(keys).await;
            for (key, answer) in keys.iter().zip(fetched) {
                match answer {
                    Ok(Some(bytes)) => {
                        out.output.extend_from_slice(
                            format!("=== {} ({} bytes) ===\n", key.marker(), bytes.len())
                                .as_bytes(),
                        );
                        out.output.extend_from_slice(&bytes);
                        if !bytes.ends_with(b"\n") {
                            out.output.push(b'\n');
                        }
                        out.found.push(*key);
                    }
                    Ok(None) => {
                        out.output.extend_from_slice(miss_label(key).as_bytes());
                        out.missing.push(*key);
                    }
                    Err(e) => {
                        out.output.extend_from_slice(
                            format!("=== {} could not be read: {e} ===\n", key.marker()).as_bytes(),
                        );
                        out.missing.push(*key);
                    }
                }
            }
            Ok(out)
        }
    }
}

fn miss_label(key: &Key) -> String {
    format!(
        "=== {} not found in this session's archive ===\n",
        key.marker()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::MemoryStore;

    const K: &str = "0123456789abcdef";
    const K2: &str = "fedcba9876543210";

    fn key(s: &str) -> Key {
        Key::parse(s).expect("valid key")
    }

    #[test]
    fn every_paste_back_form_is_accepted() {
        let forms = [
            format!("<<ccr:{K}>>"),
            K.to_string(),
            format!("ccr:{K}"),
            format!("<ccr:{K}>"),
            format!("<<CCR:{}>>", K.to_uppercase()),
            K.to_uppercase(),
            format!("<< ccr: {K} >>"),
            "<<ccr: 0123 4567 89ab cdef>>".to_string(),
            format!("`{K}`"),
            format!("\"{K}\""),
            format!("'<<ccr:{K}>>'"),
            format!("```\n<<ccr:{K}>>\n```"),
            format!(r#"{{"key": "{K}"}}"#),
            format!(r#"{{"marker":"<<ccr:{K}>>"}}"#),
            format!(r#"{{"ccr": "{K}"}}"#),
            format!(r#"{{"id": "ccr:{K}"}}"#),
            format!(r#"{{"keys": ["{K}"]}}"#),
            format!(r#"{{'key': '{K}'}}"#),
            format!("Please bring back the log in <<ccr:{K}>>, I need the stack trace."),
            format!("recall ccr:{} please", K.to_uppercase()),
        ];
        // Multi-byte characters where a prefix would be cut never split a character.
        for text in ["€€€€€€€€", "ab€cd", r#"{"key": "ab€"}"#, "ccr€:"] {
            assert!(extract_keys(text).is_empty(), "{text}");
        }
        for form in forms {
            assert_eq!(extract_keys(&form), vec![key(K)], "{form}");
        }
    }

    #[test]
    fn several_keys_in_order_distinct() {
        let forms = [
            format!("{K} {K2} {K}"),
            format!("{K}, {K2}"),
            format!(r#"{{"markers": ["<<ccr:{K}>>", "<<ccr:{K2}>>"]}}"#),
            format!(r#"{{"keys":["{K}","{K2}"]}}"#),
            format!("first <<ccr:{K}>> then ccr:{K2} and again <<ccr:{K}>>"),
        ];
        for form in forms {
            assert_eq!(extract_keys(&form), vec![key(K), key(K2)], "{form}");
        }
    }

    #[test]
    fn bare_hex_inside_prose_is_not_a_key() {
        for text in [
            format!("commit {K} broke the build"),
            format!("sha {K}0000 is longer"),
            format!("ccr:{K}0 has seventeen digits"),
            format!("xccr:{K}"),
            "ccr:0123456789abcdeg".to_string(),
            format!(r#"{{"name": "{K}"}}"#),
            String::new(),
            "no keys here".to_string(),
        ] {
            assert!(extract_keys(&text).is_empty(), "{text}");
        }
    }

    #[tokio::test]
    async fn one_key_is_byte_identical_several_are_labelled_with_misses_in_place() {
        let store = MemoryStore::new();
        let a = store.archive(b"\xff\xfe raw").await.expect("a");
        let b = store.archive(b"second\n").await.expect("b");
        let one = recall(&store, &a.to_string().to_uppercase())
            .await
            .expect("one");
        assert_eq!(one.output, b"\xff\xfe raw");
        let missing = key(K);
        let text = format!("{} {} {}", a.marker(), missing.marker(), b.marker());
        let many = recall(&store, &text).await.expect("many");
        assert_eq!(many.found, vec![a, b]);
        assert_eq!(many.missing, vec![missing]);
        let mut expected = format!("=== {} (6 bytes) ===\n", a.marker()).into_bytes();
        expected.extend_from_slice(b"\xff\xfe raw\n");
        expected.extend_from_slice(
            format!(
                "=== {} not found in this session's archive ===\n=== {} (7 bytes) ===\nsecond\n",
                missing.marker(),
                b.marker()
            )
            .as_bytes(),
        );
        assert_eq!(many.output, expected);
        assert!(matches!(
            recall(&store, "nothing").await,
            Err(RecallError::NoKey)
        ));
    }
}
