//! cairn-sim: one HTTP server speaking the OpenAI Chat Completions, OpenAI Responses,
//! Anthropic Messages, Gemini and Bedrock Converse wire formats, for tests with no provider
//! reachable.
//!
//! - Replies are scripted ([`ScriptedReply`]: text, reasoning, a tool call, a stop reason) and
//!   consumed in order by whichever API is called; with none queued the reply is `ok`, or,
//!   to a request for a summary, the summary its instructions ask for ([`summary`]).
//! - Every model has a context window (set per model, else the default); the request's
//!   token estimate is its body size in bytes / the model's bytes per token (4 unless the
//!   script sets `bytesPerToken`), rounded up. Over the window, the answer is that provider's
//!   genuine overflow error (status, headers, JSON body); a model with the `llama.cpp`
//!   dialect answers llama-server's own body on every API and, like llama-server, stops a
//!   reply with `length` when prompt and reply fill the window.
//! - A reply longer than the request's output limit (chars / 4) is cut and stops with
//!   `max_tokens`.
//! - Faults ([`Fault`]) are queued (`POST /_sim/script`, [`Sim::push_fault`]) or set per
//!   request with the `x-sim-fault` header.
//! - The `x-sim-ignore-stream` request header makes a stream request get one JSON body, as
//!   some OpenAI-compatible servers answer.
//! - Every request is recorded (`GET /_sim/requests?contains=TEXT`, [`Sim::requests`]).
//!
//! Routes: `POST /v1/chat/completions`, `/v1/responses`, `/v1/messages`,
//! `/v1beta/models/{model}:generateContent`, `/v1beta/models/{model}:streamGenerateContent`,
//! `/model/{id}/converse`, `/model/{id}/converse-stream` (AWS event-stream framing).

pub mod cache;
pub mod context;
pub mod nginx;
pub mod proxies;
pub mod script;
pub mod sigv4;
pub mod summary;
pub mod wire;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use script::{Fault, Route, Script, ScriptedCall, ScriptedReply, Stop};
pub use wire::Wire;
use wire::{ApiError, Rendered, Turn};

/// Window of a model no script named, in tokens.
pub const DEFAULT_WINDOW: u64 = 200_000;

/// One request as the simulator saw it.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct RecordedRequest {
    pub seq: u64,
    pub wire: Wire,
    pub path: String,
    pub model: String,
    /// Exact body size in bytes.
    pub bytes: u64,
    pub messages: usize,
    pub stream: bool,
    pub max_tokens: u64,
    /// Body bytes / 4, rounded up.
    pub estimated_tokens: u64,
    /// Authentication scheme seen (`bearer`, `x-api-key`, `x-goog-api-key`,
    /// `aws4-hmac-sha256`); never the credential.
    pub auth: Option<String>,
    /// SigV4 (Bedrock): the access key named, whether a session token was signed, and the
    /// signature's verdict against the secret registered with [`Sim::add_aws_key`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sigv4: Option<sigv4::SigV4Seen>,
    /// `ok`, `overflow`, `fault:<kind>`, `bad_request`, `unauthorized`, `bad_signature`.
    pub outcome: String,
    /// With the prompt cache on ([`Sim::enable_prompt_cache`]): the input tokens reported
    /// as read from and written to the cache, and where the request's cache breakpoints sit
    /// (`tools[2]`, `system[0]`, `messages[3].content[1]`; Anthropic and Bedrock).
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_breakpoints: Vec<String>,
    /// Whether the body contains the `contains` query text (admin endpoint only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contains: Option<bool>,
    #[serde(skip)]
    pub body: String,
}

impl RecordedRequest {
    pub fn contains(&self, needle: &str) -> bool {
        self.body.contains(needle)
    }
}

#[derive(Debug, Default)]
struct SimState {
    replies: VecDeque<ScriptedReply>,
    faults: VecDeque<Fault>,
    routes: Vec<Route>,
    windows: BTreeMap<String, u64>,
    bytes_per_token: BTreeMap<String, f64>,
    dialects: BTreeMap<String, String>,
    requests: Vec<RecordedRequest>,
    seq: u64,
    /// SigV4 secrets by access key id.
    aws_keys: BTreeMap<String, String>,
    /// The providers' prompt caches, when simulated.
    prompt_cache: Option<cache::PromptCache>,
}

type Shared = Arc<Mutex<SimState>>;

fn lock(s: &Shared) -> MutexGuard<'_, SimState> {
    // A panic while holding the lock cannot leave the plain data inconsistent.
    s.lock().unwrap_or_else(|p| p.into_inner())
}

fn apply_script(state: &Shared, script: Script) {
    let mut s = lock(state);
    s.replies.extend(script.replies);
    s.faults.extend(script.faults);
    s.routes.extend(script.routes);
    s.windows.extend(script.windows);
    s.bytes_per_token.extend(script.bytes_per_token);
    s.dialects.extend(script.dialects);
    if script.prompt_cache && s.prompt_cache.is_none() {
        s.prompt_cache = Some(cache::PromptCache::default());
    }
}

/// A running simulator; dropping it stops the server.
pub struct Sim {
    addr: SocketAddr,
    state: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sim {
    /// Starts on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        Self::bind(SocketAddr::from(([127, 0, 0, 1], 0)), Script::default()).await
    }

    pub async fn bind(addr: SocketAddr, script: Script) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Shared::default();
        apply_script(&state, script);
        let app = router(state.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("cairn-sim stopped: {e}");
            }
        });
        Ok(Self { addr, state, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn push_reply(&self, reply: ScriptedReply) {
        lock(&self.state).replies.push_back(reply);
    }

    /// Answers every request whose body contains `contains` with `reply` after `delay`
    /// (a slow summarizer, say), outside the reply queue; replaces an earlier route of the
    /// same text.
    pub fn route(&self, contains: &str, reply: ScriptedReply, delay: Duration) {
        let mut s = lock(&self.state);
        s.routes.retain(|r| r.contains != contains);
        s.routes.push(Route {
            contains: contains.to_string(),
            reply,
            delay_ms: delay.as_millis() as u64,
        });
    }

    pub fn push_fault(&self, fault: Fault) {
        lock(&self.state).faults.push_back(fault);
    }

    pub fn set_window(&self, model: &str, tokens: u64) {
        lock(&self.state).windows.insert(model.to_string(), tokens);
    }

    /// Makes `model` count `ratio` bytes per token and answer like a llama.cpp server.
    pub fn set_llama_dialect(&self, model: &str, ratio: f64) {
        let mut s = lock(&self.state);
        s.bytes_per_token.insert(model.to_string(), ratio);
        s.dialects.insert(model.to_string(), "llama.cpp".into());
    }

    /// Makes SigV4 requests naming `access_key_id` verified against `secret`: a wrong
    /// signature is answered as unauthorized.
    pub fn add_aws_key(&self, access_key_id: &str, secret: &str) {
        lock(&self.state)
            .aws_keys
            .insert(access_key_id.to_string(), secret.to_string());
    }

    /// Simulates the providers' prompt caches from now on (see [`cache`]): replies report
    /// cache reads and writes, and the log records each request's breakpoints.
    pub fn enable_prompt_cache(&self) {
        let mut s = lock(&self.state);
        if s.prompt_cache.is_none() {
            s.prompt_cache = Some(cache::PromptCache::default());
        }
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state).requests.clone()
    }

    /// Forgets replies, faults, windows and recorded requests.
    pub fn reset(&self) {
        *lock(&self.state) = SimState::default();
    }
}

/// The simulator's routes over `state`.
fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/responses", post(responses))
        .route("/v1/messages", post(messages))
        .route("/v1beta/models/{call}", post(gemini))
        .route("/model/{model}/converse", post(converse))
        .route("/model/{model}/converse-stream", post(converse_stream))
        .route("/_sim/requests", get(list_requests))
        .route("/_sim/script", post(load_script))
        .route("/_sim/reset", post(reset))
        .route("/_sim/health", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(512 * 1024 * 1024))
        .with_state(state)
}

/// Serves on an already bound listener until the process ends (the binary's entry point).
pub async fn serve(listener: tokio::net::TcpListener, script: Script) -> std::io::Result<()> {
    let state = Shared::default();
    apply_script(&state, script);
    axum::serve(listener, router(state)).await
}

async fn chat(State(s): State<Shared>, h: HeaderMap, body: Bytes) -> Response {
    handle(
        s,
        Wire::OpenaiChat,
        "/v1/chat/completions".into(),
        None,
        false,
        h,
        body,
    )
    .await
}

async fn responses(State(s): State<Shared>, h: HeaderMap, body: Bytes) -> Response {
    handle(
        s,
        Wire::OpenaiResponses,
        "/v1/responses".into(),
        None,
        false,
        h,
        body,
    )
    .await
}

async fn messages(State(s): State<Shared>, h: HeaderMap, body: Bytes) -> Response {
    handle(
        s,
        Wire::Anthropic,
        "/v1/messages".into(),
        None,
        false,
        h,
        body,
    )
    .await
}

async fn gemini(
    State(s): State<Shared>,
    Path(call): Path<String>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/v1beta/models/{call}");
    match call.rsplit_once(':') {
        Some((model, "generateContent")) => {
            handle(
                s,
                Wire::Gemini,
                path,
                Some(model.to_string()),
                false,
                h,
                body,
            )
            .await
        }
        Some((model, "streamGenerateContent")) => {
            handle(
                s,
                Wire::Gemini,
                path,
                Some(model.to_string()),
                true,
                h,
                body,
            )
            .await
        }
        _ => (StatusCode::NOT_FOUND, "unknown method").into_response(),
    }
}

async fn converse(
    State(s): State<Shared>,
    Path(model): Path<String>,
    uri: axum::http::Uri,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    // The path as sent (the model id percent-encoded), which SigV4 signs.
    let path = uri.path().to_string();
    handle(s, Wire::Bedrock, path, Some(model), false, h, body).await
}

async fn converse_stream(
    State(s): State<Shared>,
    Path(model): Path<String>,
    uri: axum::http::Uri,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    // The path as sent (the model id percent-encoded), which SigV4 signs.
    let path = uri.path().to_string();
    handle(s, Wire::Bedrock, path, Some(model), true, h, body).await
}

#[derive(Deserialize)]
struct RequestsQuery {
    contains: Option<String>,
}

async fn list_requests(
    State(s): State<Shared>,
    Query(q): Query<RequestsQuery>,
) -> axum::Json<Vec<RecordedRequest>> {
    let mut list = lock(&s).requests.clone();
    if let Some(needle) = &q.contains {
        for r in &mut list {
            r.contains = Some(r.contains(needle));
        }
    }
    axum::Json(list)
}

async fn load_script(State(s): State<Shared>, body: String) -> Response {
    match Script::parse(&body) {
        Ok(script) => {
            apply_script(&s, script);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
    }
}

async fn reset(State(s): State<Shared>) -> StatusCode {
    *lock(&s) = SimState::default();
    StatusCode::NO_CONTENT
}

fn auth_scheme(h: &HeaderMap) -> Option<String> {
    if let Some(v) = h.get("authorization").and_then(|v| v.to_str().ok()) {
        return v.split_whitespace().next().map(str::to_ascii_lowercase);
    }
    ["x-api-key", "x-goog-api-key"]
        .into_iter()
        .find(|k| h.get(*k).is_some_and(|v| !v.is_empty()))
        .map(str::to_string)
}

fn fault_label(f: &Fault) -> String {
    match f {
        Fault::Latency { .. } => "latency".into(),
        Fault::Status { status, .. } => format!("fault:{status}"),
        Fault::TruncateStream => "fault:truncate".into(),
        Fault::Reset => "fault:reset".into(),
        Fault::MalformedJson => "fault:malformed".into(),
        Fault::Stall { .. } => "fault:stall".into(),
        Fault::Drip { .. } => "fault:drip".into(),
        Fault::Heartbeat { .. } => "fault:heartbeat".into(),
    }
}

async fn handle(
    state: Shared,
    wire: Wire,
    path: String,
    path_model: Option<String>,
    stream_path: bool,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = auth_scheme(&headers);
    let header_fault = headers
        .get("x-sim-fault")
        .and_then(|v| v.to_str().ok())
        .and_then(Fault::parse_header);
    let parsed_json = serde_json::from_slice::<Value>(&body);
    let ignore_stream = headers.contains_key("x-sim-ignore-stream");
    let mut parsed = parsed_json
        .as_ref()
        .map_err(|e| format!("invalid JSON body: {e}"))
        .and_then(|v| wire::parse(wire, v, path_model.as_deref(), stream_path))
        .map(|mut p| {
            // Some OpenAI-compatible servers answer a stream request with one JSON body.
            p.stream &= !ignore_stream;
            p
        });
    let (seq, fault, window, reply, estimated_tokens, llama, edits, sigv4, cached) = {
        let mut s = lock(&state);
        let sigv4 = (wire == Wire::Bedrock)
            .then(|| {
                sigv4::check("POST", &path, &headers, &body, |id| {
                    s.aws_keys.get(id).cloned()
                })
            })
            .flatten();
        let bad_signature = sigv4.as_ref().is_some_and(|c| c.verdict == "invalid");
        s.seq += 1;
        let seq = s.seq;
        // A standing route answers its requests without touching the queues.
        let routed = s
            .routes
            .iter()
            .find(|r| String::from_utf8_lossy(&body).contains(&r.contains))
            .cloned();
        let fault = match &routed {
            Some(r) => {
                header_fault.or((r.delay_ms > 0).then_some(Fault::Latency { ms: r.delay_ms }))
            }
            None => header_fault.or_else(|| s.faults.pop_front()),
        };
        let model = parsed.as_ref().map(|p| p.model.clone()).unwrap_or_default();
        let window = s.windows.get(&model).copied().unwrap_or(DEFAULT_WINDOW);
        let ratio = s
            .bytes_per_token
            .get(&model)
            .copied()
            .filter(|r| *r > 0.0)
            .unwrap_or(4.0);
        let mut estimated_tokens = (body.len() as f64 / ratio).ceil() as u64;
        // The server's own context management edits the prompt before the model sees it.
        let mut edits = (None, None);
        if let Ok(v) = &parsed_json {
            match wire {
                Wire::Anthropic => {
                    let beta = headers.get("anthropic-beta").and_then(|v| v.to_str().ok());
                    match context::anthropic_edits(v, beta, estimated_tokens, ratio) {
                        Ok(c) => edits.0 = c,
                        Err(e) => parsed = Err(e),
                    }
                }
                Wire::OpenaiResponses => {
                    if let Some(t) = context::compaction_threshold(v)
                        && estimated_tokens >= t
                    {
                        let items = v.get("input").and_then(Value::as_array).map_or(0, Vec::len);
                        edits.1 = Some(context::compaction_item(seq, items));
                    }
                }
                _ => {}
            }
        }
        if let Some(c) = edits.0 {
            estimated_tokens = estimated_tokens.saturating_sub(c.input_tokens);
        }
        if edits.1.is_some() {
            // What remains of the input once compacted: a tenth, as a compaction keeps.
            estimated_tokens = estimated_tokens.div_ceil(10);
        }
        let llama = s.dialects.get(&model).is_some_and(|d| d == "llama.cpp");
        let fits = estimated_tokens <= window;
        let mut cached = cache::Outcome::default();
        if let (Some(c), Ok(v), Ok(_)) = (s.prompt_cache.as_mut(), &parsed_json, &parsed)
            && fits
        {
            match c.request(wire, &model, v, &String::from_utf8_lossy(&body), ratio) {
                Ok(o) => {
                    cached = o;
                    cached.read_tokens = cached.read_tokens.min(estimated_tokens);
                    cached.write_tokens = cached
                        .write_tokens
                        .min(estimated_tokens - cached.read_tokens);
                }
                Err(e) => parsed = Err(e),
            }
        }
        let failing = matches!(fault, Some(Fault::Status { .. }));
        let reply =
            (auth.is_some() && !bad_signature && parsed.is_ok() && fits && !failing).then(|| {
                match routed {
                    Some(r) => r.reply,
                    // Unscripted: a summary request gets the summary it asks for, anything
                    // else "ok".
                    None => s.replies.pop_front().unwrap_or_else(|| {
                        let summary = parsed_json.as_ref().ok().and_then(summary::reply);
                        ScriptedReply::text(summary.unwrap_or_else(|| "ok".into()))
                    }),
                }
            });
        let p = parsed.as_ref().ok();
        s.requests.push(RecordedRequest {
            seq,
            wire,
            path,
            model,
            bytes: body.len() as u64,
            messages: p.map_or(0, |p| p.messages),
            stream: p.is_some_and(|p| p.stream),
            max_tokens: p.map_or(0, |p| p.max_tokens),
            estimated_tokens,
            auth: auth.clone(),
            sigv4: sigv4.clone(),
            outcome: String::new(),
            cache_read_tokens: cached.read_tokens,
            cache_write_tokens: cached.write_tokens,
            cache_breakpoints: cached.breakpoints.clone(),
            contains: None,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        (
            seq,
            fault,
            window,
            reply,
            estimated_tokens,
            llama,
            edits,
            sigv4,
            cached,
        )
    };
    let outcome = |o: String| {
        let mut s = lock(&state);
        if let Some(r) = s.requests.iter_mut().rev().find(|r| r.seq == seq) {
            r.outcome = o;
        }
    };
    if auth.is_none() {
        outcome("unauthorized".into());
        return respond(wire::render_error(wire, &ApiError::Unauthorized, seq), None);
    }
    if sigv4.as_ref().is_some_and(|c| c.verdict == "invalid") {
        outcome("bad_signature".into());
        return respond(wire::render_error(wire, &ApiError::Unauthorized, seq), None);
    }
    let parsed = match parsed {
        Ok(p) => p,
        Err(e) => {
            outcome("bad_request".into());
            return respond(
                wire::render_error(wire, &ApiError::BadRequest(e), seq),
                None,
            );
        }
    };
    if let Some(Fault::Latency { ms }) = fault {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(Fault::Status {
        status,
        retry_after,
    }) = fault
    {
        outcome(format!("fault:{status}"));
        let e = ApiError::Status {
            status,
            retry_after,
        };
        return respond(wire::render_error(wire, &e, seq), None);
    }
    let Some(reply) = reply else {
        outcome("overflow".into());
        let e = if llama {
            ApiError::LlamaOverflow {
                tokens: estimated_tokens,
                window,
            }
        } else {
            ApiError::Overflow {
                tokens: estimated_tokens,
                window,
            }
        };
        return respond(wire::render_error(wire, &e, seq), None);
    };
    // llama-server generates until the context is full, whatever max_tokens allows.
    let room = llama.then(|| window.saturating_sub(estimated_tokens));
    let mut turn = turn(seq, &parsed, reply, estimated_tokens, room);
    if turn.cached_tokens == 0 {
        turn.cached_tokens = cached.read_tokens;
    }
    turn.cache_write_tokens = cached
        .write_tokens
        .min(estimated_tokens.saturating_sub(turn.cached_tokens));
    turn.context_management = edits.0.map(context::anthropic_applied);
    turn.compaction = edits.1;
    outcome(match &fault {
        Some(f) if !matches!(f, Fault::Latency { .. }) => fault_label(f),
        _ => "ok".into(),
    });
    let rendered = wire::render_reply(wire, &turn, parsed.stream, parsed.include_usage);
    respond(rendered, fault)
}

/// The scripted reply bound to this request: ids, the output limit, token counts.
fn turn(
    seq: u64,
    p: &wire::Parsed,
    reply: ScriptedReply,
    input_tokens: u64,
    room: Option<u64>,
) -> Turn {
    let limit = room.map_or(p.max_tokens, |r| r.min(p.max_tokens));
    let limit_chars = usize::try_from(limit.saturating_mul(4)).unwrap_or(usize::MAX);
    let mut text = reply.text;
    let mut calls: Vec<(String, String, serde_json::Value)> = reply
        .tool_call
        .into_iter()
        .chain(reply.tool_calls)
        .enumerate()
        .map(|(k, c)| {
            let id = c.id.unwrap_or_else(|| {
                if k == 0 {
                    format!("call_sim_{seq}")
                } else {
                    format!("call_sim_{seq}_{k}")
                }
            });
            (id, c.name, c.arguments)
        })
        .collect();
    let mut stop = reply.stop.unwrap_or(if !calls.is_empty() {
        Stop::ToolUse
    } else {
        Stop::End
    });
    if text.chars().count() > limit_chars {
        text = text.chars().take(limit_chars).collect();
        calls.clear();
        stop = Stop::MaxTokens;
    }
    let out_chars = text.chars().count()
        + calls
            .iter()
            .map(|(_, n, a)| n.len() + a.to_string().len())
            .sum::<usize>();
    Turn {
        seq,
        model: p.model.clone(),
        text,
        reasoning: reply.reasoning,
        calls,
        stop,
        input_tokens,
        // A real server that stops at a length limit has produced exactly that many tokens:
        // the request's limit, or what the window had left.
        output_tokens: if stop == Stop::MaxTokens && limit > 0 {
            limit
        } else {
            (out_chars as u64).div_ceil(4).max(1)
        },
        cached_tokens: reply.cached_tokens.min(input_tokens),
        cache_write_tokens: 0,
        context_management: None,
        compaction: None,
    }
}

/// Writes a rendered answer, bending it the way `fault` says.
fn respond(r: Rendered, fault: Option<Fault>) -> Response {
    let mut frames: Vec<Bytes> = r.frames.into_iter().map(Bytes::from).collect();
    // A single-frame body is split in two so "half the body" means something.
    if frames.len() == 1 && matches!(fault, Some(Fault::TruncateStream | Fault::Reset)) {
        let whole = frames.remove(0);
        let mid = whole.len() / 2;
        frames = vec![whole.slice(..mid), whole.slice(mid..)];
    }
    let half = frames.len() / 2;
    let body = match fault {
        Some(Fault::TruncateStream) => {
            frames.truncate(half);
            Body::from_stream(futures::stream::iter(
                frames.into_iter().map(Ok::<_, std::io::Error>),
            ))
        }
        Some(Fault::Reset) => {
            frames.truncate(half);
            let head = futures::stream::iter(frames.into_iter().map(Ok));
            // The pause lets the head and first half reach the client before the cut.
            let cut = futures::stream::once(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "simulated reset",
                ))
            });
            Body::from_stream(futures::StreamExt::chain(head, cut))
        }
        Some(Fault::MalformedJson) => {
            let broken = match r.content_type {
                "text/event-stream" => Bytes::from_static(
                    b"data: {\"type\": \"content_block_delta\", \"delta\": {\"te\n\n",
                ),
                wire::EVENT_STREAM => {
                    Bytes::from(wire::aws_event("contentBlockDelta", b"{\"delta\": {\"te"))
                }
                _ => Bytes::from_static(
                    b"{\"id\": \"sim\", \"choices\": [{\"message\": {\"content\": \"hal",
                ),
            };
            if let Some(first) = frames.first_mut() {
                *first = broken;
            }
            Body::from_stream(futures::stream::iter(
                frames.into_iter().map(Ok::<_, std::io::Error>),
            ))
        }
        Some(Fault::Stall { ms }) => {
            let tail = frames.split_off(half);
            let head = futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>));
            let pause = futures::stream::once(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(Bytes::new())
            });
            let tail = futures::stream::iter(tail.into_iter().map(Ok));
            Body::from_stream(futures::StreamExt::chain(
                futures::StreamExt::chain(head, pause),
                tail,
            ))
        }
        Some(Fault::Drip { ms }) => {
            let whole = Bytes::from(frames.concat());
            let bytes = futures::StreamExt::then(futures::stream::iter(0..whole.len()), move |i| {
                let byte = whole.slice(i..i + 1);
                async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok::<_, std::io::Error>(byte)
                }
            });
            Body::from_stream(bytes)
        }
        Some(Fault::Heartbeat { ms }) => {
            frames.truncate(half.max(1));
            let head = futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>));
            let beats =
                futures::StreamExt::then(futures::stream::repeat(()), move |()| async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(Bytes::from_static(b": keep-alive\n\n"))
                });
            Body::from_stream(futures::StreamExt::chain(head, beats))
        }
        _ => Body::from(frames.concat()),
    };
    let mut builder = Response::builder()
        .status(r.status)
        .header("content-type", r.content_type);
    for (k, v) in &r.headers {
        builder = builder.header(k.as_str(), v.as_str());
    }
    builder
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
