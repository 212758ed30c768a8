//! The json compressor on arbitrary text, under every profile: never panics, and anything it
//! drops is announced by a note carrying the marker.
#![no_main]

use cairn_agent::compress::{Limits, json};
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
        if let Some(out) = json::compress(text, &Limits::of(profile), MARKER) {
            assert!(out.contains(MARKER), "a drop without a note");
            check(text, &out);
        }
    }
});

/// Valid JSON stays valid JSON.
fn check(text: &str, out: &str) {
    if serde_json::from_str::<serde_json::Value>(text).is_ok() {
        assert!(
            serde_json::from_str::<serde_json::Value>(out).is_ok(),
            "compressed JSON no longer parses"
        );
    }
}
