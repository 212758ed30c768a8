//! An upgrade from the CRDs of an earlier release (`cairn.dev/v1alpha1` their only version,
//! `tests/fixtures/crds-v1alpha1.yaml`) on a real API server: objects created as v1alpha1
//! read back as v1beta1 once the current CRDs are applied, `kubectl get asess` works
//! throughout, and the operator's storage-version migration rewrites them in etcd and trims
//! `status.storedVersions` to `[v1beta1]`, leaving them readable at both versions.
//!
//! The migration runs as the chart's operator ServiceAccount (the chart's RBAC rendered with
//! `watchNamespaces`, impersonated), so the grants it needs are the ones the chart gives; an
//! identity without them fails, is retried and stops cleanly.
//!
//! On a control plane of its own (never `KUBECONFIG`'s cluster): it installs old CRDs, which
//! the other tests of this binary must not see.

use cairn_crds::{AgentSession, CompactionPolicy};
use cairn_operator::migrate::{self, Migrated};
use cairn_tests::harness::{ControlPlane, helm, repo_root, run_dir};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::{Value, json};

const OLD_CRDS: &str = include_str!("../../../tests/fixtures/crds-v1alpha1.yaml");
const NS: &str = "legacy";

fn wait_established(cp: &ControlPlane, yaml: &str) {
    let out = cp
        .kubectl_with_stdin(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "-f",
                "-",
            ],
            yaml,
        )
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kubectl` that must succeed, retried for a while: a resource is served a moment after its
/// CRD is established.
fn kubectl_eventually(cp: &ControlPlane, args: &[&str]) -> String {
    let mut last = String::new();
    for _ in 0..60 {
        match cp.kubectl_ok(args) {
            Ok(out) => return out,
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    panic!("kubectl {args:?} kept failing: {last}");
}

fn get_json(cp: &ControlPlane, resource: &str, name: &str) -> Value {
    let out = kubectl_eventually(cp, &["get", resource, name, "-n", NS, "-o", "json"]);
    serde_json::from_str(&out).expect("kubectl prints JSON")
}

/// The `apiVersion` etcd holds for an object of `plural`.
async fn stored_as(cp: &ControlPlane, plural: &str, name: &str) -> String {
    let key = format!("/registry/cairn.dev/{plural}/{NS}/{name}");
    let bytes = cp
        .etcd_value(&key)
        .await
        .expect("etcd answers")
        .unwrap_or_else(|| panic!("{key} is in etcd"));
    let stored: Value =
        serde_json::from_slice(&bytes).expect("a custom resource is stored as JSON");
    stored["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn stored_versions(client: &Client, crd: &str) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get(crd)
        .await
        .expect("CRD reads")
        .status
        .and_then(|s| s.stored_versions)
        .unwrap_or_default()
}

fn session_yaml(name: &str, model: &str) -> String {
    json!({
        "apiVersion": "cairn.dev/v1alpha1",
        "kind": "AgentSession",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "provider": {"kind": "anthropic", "model": model},
            "policyRef": {"name": "shared"},
        }
    })
    .to_string()
}

/// The chart's ServiceAccount and RBAC, operator in `cairn-system` watching `legacy` only.
fn install_chart_rbac(cp: &ControlPlane) {
    for ns in ["cairn-system", NS] {
        let _ = cp.kubectl(&["create", "namespace", ns]);
    }
    let out = std::process::Command::new(helm().expect("helm installs"))
        .args(["template", "cairn"])
        .arg(repo_root().join("charts/cairn"))
        .args([
            "--namespace",
            "cairn-system",
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
            "--set",
            &format!("watchNamespaces={{{NS}}}"),
        ])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cp.apply_yaml(&String::from_utf8_lossy(&out.stdout))
        .expect("the chart's RBAC applies");
}

async fn client_as(cp: &ControlPlane, user: Option<&str>) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&cp.kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig is usable");
    config.auth_info.impersonate = user.map(str::to_string);
    Client::try_from(config).expect("client")
}

#[tokio::test]
async fn v1alpha1_objects_created_before_an_upgrade_read_back_as_v1beta1_after_it() {
    let dir = run_dir("storage-migration").expect("run directory");
    let cp = ControlPlane::start(&dir).expect("the control plane comes up");
    let client = client_as(&cp, None).await;
    let operator = client_as(&cp, Some("system:serviceaccount:cairn-system:cairn")).await;
    let nobody = client_as(&cp, Some("system:serviceaccount:default:nobody")).await;

    // Before: the earlier release's CRDs and objects created as v1alpha1.
    cp.apply_yaml(OLD_CRDS).expect("the old CRDs apply");
    wait_established(&cp, OLD_CRDS);
    install_chart_rbac(&cp);
    let policy = json!({
        "apiVersion": "cairn.dev/v1alpha1",
        "kind": "CompactionPolicy",
        "metadata": {"name": "shared", "namespace": NS},
        "spec": {"budgetRatio": 0.5},
    })
    .to_string();
    for yaml in [
        policy,
        session_yaml("first", "claude-sonnet-4-5"),
        session_yaml("second", "claude-haiku-4-5"),
    ] {
        let mut last = String::new();
        let created = (0..60).any(|_| match cp.apply_yaml(&yaml) {
            Ok(_) => true,
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(std::time::Duration::from_millis(500));
                false
            }
        });
        assert!(created, "creating a v1alpha1 object: {last}");
    }
    let listed = kubectl_eventually(&cp, &["get", "asess", "-n", NS, "-o", "name"]);
    assert_eq!(
        listed.lines().collect::<Vec<_>>(),
        [
            "agentsession.cairn.dev/first",
            "agentsession.cairn.dev/second"
        ]
    );
    assert_eq!(
        stored_as(&cp, "agentsessions", "first").await,
        "cairn.dev/v1alpha1"
    );
    let generation =
        get_json(&cp, "agentsessions.v1alpha1.cairn.dev", "first")["metadata"]["generation"]
            .clone();

    // The upgrade: the current CRDs (v1beta1 stored, v1alpha1 still served).
    cp.install_crds().expect("the current CRDs apply");
    wait_established(&cp, &cairn_crds::crds_yaml().expect("yaml"));
    for crd in cairn_crds::crd_names() {
        let stored = stored_versions(&client, &crd).await;
        assert!(
            stored.contains(&"v1alpha1".to_string()) && stored.contains(&"v1beta1".to_string()),
            "{crd}: {stored:?}"
        );
    }
    // `kubectl get asess` works, and the objects read back as v1beta1 (the operator's types
    // and kubectl's explicit version) while etcd still holds them as v1alpha1.
    let listed = kubectl_eventually(&cp, &["get", "asess", "-n", NS, "-o", "name"]);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    let sessions: Api<AgentSession> = Api::namespaced(client.clone(), NS);
    let read = sessions.get("second").await.expect("reads as v1beta1");
    assert_eq!(read.spec.provider.model, "claude-haiku-4-5");
    let policies: Api<CompactionPolicy> = Api::namespaced(client.clone(), NS);
    assert_eq!(
        policies
            .get("shared")
            .await
            .expect("reads")
            .spec
            .budget_ratio,
        Some(0.5)
    );
    let v1beta1 = get_json(&cp, "agentsessions.v1beta1.cairn.dev", "first");
    assert_eq!(v1beta1["apiVersion"], "cairn.dev/v1beta1");
    assert_eq!(
        stored_as(&cp, "agentsessions", "first").await,
        "cairn.dev/v1alpha1"
    );

    // Without the grants: an error, retried until stopped, nothing changed.
    let err = migrate::migrate(&nobody)
        .await
        .expect_err("forbidden without the chart's grants");
    assert!(err.to_string().contains("forbidden"), "{err}");
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        migrate::run(
            nobody,
            tokio::time::sleep(std::time::Duration::from_secs(1)),
        ),
    )
    .await
    .expect("a failing migration stops when told to");
    assert_eq!(
        stored_versions(&client, "agentsessions.cairn.dev").await,
        ["v1alpha1", "v1beta1"]
    );

    // The operator's migration, with the chart's grants, rewrites every object and trims
    // storedVersions.
    let mut done = migrate::migrate(&operator)
        .await
        .expect("the migration succeeds");
    done.sort_by(|a, b| a.crd.cmp(&b.crd));
    let summary: Vec<(&str, usize, &str)> = done
        .iter()
        .map(
            |Migrated {
                 crd, objects, to, ..
             }| (crd.as_str(), *objects, to.as_str()),
        )
        .collect();
    assert_eq!(
        summary,
        [
            ("agentsessions.cairn.dev", 2, "v1beta1"),
            ("compactionpolicies.cairn.dev", 1, "v1beta1")
        ]
    );
    for crd in cairn_crds::crd_names() {
        assert_eq!(stored_versions(&client, &crd).await, ["v1beta1"], "{crd}");
    }
    for name in ["first", "second"] {
        assert_eq!(
            stored_as(&cp, "agentsessions", name).await,
            "cairn.dev/v1beta1"
        );
    }
    assert_eq!(
        stored_as(&cp, "compactionpolicies", "shared").await,
        "cairn.dev/v1beta1"
    );
    // Idempotent: nothing left to do, and the operator's retry loop ends at once.
    assert_eq!(migrate::migrate(&operator).await.expect("again"), []);
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        migrate::run(operator, std::future::pending()),
    )
    .await
    .expect("a successful migration ends the loop");

    // After: the same objects, unchanged (no new generation: a controller sees no spec
    // change), readable at both versions and through the short name.
    let listed = kubectl_eventually(&cp, &["get", "asess", "-n", NS, "-o", "name"]);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    let old = get_json(&cp, "agentsessions.v1alpha1.cairn.dev", "first");
    assert_eq!(old["apiVersion"], "cairn.dev/v1alpha1");
    assert_eq!(old["metadata"]["generation"], generation);
    assert_eq!(old["spec"]["provider"]["model"], "claude-sonnet-4-5");
    let new = get_json(&cp, "agentsessions.v1beta1.cairn.dev", "first");
    assert_eq!(new["apiVersion"], "cairn.dev/v1beta1");
    assert_eq!(new["spec"], old["spec"]);
    let all = sessions
        .list(&ListParams::default())
        .await
        .expect("lists as v1beta1");
    assert_eq!(all.items.len(), 2);
    let cpol = get_json(&cp, "cpol", "shared");
    assert_eq!(cpol["spec"]["budgetRatio"], 0.5);
}
