//! The session's newest compactions, oldest first: what the session page draws as its
//! timeline (`GET /v1/session`, `timeline`). Kept in the session state and journaled with
//! it, so a restarted or moved agent shows the same timeline.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Compactions the timeline keeps.
pub const TIMELINE_LEN: usize = 32;

/// Archive keys one entry names; the others are counted in [`TimelineEntry::archived_count`]
/// (a level-1 pass can archive dozens of results, each recallable from the history's own
/// markers).
pub const ENTRY_KEYS: usize = 12;

/// One compaction as the timeline shows it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    /// When the entry that persisted it was written, RFC 3339 UTC.
    pub at: String,
    /// `auto`, `preflight`, `manual`, `recovery` or `provider`.
    pub trigger: String,
    /// The highest ladder level that ran (0: a recovery's or a provider's cut).
    pub level: u8,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// What it kept in sight of what it replaced, 0–1, when it was scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// The first [`ENTRY_KEYS`] archive keys it wrote.
    #[serde(default)]
    pub archived: Vec<String>,
    /// Archive keys it wrote in all.
    #[serde(default)]
    pub archived_count: u64,
}

impl TimelineEntry {
    /// An entry naming at most [`ENTRY_KEYS`] of `archived`.
    pub fn new(
        at: String,
        trigger: &str,
        level: u8,
        bytes: (u64, u64),
        score: Option<f64>,
        archived: &[String],
    ) -> Self {
        Self {
            at,
            trigger: trigger.to_owned(),
            level,
            bytes_before: bytes.0,
            bytes_after: bytes.1,
            score,
            archived: archived.iter().take(ENTRY_KEYS).cloned().collect(),
            archived_count: archived.len() as u64,
        }
    }
}

/// The newest [`TIMELINE_LEN`] compactions, oldest first.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(transparent)]
pub struct Timeline(VecDeque<TimelineEntry>);

impl Timeline {
    /// Adds the newest compaction, dropping the oldest past [`TIMELINE_LEN`].
    pub fn push(&mut self, entry: TimelineEntry) {
        self.0.push_back(entry);
        while self.0.len() > TIMELINE_LEN {
            self.0.pop_front();
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = &TimelineEntry> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{i:016x}")).collect()
    }

    #[test]
    fn the_timeline_keeps_the_newest_and_names_a_bounded_number_of_keys() {
        let mut t = Timeline::default();
        for i in 0..TIMELINE_LEN as u64 + 5 {
            t.push(TimelineEntry::new(
                format!("2026-12-07T00:00:{:02}Z", i % 60),
                "auto",
                1,
                (1_000 + i, 500),
                Some(0.5),
                &keys(i as usize),
            ));
        }
        assert_eq!(t.len(), TIMELINE_LEN);
        let first = t.entries().next().unwrap();
        assert_eq!(first.bytes_before, 1_005, "the oldest five dropped");
        let last = t.entries().last().unwrap();
        assert_eq!(last.archived.len(), ENTRY_KEYS);
        assert_eq!(last.archived_count, TIMELINE_LEN as u64 + 4);
        // Journaled as a plain list, read back the same.
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.starts_with('['), "{json}");
        assert_eq!(serde_json::from_str::<Timeline>(&json).unwrap(), t);
    }
}
