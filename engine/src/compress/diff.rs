//! Unified diffs: every file header, hunk header and changed line stays; unchanged context is
//! trimmed to the profile's few lines around each change.

use super::lines;
use super::profile::Limits;

fn is_header(line: &str) -> bool {
    const HEADERS: [&str; 13] = [
        "diff ",
        "index ",
        "--- ",
        "+++ ",
        "@@",
        "new file",
        "deleted file",
        "similarity",
        "rename ",
        "old mode",
        "new mode",
        "Binary files",
        "copy ",
    ];
    HEADERS.iter().any(|h| line.starts_with(h))
}

fn is_change(line: &str) -> bool {
    (line.starts_with('+') || line.starts_with('-')) && !is_header(line)
}

/// Context inside a hunk: a line starting with a space (or an empty line, which some tools
/// emit for an empty context line).
fn is_context(line: &str) -> bool {
    line.starts_with(' ') || lines::content(line).is_empty()
}

pub fn compress(text: &str, limits: &Limits, marker: &str) -> Option<String> {
    let all = lines::split(text);
    let mut keep: Vec<bool> = all.iter().map(|l| !is_context(l)).collect();
    // Context within `diff_context` lines of a change, looking both ways within the hunk.
    let mut since_change = usize::MAX;
    for i in 0..all.len() {
        if is_change(all[i]) {
            since_change = 0;
        } else if is_context(all[i]) {
            since_change = since_change.saturating_add(1);
            if since_change <= limits.diff_context {
                keep[i] = true;
            }
        } else {
            since_change = usize::MAX;
        }
    }
    let mut until_change = usize::MAX;
    for i in (0..all.len()).rev() {
        if is_change(all[i]) {
            until_change = 0;
        } else if is_context(all[i]) {
            until_change = until_change.saturating_add(1);
            if until_change <= limits.diff_context {
                keep[i] = true;
            }
        } else {
            until_change = usize::MAX;
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
    fn headers_and_changes_stay_context_is_trimmed() {
        let mut d = String::from(
            "diff --git a/x.rs b/x.rs\nindex 1..2 100644\n--- a/x.rs\n+++ b/x.rs\n@@ -1,40 +1,40 @@\n",
        );
        for i in 0..20 {
            d.push_str(&format!(" context {i}\n"));
        }
        d.push_str("-old line\n+new line\n");
        for i in 20..40 {
            d.push_str(&format!(" context {i}\n"));
        }
        let out = compress(&d, &Limits::of(CompressionProfile::Default), M).expect("dropped");
        for kept in [
            "diff --git a/x.rs b/x.rs\n",
            "--- a/x.rs\n",
            "+++ b/x.rs\n",
            "@@ -1,40 +1,40 @@\n",
            " context 19\n-old line\n+new line\n context 20\n",
        ] {
            assert!(out.contains(kept), "{kept}");
        }
        assert!(!out.contains(" context 18\n"));
        assert!(!out.contains(" context 21\n"));
        assert!(out.contains("[... 19 lines omitted"));
    }
}
