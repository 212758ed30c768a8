//! A provider cannot keep a session busy for as long as it likes: every provider call has a
//! total deadline (`timeouts.providerCallSeconds`) and so has the whole turn
//! (`timeouts.turnSeconds`), whether the reply is streamed or not, trickles in a byte at a
//! time, keeps the connection alive with SSE comments, or never sends a byte at all.

use std::time::{Duration, Instant};

use cairn_agent::history::{Message, Role};
use cairn_agent::session::{Session, TurnError};
use cairn_sim::{Fault, ScriptedReply, Sim};
use serde_json::json;

use crate::support::agent::*;

/// Far longer than any deadline the tests set: a turn still running then was not bounded.
const BOUND: Duration = Duration::from_secs(20);

async fn session_with(sim: &Sim, dir: &std::path::Path, timeouts: &str) -> Session {
    session_as(sim, dir, timeouts, "a").await
}

async fn session_as(sim: &Sim, dir: &std::path::Path, timeouts: &str, holder: &str) -> Session {
    let env = storage_env(dir, None);
    let yaml = config_yaml(
        "deadlines",
        &format!("{}/v1", sim.url()),
        100_000,
        &format!("compaction:\n  timeouts: {timeouts}\n"),
    );
    build_session(&yaml, &env, holder).await.session
}

/// Runs a turn (streamed or not) and returns its result and how long it took; panics when
/// it is still running after [`BOUND`].
async fn timed_turn(
    session: &mut Session,
    input: &str,
    stream: bool,
) -> (Result<String, TurnError>, Duration) {
    let started = Instant::now();
    let input = vec![Message::user(input)];
    let run = async {
        if stream {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
            let r = session.turn_streaming(input, tx).await;
            let _ = drain.await;
            r
        } else {
            session.turn(input).await
        }
    };
    let result = tokio::time::timeout(BOUND, run)
        .await
        .unwrap_or_else(|_| panic!("the turn was still running after {BOUND:?}"));
    (result.map(|o| o.text), started.elapsed())
}

fn assert_timeout(result: &Result<String, TurnError>, took: Duration, what: &str) {
    match result {
        Err(TurnError::Provider { class, message, .. }) => {
            assert_eq!(*class, "timeout", "{what}: {message}");
            assert!(message.contains("deadline"), "{what}: {message}");
        }
        other => panic!("{what}: expected a provider timeout, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(1_900) && took < Duration::from_secs(6),
        "{what}: took {took:?}, the call deadline is 2 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_slow_provider_is_cut_at_the_call_deadline() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut session = session_with(
        &sim,
        dir.path(),
        "{providerCallSeconds: 2, turnSeconds: 60}",
    )
    .await;
    let long = "a reply long enough to take minutes at one byte every 300 ms. ".repeat(4);

    // A non-streamed JSON answer at one byte every 300 ms: never idle, never finished.
    sim.push_reply(ScriptedReply::text(long.clone()));
    sim.push_fault(Fault::Drip { ms: 300 });
    let (r, took) = timed_turn(&mut session, "q1", false).await;
    assert_timeout(&r, took, "drip, not streamed");

    // A stream that sends half its answer, then an SSE comment every 200 ms forever.
    sim.push_reply(ScriptedReply::text(long.clone()));
    sim.push_fault(Fault::Heartbeat { ms: 200 });
    let (r, took) = timed_turn(&mut session, "q2", true).await;
    assert_timeout(&r, took, "heartbeat, streamed");

    // A stream dripping one byte every 300 ms.
    sim.push_reply(ScriptedReply::text(long.clone()));
    sim.push_fault(Fault::Drip { ms: 300 });
    let (r, took) = timed_turn(&mut session, "q3", true).await;
    assert_timeout(&r, took, "drip, streamed");

    // No byte at all for a minute.
    sim.push_reply(ScriptedReply::text("late"));
    sim.push_fault(Fault::Latency { ms: 60_000 });
    let (r, took) = timed_turn(&mut session, "q4", false).await;
    assert_timeout(&r, took, "silence");

    // The session is free again and the failed turns left no input behind.
    sim.push_reply(ScriptedReply::text("fine"));
    let (r, _) = timed_turn(&mut session, "q5", false).await;
    assert_eq!(r.expect("a normal turn"), "fine");
    let users: Vec<_> = session
        .history()
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(users, ["q5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_deadline_bounds_all_calls_of_a_turn_together() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut session =
        session_with(&sim, dir.path(), "{providerCallSeconds: 2, turnSeconds: 3}").await;
    // Seven model calls of 1.5 s each: every one within the call deadline, together (10.5 s)
    // far over the turn's, so a turn that ignored its deadline would end after 9 s, the most
    // the test allows (three times the deadline: room for a loaded machine).
    for i in 0..6 {
        sim.push_reply(ScriptedReply::tool_call(
            "recall",
            json!({"key": format!("00000000000000{i:02}")}),
        ));
        sim.push_fault(Fault::Latency { ms: 1_500 });
    }
    sim.push_reply(ScriptedReply::text("too late"));
    sim.push_fault(Fault::Latency { ms: 1_500 });
    let started = Instant::now();
    let r = tokio::time::timeout(BOUND, session.turn(vec![Message::user("go")]))
        .await
        .unwrap_or_else(|_| panic!("the turn was still running after {BOUND:?}"));
    let took = started.elapsed();
    match r {
        Err(e) if e.label() == "deadline" => {
            assert!(e.to_string().contains("3s"), "{e}")
        }
        other => panic!("expected the turn deadline, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(2_900) && took < Duration::from_secs(9),
        "took {took:?}, the turn deadline is 3 s"
    );
    assert!(
        session.history().iter().all(|m| m.content != "go"),
        "the input of an aborted turn is dropped"
    );
    // ...from the journal too: a restart right after finds no question without its answer.
    drop(session);
    let again = session_as(
        &sim,
        dir.path(),
        "{providerCallSeconds: 2, turnSeconds: 3}",
        "b",
    )
    .await;
    assert!(
        again.history().iter().all(|m| m.content != "go"),
        "the restarted session still holds the aborted input: {:?}",
        again.history()
    );
}
