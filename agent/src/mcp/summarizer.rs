//! `engine: mcp`: level-2 summaries written by an MCP server's
//! `context_compact(segment, budget_chars, instruction)` tool, given the same budgeted
//! transcript the built-in summarizer gets. An error, a timeout or an empty answer hands
//! that summary to the built-in summarizer; the quality gate judges either one, and a
//! summary the gate rejected is retried with the built-in summarizer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::compact::summarize::SummaryRequest;
use crate::compact::{SummarizeError, Summarizer};

use super::McpHub;

/// The tool `engine: mcp` calls.
pub const COMPACT_TOOL: &str = "context_compact";

/// Who wrote the summaries of one compaction.
#[derive(Debug, Default)]
pub struct EngineCounts {
    /// Summaries the MCP server wrote.
    pub mcp: AtomicU64,
    /// Summaries handed to the built-in summarizer because the server failed.
    pub fallback: AtomicU64,
}

pub struct McpSummarizer<S> {
    hub: Arc<McpHub>,
    server: String,
    timeout: Duration,
    /// Size the summary is asked to stay within, in characters.
    budget_chars: usize,
    extra: Option<String>,
    fallback: S,
    pub counts: EngineCounts,
}

impl<S: Summarizer> McpSummarizer<S> {
    pub fn new(
        hub: Arc<McpHub>,
        server: String,
        timeout: Duration,
        budget_chars: usize,
        extra: Option<String>,
        fallback: S,
    ) -> Self {
        Self {
            hub,
            server,
            timeout,
            budget_chars,
            extra,
            fallback,
            counts: EngineCounts::default(),
        }
    }

    pub fn fallback(&self) -> &S {
        &self.fallback
    }

    async fn ask_server(&self, request: &SummaryRequest) -> Result<String, String> {
        let mut instruction = request.instructions.clone();
        if let Some(extra) = &self.extra {
            instruction.push_str("\n\nAdditional instruction for this summary: ");
            instruction.push_str(extra);
        }
        let budget = self.budget_chars.min(request.transcript.len());
        let args = match json!({
            "segment": request.transcript,
            "budget_chars": budget,
            "instruction": instruction,
        }) {
            Value::Object(o) => o,
            _ => return Err("arguments are not an object".into()),
        };
        match self
            .hub
            .call_with(&self.server, COMPACT_TOOL, args, self.timeout)
            .await
        {
            Ok(r) if r.is_error => Err(format!("the tool answered an error: {}", r.text)),
            Ok(r) if r.text.trim().is_empty() => Err("the tool answered nothing".into()),
            Ok(r) => Ok(r.text),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[async_trait]
impl<S: Summarizer> Summarizer for McpSummarizer<S> {
    fn window_chars(&self) -> usize {
        self.fallback.window_chars()
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        // A retry follows a summary the gate rejected: the built-in summarizer writes it.
        if request.attempt == 1 {
            match self.ask_server(request).await {
                Ok(s) => {
                    self.counts.mcp.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(server = %self.server, bytes = s.len(), "engine mcp: summary written by the server");
                    return Ok(s);
                }
                Err(why) => {
                    tracing::warn!(server = %self.server, reason = %why, "engine mcp: the built-in summarizer writes this summary");
                }
            }
        }
        self.counts.fallback.fetch_add(1, Ordering::Relaxed);
        self.fallback.summarize(request).await
    }
}
