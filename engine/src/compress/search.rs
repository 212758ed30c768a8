//! Search results (`grep -n`, `rg`, `git grep`): `path:line:match`, or rg's heading mode where
//! a path line is followed by `line:match` lines. Every file stays listed; within a file the
//! first and last matches are kept and the middle becomes one note saying how many went.

use super::lines;
use super::profile::Limits;

/// `path:NUM:` or `path-NUM-` (grep context lines): the path of a result line.
pub fn result_path(line: &str) -> Option<&str> {
    let line = lines::content(line);
    for (sep_pos, sep) in line.char_indices().filter(|(_, c)| *c == ':' || *c == '-') {
        let path = &line[..sep_pos];
        let rest = &line[sep_pos + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if looks_like_path(path)
            && digits > 0
            && rest.as_bytes().get(digits) == Some(&(sep as u8))
            && !path.contains(char::is_whitespace)
        {
            return Some(path);
        }
        if sep == ':' {
            // A path never spans a colon in these formats; stop at the first one.
            break;
        }
    }
    None
}

/// Dates, times and addresses (`2026-01-01T10`, `12`, `10.0.0.1`) look like `path:NUM:` too;
/// a path has a letter or a slash, and starts with a digit only inside a directory.
fn looks_like_path(path: &str) -> bool {
    let has_slash = path.contains('/');
    !path.is_empty()
        && (has_slash || path.bytes().any(|c| c.is_ascii_alphabetic()))
        && (has_slash || !path.starts_with(|c: char| c.is_ascii_digit()))
}

/// `NUM:` or `NUM-` at the start: a result line under an rg heading.
fn is_numbered(line: &str) -> bool {
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && matches!(line.as_bytes().get(digits), Some(b':' | b'-'))
}

pub fn compress(text: &str, limits: &Limits, marker: &str) -> Option<String> {
    let all = lines::split(text);
    let mut out = String::new();
    let mut dropped_any = false;
    let mut i = 0;
    while i < all.len() {
        // A group: consecutive lines of one file (inline paths), or numbered lines under a
        // heading line.
        let (label, start, end) = if let Some(path) = result_path(all[i]) {
            let mut j = i + 1;
            while j < all.len() && result_path(all[j]) == Some(path) {
                j += 1;
            }
            (path.to_owned(), i, j)
        } else if i + 1 < all.len() && is_numbered(all[i + 1]) && !is_numbered(all[i]) {
            out.push_str(all[i]);
            let mut j = i + 1;
            while j < all.len() && is_numbered(all[j]) {
                j += 1;
            }
            (lines::content(all[i]).to_owned(), i + 1, j)
        } else {
            out.push_str(all[i]);
            i += 1;
            continue;
        };
        let group = &all[start..end];
        let keep = limits.matches_first + limits.matches_last;
        if group.len() > keep + 1 {
            group[..limits.matches_first]
                .iter()
                .for_each(|l| out.push_str(l));
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            let what = format!("{} more results in {label}", group.len() - keep);
            out.push_str(&lines::note(&what, marker));
            group[group.len() - limits.matches_last..]
                .iter()
                .for_each(|l| out.push_str(l));
            dropped_any = true;
        } else {
            group.iter().for_each(|l| out.push_str(l));
        }
        i = end;
    }
    dropped_any.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_crds::policy::CompressionProfile;

    const M: &str = "<<ccr:0123456789abcdef>>";

    #[test]
    fn paths_are_recognised() {
        assert_eq!(result_path("src/a.rs:12:fn main() {"), Some("src/a.rs"));
        assert_eq!(result_path("src/a-b.rs-12-context"), Some("src/a-b.rs"));
        assert_eq!(result_path("a.rs:x:1"), None);
        assert_eq!(result_path("some text: 12: no"), None);
        assert_eq!(result_path("2026-01-01 INFO started"), None);
        assert_eq!(result_path("12:30:45 ready"), None);
        assert_eq!(result_path("2026-01-01T10:00:01 INFO ok"), None);
        assert_eq!(result_path("10.0.0.1:8080: refused"), None);
        assert_eq!(result_path("Makefile:3:all:"), Some("Makefile"));
    }

    #[test]
    fn first_and_last_matches_per_file_every_file_listed() {
        let mut text = String::new();
        for f in ["src/a.rs", "src/b.rs", "src/c.rs"] {
            for n in 1..=40 {
                text.push_str(&format!("{f}:{n}:    let x{n} = value;\n"));
            }
        }
        text.push_str("src/d.rs:7:only one\n");
        let out = compress(&text, &Limits::of(CompressionProfile::Default), M).expect("dropped");
        for f in ["src/a.rs", "src/b.rs", "src/c.rs"] {
            assert!(out.contains(&format!("{f}:1:")));
            assert!(out.contains(&format!("{f}:3:")));
            assert!(!out.contains(&format!("{f}:4:")));
            assert!(out.contains(&format!("{f}:40:")));
            assert!(out.contains(&format!("35 more results in {f}")));
        }
        assert!(out.contains("src/d.rs:7:only one\n"));
    }

    #[test]
    fn rg_heading_mode() {
        let mut text = "src/a.rs\n".to_owned();
        for n in 1..=30 {
            text.push_str(&format!("{n}:match {n}\n"));
        }
        let out = compress(&text, &Limits::of(CompressionProfile::Aggressive), M).expect("dropped");
        assert!(out.starts_with("src/a.rs\n1:match 1\n[... 28 more results in src/a.rs"));
        assert!(out.ends_with("30:match 30\n"));
    }
}
