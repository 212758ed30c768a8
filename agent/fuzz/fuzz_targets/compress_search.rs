//! The search compressor on arbitrary text, under every profile: never panics, and anything it
//! drops is announced by a note carrying the marker.
#![no_main]

use cairn_agent::compress::{Limits, search};
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
        if let Some(out) = search::compress(text, &Limits::of(profile), MARKER) {
            assert!(out.contains(MARKER), "a drop without a note");
            check(text, &out);
        }
    }
});

/// Kept lines are the input's own lines, in order.
fn check(text: &str, out: &str) {
    let mut input = text.lines();
    for line in out.lines().filter(|l| !l.starts_with("[... ")) {
        assert!(input.any(|l| l == line), "invented line {line:?}");
    }
}
