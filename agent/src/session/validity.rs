//! The one door of a turn's validity: every rule a turn's input and options must meet before
//! anything is sent, checked in one place. The API handlers ask it before they start a turn
//! (so a refused request is a 400 on every API, streamed or not, and the provider receives
//! nothing), and the turn asks it again for every other caller (`cairn-agent run`).

use cairn_crds::session::{AgentSessionSpec, ProviderKind};

use crate::history::{Message, Role};
use crate::provider::ToolChoice;

use super::TurnOptions;
use super::tools;

/// Why a turn's input or options are refused; one variant per case, each with its code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error("no input message")]
    NoInput,
    #[error("the input has no user message and no function call output")]
    NoQuestion,
    #[error("input messages must be user or system messages")]
    NotUserOrSystem,
    #[error("a user message of the input is empty: it has no text and no image")]
    EmptyMessage,
    #[error("the tool name {0:?} is reserved for a built-in tool of the session")]
    ReservedTool(String),
    /// A control the session's provider family cannot honour (the message says which).
    #[error("{0}")]
    UnsupportedByProvider(String),
    #[error(
        "tools: the MCP server_label {label:?} is not declared in this session's spec.tools.mcpServers (declared: {declared:?}); a request cannot add MCP servers"
    )]
    UndeclaredMcpServer {
        label: String,
        declared: Vec<String>,
    },
    #[error(
        "tools: server_url {url:?} is not the URL the spec declares for MCP server {label:?}; a request cannot point a server elsewhere (omit server_url)"
    )]
    ForeignMcpUrl { url: String, label: String },
}

impl InvalidRequest {
    /// Short stable code: the API error's `code`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoInput => "empty_input",
            Self::NoQuestion => "no_user_message",
            Self::NotUserOrSystem => "invalid_role",
            Self::EmptyMessage => "empty_message",
            Self::ReservedTool(_) => "reserved_tool_name",
            Self::UnsupportedByProvider(_) => "unsupported_by_provider",
            Self::UndeclaredMcpServer { .. } => "undeclared_mcp_server",
            Self::ForeignMcpUrl { .. } => "foreign_mcp_url",
        }
    }
}

/// Checks a turn's new input messages and options against the session's spec.
pub fn check_request(
    spec: &AgentSessionSpec,
    input: &[Message],
    options: &TurnOptions,
) -> Result<(), InvalidRequest> {
    if input.is_empty() {
        return Err(InvalidRequest::NoInput);
    }
    // A tool output answers a call of the client's tools; anything else needs a question.
    if !input
        .iter()
        .any(|m| matches!(m.role, Role::User | Role::Tool))
    {
        return Err(InvalidRequest::NoQuestion);
    }
    if options.ledger.is_none()
        && !input
            .iter()
            .all(|m| matches!(m.role, Role::User | Role::System))
    {
        return Err(InvalidRequest::NotUserOrSystem);
    }
    // A provider answers an empty question with an error of its own, or with a guess.
    if input
        .iter()
        .any(|m| m.role == Role::User && m.content.trim().is_empty() && m.images.is_empty())
    {
        return Err(InvalidRequest::EmptyMessage);
    }
    if let Some(t) = options.tools.iter().find(|t| {
        [
            tools::RECALL,
            tools::COMPRESS,
            cairn_engine::offer::TOOL_SEARCH,
        ]
        .contains(&t.name.as_str())
    }) {
        return Err(InvalidRequest::ReservedTool(t.name.clone()));
    }
    let kind = spec.provider.kind;
    let controls = &options.controls;
    if let Some(message) =
        crate::provider::unsupported_by(kind, controls.format.as_ref(), controls.effort)
    {
        return Err(InvalidRequest::UnsupportedByProvider(message));
    }
    if controls.tool_choice == ToolChoice::None && kind == ProviderKind::Bedrock {
        return Err(InvalidRequest::UnsupportedByProvider(
            "tool_choice \"none\" cannot be honoured by Bedrock Converse (it has no choice that forbids tool calls); omit tools instead".into(),
        ));
    }
    check_mcp_selection(spec, options)
}

/// A request may choose among the declared MCP servers, never reach another.
fn check_mcp_selection(
    spec: &AgentSessionSpec,
    options: &TurnOptions,
) -> Result<(), InvalidRequest> {
    for sel in options.mcp_servers.iter().flatten() {
        let Some(declared) = spec.mcp_servers().iter().find(|s| s.name == sel.label) else {
            return Err(InvalidRequest::UndeclaredMcpServer {
                label: sel.label.clone(),
                declared: spec.mcp_servers().iter().map(|s| s.name.clone()).collect(),
            });
        };
        if let Some(url) = &sel.url
            && declared.url.as_deref() != Some(url.as_str())
        {
            return Err(InvalidRequest::ForeignMcpUrl {
                url: url.clone(),
                label: sel.label.clone(),
            });
        }
    }
    Ok(())
}

impl super::Session {
    /// [`check_request`] against this session's spec.
    pub fn check_request(
        &self,
        input: &[Message],
        options: &TurnOptions,
    ) -> Result<(), InvalidRequest> {
        check_request(&self.live.spec, input, options)
    }
}
