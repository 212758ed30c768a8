//! The whole lossy path without I/O: never panics, never grows the content, and a compressed
//! result carries exactly the original's marker.
#![no_main]

use cairn_agent::ccr::{Key, extract_markers};
use cairn_agent::compress::{Kind, Outcome, plan};
use cairn_crds::policy::{Compression, CompressionMode, CompressionProfile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, content)) = data.split_first() else {
        return;
    };
    let profile = match selector % 3 {
        0 => CompressionProfile::Conservative,
        1 => CompressionProfile::Default,
        _ => CompressionProfile::Aggressive,
    };
    let tool = Kind::ALL
        .get(usize::from(selector / 3) % (Kind::ALL.len() + 1))
        .map(Kind::label);
    let policy = Compression {
        mode: CompressionMode::Lossy,
        threshold_bytes: 1,
        profile,
        max_result_bytes: u32::MAX,
    };
    let out = plan(content, tool, &policy);
    assert!(out.output(content).len() <= content.len());
    if let Outcome::Compressed { text, key, .. } = &out {
        assert_eq!(*key, Key::of(content));
        assert_eq!(extract_markers(text), vec![*key]);
    }
});
