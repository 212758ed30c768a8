//! The recovery ladder: attempts that converge on the server's numbers, learned windows,
//! ratios and payload caps, the floor diagnoses, the payload-limit notice, and output-token
//! escalation.

use cairn_crds::EffectivePolicy;
use cairn_engine::ccr::MemoryStore;
use cairn_engine::classify::{FailureClass, OtherReason, classify};
use cairn_engine::compact::pairing;
use cairn_engine::compact::{BudgetInputs, SessionState, Trigger};
use cairn_engine::history::{self, Message, Role};
use cairn_engine::provider::ProviderError;
use cairn_engine::recovery::{
    ASSUMED_REJECTED_BYTES, CONTINUATION_MESSAGE, PAYLOAD_NOTICE_HEADER, RecoveryContext,
    RecoveryError, after_memory_queue, escalate_output, recover,
};
use cairn_engine::testing::*;
use cairn_engine::turn::{GiveUp, give_up};

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
        inputs: BudgetInputs {
            context_window: 200_000,
            payload_cap: None,
            reserve_bytes: 0,
        },
        sent_weight: 900_000,
    }
}

/// llama.cpp's own overflow body, verbatim but for the numbers.
fn llama_overflow(prompt: u64, n_ctx: u64, request_bytes: u64) -> ProviderError {
    ProviderError::http(
        "openai-compatible",
        400,
        Some("application/json; charset=utf-8".into()),
        format!(
            r#"{{"error":{{"code":400,"message":"request ({prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":{prompt},"n_ctx":{n_ctx}}}}}"#
        ),
        request_bytes,
    )
}

#[tokio::test]
async fn the_first_attempt_fits_the_window_the_server_named() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    // A 41 KB history against a 2,048-token server that counts 1.7 bytes per token; the
    // session was told 32,768 tokens.
    let mut h = session(40_000);
    h.push(Message::user("p".repeat(1_500)));
    let before = h.clone();
    let sent = history::weight(&h);
    let prompt = (sent as f64 / 1.7) as u64;
    let err = llama_overflow(prompt, 2_048, sent as u64 + 2_000);
    let class = classify(&err);
    assert_eq!(class, FailureClass::ContextOverflow);
    let cx = RecoveryContext {
        inputs: BudgetInputs {
            context_window: 32_768,
            payload_cap: None,
            reserve_bytes: 0,
        },
        sent_weight: sent,
        ..ctx(&policy, &store, 0)
    };
    let o = recover(&mut h, &err, class, &cx, &mut st)
        .await
        .expect("attempt 1");
    assert_eq!(o.attempt, 1);
    assert_eq!(o.counted.prompt_tokens, Some(prompt));
    assert_eq!(o.learned_window, Some(2_048));
    assert_eq!(st.effective_window(32_768), 2_048);
    assert!(
        (st.chars_per_token.get() - 1.7).abs() < 0.01,
        "{}",
        st.chars_per_token.get()
    );
    // The result fits the real window in real tokens, with room for a reply: the budget, or
    // what every request carries (here the 1,320-byte system prompt, the truncation notice and
    // the newest message at its floor) when that is more.
    let tokens = st.chars_per_token.tokens(history::weight(&h));
    assert!(
        tokens as f64 <= 2_048.0 * cairn_engine::recovery::FLOOR_WINDOW_SHARE,
        "{tokens} tokens after recovery"
    );
    assert!(
        history::weight(&h) <= cairn_engine::compact::emergency::floor_with_keep(&h, 1).max(2_090),
        "{} bytes",
        history::weight(&h)
    );
    assert!(
        h.last().is_some_and(|m| m.role == Role::User),
        "the newest message stays"
    );
    assert!(pairing::is_valid(&h));
    assert!(
        lost_texts(&before, &h, &store).await.is_empty(),
        "everything dropped or cut is archived"
    );
    // A second rejection of the already-fitting request is never answered by resending it.
    let w1 = history::weight(&h);
    let again = llama_overflow(1_900, 2_048, w1 as u64);
    let cx2 = RecoveryContext {
        sent_weight: w1,
        ..cx
    };
    match recover(&mut h, &again, class, &cx2, &mut st).await {
        Ok(o2) => assert!(o2.report.bytes_after < w1, "attempt 2 is smaller"),
        Err(e) => assert_eq!(e.label(), "floor"),
    }
}

#[tokio::test]
async fn attempts_are_bounded_by_the_policy_and_reset_per_turn() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let mut h = session(300_000);
    let err = overflow();
    let class = classify(&err);
    let mut last = history::weight(&h);
    for attempt in 1..=policy.recovery.max_attempts {
        let o = recover(&mut h, &err, class, &ctx(&policy, &store, 5_000), &mut st)
            .await
            .expect("attempt runs");
        assert_eq!(o.attempt, attempt);
        assert!(
            o.report.bytes_after < last,
            "every attempt is smaller than the last"
        );
        last = o.report.bytes_after;
    }
    let e = recover(&mut h, &err, class, &ctx(&policy, &store, 5_000), &mut st).await;
    assert_eq!(
        e,
        Err(RecoveryError::Exhausted(policy.recovery.max_attempts))
    );
    st.begin_turn();
    let mut fresh = session(300_000);
    assert_eq!(
        recover(
            &mut fresh,
            &err,
            class,
            &ctx(&policy, &store, 5_000),
            &mut st
        )
        .await
        .map(|o| o.attempt),
        Ok(1)
    );
}

#[tokio::test]
async fn recovery_keeps_preserve_verbatim_messages() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let mut h = session(200_000);
    let mut pinned = Message::user("PINNED: the deploy key rotates on Fridays");
    pinned.meta.preserve_verbatim = true;
    h.insert(3, pinned.clone());
    h.push(Message::user("next"));
    let err = overflow();
    // Through every attempt the policy allows: the last levels keep it too.
    for attempt in 1..=policy.recovery.max_attempts {
        let cx = RecoveryContext {
            sent_weight: history::weight(&h),
            ..ctx(&policy, &store, 0)
        };
        if recover(&mut h, &err, classify(&err), &cx, &mut st)
            .await
            .is_err()
        {
            break;
        }
        assert!(
            h.contains(&pinned),
            "a PreserveVerbatim message survives recovery attempt {attempt}"
        );
    }
    assert!(h.contains(&pinned));
}

#[tokio::test]
async fn a_newest_message_that_alone_overflows_the_window_fails_fast() {
    let store = MemoryStore::new();
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    // A system prompt of 6,000 bytes at 1.7 bytes per token is 3,500 tokens: it can never fit
    // a 2,048-token window, whatever is dropped.
    let mut h = vec![
        Message::system("s".repeat(6_000)),
        Message::user("q".repeat(3_000)),
    ];
    let before = h.clone();
    let sent = history::weight(&h);
    let err = llama_overflow((sent as f64 / 1.7) as u64, 2_048, sent as u64);
    let cx = RecoveryContext {
        sent_weight: sent,
        ..ctx(&policy, &store, 6_000)
    };
    let e = recover(&mut h, &err, FailureClass::ContextOverflow, &cx, &mut st).await;
    let Err(e @ RecoveryError::WindowFloor { window: 2_048, .. }) = e else {
        panic!("expected the window floor diagnosis, got {e:?}");
    };
    assert!(e.to_string().contains("Shorten the system prompt"), "{e}");
    assert_eq!(h, before, "fail fast: nothing changed");
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
    let mut h2 = vec![
        Message::system("s"),
        summary,
        Message::assistant("a long answer ".repeat(2_000)),
        Message::user("go on"),
    ];
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
async fn recovery_on_a_failing_store_drops_nothing_and_sends_nothing() {
    let policy = EffectivePolicy::default();
    let mut st = SessionState::new();
    let mut h = session(200_000);
    h.push(Message::assistant("y".repeat(9_000)));
    let before = h.clone();
    let err = overflow();
    let unused = MemoryStore::new();
    let cx = RecoveryContext {
        store: &FailingStore,
        ..ctx(&policy, &unused, 0)
    };
    let e = recover(&mut h, &err, FailureClass::ContextOverflow, &cx, &mut st).await;
    // Nothing could be archived, so nothing was cut: resending the same request is refused.
    assert_eq!(
        e,
        Err(RecoveryError::Stuck {
            archive_error: "unavailable"
        })
    );
    assert_eq!(h, before);
    let _ = Trigger::Recovery;
}

#[tokio::test]
async fn a_refused_memory_queue_fails_the_attempt_instead_of_resending_the_same_request() {
    let policy = EffectivePolicy::default();
    let store = MemoryStore::new();
    let err = overflow();
    let attempt = |queued: Result<(), String>| {
        let policy = &policy;
        let store = &store;
        let err = &err;
        async move {
            let mut st = SessionState::new();
            let mut h = session(200_000);
            h.push(Message::assistant("y".repeat(9_000)));
            let before = history::weight(&h);
            let out = recover(
                &mut h,
                err,
                FailureClass::ContextOverflow,
                &ctx(policy, store, 0),
                &mut st,
            )
            .await;
            let shrank = out.as_ref().map(|o| o.report.bytes_after < before);
            assert_eq!(shrank, Ok(true), "the attempt itself shrinks the request");
            after_memory_queue(out, queued)
        }
    };
    // Queued: the shrunk request is resent.
    let ok = attempt(Ok(())).await.expect("recovered");
    assert_eq!(ok.attempt, 1);
    // Refused: the rewrite is undone by the caller, so the attempt fails (never a resend of
    // the request the server just rejected), and says why.
    let refused = attempt(Err("memory/queue: 503 Slow Down".into())).await;
    let e = refused.expect_err("the attempt fails");
    assert_eq!(e.label(), "memory_queue");
    assert_eq!(
        e,
        RecoveryError::MemoryQueue {
            queue_error: "memory/queue: 503 Slow Down".into()
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("session memory's queue") && text.contains("not resent"),
        "{text}"
    );
    // An attempt that failed on its own keeps its reason.
    assert_eq!(
        after_memory_queue(Err(RecoveryError::Exhausted(3)), Err("x".into())),
        Err(RecoveryError::Exhausted(3))
    );
    // The turn reports it as the provider's rejection, with the reason.
    match give_up(FailureClass::ContextOverflow, &err, &e) {
        GiveUp::Provider { class, message } => {
            assert_eq!(class, "context_overflow");
            assert!(
                message.contains("prompt is too long") && message.contains("session memory"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}
