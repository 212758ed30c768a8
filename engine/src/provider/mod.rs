//! The provider-neutral request, reply and error shapes, and the [`Provider`] trait the rest
//! of the engine (the classifier, the recovery ladder, the turn's decisions) depends on. The
//! clients that speak each provider's wire format live in the agent.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::history::{Message, ToolCall};

pub mod context_management;
mod controls;
pub mod retry;

pub use controls::{Effort, OutputFormat, unsupported_by};
pub use retry::RetryPolicy;

/// A tool offered to the model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: serde_json::Value,
}

impl ToolSpec {
    /// Bytes the tool catalog adds to every request (it can never be compacted).
    pub fn weight(&self) -> usize {
        self.name.len() + self.description.len() + self.parameters.to_string().len()
    }
}

/// Which tools the model may or must call (`tool_choice` of the OpenAI APIs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (every provider's default; not sent).
    #[default]
    Auto,
    /// No tool call.
    None,
    /// At least one tool call.
    Required,
    /// A call of this tool.
    Function(String),
}

/// How the model is asked to answer, beyond the messages and tools. The defaults send
/// nothing: the provider's own defaults apply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Controls {
    pub tool_choice: ToolChoice,
    /// `Some(false)`: at most one tool call per reply (sent where the wire format has the
    /// setting; the session enforces it for the others).
    pub parallel_tool_calls: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// The shape the reply must take (sent to families that have the setting; the others
    /// refuse the request, see [`unsupported_by`]).
    pub format: Option<OutputFormat>,
    pub effort: Option<Effort>,
}

impl Controls {
    /// Bytes these settings add to every request.
    pub fn weight(&self) -> usize {
        self.format.as_ref().map_or(0, OutputFormat::weight)
    }

    /// The tool choice to send: only with tools, and only when it is not the default.
    pub fn choice(&self, has_tools: bool) -> Option<&ToolChoice> {
        (has_tools && self.tool_choice != ToolChoice::Auto).then_some(&self.tool_choice)
    }

    /// `parallel_tool_calls` to send: only with tools.
    pub fn parallel(&self, has_tools: bool) -> Option<bool> {
        self.parallel_tool_calls.filter(|_| has_tools)
    }
}

/// One request to a provider: everything needed to build the wire body.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    /// The conversation; system messages are lifted into the provider's system field where it
    /// has one.
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub max_output_tokens: u64,
    pub stream: bool,
    pub controls: Controls,
    /// The server's own context management for this request (`engine: provider`).
    pub context: Option<context_management::ServerContext>,
}

/// A request as the provider client would send it, built by the same code as a real send
/// but not sent ([`Provider::render`]): the URL, the headers with every credential replaced
/// by [`REDACTED`], and the exact body bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    pub method: &'static str,
    pub url: String,
    /// Lower-case names; credential values read [`REDACTED`].
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// What a credential header of a [`Rendered`] request reads.
pub const REDACTED: &str = "[redacted]";

impl Rendered {
    /// A JSON POST to `url` with `headers` beside the content type.
    pub fn post(url: impl Into<String>, headers: &[(&str, &str)], body: Vec<u8>) -> Self {
        let mut h = vec![("content-type".to_owned(), "application/json".to_owned())];
        h.extend(
            headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        Self {
            method: "POST",
            url: url.into(),
            headers: h,
            body,
        }
    }
}

/// Why the model stopped, normalised across providers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    End,
    ToolUse,
    MaxTokens,
    /// Anything else the provider reported (content filter, ...), kept for logs.
    Other,
}

/// Token usage of one call, normalised across providers: `input_tokens` is every prompt
/// token, cached or not (OpenAI and Gemini report it so; Anthropic and Bedrock report the
/// uncached part, and their decoders add the cache reads and writes back), and the cache
/// reads and writes are the parts of it the prompt cache served or stored.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the cache by this call (Anthropic
    /// `cache_creation_input_tokens`, Bedrock `cacheWriteInputTokens`).
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// The counts under the `kind` label of the token metrics.
    pub fn by_kind(&self) -> [(&'static str, u64); 4] {
        [
            ("input", self.input_tokens),
            ("output", self.output_tokens),
            ("cache_read", self.cache_read_tokens),
            ("cache_write", self.cache_write_tokens),
        ]
    }

    /// Prompt tokens neither read from nor written to the cache.
    pub fn uncached_input_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cache_read_tokens)
            .saturating_sub(self.cache_write_tokens)
    }

    /// Adds `other` to this usage.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
    }
}

/// A successful reply.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatResponse {
    /// The assistant message (text, reasoning, tool calls).
    pub message: Message,
    pub stop: StopReason,
    pub usage: Usage,
    /// Exact size in bytes of the serialized request body that produced this reply.
    pub request_bytes: u64,
    /// What the server's context management did to the request, when it acted.
    pub context: Option<context_management::AppliedContext>,
}

impl ChatResponse {
    pub fn tool_calls(&self) -> &[ToolCall] {
        &self.message.tool_calls
    }
}

/// A failed call, keeping everything the classifier needs: status, headers, content type and
/// body of an HTTP answer, or the transport error, plus the exact size of the request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.summary())]
pub struct ProviderError {
    /// Provider name for messages and metrics (e.g. `anthropic`).
    pub provider: String,
    /// HTTP status, when an HTTP answer arrived.
    pub status: Option<u16>,
    /// Response headers, lower-cased names. Never contains request credentials.
    pub headers: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// Response body as text (lossy UTF-8), truncated to a bounded size.
    pub body: String,
    /// Transport-level failure (connection reset, unexpected EOF, timeout, decode error)
    /// when no complete HTTP answer was read.
    pub transport: Option<String>,
    /// Exact size in bytes of the serialized request body that failed.
    pub request_bytes: u64,
    /// Server-requested delay before retrying (from `Retry-After`), if any.
    pub retry_after: Option<Duration>,
}

impl ProviderError {
    /// A failure that never reached an HTTP answer.
    pub fn transport(
        provider: impl Into<String>,
        message: impl Into<String>,
        request_bytes: u64,
    ) -> Self {
        Self {
            provider: provider.into(),
            status: None,
            headers: BTreeMap::new(),
            content_type: None,
            body: String::new(),
            transport: Some(message.into()),
            request_bytes,
            retry_after: None,
        }
    }

    /// An HTTP answer that was not a success.
    pub fn http(
        provider: impl Into<String>,
        status: u16,
        content_type: Option<String>,
        body: impl Into<String>,
        request_bytes: u64,
    ) -> Self {
        Self {
            provider: provider.into(),
            status: Some(status),
            headers: BTreeMap::new(),
            content_type,
            body: body.into(),
            transport: None,
            request_bytes,
            retry_after: None,
        }
    }

    /// The body is an HTML page (a proxy's or WAF's), not the provider's JSON.
    pub fn is_html(&self) -> bool {
        self.content_type
            .as_deref()
            .is_some_and(|c| c.to_ascii_lowercase().contains("html"))
            || looks_like_html(self.body.as_bytes())
    }

    /// Short stable label for metrics: what kind of failure this was, before classification.
    pub fn label(&self) -> &'static str {
        match (self.status, &self.transport) {
            (Some(200..=299), Some(_)) => "bad_response",
            (Some(_), _) if self.is_html() => "http_html",
            (Some(429), _) => "http_429",
            (Some(400..=499), _) => "http_4xx",
            (Some(_), _) => "http_5xx",
            (None, _) => "transport",
        }
    }

    fn summary(&self) -> String {
        const MAX: usize = 300;
        let body: String = self.body.chars().take(MAX).collect();
        match (self.status, &self.transport) {
            (Some(s), Some(t)) => format!(
                "{} answered HTTP {s} to a {}-byte request but the reply was unusable: {t}",
                self.provider, self.request_bytes
            ),
            (Some(s), None) if self.is_html() => format!(
                "{} answered HTTP {s} to a {}-byte request with an HTML page ({}), not the \
                 provider's JSON; a proxy or firewall on the path probably answered: {body}",
                self.provider,
                self.request_bytes,
                self.content_type.as_deref().unwrap_or("no content type"),
            ),
            (Some(s), None) => format!(
                "{} answered HTTP {s} to a {}-byte request: {body}",
                self.provider, self.request_bytes
            ),
            (None, Some(t)) => format!(
                "{} request of {} bytes failed: {t}",
                self.provider, self.request_bytes
            ),
            (None, None) => format!(
                "{} request of {} bytes failed",
                self.provider, self.request_bytes
            ),
        }
    }
}

/// A provider client. Implementations record the exact serialized size of every request in
/// both the response and the error.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Provider name for logs and metrics (`openai`, `anthropic`, ...).
    fn name(&self) -> &str;

    /// Sends one request and returns the complete reply (a streamed reply is assembled).
    /// Dropping the future cancels the request; so does the `cancel` token of
    /// the client's options.
    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError>;

    /// Like [`Provider::send`], also handing text and reasoning to `on_delta` as they arrive
    /// (with `stream: true`; otherwise once, whole). The returned reply is the same.
    async fn send_streaming(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let r = self.send(request).await?;
        emit_whole(&r, on_delta);
        Ok(r)
    }

    /// The request [`Provider::send`] would send for `request`, without sending it: the same
    /// body builder and serializer, credentials redacted. Clients that cannot show their
    /// requests say so.
    fn render(&self, request: &ChatRequest) -> Result<Rendered, Box<ProviderError>> {
        let _ = request;
        Err(Box::new(ProviderError::transport(
            self.name(),
            "this provider client cannot show the requests it would send",
            0,
        )))
    }
}

/// A piece of a reply as it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delta<'a> {
    Text(&'a str),
    Reasoning(&'a str),
}

/// Receives [`Delta`]s; called on the task that drives the request, so it must not block.
pub type DeltaSink<'a> = &'a (dyn Fn(Delta<'_>) + Send + Sync);

/// Hands a whole reply to a sink, for replies that were not streamed.
pub fn emit_whole(r: &ChatResponse, on_delta: DeltaSink<'_>) {
    if let Some(reasoning) = r.message.reasoning.as_deref().filter(|t| !t.is_empty()) {
        on_delta(Delta::Reasoning(reasoning));
    }
    if !r.message.content.is_empty() {
        on_delta(Delta::Text(&r.message.content));
    }
}

/// True when a body starts like an HTML document (after whitespace).
pub fn looks_like_html(body: &[u8]) -> bool {
    let start = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(body.len());
    let head: Vec<u8> = body[start..]
        .iter()
        .take(15)
        .map(u8::to_ascii_lowercase)
        .collect();
    head.starts_with(b"<!doctype html")
        || head.starts_with(b"<html")
        || head.starts_with(b"<head")
        || head.starts_with(b"<body")
}

/// A sink that drops everything.
pub fn no_deltas(_: Delta<'_>) {}
