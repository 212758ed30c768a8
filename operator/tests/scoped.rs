//! Scoped archive credentials against a store that enforces them: SeaweedFS (`weed mini`,
//! `tests/harness/build-seaweedfs.sh`) with its STS endpoint and IAM policy engine. The
//! credentials are minted by the operator's own code (`scoped::mint`, `scoped::ensure`
//! through the controller), the S3 calls are aws-sdk-s3's. The cluster tests run the operator
//! in-process against the harness's local control plane with kwok, like `cluster.rs`:
//!
//! ```text
//! cargo test -p cairn-operator --test scoped
//! ```

mod support;
use support::condition;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use cairn_crds::{AgentSession, Phase};
use cairn_operator::config::{Defaults, ScopedArchive};
use cairn_operator::controller::Context;
use cairn_operator::metrics::Metrics;
use cairn_operator::purge::S3Purger;
use cairn_operator::scoped::{self, MintTarget, TempCredentials};
use cairn_operator::watches;
use cairn_tests::harness::seaweedfs::{
    ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY, REGION, ROLE_ARN,
};
use cairn_tests::harness::{SeaweedFs, SeaweedOptions};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const BUCKET: &str = "cairn";
const WAIT: Duration = Duration::from_secs(90);

fn start_store(name: &str, options: &SeaweedOptions) -> (SeaweedFs, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("cairn-scoped-{name}-"))
        .tempdir()
        .expect("tempdir");
    let store = SeaweedFs::start(dir.path(), &[BUCKET], options).expect("seaweedfs starts");
    (store, dir)
}

/// The operator's own mounted admin Secret, as files.
fn admin_dir(parent: &Path, access: &str, secret: &str) -> std::path::PathBuf {
    let dir = parent.join("archive-admin");
    std::fs::create_dir_all(&dir).expect("admin dir");
    std::fs::write(dir.join("AWS_ACCESS_KEY_ID"), access).expect("write");
    std::fs::write(dir.join("AWS_SECRET_ACCESS_KEY"), secret).expect("write");
    dir
}

fn defaults(store: &SeaweedFs, admin: &Path, duration: Duration) -> Defaults {
    let mut d = Defaults {
        image: "cairn-agent:test".into(),
        ..Default::default()
    };
    d.archive.bucket = Some(BUCKET.into());
    d.archive.endpoint = Some(store.endpoint.clone());
    d.archive.region = REGION.into();
    d.archive.scoped = Some(ScopedArchive {
        role_arn: Some(ROLE_ARN.into()),
        sts_endpoint: None,
        duration,
        refresh_before: None,
        admin_credentials_dir: admin.to_path_buf(),
    });
    d
}

fn s3(endpoint: &str, access: &str, secret: &str, token: Option<&str>) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(cairn_operator::purge::s3_http_client())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(
            access,
            secret,
            token.map(str::to_string),
            None,
            "test",
        ))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

fn temp_client(endpoint: &str, c: &TempCredentials) -> aws_sdk_s3::Client {
    s3(
        endpoint,
        &c.access_key_id,
        &c.secret_access_key,
        Some(&c.session_token),
    )
}

fn admin_client(endpoint: &str) -> aws_sdk_s3::Client {
    s3(endpoint, ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY, None)
}

/// The S3 error code of a failed call, or `"ok"`.
fn outcome<T, E>(r: Result<T, aws_sdk_s3::error::SdkError<E>>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e
            .as_service_error()
            .and_then(|s| s.code())
            .map(str::to_string)
            .unwrap_or_else(|| format!("{:?}", aws_sdk_s3::error::DisplayErrorContext(&e))),
    }
}

async fn put(c: &aws_sdk_s3::Client, key: &str, body: &str) -> String {
    outcome(
        c.put_object()
            .bucket(BUCKET)
            .key(key)
            .body(ByteStream::from(body.as_bytes().to_vec()))
            .send()
            .await,
    )
}

async fn get(c: &aws_sdk_s3::Client, key: &str) -> Result<String, String> {
    match c.get_object().bucket(BUCKET).key(key).send().await {
        Ok(out) => {
            let bytes = out.body.collect().await.map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&bytes.into_bytes()).into_owned())
        }
        Err(e) => Err(outcome::<(), _>(Err(e))),
    }
}

async fn delete(c: &aws_sdk_s3::Client, key: &str) -> String {
    outcome(c.delete_object().bucket(BUCKET).key(key).send().await)
}

async fn list(c: &aws_sdk_s3::Client, prefix: Option<&str>) -> Result<Vec<String>, String> {
    let mut req = c.list_objects_v2().bucket(BUCKET);
    if let Some(p) = prefix {
        req = req.prefix(p);
    }
    match req.send().await {
        Ok(out) => Ok(out
            .contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect()),
        Err(e) => Err(outcome::<(), _>(Err(e))),
    }
}

/// A session's plan as the operator builds it (so the minted scope is the operator's).
fn plan(defaults: &Defaults, namespace: &str, name: &str) -> cairn_operator::Plan {
    let mut s = AgentSession::new(
        name,
        serde_json::from_value(json!({"provider": {"kind": "openai", "model": "gpt-5"}}))
            .expect("spec"),
    );
    s.metadata.namespace = Some(namespace.into());
    s.metadata.uid = Some(format!("uid-{name}"));
    cairn_operator::validate(&s, None, defaults).expect("plan")
}

#[tokio::test]
async fn session_b_is_denied_everything_on_session_a_prefix_and_a_can_do_all_of_it() {
    let (store, dir) = start_store("isolation", &SeaweedOptions::default());
    let admin = admin_dir(dir.path(), ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY);
    let d = defaults(&store, &admin, Duration::from_secs(900));
    let config = d.archive.scoped.clone().expect("scoped");
    let plan_a = plan(&d, "team-a", "alpha");
    let plan_b = plan(&d, "team-a", "beta");
    let target_a = MintTarget::for_plan(&plan_a).expect("target");
    let target_b = MintTarget::for_plan(&plan_b).expect("target");
    // The agent writes under the same root: the layout has one spelling.
    assert_eq!(target_a.root, "cairn/team-a/alpha/");
    assert_eq!(
        target_a.root,
        cairn_crds::session::archive_root("cairn", "team-a", "alpha")
    );

    let a = scoped::mint(&config, &target_a).await.expect("mint A");
    let b = scoped::mint(&config, &target_b).await.expect("mint B");
    assert!(a.expiration > SystemTime::now() + Duration::from_secs(600));
    let (ca, cb, cadmin) = (
        temp_client(&store.endpoint, &a),
        temp_client(&store.endpoint, &b),
        admin_client(&store.endpoint),
    );

    // A's own operations all work: PUT, GET, LIST (its prefix), DELETE.
    let a_key = "cairn/team-a/alpha/ccr/original-1";
    assert_eq!(put(&ca, a_key, "A's original").await, "ok");
    assert_eq!(get(&ca, a_key).await.as_deref(), Ok("A's original"));
    assert_eq!(put(&ca, "cairn/team-a/alpha/journal/0001", "j").await, "ok");
    assert_eq!(
        list(&ca, Some("cairn/team-a/alpha/")).await,
        Ok(vec![
            a_key.to_string(),
            "cairn/team-a/alpha/journal/0001".to_string()
        ])
    );
    assert_eq!(
        list(&ca, Some("cairn/team-a/alpha/journal/"))
            .await
            .map(|k| k.len()),
        Ok(1)
    );
    assert_eq!(delete(&ca, "cairn/team-a/alpha/journal/0001").await, "ok");

    // B on A's prefix: every operation refused, and nothing of A's changed.
    assert_eq!(get(&cb, a_key).await, Err("AccessDenied".into()), "GET");
    assert_eq!(
        put(&cb, "cairn/team-a/alpha/ccr/planted", "B's").await,
        "AccessDenied",
        "PUT new"
    );
    assert_eq!(
        put(&cb, a_key, "overwritten").await,
        "AccessDenied",
        "PUT over"
    );
    assert_eq!(delete(&cb, a_key).await, "AccessDenied", "DELETE");
    assert_eq!(
        list(&cb, Some("cairn/team-a/alpha/")).await,
        Err("AccessDenied".into()),
        "LIST A's prefix"
    );
    // Nor any listing wider than B's own prefix (which would name A's keys).
    for wider in [
        None,
        Some("cairn/"),
        Some("cairn/team-a/"),
        Some("cairn/team-a/alpha"),
    ] {
        assert_eq!(
            list(&cb, wider).await,
            Err("AccessDenied".into()),
            "LIST {wider:?}"
        );
    }
    // HEAD (no error body, so no code: the status says it) and the v1 listing likewise.
    let head = cb.head_object().bucket(BUCKET).key(a_key).send().await;
    let status = head
        .as_ref()
        .err()
        .and_then(|e| e.raw_response())
        .map(|r| r.status().as_u16());
    assert_eq!(status, Some(403), "HEAD: {head:?}");
    assert_eq!(
        outcome(
            cb.list_objects()
                .bucket(BUCKET)
                .prefix("cairn/team-a/alpha/")
                .send()
                .await
        ),
        "AccessDenied",
        "LIST v1"
    );
    assert_eq!(get(&cadmin, a_key).await.as_deref(), Ok("A's original"));
    assert_eq!(
        list(&cadmin, Some("cairn/team-a/alpha/")).await,
        Ok(vec![a_key.to_string()])
    );

    // And the other way round: A's credentials do not reach B's data.
    let b_key = "cairn/team-a/beta/ccr/original-1";
    assert_eq!(put(&cb, b_key, "B's original").await, "ok");
    assert_eq!(get(&ca, b_key).await, Err("AccessDenied".into()));
    assert_eq!(delete(&ca, b_key).await, "AccessDenied");
    assert_eq!(get(&cb, b_key).await.as_deref(), Ok("B's original"));

    // A namesake prefix (`alpha` vs `alpha2`) is another session.
    let plan_a2 = plan(&d, "team-a", "alpha2");
    let a2 = scoped::mint(&config, &MintTarget::for_plan(&plan_a2).expect("target"))
        .await
        .expect("mint A2");
    let ca2 = temp_client(&store.endpoint, &a2);
    assert_eq!(get(&ca2, a_key).await, Err("AccessDenied".into()));
    assert_eq!(
        list(&ca2, Some("cairn/team-a/alpha")).await,
        Err("AccessDenied".into())
    );

    // Admin keys that are wrong mint nothing.
    let bad = admin_dir(
        &dir.path().join("bad"),
        ADMIN_ACCESS_KEY_ID,
        "not-the-secret",
    );
    let bad_config = ScopedArchive {
        admin_credentials_dir: bad,
        ..config.clone()
    };
    let err = scoped::mint(&bad_config, &target_a)
        .await
        .expect_err("wrong admin keys");
    assert_eq!(err.label(), "ScopedCredentialsFailed", "{err}");
    drop(store);
}

// ---------------------------------------------------------------------------------------
// In a cluster.

struct TestEnv {
    client: Client,
    ns: String,
    operator: Option<(watch::Sender<bool>, JoinHandle<()>)>,
}

async fn kube_client() -> Client {
    let path = match std::env::var_os("KUBECONFIG") {
        Some(path) => path.into(),
        None => cairn_tests::harness::shared_cluster().kubeconfig.clone(),
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig reads");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig is usable");
    Client::try_from(config).expect("client")
}

impl TestEnv {
    async fn new(name: &str, defaults: Defaults) -> Self {
        let client = kube_client().await;
        cairn_operator::crds::apply_crds(client.clone())
            .await
            .expect("CRDs apply");
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let ns = format!(
            "cairn-{name}-{:06x}",
            (nanos ^ std::process::id()) & 0xff_ffff
        );
        Api::<Namespace>::all(client.clone())
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
        let ctx = Arc::new(Context::new(
            client.clone(),
            defaults,
            Arc::new(Metrics::default()),
            Arc::new(S3Purger),
            Duration::from_secs(3600),
        ));
        let (tx, rx) = watch::channel(false);
        let shutdown = async move {
            let mut rx = rx;
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let handle = tokio::spawn(watches::run(ctx, Some(ns.clone()), 4, shutdown));
        Self {
            client,
            ns,
            operator: Some((tx, handle)),
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create_session(&self, name: &str, spec: serde_json::Value) {
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
            .expect("create session");
    }

    async fn wait_phase(&self, name: &str, phase: Phase) -> AgentSession {
        let api = self.api::<AgentSession>();
        eventually(&format!("{name} to reach {phase:?}"), || async {
            let s = api.get(name).await.ok()?;
            (s.status.as_ref()?.phase == Some(phase)).then_some(s)
        })
        .await
    }

    async fn credentials(&self, session: &str) -> Option<(Secret, TempCredentials)> {
        let secret = self
            .api::<Secret>()
            .get_opt(&scoped::secret_name(session))
            .await
            .ok()??;
        let data = secret.data.clone()?;
        let text = |k: &str| {
            data.get(k)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        };
        let expiration = text("AWS_CREDENTIAL_EXPIRATION")?
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()?;
        let creds = TempCredentials {
            access_key_id: text("AWS_ACCESS_KEY_ID")?,
            secret_access_key: text("AWS_SECRET_ACCESS_KEY")?,
            session_token: text("AWS_SESSION_TOKEN")?,
            expiration: SystemTime::from(expiration),
        };
        Some((secret, creds))
    }

    async fn teardown(mut self) {
        if let Some((tx, mut handle)) = self.operator.take() {
            let _ = tx.send(true);
            if tokio::time::timeout(Duration::from_secs(10), &mut handle)
                .await
                .is_err()
            {
                handle.abort();
            }
        }
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
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }
}

async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    support::eventually(WAIT, what, probe).await
}

fn minimal() -> serde_json::Value {
    json!({"provider": {"kind": "openai", "model": "gpt-5"}})
}

/// Every Secret name a pod spec refers to (env, envFrom, volumes, projected volumes).
fn referenced_secrets(pod: &k8s_openapi::api::core::v1::PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        for e in c.env.iter().flatten() {
            if let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
            {
                out.push(r.name.clone());
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.secret_ref {
                out.push(r.name.clone());
            }
        }
    }
    for v in pod.volumes.iter().flatten() {
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            out.push(name);
        }
        for s in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(r) = &s.secret {
                out.push(r.name.clone());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[tokio::test]
async fn an_agent_pod_holds_only_its_own_scoped_credentials() {
    let (store, dir) = start_store("pod", &SeaweedOptions::default());
    let admin = admin_dir(dir.path(), ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY);
    let env = TestEnv::new(
        "scoped-pod",
        defaults(&store, &admin, Duration::from_secs(3600)),
    )
    .await;
    env.create_session("one", minimal()).await;
    env.create_session("two", minimal()).await;
    env.wait_phase("one", Phase::Running).await;
    env.wait_phase("two", Phase::Running).await;

    let pod: Pod = env.api::<Pod>().get("cairn-one-0").await.expect("pod");
    let spec = pod.spec.clone().expect("pod spec");
    // Only its own Secrets: the API token and its scoped credentials.
    assert_eq!(
        referenced_secrets(&spec),
        vec![
            "cairn-one-api-token".to_string(),
            "cairn-one-archive-credentials".to_string()
        ]
    );
    // No key pair in the environment at all, and the admin keys nowhere in the pod.
    let container = &spec.containers[0];
    let env_names: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        assert!(!env_names.contains(&var), "{var} in the pod's env");
    }
    let dump = serde_json::to_string(&pod).expect("pod json");
    assert!(!dump.contains(ADMIN_SECRET_ACCESS_KEY) && !dump.contains(ADMIN_ACCESS_KEY_ID));
    // The credentials are a mounted directory the agent is pointed at.
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == scoped::MOUNT_DIR)
        .expect("credentials mount");
    assert_eq!(mount.read_only, Some(true));
    assert!(
        mount.sub_path.is_none(),
        "a subPath mount is never refreshed"
    );
    assert!(
        container
            .env
            .iter()
            .flatten()
            .any(|e| e.name == scoped::DIR_ENV && e.value.as_deref() == Some(scoped::MOUNT_DIR))
    );

    // What the pod mounts reaches its own prefix and nothing of session two's.
    let (secret, one) = env.credentials("one").await.expect("scoped Secret");
    let session_one = env.api::<AgentSession>().get("one").await.expect("session");
    let owners = secret.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1);
    assert_eq!(Some(owners[0].uid.clone()), session_one.uid());
    let (_, two) = env.credentials("two").await.expect("scoped Secret");
    let (c1, c2) = (
        temp_client(&store.endpoint, &one),
        temp_client(&store.endpoint, &two),
    );
    let two_root = format!("cairn/{}/two/", env.ns);
    let two_key = format!("{two_root}ccr/k");
    assert_eq!(put(&c2, &two_key, "two's").await, "ok");
    assert_eq!(get(&c1, &two_key).await, Err("AccessDenied".into()));
    assert_eq!(put(&c1, &two_key, "x").await, "AccessDenied");
    assert_eq!(delete(&c1, &two_key).await, "AccessDenied");
    assert_eq!(list(&c1, Some(&two_root)).await, Err("AccessDenied".into()));
    let one_key = format!("cairn/{}/one/ccr/k", env.ns);
    assert_eq!(put(&c1, &one_key, "one's").await, "ok");
    assert_eq!(get(&c1, &one_key).await.as_deref(), Ok("one's"));
    // Session one's Role grants no read of any credentials Secret through the API either.
    let role: k8s_openapi::api::rbac::v1::Role = env.api().get("cairn-one").await.expect("role");
    for rule in role.rules.iter().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "secrets") {
            assert_eq!(
                rule.resource_names.clone().unwrap_or_default(),
                vec!["cairn-one-api-token".to_string()],
                "secrets the agent may read"
            );
        }
    }
    env.teardown().await;
    drop(store);
}

#[tokio::test]
async fn credentials_are_refreshed_before_expiry_without_rolling_the_pod() {
    // The store caps every session at 30 s (whatever is asked), so the operator refreshes at
    // half of what it got, and the test can watch the first credentials expire.
    let (store, dir) = start_store(
        "refresh",
        &SeaweedOptions {
            max_session: Some(Duration::from_secs(30)),
        },
    );
    let admin = admin_dir(dir.path(), ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY);
    let env = TestEnv::new(
        "scoped-refresh",
        defaults(&store, &admin, Duration::from_secs(900)),
    )
    .await;
    env.create_session("r", minimal()).await;
    env.wait_phase("r", Phase::Running).await;
    let pod_api = env.api::<Pod>();
    let before = pod_api.get("cairn-r-0").await.expect("pod");
    let (first_secret, first) = env.credentials("r").await.expect("scoped Secret");
    let granted = first
        .expiration
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    assert!(granted <= Duration::from_secs(31), "{granted:?}");
    let key = format!("cairn/{}/r/ccr/k", env.ns);
    assert_eq!(
        put(&temp_client(&store.endpoint, &first), &key, "v1").await,
        "ok"
    );

    // Rewritten before the first ones expire.
    let (second_secret, second) = eventually("the scoped Secret to be refreshed", || async {
        let (s, c) = env.credentials("r").await?;
        (c.access_key_id != first.access_key_id).then_some((s, c))
    })
    .await;
    assert!(
        SystemTime::now() < first.expiration,
        "refreshed only after the old credentials expired"
    );
    assert!(second.expiration > first.expiration);
    assert_eq!(
        first_secret.metadata.uid, second_secret.metadata.uid,
        "the same Secret, rewritten in place"
    );
    let c2 = temp_client(&store.endpoint, &second);
    assert_eq!(get(&c2, &key).await.as_deref(), Ok("v1"));
    assert_eq!(put(&c2, &key, "v2").await, "ok");

    // The first credentials really expire; the refreshed ones keep working past that.
    let wait = first
        .expiration
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        + Duration::from_secs(2);
    tokio::time::sleep(wait).await;
    let stale = get(&temp_client(&store.endpoint, &first), &key).await;
    assert!(stale.is_err(), "expired credentials still read: {stale:?}");
    let (_, current) = env.credentials("r").await.expect("scoped Secret");
    assert_eq!(
        get(&temp_client(&store.endpoint, &current), &key)
            .await
            .as_deref(),
        Ok("v2")
    );

    // Rotation never rolled the pod: the same pod, its spec exactly what it was.
    let after = pod_api.get("cairn-r-0").await.expect("pod");
    assert_eq!(
        before.metadata.uid, after.metadata.uid,
        "the pod was replaced"
    );
    assert_eq!(
        serde_json::to_value(&before.spec).expect("json"),
        serde_json::to_value(&after.spec).expect("json"),
        "the pod spec changed"
    );
    let events: Api<Event> = env.api();
    let issued = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ScopedCredentialsIssued"))
        .count();
    assert!(issued >= 1, "an Event says credentials were issued");
    env.teardown().await;
    drop(store);
}

#[tokio::test]
async fn a_failed_minting_is_reported_and_retried_until_it_works() {
    let (store, dir) = start_store("failure", &SeaweedOptions::default());
    // The operator's admin Secret holds a wrong secret key at first.
    let admin = admin_dir(dir.path(), ADMIN_ACCESS_KEY_ID, "not-the-secret");
    let env = TestEnv::new(
        "scoped-fail",
        defaults(&store, &admin, Duration::from_secs(3600)),
    )
    .await;
    env.create_session("f", minimal()).await;
    let api = env.api::<AgentSession>();
    let session = eventually("the failure in status", || async {
        let s = api.get("f").await.ok()?;
        (condition(&s, "Ready")?.1 == "ScopedCredentialsFailed").then_some(s)
    })
    .await;
    assert_eq!(
        condition(&session, "ArchiveReady"),
        Some(("False".into(), "ScopedCredentialsFailed".into()))
    );
    assert_eq!(
        session.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Pending)
    );
    // No pod that could not start: nothing was applied without credentials.
    assert!(
        env.api::<Pod>()
            .get_opt("cairn-f-0")
            .await
            .expect("get")
            .is_none()
    );
    let events: Api<Event> = env.api();
    eventually("a Warning Event naming the failure", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ScopedCredentialsFailed")
                    && e.type_.as_deref() == Some("Warning")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("AssumeRole"))
            })
            .then_some(())
    })
    .await;

    // The Secret is fixed (as the kubelet would update the mounted files): the retry mints.
    std::fs::write(admin.join("AWS_SECRET_ACCESS_KEY"), ADMIN_SECRET_ACCESS_KEY).expect("write");
    env.wait_phase("f", Phase::Running).await;
    let (_, creds) = env.credentials("f").await.expect("scoped Secret");
    let key = format!("cairn/{}/f/ccr/k", env.ns);
    assert_eq!(
        put(&temp_client(&store.endpoint, &creds), &key, "ok").await,
        "ok"
    );
    env.teardown().await;
    drop(store);
}

#[tokio::test]
async fn deleting_a_scoped_session_purges_exactly_its_prefix_with_the_admin_keys() {
    let (store, dir) = start_store("purge", &SeaweedOptions::default());
    let admin = admin_dir(dir.path(), ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY);
    let env = TestEnv::new(
        "scoped-purge",
        defaults(&store, &admin, Duration::from_secs(3600)),
    )
    .await;
    let mut spec = minimal();
    spec["archive"] = json!({"retainOnDelete": false});
    env.create_session("p", spec).await;
    env.create_session("p2", minimal()).await;
    env.wait_phase("p", Phase::Running).await;
    env.wait_phase("p2", Phase::Running).await;
    let (_, own) = env.credentials("p").await.expect("scoped Secret");
    let c = temp_client(&store.endpoint, &own);
    let root = format!("cairn/{}/p/", env.ns);
    for k in ["ccr/a", "ccr/b", "journal/0001"] {
        assert_eq!(put(&c, &format!("{root}{k}"), "x").await, "ok");
    }
    // A namesake sibling's object, which a purge of `p` must not touch.
    let sibling = format!("cairn/{}/p2/ccr/a", env.ns);
    let admin_s3 = admin_client(&store.endpoint);
    assert_eq!(put(&admin_s3, &sibling, "keep").await, "ok");

    env.api::<AgentSession>()
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the session to be gone", || async {
        env.api::<AgentSession>()
            .get_opt("p")
            .await
            .ok()
            .and_then(|s| s.is_none().then_some(()))
    })
    .await;
    assert_eq!(list(&admin_s3, Some(&root)).await, Ok(vec![]));
    assert_eq!(get(&admin_s3, &sibling).await.as_deref(), Ok("keep"));
    // Its credentials Secret goes with it (owned by the session).
    eventually("the scoped Secret to be collected", || async {
        env.api::<Secret>()
            .get_opt(&scoped::secret_name("p"))
            .await
            .ok()
            .and_then(|s| s.is_none().then_some(()))
    })
    .await;
    env.teardown().await;
    drop(store);
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_running_pod_and_says_so_until_it_works_again() {
    let (store, dir) = start_store(
        "refresh-fail",
        &SeaweedOptions {
            max_session: Some(Duration::from_secs(30)),
        },
    );
    let admin = admin_dir(dir.path(), ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY);
    let env = TestEnv::new(
        "scoped-refail",
        defaults(&store, &admin, Duration::from_secs(900)),
    )
    .await;
    env.create_session("g", minimal()).await;
    env.wait_phase("g", Phase::Running).await;
    let (_, first) = env.credentials("g").await.expect("scoped Secret");
    // The admin Secret goes bad before the refresh is due.
    std::fs::write(admin.join("AWS_SECRET_ACCESS_KEY"), "rotated-wrongly").expect("write");
    let api = env.api::<AgentSession>();
    let s = eventually("the failed refresh in status", || async {
        let s = api.get("g").await.ok()?;
        (condition(&s, "ArchiveReady")?.1 == "ScopedCredentialsFailed").then_some(s)
    })
    .await;
    // The credentials in place still work, so the pod is left running on them.
    if SystemTime::now() < first.expiration {
        assert_eq!(condition(&s, "Ready").map(|c| c.0).as_deref(), Some("True"));
    }
    assert!(
        env.api::<Pod>()
            .get_opt("cairn-g-0")
            .await
            .expect("get")
            .is_some()
    );
    // Fixed again: the next retry mints, and the failure clears.
    std::fs::write(admin.join("AWS_SECRET_ACCESS_KEY"), ADMIN_SECRET_ACCESS_KEY).expect("write");
    let (_, next) = eventually("credentials minted after the fix", || async {
        let (s, c) = env.credentials("g").await?;
        (c.access_key_id != first.access_key_id).then_some((s, c))
    })
    .await;
    eventually("the failure to clear", || async {
        let s = api.get("g").await.ok()?;
        (condition(&s, "ArchiveReady")?.1 != "ScopedCredentialsFailed").then_some(())
    })
    .await;
    let key = format!("cairn/{}/g/ccr/k", env.ns);
    assert_eq!(
        put(&temp_client(&store.endpoint, &next), &key, "ok").await,
        "ok"
    );
    env.teardown().await;
    drop(store);
}
