//! JSON: long arrays keep their first and last items, and a sentinel string item in between
//! says how many went and carries the marker. Everything else — keys, key order, formatting,
//! numbers as written — is reproduced from the input text, so the output is still valid JSON
//! that reads like the original.
//!
//! A small scanner instead of `serde_json::Value`: a `Value` would reorder keys and reformat
//! numbers, and building one for a multi-megabyte document costs more than this single pass.

use super::profile::Limits;

/// Nesting beyond this is refused rather than recursed into.
const MAX_DEPTH: usize = 128;

/// Why the scanner stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanError {
    /// The input ended inside a value (a truncated sample of a valid document).
    Eof,
    /// Not JSON.
    Syntax,
}

/// True when `sample` (the head of a document) begins like a JSON object or array and has no
/// syntax error before it ends.
pub fn looks_like_json(sample: &str) -> bool {
    let trimmed = sample.trim_start();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return false;
    }
    let mut s = Scanner::new(sample, None);
    match s.document() {
        Ok(()) => true,
        Err(e) => e == ScanError::Eof,
    }
}

pub fn compress(text: &str, limits: &Limits, marker: &str) -> Option<String> {
    let mut s = Scanner::new(
        text,
        Some(Shrink {
            head: limits.json_head,
            tail: limits.json_tail,
            marker,
        }),
    );
    s.document().ok()?;
    s.dropped.then_some(s.out)
}

struct Shrink<'m> {
    head: usize,
    tail: usize,
    marker: &'m str,
}

struct Scanner<'a, 'm> {
    text: &'a str,
    b: &'a [u8],
    pos: usize,
    out: String,
    shrink: Option<Shrink<'m>>,
    dropped: bool,
}

impl<'a, 'm> Scanner<'a, 'm> {
    fn new(text: &'a str, shrink: Option<Shrink<'m>>) -> Self {
        Self {
            text,
            b: text.as_bytes(),
            pos: 0,
            out: String::new(),
            shrink,
            dropped: false,
        }
    }

    fn document(&mut self) -> Result<(), ScanError> {
        self.ws();
        self.value(0)?;
        self.ws();
        if self.pos != self.b.len() {
            return Err(ScanError::Syntax);
        }
        Ok(())
    }

    /// Copies input from `from` to the current position.
    fn copy_from(&mut self, from: usize) {
        if self.shrink.is_some() {
            self.out.push_str(&self.text[from..self.pos]);
        }
    }

    fn ws(&mut self) {
        let start = self.pos;
        while self.b.get(self.pos).is_some_and(u8::is_ascii_whitespace) {
            self.pos += 1;
        }
        self.copy_from(start);
    }

    fn peek(&self) -> Result<u8, ScanError> {
        self.b.get(self.pos).copied().ok_or(ScanError::Eof)
    }

    fn value(&mut self, depth: usize) -> Result<(), ScanError> {
        if depth > MAX_DEPTH {
            return Err(ScanError::Syntax);
        }
        match self.peek()? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string(),
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'n' => self.literal("null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(ScanError::Syntax),
        }
    }

    fn literal(&mut self, word: &str) -> Result<(), ScanError> {
        let start = self.pos;
        let end = (start + word.len()).min(self.b.len());
        if !word.as_bytes().starts_with(&self.b[start..end]) {
            return Err(ScanError::Syntax);
        }
        if end < start + word.len() {
            return Err(ScanError::Eof);
        }
        self.pos = end;
        self.copy_from(start);
        Ok(())
    }

    fn number(&mut self) -> Result<(), ScanError> {
        let start = self.pos;
        while self
            .b
            .get(self.pos)
            .is_some_and(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        {
            self.pos += 1;
        }
        let n = &self.text[start..self.pos];
        if self.pos == self.b.len() {
            self.copy_from(start);
            return Err(ScanError::Eof);
        }
        if n.parse::<f64>().is_err() {
            return Err(ScanError::Syntax);
        }
        self.copy_from(start);
        Ok(())
    }

    fn string(&mut self) -> Result<(), ScanError> {
        let start = self.pos;
        self.pos += 1;
        loop {
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    self.copy_from(start);
                    return Ok(());
                }
                b'\\' => {
                    self.pos += 1;
                    self.peek()?;
                    self.pos += 1;
                }
                c if c < 0x20 => return Err(ScanError::Syntax),
                _ => self.pos += 1,
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<(), ScanError> {
        let start = self.pos;
        self.pos += 1;
        self.copy_from(start);
        self.ws();
        if self.peek()? == b'}' {
            self.pos += 1;
            self.copy_from(self.pos - 1);
            return Ok(());
        }
        loop {
            if self.peek()? != b'"' {
                return Err(ScanError::Syntax);
            }
            self.string()?;
            self.ws();
            if self.peek()? != b':' {
                return Err(ScanError::Syntax);
            }
            self.pos += 1;
            self.copy_from(self.pos - 1);
            self.ws();
            self.value(depth + 1)?;
            self.ws();
            match self.peek()? {
                b',' => {
                    self.pos += 1;
                    self.copy_from(self.pos - 1);
                    self.ws();
                }
                b'}' => {
                    self.pos += 1;
                    self.copy_from(self.pos - 1);
                    return Ok(());
                }
                _ => return Err(ScanError::Syntax),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), ScanError> {
        let start = self.pos;
        self.pos += 1;
        self.copy_from(start);
        self.ws();
        if self.peek()? == b']' {
            self.pos += 1;
            self.copy_from(self.pos - 1);
            return Ok(());
        }
        // Output offsets of each item's start and end, to cut the middle out afterwards.
        let mut items: Vec<(usize, usize)> = Vec::new();
        loop {
            let item_start = self.out.len();
            self.value(depth + 1)?;
            items.push((item_start, self.out.len()));
            self.ws();
            match self.peek()? {
                b',' => {
                    self.pos += 1;
                    self.copy_from(self.pos - 1);
                    self.ws();
                }
                b']' => {
                    self.cut_middle(&items);
                    self.pos += 1;
                    self.copy_from(self.pos - 1);
                    return Ok(());
                }
                _ => return Err(ScanError::Syntax),
            }
        }
    }

    /// Replaces the middle items (and the separators between them) by one sentinel item.
    fn cut_middle(&mut self, items: &[(usize, usize)]) {
        let Some(shrink) = &self.shrink else { return };
        let (head, tail) = (shrink.head.max(1), shrink.tail.max(1));
        if items.len() <= head + tail + 1 {
            return;
        }
        let omitted = items.len() - head - tail;
        let first_cut = items[head].0;
        let last_cut = items[items.len() - tail - 1].1;
        let sentinel = format!(
            "\"[... {omitted} items omitted; full original: {}]\"",
            shrink.marker
        );
        let rest = self.out[last_cut..].to_owned();
        self.out.truncate(first_cut);
        self.out.push_str(&sentinel);
        self.out.push_str(&rest);
        self.dropped = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_crds::policy::CompressionProfile;

    const M: &str = "<<ccr:0123456789abcdef>>";

    #[test]
    fn long_arrays_keep_ends_and_stay_valid_json() {
        let items: Vec<String> = (0..100)
            .map(|i| format!(r#"{{"id": {i}, "z": 1, "a": 2}}"#))
            .collect();
        let doc = format!(
            "{{\"results\": [\n  {}\n], \"total\": 100}}",
            items.join(",\n  ")
        );
        let out = compress(&doc, &Limits::of(CompressionProfile::Default), M).expect("dropped");
        let v: serde_json::Value = serde_json::from_str(&out).expect("still JSON");
        let arr = v["results"].as_array().expect("array");
        assert_eq!(arr.len(), 5 + 1 + 3);
        assert_eq!(arr[0]["id"], 0);
        assert_eq!(arr[8]["id"], 99);
        assert_eq!(
            arr[5],
            format!("[... 92 items omitted; full original: {M}]")
        );
        assert!(
            out.contains(r#"{"id": 0, "z": 1, "a": 2}"#),
            "key order and spacing kept"
        );
        assert!(out.starts_with("{\"results\": [\n  {\"id\": 0"));
    }

    #[test]
    fn short_or_invalid_documents_are_left_alone() {
        let limits = Limits::of(CompressionProfile::Default);
        assert_eq!(compress("[1,2,3]", &limits, M), None);
        assert_eq!(compress("[1,2,", &limits, M), None);
        assert_eq!(compress(&"[".repeat(10_000), &limits, M), None);
    }

    #[test]
    fn detection_accepts_truncated_samples_only_of_json() {
        assert!(looks_like_json("[{\"a\": [1, 2, 3"));
        assert!(looks_like_json("{\"a\": tr"));
        assert!(!looks_like_json("[2026-01-01 10:00:00] INFO started"));
        assert!(!looks_like_json("{ this is not json }"));
        assert!(!looks_like_json("plain"));
    }
}
