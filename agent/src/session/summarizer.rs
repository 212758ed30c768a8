//! Level-2 summaries written by the session's own provider (or the policy's summarizer
//! model through it). The summarizer obeys the session's rules: its input is budgeted
//! against its real window in real tokens, and when the server still rejects it as too long,
//! the overflow is classified, its numbers are kept for the session to learn, and the request
//! is retried once cut to what the server said.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tracing::Instrument;

use crate::classify::{FailureClass, classify};
use crate::compact::summarize::{
    MIN_INPUT_CHARS, SECTION_FIELDS, SUMMARY_MIN_CHARS, SummaryRequest, from_sections,
    required_chars, sections_schema,
};
use crate::compact::text;
use crate::compact::{SummarizeError, Summarizer};
use crate::config::Live;
use crate::history::Message;
use crate::metrics::{Metrics, ProviderErrorLabels};
use crate::overflow::{ServerCount, server_count};
use crate::provider::{
    ChatRequest, ChatResponse, Controls, OutputFormat, Provider, ProviderError, Usage,
};
use crate::telemetry;

/// Reply budget of a summary, in tokens.
const SUMMARY_OUTPUT_TOKENS: u64 = 8_192;

pub struct ProviderSummarizer {
    provider: Arc<dyn Provider>,
    model: String,
    window_chars: usize,
    max_output: u64,
    /// A person's instruction for this compaction (`POST /v1/session/compact`).
    extra: Option<String>,
    /// What an overflow of the summarizer's own request said: the server's count and the
    /// bytes of the request it counted.
    learned: Mutex<Option<(ServerCount, usize)>>,
    /// The session's bytes per token, to tell whether the output limit can hold a summary.
    chars_per_token: f64,
    /// Tokens the summarizer's calls used, for the session to count apart.
    usage: Mutex<Usage>,
    metrics: Option<Arc<Metrics>>,
    /// Ask for the nine sections as a JSON object (`summarizer.structured`).
    structured: bool,
}

impl ProviderSummarizer {
    pub fn new(
        provider: Arc<dyn Provider>,
        live: &Live,
        window_chars: usize,
        extra: Option<String>,
    ) -> Self {
        let model = live
            .policy
            .summarizer
            .model
            .clone()
            .unwrap_or_else(|| live.spec.provider.model.clone());
        Self {
            provider,
            model,
            window_chars,
            max_output: live.limits.max_output_tokens.min(SUMMARY_OUTPUT_TOKENS),
            extra,
            learned: Mutex::new(None),
            chars_per_token: crate::tokens::DEFAULT_CHARS_PER_TOKEN,
            usage: Mutex::new(Usage::default()),
            metrics: None,
            structured: crate::config::structured_summaries(live),
        }
    }

    /// Bounds the summary's output limit (a share of a small window).
    pub fn with_max_output(mut self, max_output: u64) -> Self {
        self.max_output = self.max_output.min(max_output.max(1));
        self
    }

    /// Counts the summarizer's failed calls in `cairn_agent_provider_errors_total{client="summarizer"}`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn failed(&self, err: &crate::provider::ProviderError) -> FailureClass {
        let class = classify(err);
        tracing::warn!(
            class = class.label(),
            error = err.label(),
            "summary request failed: {err}"
        );
        if let Some(m) = &self.metrics {
            m.provider_errors
                .get_or_create(&ProviderErrorLabels {
                    error: err.label(),
                    class: class.label(),
                    client: crate::cost::Client::Summarizer.label(),
                })
                .inc();
        }
        class
    }

    pub fn with_chars_per_token(mut self, ratio: f64) -> Self {
        self.chars_per_token = ratio;
        self
    }

    /// The output limit of a summary, in tokens.
    pub fn max_output(&self) -> u64 {
        self.max_output
    }

    /// The summarizer model's name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Tokens used by the calls since the last take.
    pub fn take_usage(&self) -> Usage {
        self.usage
            .lock()
            .map(|mut u| std::mem::take(&mut *u))
            .unwrap_or_default()
    }

    fn count(&self, used: &Usage) {
        if let Ok(mut u) = self.usage.lock() {
            u.add(used);
        }
    }

    /// What the summarizer's own overflow taught, once.
    pub fn take_learned(&self) -> Option<(ServerCount, usize)> {
        self.learned.lock().ok().and_then(|mut l| l.take())
    }

    fn request(&self, instructions: &str, transcript: String) -> ChatRequest {
        let controls = Controls {
            format: self
                .structured
                .then(|| self.sections_format(transcript.len())),
            ..Controls::default()
        };
        ChatRequest {
            model: self.model.clone(),
            messages: vec![
                Message::system(instructions.to_owned()),
                Message::user(transcript),
            ],
            tools: Vec::new(),
            max_output_tokens: self.max_output,
            stream: false,
            controls,
            context: None,
        }
    }

    /// The JSON Schema format of a structured summary of `transcript_chars`: each section
    /// long enough for the quality gate together, and short enough that all nine fit the
    /// output limit even at one byte per token (what a grammar-constrained small model may
    /// write), a quarter kept for the JSON around them.
    fn sections_format(&self, transcript_chars: usize) -> OutputFormat {
        let sections = SECTION_FIELDS.len();
        let min = required_chars(transcript_chars).div_ceil(sections) + 8;
        let max = (self.max_output as usize * 3 / 4 / sections).max(min);
        OutputFormat::JsonSchema {
            name: "summary".into(),
            description: Some("The nine sections of the summary, one string each.".into()),
            schema: sections_schema(min, max),
            strict: Some(true),
        }
    }

    /// The summary a reply stands for: a structured reply's sections under their headings,
    /// any other reply as it is (the quality gate judges it).
    fn summary_of(&self, reply: String) -> String {
        if self.structured {
            return from_sections(&reply).unwrap_or(reply);
        }
        reply
    }
}

/// `transcript` cut to `max` bytes, head and tail 3:1, the cut said in place.
fn cut_transcript(transcript: &str, max: usize) -> String {
    if transcript.len() <= max {
        return transcript.to_owned();
    }
    let h = text::head(transcript, max * 3 / 4);
    let t = text::tail(&transcript[h.len()..], max / 4);
    format!(
        "{h}\n[... {} chars cut to fit the summarizer's window ...]\n{t}",
        transcript.len() - h.len() - t.len()
    )
}

impl ProviderSummarizer {
    /// One call of the summarizer's model, in its GenAI `chat` span under the summary's.
    async fn send(
        &self,
        request: &ChatRequest,
        summary: &tracing::Span,
    ) -> Result<ChatResponse, ProviderError> {
        let call = summary.in_scope(|| telemetry::chat_span(self.provider.name(), request));
        let result = self.provider.send(request).instrument(call.clone()).await;
        telemetry::record_chat(&call, &result);
        result
    }
}

#[async_trait]
impl Summarizer for ProviderSummarizer {
    fn window_chars(&self) -> usize {
        self.window_chars
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        let mut instructions = request.instructions.clone();
        if let Some(extra) = &self.extra {
            instructions.push_str("\n\nAdditional instruction for this summary: ");
            instructions.push_str(extra);
        }
        // A limit too small for the shortest summary the quality gate accepts would only
        // spend a model call on a certain rejection.
        let output_chars = (self.max_output as f64 * self.chars_per_token) as usize;
        if output_chars < SUMMARY_MIN_CHARS {
            return Err(SummarizeError::Failed(format!(
                "the output limit of {} tokens cannot hold a summary (at least {SUMMARY_MIN_CHARS} bytes); level 2 was skipped",
                self.max_output
            )));
        }
        let span = tracing::info_span!("summary", attempt = request.attempt);
        let req = self.request(&instructions, request.transcript.clone());
        let err = match self.send(&req, &span).instrument(span.clone()).await {
            Ok(r) => {
                self.count(&r.usage);
                return Ok(self.summary_of(r.message.content));
            }
            Err(e) => e,
        };
        let class = self.failed(&err);
        if class != FailureClass::ContextOverflow {
            return Err(SummarizeError::Failed(format!(
                "{} ({}): {err}",
                class.label(),
                err.label()
            )));
        }
        let sent = instructions.len() + request.transcript.len();
        let count = server_count(&err);
        if let Ok(mut l) = self.learned.lock() {
            *l = Some((count, sent));
        }
        // Cut to half the window the server named, at the bytes per token it counted.
        let (Some(window), Some(prompt)) = (count.window, count.prompt_tokens) else {
            return Err(SummarizeError::Failed(format!(
                "the summarizer's request overflowed its window and the server gave no numbers to fit it: {err}"
            )));
        };
        let per_token = sent as f64 / prompt.max(1) as f64;
        let room = ((window as f64 / 2.0) * per_token) as usize;
        let max = room.saturating_sub(instructions.len());
        if max < MIN_INPUT_CHARS {
            return Err(SummarizeError::WindowTooSmall {
                window_chars: room * 2,
            });
        }
        let retry = self.request(&instructions, cut_transcript(&request.transcript, max));
        tracing::info!(
            window,
            prompt,
            bytes = max,
            "summary request overflowed; retrying within the server's window"
        );
        match self.send(&retry, &span).instrument(span.clone()).await {
            Ok(r) => {
                self.count(&r.usage);
                Ok(self.summary_of(r.message.content))
            }
            Err(e) => {
                let class = self.failed(&e);
                Err(SummarizeError::Failed(format!(
                    "the summarizer's request overflowed ({err}) and its cut retry failed ({}): {e}",
                    class.label()
                )))
            }
        }
    }
}
