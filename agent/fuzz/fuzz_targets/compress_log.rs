//! The log compressor on arbitrary text, under every profile: never panics, and anything it
//! drops is announced by a note carrying the marker.
#![no_main]

use cairn_agent::compress::{Limits, log};
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
        if let Some(out) = log::compress(text, &Limits::of(profile), MARKER) {
            assert!(out.contains(MARKER), "a drop without a note");
            check(text, &out);
        }
    }
});

/// Every error line survives.
fn check(text: &str, out: &str) {
    let kept: std::collections::HashSet<&str> = out.lines().collect();
    for line in text.lines().filter(|l| log::is_error_line(l)) {
        assert!(kept.contains(line), "dropped error line {line:?}");
    }
}
