//! `validate` and `build` for representative sessions: every object a session owns, checked
//! field by field where it matters (security, env wiring, RBAC, owners) and as a whole against
//! committed snapshots (`tests/snapshots/*.yaml`; `UPDATE_SNAPSHOTS=1` rewrites them).

use std::collections::BTreeMap;
use std::path::PathBuf;

use cairn_crds::{AgentSession, CompactionPolicySpec};
use cairn_operator::config::OtlpExport;
use cairn_operator::objects::{
    ApiToken, BuildInputs, RESTART_HASH_ANNOTATION, SessionObjects, build, restart_hash,
};
use cairn_operator::{Defaults, OperatorArgs, Plan, ValidationError, validate};
use clap::Parser;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

const UID: &str = "0b6f7c5e-1111-2222-3333-444455556666";

fn session(name: &str, spec_yaml: &str) -> AgentSession {
    let spec = serde_yaml::from_str(spec_yaml).expect("fixture spec parses");
    let mut s = AgentSession::new(name, spec);
    s.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some("team-a".into()),
        uid: Some(UID.into()),
        generation: Some(3),
        ..Default::default()
    };
    s
}

fn policy(yaml: &str) -> CompactionPolicySpec {
    serde_yaml::from_str(yaml).expect("fixture policy parses")
}

fn defaults() -> Defaults {
    Defaults {
        image: "registry.local/cairn-agent:1.0".into(),
        operator_namespace: "cairn-system".into(),
        ..Default::default()
    }
}

fn inputs() -> BuildInputs {
    BuildInputs {
        api_token: ApiToken::from_existing("tok-0123456789abcdef".into()),
        provider_secret_digest: None,
        s3_secret_digest: None,
        otlp_headers_digest: None,
    }
}

const MINIMAL: &str = "provider: {kind: openai, model: gpt-5}";

const FULL: &str = r#"
provider:
  kind: anthropic
  model: claude-sonnet-4-5
  baseUrl: http://sim.cairn-test.svc:9000
  credentials: {secretName: anthropic-key, key: api-key}
contextWindow: 200000
payloadCap: 5MB
policyRef: {name: frugal}
compaction: {budgetRatio: 0.5}
archive:
  bucket: cairn-archive
  endpoint: http://s3.cairn-test.svc:9000
  region: eu-west-1
  credentials: {secretName: s3-creds}
  retainOnDelete: false
  localCacheSize: 512Mi
  ttl: 24h
template:
  image: registry.local/cairn-agent:2.0
  resources:
    requests: {cpu: 250m, memory: 512Mi}
    limits: {memory: 2Gi}
  nodeSelector: {pool: agents}
  tolerations: [{key: dedicated, operator: Equal, value: agents, effect: NoSchedule}]
  annotations: {team: a}
  terminationGracePeriodSeconds: 120
network:
  clients: {matchLabels: {app: chat-ui}}
"#;

const FRUGAL: &str =
    "budgetRatio: 0.4\nmicrocompact: {truncateAfterTurns: 1, summarizeAfterTurns: 3}";

fn plan(name: &str, spec: &str, policy_spec: Option<&str>) -> Plan {
    let p = policy_spec.map(policy);
    validate(&session(name, spec), p.as_ref(), &defaults()).expect("fixture validates")
}

fn container(objects: &SessionObjects) -> &Container {
    &pod(objects).containers[0]
}

fn the_pod(objects: &SessionObjects) -> &Pod {
    objects.pod.as_ref().expect("a running session has a pod")
}

fn pod(objects: &SessionObjects) -> &PodSpec {
    the_pod(objects).spec.as_ref().expect("pod spec")
}

fn env(objects: &SessionObjects) -> BTreeMap<String, String> {
    container(objects)
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e: EnvVar| {
            let from = e.value_from.unwrap_or_default();
            let v = match (e.value, from.secret_key_ref, from.field_ref) {
                (Some(v), _, _) => v,
                (None, Some(r), _) => format!("secret:{}/{}", r.name, r.key),
                (None, None, Some(f)) => format!("field:{}", f.field_path),
                _ => "?".into(),
            };
            (e.name, v)
        })
        .collect()
}

fn rules_json(objects: &SessionObjects) -> serde_json::Value {
    serde_json::to_value(objects.role.rules.clone().unwrap_or_default()).expect("rules serialize")
}

fn all_metas(o: &SessionObjects) -> Vec<(&'static str, &ObjectMeta)> {
    vec![
        ("ServiceAccount", &o.service_account.metadata),
        ("Role", &o.role.metadata),
        ("RoleBinding", &o.role_binding.metadata),
        ("Secret", &o.token_secret.metadata),
        ("Pod", &the_pod(o).metadata),
    ]
}

fn assert_snapshot(name: &str, objects: &SessionObjects) {
    let docs = [
        serde_yaml::to_string(&objects.service_account),
        serde_yaml::to_string(&objects.role),
        serde_yaml::to_string(&objects.role_binding),
        serde_yaml::to_string(&objects.token_secret),
        serde_yaml::to_string(&objects.service),
        serde_yaml::to_string(&objects.network_policy),
    ]
    .into_iter()
    .chain(
        objects
            .clients_network_policy
            .as_ref()
            .map(serde_yaml::to_string),
    )
    .chain([serde_yaml::to_string(&objects.pod)]);
    let mut actual = String::new();
    for doc in docs {
        actual.push_str("---\n");
        actual.push_str(&doc.expect("object serializes"));
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.yaml"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir snapshots");
        std::fs::write(&path, &actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing snapshot {}; run with UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    assert_eq!(
        expected, actual,
        "snapshot {name} differs; review and run with UPDATE_SNAPSHOTS=1 if intended"
    );
}

#[test]
fn minimal_session_builds_hardened_owned_objects() {
    let objects = build(&plan("chat", MINIMAL, None), &inputs());
    assert_snapshot("minimal", &objects);
    // A replacement pod has the name but not the UID of the one before: the agent's
    // holder identity takes it from the downward API. The grace period defaults to 60 s.
    let wired = env(&objects);
    assert_eq!(wired["CAIRN_POD_UID"], "field:metadata.uid");
    assert_eq!(wired["CAIRN_TERMINATION_GRACE_SECONDS"], "60");
    assert_eq!(pod(&objects).termination_grace_period_seconds, Some(60));

    for (kind, meta) in all_metas(&objects) {
        let expected_name = match kind {
            "Secret" => "cairn-chat-api-token",
            "Pod" => "cairn-chat-0",
            _ => "cairn-chat",
        };
        assert_eq!(meta.name.as_deref(), Some(expected_name), "{kind}");
        assert_eq!(meta.namespace.as_deref(), Some("team-a"), "{kind}");
        let owners = meta.owner_references.as_ref().expect("owner refs");
        assert_eq!(owners.len(), 1, "{kind}");
        let owner = &owners[0];
        assert_eq!(owner.kind, "AgentSession", "{kind}");
        assert_eq!(owner.api_version, "cairn.dev/v1beta1", "{kind}");
        assert_eq!(owner.name, "chat", "{kind}");
        assert_eq!(owner.uid, UID, "{kind}");
        assert_eq!(owner.controller, Some(true), "{kind}");
        let labels = meta.labels.as_ref().expect("labels");
        assert_eq!(labels["app.kubernetes.io/name"], "cairn-agent");
        assert_eq!(labels["app.kubernetes.io/instance"], "chat");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "cairn-operator");
        assert_eq!(labels["cairn.dev/session"], "chat");
    }

    assert_eq!(
        the_pod(&objects).metadata.name.as_deref(),
        Some("cairn-chat-0")
    );
    assert_eq!(
        objects
            .service
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref()),
        Some("None"),
        "headless: the name resolves to the pod, no ClusterIP to allocate"
    );
    // The namespace's shared Service and NetworkPolicy: no owner, no session's labels.
    for (kind, meta) in [
        ("Service", &objects.service.metadata),
        ("NetworkPolicy", &objects.network_policy.metadata),
    ] {
        assert_eq!(meta.name.as_deref(), Some("cairn-sessions"), "{kind}");
        assert_eq!(meta.namespace.as_deref(), Some("team-a"), "{kind}");
        assert_eq!(
            meta.owner_references, None,
            "{kind} outlives any one session"
        );
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(
            labels["app.kubernetes.io/managed-by"], "cairn-operator",
            "{kind}"
        );
        assert!(!labels.contains_key("cairn.dev/session"), "{kind}");
    }
    let pod = pod(&objects);
    assert_eq!(pod.hostname.as_deref(), Some("cairn-chat"));
    assert_eq!(
        pod.subdomain.as_deref(),
        Some("cairn-sessions"),
        "cairn-chat.cairn-sessions.team-a.svc names the pod"
    );
    assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
    assert_eq!(pod.service_account_name.as_deref(), Some("cairn-chat"));
    let psc = pod.security_context.as_ref().expect("pod security context");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.run_as_user, Some(65532));
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );

    let c = container(&objects);
    assert_eq!(c.image.as_deref(), Some("registry.local/cairn-agent:1.0"));
    assert_eq!(c.command.as_deref(), Some(&["cairn-agent".to_string()][..]));
    assert_eq!(
        c.args.clone().unwrap_or_default(),
        [
            "serve",
            "--session",
            "team-a/chat",
            "--listen",
            "0.0.0.0:8080"
        ]
    );
    let sc = c
        .security_context
        .as_ref()
        .expect("container security context");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(65532));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()])
    );
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .map(|h| (h.path.clone().unwrap_or_default(), h.port.clone()))
    };
    let http = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into());
    assert_eq!(
        probe_path(&c.liveness_probe),
        Some(("/healthz".into(), http.clone()))
    );
    assert_eq!(
        probe_path(&c.readiness_probe),
        Some(("/readyz".into(), http.clone()))
    );
    // Starting is polled every second, so that readiness is probed the moment it passes.
    assert_eq!(probe_path(&c.startup_probe), Some(("/readyz".into(), http)));
    assert_eq!(
        c.startup_probe.as_ref().and_then(|p| p.period_seconds),
        Some(1)
    );
    assert_eq!(c.ports.as_ref().map(|p| p[0].container_port), Some(8080));
    // Operator defaults apply without a template.
    assert_eq!(c.resources, Some(defaults().resources));
    let scratch = &pod.volumes.as_ref().expect("volumes")[0];
    assert_eq!(
        scratch
            .empty_dir
            .as_ref()
            .and_then(|e| e.size_limit.clone())
            .map(|q| q.0),
        Some("256Mi".into())
    );
    let mounts: Vec<_> = c
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_path)
        .collect();
    assert_eq!(mounts, ["/tmp", "/var/cache/cairn"]);

    let env = env(&objects);
    assert_eq!(env["CAIRN_SESSION"], "team-a/chat");
    assert_eq!(env["CAIRN_API_TOKEN"], "secret:cairn-chat-api-token/token");
    assert!(!env.contains_key("OPENAI_API_KEY"), "no credentials set");
    assert!(!env.contains_key("CAIRN_S3_BUCKET"), "no bucket anywhere");
    assert!(!env.contains_key("CAIRN_S3_ACCESS_KEY_ID"));
    assert_eq!(env["CAIRN_S3_PREFIX"], "cairn");

    assert_eq!(
        rules_json(&objects),
        serde_json::json!([
            {"apiGroups": ["cairn.dev"], "resources": ["agentsessions"], "resourceNames": ["chat"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["cairn.dev"], "resources": ["agentsessions/status"], "resourceNames": ["chat"], "verbs": ["patch", "update"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cairn-chat-api-token"], "verbs": ["get"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["cairn-chat"], "verbs": ["get", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ])
    );
    let subjects = objects.role_binding.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].name, "cairn-chat");
    assert_eq!(subjects[0].namespace.as_deref(), Some("team-a"));
    assert_eq!(objects.role_binding.role_ref.kind, "Role");
    assert_eq!(objects.role_binding.role_ref.name, "cairn-chat");

    let token = objects.token_secret.data.as_ref().expect("token data");
    assert_eq!(token["token"].0, b"tok-0123456789abcdef");

    let np = objects.network_policy.spec.as_ref().expect("netpol spec");
    assert_eq!(np.policy_types.clone().unwrap_or_default(), ["Ingress"]);
    assert_eq!(
        serde_json::to_value(&np.ingress).expect("ingress serializes"),
        serde_json::json!([{
            "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "cairn-system"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cairn-gateway"}}},
                {"podSelector": {"matchLabels": {"cairn.dev/client": "true"},
                                 "matchExpressions": [{"key": "cairn.dev/session", "operator": "DoesNotExist"}]}}
            ],
            "ports": [{"port": 8080, "protocol": "TCP"}]
        }])
    );
    let svc = objects.service.spec.as_ref().expect("service spec");
    assert_eq!(svc.ports.as_ref().map(|p| p[0].port), Some(8080));
    let every_session_pod = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "cairn-agent".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "cairn-operator".to_string(),
        ),
    ]);
    assert_eq!(svc.selector.clone().unwrap_or_default(), every_session_pod);
    assert_eq!(
        np.pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default(),
        every_session_pod
    );
    let pod_labels = the_pod(&objects)
        .metadata
        .labels
        .clone()
        .unwrap_or_default();
    assert!(
        every_session_pod
            .iter()
            .all(|(k, v)| pod_labels.get(k) == Some(v)),
        "the shared objects select the session's pod"
    );
}

#[test]
fn the_summarizers_own_credentials_are_mounted_and_readable_by_that_session_only() {
    let policy = "summarizer: {provider: openai, model: gpt-5-mini, credentials: {secretName: openai-key, key: token}}";
    let objects = build(&plan("research", FULL, Some(policy)), &inputs());
    let env = env(&objects);
    assert_eq!(env["CAIRN_SUMMARIZER_API_KEY"], "secret:openai-key/token");
    assert_eq!(env["ANTHROPIC_API_KEY"], "secret:anthropic-key/api-key");
    let rules = rules_json(&objects).to_string();
    assert!(rules.contains("openai-key"), "{rules}");
    // Without summarizer credentials nothing is mounted.
    let objects = build(&plan("research", FULL, Some(FRUGAL)), &inputs());
    assert!(!env_has(&objects, "CAIRN_SUMMARIZER_API_KEY"));
}

fn env_has(objects: &SessionObjects, name: &str) -> bool {
    env(objects).contains_key(name)
}

#[test]
fn full_session_wires_policy_credentials_archive_and_template() {
    let mut inputs = inputs();
    inputs.provider_secret_digest = Some("p1".into());
    inputs.s3_secret_digest = Some("s1".into());
    let plan = plan("research", FULL, Some(FRUGAL));
    let objects = build(&plan, &inputs);
    assert_snapshot("full", &objects);

    let env = env(&objects);
    assert_eq!(env["ANTHROPIC_API_KEY"], "secret:anthropic-key/api-key");
    assert_eq!(env["CAIRN_S3_ENDPOINT"], "http://s3.cairn-test.svc:9000");
    assert_eq!(env["CAIRN_S3_BUCKET"], "cairn-archive");
    assert_eq!(env["CAIRN_S3_PREFIX"], "cairn");
    assert_eq!(env["CAIRN_S3_REGION"], "eu-west-1");
    assert_eq!(env["CAIRN_S3_FORCE_PATH_STYLE"], "true");
    assert_eq!(
        env["CAIRN_S3_ACCESS_KEY_ID"],
        "secret:s3-creds/AWS_ACCESS_KEY_ID"
    );
    assert_eq!(
        env["CAIRN_S3_SECRET_ACCESS_KEY"],
        "secret:s3-creds/AWS_SECRET_ACCESS_KEY"
    );
    assert_eq!(env["CAIRN_ARCHIVE_TTL"], "24h");
    // The pod's grace period comes from the template, and the agent is told the same.
    assert_eq!(pod(&objects).termination_grace_period_seconds, Some(120));
    assert_eq!(env["CAIRN_TERMINATION_GRACE_SECONDS"], "120");

    let c = container(&objects);
    assert_eq!(c.image.as_deref(), Some("registry.local/cairn-agent:2.0"));
    let resources = c.resources.as_ref().expect("resources");
    assert_eq!(
        resources.requests.as_ref().map(|r| r["cpu"].0.clone()),
        Some("250m".into())
    );
    assert_eq!(
        resources.limits.as_ref().map(|r| r["memory"].0.clone()),
        Some("2Gi".into())
    );
    let pod = pod(&objects);
    assert_eq!(
        pod.node_selector.clone().unwrap_or_default()["pool"],
        "agents"
    );
    assert_eq!(pod.tolerations.as_ref().map(Vec::len), Some(1));
    let annotations = the_pod(&objects)
        .metadata
        .annotations
        .clone()
        .unwrap_or_default();
    assert_eq!(annotations["team"], "a");
    assert_eq!(
        annotations[RESTART_HASH_ANNOTATION],
        restart_hash(&plan, &inputs)
    );

    assert_eq!(
        rules_json(&objects),
        serde_json::json!([
            {"apiGroups": ["cairn.dev"], "resources": ["agentsessions"], "resourceNames": ["research"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["cairn.dev"], "resources": ["agentsessions/status"], "resourceNames": ["research"], "verbs": ["patch", "update"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["anthropic-key", "cairn-research-api-token", "s3-creds"], "verbs": ["get"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["cairn-research"], "verbs": ["get", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": ["cairn.dev"], "resources": ["compactionpolicies"], "resourceNames": ["frugal"], "verbs": ["get", "list", "watch"]},
        ])
    );

    // Precedence defaults <- policyRef <- inline.
    assert_eq!(plan.policy.budget_ratio, 0.5);
    assert_eq!(plan.policy.microcompact.summarize_after_turns, 3);
    assert_eq!(
        plan.archive.session_prefix("team-a", "research"),
        "cairn/team-a/research/"
    );
    assert!(!plan.archive.retain_on_delete);
    assert_eq!(plan.payload_cap.map(|p| p.bytes()), Some(5 * 1024 * 1024));
}

#[test]
fn suspended_session_has_no_pod_and_keeps_everything_else() {
    let running = build(&plan("chat", MINIMAL, None), &inputs());
    let suspended = build(
        &plan("chat", &format!("{MINIMAL}\nsuspend: true"), None),
        &inputs(),
    );
    assert_snapshot("suspended", &suspended);
    assert_eq!(suspended.pod, None);
    let mut resumed = suspended.clone();
    resumed.pod = running.pod.clone();
    assert_eq!(resumed, running, "suspend removes only the pod");
}

#[test]
fn bedrock_and_openai_compatible_keys_land_in_their_variables() {
    let bedrock = build(
        &plan(
            "br",
            "provider: {kind: bedrock, model: claude, region: us-west-2, credentials: {secretName: br}}",
            None,
        ),
        &inputs(),
    );
    let env_b = env(&bedrock);
    assert_eq!(env_b["AWS_BEARER_TOKEN_BEDROCK"], "secret:br/api-key");
    assert_eq!(env_b["AWS_REGION"], "us-west-2");
    let compat = build(
        &plan(
            "oc",
            "provider: {kind: openai-compatible, model: m, baseUrl: 'http://vllm:8000', credentials: {secretName: k, key: token}}",
            None,
        ),
        &inputs(),
    );
    assert_eq!(env(&compat)["OPENAI_API_KEY"], "secret:k/token");
    let gemini = build(
        &plan(
            "g",
            "provider: {kind: gemini, model: gemini-2.5-pro, credentials: {secretName: g}}",
            None,
        ),
        &inputs(),
    );
    assert_eq!(env(&gemini)["GEMINI_API_KEY"], "secret:g/api-key");
}

#[test]
fn policy_changes_never_touch_the_pod_template() {
    let base = plan("chat", FULL, Some(FRUGAL));
    let edited_policy = plan("chat", FULL, Some("budgetRatio: 0.3"));
    let edited_inline = plan(
        "chat",
        &FULL.replace(
            "compaction: {budgetRatio: 0.5}",
            "compaction: {minKeepRecent: 20}",
        ),
        Some(FRUGAL),
    );
    for other in [&edited_policy, &edited_inline] {
        assert_ne!(base.policy_hash, other.policy_hash, "the policy did change");
        assert_eq!(
            restart_hash(&base, &inputs()),
            restart_hash(other, &inputs())
        );
        assert_eq!(
            build(&base, &inputs()).pod,
            build(other, &inputs()).pod,
            "a policy edit must not roll the pod"
        );
    }
}

#[test]
fn restart_hash_follows_image_resources_credentials_and_s3_settings() {
    let base = plan("chat", FULL, Some(FRUGAL));
    let hash = |p: &Plan, i: &BuildInputs| restart_hash(p, i);
    let h0 = hash(&base, &inputs());
    assert_eq!(h0, hash(&base, &inputs()), "stable");

    let image = plan(
        "chat",
        &FULL.replace("cairn-agent:2.0", "cairn-agent:2.1"),
        Some(FRUGAL),
    );
    assert_ne!(h0, hash(&image, &inputs()), "image");
    let resources = plan(
        "chat",
        &FULL.replace("cpu: 250m", "cpu: 500m"),
        Some(FRUGAL),
    );
    assert_ne!(h0, hash(&resources, &inputs()), "resources");
    let bucket = plan(
        "chat",
        &FULL.replace("bucket: cairn-archive", "bucket: other-bucket"),
        Some(FRUGAL),
    );
    assert_ne!(h0, hash(&bucket, &inputs()), "s3 settings");

    let mut rotated = inputs();
    rotated.provider_secret_digest = Some("p2".into());
    assert_ne!(h0, hash(&base, &rotated), "provider credential content");
    let mut rotated_s3 = inputs();
    rotated_s3.s3_secret_digest = Some("s2".into());
    assert_ne!(h0, hash(&base, &rotated_s3), "s3 credential content");

    // The token is not a restart input: it never changes once generated.
    let mut other_token = inputs();
    other_token.api_token = ApiToken::from_existing("another".into());
    assert_eq!(h0, hash(&base, &other_token));
}

#[test]
fn the_token_never_shows_in_debug_output() {
    let token = ApiToken::generate();
    assert_eq!(token.expose().len(), 64);
    assert_ne!(token, ApiToken::generate());
    let mut i = inputs();
    i.api_token = token.clone();
    let printed = format!("{i:?} {token:?}");
    assert!(!printed.contains(token.expose()), "{printed}");
}

#[test]
fn operator_archive_defaults_fill_unset_fields() {
    let mut d = defaults();
    d.archive.bucket = Some("shared".into());
    d.archive.endpoint = Some("http://garage:3900".into());
    d.archive.credentials_secret = Some("cairn-s3".into());
    let p = validate(&session("chat", MINIMAL), None, &d).expect("validates");
    assert_eq!(p.archive.bucket.as_deref(), Some("shared"));
    assert!(p.archive.force_path_style, "an endpoint implies path style");
    assert!(p.archive.retain_on_delete, "retain by default");
    let objects = build(&p, &inputs());
    let env = env(&objects);
    assert_eq!(env["CAIRN_S3_BUCKET"], "shared");
    assert_eq!(
        env["CAIRN_S3_ACCESS_KEY_ID"],
        "secret:cairn-s3/AWS_ACCESS_KEY_ID"
    );
}

/// The operator configured the way a platform team turns on span export.
fn otlp_defaults() -> Defaults {
    let cli = Cli::try_parse_from([
        "cairn-operator",
        "--agent-image=registry.local/cairn-agent:1.0",
        "--agent-otlp-endpoint=https://otel-collector.observability:4318",
        "--agent-otlp-headers-secret=otlp-auth",
        "--agent-otlp-resource-attributes=k8s.cluster.name=prod-eu,deployment.environment=prod",
    ])
    .expect("flags parse");
    cli.operator.defaults()
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    operator: OperatorArgs,
}

fn parse(flags: &[&str]) -> Result<Defaults, clap::Error> {
    Cli::try_parse_from(std::iter::once("cairn-operator").chain(flags.iter().copied()))
        .map(|cli| cli.operator.defaults())
}

#[test]
fn otlp_flags_resolve_to_one_export_setting_or_none() {
    assert_eq!(
        otlp_defaults().otlp,
        Some(OtlpExport {
            endpoint: "https://otel-collector.observability:4318".into(),
            headers_secret: Some("otlp-auth".into()),
            resource_attributes: Some(
                "k8s.cluster.name=prod-eu,deployment.environment=prod".into()
            ),
        })
    );
    let unset = parse(&[]).expect("no flags parse");
    assert_eq!(unset.otlp, None);
    // The chart may pass empty variables; they mean unset, and headers or attributes without
    // an endpoint have nothing to apply to.
    let empty = parse(&[
        "--agent-otlp-endpoint=",
        "--agent-otlp-headers-secret=otlp-auth",
        "--agent-otlp-resource-attributes=k8s.cluster.name=prod-eu",
    ])
    .expect("empty endpoint parses");
    assert_eq!(empty.otlp, None);
    let plain = parse(&["--agent-otlp-endpoint=http://collector:4318"]).expect("parses");
    assert_eq!(
        plain.otlp,
        Some(OtlpExport {
            endpoint: "http://collector:4318".into(),
            headers_secret: None,
            resource_attributes: None,
        })
    );
}

#[test]
fn bad_otlp_flags_stop_the_operator_at_start_up() {
    for endpoint in [
        "otel-collector:4318",
        "grpc://otel-collector:4317",
        "ftp://otel-collector",
        "http://",
        "/v1/traces",
        "http://exa mple:4318",
    ] {
        let err = parse(&[&format!("--agent-otlp-endpoint={endpoint}")])
            .expect_err("endpoint must be refused");
        assert!(
            err.to_string().contains("--agent-otlp-endpoint"),
            "{endpoint}: {err}"
        );
    }
    for attributes in ["cluster", "=prod", "k8s.cluster.name=prod,", "a=1,,b=2"] {
        let err = parse(&[
            "--agent-otlp-endpoint=http://collector:4318",
            &format!("--agent-otlp-resource-attributes={attributes}"),
        ])
        .expect_err("attributes must be refused");
        assert!(err.to_string().contains("key=value"), "{attributes}: {err}");
    }
}

fn env_var<'a>(objects: &'a SessionObjects, name: &str) -> Option<&'a EnvVar> {
    container(objects)
        .env
        .as_ref()
        .and_then(|env| env.iter().find(|e| e.name == name))
}

#[test]
fn otlp_export_adds_the_standard_variables_and_nothing_else() {
    let with = validate(
        &session("chat", FULL),
        Some(&policy(FRUGAL)),
        &otlp_defaults(),
    )
    .expect("validates");
    let mut i = inputs();
    i.otlp_headers_digest = Some("h1".into());
    let objects = build(&with, &i);

    let env = env(&objects);
    assert_eq!(
        env["OTEL_EXPORTER_OTLP_ENDPOINT"],
        "https://otel-collector.observability:4318"
    );
    assert_eq!(
        env["OTEL_RESOURCE_ATTRIBUTES"],
        "k8s.cluster.name=prod-eu,deployment.environment=prod"
    );
    let headers = env_var(&objects, "OTEL_EXPORTER_OTLP_HEADERS")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|f| f.secret_key_ref.as_ref())
        .expect("headers come from a Secret");
    assert_eq!(headers.name, "otlp-auth");
    assert_eq!(headers.key, "OTEL_EXPORTER_OTLP_HEADERS");
    assert_eq!(
        headers.optional,
        Some(true),
        "a namespace without the Secret still runs its sessions"
    );
    assert!(
        env_var(&objects, "OTEL_EXPORTER_OTLP_HEADERS").is_some_and(|e| e.value.is_none()),
        "the headers never sit in the pod spec"
    );

    // Without the setting the pod is the same except for the export variables and the hash.
    let without = plan("chat", FULL, Some(FRUGAL));
    let mut plain = build(&without, &inputs());
    assert!(
        env_var(&plain, "OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
            && !container(&plain)
                .env
                .iter()
                .flatten()
                .any(|e| e.name.starts_with("OTEL_")),
        "unset: no OTEL_ variable at all"
    );
    let mut stripped = objects.clone();
    for o in [&mut stripped, &mut plain] {
        let pod = o.pod.as_mut().expect("pod");
        if let Some(a) = pod.metadata.annotations.as_mut() {
            a.remove(RESTART_HASH_ANNOTATION);
        }
        if let Some(env) = pod.spec.as_mut().and_then(|p| p.containers[0].env.as_mut()) {
            env.retain(|e| !e.name.starts_with("OTEL_"));
        }
    }
    assert_eq!(stripped, plain);

    // Only the endpoint is required: no headers Secret, no attributes, no variables for them.
    let mut d = defaults();
    d.otlp = Some(OtlpExport {
        endpoint: "http://collector:4318".into(),
        headers_secret: None,
        resource_attributes: None,
    });
    let minimal = validate(&session("chat", MINIMAL), None, &d).expect("validates");
    let objects = build(&minimal, &inputs());
    let otel: Vec<&str> = container(&objects)
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .filter(|n| n.starts_with("OTEL_"))
        .collect();
    assert_eq!(otel, ["OTEL_EXPORTER_OTLP_ENDPOINT"]);
}

#[test]
fn otlp_settings_and_headers_roll_the_pod_and_unset_keeps_todays_hash() {
    let with = |otlp: Option<OtlpExport>| {
        let mut d = defaults();
        d.otlp = otlp;
        validate(&session("chat", MINIMAL), None, &d).expect("validates")
    };
    let base = otlp_defaults().otlp.expect("configured");
    let h0 = restart_hash(&with(Some(base.clone())), &inputs());

    let unset = restart_hash(&with(None), &inputs());
    assert_ne!(h0, unset, "turning export on or off");
    // An operator without span export gives the hash the pods already carry (the minimal
    // snapshot pins it), so upgrading it restarts nothing.
    assert_eq!(unset, restart_hash(&plan("chat", MINIMAL, None), &inputs()));
    let mut stray = inputs();
    stray.otlp_headers_digest = Some("h1".into());
    assert_eq!(unset, restart_hash(&with(None), &stray));

    let endpoint = OtlpExport {
        endpoint: "https://other-collector:4318".into(),
        ..base.clone()
    };
    assert_ne!(
        h0,
        restart_hash(&with(Some(endpoint)), &inputs()),
        "endpoint"
    );
    let attributes = OtlpExport {
        resource_attributes: Some("k8s.cluster.name=prod-us".into()),
        ..base.clone()
    };
    assert_ne!(
        h0,
        restart_hash(&with(Some(attributes)), &inputs()),
        "resource attributes"
    );
    let secret = OtlpExport {
        headers_secret: Some("otlp-auth-v2".into()),
        ..base.clone()
    };
    assert_ne!(
        h0,
        restart_hash(&with(Some(secret)), &inputs()),
        "headers Secret"
    );

    let mut created = inputs();
    created.otlp_headers_digest = Some("h1".into());
    let h1 = restart_hash(&with(Some(base.clone())), &created);
    assert_ne!(h0, h1, "the headers Secret appearing");
    let mut rotated = inputs();
    rotated.otlp_headers_digest = Some("h2".into());
    assert_ne!(
        h1,
        restart_hash(&with(Some(base)), &rotated),
        "rotated headers"
    );
}

fn invalid(name: &str, spec: &str, policy_spec: Option<&str>) -> ValidationError {
    let p = policy_spec.map(policy);
    validate(&session(name, spec), p.as_ref(), &defaults()).expect_err("must be refused")
}

#[test]
fn a_system_prompt_from_a_config_map_is_mounted_not_granted() {
    let objects = build(
        &plan(
            "chat",
            &format!("{MINIMAL}\nsystemPromptFrom: {{configMapName: prompts, key: reviewer}}"),
            None,
        ),
        &inputs(),
    );
    let pod = pod(&objects);
    let volume = pod
        .volumes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == "system-prompt")
        .expect("prompt volume");
    let cm = volume.config_map.expect("configMap source");
    assert_eq!(cm.name, "prompts");
    assert_eq!(cm.items.clone().unwrap_or_default()[0].key, "reviewer");
    let mount = container(&objects)
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.name == "system-prompt")
        .expect("prompt mount");
    assert_eq!(mount.read_only, Some(true));
    assert_eq!(
        env(&objects)["CAIRN_SYSTEM_PROMPT_FILE"],
        "/etc/cairn/system-prompt/system-prompt"
    );
    assert!(
        !rules_json(&objects).to_string().contains("configmaps"),
        "the Role stays limited to the session's own objects"
    );
}

#[test]
fn mcp_header_secrets_are_mounted_into_their_session_only_and_never_granted() {
    let tools = "tools:\n  mcpServers:\n  - {name: search, url: 'https://tools.example.com/mcp', headersFrom: search-token}\n  - {name: fs, command: mcp-server-filesystem, args: [/work]}\n";
    let a = build(
        &plan("alpha", &format!("{MINIMAL}\n{tools}"), None),
        &inputs(),
    );
    let pod_a = pod(&a);
    let volumes: Vec<_> = pod_a
        .volumes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v.secret.is_some())
        .collect();
    let names: Vec<_> = volumes
        .iter()
        .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
        .collect();
    assert!(names.contains(&"search-token".to_string()), "{names:?}");
    let mount = container(&a)
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.mount_path == "/var/run/cairn/mcp-headers/search")
        .expect("headers mount");
    assert_eq!(mount.read_only, Some(true));
    assert_eq!(
        env(&a)["CAIRN_MCP_HEADERS_DIR_SEARCH"],
        "/var/run/cairn/mcp-headers/search"
    );
    assert!(
        !rules_json(&a).to_string().contains("search-token"),
        "the session's Role grants nothing on the headers Secret: the kubelet mounts it"
    );
    // Another session of the namespace has no path to the Secret.
    let b = build(&plan("beta", MINIMAL, None), &inputs());
    let spec_b = serde_json::to_string(&pod(&b)).unwrap();
    assert!(!spec_b.contains("search-token"), "{spec_b}");
    assert!(!env(&b).keys().any(|k| k.starts_with("CAIRN_MCP_HEADERS")));
}

#[test]
fn validate_refuses_bad_payload_caps() {
    for cap in ["5XB", "0", "'0MB'", "abc", "'-1MB'"] {
        let err = invalid("chat", &format!("{MINIMAL}\npayloadCap: {cap}"), None);
        assert!(
            matches!(err, ValidationError::PayloadCap(_)),
            "{cap}: {err:?}"
        );
        assert_eq!(err.label(), "InvalidPayloadCap");
    }
}

#[test]
fn validate_refuses_a_merged_policy_that_no_layer_breaks_alone() {
    // Each layer is valid on its own; together truncateAfterTurns >= summarizeAfterTurns.
    let err = invalid(
        "chat",
        &format!("{MINIMAL}\ncompaction: {{microcompact: {{summarizeAfterTurns: 3}}}}"),
        Some("microcompact: {truncateAfterTurns: 3}"),
    );
    assert!(matches!(err, ValidationError::Policy(_)), "{err:?}");
    assert!(err.to_string().contains("truncateAfterTurns"), "{err}");
}

#[test]
fn validate_refuses_missing_required_bits() {
    assert_eq!(
        invalid("chat", "provider: {kind: bedrock, model: m}", None),
        ValidationError::MissingRegion
    );
    assert_eq!(
        invalid(
            "chat",
            "provider: {kind: openai-compatible, model: m}",
            None
        ),
        ValidationError::MissingBaseUrl
    );
    assert_eq!(
        invalid("chat", "provider: {kind: openai, model: ' '}", None),
        ValidationError::MissingModel
    );
    assert_eq!(
        invalid(
            "chat",
            &format!("{MINIMAL}\ncontextWindow: 8192\nmaxOutputTokens: 8192"),
            None
        ),
        ValidationError::OutputExceedsWindow
    );
    // A session named `ccr` in namespace X with `prefix: cairn/Y` would be the `ccr/` of
    // session X in namespace Y: refused, whatever the prefix (sessions stored before the
    // API server refused the field); the operator's own root is accepted as a no-op.
    for prefix in ["a/../b", "cairn/Y", "other", "/cairn"] {
        let err = invalid(
            "ccr",
            &format!("{MINIMAL}\narchive: {{prefix: '{prefix}'}}"),
            None,
        );
        assert!(
            matches!(err, ValidationError::ArchivePrefixNotSettable { .. }),
            "{prefix}: {err:?}"
        );
        assert_eq!(err.label(), "InvalidArchivePrefix");
        assert!(err.to_string().contains("alias"), "{err}");
    }
    let own_root = validate(
        &session(
            "ccr",
            &format!("{MINIMAL}\narchive: {{prefix: cairn, retainOnDelete: false}}"),
        ),
        None,
        &Defaults::default(),
    )
    .expect("the operator's own root");
    assert_eq!(
        own_root.archive.session_prefix("team-a", "ccr"),
        "cairn/team-a/ccr/"
    );

    let mut unstored = session("chat", MINIMAL);
    unstored.metadata.uid = None;
    assert_eq!(
        validate(&unstored, None, &defaults()),
        Err(ValidationError::NotStored("uid"))
    );
}

#[test]
fn validate_refuses_names_that_cannot_name_the_objects() {
    for name in ["Chat", "a.b", "-a", &"x".repeat(47)] {
        let err = invalid(name, MINIMAL, None);
        assert!(
            matches!(err, ValidationError::InvalidName(_)),
            "{name}: {err:?}"
        );
    }
    let longest = "x".repeat(46);
    let p = plan(&longest, MINIMAL, None);
    let objects = build(&p, &inputs());
    // Every name built from the session's is a DNS label (<= 63).
    for (kind, meta) in all_metas(&objects) {
        let name = meta.name.clone().unwrap_or_default();
        assert!(name.len() <= 63, "{kind} {name}");
    }
    assert!(AgentSession::kind(&()) == "AgentSession");
}

#[test]
fn the_network_path_reaches_the_pod_session_proxies_over_the_fleet_and_both_ca_bundles() {
    let mut fleet = parse(&[
        "--agent-https-proxy=http://proxy.corp:3128",
        "--agent-no-proxy=.svc,.cluster.local",
        "--agent-ca-bundle=-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    ])
    .expect("flags");
    fleet.image = defaults().image;
    let spec = r#"
provider:
  kind: openai
  model: gpt-5
  caBundle: {configMapName: corp-ca}
template:
  proxy: {httpsProxy: "http://team-proxy.corp:8080"}
"#;
    let planned = validate(&session("net", spec), None, &fleet).expect("validates");
    let objects = build(&planned, &inputs());
    let vars = env(&objects);
    assert_eq!(
        vars["HTTPS_PROXY"], "http://team-proxy.corp:8080",
        "the session's wins"
    );
    assert_eq!(vars["NO_PROXY"], ".svc,.cluster.local", "the fleet's stays");
    assert!(!vars.contains_key("HTTP_PROXY"));
    assert!(vars["CAIRN_CA_BUNDLE_PEM"].contains("BEGIN CERTIFICATE"));
    assert_eq!(vars["CAIRN_CA_BUNDLE"], "/etc/cairn/ca/ca-bundle.pem");
    let volume = pod(&objects)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "ca-bundle")
        .expect("the bundle's volume");
    let cm = volume.config_map.as_ref().expect("from the ConfigMap");
    assert_eq!(cm.name, "corp-ca");
    assert_eq!(cm.items.as_ref().unwrap()[0].key, "ca.crt");
    assert!(
        container(&objects)
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/etc/cairn/ca" && m.read_only == Some(true))
    );

    // `template.env`: its own variables reach the container; its proxy variables set the
    // session's proxies where `template.proxy` does not.
    let spec = r#"
provider: {kind: openai, model: gpt-5}
template:
  proxy: {httpsProxy: "http://team-proxy.corp:8080"}
  env:
  - {name: HTTPS_PROXY, value: "http://ignored.corp:1"}
  - {name: HTTP_PROXY, value: "http://plain-proxy.corp:3128"}
  - {name: TEAM, value: search}
  - name: REGION
    valueFrom: {configMapKeyRef: {name: team, key: region}}
"#;
    let planned = validate(&session("envs", spec), None, &fleet).expect("validates");
    let objects = build(&planned, &inputs());
    let vars = env(&objects);
    assert_eq!(
        vars["HTTPS_PROXY"], "http://team-proxy.corp:8080",
        "proxy wins"
    );
    assert_eq!(
        vars["HTTP_PROXY"], "http://plain-proxy.corp:3128",
        "env over fleet"
    );
    assert_eq!(vars["TEAM"], "search");
    let all = container(&objects).env.clone().unwrap_or_default();
    let region = all.iter().find(|e| e.name == "REGION").expect("REGION");
    assert!(
        region
            .value_from
            .as_ref()
            .unwrap()
            .config_map_key_ref
            .is_some()
    );
    for name in ["HTTPS_PROXY", "HTTP_PROXY", "TEAM"] {
        assert_eq!(
            all.iter().filter(|e| e.name == name).count(),
            1,
            "{name} once"
        );
    }

    // Without any of it, none of it.
    let plain = env(&build(&plan("plain", MINIMAL, None), &inputs()));
    for k in [
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "NO_PROXY",
        "CAIRN_CA_BUNDLE",
        "CAIRN_CA_BUNDLE_PEM",
    ] {
        assert!(!plain.contains_key(k), "{k}");
    }
}

/// The operator's fleet-wide pod settings, as the chart passes them (`agent.pod` as JSON).
fn pod_defaults() -> cairn_operator::config::PodDefaults {
    cairn_operator::config::pod_defaults(
        r#"{
          "imagePullSecrets": ["fleet-pull"],
          "serviceAccountAnnotations": {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::123:role/cairn-{namespace}-{session}",
            "fleet": "yes"
          },
          "labels": {"team": "platform", "cost-center": "42"},
          "annotations": {"fleet": "yes"},
          "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["agents"]}]}]}}},
          "tolerations": [{"key": "agents", "operator": "Exists", "effect": "NoSchedule"}],
          "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "cairn-agent"}}}],
          "priorityClassName": "agents",
          "runtimeClassName": "gvisor"
        }"#,
    )
    .expect("pod defaults parse")
}

fn build_with_pod_defaults(spec: &str) -> SessionObjects {
    let d = Defaults {
        pod: pod_defaults(),
        ..defaults()
    };
    let plan = validate(&session("chat", spec), None, &d).expect("fixture validates");
    build(&plan, &inputs())
}

#[test]
fn fleet_pod_defaults_land_on_the_pod_and_the_service_account() {
    let objects = build_with_pod_defaults(MINIMAL);
    let p = pod(&objects);
    assert_eq!(
        p.image_pull_secrets
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["fleet-pull"]
    );
    assert_eq!(p.priority_class_name.as_deref(), Some("agents"));
    assert_eq!(p.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(p.tolerations.as_ref().map(Vec::len), Some(1));
    assert_eq!(
        p.topology_spread_constraints.as_ref().map(Vec::len),
        Some(1)
    );
    assert!(
        p.affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .is_some()
    );

    let meta = the_pod(&objects).metadata.clone();
    let labels = meta.labels.unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("platform"));
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("cairn-agent")
    );
    let annotations = meta.annotations.unwrap_or_default();
    assert_eq!(annotations.get("fleet").map(String::as_str), Some("yes"));
    assert!(annotations.contains_key(RESTART_HASH_ANNOTATION));

    let sa = objects
        .service_account
        .metadata
        .annotations
        .clone()
        .unwrap_or_default();
    assert_eq!(
        sa.get("eks.amazonaws.com/role-arn").map(String::as_str),
        Some("arn:aws:iam::123:role/cairn-team-a-chat"),
        "the placeholders name the session"
    );
}

#[test]
fn a_session_template_overrides_the_fleet_pod_defaults() {
    let objects = build_with_pod_defaults(
        r#"
provider: {kind: openai, model: gpt-5}
template:
  imagePullSecrets: [{name: team-pull}, {name: fleet-pull}]
  serviceAccountAnnotations:
    eks.amazonaws.com/role-arn: "arn:aws:iam::999:role/{session}-special"
    mine: "{session}"
  labels: {team: a}
  annotations: {fleet: "no", mine: "1"}
  affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, podAffinityTerm: {topologyKey: kubernetes.io/hostname}}]}}
  tolerations: []
  topologySpreadConstraints: []
  priorityClassName: interactive
  runtimeClassName: kata
"#,
    );
    let p = pod(&objects);
    assert_eq!(
        p.image_pull_secrets
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["fleet-pull", "team-pull"],
        "pull secrets add up, once each"
    );
    assert_eq!(p.priority_class_name.as_deref(), Some("interactive"));
    assert_eq!(
        p.runtime_class_name.as_deref(),
        Some("gvisor"),
        "the platform's sandbox is not the session's to leave"
    );
    assert_eq!(
        p.tolerations.as_deref(),
        Some(&[][..]),
        "an empty list replaces the default"
    );
    assert_eq!(p.topology_spread_constraints.as_deref(), Some(&[][..]));
    let affinity = p.affinity.clone().unwrap_or_default();
    assert!(affinity.node_affinity.is_none() && affinity.pod_anti_affinity.is_some());

    let meta = the_pod(&objects).metadata.clone();
    let labels = meta.labels.unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(labels.get("cost-center").map(String::as_str), Some("42"));
    let annotations = meta.annotations.unwrap_or_default();
    assert_eq!(annotations.get("fleet").map(String::as_str), Some("no"));
    assert_eq!(annotations.get("mine").map(String::as_str), Some("1"));

    let sa = objects
        .service_account
        .metadata
        .annotations
        .clone()
        .unwrap_or_default();
    assert_eq!(
        sa.get("eks.amazonaws.com/role-arn").map(String::as_str),
        Some("arn:aws:iam::123:role/cairn-team-a-chat"),
        "a session cannot point its identity at another role than the platform's"
    );
    assert_eq!(sa.get("fleet").map(String::as_str), Some("yes"));
    assert_eq!(
        sa.get("mine").map(String::as_str),
        Some("chat"),
        "it may add its own"
    );

    // Where the platform sets neither, the session's role and runtime class apply.
    let plan = validate(
        &session(
            "chat",
            "provider: {kind: openai, model: gpt-5}\ntemplate: {runtimeClassName: kata, serviceAccountAnnotations: {eks.amazonaws.com/role-arn: \"arn:aws:iam::999:role/{session}\"}}",
        ),
        None,
        &defaults(),
    )
    .expect("validates");
    let objects = build(&plan, &inputs());
    assert_eq!(pod(&objects).runtime_class_name.as_deref(), Some("kata"));
    assert_eq!(
        objects
            .service_account
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("eks.amazonaws.com/role-arn")
            .map(String::as_str),
        Some("arn:aws:iam::999:role/chat")
    );
}

#[test]
fn without_pod_settings_nothing_extra_is_set() {
    let objects = build(&plan("chat", MINIMAL, None), &inputs());
    let p = pod(&objects);
    assert!(p.image_pull_secrets.is_none() && p.affinity.is_none() && p.tolerations.is_none());
    assert!(p.topology_spread_constraints.is_none() && p.priority_class_name.is_none());
    assert!(p.runtime_class_name.is_none());
    assert!(objects.service_account.metadata.annotations.is_none());
}

#[test]
fn the_operators_selector_labels_cannot_be_overridden() {
    // From the operator's flag: refused at start-up.
    let refused = cairn_operator::config::pod_defaults(r#"{"labels": {"cairn.dev/session": "x"}}"#)
        .expect_err("a reserved label");
    assert!(refused.contains("cairn.dev/session"), "{refused}");
    assert!(
        cairn_operator::config::pod_defaults(r#"{"lables": {}}"#).is_err(),
        "a misspelt field stops the operator rather than being ignored"
    );
    // A session stored before the API server's rule refused it (or written around it): the
    // operator's labels still win, so the shared Service's selector keeps matching.
    let objects = build(
        &plan(
            "chat",
            "provider: {kind: openai, model: gpt-5}\ntemplate: {labels: {cairn.dev/session: other, app.kubernetes.io/name: evil}}",
            None,
        ),
        &inputs(),
    );
    let labels = the_pod(&objects)
        .metadata
        .labels
        .clone()
        .unwrap_or_default();
    assert_eq!(
        labels.get("cairn.dev/session").map(String::as_str),
        Some("chat")
    );
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("cairn-agent")
    );
}

fn network_policy_with(np: cairn_operator::config::NetworkPolicyDefaults) -> serde_json::Value {
    let d = Defaults {
        network_policy: np,
        ..defaults()
    };
    let plan = validate(&session("chat", MINIMAL), None, &d).expect("fixture validates");
    serde_json::to_value(build(&plan, &inputs()).network_policy.spec).expect("serializes")
}

#[test]
fn the_monitoring_namespace_is_admitted_on_the_agent_port() {
    let spec = network_policy_with(cairn_operator::config::NetworkPolicyDefaults {
        monitoring_namespace: Some("monitoring".into()),
        ..Default::default()
    });
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]));
    assert_eq!(
        spec["ingress"],
        serde_json::json!([{
            "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "cairn-system"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cairn-gateway"}}},
                {"podSelector": {"matchLabels": {"cairn.dev/client": "true"},
                                 "matchExpressions": [{"key": "cairn.dev/session", "operator": "DoesNotExist"}]}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
            ],
            "ports": [{"port": 8080, "protocol": "TCP"}]
        }])
    );
    assert!(spec.get("egress").is_none(), "egress stays open by default");
}

#[test]
fn restricted_egress_allows_dns_and_the_configured_blocks_only() {
    let egress = cairn_operator::config::egress_policy(
        r#"{"to": [{"cidr": "10.96.0.1/32", "ports": [443]},
                   {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"], "ports": [443, 9000]}]}"#,
    )
    .expect("egress parses");
    let spec = network_policy_with(cairn_operator::config::NetworkPolicyDefaults {
        egress: Some(egress),
        ..Default::default()
    });
    assert_eq!(
        spec["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert_eq!(
        spec["egress"],
        serde_json::json!([
            {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
            {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]},
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}}],
             "ports": [{"port": 443, "protocol": "TCP"}, {"port": 9000, "protocol": "TCP"}]}
        ])
    );
    let no_dns = cairn_operator::config::egress_policy(r#"{"dns": false}"#).expect("parses");
    let spec = network_policy_with(cairn_operator::config::NetworkPolicyDefaults {
        egress: Some(no_dns),
        ..Default::default()
    });
    assert_eq!(spec["egress"], serde_json::json!([]), "deny all egress");
    for bad in [
        r#"{"to": [{"cidr": "api.openai.com"}]}"#,
        r#"{"to": [{"cidr": "10.0.0.0/33"}]}"#,
        r#"{"to": [{"cidr": "10.0.0.0/8", "ports": [0]}]}"#,
        r#"{"allow": []}"#,
    ] {
        assert!(
            cairn_operator::config::egress_policy(bad).is_err(),
            "{bad} is refused"
        );
    }
}

#[test]
fn the_gateway_pod_labels_parse_as_key_value_pairs() {
    use cairn_operator::config::label_pairs;
    let labels =
        label_pairs(" app.kubernetes.io/name=cairn-gateway , app.kubernetes.io/instance=r,")
            .expect("parses");
    assert_eq!(
        labels.0,
        [
            ("app.kubernetes.io/instance".to_string(), "r".to_string()),
            (
                "app.kubernetes.io/name".to_string(),
                "cairn-gateway".to_string()
            ),
        ]
        .into()
    );
    for bad in ["", " , ", "app", "=x"] {
        assert!(label_pairs(bad).is_err(), "{bad:?} is refused");
    }
}

#[test]
fn a_bucket_without_credentials_is_refused_with_what_to_set() {
    let with_bucket = Defaults {
        archive: cairn_operator::config::ArchiveDefaults {
            bucket: Some("cairn".into()),
            ..Defaults::default().archive
        },
        ..defaults()
    };
    let err = validate(&session("chat", MINIMAL), None, &with_bucket).expect_err("refused");
    assert_eq!(err.label(), "ArchiveCredentialsMissing");
    let text = err.to_string();
    for needle in [
        "\"cairn\"",
        "spec.archive.credentials.secretName",
        "archive.credentialsSecret",
        "AWS_ACCESS_KEY_ID",
    ] {
        assert!(text.contains(needle), "{needle} in {text}");
    }
    // Credentials from the session, or from the operator's default, make it usable.
    let own = "provider: {kind: openai, model: gpt-5}\narchive: {credentials: {secretName: s3}}";
    assert!(validate(&session("chat", own), None, &with_bucket).is_ok());
    let mut with_default = with_bucket.clone();
    with_default.archive.credentials_secret = Some("s3".into());
    assert!(validate(&session("chat", MINIMAL), None, &with_default).is_ok());
    // No bucket at all: the session runs on its scratch volume (ArchiveReady says so).
    assert!(validate(&session("chat", MINIMAL), None, &defaults()).is_ok());
    // An identity of the pod's own: declared fleet-wide, or an IRSA role (the fleet's or the
    // session's own ServiceAccount annotation). The agent then takes the default chain.
    for needle in ["archive.scoped", "archive.ambientCredentials"] {
        assert!(text.contains(needle), "{needle} in {text}");
    }
    let mut ambient = with_bucket.clone();
    ambient.archive.ambient_credentials = true;
    let plan = validate(&session("chat", MINIMAL), None, &ambient).expect("ambient");
    assert!(plan.archive.ambient && plan.archive.credentials.is_none());
    let mut fleet_role = with_bucket.clone();
    fleet_role.pod.service_account_annotations.insert(
        "eks.amazonaws.com/role-arn".into(),
        "arn:aws:iam::123:role/cairn-{namespace}-{session}".into(),
    );
    assert!(validate(&session("chat", MINIMAL), None, &fleet_role).is_ok());
    let own_role = "provider: {kind: openai, model: gpt-5}\ntemplate:\n  serviceAccountAnnotations: {eks.amazonaws.com/role-arn: 'arn:aws:iam::123:role/team'}";
    assert!(validate(&session("chat", own_role), None, &with_bucket).is_ok());
    // An annotation that is not a role does not count.
    let other = "provider: {kind: openai, model: gpt-5}\ntemplate:\n  serviceAccountAnnotations: {team: search}";
    assert!(validate(&session("chat", other), None, &with_bucket).is_err());
    // The agent gets no key variables then.
    let objects = build(&plan, &inputs());
    assert!(!env(&objects).keys().any(|k| k.contains("ACCESS_KEY")));
}

fn scoped_defaults() -> Defaults {
    parse(&[
        "--agent-image=registry.local/cairn-agent:1.0",
        "--archive-bucket=cairn",
        "--archive-endpoint=http://s3.storage.svc:8333",
        "--archive-credentials-secret=shared-s3",
        "--archive-scoped=true",
        "--archive-scoped-role-arn=arn:aws:iam::000000000000:role/cairn-archive",
        "--archive-scoped-refresh-before-seconds=600",
        "--archive-scoped-admin-credentials-dir=/var/run/cairn/archive-admin",
    ])
    .expect("scoped flags parse")
}

#[test]
fn scoped_flags_resolve_and_bad_lifetimes_are_refused() {
    let d = scoped_defaults();
    let scoped = d.archive.scoped.expect("scoped mode");
    assert_eq!(
        scoped.role_arn.as_deref(),
        Some("arn:aws:iam::000000000000:role/cairn-archive")
    );
    assert_eq!(scoped.sts_endpoint, None);
    assert_eq!(scoped.duration, std::time::Duration::from_secs(3600));
    assert_eq!(
        scoped.refresh_before,
        Some(std::time::Duration::from_secs(600))
    );
    assert_eq!(parse(&[]).expect("parses").archive.scoped, None);
    // STS grants 15 minutes to 12 hours.
    for bad in ["899", "43201", "abc"] {
        assert!(
            parse(&[
                "--archive-scoped=true",
                &format!("--archive-scoped-duration-seconds={bad}")
            ])
            .is_err(),
            "{bad}"
        );
    }
}

#[test]
fn scoped_credentials_are_the_default_when_the_operator_holds_admin_credentials() {
    let admin = tempfile::tempdir().expect("dir");
    let dir = format!(
        "--archive-scoped-admin-credentials-dir={}",
        admin.path().display()
    );
    let flags = |scoped: Option<&str>| {
        let mut flags = vec![
            "--archive-bucket=cairn",
            "--archive-credentials-secret=shared-s3",
            dir.as_str(),
        ];
        flags.extend(scoped);
        parse(&flags).expect("flags parse")
    };
    // No admin credentials: nothing to mint with, the shared Secret as before.
    assert_eq!(flags(None).archive.scoped, None);
    std::fs::write(admin.path().join("AWS_ACCESS_KEY_ID"), "admin").expect("write");
    assert_eq!(flags(None).archive.scoped, None, "half a key pair is none");
    std::fs::write(admin.path().join("AWS_SECRET_ACCESS_KEY"), "secret\n").expect("write");

    // Admin credentials and no explicit setting: scoped, the shared Secret is not handed out.
    for auto in [None, Some("--archive-scoped=auto")] {
        let d = flags(auto);
        let scoped = d.archive.scoped.as_ref().expect("scoped by default");
        assert_eq!(scoped.admin_credentials_dir, admin.path());
        let plan = validate(&session("s", MINIMAL), None, &d).expect("validates");
        assert!(plan.archive.scoped && plan.archive.credentials.is_none());
    }
    // Explicitly off: the shared Secret, and the plan says it is the operator's default.
    let off = flags(Some("--archive-scoped=false"));
    assert_eq!(off.archive.scoped, None);
    let plan = validate(&session("s", MINIMAL), None, &off).expect("validates");
    assert!(!plan.archive.scoped && plan.archive.default_credentials);
    assert!(!plan.archive.shared_credentials_accepted);
    assert_eq!(
        plan.archive
            .credentials
            .as_ref()
            .map(|c| c.secret_name.as_str()),
        Some("shared-s3")
    );
    // Explicitly on works without them (the minting then says what is missing).
    let empty = tempfile::tempdir().expect("dir");
    let on = parse(&[
        "--archive-bucket=cairn",
        "--archive-scoped=true",
        &format!(
            "--archive-scoped-admin-credentials-dir={}",
            empty.path().display()
        ),
    ])
    .expect("flags parse");
    assert!(on.archive.scoped.is_some());
    assert!(parse(&["--archive-scoped=maybe"]).is_err());

    // Accepting a shared key pair: per session, or for the fleet.
    let accepting = format!("{MINIMAL}\narchive: {{sharedCredentials: true}}");
    let plan = validate(&session("s", &accepting), None, &off).expect("validates");
    assert!(plan.archive.shared_credentials_accepted);
    let fleet = parse(&[
        "--archive-bucket=cairn",
        "--archive-credentials-secret=shared-s3",
        "--archive-scoped=false",
        "--archive-allow-shared-credentials=true",
    ])
    .expect("flags parse");
    let plan = validate(&session("s", MINIMAL), None, &fleet).expect("validates");
    assert!(plan.archive.shared_credentials_accepted);
}

#[test]
fn a_scoped_session_mounts_its_own_credentials_and_holds_no_key_pair() {
    let d = scoped_defaults();
    let plan = validate(&session("s", MINIMAL), None, &d).expect("validates");
    assert!(plan.archive.scoped);
    assert_eq!(
        plan.archive.credentials, None,
        "the shared Secret is not used"
    );
    let objects = build(&plan, &inputs());
    let env = env(&objects);
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        assert!(!env.contains_key(var), "{var}");
    }
    assert_eq!(
        env.get("CAIRN_S3_CREDENTIALS_DIR").map(String::as_str),
        Some("/var/run/cairn/archive-credentials")
    );
    let pod = pod(&objects);
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "archive-credentials")
        .expect("volume");
    let secret = volume.secret.as_ref().expect("a Secret volume");
    assert_eq!(
        secret.secret_name.as_deref(),
        Some("cairn-s-archive-credentials")
    );
    assert_eq!(secret.default_mode, Some(0o440));
    let mount = container(&objects)
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "archive-credentials")
        .expect("mount");
    assert_eq!(mount.mount_path, "/var/run/cairn/archive-credentials");
    assert_eq!(
        (mount.read_only, mount.sub_path.as_ref()),
        (Some(true), None)
    );
    // The agent's Role reads no credentials Secret through the API.
    let rules = rules_json(&objects).to_string();
    assert!(
        !rules.contains("archive-credentials") && !rules.contains("shared-s3"),
        "{rules}"
    );
    // Nothing about the credentials' contents is in the restart hash: a refresh (new keys,
    // same Secret) builds the same pod.
    let again = build(&plan, &inputs());
    assert_eq!(objects.pod, again.pod);
}

#[test]
fn a_scoped_session_cannot_point_the_minted_credentials_elsewhere() {
    let d = scoped_defaults();
    for (spec, field) in [
        ("archive: {bucket: other-bucket}", "bucket"),
        (
            "archive: {endpoint: 'http://evil.example:9000'}",
            "endpoint",
        ),
    ] {
        let err =
            validate(&session("s", &format!("{MINIMAL}\n{spec}")), None, &d).expect_err("refused");
        assert!(
            matches!(&err, ValidationError::ScopedArchiveOverride { field: f, .. } if *f == field),
            "{err:?}"
        );
        assert_eq!(err.label(), "ScopedArchiveOverride");
    }
    // The same values as the operator's are fine.
    let same = validate(
        &session("s", &format!("{MINIMAL}\narchive: {{bucket: cairn}}")),
        None,
        &d,
    )
    .expect("validates");
    assert!(same.archive.scoped);
    // A session with credentials of its own uses them, anywhere.
    let own = validate(
        &session(
            "s",
            &format!(
                "{MINIMAL}\narchive: {{bucket: other-bucket, credentials: {{secretName: mine}}}}"
            ),
        ),
        None,
        &d,
    )
    .expect("validates");
    assert!(!own.archive.scoped);
    assert_eq!(
        own.archive
            .credentials
            .as_ref()
            .map(|c| c.secret_name.as_str()),
        Some("mine")
    );
    let own_env = env(&build(&own, &inputs()));
    assert!(!own_env.contains_key("CAIRN_S3_CREDENTIALS_DIR"));
}

#[test]
fn the_fleet_price_table_reaches_every_agent_pod_and_a_bad_one_is_left_out() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("prices.yaml");
    let table = "claude-sonnet-4-5: {input: 3, output: 15, cacheRead: 0.3, cacheWrite: 3.75}\n";
    std::fs::write(&file, table).expect("write");
    let flag = format!("--price-table-file={}", file.display());
    let d = parse(&["--agent-image=registry.local/cairn-agent:1.0", &flag]).expect("flags");
    assert_eq!(d.price_table.as_deref(), Some(table));
    let with = validate(&session("chat", FULL), Some(&policy(FRUGAL)), &d).expect("validates");
    let objects = build(&with, &inputs());
    assert_eq!(env(&objects)["CAIRN_PRICE_TABLE"], table);

    // Not a mapping, or no file: the agents keep their catalog's prices.
    std::fs::write(&file, "- not a table\n").expect("write");
    let d = parse(&["--agent-image=registry.local/cairn-agent:1.0", &flag]).expect("flags");
    assert_eq!(d.price_table, None);
    let missing = format!("--price-table-file={}", dir.path().join("none").display());
    let d = parse(&["--agent-image=registry.local/cairn-agent:1.0", &missing]).expect("flags");
    assert_eq!(d.price_table, None);
    let objects = build(&plan("chat", FULL, Some(FRUGAL)), &inputs());
    assert!(env_var(&objects, "CAIRN_PRICE_TABLE").is_none());
}
