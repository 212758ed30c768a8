//! The whole system on one machine, no Docker: the local control plane, an S3 server, the
//! provider simulator behind a real nginx with a small `client_max_body_size`, cairn
//! installed with its Helm chart (the operator runs as the operator pod, with the chart's
//! RBAC), and one AgentSession. A few turns force a 413 recovery and compactions; the
//! session's status and the agent's Events show each compaction level at work and the
//! recovery. `make demo` runs it on a real node (kubelet, containerd, runc:
//! the operator and agent pods are real containers of the locally built images);
//! `--kwok` (and `tests/tests/e2e_demo.rs`, which asserts on it) runs the pods on kwok's fake
//! node instead, each container as a local process with its pod's own ServiceAccount.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_sim::nginx::{Middlebox, MiddleboxConfig};
use cairn_sim::summary::SUMMARY_PHRASE;
use cairn_sim::{ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::harness::{
    ControlPlane, HarnessError, PodRuntime, RealNode, S3Server, built_paths_with, helm, node,
    repo_root, run_dir, runtime, s3,
};

/// How the demo runs.
pub struct DemoOptions {
    /// Where `cairn-agent` and `cairn-operator` were built.
    pub bin_dir: PathBuf,
    /// Turns to drive.
    pub turns: usize,
    /// Bytes of filler in each turn's input.
    pub turn_bytes: usize,
    /// nginx `client_max_body_size` in front of the simulator.
    pub proxy_limit: String,
    /// Run the pods on a real node (kubelet, containerd, runc) rather than kwok's.
    pub real_node: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            bin_dir: PathBuf::from("target/debug"),
            turns: 8,
            turn_bytes: 4_000,
            proxy_limit: "20k".into(),
            real_node: false,
        }
    }
}

/// What the demo saw.
pub struct DemoReport {
    /// `kubectl get asess -o wide`.
    pub table: String,
    /// The AgentSession as the API server has it.
    pub session: Value,
    /// 413s nginx answered.
    pub proxy_413s: usize,
    /// Turns that answered 200.
    pub answered: usize,
    /// The agent's Events on the session.
    pub events: Vec<SessionEvent>,
}

/// Everything the demo started; dropping it stops all of it.
pub struct Demo {
    /// The real node the pods run on (`DemoOptions::real_node`).
    pub node: Option<RealNode>,
    pub cp: ControlPlane,
    pub s3: S3Server,
    pub nginx: Middlebox,
    pub sim: Sim,
    /// The pod runtime of kwok's node (without a real node).
    pub pods: Option<PodRuntime>,
    pub rt: tokio::runtime::Runtime,
    pub agent_url: String,
    pub token: String,
}

const NS: &str = "demo";
const SESSION: &str = "demo";
const MODEL: &str = "demo-model";
/// The name of the real node, when the demo runs one.
const REAL_NODE: &str = "demo-node";

/// Whether this machine can run the real node (root, the tools `.ci/install.sh` installs);
/// why not, if it cannot.
pub fn real_node_unsupported() -> Option<String> {
    node::unsupported()
}

fn err(msg: impl Into<String>) -> HarnessError {
    HarnessError::Setup(msg.into())
}

/// Brings everything up and creates the session; `say` narrates.
pub fn start(opts: &DemoOptions, say: &mut dyn FnMut(&str)) -> Result<Demo, HarnessError> {
    for bin in ["cairn-agent", "cairn-operator"] {
        if !opts.bin_dir.join(bin).is_file() {
            return Err(err(format!(
                "{} is missing: build it first (cargo build -p cairn-agent -p cairn-operator)",
                opts.bin_dir.join(bin).display()
            )));
        }
    }
    let started = Instant::now();
    let dir = run_dir("demo")?;
    say("starting the control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)");
    let cp = ControlPlane::start(&dir)?;
    say("starting the S3 server (moto)");
    let s3 = S3Server::start(&dir.join("logs"), &["cairn"])?;
    let rt = tokio::runtime::Runtime::new()
        .map_err(|e| HarnessError::io("starting a Tokio runtime", e))?;
    let sim = rt
        .block_on(Sim::start())
        .map_err(|e| HarnessError::io("starting cairn-sim", e))?;
    sim.set_window(MODEL, 64_000);
    say(&format!(
        "starting nginx (client_max_body_size {}) in front of cairn-sim",
        opts.proxy_limit
    ));
    let nginx = Middlebox::start(
        sim.addr(),
        &MiddleboxConfig {
            limit: opts.proxy_limit.clone(),
            block_at: 100_000_000,
        },
    )
    .map_err(|e| err(format!("nginx: {e}")))?;
    // Where pods reach the archive store and the provider: the host's loopback with kwok's
    // pod runtime; forwarders on the real node's address otherwise.
    let mut s3_endpoint = s3.endpoint.clone();
    let mut base_url = format!("{}/v1", nginx.url("/limit"));
    let mut node_values: Vec<String> = Vec::new();
    let (node, pods) = if opts.real_node {
        say("starting a real node (containerd, runc, kubelet, kube-proxy, kube-router)");
        let node = RealNode::start(&cp, REAL_NODE, &dir.join("node"))?;
        say("making the cairn images from the workspace's build and importing them");
        let images = built_paths_with("build-images.sh", &["cairn"])?;
        for name in ["cairn-agent", "cairn-operator"] {
            node.import_image(&images.get(name)?)?;
        }
        let loopback = |url: &str| -> Result<SocketAddr, HarnessError> {
            url.trim_start_matches("http://")
                .split('/')
                .next()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| err(format!("not a loopback URL: {url}")))
        };
        let s3_addr = node.forward_to_host(loopback(&s3.endpoint)?)?;
        s3_endpoint = format!("http://{s3_addr}");
        let nginx_addr = node.forward_to_host(loopback(&nginx.url("/"))?)?;
        base_url = format!("http://{nginx_addr}/limit/v1");
        node_values = vec![
            "--set".into(),
            format!("nodeSelector.kubernetes\\.io/hostname={REAL_NODE}"),
        ];
        (Some(node), None)
    } else {
        let pods = PodRuntime::start(&cp, runtime::cairn_images(&opts.bin_dir), "")?;
        (None, Some(pods))
    };

    say("helm install cairn (the operator runs as its pod, with the chart's RBAC)");
    let chart = repo_root().join("charts/cairn");
    let out = std::process::Command::new(helm()?)
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .args(["install", "cairn"])
        .arg(&chart)
        .args([
            "--namespace",
            "cairn-system",
            "--create-namespace",
            "--wait",
            "--timeout",
            "120s",
        ])
        .args([
            "--set",
            &format!("archive.endpoint={s3_endpoint}"),
            "--set",
            "archive.bucket=cairn",
            "--set",
            "archive.credentialsSecret=cairn-s3",
        ])
        .args(["--set", "logFormat=text"])
        .args(&node_values)
        .output()
        .map_err(|e| HarnessError::io("running helm", e))?;
    if !out.status.success() {
        return Err(err(format!(
            "helm install failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    wait("the chart's CRDs", Duration::from_secs(60), || {
        cp.kubectl(&["get", "crd", "agentsessions.cairn.dev"])
            .is_ok_and(|o| o.status.success())
    })?;

    say("creating the demo AgentSession (64k-token window, behind a 20k proxy)");
    let template = if opts.real_node {
        format!("  template:\n    nodeSelector: {{kubernetes.io/hostname: {REAL_NODE}}}\n")
    } else {
        String::new()
    };
    cp.apply_yaml(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: cairn-s3, namespace: {NS}}}
stringData: {{AWS_ACCESS_KEY_ID: {}, AWS_SECRET_ACCESS_KEY: {}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: demo-provider, namespace: {NS}}}
stringData: {{api-key: sk-demo-not-a-real-key}}
---
apiVersion: cairn.dev/v1beta1
kind: AgentSession
metadata: {{name: {SESSION}, namespace: {NS}}}
spec:
  provider:
    kind: openai-compatible
    model: {MODEL}
    baseUrl: "{base_url}"
    credentials: {{secretName: demo-provider}}
  contextWindow: 64000
  maxOutputTokens: 1024
  systemPrompt: You are the cairn demo agent. Answer briefly.
  compaction: {{budgetRatio: 0.6, minKeepRecent: 4}}
{template}"#,
        s3::ACCESS_KEY_ID,
        s3::SECRET_ACCESS_KEY
    ))?;
    let pod_name = format!("cairn-{SESSION}-0");
    let (agent_url, agent_log) = match (&node, &pods) {
        (Some(node), _) => {
            // The session's pod (the namespace's headless Service resolves its name to it),
            // reached from the host through a forwarder that dials from inside the node (as a
            // process on the node would).
            let deadline = Instant::now() + Duration::from_secs(120);
            let ip = loop {
                let ip = cp
                    .kubectl_ok(&[
                        "get",
                        "pod",
                        &pod_name,
                        "-n",
                        NS,
                        "-o",
                        "jsonpath={.status.podIP}",
                    ])
                    .unwrap_or_default();
                if let Ok(ip) = ip.trim().parse::<std::net::Ipv4Addr>() {
                    break ip;
                }
                if Instant::now() > deadline {
                    return Err(err("the session's pod never got an address"));
                }
                std::thread::sleep(Duration::from_millis(300));
            };
            let addr = node.forward_from_host(SocketAddr::from((ip, 8080)))?;
            (format!("http://{addr}"), None)
        }
        (None, Some(pods)) => {
            let pod = pods.wait_for(NS, &pod_name, Duration::from_secs(120))?;
            let port = pod
                .ports
                .get("listen")
                .copied()
                .ok_or_else(|| err("the agent pod has no --listen port"))?;
            (format!("http://127.0.0.1:{port}"), Some(pod.log))
        }
        (None, None) => return Err(err("no pods run anywhere")),
    };
    let token_b64 = cp.kubectl_ok(&[
        "get",
        "secret",
        &format!("cairn-{SESSION}-api-token"),
        "-n",
        NS,
        "-o",
        "jsonpath={.data.token}",
    ])?;
    let token = decode_b64(&token_b64)?;
    let http = reqwest::Client::new();
    let ready_url = format!("{agent_url}/readyz");
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if http
                .get(&ready_url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = match &agent_log {
                    Some(log) => crate::harness::proc::tail(log),
                    None => cp
                        .kubectl_ok(&["logs", &pod_name, "-n", NS])
                        .unwrap_or_default(),
                };
                return Err(err(format!(
                    "the agent never became ready; its log:\n{log}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })?;
    say(&format!(
        "agent pod {NS}/{pod_name} is serving on {agent_url} (up in {:.0} s)",
        started.elapsed().as_secs_f64()
    ));
    Ok(Demo {
        node,
        cp,
        s3,
        nginx,
        sim,
        pods,
        rt,
        agent_url,
        token,
    })
}

impl Demo {
    /// One turn through the agent's `POST /v1/responses`: the HTTP status and the body.
    pub fn turn(&self, input: &str) -> Result<(u16, Value), HarnessError> {
        self.call(
            "POST",
            "/v1/responses",
            Some(json!({"model": MODEL, "input": input})),
        )
    }

    /// A call to the agent's HTTP API with the session's bearer token.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), HarnessError> {
        let http = reqwest::Client::new();
        let url = format!("{}{path}", self.agent_url);
        self.rt.block_on(async {
            let req = match method {
                "GET" => http.get(&url),
                _ => http.post(&url),
            };
            let req = req.bearer_auth(&self.token);
            let req = match body {
                Some(b) => req.json(&b),
                None => req,
            };
            let r = req
                .send()
                .await
                .map_err(|e| err(format!("{method} {path}: {e}")))?;
            let status = r.status().as_u16();
            Ok((status, r.json::<Value>().await.unwrap_or(Value::Null)))
        })
    }

    /// Drives the turns and collects the report.
    ///
    /// Each turn hands the agent what a client with its own tools sends: the call of its
    /// `read_build_log` tool, that tool's output (a build log) and the user's question, on
    /// every other turn with a pasted design note. The history grows past nginx's body limit, so the agent meets a 413,
    /// learns the path's cap and recovers, and compacts before the requests that would come
    /// close to it again.
    pub fn drive(
        &self,
        opts: &DemoOptions,
        say: &mut dyn FnMut(&str),
    ) -> Result<DemoReport, HarnessError> {
        let mut answered = 0;
        for turn in 1..=opts.turns {
            if turn == opts.turns && turn > 1 {
                // The last turn meets a summarizer that refuses (a model's refusal fails the
                // quality gate, twice): level 2 cannot make room, level 3 does.
                self.sim.route(
                    SUMMARY_PHRASE,
                    ScriptedReply::text("I'm sorry, I can't summarize this conversation."),
                    Duration::ZERO,
                );
                say(&format!(
                    "turn {turn}: from here on the summarizer refuses (cairn-sim answers every summary request with a refusal)"
                ));
            }
            let call_id = format!("build-{turn}");
            let input = json!([
                {"type": "function_call", "call_id": call_id, "name": "read_build_log",
                 "arguments": json!({"build": turn}).to_string()},
                {"type": "function_call_output", "call_id": call_id,
                 "output": filler(turn, opts.turn_bytes)},
                {"role": "user", "content": question(turn, opts.turn_bytes * 3 / 2)},
            ]);
            let (status, reply) = self.call(
                "POST",
                "/v1/responses",
                Some(json!({"model": MODEL, "input": input})),
            )?;
            if status == 200 {
                answered += 1;
            }
            say(&format!(
                "turn {turn}: HTTP {status} (a {}-byte build log and a {}-byte message)",
                opts.turn_bytes,
                question(turn, opts.turn_bytes * 3 / 2).len()
            ));
            if status != 200 {
                say(&format!("    {}", reply["error"]));
            }
            for n in reply["cairn"]["notices"].as_array().into_iter().flatten() {
                say(&format!(
                    "    {}: {}",
                    n["kind"].as_str().unwrap_or("?"),
                    n["message"].as_str().unwrap_or("")
                ));
            }
        }
        // The agent writes status.session at most every few seconds.
        let deadline = Instant::now() + Duration::from_secs(30);
        let session = loop {
            let json = self
                .cp
                .kubectl_ok(&["get", "asess", SESSION, "-n", NS, "-o", "json"])?;
            let v: Value = serde_json::from_str(&json).map_err(|e| err(e.to_string()))?;
            let turns = v["status"]["session"]["turns"].as_u64().unwrap_or(0);
            let running = v["status"]["phase"] == "Running";
            if (running && turns >= answered as u64) || Instant::now() > deadline {
                break v;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let table = self
            .cp
            .kubectl_ok(&["get", "asess", "-n", NS, "-o", "wide"])?;
        let proxy_413s = self
            .nginx
            .access_log()
            .lines()
            .filter(|l| l.contains("\" 413 "))
            .count();
        Ok(DemoReport {
            table,
            session,
            proxy_413s,
            answered,
            events: self.events()?,
        })
    }

    /// The agent's `Compacted` and `Recovered` Events on the session, oldest first.
    pub fn events(&self) -> Result<Vec<SessionEvent>, HarnessError> {
        let json = self
            .cp
            .kubectl_ok(&["get", "events.events.k8s.io", "-n", NS, "-o", "json"])?;
        let v: Value = serde_json::from_str(&json).map_err(|e| err(e.to_string()))?;
        let mut events: Vec<(String, SessionEvent)> = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["regarding"]["kind"] == "AgentSession"
                    && e["regarding"]["name"] == SESSION
                    && matches!(e["reason"].as_str(), Some("Compacted" | "Recovered"))
            })
            .map(|e| {
                let at = e["eventTime"]
                    .as_str()
                    .or(e["deprecatedFirstTimestamp"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                let ev = SessionEvent {
                    reason: e["reason"].as_str().unwrap_or_default().to_owned(),
                    note: e["note"].as_str().unwrap_or_default().to_owned(),
                    count: e["series"]["count"].as_u64().unwrap_or(1),
                };
                (at, ev)
            })
            .collect();
        events.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(events.into_iter().map(|(_, e)| e).collect())
    }
}

/// One of the agent's Events on the session.
#[derive(Clone, Debug)]
pub struct SessionEvent {
    /// `Compacted` or `Recovered`.
    pub reason: String,
    pub note: String,
    /// How many times it happened (the Event's series).
    pub count: u64,
}

/// The ladder levels the Events show, each with the pass that does its work: a level counts
/// only when its pass changed the history.
pub const LEVELS: [(u8, &str, &str); 3] = [
    (
        1,
        "trim",
        "old tool outputs cut to previews, originals archived",
    ),
    (
        2,
        "summary",
        "the older conversation summarized, the segment archived",
    ),
    (
        3,
        "emergency",
        "emergency truncation, the dropped messages archived",
    ),
];

impl DemoReport {
    /// The levels of [`LEVELS`] some `Compacted` Event shows at work.
    pub fn levels_seen(&self) -> Vec<u8> {
        LEVELS
            .iter()
            .filter(|(_, pass, _)| {
                self.events.iter().any(|e| {
                    e.reason == "Compacted"
                        && e.note
                            .split_once('(')
                            .and_then(|(_, rest)| rest.split_once(')'))
                            .is_some_and(|(passes, _)| passes.split(", ").any(|p| p == *pass))
                })
            })
            .map(|(level, _, _)| *level)
            .collect()
    }

    /// The scores the Events report (what each compaction kept in sight of what it
    /// replaced), in order.
    pub fn scores(&self) -> Vec<f64> {
        self.events
            .iter()
            .filter_map(|e| e.note.split_once("score ")?.1.get(..4)?.parse().ok())
            .collect()
    }

    /// Whether a `Recovered` Event shows a recovery.
    pub fn recovered(&self) -> bool {
        self.events.iter().any(|e| e.reason == "Recovered")
    }
}

fn wait(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<(), HarnessError> {
    let deadline = Instant::now() + timeout;
    while !ok() {
        if Instant::now() > deadline {
            return Err(err(format!("timed out waiting for {what}")));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(())
}

fn decode_b64(s: &str) -> Result<String, HarnessError> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| err(format!("token: {e}")))?;
    String::from_utf8(bytes).map_err(|e| err(format!("token: {e}")))
}

/// A deterministic build log of about `bytes` bytes.
fn filler(turn: usize, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 100);
    let mut i = 0;
    while s.len() < bytes {
        i += 1;
        if i % 17 == 0 {
            s.push_str(&format!(
                "error[E0{turn:02}{i:02}]: mismatched types in src/module_{i}.rs\n"
            ));
        } else {
            s.push_str(&format!(
                "   Compiling crate-{turn}-{i} v0.{i}.0 (/work/crates/crate-{i})\n"
            ));
        }
    }
    s
}

/// The user's message of a turn: a question, on every other turn with a pasted design note
/// of about `note_bytes` bytes (prose, which no compressor shortens and level 1 never
/// touches).
fn question(turn: usize, note_bytes: usize) -> String {
    if turn.is_multiple_of(4) {
        // Every fourth turn the user pastes a whole chapter: level 2 makes room by cutting it
        // (its original archived) beside the summary; level 3 when no summary comes.
        format!(
            "Turn {turn}: what failed in build {turn}? Check it against this chapter:\n{}",
            note(turn, note_bytes * 2)
        )
    } else if !turn.is_multiple_of(2) {
        format!(
            "Turn {turn}: what failed in build {turn}? It follows this design note:\n{}",
            note(turn, note_bytes)
        )
    } else {
        format!("Turn {turn}: what failed in build {turn}?")
    }
}

/// A design note of about `bytes` bytes: prose no compressor shortens.
fn note(turn: usize, bytes: usize) -> String {
    const WORDS: [&str; 16] = [
        "the", "gateway", "retries", "each", "request", "once", "after", "a", "reset", "while",
        "session", "state", "stays", "in", "the", "journal",
    ];
    let mut s = String::with_capacity(bytes + 100);
    let mut i = turn * 7;
    while s.len() < bytes {
        for n in 0..(8 + i % 9) {
            s.push_str(WORDS[(i * 5 + n * 3 + turn) % WORDS.len()]);
            s.push(' ');
        }
        s.push_str(&format!("(section {turn}.{i}).\n"));
        i += 1;
    }
    s
}

/// The binaries' directory when running from a Cargo target directory: beside this
/// executable, or one level up for test executables in `deps/`.
pub fn default_bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}
