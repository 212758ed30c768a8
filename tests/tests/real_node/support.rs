//! What the real-node test binaries share: waiting, kubectl, client pods that talk to an
//! agent with busybox's nc, and the sessions and Secrets a test applies.
// Each real-node binary uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cairn_tests::harness::node;
use cairn_tests::harness::{ControlPlane, s3};

/// The address `cairn-<session>.cairn-sessions.<ns>.svc:8080` resolves to: the IP of the session's pod (a
/// replaced pod has a new one, so callers look it up again after a roll).
pub fn session_addr(cp: &ControlPlane, ns: &str, session: &str) -> String {
    let ip = kubectl(
        cp,
        &[
            "get",
            "pod",
            &format!("cairn-{session}-0"),
            "-n",
            ns,
            "-o",
            "jsonpath={.status.podIP}",
        ],
    );
    format!("{}:8080", ip.trim())
}

/// True when this machine cannot run a real node (the test is skipped; under `CI=true` it
/// fails instead).
pub fn skip() -> bool {
    node::unsupported().is_some_and(|why| {
        cairn_tests::harness::skip_for(&format!("this machine cannot run a real node: {why}"))
    })
}

pub fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    cp.kubectl_ok(args)
        .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
}

pub fn wait_for(what: &str, timeout: Duration, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !probe() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

pub fn pod_ready(cp: &ControlPlane, ns: &str, pod: &str) -> bool {
    cp.kubectl_ok(&[
        "get",
        "pod",
        pod,
        "-n",
        ns,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ])
    .is_ok_and(|s| s.trim() == "True")
}

/// A busybox pod `client` of `ns`, labelled `cairn.dev/client: "true"`: the operator's
/// sessions of `ns` admit it (operator/src/objects/network.rs).
pub fn client_pod(ns: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: {ns}, labels: {{cairn.dev/client: "true"}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: real-node-0}}
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsNonRoot: true, runAsUser: 65532, seccompProfile: {{type: RuntimeDefault}}}}
  containers:
  - name: client
    image: harness.local/busybox:cairn
    imagePullPolicy: Never
    command: [sleep, "3600"]
    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}
    volumeMounts: [{{name: tmp, mountPath: /tmp}}]
  volumes: [{{name: tmp, emptyDir: {{sizeLimit: 16Mi}}}}]
"#
    )
}

/// The Secrets of a session's namespace: the archive credentials the chart's
/// `archive.credentialsSecret` names, and the provider's key.
pub fn session_secrets(ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: cairn-s3, namespace: {ns}}}\nstringData: {{AWS_ACCESS_KEY_ID: {}, AWS_SECRET_ACCESS_KEY: {}}}\n---\n\
apiVersion: v1\nkind: Secret\nmetadata: {{name: provider, namespace: {ns}}}\nstringData: {{api-key: sk-sim}}\n",
        s3::ACCESS_KEY_ID,
        s3::SECRET_ACCESS_KEY
    )
}

/// An AgentSession whose pod runs on the real node, its provider at `provider`.
pub fn agent_session(ns: &str, name: &str, provider: SocketAddr, compaction: &str) -> String {
    format!(
        r#"apiVersion: cairn.dev/v1beta1
kind: AgentSession
metadata: {{name: {name}, namespace: {ns}}}
spec:
  provider:
    kind: openai-compatible
    model: sim
    baseUrl: "http://{provider}/v1"
    credentials: {{secretName: provider}}
  contextWindow: 100000
  maxOutputTokens: 1000
  systemPrompt: You are a test agent.
  compaction: {compaction}
  template:
    nodeSelector: {{kubernetes.io/hostname: real-node-0}}
"#
    )
}

/// One HTTP/1.0 exchange from the client pod of `ns` with `addr`, the request on stdin:
/// the status (0 when there was no answer) and the body (or what went wrong).
pub fn exchange(
    cp: &ControlPlane,
    ns: &str,
    addr: &str,
    request: (&str, &str),
    token: &str,
    body: Option<&serde_json::Value>,
) -> (u16, String) {
    let (method, path) = request;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let text = format!(
        "{method} {path} HTTP/1.0\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (host, port) = addr.split_once(':').unwrap_or((addr, "80"));
    // nc's stdin stays open until the answer is in (the agent drops a connection whose
    // client half-closed it; busybox nc half-closes at the end of its stdin); once nc has
    // the answer it ends the sleep that held stdin open.
    let script = format!(
        "f=/tmp/x.$$; cat >$f.req; \
         {{ cat $f.req; sleep 60 & echo $! >$f.pid; wait; }} | \
         {{ nc -w 30 {host} {port}; kill $(cat $f.pid) 2>/dev/null; }}; rm -f $f.req $f.pid"
    );
    let out = cp
        .kubectl_with_stdin(
            &["exec", "-i", "client", "-n", ns, "--", "sh", "-c", &script],
            &text,
        )
        .map(|o| {
            (
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        });
    let (stdout, stderr) = match out {
        Ok(o) => o,
        Err(e) => return (0, e.to_string()),
    };
    match stdout.split_once("\r\n\r\n") {
        Some((head, body)) => (
            head.split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            body.to_string(),
        ),
        None => (0, format!("{stdout}{stderr}")),
    }
}

pub fn json_of(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A build log of about 25 KB: one tool output, large enough to be microcompacted.
pub fn build_log() -> String {
    let mut s = String::new();
    for i in 0..600 {
        s.push_str(&format!(
            "[{i:04}] compiling module_{i} ... ok (0.{i:03}s)\n"
        ));
    }
    s.push_str("error[E0308]: mismatched types in module_599\n");
    s
}

/// The archive key of `content`: the first 16 hex digits of its SHA-256.
pub fn ccr_key(content: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(content)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
