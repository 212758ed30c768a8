//! Convergence against cairn-sim speaking like llama-server: a 2,048-token window, a tokenizer
//! at 1.7 bytes per token and llama.cpp's own overflow body, while the session was told
//! 32,768 tokens. The same promises as against the real server (`real_llama`), in a second:
//! every turn answers, the window is learned from the first rejection, no later turn needs
//! more than one retry, and no rejected request is resent unchanged.

use cairn_agent::server::AppState;
use cairn_sim::Sim;

use crate::support::agent::*;

/// Log lines: 1.6–1.8 bytes per token with small vocabularies.
fn logs(turn: usize, bytes: usize) -> String {
    let mut s = format!("Check these log lines (batch {turn}):\n");
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!(
            "2026-11-30T08:{:02}:{:02}Z WARN id={:06x} retry={}\n",
            i % 60,
            (turn + i) % 60,
            turn * 7919 + i,
            i % 5
        ));
        i += 1;
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_turns_converge_on_a_small_real_window() {
    for configured in [None, Some(32_768), Some(2_048)] {
        let sim = Sim::start().await.expect("sim");
        sim.set_window(MODEL, 2_048);
        sim.set_llama_dialect(MODEL, 1.7);
        let dir = tempfile::tempdir().expect("tempdir");
        let env = storage_env(dir.path(), None);
        let mut yaml = config_yaml("conv", &format!("{}/v1", sim.url()), 0, "")
            .replace("maxOutputTokens: 1000", "maxOutputTokens: 64");
        yaml = match configured {
            Some(w) => yaml.replace("contextWindow: 0", &format!("contextWindow: {w}")),
            None => yaml.replace("contextWindow: 0\n", ""),
        };
        let built = build_session(&yaml, &env, "a").await;
        let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
        let mut seen = 0;
        let mut overflowed = false;
        for t in 0..30 {
            let (status, body) = api.turn(&logs(t, 3_000 + (t * 1_237) % 2_000)).await;
            assert_eq!(status, 200, "window {configured:?}, turn {t}: {body}");
            let reqs = sim.requests();
            let rejected = reqs[seen..]
                .iter()
                .filter(|r| r.outcome == "overflow")
                .count();
            if overflowed {
                assert!(
                    rejected <= 1,
                    "turn {t}: {rejected} retries after the first overflow"
                );
            }
            overflowed |= rejected > 0;
            for pair in reqs[seen.saturating_sub(1)..].windows(2) {
                if pair[0].outcome == "overflow" {
                    assert_ne!(
                        pair[0].body, pair[1].body,
                        "a rejected request was resent unchanged"
                    );
                }
            }
            seen = reqs.len();
            let view = api.session().await;
            let roles: Vec<String> = view["recent"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["role"].as_str().map(str::to_owned))
                .collect();
            assert!(
                roles.ends_with(&["user".to_string(), "assistant".to_string()]),
                "{roles:?}"
            );
        }
        let stats = api.session().await["stats"].clone();
        assert!(
            stats["effectiveContextWindow"].as_u64().unwrap_or(u64::MAX) <= 2_048,
            "{stats}"
        );
        if configured != Some(2_048) {
            assert_eq!(
                stats["learnedContextWindow"].as_u64(),
                Some(2_048),
                "{stats}"
            );
        }
        let ratio = stats["bytesPerToken"].as_f64().unwrap_or(0.0);
        assert!(ratio < 2.5, "the ratio follows the server's count: {ratio}");
        let total = sim.requests().len();
        let rejected = sim
            .requests()
            .iter()
            .filter(|r| r.outcome == "overflow")
            .count();
        eprintln!("window {configured:?}: {total} requests, {rejected} rejected");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_learned_window_survives_a_restart_and_is_forgotten_when_the_spec_changes() {
    let sim = Sim::start().await.expect("sim");
    sim.set_window(MODEL, 2_048);
    sim.set_llama_dialect(MODEL, 1.7);
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("restart", &format!("{}/v1", sim.url()), 32_768, "")
        .replace("maxOutputTokens: 1000", "maxOutputTokens: 64");
    {
        let mut built = build_session(&yaml, &env, "a").await;
        let out = built
            .session
            .turn(vec![cairn_agent::history::Message::user(logs(0, 5_000))])
            .await
            .expect("turn");
        assert!(
            out.notices.iter().any(|n| n.kind == "learned_window"),
            "{out:?}"
        );
        assert_eq!(built.session.stats().learned_context_window, Some(2_048));
    }
    // A restarted agent reads it back from the journal.
    let built = build_session(&yaml, &env, "b").await;
    assert_eq!(built.session.stats().learned_context_window, Some(2_048));
    assert!(built.session.stats().bytes_per_token < 2.5);
    drop(built);
    // A new configured window makes the learned one meaningless.
    let changed = yaml.replace("contextWindow: 32768", "contextWindow: 65536");
    let built = build_session(&changed, &env, "c").await;
    assert_eq!(built.session.stats().learned_context_window, None);
    assert_eq!(built.session.stats().effective_context_window, 65_536);
}
