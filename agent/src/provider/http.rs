//! The HTTP exchange every provider shares: send the exact body, retry transient answers,
//! read success bodies and event streams with idle timeouts, and turn every failure into a
//! [`ProviderError`] that keeps status, headers, content type, a bounded body and the request
//! size.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use super::config::{BuildError, ClientOptions};
use super::eventstream::EventStreamDecoder;
use super::retry::{Decision, is_quota_exhausted, parse_retry_after, resend_on_new_connection};
use super::sse::{SseDecoder, SseEvent};
use super::wire_cache::WireCache;
use super::{
    ChatRequest, ChatResponse, Delta, DeltaSink, ProviderError, StopReason, Usage, looks_like_html,
};
use crate::history::{Message, ToolCall};

/// Bytes of an error body kept for the classifier and logs.
pub const MAX_ERROR_BODY: usize = 64 * 1024;
/// Largest success body or whole stream accepted.
const MAX_SUCCESS_BODY: usize = 64 * 1024 * 1024;

/// Why a successful HTTP answer could not be turned into a reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("malformed JSON in {what}: {detail}")]
    Json { what: &'static str, detail: String },
    #[error("expected the provider's JSON but got an HTML page")]
    Html,
    #[error("the reply has no {0}")]
    Missing(&'static str),
    #[error("the reply has no choices/candidates")]
    Empty,
    #[error("the prompt was blocked: {0}")]
    Blocked(String),
    #[error("the provider reported an error inside the reply: {0}")]
    Provider(String),
    #[error("the stream ended before its final event ({0})")]
    Incomplete(&'static str),
    #[error("the stream stalled: no data for {0:?}")]
    Stalled(Duration),
    #[error("the reply is larger than {0} bytes")]
    TooLarge(usize),
    #[error("invalid event stream: {0}")]
    Stream(String),
    #[error("the connection broke while reading the reply: {0}")]
    Interrupted(String),
}

impl DecodeError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Json { .. } => "malformed_json",
            Self::Html => "html_body",
            Self::Missing(_) => "missing_field",
            Self::Empty => "empty_choices",
            Self::Blocked(_) => "blocked",
            Self::Provider(_) => "provider_error_event",
            Self::Incomplete(_) => "stream_incomplete",
            Self::Stalled(_) => "stream_stalled",
            Self::TooLarge(_) => "too_large",
            Self::Stream(_) => "bad_event_stream",
            Self::Interrupted(_) => "body_interrupted",
        }
    }

    pub(crate) fn json(what: &'static str, e: serde_json::Error) -> Self {
        Self::Json {
            what,
            detail: e.to_string(),
        }
    }
}

/// Parses JSON, reporting an HTML page as such rather than as a parse error.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, DecodeError> {
    serde_json::from_slice(bytes).map_err(|e| {
        if looks_like_html(bytes) {
            DecodeError::Html
        } else {
            DecodeError::json(what, e)
        }
    })
}

/// A provider's decoded reply before it is bound to a request size.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Reply {
    pub text: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
    pub stop: Option<StopReason>,
    pub usage: Usage,
    pub context: Option<super::context_management::AppliedContext>,
}

impl Reply {
    pub fn into_response(self, request_bytes: u64) -> ChatResponse {
        let stop = match self.stop {
            Some(s) => s,
            None if !self.calls.is_empty() => StopReason::ToolUse,
            None => StopReason::End,
        };
        let mut message = Message::assistant_calls(self.text, self.calls);
        if !self.reasoning.is_empty() {
            message.reasoning = Some(self.reasoning);
        }
        ChatResponse {
            message,
            stop,
            usage: self.usage,
            request_bytes,
            context: self.context,
        }
    }
}

/// Assembles a streamed reply from its events.
pub(crate) trait StreamState: Send {
    /// Framed as AWS event-stream (Bedrock) rather than Server-Sent Events.
    const EVENT_STREAM: bool = false;

    /// Applies one event; `Ok(true)` when it was the terminal event.
    fn on_event(&mut self, event: &SseEvent) -> Result<bool, DecodeError>;
    /// The reply once the stream ended; an error when it ended too early.
    fn finish(self, saw_terminal: bool) -> Result<Reply, DecodeError>;
    /// Decodes a whole JSON reply, for servers that answer a stream request without
    /// streaming.
    fn whole(bytes: &[u8]) -> Result<Reply, DecodeError>;
    /// Text and reasoning assembled so far (they only ever grow).
    fn progress(&self) -> (&str, &str);
}

/// Splits a byte stream into events, whichever framing the provider uses.
enum Framer {
    Sse(SseDecoder),
    Aws(EventStreamDecoder),
}

impl Framer {
    fn new(event_stream: bool) -> Self {
        if event_stream {
            Self::Aws(EventStreamDecoder::default())
        } else {
            Self::Sse(SseDecoder::default())
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, DecodeError> {
        match self {
            Self::Sse(d) => d
                .feed(chunk)
                .map_err(|e| DecodeError::Stream(e.to_string())),
            Self::Aws(d) => d
                .feed(chunk)
                .map(|frames| frames.iter().map(|f| f.to_event()).collect())
                .map_err(|e| DecodeError::Stream(e.to_string())),
        }
    }

    fn finish(&mut self) -> Option<SseEvent> {
        match self {
            Self::Sse(d) => d.finish(),
            Self::Aws(_) => None,
        }
    }
}

/// Runs a whole event stream held in memory through `state` (tests and fuzzing).
pub(crate) fn decode_sse_bytes<S: StreamState>(
    bytes: &[u8],
    mut state: S,
) -> Result<Reply, DecodeError> {
    let mut framer = Framer::new(S::EVENT_STREAM);
    let mut events = framer.feed(bytes)?;
    events.extend(framer.finish());
    let mut done = false;
    for ev in &events {
        if state.on_event(ev)? {
            done = true;
            break;
        }
    }
    state.finish(done)
}

/// Builds the request headers for one attempt (Bedrock signs each attempt anew).
/// Characters left unencoded in a URL path segment (RFC 3986 unreserved): model ids and ARNs
/// in Bedrock and Gemini paths carry `:` and `/` encoded.
pub(crate) const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

pub(crate) type HeaderFn<'a> = &'a (dyn Fn(&[u8]) -> Result<HeaderMap, String> + Send + Sync);

/// Adds a credential header, marked sensitive so it never shows in debug output.
pub(crate) fn secret_header(
    headers: &mut HeaderMap,
    name: HeaderName,
    value: &str,
) -> Result<(), String> {
    let mut value = HeaderValue::from_str(value)
        .map_err(|_| "the credentials contain characters not allowed in a header")?;
    value.set_sensitive(true);
    headers.insert(name, value);
    Ok(())
}

/// One HTTP client per provider instance.
pub(crate) struct HttpClient {
    client: reqwest::Client,
    provider: String,
    options: ClientOptions,
    /// The escaped long texts of the last body, reused by the next.
    wire: WireCache,
    /// Connections opened so far ([`CountConnections`]).
    opened: Arc<AtomicU64>,
    /// When the last answer's body ended, as milliseconds since `born` plus one (0: never):
    /// from then on its connection may sit in the pool for [`POOL_IDLE`].
    body_ended: AtomicU64,
    born: std::time::Instant,
}

/// A layer around the client's connector that counts the connections it opens: a request
/// that failed while none was opened went out on a pooled one.
#[derive(Clone)]
struct CountConnections(Arc<AtomicU64>);

impl<S> tower::Layer<S> for CountConnections {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            opened: Arc::clone(&self.0),
        }
    }
}

#[derive(Clone)]
struct Counted<S> {
    inner: S,
    opened: Arc<AtomicU64>,
}

impl<S: tower::Service<R>, R> tower::Service<R> for Counted<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, target: R) -> S::Future {
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.inner.call(target)
    }
}

/// The connection closed under a request before any answer came: hyper's incomplete
/// message, or the reset or broken pipe of writing onto a socket the server had closed.
fn closed_unanswered(e: &reqwest::Error) -> bool {
    use std::io::ErrorKind;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
            || err.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::BrokenPipe
                        | ErrorKind::ConnectionAborted
                )
            })
        {
            return true;
        }
        source = err.source();
    }
    false
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

struct Success {
    status: u16,
    headers: BTreeMap<String, String>,
    content_type: Option<String>,
    response: reqwest::Response,
}

/// The body bytes of a request: what [`HttpClient::exchange`] sends and
/// [`super::Provider::render`] shows.
pub(crate) fn encode(
    provider: &str,
    body: &(impl serde::Serialize + ?Sized),
) -> Result<Vec<u8>, Box<ProviderError>> {
    serde_json::to_vec(body)
        .map_err(|e| Box::new(ProviderError::transport(provider, e.to_string(), 0)))
}

/// How long an idle connection is kept for the next request.
const POOL_IDLE: Duration = Duration::from_secs(4);

impl HttpClient {
    pub fn new(provider: &str, options: ClientOptions) -> Result<Self, BuildError> {
        let opened = Arc::new(AtomicU64::new(0));
        let builder = reqwest::Client::builder()
            .user_agent(concat!("cairn-agent/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(options.connect_timeout)
            // Below the 5 s after which llama-server (cpp-httplib), Node and uvicorn close an
            // idle connection: a request written as the server closes gets no answer, and a
            // transport failure is a payload signal to the recovery ladder, never retried.
            .pool_idle_timeout(POOL_IDLE)
            .connector_layer(CountConnections(Arc::clone(&opened)));
        let client = options
            .net
            .reqwest(builder)
            .build()
            .map_err(|e| BuildError::Client(e.to_string()))?;
        Ok(Self {
            client,
            provider: provider.to_string(),
            options,
            wire: WireCache::new(),
            opened,
            body_ended: AtomicU64::new(0),
            born: std::time::Instant::now(),
        })
    }

    /// Serializes `body` (built from `request`) and POSTs it, reading the reply as the event
    /// stream `S` assembles when the request streams, as one JSON document otherwise
    /// (handed to `on_delta` whole).
    pub async fn exchange<S: StreamState + Default>(
        &self,
        url: &str,
        headers: HeaderFn<'_>,
        request: &ChatRequest,
        body: &(impl serde::Serialize + Sync),
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        // The same bytes `encode` gives, with the long texts' escaping reused.
        let body = self
            .wire
            .to_vec(body)
            .map_err(|e| ProviderError::transport(&self.provider, e.to_string(), 0))?;
        if request.stream {
            self.post_sse(url, headers, body, S::default(), on_delta)
                .await
        } else {
            self.post_json(url, headers, body, S::whole)
                .await
                .inspect(|r| super::emit_whole(r, on_delta))
        }
    }

    /// POSTs `body` and decodes a JSON reply with `decode`.
    pub async fn post_json(
        &self,
        url: &str,
        headers: HeaderFn<'_>,
        body: Vec<u8>,
        decode: fn(&[u8]) -> Result<Reply, DecodeError>,
    ) -> Result<ChatResponse, ProviderError> {
        let request_bytes = body.len() as u64;
        let work = async {
            let ok = self.send(url, headers, Bytes::from(body)).await?;
            let (status, hdrs, ct) = (ok.status, ok.headers, ok.content_type);
            let fail = |e: DecodeError, body: &[u8]| {
                self.decode_error(status, &hdrs, ct.clone(), body, e, request_bytes)
            };
            let bytes = match self.read_all(ok.response).await {
                Ok(b) => b,
                Err((e, partial)) => return Err(fail(e, &partial)),
            };
            if ct.as_deref().is_some_and(|c| c.contains("html")) || looks_like_html(&bytes) {
                return Err(fail(DecodeError::Html, &bytes));
            }
            decode(&bytes)
                .map(|r| r.into_response(request_bytes))
                .map_err(|e| fail(e, &bytes))
        };
        self.cancellable(work, request_bytes).await
    }

    /// POSTs `body` and assembles an event-stream reply with `state`.
    pub async fn post_sse<S: StreamState>(
        &self,
        url: &str,
        headers: HeaderFn<'_>,
        body: Vec<u8>,
        mut state: S,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let request_bytes = body.len() as u64;
        let work = async {
            let ok = self.send(url, headers, Bytes::from(body)).await?;
            let (status, hdrs, ct) = (ok.status, ok.headers, ok.content_type);
            let mut response = ok.response;
            let mut decoder = Framer::new(S::EVENT_STREAM);
            let mut seen: Vec<u8> = Vec::new();
            let mut done = false;
            let mut total = 0usize;
            let (mut sent_text, mut sent_reasoning) = (0usize, 0usize);
            let fail = |e: DecodeError, seen: &[u8]| {
                self.decode_error(status, &hdrs, ct.clone(), seen, e, request_bytes)
            };
            if ct.as_deref().is_some_and(|c| c.contains("html")) {
                let bytes = self.read_all(response).await.unwrap_or_default();
                return Err(fail(DecodeError::Html, &bytes));
            }
            if ct.as_deref().is_some_and(|c| c.contains("json")) {
                let bytes = match self.read_all(response).await {
                    Ok(b) => b,
                    Err((e, partial)) => return Err(fail(e, &partial)),
                };
                return S::whole(&bytes)
                    .map(|r| r.into_response(request_bytes))
                    .inspect(|r| super::emit_whole(r, on_delta))
                    .map_err(|e| fail(e, &bytes));
            }
            while !done {
                let chunk = match self.next_chunk(&mut response).await {
                    Ok(Some(c)) => c,
                    Ok(None) => break,
                    Err(e) => return Err(fail(e, &seen)),
                };
                total += chunk.len();
                if total > MAX_SUCCESS_BODY {
                    return Err(fail(DecodeError::TooLarge(MAX_SUCCESS_BODY), &seen));
                }
                if seen.len() < MAX_ERROR_BODY {
                    seen.extend_from_slice(&chunk[..chunk.len().min(MAX_ERROR_BODY - seen.len())]);
                }
                let events = decoder.feed(&chunk).map_err(|e| fail(e, &seen))?;
                for ev in &events {
                    let terminal = state.on_event(ev).map_err(|e| fail(e, &seen))?;
                    let (text, reasoning) = state.progress();
                    if let Some(new) = reasoning.get(sent_reasoning..).filter(|n| !n.is_empty()) {
                        on_delta(Delta::Reasoning(new));
                        sent_reasoning = reasoning.len();
                    }
                    if let Some(new) = text.get(sent_text..).filter(|n| !n.is_empty()) {
                        on_delta(Delta::Text(new));
                        sent_text = text.len();
                    }
                    if terminal {
                        done = true;
                        break;
                    }
                }
            }
            if !done && let Some(ev) = decoder.finish() {
                done = state.on_event(&ev).map_err(|e| fail(e, &seen))?;
            }
            if !done && looks_like_html(&seen) {
                return Err(fail(DecodeError::Html, &seen));
            }
            state
                .finish(done)
                .map(|r| r.into_response(request_bytes))
                .map_err(|e| fail(e, &seen))
        };
        self.cancellable(work, request_bytes).await
    }

    async fn cancellable<F>(
        &self,
        work: F,
        request_bytes: u64,
    ) -> Result<ChatResponse, ProviderError>
    where
        F: Future<Output = Result<ChatResponse, ProviderError>>,
    {
        let span = tracing::info_span!("provider_call", provider = %self.provider, request_bytes);
        let started = std::time::Instant::now();
        let result = tracing::Instrument::instrument(
            async {
                match &self.options.cancel {
                    Some(token) => tokio::select! {
                        r = work => r,
                        () = token.cancelled() => Err(ProviderError::transport(
                            &self.provider, "cancelled", request_bytes)),
                    },
                    None => work.await,
                }
            },
            span,
        )
        .await;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(r) => tracing::debug!(
                provider = %self.provider,
                request_bytes,
                elapsed_ms,
                input_tokens = r.usage.input_tokens,
                output_tokens = r.usage.output_tokens,
                "provider call succeeded"
            ),
            Err(e) => tracing::debug!(
                provider = %self.provider,
                request_bytes,
                elapsed_ms,
                status = ?e.status,
                label = e.label(),
                "provider call failed"
            ),
        }
        result
    }

    /// Sends with retries; returns the first 2xx answer or the last error.
    async fn send(
        &self,
        url: &str,
        headers: HeaderFn<'_>,
        body: Bytes,
    ) -> Result<Success, ProviderError> {
        let request_bytes = body.len() as u64;
        let mut attempt = 0u32;
        loop {
            let err = match self.attempt(url, headers, body.clone()).await {
                Ok(ok) => return Ok(ok),
                Err(e) => e,
            };
            let status = err.status.filter(|s| !is_quota_exhausted(*s, &err.body));
            match self
                .options
                .retry
                .decide(attempt, status, err.retry_after, fastrand::f64())
            {
                Decision::GiveUp => return Err(err),
                Decision::Retry(wait) => {
                    tracing::warn!(
                        provider = %self.provider,
                        status = ?err.status,
                        attempt,
                        wait_ms = wait.as_millis() as u64,
                        request_bytes,
                        "transient provider failure, retrying"
                    );
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        }
    }

    async fn attempt(
        &self,
        url: &str,
        headers: HeaderFn<'_>,
        body: Bytes,
    ) -> Result<Success, ProviderError> {
        let request_bytes = body.len() as u64;
        let mut hdrs = headers(&body)
            .map_err(|e| ProviderError::transport(&self.provider, e, request_bytes))?;
        for (k, v) in &self.options.extra_headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes());
            let value = reqwest::header::HeaderValue::from_str(v);
            match (name, value) {
                (Ok(name), Ok(mut value)) => {
                    value.set_sensitive(true);
                    hdrs.insert(name, value);
                }
                _ => {
                    return Err(ProviderError::transport(
                        &self.provider,
                        format!("extra header {k:?} is not a valid HTTP header"),
                        request_bytes,
                    ));
                }
            }
        }
        let response =
            match tokio::time::timeout(self.options.response_timeout, self.post(url, hdrs, body))
                .await
            {
                Err(_) => {
                    return Err(ProviderError::transport(
                        &self.provider,
                        format!(
                            "no response within {:?} (timeout)",
                            self.options.response_timeout
                        ),
                        request_bytes,
                    ));
                }
                Ok(Err(e)) => {
                    return Err(ProviderError::transport(
                        &self.provider,
                        describe_reqwest(e),
                        request_bytes,
                    ));
                }
                Ok(Ok(r)) => r,
            };
        let status = response.status().as_u16();
        let headers = header_map(response.headers());
        let content_type = headers.get("content-type").cloned();
        if (200..300).contains(&status) {
            return Ok(Success {
                status,
                headers,
                content_type,
                response,
            });
        }
        let retry_after = retry_after(&headers);
        let body = self.read_bounded(response).await;
        let mut err = ProviderError::http(
            &self.provider,
            status,
            content_type,
            String::from_utf8_lossy(&body).into_owned(),
            request_bytes,
        );
        err.headers = headers;
        err.retry_after = retry_after;
        Err(err)
    }

    /// POSTs `body`, and once more on a new connection when the connection closed under it
    /// unanswered after it may have gone out on a pooled one ([`resend_on_new_connection`]).
    async fn post(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let request_bytes = body.len() as u64;
        let mut resent = false;
        loop {
            let opened = self.opened.load(Ordering::Relaxed);
            let pooled = self.may_be_pooled();
            let sent = self
                .client
                .post(url)
                .headers(headers.clone())
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await;
            match sent {
                Err(e)
                    if closed_unanswered(&e)
                        && resend_on_new_connection(
                            pooled || self.opened.load(Ordering::Relaxed) == opened,
                            request_bytes,
                            resent,
                        ) =>
                {
                    tracing::debug!(
                        provider = %self.provider,
                        request_bytes,
                        error = %crate::net::error_chain(&e),
                        "a pooled connection closed under the request; resending it on a new one"
                    );
                    resent = true;
                }
                other => return other,
            }
        }
    }

    /// Whether an answer's body ended within [`POOL_IDLE`], so its connection may be the one
    /// the next request goes out on. The pool takes a connection back a moment after its body
    /// ends; a request sent in that moment starts a new connection in the background and may
    /// still go out on the old one, so a new connection opened is no proof the request used it.
    fn may_be_pooled(&self) -> bool {
        match self.body_ended.load(Ordering::Relaxed) {
            0 => false,
            at => {
                let ended = Duration::from_millis(at - 1);
                self.born.elapsed().saturating_sub(ended) <= POOL_IDLE
            }
        }
    }

    fn note_body_end(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.body_ended.store(ms + 1, Ordering::Relaxed);
    }

    fn decode_error(
        &self,
        status: u16,
        headers: &BTreeMap<String, String>,
        content_type: Option<String>,
        body: &[u8],
        e: DecodeError,
        request_bytes: u64,
    ) -> ProviderError {
        let body = &body[..body.len().min(MAX_ERROR_BODY)];
        let mut err = ProviderError::http(
            &self.provider,
            status,
            content_type,
            String::from_utf8_lossy(body).into_owned(),
            request_bytes,
        );
        err.headers = headers.clone();
        err.transport = Some(format!("{} [{}]", e, e.label()));
        err
    }

    async fn next_chunk(
        &self,
        response: &mut reqwest::Response,
    ) -> Result<Option<Bytes>, DecodeError> {
        match tokio::time::timeout(self.options.idle_timeout, response.chunk()).await {
            Err(_) => Err(DecodeError::Stalled(self.options.idle_timeout)),
            Ok(Err(e)) => Err(DecodeError::Interrupted(describe_reqwest(e))),
            Ok(Ok(None)) => {
                self.note_body_end();
                Ok(None)
            }
            Ok(Ok(c)) => Ok(c),
        }
    }

    async fn read_all(
        &self,
        mut response: reqwest::Response,
    ) -> Result<Vec<u8>, (DecodeError, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            match self.next_chunk(&mut response).await {
                Ok(Some(c)) => {
                    if out.len() + c.len() > MAX_SUCCESS_BODY {
                        return Err((DecodeError::TooLarge(MAX_SUCCESS_BODY), out));
                    }
                    out.extend_from_slice(&c);
                }
                Ok(None) => return Ok(out),
                Err(e) => return Err((e, out)),
            }
        }
    }

    async fn read_bounded(&self, mut response: reqwest::Response) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < MAX_ERROR_BODY {
            match self.next_chunk(&mut response).await {
                Ok(Some(c)) => out.extend_from_slice(&c[..c.len().min(MAX_ERROR_BODY - out.len())]),
                _ => break,
            }
        }
        out
    }
}

fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let v = String::from_utf8_lossy(value.as_bytes()).into_owned();
        out.entry(name.as_str().to_ascii_lowercase())
            .and_modify(|e: &mut String| {
                e.push_str(", ");
                e.push_str(&v);
            })
            .or_insert(v);
    }
    out
}

fn retry_after(headers: &BTreeMap<String, String>) -> Option<Duration> {
    if let Some(ms) = headers.get("retry-after-ms")
        && let Ok(ms) = ms.trim().parse::<f64>()
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms.min(1e9) / 1000.0));
    }
    headers
        .get("retry-after")
        .and_then(|v| parse_retry_after(v, SystemTime::now()))
}

/// A transport error in words the classifier can match (reset, EOF, timeout), without the
/// URL (it may carry a key in its query).
fn describe_reqwest(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout: "
    } else if e.is_connect() {
        "connect: "
    } else {
        ""
    };
    format!("{kind}{}", crate::net::error_chain(&e.without_url()))
}
