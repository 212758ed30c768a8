//! The real `cairn-agent serve --session NS/NAME` against a real Kubernetes API server (the
//! cluster in `$KUBECONFIG` when set, else the local control plane of `tests/harness`) while
//! another agent holds the session's journal Lease: `/healthz` answers at once, `/readyz`
//! and the API say what the agent waits for, and once the Lease is released the session
//! opens and answers a turn from cairn-sim.
//!
//! `cargo test -p cairn-agent --test agent_serve_lease`

mod agent_support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_support::*;
use cairn_agent::kube::LeaseHold;
use cairn_crds::{AgentSession, AgentSessionSpec};
use cairn_sim::{ScriptedReply, Sim};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::{Api as KubeApi, Client};

fn kubeconfig() -> std::path::PathBuf {
    match std::env::var_os("KUBECONFIG") {
        Some(path) => std::path::PathBuf::from(path),
        None => {
            let cp = cairn_tests::harness::shared_cluster();
            cp.apply_yaml(&cairn_crds::crds_yaml().expect("CRDs serialize"))
                .expect("CRDs install");
            cp.kubeconfig.clone()
        }
    }
}

async fn client(path: &std::path::Path) -> Client {
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn-agent"))
        .args(["serve", "--session", &format!("{ns}/s1")])
        .args(["--listen", "127.0.0.1:0"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", &path)
        .env("HOSTNAME", "agent-pod")
        .env("CAIRN_API_TOKEN", TOKEN)
        .env("OPENAI_API_KEY", "sk-sim")
        .env("RUST_LOG", "info")
        .envs(storage_env(dir.path(), None))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
        .spawn()
        .expect("spawn cairn-agent");
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
