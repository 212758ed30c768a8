//! The diff compressor on arbitrary text, under every profile: never panics, and anything it
//! drops is announced by a note carrying the marker.
#![no_main]

use cairn_agent::compress::{Limits, diff};
use cairn_crds::policy::CompressionProfile;
use libfuzzer_sys::fuzz_target;

const MARKER: &str = "<<ccr:0123456789abcdef>>";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for profile in [
        CompressionProfile::Conservative,
        CompressionProfile::Default,
        CompressionProfile::Aggressive,
    ] {
        if let Some(out) = diff::compress(text, &Limits::of(profile), MARKER) {
            assert!(out.contains(MARKER), "a drop without a note");
            check(text, &out);
        }
    }
});

/// Every changed line survives.
fn check(text: &str, out: &str) {
    let kept: std::collections::HashSet<&str> = out.lines().collect();
    for line in text.lines() {
        if line.starts_with('+') || line.starts_with('-') {
            assert!(kept.contains(line), "dropped changed line {line:?}");
        }
    }
}
