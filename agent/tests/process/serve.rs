//! The real `cairn-agent serve` binary: killed mid-session and restarted, two agents on one
//! session, a policy change picked up between turns, graceful shutdown. Providers are
//! cairn-sim, S3 is moto.

use std::time::{Duration, Instant};

use cairn_sim::{Fault, ScriptedReply, Sim};
use serde_json::Value;

use crate::support::agent::*;
use crate::support::moto::Moto;

struct Rig {
    sim: Sim,
    moto: Moto,
    dir: tempfile::TempDir,
}

impl Rig {
    async fn start() -> Self {
        Self {
            sim: Sim::start().await.expect("sim"),
            moto: Moto::start().await,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn config(&self, name: &str, extra: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(format!("{name}.yaml"));
        let yaml = config_yaml(name, &format!("{}/v1", self.sim.url()), 200_000, extra);
        std::fs::write(&path, yaml).expect("write config");
        path
    }

    /// Each agent gets its own local cache directory, as two pods would.
    fn agent(&self, config: &std::path::Path, id: &str) -> AgentProcess {
        let data = self.dir.path().join(id);
        let env = storage_env(&data, Some(&self.moto.endpoint));
        AgentProcess::start(config, &env, &self.dir.path().join(format!("{id}.log")))
    }
}

fn sim_saw(sim: &Sim, needle: &str) -> Option<cairn_sim::RecordedRequest> {
    sim.requests()
        .into_iter()
        .rev()
        .find(|r| r.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_session_and_restarted_nothing_acknowledged_is_lost() {
    let rig = Rig::start().await;
    let config = rig.config("crash", "");
    let mut first = rig.agent(&config, "first");
    let api = first.api();
    for i in 0..5 {
        let (status, body) = api.turn(&format!("remember fact number {i}")).await;
        assert_eq!(status, 200, "{body}");
    }
    // A turn in flight when the process dies: never acknowledged.
    rig.sim.push_fault(Fault::Latency { ms: 10_000 });
    let in_flight = {
        let api = api.clone();
        tokio::spawn(async move { api.turn("this one is in flight").await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    first.kill();
    let _ = in_flight.await;

    let second = rig.agent(&config, "second");
    let api = second.api();
    let session = api.session().await;
    assert_eq!(session["stats"]["turns"], 5, "{session}");
    assert_eq!(session["journalEpoch"], 2, "{session}");
    rig.sim.reset();
    let (status, body) = api.turn("what do you remember?").await;
    assert_eq!(status, 200, "{body}");
    let req = sim_saw(&rig.sim, "what do you remember?").expect("request");
    for i in 0..5 {
        assert!(
            req.contains(&format!("remember fact number {i}")),
            "fact {i} lost"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_on_one_session_exactly_one_writes() {
    let rig = Rig::start().await;
    let config = rig.config("twice", "");
    let a = rig.agent(&config, "a");
    let (status, body) = a.api().turn("written by a").await;
    assert_eq!(status, 200, "{body}");

    // A second agent on the same session takes it over.
    let b = rig.agent(&config, "b");
    let (status, body) = a.api().turn("a tries again").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "fenced", "{body}");
    let why = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("no longer owns the session") && why.contains("epoch 2"),
        "{why}"
    );
    // It stays stopped and says so.
    let (status, body) = a.api().turn("and again").await;
    assert_eq!(status, 409, "{body}");
    let ready = reqwest::get(format!("{}/readyz", a.url))
        .await
        .expect("readyz");
    assert_eq!(ready.status().as_u16(), 503);
    assert!(
        ready
            .text()
            .await
            .unwrap_or_default()
            .contains("took it over")
    );

    let (status, body) = b.api().turn("written by b").await;
    assert_eq!(status, 200, "{body}");
    let req = sim_saw(&rig.sim, "written by b").expect("request");
    assert!(
        req.contains("written by a"),
        "b continued a's acknowledged history"
    );
    assert!(
        !req.contains("a tries again"),
        "a's refused write is not in b's history"
    );

    // A third agent rebuilds exactly b's view.
    drop(b);
    drop(a);
    let c = rig.agent(&config, "c");
    let session = c.api().session().await;
    assert_eq!(session["stats"]["turns"], 2, "{session}");
    rig.sim.reset();
    let (status, _) = c.api().turn("third").await;
    assert_eq!(status, 200);
    let req = sim_saw(&rig.sim, "third").expect("request");
    assert!(req.contains("written by a") && req.contains("written by b"));
    assert!(!req.contains("a tries again") && !req.contains("and again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_applies_on_the_next_turn_without_a_restart() {
    let rig = Rig::start().await;
    let config = rig.config("reload", "");
    let agent = rig.agent(&config, "a");
    let api = agent.api();
    let big = |t: &str| format!("{t}: {}", "lorem ipsum dolor sit amet ".repeat(1_000));
    for t in ["one", "two"] {
        let (status, body) = api.turn(&big(t)).await;
        assert_eq!(status, 200, "{body}");
    }
    let before = api.session().await;
    assert_eq!(before["stats"]["compactions"], 0, "{before}");

    // 200k tokens × 0.05 × 4 chars = 40 KB: below the ~55 KB history.
    let yaml = config_yaml(
        "reload",
        &format!("{}/v1", rig.sim.url()),
        200_000,
        "compaction:\n  budgetRatio: 0.05\n",
    );
    std::fs::write(&config, yaml).expect("rewrite config");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = api.turn(&big("three")).await;
        assert_eq!(status, 200, "{body}");
        let notices = body["cairn"]["notices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if notices.iter().any(|n| n["kind"] == "compaction") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new policy never applied: {body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after = api.session().await;
    assert_ne!(after["policyHash"], before["policyHash"]);
    assert_eq!(after["policy"]["budgetRatio"], 0.05, "{after}");
    assert!(after["stats"]["compactions"].as_u64().unwrap_or(0) >= 1);
    assert!(agent.log().contains("config changed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_cleanly_and_a_restart_continues() {
    let rig = Rig::start().await;
    let config = rig.config("term", "");
    let mut agent = rig.agent(&config, "a");
    rig.sim.push_reply(ScriptedReply::text("noted"));
    let (status, body) = agent.api().turn("before the restart").await;
    assert_eq!(status, 200, "{body}");
    let exit = agent.terminate();
    assert!(exit.success(), "{exit}: {}", agent.log());
    let logs: Vec<Value> = agent
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(!logs.is_empty(), "logs are JSON");
    assert!(
        !agent.log().contains("before the restart"),
        "no message bodies in logs"
    );

    let again = rig.agent(&config, "b");
    let session = again.api().session().await;
    assert_eq!(session["stats"]["turns"], 1);
}
