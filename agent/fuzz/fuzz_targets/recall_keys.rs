//! The tolerant key parser: never panics, returns only valid distinct keys, and finds the
//! canonical marker of every key it returns.
#![no_main]

use cairn_agent::ccr::{Key, extract_keys};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let keys = extract_keys(&text);
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(Key::parse(key.as_str()), Some(*key));
        assert!(!keys[..i].contains(key), "keys are distinct");
        assert_eq!(extract_keys(&key.marker()), vec![*key]);
    }
});
