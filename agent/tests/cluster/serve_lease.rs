//! The real `cairn-agent serve --session NS/NAME` against a real Kubernetes API server (the
//! cluster in `$KUBECONFIG` when set, else the local control plane of `tests/harness`) while
//! another agent holds the session's journal Lease: `/healthz` answers at once, `/readyz`
//! and the API say what the agent waits for, and once the Lease is released the session
//! opens and answers a turn from cairn-sim. An agent whose archive does not answer says so
//! (readyz, `status.session.archiveCheck`) and waits until it does.
//!
//! `cargo test -p cairn-agent --test cluster serve_lease::`

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_agent::cluster::LeaseHold;
use cairn_crds::{AgentSession, AgentSessionSpec};
use cairn_sim::{ScriptedReply, Sim};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::{Api as KubeApi, Client};

use crate::support::agent::*;

pub(crate) fn kubeconfig() -> std::path::PathBuf {
    match std::env::var_os("KUBECONFIG") {
        Some(path) => std::path::PathBuf::from(path),
        None => {
            let cp = cairn_tests::harness::shared_cluster();
            cp.install_crds().expect("CRDs install");
            cp.kubeconfig.clone()
        }
    }
}

pub(crate) async fn client(path: &std::path::Path) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig reads");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig is usable");
    Client::try_from(config).expect("client")
}

async fn status(api: &Api, path: &str, auth: bool) -> (u16, String) {
    let mut r = api.http.get(format!("{}{path}", api.base));
    if auth {
        r = r.bearer_auth(TOKEN);
    }
    let r = r.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_while_the_agent_waits_for_its_lease() {
    let path = kubeconfig();
    let client = client(&path).await;
    let ns = format!("cairn-serve-test-{:08x}", fastrand::u32(..));
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns");
    KubeApi::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    let sim = Sim::start().await.expect("sim");
    let spec: AgentSessionSpec = serde_yaml::from_str(&format!(
        "provider: {{kind: openai-compatible, model: {MODEL}, baseUrl: {}/v1}}\ncontextWindow: 100000\n",
        sim.url()
    ))
    .expect("spec");
    KubeApi::<AgentSession>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &AgentSession::new("s1", spec))
        .await
        .expect("create AgentSession");
    // Another agent holds the Lease (for 15 s unless it renews or releases it).
    let other = LeaseHold::acquire(client.clone(), &ns, "s1", "other-pod/1")
        .await
        .expect("the other agent acquires");

    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("agent.log");
    let mut child = spawn_serve(
        &format!("{ns}/s1"),
        &path,
        storage_env(dir.path(), None),
        &log,
    );
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = loop {
        let text = read_log();
        if let Some(addr) = text
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
            "cairn-agent did not start: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let api = Api::new(url);

    // For three seconds, while the other agent holds the Lease: alive, not ready.
    let waiting_until = Instant::now() + Duration::from_secs(3);
    let mut saw_lease_wait = false;
    while Instant::now() < waiting_until {
        assert_eq!(status(&api, "/healthz", false).await, (200, "ok".into()));
        let (code, why) = status(&api, "/readyz", false).await;
        assert_eq!(code, 503, "{why}");
        saw_lease_wait |= why.contains("Lease");
        let (code, body) = status(&api, "/v1/session", true).await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("\"starting\""), "{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(saw_lease_wait, "/readyz never named the Lease");
    assert!(!read_log().contains("cairn-agent listening on"));

    // The other agent lets go: the session opens and becomes ready.
    other.release().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if status(&api, "/readyz", false).await.0 == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never ready after the Lease was released: {}",
            read_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(read_log().contains("cairn-agent listening on"));
    sim.push_reply(ScriptedReply::text("now I answer"));
    let (code, body) = api.turn("are you there?").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(output_text(&body), "now I answer");

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let exit = child.wait().expect("wait");
    assert!(exit.success(), "{exit}: {}", read_log());
    let _ = KubeApi::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_that_does_not_answer_is_reported_and_waited_for() {
    let path = kubeconfig();
    let client = client(&path).await;
    let ns = format!("cairn-archive-test-{:08x}", fastrand::u32(..));
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns");
    KubeApi::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    let sim = Sim::start().await.expect("sim");
    let moto = crate::support::moto::Moto::start().await;
    let spec: AgentSessionSpec = serde_yaml::from_str(&format!(
        "provider: {{kind: openai-compatible, model: {MODEL}, baseUrl: {}/v1}}\ncontextWindow: 100000\n",
        sim.url()
    ))
    .expect("spec");
    let sessions = KubeApi::<AgentSession>::namespaced(client.clone(), &ns);
    sessions
        .create(&PostParams::default(), &AgentSession::new("s2", spec))
        .await
        .expect("create AgentSession");

    // The bucket the session is configured with does not exist (yet).
    let bucket = format!("late-{:08x}", fastrand::u32(..));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut env = storage_env(&dir.path().join("data"), Some(&moto.endpoint));
    for (k, v) in &mut env {
        if k == "CAIRN_S3_BUCKET" {
            v.clone_from(&bucket);
        }
    }
    let log = dir.path().join("agent.log");
    let mut child = spawn_serve(&format!("{ns}/s2"), &path, env, &log);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = loop {
        if let Some(addr) = read_log()
            .lines()
            .find_map(|l| l.strip_prefix("cairn-agent starting on "))
        {
            break format!("http://{}", addr.trim());
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("cairn-agent exited with {status}: {}", read_log());
        }
        assert!(Instant::now() < deadline, "cairn-agent did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let api = Api::new(url);
    let location = format!("s3://{bucket}/cairn/{ns}/s2/");

    // The failure reaches the session's status with the S3 error; the agent stays up, not
    // ready, and says why.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = sessions.get_status("s2").await.expect("status");
        let check = s
            .status
            .and_then(|st| st.session)
            .and_then(|x| x.archive_check);
        if let Some(c) = check {
            assert!(!c.ok, "{c:?}");
            assert_eq!(c.location, location);
            assert!(
                c.message
                    .as_deref()
                    .unwrap_or_default()
                    .contains("NoSuchBucket"),
                "{c:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no archive check reported: {}",
            read_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, why) = status(&api, "/readyz", false).await;
    assert_eq!(code, 503, "{why}");
    assert!(
        why.contains("does not answer") && why.contains("NoSuchBucket"),
        "{why}"
    );
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the agent exited"
    );

    // The bucket appears: the next check passes and the session opens.
    let s3 = moto.config().client().expect("s3 client");
    s3.create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("create bucket");
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&api, "/readyz", false).await.0 != 200 {
        assert!(Instant::now() < deadline, "never ready: {}", read_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = sessions.get_status("s2").await.expect("status");
        let check = s
            .status
            .and_then(|st| st.session)
            .and_then(|x| x.archive_check);
        if check
            .as_ref()
            .is_some_and(|c| c.ok && c.location == location)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the passing check never reached the status: {check:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
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

/// `cairn-agent serve --session SESSION` on a free port against the cluster of
/// `kubeconfig`, with the test token and key, `storage` for its archive and journal, and its
/// stderr in `log`.
pub fn spawn_serve(
    session: &str,
    kubeconfig: &std::path::Path,
    storage: Vec<(String, String)>,
    log: &std::path::Path,
) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_cairn-agent"))
        .args(["serve", "--session", session])
        .args(["--listen", "127.0.0.1:0"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("HOSTNAME", "agent-pod")
        .env("CAIRN_API_TOKEN", TOKEN)
        .env("OPENAI_API_KEY", "sk-sim")
        .env("RUST_LOG", "info")
        .envs(storage)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).expect("log")))
        .spawn()
        .expect("spawn cairn-agent")
}
