//! The decisions of one turn, as functions of plain data: what to do before a request is
//! sent (pre-flight, budget, headroom tier, breaker), the output limit of a request, how to
//! judge a reply's stop (complete, escalate, truncated and why), what a rejection leaves to
//! try (the floor before recovery, giving up), and the notices each outcome owes the client.
//! The agent's session loop performs what they decide: the model calls, the ladders, the
//! journal, the notices and metrics.

use std::fmt;

use cairn_crds::EffectivePolicy;

use crate::classify::FailureClass;
use crate::compact::ladder::{Preflight, preflight};
use crate::compact::{Budget, BudgetInputs, Headroom, SessionState, Trigger};
use crate::provider::{ChatResponse, ProviderError, StopReason, Usage};
use crate::recovery::{RecoveryError, RecoveryOutcome};

/// Output tokens a request asks for at least, even when the window is nearly full.
pub const MIN_OUTPUT_TOKENS: u64 = 128;

/// What the pre-flight check decided before a request is sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Preparation {
    /// No payload cap is known and the request is large: the client hears once per session
    /// that a proxy may limit it (the request's size in bytes).
    pub large_history: Option<usize>,
    pub plan: Plan,
}

/// What happens to the history before the request goes out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Plan {
    /// It fits: send as is.
    Send,
    /// It fits, but the headroom is at the warning tier (`left` tokens).
    WarnHeadroom { left: i64 },
    /// Run the compaction ladder first, then refuse a request still in the blocking tier.
    Compact {
        trigger: Trigger,
        budget_ratio: Option<f64>,
    },
}

/// Decides what happens before a request of a `weight`-byte history plus the reserve of
/// `inputs` is sent: pre-flight against a known payload cap (compact hard near it), then the
/// budget and the headroom tiers. The open circuit breaker stops routine auto-compaction,
/// never the compaction the blocking tier demands.
pub fn before_send(
    weight: usize,
    inputs: &BudgetInputs,
    policy: &EffectivePolicy,
    state: &mut SessionState,
) -> Preparation {
    let request_bytes = weight + inputs.reserve_bytes;
    let mut large_history = None;
    match preflight(request_bytes, inputs.payload_cap, state) {
        Preflight::Compact { budget_ratio } => {
            return Preparation {
                large_history,
                plan: Plan::Compact {
                    trigger: Trigger::PreFlight,
                    budget_ratio: Some(budget_ratio),
                },
            };
        }
        Preflight::WarnLargeHistory => large_history = Some(request_bytes),
        Preflight::Send => {}
    }
    let budget = Budget::compute(inputs, policy, state);
    let (headroom, left) = Headroom::of(request_bytes, inputs, policy, state);
    let plan = if headroom == Headroom::Blocking && state.auto_compaction_disabled() {
        Plan::Compact {
            trigger: Trigger::PreFlight,
            budget_ratio: None,
        }
    } else if !budget.fits(weight) || headroom >= Headroom::AutoCompact {
        Plan::Compact {
            trigger: Trigger::Auto,
            budget_ratio: None,
        }
    } else if headroom == Headroom::Warning {
        Plan::WarnHeadroom { left }
    } else {
        Plan::Send
    };
    Preparation {
        large_history,
        plan,
    }
}

/// The notice of a large request with no payload cap known.
pub fn large_history_notice(request_bytes: usize) -> String {
    format!(
        "the request is {request_bytes} bytes and no payload cap is known; if a proxy limits request bodies, set spec.payloadCap"
    )
}

/// The notice of the headroom's warning tier.
pub fn headroom_notice(left: i64, policy: &EffectivePolicy) -> String {
    format!(
        "the context headroom is down to about {left} tokens (autoCompact.warningBufferTokens is {}); the history will be compacted soon",
        policy.auto_compact.warning_buffer_tokens
    )
}

/// The notice of a compaction the turn ran.
pub fn compaction_notice(
    trigger: Trigger,
    level: u8,
    bytes_before: usize,
    bytes_after: usize,
    breaker_opened: bool,
) -> String {
    format!(
        "compacted the history ({}, level {level}) from {bytes_before} to {bytes_after} bytes{}",
        trigger.label(),
        if breaker_opened {
            "; three compactions in a row missed their target, auto-compaction is now off for this session"
        } else {
            ""
        }
    )
}

/// A request in the blocking tier of the headroom: it is not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextFull {
    /// Tokens the request would leave in the window.
    pub left: i64,
    pub window: u64,
    pub blocking_buffer: u64,
    /// The circuit breaker had turned auto-compaction off.
    pub breaker_open: bool,
}

impl fmt::Display for ContextFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request would leave about {} tokens of headroom in the {}-token context window, at or below autoCompact.blockingBufferTokens ({}), and compaction could not make room{}; it was not sent",
            self.left,
            self.window,
            self.blocking_buffer,
            if self.breaker_open {
                " (auto-compaction is off for this session after three compactions missed their target)"
            } else {
                ""
            }
        )
    }
}

/// `Some` when a request of `request_bytes` (history plus reserve) is in the blocking tier.
pub fn blocking(
    request_bytes: usize,
    inputs: &BudgetInputs,
    policy: &EffectivePolicy,
    state: &SessionState,
) -> Option<ContextFull> {
    let (headroom, left) = Headroom::of(request_bytes, inputs, policy, state);
    (headroom == Headroom::Blocking).then(|| ContextFull {
        left,
        window: inputs.context_window,
        blocking_buffer: u64::from(policy.auto_compact.blocking_buffer_tokens),
        breaker_open: state.auto_compaction_disabled(),
    })
}

/// The output limit of one request: the turn's limit, but never more than the window leaves
/// after the prompt (servers such as vLLM and OpenAI reject prompt + limit > window).
pub fn output_limit(max_out: u64, window: u64, state: &SessionState, sent_weight: usize) -> u64 {
    let prompt = state.chars_per_token.tokens(sent_weight);
    max_out.min(window.saturating_sub(prompt).max(MIN_OUTPUT_TOKENS))
}

/// Why a reply stopped at a length limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truncation {
    /// The output-token limit sent, which escalation may raise.
    OutputLimit,
    /// The context window filled during generation (the reply stopped short of the limit,
    /// or prompt and reply add up to the window): a higher limit cannot help.
    ContextFull,
    /// The limit sent was already all the window leaves after the prompt.
    WindowBound,
}

impl Truncation {
    pub const ALL: [Self; 3] = [Self::OutputLimit, Self::ContextFull, Self::WindowBound];

    pub fn judge(usage: &Usage, sent_limit: u64, turn_limit: u64, window: u64) -> Self {
        let out = usage.output_tokens;
        let total = usage.input_tokens + out;
        if out > 0 && (out < sent_limit || total >= window) {
            Self::ContextFull
        } else if sent_limit < turn_limit {
            Self::WindowBound
        } else {
            Self::OutputLimit
        }
    }

    /// The stable label (`status`, metrics, the API's `truncated`).
    pub fn label(self) -> &'static str {
        match self {
            Self::OutputLimit => "output_limit",
            Self::ContextFull => "context_full",
            Self::WindowBound => "window_bound",
        }
    }

    /// Why the reply is incomplete, for the client's notice.
    pub fn explain(self, usage: &Usage, limit: u64, window: u64) -> String {
        match self {
            Self::ContextFull => format!(
                "the model's context window filled during generation ({} prompt + {} reply tokens)",
                usage.input_tokens, usage.output_tokens
            ),
            Self::WindowBound => format!(
                "the output limit of {limit} tokens was all the context window ({window} tokens) left after the prompt"
            ),
            Self::OutputLimit => format!(
                "the output limit of {limit} tokens could not be raised (the model's maximum, or escalations used up)"
            ),
        }
    }

    /// The window a filled context teaches: the prompt and reply the server fit, when that
    /// is less than the configured window.
    pub fn learned_window(self, usage: &Usage, configured_window: u64) -> Option<u64> {
        let total = usage.input_tokens + usage.output_tokens;
        (self == Self::ContextFull && total > 0 && total < configured_window).then_some(total)
    }
}

/// How a reply that arrived ends the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopVerdict {
    /// A whole reply (or tool calls).
    Complete,
    /// Cut at the output limit sent: raise it and continue, when escalations are left.
    Escalate,
    /// Cut short in a way a higher limit cannot fix.
    Truncated(Truncation),
}

/// Judges the stop of `reply`, sent with output limit `sent_limit` in a turn whose limit is
/// `turn_limit`, against a window of `window` tokens.
pub fn judge_stop(
    reply: &ChatResponse,
    sent_limit: u64,
    turn_limit: u64,
    window: u64,
) -> StopVerdict {
    if reply.stop != StopReason::MaxTokens || !reply.message.tool_calls.is_empty() {
        return StopVerdict::Complete;
    }
    match Truncation::judge(&reply.usage, sent_limit, turn_limit, window) {
        Truncation::OutputLimit => StopVerdict::Escalate,
        cut => StopVerdict::Truncated(cut),
    }
}

/// The notice of an escalation of the output limit.
pub fn escalation_notice(limit: u64, raised_to: u64) -> String {
    format!("the reply hit the output-token limit of {limit}; continuing with {raised_to}")
}

/// Rejected again although what remains compactable was already cut down, and the part that
/// can never shrink is over the learned cap: no retry can pass.
pub fn floor_before_recovery(
    class: FailureClass,
    state: &SessionState,
    uncompactable: u64,
    rejected: u64,
) -> Option<RecoveryError> {
    let cap = state.learned_payload_cap?;
    (class.is_payload() && state.recovery_attempts >= 1 && uncompactable >= cap).then_some(
        RecoveryError::Floor {
            uncompactable,
            rejected,
        },
    )
}

/// How a turn fails when recovery gives up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// What every request must carry cannot fit: the message says what to change.
    Floor(String),
    /// The provider's failure, with why recovery could not help when it tried.
    Provider {
        class: &'static str,
        message: String,
    },
}

/// The failure a turn reports when recovery from `err` (class `class`) ended in `re`.
pub fn give_up(class: FailureClass, err: &ProviderError, re: &RecoveryError) -> GiveUp {
    match re {
        RecoveryError::Floor { .. } | RecoveryError::WindowFloor { .. } => {
            GiveUp::Floor(re.to_string())
        }
        RecoveryError::NotRecoverable(_) => GiveUp::Provider {
            class: class.label(),
            message: err.to_string(),
        },
        RecoveryError::Exhausted(_)
        | RecoveryError::Stuck { .. }
        | RecoveryError::MemoryQueue { .. } => GiveUp::Provider {
            class: class.label(),
            message: format!("{err} ({re})"),
        },
    }
}

/// The notices a recovery attempt owes the client, as `(kind, message)` in order: the
/// attempt, a cap learned from the network path, a floor warning, a window and ratio learned
/// from the server's count. `chars_per_token` is the session's ratio after the attempt.
pub fn recovery_notices(
    class: FailureClass,
    err: &ProviderError,
    o: &RecoveryOutcome,
    sent_weight: usize,
    chars_per_token: f64,
) -> Vec<(&'static str, String)> {
    let mut notices = vec![(
        "recovery",
        format!(
            "{} ({}); recovery attempt {} took the history from {} to {} bytes",
            class.label(),
            err.label(),
            o.attempt,
            o.report.bytes_before,
            o.report.bytes_after
        ),
    )];
    if let Some(cap) = o.learned_cap {
        notices.push((
            "learned_cap",
            format!(
                "the network path rejected {} bytes; requests now stay under {cap} bytes",
                err.request_bytes
            ),
        ));
    }
    if let Some(w) = &o.floor_warning {
        notices.push(("warning", w.clone()));
    }
    if let Some(tokens) = o.counted.prompt_tokens {
        notices.push((
            "learned_window",
            format!(
                "the server counted {tokens} tokens for a {sent_weight}-byte request ({chars_per_token:.2} bytes per token){}; requests are now budgeted with its numbers",
                o.learned_window
                    .map(|w| format!(" and enforces a context window of {w} tokens"))
                    .unwrap_or_default()
            ),
        ));
    }
    notices
}
