//! One classifier for every failed provider call: which failures the recovery ladder may
//! touch, and which it must leave alone.
//!
//! Structured signals come first (HTTP status, content type, headers, the provider's JSON
//! error code/type), phrases second. Phrase matching runs on the provider's error *message*
//! (extracted from the JSON body where there is one), lower-cased, so that a number such as
//! `413` inside a token count or a request id never decides anything: only the HTTP status
//! does.
//!
//! Decisions that are not obvious:
//! - **429 is never recoverable**, whatever its wording ("tokens per minute", "request too
//!   large"): a rate limit is a quota over time, and shrinking the history only hides it.
//! - **Groq-style 413 TPM limits are rate limits.** Groq answers HTTP 413 with
//!   `code: rate_limit_exceeded` / "tokens per minute (TPM)" when one request alone exceeds the
//!   per-minute token quota. That 413 is not a body-size limit of the network path: learning a
//!   byte cap from it would shrink every later request of the session for nothing. It is
//!   classified [`OtherReason::RateLimit`].
//! - A plain JSON 403 is an authorization answer from the provider; only a 403 with WAF
//!   signals or an HTML body is a [`FailureClass::ProxyRejection`]. Headers such as `cf-ray`
//!   count only when the body is not the provider's own JSON error, because some providers
//!   sit behind Cloudflare and send `cf-ray` on every answer.
//! - An HTML body on any other 4xx (except 401/407/429 and the wrong-URL statuses 404/405/410)
//!   is a proxy rejection: every supported provider answers errors in JSON, so HTML means a
//!   middlebox spoke.
//! - A **2xx reply that breaks while its body is read** is judged as a cut connection (by the
//!   request's size, like a reset before any answer), a stall as a timeout, and a whole body
//!   that does not decode as [`OtherReason::MalformedReply`]. The answer's status says nothing
//!   about the request there.
//! - **A 2xx HTML page is a captive portal** ([`OtherReason::CaptivePortal`]): something on the
//!   network path answered in the provider's place and accepted the request whatever its
//!   size, so shrinking the request cannot help and no byte cap is learned from it.

use crate::provider::{ProviderError, StopReason};

/// Requests at least this large that die with a transport error (EOF, reset, broken pipe)
/// are suspected payload rejections; smaller ones are ordinary transient failures.
pub const DEFAULT_SUSPECTED_PAYLOAD_BYTES: u64 = 500 * 1024;

/// What went wrong, as far as recovery is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// The prompt does not fit the model's context window.
    ContextOverflow,
    /// The request body is too large for the provider or the network path (413/431).
    PayloadTooLarge,
    /// A middlebox (WAF, corporate proxy) rejected the request.
    ProxyRejection,
    /// A large request died in transit; probably a silent body-size limit.
    SuspectedPayload,
    /// The reply stopped at the output-token limit.
    MaxOutputTokens,
    /// Anything recovery must not touch.
    Other(OtherReason),
}

/// Why a failure is not recoverable by shrinking the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OtherReason {
    RateLimit,
    Auth,
    Overloaded,
    Server,
    Timeout,
    Transient,
    BadRequest,
    /// A 2xx reply whose body could not be decoded (not a transfer failure).
    MalformedReply,
    /// A 2xx HTML page instead of the provider's JSON: a captive portal or a proxy answered.
    CaptivePortal,
    Unknown,
}

impl FailureClass {
    /// Short stable label for metrics and events.
    pub fn label(self) -> &'static str {
        match self {
            Self::ContextOverflow => "context_overflow",
            Self::PayloadTooLarge => "payload_too_large",
            Self::ProxyRejection => "proxy_rejection",
            Self::SuspectedPayload => "suspected_payload",
            Self::MaxOutputTokens => "max_output_tokens",
            Self::Other(r) => match r {
                OtherReason::RateLimit => "rate_limit",
                OtherReason::Auth => "auth",
                OtherReason::Overloaded => "overloaded",
                OtherReason::Server => "server_error",
                OtherReason::Timeout => "timeout",
                OtherReason::Transient => "transient",
                OtherReason::BadRequest => "bad_request",
                OtherReason::MalformedReply => "malformed_reply",
                OtherReason::CaptivePortal => "captive_portal",
                OtherReason::Unknown => "unknown",
            },
        }
    }

    /// True for the classes the request-shrinking recovery ladder handles.
    pub fn is_recoverable(self) -> bool {
        matches!(
            self,
            Self::ContextOverflow
                | Self::PayloadTooLarge
                | Self::ProxyRejection
                | Self::SuspectedPayload
        )
    }

    /// True for the classes that teach the session a payload cap.
    pub fn is_payload(self) -> bool {
        matches!(
            self,
            Self::PayloadTooLarge | Self::ProxyRejection | Self::SuspectedPayload
        )
    }
}

/// Tunables of the classifier that are not part of the compaction policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassifyOptions {
    /// See [`DEFAULT_SUSPECTED_PAYLOAD_BYTES`].
    pub suspected_payload_bytes: u64,
}

impl Default for ClassifyOptions {
    fn default() -> Self {
        Self {
            suspected_payload_bytes: DEFAULT_SUSPECTED_PAYLOAD_BYTES,
        }
    }
}

/// The class of a reply that completed but stopped early.
pub fn classify_stop(stop: StopReason) -> Option<FailureClass> {
    (stop == StopReason::MaxTokens).then_some(FailureClass::MaxOutputTokens)
}

/// Classifies a failed call with the default options.
pub fn classify(err: &ProviderError) -> FailureClass {
    classify_with(err, &ClassifyOptions::default())
}

/// Classifies a failed call.
pub fn classify_with(err: &ProviderError, opts: &ClassifyOptions) -> FailureClass {
    let Some(status) = err.status else {
        return classify_transport(err, opts);
    };
    if (200..300).contains(&status) {
        return classify_broken_reply(err, opts);
    }
    let parsed = ParsedBody::parse(&err.body);
    let msg = parsed.message.to_lowercase();
    let mut codes = parsed.codes_lower();
    // Bedrock names the error class in a header: `ValidationException:http://...`.
    if let Some(t) = err.headers.get("x-amzn-errortype") {
        codes.push(t.split(':').next().unwrap_or_default().to_lowercase());
    }
    let html = is_html(err);

    if status == 429 {
        return FailureClass::Other(OtherReason::RateLimit);
    }
    if is_rate_limit(&codes, &msg) {
        return FailureClass::Other(OtherReason::RateLimit);
    }
    // 407: the proxy wants credentials; no request size will change that.
    if status == 401 || status == 407 {
        return FailureClass::Other(OtherReason::Auth);
    }
    if status == 529 || codes.iter().any(|c| c == "overloaded_error") {
        return FailureClass::Other(OtherReason::Overloaded);
    }
    if status >= 500 {
        return if msg.contains("deadline exceeded") || status == 504 {
            FailureClass::Other(OtherReason::Timeout)
        } else {
            FailureClass::Other(OtherReason::Server)
        };
    }
    if status == 403 {
        return classify_403(err, &parsed, &msg, html);
    }
    // A wrong URL or method is a configuration error, whatever page the server renders.
    if matches!(status, 404 | 405 | 410) {
        return FailureClass::Other(OtherReason::BadRequest);
    }
    if html {
        return if status == 413 || status == 431 || has_payload_phrase(&msg) {
            FailureClass::PayloadTooLarge
        } else {
            FailureClass::ProxyRejection
        };
    }
    if codes.iter().any(|c| c == "request_too_large") || has_payload_phrase(&msg) {
        return FailureClass::PayloadTooLarge;
    }
    if is_overflow(&codes, &msg, status) {
        return FailureClass::ContextOverflow;
    }
    if status == 413 || status == 431 {
        return FailureClass::PayloadTooLarge;
    }
    if msg.contains("deadline exceeded") || status == 408 {
        return FailureClass::Other(OtherReason::Timeout);
    }
    FailureClass::Other(OtherReason::BadRequest)
}

/// A reply that began normally (2xx) and then broke while its body was read or decoded. A
/// transfer that was cut is judged like any cut connection (by the request's size); a stall
/// is a timeout; a body that arrived whole but does not decode is the provider's fault.
fn classify_broken_reply(err: &ProviderError, opts: &ClassifyOptions) -> FailureClass {
    let t = err.transport.as_deref().unwrap_or_default().to_lowercase();
    if t.contains("[stream_stalled]") {
        return FailureClass::Other(OtherReason::Timeout);
    }
    if t.contains("[html_body]") || is_html(err) {
        return FailureClass::Other(OtherReason::CaptivePortal);
    }
    let cut = t.contains("[body_interrupted]") || t.contains("[stream_incomplete]");
    if cut || is_cut(&t) {
        return cut_connection(err, opts);
    }
    FailureClass::Other(OtherReason::MalformedReply)
}

fn cut_connection(err: &ProviderError, opts: &ClassifyOptions) -> FailureClass {
    if err.request_bytes >= opts.suspected_payload_bytes {
        FailureClass::SuspectedPayload
    } else {
        FailureClass::Other(OtherReason::Transient)
    }
}

fn is_cut(t: &str) -> bool {
    const CUT: [&str; 7] = [
        "unexpected eof",
        "connection reset",
        "broken pipe",
        "stream error",
        "connection closed",
        "connection aborted",
        "incomplete message",
    ];
    CUT.iter().any(|p| t.contains(p)) || contains_word(t, "eof")
}

fn classify_transport(err: &ProviderError, opts: &ClassifyOptions) -> FailureClass {
    let t = err.transport.as_deref().unwrap_or_default().to_lowercase();
    // SDKs that expect JSON and receive a proxy's HTML page fail while decoding it.
    if t.contains("invalid character '<'")
        || t.contains("expected value at line 1 column 1") && t.contains('<')
        || t.contains("<html")
    {
        return FailureClass::ProxyRejection;
    }
    if t.contains("deadline exceeded") || t.contains("timed out") || t.contains("timeout") {
        return FailureClass::Other(OtherReason::Timeout);
    }
    if is_cut(&t) {
        return cut_connection(err, opts);
    }
    FailureClass::Other(OtherReason::Transient)
}

fn classify_403(err: &ProviderError, parsed: &ParsedBody, msg: &str, html: bool) -> FailureClass {
    if html || has_waf_phrase(msg) {
        return FailureClass::ProxyRejection;
    }
    if parsed.is_json {
        return FailureClass::Other(OtherReason::Auth);
    }
    let header_signal = err.headers.iter().any(|(k, v)| {
        let v = v.to_lowercase();
        k == "cf-ray"
            || k.starts_with("x-amzn-waf")
            || k.starts_with("x-akamai")
            || v.contains("cloudflare")
            || v.contains("akamaighost")
            || v.contains("mod_security")
            || v.contains("zscaler")
    });
    if header_signal {
        FailureClass::ProxyRejection
    } else {
        FailureClass::Other(OtherReason::Auth)
    }
}

fn is_html(err: &ProviderError) -> bool {
    let ct_html = err
        .content_type
        .as_deref()
        .is_some_and(|c| c.to_lowercase().contains("text/html"));
    let head: String = err
        .body
        .trim_start()
        .chars()
        .take(512)
        .collect::<String>()
        .to_lowercase();
    ct_html || head.starts_with("<!doctype html") || head.contains("<html")
}

fn is_rate_limit(codes: &[String], msg: &str) -> bool {
    codes.iter().any(|c| {
        c == "rate_limit_exceeded"
            || c == "rate_limit_error"
            || c == "resource_exhausted"
            || c == "throttlingexception"
    }) || msg.contains("tokens per minute")
        || msg.contains("(tpm)")
        || msg.contains("requests per minute")
        || msg.contains("rate limit")
}

const WAF_PHRASES: [&str; 12] = [
    "firewall",
    "waf",
    "security policy",
    "blocked by",
    "cloudflare",
    "cf-ray",
    "mod_security",
    "modsecurity",
    "akamai",
    "proxy denied",
    "policy violation",
    "request blocked",
];

fn has_waf_phrase(msg: &str) -> bool {
    WAF_PHRASES.iter().any(|p| contains_word(msg, p))
}

const PAYLOAD_PHRASES: [&str; 7] = [
    "payload too large",
    "request entity too large",
    "body too large",
    "maximum request size",
    "request header fields too large",
    "request header or cookie too large",
    "request exceeds the maximum allowed number of bytes",
];

fn has_payload_phrase(msg: &str) -> bool {
    PAYLOAD_PHRASES.iter().any(|p| msg.contains(p))
}

/// Known overflow wordings, one or more per provider. Matched on the lower-cased message.
const OVERFLOW_PHRASES: [&str; 16] = [
    // OpenAI chat, DeepSeek, vLLM, OpenRouter, Groq: "This model's maximum context length is N tokens"
    "maximum context length",
    // OpenAI Responses
    "exceeds the context window",
    // Anthropic (direct and on Bedrock): "prompt is too long: N tokens > M maximum"
    "prompt is too long",
    // Anthropic: "input length and `max_tokens` exceed context limit"
    "exceed context limit",
    // Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)."
    "input token count",
    // Bedrock
    "input is too long for requested model",
    "too many input tokens",
    // xAI: "This model's maximum prompt length is N but the request contains M tokens."
    "maximum prompt length",
    // Mistral: "... too large for model with N maximum context length"
    "maximum context length",
    // Groq: "Please reduce the length of the messages or completion."
    "reduce the length of the messages",
    // llama.cpp / Ollama style servers
    "exceeds the available context size",
    "exceeds context length",
    "exceeds the context length",
    "context window exceeded",
    "context length exceeded",
    "prompt is longer than the model's context",
];

const PARAM_NAMES: [&str; 4] = [
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "maxoutputtokens",
];

fn is_overflow(codes: &[String], msg: &str, status: u16) -> bool {
    if codes.iter().any(|c| {
        c == "context_length_exceeded"
            || c == "context_window_exceeded"
            || c == "exceed_context_size_error"
    }) {
        return true;
    }
    // "context deadline exceeded" is a Go timeout, not a context window.
    let msg = msg.replace("context deadline exceeded", "");
    if OVERFLOW_PHRASES.iter().any(|p| msg.contains(p)) {
        return true;
    }
    if msg.contains("unknown parameter") || msg.contains("unrecognized request argument") {
        return false;
    }
    // An invalid output-limit parameter ("max_tokens is too large: 50000") is a bad request:
    // shrinking the history would not help.
    if PARAM_NAMES.iter().any(|p| msg.contains(p)) {
        return false;
    }
    if status != 400 && status != 413 {
        return false;
    }
    const SUBJECT: [&str; 5] = ["token", "context", "length", "prompt", "input"];
    const EXCESS: [&str; 6] = [
        "exceed",
        "too large",
        "too long",
        "limit",
        "maximum",
        "too many",
    ];
    SUBJECT.iter().any(|s| msg.contains(s)) && EXCESS.iter().any(|e| msg.contains(e))
}

/// `needle` occurs in `hay` not glued to other letters (so "waf" does not match "wafer").
fn contains_word(hay: &str, needle: &str) -> bool {
    let bytes = hay.as_bytes();
    let mut from = 0;
    while let Some(pos) = hay[from..].find(needle) {
        let start = from + pos;
        let end = start + needle.len();
        let before_ok = start == 0 || !bytes[start - 1].is_ascii_alphanumeric();
        let after_ok = end >= bytes.len() || !bytes[end].is_ascii_alphanumeric();
        if before_ok && after_ok {
            return true;
        }
        from = start + 1;
        while from < hay.len() && !hay.is_char_boundary(from) {
            from += 1;
        }
    }
    false
}

/// The useful parts of an error body: every code/type/status string found and the message.
#[derive(Debug, Default)]
pub(crate) struct ParsedBody {
    pub(crate) is_json: bool,
    pub(crate) codes: Vec<String>,
    pub(crate) message: String,
}

impl ParsedBody {
    pub(crate) fn parse(body: &str) -> Self {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(body.trim()) else {
            return Self {
                is_json: false,
                codes: Vec::new(),
                message: body.to_string(),
            };
        };
        let mut out = Self {
            is_json: true,
            ..Self::default()
        };
        out.collect(&value, 0);
        if out.message.is_empty() {
            out.message = body.to_string();
        }
        out
    }

    fn collect(&mut self, v: &serde_json::Value, depth: usize) {
        use serde_json::Value;
        if depth > 4 {
            return;
        }
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("code" | "type" | "status" | "__type", Value::String(s)) => {
                            self.codes.push(s.clone());
                        }
                        ("message" | "detail" | "error" | "msg", Value::String(s)) => {
                            if !self.message.is_empty() {
                                self.message.push(' ');
                            }
                            self.message.push_str(s);
                        }
                        (_, Value::Object(_) | Value::Array(_)) => self.collect(v, depth + 1),
                        _ => {}
                    }
                }
            }
            Value::Array(items) => {
                for item in items.iter().take(8) {
                    self.collect(item, depth + 1);
                }
            }
            _ => {}
        }
    }

    fn codes_lower(&self) -> Vec<String> {
        self.codes.iter().map(|c| c.to_lowercase()).collect()
    }
}
