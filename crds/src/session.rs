//! AgentSession: one LLM agent session, reconciled by the operator into one pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_derive::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::payload::{PayloadSize, PayloadSizeError};
use crate::policy::CompactionPolicySpec;
pub use crate::provider::{ProviderKind, SecretKeyRef};

/// An LLM agent session: which model it talks to, how large its context and its requests
/// may grow, and how it compacts. The operator runs it as a single pod; the agent in that pod
/// keeps the session alive through context overflows and proxy body-size limits.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "cairn.dev",
    version = "v1beta1",
    kind = "AgentSession",
    namespaced,
    shortname = "asess",
    category = "cairn",
    doc = "An LLM agent session run by cairn as one pod; see spec for its provider, context window, payload cap and compaction policy.",
    status = "AgentSessionStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider.kind"}"#,
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".spec.provider.model"}"#,
    printcolumn = r#"{"name":"Utilization","type":"number","format":"float","jsonPath":".status.session.utilization"}"#,
    printcolumn = r#"{"name":"Recoveries","type":"integer","jsonPath":".status.session.recoveries"}"#,
    printcolumn = r#"{"name":"Compactions","type":"integer","priority":1,"jsonPath":".status.session.compactions"}"#,
    printcolumn = r#"{"name":"Learned-Cap","type":"integer","priority":1,"jsonPath":".status.session.learnedPayloadCap"}"#,
    printcolumn = r#"{"name":"Policy","type":"string","priority":1,"jsonPath":".status.policyHash"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.systemPrompt) && has(self.systemPromptFrom))").message("set systemPrompt or systemPromptFrom, not both"))]
#[x_kube(validation = Rule::new("!has(self.maxOutputTokens) || !has(self.contextWindow) || self.maxOutputTokens < self.contextWindow").message("maxOutputTokens must be smaller than contextWindow"))]
pub struct AgentSessionSpec {
    /// The LLM provider and model this session talks to.
    pub provider: ProviderSpec,

    /// Context window of the model, in tokens. Default: the model catalog's value for
    /// `provider.model` (a per-family fallback for unknown models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1024 && self <= 100000000").message("contextWindow must be between 1024 and 100000000 tokens"))]
    pub context_window: Option<u64>,

    /// Largest reply, in tokens, requested from the model. Default: the model catalog's
    /// value for `provider.model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("maxOutputTokens must be positive"))]
    pub max_output_tokens: Option<u64>,

    /// Request-body ceiling of the network path to the provider (a corporate proxy, a WAF, an
    /// API gateway). Requests are kept below it. A string like `5MB`, `512KB`, `2.5MB`,
    /// `1048576B`, `5Mi`, or a bare number of megabytes. K, M and G are binary units
    /// (1 KB = 1024 bytes). Optional: without it the agent learns the cap from the first
    /// rejection (¾ of the rejected request's size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "payload_cap_schema")]
    pub payload_cap: Option<IntOrString>,

    /// System prompt of the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("size(self) <= 1048576").message("systemPrompt must be at most 1 MiB; use systemPromptFrom for larger prompts"))]
    pub system_prompt: Option<String>,

    /// System prompt read from a ConfigMap in the session's namespace (instead of
    /// `systemPrompt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt_from: Option<ConfigMapKeyRef>,

    /// A CompactionPolicy in the same namespace that this session uses. Optional: without it
    /// the built-in defaults apply (and `compaction` overrides them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_ref: Option<PolicyRef>,

    /// Inline overrides of the compaction policy; same shape as CompactionPolicy.spec.
    /// Precedence: built-in defaults ← policyRef ← compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionPolicySpec>,

    /// A cost budget: when the session's provider calls (the session model's and the
    /// summarizer's, at the model price table) reach it, the CostBudget condition turns False
    /// with a Warning Event, and with the policy's `onBudgetExceeded: suspend` the agent
    /// refuses new turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,

    /// Where the session's archive (originals of everything compacted) and journal live.
    /// Unset fields take the operator's configured defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveSpec>,

    /// True stops the session's pod; its journal and archive are kept, and setting it back
    /// to false resumes the session where it left off. Default: false.
    #[serde(default)]
    pub suspend: bool,

    /// Idle suspend: the operator stops the pod of a session nobody used for a while (journal
    /// and archive stay, as with suspend) and starts it again when a request for it arrives
    /// at the gateway. Absent: never suspended for being idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleSpec>,

    /// Overrides for the session's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodOverrides>,

    /// Tools the agent runs for the model inside a turn, beside its built-in `recall` and
    /// `compress` and the function tools an API client declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolsSpec>,

    /// Who may reach the session's API directly, beside the gateway. Absent: the gateway,
    /// the pods of the namespace labelled `cairn.dev/client: "true"` and the operator's
    /// monitoring namespace only; never another session's agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<SessionNetwork>,
}

/// Direct clients of the session's agent.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct SessionNetwork {
    /// Pods of the session's namespace admitted to the agent's port (its own NetworkPolicy,
    /// `cairn-NAME`), beside those every session admits. They still need the session's
    /// token. An empty selector (`{}`) admits every pod of the namespace, other sessions'
    /// agents included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<LabelSelector>,
}

/// When an unused session is suspended.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct IdleSpec {
    /// How long the session may go without client work (a turn, a compaction, a rewind;
    /// status.session.lastActivity) before its pod is stopped: a duration like `30s`, `15m`
    /// or `1h30m`. Counted from the later of the last activity, the pod's start and the last
    /// wake-up. The agent reports when this much time passed without client work
    /// (status.session.idleSince) and the pod is stopped then; without that report (an agent
    /// that does not send it) the operator waits one status interval (30 s by default) more,
    /// which is how stale its view of the last activity can be. Absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(h|m|s))+$') && size(self) <= 32").message("idle.suspendAfter must be a duration like 30s, 15m or 1h30m"))]
    #[x_kube(validation = Rule::new("!self.matches('^(0+(h|m|s))+$')").message("idle.suspendAfter must be longer than 0s"))]
    pub suspend_after: Option<String>,
}

/// Annotation by which the gateway asks the operator to wake an idle-suspended session: an
/// RFC 3339 UTC time, newer than the suspension.
pub const WAKE_ANNOTATION: &str = "cairn.dev/wake-requested-at";

/// The digest of a session's API token published as `status.apiTokenHash`:
/// `sha256:<hex>` of a domain tag, the session's namespace and name (the salt: one token
/// digest is never another session's) and the token, NUL-separated. One home for the
/// operator that writes it and the gateway that compares against it.
pub fn api_token_hash(namespace: &str, name: &str, token: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in ["cairn.dev/api-token-v1", namespace, name, token] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// A duration of the form `1h30m`, `15m`, `30s` (the shape `idle.suspendAfter` is validated
/// against); `None` for anything else or an overflow.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in text.chars() {
        match c {
            '0'..='9' => digits.push(c),
            'h' | 'm' | 's' if !digits.is_empty() => {
                let n: u64 = digits.parse().ok()?;
                let unit = match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                total = total.checked_add(n.checked_mul(unit)?)?;
                digits.clear();
            }
            _ => return None,
        }
    }
    (digits.is_empty() && !text.is_empty()).then(|| std::time::Duration::from_secs(total))
}

/// Server-side tools of a session.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ToolsSpec {
    /// MCP (Model Context Protocol) servers the agent connects to. Their tools are offered
    /// to the model; the agent runs the calls the model makes and keeps each result in the
    /// history as a tool message (compacted and archived like any other).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.all(a, self.exists_one(b, b.name == a.name))").message("tools.mcpServers names must be unique"))]
    pub mcp_servers: Vec<McpServerSpec>,
}

/// One MCP server: reached over streamable HTTP at `url`, or launched by the agent as a
/// child process speaking MCP over stdio (`command` and `args`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.url) != has(self.command)").message("an mcpServers entry needs exactly one of url (streamable HTTP) or command (stdio)"))]
#[x_kube(validation = Rule::new("!has(self.args) || has(self.command)").message("mcpServers args are only for a command (stdio) server"))]
#[x_kube(validation = Rule::new("!has(self.headersFrom) || has(self.url)").message("mcpServers headersFrom is only for a url (streamable HTTP) server"))]
pub struct McpServerSpec {
    /// Name of the server, unique in the session: used in logs, metrics, tool errors, the
    /// Responses API's `server_label` and the policy's `engineServer`.
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$')").message("mcpServers name must be 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit"))]
    pub name: String,

    /// Endpoint of a streamable HTTP server, e.g. `https://tools.example.com/mcp`. Must be
    /// an http(s) URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s]+$')").message("mcpServers url must be an http:// or https:// URL"))]
    pub url: Option<String>,

    /// Program of a stdio server the agent launches (it must be in the agent's image, or
    /// on the PATH of a standalone agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub command: Option<String>,

    /// Arguments of `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(max = 4096)))]
    pub args: Option<Vec<String>>,

    /// A Secret in the session's namespace whose keys become HTTP headers of every request
    /// to the server (e.g. a key `Authorization` holding `Bearer ...`). Only this
    /// session's pod mounts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("mcpServers headersFrom must be a valid Secret name"))]
    pub headers_from: Option<String>,

    /// Tools of the server offered to the model. Empty or absent: all of them. A call of
    /// any other tool is refused with a tool error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(max = 128)))]
    pub allowed_tools: Option<Vec<String>>,

    /// Longest one call (connecting, listing or running a tool) may take before it fails
    /// with a tool error. Default: 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3600").message("mcpServers timeoutSeconds must be between 1 and 3600"))]
    pub timeout_seconds: Option<u32>,
}

/// `mcpServers[].timeoutSeconds` when a server sets none.
pub const DEFAULT_MCP_TIMEOUT_SECONDS: u32 = 30;

impl McpServerSpec {
    /// The environment variable that names the directory holding this server's headers
    /// (one file per `headersFrom` key): `CAIRN_MCP_HEADERS_DIR_<NAME>`, the name upper-cased
    /// with `-` as `_` (unique, as names have no `_`).
    pub fn headers_dir_env(&self) -> String {
        format!(
            "CAIRN_MCP_HEADERS_DIR_{}",
            self.name.to_ascii_uppercase().replace('-', "_")
        )
    }

    /// The call timeout of this server.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(
            self.timeout_seconds.unwrap_or(DEFAULT_MCP_TIMEOUT_SECONDS),
        ))
    }
}

impl AgentSessionSpec {
    /// The declared MCP servers.
    pub fn mcp_servers(&self) -> &[McpServerSpec] {
        self.tools
            .as_ref()
            .map_or(&[], |t| t.mcp_servers.as_slice())
    }
}

/// The provider endpoint a session talks to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.kind != 'bedrock' || has(self.region)").message("provider.region is required when provider.kind is bedrock"))]
#[x_kube(validation = Rule::new("self.kind != 'openai-compatible' || has(self.baseUrl)").message("provider.baseUrl is required when provider.kind is openai-compatible"))]
pub struct ProviderSpec {
    /// API family: `openai` (Chat Completions), `openai-responses`, `anthropic`, `gemini`,
    /// `bedrock` (Converse) or `openai-compatible` (xAI, Mistral, Groq, DeepSeek,
    /// OpenRouter, vLLM, Ollama, ... through `baseUrl`).
    pub kind: ProviderKind,

    /// Model name as the provider spells it, e.g. `claude-sonnet-4-5` or `gpt-5`.
    #[x_kube(validation = Rule::new("size(self) > 0 && size(self) <= 256").message("provider.model must be 1 to 256 characters"))]
    pub model: String,

    /// Endpoint override: a proxy, an API gateway, a self-hosted server or the simulator.
    /// Must be an http(s) URL. Default: the provider's public endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s]+$') && size(self) <= 2048").message("provider.baseUrl must be an http:// or https:// URL"))]
    pub base_url: Option<String>,

    /// Secret (in the session's namespace) holding the provider API key. Optional for
    /// openai-compatible endpoints that need none, and for Bedrock with ambient AWS
    /// credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SecretKeyRef>,

    /// AWS region; required for `bedrock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9-]{2,32}$')").message("provider.region must look like us-east-1"))]
    pub region: Option<String>,

    /// Extra certificate authorities (PEM) the agent trusts, beside the platform's and the
    /// bundled public roots: the CA of a TLS-inspecting proxy on the way to the provider, S3
    /// or an MCP server (one bundle serves all of the agent's connections). A ConfigMap or a
    /// Secret key in the session's namespace, mounted into the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleRef>,
}

/// A PEM bundle in a ConfigMap or a Secret of the session's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.configMapName) != has(self.secretName)").message("provider.caBundle needs exactly one of configMapName and secretName"))]
pub struct CaBundleRef {
    /// ConfigMap holding the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("caBundle.configMapName must be a valid ConfigMap name"))]
    pub config_map_name: Option<String>,
    /// Secret holding the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("caBundle.secretName must be a valid Secret name"))]
    pub secret_name: Option<String>,
    /// Key of the bundle. Default: `ca.crt`.
    #[serde(default = "default_ca_key")]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]{1,253}$')").message("caBundle.key must be a valid ConfigMap or Secret key"))]
    pub key: String,
}

fn default_ca_key() -> String {
    "ca.crt".into()
}

/// Forward proxies of the agent's outbound connections (provider, S3, MCP), as the
/// `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` variables define them. Each field set here
/// replaces the operator's fleet-wide one.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ProxySettings {
    /// Proxy of `https://` endpoints (a CONNECT tunnel), e.g. `http://proxy.corp:3128`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s]+$') && size(self) <= 2048").message("proxy.httpsProxy must be an http:// or https:// URL"))]
    pub https_proxy: Option<String>,
    /// Proxy of `http://` endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s]+$') && size(self) <= 2048").message("proxy.httpProxy must be an http:// or https:// URL"))]
    pub http_proxy: Option<String>,
    /// Hosts reached directly, comma-separated (`.corp.example,10.0.0.0/8,localhost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("size(self) <= 4096 && !self.matches('\\\\s')").message("proxy.noProxy must be a comma-separated host list without spaces"))]
    pub no_proxy: Option<String>,
}

/// A key of a ConfigMap in the session's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// Name of the ConfigMap.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("configMapName must be a valid ConfigMap name"))]
    pub config_map_name: String,
    /// Key within the ConfigMap.
    #[x_kube(validation = Rule::new("size(self) > 0 && size(self) <= 253").message("key must be 1 to 253 characters"))]
    pub key: String,
}

/// Reference to a CompactionPolicy in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct PolicyRef {
    /// Name of the CompactionPolicy.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("policyRef.name must be a valid object name"))]
    pub name: String,
}

/// S3-compatible storage of the session's archive and journal. Objects live under
/// `<prefix>/<namespace>/<session>/ccr/` and `.../journal/`; in a cluster `<prefix>` is the
/// operator's root, the same for every session, so no session can reach into another's.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ArchiveSpec {
    /// Bucket name. Default: the operator's configured bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$')").message("archive.bucket must be a valid S3 bucket name"))]
    pub bucket: Option<String>,
    /// Key prefix inside the bucket, for standalone agents (`cairn-agent --config`). Not
    /// settable on an AgentSession: there the operator's configured prefix (`cairn`) is the
    /// root of every session, so one session's prefix can never alias another's objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("size(self) <= 512 && !self.startsWith('/') && !self.contains('..')").message("archive.prefix must be at most 512 characters, relative, without '..'"))]
    #[x_kube(validation = Rule::new("false").message("archive.prefix cannot be set on an AgentSession: every session's objects live under the operator's archive prefix as <prefix>/<namespace>/<session>/ (the field is for standalone agent config files)"))]
    pub prefix: Option<String>,
    /// S3 endpoint URL (MinIO, Garage, Ceph, ...). Default: the operator's configured
    /// endpoint, else AWS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s]+$') && size(self) <= 2048").message("archive.endpoint must be an http:// or https:// URL"))]
    pub endpoint: Option<String>,
    /// S3 region. Default: the operator's configured region (`us-east-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("size(self) > 0 && size(self) <= 64").message("archive.region must be 1 to 64 characters"))]
    pub region: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), needed by most self-hosted stores.
    /// Default: the operator's configured value (true when an endpoint is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
    /// Secret holding the S3 access key pair. Default: the operator's scoped credentials
    /// (minted for this session's prefix only) when it mints them, else its configured Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<S3CredentialsRef>,
    /// Accept a static key pair that other sessions hold too (the operator's default Secret,
    /// or a `credentials` Secret another session of the namespace names): each of those pods
    /// can then read, overwrite and delete the others' archive and journal. Without it such a
    /// session still runs, with `ArchiveCredentials=False/SharedArchiveCredentials` and a
    /// Warning Event; with it the condition still says the credentials are shared
    /// (`SharedArchiveCredentialsAccepted`). Changes nothing with scoped credentials.
    /// Default: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_credentials: Option<bool>,
    /// Keep the archive and journal when the AgentSession is deleted. False purges the
    /// session's S3 prefix on delete. Default: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_on_delete: Option<bool>,
    /// Size of the pod-local archive cache (a Kubernetes quantity, e.g. `256Mi`).
    /// Default: 256Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(Ki|Mi|Gi|K|M|G)?$')").message("archive.localCacheSize must be a quantity like 256Mi"))]
    pub local_cache_size: Option<String>,
    /// How long entries stay in the pod-local cache (a duration like `168h` or `30m`).
    /// S3 keeps them regardless. Default: 168h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(h|m|s))+$')").message("archive.ttl must be a duration like 168h, 30m or 1h30m"))]
    pub ttl: Option<String>,
    /// Archive writes (or reads) one compaction pass keeps in flight at once; the pass
    /// still applies its edits only after every original is stored. 1 writes them one
    /// after another. Default: 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 256").message("archive.maxInFlight must be between 1 and 256"))]
    pub max_in_flight: Option<u32>,
}

/// `archive.maxInFlight` when the session sets none: where more in flight stopped helping in
/// the S3 benchmark (the ~300 originals of a first compaction of a 4 MiB history at 20 ms per
/// request: 367 ms at 32, 283 ms at 64, 282 ms at 128; docs/benchmarks.md). A pass opens up to
/// this many connections to the store at once.
pub const DEFAULT_ARCHIVE_MAX_IN_FLIGHT: u32 = 64;

/// Keys of a Secret holding S3 credentials.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct S3CredentialsRef {
    /// Name of the Secret, in the session's namespace.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("credentials.secretName must be a valid Secret name"))]
    pub secret_name: String,
    /// Key holding the access key id. Default: `AWS_ACCESS_KEY_ID`.
    #[serde(default = "default_access_key_key")]
    pub access_key_id_key: String,
    /// Key holding the secret access key. Default: `AWS_SECRET_ACCESS_KEY`.
    #[serde(default = "default_secret_key_key")]
    pub secret_access_key_key: String,
}

/// Key of the session token in an S3 credentials Secret holding temporary credentials (the
/// operator's scoped mode writes it beside the key pair).
pub const S3_SESSION_TOKEN_KEY: &str = "AWS_SESSION_TOKEN";
/// Key of the instant temporary S3 credentials expire at (RFC 3339, UTC).
pub const S3_EXPIRATION_KEY: &str = "AWS_CREDENTIAL_EXPIRATION";

/// `<prefix>/<namespace>/<session>/`: every object of one session (archive and journal)
/// lives under this key prefix. The one spelling of the layout: the agent's store, the
/// operator's purge and the operator's scoped session policy all call it, so the prefix a
/// session's credentials are scoped to is the prefix its agent writes to.
pub fn archive_root(prefix: &str, namespace: &str, session: &str) -> String {
    let base = prefix.trim_matches('/');
    if base.is_empty() {
        format!("{namespace}/{session}/")
    } else {
        format!("{base}/{namespace}/{session}/")
    }
}

fn default_access_key_key() -> String {
    "AWS_ACCESS_KEY_ID".into()
}

fn default_secret_key_key() -> String {
    "AWS_SECRET_ACCESS_KEY".into()
}

/// Overrides for the session's pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Agent container image. Default: the operator's configured agent image. Changing it
    /// replaces the pod (the session continues from its journal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("size(self) > 0 && size(self) <= 1024").message("template.image must be 1 to 1024 characters"))]
    pub image: Option<String>,
    /// Resource requests and limits of the agent container. Default: the operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node selector of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations of the pod. Replace the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Extra annotations on the pod (over the operator's defaults, key by key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Extra labels on the pod (over the operator's defaults, key by key). The operator's own
    /// labels, which select the pod, cannot be set here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!('app.kubernetes.io/name' in self) && !('app.kubernetes.io/instance' in self) && !('app.kubernetes.io/managed-by' in self) && !('cairn.dev/session' in self)").message("template.labels cannot set app.kubernetes.io/name, app.kubernetes.io/instance, app.kubernetes.io/managed-by or cairn.dev/session: the operator sets them and selects the pod by them"))]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations on the session's ServiceAccount, e.g. `eks.amazonaws.com/role-arn` for
    /// IRSA. Keys the operator's defaults set are the operator's (a session cannot point its
    /// identity at another role); the rest are added. In values, `{namespace}` and
    /// `{session}` are replaced by the session's namespace and name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_annotations: Option<BTreeMap<String, String>>,
    /// Pull secrets of the pod (Secrets of the session's namespace), added to the operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Affinity of the pod. Replaces the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Topology spread constraints of the pod. Replace the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// PriorityClass of the pod. Replaces the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("template.priorityClassName must be a valid PriorityClass name"))]
    pub priority_class_name: Option<String>,
    /// RuntimeClass of the pod (e.g. gVisor or Kata), when the operator sets none (a
    /// sandbox the platform chose is not the session's to leave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("template.runtimeClassName must be a valid RuntimeClass name"))]
    pub runtime_class_name: Option<String>,
    /// Forward proxies of this session's agent (each field replaces the operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySettings>,
    /// Extra environment of the agent container (values, or `valueFrom` a ConfigMap of the
    /// session's namespace or a field of the pod; not from Secrets). `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` here
    /// set the session's proxies like `proxy` does (`proxy` wins where both are set). Names
    /// the operator sets itself are refused: `CAIRN_*`, `AWS_*`, `OTEL_*`, `HOME`,
    /// `XDG_DATA_HOME` and the provider key variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new(RESERVED_ENV_RULE).message("template.env cannot set CAIRN_*, AWS_*, OTEL_*, HOME, XDG_DATA_HOME or a provider key variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY): the operator sets them"),
        validation = Rule::new("self.all(e, !has(e.valueFrom) || !has(e.valueFrom.secretKeyRef))").message("template.env cannot read Secrets (valueFrom.secretKeyRef): name credentials in the spec's credentials fields, whose Secrets the operator grants to this session only")
    )]
    #[schemars(schema_with = "env_schema")]
    pub env: Option<Vec<EnvVar>>,
    /// Seconds the pod is given to stop (the pod's `terminationGracePeriodSeconds`). On
    /// SIGTERM the agent lets a turn in flight run until 5 s before this ends, then aborts
    /// it (not acknowledged, its input dropped), flushes the journal and releases the Lease.
    /// Default: 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 3600").message("template.terminationGracePeriodSeconds must be between 10 and 3600"))]
    pub termination_grace_period_seconds: Option<u32>,
}

/// The CEL rule of `template.env`: no name the operator sets itself.
const RESERVED_ENV_RULE: &str = "self.all(e, !e.name.startsWith('CAIRN_') && !e.name.startsWith('AWS_') && !e.name.startsWith('OTEL_') && !(e.name in ['HOME', 'XDG_DATA_HOME', 'OPENAI_API_KEY', 'ANTHROPIC_API_KEY', 'GEMINI_API_KEY']))";

/// `template.env`: Kubernetes `EnvVar`s, a list keyed by name (so a name appears once).
fn env_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<EnvVar>>();
    let obj = schema.ensure_object();
    obj.insert("x-kubernetes-list-type".into(), "map".into());
    obj.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["name"]),
    );
    obj.insert("maxItems".into(), 64.into());
    // Bounds the CEL rule's cost for the API server (names are C identifiers in practice).
    if let Some(name) = obj
        .get_mut("items")
        .and_then(|i| i.get_mut("properties"))
        .and_then(|p| p.get_mut("name"))
        .and_then(|n| n.as_object_mut())
    {
        name.insert("maxLength".into(), 256.into());
    }
    schema
}

/// `template.terminationGracePeriodSeconds` when the session sets none.
pub const DEFAULT_TERMINATION_GRACE_SECONDS: u32 = 60;

/// Observed state, written by the operator (phase, conditions, pod) and by the agent
/// (`session`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentSessionStatus {
    /// Pending, Running, Suspended, Degraded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The metadata.generation the operator last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, PolicyResolved, ArchiveReady and friends, as metav1.Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Name of the session's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// In-cluster URL of the session's HTTP API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_url: Option<String>,
    /// Hash of the effective compaction policy (built-in defaults ← policyRef ←
    /// compaction); changes whenever the policy the agent runs with changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<String>,
    /// Salted digest of the session's API bearer token ([`api_token_hash`]), written by the
    /// operator so that the gateway checks a presented token without reading the Secret.
    /// The token is 256 random bits: its digest reveals nothing usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_token_hash: Option<String>,
    /// Live counters reported by the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionStats>,
}

/// Lifecycle phase of a session.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Pending,
    Running,
    Suspended,
    Degraded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Suspended => "Suspended",
            Self::Degraded => "Degraded",
            Self::Failed => "Failed",
        }
    }
}

/// Counters the agent reports about its session.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SessionStats {
    /// Completed turns.
    #[serde(default)]
    pub turns: u64,
    /// Messages currently in the history.
    #[serde(default)]
    pub messages: u64,
    /// Weight of the current history in bytes (content, tool calls, images, system parts).
    #[serde(default)]
    pub history_bytes: u64,
    /// Estimated tokens of the current history.
    #[serde(default)]
    pub context_tokens: u64,
    /// contextTokens / contextWindow, between 0 and 1.
    #[serde(default)]
    pub utilization: f64,
    /// Request-size cap learned from a payload rejection, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_payload_cap: Option<u64>,
    /// Context window in tokens the model server itself named (in an overflow error, or by
    /// filling the context during generation), when it is smaller than the configured one.
    /// Only tightens; forgotten when spec.contextWindow or the model changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_context_window: Option<u64>,
    /// The context window requests are budgeted against: the configured one, or the learned
    /// one when smaller.
    #[serde(default)]
    pub effective_context_window: u64,
    /// Bytes per token of this session's content as the model server counts it (starts at
    /// 4; each reply's usage and each overflow error's own count calibrate it).
    #[serde(default)]
    pub bytes_per_token: f64,
    /// Replies cut short without a fix: the context filled during generation, or the output
    /// limit was already the model's maximum.
    #[serde(default)]
    pub truncated_replies: u64,
    /// Compactions run (all levels).
    #[serde(default)]
    pub compactions: u64,
    /// Level-3 (emergency truncation) compactions run.
    #[serde(default)]
    pub level3_compactions: u64,
    /// Recovery attempts run after classified failures.
    #[serde(default)]
    pub recoveries: u64,
    /// The most recent recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recovery: Option<LastRecovery>,
    /// Archive usage of the session.
    #[serde(default)]
    pub archive: ArchiveStats,
    /// The agent's latest check that the archive answers (the operator's ArchiveReady
    /// condition follows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_check: Option<ArchiveCheck>,
    /// Token usage reported by the provider.
    #[serde(default)]
    pub tokens: TokenStats,
    /// Messages the cheap compaction passes changed over the session's life.
    #[serde(default)]
    pub passes: PassStats,
    /// What the level-2 summarizer's summaries came to over the session's life.
    #[serde(default)]
    pub summaries: SummaryStats,
    /// Compression of tool results as they entered the history (and by the `compress`
    /// tool), per strategy, and how often the model's `recall` found what it asked for.
    #[serde(default)]
    pub compression: CompressionStats,
    /// Tool calls the model made since the agent started, by who runs them.
    #[serde(default)]
    pub tool_calls: ToolCallStats,
    /// Where the context headroom of the next request stands against the policy's buffers
    /// (the operator's ContextHeadroom condition and its Events follow it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom: Option<HeadroomReport>,
    /// Settings of the spec or its effective policy that this agent does not honour, each
    /// with what it does instead (the operator's PolicySupported condition follows it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<UnsupportedSetting>,
    /// When the agent last started or finished work for a client (a turn, a compaction, a
    /// rewind; never a health or metrics probe), RFC 3339 UTC. The operator's idle suspend
    /// (spec.idle.suspendAfter) counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<String>,
    /// Set by the agent when it saw no client activity for spec.idle.suspendAfter since
    /// this time (its lastActivity), RFC 3339 UTC; written at once, outside the status
    /// interval, and cleared by the write that reports the next activity. The operator
    /// suspends on it without waiting for the throttled report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<String>,

    /// What the session's provider calls cost in USD by the model price table (the catalog's,
    /// or the fleet's ConfigMap), the session model's and the summarizer's apart.
    #[serde(default, rename = "costUSD", skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<CostStats>,

    /// The session memory (compaction.memory), when it is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,

    /// What compactions kept in sight of what they replaced (journaled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_quality: Option<CompactionQuality>,
}

/// What compactions kept in sight, over the session's life (journaled). A compaction puts
/// at stake the files, commands and errors of the messages it replaces or removes, and the
/// user's requests among them; an artifact is in sight when the compacted history still
/// shows its text (in a kept message, a summary or the artifact ledger). What is not in sight
/// stays recallable through the stand-in's `<<ccr:KEY>>` markers.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompactionQuality {
    /// The newest compaction that replaced or removed messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<CompactionScore>,
    /// Compactions scored.
    #[serde(default)]
    pub scored: u64,
    /// Scores weighted toward the newest: each compaction's score moves it a fifth of the
    /// way (the first sets it).
    #[serde(default)]
    pub rolling: f64,
    /// The lowest score of any compaction.
    #[serde(default)]
    pub lowest: f64,
    /// Compactions whose best attempt stayed below `compaction.quality.minScore`.
    #[serde(default)]
    pub below_min_score: u64,
}

impl CompactionQuality {
    /// Nothing scored and nothing below the threshold yet: not worth reporting.
    pub fn is_empty(&self) -> bool {
        self.scored == 0 && self.below_min_score == 0
    }

    /// Counts `score` in.
    pub fn record(&mut self, score: CompactionScore) {
        let s = score.score;
        if self.scored == 0 {
            self.rolling = s;
            self.lowest = s;
        } else {
            self.rolling += (s - self.rolling) / 5.0;
            self.lowest = self.lowest.min(s);
        }
        self.scored += 1;
        self.last = Some(score);
    }
}

/// One compaction's score: per category, the artifacts at stake and those still in sight.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompactionScore {
    /// Mean of `inSight / atStake` over the categories with something at stake (1 when
    /// nothing was).
    pub score: f64,
    /// Highest ladder level that ran (0: the cheap passes only).
    #[serde(default)]
    pub level: u8,
    /// Files named by the replaced tool calls' arguments.
    #[serde(default)]
    pub files: InSight,
    /// Commands the replaced tool calls ran.
    #[serde(default)]
    pub commands: InSight,
    /// Error lines of the replaced tool results.
    #[serde(default)]
    pub errors: InSight,
    /// The user's requests among the replaced messages.
    #[serde(default)]
    pub requests: InSight,
}

impl CompactionScore {
    /// The categories by their stable label (`files`, `commands`, `errors`, `requests`), in
    /// that order: one list for Events, metrics and the inspector.
    pub fn categories(&self) -> [(&'static str, InSight); 4] {
        [
            ("files", self.files),
            ("commands", self.commands),
            ("errors", self.errors),
            ("requests", self.requests),
        ]
    }

    /// Something at stake is no longer in sight (only recallable through a marker).
    pub fn lost_sight(&self) -> bool {
        self.categories()
            .iter()
            .any(|(_, c)| c.in_sight < c.at_stake)
    }
}

/// Artifacts of one category a compaction put at stake, and how many stay in sight.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InSight {
    /// Artifacts of this category in the messages the compaction replaced or removed.
    pub at_stake: u64,
    /// Of those, the ones the compacted history still shows.
    pub in_sight: u64,
}

/// The session memory: how fresh it is and what waits to be absorbed.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// Version of the memory (0: none yet); each successful update adds one.
    #[serde(default)]
    pub version: u64,
    /// When the memory was last updated, RFC 3339 UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// Seconds since the last update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<u64>,
    /// The turn the last update covered.
    #[serde(default)]
    pub covered_turn: u64,
    /// Turns since the last update.
    #[serde(default)]
    pub turns_behind: u64,
    /// Messages of the current history the memory covers (from its start).
    #[serde(default)]
    pub covered_messages: u64,
    /// Bytes of the memory's text.
    #[serde(default)]
    pub bytes: u64,
    /// Archive key of the memory's text (recallable as <<ccr:KEY>>).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Segments removed by compactions that the memory has not absorbed yet.
    #[serde(default)]
    pub queue_segments: u64,
    /// Messages in those segments.
    #[serde(default)]
    pub queue_messages: u64,
    /// An update is running.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub updating: bool,
    /// Updates that succeeded since the agent started.
    #[serde(default)]
    pub updates: u64,
    /// Updates that failed since the agent started (logged, and told as a notice).
    #[serde(default)]
    pub failures: u64,
    /// Why the latest update failed, until one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Compactions that replaced history with the memory, with no summarizer call.
    #[serde(default)]
    pub compactions_from_memory: u64,
}

/// A session's cost budget.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct BudgetSpec {
    /// Most the session may cost, in USD (status.session.costUSD.total). Unset: no budget.
    #[serde(
        default,
        rename = "maxCostUSD",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self > 0.0").message("maxCostUSD must be positive"))]
    pub max_cost_usd: Option<f64>,
}

/// The cost of a session's provider calls in USD.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CostStats {
    /// Session model plus summarizer.
    #[serde(default)]
    pub total: f64,
    /// The session model's replies.
    #[serde(default)]
    pub session: f64,
    /// The level-2 summarizer's calls.
    #[serde(default)]
    pub summarizer: f64,
    /// Models the price table has no prices for: their calls are not in the cost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unpriced: Vec<String>,
    /// spec.budget.maxCostUSD, when set.
    #[serde(default, rename = "maxUSD", skip_serializing_if = "Option::is_none")]
    pub max_usd: Option<f64>,
    /// The total reached the budget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub budget_exceeded: bool,
    /// What crossing the budget does (the policy's onBudgetExceeded: warn or suspend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_budget_exceeded: Option<String>,
}

/// Default of the agent's status interval (`CAIRN_STATUS_INTERVAL_SECS`): `status.session`
/// is written at most once per this many seconds while the session is in use, never while
/// it is idle; the counters a dashboard follows closely are in the agent's `/metrics`.
pub const DEFAULT_STATUS_INTERVAL_SECONDS: u64 = 30;

/// What the cheap passes did (counted over the session's life, journaled).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PassStats {
    /// Old tool results truncated or summarized by microcompact.
    #[serde(default)]
    pub microcompacted: u64,
    /// Repeated reads replaced by a reference to the newer one.
    #[serde(default)]
    pub deduplicated: u64,
    /// Tool results cut to the per-result or per-turn budget in a request.
    #[serde(default)]
    pub tool_results_cut: u64,
}

/// Level-2 summaries over the session's life (journaled). A summary the quality gate rejects
/// (twice in one compaction) or a summarizer call that fails backs level 2 off: the next
/// 1, 2, 4, then 8 compactions go from level 1 straight to level 3, until a summary passes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SummaryStats {
    /// Summaries that passed the quality gate and replaced their segment.
    #[serde(default)]
    pub accepted: u64,
    /// Compactions whose summaries the gate rejected (both tries).
    #[serde(default)]
    pub rejected: u64,
    /// Summarizer calls that failed (a provider error, a window too small, the archive
    /// refusing the segment).
    #[serde(default)]
    pub failed: u64,
    /// Compactions that skipped level 2 (backed off after a rejection or a failure, or
    /// after a summary that did not bring the history under budget).
    #[serde(default)]
    pub skipped: u64,
    /// Why the newest rejected summary was rejected (`missing_sections`, `too_short`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rejection: Option<String>,
}

/// Tool calls since the agent started.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallStats {
    /// Calls of the session's built-in tools (`recall`, `compress`, ...), run by the agent.
    #[serde(default)]
    pub builtin: u64,
    /// Calls of MCP servers' tools, run by the agent.
    #[serde(default)]
    pub mcp: u64,
    /// Calls of the client's own function tools, handed back to the client to run.
    #[serde(default)]
    pub client: u64,
}

/// Compression since the agent started.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompressionStats {
    /// By strategy: `log`, `search`, `diff`, `json`, `code`, `prose`, `ceiling` (results cut
    /// to compression.maxResultBytes) and `none` (no strategy ran).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub strategies: std::collections::BTreeMap<String, CompressionStrategyStats>,
    /// Keys the model's recall calls found in the archive.
    #[serde(default)]
    pub recall_found: u64,
    /// Keys the model's recall calls asked for that the archive did not hold.
    #[serde(default)]
    pub recall_missing: u64,
    /// recallFound / (recallFound + recallMissing), when the model recalled anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall_hit_rate: Option<f64>,
}

/// Totals of one compression strategy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompressionStrategyStats {
    /// Results that came out smaller (originals archived first).
    #[serde(default)]
    pub compressed: u64,
    /// Results left byte-identical.
    #[serde(default)]
    pub unchanged: u64,
    /// Bytes of the results as the tools produced them.
    #[serde(default)]
    pub bytes_in: u64,
    /// Bytes of the results as they entered the history.
    #[serde(default)]
    pub bytes_out: u64,
}

/// A setting the running agent cannot honour.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnsupportedSetting {
    /// The field, as a path in the effective policy or the spec (e.g. `engine`).
    pub field: String,
    /// Why it is not honoured and what the agent does instead.
    pub reason: String,
}

/// The headroom the next request would leave in the context window.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeadroomReport {
    /// Ok, Warning (at or below autoCompact.warningBufferTokens), AutoCompact (at or below
    /// bufferTokens: the next turn compacts first) or Blocking (at or below
    /// blockingBufferTokens: nothing is sent before compacting).
    pub tier: String,
    /// Estimated tokens left in the effective context window.
    pub tokens_left: i64,
    /// The policy's warning buffer, in tokens (after scaling to small windows).
    pub warning_buffer_tokens: u64,
}

/// A check that the archive answers: a probe object written, read back and deleted with
/// the agent's own credentials, at start-up and every few minutes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveCheck {
    /// True when the probe's round trip succeeded.
    pub ok: bool,
    /// What was checked: `s3://BUCKET/PREFIX/NAMESPACE/SESSION/`, or `local:DIR`.
    pub location: String,
    /// The error of a failed check (the S3 error as the client reported it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the S3 client's AWS identity comes from: `static keys`, `directory PATH` or
    /// `default chain (...)` (never a key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    /// When (RFC 3339, UTC).
    pub at: String,
}

/// The most recent recovery of a session.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LastRecovery {
    /// When it happened (RFC 3339).
    pub at: String,
    /// The classified failure: ContextOverflow, PayloadTooLarge, ProxyRejection or
    /// SuspectedPayload.
    pub trigger: String,
    /// Ladder level reached (1 to 3).
    pub level: u32,
    /// Recovered or Failed.
    pub outcome: String,
}

/// Archive usage.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveStats {
    /// Objects archived by this session.
    #[serde(default)]
    pub objects: u64,
    /// Bytes archived by this session.
    #[serde(default)]
    pub bytes: u64,
}

/// Token usage.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TokenStats {
    /// Input tokens billed.
    #[serde(default)]
    pub input: u64,
    /// Output tokens billed.
    #[serde(default)]
    pub output: u64,
    /// Input tokens served from the provider's prompt cache.
    #[serde(default)]
    pub cache_read: u64,
    /// Input tokens written to the provider's prompt cache (Anthropic, Bedrock).
    #[serde(default)]
    pub cache_write: u64,
    /// The session model these tokens are of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Tokens of the level-2 summarizer's calls since the agent started, counted apart from
    /// the session's (on the summarizer's own provider when it has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summarizer: Option<SummarizerTokens>,
}

/// Token usage of the level-2 summarizer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SummarizerTokens {
    /// Input tokens of the summarizer's calls.
    #[serde(default)]
    pub input: u64,
    /// Output tokens of the summarizer's calls.
    #[serde(default)]
    pub output: u64,
    /// Input tokens of the summarizer's calls served from the prompt cache.
    #[serde(default)]
    pub cache_read: u64,
    /// Input tokens of the summarizer's calls written to the prompt cache.
    #[serde(default)]
    pub cache_write: u64,
    /// The summarizer's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl AgentSessionSpec {
    /// The payload cap in bytes, if one is set.
    pub fn payload_cap(&self) -> Result<Option<PayloadSize>, PayloadSizeError> {
        self.payload_cap
            .as_ref()
            .map(PayloadSize::from_int_or_string)
            .transpose()
    }
}

fn payload_cap_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    // An int-or-string with a CEL rule: integers are megabytes, strings must parse. `string()`
    // turns an integer into a bare number (megabytes), so one pattern covers both forms; it is
    // the parser's (`payload::PAYLOAD_SIZE_PATTERN`), and an all-zero size is refused.
    // maxLength bounds the rule's cost for the API server.
    let pattern = crate::payload::PAYLOAD_SIZE_PATTERN.replace('\\', "\\\\");
    let rule = format!(
        "string(self).matches('{pattern}') && !string(self).matches('^[\\\\s0.]*[a-zA-Z]*\\\\s*$')"
    );
    schemars::json_schema!({
        "description": "Request-body ceiling of the network path to the provider (a corporate proxy, a WAF, an API gateway). Requests are kept below it. A string like `5MB`, `512KB`, `2.5MB`, `1048576B`, `5Mi`, or a bare number of megabytes. K, M and G are binary units (1 KB = 1024 bytes). Optional: without it the agent learns the cap from the first rejection (3/4 of the rejected request's size).",
        "x-kubernetes-int-or-string": true,
        "anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 32}],
        "x-kubernetes-validations": [{
            "rule": rule,
            "message": "payloadCap must be a positive size like 5MB, 512KB, 2.5MB, 1048576B, 5Mi or a bare number of megabytes"
        }]
    })
}
