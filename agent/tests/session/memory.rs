//! The session memory (`compaction.memory`): with a summarizer that takes 30 s a call, a
//! 40-turn session compacts several times and no turn waits for the summarizer once the
//! memory exists; an agent killed between queueing a removed segment and absorbing it loses
//! nothing (the next agent absorbs it); a memory that fails the quality gate is not used and
//! level 2 runs as without one. The provider is cairn-sim (routes answer the summarizer's
//! requests, with a delay), the store a local directory or moto.

use std::time::{Duration, Instant};

use cairn_agent::compact::summarize::SECTIONS;
use cairn_agent::history::Message;
use cairn_agent::memory::UPDATE_PHRASE;
use cairn_sim::{ScriptedReply, Sim};
use serde_json::Value;

use crate::support::agent::*;
use crate::support::moto::Moto;

/// What only a level-2 summary request carries.
const LEVEL2_PHRASE: &str = "Summarize the conversation transcript below";
/// A summarizer call takes this long: long beside a turn (milliseconds), as a real model's
/// summary is, and five of a person's messages long.
const SLOW: Duration = Duration::from_secs(8);
/// A person sends a message every this often (the turns themselves take milliseconds).
const PACE: Duration = Duration::from_millis(1_600);
const TURNS: usize = 40;

/// A memory with the nine sections, about 1.2 KB.
fn memory_text(tag: &str) -> String {
    let mut s = String::new();
    for (n, sec) in SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe user keeps sending numbered notes ({tag}); each was acknowledged.\n",
            n + 1
        ));
    }
    while s.len() < 1_200 {
        s.push_str("Nothing else is pending.\n");
    }
    s
}

fn summary_text(len: usize) -> String {
    let mut s = memory_text("level 2");
    while s.len() < len {
        s.push_str("Details of the level-2 summary.\n");
    }
    s.truncate(len);
    s
}

fn extra(every_turns: u32) -> String {
    format!(
        "compaction:\n  minKeepRecent: 4\n  autoCompact: {{bufferTokens: 1000, warningBufferTokens: 1500, blockingBufferTokens: 200}}\n  memory: {{enabled: true, everyTurns: {every_turns}, everyTokens: 0}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_summarizer_never_holds_a_turn_once_the_memory_exists() {
    let sim = Sim::start().await.expect("sim");
    sim.route(
        UPDATE_PHRASE,
        ScriptedReply::text(memory_text("memory")),
        SLOW,
    );
    sim.route(
        LEVEL2_PHRASE,
        ScriptedReply::text(summary_text(2_000)),
        SLOW,
    );
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml(
        "memory-latency",
        &format!("{}/v1", sim.url()),
        16_000,
        &extra(1),
    );
    let mut built = build_session(&yaml, &env, "a").await;

    let mut compaction_turns = Vec::new();
    for i in 0..TURNS {
        let before = built.session.stats();
        let memory_exists = before.memory.as_ref().is_some_and(|m| m.version > 0);
        let started = Instant::now();
        built
            .session
            .turn(vec![Message::user(format!(
                "note {i}: {}",
                "words of the note ".repeat(110)
            ))])
            .await
            .expect("turn");
        let took = started.elapsed();
        let after = built.session.stats();
        let memory = after.memory.clone().expect("memory status");
        eprintln!(
            "turn {i}: {took:?}, history {} bytes, compactions {}, memory v{} covers {} of {} messages, queue {}, updating {}",
            after.history_bytes,
            after.compactions,
            memory.version,
            memory.covered_messages,
            after.messages,
            memory.queue_segments,
            memory.updating
        );
        if after.compactions > before.compactions {
            compaction_turns.push((i, took, memory_exists));
        }
        if memory_exists {
            assert!(
                took < SLOW / 6,
                "turn {i} took {took:?} although the memory existed"
            );
        }
        tokio::time::sleep(PACE).await;
    }
    eprintln!("compactions at: {compaction_turns:?}");
    assert!(
        compaction_turns.len() >= 3,
        "the session compacted several times: {compaction_turns:?}"
    );
    for (i, took, memory_existed) in &compaction_turns {
        assert!(memory_existed, "the memory existed by compaction turn {i}");
        assert!(*took < SLOW / 6, "compaction turn {i} took {took:?}");
    }
    let stats = built.session.stats();
    let memory = stats.memory.expect("memory");
    assert_eq!(
        memory.compactions_from_memory,
        compaction_turns.len() as u64,
        "every compaction used the memory: {memory:?}"
    );
    assert!(memory.updates >= 3, "{memory:?}");
    assert_eq!(memory.failures, 0, "{memory:?}");
    assert!(
        !sim.requests().iter().any(|r| r.contains(LEVEL2_PHRASE)),
        "no level-2 summary was asked for"
    );
    // The memory stands in the history with its sections and its segment's marker.
    let history = cairn_agent::history::to_jsonl(built.session.history());
    for s in SECTIONS {
        assert!(history.contains(s), "{s}");
    }
    // Its updates are the summarizer's spending.
    let summarizer = stats.tokens.summarizer.expect("summarizer tokens");
    assert!(summarizer.input > 0 && summarizer.output > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_queueing_a_segment_and_absorbing_it_nothing_is_lost() {
    let sim = Sim::start().await.expect("sim");
    let moto = Moto::start().await;
    let dir = tempfile::tempdir().expect("dir");
    // The first agent's update never finishes: it is killed with the segment queued.
    sim.route(
        UPDATE_PHRASE,
        ScriptedReply::text(memory_text("first")),
        Duration::from_secs(600),
    );
    sim.route(
        LEVEL2_PHRASE,
        ScriptedReply::text(summary_text(1_500)),
        Duration::ZERO,
    );
    let config = dir.path().join("memory.yaml");
    std::fs::write(
        &config,
        config_yaml(
            "memory-kill",
            &format!("{}/v1", sim.url()),
            200_000,
            &extra(1_000),
        ),
    )
    .expect("config");
    let log = |id: &str| dir.path().join(format!("{id}.log"));
    let env = |id: &str| storage_env(&dir.path().join(id), Some(&moto.endpoint));

    let mut first = AgentProcess::start(&config, &env("first"), &log("first"));
    let api = first.api();
    for i in 0..6 {
        let (status, body) = api
            .turn(&format!("fact number {i}: {}", "detail ".repeat(300)))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = api.post("/v1/session/compact", Value::Null).await;
    assert_eq!(status, 200, "{body}");
    let memory = api.session().await["stats"]["memory"].clone();
    assert_eq!(memory["queueSegments"], 1, "{memory}");
    assert_eq!(memory["version"], 0, "{memory}");
    // The update is in flight (the summarizer has the segment) when the process dies.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sim.requests().iter().any(|r| r.contains(UPDATE_PHRASE)) {
        assert!(Instant::now() < deadline, "no update started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.kill();

    sim.route(
        UPDATE_PHRASE,
        ScriptedReply::text(memory_text("second")),
        Duration::ZERO,
    );
    let second = AgentProcess::start(&config, &env("second"), &log("second"));
    let api = second.api();
    let deadline = Instant::now() + Duration::from_secs(60);
    let memory = loop {
        let m = api.session().await["stats"]["memory"].clone();
        if m["version"].as_u64().unwrap_or(0) >= 1 && m["queueSegments"] == 0 {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "the queue was not absorbed: {m}\n{}",
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(memory["failures"], 0, "{memory}");
    // The second agent's update carried the segment the first one queued: the facts the
    // compaction removed from the history.
    let updates: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.contains(UPDATE_PHRASE))
        .collect();
    let last = updates.last().expect("update");
    for i in 0..3 {
        assert!(
            last.contains(&format!("fact number {i}")),
            "fact {i} reached the memory"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_that_fails_the_quality_gate_is_not_used_and_level_2_runs() {
    let sim = Sim::start().await.expect("sim");
    sim.route(
        UPDATE_PHRASE,
        ScriptedReply::text(format!(
            "I'm sorry, I cannot help with that. {}",
            memory_text("x")
        )),
        Duration::ZERO,
    );
    sim.route(
        LEVEL2_PHRASE,
        ScriptedReply::text(summary_text(3_000)),
        Duration::ZERO,
    );
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml(
        "memory-gate",
        &format!("{}/v1", sim.url()),
        200_000,
        &extra(1),
    );
    let mut built = build_session(&yaml, &env, "a").await;
    built
        .session
        .turn(vec![Message::user("the first note")])
        .await
        .expect("turn");
    let memory = built.session.memory().expect("memory on");
    memory.idle().await;
    let stats = built.session.stats().memory.expect("memory status");
    assert_eq!(stats.version, 0, "a refusal is no memory: {stats:?}");
    assert_eq!(stats.failures, 1, "{stats:?}");
    assert!(
        stats
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("refusal")),
        "{stats:?}"
    );
    // The failure is told with the next turn, and the turn goes on.
    let out = built
        .session
        .turn(vec![Message::user("the second note")])
        .await
        .expect("turn");
    assert!(
        out.notices.iter().any(|n| n.kind == "memory"),
        "{:?}",
        out.notices
    );
    memory.idle().await;

    // A memory with its nine sections that is longer than what it would replace fails the
    // summary's gate at compaction time: level 2 is asked instead, as without a memory.
    sim.route(
        UPDATE_PHRASE,
        ScriptedReply::text(memory_text("valid")),
        Duration::ZERO,
    );
    built
        .session
        .turn(vec![Message::user("the third note")])
        .await
        .expect("turn");
    memory.idle().await;
    let stats = built.session.stats().memory.expect("memory status");
    assert!(stats.version >= 1, "{stats:?}");
    assert!(stats.covered_messages > 0, "{stats:?}");
    let level2_before = sim
        .requests()
        .iter()
        .filter(|r| r.contains(LEVEL2_PHRASE))
        .count();
    let out = built.session.compact_now(None).await.expect("compaction");
    let notes: Vec<&String> = out
        .reports
        .iter()
        .filter(|r| r.pass == cairn_agent::compact::Pass::Summary)
        .flat_map(|r| &r.notes)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("session memory rejected by the quality gate: not_shorter")),
        "{notes:?}"
    );
    let level2_after = sim
        .requests()
        .iter()
        .filter(|r| r.contains(LEVEL2_PHRASE))
        .count();
    assert!(level2_after > level2_before, "level 2 ran");
    let stats = built.session.stats().memory.expect("memory status");
    assert_eq!(stats.compactions_from_memory, 0, "{stats:?}");
}

/// A request of the session's own turn that carries `ask`, not a summarizer's (a memory
/// update or a level-2 summary running beside the turn may quote the conversation).
fn is_turn_request(r: &cairn_sim::RecordedRequest, ask: &str) -> bool {
    r.contains(ask) && !r.contains(UPDATE_PHRASE) && !r.contains(LEVEL2_PHRASE)
}

/// The body sizes of the session's own requests that carried `ask`, in order.
fn turn_request_sizes(sim: &Sim, ask: &str) -> Vec<u64> {
    sim.requests()
        .iter()
        .filter(|r| is_turn_request(r, ask))
        .map(|r| r.bytes)
        .collect()
}

/// Recovery shrinks the rejected request, the session memory's queue refuses what
/// it removed, so the rewrite is undone. The same request must not go out again: the attempt
/// fails, says why, and nothing is dropped. With the queue back, recovery goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_memory_queue_during_recovery_never_resends_the_rejected_request() {
    use crate::support::faults::{Fault, FaultProxy, Op};
    let sim = Sim::start().await.expect("sim");
    let moto = Moto::start().await;
    let proxy = FaultProxy::start(moto.port, Duration::from_millis(600)).await;
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), Some(&proxy.endpoint));
    let yaml = config_yaml(
        "memory-queue-refused",
        &format!("{}/v1", sim.url()),
        200_000,
        &extra(1_000),
    );
    let mut built = build_session(&yaml, &env, "a").await;
    for i in 0..8 {
        built
            .session
            .turn(vec![Message::user(format!(
                "fact number {i}: {}",
                "detail ".repeat(300)
            ))])
            .await
            .expect("turn");
    }
    let history_before = cairn_agent::history::to_jsonl(built.session.history());
    // A proxy in front of the provider rejects the body as too large, every time it sees it.
    let rejected = cairn_sim::Fault::Status {
        status: 413,
        retry_after: None,
    };
    for _ in 0..6 {
        sim.push_fault(rejected.clone());
    }
    proxy.always(Op::Put, "memory/queue", Fault::Refuse);
    const ASK: &str = "the question after the rejection";
    let err = built
        .session
        .turn(vec![Message::user(ASK)])
        .await
        .expect_err("the attempt fails");
    let sent = turn_request_sizes(&sim, ASK);
    assert_eq!(
        sent.len(),
        1,
        "the rejected request went out once, never again unchanged: {sent:?}"
    );
    assert_eq!(err.label(), "provider", "{err}");
    let why = err.to_string();
    assert!(
        why.contains("session memory's queue") && why.contains("not resent"),
        "{why}"
    );
    assert_eq!(
        cairn_agent::history::to_jsonl(built.session.history()),
        history_before,
        "nothing was dropped"
    );
    let stats = built.session.stats();
    let last = stats.last_recovery.expect("last recovery");
    assert_eq!(last.outcome, "Failed", "{last:?}");
    assert_eq!(stats.memory.expect("memory").queue_segments, 0);

    // The queue answers again: the cap learned from the rejection shrinks the next request
    // before it is sent, and what the compaction removed is queued for the memory.
    let rejected_bytes = sent[0];
    proxy.clear();
    sim.reset();
    built
        .session
        .turn(vec![Message::user(ASK)])
        .await
        .expect("the turn goes through once the queue answers");
    let sent = turn_request_sizes(&sim, ASK);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0] < rejected_bytes * 3 / 4,
        "under the learned cap: {sent:?}"
    );
    let stats = built.session.stats();
    assert!(stats.memory.expect("memory").queue_segments >= 1);
}
