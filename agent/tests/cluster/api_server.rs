//! The agent against a real Kubernetes API server — the cluster in `$KUBECONFIG` when set,
//! else the local control plane of `tests/harness` — with the cairn CRDs installed: the
//! session Lease, live policy, and `status.session`.
//!
//! `cargo test -p cairn-agent --test cluster api_server::`

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_agent::cluster::{LeaseHold, follow, load, write_status};
use cairn_agent::config::Live;
use cairn_crds::names::lease_name;
use cairn_crds::{AgentSession, AgentSessionSpec, SessionStats};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

/// A client of the cluster under test, with the CRDs installed.
async fn cluster_client() -> Client {
    let path = match std::env::var_os("KUBECONFIG") {
        Some(path) => std::path::PathBuf::from(path),
        None => {
            let cp = cairn_tests::harness::shared_cluster();
            cp.install_crds().expect("CRDs install");
            cp.kubeconfig.clone()
        }
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig reads");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig is usable");
    Client::try_from(config).expect("client")
}

async fn namespace(client: &Client) -> String {
    let name = format!("cairn-agent-test-{:08x}", fastrand::u32(..));
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    name
}

async fn create_session(client: &Client, ns: &str, name: &str) {
    let spec: AgentSessionSpec = serde_yaml::from_str(
        "provider: {kind: openai-compatible, model: m-1, baseUrl: http://127.0.0.1:1/v1}\ncontextWindow: 100000\n",
    )
    .expect("spec");
    let s = AgentSession::new(name, spec);
    Api::<AgentSession>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .expect("create AgentSession");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_admits_one_holder_and_passes_on_release() {
    let client = cluster_client().await;
    let ns = namespace(&client).await;
    let a = LeaseHold::acquire(client.clone(), &ns, "s1", "pod-a")
        .await
        .expect("a acquires");
    // b waits while a holds and renews.
    let b = {
        let client = client.clone();
        let ns = ns.clone();
        tokio::spawn(async move { LeaseHold::acquire(client, &ns, "s1", "pod-b").await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b.is_finished(), "b must wait while a holds the lease");
    a.renew(Some(1)).await.expect("a renews");
    a.release().await;
    let b = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("b acquires after release")
        .expect("join")
        .expect("b acquires");
    b.renew(Some(2)).await.expect("b renews");
    let err = a.renew(Some(1)).await.expect_err("a lost it");
    assert!(err.contains("pod-b"), "{err}");
    let lease = Api::<Lease>::namespaced(client.clone(), &ns)
        .get(&lease_name("s1"))
        .await
        .expect("lease");
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("pod-b"));
    assert_eq!(spec.lease_transitions, Some(1));
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patched_session_changes_the_live_policy_and_status_is_written() {
    let client = cluster_client().await;
    let ns = namespace(&client).await;
    create_session(&client, &ns, "s2").await;
    let (_, live) = load(&client, &ns, "s2").await.expect("load");
    let first_hash = live.policy_hash.clone();
    let (tx, mut rx) = watch::channel(Arc::new(live));
    tokio::spawn(follow(client.clone(), ns.clone(), "s2".into(), tx));
    let api = Api::<AgentSession>::namespaced(client.clone(), &ns);
    api.patch(
        "s2",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"compaction": {"budgetRatio": 0.3}}})),
    )
    .await
    .expect("patch");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let changed: Arc<Live> = rx.borrow_and_update().clone();
        if changed.policy_hash != first_hash {
            assert_eq!(changed.policy.budget_ratio, 0.3);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the patch never reached the agent"
        );
        let _ = tokio::time::timeout(Duration::from_secs(1), rx.changed()).await;
    }

    let stats = SessionStats {
        turns: 7,
        ..SessionStats::default()
    };
    let (stx, srx) = watch::channel(Some(stats));
    // At most one write per interval while the counters change, none while they do not.
    let interval = Duration::from_secs(4);
    tokio::spawn(write_status(
        client.clone(),
        ns.clone(),
        "s2".into(),
        srx,
        interval,
        None,
    ));
    let turns = |s: &AgentSession| {
        s.status
            .as_ref()
            .and_then(|st| st.session.as_ref())
            .map(|x| x.turns)
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = api.get_status("s2").await.expect("get");
        if turns(&s) == Some(7) {
            break;
        }
        assert!(Instant::now() < deadline, "status.session never written");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first_seen = Instant::now();
    stx.send_replace(Some(SessionStats {
        turns: 8,
        ..SessionStats::default()
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = api.get_status("s2").await.expect("get");
    if first_seen.elapsed() < interval / 2 {
        assert_eq!(turns(&s), Some(7), "a second write within the interval");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let written = loop {
        let s = api.get_status("s2").await.expect("get");
        if turns(&s) == Some(8) {
            break s;
        }
        assert!(Instant::now() < deadline, "the change was never written");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Nothing changes: nothing is written.
    tokio::time::sleep(interval + Duration::from_secs(1)).await;
    let later = api.get_status("s2").await.expect("get");
    assert_eq!(
        later.metadata.resource_version, written.metadata.resource_version,
        "an idle session wrote its status"
    );
    drop(stx);
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await;
}
