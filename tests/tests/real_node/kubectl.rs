//! `kubectl cairn` (the `kubectl-cairn` plugin) against an operator-managed session whose
//! agent runs as a real pod on the real node, by a user who holds nothing but a Role in the
//! session's namespace: `context` (table, JSON and the exact request, equal to what the
//! agent's endpoint answers), `recall` of a key a microcompaction archived, `compact
//! --instruction`, `rewind`; and the plugin's words for a Role without `get` on Secrets, a
//! Role without `get` on `pods/portforward`, a session that does not exist, a namespace the
//! Role does not cover and an agent's error answer.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_tests::harness::ControlPlane;

use super::{
    build_log, ccr_key, client_pod, exchange, json_of, kubectl, pod_ready, session_secrets,
    shared_cluster, shared_node, shared_operator, skip, summary_text, wait_for, worker_endpoint,
};

/// The namespace of this test's session (one the operator of `shared_operator` manages).
pub const NS: &str = "plugin";

/// What `kubectl cairn` needs, and only in the session's namespace (`sessions`: the verbs
/// on AgentSessions; `list` shows the page's fleet list).
fn role(ns: &str, name: &str, sessions: &str, secrets: bool, forward: &str) -> String {
    let secret_rule = if secrets {
        "- {apiGroups: [\"\"], resources: [secrets], resourceNames: [cairn-worker-api-token], verbs: [get]}\n"
    } else {
        ""
    };
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {name}, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}, namespace: {ns}}}
rules:
- {{apiGroups: [cairn.dev], resources: [agentsessions], verbs: [{sessions}]}}
{secret_rule}- {{apiGroups: [""], resources: [pods/portforward], verbs: [{forward}]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: {ns}}}]
"#
    )
}

/// A kubeconfig that authenticates as ServiceAccount `ns/name` (a token of the
/// TokenRequest API), against the harness's API server, default namespace `ns`.
fn kubeconfig_of(cp: &ControlPlane, ns: &str, name: &str, dir: &Path) -> PathBuf {
    let token = kubectl(cp, &["create", "token", name, "-n", ns, "--duration=1h"]);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: harness\n  cluster: {{server: \"{}\", certificate-authority: {}}}\nusers:\n- name: {name}\n  user: {{token: {}}}\ncontexts:\n- name: {name}\n  context: {{cluster: harness, user: {name}, namespace: {ns}}}\ncurrent-context: {name}\n",
        cp.server,
        cp.pki.ca_crt().display(),
        token.trim()
    );
    let path = dir.join(format!("kubeconfig-{name}"));
    std::fs::write(&path, text).expect("kubeconfig written");
    path
}

/// The plugin's directory: the binaries of the Cargo target directory
/// (`cargo build --workspace --bins` builds `kubectl-cairn` there).
fn plugin_dir() -> PathBuf {
    let dir = cairn_tests::demo::default_bin_dir();
    assert!(
        dir.join("kubectl-cairn").exists(),
        "no kubectl-cairn in {}: run `cargo build -p kubectl-cairn` first",
        dir.display()
    );
    dir
}

/// What `kubectl cairn ARGS` printed and its exit code, run as kubectl runs a plugin: found
/// on PATH, with the user's kubeconfig.
struct Run {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

impl Run {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// `kubectl cairn ARGS` as kubectl runs the plugin: found on PATH, with `kubeconfig`.
fn plugin_command(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) -> Command {
    let path = format!(
        "{}:{}",
        plugin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(&cp.kubectl);
    cmd.arg("cairn")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path);
    cmd
}

fn plugin(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) -> Run {
    let out = plugin_command(cp, kubeconfig, args)
        .output()
        .expect("kubectl runs");
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!(
        "kubectl cairn {}: exit {}; stderr: {}",
        args.join(" "),
        run.code,
        run.stderr.trim()
    );
    run
}

#[test]
fn kubectl_cairn_works_with_namespace_scoped_rbac_against_a_real_agent_pod() {
    if skip() {
        return;
    }
    let node = shared_node();
    let cp = shared_cluster();
    let _operator = shared_operator();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sim = rt.block_on(cairn_sim::Sim::start()).expect("cairn-sim");
    let provider = node.forward_to_host(sim.addr()).expect("forwarder");
    let ns = NS;
    cp.apply_yaml(&format!(
        "{}---\n{}",
        session_secrets(ns),
        super::agent_session(
            ns,
            "worker",
            provider,
            "{minKeepRecent: 2, compression: {mode: \"off\"}, microcompact: {truncateAfterTurns: 1, summarizeAfterTurns: 50, minContentChars: 1000}}"
        )
    ))
    .expect("session applied");
    cp.apply_yaml(&client_pod(ns)).expect("client applied");
    cp.apply_yaml(&role(ns, "engineer", "get", true, "get, create"))
        .expect("engineer's Role applied");
    cp.apply_yaml(&role(ns, "lead", "get, list", true, "get, create"))
        .expect("lead's Role applied");
    cp.apply_yaml(&role(ns, "no-secrets", "get", false, "get, create"))
        .expect("no-secrets Role applied");
    // `create` alone is what `kubectl port-forward` (SPDY) needs; the WebSocket upgrade is a GET.
    cp.apply_yaml(&role(ns, "no-forward", "get", true, "create"))
        .expect("no-forward Role applied");
    let pod = "cairn-worker-0";
    let started = Instant::now();
    for p in [pod, "client"] {
        wait_for("the pods to be Ready", Duration::from_secs(120), || {
            pod_ready(cp, ns, p)
        });
    }
    eprintln!("session pod Ready in {:?}", started.elapsed());
    // The plugin goes by the session's phase, which the operator writes once it saw the pod.
    wait_for("the session to be Running", Duration::from_secs(60), || {
        cp.kubectl_ok(&[
            "get",
            "asess",
            "worker",
            "-n",
            ns,
            "-o",
            "jsonpath={.status.phase}",
        ])
        .is_ok_and(|p| p.trim() == "Running")
    });
    let dir = cairn_tests::harness::run_dir("plugin").expect("run dir");
    let engineer = kubeconfig_of(cp, ns, "engineer", &dir);
    let lead = kubeconfig_of(cp, ns, "lead", &dir);
    let denied = kubeconfig_of(cp, ns, "no-secrets", &dir);
    let no_forward = kubeconfig_of(cp, ns, "no-forward", &dir);

    // The engineer's account really has nothing beyond its Role.
    let can = |verb: &str, what: &str, in_ns: &str| {
        let out = Command::new(&cp.kubectl)
            .args(["auth", "can-i", verb, what, "-n", in_ns])
            .env("KUBECONFIG", &engineer)
            .output()
            .expect("kubectl auth can-i");
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    assert!(can("get", "agentsessions.cairn.dev", ns));
    assert!(!can("get", "agentsessions.cairn.dev", "default"));
    assert!(!can("list", "secrets", ns));
    assert!(!can("create", "pods/portforward", "default"));

    // The agent's own answers, from a client pod of the namespace with the session's
    // token, to hold the plugin's output to.
    let (token, addr) = worker_endpoint(cp, ns);
    let call = |request: (&str, &str), body: Option<serde_json::Value>| {
        exchange(cp, ns, &addr, request, &token, body.as_ref())
    };
    let tools = serde_json::json!([{
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    }]);

    // A large tool output, microcompacted into the archive a turn later: the key to recall.
    sim.push_reply(cairn_sim::ScriptedReply::tool_call(
        "read_file",
        serde_json::json!({"path": "build.log"}),
    ));
    let (status, body) = call(
        ("POST", "/v1/responses"),
        Some(
            serde_json::json!({"model": "sim", "input": "read the build log of ticket WHY-4711", "tools": tools}),
        ),
    );
    assert_eq!(status, 200, "first turn: {body}");
    let first = json_of(&body);
    let call_id = first["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .and_then(|c| c["call_id"].as_str())
        .unwrap_or_else(|| panic!("no function_call in {first}"))
        .to_string();
    let log = build_log();
    let key = ccr_key(log.as_bytes());
    sim.push_reply(cairn_sim::ScriptedReply::text("the build log is read"));
    let (status, body) = call(
        ("POST", "/v1/responses"),
        Some(serde_json::json!({
            "model": "sim", "previous_response_id": first["id"], "tools": tools,
            "input": [{"type": "function_call_output", "call_id": call_id, "output": log}]
        })),
    );
    assert_eq!(status, 200, "the tool output: {body}");
    let marker = format!("<<ccr:{key}>>");
    let mut compacted = false;
    for turn in 0..3 {
        sim.push_reply(cairn_sim::ScriptedReply::text("module_599 fails"));
        let (status, body) = call(
            ("POST", "/v1/responses"),
            Some(
                serde_json::json!({"model": "sim", "input": format!("turn {turn}: what failed?"), "tools": tools}),
            ),
        );
        assert_eq!(status, 200, "turn {turn}: {body}");
        if sim.requests().pop().is_some_and(|r| r.contains(&marker)) {
            compacted = true;
            break;
        }
    }
    assert!(compacted, "the tool output was never microcompacted");

    // context: the table, the JSON report and the exact request, as the endpoint answers.
    let table = plugin(cp, &engineer, &["context", "worker"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    let text = table.text();
    eprintln!("{text}");
    for needle in [
        "system prompt",
        "tools: client",
        "tool results: read_file",
        "headroom: normal",
        "markers in view: 1",
        &marker,
    ] {
        assert!(text.contains(needle), "no {needle:?} in the table:\n{text}");
    }
    let json = plugin(cp, &engineer, &["context", "worker", "-n", ns, "--json"]);
    assert_eq!(json.code, 0, "{}", json.stderr);
    let (status, endpoint) = call(("GET", "/v1/session/context"), None);
    assert_eq!(status, 200, "{endpoint}");
    let report = json_of(&json.text());
    assert_eq!(
        report,
        json_of(&endpoint),
        "kubectl cairn context --json is the endpoint's report"
    );
    assert_eq!(report["markers"][0]["key"], key.as_str(), "{report}");
    assert!(
        text.contains(&format!(
            "{:<36} {:>10}",
            "total",
            report["bodyBytes"].as_u64().unwrap_or(0)
        )),
        "the table's total is the report's body size:\n{text}"
    );
    let request = plugin(cp, &engineer, &["context", "worker", "--view", "request"]);
    assert_eq!(request.code, 0, "{}", request.stderr);
    let (status, body) = call(("GET", "/v1/session/context?view=request"), None);
    assert_eq!(status, 200, "{body}");
    assert!(
        request.stdout == body.as_bytes(),
        "kubectl cairn context --view request is the exact body of the next request"
    );
    assert_eq!(
        request.stdout.len() as u64,
        report["bodyBytes"].as_u64().unwrap_or(0)
    );

    // recall: the original of the microcompacted output, byte for byte.
    let recalled = plugin(cp, &engineer, &["recall", "worker", &key]);
    assert_eq!(recalled.code, 0, "{}", recalled.stderr);
    assert!(
        recalled.stdout == log.as_bytes(),
        "kubectl cairn recall prints the original byte for byte"
    );
    let unknown = plugin(cp, &engineer, &["recall", "worker", "0123456789abcdef"]);
    assert_eq!(unknown.code, 3, "an agent's error answer");
    assert!(
        unknown
            .stderr
            .contains("the agent answered 404 (not_archived)"),
        "{}",
        unknown.stderr
    );

    // compact --instruction: the summarizer is asked with the instruction.
    let before = sim.requests().len();
    sim.push_reply(cairn_sim::ScriptedReply::text(summary_text()));
    let compact = plugin(
        cp,
        &engineer,
        &[
            "compact",
            "worker",
            "--instruction",
            "keep the build errors of module_599",
            "--json",
        ],
    );
    assert_eq!(compact.code, 0, "{}", compact.stderr);
    let out = json_of(&compact.text());
    assert!(
        out["bytesAfter"].as_u64() < out["bytesBefore"].as_u64(),
        "the compaction made the history smaller: {out}"
    );
    let asked = sim.requests();
    assert!(
        asked[before..]
            .iter()
            .any(|r| r.contains("keep the build errors of module_599")),
        "the summarizer got the instruction"
    );
    eprintln!("compaction: {out}");
    let compacted_to = out["bytesAfter"].as_u64().unwrap_or(0);

    // rewind: the history before the compaction is back; with one compaction, a second rewind
    // has nothing to undo.
    let rewind = plugin(cp, &engineer, &["rewind", "worker"]);
    assert_eq!(rewind.code, 0, "{}", rewind.stderr);
    assert!(
        rewind.text().starts_with("rewound the last compaction: "),
        "{}",
        rewind.text()
    );
    let (_, view) = call(("GET", "/v1/session"), None);
    let stats = json_of(&view)["stats"].clone();
    let (messages, bytes) = (
        stats["messages"].as_u64().unwrap_or(0),
        stats["historyBytes"].as_u64().unwrap_or(0),
    );
    assert_eq!(
        rewind.text().trim(),
        format!(
            "rewound the last compaction: {messages} messages, {bytes} bytes of history; nothing more to rewind"
        ),
        "the agent's answer, as the session reports it"
    );
    assert!(
        bytes > compacted_to,
        "the rewind brought back what the compaction replaced: {bytes} bytes, {compacted_to} after the compaction"
    );
    let again = plugin(cp, &engineer, &["rewind", "worker"]);
    assert_eq!(again.code, 3, "{}", again.stderr);
    assert!(
        again.stderr.contains("(nothing_to_rewind)"),
        "{}",
        again.stderr
    );

    // context --why: a text of the first turn, after three compactions with work between
    // them, is located; the marker it prints recalls the original that holds it.
    let early = "ticket WHY-4711";
    for round in 0..3 {
        for i in 0..2 {
            sim.push_reply(cairn_sim::ScriptedReply::text(format!(
                "round {round}, answer {i}: {}",
                "module_599 still fails. ".repeat(30)
            )));
            let (status, body) = call(
                ("POST", "/v1/responses"),
                Some(serde_json::json!({
                    "model": "sim", "tools": tools,
                    "input": format!("round {round}, question {i}: {}", "y".repeat(1500))
                })),
            );
            assert_eq!(status, 200, "round {round}, turn {i}: {body}");
        }
        sim.push_reply(cairn_sim::ScriptedReply::text(summary_text()));
        let compact = plugin(cp, &engineer, &["compact", "worker", "--json"]);
        assert_eq!(compact.code, 0, "{}", compact.stderr);
        let out = json_of(&compact.text());
        assert!(
            out["bytesAfter"].as_u64() < out["bytesBefore"].as_u64(),
            "compaction {round} made the history smaller: {out}"
        );
    }
    let why = plugin(cp, &engineer, &["context", "worker", "--why", early]);
    assert_eq!(why.code, 0, "{}", why.stderr);
    let where_ = why.text();
    eprintln!("kubectl cairn context --why: {where_}");
    let archived = where_
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("archived under "))
        .and_then(|rest| rest.find(">>").map(|end| rest[..end + 2].to_owned()))
        .unwrap_or_else(|| panic!("no archived place for {early:?}:\n{where_}"));
    let recalled = plugin(cp, &engineer, &["recall", "worker", &archived]);
    assert_eq!(recalled.code, 0, "{}", recalled.stderr);
    assert!(
        String::from_utf8_lossy(&recalled.stdout).contains(early),
        "recall of {archived} returns the original that holds {early:?}"
    );
    let why_json = plugin(
        cp,
        &engineer,
        &["context", "worker", "--why", early, "--json"],
    );
    assert_eq!(why_json.code, 0, "{}", why_json.stderr);
    let (status, endpoint) = call(("GET", "/v1/session/context?why=ticket%20WHY-4711"), None);
    assert_eq!(status, 200, "{endpoint}");
    assert_eq!(json_of(&why_json.text()), json_of(&endpoint));
    // The table carries the compactions' score.
    let table = plugin(cp, &engineer, &["context", "worker"]).text();
    assert!(
        table.contains("compaction score: ") && table.contains(" scored, rolling "),
        "{table}"
    );

    // The plugin's words for what the caller can fix.
    let refused = plugin(cp, &denied, &["context", "worker"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains(&format!(
            "RBAC denied: you cannot get secrets \"cairn-worker-api-token\" in namespace \"{ns}\""
        )),
        "{}",
        refused.stderr
    );
    assert!(refused.stdout.is_empty());
    let refused = plugin(cp, &no_forward, &["recall", "worker", &key]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains(&format!(
            "RBAC denied: you cannot get pods/portforward \"cairn-worker-0\" in namespace \"{ns}\""
        )),
        "{}",
        refused.stderr
    );
    let missing = plugin(cp, &engineer, &["context", "nosuch"]);
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(
        missing
            .stderr
            .contains(&format!("no AgentSession \"nosuch\" in namespace \"{ns}\"")),
        "{}",
        missing.stderr
    );
    let elsewhere = plugin(cp, &engineer, &["context", "worker", "-n", "default"]);
    assert_eq!(elsewhere.code, 2, "{}", elsewhere.stderr);
    assert!(
        elsewhere
            .stderr
            .contains("RBAC denied: you cannot get agentsessions.cairn.dev \"worker\" in namespace \"default\""),
        "{}",
        elsewhere.stderr
    );

    // open: the session page, through the plugin's port-forward, in a real browser.
    the_page_through_open(cp, (&engineer, &lead), &denied, &rt, &dir, early);
}

/// Stops `kubectl cairn open` when the test ends, passed or not.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kubectl cairn open`: a caller who cannot read the token Secret gets no page; the
/// engineer's page of the real agent pod loads in Chromium and shows the window by part,
/// the compactions with their scores, and where `early` (a text of the first turn) went.
/// `kubectl cairn open` as `kubeconfig`: the process (stopped when dropped) and the page's
/// URL it printed.
fn open_page(cp: &ControlPlane, kubeconfig: &Path) -> (Serving, String) {
    use std::io::BufRead;

    let mut child = plugin_command(cp, kubeconfig, &["open", "worker"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl cairn open");
    let stdout = child.stdout.take().expect("stdout");
    let serving = Serving(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("kubectl cairn open prints its address")
        .trim()
        .to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/ui"),
        "{url}"
    );
    (serving, url)
}

/// The page through `kubectl cairn open` in Chromium: as the engineer (no `list` on
/// sessions: the page without a fleet list), and as the lead, who may list them.
fn the_page_through_open(
    cp: &ControlPlane,
    (engineer, lead): (&Path, &Path),
    denied: &Path,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    early: &str,
) {
    let refused = plugin(cp, denied, &["open", "worker"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stdout.is_empty()
            && refused
                .stderr
                .contains("RBAC denied: you cannot get secrets"),
        "no page without the token Secret: {}",
        refused.stderr
    );
    let (serving, url) = open_page(cp, engineer);
    let (lead_serving, lead_url) = open_page(cp, lead);
    rt.block_on(async {
        let within = Duration::from_secs(60);
        let browser = cairn_tests::harness::browser::Browser::start(dir)
            .await
            .expect("chromium");
        browser.client.goto(&url).await.expect("the page");
        browser
            .until(
                "the window's hundred cells",
                "return document.querySelectorAll('#grid .cell').length === 100",
                within,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let seen = browser
            .eval(
                "return [document.getElementById('title').textContent,
                         new Set([...document.querySelectorAll('#grid .cell')].map(c => c.dataset.part)).size,
                         [...document.querySelectorAll('#timeline tbody tr [data-score]')].length,
                         document.querySelectorAll('#timeline a.marker').length]",
            )
            .await
            .expect("the page");
        eprintln!("the page of {NS}/worker: {seen}");
        assert_eq!(seen[0], format!("{NS}/worker"), "{seen}");
        assert!(seen[1].as_u64() >= Some(3), "the window shows several parts: {seen}");
        assert!(seen[2].as_u64() >= Some(3), "the compactions' scores: {seen}");
        assert!(seen[3].as_u64() >= Some(1), "archived keys to recall: {seen}");
        browser
            .eval(&format!(
                "document.getElementById('why').value = {early:?};
                 document.querySelector('#why-form button').click(); return true"
            ))
            .await
            .expect("the why box");
        let places = browser
            .until(
                "where the first turn's text went",
                "const rows = [...document.querySelectorAll('#places tbody tr')];
                 return rows.map(r => r.dataset.where)",
                within,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            places.as_array().is_some_and(|p| p.iter().any(|w| w == "archived")),
            "{early:?} is found in the archive: {places}"
        );
        // The engineer may not list sessions: no fleet list, and the plugin's route says why.
        let fleet = browser
            .eval("return document.getElementById('fleet').classList.contains('hidden')")
            .await
            .expect("the page");
        assert_eq!(fleet, serde_json::json!(true), "no fleet list for the engineer");
        let fleet_url = url.replace("/ui", "/v1/fleet");
        let answer = reqwest::get(&fleet_url).await.expect("the fleet route");
        assert_eq!(answer.status(), 403);
        let text = answer.text().await.unwrap_or_default();
        assert!(text.contains("RBAC denied: you cannot list"), "{text}");

        // The lead may: the fleet list names the namespace's sessions with their phase.
        browser.client.goto(&lead_url).await.expect("the lead's page");
        let rows = browser
            .until(
                "the fleet list",
                "const rows = [...document.querySelectorAll('#fleet-table tbody tr')];
                 return rows.length > 0 && !document.getElementById('fleet').classList.contains('hidden')
                   && rows.map(r => [r.dataset.session, r.children[1].textContent, r.className])",
                within,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("the fleet list: {rows}");
        assert_eq!(
            rows,
            serde_json::json!([["worker", "Running", "current"]]),
            "the namespace's one session, this one"
        );
        if let Ok(path) = std::env::var("CAIRN_PAGE_SCREENSHOT") {
            browser
                .eval("window.scrollTo(0, 0); return true")
                .await
                .expect("scroll");
            let png = browser.screenshot().await.expect("screenshot");
            std::fs::write(&path, png).expect("screenshot file");
            eprintln!("screenshot: {path}");
        }
    });
    drop((serving, lead_serving));
}
