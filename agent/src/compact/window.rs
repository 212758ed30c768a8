//! The history budget and the headroom thresholds.
//!
//! Budget = contextWindow × budgetRatio × chars-per-token, capped at 0.7 × the payload cap
//! when one is known, minus the uncompactable reserve (tool catalog), never below a quarter
//! of itself.

use cairn_crds::EffectivePolicy;

use super::SessionState;

/// Share of a payload cap the history may fill; the rest covers the request's framing, the
/// tool catalog and the reply-side overhead of the wire format.
pub const PAYLOAD_CAP_SHARE: f64 = 0.7;

/// What the budget is computed from, besides policy and session state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetInputs {
    /// Context window of the model, in tokens.
    pub context_window: u64,
    /// The configured payload cap in bytes (`spec.payloadCap`), if any.
    pub payload_cap: Option<u64>,
    /// Bytes every request carries that compaction can never remove (the tool catalog).
    pub reserve_bytes: usize,
}

/// A history budget in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Bytes the history may weigh.
    pub chars: usize,
}

impl Budget {
    /// The budget with the policy's ratio.
    pub fn compute(inputs: &BudgetInputs, policy: &EffectivePolicy, state: &SessionState) -> Self {
        Self::with_ratio(inputs, policy.budget_ratio, state)
    }

    /// The budget with an explicit ratio (pre-flight uses a tighter one).
    pub fn with_ratio(inputs: &BudgetInputs, ratio: f64, state: &SessionState) -> Self {
        let cpt = state.chars_per_token.get();
        let mut b = (inputs.context_window as f64 * ratio * cpt) as usize;
        if let Some(cap) = state.effective_payload_cap(inputs.payload_cap) {
            b = b.min((cap as f64 * PAYLOAD_CAP_SHARE) as usize);
        }
        let chars = b.saturating_sub(inputs.reserve_bytes).max(b / 4);
        Self { chars }
    }

    pub fn fits(&self, weight: usize) -> bool {
        weight <= self.chars
    }
}

/// Where the remaining headroom of the context window stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Headroom {
    Ok,
    /// At or below `warningBufferTokens`: tell someone.
    Warning,
    /// At or below `bufferTokens`: compact on our own.
    AutoCompact,
    /// At or below `blockingBufferTokens`: do not send before compacting.
    Blocking,
}

impl Headroom {
    /// Headroom of a request weighing `request_bytes` (history plus reserve).
    pub fn of(
        request_bytes: usize,
        inputs: &BudgetInputs,
        policy: &EffectivePolicy,
        state: &SessionState,
    ) -> (Self, i64) {
        let used = state.chars_per_token.tokens(request_bytes) as i64;
        let left = inputs.context_window as i64 - used;
        let a = &policy.auto_compact;
        let level = if left <= i64::from(a.blocking_buffer_tokens) {
            Self::Blocking
        } else if left <= i64::from(a.buffer_tokens) {
            Self::AutoCompact
        } else if left <= i64::from(a.warning_buffer_tokens) {
            Self::Warning
        } else {
            Self::Ok
        };
        (level, left)
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warning => "warning",
            Self::AutoCompact => "auto_compact",
            Self::Blocking => "blocking",
        }
    }
}

/// The target a compaction aims for: under budget and with more headroom than the
/// auto-compact buffer.
pub fn target_chars(
    budget: Budget,
    inputs: &BudgetInputs,
    policy: &EffectivePolicy,
    state: &SessionState,
) -> usize {
    let window_tokens = inputs
        .context_window
        .saturating_sub(u64::from(policy.auto_compact.buffer_tokens));
    let by_headroom = state
        .chars_per_token
        .chars(window_tokens)
        .saturating_sub(inputs.reserve_bytes);
    budget.chars.min(by_headroom.max(budget.chars / 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(window: u64, cap: Option<u64>, reserve: usize) -> BudgetInputs {
        BudgetInputs {
            context_window: window,
            payload_cap: cap,
            reserve_bytes: reserve,
        }
    }

    #[test]
    fn budget_formula() {
        let p = EffectivePolicy::default();
        let s = SessionState::new();
        // 200k tokens × 0.6 × 4 chars = 480,000
        assert_eq!(
            Budget::compute(&inputs(200_000, None, 0), &p, &s).chars,
            480_000
        );
        // capped at 0.7 × 500,000 = 350,000, minus reserve 50,000
        assert_eq!(
            Budget::compute(&inputs(200_000, Some(500_000), 50_000), &p, &s).chars,
            300_000
        );
        // never below a quarter of itself
        assert_eq!(
            Budget::compute(&inputs(200_000, None, 1_000_000), &p, &s).chars,
            120_000
        );
        let mut learned = SessionState::new();
        learned.learn_payload_cap(100_000);
        assert_eq!(
            Budget::compute(&inputs(200_000, Some(500_000), 0), &p, &learned).chars,
            70_000
        );
    }

    #[test]
    fn headroom_thresholds() {
        let p = EffectivePolicy::default();
        let s = SessionState::new();
        let i = inputs(100_000, None, 0);
        let at =
            |tokens_left: u64| Headroom::of(((100_000 - tokens_left) * 4) as usize, &i, &p, &s).0;
        assert_eq!(at(50_000), Headroom::Ok);
        assert_eq!(at(20_000), Headroom::Warning);
        assert_eq!(at(13_000), Headroom::AutoCompact);
        assert_eq!(at(3_000), Headroom::Blocking);
    }
}
