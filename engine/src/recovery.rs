//! The recovery ladder: what to do after a classified failure, at most
//! `recovery.maxAttempts` times per turn.
//!
//! Every attempt first learns what the failure says: an overflow error's own numbers teach
//! the session its real window and its real bytes per token for the request that failed
//! ([`crate::overflow`]); a payload-class failure teaches a cap of ¾ of the exact size of the
//! rejected request ([`ASSUMED_REJECTED_BYTES`] when the size is unknown), runs the floor
//! diagnosis and adds the payload-limit guidance once per session. Then it computes the size
//! the history must reach — the session's budget under what it just learned, less a safety
//! margin, and strictly below the rejected size — and hands that target to the one shrinking
//! engine, the compaction ladder ([`crate::compact::ladder`], without a summarizer call).
//! Its last level keeps fewer and fewer messages, each cut to its floor (archived first),
//! until the target is met. When the system prompt, the tool catalog and the newest user
//! message alone cannot fit the window, recovery fails fast with the floor diagnosis; an
//! attempt that could not make the request smaller is never sent.
//!
//! On a reply stopped by the output-token limit, [`escalate_output`] doubles the limit (up to
//! the model's own maximum) and asks the model to continue.

use cairn_crds::EffectivePolicy;

use crate::ccr::Store;
use crate::classify::FailureClass;
use crate::compact::emergency::floor_with_keep;
use crate::compact::ladder::{self, LadderContext};
use crate::compact::{Budget, BudgetInputs, Pass, PassReport, SessionState, Trigger, window};
use crate::history::{self, Message};
use crate::overflow::{ServerCount, server_count};
use crate::provider::ProviderError;

/// A payload rejection of a request no larger than the uncompactable part plus this much
/// is no evidence of a body-size limit worth learning (no proxy limits bodies to a few KB;
/// a cap that small would compact every later turn down to nothing): it is a floor
/// diagnosis, and no cap is learned.
pub const MIN_PLAUSIBLE_ROOM_BYTES: u64 = 4 * 1024;
/// The rejected size assumed when a payload failure carries no request size.
pub const ASSUMED_REJECTED_BYTES: u64 = 4 * 1024 * 1024;
/// First line of the payload-limit guidance; also how it is found again in a history.
pub const PAYLOAD_NOTICE_HEADER: &str = "[SYSTEM NOTICE — PAYLOAD LIMIT HIT]";
/// Asked of the model after a reply cut off at the output-token limit.
pub const CONTINUATION_MESSAGE: &str = "Your response was cut off at the token limit. Resume DIRECTLY from where you stopped — do not repeat any content. Do not apologize, recap or restart; continue mid-sentence if that is where you stopped.";
/// Share of the computed target a recovery aims for: the new request differs from the one
/// the server counted, so its bytes per token do too.
pub const TARGET_MARGIN: f64 = 0.9;
/// Without any number to go by (the estimate says the request fits, the server says it does
/// not), each attempt halves what it keeps.
pub const BLIND_SHRINK: f64 = 0.5;
/// Share of the window the floor may fill before recovery gives up: the rest is the least
/// room a reply needs.
pub const FLOOR_WINDOW_SHARE: f64 = 0.9;

/// Why recovery cannot help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    #[error("{} failures are not recoverable by shrinking the request", .0.label())]
    NotRecoverable(FailureClass),
    #[error("recovery gave up after {0} attempts this turn")]
    Exhausted(u32),
    /// The part of every request that can never be compacted is itself too large.
    #[error(
        "the system prompt and tool catalog alone are {uncompactable} bytes, but the network path rejected a {rejected}-byte request: no compaction can fix this. Shorten the system prompt, offer fewer tools, or raise the body-size limit of the proxy in front of the provider (and set spec.payloadCap to match)"
    )]
    Floor { uncompactable: u64, rejected: u64 },
    /// The context-window twin of [`RecoveryError::Floor`]: what every request must carry
    /// does not fit the model's window.
    #[error(
        "the system prompt, the tool catalog and the newest message need about {floor_tokens} tokens even with everything else dropped and the message cut to its floor, but requests must fit a context window of {window} tokens (spec.contextWindow, or the server's own when smaller): no compaction can fix this. Shorten the system prompt or the message, offer fewer tools, or use a model with a larger window"
    )]
    WindowFloor { floor_tokens: u64, window: u64 },
    /// Nothing could be made smaller (the archive refused the originals, so nothing was cut):
    /// the rejected request is not resent.
    #[error(
        "recovery could not make the rejected request smaller (the archive refused: {archive_error}), so it was not resent; nothing was dropped"
    )]
    Stuck { archive_error: &'static str },
    /// The session memory's queue refused what the attempt removed, so the rewrite was undone
    /// (a compaction never drops what the memory has not queued): the rejected request is not
    /// resent unchanged.
    #[error(
        "recovery shrank the rejected request, but the session memory's queue could not take what it removed ({queue_error}); the rewrite was undone and the same request was not resent; nothing was dropped"
    )]
    MemoryQueue { queue_error: String },
}

impl RecoveryError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotRecoverable(_) => "not_recoverable",
            Self::Exhausted(_) => "exhausted",
            Self::Floor { .. } | Self::WindowFloor { .. } => "floor",
            Self::Stuck { .. } => "stuck",
            Self::MemoryQueue { .. } => "memory_queue",
        }
    }
}

/// What recovery needs besides the history and the session state.
pub struct RecoveryContext<'a> {
    pub policy: &'a EffectivePolicy,
    pub store: &'a dyn Store,
    /// Bytes of the parts no compaction can remove: system prompt and tool catalog.
    pub uncompactable_bytes: u64,
    /// The budget inputs with the *configured* window (the session's learned window is
    /// applied here) and the configured payload cap.
    pub inputs: BudgetInputs,
    /// Weight of the request that failed, as cairn measures it (history as sent plus tool
    /// catalog): the basis the server's token count is converted with.
    pub sent_weight: usize,
}

/// What one recovery attempt did.
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveryOutcome {
    /// 1, 2, ... up to `recovery.maxAttempts`.
    pub attempt: u32,
    pub class: FailureClass,
    /// The session's payload cap after this failure (payload classes only).
    pub learned_cap: Option<u64>,
    /// The numbers the overflow error carried.
    pub counted: ServerCount,
    /// The session's window after this failure, when a server named one.
    pub learned_window: Option<u64>,
    /// The history weight the attempt aimed for.
    pub target: usize,
    /// The payload-limit guidance was added by this attempt.
    pub notice_injected: bool,
    /// Set when the uncompactable part reaches ¾ of the rejected size.
    pub floor_warning: Option<String>,
    pub report: PassReport,
    /// What its compaction kept in sight of what it replaced, when it changed the history.
    pub quality: Option<cairn_crds::session::CompactionScore>,
}

/// Runs the next recovery attempt on `history` after a failure of class `class`.
pub async fn recover(
    history: &mut Vec<Message>,
    err: &ProviderError,
    class: FailureClass,
    ctx: &RecoveryContext<'_>,
    state: &mut SessionState,
) -> Result<RecoveryOutcome, RecoveryError> {
    if !class.is_recoverable() {
        return Err(RecoveryError::NotRecoverable(class));
    }
    let max = ctx.policy.recovery.max_attempts;
    if state.recovery_attempts >= max {
        return Err(RecoveryError::Exhausted(state.recovery_attempts));
    }
    let mut learned_cap = None;
    let mut floor_warning = None;
    if class.is_payload() {
        let rejected = if err.request_bytes == 0 {
            ASSUMED_REJECTED_BYTES
        } else {
            err.request_bytes
        };
        if ctx.uncompactable_bytes + MIN_PLAUSIBLE_ROOM_BYTES >= rejected {
            return Err(RecoveryError::Floor {
                uncompactable: ctx.uncompactable_bytes,
                rejected,
            });
        }
        if ctx.uncompactable_bytes >= rejected / 4 * 3 {
            floor_warning = Some(format!(
                "the system prompt and tool catalog ({} bytes) use over three quarters of the {rejected}-byte request the network path rejected; little room is left for the conversation",
                ctx.uncompactable_bytes
            ));
        }
        learned_cap = Some(state.learn_payload_cap(rejected / 4 * 3));
    }
    let counted = if class == FailureClass::ContextOverflow {
        learn_from_count(err, ctx, state)
    } else {
        ServerCount::default()
    };
    let learned_window = counted.window.and(state.learned_window);

    let weight = history::weight(history);
    let target = target_for(history, weight, &counted, learned_cap, ctx, state)?;

    state.recovery_attempts += 1;
    state.recoveries += 1;
    let attempt = state.recovery_attempts;
    let mut report = PassReport::new(Pass::Recovery, Trigger::Recovery, weight);
    report.notes.push(format!(
        "attempt {attempt} after {}: target {target} bytes",
        class.label()
    ));

    let inputs = effective_inputs(ctx, state);
    let lctx = LadderContext {
        policy: ctx.policy,
        inputs,
        store: ctx.store,
        summarizer: None,
        trigger: Trigger::Recovery,
        budget_ratio: None,
        target: Some(target),
    };
    let out = ladder::compact(history, &lctx, state).await;
    for r in &out.reports {
        merge(&mut report, r);
    }

    let mut notice_injected = false;
    if class.is_payload() && !payload_notice_present(history, state) {
        let cap = learned_cap.unwrap_or(ASSUMED_REJECTED_BYTES);
        history.push(Message::user(payload_notice(err.request_bytes, cap)));
        state.payload_notice_injected = true;
        notice_injected = true;
        report.added += 1;
    }
    report.bytes_after = history::weight(history);
    if report.bytes_after >= weight {
        // Resending the same bytes can only fail the same way.
        return Err(match report.archive_error {
            Some(archive_error) => RecoveryError::Stuck { archive_error },
            None => floor_error(history, class, err, ctx, state),
        });
    }
    report.quality.clone_from(&out.quality);
    Ok(RecoveryOutcome {
        attempt,
        class,
        learned_cap,
        counted,
        learned_window,
        target,
        notice_injected,
        floor_warning,
        report,
        quality: out.quality,
    })
}

/// An attempt's outcome once what it removed went to the session memory's queue (`queued`:
/// `Ok`, or the queue's error). A refused queue undoes the rewrite, which would leave the
/// rejected request to go out again unchanged: the attempt fails instead
/// ([`RecoveryError::MemoryQueue`]). An attempt that already failed stays as it was.
pub fn after_memory_queue(
    outcome: Result<RecoveryOutcome, RecoveryError>,
    queued: Result<(), String>,
) -> Result<RecoveryOutcome, RecoveryError> {
    match (outcome, queued) {
        (Ok(_), Err(queue_error)) => Err(RecoveryError::MemoryQueue { queue_error }),
        (outcome, _) => outcome,
    }
}

/// Learns the window and the bytes per token from an overflow error's own numbers.
fn learn_from_count(
    err: &ProviderError,
    ctx: &RecoveryContext<'_>,
    state: &mut SessionState,
) -> ServerCount {
    let count = server_count(err);
    if let Some(prompt) = count.prompt_tokens {
        state
            .chars_per_token
            .set_counted(ctx.sent_weight as u64, prompt);
    }
    let configured = ctx.inputs.context_window;
    match (count.window, count.prompt_tokens) {
        (Some(w), _) if w < configured => {
            state.learn_window(w);
        }
        // The server rejected `p` tokens without naming its window: the window is smaller.
        (None, Some(p)) if p <= configured => {
            state.learn_window(p.saturating_sub(1).max(1));
        }
        _ => {}
    }
    count
}

/// The budget inputs with the session's learned window applied.
fn effective_inputs(ctx: &RecoveryContext<'_>, state: &SessionState) -> BudgetInputs {
    BudgetInputs {
        context_window: state.effective_window(ctx.inputs.context_window),
        ..ctx.inputs
    }
}

/// The history weight an attempt aims for: the budget under what the session now knows,
/// less [`TARGET_MARGIN`], and strictly below what was rejected; never below what every
/// request carries (system messages and the newest user message at its floor), which fails
/// fast when even that cannot fit the window.
fn target_for(
    history: &[Message],
    weight: usize,
    counted: &ServerCount,
    learned_cap: Option<u64>,
    ctx: &RecoveryContext<'_>,
    state: &SessionState,
) -> Result<usize, RecoveryError> {
    let inputs = effective_inputs(ctx, state);
    let budget = Budget::compute(&inputs, ctx.policy, state);
    let by_budget = window::target_chars(budget, &inputs, ctx.policy, state).min(budget.chars);
    let mut target = (by_budget as f64 * TARGET_MARGIN) as usize;
    let informed = !counted.is_empty() || learned_cap.is_some();
    if target >= weight || !informed {
        // Nothing learned says by how much: halve.
        target = target.min((weight as f64 * BLIND_SHRINK) as usize);
    }
    let floor = floor_with_keep(history, 1);
    let floor_tokens = state
        .chars_per_token
        .tokens(floor + ctx.inputs.reserve_bytes);
    let window = inputs.context_window;
    if floor_tokens as f64 > window as f64 * FLOOR_WINDOW_SHARE {
        return Err(RecoveryError::WindowFloor {
            floor_tokens,
            window,
        });
    }
    Ok(target.max(floor).min(weight.saturating_sub(1)))
}

fn floor_error(
    history: &[Message],
    class: FailureClass,
    err: &ProviderError,
    ctx: &RecoveryContext<'_>,
    state: &SessionState,
) -> RecoveryError {
    if class.is_payload() {
        RecoveryError::Floor {
            uncompactable: ctx.uncompactable_bytes,
            rejected: err.request_bytes,
        }
    } else {
        RecoveryError::WindowFloor {
            floor_tokens: state
                .chars_per_token
                .tokens(floor_with_keep(history, 1) + ctx.inputs.reserve_bytes),
            window: state.effective_window(ctx.inputs.context_window),
        }
    }
}

fn merge(into: &mut PassReport, from: &PassReport) {
    into.changed += from.changed;
    into.removed += from.removed;
    into.added += from.added;
    for k in &from.archived {
        if !into.archived.contains(k) {
            into.archived.push(*k);
        }
    }
    if into.archive_error.is_none() {
        into.archive_error = from.archive_error;
    }
    into.notes.extend(from.notes.iter().cloned());
}

/// The payload-limit guidance.
pub fn payload_notice(rejected_bytes: u64, cap: u64) -> String {
    format!(
        "{PAYLOAD_NOTICE_HEADER} The network path to the model rejected a request of {rejected_bytes} bytes, so this session now keeps every request under {cap} bytes. Keep tool outputs small: read files in line ranges, filter command output (grep, head, tail, wc), never print whole logs, lock files, minified or binary data. Earlier content that was cut is archived; use the recall tool with its <<ccr:KEY>> marker when you need it again."
    )
}

/// True when the guidance is already in the session (also inside a summary).
pub fn payload_notice_present(history: &[Message], state: &SessionState) -> bool {
    state.payload_notice_injected
        || history
            .iter()
            .any(|m| m.content.contains(PAYLOAD_NOTICE_HEADER))
}

/// A reply that stopped at the output-token limit, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Escalation {
    /// The output-token limit for the continuation request.
    pub max_output_tokens: u64,
}

/// Doubles the output-token limit (up to `model_max_output`, the model catalog's maximum)
/// and appends the partial reply and the continuation request to `history`. `None` when the
/// escalations of this turn are used up or the limit is already at the model's maximum.
/// Tool calls of the partial reply are dropped: a call cut off mid-arguments cannot run.
pub fn escalate_output(
    history: &mut Vec<Message>,
    partial: &Message,
    current_limit: u64,
    model_max_output: u64,
    policy: &EffectivePolicy,
    state: &mut SessionState,
) -> Option<Escalation> {
    if state.token_escalations >= policy.recovery.max_token_escalations
        || current_limit >= model_max_output
    {
        return None;
    }
    state.token_escalations += 1;
    let limit = current_limit.saturating_mul(2).min(model_max_output);
    let mut reply = partial.clone();
    reply.tool_calls.clear();
    history.push(reply);
    history.push(Message::user(CONTINUATION_MESSAGE));
    Some(Escalation {
        max_output_tokens: limit,
    })
}
