//! What an entry holds: the splice of its base's history, the session state that outlives a
//! restart, its compactions and how to undo them.

use serde::{Deserialize, Serialize};

use crate::compact::SessionState;
use crate::history::Message;

/// The parts of [`SessionState`] that outlive a restart.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PersistedState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_payload_cap: Option<u64>,
    /// The configured `spec.payloadCap` (`none` or bytes) the learned cap belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_cap_basis: Option<String>,
    #[serde(default)]
    pub payload_notice_injected: bool,
    #[serde(default)]
    pub large_history_warned: bool,
    #[serde(default)]
    pub consecutive_failures: u32,
    #[serde(default)]
    pub skip_level2: u32,
    #[serde(default)]
    pub tool_budget_halvings: u32,
    /// Level-2 summaries rejected or failed in a row (the backoff's exponent).
    #[serde(default)]
    pub summary_failures_in_row: u32,
    /// What level 2's summaries came to (`status.session.summaries`).
    #[serde(default)]
    pub summaries: cairn_crds::session::SummaryStats,
    /// What compactions kept in sight (`status.session.compactionQuality`).
    #[serde(
        default,
        skip_serializing_if = "cairn_crds::session::CompactionQuality::is_empty"
    )]
    pub quality: cairn_crds::session::CompactionQuality,
    #[serde(default)]
    pub compactions: u64,
    #[serde(default)]
    pub level3_compactions: u64,
    /// The newest compactions (the session page's timeline).
    #[serde(
        default,
        skip_serializing_if = "crate::compact::timeline::Timeline::is_empty"
    )]
    pub timeline: crate::compact::timeline::Timeline,
    #[serde(default)]
    pub recoveries: u64,
    #[serde(default)]
    pub turns: u64,
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// The window a server named, and the `model@configured-window` it was learned for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_window: Option<(u64, String)>,
    /// The calibrated bytes per token and how many counts it rests on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chars_per_token: Option<(f64, u32)>,
    #[serde(default)]
    pub truncated_replies: u64,
    /// The items a served session accepted and its recent response ids (`crate::replay`).
    #[serde(default, skip_serializing_if = "crate::replay::Ledger::is_empty")]
    pub replay: crate::replay::Ledger,
    /// What the cheap passes changed so far (`status.session.passes`).
    #[serde(default)]
    pub passes: cairn_crds::session::PassStats,
    /// Tokens of the summarizer's own client: input, output, cache read
    /// (`status.session.tokens.summarizer`).
    #[serde(default, skip_serializing_if = "is_zero_tokens")]
    pub summarizer_tokens: [u64; 3],
    /// Cache writes and cost of the session model's and the summarizer's calls
    /// (`status.session.costUSD`).
    #[serde(default, skip_serializing_if = "crate::cost::Accounting::is_empty")]
    pub accounting: crate::cost::Accounting,
    /// When the session's last reply was journaled, in milliseconds since the Unix epoch:
    /// the idle clock of microcompact's idle rule, so a restarted (or woken) agent knows how
    /// long the provider's cache has been cold. `None` (journals written before the field):
    /// the clock starts with the first reply after the restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reply_ms: Option<u64>,
}

impl PersistedState {
    pub fn capture(state: &SessionState, turns: u64, tokens: [u64; 3]) -> Self {
        Self {
            learned_payload_cap: state.learned_payload_cap,
            payload_cap_basis: state.payload_cap_basis.clone(),
            payload_notice_injected: state.payload_notice_injected,
            large_history_warned: state.large_history_warned,
            consecutive_failures: state.consecutive_failures,
            skip_level2: state.skip_level2,
            tool_budget_halvings: state.tool_budget_halvings,
            summary_failures_in_row: state.summary_failures_in_row,
            summaries: state.summaries.clone(),
            quality: state.quality.clone(),
            compactions: state.compactions,
            level3_compactions: state.level3_compactions,
            timeline: state.timeline.clone(),
            recoveries: state.recoveries,
            turns,
            input_tokens: tokens[0],
            output_tokens: tokens[1],
            cache_read_tokens: tokens[2],
            learned_window: state.learned_window.zip(state.learned_window_basis.clone()),
            chars_per_token: (state.chars_per_token.samples() > 0)
                .then(|| (state.chars_per_token.get(), state.chars_per_token.samples())),
            truncated_replies: state.truncated_replies,
            replay: crate::replay::Ledger::default(),
            passes: Default::default(),
            summarizer_tokens: [0; 3],
            accounting: Default::default(),
            last_reply_ms: None,
        }
    }

    pub fn restore_into(&self, state: &mut SessionState) {
        state.learned_payload_cap = self.learned_payload_cap;
        state.payload_cap_basis = self.payload_cap_basis.clone();
        state.payload_notice_injected = self.payload_notice_injected;
        state.large_history_warned = self.large_history_warned;
        state.consecutive_failures = self.consecutive_failures;
        state.skip_level2 = self.skip_level2;
        state.tool_budget_halvings = self.tool_budget_halvings;
        state.summary_failures_in_row = self.summary_failures_in_row;
        state.summaries = self.summaries.clone();
        state.quality = self.quality.clone();
        state.compactions = self.compactions;
        state.level3_compactions = self.level3_compactions;
        state.timeline = self.timeline.clone();
        state.recoveries = self.recoveries;
        state.truncated_replies = self.truncated_replies;
        if let Some((w, basis)) = &self.learned_window {
            state.learned_window = Some(*w);
            state.learned_window_basis = Some(basis.clone());
        }
        if let Some((v, n)) = self.chars_per_token {
            state.chars_per_token = crate::tokens::CharsPerToken::restored(v, n);
        }
    }
}

/// A compaction recorded with the entry that persisted its result.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompactionRecord {
    /// `auto`, `preflight`, `manual` or `recovery`.
    pub trigger: String,
    /// Highest ladder level that ran (0 for recovery without a ladder level).
    pub level: u8,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Archive keys written by the compaction.
    #[serde(default)]
    pub archived: Vec<String>,
    /// What it kept in sight of what it replaced, 0–1, when it was scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

impl CompactionRecord {
    /// The record as the session page's timeline shows it, persisted `at` (RFC 3339).
    pub fn timeline_entry(&self, at: String) -> crate::compact::timeline::TimelineEntry {
        crate::compact::timeline::TimelineEntry::new(
            at,
            &self.trigger,
            self.level,
            (self.bytes_before, self.bytes_after),
            self.score,
            &self.archived,
        )
    }
}

/// How to undo the compactions of one change: `pre` is the history just before the first of
/// them; everything from `post_len` on in the change's result was added after the last.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Undo {
    pub pre: Vec<Message>,
    pub post_len: usize,
}

/// An [`Undo`] as an entry stores it: the pre-compaction history as a splice of the entry's
/// own history up to `post_len` — its first `keep` messages, then `pre`, then its messages
/// `tail[0]..tail[1]`. (Entries written before splicing was introduced hold `pre` whole.)
/// When the journal has an archive, the messages of `pre` are archived as a segment and the
/// entry names its key instead ([`ArchivedUndo`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct StoredUndo {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub keep: usize,
    #[serde(default)]
    pub pre: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived: Option<ArchivedUndo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<[usize; 2]>,
    pub post_len: usize,
}

/// An undo record below the newest, as a checkpoint carries it: whole (see
/// [`StoredUndo::is_whole`]), so it needs no entry the checkpoint supersedes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CarriedUndo {
    /// The entry that compacted.
    pub seq: u64,
    pub undo: StoredUndo,
}

/// The replaced messages of an undo, archived as one segment (see `compact::archive`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ArchivedUndo {
    /// Archive key of the segment.
    pub key: String,
    /// Messages in the segment.
    pub messages: usize,
    /// Serialized size of those messages.
    pub bytes: u64,
}

/// Replaced messages of an undo weighing at least this much are archived rather than kept in
/// the journal's entries (smaller ones cost less inline than a key and a round trip).
pub const UNDO_ARCHIVE_MIN_BYTES: u64 = 4 * 1024;

fn is_zero_tokens(t: &[u64; 3]) -> bool {
    t.iter().all(|n| *n == 0)
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One journal object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Entry {
    pub epoch: u64,
    pub seq: u64,
    pub holder: String,
    /// The entry whose history this one splices. `None` with `at = 0` and no `tail`: a
    /// checkpoint; `None` otherwise: an entry of the first format, which splices the entry
    /// before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<u64>,
    /// Messages kept from the start of the base's history.
    pub at: usize,
    pub messages: Vec<Message>,
    /// The base's messages `tail[0]..tail[1]`, after `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<[usize; 2]>,
    #[serde(default)]
    pub state: PersistedState,
    /// Items of the base's replay ledger this entry keeps; `state.replay.items` then holds
    /// only the items after them (the ledger only grows between checkpoints, so a delta
    /// carries what is new, not the whole ledger). `None`: `state.replay` is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_at: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compactions: Vec<CompactionRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<StoredUndo>,
    /// A checkpoint's rewind levels below `undo` (the newest), oldest first, each stored
    /// whole. Journals written before multi-level rewind have none: their levels are `undo`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub older_undos: Vec<CarriedUndo>,
    /// This entry undoes the compactions of entry `rewinds`. On a checkpoint, informational:
    /// its `undo` and `older_undos` are the levels left after the rewind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewinds: Option<u64>,
}

impl Entry {
    /// Holds the whole history and builds on nothing.
    pub fn is_checkpoint(&self) -> bool {
        self.base.is_none() && self.at == 0 && self.tail.is_none()
    }
}

/// [`Entry`] as written, borrowing the history instead of copying it.
#[derive(Serialize)]
pub struct EntryOut<'a> {
    pub epoch: u64,
    pub seq: u64,
    pub holder: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<u64>,
    pub at: usize,
    pub messages: &'a [Message],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<[usize; 2]>,
    pub state: &'a PersistedState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_at: Option<usize>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub compactions: &'a [CompactionRecord],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undo: Option<StoredUndo>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub older_undos: &'a [CarriedUndo],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewinds: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_clock_is_journaled_and_an_older_state_reads_without_it() {
        let state = PersistedState {
            last_reply_ms: Some(1_700_000_000_123),
            ..PersistedState::default()
        };
        let text = serde_json::to_string(&state).unwrap();
        assert!(text.contains("\"last_reply_ms\":1700000000123"), "{text}");
        assert_eq!(
            serde_json::from_str::<PersistedState>(&text).unwrap(),
            state
        );
        // A state written before the field: no idle clock, as before.
        let old: PersistedState = serde_json::from_str(r#"{"turns": 3}"#).unwrap();
        assert_eq!(old.last_reply_ms, None);
        assert_eq!(old.turns, 3);
        // Without a clock nothing is written for it.
        let none = serde_json::to_string(&PersistedState::default()).unwrap();
        assert!(!none.contains("last_reply_ms"), "{none}");
    }
}
