//! The operator against a real control plane: kube-apiserver, kube-controller-manager (garbage
//! collection, the EndpointSlice controller), kube-scheduler and kwok (fake nodes, so pods get
//! scheduled and marked Running). The cluster is the one `KUBECONFIG` points at when it is
//! set (a kind cluster, `tests/e2e/kind.sh`), else the local control plane of `tests/harness`,
//! started for this test binary:
//!
//! ```text
//! cargo test -p cairn-operator --test cluster
//! ```
//!
//! Each test gets its own namespace. By default each test runs the operator in-process, scoped
//! to that namespace; with `CAIRN_TEST_EXTERNAL_OPERATOR=1` the tests expect an operator that
//! is already running (installed with the Helm chart) and only drive the API.
//! `CAIRN_TEST_OPERATOR_AS=system:serviceaccount:NS:NAME` makes the in-process operator
//! impersonate that identity, to check the RBAC the chart grants (docs/operator.md).
//! `S3`-backed tests start moto (`python3 -m moto.server`) unless `CAIRN_TEST_S3_ENDPOINT`
//! names a reachable S3 server (credentials `CAIRN_TEST_S3_ACCESS_KEY` /
//! `CAIRN_TEST_S3_SECRET_KEY`, default `testing`/`testing`).

mod storage_migration;
mod support;
use support::condition;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use cairn_crds::{AgentSession, CompactionPolicy, Phase};
use cairn_operator::config::{Defaults, OtlpExport};
use cairn_operator::controller::{self, Context};
use cairn_operator::metrics::Metrics;
use cairn_operator::objects::RESTART_HASH_ANNOTATION;
use cairn_operator::purge::S3Purger;
use cairn_operator::watches;
use cairn_tests::harness::S3Server;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(90);

/// One test's namespace, and the operator serving it (unless an external one does).
struct TestEnv {
    client: Client,
    /// The in-process operator's client: the test's own, or impersonating
    /// `CAIRN_TEST_OPERATOR_AS` (e.g. `system:serviceaccount:cairn-system:cairn-operator`) to
    /// check the RBAC the chart grants.
    operator_client: Client,
    ns: String,
    operator: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    /// Whether the in-process operator watches the metadata of this namespace's Secrets
    /// (`--secret-watch-namespaces`). Off by default, like the chart.
    secret_watch: bool,
    /// The in-process operator's `--secret-wait-requeue-seconds`.
    secret_wait: Duration,
}

async fn config() -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(cairn_tests::harness::kubeconfig())
        .expect("kubeconfig reads");
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig is usable")
}

impl TestEnv {
    async fn new(name: &str) -> Self {
        let client = Client::try_from(config().await).expect("client");
        cairn_operator::crds::apply_crds(client.clone())
            .await
            .expect("CRDs apply");
        let suffix = hex_suffix();
        let ns = format!("cairn-{name}-{suffix}");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
            )
            .await
            .expect("create namespace");
        let sessions: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
        eventually("the AgentSession API to be served", || async {
            sessions.list(&ListParams::default()).await.ok()
        })
        .await;
        let operator_client = match std::env::var("CAIRN_TEST_OPERATOR_AS") {
            Ok(user) => {
                let mut config = config().await;
                config.auth_info.impersonate = Some(user);
                Client::try_from(config).expect("impersonating client")
            }
            Err(_) => client.clone(),
        };
        let mut env = Self {
            client,
            operator_client,
            ns,
            operator: None,
            secret_watch: false,
            secret_wait: Duration::from_secs(
                cairn_operator::config::DEFAULT_SECRET_WAIT_REQUEUE_SECONDS,
            ),
        };
        if std::env::var_os("CAIRN_TEST_EXTERNAL_OPERATOR").is_none() {
            env.start_operator();
        }
        env
    }

    fn start_operator(&mut self) {
        self.start_operator_with(Defaults {
            image: "cairn-agent:test".into(),
            ..Default::default()
        });
    }

    fn start_operator_with(&mut self, defaults: Defaults) {
        let ctx = Arc::new(
            Context::new(
                self.operator_client.clone(),
                defaults,
                Arc::new(Metrics::default()),
                Arc::new(S3Purger),
                Duration::from_secs(3600),
            )
            .with_secret_watch(self.secret_watch.then(|| self.ns.clone()), self.secret_wait),
        );
        let (tx, rx) = watch::channel(false);
        let shutdown = async move {
            let mut rx = rx;
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let handle = tokio::spawn(watches::run(ctx, Some(self.ns.clone()), 4, shutdown));
        self.operator = Some((tx, handle));
    }

    async fn stop_operator(&mut self) {
        if let Some((tx, mut handle)) = self.operator.take() {
            let _ = tx.send(true);
            if tokio::time::timeout(Duration::from_secs(10), &mut handle)
                .await
                .is_err()
            {
                handle.abort();
            }
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create_session(&self, name: &str, spec: serde_json::Value) -> AgentSession {
        let session: AgentSession = serde_json::from_value(json!({
            "apiVersion": "cairn.dev/v1beta1",
            "kind": "AgentSession",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("session fixture");
        self.api::<AgentSession>()
            .create(&PostParams::default(), &session)
            .await
            .expect("create session")
    }

    async fn create_policy(&self, name: &str, spec: serde_json::Value) {
        let policy: CompactionPolicy = serde_json::from_value(json!({
            "apiVersion": "cairn.dev/v1beta1",
            "kind": "CompactionPolicy",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("policy fixture");
        self.api::<CompactionPolicy>()
            .create(&PostParams::default(), &policy)
            .await
            .expect("create policy");
    }

    async fn patch_session(&self, name: &str, patch: serde_json::Value) {
        self.api::<AgentSession>()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch session");
    }

    async fn session(&self, name: &str) -> AgentSession {
        self.api::<AgentSession>()
            .get(name)
            .await
            .expect("get session")
    }

    /// Waits until the session reports `phase`.
    async fn wait_phase(&self, name: &str, phase: Phase) -> AgentSession {
        let api = self.api::<AgentSession>();
        eventually(&format!("{name} to reach {phase:?}"), || async {
            let s = api.get(name).await.ok()?;
            (s.status.as_ref()?.phase == Some(phase)).then_some(s)
        })
        .await
    }

    async fn pod(&self, session: &str) -> Option<Pod> {
        self.api::<Pod>()
            .get_opt(&format!("cairn-{session}-0"))
            .await
            .ok()
            .flatten()
    }

    /// Waits for the session's pod to be replaced by one with another restart hash than
    /// `hash` (a roll, not a restart of the same pod).
    async fn rolled_pod(&self, session: &str, before: &Pod, hash: &str, what: &str) -> Pod {
        eventually(what, || async {
            let pod = self.pod(session).await?;
            let rolled = pod.uid() != before.uid()
                && pod
                    .annotations()
                    .get(RESTART_HASH_ANNOTATION)
                    .map(String::as_str)
                    != Some(hash);
            rolled.then_some(pod)
        })
        .await
    }

    async fn teardown(mut self) {
        self.stop_operator().await;
        // Drop the finalizers first: the namespace must go even when a test failed mid-way.
        let sessions = self.api::<AgentSession>();
        if let Ok(list) = sessions.list(&ListParams::default()).await {
            for s in list {
                let _ = sessions
                    .patch(
                        &s.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces.delete(&self.ns, &DeleteParams::default()).await;
    }
}

fn hex_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{:06x}", (nanos ^ std::process::id()) & 0xff_ffff)
}

async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    support::eventually(WAIT, what, probe).await
}

fn restart_hash(pod: &Pod) -> String {
    pod.annotations()
        .get(RESTART_HASH_ANNOTATION)
        .cloned()
        .unwrap_or_default()
}

fn minimal() -> serde_json::Value {
    json!({"provider": {"kind": "openai", "model": "gpt-5"}})
}

fn assert_owned_by(meta: &kube::core::ObjectMeta, session: &AgentSession, kind: &str) {
    let owners = meta.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{kind} owners");
    assert_eq!(owners[0].uid, session.uid().unwrap_or_default(), "{kind}");
    assert_eq!(owners[0].controller, Some(true), "{kind}");
}

#[tokio::test]
async fn create_builds_owned_objects_and_becomes_ready() {
    let env = TestEnv::new("create").await;
    let created = env.create_session("chat", minimal()).await;
    let session = env.wait_phase("chat", Phase::Running).await;
    assert_eq!(created.uid(), session.uid());

    let status = session.status.clone().expect("status");
    assert_eq!(status.pod.as_deref(), Some("cairn-chat-0"));
    assert_eq!(
        status.service_url,
        Some(format!(
            "http://cairn-chat.cairn-sessions.{}.svc:8080",
            env.ns
        ))
    );
    assert_eq!(status.observed_generation, session.metadata.generation);
    assert_eq!(
        condition(&session, "Ready"),
        Some(("True".into(), "AgentReady".into()))
    );
    assert_eq!(
        condition(&session, "PolicyResolved").map(|c| c.0),
        Some("True".into())
    );
    let expected_hash = cairn_crds::resolve(None, None).expect("defaults").hash();
    assert_eq!(status.policy_hash, Some(expected_hash));
    assert!(
        !session
            .finalizers()
            .iter()
            .any(|f| f == controller::FINALIZER),
        "no bucket, nothing to purge: no finalizer"
    );

    let name = "cairn-chat";
    assert_owned_by(
        &env.pod("chat").await.expect("pod").metadata,
        &session,
        "Pod",
    );
    assert_owned_by(
        &env.api::<ServiceAccount>()
            .get(name)
            .await
            .expect("sa")
            .metadata,
        &session,
        "ServiceAccount",
    );
    assert_owned_by(
        &env.api::<Role>().get(name).await.expect("role").metadata,
        &session,
        "Role",
    );
    assert_owned_by(
        &env.api::<RoleBinding>()
            .get(name)
            .await
            .expect("rb")
            .metadata,
        &session,
        "RoleBinding",
    );
    // The namespace's shared Service and NetworkPolicy: no session owns them, and they
    // select the session's pod, whose hostname and subdomain give it its DNS name.
    let shared = |meta: &ObjectMeta, kind: &str| {
        assert_eq!(meta.owner_references, None, "{kind}");
        assert_eq!(
            meta.labels.clone().unwrap_or_default()["app.kubernetes.io/managed-by"],
            "cairn-operator",
            "{kind}"
        );
    };
    let service = env
        .api::<Service>()
        .get("cairn-sessions")
        .await
        .expect("svc");
    shared(&service.metadata, "Service");
    let policy = env
        .api::<NetworkPolicy>()
        .get("cairn-sessions")
        .await
        .expect("np");
    shared(&policy.metadata, "NetworkPolicy");
    let pod_labels = env
        .pod("chat")
        .await
        .expect("pod")
        .metadata
        .labels
        .unwrap_or_default();
    let selects = |selector: &BTreeMap<String, String>| {
        selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
    };
    assert!(selects(
        &service
            .spec
            .and_then(|s| s.selector)
            .expect("service selector")
    ));
    assert!(selects(
        &policy
            .spec
            .and_then(|s| s.pod_selector)
            .and_then(|s| s.match_labels)
            .expect("policy selector")
    ));
    let spec = env.pod("chat").await.expect("pod").spec.expect("pod spec");
    assert_eq!(spec.hostname.as_deref(), Some("cairn-chat"));
    assert_eq!(spec.subdomain.as_deref(), Some("cairn-sessions"));
    let token = env
        .api::<Secret>()
        .get("cairn-chat-api-token")
        .await
        .expect("token secret");
    assert_owned_by(&token.metadata, &session, "Secret");
    let pod = env.pod("chat").await.expect("pod");
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));

    // The token survives further reconciles untouched.
    env.patch_session("chat", json!({"metadata": {"annotations": {"touch": "1"}}}))
        .await;
    env.patch_session("chat", json!({"spec": {"contextWindow": 100000}}))
        .await;
    eventually("the new generation to be observed", || async {
        let s = env.session("chat").await;
        (s.status?.observed_generation == s.metadata.generation).then_some(())
    })
    .await;
    let again = env
        .api::<Secret>()
        .get("cairn-chat-api-token")
        .await
        .expect("token secret");
    assert_eq!(token.data, again.data, "the API token is never regenerated");

    // The namespace's last session goes, and its shared objects with it.
    env.api::<AgentSession>()
        .delete("chat", &DeleteParams::default())
        .await
        .expect("delete session");
    eventually(
        "the shared Service and NetworkPolicy to be deleted",
        || async {
            let svc = env.api::<Service>().get_opt("cairn-sessions").await.ok()?;
            let np = env
                .api::<NetworkPolicy>()
                .get_opt("cairn-sessions")
                .await
                .ok()?;
            (svc.is_none() && np.is_none()).then_some(())
        },
    )
    .await;
    env.teardown().await;
}

#[tokio::test]
async fn the_agent_identity_reaches_only_its_own_objects() {
    let env = TestEnv::new("rbac").await;
    env.create_session("a", minimal()).await;
    env.create_session("b", minimal()).await;
    env.wait_phase("a", Phase::Running).await;
    env.wait_phase("b", Phase::Running).await;

    let mut config = config().await;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{}:cairn-a", env.ns));
    let agent = Client::try_from(config).expect("impersonating client");
    let sessions: Api<AgentSession> = Api::namespaced(agent.clone(), &env.ns);
    let secrets: Api<Secret> = Api::namespaced(agent.clone(), &env.ns);

    sessions.get("a").await.expect("reads its own session");
    sessions
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"session": {"turns": 1}}})),
        )
        .await
        .expect("patches its own status");
    secrets
        .get("cairn-a-api-token")
        .await
        .expect("reads its own token");
    let forbidden =
        |r: Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(e)) if e.code == 403);
    assert!(
        forbidden(secrets.get("cairn-b-api-token").await.map(|_| ())),
        "another session's Secret"
    );
    assert!(
        forbidden(sessions.get("b").await.map(|_| ())),
        "another session"
    );
    assert!(
        forbidden(secrets.list(&ListParams::default()).await.map(|_| ())),
        "listing Secrets"
    );
    env.teardown().await;
}

#[tokio::test]
async fn policy_edit_changes_the_hash_without_restarting_the_pod() {
    let env = TestEnv::new("policy").await;
    env.create_policy("frugal", json!({"budgetRatio": 0.5}))
        .await;
    let mut spec = minimal();
    spec["policyRef"] = json!({"name": "frugal"});
    env.create_session("chat", spec).await;
    let before = env.wait_phase("chat", Phase::Running).await;
    let hash_before = before.status.and_then(|s| s.policy_hash).expect("hash");
    let pod_before = env.pod("chat").await.expect("pod");

    env.api::<CompactionPolicy>()
        .patch(
            "frugal",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"budgetRatio": 0.3}})),
        )
        .await
        .expect("patch policy");
    let expected = cairn_crds::resolve(
        Some(&serde_json::from_value(json!({"budgetRatio": 0.3})).expect("spec")),
        None,
    )
    .expect("valid")
    .hash();
    eventually("policyHash to follow the policy edit", || async {
        let s = env.session("chat").await;
        (s.status?.policy_hash.as_deref() == Some(expected.as_str())).then_some(())
    })
    .await;
    assert_ne!(hash_before, expected);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let pod_after = env.pod("chat").await.expect("pod");
    assert_eq!(restart_hash(&pod_before), restart_hash(&pod_after));
    assert_eq!(pod_after.uid(), pod_before.uid(), "same pod");
    env.teardown().await;
}

#[tokio::test]
async fn image_change_replaces_the_pod() {
    let env = TestEnv::new("image").await;
    env.create_session("chat", minimal()).await;
    env.wait_phase("chat", Phase::Running).await;
    let before = env.pod("chat").await.expect("pod");

    env.patch_session(
        "chat",
        json!({"spec": {"template": {"image": "cairn-agent:next"}}}),
    )
    .await;
    let pod = eventually("a new pod with the new image", || async {
        let pod = env.pod("chat").await?;
        let replaced = pod.uid() != before.uid();
        let image = pod.spec.as_ref()?.containers.first()?.image.clone();
        (replaced && image.as_deref() == Some("cairn-agent:next")).then_some(pod)
    })
    .await;
    assert_ne!(
        restart_hash(&pod),
        restart_hash(&before),
        "the restart hash follows the image"
    );
    env.wait_phase("chat", Phase::Running).await;
    env.teardown().await;
}

fn env_var(pod: &Pod, name: &str) -> Option<k8s_openapi::api::core::v1::EnvVar> {
    pod.spec
        .as_ref()?
        .containers
        .first()?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)
        .cloned()
}

#[tokio::test]
async fn turning_on_span_export_and_adding_its_headers_roll_the_pod() {
    if std::env::var_os("CAIRN_TEST_EXTERNAL_OPERATOR").is_some() {
        eprintln!("reconfiguring an external operator is the harness's job");
        return;
    }
    let mut env = TestEnv::new("otlp").await;
    env.create_session("chat", minimal()).await;
    env.wait_phase("chat", Phase::Running).await;
    let plain = env.pod("chat").await.expect("pod");
    assert!(env_var(&plain, "OTEL_EXPORTER_OTLP_ENDPOINT").is_none());

    // The platform team redeploys the operator with an OTLP endpoint, and a Secret watch on
    // the namespace (the headers Secret is optional: nothing waits for it, only the watch
    // sees it appear).
    env.stop_operator().await;
    env.secret_watch = true;
    env.start_operator_with(Defaults {
        image: "cairn-agent:test".into(),
        otlp: Some(OtlpExport {
            endpoint: "http://otel-collector.observability:4318".into(),
            headers_secret: Some("otlp-auth".into()),
            resource_attributes: Some("k8s.cluster.name=test".into()),
        }),
        ..Default::default()
    });
    let exporting = eventually("a new pod with the OTLP variables", || async {
        let pod = env.pod("chat").await?;
        let endpoint = env_var(&pod, "OTEL_EXPORTER_OTLP_ENDPOINT")?.value;
        (pod.uid() != plain.uid()
            && endpoint.as_deref() == Some("http://otel-collector.observability:4318"))
        .then_some(pod)
    })
    .await;
    assert_eq!(
        env_var(&exporting, "OTEL_RESOURCE_ATTRIBUTES").and_then(|e| e.value),
        Some("k8s.cluster.name=test".into())
    );
    let headers = env_var(&exporting, "OTEL_EXPORTER_OTLP_HEADERS")
        .and_then(|e| e.value_from?.secret_key_ref)
        .expect("headers from the Secret");
    assert_eq!(
        (headers.name.as_str(), headers.optional),
        ("otlp-auth", Some(true))
    );
    // The Secret does not exist yet: the session runs anyway.
    env.wait_phase("chat", Phase::Running).await;

    // Creating the headers Secret rolls the pod, so the agent starts with them.
    let hash = exporting
        .annotations()
        .get(RESTART_HASH_ANNOTATION)
        .cloned()
        .expect("hash");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "otlp-auth"},
        "stringData": {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer t0"},
    }))
    .expect("secret fixture");
    env.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    env.rolled_pod(
        "chat",
        &exporting,
        &hash,
        "a new pod after the headers Secret appeared",
    )
    .await;
    env.wait_phase("chat", Phase::Running).await;
    env.teardown().await;
}

#[tokio::test]
async fn suspend_stops_the_pod_and_resume_brings_it_back() {
    let env = TestEnv::new("suspend").await;
    env.create_session("chat", minimal()).await;
    env.wait_phase("chat", Phase::Running).await;

    env.patch_session("chat", json!({"spec": {"suspend": true}}))
        .await;
    let suspended = env.wait_phase("chat", Phase::Suspended).await;
    assert_eq!(suspended.status.as_ref().and_then(|s| s.pod.clone()), None);
    eventually("the pod to go away", || async {
        env.pod("chat").await.is_none().then_some(())
    })
    .await;
    assert!(
        env.api::<Secret>()
            .get_opt("cairn-chat-api-token")
            .await
            .expect("get")
            .is_some(),
        "suspend keeps everything but the pod"
    );

    env.patch_session("chat", json!({"spec": {"suspend": false}}))
        .await;
    env.wait_phase("chat", Phase::Running).await;
    assert!(env.pod("chat").await.is_some());
    env.teardown().await;
}

#[tokio::test]
async fn a_missing_policy_is_reported_and_picked_up_once_created() {
    let env = TestEnv::new("missing").await;
    let mut spec = minimal();
    spec["policyRef"] = json!({"name": "later"});
    env.create_session("chat", spec).await;
    let api = env.api::<AgentSession>();
    let waiting = eventually("PolicyResolved=False", || async {
        let s = api.get("chat").await.ok()?;
        (condition(&s, "PolicyResolved")? == ("False".into(), "PolicyNotFound".into())).then_some(s)
    })
    .await;
    assert_eq!(waiting.status.and_then(|s| s.phase), Some(Phase::Pending));
    assert!(
        env.pod("chat").await.is_none(),
        "nothing is started without its policy"
    );

    // The CompactionPolicy watch re-triggers the session well before the slow requeue.
    env.create_policy("later", json!({"minKeepRecent": 12}))
        .await;
    let running = env.wait_phase("chat", Phase::Running).await;
    assert_eq!(
        condition(&running, "PolicyResolved"),
        Some(("True".into(), "Resolved".into()))
    );
    env.teardown().await;
}

fn provider_secret(value: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": "provider-key"},
        "stringData": {"api-key": value},
    }))
    .expect("secret fixture")
}

fn with_provider_credentials() -> serde_json::Value {
    json!({"provider": {"kind": "openai", "model": "gpt-5",
        "credentials": {"secretName": "provider-key"}}})
}

#[tokio::test]
async fn without_a_secret_watch_a_session_waiting_for_its_secret_is_rechecked_by_name() {
    if std::env::var_os("CAIRN_TEST_EXTERNAL_OPERATOR").is_some() {
        eprintln!("the external operator's requeue period is the chart's");
        return;
    }
    let mut env = TestEnv::new("secret-later").await;
    // The default: no Secret watch. A short re-check (the slow safety net would take 300 s,
    // far past this test's patience) is the only thing that can notice the Secret.
    env.stop_operator().await;
    env.secret_wait = Duration::from_secs(2);
    env.start_operator();
    env.create_session("chat", with_provider_credentials())
        .await;
    let api = env.api::<AgentSession>();
    eventually("Ready=False with SecretNotFound", || async {
        let s = api.get("chat").await.ok()?;
        (condition(&s, "Ready")?.1 == "SecretNotFound").then_some(s)
    })
    .await;
    assert!(
        env.pod("chat").await.is_none(),
        "nothing is started without its credentials"
    );
    env.api::<Secret>()
        .create(&PostParams::default(), &provider_secret("sk-1"))
        .await
        .expect("create secret");
    env.wait_phase("chat", Phase::Running).await;
    env.teardown().await;
}

#[tokio::test]
async fn a_rotated_secret_rolls_the_pod_through_the_metadata_watch() {
    if std::env::var_os("CAIRN_TEST_EXTERNAL_OPERATOR").is_some() {
        eprintln!("the external operator's Secret watch is the chart's");
        return;
    }
    let mut env = TestEnv::new("rotate").await;
    env.stop_operator().await;
    env.secret_watch = true;
    env.start_operator();
    env.api::<Secret>()
        .create(&PostParams::default(), &provider_secret("sk-1"))
        .await
        .expect("create secret");
    env.create_session("chat", with_provider_credentials())
        .await;
    env.wait_phase("chat", Phase::Running).await;
    let before = env.pod("chat").await.expect("pod");
    let hash = before
        .annotations()
        .get(RESTART_HASH_ANNOTATION)
        .cloned()
        .expect("hash");

    // Rotation: only the Secret changes. The resync is an hour away, so the new pod can only
    // come from the metadata watch re-triggering the session.
    env.api::<Secret>()
        .patch(
            "provider-key",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"api-key": "sk-2"}})),
        )
        .await
        .expect("rotate");
    env.rolled_pod("chat", &before, &hash, "a new pod after the rotation")
        .await;
    env.wait_phase("chat", Phase::Running).await;
    env.teardown().await;
}

#[tokio::test]
async fn template_pass_throughs_land_on_the_pod_and_service_account() {
    if std::env::var_os("CAIRN_TEST_EXTERNAL_OPERATOR").is_some() {
        eprintln!("the external operator's pod defaults are the chart's");
        return;
    }
    let mut env = TestEnv::new("passthrough").await;
    env.stop_operator().await;
    env.start_operator_with(Defaults {
        image: "cairn-agent:test".into(),
        pod: cairn_operator::config::pod_defaults(
            r#"{"imagePullSecrets": ["fleet-pull"],
                "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123:role/cairn-{namespace}-{session}"},
                "labels": {"team": "platform"},
                "priorityClassName": "cairn-test-agents"}"#,
        )
        .expect("pod defaults"),
        ..Default::default()
    });

    // The API server refuses the operator's own labels in template.labels, saying why.
    let mut reserved = minimal();
    reserved["template"] = json!({"labels": {"cairn.dev/session": "other"}});
    let session: AgentSession = serde_json::from_value(json!({
        "apiVersion": "cairn.dev/v1beta1", "kind": "AgentSession",
        "metadata": {"name": "evil"}, "spec": reserved,
    }))
    .expect("fixture");
    let refused = env
        .api::<AgentSession>()
        .create(&PostParams::default(), &session)
        .await
        .expect_err("reserved label refused");
    assert!(
        refused.to_string().contains("template.labels cannot set"),
        "{refused}"
    );

    let mut spec = minimal();
    spec["template"] = json!({
        "imagePullSecrets": [{"name": "team-pull"}],
        "labels": {"app": "chat"},
        "annotations": {"team": "a"},
        "tolerations": [{"key": "agents", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
            [{"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["agents"]}]}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway"}],
        "runtimeClassName": "runc-test",
    });
    // The named PriorityClass and RuntimeClass must exist for the pod to be admitted.
    for manifest in [
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
               "metadata": {"name": "cairn-test-agents"}, "value": 1000}),
        json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
               "metadata": {"name": "runc-test"}, "handler": "runc"}),
    ] {
        let kind = manifest["kind"].as_str().unwrap_or_default().to_string();
        let object: kube::api::DynamicObject = serde_json::from_value(manifest).expect("manifest");
        let resource = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            if kind == "PriorityClass" {
                "scheduling.k8s.io"
            } else {
                "node.k8s.io"
            },
            "v1",
            &kind,
        ));
        let api: Api<kube::api::DynamicObject> = Api::all_with(env.client.clone(), &resource);
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating the {kind}: {e}"),
        }
    }
    env.create_session("chat", spec).await;
    let pod = eventually("the pod", || async { env.pod("chat").await }).await;
    let meta = pod.metadata;
    let labels = meta.labels.expect("labels");
    assert_eq!(labels.get("app").map(String::as_str), Some("chat"));
    assert_eq!(labels.get("team").map(String::as_str), Some("platform"));
    assert_eq!(
        labels.get("cairn.dev/session").map(String::as_str),
        Some("chat")
    );
    assert_eq!(
        meta.annotations
            .expect("annotations")
            .get("team")
            .map(String::as_str),
        Some("a")
    );
    let pod = pod.spec.expect("pod spec");
    let pull: Vec<String> = pod
        .image_pull_secrets
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(pull, ["fleet-pull", "team-pull"]);
    // Admission adds the default not-ready/unreachable tolerations beside the session's.
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("agents"))
    );
    assert!(pod.affinity.and_then(|a| a.node_affinity).is_some());
    assert_eq!(pod.topology_spread_constraints.map(|t| t.len()), Some(1));
    assert_eq!(pod.runtime_class_name.as_deref(), Some("runc-test"));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("cairn-test-agents")
    );
    let sa = env
        .api::<ServiceAccount>()
        .get("cairn-chat")
        .await
        .expect("service account");
    assert_eq!(
        sa.annotations()
            .get("eks.amazonaws.com/role-arn")
            .map(String::as_str),
        Some(format!("arn:aws:iam::123:role/cairn-{}-chat", env.ns).as_str())
    );
    env.teardown().await;
}

fn helm(args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("helm home");
    Command::new(cairn_tests::harness::helm().expect("helm installs"))
        .env("KUBECONFIG", cairn_tests::harness::kubeconfig())
        .env("HELM_CACHE_HOME", dir.path().join("cache"))
        .env("HELM_CONFIG_HOME", dir.path().join("config"))
        .env("HELM_DATA_HOME", dir.path().join("data"))
        .args(args)
        .output()
        .expect("helm runs")
}

/// The operator's flags as the Deployment of `manifest` sets them: its args, and each
/// `CAIRN_*` variable with a value turned into the flag that reads it.
fn operator_args_of(manifest: &str, namespace: &str) -> cairn_operator::OperatorArgs {
    use clap::{CommandFactory, Parser};
    use serde::Deserialize;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        operator: cairn_operator::OperatorArgs,
    }
    let deployment = serde_yaml::Deserializer::from_str(manifest)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("manifest parses"))
        .find(|doc| doc["kind"] == "Deployment")
        .expect("the chart installs a Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut argv = vec!["cairn-operator".to_string()];
    argv.extend(
        container["args"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(String::from)),
    );
    let command = Cli::command();
    for var in container["env"].as_sequence().into_iter().flatten() {
        let (Some(name), Some(value)) = (var["name"].as_str(), var["value"].as_str()) else {
            continue;
        };
        let flag = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == name))
            .and_then(|a| a.get_long());
        if let Some(flag) = flag {
            argv.push(format!("--{flag}={value}"));
        }
    }
    argv.push(format!("--operator-namespace={namespace}"));
    Cli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("the chart's flags {argv:?} parse: {e}"))
        .operator
}

#[tokio::test]
async fn a_default_helm_install_runs_a_session_that_says_what_is_missing() {
    if std::env::var_os("CAIRN_TEST_EXTERNAL_OPERATOR").is_some() {
        eprintln!("the external operator was installed with its own values");
        return;
    }
    // `helm install` with nothing set. The release name contains "cairn", so every object
    // (the ClusterRole and its binding included) is named after it alone.
    let release = format!("cairn-defaults-{}", hex_suffix());
    // Other tests of this binary apply the CRDs without Helm, with the operator's field
    // manager, at any moment: `--take-ownership --force-conflicts` lets the release adopt
    // them, as a first install over CRDs applied that way must (docs/operator.md, "Who owns
    // the CRDs"). They are applied here first, so the install is always that adoption: a CRD
    // created by another test between Helm's lookup and its update fails the install
    // ("original object ... not found"). The values stay the defaults.
    cairn_operator::crds::apply_crds(env_client().await)
        .await
        .expect("CRDs apply");
    let out = helm(&[
        "install",
        "--take-ownership",
        "--force-conflicts",
        &release,
        &cairn_tests::harness::repo_root()
            .join("charts/cairn")
            .to_string_lossy(),
        "--namespace",
        &release,
        "--create-namespace",
    ]);
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let notes = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        notes.contains("MISSING: an archive store") && notes.contains("archive.bucket"),
        "NOTES say what is missing: {notes}"
    );
    let manifest = helm(&["get", "manifest", &release, "--namespace", &release]);
    let args = operator_args_of(&String::from_utf8_lossy(&manifest.stdout), &release);
    assert_eq!(args.archive_bucket, None, "no bucket by default");

    // The operator as the chart configures it and with exactly the RBAC the chart grants it.
    let mut env = TestEnv::new("defaults").await;
    env.stop_operator().await;
    let mut config = config().await;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{release}:{release}"));
    env.operator_client = Client::try_from(config).expect("impersonating client");
    env.start_operator_with(args.defaults());

    env.create_session("chat", minimal()).await;
    let running = env.wait_phase("chat", Phase::Running).await;
    let (status, reason) = condition(&running, "ArchiveReady").expect("ArchiveReady");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ArchiveNotConfigured")
    );
    let message = running
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "ArchiveReady"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    for needle in [
        "no archive bucket",
        "scratch volume",
        "archive.bucket",
        "archive.credentialsSecret",
    ] {
        assert!(message.contains(needle), "{needle:?} in {message:?}");
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    eventually("a Warning Event ArchiveNotConfigured", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("ArchiveNotConfigured")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("chat")
        })
    })
    .await;

    env.teardown().await;
    let _ = helm(&["uninstall", &release, "--namespace", &release]);
    let namespaces: Api<Namespace> = Api::all(env_client().await);
    let _ = namespaces.delete(&release, &DeleteParams::default()).await;
}

async fn env_client() -> Client {
    Client::try_from(config().await).expect("client")
}

/// The harness's moto server, stopped on drop (also when the test process dies).
struct Moto {
    _server: S3Server,
    _logs: tempfile::TempDir,
}

/// An S3 endpoint: `CAIRN_TEST_S3_ENDPOINT`, or a moto server started here.
fn s3_endpoint() -> (String, Option<Moto>) {
    if let Ok(endpoint) = std::env::var("CAIRN_TEST_S3_ENDPOINT") {
        return (endpoint, None);
    }
    let logs = tempfile::tempdir().expect("log dir");
    let server = S3Server::start(logs.path(), &[])
        .unwrap_or_else(|e| panic!("{e} (pip install 'moto[server]')"));
    let endpoint = server.endpoint.clone();
    (
        endpoint,
        Some(Moto {
            _server: server,
            _logs: logs,
        }),
    )
}

#[tokio::test]
async fn delete_purges_the_archive_and_children_are_collected() {
    let env = TestEnv::new("delete").await;
    let (endpoint, _moto) = s3_endpoint();
    let access = std::env::var("CAIRN_TEST_S3_ACCESS_KEY").unwrap_or_else(|_| "testing".into());
    let secret = std::env::var("CAIRN_TEST_S3_SECRET_KEY").unwrap_or_else(|_| "testing".into());
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(cairn_operator::purge::s3_http_client())
            .region(Region::new("us-east-1"))
            .endpoint_url(&endpoint)
            .force_path_style(true)
            .credentials_provider(Credentials::new(&access, &secret, None, None, "test"))
            .build(),
    );
    let bucket = format!("cairn-{}", hex_suffix());
    s3.create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("bucket");

    let creds: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret},
    }))
    .expect("secret");
    env.api::<Secret>()
        .create(&PostParams::default(), &creds)
        .await
        .expect("create s3 secret");
    let archive = |retain: bool| {
        // No prefix: every session lives under the operator's root (`cairn`).
        json!({"bucket": bucket, "endpoint": endpoint,
               "credentials": {"secretName": "s3"}, "retainOnDelete": retain})
    };
    let mut doomed = minimal();
    doomed["archive"] = archive(false);
    let mut kept = minimal();
    kept["archive"] = archive(true);
    env.create_session("doomed", doomed).await;
    env.create_session("kept", kept).await;
    let running = env.wait_phase("doomed", Phase::Running).await;
    let kept_running = env.wait_phase("kept", Phase::Running).await;
    assert!(
        running
            .finalizers()
            .iter()
            .any(|f| f == controller::FINALIZER),
        "a session whose archive is purged on delete has the purging finalizer"
    );
    assert!(
        kept_running.finalizers().is_empty(),
        "a session whose archive is kept has nothing to wait for when deleted"
    );
    // A configured bucket is not an archive that answered: no agent runs here (kwok), so
    // ArchiveReady waits for a check until one is written as the agent writes it.
    assert_eq!(
        condition(&running, "ArchiveReady"),
        Some(("Unknown".into(), "ArchiveNotChecked".into()))
    );
    let sessions = env.api::<AgentSession>();
    let location = format!("s3://{bucket}/cairn/{}/doomed/", env.ns);
    for (ok, message, want) in [
        (
            false,
            Some("S3 put: service error: NoSuchBucket"),
            ("False", "ArchiveUnreachable"),
        ),
        (true, None, ("True", "ArchiveAnswered")),
    ] {
        let check = json!({"status": {"session": {"archiveCheck": {
            "ok": ok, "location": location, "message": message, "at": "2027-01-15T08:00:00Z"}}}});
        sessions
            .patch_status(
                "doomed",
                &PatchParams {
                    field_manager: Some("cairn-agent".into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&check),
            )
            .await
            .expect("agent's archive check");
        eventually(&format!("ArchiveReady={}/{}", want.0, want.1), || async {
            let s = sessions.get("doomed").await.ok()?;
            (condition(&s, "ArchiveReady")? == (want.0.into(), want.1.into())).then_some(())
        })
        .await;
    }

    for key in ["ccr/aaaa", "ccr/bbbb", "journal/000001.jsonl"] {
        for session in ["doomed", "kept"] {
            s3.put_object()
                .bucket(&bucket)
                .key(format!("cairn/{}/{session}/{key}", env.ns))
                .body(ByteStream::from_static(b"x"))
                .send()
                .await
                .expect("put");
        }
    }

    let sessions = env.api::<AgentSession>();
    for name in ["doomed", "kept"] {
        sessions
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    eventually("both sessions to be gone (finalizer done)", || async {
        let list = sessions.list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    let listed = s3
        .list_objects_v2()
        .bucket(&bucket)
        .send()
        .await
        .expect("list");
    let mut keys: Vec<String> = listed
        .contents()
        .iter()
        .filter_map(|o| o.key().map(String::from))
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            format!("cairn/{}/kept/ccr/aaaa", env.ns),
            format!("cairn/{}/kept/ccr/bbbb", env.ns),
            format!("cairn/{}/kept/journal/000001.jsonl", env.ns),
        ],
        "the doomed session's prefix is purged, the retained one is kept"
    );
    eventually("children to be garbage-collected", || async {
        let managed = ListParams::default().labels("app.kubernetes.io/managed-by=cairn-operator");
        let pods = env.api::<Pod>().list(&managed).await.ok()?;
        let secrets = env.api::<Secret>().list(&managed).await.ok()?;
        (pods.items.is_empty() && secrets.items.is_empty()).then_some(())
    })
    .await;
    env.teardown().await;
}

#[tokio::test]
async fn an_operator_restart_converges_without_duplicates() {
    if std::env::var_os("CAIRN_TEST_EXTERNAL_OPERATOR").is_some() {
        eprintln!("restarting an external operator is the harness's job");
        return;
    }
    let mut env = TestEnv::new("restart").await;
    env.create_session("chat", minimal()).await;
    // Stop as soon as the first objects exist: mid-reconcile, or just after.
    eventually("the first objects", || async {
        env.api::<ServiceAccount>()
            .get_opt("cairn-chat")
            .await
            .ok()
            .flatten()
    })
    .await;
    env.stop_operator().await;
    let token = env
        .api::<Secret>()
        .get_opt("cairn-chat-api-token")
        .await
        .expect("get");
    env.start_operator();
    env.wait_phase("chat", Phase::Running).await;

    let managed = ListParams::default().labels("cairn.dev/session=chat");
    assert_eq!(
        env.api::<Pod>()
            .list(&managed)
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    assert_eq!(
        env.api::<Secret>()
            .list(&managed)
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    assert_eq!(
        env.api::<Service>()
            .list(&ListParams::default().labels("app.kubernetes.io/component=cairn-sessions"))
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    assert_eq!(
        env.api::<Pod>()
            .list(&managed)
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    if let Some(token) = token {
        let now = env
            .api::<Secret>()
            .get("cairn-chat-api-token")
            .await
            .expect("get");
        assert_eq!(token.data, now.data, "a restart keeps the token");
    }
    env.teardown().await;
}

/// A `cairn-operator` process (the real binary) with leader election on.
struct Replica {
    child: Child,
    identity: String,
    metrics_port: u16,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The replica's log, kept for a failed run: `$TMPDIR/<namespace>-<identity>.log`.
fn log_file(ns: &str, identity: &str) -> Stdio {
    let path = std::env::temp_dir().join(format!("{ns}-{identity}.log"));
    std::fs::File::create(&path).map_or_else(|_| Stdio::null(), Stdio::from)
}

/// `n` distinct free ports (all listeners are held until every port is chosen, so the OS
/// cannot hand out the same one twice).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

fn start_replica(ns: &str, identity: &str, metrics_port: u16) -> Replica {
    let child = Command::new(env!("CARGO_BIN_EXE_cairn-operator"))
        .args([
            "--watch-namespaces",
            ns,
            "--operator-namespace",
            ns,
            "--leader-election-lease",
            "cairn-operator-test",
            "--skip-crd-install",
            "--log-format",
            "text",
            "--metrics-listen",
            &format!("127.0.0.1:{metrics_port}"),
        ])
        .env("KUBECONFIG", cairn_tests::harness::kubeconfig())
        .env("POD_NAME", identity)
        .env("RUST_LOG", "info")
        .stdout(log_file(ns, identity))
        .stderr(Stdio::null())
        .spawn()
        .expect("start cairn-operator");
    Replica {
        child,
        identity: identity.to_string(),
        metrics_port,
    }
}

async fn reconciles(port: u16) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(
        body.lines()
            .filter(|l| l.starts_with("cairn_operator_reconciles_total"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum(),
    )
}

async fn lease_holder(client: &Client, ns: &str) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), ns);
    leases
        .get_opt("cairn-operator-test")
        .await
        .ok()??
        .spec?
        .holder_identity
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_fail_over() {
    let mut env = TestEnv::new("leader").await;
    // The replicas are the operators here.
    env.stop_operator().await;
    let ports = free_ports(2);
    let a = start_replica(&env.ns, "replica-a", ports[0]);
    let b = start_replica(&env.ns, "replica-b", ports[1]);
    let holder = eventually("a leader", || async {
        lease_holder(&env.client, &env.ns).await
    })
    .await;
    let (mut leader, follower) = if holder == a.identity { (a, b) } else { (b, a) };
    assert_eq!(holder, leader.identity);

    env.create_session("chat", minimal()).await;
    env.wait_phase("chat", Phase::Running).await;
    let follower_count = eventually("the follower's metrics", || async {
        reconciles(follower.metrics_port).await
    })
    .await;
    assert_eq!(follower_count, 0.0, "the follower never reconciles");
    assert!(reconciles(leader.metrics_port).await.unwrap_or(0.0) > 0.0);

    // A graceful stop releases the Lease (its holder is cleared on exit); the follower takes
    // it on its next check, within one lease duration.
    let pid = leader.child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let taken = std::time::Instant::now();
    let _ = leader.child.wait();
    let holder = lease_holder(&env.client, &env.ns).await;
    assert_ne!(
        holder.as_deref(),
        Some(leader.identity.as_str()),
        "released on exit"
    );
    eventually("the follower to take over", || async {
        (lease_holder(&env.client, &env.ns).await.as_deref() == Some(follower.identity.as_str()))
            .then_some(())
    })
    .await;
    assert!(
        taken.elapsed() < Duration::from_secs(15),
        "took {:?}",
        taken.elapsed()
    );
    env.patch_session("chat", json!({"spec": {"suspend": true}}))
        .await;
    env.wait_phase("chat", Phase::Suspended).await;
    drop(follower);
    env.start_operator();
    env.teardown().await;
}

#[tokio::test]
async fn a_stuck_cleanup_says_why_and_retaining_releases_it() {
    let env = TestEnv::new("stuck").await;
    let creds: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"},
    }))
    .expect("secret");
    env.api::<Secret>()
        .create(&PostParams::default(), &creds)
        .await
        .expect("create s3 secret");
    let mut spec = minimal();
    // Nothing listens on port 9: every purge attempt fails.
    spec["archive"] = json!({"bucket": "gone", "endpoint": "http://127.0.0.1:9",
                             "credentials": {"secretName": "s3"},
                             "retainOnDelete": false});
    env.create_session("chat", spec).await;
    env.wait_phase("chat", Phase::Running).await;
    env.api::<AgentSession>()
        .delete("chat", &DeleteParams::default())
        .await
        .expect("delete");

    let stuck = eventually("ArchiveReady=False/PurgeFailed", || async {
        let s = env.api::<AgentSession>().get_opt("chat").await.ok()??;
        (condition(&s, "ArchiveReady")? == ("False".into(), "PurgeFailed".into())).then_some(s)
    })
    .await;
    assert!(stuck.metadata.deletion_timestamp.is_some());
    assert!(
        stuck
            .finalizers()
            .iter()
            .any(|f| f == controller::FINALIZER)
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    eventually("a PurgeFailed Event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("PurgeFailed"))
            .then_some(())
    })
    .await;

    env.patch_session(
        "chat",
        json!({"spec": {"archive": {"retainOnDelete": true}}}),
    )
    .await;
    eventually("the session to be gone", || async {
        env.api::<AgentSession>()
            .get_opt("chat")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    env.teardown().await;
}
