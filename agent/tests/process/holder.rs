//! The holder identity of the journal claims and of the Lease is unique per incarnation. In a
//! container the agent is pid 1 and a session's replacement pod has the same name, so
//! `HOSTNAME/pid` named every incarnation of `cairn-x-0` alike; the test runs each agent as
//! pid 1 of its own pid namespace with the same HOSTNAME, as two incarnations of one pod.

use std::path::Path;
use std::process::Command;

use cairn_sim::{ScriptedReply, Sim};
use serde_json::Value;

use crate::support::agent::*;

fn holders(journal: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(journal.join("claims"))
        .expect("claims directory")
        .map(|e| e.expect("entry").path())
        // One claim per incarnation; its completion (`-start.json`) names the same holder.
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p.to_string_lossy().ends_with("-start.json")
        })
        .map(|p| {
            let v: Value =
                serde_json::from_slice(&std::fs::read(&p).expect("claim")).expect("claim JSON");
            v["holder"].as_str().expect("holder").to_owned()
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_incarnations_of_one_pod_hold_the_session_under_different_identities() {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status();
    assert!(
        probe.is_ok_and(|s| s.success()),
        "this test needs `unshare --pid` (util-linux, run as root)"
    );
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("x.yaml");
    std::fs::write(
        &config,
        config_yaml("x", &format!("{}/v1", sim.url()), 200_000, ""),
    )
    .expect("config");
    for i in 0..2 {
        sim.push_reply(ScriptedReply::text("ok"));
        let config = config.clone();
        let data = dir.path().to_path_buf();
        let out = tokio::task::spawn_blocking(move || {
            Command::new("unshare")
                .args(["--pid", "--fork"])
                .arg(env!("CARGO_BIN_EXE_cairn-agent"))
                .args(["run", "--config"])
                .arg(&config)
                .args(["--prompt", "hello"])
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("XDG_DATA_HOME", &data)
                .env("HOSTNAME", "cairn-x-0")
                .env("CAIRN_POD_UID", "3f1c9a52-0000-4000-8000-00000000000a")
                .env("OPENAI_API_KEY", "sk-sim")
                .output()
                .expect("cairn-agent")
        })
        .await
        .expect("join");
        assert!(
            out.status.success(),
            "run {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let holders = holders(&dir.path().join("cairn/tests/x/journal"));
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert_ne!(
        holders[0], holders[1],
        "two incarnations claimed the journal under one identity"
    );
    for h in &holders {
        assert!(h.starts_with("cairn-x-0/"), "the pod name leads: {h}");
    }
}
