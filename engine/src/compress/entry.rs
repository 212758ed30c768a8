//! The one door every tool result goes through as it enters the history: a client's
//! `function_call_output` or `role: tool` message, a built-in tool's result, and any other
//! tool a session runs. [`admit_tool_result`] applies the policy there, once, so what the
//! history holds (and the journal, and every later request) is already within bounds.
//!
//! - `compression.mode: lossy`: a result of at least `thresholdBytes` goes through the
//!   content-aware router ([`super::compress`]); its original is archived first and the
//!   compressed text carries the marker. Error outputs stay verbatim (the model needs the
//!   whole error), and so does `recall`'s output (the model asked for exactly those bytes).
//! - `lossless` and `off`: the router never runs.
//! - In every mode, a result still over `maxResultBytes` is archived and replaced by a head
//!   and tail preview of that size carrying its marker, so one huge tool output can never
//!   make a request unsendable. Nothing is ever dropped irrecoverably: when the archive
//!   cannot store the original, the result enters whole (the per-request budget still cuts
//!   the outgoing copy).

use cairn_crds::policy::Compression;
use cairn_crds::session::CompactionScore;

use crate::ccr::stats::CompressionCounters;
use crate::ccr::{Key, Store};
use crate::compact::archive::note_archived;
use crate::compact::{ledger, probe, text};
use crate::history::{Message, Role};

use super::{Kind, Outcome, compress};

/// Counter label of results cut to `maxResultBytes`.
pub const CEILING: &str = "ceiling";

/// What one tool result looked like to the admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolOrigin {
    /// The tool reported a failure: the output stays verbatim (below the ceiling).
    pub is_error: bool,
}

/// What [`admit_tool_result`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Entered byte-identical.
    Whole,
    /// Compressed by the router for `kind`; the original is archived under `key`.
    Compressed { kind: Kind, key: Key },
    /// Over `maxResultBytes`: the original is archived under `key` and a preview entered.
    Ceiling { key: Key },
    /// Over `maxResultBytes`, but the original could not be archived: it entered whole.
    CeilingNotArchived,
}

/// Applies the compression policy to `message` (a tool result) before it enters the
/// history. Archives every original it replaces first, and records the outcome in
/// `counters` (per strategy; `ceiling` for results cut to the ceiling).
pub async fn admit_tool_result(
    message: &mut Message,
    origin: ToolOrigin,
    policy: &Compression,
    store: &dyn Store,
    counters: &CompressionCounters,
) -> Admission {
    if message.role != Role::Tool {
        return Admission::Whole;
    }
    let mut admission = Admission::Whole;
    let mut original: Option<String> = None;
    // What the whole result shows of its errors stays in sight whatever is admitted.
    let errors = text::errors_to_keep(message);
    if !origin.is_error && !message.meta.preserve_verbatim {
        let outcome = compress(
            store,
            message.content.as_bytes(),
            message.name.as_deref(),
            policy,
            counters,
        )
        .await;
        if let Outcome::Compressed {
            text: compressed,
            key,
            kind,
        } = outcome
            && let compressed = text::with_errors(compressed, &errors)
            && compressed.len() < message.content.len()
        {
            ledger::note_cut(message);
            original = Some(std::mem::replace(&mut message.content, compressed));
            note_archived(message, &key);
            admission = Admission::Compressed { kind, key };
        }
    }
    let max = policy.max_result_bytes as usize;
    if message.content.len() <= max {
        return admission;
    }
    // The preview is cut from the original, not from a compressed text that is still too
    // large: its head and tail are the tool's own bytes.
    let full = original.as_deref().unwrap_or(&message.content);
    let key = match &admission {
        Admission::Compressed { key, .. } => Ok(*key),
        _ => store.archive(full.as_bytes()).await,
    };
    let key = match key {
        Ok(key) => key,
        Err(e) => {
            tracing::warn!(error = %e, label = e.label(), bytes = full.len(),
                "tool result over compression.maxResultBytes not archived; it enters the history whole");
            return Admission::CeilingNotArchived;
        }
    };
    let Some(preview) = text::preview_within(full, max, &key)
        .map(|p| text::with_errors(p, &errors))
        .filter(|p| p.len() < message.content.len())
    else {
        return admission;
    };
    let bytes_in = full.len();
    counters.record(CEILING, bytes_in, Some(preview.len()));
    ledger::note_cut(message);
    message.content = preview;
    note_archived(message, &key);
    Admission::Ceiling { key }
}

/// What an admission kept in sight of the whole result: the artifacts of the original (its
/// ledger recorded them when it was cut on entry) against what entered the history. `None`
/// when the result entered whole.
pub fn admission_score(admission: &Admission, message: &Message) -> Option<CompactionScore> {
    if *admission == Admission::Whole || message.meta.ledger.is_empty() {
        return None;
    }
    Some(probe::score(
        &message.meta.ledger,
        std::slice::from_ref(message),
        0,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::{MemoryStore, recall};
    use cairn_crds::policy::CompressionMode;

    fn policy(mode: CompressionMode) -> Compression {
        Compression {
            mode,
            ..cairn_crds::EffectivePolicy::default().compression
        }
    }

    fn log(lines: usize) -> String {
        let mut s = String::new();
        for i in 0..lines {
            s.push_str(&format!("2026-01-01T00:00:00 INFO step {i} done\n"));
            if i % 997 == 0 {
                s.push_str(&format!("2026-01-01T00:00:00 ERROR step {i} failed\n"));
            }
        }
        s
    }

    fn tool_message(name: &str, content: String) -> Message {
        let mut m = Message::tool("c1", content);
        m.name = Some(name.into());
        m
    }

    #[tokio::test]
    async fn lossy_compresses_and_the_original_is_recallable() {
        let store = MemoryStore::new();
        let counters = CompressionCounters::default();
        let original = log(5_000);
        let mut m = tool_message("bash", original.clone());
        let a = admit_tool_result(
            &mut m,
            ToolOrigin { is_error: false },
            &policy(CompressionMode::Lossy),
            &store,
            &counters,
        )
        .await;
        let Admission::Compressed { key, kind } = a else {
            panic!("expected compression, got {a:?}");
        };
        assert_eq!(kind, Kind::Log);
        assert!(m.content.len() < original.len() / 4);
        assert!(m.content.contains(&key.marker()));
        assert_eq!(m.meta.archived, vec![key.as_str().to_owned()]);
        for line in original.lines().filter(|l| l.contains("ERROR")) {
            assert!(m.content.contains(line), "error line kept: {line}");
        }
        let back = recall(&store, &key.marker()).await.expect("recall");
        assert_eq!(back.output, original.as_bytes());
        assert_eq!(counters.snapshot()["log"].compressed, 1);
    }

    #[tokio::test]
    async fn errors_recall_and_other_modes_enter_whole_below_the_ceiling() {
        let store = MemoryStore::new();
        let counters = CompressionCounters::default();
        let original = log(3_000);
        assert!(original.len() < 256 * 1024);
        let cases = [
            ("bash", true, false, CompressionMode::Lossy),
            ("recall", false, true, CompressionMode::Lossy),
            ("bash", false, false, CompressionMode::Lossless),
            ("bash", false, false, CompressionMode::Off),
        ];
        for (name, is_error, verbatim, mode) in cases {
            let mut m = tool_message(name, original.clone());
            m.meta.preserve_verbatim = verbatim;
            let a = admit_tool_result(
                &mut m,
                ToolOrigin { is_error },
                &policy(mode),
                &store,
                &counters,
            )
            .await;
            assert_eq!(a, Admission::Whole, "{name} {mode:?}");
            assert_eq!(m.content, original);
        }
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn the_ceiling_holds_in_every_mode_and_keeps_the_original() {
        let store = MemoryStore::new();
        let counters = CompressionCounters::default();
        // Random-looking lines no compressor can shrink much: only the ceiling can.
        let original: String = (0..200_000u64)
            .map(|i| format!("{:016x}\n", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect();
        for mode in [
            CompressionMode::Lossy,
            CompressionMode::Lossless,
            CompressionMode::Off,
        ] {
            let p = policy(mode);
            let mut m = tool_message("read_file", original.clone());
            let a = admit_tool_result(&mut m, ToolOrigin { is_error: true }, &p, &store, &counters)
                .await;
            let Admission::Ceiling { key } = a else {
                panic!("expected the ceiling, got {a:?}");
            };
            assert!(m.content.len() <= p.max_result_bytes as usize, "{mode:?}");
            assert!(m.content.contains(&key.marker()));
            assert!(m.content.starts_with(&original[..1000]));
            let back = recall(&store, &m.content).await.expect("recall");
            assert_eq!(back.output, original.as_bytes());
        }
        assert_eq!(counters.snapshot()[CEILING].compressed, 3);
    }
}
