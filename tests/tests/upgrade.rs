//! `helm upgrade` with live sessions, then `helm rollback`, on the real node.
//!
//! The previous release ([`PREVIOUS`]: its chart, and images built from its tree by
//! `tests/harness/build-release.sh`) is installed; three sessions are created through it
//! (`talker` mid-conversation, `sleeper` suspended, `keeper` with an archived original); the
//! chart and images of this tree replace it while `talker` streams a turn; then the release is
//! rolled back. Across each step: no acknowledged turn is missing from the history the model
//! is sent next, each agent pod is replaced at most once, recall of the archived original is
//! byte-identical, the suspended session resumes with its history, and `kubectl get asess`
//! answers throughout. The CRDs gain `v1beta1` as their storage version on the upgrade, and
//! the objects the previous release created as `v1alpha1` read back as `v1beta1`.
//!
//! Its own control plane and node (not `real_node`'s): the CRDs are cluster-wide, and this
//! test installs and replaces them.

#[path = "real_node/support.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_tests::harness::node::RealNode;
use cairn_tests::harness::{
    ControlPlane, S3Server, built_paths, built_paths_with, helm, run_dir, shared_cluster,
};
use support::{
    agent_session, build_log, ccr_key, client_pod, exchange, json_of, kubectl, pod_ready,
    session_addr, session_secrets, skip, wait_for,
};

/// The release this test upgrades from: the tree before sessions were isolated from each
/// other, the gateway lost its Secret reads and the CRDs gained `v1beta1`. Its one home is
/// `tests/harness/previous-release`, which `make test` reads to build it before the lanes.
const PREVIOUS: &str = include_str!("../harness/previous-release").trim_ascii();
const NS: &str = "upgrade";
const OPERATOR_NS: &str = "cairn-system";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const SESSIONS: [&str; 3] = ["talker", "sleeper", "keeper"];
const RUNNING: [&str; 2] = ["talker", "keeper"];

/// One `helm` command against the test's control plane, its state under `dir`.
fn helm_run(cp: &ControlPlane, dir: &Path, args: &[String]) -> Output {
    Command::new(helm().expect("helm installs"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .args(args)
        .output()
        .expect("helm runs")
}

fn assert_helm(cp: &ControlPlane, what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cp.kubectl_ok(&["describe", "pods", "-n", OPERATOR_NS])
            .unwrap_or_default()
    );
}

/// The values of a release whose images carry `tag`: the operator on the real node,
/// watching [`NS`], its archive in moto at `s3`.
fn values(tag: &str, s3: SocketAddr) -> Vec<String> {
    [
        "nodeSelector.kubernetes\\.io/hostname=real-node-0".to_string(),
        format!("watchNamespaces={{{NS}}}"),
        format!("archive.endpoint=http://{s3}"),
        "archive.bucket=cairn".to_string(),
        "archive.credentialsSecret=cairn-s3".to_string(),
        "logFormat=text".to_string(),
        format!("image.tag={tag}"),
        format!("agent.image=ghcr.io/cairn-dev/cairn-agent:{tag}"),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

/// The session's API token, from the Secret the operator made for it.
fn token_of(cp: &ControlPlane, session: &str) -> String {
    use base64::Engine;
    let raw = kubectl(
        cp,
        &[
            "get",
            "secret",
            &format!("cairn-{session}-api-token"),
            "-n",
            NS,
            "-o",
            "jsonpath={.data.token}",
        ],
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(raw.trim())
        .expect("base64 token");
    String::from_utf8(bytes).expect("UTF-8 token")
}

/// A turn of `session` from the client pod; (status, body).
fn turn(cp: &ControlPlane, session: &str, input: &str, stream: bool) -> (u16, String) {
    let body = serde_json::json!({"model": "sim", "input": input, "stream": stream});
    exchange(
        cp,
        NS,
        &session_addr(cp, NS, session),
        ("POST", "/v1/responses"),
        &token_of(cp, session),
        Some(&body),
    )
}

/// What a watcher saw while a release changed: every pod UID per session pod, and the
/// `kubectl get asess` calls that failed.
#[derive(Default)]
struct Seen {
    uids: BTreeMap<String, BTreeSet<String>>,
    get_failures: Vec<String>,
    polls: usize,
}

/// Polls the namespace's pods and `kubectl get asess` until `stop`.
fn watch(cp: &'static ControlPlane, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut seen = Seen::default();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(pods) = cp.kubectl_ok(&[
                "get",
                "pods",
                "-n",
                NS,
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.metadata.uid}{\"\\n\"}{end}",
            ]) {
                for (name, uid) in pods.lines().filter_map(|l| l.split_once('=')) {
                    if name.starts_with("cairn-") {
                        seen.uids
                            .entry(name.to_string())
                            .or_default()
                            .insert(uid.to_string());
                    }
                }
            }
            // A discovery cache of its own per call: kubectl keeps the API versions it
            // discovered on disk, and after the rollback its cache still names v1beta1 (a
            // user refreshes it with `kubectl api-resources`); the server is what is held
            // to serving `asess` throughout.
            let cache = std::env::temp_dir().join(format!(
                "upgrade-kubectl-cache-{}-{}",
                std::process::id(),
                seen.polls
            ));
            let cache_arg = format!("--cache-dir={}", cache.display());
            let mut get = cp.kubectl(&["get", "asess", "-n", NS, &cache_arg]);
            let _ = std::fs::remove_dir_all(&cache);
            // The one race no client avoids: the rollback's CRD stops serving v1beta1 between
            // this call's discovery and its list. Discovering again answers; two failures in
            // a row are a real gap.
            let version_went = |o: &Output| {
                !o.status.success()
                    && String::from_utf8_lossy(&o.stderr)
                        .contains("the server could not find the requested resource")
            };
            if get.as_ref().is_ok_and(version_went) {
                get = cp.kubectl(&["get", "asess", "-n", NS, &cache_arg]);
                let _ = std::fs::remove_dir_all(&cache);
            }
            match get {
                Ok(o) if o.status.success() => {}
                Ok(o) => seen
                    .get_failures
                    .push(String::from_utf8_lossy(&o.stderr).into_owned()),
                Err(e) => seen.get_failures.push(e.to_string()),
            }
            seen.polls += 1;
            std::thread::sleep(Duration::from_millis(500));
        }
        seen
    })
}

/// The image of the running session pod.
fn pod_image(cp: &ControlPlane, session: &str) -> String {
    cp.kubectl_ok(&[
        "get",
        "pod",
        &format!("cairn-{session}-0"),
        "-n",
        NS,
        "-o",
        "jsonpath={.spec.containers[0].image}",
    ])
    .unwrap_or_default()
}

/// Waits until every running session's pod runs `tag`'s agent image and is Ready.
fn wait_for_agents(cp: &ControlPlane, tag: &str) {
    let image = format!("ghcr.io/cairn-dev/cairn-agent:{tag}");
    let deadline = Instant::now() + Duration::from_secs(240);
    for session in RUNNING {
        let pod = format!("cairn-{session}-0");
        while !(pod_image(cp, session) == image && pod_ready(cp, NS, &pod)) {
            assert!(
                Instant::now() < deadline,
                "{pod} does not run {image} Ready after 240 s:\n{}\n{}\n{}\n{}",
                cp.kubectl_ok(&["describe", "pod", &pod, "-n", NS])
                    .unwrap_or_default(),
                cp.kubectl_ok(&["get", "asess", session, "-n", NS, "-o", "yaml"])
                    .unwrap_or_default(),
                cp.kubectl_ok(&[
                    "logs",
                    "-n",
                    OPERATOR_NS,
                    "-l",
                    "app.kubernetes.io/instance=cairn",
                    "--tail",
                    "2000"
                ])
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(session))
                .collect::<Vec<_>>()
                .join("\n"),
                cp.kubectl_ok(&["get", "events", "-n", NS])
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// The CRD's `status.storedVersions`.
fn stored_versions(cp: &ControlPlane) -> String {
    cp.kubectl_ok(&[
        "get",
        "crd",
        "agentsessions.cairn.dev",
        "-o",
        "jsonpath={.status.storedVersions}",
    ])
    .unwrap_or_default()
}

/// Holds each session to what it acknowledged: a new turn's request to the model carries
/// every input the session answered before.
fn assert_history(cp: &ControlPlane, sim: &cairn_sim::Sim, history: &BTreeMap<&str, Vec<String>>) {
    for (session, inputs) in history {
        let probe = format!("probe {session} {}", sim.requests().len());
        let (status, body) = turn(cp, session, &probe, false);
        assert_eq!(status, 200, "{session}'s probe turn: {body}");
        let request = sim
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.contains(&probe))
            .expect("the probe reached the model");
        for input in inputs {
            assert!(
                request.contains(input),
                "{session} lost the acknowledged turn {input:?}"
            );
        }
    }
}

/// The history of the sessions that are running (not `sleeper`).
fn running(history: &BTreeMap<&'static str, Vec<String>>) -> BTreeMap<&'static str, Vec<String>> {
    history
        .iter()
        .filter(|(s, _)| RUNNING.contains(s))
        .map(|(s, v)| (*s, v.clone()))
        .collect()
}

fn assert_recall(cp: &ControlPlane, key: &str, original: &str) {
    let (status, recalled) = exchange(
        cp,
        NS,
        &session_addr(cp, NS, "keeper"),
        ("GET", &format!("/v1/recall/{key}")),
        &token_of(cp, "keeper"),
        None,
    );
    assert_eq!(status, 200, "recall: {recalled}");
    assert!(
        recalled == original,
        "recall returns the original byte for byte"
    );
}

/// `suspend` of `session` set to `on`.
fn suspend(cp: &ControlPlane, session: &str, on: bool) {
    kubectl(
        cp,
        &[
            "patch",
            "asess",
            session,
            "-n",
            NS,
            "--type=merge",
            "-p",
            &format!("{{\"spec\":{{\"suspend\":{on}}}}}"),
        ],
    );
}

/// Suspends `sleeper` and waits until its pod is gone.
fn put_to_sleep(cp: &ControlPlane) {
    suspend(cp, "sleeper", true);
    wait_for("sleeper's pod to go", Duration::from_secs(120), || {
        cp.kubectl_ok(&["get", "pod", "cairn-sleeper-0", "-n", NS])
            .is_err()
    });
}

/// Changes the release with a streamed turn of `talker` in flight and a watcher running;
/// afterwards every agent runs `tag` and each pod was replaced at most once.
fn change_release(
    cp: &'static ControlPlane,
    what: &str,
    change: impl FnOnce() -> Output,
    tag: &str,
    history: &mut BTreeMap<&'static str, Vec<String>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(cp, stop.clone());
    let input = format!("streamed during the {what}");
    let streaming = {
        let input = input.clone();
        std::thread::spawn(move || turn(cp, "talker", &input, true))
    };
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    let out = change();
    assert_helm(cp, what, &out);
    wait_for_agents(cp, tag);
    eprintln!("{what}: agents on {tag} in {:?}", started.elapsed());
    let (status, body) = streaming.join().expect("the streamed turn");
    let acknowledged = status == 200 && body.contains("response.completed");
    eprintln!("{what}: the streamed turn answered {status}, acknowledged: {acknowledged}");
    if acknowledged {
        history.entry("talker").or_default().push(input);
    }
    // Time for a second replacement to show, were there one.
    std::thread::sleep(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    let seen = watcher.join().expect("the watcher");
    assert!(seen.polls > 10, "the watcher polled ({})", seen.polls);
    assert!(
        seen.get_failures.is_empty(),
        "kubectl get asess failed during the {what}: {:?}",
        seen.get_failures
    );
    for session in RUNNING {
        let pod = format!("cairn-{session}-0");
        let uids = seen.uids.get(&pod).map(BTreeSet::len).unwrap_or(0);
        assert!(
            (1..=2).contains(&uids),
            "{pod} was replaced at most once during the {what}: {uids} pods"
        );
    }
}

#[test]
fn helm_upgrade_and_rollback_keep_every_session() {
    if skip() {
        return;
    }
    let cp = shared_cluster();
    let dir = run_dir("upgrade").expect("run dir");
    let node = RealNode::start(cp, "real-node-0", &dir.join("node")).expect("the real node");
    let previous = built_paths_with("build-release.sh", &[PREVIOUS]).expect("previous release");
    let current = built_paths("build-images.sh").expect("images build");
    for name in ["busybox", "cairn-agent", "cairn-operator"] {
        node.import_image(&current.get(name).expect("image"))
            .expect("image imported");
    }
    for name in ["cairn-agent", "cairn-operator"] {
        node.import_image(&previous.get(name).expect("previous image"))
            .expect("previous image imported");
    }
    let previous_chart: PathBuf = previous.get("chart").expect("previous chart");
    let s3 = S3Server::start(&dir, &["cairn"]).expect("moto");
    let s3_addr = node
        .forward_to_host(SocketAddr::from(([127, 0, 0, 1], s3.port)))
        .expect("forwarder");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sim = rt.block_on(cairn_sim::Sim::start()).expect("cairn-sim");
    let provider = node.forward_to_host(sim.addr()).expect("forwarder");
    let _ = cp.kubectl(&["create", "namespace", NS]);

    // The previous release, and its sessions.
    let install = [
        "install",
        "cairn",
        previous_chart.to_str().expect("UTF-8 path"),
        "--namespace",
        OPERATOR_NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "180s",
    ]
    .map(String::from);
    let out = helm_run(
        cp,
        &dir,
        &[&install[..], &values(PREVIOUS, s3_addr)].concat(),
    );
    assert_helm(cp, "helm install of the previous release", &out);
    let mut manifests = session_secrets(NS);
    for session in SESSIONS {
        let compaction = if session == "keeper" {
            "{minKeepRecent: 2, compression: {mode: \"off\"}, microcompact: {truncateAfterTurns: 1, summarizeAfterTurns: 50, minContentChars: 1000}}"
        } else {
            "{}"
        };
        manifests.push_str("---\n");
        // The previous release serves v1alpha1 only.
        let manifest = agent_session(NS, session, provider, compaction).replace(
            "apiVersion: cairn.dev/v1beta1",
            "apiVersion: cairn.dev/v1alpha1",
        );
        assert!(manifest.contains("apiVersion: cairn.dev/v1alpha1"));
        manifests.push_str(&manifest);
    }
    cp.apply_yaml(&manifests).expect("sessions applied");
    cp.apply_yaml(&client_pod(NS)).expect("client applied");
    wait_for("the client pod", Duration::from_secs(90), || {
        pod_ready(cp, NS, "client")
    });
    wait_for_agents(cp, PREVIOUS);
    wait_for("sleeper's pod", Duration::from_secs(120), || {
        pod_ready(cp, NS, "cairn-sleeper-0")
    });

    let mut history: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for session in SESSIONS {
        for n in 0..2 {
            let input = format!("{session} says {n} before the upgrade");
            let (status, body) = turn(cp, session, &input, false);
            assert_eq!(status, 200, "{session}'s turn {n}: {body}");
            history.entry(session).or_default().push(input);
        }
    }
    // keeper: a tool output large enough to be microcompacted, archived in S3.
    let tools = serde_json::json!([{
        "type": "function", "name": "read_file", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    }]);
    sim.route(
        "read the build log",
        cairn_sim::ScriptedReply::tool_call("read_file", serde_json::json!({"path": "build.log"})),
        Duration::ZERO,
    );
    let (addr, token) = (session_addr(cp, NS, "keeper"), token_of(cp, "keeper"));
    let (status, body) = exchange(
        cp,
        NS,
        &addr,
        ("POST", "/v1/responses"),
        &token,
        Some(&serde_json::json!({"model": "sim", "input": "read the build log", "tools": tools})),
    );
    assert_eq!(status, 200, "keeper's tool turn: {body}");
    let first = json_of(&body);
    let call_id = first["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .and_then(|c| c["call_id"].as_str())
        .unwrap_or_else(|| panic!("no function_call in {first}"))
        .to_string();
    let log = build_log();
    let key = ccr_key(log.as_bytes());
    let (status, body) = exchange(
        cp,
        NS,
        &addr,
        ("POST", "/v1/responses"),
        &token,
        Some(&serde_json::json!({
            "model": "sim", "previous_response_id": first["id"], "tools": tools,
            "input": [{"type": "function_call_output", "call_id": call_id, "output": log}]
        })),
    );
    assert_eq!(status, 200, "keeper's tool output: {body}");
    let marker = format!("<<ccr:{key}>>");
    let mut archived = false;
    for n in 0..3 {
        let input = format!("keeper asks {n}: what failed?");
        let (status, body) = turn(cp, "keeper", &input, false);
        assert_eq!(status, 200, "keeper's turn: {body}");
        history.entry("keeper").or_default().push(input.clone());
        let request = sim
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.contains(&input));
        if request.is_some_and(|r| r.contains(&marker)) {
            archived = true;
            break;
        }
    }
    assert!(archived, "keeper's tool output was never microcompacted");
    assert_recall(cp, &key, &log);
    // sleeper: suspended, its pod gone.
    put_to_sleep(cp);
    assert!(
        stored_versions(cp).contains("v1alpha1"),
        "the previous release stores v1alpha1"
    );
    // A slow model for the streamed turns during the release changes.
    sim.route(
        "streamed during the",
        cairn_sim::ScriptedReply::text("answered slowly"),
        Duration::from_secs(20),
    );

    // The upgrade: this tree's chart and images.
    let upgrade = [
        "upgrade",
        "cairn",
        cairn_tests::harness::repo_root()
            .join("charts/cairn")
            .to_str()
            .expect("UTF-8 path"),
        "--namespace",
        OPERATOR_NS,
        "--wait",
        "--timeout",
        "180s",
    ]
    .map(String::from);
    change_release(
        cp,
        "upgrade",
        || {
            helm_run(
                cp,
                &dir,
                &[&upgrade[..], &values(VERSION, s3_addr)].concat(),
            )
        },
        VERSION,
        &mut history,
    );
    assert_history(cp, &sim, &running(&history));
    assert_recall(cp, &key, &log);
    wait_for(
        "the objects to be migrated to v1beta1",
        Duration::from_secs(120),
        || stored_versions(cp) == "[\"v1beta1\"]",
    );
    let listed = kubectl(
        cp,
        &[
            "get",
            "agentsessions.v1beta1.cairn.dev",
            "-n",
            NS,
            "-o",
            "jsonpath={range .items[*]}{.apiVersion} {.metadata.name}{\"\\n\"}{end}",
        ],
    );
    for session in SESSIONS {
        assert!(
            listed.contains(&format!("cairn.dev/v1beta1 {session}")),
            "{session}, created as v1alpha1, reads back as v1beta1: {listed}"
        );
    }
    suspend(cp, "sleeper", false);
    wait_for("sleeper to resume", Duration::from_secs(180), || {
        pod_ready(cp, NS, "cairn-sleeper-0") && pod_image(cp, "sleeper").ends_with(VERSION)
    });
    assert_history(cp, &sim, &history);
    put_to_sleep(cp);

    // The rollback: the objects go back to the previous release's storage version first
    // (its CRD has no v1beta1, and the API server refuses a CRD without a stored version),
    // then `helm rollback` to the first revision.
    let storage_back = [
        &upgrade[..],
        &values(VERSION, s3_addr),
        &[
            "--set".to_string(),
            "crds.storageVersion=v1alpha1".to_string(),
        ],
    ]
    .concat();
    assert_helm(
        cp,
        "helm upgrade with the storage version back at v1alpha1",
        &helm_run(cp, &dir, &storage_back),
    );
    wait_for(
        "the objects to be migrated back to v1alpha1",
        Duration::from_secs(120),
        || stored_versions(cp) == "[\"v1alpha1\"]",
    );
    let rollback = [
        "rollback",
        "cairn",
        "1",
        "--namespace",
        OPERATOR_NS,
        "--wait",
        "--timeout",
        "180s",
    ]
    .map(String::from);
    change_release(
        cp,
        "rollback",
        || helm_run(cp, &dir, &rollback),
        PREVIOUS,
        &mut history,
    );
    assert_history(cp, &sim, &running(&history));
    assert_recall(cp, &key, &log);
    // As docs/operator.md says: kubectl's discovery cache still names v1beta1.
    kubectl(cp, &["api-resources"]);
    suspend(cp, "sleeper", false);
    wait_for(
        "sleeper to resume on the previous release",
        Duration::from_secs(180),
        || pod_ready(cp, NS, "cairn-sleeper-0") && pod_image(cp, "sleeper").ends_with(PREVIOUS),
    );
    assert_history(cp, &sim, &history);
    drop(node);
}
