//! Content-aware compression of large tool outputs (and of the `compress` tool).
//!
//! A router decides what the content is — build/test log, search results, unified diff, JSON,
//! source code or prose — from the tool's name or a bounded sample, and the matching compressor
//! keeps what a reader needs (every error line and stack trace, every changed line, the first
//! and last matches per file, the ends of long arrays) and replaces the rest with notes that
//! carry the original's marker. The original is archived before the compressed text is
//! returned; whenever anything is off — below the threshold, `off`/`lossless` mode, not smaller,
//! not text, already carrying a marker, archive unreachable — the output is the input,
//! byte-identical.

pub mod code;
pub mod diff;
pub mod entry;
pub mod json;
mod lines;
pub mod log;
pub mod profile;
pub mod prose;
pub mod router;
pub mod search;

use cairn_crds::policy::{Compression, CompressionMode, CompressionProfile};

use crate::ccr::stats::CompressionCounters;
use crate::ccr::{Key, Store, has_marker};

pub use entry::{Admission, ToolOrigin, admission_score, admit_tool_result};
pub use profile::Limits;
pub use router::{Kind, detect};

/// Why content was left byte-identical.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// `compression.mode: off`.
    Off,
    /// `compression.mode: lossless`: nothing may be dropped, even recoverably.
    Lossless,
    /// Smaller than `compression.thresholdBytes`.
    BelowThreshold,
    /// The compressor found nothing worth dropping, or its result was not smaller.
    NotSmaller,
    /// Not UTF-8.
    NotText,
    /// Output of `recall`: the model asked for exactly these bytes.
    RecallOutput,
    /// Already carries a marker (archiving it again would nest archives).
    AlreadyArchived,
    /// The archive could not store the original, so nothing may be dropped.
    ArchiveUnavailable,
}

impl Skip {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Lossless => "lossless",
            Self::BelowThreshold => "below_threshold",
            Self::NotSmaller => "not_smaller",
            Self::NotText => "not_text",
            Self::RecallOutput => "recall_output",
            Self::AlreadyArchived => "already_archived",
            Self::ArchiveUnavailable => "archive_unavailable",
        }
    }
}

/// What compression decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Unchanged {
        reason: Skip,
        /// The detected kind, when detection ran.
        kind: Option<Kind>,
    },
    Compressed {
        text: String,
        /// The original's key; the text carries its marker.
        key: Key,
        kind: Kind,
    },
}

impl Outcome {
    /// The bytes to use in place of `original`.
    pub fn output<'a>(&'a self, original: &'a [u8]) -> &'a [u8] {
        match self {
            Self::Unchanged { .. } => original,
            Self::Compressed { text, .. } => text.as_bytes(),
        }
    }
}

/// The pure half of compression: decides, and builds the compressed text for the original's
/// key. Nothing is archived; the caller must archive `content` before using the text
/// ([`compress`] does).
pub fn plan(content: &[u8], tool: Option<&str>, policy: &Compression) -> Outcome {
    let unchanged = |reason, kind| Outcome::Unchanged { reason, kind };
    match policy.mode {
        CompressionMode::Off => return unchanged(Skip::Off, None),
        CompressionMode::Lossless => return unchanged(Skip::Lossless, None),
        CompressionMode::Lossy => {}
    }
    if tool.is_some_and(router::is_recall_tool) {
        return unchanged(Skip::RecallOutput, None);
    }
    if content.len() < policy.threshold_bytes as usize {
        return unchanged(Skip::BelowThreshold, None);
    }
    let Ok(text) = std::str::from_utf8(content) else {
        return unchanged(Skip::NotText, None);
    };
    if has_marker(text) {
        return unchanged(Skip::AlreadyArchived, None);
    }
    let kind = detect(tool, text);
    let key = Key::of(content);
    match compress_as(text, kind, policy.profile, &key.marker()) {
        Some(out) if out.len() < text.len() => Outcome::Compressed {
            text: out,
            key,
            kind,
        },
        _ => unchanged(Skip::NotSmaller, Some(kind)),
    }
}

/// Runs the compressor for `kind`; `None` when it would drop nothing. JSON that does not
/// parse falls back to the line-oriented log compressor.
pub fn compress_as(
    text: &str,
    kind: Kind,
    profile: CompressionProfile,
    marker: &str,
) -> Option<String> {
    let limits = Limits::of(profile);
    match kind {
        Kind::Log => log::compress(text, &limits, marker),
        Kind::Search => search::compress(text, &limits, marker),
        Kind::Diff => diff::compress(text, &limits, marker),
        Kind::Json => {
            json::compress(text, &limits, marker).or_else(|| log::compress(text, &limits, marker))
        }
        Kind::Code => code::compress(text, &limits, marker),
        Kind::Prose => prose::compress(text, &limits, marker),
    }
}

/// Compresses `content` when the policy allows and it pays, archiving the original first.
/// If the archive refuses, the content is returned unchanged: nothing is dropped.
pub async fn compress(
    store: &dyn Store,
    content: &[u8],
    tool: Option<&str>,
    policy: &Compression,
    counters: &CompressionCounters,
) -> Outcome {
    let outcome = match plan(content, tool, policy) {
        // `plan` scanned the original for markers and hashed it: the store gets that proof
        // instead of doing both again (two passes over a multi-megabyte output).
        Outcome::Compressed { text, key, kind } => match store
            .put_hashed(crate::ccr::Hashed::checked(key, content))
            .await
        {
            Ok(()) => Outcome::Compressed { text, key, kind },
            Err(e) => {
                tracing::warn!(error = %e, label = e.label(), kind = kind.label(),
                    "compress: original not archived; leaving content unchanged");
                Outcome::Unchanged {
                    reason: Skip::ArchiveUnavailable,
                    kind: Some(kind),
                }
            }
        },
        unchanged => unchanged,
    };
    match &outcome {
        Outcome::Compressed { text, kind, .. } => {
            counters.record(kind.label(), content.len(), Some(text.len()))
        }
        Outcome::Unchanged { kind, .. } => {
            counters.record(kind.map_or("none", |k| k.label()), content.len(), None)
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::{ArchiveError, Hashed, MemoryStore, recall};

    fn policy(mode: CompressionMode, threshold_bytes: u32) -> Compression {
        Compression {
            mode,
            threshold_bytes,
            profile: CompressionProfile::Default,
            max_result_bytes: 256 * 1024,
        }
    }

    fn big_log() -> String {
        let mut s = String::new();
        for i in 0..2000 {
            s.push_str(&format!(
                "2026-01-01T00:00:{:02} INFO step {i} done\n",
                i % 60
            ));
            if i == 1234 {
                s.push_str("2026-01-01T00:00:00 ERROR connection refused to db:5432\n");
            }
        }
        s
    }

    #[tokio::test]
    async fn lossy_archives_first_and_the_marker_resolves() {
        let store = MemoryStore::new();
        let counters = CompressionCounters::default();
        let log = big_log();
        let p = policy(CompressionMode::Lossy, 4000);
        let out = compress(&store, log.as_bytes(), Some("bash"), &p, &counters).await;
        let Outcome::Compressed { text, key, kind } = &out else {
            panic!("expected compression, got {out:?}");
        };
        assert_eq!(*kind, Kind::Log);
        assert!(text.len() < log.len() / 4);
        assert!(text.contains("ERROR connection refused to db:5432"));
        assert!(text.contains(&key.marker()));
        let back = recall(&store, text).await.expect("recall");
        assert_eq!(back.output, log.as_bytes());
        assert_eq!(counters.snapshot()["log"].compressed, 1);
    }

    #[tokio::test]
    async fn unchanged_cases_are_byte_identical() {
        let store = MemoryStore::new();
        let counters = CompressionCounters::default();
        let log = big_log();
        let cases = [
            (policy(CompressionMode::Off, 1), None, Skip::Off),
            (policy(CompressionMode::Lossless, 1), None, Skip::Lossless),
            (
                policy(CompressionMode::Lossy, log.len() as u32 + 1),
                None,
                Skip::BelowThreshold,
            ),
            (
                policy(CompressionMode::Lossy, 1),
                Some("recall"),
                Skip::RecallOutput,
            ),
        ];
        for (p, tool, reason) in cases {
            let out = compress(&store, log.as_bytes(), tool, &p, &counters).await;
            assert!(matches!(out, Outcome::Unchanged { reason: r, .. } if r == reason));
            assert_eq!(out.output(log.as_bytes()), log.as_bytes());
        }
        assert!(store.is_empty(), "nothing archived when nothing compressed");
        let lossy = policy(CompressionMode::Lossy, 1);
        let binary = [0xffu8; 10_000];
        assert!(matches!(
            plan(&binary, None, &lossy),
            Outcome::Unchanged {
                reason: Skip::NotText,
                ..
            }
        ));
        let marked = format!("{}{}", log, Key::of(b"x").marker());
        assert!(matches!(
            plan(marked.as_bytes(), None, &lossy),
            Outcome::Unchanged {
                reason: Skip::AlreadyArchived,
                ..
            }
        ));
    }

    struct DownStore;

    #[async_trait::async_trait]
    impl Store for DownStore {
        async fn put_hashed(&self, _: Hashed<'_>) -> Result<(), ArchiveError> {
            Err(ArchiveError::Unavailable("down".into()))
        }
        async fn fetch(&self, _: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
            Err(ArchiveError::Unavailable("down".into()))
        }
    }

    #[tokio::test]
    async fn archive_down_leaves_content_unchanged() {
        let log = big_log();
        let out = compress(
            &DownStore,
            log.as_bytes(),
            None,
            &policy(CompressionMode::Lossy, 4000),
            &CompressionCounters::default(),
        )
        .await;
        assert!(matches!(
            out,
            Outcome::Unchanged {
                reason: Skip::ArchiveUnavailable,
                ..
            }
        ));
        assert_eq!(out.output(log.as_bytes()), log.as_bytes());
    }
}
