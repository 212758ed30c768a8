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

use cairn_crds::ProviderKind;

/// True for the provider families with server-side context management.
pub fn supports_provider_engine(kind: ProviderKind) -> bool {
    matches!(kind, ProviderKind::Anthropic | ProviderKind::OpenaiResponses)
}
