//! The context inspector of a session: the next request, assembled by the turn's own code
//! (cheap passes, tool catalog, tool-result cuts, instructions, request settings) on the
//! current history and rendered by the provider client, then measured by part
//! ([`crate::breakdown::breakdown`]). Nothing is sent, and the history, the catalog and the
//! counters are as before.

use std::sync::Arc;

use serde::Serialize;

use crate::breakdown::{Breakdown, ToolSource, breakdown};
use crate::compact::Budget;
use crate::compact::ladder::{Preflight, preflight};
use crate::compact::window::{Buffers, Headroom};
use crate::history::{self, Message};
use crate::provider::{ProviderError, Rendered};

use super::Session;
use super::tools;
use super::turn::{INITIAL_OUTPUT_TOKENS, Lent, Notices, Offered};

/// What the next request would be.
#[derive(Clone, Debug, Default)]
pub struct InspectOptions {
    /// A user message the next turn brings (not journaled; only shown in the request).
    pub input: Option<String>,
    /// The request streams (as a streamed API turn's do).
    pub stream: bool,
}

/// The next request, by part, with the limits it is measured against.
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ContextReport {
    pub provider: String,
    pub model: String,
    pub method: &'static str,
    pub url: String,
    /// The request's headers, credentials redacted.
    pub headers: Vec<(String, String)>,
    pub stream: bool,
    pub max_output_tokens: u64,
    #[serde(flatten)]
    pub parts: Breakdown,
    pub window: WindowReport,
    pub headroom: HeadroomState,
    /// `spec.payloadCap`.
    pub payload_cap: Option<u64>,
    /// The cap learned from rejections of the network path.
    pub learned_payload_cap: Option<u64>,
    /// What the session can never compact: the system prompt, the tool catalog, the client's
    /// instructions and output format.
    pub uncompactable_floor: Floor,
    /// Set when the next turn compacts before it sends: why.
    pub compacts_first: Option<String>,
    /// The client's part the request assumes, from the latest turn.
    pub assumes: Assumptions,
    /// The tool catalog: its whole and offered bytes, the room it had, and the tools
    /// shortened or deferred behind `tool_search` to fit it.
    pub catalog: cairn_engine::offer::CatalogReport,
    /// Things the assembly reported (MCP servers out of reach, a catalog that gave way, ...).
    pub notices: Vec<String>,
    /// What the session's compactions kept in sight of what they replaced: the newest one's
    /// score by category, the rolling and lowest scores (`status.session.compactionQuality`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_quality: Option<cairn_crds::session::CompactionQuality>,
    /// The exact body; not part of the JSON report (`?view=request` serves it).
    #[serde(skip)]
    pub body: Vec<u8>,
}

#[derive(Serialize, Clone, Copy, Debug)]
#[serde(rename_all = "camelCase")]
pub struct WindowReport {
    /// The configured context window, tokens.
    pub context_window: u64,
    /// The window in force (a learned one can be smaller).
    pub effective_context_window: u64,
    /// Bytes the history may weigh (`budgetRatio` of the window, within the payload caps).
    pub budget_bytes: u64,
    pub budget_tokens: u64,
    /// Bytes per token the session measured.
    pub bytes_per_token: f64,
}

#[derive(Serialize, Clone, Copy, Debug)]
#[serde(rename_all = "camelCase")]
pub struct HeadroomState {
    /// `normal`, `warning`, `auto-compact` or `blocking`.
    pub state: &'static str,
    /// Tokens the request leaves in the window (negative: over it).
    pub tokens_left: i64,
    pub warning_buffer_tokens: u64,
    pub auto_compact_buffer_tokens: u64,
    pub blocking_buffer_tokens: u64,
}

#[derive(Serialize, Clone, Copy, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Floor {
    pub bytes: u64,
    pub tokens: u64,
}

#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Assumptions {
    pub input: bool,
    pub client_tools: Vec<String>,
    pub instructions: bool,
}

fn state_name(h: Headroom) -> &'static str {
    match h {
        Headroom::Ok => "normal",
        Headroom::Warning => "warning",
        Headroom::AutoCompact => "auto-compact",
        Headroom::Blocking => "blocking",
    }
}

impl Session {
    /// The request the next turn would send first, by part: assembled and rendered by the code
    /// of a real send, measured, and not sent. The next turn is assumed to bring the client
    /// part (tools, instructions, controls) of the latest turn, and `options.input`.
    /// Where `text` went: the history, then the archived originals its markers reach
    /// (`GET /v1/session/context?why=TEXT`).
    pub async fn why(&self, text: &str) -> cairn_engine::why::Why {
        cairn_engine::why::why(&self.history, text, self.store.as_ref()).await
    }

    pub async fn inspect(
        &mut self,
        options: InspectOptions,
    ) -> Result<ContextReport, Box<ProviderError>> {
        self.refresh_live();
        let saved_history = self.history.to_vec();
        let saved_catalog = std::mem::take(&mut self.mcp_catalog);
        let saved_plan = std::mem::take(&mut self.tool_plan);
        let saved_options = std::mem::replace(&mut self.options, self.last_options.clone());
        let result = self.assemble_and_measure(&options).await;
        self.history.replace(saved_history);
        self.mcp_catalog = saved_catalog;
        self.tool_plan = saved_plan;
        self.options = saved_options;
        result
    }

    async fn assemble_and_measure(
        &mut self,
        options: &InspectOptions,
    ) -> Result<ContextReport, Box<ProviderError>> {
        let live = Arc::clone(&self.live);
        let policy = &live.policy;
        self.ensure_system_prompt();
        if let Some(text) = &options.input {
            self.history.push(Message::user(text.clone()));
        }
        let _ = self.cheap_passes().await;
        let mut notices = Notices {
            list: Vec::new(),
            live: None,
        };
        let catalog = self.offer_tools(&mut notices).await;
        self.fit_catalog(&catalog);
        if !self.tool_plan.is_whole() {
            notices.list.push(super::turn::Notice {
                kind: "catalog",
                message: cairn_engine::offer::notice(&self.tool_plan),
            });
        }
        let Offered {
            specs: tool_specs,
            bytes: tools_bytes,
        } = self.offered(&catalog);
        let max_out = self.model_max().min(INITIAL_OUTPUT_TOKENS);

        // The limits, as the turn's pre-flight measures them (before the cuts).
        let inputs = self.budget_inputs();
        let weight = history::weight(&self.history);
        let request_bytes = weight + inputs.reserve_bytes;
        let budget = Budget::compute(&inputs, policy, &self.state);
        let (tier, left) = Headroom::of(request_bytes, &inputs, policy, &self.state);
        let buffers = Buffers::of(inputs.context_window, policy);
        let mut probe = self.state.clone();
        let compacts_first = match preflight(request_bytes, live.payload_cap, &mut probe) {
            Preflight::Compact { .. } => Some(format!(
                "pre-flight: the request ({request_bytes} bytes) comes close to the payload cap"
            )),
            _ if tier == Headroom::Blocking => {
                Some("the headroom is at the blocking buffer".to_owned())
            }
            _ if tier >= Headroom::AutoCompact => {
                Some("the headroom is at the auto-compact buffer".to_owned())
            }
            _ if !budget.fits(weight) => Some(format!(
                "the history ({weight} bytes) is over its budget ({} bytes)",
                budget.chars
            )),
            _ => None,
        };
        let floor = cairn_engine::compact::window::system_weight(self.history.iter()) + tools_bytes;
        let cpt = self.state.chars_per_token;
        let window = WindowReport {
            context_window: live.limits.context_window,
            effective_context_window: inputs.context_window,
            budget_bytes: budget.chars as u64,
            budget_tokens: cpt.tokens(budget.chars),
            bytes_per_token: (cpt.get() * 1000.0).round() / 1000.0,
        };
        let mut builtin: Vec<String> = tools::catalog().into_iter().map(|t| t.name).collect();
        builtin.push(cairn_engine::offer::TOOL_SEARCH.to_owned());
        let mcp: Vec<String> = self
            .mcp_catalog
            .specs
            .iter()
            .map(|t| t.name.clone())
            .collect();
        let source = |name: &str| {
            if builtin.iter().any(|n| n == name) {
                ToolSource::Builtin
            } else if mcp.iter().any(|n| n == name) {
                ToolSource::Mcp
            } else {
                ToolSource::Client
            }
        };
        let assumes = Assumptions {
            input: options.input.is_some(),
            client_tools: self.options.tools.iter().map(|t| t.name.clone()).collect(),
            instructions: self.options.instructions.is_some(),
        };
        let provider = Arc::clone(&self.provider);
        let Lent { loan, limit, .. } = self
            .lend_request(&tool_specs, tools_bytes, max_out, options.stream)
            .await;
        let rendered = provider.render(&loan.request);
        let measured = rendered.map(
            |Rendered {
                 method,
                 url,
                 headers,
                 body,
             }| {
                let parts = breakdown(&loan.request, &body, &source, loan.instructions, &cpt);
                (method, url, headers, body, parts)
            },
        );
        drop(loan);
        let (method, url, headers, body, parts) = measured?;
        Ok(ContextReport {
            provider: provider.name().to_owned(),
            model: live.spec.provider.model.clone(),
            method,
            url,
            headers,
            stream: options.stream,
            max_output_tokens: limit,
            parts,
            window,
            headroom: HeadroomState {
                state: state_name(tier),
                tokens_left: left,
                warning_buffer_tokens: buffers.warning,
                auto_compact_buffer_tokens: buffers.auto_compact,
                blocking_buffer_tokens: buffers.blocking,
            },
            payload_cap: live.payload_cap,
            learned_payload_cap: self.state.learned_payload_cap,
            uncompactable_floor: Floor {
                bytes: floor as u64,
                tokens: cpt.tokens(floor),
            },
            compacts_first,
            assumes,
            catalog: self.tool_plan.report(),
            notices: notices.list.into_iter().map(|n| n.message).collect(),
            compaction_quality: (!self.state.quality.is_empty())
                .then(|| self.state.quality.clone()),
            body,
        })
    }
}
