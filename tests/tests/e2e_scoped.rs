//! Scoped archive credentials end to end: cairn installed with its Helm chart in scoped mode
//! (`archive.scoped`), the operator running as its pod with the admin key pair mounted from
//! its own Secret, two AgentSessions whose agent pods run as local processes (the harness's
//! pod runtime, kwok's node) against SeaweedFS, which enforces the STS session policies. Each
//! agent's archive check (a probe written, read back and deleted under its own prefix, with
//! the credentials mounted from its own Secret) passes; what session one's pod mounts is
//! refused on session two's prefix. Needs `cargo build -p cairn-agent -p cairn-operator`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_tests::demo;
use cairn_tests::harness::seaweedfs::{ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY, ROLE_ARN};
use cairn_tests::harness::{PodRuntime, SeaweedFs, SeaweedOptions, helm, repo_root, runtime};
use serde_json::Value;

const SYSTEM_NS: &str = "cairn-scoped";
const NS: &str = "tenant-scoped";

fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn condition(session: &Value, kind: &str) -> Option<(String, String)> {
    session["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// A mounted Secret's key as the pod runtime wrote it for the pod.
fn mounted(root: &Path, volume: &str, key: &str) -> String {
    std::fs::read_to_string(root.join("volumes").join(volume).join(key))
        .unwrap_or_else(|e| panic!("{volume}/{key} in {}: {e}", root.display()))
}

#[test]
fn chart_installed_operator_gives_each_agent_credentials_for_its_own_prefix_only() {
    let bin_dir = demo::default_bin_dir();
    for bin in ["cairn-agent", "cairn-operator"] {
        assert!(
            bin_dir.join(bin).is_file(),
            "{} is missing: cargo build -p cairn-agent -p cairn-operator",
            bin_dir.join(bin).display()
        );
    }
    let cp = cairn_tests::harness::shared_cluster();
    let dir = cp.dir.join("e2e-scoped");
    std::fs::create_dir_all(&dir).expect("dir");
    let store =
        SeaweedFs::start(&dir, &["cairn"], &SeaweedOptions::default()).expect("seaweedfs starts");
    let runtime_pods =
        PodRuntime::start(cp, runtime::cairn_images(&bin_dir), "").expect("pod runtime");

    // The admin key pair: the operator's own Secret, in the operator's namespace.
    cp.apply_yaml(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {SYSTEM_NS}}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: archive-admin, namespace: {SYSTEM_NS}}}
stringData: {{AWS_ACCESS_KEY_ID: {ADMIN_ACCESS_KEY_ID}, AWS_SECRET_ACCESS_KEY: {ADMIN_SECRET_ACCESS_KEY}}}
"#
    ))
    .expect("admin Secret");
    let out = Command::new(helm().expect("helm"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .args(["install", "cairn-scoped"])
        .arg(repo_root().join("charts/cairn"))
        .args(["--namespace", SYSTEM_NS, "--wait", "--timeout", "120s"])
        .args(["--set", &format!("watchNamespaces={{{NS}}}")])
        .args(["--set", &format!("archive.endpoint={}", store.endpoint)])
        .args(["--set", "archive.bucket=cairn"])
        .args(["--set", "archive.scoped.enabled=true"])
        .args([
            "--set",
            "archive.scoped.adminCredentialsSecret=archive-admin",
        ])
        .args(["--set", &format!("archive.scoped.roleArn={ROLE_ARN}")])
        .args(["--set", "logFormat=text"])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let session = |name: &str| {
        format!(
            r#"---
apiVersion: cairn.dev/v1beta1
kind: AgentSession
metadata: {{name: {name}, namespace: {NS}}}
spec:
  provider: {{kind: openai-compatible, model: m, baseUrl: "http://127.0.0.1:9/v1"}}
"#
        )
    };
    let crd_served = wait_for("the AgentSession CRD", Duration::from_secs(60), || {
        cp.kubectl(&["get", "crd", "agentsessions.cairn.dev"])
            .ok()
            .filter(|o| o.status.success())
    });
    drop(crd_served);
    cp.apply_yaml(&format!("{}{}", session("one"), session("two")))
        .expect("sessions");

    // Each agent checked its archive with the credentials its pod mounts: ArchiveReady=True.
    for name in ["one", "two"] {
        let s: Value = wait_for(
            &format!("session {name}'s agent to answer its archive check"),
            Duration::from_secs(150),
            || {
                let json = cp
                    .kubectl_ok(&["get", "asess", name, "-n", NS, "-o", "json"])
                    .ok()?;
                let s: Value = serde_json::from_str(&json).ok()?;
                (condition(&s, "ArchiveReady")? == ("True".into(), "ArchiveAnswered".into()))
                    .then_some(s)
            },
        );
        assert_eq!(
            s["status"]["session"]["archiveCheck"]["location"],
            format!("s3://cairn/cairn/{NS}/{name}/")
        );
    }

    // What session one's pod holds: its own scoped Secret's files, nothing with the admin
    // keys; and those credentials are refused on session two's prefix.
    let pods = runtime_pods.pods();
    let one = pods
        .iter()
        .find(|p| p.namespace == NS && p.name == "cairn-one-0")
        .expect("session one's pod runs");
    let access = mounted(&one.root, "archive-credentials", "AWS_ACCESS_KEY_ID");
    let secret = mounted(&one.root, "archive-credentials", "AWS_SECRET_ACCESS_KEY");
    let token = mounted(&one.root, "archive-credentials", "AWS_SESSION_TOKEN");
    assert_ne!(access, ADMIN_ACCESS_KEY_ID);
    let pod_json = cp
        .kubectl_ok(&["get", "pod", "cairn-one-0", "-n", NS, "-o", "json"])
        .expect("pod");
    assert!(!pod_json.contains(ADMIN_SECRET_ACCESS_KEY) && !pod_json.contains("archive-admin"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let cfg = aws_config(&store.endpoint, &access, &secret, &token);
        let c = aws_sdk_s3::Client::from_conf(cfg);
        let denied = c
            .list_objects_v2()
            .bucket("cairn")
            .prefix(format!("cairn/{NS}/two/"))
            .send()
            .await;
        let code = denied
            .as_ref()
            .err()
            .and_then(|e| e.as_service_error())
            .and_then(aws_sdk_s3::error::ProvideErrorMetadata::code)
            .map(str::to_string);
        assert_eq!(code.as_deref(), Some("AccessDenied"), "{denied:?}");
        let own = c
            .list_objects_v2()
            .bucket("cairn")
            .prefix(format!("cairn/{NS}/one/"))
            .send()
            .await;
        assert!(own.is_ok(), "{own:?}");
    });

    let _ = Command::new(helm().expect("helm"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .args(["uninstall", "cairn-scoped", "--namespace", SYSTEM_NS])
        .output();
    drop(store);
}

fn aws_config(endpoint: &str, access: &str, secret: &str, token: &str) -> aws_sdk_s3::Config {
    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
    aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https(),
        )
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(
            access,
            secret,
            Some(token.to_string()),
            None,
            "pod",
        ))
        .build()
}
