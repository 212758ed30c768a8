//! The real `cairn-agent serve --session NS/NAME` against a real Kubernetes API server: a
//! recovery after a 413 and a manual compaction each leave an Event about the AgentSession
//! (what `kubectl describe asess` shows).
//!
//! `cargo test -p cairn-agent --test cluster events::`

use std::process::Command;
use std::time::{Duration, Instant};

use cairn_crds::{AgentSession, AgentSessionSpec};
use cairn_sim::{Fault, ScriptedReply, Sim};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::Api as KubeApi;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::serve_lease::{client, kubeconfig, spawn_serve};
use crate::support::agent::*;

fn summary() -> String {
    let mut s = String::new();
    for (n, sec) in cairn_agent::compact::summarize::SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe build of module_7 fails with E0308.\n",
            n + 1
        ));
    }
    while s.len() < 2_500 {
        s.push_str("Details: the failing build step is module_7.\n");
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_and_a_compaction_each_leave_an_event_on_the_session() {
    let path = kubeconfig();
    let client = client(&path).await;
    let ns = format!("cairn-events-test-{:08x}", fastrand::u32(..));
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns");
    KubeApi::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    let sim = Sim::start().await.expect("sim");
    let spec: AgentSessionSpec = serde_yaml::from_str(&format!(
        "provider: {{kind: openai-compatible, model: {MODEL}, baseUrl: {}/v1}}\ncontextWindow: 200000\ncompaction: {{minKeepRecent: 2}}\n",
        sim.url()
    ))
    .expect("spec");
    let created = KubeApi::<AgentSession>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &AgentSession::new("s1", spec))
        .await
        .expect("create AgentSession");
    let uid = created.metadata.uid.clone().expect("uid");

    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("agent.log");
    let mut env = storage_env(dir.path(), None);
    // status.session goes out each second, so the test sees the compaction's score there.
    env.push((
        cairn_agent::cluster::STATUS_INTERVAL_ENV.to_owned(),
        "1".to_owned(),
    ));
    let mut child = spawn_serve(&format!("{ns}/s1"), &path, env, &log);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = loop {
        let text = read_log();
        if text.contains("cairn-agent listening on")
            && let Some(addr) = text
                .lines()
                .find_map(|l| l.strip_prefix("cairn-agent starting on "))
        {
            break format!("http://{}", addr.trim());
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("cairn-agent exited with {status}: {text}");
        }
        assert!(
            Instant::now() < deadline,
            "cairn-agent did not open: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let api = Api::new(url);

    for i in 0..6 {
        sim.push_reply(ScriptedReply::text(format!(
            "answer {i}: {}",
            "the build of module_7 fails. ".repeat(40)
        )));
        let (status, body) = api
            .turn(&format!(
                "question {i}: why does module_7 fail? {}",
                "x".repeat(800)
            ))
            .await;
        assert_eq!(status, 200, "turn {i}: {body}");
    }
    // A person compacts the session.
    sim.push_reply(ScriptedReply::text(summary()));
    let (status, body) = api.post("/v1/session/compact", json!({})).await;
    assert_eq!(status, 200, "compaction: {body}");
    let answered = body["quality"]["score"].as_f64();
    // The compaction is scored on what it replaced: the six questions were at stake, and
    // the score says how many the compacted history still shows. The same figures are in
    // the session's counters, the context inspector and the metrics.
    let (_, session) = api.get("/v1/session").await;
    let session: serde_json::Value = serde_json::from_slice(&session).expect("session JSON");
    let quality = session
        .pointer("/stats/compactionQuality")
        .cloned()
        .unwrap_or_default();
    assert_eq!(quality["scored"], 1, "{session}");
    let last = &quality["last"];
    let requests = &last["requests"];
    assert!(requests["atStake"].as_u64() >= Some(1), "{last}");
    assert!(
        requests["inSight"].as_u64() <= requests["atStake"].as_u64(),
        "{last}"
    );
    let score = last["score"].as_f64().expect("a score");
    assert!((0.0..=1.0).contains(&score), "{last}");
    assert_eq!(quality["rolling"].as_f64(), Some(score), "{quality}");
    assert_eq!(
        answered,
        Some(score),
        "the compaction's answer carries its score: {body}"
    );
    let (_, context) = api.get("/v1/session/context").await;
    let context: serde_json::Value = serde_json::from_slice(&context).expect("context JSON");
    assert_eq!(context["compactionQuality"], quality, "{context}");
    let (_, metrics) = api.get("/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("cairn_agent_compaction_score_count 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_agent_compaction_artifacts_total{category=\"requests\""),
        "{metrics}"
    );

    for i in 6..9 {
        sim.push_reply(ScriptedReply::text(format!(
            "answer {i}: {}",
            "it is E0308. ".repeat(60)
        )));
        let (status, body) = api
            .turn(&format!("question {i}: {}", "y".repeat(800)))
            .await;
        assert_eq!(status, 200, "turn {i}: {body}");
    }
    // The network path rejects the next request as too large: recovery shrinks and retries.
    sim.push_fault(Fault::Status {
        status: 413,
        retry_after: None,
    });
    sim.push_reply(ScriptedReply::text("answered after recovery"));
    let (status, body) = api.turn("one more question about module_7").await;
    assert_eq!(status, 200, "{body}: {}", read_log());
    let events = KubeApi::<Event>::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (compacted, recovered) = loop {
        let list = events.list(&ListParams::default()).await.expect("list");
        let about_session: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.name.as_deref() == Some("s1")
                        && r.kind.as_deref() == Some("AgentSession")
                        && r.uid.as_deref() == Some(&uid)
                })
            })
            .collect();
        let find = |reason: &str| {
            about_session
                .iter()
                .find(|e| e.reason.as_deref() == Some(reason))
                .cloned()
        };
        if let (Some(c), Some(r)) = (find("Compacted"), find("Recovered")) {
            break (c, r);
        }
        assert!(
            Instant::now() < deadline,
            "no Compacted and Recovered Events about the session: {about_session:#?}\n{}",
            read_log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(compacted.type_.as_deref(), Some("Normal"));
    assert_eq!(
        compacted.reporting_controller.as_deref(),
        Some("cairn-agent")
    );
    let note = compacted.note.unwrap_or_default();
    assert!(
        note.starts_with("manual compaction, level ") && note.contains(" bytes"),
        "{note}"
    );
    assert!(
        note.contains(&format!("; score {score:.2}, in sight: ")) && note.contains(" requests "),
        "{note}"
    );
    assert_eq!(recovered.type_.as_deref(), Some("Normal"));
    let note = recovered.note.unwrap_or_default();
    assert!(
        note.starts_with("after payload too large (413): attempt 1 shrank the history"),
        "{note}"
    );

    // status.session carries the score too (the recovery may have scored once more).
    let sessions = KubeApi::<AgentSession>::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = sessions.get("s1").await.expect("get AgentSession");
        let scored = s
            .status
            .as_ref()
            .and_then(|st| st.session.as_ref())
            .and_then(|st| st.compaction_quality.as_ref())
            .map_or(0, |q| q.scored);
        if scored >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no compactionQuality in status.session: {:?}",
            s.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let exit = child.wait().expect("wait");
    assert!(exit.success(), "{exit}: {}", read_log());
    let _ = KubeApi::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
}
