//! Compaction: the cheap passes (no LLM, no network) and the three-level ladder that brings a
//! history back under its budget.
//!
//! Every pass is a function of the history, the effective policy and the caller's
//! [`SessionState`]; nothing is kept in process globals, so two sessions in one process never
//! share budgets, learned caps or counters. Every lossy step archives its original through
//! [`crate::ccr::Store`] first: a pass stages the new history, archives the originals, and
//! swaps only when every archive succeeded. When the store fails, the pass is a no-op.

pub mod archive;
pub mod budget;
pub mod dedup;
pub mod emergency;
pub mod ladder;
pub mod ledger;
pub mod microcompact;
pub mod mirror;
pub mod pairing;
pub mod probe;
pub mod sections;
pub mod state;
pub mod summarize;
pub mod text;
pub mod timeline;
pub mod trim;
pub mod verbatim;
pub mod window;

pub use ladder::{CompactionOutcome, LadderContext, Preflight, compact, preflight};
pub use probe::{Retention, retention};
pub use state::{SessionState, SummaryVerdict};
pub use summarize::{SummarizeError, Summarizer};
pub use window::{Budget, BudgetInputs, Headroom};

use std::time::Duration;

use cairn_crds::EffectivePolicy;

use crate::ccr::{Key, Store};
use crate::history::Message;

/// The turn's cheap passes, in order: microcompact (with the idle rule when `idle_for` says
/// so), dedup repeated reads, pairing repair. No LLM, no network beyond the archive.
pub async fn cheap_passes(
    history: &mut Vec<Message>,
    policy: &EffectivePolicy,
    idle_for: Option<Duration>,
    store: &dyn Store,
) -> Vec<PassReport> {
    let mc = microcompact::microcompact(history, policy, idle_for, store).await;
    let dd = dedup::dedup_reads(history, policy, store).await;
    let (pr, _) = pairing::repair_archived(history, store, Trigger::Turn).await;
    vec![mc, dd, pr]
}

/// Which pass produced a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    Microcompact,
    IdleClear,
    Dedup,
    Pairing,
    ToolResultBudget,
    Verbatim,
    Trim,
    Summary,
    Emergency,
    Recovery,
    /// A provider's server-side clearing of tool results, mirrored ([`mirror`]).
    Mirror,
    /// Compression or the size ceiling of a tool result entering the history
    /// ([`crate::compress::admit_tool_result`]).
    Admission,
}

impl Pass {
    /// Short stable label for metrics and events.
    pub fn label(self) -> &'static str {
        match self {
            Self::Microcompact => "microcompact",
            Self::IdleClear => "idle_clear",
            Self::Dedup => "dedup",
            Self::Pairing => "pairing",
            Self::ToolResultBudget => "tool_result_budget",
            Self::Verbatim => "verbatim_budget",
            Self::Trim => "trim",
            Self::Summary => "summary",
            Self::Emergency => "emergency",
            Self::Recovery => "recovery",
            Self::Mirror => "mirror",
            Self::Admission => "admission",
        }
    }

    /// Ladder level of the pass (1 trim, 2 summary, 3 emergency), `None` for cheap passes.
    pub fn level(self) -> Option<u8> {
        match self {
            Self::Trim => Some(1),
            Self::Summary => Some(2),
            Self::Emergency => Some(3),
            _ => None,
        }
    }
}

/// Why a pass ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// The turn's routine cheap passes.
    Turn,
    /// The history went over budget or the headroom fell below the auto-compact buffer.
    Auto,
    /// Pre-flight: the request would exceed 85% of a known payload cap.
    PreFlight,
    /// Asked for by a person (`POST /v1/session/compact`).
    Manual,
    /// The recovery ladder, after a classified failure.
    Recovery,
}

impl Trigger {
    pub fn label(self) -> &'static str {
        match self {
            Self::Turn => "turn",
            Self::Auto => "auto",
            Self::PreFlight => "preflight",
            Self::Manual => "manual",
            Self::Recovery => "recovery",
        }
    }
}

/// What one pass did, for events, status and metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct PassReport {
    pub pass: Pass,
    pub trigger: Trigger,
    /// Messages whose content changed.
    pub changed: usize,
    /// Messages removed from the history (their originals are archived).
    pub removed: usize,
    /// Messages added (notices, summaries, synthetic tool results).
    pub added: usize,
    pub bytes_before: usize,
    pub bytes_after: usize,
    /// Keys of the originals archived by this pass.
    pub archived: Vec<Key>,
    /// Set when the pass wanted to change something but the archive refused: nothing changed.
    pub archive_error: Option<&'static str>,
    /// Human-readable remarks ("summary rejected: too short", "floor reached").
    pub notes: Vec<String>,
    /// What the pass kept in sight of what it cut, replaced or removed, when it changed the
    /// history ([`probe::grade_pass`]).
    pub quality: Option<cairn_crds::session::CompactionScore>,
}

impl PassReport {
    pub fn new(pass: Pass, trigger: Trigger, bytes: usize) -> Self {
        Self {
            pass,
            trigger,
            changed: 0,
            removed: 0,
            added: 0,
            bytes_before: bytes,
            bytes_after: bytes,
            archived: Vec::new(),
            archive_error: None,
            notes: Vec::new(),
            quality: None,
        }
    }

    pub fn level(&self) -> Option<u8> {
        self.pass.level()
    }

    /// True when the pass's score says it put something out of sight.
    pub fn lost_sight(&self) -> bool {
        self.quality
            .as_ref()
            .is_some_and(cairn_crds::session::CompactionScore::lost_sight)
    }

    /// True when the pass changed the history.
    pub fn is_change(&self) -> bool {
        self.changed + self.removed + self.added > 0
    }
}
