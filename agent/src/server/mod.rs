//! The HTTP API of a session (axum): the OpenAI Responses and Chat Completions APIs
//! (`responses`, `chat`; request items and tools in `items`, replay reconciliation in
//! `crate::replay`), session endpoints (the context inspector, `GET /v1/session/context`, in
//! `inspector`), recall, health and metrics.
//!
//! Every route but `/healthz`, `/readyz` and `/metrics` needs `Authorization: Bearer
//! $CAIRN_API_TOKEN`. `/metrics` carries counters only (no message bodies, no secrets) so a
//! Prometheus scraper needs no session token. One turn runs at a time: a request that needs
//! the session while another holds it gets 409. Bodies over the limit get 413; malformed
//! ones 400; every error is a JSON `{"error": {"message", "type", "code", "param"}}`. A failed
//! provider answers with its class ([`ApiError::provider`]): 429 with the provider's
//! `Retry-After`, 503 for an overload, 504 for a timeout, 502 otherwise.

mod chat;
mod inspector;
mod items;
mod listen;
mod page;
mod responses;

pub use listen::{Limits, LimitsError, serve as serve_limited};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::{Mutex, watch};

use crate::ccr::stats::ArchiveCounters;
use crate::ccr::{RecallError, Store, recall};
use crate::metrics::Metrics;
use crate::session::{InvalidRequest, ProviderAnswer, Session, TurnError};
use cairn_crds::SessionStats;
use cairn_crds::time::rfc3339_millis;

/// Default request-body limit (`CAIRN_MAX_REQUEST_BYTES`).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    pub session: Arc<Mutex<Session>>,
    token: Arc<str>,
    metrics: Arc<Metrics>,
    archive_counters: Arc<ArchiveCounters>,
    store: Arc<dyn Store>,
    ready: Arc<AtomicBool>,
    view: Arc<RwLock<Value>>,
    lost: Arc<RwLock<Option<String>>>,
    stats_tx: Arc<watch::Sender<Option<SessionStats>>>,
    /// When work for a client last started or ended (`status.session.lastActivity`).
    last_activity: Arc<RwLock<Option<String>>>,
    /// Client work running now (the idle report waits while there is any).
    in_flight: Arc<watch::Sender<usize>>,
    /// The ids of the newest stored Response objects, oldest first, for `GET
    /// /v1/responses/{id}`: with the object when this process answered it, `None` for one of
    /// an earlier run (read from the store).
    recent: Arc<RwLock<RecentResponses>>,
    /// Where they are kept across restarts: the journal's store, under `responses/`.
    responses: Arc<dyn crate::journal::ObjectStore>,
    /// Whether this process has deleted what earlier runs stored beyond `recent`.
    swept: Arc<AtomicBool>,
}

/// Recent response ids, oldest first, with the object when this process has it.
type RecentResponses = std::collections::VecDeque<(String, Option<Value>)>;

/// Response objects `GET /v1/responses/{id}` finds (the newest kept, in memory and in the
/// journal's store).
pub const RECENT_RESPONSES: usize = 32;

/// Name of a stored Response object; `None` for an id the session cannot have issued.
fn response_object_name(id: &str) -> Option<String> {
    let hex = id.strip_prefix("resp_")?;
    (hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("responses/{id}.json"))
}

impl AppState {
    pub fn new(session: Session, token: impl Into<Arc<str>>) -> Self {
        let metrics = Arc::clone(session.metrics());
        let archive_counters = Arc::clone(session.archive_counters());
        let store = session.store();
        let (stats_tx, _) = watch::channel(Some(session.stats()));
        let view = Arc::new(RwLock::new(view_of(&session, "idle")));
        let responses = session.journal_objects();
        // The ledger's recent response ids: what earlier runs may have stored.
        let ids = &session.ledger().responses;
        let recent = ids[ids.len().saturating_sub(RECENT_RESPONSES)..]
            .iter()
            .map(|id| (id.clone(), None))
            .collect();
        Self {
            session: Arc::new(Mutex::new(session)),
            token: token.into(),
            metrics,
            archive_counters,
            store,
            ready: Arc::new(AtomicBool::new(true)),
            view,
            lost: Arc::new(RwLock::new(None)),
            stats_tx: Arc::new(stats_tx),
            last_activity: Arc::new(RwLock::new(None)),
            in_flight: Arc::new(watch::channel(0).0),
            recent: Arc::new(RwLock::new(recent)),
            responses,
            swept: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Keeps a Response object for `GET /v1/responses/{id}`: in memory and in the journal's
    /// store, so a restarted agent still finds it. Only the newest [`RECENT_RESPONSES`] are
    /// kept. Storing is best effort: a failure is logged and the response still answered
    /// (the conversation itself is in the journal either way).
    async fn remember(&self, id: &str, response: &Value) {
        let mut evicted = Vec::new();
        if let Ok(mut r) = self.recent.write() {
            r.retain(|(k, _)| k != id);
            r.push_back((id.to_owned(), Some(response.clone())));
            while r.len() > RECENT_RESPONSES {
                evicted.extend(r.pop_front().map(|(k, _)| k));
            }
        }
        let Some(name) = response_object_name(id) else {
            return;
        };
        if let Err(e) = self
            .responses
            .put(&name, response.to_string().into_bytes())
            .await
        {
            tracing::warn!(id, error = %e, "storing the response for GET /v1/responses failed");
            return;
        }
        // The first response stored by this process also deletes whatever earlier runs
        // stored beyond the recent ids.
        if !self.swept.swap(true, Ordering::SeqCst) {
            match self.responses.list("responses/").await {
                Ok(names) => {
                    let recent = self.recent_ids();
                    evicted.extend(names.iter().filter_map(|n| {
                        let id = n.strip_prefix("responses/")?.strip_suffix(".json")?;
                        (!recent.iter().any(|k| k == id)).then(|| id.to_owned())
                    }));
                }
                Err(e) => tracing::warn!(error = %e, "listing stored responses failed"),
            }
        }
        for old in evicted {
            if let Some(n) = response_object_name(&old)
                && let Err(e) = self.responses.delete(&n).await
            {
                tracing::warn!(id = old, error = %e, "deleting an old stored response failed");
            }
        }
    }

    fn recent_ids(&self) -> Vec<String> {
        self.recent
            .read()
            .map(|r| r.iter().map(|(k, _)| k.clone()).collect())
            .unwrap_or_default()
    }

    /// A stored Response object: from memory, else (one of an earlier run) from the store.
    async fn recalled(&self, id: &str) -> Option<Value> {
        let cached = self
            .recent
            .read()
            .ok()?
            .iter()
            .rev()
            .find(|(k, _)| k == id)
            .map(|(_, v)| v.clone())?;
        if cached.is_some() {
            return cached;
        }
        let name = response_object_name(id)?;
        match self.responses.get(&name).await {
            Ok(Some(body)) => serde_json::from_slice(&body).ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(id, error = %e, "reading a stored response failed");
                None
            }
        }
    }

    /// Session counters after every turn (the status writer follows this).
    pub fn stats(&self) -> watch::Receiver<Option<SessionStats>> {
        self.stats_tx.subscribe()
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// This agent lost the session (its Lease went to another pod): no more turns.
    pub fn fence(&self, reason: String) {
        self.set_ready(false);
        if let Ok(mut v) = self.view.write()
            && let Some(o) = v.as_object_mut()
        {
            o.insert("status".into(), json!("fenced"));
            o.insert("fenced".into(), json!(reason));
        }
        if let Ok(mut l) = self.lost.write() {
            *l = Some(reason);
        }
    }

    /// Refuses work once the session was lost.
    fn check_owned(&self) -> Result<(), ApiError> {
        match self.lost.read().ok().and_then(|l| l.clone()) {
            Some(reason) => Err(ApiError::new(StatusCode::CONFLICT, "fenced", reason)),
            None => Ok(()),
        }
    }

    /// Client work in flight, as it changes (the status writer's idle report follows it).
    pub fn in_flight(&self) -> watch::Receiver<usize> {
        self.in_flight.subscribe()
    }

    /// Client work starts now: recorded as activity and counted in flight until the
    /// returned guard is dropped (after the work's [`AppState::publish`]).
    pub fn begin(&self) -> Work {
        self.in_flight.send_modify(|n| *n += 1);
        self.touch();
        Work {
            in_flight: Arc::clone(&self.in_flight),
        }
    }

    /// Records that work for a client starts or ends now (`status.session.lastActivity`,
    /// to the millisecond: the idle report is due `idle.suspendAfter` after it).
    pub fn touch(&self) {
        let now = rfc3339_millis(SystemTime::now());
        if let Ok(mut l) = self.last_activity.write() {
            *l = Some(now.clone());
        }
        self.stats_tx.send_modify(|s| {
            if let Some(s) = s.as_mut() {
                s.last_activity = Some(now);
            }
        });
    }

    /// Refreshes the cached view after work for a client changed the session.
    pub fn publish(&self, session: &Session) {
        self.touch();
        self.refresh(session);
    }

    /// Refreshes the cached view (no client activity: a background check changed it).
    pub fn refresh(&self, session: &Session) {
        let status = if session.fenced().is_some() {
            self.set_ready(false);
            "fenced"
        } else {
            "idle"
        };
        if let Ok(mut v) = self.view.write() {
            *v = view_of(session, status);
        }
        let mut stats = session.stats();
        stats.last_activity = self.last_activity.read().ok().and_then(|l| l.clone());
        self.stats_tx.send_replace(Some(stats));
    }
}

/// Client work in flight; dropping it ends it.
#[must_use = "the work ends when this is dropped"]
pub struct Work {
    in_flight: Arc<watch::Sender<usize>>,
}

impl Drop for Work {
    fn drop(&mut self) {
        self.in_flight.send_modify(|n| *n = n.saturating_sub(1));
    }
}

fn view_of(session: &Session, status: &str) -> Value {
    let live = session.live();
    json!({
        "namespace": session.namespace,
        "name": session.name,
        "status": status,
        "fenced": session.fenced(),
        "provider": live.spec.provider.kind.as_str(),
        "model": live.spec.provider.model,
        "contextWindow": live.limits.context_window,
        "payloadCap": live.payload_cap,
        "journalEpoch": session.journal_epoch(),
        "stats": session.stats(),
        "replay": {
            "items": session.ledger().items.len(),
            "latestResponse": session.ledger().latest_response(),
        },
        // The shape of the newest messages (roles and sizes, never their text): what a
        // person checks first after a compaction.
        "recent": session
            .history()
            .iter()
            .rev()
            .take(4)
            .rev()
            .map(|m| json!({"role": m.role.as_str(), "bytes": m.weight(), "summary": m.meta.is_summary}))
            .collect::<Vec<_>>(),
        "policyHash": live.policy_hash,
        "policy": live.policy,
        // The newest compactions, oldest first (the session page's timeline).
        "timeline": session.state().timeline,
    })
}

/// Runs a non-streamed turn in its own task, as a streamed one runs: a client that goes away
/// mid-turn (dropping the handler) does not cancel it; it runs to the end and is journaled,
/// so the next request never finds a question without its answer.
async fn detached_turn(
    state: &AppState,
    mut session: tokio::sync::OwnedMutexGuard<Session>,
    input: Vec<crate::history::Message>,
    options: crate::session::TurnOptions,
) -> Result<crate::session::TurnOutcome, ApiError> {
    let task_state = state.clone();
    let turn = tokio::spawn(async move {
        let work = task_state.begin();
        let result = session.turn_with_options(input, options, None).await;
        task_state.publish(&session);
        drop(work);
        result
    });
    let outcome = turn.await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "turn_failed",
            format!("the turn task failed: {e}"),
        )
    })??;
    Ok(outcome)
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// `Retry-After` (and `retry-after-ms` when it is not whole seconds).
    retry_after: Option<Duration>,
    /// `x-should-retry: false`: a retry cannot succeed (the OpenAI SDKs obey it).
    final_answer: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            final_answer: false,
        }
    }

    /// The answer to a turn the provider failed: its class (the classifier's label) and
    /// what the provider's last answer said decide the status, the code and the delay.
    /// Pure: docs/agent.md, "Provider failures", is its table.
    pub fn provider(class: &'static str, answer: ProviderAnswer, message: String) -> Self {
        let e = |status, code| Self::new(status, code, message.clone());
        match class {
            "rate_limit" if answer.quota_exhausted => Self {
                final_answer: true,
                ..e(StatusCode::TOO_MANY_REQUESTS, "insufficient_quota")
            },
            "rate_limit" => Self {
                retry_after: answer.retry_after,
                ..e(StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded")
            },
            "auth" => Self {
                final_answer: true,
                ..e(StatusCode::BAD_GATEWAY, "provider_auth")
            },
            // The provider's delay or none: an invented one would be a promise nobody made.
            "overloaded" => Self {
                retry_after: answer.retry_after,
                ..e(StatusCode::SERVICE_UNAVAILABLE, "provider_overloaded")
            },
            "server_error" if answer.status == Some(503) => Self {
                retry_after: answer.retry_after,
                ..e(StatusCode::SERVICE_UNAVAILABLE, "provider_overloaded")
            },
            // Something on the network path answered in the provider's place: no retry and
            // no shorter request can help until the path is fixed.
            "captive_portal" => Self {
                final_answer: true,
                ..Self::new(
                    StatusCode::BAD_GATEWAY,
                    "provider_captive_portal",
                    format!(
                        "an HTML page answered instead of the provider (a captive portal or a proxy on the way to the provider's URL; check the network path and the URL): {message}"
                    ),
                )
            },
            "timeout" => e(StatusCode::GATEWAY_TIMEOUT, "provider_timeout"),
            _ => e(StatusCode::BAD_GATEWAY, "provider"),
        }
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            409 => "conflict_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The OpenAI error shape: `{"error": {message, type, code, param}}`.
    pub(crate) fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind(), "code": self.code, "param": null}})
    }

    /// The error of a failed streamed turn, as the Responses API's `response.error`.
    pub(crate) fn response_error(&self) -> Value {
        json!({"code": self.code, "message": self.message, "type": self.kind()})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        let h = r.headers_mut();
        if let Some(wait) = self.retry_after {
            // Whole seconds, rounded up (RFC 9110); the exact delay beside it when it has a
            // fraction, as OpenAI sends `retry-after-ms`.
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            h.insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
            if wait.subsec_nanos() > 0 {
                let ms = wait.as_millis() as u64;
                h.insert("retry-after-ms", header::HeaderValue::from(ms));
            }
        }
        if self.final_answer {
            h.insert("x-should-retry", header::HeaderValue::from_static("false"));
        }
        r
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        let status = r.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(
                status,
                "body_too_large",
                "request body exceeds the size limit",
            )
        } else {
            Self::new(status, "bad_body", r.body_text())
        }
    }
}

impl From<InvalidRequest> for ApiError {
    fn from(e: InvalidRequest) -> Self {
        Self::new(StatusCode::BAD_REQUEST, e.code(), e.to_string())
    }
}

impl From<TurnError> for ApiError {
    fn from(e: TurnError) -> Self {
        let status = match &e {
            TurnError::BadInput(invalid) => return invalid.clone().into(),
            TurnError::Provider { class, answer, .. } => {
                return Self::provider(class, *answer, e.to_string());
            }
            TurnError::Floor(_) => StatusCode::UNPROCESSABLE_ENTITY,
            TurnError::Journal(_) | TurnError::Unsettled(_) => StatusCode::SERVICE_UNAVAILABLE,
            TurnError::Fenced(_) => StatusCode::CONFLICT,
            TurnError::NothingToRewind => StatusCode::CONFLICT,
            TurnError::Deadline(_) => StatusCode::GATEWAY_TIMEOUT,
            TurnError::ContextFull(_) => StatusCode::UNPROCESSABLE_ENTITY,
            TurnError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            TurnError::BudgetExceeded(_) => StatusCode::PAYMENT_REQUIRED,
        };
        Self::new(status, e.label(), e.to_string())
    }
}

/// How long a streamed answer's response head waits for the turn's first event: a turn that
/// fails before then is answered with the failure's own status (429, 503, ...) instead of a
/// 200 stream that carries the error.
pub const STREAM_HEAD_HOLD: Duration = Duration::from_secs(30);

type HeadSlot = Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<Option<ApiError>>>>>;

/// The turn's side of a streamed answer whose head is held (see [`STREAM_HEAD_HOLD`]).
pub(crate) struct Head {
    slot: HeadSlot,
}

/// The handler's side: waits for the turn's first event or its failure.
pub(crate) struct HeadWait {
    slot: HeadSlot,
    rx: tokio::sync::oneshot::Receiver<Option<ApiError>>,
}

/// A held response head: whoever takes the slot first decides between a stream and an
/// error status; the sender is used under the slot's lock, so the other side sees it.
pub(crate) fn hold_head() -> (Head, HeadWait) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let slot: HeadSlot = Arc::new(std::sync::Mutex::new(Some(tx)));
    (
        Head {
            slot: Arc::clone(&slot),
        },
        HeadWait { slot, rx },
    )
}

impl Head {
    fn take_and(&self, value: Option<ApiError>) -> Result<(), Option<ApiError>> {
        let Ok(mut slot) = self.slot.lock() else {
            return Err(value);
        };
        match slot.take() {
            Some(tx) => {
                // The handler may be gone (its client left): nothing to answer then.
                let _ = tx.send(value);
                Ok(())
            }
            None => Err(value),
        }
    }

    /// The stream starts: the head goes out (if the hold has not sent it already).
    pub(crate) fn start(&self) {
        let _ = self.take_and(None);
    }

    /// The turn failed before the stream started: the error is the answer's status and body
    /// (`None` back), unless the hold ran out and the stream has started (the error back, to
    /// be sent in the stream).
    pub(crate) fn fail(&self, e: ApiError) -> Option<ApiError> {
        self.take_and(Some(e)).err().flatten()
    }
}

impl HeadWait {
    /// `Err` when the turn failed before its first event; `Ok` once the stream starts.
    pub(crate) async fn wait(mut self, hold: Duration) -> Result<(), ApiError> {
        match tokio::time::timeout(hold, &mut self.rx).await {
            Ok(Ok(Some(e))) => Err(e),
            Ok(_) => Ok(()),
            Err(_) => {
                let taken = self.slot.lock().ok().and_then(|mut s| s.take());
                match taken {
                    // The head goes out now: the turn will send its failure in the stream.
                    Some(_) => Ok(()),
                    // The turn took the slot first and sent under its lock.
                    None => match self.rx.try_recv() {
                        Ok(Some(e)) => Err(e),
                        _ => Ok(()),
                    },
                }
            }
        }
    }
}

fn busy() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "session_busy",
        "another turn is running on this session; retry when it has finished",
    )
}

/// The server of an agent that is still opening its session (waiting for its journal
/// Lease, rebuilding the history): `/healthz` answers from the start so the kubelet does
/// not restart a pod that is only waiting, `/readyz` says what it waits for, and every other
/// route gets 503 until [`Gate::open`] hands over the session's router.
#[derive(Clone, Default)]
pub struct Gate {
    inner: Arc<OnceLock<Router>>,
    waiting: Arc<RwLock<String>>,
}

impl Gate {
    pub fn new(waiting: impl Into<String>) -> Self {
        Self {
            inner: Arc::default(),
            waiting: Arc::new(RwLock::new(waiting.into())),
        }
    }

    /// What the agent waits for, as `/readyz` reports it.
    pub fn waiting(&self, why: impl Into<String>) {
        if let Ok(mut w) = self.waiting.write() {
            *w = why.into();
        }
    }

    /// From now on every request goes to `router`.
    pub fn open(&self, router: Router) {
        let _ = self.inner.set(router);
    }

    pub fn router(&self) -> Router {
        let gate = self.clone();
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .fallback(move |request: axum::extract::Request| {
                let gate = gate.clone();
                async move { gate.handle(request).await }
            })
            .method_not_allowed_fallback(method_not_allowed)
    }

    async fn handle(&self, request: axum::extract::Request) -> Response {
        use tower::ServiceExt;
        if let Some(router) = self.inner.get() {
            return match router.clone().oneshot(request).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
        }
        let why = self
            .waiting
            .read()
            .map(|w| w.clone())
            .unwrap_or_else(|_| "starting".into());
        if request.uri().path() == "/readyz" {
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", why)
                .into_response();
        }
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting",
            format!("the session is not open yet: {why}"),
        )
        .into_response()
    }
}

/// The router with every route.
pub fn router(state: AppState, max_body: usize) -> Router {
    let protected = Router::new()
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get))
        .route("/v1/chat/completions", post(chat::create))
        .route("/v1/session", get(get_session))
        .route("/v1/session/context", get(inspector::get_context))
        .route("/v1/session/compact", post(compact))
        .route("/v1/session/rewind", post(rewind))
        .route("/v1/session/reset-payload-cap", post(reset_payload_cap))
        .route("/v1/recall/{key}", get(get_recall))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/ui", get(page::page))
        .merge(protected)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// A known route asked with a method it does not answer (axum's own 405 has no body).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not answer {method}", uri.path()),
    )
}

async fn auth(
    State(state): State<AppState>,
    headers: HeaderMap,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match presented {
        Some(t) if constant_time_eq(t.as_bytes(), state.token.as_bytes()) => {
            next.run(request).await
        }
        _ => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token (Authorization: Bearer $CAIRN_API_TOKEN)",
        )
        .into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.ready.load(Ordering::SeqCst) {
        "ready".into_response()
    } else {
        let reason = state
            .view
            .read()
            .ok()
            .and_then(|v| v.get("fenced").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| "not ready".into());
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", reason).into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state
            .metrics
            .render(Some(state.archive_counters.snapshot())),
    )
        .into_response()
}

async fn get_session(State(state): State<AppState>) -> Response {
    let mut v = state.view.read().map(|v| v.clone()).unwrap_or(Value::Null);
    match state.session.try_lock() {
        Err(_) => {
            if let Some(o) = v.as_object_mut() {
                o.insert("status".into(), json!("busy"));
            }
        }
        // The session memory changes between turns (its background updates): read it now.
        Ok(session) => {
            if let Some(m) = session.memory_stats()
                && let Some(stats) = v.get_mut("stats").and_then(Value::as_object_mut)
            {
                stats.insert("memory".into(), json!(m));
            }
        }
    }
    axum::Json(v).into_response()
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("request body is not valid JSON: {e}"),
        )
    })
}

async fn compact(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = parse_json(&body?)?;
    let instruction = match body.get("instruction") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_instruction",
                "instruction must be a string",
            ));
        }
    };
    state.check_owned()?;
    let mut session = state.session.try_lock().map_err(|_| busy())?;
    let work = state.begin();
    let result = session.compact_now(instruction).await;
    state.publish(&session);
    drop(work);
    let out = result?;
    Ok(axum::Json(json!({
        "trigger": out.trigger.label(),
        "level": out.level,
        "bytesBefore": out.bytes_before,
        "bytesAfter": out.bytes_after,
        "met": out.met,
        "messages": session.history().len(),
        "quality": out.quality,
        "belowMinScore": out.below_min_score,
    }))
    .into_response())
}

async fn rewind(State(state): State<AppState>) -> Result<Response, ApiError> {
    state.check_owned()?;
    let mut session = state.session.try_lock().map_err(|_| busy())?;
    let work = state.begin();
    let result = session.rewind().await;
    state.publish(&session);
    drop(work);
    let messages = result?;
    Ok(axum::Json(json!({
        "messages": messages,
        "historyBytes": session.stats().history_bytes,
        "levelsLeft": session.rewind_levels(),
    }))
    .into_response())
}

async fn reset_payload_cap(State(state): State<AppState>) -> Result<Response, ApiError> {
    state.check_owned()?;
    let mut session = state.session.try_lock().map_err(|_| busy())?;
    let work = state.begin();
    let result = session.reset_payload_cap().await;
    state.publish(&session);
    drop(work);
    let previous = result?;
    Ok(axum::Json(json!({
        "previous": previous,
        "learnedPayloadCap": session.stats().learned_payload_cap,
        "payloadCap": session.live().payload_cap,
    }))
    .into_response())
}

async fn get_recall(
    State(state): State<AppState>,
    key: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    // axum's own rejection is plain text; a key that is not even UTF-8 is no key.
    let Path(key) = key.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_key",
            format!("the key in the path cannot be decoded: {}", e.body_text()),
        )
    })?;
    match recall(state.store.as_ref(), &key).await {
        Ok(r) if r.missing.is_empty() => Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            r.output,
        )
            .into_response()),
        Ok(r) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_archived",
            format!(
                "this session's archive has no {}",
                r.missing
                    .iter()
                    .map(|k| k.marker())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        Err(RecallError::NoKey) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_key",
            RecallError::NoKey.to_string(),
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "archive_unavailable",
            e.to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_in_flight_until_dropped() {
        let (tx, rx) = watch::channel(0usize);
        let tx = Arc::new(tx);
        let begin = |tx: &Arc<watch::Sender<usize>>| {
            tx.send_modify(|n| *n += 1);
            Work {
                in_flight: Arc::clone(tx),
            }
        };
        let a = begin(&tx);
        let b = begin(&tx);
        assert_eq!(*rx.borrow(), 2);
        drop(a);
        assert_eq!(*rx.borrow(), 1);
        drop(b);
        assert_eq!(*rx.borrow(), 0);
    }

    fn answer(status: u16, retry_after: Option<u64>) -> ProviderAnswer {
        ProviderAnswer {
            status: Some(status),
            retry_after: retry_after.map(Duration::from_secs),
            quota_exhausted: false,
        }
    }

    fn headers(e: ApiError) -> (u16, Option<String>, Option<String>, Option<String>, Value) {
        let body = e.body();
        let r = e.into_response();
        let h = |n: &str| {
            r.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (
            r.status().as_u16(),
            h("retry-after"),
            h("retry-after-ms"),
            h("x-should-retry"),
            body,
        )
    }

    #[test]
    fn provider_failures_map_by_class() {
        let cases = [
            (
                "rate_limit",
                answer(429, Some(7)),
                429,
                "rate_limit_exceeded",
                Some("7"),
                None,
            ),
            (
                "rate_limit",
                answer(413, None),
                429,
                "rate_limit_exceeded",
                None,
                None,
            ),
            (
                "auth",
                answer(401, None),
                502,
                "provider_auth",
                None,
                Some("false"),
            ),
            (
                "overloaded",
                answer(529, None),
                503,
                "provider_overloaded",
                None,
                None,
            ),
            (
                "overloaded",
                answer(529, Some(2)),
                503,
                "provider_overloaded",
                Some("2"),
                None,
            ),
            (
                "server_error",
                answer(503, None),
                503,
                "provider_overloaded",
                None,
                None,
            ),
            (
                "server_error",
                answer(500, Some(3)),
                502,
                "provider",
                None,
                None,
            ),
            (
                "timeout",
                answer(504, None),
                504,
                "provider_timeout",
                None,
                None,
            ),
            (
                "captive_portal",
                answer(200, None),
                502,
                "provider_captive_portal",
                None,
                Some("false"),
            ),
            (
                "proxy_rejection",
                answer(403, None),
                502,
                "provider",
                None,
                None,
            ),
            (
                "transient",
                ProviderAnswer::default(),
                502,
                "provider",
                None,
                None,
            ),
        ];
        for (class, a, status, code, retry_after, should_retry) in cases {
            let (s, ra, _, sr, body) = headers(ApiError::provider(class, a, "m".into()));
            assert_eq!(s, status, "{class} {a:?}");
            assert_eq!(body["error"]["code"], code, "{class} {a:?}");
            assert!(body["error"]["param"].is_null());
            assert_eq!(ra.as_deref(), retry_after, "{class} {a:?}");
            assert_eq!(sr.as_deref(), should_retry, "{class} {a:?}");
        }
        let quota = ProviderAnswer {
            quota_exhausted: true,
            ..answer(429, Some(1))
        };
        let (s, ra, _, sr, body) = headers(ApiError::provider("rate_limit", quota, "m".into()));
        assert_eq!(
            (s, body["error"]["code"].as_str()),
            (429, Some("insufficient_quota"))
        );
        assert_eq!((ra, sr.as_deref()), (None, Some("false")));
        assert_eq!(body["error"]["type"], "rate_limit_error");
    }

    #[test]
    fn a_fractional_delay_goes_out_rounded_up_and_in_milliseconds() {
        let a = ProviderAnswer {
            status: Some(429),
            retry_after: Some(Duration::from_millis(1_250)),
            quota_exhausted: false,
        };
        let (_, ra, ms, _, _) = headers(ApiError::provider("rate_limit", a, "m".into()));
        assert_eq!(ra.as_deref(), Some("2"));
        assert_eq!(ms.as_deref(), Some("1250"));
    }

    fn failure() -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded", "m")
    }

    #[tokio::test]
    async fn a_held_head_carries_an_early_failure_and_streams_after_the_start() {
        let (head, wait) = hold_head();
        assert!(head.fail(failure()).is_none(), "the status answers it");
        let e = wait.wait(Duration::from_secs(5)).await.err();
        assert_eq!(e.map(|e| e.status.as_u16()), Some(429));

        let (head, wait) = hold_head();
        head.start();
        assert!(wait.wait(Duration::from_secs(5)).await.is_ok());
        // Once the stream started, a failure goes into the stream.
        assert!(head.fail(failure()).is_some());

        // The hold ran out: the stream starts and a later failure goes into it.
        let (head, wait) = hold_head();
        assert!(wait.wait(Duration::from_millis(10)).await.is_ok());
        assert!(head.fail(failure()).is_some());
    }
}
