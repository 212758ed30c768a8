//! `engine: provider`: the server-side context management of the provider families that
//! have one, as their APIs document it.
//!
//! - Anthropic Messages: context editing. Tool-loop requests carry the
//!   `context-management-2025-06-27` beta and a `clear_tool_uses_20250919` edit whose
//!   `trigger`, `keep`, `clear_at_least` and `exclude_tools` come from `providerEngine`.
//! - OpenAI Responses: server-side compaction, `context_management: [{"type": "compaction",
//!   "compact_threshold": N}]`; the opaque compaction item the server returns stands in the
//!   history for the items it replaced.
//!
//! Every other family has no equivalent: the session reports `engine` in
//! `status.session.unsupported` and the built-in summarizer writes level-2 summaries.
//!
//! What the server did ([`AppliedContext`]) is applied to the local history by
//! [`crate::compact::mirror`].

use cairn_crds::ProviderKind;

/// True for the provider families with server-side context management.
pub fn supports_provider_engine(kind: ProviderKind) -> bool {
    matches!(
        kind,
        ProviderKind::Anthropic | ProviderKind::OpenaiResponses
    )
}

/// What a request asks of the server's own context management (`engine: provider`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerContext {
    /// Anthropic: one `clear_tool_uses_20250919` edit.
    ClearToolUses {
        trigger_input_tokens: u64,
        keep_tool_uses: u64,
        clear_at_least_input_tokens: Option<u64>,
        exclude_tools: Vec<String>,
    },
    /// OpenAI Responses: server-side compaction past this many rendered tokens.
    Compaction { compact_threshold: u64 },
}

impl ServerContext {
    /// Anthropic's `context_management` body field.
    pub fn anthropic_body(&self) -> Option<serde_json::Value> {
        let Self::ClearToolUses {
            trigger_input_tokens,
            keep_tool_uses,
            clear_at_least_input_tokens,
            exclude_tools,
        } = self
        else {
            return None;
        };
        let mut edit = serde_json::json!({
            "type": CLEAR_TOOL_USES,
            "trigger": {"type": "input_tokens", "value": trigger_input_tokens},
            "keep": {"type": "tool_uses", "value": keep_tool_uses},
        });
        if let Some(n) = clear_at_least_input_tokens {
            edit["clear_at_least"] = serde_json::json!({"type": "input_tokens", "value": n});
        }
        if !exclude_tools.is_empty() {
            edit["exclude_tools"] = serde_json::json!(exclude_tools);
        }
        Some(serde_json::json!({"edits": [edit]}))
    }

    /// The Responses API's `context_management` body field.
    pub fn responses_body(&self) -> Option<serde_json::Value> {
        let Self::Compaction { compact_threshold } = self else {
            return None;
        };
        Some(serde_json::json!([{"type": "compaction", "compact_threshold": compact_threshold}]))
    }
}

/// The edit type of Anthropic's tool-result clearing.
pub const CLEAR_TOOL_USES: &str = "clear_tool_uses_20250919";
/// The beta that enables Anthropic's context editing.
pub const ANTHROPIC_BETA: &str = "context-management-2025-06-27";

/// What the server's context management did to one request.
#[derive(Clone, Debug, PartialEq)]
pub enum AppliedContext {
    /// Anthropic cleared the results of the oldest `cleared_tool_uses` tool uses.
    ClearedToolUses {
        cleared_tool_uses: u64,
        cleared_input_tokens: u64,
    },
    /// OpenAI compacted everything before this opaque item into it.
    Compaction { item: serde_json::Value },
}

/// The request field for `policy` and a session on `kind`, when `engine: provider` applies.
pub fn server_context(
    kind: ProviderKind,
    policy: &cairn_crds::EffectivePolicy,
    history_budget_tokens: u64,
) -> Option<ServerContext> {
    if policy.engine != cairn_crds::policy::SummaryEngine::Provider {
        return None;
    }
    let e = &policy.provider_engine;
    match kind {
        ProviderKind::Anthropic => Some(ServerContext::ClearToolUses {
            trigger_input_tokens: u64::from(e.trigger_input_tokens),
            keep_tool_uses: u64::from(e.keep_tool_uses),
            clear_at_least_input_tokens: e.clear_at_least_input_tokens.map(u64::from),
            exclude_tools: e.exclude_tools.clone(),
        }),
        ProviderKind::OpenaiResponses => Some(ServerContext::Compaction {
            compact_threshold: e
                .compact_threshold_tokens
                .map_or(history_budget_tokens, u64::from)
                .max(1),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_fields_follow_the_documented_shapes() {
        let mut policy = cairn_crds::EffectivePolicy::default();
        assert_eq!(server_context(ProviderKind::Anthropic, &policy, 1000), None);
        policy.engine = cairn_crds::policy::SummaryEngine::Provider;
        let a = server_context(ProviderKind::Anthropic, &policy, 1000).expect("anthropic");
        assert_eq!(
            a.anthropic_body(),
            Some(
                serde_json::json!({"edits": [{"type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 100_000},
                "keep": {"type": "tool_uses", "value": 3}}]})
            )
        );
        policy.provider_engine.clear_at_least_input_tokens = Some(5000);
        policy.provider_engine.exclude_tools = vec!["recall".into()];
        let a = server_context(ProviderKind::Anthropic, &policy, 1000).expect("anthropic");
        let body = a.anthropic_body().expect("body");
        assert_eq!(body["edits"][0]["clear_at_least"]["value"], 5000);
        assert_eq!(body["edits"][0]["exclude_tools"][0], "recall");
        let o = server_context(ProviderKind::OpenaiResponses, &policy, 1234).expect("responses");
        assert_eq!(
            o.responses_body(),
            Some(serde_json::json!([{"type": "compaction", "compact_threshold": 1234}]))
        );
        assert_eq!(server_context(ProviderKind::Gemini, &policy, 1000), None);
    }
}
