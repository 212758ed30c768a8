//! Invariants of the archive and the compressors, over generated inputs.

use std::time::Duration;

use cairn_agent::ccr::stats::CompressionCounters;
use cairn_agent::ccr::{
    Archivable, LocalLimits, LocalStore, Store, extract_keys, extract_markers, recall,
};
use cairn_agent::compress::{self, Kind, Limits, Outcome, Skip, log};
use cairn_crds::policy::{Compression, CompressionMode, CompressionProfile};
use proptest::prelude::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn local_store(dir: &std::path::Path) -> LocalStore {
    LocalStore::open(
        dir,
        LocalLimits {
            max_bytes: 1 << 30,
            ttl: Duration::from_secs(3600),
        },
    )
    .expect("open")
}

fn profiles() -> impl Strategy<Value = CompressionProfile> {
    prop_oneof![
        Just(CompressionProfile::Conservative),
        Just(CompressionProfile::Default),
        Just(CompressionProfile::Aggressive),
    ]
}

/// Lines of the shapes tool outputs are made of, plus arbitrary text.
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0u32..10_000).prop_map(|n| format!("2026-01-01T00:00:00 INFO step {n} done")),
        1 => "[a-z ]{0,40}".prop_map(|w| format!("ERROR {w}")),
        1 => "[a-z ]{0,40}".prop_map(|w| format!("test {w} ... FAILED")),
        1 => "[a-z:]{0,30}".prop_map(|w| format!("    at {w}")),
        2 => ("[a-z]{1,8}", 1u32..500, "[ -~]{0,60}")
            .prop_map(|(f, n, t)| format!("src/{f}.rs:{n}:{t}")),
        1 => "[ -~]{0,60}".prop_map(|t| format!("+{t}")),
        1 => "[ -~]{0,60}".prop_map(|t| format!(" {t}")),
        1 => Just("@@ -1,3 +1,3 @@".to_string()),
        1 => (0u32..1000).prop_map(|n| format!("  {{\"id\": {n}, \"name\": \"item\"}},")),
        2 => "\\PC{0,80}",
        1 => Just(String::new()),
    ]
}

fn document() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(line(), 0..300).prop_map(|l| l.join("\n")),
        1 => prop::collection::vec(0u32..100_000, 0..400).prop_map(|v| {
            let items: Vec<String> = v.iter().map(|n| format!("{{\"n\": {n}}}")).collect();
            format!("{{\"items\": [{}]}}", items.join(", "))
        }),
    ]
}

fn lossy(threshold_bytes: u32, profile: CompressionProfile) -> Compression {
    Compression {
        mode: CompressionMode::Lossy,
        threshold_bytes,
        profile,
        max_result_bytes: u32::MAX,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn recall_of_archive_is_identical(content in prop::collection::vec(any::<u8>(), 0..20_000)) {
        prop_assume!(Archivable::check(&content).is_ok());
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = runtime();
        let back = rt.block_on(async {
            let store = local_store(dir.path());
            let key = store.archive(&content).await.expect("archive");
            // A fresh instance over the same directory, as after a restart.
            let reopened = local_store(dir.path());
            recall(&reopened, &key.marker()).await.expect("recall").output
        });
        prop_assert_eq!(back, content);
    }

    #[test]
    fn log_compressor_never_drops_an_error_line(
        lines in prop::collection::vec(line(), 0..400),
        profile in profiles(),
    ) {
        let text = lines.join("\n");
        if let Some(out) = log::compress(&text, &Limits::of(profile), "<<ccr:0123456789abcdef>>") {
            let kept: std::collections::HashSet<&str> = out.lines().collect();
            for l in text.lines().filter(|l| log::is_error_line(l)) {
                prop_assert!(kept.contains(l), "dropped error line {:?}", l);
            }
        }
    }

    #[test]
    fn compression_never_grows_content_whatever_the_kind(
        text in document(),
        profile in profiles(),
        kind in prop::sample::select(Kind::ALL.to_vec()),
    ) {
        let p = lossy(1, profile);
        for tool in [Some(kind.label()), None] {
            let out = compress::plan(text.as_bytes(), tool, &p);
            prop_assert!(out.output(text.as_bytes()).len() <= text.len());
            if let Outcome::Compressed { text: small, .. } = &out {
                prop_assert!(small.len() < text.len());
            }
        }
    }

    #[test]
    fn markers_in_compressed_output_always_resolve(text in document(), profile in profiles()) {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = runtime();
        rt.block_on(async {
            let store = local_store(dir.path());
            let counters = CompressionCounters::default();
            let out = compress::compress(&store, text.as_bytes(), None, &lossy(1, profile), &counters).await;
            if let Outcome::Compressed { text: small, key, .. } = &out {
                prop_assert_eq!(extract_markers(small), vec![*key]);
                prop_assert_eq!(extract_keys(small), vec![*key]);
                let back = recall(&store, small).await.expect("recall");
                prop_assert_eq!(&back.output, &text.as_bytes().to_vec());
            }
            Ok(())
        })?;
    }

    #[test]
    fn below_threshold_off_and_lossless_are_byte_identical(
        text in document(),
        profile in profiles(),
    ) {
        let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
        for (p, reason) in [
            (lossy(len.saturating_add(1), profile), Skip::BelowThreshold),
            (Compression { mode: CompressionMode::Off, threshold_bytes: 1, profile, max_result_bytes: u32::MAX }, Skip::Off),
            (Compression { mode: CompressionMode::Lossless, threshold_bytes: 1, profile, max_result_bytes: u32::MAX }, Skip::Lossless),
        ] {
            let out = compress::plan(text.as_bytes(), None, &p);
            prop_assert_eq!(&out, &Outcome::Unchanged { reason, kind: None });
            prop_assert_eq!(out.output(text.as_bytes()), text.as_bytes());
        }
    }

    #[test]
    fn recall_output_is_never_recompressed(docs in prop::collection::vec(document(), 1..4)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = runtime();
        rt.block_on(async {
            let store = local_store(dir.path());
            let mut markers = String::new();
            for d in &docs {
                let key = store.archive(d.as_bytes()).await.expect("archive");
                markers.push_str(&key.marker());
                markers.push(' ');
            }
            let recalled = recall(&store, &markers).await.expect("recall").output;
            let p = lossy(1, CompressionProfile::Aggressive);
            for tool in [Some("recall"), None] {
                let out = compress::plan(&recalled, tool, &p);
                // One key: only the tool name protects it. Several: the labels carry markers.
                if tool.is_some() || extract_keys(&markers).len() > 1 {
                    prop_assert!(matches!(out, Outcome::Unchanged { .. }), "{:?}", out);
                    prop_assert_eq!(out.output(&recalled), recalled.as_slice());
                }
            }
            Ok(())
        })?;
    }
}

proptest! {
    #[test]
    fn byte_scan_agrees_with_the_text_scan(
        prefix in prop::collection::vec(any::<u8>(), 0..64),
        hex in "[0-9a-fA-F]{15,17}",
        close in prop_oneof![Just(">>"), Just(">"), Just("")],
        suffix in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut content = prefix;
        content.extend_from_slice(format!("<<ccr:{hex}{close}").as_bytes());
        content.extend_from_slice(&suffix);
        prop_assert_eq!(
            cairn_agent::ccr::has_marker_bytes(&content),
            cairn_agent::ccr::has_marker(&String::from_utf8_lossy(&content))
        );
    }
}
