//! The gateway as in production, on the real-node tier: `helm install` of `charts/cairn` with
//! `gateway.enabled=true` runs the operator and the gateway as pods on a real kubelet; the
//! AgentSessions run as real agent pods behind their Services, named by the cluster DNS
//! (CoreDNS inside the node). The official OpenAI Python SDK on the host talks to ONE gateway
//! URL (the gateway's Service, reached from the host through the node): two sessions in two
//! namespaces, streamed and not, the denials, and a session with `idle.suspendAfter: 30s`
//! that the operator suspends 30 s after its last request (on the agent's idle report) and
//! the next SDK request wakes, its history rebuilt from the journal (the model is sent the
//! earlier turns).
//!
//! Skips (with the reason) only on a machine that cannot run a node at all: not root, or
//! without the tools `.ci/install.sh` installs.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_sim::{ScriptedReply, Sim};
use cairn_tests::harness::node::{self, RealNode};
use cairn_tests::harness::otelcol::Collector;
use cairn_tests::harness::python::{self, line};
use cairn_tests::harness::{ControlPlane, S3Server, built_paths, helm, repo_root, run_dir, s3};
use serde_json::json;

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "cairn-gateway";
const HMAC_KEY: &[u8] = b"a-test-signing-key-of-32-bytes!!";
/// Where the chart installs the operator and the gateway.
const OPERATOR_NS: &str = "cairn-system";
/// The two sessions' namespaces: alpha (idle after 30 s) in the first, beta in the second.
const NS_A: &str = "gw-team-a";
const NS_B: &str = "gw-team-b";
const NODE: &str = "real-node-0";

/// Prometheus and the OpenTelemetry Collector on what the pods below export.
#[path = "gateway_real_node/observed.rs"]
mod observed;

/// True when this machine cannot run a real node (the test is skipped; under `CI=true` it
/// fails instead).
fn skip() -> bool {
    node::unsupported().is_some_and(|why| {
        cairn_tests::harness::skip_for(&format!("this machine cannot run a real node: {why}"))
    })
}

fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    cp.kubectl_ok(args)
        .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
}

fn jsonpath(cp: &ControlPlane, ns: &str, kind: &str, name: &str, path: &str) -> String {
    cp.kubectl_ok(&[
        "get",
        kind,
        name,
        "-n",
        ns,
        "-o",
        &format!("jsonpath={path}"),
    ])
    .unwrap_or_default()
    .trim()
    .to_string()
}

fn condition(cp: &ControlPlane, ns: &str, session: &str, kind: &str, field: &str) -> String {
    jsonpath(
        cp,
        ns,
        "agentsession",
        session,
        &format!("{{.status.conditions[?(@.type==\"{kind}\")].{field}}}"),
    )
}

fn phase(cp: &ControlPlane, ns: &str, session: &str) -> String {
    jsonpath(cp, ns, "agentsession", session, "{.status.phase}")
}

fn running(cp: &ControlPlane, ns: &str, session: &str) -> bool {
    phase(cp, ns, session) == "Running" && condition(cp, ns, session, "Ready", "status") == "True"
}

fn wait_for(what: &str, timeout: Duration, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !probe() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The Secrets of a session's namespace: the archive credentials the chart's
/// `archive.credentialsSecret` names, and the provider's key.
fn session_secrets(ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: cairn-s3, namespace: {ns}}}\nstringData: {{AWS_ACCESS_KEY_ID: {}, AWS_SECRET_ACCESS_KEY: {}}}\n---\n\
apiVersion: v1\nkind: Secret\nmetadata: {{name: provider, namespace: {ns}}}\nstringData: {{api-key: sk-sim}}\n",
        s3::ACCESS_KEY_ID,
        s3::SECRET_ACCESS_KEY
    )
}

/// An AgentSession whose pod runs on the real node, its provider at `provider`.
fn agent_session(ns: &str, name: &str, provider: SocketAddr, idle: Option<&str>) -> String {
    let idle = idle
        .map(|d| format!("  idle: {{suspendAfter: {d}}}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: cairn.dev/v1beta1
kind: AgentSession
metadata: {{name: {name}, namespace: {ns}}}
spec:
  provider:
    kind: openai-compatible
    model: m-1
    baseUrl: "http://{provider}/v1"
    credentials: {{secretName: provider}}
  contextWindow: 100000
  maxOutputTokens: 1000
  systemPrompt: You are a test agent.
{idle}  template:
    nodeSelector: {{kubernetes.io/hostname: {NODE}}}
"#
    )
}

/// A session whose archive bucket does not exist (a typo): its agent's archive check fails,
/// and the operator's ArchiveReady says so.
fn unarchivable_session(ns: &str, name: &str, provider: SocketAddr) -> String {
    agent_session(ns, name, provider, None).replace(
        "  template:\n",
        "  archive: {bucket: no-such-bucket}\n  template:\n",
    )
}

/// A session whose pod template the API server refuses (a node selector value that is no
/// label value): the operator's reconcile fails on every try.
fn unplaceable_session(ns: &str, name: &str, provider: SocketAddr) -> String {
    agent_session(ns, name, provider, None).replace(
        &format!("kubernetes.io/hostname: {NODE}"),
        "kubernetes.io/hostname: \"not a label value!\"",
    )
}

/// Sets `spec.idle.suspendAfter` of `ns/session`.
fn set_idle(cp: &ControlPlane, ns: &str, session: &str, after: &str) {
    let patch = format!(r#"{{"spec":{{"idle":{{"suspendAfter":"{after}"}}}}}}"#);
    kubectl(
        cp,
        &[
            "patch",
            "agentsession",
            session,
            "-n",
            ns,
            "--type=merge",
            "-p",
            &patch,
        ],
    );
}

fn token_of(cp: &ControlPlane, ns: &str, session: &str) -> String {
    use base64::Engine;
    let b64 = jsonpath(
        cp,
        ns,
        "secret",
        &format!("cairn-{session}-api-token"),
        "{.data.token}",
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64 token");
    String::from_utf8(bytes).expect("UTF-8 token")
}

/// A JWT of the test issuer allowing `namespaces`.
fn jwt(namespaces: &[&str]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("k1".into());
    jsonwebtoken::encode(
        &header,
        &json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "platform", "exp": now + 3600,
                "cairn.dev/namespaces": namespaces}),
        &jsonwebtoken::EncodingKey::from_secret(HMAC_KEY),
    )
    .expect("jwt")
}

fn jwks() -> String {
    use base64::Engine;
    let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(HMAC_KEY);
    json!({"keys": [{"kty": "oct", "kid": "k1", "alg": "HS256", "k": k}]}).to_string()
}

fn run_python(script: &str, env: &[(&str, String)]) -> String {
    python::run(script, env)
}

const PRELUDE: &str = r#"
import os, time
from openai import OpenAI, AuthenticationError, PermissionDeniedError

gw = os.environ["GW"]
def client(ns, session, key):
    return OpenAI(base_url=gw + "/" + ns + "/" + session + "/v1", api_key=key, max_retries=0)

a = client(os.environ["NS_A"], "alpha", os.environ["TOKEN_A"])
b = client(os.environ["NS_B"], "beta", os.environ["TOKEN_B"])
"#;

/// Both sessions through the one gateway URL, streamed and not, then the denials.
const SDK: &str = r#"
r = a.chat.completions.create(model="m-1", messages=[{"role": "user", "content": "alpha question one"}])
print("A1=" + r.choices[0].message.content)
r = b.chat.completions.create(model="m-1", messages=[{"role": "user", "content": "beta question one"}])
print("B1=" + r.choices[0].message.content)
text, chunks = "", 0
for chunk in a.chat.completions.create(model="m-1", stream=True, messages=[
        {"role": "user", "content": "alpha question one"}, {"role": "assistant", "content": "alpha answer one"},
        {"role": "user", "content": "alpha question two"}]):
    chunks += 1
    for c in chunk.choices:
        text += c.delta.content or ""
print("A2=" + text)
print("A2_CHUNKS=" + str(chunks))
text = ""
with b.responses.stream(model="m-1", input="beta question two") as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
print("B2=" + text)

# A JWT allowing the namespace is as good as the session's token.
j = client(os.environ["NS_A"], "alpha", os.environ["JWT_A"])
r = j.responses.create(model="m-1", input="alpha by jwt")
print("AJ=" + r.output_text)

def denied(c):
    try:
        c.chat.completions.create(model="m-1", messages=[{"role": "user", "content": "x"}])
        return "accepted"
    except (AuthenticationError, PermissionDeniedError) as e:
        return str(e.status_code) + " " + e.body.get("code", "")
print("WRONG=" + denied(client(os.environ["NS_A"], "alpha", "not-the-token")))
print("OTHER=" + denied(client(os.environ["NS_A"], "alpha", os.environ["TOKEN_B"])))
print("JWT_NS=" + denied(client(os.environ["NS_B"], "beta", os.environ["JWT_A"])))
"#;

/// The first request after alpha went to sleep: one slower answer, not an error.
const WAKE: &str = r#"
t = time.monotonic()
r = a.responses.create(model="m-1", input="alpha question three")
print("WAKE_MS=" + str(int((time.monotonic() - t) * 1000)))
print("A3=" + r.output_text)
t = time.monotonic()
r = a.responses.create(model="m-1", input="alpha question four")
print("AWAKE_MS=" + str(int((time.monotonic() - t) * 1000)))
print("A4=" + r.output_text)
"#;

/// One more wake-up of alpha: the request that wakes it, timed as the SDK saw it.
fn wake_again(n: usize) -> String {
    format!(
        r#"
t = time.monotonic()
r = a.responses.create(model="m-1", input="alpha wake {n}")
print("WAKE_MS=" + str(int((time.monotonic() - t) * 1000)))
print("ANSWER=" + r.output_text)
"#
    )
}

/// Wake-ups the test times: the first above and this many more.
const WAKES: usize = 5;

/// The most a wake-up may take in the test: three times the slowest wake-up measured on a
/// fresh machine of the project's kind while `make test`'s other lanes ran beside it (10.0 s).
/// What a wake-up takes on a quiet machine (a median of 4 s, the target 5 s) is measured in
/// docs/benchmarks.md, not asserted here: this test proves that an idle session wakes on
/// traffic and keeps its history, on a machine of any speed.
const WAKE_CEILING: Duration = Duration::from_secs(30);

/// Serves the JWKS on the host's loopback (the gateway pod fetches it through the node).
fn serve_jwks(rt: &tokio::runtime::Runtime) -> SocketAddr {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let body = jwks();
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let body = body.clone();
            async move { ([(http::header::CONTENT_TYPE, "application/json")], body) }
        }),
    );
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

fn helm_install(cp: &ControlPlane, dir: &std::path::Path, sets: &[String]) {
    let mut cmd = Command::new(helm().expect("helm installs"));
    cmd.env("KUBECONFIG", &cp.kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .args(["install", "cairn"])
        .arg(repo_root().join("charts/cairn"))
        .args(["--namespace", OPERATOR_NS, "--create-namespace"])
        .args(["--wait", "--timeout", "240s"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm runs");
    assert!(
        out.status.success(),
        "helm install: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cp.kubectl_ok(&["describe", "pods", "-n", OPERATOR_NS])
            .unwrap_or_default()
    );
}

#[test]
fn the_sdk_drives_real_pods_through_one_gateway_and_an_idle_session_wakes_with_its_history() {
    if skip() {
        return;
    }
    let cp = cairn_tests::harness::shared_cluster();
    let dir = run_dir("gw-node").expect("run dir");
    let started = Instant::now();
    let node = RealNode::start(cp, NODE, &dir.join("node")).expect("the real node comes up");
    let _dns = node.start_cluster_dns().expect("the cluster DNS comes up");
    eprintln!("real node and its DNS ready in {:?}", started.elapsed());
    let images = built_paths("build-images.sh").expect("images build");
    for name in ["cairn-agent", "cairn-operator", "cairn-gateway"] {
        node.import_image(&images.get(name).expect("image reported"))
            .expect("image imported");
    }

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sim = rt.block_on(Sim::start()).expect("cairn-sim");
    let provider = node.forward_to_host(sim.addr()).expect("forwarder");
    let jwks_addr = node
        .forward_to_host(serve_jwks(&rt))
        .expect("JWKS forwarder");
    let s3 = S3Server::start(&dir, &["cairn"]).expect("moto");
    let s3_addr = node
        .forward_to_host(SocketAddr::from(([127, 0, 0, 1], s3.port)))
        .expect("S3 forwarder");
    let mut collector = Collector::start(&dir).expect("the OpenTelemetry Collector");
    let otlp = node
        .forward_to_host(collector.addr)
        .expect("OTLP forwarder");
    for ns in [NS_A, NS_B] {
        let _ = cp.kubectl(&["create", "namespace", ns]);
        cp.apply_yaml(&session_secrets(ns)).expect("secrets");
    }

    let installed = Instant::now();
    let on_node = format!("kubernetes\\.io/hostname={NODE}");
    let sets = [
        format!("nodeSelector.{on_node}"),
        format!("watchNamespaces={{{NS_A},{NS_B}}}"),
        format!("archive.endpoint=http://{s3_addr}"),
        "archive.bucket=cairn".into(),
        "archive.credentialsSecret=cairn-s3".into(),
        "logFormat=text".into(),
        "gateway.enabled=true".into(),
        "gateway.replicaCount=1".into(),
        format!("gateway.nodeSelector.{on_node}"),
        format!("gateway.oidc.issuer={ISSUER}"),
        format!("gateway.oidc.jwks=http://{jwks_addr}/jwks.json"),
        format!("gateway.oidc.audience={AUDIENCE}"),
        // A JWT caller of alpha is forwarded with alpha's token, read from its Secret:
        // the gateway may read Secrets in NS_A only (a Role), nowhere else.
        format!("gateway.oidc.tokenSecretNamespaces={{{NS_A}}}"),
        // Every agent exports its spans to the collector; the model has a price.
        format!("agent.otlp.endpoint=http://{otlp}"),
        "agent.prices.m-1.input=1".into(),
        "agent.prices.m-1.output=4".into(),
        "agent.prices.m-1.cacheRead=0".into(),
        "agent.prices.m-1.cacheWrite=2".into(),
    ];
    helm_install(cp, &dir, &sets);
    eprintln!(
        "helm install: operator and gateway Ready in {:?}",
        installed.elapsed()
    );
    // The gateway with OIDC on reads no Secret cluster-wide and impersonates no one, as the
    // API server's authorizer answers for its ServiceAccount.
    let gateway_sa = format!("system:serviceaccount:{OPERATOR_NS}:cairn-gateway");
    for (args, allowed) in [
        (&["get", "secrets", "-A"][..], false),
        (&["impersonate", "users"][..], false),
        (&["impersonate", "groups"][..], false),
        (&["get", "secrets", "-n", NS_B][..], false),
        (&["get", "secrets", "-n", NS_A][..], true),
        (
            &["create", "subjectaccessreviews.authorization.k8s.io"][..],
            true,
        ),
    ] {
        let mut all = vec!["auth", "can-i"];
        all.extend(args);
        all.extend(["--as", gateway_sa.as_str()]);
        let out = cp.kubectl(&all).expect("kubectl runs");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(
            answer,
            if allowed { "yes" } else { "no" },
            "kubectl {all:?}"
        );
    }

    cp.apply_yaml(&format!(
        "{}---\n{}",
        agent_session(NS_A, "alpha", provider, Some("30s")),
        agent_session(NS_B, "beta", provider, None)
    ))
    .expect("sessions applied");
    let created = Instant::now();
    for (ns, s) in [(NS_A, "alpha"), (NS_B, "beta")] {
        let deadline = Instant::now() + Duration::from_secs(180);
        while !running(cp, ns, s) {
            assert!(
                Instant::now() < deadline,
                "session {ns}/{s} is not Running after 180 s:\n{}\n{}",
                cp.kubectl_ok(&["get", "agentsession", s, "-n", ns, "-o", "yaml"])
                    .unwrap_or_default(),
                cp.kubectl_ok(&["describe", "pods", "-n", ns])
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    eprintln!("both sessions Running in {:?}", created.elapsed());
    assert_eq!(
        jsonpath(cp, NS_A, "agentsession", "alpha", "{.status.serviceUrl}"),
        format!("http://cairn-alpha.cairn-sessions.{NS_A}.svc:8080"),
        "the gateway reaches the session by its Service's name"
    );

    // The one gateway URL: the gateway's Service, dialled from inside the node.
    let ip = jsonpath(
        cp,
        OPERATOR_NS,
        "service",
        "cairn-gateway",
        "{.spec.clusterIP}",
    );
    let gw_addr = node
        .forward_from_host(format!("{ip}:8080").parse().expect("ClusterIP"))
        .expect("gateway forwarder");
    let gw = format!("http://{gw_addr}");
    wait_for(
        "the gateway's Service to route",
        Duration::from_secs(60),
        || {
            rt.block_on(reqwest::get(format!("{gw}/readyz")))
                .is_ok_and(|r| r.status() == 200)
        },
    );

    let env = vec![
        ("GW", gw.clone()),
        ("NS_A", NS_A.to_string()),
        ("NS_B", NS_B.to_string()),
        ("TOKEN_A", token_of(cp, NS_A, "alpha")),
        ("TOKEN_B", token_of(cp, NS_B, "beta")),
        ("JWT_A", jwt(&[NS_A])),
    ];
    for reply in [
        "alpha answer one",
        "beta answer one",
        "alpha answer two",
        "beta answer two",
        "alpha by jwt answer",
    ] {
        sim.push_reply(ScriptedReply::text(reply));
    }
    let out = run_python(&format!("{PRELUDE}{SDK}"), &env);
    let last_request = Instant::now();
    eprintln!("{out}");
    assert_eq!(line(&out, "A1"), "alpha answer one");
    assert_eq!(line(&out, "B1"), "beta answer one");
    assert_eq!(line(&out, "A2"), "alpha answer two");
    assert!(
        line(&out, "A2_CHUNKS").parse::<u32>().expect("count") > 1,
        "streamed in chunks: {out}"
    );
    assert_eq!(line(&out, "B2"), "beta answer two");
    assert_eq!(line(&out, "AJ"), "alpha by jwt answer");
    assert_eq!(line(&out, "WRONG"), "401 invalid_token");
    assert_eq!(line(&out, "OTHER"), "401 invalid_token");
    assert_eq!(line(&out, "JWT_NS"), "403 namespace_forbidden");

    // Nobody uses alpha: after 30 s the operator stops its pod (journal and archive stay).
    let mut slept = Duration::ZERO;
    wait_for(
        "alpha to be idle-suspended",
        Duration::from_secs(120),
        || {
            let asleep = phase(cp, NS_A, "alpha") == "Suspended"
                && condition(cp, NS_A, "alpha", "Idle", "status") == "True";
            slept = last_request.elapsed();
            asleep
        },
    );
    eprintln!("alpha idle-suspended {slept:?} after its last request");
    // The agent reports the session idle 30 s after its last turn ended and the operator
    // suspends it on that report: never before 30 s idle (the clock here starts once the
    // script, whose last requests were denied at the gateway, has exited: a little after
    // alpha's last turn), and not a status interval later, only the watch and the reconcile
    // (and this loop's polling).
    assert!(
        slept >= Duration::from_secs(29),
        "suspended only {slept:?} after the last request"
    );
    assert!(
        slept <= Duration::from_secs(30 + 15),
        "suspended {slept:?} after the last request"
    );
    assert_eq!(
        condition(cp, NS_A, "alpha", "Idle", "reason"),
        "IdleTimeout"
    );
    let message = condition(cp, NS_A, "alpha", "Idle", "message");
    assert!(
        message.contains("the agent reported no client activity since"),
        "suspended on the agent's idle report: {message}"
    );
    let since = jsonpath(
        cp,
        NS_A,
        "agentsession",
        "alpha",
        "{.status.session.idleSince}",
    );
    assert!(
        !since.is_empty(),
        "the agent's idle report is in the status"
    );
    assert_eq!(
        since,
        jsonpath(
            cp,
            NS_A,
            "agentsession",
            "alpha",
            "{.status.session.lastActivity}"
        ),
        "idle since its last activity"
    );
    assert_ne!(
        jsonpath(cp, NS_A, "agentsession", "alpha", "{.spec.suspend}"),
        "true",
        "the operator leaves spec.suspend alone"
    );
    wait_for("alpha's pod to be gone", Duration::from_secs(60), || {
        cp.kubectl_ok(&["get", "pods", "-n", NS_A, "-o", "name"])
            .is_ok_and(|o| o.trim().is_empty())
    });
    assert!(running(cp, NS_B, "beta"), "beta has no idle rule: it runs");

    // The next SDK request wakes it through the gateway: held, then answered.
    sim.push_reply(ScriptedReply::text("alpha answer three"));
    sim.push_reply(ScriptedReply::text("alpha answer four"));
    let before = sim.requests().len();
    let woke = Instant::now();
    let out = run_python(&format!("{PRELUDE}{WAKE}"), &env);
    eprintln!("{out}");
    eprintln!(
        "wake-up through the gateway, as the test saw it: {:?}",
        woke.elapsed()
    );
    assert_eq!(line(&out, "A3"), "alpha answer three");
    assert_eq!(line(&out, "A4"), "alpha answer four");
    let wake_ms: u64 = line(&out, "WAKE_MS").parse().expect("ms");
    let awake_ms: u64 = line(&out, "AWAKE_MS").parse().expect("ms");
    eprintln!("WAKE-UP: {wake_ms} ms request sent -> response (next request {awake_ms} ms)");
    assert!(
        wake_ms > awake_ms,
        "the woken request was held while the pod started"
    );
    // History intact: the model was sent alpha's turns from before the sleep.
    let requests = sim.requests();
    let woken = requests
        .iter()
        .skip(before)
        .find(|r| r.contains("alpha question three"))
        .unwrap_or_else(|| panic!("the provider never got the woken turn: {requests:?}"));
    for earlier in [
        "alpha question one",
        "alpha answer one",
        "alpha question two",
        "alpha answer two",
        "alpha by jwt answer",
    ] {
        assert!(
            woken.contains(earlier),
            "the woken session remembers {earlier:?}: {}",
            woken.body
        );
    }
    assert!(
        !woken.contains("beta question one"),
        "and nothing of the other session"
    );
    assert_eq!(phase(cp, NS_A, "alpha"), "Running");
    assert_eq!(condition(cp, NS_A, "alpha", "Idle", "status"), "False");
    assert_eq!(condition(cp, NS_A, "alpha", "Idle", "reason"), "Woken");
    let wake_at = jsonpath(
        cp,
        NS_A,
        "agentsession",
        "alpha",
        "{.metadata.annotations.cairn\\.dev/wake-requested-at}",
    );
    assert!(!wake_at.is_empty(), "the gateway asked by annotation");
    let events = kubectl(
        cp,
        &[
            "get",
            "events",
            "-n",
            NS_A,
            "--field-selector",
            "involvedObject.name=alpha",
            "-o",
            "jsonpath={.items[*].reason}",
        ],
    );
    eprintln!("alpha's events: {events}");

    // More wake-ups, each after alpha fell asleep again (a shorter idle rule from here on):
    // each held request answered, the history intact, each within the ceiling; the median
    // is printed.
    set_idle(cp, NS_A, "alpha", "5s");
    let mut wakes = vec![Duration::from_millis(wake_ms)];
    let mut said = vec![
        "alpha question one",
        "alpha question three",
        "alpha answer four",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    for n in 2..=WAKES {
        wait_for(
            "alpha to be idle-suspended again",
            Duration::from_secs(120),
            || {
                phase(cp, NS_A, "alpha") == "Suspended"
                    && cp
                        .kubectl_ok(&["get", "pods", "-n", NS_A, "-o", "name"])
                        .is_ok_and(|o| o.trim().is_empty())
            },
        );
        let answer = format!("alpha answer after wake {n}");
        sim.push_reply(ScriptedReply::text(&answer));
        let before = sim.requests().len();
        let out = run_python(&format!("{PRELUDE}{}", wake_again(n)), &env);
        assert_eq!(line(&out, "ANSWER"), answer, "{out}");
        let took = Duration::from_millis(line(&out, "WAKE_MS").parse().expect("ms"));
        eprintln!("WAKE-UP {n}: {took:?}");
        let question = format!("alpha wake {n}");
        let requests = sim.requests();
        let woken = requests
            .iter()
            .skip(before)
            .find(|r| r.contains(&question))
            .unwrap_or_else(|| panic!("the provider never got {question:?}: {requests:?}"));
        for earlier in &said {
            assert!(
                woken.contains(earlier),
                "wake-up {n}: the session remembers {earlier:?}: {}",
                woken.body
            );
        }
        said.extend([question, answer]);
        wakes.push(took);
    }
    let mut sorted = wakes.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    eprintln!("WAKE-UPS: {wakes:?}, median {median:?}");
    for (n, took) in wakes.iter().enumerate() {
        assert!(
            *took <= WAKE_CEILING,
            "wake-up {} took {took:?} (at most {WAKE_CEILING:?}): {wakes:?}",
            n + 1
        );
    }

    // Nothing the operator asked for was refused: it checks before watching what the chart
    // does not grant (Secrets outside `secretWatchNamespaces`).
    let log = kubectl(
        cp,
        &["logs", "-n", OPERATOR_NS, "deploy/cairn", "-c", "operator"],
    );
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).collect();
    assert!(
        refused.is_empty(),
        "the operator was refused {} times: {:?}",
        refused.len(),
        refused.first()
    );

    // What a platform team sees: beta recovers, alpha's window overflows and it compacts, a
    // session's archive does not answer, another's reconciles fail, and Prometheus and the
    // collector show it all.
    let token_b = token_of(cp, NS_B, "beta");
    observed::recover(&rt, &sim, &gw, (NS_B, "beta"), &token_b);
    // Alpha stays awake from here on: the next request wakes it for good.
    set_idle(cp, NS_A, "alpha", "1h");
    observed::overflow_window(
        &rt,
        &sim,
        &gw,
        (NS_A, "alpha"),
        &token_of(cp, NS_A, "alpha"),
    );
    cp.apply_yaml(&format!(
        "{}---\n{}",
        unarchivable_session(NS_B, "gamma", provider),
        unplaceable_session(NS_B, "delta", provider)
    ))
    .expect("gamma and delta applied");
    let deadline = Instant::now() + Duration::from_secs(120);
    while condition(cp, NS_B, "gamma", "ArchiveReady", "status") != "False" {
        assert!(
            Instant::now() < deadline,
            "gamma's ArchiveReady is not False after 120 s:\n{}",
            cp.kubectl_ok(&["get", "agentsession", "gamma", "-n", NS_B, "-o", "yaml"])
                .unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    wait_for("delta's failed reconciles", Duration::from_secs(60), || {
        cp.kubectl_ok(&[
            "get",
            "events",
            "-n",
            NS_B,
            "--field-selector",
            "involvedObject.name=delta,type=Warning",
            "-o",
            "name",
        ])
        .is_ok_and(|o| !o.trim().is_empty())
    });
    observed::prometheus_sees_every_panel_and_alert(cp, &node, &dir, &sets, (NS_B, "beta"));
    observed::the_collector_has_genai_spans(&mut collector);

    for ns in [NS_A, NS_B] {
        let _ = cp.kubectl(&["delete", "agentsession", "--all", "-n", ns, "--wait=false"]);
    }
    drop(s3);
}
