//! Level-2 summaries written by the session's own provider.

use std::sync::Arc;

use async_trait::async_trait;
use tracing::Instrument;

use crate::compact::summarize::SummaryRequest;
use crate::compact::{SummarizeError, Summarizer};
use crate::config::Live;
use crate::history::Message;
use crate::provider::{ChatRequest, Provider};

/// Reply budget of a summary, in tokens.
const SUMMARY_OUTPUT_TOKENS: u64 = 8_192;

pub struct ProviderSummarizer {
    provider: Arc<dyn Provider>,
    model: String,
    window_chars: usize,
    max_output: u64,
    /// A person's instruction for this compaction (`POST /v1/session/compact`).
    extra: Option<String>,
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
        }
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
        let req = ChatRequest {
            model: self.model.clone(),
            messages: vec![
                Message::system(instructions),
                Message::user(request.transcript.clone()),
            ],
            tools: Vec::new(),
            max_output_tokens: self.max_output,
            stream: false,
        };
        let span = tracing::info_span!("summary", attempt = request.attempt);
        match self.provider.send(&req).instrument(span).await {
            Ok(r) => Ok(r.message.content),
            Err(e) => Err(SummarizeError::Failed(e.to_string())),
        }
    }
}
