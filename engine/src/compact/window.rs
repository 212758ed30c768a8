//! The history budget and the headroom thresholds.
//!
//! Budget = contextWindow × budgetRatio × chars-per-token, capped at 0.7 × the payload cap
//! when one is known, minus the uncompactable reserve (tool catalog), never below a quarter
//! of itself.

use cairn_crds::EffectivePolicy;

use super::SessionState;
use crate::history::{self, Message};
use crate::provider::ToolSpec;

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
        let a = Buffers::of(inputs.context_window, policy);
        let level = if left <= a.blocking as i64 {
            Self::Blocking
        } else if left <= a.auto_compact as i64 {
            Self::AutoCompact
        } else if left <= a.warning as i64 {
            Self::Warning
        } else {
            Self::Ok
        };
        (level, left)
    }

    /// The tier's name in `status.session.headroom`.
    pub fn status_name(self) -> &'static str {
        match self {
            Self::Ok => "Ok",
            Self::Warning => "Warning",
            Self::AutoCompact => "AutoCompact",
            Self::Blocking => "Blocking",
        }
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

/// The largest share of the window the auto-compact buffer may take.
pub const MAX_BUFFER_SHARE: f64 = 0.5;

/// The headroom buffers in force for a window, in tokens.
///
/// The policy's buffers (13,000 / 20,000 / 3,000 by default) are sized for windows of 100k
/// tokens and more; on a small window they would exceed the window itself, so every request
/// would be "blocking" and every compaction would aim below a quarter of the budget. They
/// are scaled down together so that the auto-compact buffer never exceeds
/// [`MAX_BUFFER_SHARE`] of the window. Buffers that already fit are used as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffers {
    pub warning: u64,
    pub auto_compact: u64,
    pub blocking: u64,
}

impl Buffers {
    pub fn of(window: u64, policy: &EffectivePolicy) -> Self {
        let a = &policy.auto_compact;
        let free = (window as f64 * MAX_BUFFER_SHARE).floor();
        let buffer = f64::from(a.buffer_tokens.max(1));
        let scale = (free / buffer).min(1.0);
        let scaled = |t: u32| (f64::from(t) * scale).floor() as u64;
        Self {
            warning: scaled(a.warning_buffer_tokens),
            auto_compact: scaled(a.buffer_tokens),
            blocking: scaled(a.blocking_buffer_tokens),
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
        .saturating_sub(Buffers::of(inputs.context_window, policy).auto_compact);
    let by_headroom = state
        .chars_per_token
        .chars(window_tokens)
        .saturating_sub(inputs.reserve_bytes);
    budget.chars.min(by_headroom.max(budget.chars / 4))
}

/// Bytes a request really carries for this history and tool catalog: every message's weight
/// (content, reasoning, tool-call names and arguments, images, system parts) plus the catalog.
pub fn request_weight(messages: &[Message], tools: &[ToolSpec]) -> usize {
    history::weight(messages) + catalog_weight(tools)
}

/// Bytes the tool catalog adds to every request.
pub fn catalog_weight(tools: &[ToolSpec]) -> usize {
    tools.iter().map(ToolSpec::weight).sum()
}

/// The part of every request that no compaction can remove: system messages and the tool
/// catalog. The recovery ladder's floor diagnosis compares it with a rejected size.
pub fn uncompactable_bytes(messages: &[Message], tools: &[ToolSpec]) -> usize {
    system_weight(messages.iter()) + catalog_weight(tools)
}

/// The weight of the system messages among `messages`.
pub fn system_weight<'a>(messages: impl Iterator<Item = &'a Message>) -> usize {
    messages
        .filter(|m| m.is_system())
        .map(Message::weight)
        .sum()
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
    fn weights_are_honest() {
        let tools = vec![ToolSpec {
            name: "recall".into(),
            description: "bring back an archived original".into(),
            parameters: serde_json::json!({"type": "object"}),
        }];
        let h = vec![Message::system("sys"), Message::user("hello")];
        let catalog = 6 + 31 + r#"{"type":"object"}"#.len();
        assert_eq!(catalog_weight(&tools), catalog);
        assert_eq!(request_weight(&h, &tools), 8 + catalog);
        assert_eq!(uncompactable_bytes(&h, &tools), 3 + catalog);
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

    #[test]
    fn buffers_scale_down_on_small_windows() {
        let p = EffectivePolicy::default();
        let big = Buffers::of(200_000, &p);
        assert_eq!(
            (big.warning, big.auto_compact, big.blocking),
            (20_000, 13_000, 3_000)
        );
        // Half of 2,048: the auto-compact buffer is 1,024 tokens, the others scale along.
        let small = Buffers::of(2_048, &p);
        assert_eq!(small.auto_compact, 1_024);
        assert!(small.blocking < small.auto_compact && small.auto_compact < small.warning);
        let s = SessionState::new();
        let i = inputs(2_048, None, 0);
        // A request at the budget (60 % of the window) is not yet blocking.
        let at_budget = Headroom::of(2_048 * 6 / 10 * 4, &i, &p, &s).0;
        assert!(at_budget < Headroom::Blocking, "{at_budget:?}");
        let b = Budget::compute(&i, &p, &s);
        assert_eq!(target_chars(b, &i, &p, &s), 1_024 * 4);
        // Buffers that fit the window are used as configured.
        let fits = Buffers::of(10_000, &p);
        assert_eq!(fits.auto_compact, 5_000);
    }
}
