//! One reconcile against a mocked API server (tower-test): the requests the pipeline sends, in
//! order, and that an unchanged session causes no status write and no Event. The real-cluster
//! behaviour is covered by `tests/cluster.rs`; this pins the request sequence.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_crds::{AgentSession, AgentSessionStatus};
use cairn_operator::Defaults;
use cairn_operator::cache::{Packed, Stores, pack_event};
use cairn_operator::controller::{self, Context, FINALIZER};
use cairn_operator::metrics::Metrics;
use cairn_operator::purge::S3Purger;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::client::Body;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

/// What the fake API server saw: "METHOD path?query" and the JSON body.
type Seen = Vec<(String, Value)>;

/// The token Secret the fake API server holds, kept across servers the way a real API server
/// keeps it across reconciles.
type TokenSecret = Arc<Mutex<Option<Value>>>;

async fn serve(handle: tower_test::mock::Handle<Request<Body>, Response<Body>>) -> Seen {
    serve_with(handle, TokenSecret::default(), LONG_AGO).await
}

/// The creation time the fake API server gives a pod it creates, unless a test asks for
/// none (then the operator counts the pod as created now): long ago, so that a new session's
/// first status does not wait for it ([`cairn_operator::status::FIRST_STATUS_GRACE`]).
const LONG_AGO: Option<&str> = Some("2026-01-01T00:00:00Z");

async fn serve_with(
    handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    token_secret: TokenSecret,
    pod_created: Option<&'static str>,
) -> Seen {
    let log = Arc::new(Mutex::new(Seen::new()));
    serve_into(handle, log.clone(), token_secret, pod_created).await;
    log.lock().map(|seen| seen.clone()).expect("log")
}

/// The resourceVersion the fake API server gives every object it stores.
const STORED_VERSION: &str = "42";

/// `serve`, logging into `log` as the requests come. The token Secret is stored when it is
/// created or applied and read back from `token_secret`; the pod is never found.
async fn serve_into(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    log: Arc<Mutex<Seen>>,
    token_secret: TokenSecret,
    pod_created: Option<&'static str>,
) {
    while let Some((request, respond)) = handle.next_request().await {
        let method = request.method().clone();
        let uri = request.uri().clone();
        let bytes = request
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let path = uri.path().to_string();
        log.lock().expect("log").push((
            format!("{method} {path}?{}", uri.query().unwrap_or_default()),
            body.clone(),
        ));
        let token_path = path.ends_with("/secrets/cairn-chat-api-token");
        if (method == http::Method::POST && path.ends_with("/secrets"))
            || (method == http::Method::PATCH && token_path)
        {
            *token_secret.lock().expect("token secret") = Some(body.clone());
        }
        let stored_token = token_secret.lock().expect("token secret").clone();
        let (status, reply) = if method == http::Method::GET
            && token_path
            && let Some(secret) = stored_token
        {
            (StatusCode::OK, secret)
        } else if method == http::Method::GET
            && (token_path || path.ends_with("/pods/cairn-chat-0"))
        {
            (
                StatusCode::NOT_FOUND,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "reason": "NotFound", "code": 404, "message": "not found"}),
            )
        } else if path.ends_with("/status") {
            let mut stored = serde_json::to_value(session(None)).unwrap_or_default();
            stored["status"] = body["status"].clone();
            (StatusCode::OK, stored)
        } else if method == http::Method::DELETE && path.contains("/pods/") {
            (
                StatusCode::OK,
                json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "cairn-chat-0", "namespace": "team-a",
                                        "deletionTimestamp": "2026-12-02T00:00:00Z"}}),
            )
        } else {
            (StatusCode::OK, body)
        };
        let mut reply = reply;
        if status == StatusCode::OK
            && let Some(meta) = reply.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.insert("resourceVersion".into(), json!(STORED_VERSION));
            if method == http::Method::POST
                && path.ends_with("/pods")
                && let Some(at) = pod_created
            {
                meta.insert("creationTimestamp".into(), json!(at));
            }
        }
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&reply).unwrap_or_default()))
            .expect("response");
        respond.send_response(response);
    }
}

fn session(status: Option<AgentSessionStatus>) -> AgentSession {
    let mut s: AgentSession = serde_json::from_value(json!({
        "apiVersion": "cairn.dev/v1beta1",
        "kind": "AgentSession",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "u-1", "generation": 1,
                     "finalizers": [FINALIZER]},
        "spec": {"provider": {"kind": "openai", "model": "gpt-5"}},
    }))
    .expect("fixture");
    s.status = status;
    s
}

async fn reconcile_once(s: AgentSession) -> Seen {
    reconcile_against(s, TokenSecret::default(), LONG_AGO).await
}

/// One reconcile against a fake API server that holds `token_secret`.
async fn reconcile_against(
    s: AgentSession,
    token_secret: TokenSecret,
    pod_created: Option<&'static str>,
) -> Seen {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(serve_with(handle, token_secret, pod_created));
    let client = Client::new(service, "default");
    let ctx = Arc::new(Context::new(
        client,
        Defaults::default(),
        Arc::new(Metrics::default()),
        Arc::new(S3Purger),
        Duration::from_secs(3600),
    ));
    let action = controller::reconcile(Arc::new(DeserializeGuard(Ok(s))), ctx.clone()).await;
    assert!(action.is_ok(), "{action:?}");
    drop(ctx);
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("mock server ends when the client is dropped")
        .expect("mock server task")
}

fn requests(seen: &Seen) -> Vec<&str> {
    seen.iter()
        .map(|(r, _)| r.as_str())
        .filter(|r| !r.contains("/events"))
        .collect()
}

#[tokio::test]
async fn first_reconcile_applies_every_object_then_writes_status() {
    let seen = reconcile_once(session(None)).await;
    let ssa = |p: &str| format!("PATCH {p}");
    let expected = [
        "GET /api/v1/namespaces/team-a/secrets/cairn-chat-api-token".to_string(),
        ssa("/api/v1/namespaces/team-a/serviceaccounts/cairn-chat"),
        ssa("/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles/cairn-chat"),
        ssa("/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings/cairn-chat"),
        ssa("/api/v1/namespaces/team-a/secrets/cairn-chat-api-token"),
        ssa("/api/v1/namespaces/team-a/services/cairn-sessions"),
        ssa("/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/cairn-sessions"),
        "GET /api/v1/namespaces/team-a/pods/cairn-chat-0".to_string(),
        "POST /api/v1/namespaces/team-a/pods".to_string(),
        ssa("/apis/cairn.dev/v1beta1/namespaces/team-a/agentsessions/chat/status"),
    ];
    let got = requests(&seen);
    let paths: Vec<&str> = got
        .iter()
        .map(|r| r.split_once('?').map_or(*r, |(p, _)| p))
        .collect();
    assert_eq!(paths, expected, "requests in order");
    for patch in got.iter().filter(|r| r.starts_with("PATCH")) {
        let query = patch.split_once('?').map(|(_, q)| q).unwrap_or_default();
        let mut params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
        params.sort();
        assert_eq!(
            params,
            ["fieldManager=cairn-operator", "force=true"],
            "server-side apply, forced, one field manager: {patch}"
        );
    }

    let status = &seen
        .iter()
        .find(|(r, _)| r.contains("/status"))
        .expect("status patch")
        .1;
    assert_eq!(status["apiVersion"], "cairn.dev/v1beta1");
    assert_eq!(status["kind"], "AgentSession");
    assert_eq!(
        status["status"]["phase"], "Pending",
        "the pod is not ready, and not new"
    );
    assert_eq!(status["status"]["pod"], "cairn-chat-0");
    let pod = &seen
        .iter()
        .find(|(r, _)| r.starts_with("POST") && r.contains("/pods"))
        .expect("pod created")
        .1;
    assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "u-1");
    assert!(
        pod["metadata"]["annotations"]["cairn.dev/applied"].is_string(),
        "the pod carries the digest it was built with"
    );
    assert!(
        status["status"].get("session").is_none(),
        "the agent's block is not ours"
    );
    assert!(
        seen.iter()
            .any(|(r, _)| r.starts_with("POST") && r.contains("/events")),
        "transitions are published as Events"
    );
}

#[tokio::test]
async fn a_new_sessions_first_status_waits_for_its_pod() {
    let seen = reconcile_against(session(None), TokenSecret::default(), None).await;
    let got = requests(&seen);
    assert!(
        got.iter()
            .any(|r| r.starts_with("POST") && r.contains("/pods")),
        "the pod is created: {got:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(r, _)| r.contains("/status") || r.contains("/events")),
        "a status that would only say the pod is starting waits for the pod: {got:?}"
    );
}

#[tokio::test]
async fn an_unchanged_session_gets_no_status_write_and_no_event() {
    let token_secret = TokenSecret::default();
    let first = reconcile_against(session(None), token_secret.clone(), LONG_AGO).await;
    let written: AgentSessionStatus = serde_json::from_value(
        first
            .iter()
            .find(|(r, _)| r.contains("/status"))
            .expect("status patch")
            .1["status"]
            .clone(),
    )
    .expect("status parses");
    assert!(
        written.api_token_hash.is_some(),
        "the token's digest is published"
    );
    let second = reconcile_against(session(Some(written)), token_secret, LONG_AGO).await;
    assert!(
        !second.iter().any(|(r, _)| r.contains("/status")),
        "status unchanged: not written"
    );
    assert!(
        !second.iter().any(|(r, _)| r.contains("/events")),
        "nothing happened: no Event"
    );
}

/// An API server that fails every write with 500.
async fn serve_failing(mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>) {
    while let Some((request, respond)) = handle.next_request().await {
        let (status, reply) = if request.method() == http::Method::GET {
            (
                StatusCode::NOT_FOUND,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "reason": "NotFound", "code": 404, "message": "not found"}),
            )
        } else {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "reason": "InternalError", "code": 500, "message": "etcd is down"}),
            )
        };
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&reply).unwrap_or_default()))
            .expect("response");
        respond.send_response(response);
    }
}

#[tokio::test]
async fn transient_failures_back_off_per_object() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(serve_failing(handle));
    let ctx = Arc::new(Context::new(
        Client::new(service, "default"),
        Defaults::default(),
        Arc::new(Metrics::default()),
        Arc::new(S3Purger),
        Duration::from_secs(3600),
    ));
    let guard = Arc::new(DeserializeGuard(Ok(session(None))));
    for attempt in 1..=3 {
        let err = controller::reconcile(guard.clone(), ctx.clone())
            .await
            .expect_err("writes fail");
        assert_eq!(err.label(), "KubeApi");
        let action = controller::error_policy(guard.clone(), &err, ctx.clone());
        assert_ne!(action, kube::runtime::controller::Action::await_change());
        assert_eq!(ctx.backoff.failures("team-a/chat"), attempt);
    }
    assert_eq!(ctx.backoff.failures("team-a/other"), 0, "per object");
    let text = ctx.metrics.encode();
    assert!(
        text.contains("cairn_operator_reconciles_total{result=\"KubeApi\"} 3"),
        "{text}"
    );
}

#[tokio::test]
async fn an_undecodable_session_is_reported_and_waits_for_an_edit() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(serve(handle));
    let ctx = Arc::new(Context::new(
        Client::new(service, "default"),
        Defaults::default(),
        Arc::new(Metrics::default()),
        Arc::new(S3Purger),
        Duration::from_secs(3600),
    ));
    let invalid: DeserializeGuard<AgentSession> = serde_json::from_value(json!({
        "apiVersion": "cairn.dev/v1beta1",
        "kind": "AgentSession",
        "metadata": {"name": "broken", "namespace": "team-a", "uid": "u-2"},
        "spec": {"provider": {"kind": "carrier-pigeon", "model": "m"}},
    }))
    .expect("a guard always deserializes");
    assert!(invalid.0.is_err());
    let action = controller::reconcile(Arc::new(invalid), ctx.clone())
        .await
        .expect("reported, not an error");
    assert_eq!(action, kube::runtime::controller::Action::await_change());
    drop(ctx);
    let seen = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server ends")
        .expect("server task");
    assert_eq!(seen.len(), 1, "only the Event: {seen:?}");
    assert!(seen[0].0.starts_with("POST") && seen[0].0.contains("/events"));
    assert_eq!(seen[0].1["reason"], "InvalidObject");
}

/// A store that has had its first (empty) list, and its writer.
fn synced<K>() -> (Store<K>, Writer<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitDone);
    (reader, writer)
}

fn sent(log: &Mutex<Seen>) -> Vec<String> {
    log.lock()
        .expect("log")
        .iter()
        .map(|(r, _)| r.split_once('?').map_or(r.as_str(), |(p, _)| p).to_string())
        .collect()
}

/// The watches lag: a reconcile that finds the caches (and the session itself) older than what
/// the operator wrote a moment ago sends nothing again. Once the watch delivers a deletion or
/// an edit made after the operator's write, that object is repaired.
#[tokio::test]
async fn an_outdated_cache_is_no_reason_to_send_an_accepted_write_again() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let log = Arc::new(Mutex::new(Seen::new()));
    let server = tokio::spawn(serve_into(
        handle,
        log.clone(),
        TokenSecret::default(),
        LONG_AGO,
    ));
    let ctx = Arc::new(Context::new(
        Client::new(service, "default"),
        Defaults::default(),
        Arc::new(Metrics::default()),
        Arc::new(S3Purger),
        Duration::from_secs(3600),
    ));
    let (sessions, _sessions_writer) = synced();
    let (service_accounts, mut sa_writer) = synced::<Packed<ServiceAccount>>();
    let (roles, _roles_writer) = synced();
    let (role_bindings, _rb_writer) = synced();
    let (secrets, _secrets_writer) = synced();
    let (services, mut svc_writer) = synced::<Packed<Service>>();
    let (network_policies, mut np_writer) = synced::<Packed<NetworkPolicy>>();
    let (pods, mut pod_writer) = synced::<Packed<Pod>>();
    // An earlier version's Service and NetworkPolicy of the session itself (owned by it), and
    // another session's.
    let own = |name: &str, uid: &str| {
        json!({"metadata": {"name": name, "namespace": "team-a", "resourceVersion": "5",
                            "uid": format!("{name}-{uid}"),
                            "ownerReferences": [{"apiVersion": "cairn.dev/v1beta1",
                                                 "kind": "AgentSession", "name": "x",
                                                 "uid": uid, "controller": true}]}})
    };
    for (name, uid) in [("cairn-chat", "u-1"), ("cairn-other", "u-2")] {
        let svc: Service = serde_json::from_value(own(name, uid)).expect("svc fixture");
        svc_writer.apply_watcher_event(&pack_event(Event::Apply(svc)));
        let np: NetworkPolicy = serde_json::from_value(own(name, uid)).expect("np fixture");
        np_writer.apply_watcher_event(&pack_event(Event::Apply(np)));
    }
    // The cache holds the session's pod of an older build, ready.
    let older: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cairn-chat-0", "namespace": "team-a", "resourceVersion": "7",
                     "uid": "p-1",
                     "ownerReferences": [{"apiVersion": "cairn.dev/v1beta1",
                                          "kind": "AgentSession", "name": "chat", "uid": "u-1",
                                          "controller": true}],
                     "annotations": {"cairn.dev/applied": "an-older-build"}},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .expect("pod fixture");
    pod_writer.apply_watcher_event(&pack_event(Event::Apply(older)));
    ctx.add_stores(
        Some("team-a".into()),
        Stores {
            sessions,
            service_accounts,
            roles,
            role_bindings,
            secrets,
            services,
            network_policies,
            pods,
        },
    );
    let outdated = Arc::new(DeserializeGuard(Ok(session(None))));

    controller::reconcile(outdated.clone(), ctx.clone())
        .await
        .expect("first reconcile");
    let first = sent(&log);
    let writes = |all: &[String]| {
        all.iter()
            .filter(|r| !r.contains("/events"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        writes(&first),
        [
            "PATCH /api/v1/namespaces/team-a/serviceaccounts/cairn-chat",
            "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles/cairn-chat",
            "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings/cairn-chat",
            "POST /api/v1/namespaces/team-a/secrets",
            "PATCH /api/v1/namespaces/team-a/services/cairn-sessions",
            "PATCH /apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/cairn-sessions",
            "DELETE /api/v1/namespaces/team-a/services/cairn-chat",
            "DELETE /apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/cairn-chat",
            "DELETE /api/v1/namespaces/team-a/pods/cairn-chat-0",
            "PATCH /apis/cairn.dev/v1beta1/namespaces/team-a/agentsessions/chat/status",
        ],
        "everything is sent once (the token Secret created, the cache has none; the pod of \
         an older build is replaced; the session's own Service and NetworkPolicy of an \
         earlier version are deleted, another session's are left to it)"
    );
    assert!(first.iter().any(|r| r.contains("/events")), "transitions");
    assert_eq!(
        ctx.accepted.len(),
        10,
        "every write and deletion remembered until the watch has it"
    );

    // Nothing reached the caches: the same outdated session, the same outdated caches.
    controller::reconcile(outdated.clone(), ctx.clone())
        .await
        .expect("second reconcile");
    // The outdated copy has no status, so no token digest: the token Secret is read to
    // publish it, and the status that digest completes is the one already accepted.
    assert_eq!(
        sent(&log)[first.len()..],
        ["GET /api/v1/namespaces/team-a/secrets/cairn-chat-api-token"],
        "a reconcile of outdated copies sends nothing the API server accepted"
    );

    // The watch delivers the Service as the operator wrote it, then someone's edit of it; and
    // the ServiceAccount's deletion.
    let applied = |path: &str| {
        log.lock()
            .expect("log")
            .iter()
            .find(|(r, _)| r.starts_with("PATCH") && r.contains(path))
            .map(|(_, body)| body.clone())
            .expect("applied body")
    };
    let mut as_written: Service =
        serde_json::from_value(applied("/services/")).expect("service body");
    as_written.metadata.resource_version = Some(STORED_VERSION.into());
    let mut edited = as_written.clone();
    edited.metadata.resource_version = Some("43".into());
    if let Some(port) = edited
        .spec
        .as_mut()
        .and_then(|s| s.ports.as_mut())
        .and_then(|p| p.first_mut())
    {
        port.port = 1;
    }
    for event in [Event::Apply(as_written), Event::Apply(edited)].map(pack_event) {
        svc_writer.apply_watcher_event(&event);
        ctx.accepted.observe(&event);
    }
    let mut account: ServiceAccount =
        serde_json::from_value(applied("/serviceaccounts/")).expect("sa body");
    account.metadata.resource_version = Some(STORED_VERSION.into());
    let deleted = pack_event(Event::Delete(account));
    sa_writer.apply_watcher_event(&deleted);
    ctx.accepted.observe(&deleted);

    let before = sent(&log).len();
    controller::reconcile(outdated, ctx.clone())
        .await
        .expect("third reconcile");
    assert_eq!(
        writes(&sent(&log)[before..]),
        [
            // The outdated copy still has no token digest (see above).
            "GET /api/v1/namespaces/team-a/secrets/cairn-chat-api-token",
            "PATCH /api/v1/namespaces/team-a/serviceaccounts/cairn-chat",
            "PATCH /api/v1/namespaces/team-a/services/cairn-sessions",
        ],
        "the deleted and the edited object are repaired, nothing else is sent"
    );
    drop(ctx);
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}
