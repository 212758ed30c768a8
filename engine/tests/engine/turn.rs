//! The turn's decisions, scenario by scenario, as plain data: what is decided before a
//! request, after a reply and after a rejection. No provider, store or simulator.

use cairn_crds::EffectivePolicy;
use cairn_engine::classify::{FailureClass, classify};
use cairn_engine::compact::ladder::{PREFLIGHT_BUDGET_RATIO, PREFLIGHT_CAP_SHARE};
use cairn_engine::compact::{BudgetInputs, SessionState, Trigger};
use cairn_engine::history::{self, Message};
use cairn_engine::provider::{ChatResponse, ProviderError, StopReason, Usage};
use cairn_engine::recovery::{RecoveryError, escalate_output};
use cairn_engine::testing::nginx_413;
use cairn_engine::turn::{
    GiveUp, Plan, StopVerdict, Truncation, before_send, blocking, floor_before_recovery, give_up,
    judge_stop, output_limit,
};

fn inputs(window: u64, cap: Option<u64>, reserve: usize) -> BudgetInputs {
    BudgetInputs {
        context_window: window,
        payload_cap: cap,
        reserve_bytes: reserve,
    }
}

fn reply(text: &str, stop: StopReason, input: u64, output: u64) -> ChatResponse {
    ChatResponse {
        message: Message::assistant(text),
        stop,
        usage: Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        },
        request_bytes: 0,
        context: None,
    }
}

/// A history of `n` user/assistant pairs of `size` bytes each after a system prompt.
fn history_of(n: usize, size: usize) -> Vec<Message> {
    let mut h = vec![Message::system("You are terse.")];
    for i in 0..n {
        h.push(Message::user(format!("{i} {}", "q".repeat(size))));
        h.push(Message::assistant("a".repeat(size)));
    }
    h
}

#[test]
fn preflight_at_85_percent_of_a_learned_cap_then_a_413() {
    let policy = EffectivePolicy::default();
    let mut state = SessionState::new();
    // A proxy rejected a request earlier: the session learned a 100 kB cap.
    state.learn_payload_cap(100_000);
    let window = inputs(1_000_000, None, 2_000);

    // Below 85 % of the cap nothing is forced by the pre-flight check.
    let below = (100_000.0 * PREFLIGHT_CAP_SHARE) as usize - 2_000 - 1;
    let prep = before_send(below, &window, &policy, &mut state);
    assert_ne!(
        prep.plan,
        Plan::Compact {
            trigger: Trigger::PreFlight,
            budget_ratio: Some(PREFLIGHT_BUDGET_RATIO)
        }
    );
    // Above it, the history is compacted hard before the request goes out.
    let above = (100_000.0 * PREFLIGHT_CAP_SHARE) as usize;
    let prep = before_send(above, &window, &policy, &mut state);
    assert_eq!(
        prep.plan,
        Plan::Compact {
            trigger: Trigger::PreFlight,
            budget_ratio: Some(PREFLIGHT_BUDGET_RATIO)
        }
    );
    assert_eq!(prep.large_history, None, "a cap is known: no warning");

    // The compacted request is still rejected by the proxy: a payload failure. The first
    // rejection of the turn always gets a recovery attempt.
    let err = nginx_413(60_000);
    let class = classify(&err);
    assert!(class.is_payload(), "{class:?}");
    assert_eq!(floor_before_recovery(class, &state, 30_000, 60_000), None);

    // After an attempt, a system prompt and catalog at least as big as the cap can never
    // pass: the turn ends with the floor diagnosis instead of another resend.
    state.recovery_attempts = 1;
    let floor = floor_before_recovery(class, &state, 100_000, 60_000).expect("floor");
    assert_eq!(
        floor,
        RecoveryError::Floor {
            uncompactable: 100_000,
            rejected: 60_000
        }
    );
    match give_up(class, &err, &floor) {
        GiveUp::Floor(message) => assert!(message.contains("spec.payloadCap"), "{message}"),
        other => panic!("not a floor: {other:?}"),
    }
    // Below the cap, recovery gets its next attempt.
    assert_eq!(floor_before_recovery(class, &state, 99_999, 60_000), None);
    // An overflow is never a payload floor.
    let overflow = FailureClass::ContextOverflow;
    assert_eq!(
        floor_before_recovery(overflow, &state, 100_000, 60_000),
        None
    );
}

#[test]
fn a_window_learned_mid_turn_governs_the_next_request() {
    let policy = EffectivePolicy::default();
    let mut state = SessionState::new();
    let configured = 32_768;

    // The server stopped the reply at 900 of 4,096 tokens with 3,900 in the window: the
    // context filled, and a higher output limit cannot help.
    let cut = reply("partial", StopReason::MaxTokens, 3_000, 900);
    let verdict = judge_stop(&cut, 4_096, 8_192, configured);
    assert_eq!(verdict, StopVerdict::Truncated(Truncation::ContextFull));
    assert_eq!(Truncation::ContextFull.label(), "context_full");
    let learned = Truncation::ContextFull
        .learned_window(&cut.usage, configured)
        .expect("a smaller window");
    assert_eq!(learned, 3_900);
    state.learn_window(learned);
    let window = state.effective_window(configured);
    assert_eq!(window, 3_900);

    // The next request is budgeted against the learned window: a history the configured
    // window took easily is compacted first.
    let h = history_of(6, 1_000);
    let weight = history::weight(&h);
    let roomy = before_send(
        weight,
        &inputs(configured, None, 0),
        &policy,
        &mut state.clone(),
    );
    assert_eq!(roomy.plan, Plan::Send);
    let prep = before_send(weight, &inputs(window, None, 0), &policy, &mut state);
    assert_eq!(
        prep.plan,
        Plan::Compact {
            trigger: Trigger::Auto,
            budget_ratio: None
        }
    );
    // And its output limit leaves the prompt room in that window.
    let limit = output_limit(8_192, window, &state, weight);
    assert!(
        (cairn_engine::turn::MIN_OUTPUT_TOKENS..8_192).contains(&limit),
        "{limit}"
    );
    // A request that would leave no headroom is refused, with the numbers.
    let full = blocking(weight * 3, &inputs(window, None, 0), &policy, &state).expect("full");
    assert_eq!(full.window, 3_900);
    assert!(full.to_string().contains("blockingBufferTokens"), "{full}");

    // A full window as large as the configured one teaches nothing.
    let at_window = reply("", StopReason::MaxTokens, 30_000, 2_768);
    assert_eq!(
        Truncation::ContextFull.learned_window(&at_window.usage, configured),
        None
    );
}

#[test]
fn an_escalation_whose_continuation_overflows() {
    let policy = EffectivePolicy::default();
    let mut state = SessionState::new();
    let mut h = history_of(3, 200);
    let window = 200_000;

    // Cut exactly at the 4,096 tokens sent: escalate.
    let cut = reply(&"x".repeat(16_000), StopReason::MaxTokens, 1_000, 4_096);
    assert_eq!(
        judge_stop(&cut, 4_096, 4_096, window),
        StopVerdict::Escalate
    );
    let before = h.len();
    let esc = escalate_output(&mut h, &cut.message, 4_096, 32_000, &policy, &mut state)
        .expect("escalated");
    assert_eq!(esc.max_output_tokens, 8_192);
    assert_eq!(
        h.len(),
        before + 2,
        "the partial reply and the continuation"
    );
    // The continuation carries the partial reply and is prepared like any request: over a
    // small window's budget it is compacted before it is sent.
    let weight = history::weight(&h);
    let prep = before_send(weight, &inputs(4_096, None, 0), &policy, &mut state);
    assert!(matches!(prep.plan, Plan::Compact { .. }), "{prep:?}");

    // The continuation overflows anyway: an overflow, recoverable, never a payload floor;
    // when recovery is used up the turn reports the provider's error with the reason.
    let overflow = ProviderError::http(
        "anthropic",
        400,
        Some("application/json".into()),
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 204831 tokens > 200000 maximum"}}"#,
        weight as u64,
    );
    let class = classify(&overflow);
    assert_eq!(class, FailureClass::ContextOverflow);
    state.recovery_attempts = 1;
    assert_eq!(floor_before_recovery(class, &state, 1_000_000, 1), None);
    match give_up(class, &overflow, &RecoveryError::Exhausted(3)) {
        GiveUp::Provider { class, message } => {
            assert_eq!(class, "context_overflow");
            assert!(
                message.contains("recovery gave up after 3 attempts"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }

    // The escalations of a turn are bounded: once used up the reply stays cut.
    state.token_escalations = policy.recovery.max_token_escalations;
    assert!(escalate_output(&mut h, &cut.message, 8_192, 32_000, &policy, &mut state).is_none());
    // A tool call cut at the limit is complete as far as escalation goes.
    let mut calls = cut.clone();
    calls
        .message
        .tool_calls
        .push(cairn_engine::testing::call("c1", "read", "{}"));
    assert_eq!(
        judge_stop(&calls, 4_096, 4_096, window),
        StopVerdict::Complete
    );
    // A limit already bound by the window is not the output limit's fault.
    assert_eq!(
        judge_stop(&cut, 4_096, 8_192, window),
        StopVerdict::Truncated(Truncation::WindowBound)
    );
}
