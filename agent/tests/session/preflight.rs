//! Pre-flight has one implementation (`compact::ladder::preflight`) and the turn uses it: the
//! large-history warning comes at 2.5 MiB of request, the threshold the ladder documents.

use cairn_agent::compact::ladder::LARGE_HISTORY_WARN_BYTES;
use cairn_agent::history::Message;
use cairn_sim::Sim;

use crate::support::agent::*;

async fn warned_at(history_bytes: usize) -> bool {
    let sim = Sim::start().await.expect("sim");
    sim.set_window(MODEL, 10_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("pre", &format!("{}/v1", sim.url()), 10_000_000, "");
    let mut built = build_session(&yaml, &env, "a").await;
    let chunk = "word ".repeat(10_000);
    let mut seed = Vec::new();
    let mut bytes = 0;
    while bytes + chunk.len() < history_bytes {
        seed.push(Message::user(chunk.clone()));
        seed.push(Message::assistant("noted"));
        bytes += chunk.len() + 5;
    }
    seed.push(Message::user("x".repeat(history_bytes - bytes)));
    seed.push(Message::assistant("noted"));
    built.session.seed(seed).await.expect("seeded");
    let out = built
        .session
        .turn(vec![Message::user("go on")])
        .await
        .expect("turn");
    out.notices
        .iter()
        .any(|n| n.kind == "warning" && n.message.contains("no payload cap is known"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_large_history_warning_uses_the_ladders_threshold() {
    assert_eq!(LARGE_HISTORY_WARN_BYTES, 2_621_440);
    // 2.55 MB: over the 2,500,000 bytes a second copy of the rule once used, under 2.5 MiB.
    assert!(!warned_at(2_550_000).await, "warned below 2.5 MiB");
    assert!(warned_at(2_700_000).await, "no warning above 2.5 MiB");
}
