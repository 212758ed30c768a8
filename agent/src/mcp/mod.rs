//! MCP tool servers of a session (`spec.tools.mcpServers`), reached with the official Rust
//! SDK (`rmcp`): streamable HTTP for a `url`, a child process over stdio for a `command`.
//!
//! A server is connected on first use and its tool list cached; a call that finds the
//! connection gone reconnects once, and a server that cannot be reached is not tried again
//! before a back-off (doubling up to [`MAX_BACKOFF`]) has passed, so a server that is down
//! costs a turn one clear tool error per call, not a connection attempt per call. Every
//! failure becomes the text of a tool error for the model; nothing here fails a turn.

pub mod summarizer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_crds::session::McpServerSpec;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, Tool};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::Value;
use tokio::sync::Mutex;

use crate::provider::ToolSpec;

/// Where each server's `headersFrom` Secret is read from, one file per header: the
/// directory `CAIRN_MCP_HEADERS_DIR_<NAME>` names (the operator sets one per server, at the
/// Secret's mount), else `DIR/<server>` under `CAIRN_MCP_HEADERS_DIR`, else under
/// [`DEFAULT_HEADERS_DIR`].
pub const HEADERS_DIR_ENV: &str = "CAIRN_MCP_HEADERS_DIR";
pub const DEFAULT_HEADERS_DIR: &str = "/var/run/cairn/mcp-headers";
/// Longest wait before a server that could not be reached is tried again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// Why an MCP call produced no result; the text the model gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error("MCP server {server:?} is unavailable: {reason}")]
    Unavailable { server: String, reason: String },
    #[error("MCP server {server:?} did not answer {what} within {secs}s (timeoutSeconds)")]
    Timeout {
        server: String,
        what: String,
        secs: u64,
    },
    #[error("MCP server {server:?} failed the call of {tool:?}: {reason}")]
    Call {
        server: String,
        tool: String,
        reason: String,
    },
    #[error(
        "the tool {tool:?} of MCP server {server:?} is not in its allowedTools; it was not called"
    )]
    NotAllowed { server: String, tool: String },
    #[error("the arguments of {tool:?} must be a JSON object: {reason}")]
    BadArguments { tool: String, reason: String },
}

impl McpError {
    /// Stable short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => "unavailable",
            Self::Timeout { .. } => "timeout",
            Self::Call { .. } => "call",
            Self::NotAllowed { .. } => "not_allowed",
            Self::BadArguments { .. } => "bad_arguments",
        }
    }
}

/// The answer of a tool: its text, and whether the server flagged it as an error
/// (`isError`), in which case it goes back to the model verbatim all the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutcome {
    pub text: String,
    pub is_error: bool,
}

type Client = RunningService<RoleClient, ()>;

#[derive(Default)]
struct Conn {
    client: Option<Arc<Client>>,
    /// Every tool the server listed (allowed or not).
    tools: Vec<Tool>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: Option<String>,
}

struct Server {
    spec: McpServerSpec,
    /// Where the `headersFrom` keys are, one file each.
    headers_dir: PathBuf,
    http: Arc<HttpClient>,
    conn: Mutex<Conn>,
}

/// A tool the model may call, and where it goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub server: String,
    /// The tool's name on its server.
    pub tool: String,
}

/// The MCP part of one turn's catalog.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct McpCatalog {
    pub specs: Vec<ToolSpec>,
    /// By the name offered to the model.
    pub routes: HashMap<String, Route>,
    /// Servers whose tools could not be listed, with why.
    pub unavailable: Vec<String>,
}

impl McpCatalog {
    pub fn route(&self, name: &str) -> Option<&Route> {
        self.routes.get(name)
    }
}

/// Why `url` cannot be reached at all (TLS, proxy, connect), if that is the trouble: rmcp's
/// error keeps only the transport's outer message, so one plain request to the same URL on
/// the same client names the cause. `None` when the server answers HTTP.
async fn transport_cause(http: &reqwest_mcp::Client, url: &str) -> Option<String> {
    match http.get(url).send().await {
        Ok(_) => None,
        Err(e) => Some(crate::net::error_chain(&e.without_url())),
    }
}

/// The MCP servers of a session.
pub struct McpHub {
    servers: Vec<Server>,
}

/// How a server over HTTP is reached: the agent's CA bundle and proxies.
type HttpClient = Result<reqwest_mcp::Client, String>;

impl McpHub {
    /// Servers of `specs`; the headers of a `headersFrom` Secret are read from
    /// `headers_root/<server>` when given, else as [`HEADERS_DIR_ENV`] says. Nothing is
    /// connected yet. Servers over HTTP are reached on `net` (trust and proxies).
    pub fn new(
        specs: &[McpServerSpec],
        headers_root: Option<PathBuf>,
        net: &crate::net::NetPath,
    ) -> Self {
        // One client for every HTTP server of the session; a path that cannot be used is
        // each such server's reason to be unavailable.
        let http: Arc<HttpClient> = Arc::new(net.mcp_client().map_err(|e| e.to_string()));
        let root = headers_root.clone().unwrap_or_else(|| {
            std::env::var_os(HEADERS_DIR_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_HEADERS_DIR))
        });
        Self {
            servers: specs
                .iter()
                .map(|s| {
                    let own = std::env::var_os(s.headers_dir_env())
                        .filter(|_| headers_root.is_none())
                        .map(PathBuf::from);
                    Server {
                        spec: s.clone(),
                        headers_dir: own.unwrap_or_else(|| root.join(&s.name)),
                        http: Arc::clone(&http),
                        conn: Mutex::new(Conn::default()),
                    }
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    pub fn specs(&self) -> impl Iterator<Item = &McpServerSpec> {
        self.servers.iter().map(|s| &s.spec)
    }

    fn server(&self, name: &str) -> Option<&Server> {
        self.servers.iter().find(|s| s.spec.name == name)
    }

    /// The tools of the servers named in `only` (all when `None`), connecting where needed.
    /// A tool keeps its own name unless an earlier server, a built-in or a reserved name
    /// took it; then it is offered as `<server>__<tool>`.
    pub async fn catalog(&self, only: Option<&[String]>, taken: &[&str]) -> McpCatalog {
        let chosen: Vec<&Server> = self
            .servers
            .iter()
            .filter(|s| only.is_none_or(|o| o.contains(&s.spec.name)))
            .collect();
        let listed = futures::future::join_all(chosen.iter().map(|s| s.tools())).await;
        let mut out = McpCatalog::default();
        for (server, tools) in chosen.into_iter().zip(listed) {
            let tools = match tools {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(server = %server.spec.name, error = %e, "MCP server: no tools this turn");
                    out.unavailable.push(e.to_string());
                    continue;
                }
            };
            // By name: a server's listing order is its own and may change from one listing
            // to the next; the catalog is part of the cached prompt prefix.
            let mut tools: Vec<_> = tools.iter().filter(|t| server.allows(&t.name)).collect();
            tools.sort_by(|a, b| a.name.cmp(&b.name));
            for t in tools {
                let mut name = t.name.to_string();
                if taken.contains(&name.as_str()) || out.routes.contains_key(&name) {
                    name = format!("{}__{}", server.spec.name, t.name);
                }
                out.specs.push(ToolSpec {
                    name: name.clone(),
                    description: t.description.as_deref().unwrap_or_default().to_owned(),
                    parameters: Value::Object((*t.input_schema).clone()),
                });
                out.routes.insert(
                    name,
                    Route {
                        server: server.spec.name.clone(),
                        tool: t.name.to_string(),
                    },
                );
            }
        }
        out
    }

    /// A tool of `server` that the server lists but its `allowedTools` leaves out.
    pub async fn refused(&self, name: &str) -> Option<McpError> {
        for s in &self.servers {
            let conn = s.conn.lock().await;
            if conn.tools.iter().any(|t| t.name == name) && !s.allows(name) {
                return Some(McpError::NotAllowed {
                    server: s.spec.name.clone(),
                    tool: name.to_owned(),
                });
            }
        }
        None
    }

    /// Calls `tool` of `server` with the model's JSON `arguments`.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: &str,
    ) -> Result<CallOutcome, McpError> {
        let Some(s) = self.server(server) else {
            return Err(McpError::Unavailable {
                server: server.to_owned(),
                reason: "not declared in spec.tools.mcpServers".into(),
            });
        };
        if !s.allows(tool) {
            return Err(McpError::NotAllowed {
                server: server.to_owned(),
                tool: tool.to_owned(),
            });
        }
        let args = parse_arguments(tool, arguments)?;
        s.call(tool, args).await
    }

    /// Calls a tool with arguments built by the agent (the `engine: mcp` compactor), with
    /// its own deadline instead of the server's `timeoutSeconds`.
    pub async fn call_with(
        &self,
        server: &str,
        tool: &str,
        args: serde_json::Map<String, Value>,
        timeout: Duration,
    ) -> Result<CallOutcome, McpError> {
        let Some(s) = self.server(server) else {
            return Err(McpError::Unavailable {
                server: server.to_owned(),
                reason: "not declared in spec.tools.mcpServers".into(),
            });
        };
        s.call_within(tool, args, timeout).await
    }
}

fn parse_arguments(
    tool: &str,
    arguments: &str,
) -> Result<serde_json::Map<String, Value>, McpError> {
    if arguments.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(other) => Err(McpError::BadArguments {
            tool: tool.to_owned(),
            reason: format!("got {}", kind_of(&other)),
        }),
        Err(e) => Err(McpError::BadArguments {
            tool: tool.to_owned(),
            reason: e.to_string(),
        }),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The text of a tool result as the model reads it: text blocks as they are, other blocks
/// as a short note (images and audio are not forwarded), structured content as JSON when
/// there is no text.
pub fn result_text(r: &CallToolResult) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in &r.content {
        match block {
            ContentBlock::Text(t) => parts.push(t.text.clone()),
            ContentBlock::Image(i) => parts.push(format!("[image {}]", i.mime_type)),
            ContentBlock::Audio(a) => parts.push(format!("[audio {}]", a.mime_type)),
            ContentBlock::Resource(r) => parts.push(
                serde_json::to_value(&r.resource)
                    .ok()
                    .and_then(|v| v.get("text").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| "[embedded resource]".into()),
            ),
            ContentBlock::ResourceLink(l) => parts.push(format!("[resource {}]", l.uri)),
            _ => parts.push("[content of a kind this agent does not read]".into()),
        }
    }
    if parts.is_empty()
        && let Some(s) = &r.structured_content
    {
        return s.to_string();
    }
    parts.join("\n")
}

impl Server {
    fn allows(&self, tool: &str) -> bool {
        match &self.spec.allowed_tools {
            None => true,
            Some(list) if list.is_empty() => true,
            Some(list) => list.iter().any(|t| t == tool),
        }
    }

    fn unavailable(&self, reason: impl Into<String>) -> McpError {
        McpError::Unavailable {
            server: self.spec.name.clone(),
            reason: reason.into(),
        }
    }

    fn timeout(&self, what: &str, d: Duration) -> McpError {
        McpError::Timeout {
            server: self.spec.name.clone(),
            what: what.to_owned(),
            secs: d.as_secs().max(1),
        }
    }

    /// The connected client, connecting (and listing the tools) when there is none and the
    /// back-off allows it.
    async fn client(&self, conn: &mut Conn) -> Result<Arc<Client>, McpError> {
        if let Some(c) = &conn.client {
            return Ok(Arc::clone(c));
        }
        if let Some(at) = conn.retry_at
            && Instant::now() < at
        {
            return Err(self.unavailable(format!(
                "{}; not retried for another {}s",
                conn.last_error
                    .as_deref()
                    .unwrap_or("it could not be reached"),
                at.saturating_duration_since(Instant::now())
                    .as_secs()
                    .max(1)
            )));
        }
        let timeout = self.spec.timeout();
        let result = match tokio::time::timeout(timeout, self.connect()).await {
            Ok(r) => r,
            Err(_) => Err(self.timeout("the connection and tool listing", timeout)),
        };
        match result {
            Ok((client, tools)) => {
                tracing::info!(server = %self.spec.name, tools = tools.len(), "MCP server connected");
                let client = Arc::new(client);
                conn.client = Some(Arc::clone(&client));
                conn.tools = tools;
                conn.failures = 0;
                conn.retry_at = None;
                conn.last_error = None;
                Ok(client)
            }
            Err(e) => {
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << conn.failures.min(6))
                    .min(MAX_BACKOFF);
                conn.failures += 1;
                conn.retry_at = Some(Instant::now() + backoff);
                conn.last_error = Some(e.to_string());
                tracing::warn!(server = %self.spec.name, error = %e, retry_in = backoff.as_secs(), "MCP server unreachable");
                Err(e)
            }
        }
    }

    async fn connect(&self) -> Result<(Client, Vec<Tool>), McpError> {
        let client = if let Some(url) = &self.spec.url {
            let headers = self.headers()?;
            let http = match self.http.as_ref() {
                Ok(c) => c.clone(),
                Err(e) => return Err(self.unavailable(e.clone())),
            };
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
            let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
            match ().serve(transport).await {
                Ok(client) => client,
                Err(e) => {
                    let why = transport_cause(&http, url)
                        .await
                        .unwrap_or_else(|| crate::net::error_chain(&e));
                    return Err(
                        self.unavailable(format!("cannot initialise a session at {url}: {why}"))
                    );
                }
            }
        } else if let Some(program) = &self.spec.command {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(self.spec.args.iter().flatten());
            // The server's stderr is its log: the agent's own stderr carries it.
            let transport = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .map(|(t, _)| t)
                .map_err(|e| self.unavailable(format!("cannot start {program:?}: {e}")))?;
            ().serve(transport)
                .await
                .map_err(|e| self.unavailable(format!("{program:?} did not initialise: {e}")))?
        } else {
            return Err(self.unavailable("neither url nor command is set"));
        };
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| self.unavailable(format!("cannot list its tools: {e}")))?;
        Ok((client, tools))
    }

    fn headers(&self) -> Result<HashMap<http::HeaderName, http::HeaderValue>, McpError> {
        let mut out = HashMap::new();
        let Some(secret) = &self.spec.headers_from else {
            return Ok(out);
        };
        let dir = &self.headers_dir;
        let entries = std::fs::read_dir(dir).map_err(|e| {
            self.unavailable(format!(
                "cannot read the headers of Secret {secret:?} from {}: {e}",
                dir.display()
            ))
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // The kubelet's projection keeps its bookkeeping in dot-entries.
            if name.starts_with('.') || !is_file(&entry.path()) {
                continue;
            }
            let value = std::fs::read_to_string(entry.path()).map_err(|e| {
                self.unavailable(format!(
                    "cannot read header {name:?} of Secret {secret:?}: {e}"
                ))
            })?;
            let header = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                self.unavailable(format!(
                    "key {name:?} of Secret {secret:?} is not an HTTP header name"
                ))
            })?;
            let value = http::HeaderValue::from_str(value.trim_end_matches(['\n', '\r'])).map_err(
                |_| {
                    self.unavailable(format!(
                        "key {name:?} of Secret {secret:?} is not a valid HTTP header value"
                    ))
                },
            )?;
            out.insert(header, value);
        }
        Ok(out)
    }

    async fn tools(&self) -> Result<Vec<Tool>, McpError> {
        let mut conn = self.conn.lock().await;
        self.client(&mut conn).await?;
        Ok(conn.tools.clone())
    }

    async fn call(
        &self,
        tool: &str,
        args: serde_json::Map<String, Value>,
    ) -> Result<CallOutcome, McpError> {
        self.call_within(tool, args, self.spec.timeout()).await
    }

    /// One call; a connection found closed is re-established once.
    async fn call_within(
        &self,
        tool: &str,
        args: serde_json::Map<String, Value>,
        timeout: Duration,
    ) -> Result<CallOutcome, McpError> {
        for attempt in 0..2 {
            let client = {
                let mut conn = self.conn.lock().await;
                self.client(&mut conn).await?
            };
            let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args.clone());
            let result = match tokio::time::timeout(timeout, client.call_tool(params)).await {
                Ok(r) => r,
                Err(_) => return Err(self.timeout(&format!("the call of {tool:?}"), timeout)),
            };
            match result {
                Ok(r) => {
                    return Ok(CallOutcome {
                        text: result_text(&r),
                        is_error: r.is_error.unwrap_or(false),
                    });
                }
                Err(e) if attempt == 0 && connection_lost(&e) => {
                    tracing::warn!(server = %self.spec.name, error = %e, "MCP connection lost; reconnecting once");
                    let mut conn = self.conn.lock().await;
                    if conn
                        .client
                        .as_ref()
                        .is_some_and(|c| Arc::ptr_eq(c, &client))
                    {
                        conn.client = None;
                    }
                }
                Err(e) => {
                    if connection_lost(&e) {
                        let mut conn = self.conn.lock().await;
                        conn.client = None;
                        conn.last_error = Some(e.to_string());
                    }
                    return Err(McpError::Call {
                        server: self.spec.name.clone(),
                        tool: tool.to_owned(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        Err(self.unavailable("the connection was lost twice"))
    }
}

fn is_file(p: &Path) -> bool {
    // Projected Secret keys are symlinks into a timestamped directory.
    std::fs::metadata(p).is_ok_and(|m| m.is_file())
}

/// The transport is gone (the process exited, the HTTP session ended): a new connection
/// may succeed where this one cannot.
fn connection_lost(e: &ServiceError) -> bool {
    matches!(
        e,
        ServiceError::TransportClosed | ServiceError::TransportSend(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(allowed: Option<Vec<&str>>) -> McpServerSpec {
        serde_json::from_value(serde_json::json!({
            "name": "fs",
            "command": "/nonexistent/mcp-server",
            "allowedTools": allowed,
        }))
        .expect("spec")
    }

    #[tokio::test]
    async fn a_server_that_cannot_start_is_a_clear_error_and_is_backed_off() {
        let hub = McpHub::new(
            &[spec(None)],
            Some(PathBuf::from("/nonexistent")),
            &Default::default(),
        );
        let e = hub.call("fs", "read_text_file", "{}").await.unwrap_err();
        assert!(matches!(e, McpError::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("cannot start"), "{e}");
        // Within the back-off nothing is started again, and the error says so.
        let e = hub.call("fs", "read_text_file", "{}").await.unwrap_err();
        assert!(e.to_string().contains("not retried for another"), "{e}");
        let cat = hub.catalog(None, &[]).await;
        assert!(cat.specs.is_empty());
        assert_eq!(cat.unavailable.len(), 1);
    }

    #[tokio::test]
    async fn tools_outside_allowed_tools_and_bad_arguments_are_refused_without_a_call() {
        let hub = McpHub::new(
            &[spec(Some(vec!["read_text_file"]))],
            None,
            &Default::default(),
        );
        let e = hub.call("fs", "write_file", "{}").await.unwrap_err();
        assert_eq!(e.label(), "not_allowed");
        assert!(e.to_string().contains("allowedTools"), "{e}");
        let e = hub.call("fs", "read_text_file", "[1]").await.unwrap_err();
        assert_eq!(e.label(), "bad_arguments");
        let e = hub.call("nope", "x", "{}").await.unwrap_err();
        assert!(e.to_string().contains("not declared"), "{e}");
    }
}
