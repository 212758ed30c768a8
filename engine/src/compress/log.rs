//! Build, test and command logs: keep the start, the end, every error or failure line with
//! the stack trace or compiler notes that follow it, and collapse runs of identical lines.
//! Everything else — progress, passing tests, download chatter — becomes one note per run.

use super::lines::{self, contains_ci};
use super::profile::Limits;

/// Words that make a line one the reader must see, grouped by their first letter so a line
/// is scanned once whatever the number of words (this runs on every line of multi-megabyte
/// logs).
const ERROR_WORDS: [(u8, &[&str]); 10] = [
    (b'a', &["assertion", "aborted"]),
    (b'c', &["critical"]),
    (b'd', &["denied"]),
    (b'e', &["error", "exception"]),
    (b'f', &["fail", "fatal"]),
    (b'k', &["killed"]),
    (b'p', &["panic"]),
    (b'r', &["refused"]),
    (b's', &["segmentation fault"]),
    (b't', &["traceback", "timed out"]),
];

/// True for a line the log compressor never drops: it contains one of the error words, in
/// any case.
pub fn is_error_line(line: &str) -> bool {
    let b = line.as_bytes();
    (0..b.len()).any(|i| {
        let first = b[i].to_ascii_lowercase();
        let Some((_, words)) = ERROR_WORDS.iter().find(|(c, _)| *c == first) else {
            return false;
        };
        words.iter().any(|w| {
            b.get(i..i + w.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(w.as_bytes()))
        })
    })
}

fn is_warning_line(line: &str) -> bool {
    contains_ci(line, "warn")
}

/// A line that continues a trace: stack frames, `Caused by`, rustc's `-->`/`|` gutter, Python's
/// `File "..."`, indented detail.
fn is_trace_line(line: &str) -> bool {
    let t = lines::content(line);
    let trimmed = t.trim_start();
    !trimmed.is_empty()
        && (t.starts_with([' ', '\t'])
            || trimmed.starts_with("at ")
            || trimmed.starts_with("Caused by")
            || trimmed.starts_with("File \"")
            || trimmed.starts_with("-->")
            || trimmed.starts_with('|')
            || trimmed.starts_with("= ")
            || trimmed.starts_with("note:")
            || trimmed.starts_with("help:")
            || trimmed.starts_with("...")
            || trimmed
                .split_once(':')
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit())))
}

/// Occurrences from which a line template counts as one of the log's dominant ones.
const DOMINANT_MIN: u32 = 8;
/// The most lines kept for matching no dominant template, the rarest first.
const ODD_LINES_MAX: usize = 32;

/// A line's template: its text with every run of digits as one `#`, hashed (no allocation:
/// this runs on every line of multi-megabyte logs).
fn template(line: &str) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    let mut in_digits = false;
    for &b in lines::content(line).as_bytes() {
        if b.is_ascii_digit() {
            if !in_digits {
                h.write_u8(b'#');
            }
            in_digits = true;
        } else {
            h.write_u8(b);
            in_digits = false;
        }
    }
    h.finish()
}

/// Keeps the odd one out: in a log made of a few templates repeated (`line N: compiling
/// crate_N ... ok` three thousand times), a line that matches none of them is what the reader
/// must see, whatever its words. Up to [`ODD_LINES_MAX`] such lines not kept already, the
/// rarest templates first; none when they are a quarter of the log or more (then the log is
/// not one of a few templates, and the odd lines are not odd).
fn keep_odd_lines(all: &[&str], keep: &mut [bool]) {
    let templates: Vec<u64> = all.iter().map(|l| template(l)).collect();
    let mut counts: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
    for t in &templates {
        *counts.entry(*t).or_default() += 1;
    }
    // (occurrences of the line's template, line).
    let mut odd: Vec<(u32, usize)> = (0..all.len())
        .filter(|&i| !lines::content(all[i]).trim().is_empty())
        .map(|i| (counts[&templates[i]], i))
        .filter(|(n, _)| *n < DOMINANT_MIN)
        .collect();
    if odd.len() * 4 >= all.len() {
        return;
    }
    // The rarest first; among equally rare lines, the earliest.
    odd.sort_unstable();
    let fresh = odd.into_iter().filter(|(_, i)| !keep[*i]);
    for (_, i) in fresh.take(ODD_LINES_MAX).collect::<Vec<_>>() {
        keep[i] = true;
    }
}

pub fn compress(text: &str, limits: &Limits, marker: &str) -> Option<String> {
    let all = lines::split(text);
    let mut keep = vec![false; all.len()];
    lines::keep_ends(&mut keep, limits.head_lines, limits.tail_lines);
    let mut i = 0;
    while i < all.len() {
        let important = is_error_line(all[i]) || (limits.keep_warnings && is_warning_line(all[i]));
        if !important {
            i += 1;
            continue;
        }
        keep[i] = true;
        let mut j = i + 1;
        while j < all.len() && j - i <= limits.error_context && is_trace_line(all[j]) {
            keep[j] = true;
            j += 1;
        }
        i = j.max(i + 1);
    }
    keep_odd_lines(&all, &mut keep);
    // A run of identical lines keeps only its first; the first of a run of error lines is an
    // error line itself, so every error text stays present.
    for i in 1..all.len() {
        if lines::content(all[i]) == lines::content(all[i - 1]) {
            keep[i] = false;
        }
    }
    lines::emit(&all, &keep, marker)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_crds::policy::CompressionProfile;

    const M: &str = "<<ccr:0123456789abcdef>>";

    #[test]
    fn keeps_errors_and_their_traces_drops_noise() {
        let mut log = String::new();
        for i in 0..500 {
            log.push_str(&format!("   Compiling crate{i} v0.1.0\n"));
            if i == 250 {
                log.push_str("thread 'main' panicked at src/lib.rs:10:5:\n");
                log.push_str("    0: std::panicking::begin_panic\n");
                log.push_str("    1: app::run\n");
                log.push_str("error[E0308]: mismatched types\n");
                log.push_str("  --> src/main.rs:4:5\n");
            }
        }
        log.push_str("test result: FAILED. 3 passed; 1 failed\n");
        let out = compress(&log, &Limits::of(CompressionProfile::Default), M).expect("dropped");
        for line in [
            "thread 'main' panicked at src/lib.rs:10:5:",
            "    0: std::panicking::begin_panic",
            "    1: app::run",
            "error[E0308]: mismatched types",
            "  --> src/main.rs:4:5",
            "test result: FAILED. 3 passed; 1 failed",
        ] {
            assert!(out.contains(line), "{line}");
        }
        assert!(!out.contains("crate200 "));
        assert!(out.contains(M));
        assert!(out.len() < log.len() / 5);
    }

    #[test]
    fn the_odd_line_among_thousands_of_one_template_is_kept() {
        let mut log = String::new();
        for i in 0..3_000 {
            log.push_str(&format!("line {i}: compiling crate_{i} ... ok\n"));
            if i == 1_500 {
                log.push_str("line 1500: cache key mismatch for crate_1500, rebuilt from source\n");
            }
        }
        let out = compress(&log, &Limits::of(CompressionProfile::Default), M).expect("dropped");
        assert!(
            out.contains("line 1500: cache key mismatch for crate_1500, rebuilt from source\n")
        );
        assert!(!out.contains("line 1400: compiling"));
        assert!(out.len() < log.len() / 20, "{} of {}", out.len(), log.len());
        // A log of many different lines has no odd one out: nothing extra is kept.
        let varied: String = (0..400)
            .map(|i| {
                format!(
                    "{} step {}\n",
                    ["fetch", "unpack", "link", "verify"][i % 4].repeat(i % 7 + 1),
                    "x".repeat(i % 13)
                )
            })
            .collect();
        let kept = compress(&varied, &Limits::of(CompressionProfile::Default), M)
            .map_or(varied.len(), |o| o.len());
        assert!(kept < varied.len(), "the varied log still compresses");
    }

    /// `go test -v -count=1 -skip TestCVE202230633 encoding/xml` (go1.26.8): 800 lines, most
    /// of them the numbered subtests of two tests, 180 lines of other templates.
    const GO_TEST_LOG: &str = include_str!("../../tests/data/go-test-encoding-xml.log");

    #[test]
    fn past_the_budget_the_rarest_odd_lines_are_kept() {
        let limits = Limits::of(CompressionProfile::Default);
        let all = lines::split(GO_TEST_LOG);
        let count = |line: &str| all.iter().filter(|l| template(l) == template(line)).count();
        let odd: Vec<&str> = all
            .iter()
            .copied()
            .filter(|l| count(l) < DOMINANT_MIN as usize && !l.trim().is_empty())
            .collect();
        assert!(odd.len() > ODD_LINES_MAX, "{} odd lines", odd.len());

        let out = compress(GO_TEST_LOG, &limits, M).expect("dropped");
        // Odd lines kept for being odd: not among the first and last lines, no error line.
        let mut ends = vec![false; all.len()];
        lines::keep_ends(&mut ends, limits.head_lines, limits.tail_lines);
        let kept_odd: Vec<&str> = all
            .iter()
            .zip(&ends)
            .filter(|(l, end)| !**end && !is_error_line(l) && odd.contains(l) && out.contains(**l))
            .map(|(l, _)| *l)
            .collect();
        // A line dropped between two kept ones stays when its note would be longer.
        let rarest_kept = kept_odd.iter().filter(|l| count(l) == 1).count();
        assert!(rarest_kept >= ODD_LINES_MAX, "{kept_odd:#?}");
        // The end of the first test and the start of the next one: once each in the log.
        for line in [
            "--- PASS: TestMarshal (0.00s)\n",
            "=== RUN   TestUnmarshal\n",
        ] {
            assert!(out.contains(line), "{line}");
        }
        assert!(
            !out.contains("=== RUN   TestNestedDirectives\n"),
            "past the budget"
        );
        assert!(!out.contains("=== RUN   TestUnmarshal/99\n"));
        assert!(
            out.len() < GO_TEST_LOG.len() / 3,
            "{} of {}",
            out.len(),
            GO_TEST_LOG.len()
        );
    }

    #[test]
    fn identical_error_lines_collapse_but_stay_present() {
        let log = "start\n".to_owned() + &"ERROR retrying\n".repeat(400) + "end\n";
        let out = compress(&log, &Limits::of(CompressionProfile::Aggressive), M).expect("dropped");
        assert!(out.contains("ERROR retrying\n"));
        assert!(out.len() < 400);
    }
}
