//! Idle suspend and wake-up (`spec.idle.suspendAfter`, the `cairn.dev/wake-requested-at`
//! annotation), and the caches that keep an unchanged reconcile silent, against the local
//! control plane of `tests/harness` (kwok nodes mark pods Running), or the cluster `KUBECONFIG`
//! points at:
//!
//! ```text
//! cargo test -p cairn-operator --test idle
//! ```
//!
//! The operator runs in-process, scoped to the test's namespace, with a client that counts its
//! requests. The kwok pods run no agent: those sessions sleep by the rule for agents that send
//! no idle report (`suspendAfter` plus a status interval); the test writes the report itself
//! where it checks the agent's part.

mod support;
use support::condition;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_crds::{AgentSession, Phase};
use cairn_operator::controller::Context;
use cairn_operator::metrics::Metrics;
use cairn_operator::purge::S3Purger;
use cairn_operator::watches;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(120);
const WRITES: [http::Method; 4] = [
    http::Method::POST,
    http::Method::PUT,
    http::Method::PATCH,
    http::Method::DELETE,
];

struct Env {
    client: Client,
    ns: String,
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
}

async fn config() -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(cairn_tests::harness::kubeconfig())
        .expect("kubeconfig reads");
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig is usable")
}

impl Env {
    async fn new(name: &str) -> Self {
        let config = config().await;
        let client = Client::try_from(config.clone()).expect("client");
        cairn_operator::crds::apply_crds(client.clone())
            .await
            .expect("CRDs apply");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let ns = format!(
            "cairn-{name}-{:06x}",
            (nanos ^ std::process::id()) & 0xff_ffff
        );
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
            )
            .await
            .expect("create namespace");
        let sessions: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
        support::eventually(WAIT, "the AgentSession API", || async {
            sessions.list(&ListParams::default()).await.ok()
        })
        .await;
        let metrics = Arc::new(Metrics::default());
        let operator_client =
            cairn_operator::client::counting_client(config, metrics.clone()).expect("client");
        let ctx = Arc::new(Context::new(
            operator_client,
            cairn_operator::Defaults {
                image: "cairn-agent:test".into(),
                ..Default::default()
            },
            metrics.clone(),
            Arc::new(S3Purger),
            Duration::from_secs(3600),
        ));
        let (stop, rx) = watch::channel(false);
        let shutdown = async move {
            let mut rx = rx;
            let _ = rx.wait_for(|stop| *stop).await;
        };
        tokio::spawn(watches::run(ctx, Some(ns.clone()), 4, shutdown));
        Self {
            client,
            ns,
            metrics,
            stop,
        }
    }

    fn sessions(&self) -> Api<AgentSession> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create(&self, name: &str, spec: serde_json::Value) {
        let session: AgentSession = serde_json::from_value(json!({
            "apiVersion": "cairn.dev/v1beta1",
            "kind": "AgentSession",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("session fixture");
        self.sessions()
            .create(&PostParams::default(), &session)
            .await
            .expect("create session");
    }

    async fn patch(&self, name: &str, patch: serde_json::Value) {
        self.sessions()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch session");
    }

    async fn wait(
        &self,
        name: &str,
        what: &str,
        test: impl Fn(&AgentSession) -> bool,
    ) -> AgentSession {
        let api = self.sessions();
        support::eventually(WAIT, &format!("{name}: {what}"), || async {
            let s = api.get(name).await.ok()?;
            test(&s).then_some(s)
        })
        .await
    }

    /// Whether the session's pod is gone or on its way out.
    async fn pod_stopped(&self, session: &str) -> bool {
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .get_opt(&format!("cairn-{session}-0"))
            .await
            .ok()
            .is_some_and(|p| p.is_none_or(|p| p.metadata.deletion_timestamp.is_some()))
    }

    async fn event_reasons(&self, session: &str) -> Vec<String> {
        Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter(|e| e.involved_object.name.as_deref() == Some(session))
                    .filter_map(|e| e.reason)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn writes(&self) -> u64 {
        WRITES.iter().map(|m| self.metrics.api_requests(m)).sum()
    }

    async fn teardown(self) {
        let _ = self.stop.send(true);
        let sessions = self.sessions();
        if let Ok(list) = sessions.list(&ListParams::default()).await {
            for s in list {
                let _ = sessions
                    .patch(
                        &kube::ResourceExt::name_any(&s),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }
}

fn phase(s: &AgentSession) -> Option<Phase> {
    s.status.as_ref().and_then(|s| s.phase)
}

fn spec(suspend_after: &str) -> serde_json::Value {
    json!({
        "provider": {"kind": "openai", "model": "gpt-5"},
        "idle": {"suspendAfter": suspend_after},
    })
}

fn ready_since(s: &AgentSession) -> Option<Timestamp> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.0)
}

fn idle_since(s: &AgentSession) -> Option<Timestamp> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Idle" && c.status == "True")
        .map(|c| c.last_transition_time.0)
}

fn seconds_between(from: Timestamp, to: Timestamp) -> i64 {
    to.as_second() - from.as_second()
}

#[tokio::test]
async fn an_idle_session_sleeps_on_time_and_a_wake_request_brings_it_back() {
    let env = Env::new("idle").await;
    env.create("fast", spec("5s")).await;
    env.create("slow", spec("30s")).await;

    let running = env
        .wait("fast", "Running", |s| phase(s) == Some(Phase::Running))
        .await;
    let ready = ready_since(&running).expect("Ready since");
    // The 30 s session's start, read now: it sleeps before the 5 s one's cycle is over.
    let slow_running = env
        .wait("slow", "Running", |s| ready_since(s).is_some())
        .await;
    let slow_ready = ready_since(&slow_running).expect("Ready since");
    let asleep = env
        .wait("fast", "idle-suspended", |s| {
            phase(s) == Some(Phase::Suspended) && idle_since(s).is_some()
        })
        .await;
    // suspendAfter plus one status interval (the agent's throttled report of activity).
    let lag = cairn_crds::session::DEFAULT_STATUS_INTERVAL_SECONDS as i64;
    let slept = seconds_between(ready, idle_since(&asleep).expect("Idle since"));
    assert!(
        (5 + lag..=9 + lag).contains(&slept),
        "suspended {slept}s after the pod became ready, not about 5s + {lag}s"
    );
    assert_eq!(
        condition(&asleep, "Idle"),
        Some(("True".into(), "IdleTimeout".into()))
    );
    assert!(!asleep.spec.suspend, "the operator never sets spec.suspend");
    assert!(env.pod_stopped("fast").await, "the pod is stopped");
    support::eventually(WAIT, "the IdleTimeout Event", || async {
        env.event_reasons("fast")
            .await
            .iter()
            .any(|r| r == "IdleTimeout")
            .then_some(())
    })
    .await;

    // An old wake-up request does not wake it; a newer one does.
    env.patch(
        "fast",
        json!({"metadata": {"annotations": {"cairn.dev/wake-requested-at": "2020-01-01T00:00:00Z"}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        phase(&env.sessions().get("fast").await.expect("get")),
        Some(Phase::Suspended)
    );
    let requested = Timestamp::now().to_string();
    env.patch(
        "fast",
        json!({"metadata": {"annotations": {"cairn.dev/wake-requested-at": requested}}}),
    )
    .await;
    let woken = env
        .wait("fast", "woken and Running", |s| {
            phase(s) == Some(Phase::Running)
                && condition(s, "Idle").is_some_and(|(st, r)| st == "False" && r == "Woken")
        })
        .await;
    let message = woken
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Idle"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains(&requested), "{message}");
    support::eventually(WAIT, "the Woken Event", || async {
        env.event_reasons("fast")
            .await
            .iter()
            .any(|r| r == "Woken")
            .then_some(())
    })
    .await;
    // Idle again, it sleeps again.
    env.wait("fast", "idle-suspended again", |s| {
        phase(s) == Some(Phase::Suspended) && idle_since(s).is_some()
    })
    .await;

    // The 30 s session: suspended 30 s and a status interval (and a few) after its pod
    // became ready.
    let ready = slow_ready;
    let asleep = env
        .wait("slow", "idle-suspended", |s| {
            phase(s) == Some(Phase::Suspended) && idle_since(s).is_some()
        })
        .await;
    let slept = seconds_between(ready, idle_since(&asleep).expect("Idle since"));
    assert!(
        (30 + lag..=34 + lag).contains(&slept),
        "suspended {slept}s after the pod became ready, not about 30s + {lag}s"
    );
    env.teardown().await;
}

#[tokio::test]
async fn the_agent_idle_report_suspends_without_the_status_interval() {
    let env = Env::new("idle-report").await;
    env.create("chat", spec("10s")).await;
    env.wait("chat", "Running", |s| phase(s) == Some(Phase::Running))
        .await;
    // What the agent writes once it saw no client work for suspendAfter (here written
    // early, as a clock ahead of the operator's would): its last activity, idle since then.
    let since = Timestamp::now();
    env.sessions()
        .patch_status(
            "chat",
            &PatchParams::apply("cairn-agent").force(),
            &Patch::Apply(json!({
                "apiVersion": "cairn.dev/v1beta1",
                "kind": "AgentSession",
                "status": {"session": {
                    "turns": 1,
                    "lastActivity": since.to_string(),
                    "idleSince": since.to_string(),
                }},
            })),
        )
        .await
        .expect("agent status write");
    let asleep = env
        .wait("chat", "idle-suspended", |s| {
            phase(s) == Some(Phase::Suspended) && idle_since(s).is_some()
        })
        .await;
    // suspendAfter past the report, not a status interval later.
    let slept = seconds_between(since, idle_since(&asleep).expect("Idle since"));
    assert!(
        (9..=14).contains(&slept),
        "suspended {slept}s after the reported idle time, not about 10s"
    );
    let message = asleep
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Idle"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("the agent reported no client activity since"),
        "{message}"
    );
    assert!(env.pod_stopped("chat").await, "the pod is stopped");
    env.teardown().await;
}

#[tokio::test]
async fn manual_suspend_is_never_overridden_by_a_wake_request() {
    let env = Env::new("idle-manual").await;
    env.create("chat", spec("5s")).await;
    env.wait("chat", "idle-suspended", |s| {
        phase(s) == Some(Phase::Suspended) && idle_since(s).is_some()
    })
    .await;
    env.patch("chat", json!({"spec": {"suspend": true}})).await;
    env.wait("chat", "manually suspended", |s| {
        condition(s, "Idle").is_some_and(|(_, r)| r == "ManuallySuspended")
    })
    .await;
    env.patch(
        "chat",
        json!({"metadata": {"annotations": {"cairn.dev/wake-requested-at": Timestamp::now().to_string()}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = env.sessions().get("chat").await.expect("get");
    assert_eq!(phase(&s), Some(Phase::Suspended));
    assert!(env.pod_stopped("chat").await);
    assert!(s.spec.suspend);

    // Resumed by hand, it runs (and is not suspended again at once).
    env.patch("chat", json!({"spec": {"suspend": false}})).await;
    env.wait("chat", "Running", |s| phase(s) == Some(Phase::Running))
        .await;
    env.teardown().await;
}

#[tokio::test]
async fn an_unchanged_session_costs_the_operator_no_writes() {
    let env = Env::new("quiet").await;
    env.create(
        "chat",
        json!({"provider": {"kind": "openai", "model": "gpt-5"}}),
    )
    .await;
    env.wait("chat", "Running", |s| phase(s) == Some(Phase::Running))
        .await;
    // The agent's first report is news (the PolicySupported condition appears); its later
    // writes are watch events and reconciles, none of which may send anything.
    let mut before = 0;
    let mut started = Instant::now();
    for turns in 0..=3u64 {
        if turns == 1 {
            before = env.writes();
            started = Instant::now();
        }
        env.sessions()
            .patch_status(
                "chat",
                &PatchParams::apply("cairn-agent").force(),
                &Patch::Apply(json!({
                    "apiVersion": "cairn.dev/v1beta1",
                    "kind": "AgentSession",
                    "status": {"session": {"turns": turns}},
                })),
            )
            .await
            .expect("agent status write");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let after = env.writes();
    assert_eq!(
        after - before,
        0,
        "the operator wrote {} times in {:?} for a session that did not change",
        after - before,
        started.elapsed()
    );
    env.teardown().await;
}
