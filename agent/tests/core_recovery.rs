//! The recovery ladder: three attempts, learned payload caps, the floor diagnosis, the
//! payload-limit notice, and output-token escalation.

mod core_support;

use cairn_agent::ccr::{MemoryStore, Store, extract_markers};
use cairn_agent::classify::{FailureClass, OtherReason, classify};
use cairn_agent::compact::archive::parse_segment;
use cairn_agent::compact::pairing;
use cairn_agent::compact::{SessionState, Trigger};
use cairn_agent::history::{self, Message, Role};
use cairn_agent::provider::ProviderError;
use cairn_agent::recovery::{
    ASSUMED_REJECTED_BYTES, CONTINUATION_MESSAGE, LONG_ASSISTANT_CHARS, PAYLOAD_NOTICE_HEADER,
    RecoveryContext, RecoveryError, escalate_output, recover,
};
use cairn_crds::EffectivePolicy;
use core_support::*;

fn nginx_413(bytes: u64) -> ProviderError {
    ProviderError::http(
        "openai",
        413,
        Some("text/html".into()),
        "<html><head><title>413 Request Entity Too Large</title></head></html>",
        bytes,
    )
}

fn overflow() -> ProviderError {
    ProviderError::http(
        "anthropic",
        400,
        Some("application/json".into()),
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 204831 tokens > 200000 maximum"}}"#,
        900_000,
    )
}

fn ctx<'a>(
    policy: &'a EffectivePolicy,
    store: &'a MemoryStore,
    uncompactable: u64,
) -> RecoveryContext<'a> {
    RecoveryContext {
        policy,
        store,
        uncompactable_bytes: uncompactable,
    }
}

#[tokio::test]
async fn three_attempts_then_exhausted_and_reset_per_turn() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let mut h = session(300_000);
    h.push(Message::assistant("x".repeat(12_000)));
    h.push(Message::user("continue"));
    let before = h.clone();
    let err = overflow();
    let class = classify(&err);
    assert_eq!(class, FailureClass::ContextOverflow);

    // Attempt 1: pairing checked, tool budgets halved for this session, long replies cut.
    let limits_before = st.tool_result_limits(&policy);
    let o1 = recover(&mut h, &err, class, &ctx(&policy, &store, 5_000), &mut st)
        .await
        .expect("attempt 1");
    assert_eq!(o1.attempt, 1);
    assert_eq!(
        st.tool_result_limits(&policy).per_result,
        limits_before.per_result / 2
    );
    assert_eq!(
        st.tool_result_limits(&policy).per_turn,
        limits_before.per_turn / 2
    );
    let long = &h[h.len() - 2];
    assert!(long.content.len() <= LONG_ASSISTANT_CHARS && long.content.starts_with("xxx"));
    assert!(o1.learned_cap.is_none(), "overflow teaches no payload cap");
    assert!(!o1.notice_injected);

    // Attempt 2: system + last emergencyKeepMessages non-system, starting at a user message.
    let o2 = recover(&mut h, &err, class, &ctx(&policy, &store, 5_000), &mut st)
        .await
        .expect("attempt 2");
    assert_eq!(o2.attempt, 2);
    assert!(h[0].is_system());
    assert_eq!(h[1].role, Role::User);
    assert!(h[1].meta.is_summary);
    let non_system = h.iter().filter(|m| !m.is_system()).count();
    assert!(
        non_system <= policy.recovery.emergency_keep_messages as usize + 1,
        "{non_system}"
    );
    assert!(pairing::is_valid(&h));
    let key = extract_markers(&h[1].content)[0];
    let seg = store.fetch(&key).await.expect("ok").expect("archived");
    assert!(
        !parse_segment(&String::from_utf8(seg).expect("utf8"))
            .expect("segment")
            .is_empty()
    );

    // Attempt 3: system + last nuclearKeepMessages, each capped.
    let o3 = recover(&mut h, &err, class, &ctx(&policy, &store, 5_000), &mut st)
        .await
        .expect("attempt 3");
    assert_eq!(o3.attempt, 3);
    let kept: Vec<&Message> = h
        .iter()
        .filter(|m| !m.is_system() && !m.meta.is_summary)
        .collect();
    assert!(kept.len() <= policy.recovery.nuclear_keep_messages as usize);
    assert!(
        kept.iter()
            .all(|m| m.content.len() <= policy.recovery.nuclear_message_chars as usize)
    );
    assert!(pairing::is_valid(&h));
    assert!(
        lost_texts(&before, &h, &store).await.is_empty(),
        "everything dropped is archived"
    );

    let e = recover(&mut h, &err, class, &ctx(&policy, &store, 5_000), &mut st).await;
    assert_eq!(e, Err(RecoveryError::Exhausted(3)));
    st.begin_turn();
    assert_eq!(
        recover(&mut h, &err, class, &ctx(&policy, &store, 5_000), &mut st)
            .await
            .map(|o| o.attempt),
        Ok(1)
    );
    assert_eq!(st.recoveries, 4);
}

#[tokio::test]
async fn max_attempts_comes_from_the_policy() {
    let store = MemoryStore::new();
    let mut policy = EffectivePolicy::default();
    policy.recovery.max_attempts = 1;
    let mut st = SessionState::new();
    let mut h = session(50_000);
    let err = overflow();
    recover(
        &mut h,
        &err,
        classify(&err),
        &ctx(&policy, &store, 0),
        &mut st,
    )
    .await
    .expect("one");
    assert!(matches!(
        recover(
            &mut h,
            &err,
            classify(&err),
            &ctx(&policy, &store, 0),
            &mut st
        )
        .await,
        Err(RecoveryError::Exhausted(1))
    ));
    policy.recovery.max_attempts = 0;
    let mut st = SessionState::new();
    assert!(
        recover(
            &mut h,
            &err,
            classify(&err),
            &ctx(&policy, &store, 0),
            &mut st
        )
        .await
        .is_err()
    );
}

#[tokio::test]
async fn payload_rejection_learns_three_quarters_and_only_tightens() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let mut h = session(100_000);
    let o = recover(
        &mut h,
        &nginx_413(2_000_000),
        FailureClass::PayloadTooLarge,
        &ctx(&policy, &store, 10_000),
        &mut st,
    )
    .await
    .expect("recovers");
    assert_eq!(o.learned_cap, Some(1_500_000));
    assert_eq!(st.learned_payload_cap, Some(1_500_000));
    // A larger rejected request never loosens the cap.
    let o = recover(
        &mut h,
        &nginx_413(8_000_000),
        FailureClass::PayloadTooLarge,
        &ctx(&policy, &store, 10_000),
        &mut st,
    )
    .await
    .expect("recovers");
    assert_eq!(o.learned_cap, Some(1_500_000));
    // Unknown size: 4 MB assumed.
    let mut fresh = SessionState::new();
    let o = recover(
        &mut h,
        &nginx_413(0),
        FailureClass::PayloadTooLarge,
        &ctx(&policy, &store, 10_000),
        &mut fresh,
    )
    .await
    .expect("recovers");
    assert_eq!(o.learned_cap, Some(ASSUMED_REJECTED_BYTES / 4 * 3));
    // Another session in the same process learned nothing.
    assert_eq!(SessionState::new().learned_payload_cap, None);
}

#[tokio::test]
async fn floor_diagnosis_fails_fast_and_warns_at_three_quarters() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut h = session(100_000);
    let before = h.clone();
    let mut st = SessionState::new();
    let e = recover(
        &mut h,
        &nginx_413(100_000),
        FailureClass::PayloadTooLarge,
        &ctx(&policy, &store, 120_000),
        &mut st,
    )
    .await;
    let Err(err @ RecoveryError::Floor { .. }) = e else {
        panic!("expected the floor diagnosis, got {e:?}");
    };
    assert_eq!(err.label(), "floor");
    assert!(err.to_string().contains("Shorten the system prompt"));
    assert_eq!(h, before, "fail fast: nothing changed");
    assert_eq!(st.recovery_attempts, 0);

    let o = recover(
        &mut h,
        &nginx_413(100_000),
        FailureClass::PayloadTooLarge,
        &ctx(&policy, &store, 80_000),
        &mut st,
    )
    .await
    .expect("recovers");
    assert!(o.floor_warning.is_some());
}

#[tokio::test]
async fn payload_notice_is_injected_once_and_found_inside_a_summary() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let mut h = session(100_000);
    let o = recover(
        &mut h,
        &nginx_413(1_000_000),
        FailureClass::ProxyRejection,
        &ctx(&policy, &store, 0),
        &mut st,
    )
    .await
    .expect("recovers");
    assert!(o.notice_injected);
    let count = |h: &[Message]| {
        h.iter()
            .filter(|m| m.content.contains(PAYLOAD_NOTICE_HEADER))
            .count()
    };
    assert_eq!(count(&h), 1);
    let o = recover(
        &mut h,
        &nginx_413(1_000_000),
        FailureClass::SuspectedPayload,
        &ctx(&policy, &store, 0),
        &mut st,
    )
    .await
    .expect("recovers");
    assert!(!o.notice_injected);
    assert!(count(&h) <= 1);

    // A restarted session (fresh state) whose summary quotes the notice does not add another.
    let mut restarted = SessionState::new();
    let mut summary = Message::user(format!(
        "[cairn: summary]\n7. Pending tasks\n{PAYLOAD_NOTICE_HEADER} keep outputs small"
    ));
    summary.meta.is_summary = true;
    let mut h2 = vec![Message::system("s"), summary, Message::user("go on")];
    let o = recover(
        &mut h2,
        &nginx_413(1_000_000),
        FailureClass::PayloadTooLarge,
        &ctx(&policy, &store, 0),
        &mut restarted,
    )
    .await
    .expect("recovers");
    assert!(!o.notice_injected);
    assert_eq!(count(&h2), 1);
}

#[tokio::test]
async fn other_classes_are_never_touched() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut h = session(50_000);
    let before = h.clone();
    let mut st = SessionState::new();
    for class in [
        FailureClass::Other(OtherReason::RateLimit),
        FailureClass::Other(OtherReason::Auth),
        FailureClass::MaxOutputTokens,
    ] {
        let e = recover(
            &mut h,
            &overflow(),
            class,
            &ctx(&policy, &store, 0),
            &mut st,
        )
        .await;
        assert_eq!(e, Err(RecoveryError::NotRecoverable(class)));
    }
    assert_eq!(h, before);
    assert_eq!(st, SessionState::new());
}

#[test]
fn output_tokens_double_up_to_the_model_cap_at_most_twice() {
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let mut h = vec![Message::user("write a long essay")];
    let mut partial = Message::assistant("Once upon a time");
    partial
        .tool_calls
        .push(call("c1", "bash", "{\"command\":\"ls"));
    let e = escalate_output(&mut h, &partial, 8_192, 64_000, &policy, &mut st).expect("escalates");
    assert_eq!(e.max_output_tokens, 16_384);
    assert_eq!(h.len(), 3);
    assert_eq!(h[1].content, "Once upon a time");
    assert!(h[1].tool_calls.is_empty(), "a cut-off call cannot run");
    assert_eq!(h[2].content, CONTINUATION_MESSAGE);
    assert!(CONTINUATION_MESSAGE.starts_with(
        "Your response was cut off at the token limit. Resume DIRECTLY from where you stopped — do not repeat any content."
    ));
    let e = escalate_output(&mut h, &partial, 40_000, 64_000, &policy, &mut st).expect("escalates");
    assert_eq!(
        e.max_output_tokens, 64_000,
        "capped at the model's own maximum"
    );
    assert!(
        escalate_output(&mut h, &partial, 64_000, 128_000, &policy, &mut st).is_none(),
        "at most 2"
    );
    st.begin_turn();
    assert!(
        escalate_output(&mut h, &partial, 64_000, 64_000, &policy, &mut st).is_none(),
        "already at the cap"
    );
}

#[tokio::test]
async fn recovery_on_a_failing_store_drops_nothing() {
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let mut h = session(200_000);
    h.push(Message::assistant("y".repeat(9_000)));
    let before = h.clone();
    let err = overflow();
    for attempt in 1..=3 {
        let o = recover(
            &mut h,
            &err,
            FailureClass::ContextOverflow,
            &RecoveryContext {
                policy: &policy,
                store: &FailingStore,
                uncompactable_bytes: 0,
            },
            &mut st,
        )
        .await
        .expect("attempt runs");
        assert_eq!(o.attempt, attempt);
        assert_eq!(o.report.archive_error, Some("unavailable"));
        assert_eq!(o.report.trigger, Trigger::Recovery);
    }
    assert_eq!(history::weight(&h), history::weight(&before));
    assert_eq!(h, before);
}
