//! The gateway against the harness control plane (kwok tier): AgentSessions and token Secrets
//! live in the API server, the gateway watches them through its reflector, and forwards to
//! real `cairn-agent serve` processes (cairn-sim as their provider). The tests write what the
//! operator would write (the session's status: phase, `Ready`, `Idle`, `serviceUrl` pointing
//! at the agent process), so forwarding, authentication, the lifecycle API and the wake
//! bookkeeping are exercised against the real API server, without pods.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cairn_crds::AgentSession;
use cairn_gateway::auth::Oidc;
use cairn_gateway::config::{IdentityClaims, JwksSource, OidcSettings, Settings};
use cairn_gateway::directory::{Directory, KubeDirectory, WAKE_ANNOTATION};
use cairn_gateway::server::Gateway;
use cairn_sim::{ScriptedReply, Sim};
use cairn_tests::harness::python::{self, line};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "cairn-gateway";
const HMAC_KEY: &[u8] = b"a-test-signing-key-of-32-bytes!!";

/// The harness cluster's admin configuration (the CRDs applied once).
async fn config() -> kube::Config {
    let cp = cairn_tests::harness::shared_cluster();
    static CRDS: std::sync::Once = std::sync::Once::new();
    CRDS.call_once(|| {
        cp.install_crds().expect("CRDs install");
    });
    let kubeconfig = kube::config::Kubeconfig::read_from(&cp.kubeconfig).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig is usable")
}

async fn client() -> Client {
    Client::try_from(config().await).expect("client")
}

fn suffix() -> String {
    format!("{:08x}", fastrand::u32(..))
}

async fn namespace(client: &Client, name: &str) -> String {
    let ns = format!("gw-{name}-{}", suffix());
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
    )
    .await
    .expect("create namespace");
    let sessions: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
    for _ in 0..120 {
        if sessions.list(&Default::default()).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ns
}

/// Creates the session, its token Secret and (as the operator would) its status.
async fn session(client: &Client, ns: &str, name: &str, token: &str, suspend: bool) {
    let api: Api<AgentSession> = Api::namespaced(client.clone(), ns);
    let s: AgentSession = serde_json::from_value(json!({
        "apiVersion": "cairn.dev/v1beta1", "kind": "AgentSession",
        "metadata": {"name": name},
        "spec": {"provider": {"kind": "openai", "model": "m-1"}, "suspend": suspend},
    }))
    .expect("session");
    api.create(&PostParams::default(), &s)
        .await
        .expect("create session");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("cairn-{name}-api-token")},
        "stringData": {"token": token},
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    // The token's digest, as the operator publishes it: what the gateway checks a session
    // token against (it reads the Secret only for a JWT caller).
    set_status(
        client,
        ns,
        name,
        json!({"apiTokenHash": cairn_crds::session::api_token_hash(ns, name, token)}),
    )
    .await;
}

fn condition(kind: &str, status: &str, reason: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": reason,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Writes the status the operator writes for a session whose pod answers at `url`.
async fn set_running(client: &Client, ns: &str, name: &str, url: &str) {
    set_status(client, ns, name, json!({
        "phase": "Running", "serviceUrl": url,
        "conditions": [condition("Ready", "True", "PodReady"), condition("Idle", "False", "Woken")],
    }))
    .await;
}

async fn set_status(client: &Client, ns: &str, name: &str, status: Value) {
    let api: Api<AgentSession> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await
    .expect("patch status");
}

/// The real agent binary, serving one session with its own token.
struct Agent {
    child: Child,
    url: String,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

fn agent(dir: &Path, name: &str, token: &str, sim: &Sim) -> Agent {
    let bin = bin_dir().join("cairn-agent");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build -p cairn-agent first",
        bin.display()
    );
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "name: {name}\nnamespace: tests\nprovider:\n  kind: openai-compatible\n  model: m-1\n  baseUrl: {}/v1\ncontextWindow: 200000\nmaxOutputTokens: 1000\nsystemPrompt: You are a test agent.\n",
            sim.url()
        ),
    )
    .expect("config");
    let data = dir.join(name);
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CAIRN_API_TOKEN", token)
        .env("OPENAI_API_KEY", "sk-sim")
        .env("RUST_LOG", "info")
        .env("XDG_DATA_HOME", &data)
        .env("CAIRN_CACHE_DIR", data.join("cache"))
        .env("HOME", &data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
        .spawn()
        .expect("spawn cairn-agent");
    let mut agent = Agent {
        child,
        url: String::new(),
    };
    for _ in 0..1200 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // Whole lines only: the line may be read half written (stderr is unbuffered).
        if let Some(addr) = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .find_map(|l| l.strip_prefix("cairn-agent listening on "))
        {
            agent.url = format!("http://{}", addr.trim());
            return agent;
        }
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("cairn-agent exited with {status}: {text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "cairn-agent did not start: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

fn jwks_file(dir: &Path) -> PathBuf {
    use base64::Engine;
    let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(HMAC_KEY);
    let path = dir.join("jwks.json");
    std::fs::write(
        &path,
        json!({"keys": [{"kty": "oct", "kid": "k1", "alg": "HS256", "k": k}]}).to_string(),
    )
    .expect("jwks");
    path
}

/// A JWT of the test issuer allowing `namespaces`, for the user `platform`.
fn jwt(namespaces: &[&str], key: &[u8], exp_in: i64) -> String {
    jwt_of(
        json!({"sub": "platform", "cairn.dev/namespaces": namespaces}),
        key,
        exp_in,
    )
}

/// A JWT of the test issuer with `claims` (issuer, audience and expiry added).
fn jwt_of(mut claims: Value, key: &[u8], exp_in: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("k1".into());
    if let Some(c) = claims.as_object_mut() {
        c.insert("iss".into(), json!(ISSUER));
        c.insert("aud".into(), json!(AUDIENCE));
        c.insert("exp".into(), json!(now + exp_in));
    }
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(key),
    )
    .expect("jwt")
}

/// Lets `subject` (`User` or `Group`, name) use `verbs` on AgentSessions in `ns`: a Role and
/// its RoleBinding, as a cluster admin would write them.
async fn grant(client: &Client, ns: &str, subject: (&str, &str), verbs: &[&str]) {
    let name = format!("sessions-{}", subject.1.replace([':', '@'], "-"));
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(client.clone(), ns);
    let role = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": ["cairn.dev"], "resources": ["agentsessions"], "verbs": verbs}],
    }))
    .expect("role");
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(client.clone(), ns);
    let binding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": subject.0, "name": subject.1}],
    }))
    .expect("binding");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
}

/// A gateway on free local ports, watching the cluster; gives its API base URL.
async fn gateway(
    client: &Client,
    dir: &Path,
    settings: Settings,
    with_oidc: bool,
) -> (String, String) {
    let oidc = if with_oidc {
        Some(
            Oidc::load(OidcSettings {
                issuer: ISSUER.into(),
                jwks: JwksSource::File(jwks_file(dir)),
                audience: Some(AUDIENCE.into()),
                namespace_claim: "cairn.dev/namespaces".into(),
                namespace_prefix: String::new(),
                identity: IdentityClaims::default(),
            })
            .await
            .expect("oidc"),
        )
    } else {
        None
    };
    let directory: Arc<dyn Directory> = KubeDirectory::start(client.clone(), None);
    // The gateway's own credential is the cluster admin's: whatever it may do, each lifecycle
    // call is authorized for the caller (a SubjectAccessReview) before it is made.
    let gw = Gateway::new(directory, settings, oidc, Some(config().await)).expect("gateway");
    let api = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let (base, mbase) = (
        format!("http://{}", api.local_addr().expect("addr")),
        format!("http://{}", metrics.local_addr().expect("addr")),
    );
    tokio::spawn(cairn_gateway::run::serve(
        gw,
        api,
        metrics,
        std::future::pending(),
    ));
    // Ready once the reflector has its list.
    for _ in 0..200 {
        if let Ok(r) = reqwest::get(format!("{mbase}/readyz")).await
            && r.status() == 200
        {
            return (base, mbase);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the gateway never became ready");
}

/// Waits until the gateway's reflector shows what the test wrote (a request may race it).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

async fn run_python(script: &'static str, env: Vec<(&'static str, String)>) -> String {
    tokio::task::spawn_blocking(move || python::run(script, &env))
        .await
        .expect("join")
}

const SDK: &str = r#"
import os
from openai import OpenAI, AuthenticationError, PermissionDeniedError

gw = os.environ["GW"]
def client(session, key):
    return OpenAI(base_url=gw + "/" + os.environ["NS"] + "/" + session + "/v1", api_key=key, max_retries=0)

a = client("alpha", os.environ["TOKEN_A"])
b = client("beta", os.environ["TOKEN_B"])
r = a.chat.completions.create(model="m-1", messages=[{"role": "user", "content": "alpha question one"}])
print("A1=" + r.choices[0].message.content)
r = b.chat.completions.create(model="m-1", messages=[{"role": "user", "content": "beta question one"}])
print("B1=" + r.choices[0].message.content)
text = ""
chunks = 0
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
j = client("beta", os.environ["JWT_OK"])
r = j.responses.create(model="m-1", input="beta by jwt")
print("BJ=" + r.output_text)

def denied(c):
    try:
        c.chat.completions.create(model="m-1", messages=[{"role": "user", "content": "x"}])
        return "accepted"
    except (AuthenticationError, PermissionDeniedError) as e:
        return str(e.status_code) + " " + e.body.get("code", "") + " " + e.body.get("type", "")
print("WRONG=" + denied(client("alpha", "not-the-token")))
print("OTHER=" + denied(client("alpha", os.environ["TOKEN_B"])))
print("JWT_NS=" + denied(client("alpha", os.environ["JWT_OTHER_NS"])))
print("JWT_BAD=" + denied(client("alpha", os.environ["JWT_BAD_KEY"])))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_drives_two_sessions_through_one_gateway_url_and_denials_are_clear() {
    let client = client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = namespace(&client, "sdk").await;
    let sim = Sim::start().await.expect("sim");
    let (ta, tb) = ("token-of-alpha-0001", "token-of-beta-0002");
    let a = agent(dir.path(), "alpha", ta, &sim);
    let b = agent(dir.path(), "beta", tb, &sim);
    session(&client, &ns, "alpha", ta, false).await;
    session(&client, &ns, "beta", tb, false).await;
    set_running(&client, &ns, "alpha", &a.url).await;
    set_running(&client, &ns, "beta", &b.url).await;
    let (gw, metrics) = gateway(&client, dir.path(), Settings::default(), true).await;
    settle().await;

    for reply in [
        "alpha answer one",
        "beta answer one",
        "alpha answer two",
        "beta answer two",
        "beta by jwt answer",
    ] {
        sim.push_reply(ScriptedReply::text(reply));
    }
    let out = run_python(
        SDK,
        vec![
            ("GW", gw.clone()),
            ("NS", ns.clone()),
            ("TOKEN_A", ta.into()),
            ("TOKEN_B", tb.into()),
            ("JWT_OK", jwt(&[&ns], HMAC_KEY, 300)),
            (
                "JWT_OTHER_NS",
                jwt(&["some-other-namespace"], HMAC_KEY, 300),
            ),
            (
                "JWT_BAD_KEY",
                jwt(&[&ns], b"another-key-another-key-another!", 300),
            ),
        ],
    )
    .await;
    assert_eq!(line(&out, "A1"), "alpha answer one");
    assert_eq!(line(&out, "B1"), "beta answer one");
    assert_eq!(line(&out, "A2"), "alpha answer two");
    assert!(
        line(&out, "A2_CHUNKS").parse::<u32>().expect("count") > 1,
        "streamed in chunks: {out}"
    );
    assert_eq!(line(&out, "B2"), "beta answer two");
    assert_eq!(line(&out, "BJ"), "beta by jwt answer");
    assert_eq!(
        line(&out, "WRONG"),
        "401 invalid_token authentication_error"
    );
    assert_eq!(
        line(&out, "OTHER"),
        "401 invalid_token authentication_error"
    );
    assert_eq!(
        line(&out, "JWT_NS"),
        "403 namespace_forbidden permission_error"
    );
    assert_eq!(
        line(&out, "JWT_BAD"),
        "401 invalid_token authentication_error"
    );

    // Each session saw its own conversation only: alpha's second turn carries alpha's first,
    // never beta's.
    let reqs = sim.requests();
    assert_eq!(reqs.len(), 5, "one model call per accepted request");
    let alpha_two = reqs
        .iter()
        .find(|r| r.contains("alpha question two"))
        .expect("alpha's second turn");
    assert!(
        alpha_two.contains("alpha question one") && !alpha_two.contains("beta"),
        "{alpha_two:?}"
    );
    let beta_two = reqs
        .iter()
        .find(|r| r.contains("beta question two"))
        .expect("beta's second turn");
    assert!(
        beta_two.contains("beta question one") && !beta_two.contains("alpha"),
        "{beta_two:?}"
    );

    // The denials are counted by reason; no token appears in the metrics.
    let m = reqwest::get(format!("{metrics}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        m.contains(r#"cairn_gateway_denials_total{reason="invalid_token"} 3"#),
        "{m}"
    );
    assert!(
        m.contains(r#"cairn_gateway_denials_total{reason="namespace_forbidden"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"cairn_gateway_requests_total{route="chat_completions",code="200"} 3"#),
        "{m}"
    );
    assert!(
        m.contains(r#"cairn_gateway_requests_total{route="responses",code="200"} 2"#),
        "{m}"
    );
    assert!(!m.contains(ta) && !m.contains(tb));

    // Without a bearer, for an unknown session, and past the size limit.
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{gw}/{ns}/alpha/v1/chat/completions"))
        .json(&json!({}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "missing_token", "{body}");
    let r = http
        .post(format!("{gw}/{ns}/gamma/v1/chat/completions"))
        .bearer_auth(jwt(&[&ns], HMAC_KEY, 300))
        .json(&json!({}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 404);
    let r = http
        .get(format!("{gw}/{ns}/alpha/v1/session"))
        .bearer_auth(ta)
        .send()
        .await
        .expect("send");
    assert_eq!(
        r.status(),
        200,
        "the agent's session endpoints pass through"
    );
    let expired = jwt(&[&ns], HMAC_KEY, -120);
    let r = http
        .get(format!("{gw}/{ns}/alpha/v1/session"))
        .bearer_auth(expired)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("expired"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_an_idle_session_wakes_it_and_a_manually_suspended_one_is_refused() {
    let client = client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = namespace(&client, "wake").await;
    let sim = Sim::start().await.expect("sim");
    let token = "token-of-sleepy-0003";
    let a = agent(dir.path(), "sleepy", token, &sim);
    session(&client, &ns, "sleepy", token, false).await;
    session(&client, &ns, "stopped", "token-of-stopped-0004", true).await;
    session(&client, &ns, "never", "token-of-never-0005", false).await;
    let idle = json!({"phase": "Suspended", "conditions": [
        condition("Ready", "False", "Suspended"), condition("Idle", "True", "IdleTimeout")]});
    set_status(&client, &ns, "sleepy", idle.clone()).await;
    set_status(&client, &ns, "never", idle).await;
    set_status(
        &client,
        &ns,
        "stopped",
        json!({"phase": "Suspended", "conditions": [condition("Ready", "False", "Suspended")]}),
    )
    .await;
    let settings = Settings {
        wake_timeout: Duration::from_secs(4),
        ..Settings::default()
    };
    let (gw, metrics) = gateway(&client, dir.path(), settings, false).await;
    settle().await;
    sim.push_reply(ScriptedReply::text("good morning"));

    let http = reqwest::Client::new();
    let held = {
        let (http, url) = (
            http.clone(),
            format!("{gw}/{ns}/sleepy/v1/chat/completions"),
        );
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = http
                .post(url)
                .bearer_auth(token)
                .json(
                    &json!({"model": "m-1", "messages": [{"role": "user", "content": "wake up"}]}),
                )
                .send()
                .await
                .expect("send");
            (
                r.status().as_u16(),
                r.json::<Value>().await.expect("json"),
                started.elapsed(),
            )
        })
    };
    // The gateway asks for the wake by annotation; the test plays the operator.
    let api: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
    let mut requested = None;
    for _ in 0..100 {
        let s = api.get("sleepy").await.expect("get");
        if let Some(at) = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(WAKE_ANNOTATION))
        {
            requested = Some(at.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at = requested.expect("the gateway annotated the session");
    let parsed: k8s_openapi::jiff::Timestamp = at.parse().expect("RFC 3339");
    assert!(at.ends_with('Z'), "UTC: {at}");
    assert!(
        (k8s_openapi::jiff::Timestamp::now() - parsed)
            .get_seconds()
            .abs()
            < 30,
        "{at}"
    );
    assert!(
        !held.is_finished(),
        "the request is held while the session sleeps"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    set_running(&client, &ns, "sleepy", &a.url).await;
    let (status, body, waited) = held.await.expect("join");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"], "good morning",
        "{body}"
    );
    assert!(waited >= Duration::from_millis(700), "{waited:?}");

    // Manual suspend: refused at once, never patched.
    let r = http
        .post(format!("{gw}/{ns}/stopped/v1/chat/completions"))
        .bearer_auth("token-of-stopped-0004")
        .json(&json!({"model": "m-1", "messages": []}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "session_suspended", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let stopped = api.get("stopped").await.expect("get");
    assert!(
        !stopped
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(WAKE_ANNOTATION)
    );

    // A session that never wakes: 503 wake_timeout after the bounded wait.
    let r = http
        .post(format!("{gw}/{ns}/never/v1/chat/completions"))
        .bearer_auth("token-of-never-0005")
        .json(&json!({"model": "m-1", "messages": []}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "wake_timeout", "{body}");

    let m = reqwest::get(format!("{metrics}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        m.contains(r#"cairn_gateway_wakeups_total{outcome="requested"} 2"#),
        "{m}"
    );
    assert!(
        m.contains(r#"cairn_gateway_wakeups_total{outcome="ready"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"cairn_gateway_wakeups_total{outcome="timeout"} 1"#),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lifecycle_api_writes_agent_sessions_in_the_namespaces_a_jwt_allows() {
    let client = client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = namespace(&client, "life").await;
    // The JWT's user may manage sessions in the namespace (the lifecycle API acts as it).
    grant(
        &client,
        &ns,
        ("User", "platform"),
        &["get", "list", "create", "delete"],
    )
    .await;
    let (gw, _) = gateway(&client, dir.path(), Settings::default(), true).await;
    let http = reqwest::Client::new();
    let ok = jwt(&[&ns], HMAC_KEY, 300);

    let spec = json!({"name": "made", "spec": {"provider": {"kind": "openai", "model": "m-1"}}});
    let r = http
        .post(format!("{gw}/{ns}/sessions"))
        .bearer_auth(&ok)
        .json(&spec)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.expect("json");
    assert_eq!(made["metadata"]["namespace"], ns.as_str());
    // The API server has it: it is the source of truth.
    let api: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        api.get("made").await.expect("get").spec.provider.model,
        "m-1"
    );

    let r = http
        .post(format!("{gw}/{ns}/sessions"))
        .bearer_auth(&ok)
        .json(&spec)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 409);
    let bad =
        json!({"name": "broken", "spec": {"provider": {"kind": "no-such-kind", "model": "m"}}});
    let r = http
        .post(format!("{gw}/{ns}/sessions"))
        .bearer_auth(&ok)
        .json(&bad)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400);
    let r = http
        .get(format!("{gw}/{ns}/sessions"))
        .bearer_auth(&ok)
        .send()
        .await
        .expect("send");
    let list: Value = r.json().await.expect("json");
    let names: Vec<&str> = list["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["made"]);
    let r = http
        .get(format!("{gw}/{ns}/sessions/made"))
        .bearer_auth(&ok)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);

    // Another namespace, a session token instead of a JWT, no bearer.
    let r = http
        .get(format!("{gw}/{ns}/sessions"))
        .bearer_auth(jwt(&["elsewhere"], HMAC_KEY, 300))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 403);
    let r = http
        .get(format!("{gw}/{ns}/sessions"))
        .bearer_auth("a-session-token")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 401);
    let r = http
        .get(format!("{gw}/{ns}/sessions"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 401);

    let r = http
        .delete(format!("{gw}/{ns}/sessions/made"))
        .bearer_auth(&ok)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let mut gone = false;
    for _ in 0..40 {
        if api.get_opt("made").await.expect("get").is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(gone, "deleted in the API server");
    let r = http
        .get(format!("{gw}/{ns}/sessions/made"))
        .bearer_auth(&ok)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 404);

    // Without an issuer the lifecycle API is off.
    let (plain, _) = gateway(&client, dir.path(), Settings::default(), false).await;
    let r = http
        .get(format!("{plain}/{ns}/sessions"))
        .bearer_auth(&ok)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "lifecycle_disabled", "{body}");
}

/// What a lifecycle call answered: the status and the error code (empty on success).
async fn call(r: reqwest::RequestBuilder) -> (u16, String, String) {
    let r = r.send().await.expect("send");
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().unwrap_or("").to_string();
    let message = body["error"]["message"].as_str().unwrap_or("").to_string();
    (status, code, message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_rbac_decides_each_lifecycle_call_for_the_caller() {
    let client = client().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (mine, theirs) = (
        namespace(&client, "rbac-a").await,
        namespace(&client, "rbac-b").await,
    );
    // alice manages sessions in her namespace; the group team-b may only read the other.
    // The gateway's own credential could do anything anywhere.
    grant(
        &client,
        &mine,
        ("User", "alice"),
        &["get", "list", "create", "delete"],
    )
    .await;
    grant(&client, &theirs, ("Group", "team-b"), &["get", "list"]).await;
    let existing: AgentSession = serde_json::from_value(json!({
        "apiVersion": "cairn.dev/v1beta1", "kind": "AgentSession",
        "metadata": {"name": "existing"},
        "spec": {"provider": {"kind": "openai", "model": "m-1"}},
    }))
    .expect("session");
    let admin: Api<AgentSession> = Api::namespaced(client.clone(), &theirs);
    admin
        .create(&PostParams::default(), &existing)
        .await
        .expect("create");
    let (gw, _) = gateway(&client, dir.path(), Settings::default(), true).await;
    let http = reqwest::Client::new();
    // Both JWTs allow both namespaces: only RBAC tells them apart.
    let both = [mine.as_str(), theirs.as_str()];
    let alice = jwt_of(
        json!({"sub": "alice", "cairn.dev/namespaces": both}),
        HMAC_KEY,
        300,
    );
    let bob = jwt_of(
        json!({"sub": "bob", "groups": ["team-b"], "cairn.dev/namespaces": both}),
        HMAC_KEY,
        300,
    );
    let spec = |name: &str| json!({"name": name, "spec": {"provider": {"kind": "openai", "model": "m-1"}}});

    let (status, code, _) = call(
        http.post(format!("{gw}/{mine}/sessions"))
            .bearer_auth(&alice)
            .json(&spec("hers")),
    )
    .await;
    assert_eq!(
        (status, code.as_str()),
        (201, ""),
        "alice creates in her namespace"
    );

    let (status, code, message) = call(
        http.post(format!("{gw}/{theirs}/sessions"))
            .bearer_auth(&alice)
            .json(&spec("sneaked")),
    )
    .await;
    assert_eq!(
        (status, code.as_str()),
        (403, "kubernetes_forbidden"),
        "{message}"
    );
    assert!(
        message.contains("\"alice\""),
        "the API server's refusal names the caller: {message}"
    );
    assert!(
        admin.get_opt("sneaked").await.expect("get").is_none(),
        "nothing was created in the namespace her RBAC denies"
    );
    for r in [
        http.delete(format!("{gw}/{theirs}/sessions/existing")),
        http.get(format!("{gw}/{theirs}/sessions")),
        http.get(format!("{gw}/{theirs}/sessions/existing")),
    ] {
        let (status, code, message) = call(r.bearer_auth(&alice)).await;
        assert_eq!(
            (status, code.as_str()),
            (403, "kubernetes_forbidden"),
            "{message}"
        );
    }
    assert!(
        admin.get_opt("existing").await.expect("get").is_some(),
        "her delete did not happen"
    );

    // A group binding counts: bob (team-b) reads the other namespace, and only reads.
    let r = http
        .get(format!("{gw}/{theirs}/sessions"))
        .bearer_auth(&bob)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let list: Value = r.json().await.expect("json");
    assert_eq!(list["data"][0]["metadata"]["name"], "existing", "{list}");
    for r in [
        http.post(format!("{gw}/{theirs}/sessions"))
            .json(&spec("bobs")),
        http.delete(format!("{gw}/{theirs}/sessions/existing")),
    ] {
        let (status, code, message) = call(r.bearer_auth(&bob)).await;
        assert_eq!(
            (status, code.as_str()),
            (403, "kubernetes_forbidden"),
            "{message}"
        );
    }
    let (status, code, _) = call(http.get(format!("{gw}/{mine}/sessions")).bearer_auth(&bob)).await;
    assert_eq!((status, code.as_str()), (403, "kubernetes_forbidden"));
    assert!(admin.get_opt("existing").await.expect("get").is_some());
    assert!(admin.get_opt("bobs").await.expect("get").is_none());

    // An issuer cannot make a caller a member of Kubernetes' own groups, nor nobody.
    let masters = jwt_of(
        json!({"sub": "mallory", "groups": ["system:masters"], "cairn.dev/namespaces": both}),
        HMAC_KEY,
        300,
    );
    let nobody = jwt_of(json!({"cairn.dev/namespaces": both}), HMAC_KEY, 300);
    for token in [&masters, &nobody] {
        let (status, code, message) = call(
            http.post(format!("{gw}/{theirs}/sessions"))
                .bearer_auth(token)
                .json(&spec("mallorys")),
        )
        .await;
        assert_eq!(
            (status, code.as_str()),
            (403, "identity_forbidden"),
            "{message}"
        );
    }
    assert!(admin.get_opt("mallorys").await.expect("get").is_none());

    // alice deletes her own.
    let (status, _, message) = call(
        http.delete(format!("{gw}/{mine}/sessions/hers"))
            .bearer_auth(&alice),
    )
    .await;
    assert_eq!(status, 200, "{message}");
}
