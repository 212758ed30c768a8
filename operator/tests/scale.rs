//! Scale test: many AgentSessions created at once converge to Running within a ceiling; then
//! an idle minute must produce no writes from the operator (no hot loop), nor may a fleet of
//! active agents writing their status; and the API requests per session at creation stay
//! under a ceiling.
//!
//! Runs the real `cairn-operator` binary (so its peak RSS is its own) against the cluster that
//! `KUBECONFIG` points at, else the harness's own control plane (kwok: pods are marked
//! Running and nothing runs them), scoped to a fresh namespace. In `make test` it is the scale
//! tier: 300 sessions. The large run is a manual command on a release build:
//!
//! ```text
//! cargo run -p cairn-tests --bin cairn-harness -- up --env-file /tmp/cairn.env --crds --no-pods &
//! set -a; . /tmp/cairn.env; set +a
//! CAIRN_SCALE_SESSIONS=10000 cargo test -p cairn-operator --release --test scale -- --nocapture
//! ```
//!
//! `--no-pods`: as in the harness's own control plane; with the harness's pod runtime every
//! pod would start a real agent, whose first status report the operator answers (a
//! PolicySupported condition appears), which is not what this test measures.
//!
//! `CAIRN_SCALE_SESSIONS` (default 300) sets the number of sessions, `CAIRN_SCALE_IDLE_SECS`
//! (default 60) the idle window. Then `CAIRN_SCALE_ACTIVE` (default 1000) simulated agents
//! write their `status.session` at the agent's cadence (`CAIRN_SCALE_STATUS_INTERVAL_SECS`,
//! default the agent's 30 s) for `CAIRN_SCALE_ACTIVE_SECS` (default 60) after their first
//! round and the operator's answers to it (PolicySupported on every session), and the status
//! writes per second (theirs and the operator's) are measured. Results are printed as one
//! line of `key=value` pairs.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cairn_crds::{AgentSession, Phase};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn scrape(port: u16) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return out;
    };
    let request = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return out;
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body).await;
    for line in body.lines().filter(|l| l.starts_with("cairn_operator_")) {
        if let Some((key, value)) = line.rsplit_once(' ')
            && let Ok(v) = value.parse()
        {
            out.insert(key.to_string(), v);
        }
    }
    out
}

fn requests(metrics: &BTreeMap<String, f64>, method: &str) -> f64 {
    metrics
        .get(&format!(
            "cairn_operator_api_requests_total{{method=\"{method}\"}}"
        ))
        .copied()
        .unwrap_or(0.0)
}

fn writes(metrics: &BTreeMap<String, f64>) -> f64 {
    ["POST", "PUT", "PATCH", "DELETE"]
        .iter()
        .map(|m| requests(metrics, m))
        .sum()
}

/// The writes by method and resource between two scrapes (`cairn_operator_api_writes_total`),
/// those that moved, as `METHOD resource:count`.
fn writes_by_resource(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    per: f64,
) -> String {
    let prefix = "cairn_operator_api_writes_total{";
    after
        .iter()
        .filter_map(|(key, value)| {
            let labels = key.strip_prefix(prefix)?.strip_suffix('}')?;
            let delta = value - before.get(key).copied().unwrap_or(0.0);
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            (delta > 0.0)
                .then(|| format!("{}_{}:{}", label("method"), label("resource"), delta / per))
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Waits until `wanted` sessions are `done`, following one watch of the namespace's sessions
/// (a list, then each change once). Listing every session every few seconds instead would
/// cost the API server, on the same two cores, more than the fleet being measured: at 10,000
/// sessions each list is some 30 MB of JSON.
async fn watch_until(
    api: &Api<AgentSession>,
    wanted: u64,
    within: Duration,
    what: &str,
    done: impl Fn(&AgentSession) -> bool,
) {
    use kube::ResourceExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let stream = watcher(api.clone(), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut state: BTreeMap<String, bool> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let count = state.values().filter(|v| **v).count() as u64;
        if count >= wanted {
            return;
        }
        let event = match tokio::time::timeout_at(deadline, stream.try_next()).await {
            Ok(event) => event
                .expect("the watch of sessions")
                .expect("the watch goes on"),
            Err(_) => panic!("only {count}/{wanted} sessions {what} after {within:?}"),
        };
        match event {
            watcher::Event::Init => state.clear(),
            watcher::Event::InitApply(s) | watcher::Event::Apply(s) => {
                state.insert(s.name_any(), done(&s));
            }
            watcher::Event::Delete(s) => {
                state.remove(&s.name_any());
            }
            watcher::Event::InitDone => {}
        }
    }
}

/// Seconds each session may add to the time the fleet takes to converge: three times the
/// slowest run measured (300 sessions in 75 s, a debug build beside a cold `.ci/run`'s other
/// lanes; 13 s on a quiet machine, docs/benchmarks.md). The test proves convergence and
/// counts writes; how fast a quiet machine converges is the benchmark's to say.
const CONVERGE_SECS_PER_SESSION: f64 = 0.75;
/// API requests per session at creation, at most (reads and writes).
const REQUESTS_PER_SESSION: f64 = 12.0;
/// API writes per session at creation, at most: its ServiceAccount, Role, RoleBinding, token
/// Secret and Pod, and one status write; a little over 6 where a pod was not ready within
/// the first status's grace (two status writes). The fleet runs as production does: the
/// archive in a bucket, reached with the pods' own identity and kept when a session is
/// deleted (no finalizer). An archive purged on delete adds its finalizer, one without a
/// bucket its warning Event, scoped credentials their Secret (docs/benchmarks.md).
const WRITES_PER_SESSION: f64 = 6.2;

#[tokio::test]
async fn sessions_converge_and_the_operator_then_idles() {
    let sessions_wanted = env_or("CAIRN_SCALE_SESSIONS", 300);
    let idle = Duration::from_secs(env_or("CAIRN_SCALE_IDLE_SECS", 60));
    let kubeconfig = cairn_tests::harness::kubeconfig();
    let client = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig reads"),
            &Default::default(),
        )
        .await
        .expect("kubeconfig is usable"),
    )
    .expect("client");
    cairn_operator::crds::apply_crds(client.clone())
        .await
        .expect("CRDs");
    let ns = format!("cairn-scale-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns"),
        )
        .await
        .expect("namespace");

    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let operator = Operator(
        Command::new(env!("CARGO_BIN_EXE_cairn-operator"))
            .args([
                "--watch-namespaces",
                &ns,
                "--leader-election",
                "false",
                "--skip-crd-install",
                "--log-format",
                "text",
                "--metrics-listen",
                &format!("127.0.0.1:{port}"),
                "--archive-bucket",
                "cairn-scale",
                "--archive-ambient-credentials",
            ])
            .env("RUST_LOG", "warn")
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start cairn-operator"),
    );
    let pid = operator.0.id();

    let api: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
    // A freshly applied CRD is served a moment after it is stored: until then its paths are
    // a plain 404.
    let served = Instant::now() + Duration::from_secs(60);
    while let Err(e) = api.list(&ListParams::default().limit(1)).await {
        assert!(Instant::now() < served, "AgentSessions not served: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = Instant::now();
    futures::stream::iter(0..sessions_wanted)
        .map(|i| {
            let api = api.clone();
            async move {
                let session: AgentSession = serde_json::from_value(json!({
                    "apiVersion": "cairn.dev/v1beta1",
                    "kind": "AgentSession",
                    "metadata": {"name": format!("s{i:05}")},
                    "spec": {"provider": {"kind": "openai", "model": "gpt-5"}},
                }))
                .expect("fixture");
                api.create(&PostParams::default(), &session)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .expect("create sessions");
    let created = started.elapsed();

    watch_until(
        &api,
        sessions_wanted,
        Duration::from_secs(1800),
        "Running",
        |s| s.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running),
    )
    .await;
    let converged = started.elapsed();
    let at_convergence = scrape(port).await;
    let rss_converged = peak_rss_kib(pid);

    tokio::time::sleep(idle).await;
    let after_idle = scrape(port).await;
    let idle_writes = writes(&after_idle) - writes(&at_convergence);
    let idle_reads = requests(&after_idle, "GET") - requests(&at_convergence, "GET");
    let idle_by_method: Vec<String> = ["POST", "PUT", "PATCH", "DELETE"]
        .iter()
        .map(|m| {
            format!(
                "{m}:{}",
                requests(&after_idle, m) - requests(&at_convergence, m)
            )
        })
        .collect();
    let reconciles = |m: &BTreeMap<String, f64>| {
        m.get("cairn_operator_reconciles_total{result=\"ok\"}")
            .copied()
            .unwrap_or(0.0)
    };
    let idle_reconciles = reconciles(&after_idle) - reconciles(&at_convergence);
    let idle_by_resource = writes_by_resource(&at_convergence, &after_idle, 1.0);
    let created_by_resource =
        writes_by_resource(&BTreeMap::new(), &at_convergence, sessions_wanted as f64);

    // A fleet of active agents: each writes its status.session at the agent's real cadence
    // (once per status interval while in use), spread over the interval. The first round
    // is the agents' first report (news to the operator: PolicySupported appears); the
    // window after it measures the steady state.
    let active = env_or("CAIRN_SCALE_ACTIVE", 1000).min(sessions_wanted);
    let window = Duration::from_secs(env_or("CAIRN_SCALE_ACTIVE_SECS", 60));
    let interval = Duration::from_secs(env_or(
        "CAIRN_SCALE_STATUS_INTERVAL_SECS",
        cairn_crds::session::DEFAULT_STATUS_INTERVAL_SECONDS,
    ));
    let agent_writes = Arc::new(AtomicU64::new(0));
    let fleet_started = Instant::now();
    let agents: Vec<_> = (0..active)
        .map(|i| {
            let api = api.clone();
            let count = agent_writes.clone();
            let offset = interval.mul_f64(i as f64 / active.max(1) as f64);
            tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                let mut turns = 0u64;
                loop {
                    turns += 1;
                    let patch = json!({
                        "apiVersion": "cairn.dev/v1beta1",
                        "kind": "AgentSession",
                        "status": {"session": {
                            "turns": turns,
                            "lastActivity": k8s_openapi::jiff::Timestamp::now().to_string(),
                        }},
                    });
                    if api
                        .patch_status(
                            &format!("s{i:05}"),
                            &PatchParams::apply("cairn-agent").force(),
                            &Patch::Apply(&patch),
                        )
                        .await
                        .is_ok()
                    {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(interval).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(interval.saturating_sub(fleet_started.elapsed())).await;
    // The operator's answers to the first round (each adds PolicySupported) are done before
    // the steady state is measured.
    watch_until(
        &api,
        active,
        Duration::from_secs(600),
        "showing PolicySupported",
        |s| {
            s.status
                .as_ref()
                .is_some_and(|st| st.conditions.iter().any(|c| c.type_ == "PolicySupported"))
        },
    )
    .await;
    let window_start = scrape(port).await;
    let agent_start = agent_writes.load(Ordering::Relaxed);
    let measured = Instant::now();
    tokio::time::sleep(window).await;
    let window_end = scrape(port).await;
    let agent_in_window = agent_writes.load(Ordering::Relaxed) - agent_start;
    let measured = measured.elapsed().as_secs_f64();
    for agent in &agents {
        agent.abort();
    }
    let operator_active_writes = writes(&window_end) - writes(&window_start);
    let status_writes_per_sec = (agent_in_window as f64 + operator_active_writes) / measured;
    let rss_peak = peak_rss_kib(pid);

    let total: f64 = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        .iter()
        .map(|m| requests(&at_convergence, m))
        .sum();
    let n = sessions_wanted as f64;
    println!(
        "sessions={sessions_wanted} create_secs={:.1} converge_secs={:.1} peak_rss_mib={:.1} \
         api_requests={total} per_session={:.2} writes_per_session={:.2} \
         get_per_session={:.2} patch_per_session={:.2} post_per_session={:.2} reconciles={} idle_secs={} idle_writes={idle_writes} \
         idle_reads={idle_reads} idle_writes_by_method={} idle_reconciles={idle_reconciles} \
         idle_writes_by_resource={idle_by_resource} \
         writes_per_session_by_resource={created_by_resource} \
         active_agents={active} status_interval_secs={} \
         active_window_secs={measured:.1} agent_status_writes={agent_in_window} \
         operator_writes_while_active={operator_active_writes} \
         status_writes_per_sec={status_writes_per_sec:.1} peak_rss_mib_after_fleet={:.1}",
        created.as_secs_f64(),
        converged.as_secs_f64(),
        rss_converged as f64 / 1024.0,
        total / n,
        writes(&at_convergence) / n,
        requests(&at_convergence, "GET") / n,
        requests(&at_convergence, "PATCH") / n,
        requests(&at_convergence, "POST") / n,
        at_convergence
            .get("cairn_operator_reconciles_total{result=\"ok\"}")
            .copied()
            .unwrap_or(0.0),
        idle.as_secs(),
        idle_by_method.join(","),
        interval.as_secs(),
        rss_peak as f64 / 1024.0,
    );
    // The operator still runs its finalizers while the namespace goes.
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    let gone = Instant::now() + Duration::from_secs(600);
    while Instant::now() < gone
        && api
            .list(&ListParams::default().limit(1))
            .await
            .is_ok_and(|l| !l.items.is_empty())
    {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    drop(operator);
    assert_eq!(idle_writes, 0.0, "the operator wrote while nothing changed");
    assert!(
        writes(&at_convergence) / n <= WRITES_PER_SESSION,
        "{:.2} API writes per session at creation (at most {WRITES_PER_SESSION}): \
         {created_by_resource}",
        writes(&at_convergence) / n
    );
    assert!(
        total / n <= REQUESTS_PER_SESSION,
        "{:.2} API requests per session at creation (at most {REQUESTS_PER_SESSION})",
        total / n
    );
    let ceiling = CONVERGE_SECS_PER_SESSION * n;
    assert!(
        converged.as_secs_f64() <= ceiling,
        "{sessions_wanted} sessions converged in {:.1} s (at most {ceiling:.0} s)",
        converged.as_secs_f64()
    );
    assert_eq!(
        operator_active_writes, 0.0,
        "the operator wrote for agents' status writes that changed nothing of its own"
    );
}
