//! JSON: long arrays keep their first and last items and the first error records of the
//! middle; a sentinel string item in place of each run of dropped items says how many went
//! and carries the marker. Everything else — keys, key order, formatting, numbers as written
//! — is reproduced from the input text, so the output is still valid JSON that reads like
//! the original.
//!
//! An error record is an object with a member (key in any case) that says it failed:
//! - `error`, `errors`, `err`, `exception`, `failure` or `failures` holding something (not
//!   `null`, `false`, `0`, `""`, `{}` or `[]`: a test reporter's `"err": {}` is a pass);
//! - `status`, `state`, `result`, `outcome`, `conclusion` or `phase` holding `failed`,
//!   `failure`, `fail`, `error` or `errored`, or an object that is itself an error record
//!   (`"status": {"phase": "Failed"}`);
//! - `level`, `severity` or `levelname` holding `error`, `fatal`, `critical` or `panic`.
//!
//! A small scanner instead of `serde_json::Value`: a `Value` would reorder keys and reformat
//! numbers, and building one for a multi-megabyte document costs more than this single pass.

use super::profile::Limits;

/// Nesting beyond this is refused rather than recursed into.
const MAX_DEPTH: usize = 128;

/// Keys whose value, when it holds anything, is an error (lowercase).
const ERROR_KEYS: [&str; 6] = ["error", "errors", "err", "exception", "failure", "failures"];
/// Values that hold nothing, whitespace removed.
const EMPTY_VALUES: [&str; 6] = ["null", "false", "0", "\"\"", "{}", "[]"];
/// Keys whose value says how something ended (lowercase).
const STATUS_KEYS: [&str; 6] = [
    "status",
    "state",
    "result",
    "outcome",
    "conclusion",
    "phase",
];
const FAILED_STATUSES: [&str; 5] = ["failed", "failure", "fail", "error", "errored"];
/// Keys whose value is a log record's level (lowercase).
const LEVEL_KEYS: [&str; 3] = ["level", "severity", "levelname"];
const ERROR_LEVELS: [&str; 4] = ["error", "fatal", "critical", "panic"];

/// Whether a scanned value is an error record (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Record {
    Error,
    Other,
}

/// The record a member makes its object, from the key's text (without quotes), the value's
/// text as written and the record the value is.
fn member_record(key: &str, value: &str, nested: Record) -> Record {
    let is = |keys: &[&str]| keys.iter().any(|k| key.eq_ignore_ascii_case(k));
    let string_among = |words: &[&str]| {
        value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .is_some_and(|v| words.iter().any(|w| v.eq_ignore_ascii_case(w)))
    };
    let holds_something = || {
        value.len() > 8 || {
            let squeezed: String = value.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            !EMPTY_VALUES.contains(&squeezed.as_str())
        }
    };
    let failed = (is(&ERROR_KEYS) && holds_something())
        || (is(&STATUS_KEYS) && (string_among(&FAILED_STATUSES) || nested == Record::Error))
        || (is(&LEVEL_KEYS) && string_among(&ERROR_LEVELS));
    if failed { Record::Error } else { Record::Other }
}

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
            errors: limits.json_errors,
            marker,
        }),
    );
    s.document().ok()?;
    s.dropped.then_some(s.out)
}

struct Shrink<'m> {
    head: usize,
    tail: usize,
    errors: usize,
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

    fn value(&mut self, depth: usize) -> Result<Record, ScanError> {
        if depth > MAX_DEPTH {
            return Err(ScanError::Syntax);
        }
        match self.peek()? {
            b'{' => return self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string(),
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'n' => self.literal("null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(ScanError::Syntax),
        }?;
        Ok(Record::Other)
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

    fn object(&mut self, depth: usize) -> Result<Record, ScanError> {
        let start = self.pos;
        self.pos += 1;
        self.copy_from(start);
        self.ws();
        if self.peek()? == b'}' {
            self.pos += 1;
            self.copy_from(self.pos - 1);
            return Ok(Record::Other);
        }
        let mut record = Record::Other;
        loop {
            if self.peek()? != b'"' {
                return Err(ScanError::Syntax);
            }
            let key_start = self.pos;
            self.string()?;
            let key_end = self.pos;
            self.ws();
            if self.peek()? != b':' {
                return Err(ScanError::Syntax);
            }
            self.pos += 1;
            self.copy_from(self.pos - 1);
            self.ws();
            let value_start = self.pos;
            let nested = self.value(depth + 1)?;
            if member_record(
                &self.text[key_start + 1..key_end - 1],
                &self.text[value_start..self.pos],
                nested,
            ) == Record::Error
            {
                record = Record::Error;
            }
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
                    return Ok(record);
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
        // Each item's start and end in the output and its record, to cut the middle out
        // afterwards.
        let mut items: Vec<Item> = Vec::new();
        loop {
            let start = self.out.len();
            let record = self.value(depth + 1)?;
            items.push(Item {
                start,
                end: self.out.len(),
                record,
            });
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

    /// Replaces the middle items but the first error records (and the separators between
    /// them) by one sentinel item per run of dropped items.
    fn cut_middle(&mut self, items: &[Item]) {
        let Some(shrink) = &self.shrink else { return };
        let (head, tail) = (shrink.head.max(1), shrink.tail.max(1));
        if items.len() <= head + tail + 1 {
            return;
        }
        let middle = head..items.len() - tail;
        let kept: Vec<usize> = middle
            .clone()
            .filter(|&i| items[i].record == Record::Error)
            .take(shrink.errors)
            .collect();
        if kept.len() == middle.len() {
            return;
        }
        let sentinel = |omitted: usize| {
            format!(
                "\"[... {omitted} items omitted; full original: {}]\"",
                shrink.marker
            )
        };
        let out = &self.out;
        let mut shrunk = out[..items[head].start].to_owned();
        let mut i = middle.start;
        while i < middle.end {
            // The last item this piece stands for.
            let last = if kept.contains(&i) {
                shrunk.push_str(&out[items[i].start..items[i].end]);
                i
            } else {
                let run_end = kept.iter().copied().find(|&k| k > i).unwrap_or(middle.end);
                shrunk.push_str(&sentinel(run_end - i));
                run_end - 1
            };
            i = last + 1;
            if i < middle.end {
                shrunk.push_str(&out[items[last].end..items[i].start]);
            }
        }
        shrunk.push_str(&out[items[middle.end - 1].end..]);
        self.out = shrunk;
        self.dropped = true;
    }
}

/// One item of an array as scanned: where it is in the output, and whether it is an error
/// record.
struct Item {
    start: usize,
    end: usize,
    record: Record,
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

    /// mocha 10.8.2's `--reporter json` on a spec of 25 JSON round trips of numbers, the
    /// thirteenth (`NaN`) failing: its `tests` array holds every test in order, each pass
    /// with `"err": {}`, the failure with the assertion error.
    const MOCHA_REPORT: &str = include_str!("../../tests/data/mocha-json-reporter.json");

    #[test]
    fn an_error_record_in_the_middle_of_an_array_is_kept() {
        let out =
            compress(MOCHA_REPORT, &Limits::of(CompressionProfile::Default), M).expect("dropped");
        let report: serde_json::Value = serde_json::from_str(MOCHA_REPORT).expect("JSON");
        let v: serde_json::Value = serde_json::from_str(&out).expect("still JSON");
        let titles = |key: &str| -> Vec<String> {
            v[key]
                .as_array()
                .expect("array")
                .iter()
                .map(|t| {
                    t["title"]
                        .as_str()
                        .map_or_else(|| t.to_string(), String::from)
                })
                .collect()
        };
        let omitted = |n: usize| format!("\"[... {n} items omitted; full original: {M}]\"");
        assert_eq!(
            titles("tests"),
            [
                "keeps 0",
                "keeps 1.5",
                "keeps 3",
                "keeps 4.5",
                "keeps 6",
                &omitted(7),
                "keeps NaN",
                &omitted(9),
                "keeps 31.5",
                "keeps 33",
                "keeps 34.5",
            ]
        );
        assert_eq!(v["tests"][6], report["tests"][12], "the failure whole");
        assert!(
            v["tests"][6]["err"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("NaN"))
        );
        // Every pass says `"err": {}`: no error record, one run dropped.
        assert_eq!(titles("passes").len(), 5 + 1 + 3);
        assert_eq!(v["failures"], report["failures"]);
    }

    #[test]
    fn what_makes_an_error_record() {
        let record = |doc: &str| {
            let mut s = Scanner::new(doc, None);
            let r = s.value(0).expect("JSON");
            r == Record::Error
        };
        for failed in [
            r#"{"err": {"message": "boom"}}"#,
            r#"{"Error": "ENOENT"}"#,
            r#"{"errors": [{"code": 1}]}"#,
            r#"{"status": "FAILED"}"#,
            r#"{"metadata": {}, "status": {"phase": "Failed"}}"#,
            r#"{"conclusion": "failure"}"#,
            r#"{"level": "error", "msg": "x"}"#,
            r#"{"severity": "CRITICAL"}"#,
        ] {
            assert!(record(failed), "{failed}");
        }
        for other in [
            r#"{"err": {}}"#,
            r#"{"error": null, "errors": [ ]}"#,
            r#"{"failures": 0}"#,
            r#"{"status": "passed"}"#,
            r#"{"level": "info", "msg": "error"}"#,
            r#"{"spec": {"status": "failed"}}"#,
            r#"["error"]"#,
            r#""error""#,
        ] {
            assert!(!record(other), "{other}");
        }
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
