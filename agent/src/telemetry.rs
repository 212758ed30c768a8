//! Logs and traces. Logs go to stderr (JSON when `CAIRN_LOG_FORMAT=json`, the default for
//! `serve`), filtered by `RUST_LOG`. Spans (turn, compaction, recovery, provider call) are
//! also exported over OTLP/HTTP (protobuf) when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, as `service.name=cairn-agent` with the
//! session's namespace and name as resource attributes. Neither carries message bodies or
//! secrets: spans hold sizes, counts, labels and names only.
//!
//! The turn, provider-call, tool-call and compaction spans carry the attributes of the
//! OpenTelemetry GenAI semantic conventions (`gen_ai.*`): a turn is `invoke_agent`, a
//! provider call `chat`, a tool call `execute_tool`.

use opentelemetry::trace::{Status, TracerProvider as _};
use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Level, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::provider::{ChatRequest, ChatResponse, ProviderError, StopReason};

/// `service.name` of the exported spans.
pub const SERVICE_NAME: &str = "cairn-agent";
/// Resource attributes naming the session.
pub const NAMESPACE_ATTRIBUTE: &str = "cairn.session.namespace";
pub const NAME_ATTRIBUTE: &str = "cairn.session.name";

/// The endpoint variables that turn the export on.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Why the OTLP export could not start (the agent runs on without it).
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0} is not supported; only http/protobuf is")]
    Protocol(String),
    #[error("the OTLP exporter could not be built: {0}")]
    Exporter(String),
}

impl TelemetryError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Protocol(_) => "protocol",
            Self::Exporter(_) => "exporter",
        }
    }
}

/// What must outlive the program's work: the span exporter, flushed by [`Telemetry::shutdown`].
#[must_use = "call shutdown() at exit, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends the spans still buffered and stops the exporter. Blocks: call it outside the
    /// async runtime.
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            if let Err(e) = p.force_flush() {
                eprintln!("cairn-agent: flushing spans: {e}");
            }
            if let Err(e) = p.shutdown() {
                eprintln!("cairn-agent: stopping the span exporter: {e}");
            }
        }
    }
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// Whether an OTLP endpoint is configured.
pub fn otlp_configured() -> bool {
    ENDPOINT_VARS.iter().any(|k| var(k).is_some())
}

/// The tracer provider for `session` (namespace, name), when an endpoint is configured.
fn provider(session: Option<(&str, &str)>) -> Result<Option<SdkTracerProvider>, TelemetryError> {
    if !otlp_configured() {
        return Ok(None);
    }
    if let Some(p) = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .filter(|p| p != "http/protobuf")
    {
        return Err(TelemetryError::Protocol(p));
    }
    // The endpoint, headers and timeout come from the standard OTEL_EXPORTER_OTLP_* variables.
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let mut attributes = Vec::new();
    if let Some((ns, name)) = session {
        attributes.push(KeyValue::new(NAMESPACE_ATTRIBUTE, ns.to_owned()));
        attributes.push(KeyValue::new(NAME_ATTRIBUTE, name.to_owned()));
    }
    let resource = Resource::builder()
        .with_service_name(SERVICE_NAME)
        .with_attributes(attributes)
        .build();
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build(),
    ))
}

/// The log filter directive that keeps the SigV4 signer's traces out.
pub const SIGNER_QUIET: &str = "aws_sigv4=debug";

/// Installs the global subscriber: logs on stderr, and spans over OTLP when configured.
/// `session` names the session in the exported resource.
pub fn init(json_default: bool, session: Option<(&str, &str)>) -> Telemetry {
    // The SigV4 signer traces canonical requests, session tokens included: never shown,
    // whatever RUST_LOG says.
    let mut filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(if json_default { "info" } else { "warn" }));
    if let Ok(quiet) = SIGNER_QUIET.parse() {
        filter = filter.add_directive(quiet);
    }
    let json = std::env::var("CAIRN_LOG_FORMAT").map_or(json_default, |v| v == "json");
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if json {
        logs.json().with_filter(filter).boxed()
    } else {
        logs.with_filter(filter).boxed()
    };
    let (provider, failed) = match provider(session) {
        Ok(p) => (p, None),
        Err(e) => (None, Some(e)),
    };
    // The agent's own spans only, whatever RUST_LOG says: the HTTP clients' spans would
    // include the exporter's own requests.
    let spans = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(SERVICE_NAME))
            .with_filter(Targets::new().with_target("cairn_agent", Level::INFO))
    });
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init();
    if let Some(e) = failed {
        tracing::warn!(error = %e, label = e.label(), "spans are not exported");
    }
    Telemetry { provider }
}

/// The GenAI conventions' `gen_ai.provider.name` of a provider client (`Provider::name`):
/// the conventions' well-known value where they name the provider, else the client's own name
/// (`openai-compatible` serves many).
pub fn genai_provider_name(client: &str) -> &str {
    match client {
        "openai" | "openai-responses" => "openai",
        "bedrock" => "aws.bedrock",
        "gemini" => "gcp.gemini",
        other => other,
    }
}

/// A reply's stop as a GenAI finish reason.
fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::End => "stop",
        StopReason::ToolUse => "tool_call",
        StopReason::MaxTokens => "length",
        StopReason::Other => "other",
    }
}

/// The span of one model call sent by `client` (`Provider::name`): a GenAI `chat`, its
/// outcome recorded by [`record_chat`].
pub fn chat_span(client: &str, request: &ChatRequest) -> Span {
    tracing::info_span!(
        "provider_call",
        provider = client,
        max_out = request.max_output_tokens,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = genai_provider_name(client),
        gen_ai.request.model = %request.model,
        gen_ai.request.max_tokens = int(request.max_output_tokens),
    )
}

/// A count as an OTLP integer (the export writes a u64 as a string).
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The outcome of a model call on its [`chat_span`]: finish reasons and token usage, or the
/// error's label as `error.type` and an error status.
pub fn record_chat(span: &Span, result: &Result<ChatResponse, ProviderError>) {
    match result {
        Ok(reply) => {
            let reasons = vec![StringValue::from(finish_reason(reply.stop))];
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                Value::Array(Array::String(reasons)),
            );
            let usage = &reply.usage;
            for (key, n) in [
                ("gen_ai.usage.input_tokens", usage.input_tokens),
                ("gen_ai.usage.output_tokens", usage.output_tokens),
                (
                    "gen_ai.usage.cache_read.input_tokens",
                    usage.cache_read_tokens,
                ),
                (
                    "gen_ai.usage.cache_creation.input_tokens",
                    usage.cache_write_tokens,
                ),
            ] {
                span.set_attribute(key, int(n));
            }
        }
        Err(e) => failed(span, e.label()),
    }
}

/// A failed GenAI operation: its `error.type` and an error status.
pub fn failed(span: &Span, error_type: &'static str) {
    span.set_attribute("error.type", error_type);
    span.set_status(Status::error(error_type));
}
