//! The idle rule's clock survives a restart: the real `cairn-agent serve` is stopped and
//! started again on the same journal, and the first turn after the restart stubs old tool
//! results once `idleMinutes` have passed since the last reply, as an agent that never
//! stopped would. The time that passed is simulated by moving the journaled time of the last
//! reply back (what a wall clock two hours later would see), not by waiting.

use std::path::{Path, PathBuf};

use cairn_agent::journal::parse_entry_name;
use cairn_sim::Sim;
use serde_json::{Value, json};

use crate::support::agent::*;

/// Tool outputs in the history; the idle rule keeps the five most recent.
const OUTPUTS: usize = 8;

fn payload(i: usize) -> String {
    format!("PAYLOAD-{i}-{}", "tool output line; ".repeat(200))
}

fn read_tool() -> Value {
    json!([{
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }])
}

/// The journal's directory under `data` (local storage).
fn journal_dir(data: &Path) -> PathBuf {
    fn find(dir: &Path) -> Option<PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "journal") {
                    return Some(path);
                }
                if let Some(found) = find(&path) {
                    return Some(found);
                }
            }
        }
        None
    }
    find(data).expect("the journal directory")
}

/// Moves the journaled time of the last reply `by_ms` into the past (the newest entry is the
/// one a rebuild takes its state from). Returns the value it held.
fn age_last_reply(data: &Path, by_ms: u64) -> Option<u64> {
    let dir = journal_dir(data);
    let newest = std::fs::read_dir(&dir)
        .expect("journal dir")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            parse_entry_name(&name).map(|(_, seq, _)| (seq, e.path()))
        })
        .max_by_key(|(seq, _)| *seq)
        .expect("a journal entry")
        .1;
    let mut entry: Value =
        serde_json::from_slice(&std::fs::read(&newest).expect("read entry")).expect("entry json");
    let held = entry["state"]["last_reply_ms"].as_u64();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    entry["state"]["last_reply_ms"] = json!(held.unwrap_or(now) - by_ms);
    std::fs::write(&newest, serde_json::to_vec(&entry).expect("entry")).expect("write entry");
    held
}

/// The outputs the provider saw whole in the last request.
fn whole_outputs(sim: &Sim) -> Vec<usize> {
    let last = sim.requests().pop().expect("a request");
    (0..OUTPUTS)
        .filter(|i| last.contains(&payload(*i)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_idle_rule_fires_on_the_first_turn_once_its_time_has_passed() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("idle.yaml");
    // The outputs reach the history whole and the age rule stays out of the way: only the
    // idle rule (60 minutes) can stub.
    let extra = "compaction:\n  compression:\n    mode: \"off\"\n  microcompact:\n    truncateAfterTurns: 50\n    summarizeAfterTurns: 60\n    idleMinutes: 60\n";
    std::fs::write(
        &config,
        config_yaml("idle", &format!("{}/v1", sim.url()), 200_000, extra),
    )
    .expect("config");
    let data = dir.path().join("data");
    let env = storage_env(&data, None);
    let start = |n: &str| AgentProcess::start(&config, &env, &dir.path().join(format!("{n}.log")));

    // A conversation with eight tool outputs, answered once.
    let mut input = vec![json!({"role": "user", "content": "read the files"})];
    for i in 0..OUTPUTS {
        let id = format!("call_{i}");
        input.push(json!({"type": "function_call", "call_id": id, "name": "read_file", "arguments": format!("{{\"path\":\"f{i}\"}}")}));
        input.push(json!({"type": "function_call_output", "call_id": id, "output": payload(i)}));
    }
    let mut agent = start("a");
    let (status, first) = agent
        .api()
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": input, "tools": read_tool()}),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(whole_outputs(&sim), (0..OUTPUTS).collect::<Vec<_>>());
    assert!(agent.terminate().success(), "{}", agent.log());

    // Restarted at once: the cache is warm, the idle rule must not fire.
    let mut agent = start("b");
    let (status, second) = agent
        .api()
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": "go on", "previous_response_id": first["id"], "tools": read_tool()}),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        whole_outputs(&sim),
        (0..OUTPUTS).collect::<Vec<_>>(),
        "a restart alone is not idleness"
    );
    assert!(agent.terminate().success(), "{}", agent.log());

    // Two hours pass while the agent is down (an idle suspend, say).
    let held = age_last_reply(&data, 2 * 60 * 60 * 1000);
    let agent = start("c");
    let (status, third) = agent
        .api()
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": "and now?", "previous_response_id": second["id"], "tools": read_tool()}),
        )
        .await;
    assert_eq!(status, 200, "{third}");
    // The first turn after the restart stubs every output but the five most recent.
    assert_eq!(
        whole_outputs(&sim),
        (OUTPUTS - 5..OUTPUTS).collect::<Vec<_>>(),
        "the idle rule ran on the first turn after the restart"
    );
    let last = sim.requests().pop().expect("request");
    assert!(
        last.contains("<<ccr:"),
        "the stubs name their archived originals"
    );
    assert!(
        held.is_some(),
        "the journal holds the time of the last reply"
    );
    let session = agent.api().session().await;
    assert!(
        session["stats"]["passes"]["microcompacted"]
            .as_u64()
            .unwrap_or(0)
            >= 3,
        "{session}"
    );
}
