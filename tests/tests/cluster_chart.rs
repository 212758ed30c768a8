//! The Helm chart: `helm lint --strict` is clean, its rendered output passes a server-side
//! dry run against the real API server for every shape of values, and `helm install`
//! creates a running operator Deployment. Its dashboard and alerts: `monitoring`.

use std::process::Command;

use serde::Deserialize;

use cairn_tests::harness::{ControlPlane, helm, repo_root, shared_cluster};

#[path = "cluster_chart/monitoring.rs"]
mod monitoring;

fn chart() -> String {
    repo_root()
        .join("charts/cairn")
        .to_string_lossy()
        .into_owned()
}

fn helm_cmd(cp: &ControlPlane, args: &[&str]) -> std::process::Output {
    Command::new(helm().expect("helm installs"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("HELM_CACHE_HOME", cp.dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", cp.dir.join("helm/config"))
        .env("HELM_DATA_HOME", cp.dir.join("helm/data"))
        .args(args)
        .output()
        .expect("helm runs")
}

#[test]
fn lint_is_clean() {
    let out = Command::new(helm().expect("helm installs"))
        .args(["lint", "--strict", &chart()])
        .output()
        .expect("helm runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helm lint --strict failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("[WARNING]") && !text.contains("[ERROR]"),
        "{text}"
    );
}

/// The operator container's environment as rendered with `values`.
fn operator_env(values: &[&str]) -> Vec<(String, String)> {
    let mut args = vec!["template", "t", &chart()]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    for v in values {
        args.extend(["--set".to_string(), v.to_string()]);
    }
    let out = Command::new(helm().expect("helm installs"))
        .args(&args)
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let deployment = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("rendered YAML parses"))
        .find(|doc| doc["kind"] == "Deployment")
        .expect("the chart renders a Deployment");
    let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
    env.as_sequence()
        .expect("the operator has an env list")
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default().to_string();
            let value = e["value"].as_str().unwrap_or_default().to_string();
            (name, value)
        })
        .collect()
}

#[test]
fn otlp_values_reach_the_operator_only_when_an_endpoint_is_set() {
    let env = operator_env(&[
        "agent.otlp.endpoint=https://otel-collector.observability:4318",
        "agent.otlp.headersSecret=otlp-auth",
        "agent.otlp.resourceAttributes.k8s\\.cluster\\.name=prod-eu",
        "agent.otlp.resourceAttributes.deployment\\.environment=prod",
    ]);
    let otlp: Vec<(&str, &str)> = env
        .iter()
        .filter(|(n, _)| n.starts_with("CAIRN_AGENT_OTLP_"))
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        otlp,
        [
            (
                "CAIRN_AGENT_OTLP_ENDPOINT",
                "https://otel-collector.observability:4318"
            ),
            ("CAIRN_AGENT_OTLP_HEADERS_SECRET", "otlp-auth"),
            (
                "CAIRN_AGENT_OTLP_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,k8s.cluster.name=prod-eu"
            ),
        ]
    );
    let defaults = operator_env(&[]);
    assert!(
        !defaults
            .iter()
            .any(|(n, _)| n.starts_with("CAIRN_AGENT_OTLP_")),
        "{defaults:?}"
    );
}

#[test]
fn agent_pod_values_reach_the_operator_as_json_without_the_empty_ones() {
    let env = operator_env(&[
        "agent.pod.imagePullSecrets={fleet-pull}",
        "agent.pod.serviceAccountAnnotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::123:role/cairn-{namespace}-{session}",
        "agent.pod.priorityClassName=agents",
    ]);
    let json = env
        .iter()
        .find(|(n, _)| n == "CAIRN_AGENT_POD_DEFAULTS")
        .map(|(_, v)| v.clone())
        .expect("the pod defaults are passed");
    let parsed: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(
        parsed,
        serde_json::json!({
            "imagePullSecrets": ["fleet-pull"],
            "serviceAccountAnnotations": {
                "eks.amazonaws.com/role-arn": "arn:aws:iam::123:role/cairn-{namespace}-{session}"
            },
            "priorityClassName": "agents",
        })
    );
    let defaults = operator_env(&[]);
    assert!(
        !defaults
            .iter()
            .any(|(n, _)| n == "CAIRN_AGENT_POD_DEFAULTS"),
        "{defaults:?}"
    );
}

#[test]
fn agent_network_policy_values_reach_the_operator_and_the_pod_monitor_renders() {
    let env = operator_env(&[
        "agent.networkPolicy.monitoringNamespace=monitoring",
        "agent.networkPolicy.egress.enabled=true",
        "agent.networkPolicy.egress.to[0].cidr=10.96.0.1/32",
        "agent.networkPolicy.egress.to[0].ports={443}",
    ]);
    let get = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(
        get("CAIRN_AGENT_MONITORING_NAMESPACE").as_deref(),
        Some("monitoring")
    );
    let egress: serde_json::Value =
        serde_json::from_str(&get("CAIRN_AGENT_EGRESS").expect("egress is passed")).expect("JSON");
    assert_eq!(
        egress,
        serde_json::json!({"dns": true, "to": [{"cidr": "10.96.0.1/32", "ports": [443]}]})
    );
    let defaults = operator_env(&[]);
    assert!(
        !defaults
            .iter()
            .any(|(n, _)| n == "CAIRN_AGENT_EGRESS" || n == "CAIRN_AGENT_MONITORING_NAMESPACE"),
        "egress is unrestricted and no namespace is admitted by default: {defaults:?}"
    );

    let out = Command::new(helm().expect("helm installs"))
        .args([
            "template",
            "t",
            &chart(),
            "--set",
            "metrics.agentPodMonitor.enabled=true",
        ])
        .args(["--set", "watchNamespaces={team-a}"])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let monitor = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("rendered YAML parses"))
        .find(|doc| doc["kind"] == "PodMonitor")
        .expect("the chart renders a PodMonitor");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "cairn-agent"
    );
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"][0],
        "team-a"
    );
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"][0]["path"],
        "/metrics"
    );
}

/// The rendered CRDs with `values`, as YAML documents.
fn rendered_crds(values: &[&str]) -> Vec<serde_yaml::Value> {
    let mut cmd = Command::new(helm().expect("helm installs"));
    cmd.args(["template", "t", &chart()]);
    for v in values {
        cmd.args(["--set", v]);
    }
    let out = cmd.output().expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("rendered YAML parses"))
        .filter(|doc| doc["kind"] == "CustomResourceDefinition")
        .collect()
}

#[test]
fn the_chart_alone_owns_the_crds_and_crds_keep_decides_uninstall() {
    let kept = rendered_crds(&[]);
    assert_eq!(kept.len(), 2);
    for crd in &kept {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
    }
    for crd in rendered_crds(&["crds.keep=false"]) {
        assert!(
            crd["metadata"].get("annotations").is_none(),
            "no keep annotation: {:?}",
            crd["metadata"]
        );
    }
    assert!(rendered_crds(&["crds.install=false"]).is_empty());
    // The operator never applies them itself.
    let out = Command::new(helm().expect("helm installs"))
        .args(["template", "t", &chart()])
        .output()
        .expect("helm runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let deployment = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("rendered YAML parses"))
        .find(|doc| doc["kind"] == "Deployment")
        .expect("a Deployment");
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_sequence()
            .is_some_and(|a| a.iter().any(|v| v == "--skip-crd-install")),
        "{args:?}"
    );
    // CRD permissions: only the storage-version migration's, by name.
    let names = cairn_crds::crd_names();
    let docs = cairn_tests::chart_roles::parse(&text).expect("rendered YAML parses");
    let mut crd_rules = 0;
    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        for rule in doc["rules"].as_sequence().into_iter().flatten() {
            let groups = rule["apiGroups"].as_sequence().cloned().unwrap_or_default();
            if !groups.iter().any(|g| g == "apiextensions.k8s.io") {
                continue;
            }
            crd_rules += 1;
            assert_eq!(
                doc["metadata"]["name"], "t-cairn-storage-migration",
                "{rule:?}"
            );
            let named: Vec<&str> = rule["resourceNames"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .collect();
            assert_eq!(named, names, "by name only: {rule:?}");
            let verbs: Vec<&str> = rule["verbs"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .collect();
            match rule["resources"][0].as_str() {
                Some("customresourcedefinitions") => assert_eq!(verbs, ["get"]),
                Some("customresourcedefinitions/status") => assert_eq!(verbs, ["patch"]),
                other => panic!("unexpected CRD rule on {other:?}"),
            }
        }
    }
    assert_eq!(crd_rules, 2, "the migration's two CRD rules");
}

#[test]
fn bad_values_are_refused_by_the_schema() {
    let h = helm().expect("helm installs");
    for bad in [
        "replicaCount=0",
        "logFormat=xml",
        "archive.bucket=Not_A_Bucket",
        // The operator no longer applies CRDs: the old switch is gone, not ignored.
        "operatorInstallsCrds=true",
        "metrics.port=70000",
        "unknownKey=1",
        "agent.otlp.endpoint=otel-collector:4318",
        "agent.otlp.endpoint=grpc://otel-collector:4317",
        "agent.otlp.endpoint=http://user:pass@otel-collector:4318",
        "agent.otlp.headersSecret=Not_A_Secret",
        "agent.otlp.resourceAttributes.team=a\\,b",
        // Headers without an endpoint have nothing to apply to.
        "agent.otlp.headersSecret=otlp-auth",
        // The operator selects its pods by its own labels.
        "agent.pod.labels.cairn\\.dev/session=x",
        "agent.pod.labels.app\\.kubernetes\\.io/name=x",
        "agent.pod.unknown=1",
        // NetworkPolicy names addresses only.
        "agent.networkPolicy.egress.to[0].cidr=api.openai.com",
        "agent.networkPolicy.monitoringNamespace=Not_A_Namespace",
    ] {
        let out = Command::new(&h)
            .args(["template", "t", &chart(), "--set", bad])
            .output()
            .expect("helm runs");
        assert!(
            !out.status.success(),
            "{bad} should be refused by values.schema.json"
        );
    }
}

/// What the API server's authorizer answers for `verb` on Secrets as the chart's operator
/// ServiceAccount, cluster-wide (`namespace` `None`) or in one namespace.
fn operator_may(cp: &ControlPlane, verb: &str, namespace: Option<&str>) -> bool {
    let mut args = vec![
        "auth",
        "can-i",
        verb,
        "secrets",
        "--as",
        "system:serviceaccount:cairn-install:cairn",
    ];
    match namespace {
        Some(ns) => args.extend(["--namespace", ns]),
        None => args.push("--all-namespaces"),
    }
    let out = cp.kubectl(&args).expect("kubectl runs");
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        answer == "yes" || answer == "no",
        "kubectl auth can-i {verb} secrets: {answer:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

/// One cluster, in order: install (which creates the CRDs), uninstall (which keeps them),
/// then dry runs of every shape of values against the kept CRDs.
#[test]
fn install_uninstall_and_dry_runs() {
    let cp = shared_cluster();
    // The namespace whose Secret metadata the operator may watch exists before the install
    // renders its Role there.
    let _ = cp.kubectl(&["create", "namespace", "cairn-install-watched"]);
    let out = helm_cmd(
        cp,
        &[
            "install",
            "cairn",
            &chart(),
            "--namespace",
            "cairn-install",
            "--create-namespace",
            "--set",
            "secretWatchNamespaces={cairn-install-watched}",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ready = cp
        .kubectl_ok(&[
            "get",
            "deploy",
            "-n",
            "cairn-install",
            "cairn",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ])
        .expect("the operator Deployment exists");
    assert_eq!(ready.trim(), "1", "kwok runs the operator pod");
    cp.kubectl_ok(&["get", "crd", "agentsessions.cairn.dev"])
        .expect("the chart installed the CRDs");
    let keep = cp
        .kubectl_ok(&[
            "get",
            "crd",
            "agentsessions.cairn.dev",
            "-o",
            "jsonpath={.metadata.annotations.helm\\.sh/resource-policy}",
        ])
        .expect("get");
    assert_eq!(keep, "keep");

    // Least privilege on Secrets, as the API server's RBAC authorizer decides it for the
    // operator's ServiceAccount: no cluster-wide list or watch, list/watch only in the
    // namespace listed in secretWatchNamespaces, get (by name) and the token Secret's
    // create/patch everywhere.
    for verb in ["list", "watch"] {
        assert!(!operator_may(cp, verb, None), "cluster-wide {verb} secrets");
        assert!(
            !operator_may(cp, verb, Some("default")),
            "{verb} secrets in an unlisted namespace"
        );
        assert!(
            operator_may(cp, verb, Some("cairn-install-watched")),
            "{verb} secrets where secretWatchNamespaces lists it"
        );
    }
    for verb in ["get", "create", "patch"] {
        assert!(operator_may(cp, verb, Some("default")), "{verb} secrets");
    }
    for verb in ["update", "delete", "deletecollection"] {
        assert!(!operator_may(cp, verb, None), "{verb} secrets");
    }
    // The chart alone owns the CRDs: the operator may not write them. The storage-version
    // migration may read cairn's two (and no other) and patch their status.
    let crd_may = |verb: &str, target: &str, subresource: Option<&str>| {
        let mut args = vec![
            "auth",
            "can-i",
            verb,
            target,
            "--as",
            "system:serviceaccount:cairn-install:cairn",
        ];
        if let Some(sub) = subresource {
            args.extend(["--subresource", sub]);
        }
        let out = cp.kubectl(&args).expect("kubectl runs");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(answer == "yes" || answer == "no", "{args:?}: {answer:?}");
        answer == "yes"
    };
    let crds = "customresourcedefinitions.apiextensions.k8s.io";
    let ours = "customresourcedefinitions.apiextensions.k8s.io/agentsessions.cairn.dev";
    let other = "customresourcedefinitions.apiextensions.k8s.io/widgets.example.com";
    for verb in [
        "create", "patch", "update", "delete", "get", "list", "watch",
    ] {
        assert!(!crd_may(verb, crds, None), "{verb} CRDs");
    }
    for verb in ["patch", "update", "delete"] {
        assert!(!crd_may(verb, ours, None), "{verb} cairn's CRD");
    }
    assert!(crd_may("get", ours, None), "get cairn's CRD");
    assert!(!crd_may("get", other, None), "get another CRD");
    assert!(
        crd_may("patch", ours, Some("status")),
        "patch cairn's CRD status"
    );
    assert!(
        !crd_may("patch", other, Some("status")),
        "patch another CRD's status"
    );
    let out = helm_cmd(
        cp,
        &[
            "uninstall",
            "cairn",
            "--namespace",
            "cairn-install",
            "--wait",
        ],
    );
    assert!(
        out.status.success(),
        "helm uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    cp.kubectl_ok(&["get", "crd", "agentsessions.cairn.dev"])
        .expect("CRDs survive helm uninstall");
    rendered_chart_passes_a_server_side_dry_run(cp);
}

fn rendered_chart_passes_a_server_side_dry_run(cp: &ControlPlane) {
    let _ = cp.kubectl(&["create", "namespace", "cairn-system"]);
    let _ = cp.kubectl(&["create", "namespace", "team-a"]);
    let variants: &[&[&str]] = &[
        &[],
        &[
            "--set",
            "watchNamespaces={team-a}",
            "--set",
            "crds.keep=false",
        ],
        &[
            "--set",
            "replicaCount=2",
            "--set",
            "networkPolicy.enabled=false",
            "--set",
            "archive.endpoint=http://s3.local:9000",
        ],
        &[
            "--set",
            "agent.otlp.endpoint=https://otel-collector.observability:4318",
            "--set",
            "agent.otlp.headersSecret=otlp-auth",
            "--set",
            "agent.otlp.resourceAttributes.k8s\\.cluster\\.name=prod-eu",
            "--set",
            "metrics.dashboard.enabled=true",
        ],
        &[
            "--set",
            "secretWatchNamespaces={team-a}",
            "--set",
            "agent.pod.imagePullSecrets={fleet-pull}",
            "--set",
            "agent.pod.labels.team=platform",
            "--set",
            "agent.pod.runtimeClassName=gvisor",
        ],
        &[
            "--set",
            "archive.scoped.enabled=true",
            "--set",
            "archive.scoped.adminCredentialsSecret=archive-admin",
            "--set",
            "archive.scoped.roleArn=arn:aws:iam::123456789012:role/cairn-archive",
        ],
    ];
    // The CRDs exist (kept from the install): a dry run of a CRD would not make it servable
    // for the rest of the stream.
    for extra in variants {
        let mut args = vec!["template", "cairn", &chart(), "--namespace", "cairn-system"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let rendered = helm_cmd(cp, &args);
        assert!(
            rendered.status.success(),
            "helm template {extra:?}: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
        let yaml = String::from_utf8_lossy(&rendered.stdout);
        let out = cp
            .kubectl_with_stdin(
                &[
                    "apply",
                    "--dry-run=server",
                    "--server-side",
                    "--force-conflicts",
                    "-f",
                    "-",
                ],
                &yaml,
            )
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "server-side dry run of helm template {extra:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn scoped_credentials_values_mount_the_admin_secret_into_the_operator_only() {
    let scoped = [
        "archive.scoped.enabled=true",
        "archive.scoped.adminCredentialsSecret=archive-admin",
        "archive.scoped.roleArn=arn:aws:iam::123456789012:role/cairn-archive",
        "archive.scoped.refreshBeforeSeconds=600",
    ];
    let env = operator_env(&scoped);
    let get = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    assert_eq!(get("CAIRN_ARCHIVE_SCOPED"), Some("true"));
    assert_eq!(
        get("CAIRN_ARCHIVE_SCOPED_ROLE_ARN"),
        Some("arn:aws:iam::123456789012:role/cairn-archive")
    );
    assert_eq!(get("CAIRN_ARCHIVE_SCOPED_DURATION_SECONDS"), Some("3600"));
    assert_eq!(
        get("CAIRN_ARCHIVE_SCOPED_REFRESH_BEFORE_SECONDS"),
        Some("600")
    );
    assert_eq!(
        get("CAIRN_ARCHIVE_SCOPED_ADMIN_CREDENTIALS_DIR"),
        Some("/var/run/cairn/archive-admin")
    );
    // The admin keys are a file mount of the operator's own pod, never a variable.
    assert!(!env.iter().any(|(n, _)| n.starts_with("AWS_")), "{env:?}");
    let out = Command::new(helm().expect("helm installs"))
        .args(["template", "t", &chart()])
        .args(scoped.iter().flat_map(|v| ["--set", v]))
        .output()
        .expect("helm runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let deployment = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("rendered YAML parses"))
        .find(|doc| doc["kind"] == "Deployment")
        .expect("a Deployment");
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    let admin = volumes
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "archive-admin")
        .expect("the admin Secret volume");
    assert_eq!(admin["secret"]["secretName"], "archive-admin");
    let mounts = &deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    assert!(
        mounts
            .as_sequence()
            .expect("mounts")
            .iter()
            .any(|m| m["name"] == "archive-admin"
                && m["mountPath"] == "/var/run/cairn/archive-admin"
                && m["readOnly"] == true)
    );
    // Without an admin Secret: off, said explicitly (the operator's own `auto` would look
    // for admin keys the chart did not mount), and no admin mount at all.
    let scoped_vars = |values: &[&str]| -> Vec<(String, String)> {
        operator_env(values)
            .into_iter()
            .filter(|(n, _)| n.starts_with("CAIRN_ARCHIVE_SCOPED"))
            .collect()
    };
    let off = vec![("CAIRN_ARCHIVE_SCOPED".to_string(), "false".to_string())];
    assert_eq!(scoped_vars(&[]), off);
    // With one and no explicit setting: on by default.
    let by_default = operator_env(&["archive.scoped.adminCredentialsSecret=archive-admin"]);
    assert!(
        by_default
            .iter()
            .any(|(n, v)| n == "CAIRN_ARCHIVE_SCOPED" && v == "true"),
        "{by_default:?}"
    );
    // Explicitly off even with one: off, and the admin Secret is not mounted.
    let explicit_off = [
        "archive.scoped.enabled=false",
        "archive.scoped.adminCredentialsSecret=archive-admin",
    ];
    assert_eq!(scoped_vars(&explicit_off[..]), off);
    let out = Command::new(helm().expect("helm installs"))
        .args(["template", "t", &chart()])
        .args(explicit_off.iter().flat_map(|v| ["--set", v]))
        .output()
        .expect("helm runs");
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("archive-admin"),
        "no admin Secret volume or mount when scoped mode is off"
    );
    // Accepting shared key pairs fleet-wide is a value of its own.
    assert!(
        operator_env(&["archive.allowSharedCredentials=true"])
            .iter()
            .any(|(n, v)| n == "CAIRN_ARCHIVE_ALLOW_SHARED_CREDENTIALS" && v == "true")
    );
    assert!(
        !operator_env(&[])
            .iter()
            .any(|(n, _)| n == "CAIRN_ARCHIVE_ALLOW_SHARED_CREDENTIALS")
    );

    let h = helm().expect("helm installs");
    for bad in [
        // Scoped mode needs the admin Secret.
        vec!["archive.scoped.enabled=true"],
        vec![
            "archive.scoped.enabled=true",
            "archive.scoped.adminCredentialsSecret=a",
            "archive.scoped.durationSeconds=60",
        ],
        vec![
            "archive.scoped.enabled=true",
            "archive.scoped.adminCredentialsSecret=a",
            "archive.scoped.roleArn=cairn-archive",
        ],
        // auto, true or false only.
        vec!["archive.scoped.enabled=maybe"],
    ] {
        let out = Command::new(&h)
            .args(["template", "t", &chart()])
            .args(bad.iter().flat_map(|v| ["--set", *v]))
            .output()
            .expect("helm runs");
        assert!(!out.status.success(), "{bad:?} should be refused");
    }
}

/// Every option of the chart that renders RBAC or a Secret reference, on: the operator bound
/// cluster-wide, the Secret watch, scoped credentials, the gateway with OIDC, its lifecycle
/// API and its token Secret namespaces, monitors, an Ingress.
const EVERY_OPTION: &[&str] = &[
    "secretWatchNamespaces={team-a}",
    "archive.bucket=cairn",
    "archive.credentialsSecret=archive-keys",
    "archive.scoped.enabled=true",
    "archive.scoped.adminCredentialsSecret=archive-admin",
    "archive.scoped.roleArn=arn:aws:iam::123456789012:role/cairn-archive",
    "agent.otlp.endpoint=https://otel-collector.observability:4318",
    "agent.otlp.headersSecret=otlp-auth",
    "metrics.serviceMonitor.enabled=true",
    "metrics.agentPodMonitor.enabled=true",
    "networkPolicy.enabled=true",
    "gateway.enabled=true",
    "gateway.ingress.enabled=true",
    "gateway.oidc.issuer=https://login.example.com",
    "gateway.oidc.jwks=https://login.example.com/jwks",
    "gateway.oidc.tokenSecretNamespaces={team-a,team-b}",
];

/// The grants the chart-roles check accepts, each with its reason.
const ALLOWED: &[cairn_tests::chart_roles::Allowed] = &[cairn_tests::chart_roles::Allowed {
    role: "ClusterRole/cairn",
    verb: "get",
    resource: "secrets",
    reason: "the operator reads, by name, the Secrets a session names (provider key, S3 key \
             pair) in the session's namespace and each session's token Secret, to keep the \
             token it holds; sessions live in any namespace. No list or watch cluster-wide \
             (docs/security.md §5).",
}];

fn render(values: &[&str]) -> Vec<serde_yaml::Value> {
    let mut args = vec!["template", "cairn", &chart(), "--namespace", "cairn-system"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    for v in values {
        args.extend(["--set".to_string(), v.to_string()]);
    }
    let out = Command::new(helm().expect("helm installs"))
        .args(&args)
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    cairn_tests::chart_roles::parse(&String::from_utf8_lossy(&out.stdout))
        .expect("rendered YAML parses")
}

fn role<'a>(
    docs: &'a mut [serde_yaml::Value],
    kind: &str,
    name: &str,
) -> &'a mut serde_yaml::Value {
    docs.iter_mut()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders {kind} {name}"))
}

#[test]
fn no_role_of_the_chart_reads_every_secret_impersonates_escalates_binds_or_uses_wildcards() {
    use cairn_tests::chart_roles::{unused, violations};
    for extra in [&[][..], &["watchNamespaces={team-a,team-b}"][..]] {
        let values: Vec<&str> = EVERY_OPTION.iter().chain(extra).copied().collect();
        let docs = render(&values);
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
            assert!(
                kinds.contains(&kind),
                "every option renders a {kind}: {kinds:?}"
            );
        }
        let left = violations(&docs, ALLOWED);
        assert!(
            left.is_empty(),
            "with {extra:?}:\n{}",
            left.iter().map(|f| format!("  {f}\n")).collect::<String>()
        );
        if extra.is_empty() {
            let stale = unused(&docs, ALLOWED);
            assert!(
                stale.is_empty(),
                "allow-list entries no grant needs: {stale:?}"
            );
        }
    }
}

#[test]
fn the_chart_roles_check_fails_when_a_forbidden_grant_is_added() {
    use cairn_tests::chart_roles::violations;
    let clean = render(EVERY_OPTION);
    assert!(violations(&clean, ALLOWED).is_empty());
    let added = [
        (
            "{apiGroups: [''], resources: [users, groups], verbs: [impersonate]}",
            "impersonate",
        ),
        (
            "{apiGroups: [''], resources: [secrets], verbs: [get]}",
            "get",
        ),
        (
            "{apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [bind, escalate]}",
            "bind",
        ),
        (
            "{apiGroups: [cairn.dev], resources: ['*'], verbs: ['*']}",
            "*",
        ),
    ];
    for (rule, verb) in added {
        let mut docs = clean.clone();
        let rule: serde_yaml::Value = serde_yaml::from_str(rule).expect("rule");
        role(&mut docs, "ClusterRole", "cairn-gateway")["rules"]
            .as_sequence_mut()
            .expect("the gateway's ClusterRole has rules")
            .push(rule.clone());
        let left = violations(&docs, ALLOWED);
        assert!(
            left.iter()
                .any(|f| f.role == "ClusterRole/cairn-gateway" && f.verb == verb),
            "adding {rule:?} to the gateway's role must fail the check: {left:?}"
        );
    }
    // The operator's allowed `get secrets` does not stretch to `list`.
    let mut docs = clean;
    role(&mut docs, "ClusterRole", "cairn")["rules"]
        .as_sequence_mut()
        .expect("rules")
        .push(
            serde_yaml::from_str("{apiGroups: [''], resources: [secrets], verbs: [list]}")
                .expect("rule"),
        );
    let left = violations(&docs, ALLOWED);
    assert_eq!(
        left.iter()
            .map(|f| (f.role.as_str(), f.verb.as_str()))
            .collect::<Vec<_>>(),
        [("ClusterRole/cairn", "list")]
    );
}

/// What the API server's authorizer answers for `args` as `user`.
fn can_i(cp: &ControlPlane, user: &str, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend(args);
    all.extend(["--as", user]);
    let out = cp.kubectl(&all).expect("kubectl runs");
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        answer == "yes" || answer == "no",
        "kubectl {all:?}: {answer:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

/// The API server's answer to a SubjectAccessReview for ServiceAccount `ns`/`name`:
/// `verb` on `group`/`resource` in every namespace.
fn service_account_may(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    verb: &str,
    group: &str,
    resource: &str,
) -> bool {
    let review = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:{ns}:{name}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource},
        },
    });
    let out = cp
        .kubectl_with_stdin(
            &["create", "-f", "-", "-o", "jsonpath={.status.allowed}"],
            &review.to_string(),
        )
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim() == "true"
}

/// The gateway's rendered RBAC (every option on, OIDC included) applied to the real API
/// server: its ServiceAccount reads no Secret cluster-wide, impersonates no one, and has
/// exactly what its job needs.
#[test]
fn the_gateway_with_oidc_reads_no_secret_and_impersonates_no_one_on_the_api_server() {
    let cp = shared_cluster();
    let (ns, tokens_ns) = ("cairn-gw-rbac", "cairn-gw-rbac-tokens");
    for n in [ns, tokens_ns] {
        let _ = cp.kubectl(&["create", "namespace", n]);
    }
    let release = "gwrbac";
    let mut args = vec!["template", release, &chart(), "--namespace", ns]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    for v in EVERY_OPTION
        .iter()
        .filter(|v| !v.starts_with("gateway.oidc.tokenSecretNamespaces"))
        .map(|v| v.to_string())
        .chain([format!(
            "gateway.oidc.tokenSecretNamespaces={{{tokens_ns}}}"
        )])
    {
        args.extend(["--set".to_string(), v]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = helm_cmd(cp, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = cairn_tests::chart_roles::parse(&String::from_utf8_lossy(&out.stdout))
        .expect("rendered YAML parses");
    let gateway = format!("{release}-cairn-gateway");
    let rbac: Vec<&serde_yaml::Value> = docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some(
                    "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "Role"
                        | "RoleBinding"
                )
            ) && d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&gateway))
        })
        .collect();
    assert!(
        rbac.len() >= 5,
        "the gateway's identity and roles: {rbac:?}"
    );
    let yaml = rbac
        .iter()
        .map(|d| serde_yaml::to_string(d).expect("yaml"))
        .collect::<Vec<_>>()
        .join("---\n");
    let applied = cp
        .kubectl_with_stdin(&["apply", "-f", "-"], &yaml)
        .expect("kubectl runs");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let sa = format!("system:serviceaccount:{ns}:{gateway}");
    let yes = [
        vec!["create", "subjectaccessreviews.authorization.k8s.io"],
        vec!["get", "secrets", "-n", tokens_ns],
    ];
    // The authorizer sees new bindings through its informers, a moment after the apply:
    // every "yes" first (so the "no"s below are answered with the roles in force).
    for args in &yes {
        let allowed = (0..40).any(|_| {
            can_i(cp, &sa, args) || {
                std::thread::sleep(std::time::Duration::from_millis(250));
                false
            }
        });
        assert!(allowed, "the gateway may not {args:?}");
    }
    // AgentSessions, asked with a SubjectAccessReview of the ServiceAccount (kubectl's
    // `can-i` needs the CRD in discovery, which this cluster may not have installed yet).
    for (verb, allowed) in [
        ("get", true),
        ("list", true),
        ("watch", true),
        ("patch", true),
        ("create", true),
        ("delete", true),
        ("update", false),
        ("deletecollection", false),
    ] {
        assert_eq!(
            service_account_may(cp, ns, &gateway, verb, "cairn.dev", "agentsessions"),
            allowed,
            "{verb} agentsessions"
        );
    }
    let no = [
        vec!["get", "secrets", "-A"],
        vec!["list", "secrets", "-A"],
        vec!["get", "secrets", "-n", ns],
        vec!["get", "secrets", "-n", "default"],
        vec!["impersonate", "users"],
        vec!["impersonate", "groups"],
        vec!["impersonate", "serviceaccounts", "-A"],
        vec!["escalate", "clusterroles"],
        vec!["bind", "clusterroles"],
        vec!["update", "agentsessions.cairn.dev", "-A"],
        vec![
            "patch",
            "agentsessions.cairn.dev",
            "--subresource=status",
            "-A",
        ],
        vec!["list", "secrets", "-n", tokens_ns],
    ];
    for args in &no {
        assert!(!can_i(cp, &sa, args), "the gateway may {args:?}");
    }
    let _ = cp.kubectl_with_stdin(&["delete", "--ignore-not-found", "-f", "-"], &yaml);
}
