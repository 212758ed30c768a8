//! Everything one session learns while it runs. Owned by the caller (the session loop), one
//! per session: nothing here is shared between sessions or kept in a global.

use cairn_crds::EffectivePolicy;

use crate::tokens::CharsPerToken;

/// Consecutive failed compactions after which auto-compaction stops for the session.
pub const CIRCUIT_BREAKER_FAILURES: u32 = 3;
/// Compactions that skip level 2 after a summary that did not bring the history under budget.
pub const SKIP_LEVEL2_AFTER_NON_CONVERGING: u32 = 2;
/// The most compactions level 2 backs off for after rejected or failed summaries in a row
/// (1, 2, 4, then this many).
pub const MAX_LEVEL2_BACKOFF: u32 = 8;
/// Recovery halves the tool-result budgets at most this many times (down to 1/8).
pub const MAX_TOOL_BUDGET_HALVINGS: u32 = 3;

/// How one level-2 summary ended, for the counters, the metrics and the backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SummaryVerdict {
    Accepted,
    /// The quality gate rejected both tries, for this reason (`Rejection::label`).
    Rejected(&'static str),
    /// The summarizer call failed, or the archive refused the segment.
    Failed,
}

impl SummaryVerdict {
    /// The `outcome` label of `cairn_agent_summaries_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Rejected(_) => "rejected",
            Self::Failed => "failed",
        }
    }
}

/// Per-session state of the compaction and recovery machinery.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionState {
    /// Calibrated characters per token.
    pub chars_per_token: CharsPerToken,
    /// Byte cap learned from a payload rejection; only ever tightens, and is forgotten when
    /// `spec.payloadCap` changes.
    pub learned_payload_cap: Option<u64>,
    /// The configured payload cap (`none` or bytes) the learned cap was learned under.
    pub payload_cap_basis: Option<String>,
    /// Context window a server named in an overflow error (or filled during generation);
    /// only ever tightens, and is forgotten when the configured window or the model changes.
    pub learned_window: Option<u64>,
    /// `model@configured-window` the learned window belongs to.
    pub learned_window_basis: Option<String>,
    /// Window a dedicated summarizer model's server named (the session's own model learns
    /// into `learned_window`).
    pub summarizer_window: Option<u64>,
    /// Replies reported as cut short with no fix possible.
    pub truncated_replies: u64,
    /// Failed compactions in a row (reset by a success).
    pub consecutive_failures: u32,
    /// Upcoming compactions that go straight from level 1 to level 3.
    pub skip_level2: u32,
    /// Tool-result budget halvings restored from a journal of an older agent (recovery aims
    /// at a target now and halves nothing); cleared by the next successful turn.
    pub tool_budget_halvings: u32,
    /// The payload-limit guidance is in the history already (never stacked).
    pub payload_notice_injected: bool,
    /// Recovery attempts made in the current turn.
    pub recovery_attempts: u32,
    /// Output-token escalations made in the current turn.
    pub token_escalations: u32,
    /// The once-per-session "large history, no payload cap known" warning was given.
    pub large_history_warned: bool,
    /// Level-2 summaries rejected or failed in a row (reset by an accepted one): the backoff.
    pub summary_failures_in_row: u32,
    /// What level 2's summaries came to (`status.session.summaries`).
    pub summaries: cairn_crds::session::SummaryStats,
    /// What compactions kept in sight (`status.session.compactionQuality`).
    pub quality: cairn_crds::session::CompactionQuality,
    /// Counters for status and metrics.
    pub compactions: u64,
    pub level3_compactions: u64,
    pub recoveries: u64,
    /// The newest compactions (the session page's timeline).
    pub timeline: super::timeline::Timeline,
}

impl SessionState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Calibrates chars-per-token from a reply: the request's size and the provider's
    /// reported input tokens.
    pub fn observe_usage(&mut self, request_bytes: u64, input_tokens: u64) {
        self.chars_per_token.observe(request_bytes, input_tokens);
    }

    /// Resets the per-turn counters; call when a new user message starts a turn.
    pub fn begin_turn(&mut self) {
        self.recovery_attempts = 0;
        self.token_escalations = 0;
    }

    /// Records how a level-2 summary ended and backs level 2 off after a rejection or a
    /// failure: the next 1, 2, 4, then [`MAX_LEVEL2_BACKOFF`] compactions skip it, until a
    /// summary passes.
    pub fn record_summary(&mut self, verdict: SummaryVerdict) {
        match verdict {
            SummaryVerdict::Accepted => {
                self.summaries.accepted += 1;
                self.summary_failures_in_row = 0;
                return;
            }
            SummaryVerdict::Rejected(reason) => {
                self.summaries.rejected += 1;
                self.summaries.last_rejection = Some(reason.to_owned());
            }
            SummaryVerdict::Failed => self.summaries.failed += 1,
        }
        self.summary_failures_in_row = self.summary_failures_in_row.saturating_add(1);
        let backoff = 1_u32
            .checked_shl(self.summary_failures_in_row - 1)
            .unwrap_or(u32::MAX)
            .min(MAX_LEVEL2_BACKOFF);
        self.skip_level2 = self.skip_level2.max(backoff);
    }

    /// True when the circuit breaker has opened.
    pub fn auto_compaction_disabled(&self) -> bool {
        self.consecutive_failures >= CIRCUIT_BREAKER_FAILURES
    }

    /// Learns a payload cap; keeps the tighter of the old and the new one. Returns the cap.
    pub fn learn_payload_cap(&mut self, cap: u64) -> u64 {
        let cap = self.learned_payload_cap.map_or(cap, |old| old.min(cap));
        self.learned_payload_cap = Some(cap);
        cap
    }

    /// Learns a context window; keeps the tighter of the old and the new one.
    pub fn learn_window(&mut self, window: u64) -> u64 {
        let w = self.learned_window.map_or(window, |old| old.min(window));
        self.learned_window = Some(w);
        w
    }

    /// Forgets a learned window that was learned for another model or configured window.
    /// Returns true when it did.
    pub fn rebase_window(&mut self, basis: &str) -> bool {
        if self.learned_window_basis.as_deref() == Some(basis) {
            return false;
        }
        let had = self.learned_window.take().is_some();
        self.learned_window_basis = Some(basis.to_owned());
        had
    }

    /// Forgets a learned payload cap that was learned under another configured cap (the
    /// platform team's new number is the evidence now). Returns the cap forgotten.
    pub fn rebase_payload_cap(&mut self, configured: Option<u64>) -> Option<u64> {
        let basis = payload_cap_basis(configured);
        if self.payload_cap_basis.as_deref() == Some(basis.as_str()) {
            return None;
        }
        // A journal of an older agent names no basis: its cap is kept under the current one.
        let known = self.payload_cap_basis.is_some();
        self.payload_cap_basis = Some(basis);
        if known {
            self.payload_notice_injected = false;
            self.learned_payload_cap.take()
        } else {
            None
        }
    }

    /// The window requests must fit: the configured one, or the tighter one a server named.
    pub fn effective_window(&self, configured: u64) -> u64 {
        self.learned_window
            .map_or(configured, |w| w.min(configured))
    }

    /// The tightest payload cap known: the configured one or the learned one.
    pub fn effective_payload_cap(&self, configured: Option<u64>) -> Option<u64> {
        match (configured, self.learned_payload_cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The per-request tool-result limits in force, after recovery's halvings.
    pub fn tool_result_limits(&self, policy: &EffectivePolicy) -> ToolResultLimits {
        let shift = self.tool_budget_halvings.min(MAX_TOOL_BUDGET_HALVINGS);
        ToolResultLimits {
            per_result: (policy.tool_results.per_result_chars as usize) >> shift,
            per_turn: (policy.tool_results.per_turn_chars as usize) >> shift,
        }
    }

    pub(crate) fn record_outcome(&mut self, success: bool) {
        if success {
            self.consecutive_failures = 0;
        } else {
            self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        }
    }
}

/// What a learned payload cap belongs to: the configured cap, or `none`.
fn payload_cap_basis(configured: Option<u64>) -> String {
    configured.map_or_else(|| "none".to_owned(), |c| c.to_string())
}

/// Per-request tool-result limits, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolResultLimits {
    pub per_result: usize,
    pub per_turn: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learned_window_only_tightens_and_is_forgotten_on_a_new_basis() {
        let mut s = SessionState::new();
        assert!(!s.rebase_window("m@32768"), "nothing learned yet");
        assert_eq!(s.learn_window(2_048), 2_048);
        assert_eq!(s.learn_window(4_096), 2_048, "never loosens");
        assert_eq!(s.effective_window(32_768), 2_048);
        assert_eq!(
            s.effective_window(1_024),
            1_024,
            "a smaller configured window wins"
        );
        assert!(!s.rebase_window("m@32768"), "same model and window: kept");
        assert_eq!(s.learned_window, Some(2_048));
        assert!(s.rebase_window("m@65536"), "the configured window changed");
        assert_eq!(s.learned_window, None);
        s.learn_window(2_048);
        assert!(s.rebase_window("other@65536"), "the model changed");
        assert_eq!(s.effective_window(65_536), 65_536);
    }

    #[test]
    fn a_learned_cap_is_forgotten_when_the_configured_cap_changes() {
        let mut s = SessionState::new();
        assert_eq!(
            s.rebase_payload_cap(None),
            None,
            "first basis: nothing to forget"
        );
        s.learn_payload_cap(1_000);
        s.payload_notice_injected = true;
        assert_eq!(s.rebase_payload_cap(None), None, "same basis: kept");
        assert_eq!(s.learned_payload_cap, Some(1_000));
        assert_eq!(s.rebase_payload_cap(Some(2_000_000)), Some(1_000));
        assert_eq!(s.learned_payload_cap, None);
        assert!(
            !s.payload_notice_injected,
            "the guidance may be given again"
        );
        s.learn_payload_cap(900);
        assert_eq!(
            s.rebase_payload_cap(None),
            Some(900),
            "unset is a change too"
        );
    }

    #[test]
    fn a_cap_restored_without_a_basis_is_kept() {
        let mut s = SessionState::new();
        s.learn_payload_cap(1_000);
        assert_eq!(s.rebase_payload_cap(Some(5_000)), None);
        assert_eq!(s.learned_payload_cap, Some(1_000));
        assert_eq!(s.rebase_payload_cap(Some(6_000)), Some(1_000));
    }
}
