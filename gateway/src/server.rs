//! The gateway's HTTP API: `/{namespace}/{session}/v1/...` forwarded to the session, the
//! lifecycle API `/{namespace}/sessions[/{name}]`, health, and `/metrics` on its own router.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use cairn_crds::AgentSession;
use http::StatusCode;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::auth::{self, Caller, Identity, Oidc, TokenCache};
use crate::authz;
use crate::config::Settings;
use crate::directory::{Directory, Readiness};
use crate::error::GatewayError;
use crate::metrics::{Metrics, route_of};
use crate::proxy::{self, Forward};

/// A second wake request for the same session from this replica waits this long.
const WAKE_REPEAT: Duration = Duration::from_secs(5);
/// A session that just started may be Ready before its Service routes to the new pod (the
/// proxies of the nodes catch up a moment later): a request that found no listener is sent
/// again this often, within the wake timeout.
const STARTED_RETRY: Duration = Duration::from_millis(250);

/// Everything a request needs. Nothing in it is per-caller state: replicas are
/// interchangeable.
pub struct Gateway {
    pub dir: Arc<dyn Directory>,
    pub tokens: TokenCache,
    pub oidc: Option<Oidc>,
    pub http: reqwest::Client,
    pub settings: Settings,
    pub metrics: Metrics,
    /// For the lifecycle API (`None`: not served): the gateway's own Kubernetes client
    /// configuration. Each call is authorized for the caller with a SubjectAccessReview and
    /// then made with the gateway's own identity.
    pub kube: Option<kube::Config>,
    pub shutting_down: AtomicBool,
    wakes: std::sync::Mutex<HashMap<(String, String), Instant>>,
}

impl Gateway {
    pub fn new(
        dir: Arc<dyn Directory>,
        settings: Settings,
        oidc: Option<Oidc>,
        kube: Option<kube::Config>,
    ) -> Result<Arc<Self>, reqwest::Error> {
        Ok(Arc::new(Self {
            dir,
            tokens: TokenCache::new(settings.token_ttl),
            oidc,
            http: proxy::client(settings.connect_timeout)?,
            metrics: Metrics::default(),
            kube,
            shutting_down: AtomicBool::new(false),
            wakes: std::sync::Mutex::new(HashMap::new()),
            settings,
        }))
    }
}

type Shared = Arc<Gateway>;

/// The API router (sessions, lifecycle, health).
pub fn router(gw: Shared) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(
            "/{namespace}/sessions",
            get(list_sessions).post(create_session),
        )
        .route(
            "/{namespace}/sessions/{name}",
            get(get_session).delete(delete_session),
        )
        .route("/{namespace}/{session}/v1/{*rest}", any(forward))
        .fallback(not_found)
        .with_state(gw)
}

/// The metrics router (`/metrics` and health).
pub fn metrics_router(gw: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(gw)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(gw): State<Shared>) -> Response {
    if gw.shutting_down.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    } else if !gw.dir.synced() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the AgentSession list has not arrived yet",
        )
            .into_response()
    } else {
        "ok".into_response()
    }
}

async fn metrics(State(gw): State<Shared>) -> Response {
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        gw.metrics.encode(),
    )
        .into_response()
}

async fn not_found() -> GatewayError {
    GatewayError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route: sessions are served at /{namespace}/{session}/v1/...",
    )
}

/// Finishes a request: counts it (and a denial by its reason).
fn finish(
    gw: &Gateway,
    route: &'static str,
    start: Instant,
    r: Result<Response, GatewayError>,
) -> Response {
    let response = match r {
        Ok(r) => r,
        Err(e) => {
            if e.is_denial() {
                gw.metrics.denial(e.code);
            }
            e.into_response()
        }
    };
    gw.metrics.request(
        route,
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

async fn forward(
    State(gw): State<Shared>,
    Path((namespace, session, rest)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let start = Instant::now();
    let route = route_of(&rest);
    let r = serve_session(&gw, &namespace, &session, &rest, req).await;
    finish(&gw, route, start, r)
}

async fn serve_session(
    gw: &Gateway,
    namespace: &str,
    session: &str,
    rest: &str,
    req: Request,
) -> Result<Response, GatewayError> {
    let (parts, body) = req.into_parts();
    let token = authenticate(gw, &parts.headers, namespace, session).await?;
    if gw.dir.lookup(namespace, session).is_none() {
        return Err(GatewayError::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            format!("there is no session {namespace}/{session}"),
        ));
    }
    let body = axum::body::to_bytes(body, gw.settings.max_body_bytes)
        .await
        .map_err(|_| {
            GatewayError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                format!(
                    "the request body is larger than the gateway accepts ({} bytes)",
                    gw.settings.max_body_bytes
                ),
            )
        })?;
    let held_since = Instant::now();
    let (base, held) = until_ready(gw, namespace, session).await?;
    let path_and_query = match parts.uri.query() {
        Some(q) => format!("/v1/{rest}?{q}"),
        None => format!("/v1/{rest}"),
    };
    loop {
        let r = proxy::forward(Forward {
            http: &gw.http,
            base: &base,
            path_and_query: &path_and_query,
            method: parts.method.clone(),
            headers: &parts.headers,
            body: body.clone(),
            token: &token,
            response_timeout: gw.settings.response_timeout,
            stream_idle_timeout: gw.settings.stream_idle_timeout,
        })
        .await;
        match r {
            Err(e)
                if held
                    && e.not_delivered
                    && held_since.elapsed() + STARTED_RETRY < gw.settings.wake_timeout =>
            {
                tokio::time::sleep(STARTED_RETRY).await;
            }
            r => return r,
        }
    }
}

/// The caller may use the session: gives the session's token for the upstream request.
async fn authenticate(
    gw: &Gateway,
    headers: &http::HeaderMap,
    namespace: &str,
    session: &str,
) -> Result<Arc<str>, GatewayError> {
    let Some(presented) = auth::bearer(headers) else {
        return Err(GatewayError::unauthorized(
            "missing_token",
            "an Authorization: Bearer token is required",
        ));
    };
    if let Some(oidc) = &gw.oidc
        && auth::looks_like_jwt(presented)
    {
        let caller = oidc.verify(presented).await?;
        allow(&caller, namespace)?;
        return match gw.tokens.token(gw.dir.as_ref(), namespace, session).await? {
            Some(t) => Ok(t),
            None if gw.dir.lookup(namespace, session).is_none() => Err(GatewayError::new(
                StatusCode::NOT_FOUND,
                "session_not_found",
                format!("there is no session {namespace}/{session}"),
            )),
            None => Err(GatewayError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "token_unavailable",
                format!("session {namespace}/{session} has no API token yet; retry"),
            )),
        };
    }
    // The session's own token: checked against the digest the operator published on the
    // session (from the reflector's memory: no Secret is read, nothing asked of the API
    // server). A rotated token is a new digest, seen as soon as the watch delivers it.
    let denied = || {
        GatewayError::unauthorized(
            "invalid_token",
            format!("the bearer token is not the token of session {namespace}/{session}"),
        )
    };
    let Some(view) = gw.dir.lookup(namespace, session) else {
        return Err(denied());
    };
    match view.token_hash {
        Some(published) if auth::token_matches(namespace, session, presented, &published) => {
            Ok(Arc::from(presented))
        }
        Some(_) => Err(denied()),
        None => Err(GatewayError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "token_unavailable",
            format!(
                "session {namespace}/{session} has no published token digest yet \
                 (status.apiTokenHash, written by the operator); retry"
            ),
        )),
    }
}

fn allow(caller: &Caller, namespace: &str) -> Result<(), GatewayError> {
    if caller.may_use(namespace) {
        Ok(())
    } else {
        tracing::info!(
            subject = caller.subject.as_deref().unwrap_or(""),
            namespace,
            "JWT does not allow the namespace"
        );
        Err(GatewayError::forbidden(
            "namespace_forbidden",
            format!("the bearer JWT does not allow namespace {namespace}"),
        ))
    }
}

/// Waits (bounded) until the session takes requests, waking it when it sleeps for being
/// idle. Gives its base URL, and whether the request was held for a start.
async fn until_ready(
    gw: &Gateway,
    namespace: &str,
    session: &str,
) -> Result<(String, bool), GatewayError> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + gw.settings.wake_timeout;
    let mut changes = gw.dir.changes();
    let mut woke = false;
    let mut held = false;
    loop {
        changes.borrow_and_update();
        let Some(view) = gw.dir.lookup(namespace, session) else {
            return Err(GatewayError::new(
                StatusCode::NOT_FOUND,
                "session_not_found",
                format!("session {namespace}/{session} was deleted"),
            ));
        };
        match view.readiness {
            Readiness::Ready => {
                if woke {
                    gw.metrics.wakeup("ready");
                    tracing::info!(
                        namespace,
                        session,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "woken session ready; forwarding"
                    );
                }
                return Ok((view.url, held));
            }
            Readiness::Suspended => {
                return Err(GatewayError::new(
                    StatusCode::CONFLICT,
                    "session_suspended",
                    format!(
                        "session {namespace}/{session} is suspended (spec.suspend: true); resume it to use it"
                    ),
                ));
            }
            Readiness::Failed(why) => {
                return Err(GatewayError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "session_failed",
                    format!("session {namespace}/{session} has failed: {why}"),
                ));
            }
            Readiness::Idle => {
                woke = true;
                held = true;
                request_wake(gw, namespace, session).await?;
            }
            Readiness::Starting => held = true,
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => {
                gw.metrics.wakeup("timeout");
                return Err(GatewayError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "wake_timeout",
                    format!(
                        "session {namespace}/{session} was not ready within {} s; retry",
                        gw.settings.wake_timeout.as_secs()
                    ),
                ));
            }
        }
    }
}

async fn request_wake(gw: &Gateway, namespace: &str, session: &str) -> Result<(), GatewayError> {
    let key = (namespace.to_string(), session.to_string());
    {
        let Ok(mut wakes) = gw.wakes.lock() else {
            return Ok(());
        };
        if wakes.get(&key).is_some_and(|at| at.elapsed() < WAKE_REPEAT) {
            return Ok(());
        }
        wakes.retain(|_, at| at.elapsed() < WAKE_REPEAT);
        wakes.insert(key, Instant::now());
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let at = k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string();
    gw.dir
        .request_wake(namespace, session, &at)
        .await
        .map_err(|e| {
            tracing::warn!(namespace, session, error = %e, "requesting a wake");
            GatewayError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "wake_failed",
                format!("session {namespace}/{session} sleeps and could not be woken; retry"),
            )
        })?;
    gw.metrics.wakeup("requested");
    tracing::info!(
        namespace,
        session,
        at,
        "asked the operator to wake an idle session"
    );
    Ok(())
}

// ---- lifecycle API ----

/// The lifecycle API's caller: a JWT allowing the namespace, naming a usable Kubernetes
/// identity.
async fn lifecycle_caller(
    gw: &Gateway,
    headers: &http::HeaderMap,
    namespace: &str,
) -> Result<Identity, GatewayError> {
    let Some(oidc) = &gw.oidc else {
        return Err(GatewayError::forbidden(
            "lifecycle_disabled",
            "the lifecycle API needs an OIDC issuer (--oidc-issuer); it is off",
        ));
    };
    let Some(presented) = auth::bearer(headers) else {
        return Err(GatewayError::unauthorized(
            "missing_token",
            "an Authorization: Bearer JWT is required",
        ));
    };
    if !auth::looks_like_jwt(presented) {
        return Err(GatewayError::unauthorized(
            "invalid_token",
            "the lifecycle API takes a JWT of the configured issuer, not a session token",
        ));
    }
    let caller = oidc.verify(presented).await?;
    allow(&caller, namespace)?;
    caller.identity.clone().map_err(|why| {
        tracing::info!(
            subject = caller.subject.as_deref().unwrap_or(""),
            why = %why,
            "JWT names no usable Kubernetes identity"
        );
        GatewayError::forbidden("identity_forbidden", why)
    })
}

/// The gateway's own Kubernetes client (its ServiceAccount's narrow role).
fn own_client(gw: &Gateway) -> Result<kube::Client, GatewayError> {
    let unavailable = |why: &str| {
        GatewayError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "lifecycle_unavailable",
            format!("this gateway cannot reach Kubernetes: {why}"),
        )
    };
    let config = gw
        .kube
        .clone()
        .ok_or_else(|| unavailable("no Kubernetes client"))?;
    kube::Client::try_from(config).map_err(|e| {
        tracing::warn!(error = %e, "building the Kubernetes client");
        unavailable("building the client failed")
    })
}

/// Asks Kubernetes whether the caller may make `call` (a SubjectAccessReview); a refusal is
/// 403 `kubernetes_forbidden` naming the user, the verb and the resource.
async fn authorize(
    client: &kube::Client,
    who: &Identity,
    call: &authz::Call<'_>,
) -> Result<(), GatewayError> {
    match authz::authorize(client, who, call).await {
        Ok(authz::Decision::Allowed) => {
            tracing::debug!(user = %who.user, groups = ?who.groups, verb = call.verb, namespace = call.namespace, "lifecycle call allowed");
            Ok(())
        }
        Ok(authz::Decision::Denied(reason)) => {
            tracing::info!(user = %who.user, verb = call.verb, namespace = call.namespace, "lifecycle call refused by Kubernetes RBAC");
            Err(GatewayError::forbidden(
                "kubernetes_forbidden",
                format!(
                    "Kubernetes RBAC does not allow this: {}",
                    authz::refusal(who, call, Some(&reason))
                ),
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "SubjectAccessReview");
            Err(GatewayError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "lifecycle_unavailable",
                "the gateway could not ask Kubernetes whether the call is allowed; retry",
            ))
        }
    }
}

fn kube_error(e: kube::Error, namespace: &str, name: &str) -> GatewayError {
    match &e {
        kube::Error::Api(s) => match s.code {
            404 => GatewayError::new(
                StatusCode::NOT_FOUND,
                "session_not_found",
                format!("there is no session {namespace}/{name}"),
            ),
            409 => GatewayError::new(
                StatusCode::CONFLICT,
                "session_exists",
                format!("session {namespace}/{name} already exists"),
            ),
            400 | 422 => GatewayError::new(
                StatusCode::BAD_REQUEST,
                "invalid_session",
                s.message.clone(),
            ),
            // The caller was allowed, the gateway's own role was not (a chart whose role
            // lacks the verb): not the caller's fault.
            403 => {
                tracing::warn!(message = %s.message, "the gateway's own role refused a lifecycle call");
                GatewayError::new(
                    StatusCode::BAD_GATEWAY,
                    "kubernetes_error",
                    format!("the gateway's own role does not allow this: {}", s.message),
                )
            }
            _ => GatewayError::new(
                StatusCode::BAD_GATEWAY,
                "kubernetes_error",
                s.message.clone(),
            ),
        },
        _ => {
            tracing::warn!(error = %e, "lifecycle API call");
            GatewayError::new(
                StatusCode::BAD_GATEWAY,
                "kubernetes_unreachable",
                "the Kubernetes API could not be reached",
            )
        }
    }
}

/// A session object as answered: the API server's, without managed fields.
fn answer(mut s: AgentSession) -> Value {
    s.metadata.managed_fields = None;
    serde_json::to_value(s).unwrap_or(Value::Null)
}

/// One lifecycle call: the caller authenticated (a JWT allowing the namespace), `verb` on
/// the session `name` (or the collection) authorized for the caller by Kubernetes, then `f`
/// with the gateway's own client.
async fn lifecycle<F, Fut>(
    gw: Shared,
    headers: http::HeaderMap,
    namespace: String,
    verb: &'static str,
    name: Option<String>,
    f: F,
) -> Response
where
    F: FnOnce(Api<AgentSession>) -> Fut,
    Fut: std::future::Future<Output = Result<Response, GatewayError>>,
{
    let start = Instant::now();
    let r = async {
        let who = lifecycle_caller(&gw, &headers, &namespace).await?;
        let client = own_client(&gw)?;
        let call = authz::Call {
            verb,
            namespace: &namespace,
            name: name.as_deref(),
        };
        authorize(&client, &who, &call).await?;
        f(Api::namespaced(client, &namespace)).await
    }
    .await;
    finish(&gw, "lifecycle", start, r)
}

async fn list_sessions(
    State(gw): State<Shared>,
    Path(namespace): Path<String>,
    headers: http::HeaderMap,
) -> Response {
    let ns = namespace.clone();
    lifecycle(gw, headers, namespace, "list", None, |api| async move {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error(e, &ns, ""))?;
        let data: Vec<Value> = list.items.into_iter().map(answer).collect();
        Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
    })
    .await
}

async fn get_session(
    State(gw): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    headers: http::HeaderMap,
) -> Response {
    let ns = namespace.clone();
    let n = Some(name.clone());
    lifecycle(gw, headers, namespace, "get", n, |api| async move {
        let s = api
            .get(&name)
            .await
            .map_err(|e| kube_error(e, &ns, &name))?;
        Ok(axum::Json(answer(s)).into_response())
    })
    .await
}

async fn delete_session(
    State(gw): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    headers: http::HeaderMap,
) -> Response {
    let ns = namespace.clone();
    let n = Some(name.clone());
    lifecycle(gw, headers, namespace, "delete", n, |api| async move {
        api.delete(&name, &DeleteParams::background())
            .await
            .map_err(|e| kube_error(e, &ns, &name))?;
        Ok(axum::Json(
            json!({"object": "session.deleted", "namespace": ns, "name": name, "deleted": true}),
        )
        .into_response())
    })
    .await
}

/// The body of a create: `{"name": .., "spec": {..}}` or an AgentSession object. Pure.
pub fn session_to_create(namespace: &str, body: &[u8]) -> Result<AgentSession, GatewayError> {
    let bad = |why: String| GatewayError::new(StatusCode::BAD_REQUEST, "invalid_session", why);
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(bad("the body must be a JSON object".into()));
    };
    obj.entry("metadata").or_insert_with(|| json!({}));
    if let Some(name) = obj.remove("name")
        && let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut)
    {
        m.insert("name".into(), name);
    }
    obj.insert("apiVersion".into(), json!("cairn.dev/v1beta1"));
    obj.insert("kind".into(), json!("AgentSession"));
    let mut s: AgentSession = serde_json::from_value(v)
        .map_err(|e| bad(format!("the body is not an AgentSession: {e}")))?;
    match s.metadata.namespace.as_deref() {
        Some(ns) if ns != namespace => {
            return Err(bad(format!(
                "metadata.namespace {ns} differs from the namespace of the path, {namespace}"
            )));
        }
        _ => s.metadata.namespace = Some(namespace.to_string()),
    }
    if s.metadata.name.as_deref().unwrap_or("").is_empty() && s.metadata.generate_name.is_none() {
        return Err(bad("a session needs a name".into()));
    }
    s.metadata.resource_version = None;
    s.metadata.uid = None;
    s.status = None;
    Ok(s)
}

async fn create_session(
    State(gw): State<Shared>,
    Path(namespace): Path<String>,
    headers: http::HeaderMap,
    body: Body,
) -> Response {
    let ns = namespace.clone();
    let limit = gw.settings.max_body_bytes;
    // RBAC cannot restrict a create by name: the collection is what is authorized.
    lifecycle(gw, headers, namespace, "create", None, |api| async move {
        let body = axum::body::to_bytes(body, limit).await.map_err(|_| {
            GatewayError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                "the request body is too large",
            )
        })?;
        let s = session_to_create(&ns, &body)?;
        let name = s.metadata.name.clone().unwrap_or_default();
        let created = api
            .create(&PostParams::default(), &s)
            .await
            .map_err(|e| kube_error(e, &ns, &name))?;
        Ok((StatusCode::CREATED, axum::Json(answer(created))).into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_body_is_a_name_and_a_spec_or_an_object() {
        let spec = r#"{"name": "chat", "spec": {"provider": {"kind": "openai", "model": "m"}}}"#;
        let s = session_to_create("team-a", spec.as_bytes()).expect("valid");
        assert_eq!(s.metadata.name.as_deref(), Some("chat"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("team-a"));
        let other = r#"{"metadata": {"name": "chat", "namespace": "team-b"}, "spec": {"provider": {"kind": "openai", "model": "m"}}}"#;
        let e = session_to_create("team-a", other.as_bytes()).expect_err("other namespace");
        assert_eq!(e.code, "invalid_session");
        let e = session_to_create("team-a", b"[1]").expect_err("not an object");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = session_to_create(
            "team-a",
            br#"{"spec": {"provider": {"kind": "openai", "model": "m"}}}"#,
        )
        .expect_err("no name");
        assert!(e.message.contains("name"), "{}", e.message);
    }
}
