//! Recovery converges by construction: for any history, window and real bytes-per-token
//! ratio, each attempt after an overflow either produces a request whose estimate fits the
//! window the server named, or fails fast with the floor diagnosis — never an attempt that is
//! not smaller than the one rejected. With a server whose count follows one ratio, the first
//! attempt already fits.

use cairn_crds::EffectivePolicy;
use cairn_engine::ccr::{Key, MemoryStore, Store};
use cairn_engine::classify::{FailureClass, classify};
use cairn_engine::compact::{BudgetInputs, SessionState};
use cairn_engine::history::{self, Message, Role};
use cairn_engine::provider::ProviderError;
use cairn_engine::recovery::{FLOOR_WINDOW_SHARE, RecoveryContext, RecoveryError, recover};
use cairn_engine::testing::*;
use proptest::prelude::*;

/// A server that counts `weight / ratio` tokens and answers like llama-server.
struct Server {
    window: u64,
    ratio: f64,
}

impl Server {
    fn count(&self, weight: usize) -> u64 {
        (weight as f64 / self.ratio).ceil() as u64
    }

    fn rejects(&self, weight: usize) -> Option<ProviderError> {
        let tokens = self.count(weight);
        (tokens > self.window).then(|| {
            ProviderError::http(
                "openai-compatible",
                400,
                Some("application/json; charset=utf-8".into()),
                format!(
                    r#"{{"error":{{"code":400,"message":"request ({tokens} tokens) exceeds the available context size ({} tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":{tokens},"n_ctx":{}}}}}"#,
                    self.window, self.window
                ),
                weight as u64 * 11 / 10,
            )
        })
    }
}

fn pinned_text() -> String {
    "PINNED ".repeat(20)
}

fn history_of(body: usize, system: usize, newest: usize, verbatim: bool) -> Vec<Message> {
    let mut h = session(body);
    h[0] = Message::system("s".repeat(system.max(1)));
    if verbatim {
        let mut pinned = Message::user(pinned_text());
        pinned.meta.preserve_verbatim = true;
        h.insert(2, pinned);
    }
    h.push(Message::user(tool_output(0, newest, newest)));
    h
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn every_attempt_fits_or_fails_fast_never_resends(
        body in 2_000usize..120_000,
        system in 10usize..6_000,
        newest in 10usize..12_000,
        verbatim in any::<bool>(),
        window in 256u64..16_384,
        ratio in 1.0f64..6.0,
        configured in prop_oneof![Just(32_768u64), Just(200_000u64), 256u64..16_384],
        reserve in 0usize..2_000,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(async {
            let store = MemoryStore::new();
            let policy = EffectivePolicy::default();
            let mut state = SessionState::new();
            let mut h = history_of(body, system, newest, verbatim);
            let server = Server { window, ratio };
            let uncompactable = (system + reserve) as u64;
            let mut attempts = 0;
            loop {
                let sent = history::weight(&h) + reserve;
                let Some(err) = server.rejects(sent) else { break };
                prop_assert_eq!(classify(&err), FailureClass::ContextOverflow);
                attempts += 1;
                let ctx = RecoveryContext {
                    policy: &policy,
                    store: &store,
                    uncompactable_bytes: uncompactable,
                    inputs: BudgetInputs { context_window: configured, payload_cap: None, reserve_bytes: reserve },
                    sent_weight: sent,
                };
                let before = h.clone();
                match recover(&mut h, &err, FailureClass::ContextOverflow, &ctx, &mut state).await {
                    Ok(o) => {
                        let after = history::weight(&h) + reserve;
                        prop_assert!(after < sent, "attempt {} did not shrink: {} -> {}", o.attempt, sent, after);
                        let est = state.chars_per_token.tokens(after);
                        let w = state.effective_window(configured);
                        prop_assert!(w <= window.min(configured));
                        prop_assert!(
                            est as f64 <= w as f64 * FLOOR_WINDOW_SHARE + 1.0,
                            "estimate {} does not fit window {}", est, w
                        );
                        prop_assert!(h.last().is_some_and(|m| m.role == Role::User), "the newest message stays");
                        // Verbatim messages survive every level within their share of the
                        // budget (compact::verbatim); beyond it they are archived first.
                        if verbatim && !h.iter().any(|m| m.meta.preserve_verbatim) {
                            let pinned = pinned_text();
                            let archived = store.fetch(&Key::of(pinned.as_bytes())).await.ok().flatten();
                            prop_assert_eq!(archived.as_deref(), Some(pinned.as_bytes()), "verbatim kept or archived");
                        }
                    }
                    Err(e @ RecoveryError::WindowFloor { .. }) => {
                        prop_assert_eq!(&h, &before, "fail fast changes nothing");
                        // The floor really cannot fit: system + catalog + newest at its floor.
                        let floor = cairn_engine::compact::emergency::floor_with_keep(&h, 1) + reserve;
                        let limit = window.min(configured);
                        prop_assert!(
                            server.count(floor) as f64 > limit as f64 * FLOOR_WINDOW_SHARE * 0.9,
                            "floor diagnosis although {} tokens would fit {}: {}", server.count(floor), limit, e
                        );
                        break;
                    }
                    Err(e) => prop_assert!(false, "unexpected {e:?}"),
                }
                // A server that counts with one ratio is satisfied by the first attempt.
                prop_assert!(attempts <= 1 || server.rejects(history::weight(&h) + reserve).is_none(),
                    "attempt {} still rejected", attempts);
                if attempts >= 2 { break; }
            }
            Ok(())
        })?;
    }
}
