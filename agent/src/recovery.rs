//! The recovery ladder: what to do after a classified failure, at most
//! `recovery.maxAttempts` times per turn.
//!
//! - Attempt 1: pairing repair; the session's tool-result budgets are halved; assistant
//!   messages over [`LONG_ASSISTANT_CHARS`] are cut (¾ head + ¼ tail).
//! - Attempt 2: the system messages and the last `emergencyKeepMessages` non-system
//!   messages, starting at a user message; pairing re-checked.
//! - Attempt 3: the system messages and the last `nuclearKeepMessages`, each capped at
//!   `nuclearMessageChars`.
//!
//! Everything dropped or cut is archived first; a notice with the recall marker replaces a
//! dropped segment. A payload-class failure also teaches the session a cap (¾ of the exact
//! size of the rejected request; [`ASSUMED_REJECTED_BYTES`] when the size is unknown), runs
//! the floor diagnosis, and adds the payload-limit guidance once per session.
//!
//! On a reply stopped by the output-token limit, [`escalate_output`] doubles the limit (up to
//! the model's own maximum) and asks the model to continue.

use cairn_crds::EffectivePolicy;

use crate::ccr::{Key, Store, extract_markers};
use crate::classify::FailureClass;
use crate::compact::archive::{archive_all, note_archived, referenced_keys, segment_text};
use crate::compact::emergency::user_tail_start;
use crate::compact::pairing::{self, OrphanMode};
use crate::compact::state::MAX_TOOL_BUDGET_HALVINGS;
use crate::compact::{Pass, PassReport, SessionState, Trigger, text};
use crate::history::{self, Message, Role};
use crate::provider::ProviderError;

/// Assistant messages longer than this are cut by attempt 1.
pub const LONG_ASSISTANT_CHARS: usize = 5_000;
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
}

impl RecoveryError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotRecoverable(_) => "not_recoverable",
            Self::Exhausted(_) => "exhausted",
            Self::Floor { .. } => "floor",
        }
    }
}

/// What recovery needs besides the history and the session state.
pub struct RecoveryContext<'a> {
    pub policy: &'a EffectivePolicy,
    pub store: &'a dyn Store,
    /// Bytes of the parts no compaction can remove: system prompt and tool catalog.
    pub uncompactable_bytes: u64,
}

/// What one recovery attempt did.
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveryOutcome {
    /// 1, 2 or 3.
    pub attempt: u32,
    pub class: FailureClass,
    /// The session's payload cap after this failure (payload classes only).
    pub learned_cap: Option<u64>,
    /// The payload-limit guidance was added by this attempt.
    pub notice_injected: bool,
    /// Set when the uncompactable part reaches ¾ of the rejected size.
    pub floor_warning: Option<String>,
    pub report: PassReport,
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
    let max = ctx.policy.recovery.max_attempts.min(3);
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
    state.recovery_attempts += 1;
    state.recoveries += 1;
    let attempt = state.recovery_attempts;
    let mut report = PassReport::new(Pass::Recovery, Trigger::Recovery, history::weight(history));
    report
        .notes
        .push(format!("attempt {attempt} after {}", class.label()));

    match attempt {
        1 => {
            let (pr, _) = pairing::repair_archived(history, ctx.store, Trigger::Recovery).await;
            merge(&mut report, &pr);
            state.tool_budget_halvings =
                (state.tool_budget_halvings + 1).min(MAX_TOOL_BUDGET_HALVINGS);
            cut_long_assistants(history, ctx.store, &mut report).await;
        }
        2 => {
            let keep = ctx.policy.recovery.emergency_keep_messages as usize;
            keep_last(history, keep, None, ctx.store, &mut report).await;
        }
        _ => {
            let r = &ctx.policy.recovery;
            keep_last(
                history,
                r.nuclear_keep_messages as usize,
                Some(r.nuclear_message_chars as usize),
                ctx.store,
                &mut report,
            )
            .await;
        }
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
    Ok(RecoveryOutcome {
        attempt,
        class,
        learned_cap,
        notice_injected,
        floor_warning,
        report,
    })
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

async fn cut_long_assistants(history: &mut [Message], store: &dyn Store, report: &mut PassReport) {
    let targets: Vec<usize> = history
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.role == Role::Assistant
                && m.content.len() > LONG_ASSISTANT_CHARS
                && !m.meta.preserve_verbatim
                && !text::quotes_marker(&m.content)
        })
        .map(|(i, _)| i)
        .collect();
    cap_messages(history, &targets, LONG_ASSISTANT_CHARS, store, report).await;
}

/// Cuts each message in `targets` to `cap` bytes (¾ head, ¼ tail), archiving originals
/// first; all or nothing.
async fn cap_messages(
    history: &mut [Message],
    targets: &[usize],
    cap: usize,
    store: &dyn Store,
    report: &mut PassReport,
) {
    // (index, already-archived stub) — `None`: archive the content, then cut it.
    let mut edits: Vec<(usize, Option<(String, Key)>)> = Vec::new();
    for &i in targets {
        let c = &history[i].content;
        if c.len() <= cap {
            continue;
        }
        if text::is_ours(c) {
            if let (Some(k), Some(st)) = (extract_markers(c).first().copied(), text::parse_stats(c))
            {
                let s = text::stub("message", st, &k);
                if s.len() < c.len() {
                    edits.push((i, Some((s, k))));
                }
            }
            continue;
        }
        if !text::quotes_marker(c) {
            edits.push((i, None));
        }
    }
    let originals: Vec<&[u8]> = edits
        .iter()
        .filter(|(_, ready)| ready.is_none())
        .map(|(i, _)| history[*i].content.as_bytes())
        .collect();
    let keys = match archive_all(store, &originals).await {
        Ok(keys) => keys,
        Err(e) => {
            report.archive_error = Some(e.label());
            return;
        }
    };
    for k in &keys {
        if !report.archived.contains(k) {
            report.archived.push(*k);
        }
    }
    let mut keys = keys.into_iter();
    for (i, ready) in edits {
        let (new, key) = match ready {
            Some(r) => r,
            None => {
                let Some(key) = keys.next() else { break };
                match text::preview_within(&history[i].content, cap, &key) {
                    Some(p) => (p, key),
                    None => continue,
                }
            }
        };
        history[i].content = new;
        note_archived(&mut history[i], &key);
        report.changed += 1;
    }
}

/// Keeps the system messages and the last `keep` non-system messages (starting at a user
/// message), optionally capping each; the dropped part is archived and replaced by a notice.
async fn keep_last(
    history: &mut Vec<Message>,
    keep: usize,
    cap: Option<usize>,
    store: &dyn Store,
    report: &mut PassReport,
) {
    let ts = user_tail_start(history, keep);
    let dropped: Vec<Message> = history[..ts]
        .iter()
        .filter(|m| !m.is_system())
        .cloned()
        .collect();
    let mut staged: Vec<Message> = history.iter().filter(|m| m.is_system()).cloned().collect();
    if !dropped.is_empty() {
        let archive_text = segment_text(&dropped);
        let key = match archive_all(store, &[archive_text.as_bytes()]).await {
            Ok(keys) if !keys.is_empty() => keys[0],
            Ok(_) => return,
            Err(e) => {
                report.archive_error = Some(e.label());
                return;
            }
        };
        report.archived.push(key);
        let chars: usize = dropped.iter().map(Message::weight).sum();
        let mut n = Message::user(format!(
            "{}a request was rejected, so {} earlier messages ({chars} chars) were dropped to recover. They are archived; recall {} to read them.]",
            text::BANNER_PREFIX,
            dropped.len(),
            key.marker()
        ));
        n.meta.is_summary = true;
        n.meta.archived.push(key.as_str().to_string());
        for k in referenced_keys(&dropped) {
            if k != key {
                n.meta.archived.push(k.as_str().to_string());
            }
        }
        staged.push(n);
        report.removed += dropped.len();
        report.added += 1;
    }
    staged.extend(history[ts..].iter().filter(|m| !m.is_system()).cloned());
    pairing::repair(&mut staged, OrphanMode::ToUser);
    if let Some(cap) = cap {
        let targets: Vec<usize> = staged
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.is_system() && !m.meta.is_summary && m.content.len() > cap)
            .map(|(i, _)| i)
            .collect();
        cap_messages(&mut staged, &targets, cap, store, report).await;
    }
    *history = staged;
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
