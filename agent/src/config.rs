//! From a config file, the environment or an AgentSession spec to the settings a session
//! runs with: the live part (policy, limits, system prompt — replaceable between turns) and
//! the storage (archive and journal, in S3 or a local directory).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_crds::policy::SummaryEngine;
use cairn_crds::session::UnsupportedSetting;
use cairn_crds::{AgentSessionSpec, CompactionPolicySpec, EffectivePolicy, ProviderSpec};
use serde::Deserialize;

use crate::catalog::{self, Limits};
use crate::ccr::s3::journal_objects;
use crate::ccr::stats::ArchiveCounters;
use crate::ccr::{
    DEFAULT_IN_FLIGHT, LayeredStore, LocalLimits, LocalStore, S3Config, S3Store, S3Timeouts,
    SessionScope, Store,
};
use crate::storage::{DirObjects, ObjectStore};

/// The default S3 key prefix (the operator's default too).
pub const DEFAULT_PREFIX: &str = "cairn";

/// Directory of a mounted S3 credentials Secret (one file per key); when set, the archive's
/// credentials come from there instead of `AWS_*` variables.
pub const S3_CREDENTIALS_DIR_ENV: &str = "CAIRN_S3_CREDENTIALS_DIR";

/// A settings problem: bad input, exit code 2 in `run`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Parse { path: String, reason: String },
    #[error("invalid session {0:?}: expected NAMESPACE/NAME")]
    SessionName(String),
    #[error("compaction policy: {0}")]
    Policy(String),
    #[error("payloadCap: {0}")]
    PayloadCap(String),
    #[error("archive: {0}")]
    Archive(String),
    #[error("network path: {0}")]
    Net(#[from] crate::net::NetError),
}

impl ConfigError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read",
            Self::Parse { .. } => "parse",
            Self::SessionName(_) => "session_name",
            Self::Policy(_) => "policy",
            Self::PayloadCap(_) => "payload_cap",
            Self::Archive(_) => "archive",
            Self::Net(_) => "network_path",
        }
    }
}

/// `--config FILE`: the AgentSession spec's fields plus `name` and `namespace`.
#[derive(Deserialize, Clone, Debug, PartialEq)]
pub struct ConfigFile {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(flatten)]
    pub spec: AgentSessionSpec,
    /// The CompactionPolicy spec the session references, inlined (standalone has no API to
    /// read it from).
    #[serde(default)]
    pub policy: Option<CompactionPolicySpec>,
}

fn default_namespace() -> String {
    "default".into()
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// `NS/NAME`.
pub fn parse_session_ref(s: &str) -> Result<(String, String), ConfigError> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(ConfigError::SessionName(s.to_owned())),
    }
}

/// What may change between two turns without a restart.
#[derive(Clone, Debug, PartialEq)]
pub struct Live {
    pub spec: AgentSessionSpec,
    pub policy: EffectivePolicy,
    pub policy_hash: String,
    pub limits: Limits,
    /// `spec.payloadCap` in bytes.
    pub payload_cap: Option<u64>,
    pub system_prompt: Option<String>,
}

/// The system prompt that stands for `spec.systemPromptFrom`: `CAIRN_SYSTEM_PROMPT`, else
/// the file named by `CAIRN_SYSTEM_PROMPT_FILE` (the operator mounts the ConfigMap key there,
/// so the agent needs no ConfigMap access; read on every resolve, so an edited ConfigMap
/// reaches the next turn once the kubelet has refreshed the file).
pub fn system_prompt_override() -> Option<String> {
    if let Ok(prompt) = std::env::var("CAIRN_SYSTEM_PROMPT") {
        return Some(prompt);
    }
    let path = std::env::var_os("CAIRN_SYSTEM_PROMPT_FILE")?;
    match std::fs::read_to_string(&path) {
        Ok(prompt) => Some(prompt),
        Err(e) => {
            tracing::warn!(path = %std::path::Path::new(&path).display(), error = %e, "cannot read the system prompt file");
            None
        }
    }
}

impl Live {
    /// Resolves the effective policy (defaults ← referenced policy ← inline overrides), the
    /// model limits and the system prompt (`CAIRN_SYSTEM_PROMPT` stands for
    /// `spec.systemPromptFrom`, whose ConfigMap the agent cannot read).
    pub fn resolve(
        spec: &AgentSessionSpec,
        policy: Option<&CompactionPolicySpec>,
        system_prompt_env: Option<String>,
    ) -> Result<Self, ConfigError> {
        let effective = cairn_crds::resolve(policy, spec.compaction.as_ref())
            .map_err(|e| ConfigError::Policy(e.to_string()))?;
        let payload_cap = spec
            .payload_cap()
            .map_err(|e| ConfigError::PayloadCap(e.to_string()))?
            .map(|c| c.bytes());
        let system_prompt = system_prompt_env
            .filter(|s| !s.is_empty())
            .or_else(|| spec.system_prompt.clone());
        if system_prompt.is_none() && spec.system_prompt_from.is_some() {
            tracing::warn!(
                "spec.systemPromptFrom is set but neither CAIRN_SYSTEM_PROMPT nor CAIRN_SYSTEM_PROMPT_FILE gives it: running without a system prompt"
            );
        }
        // The verbosity directive follows the prompt, inside the cached prefix.
        let system_prompt =
            crate::steering::system_prompt(system_prompt, effective.output.verbosity);
        Ok(Self {
            policy_hash: effective.hash(),
            policy: effective,
            limits: catalog::limits_for(spec),
            payload_cap,
            system_prompt,
            spec: spec.clone(),
        })
    }
}

/// The provider settings of the level-2 summarizer: `summarizer.provider` and its endpoint
/// fields, each falling back to the session's own where the CRD says so (the base URL,
/// credentials and region only when the kind is the session's).
pub fn summarizer_spec(live: &Live) -> ProviderSpec {
    let s = &live.policy.summarizer;
    let own = &live.spec.provider;
    let kind = s.provider.unwrap_or(own.kind);
    let same = kind == own.kind;
    ProviderSpec {
        kind,
        model: s.model.clone().unwrap_or_else(|| own.model.clone()),
        base_url: s
            .base_url
            .clone()
            .or_else(|| same.then(|| own.base_url.clone()).flatten()),
        credentials: s
            .credentials
            .clone()
            .or_else(|| same.then(|| own.credentials.clone()).flatten()),
        region: s.region.clone().or_else(|| own.region.clone()),
        // One bundle trusts every connection of the pod (it is mounted once).
        ca_bundle: own.ca_bundle.clone(),
    }
}

/// True when the summarizer talks to another endpoint than the session (its own kind, base
/// URL or credentials): it then needs a client of its own.
pub fn summarizer_has_own_endpoint(live: &Live) -> bool {
    let s = summarizer_spec(live);
    let own = &live.spec.provider;
    s.kind != own.kind || s.base_url != own.base_url || s.credentials != own.credentials
}

/// The settings of `live` this agent does not honour, with what it does instead. Reported in
/// `status.session.unsupported` (the operator's `PolicySupported` condition and its Event),
/// logged when they change: a setting is never silently ignored.
/// Whether level-2 summaries are asked for as a JSON object of the nine sections
/// (`summarizer.structured`, on a summarizer whose provider has an output format).
pub fn structured_summaries(live: &Live) -> bool {
    let kind = live
        .policy
        .summarizer
        .provider
        .unwrap_or(live.spec.provider.kind);
    live.policy.summarizer.structured && kind != cairn_crds::ProviderKind::Bedrock
}

pub fn unsupported(live: &Live) -> Vec<UnsupportedSetting> {
    let mut out = Vec::new();
    if let Some(e) = catalog::PriceTable::fleet_error() {
        out.push(UnsupportedSetting {
            field: "priceTable".into(),
            reason: format!("{e}; the cost is counted at the catalog's prices"),
        });
    }
    match live.policy.engine {
        SummaryEngine::Local => {}
        SummaryEngine::Provider if crate::provider::context_management::supports_provider_engine(live.spec.provider.kind) => {}
        SummaryEngine::Provider => out.push(UnsupportedSetting {
            field: "engine".into(),
            reason: format!(
                "engine: provider: the {} API has no server-side context management (only anthropic's context editing and openai-responses' compaction are); the built-in summarizer writes level-2 summaries",
                live.spec.provider.kind.as_str()
            ),
        }),
        SummaryEngine::Mcp => match &live.policy.engine_server {
            Some(server) if live.spec.mcp_servers().iter().any(|s| s.name == *server) => {}
            Some(server) => out.push(UnsupportedSetting {
                field: "engineServer".into(),
                reason: format!(
                    "engine: mcp names the server {server:?}, which spec.tools.mcpServers does not declare; the built-in summarizer writes level-2 summaries"
                ),
            }),
            None => out.push(UnsupportedSetting {
                field: "engineServer".into(),
                reason: "engine: mcp needs engineServer, the name of an mcpServers entry; the built-in summarizer writes level-2 summaries".into(),
            }),
        },
    }
    out.extend(silent_settings(live));
    if live.policy.summarizer.structured && !structured_summaries(live) {
        out.push(UnsupportedSetting {
            field: "summarizer.structured".into(),
            reason: "the summarizer's provider (bedrock, Converse API) has no output format; summaries are asked for as text".into(),
        });
    }
    if live.policy.memory.enabled
        && (!live.policy.summarizer.enabled || live.policy.engine != SummaryEngine::Local)
    {
        out.push(UnsupportedSetting {
            field: "memory.enabled".into(),
            reason: "the session memory needs engine: local and the summarizer enabled; compactions run the ladder without it".into(),
        });
    }
    // The summarizer's own provider is honoured whenever it can be built at all.
    let s = summarizer_spec(live);
    if s.base_url.is_none()
        && crate::provider::default_base_url(s.kind, s.region.as_deref()).is_none()
    {
        out.push(UnsupportedSetting {
            field: if s.kind == cairn_crds::ProviderKind::Bedrock {
                "summarizer.region".into()
            } else {
                "summarizer.baseUrl".into()
            },
            reason: format!(
                "a {} summarizer needs {}; its summaries fail and the ladder goes on without them",
                s.kind.as_str(),
                if s.kind == cairn_crds::ProviderKind::Bedrock {
                    "a region"
                } else {
                    "a baseUrl"
                }
            ),
        });
    }
    out
}

/// Settings that take no error and have no effect on this session's model or provider:
/// effort routing on a model without an effort setting, a cost budget for a model without a
/// price (its cost stays 0, so the budget never trips), and `providerEngine` fields of the
/// other provider family.
fn silent_settings(live: &Live) -> Vec<UnsupportedSetting> {
    let mut out = Vec::new();
    let kind = live.spec.provider.kind;
    let model = &live.spec.provider.model;
    if live.policy.output.effort_routing && !crate::steering::has_effort(kind, model) {
        out.push(UnsupportedSetting {
            field: "output.effortRouting".into(),
            reason: format!(
                "the model {model:?} ({}) has no reasoning-effort setting; requests go out without one",
                kind.as_str()
            ),
        });
    }
    if let Some(max) = live.spec.budget.as_ref().and_then(|b| b.max_cost_usd)
        && catalog::PriceTable::fleet().prices(model).is_none()
    {
        out.push(UnsupportedSetting {
            field: "budget.maxCostUSD".into(),
            reason: format!(
                "neither the price table nor the catalog has a price for the model {model:?}: its calls cost 0 USD, so the budget of {max} USD never trips on them (add the model to the fleet's price table)"
            ),
        });
    }
    if live.policy.engine == SummaryEngine::Provider
        && crate::provider::context_management::supports_provider_engine(kind)
    {
        let set = &live.policy.provider_engine;
        let default = EffectivePolicy::default().provider_engine;
        let fields: Vec<&str> = if kind == cairn_crds::ProviderKind::Anthropic {
            [(
                "providerEngine.compactThresholdTokens",
                set.compact_threshold_tokens != default.compact_threshold_tokens,
            )]
            .into_iter()
            .filter_map(|(f, changed)| changed.then_some(f))
            .collect()
        } else {
            [
                (
                    "providerEngine.triggerInputTokens",
                    set.trigger_input_tokens != default.trigger_input_tokens,
                ),
                (
                    "providerEngine.keepToolUses",
                    set.keep_tool_uses != default.keep_tool_uses,
                ),
                (
                    "providerEngine.clearAtLeastInputTokens",
                    set.clear_at_least_input_tokens != default.clear_at_least_input_tokens,
                ),
                (
                    "providerEngine.excludeTools",
                    set.exclude_tools != default.exclude_tools,
                ),
            ]
            .into_iter()
            .filter_map(|(f, changed)| changed.then_some(f))
            .collect()
        };
        let (other, own) = if kind == cairn_crds::ProviderKind::Anthropic {
            (
                "openai-responses' compaction",
                "anthropic's context editing",
            )
        } else {
            (
                "anthropic's context editing",
                "openai-responses' compaction",
            )
        };
        for field in fields {
            out.push(UnsupportedSetting {
                field: field.into(),
                reason: format!(
                    "{field} belongs to {other}; the session's provider ({}) uses {own}, which ignores it",
                    kind.as_str()
                ),
            });
        }
    }
    out
}

/// Where the archive and the journal live.
#[derive(Clone, Debug)]
pub struct StorageSettings {
    /// `None`: everything in `data_dir`.
    pub s3: Option<S3Config>,
    pub prefix: String,
    /// Root of the local archive cache (S3 mode).
    pub cache_dir: PathBuf,
    /// Root of the local archive and journal (no S3).
    pub data_dir: PathBuf,
    pub cache_limits: LocalLimits,
    /// Archive requests of one pass in flight at once (`archive.maxInFlight`).
    pub in_flight: usize,
    /// Trusted authorities and forward proxies of every outbound client.
    pub net: crate::net::NetPath,
}

fn truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes")
}

impl StorageSettings {
    /// From the spec's `archive` block, overridden by the environment the operator sets
    /// (`CAIRN_S3_*`, `CAIRN_ARCHIVE_*`, `CAIRN_CACHE_DIR`, `AWS_*`, `XDG_DATA_HOME`, `HOME`).
    pub fn from_spec(
        spec: &AgentSessionSpec,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let a = spec.archive.clone().unwrap_or_default();
        let data_dir = var("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".local/share")))
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join("cairn");
        let cache_dir = var("CAIRN_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| data_dir.join("cache"));
        let size = var("CAIRN_ARCHIVE_CACHE_SIZE").or(a.local_cache_size.clone());
        let ttl = var("CAIRN_ARCHIVE_TTL").or(a.ttl.clone());
        let cache_limits = LocalLimits::from_spec(size.as_deref(), ttl.as_deref())
            .map_err(|e| ConfigError::Archive(e.to_string()))?;
        let prefix = var("CAIRN_S3_PREFIX")
            .or(a.prefix.clone())
            .unwrap_or_else(|| DEFAULT_PREFIX.into());
        let bucket = var("CAIRN_S3_BUCKET").or(a.bucket.clone());
        let net = crate::net::NetPath::from_env(var)?;
        let s3 = match bucket {
            None => None,
            Some(bucket) => {
                let credentials = crate::aws::AwsIdentity::from_lookup(var, "CAIRN_S3")
                    .map_err(|e| ConfigError::Archive(format!("S3 credentials: {e}")))?;
                Some(S3Config {
                    bucket,
                    endpoint: var("CAIRN_S3_ENDPOINT").or(a.endpoint.clone()),
                    region: var("CAIRN_S3_REGION")
                        .or(a.region.clone())
                        .or_else(|| var("AWS_REGION"))
                        .unwrap_or_else(|| "us-east-1".into()),
                    force_path_style: var("CAIRN_S3_FORCE_PATH_STYLE")
                        .map(|v| truthy(&v))
                        .or(a.force_path_style)
                        .unwrap_or(false),
                    credentials,
                    timeouts: s3_timeouts(&var),
                    net: net.clone(),
                })
            }
        };
        let in_flight = a
            .max_in_flight
            .map_or(DEFAULT_IN_FLIGHT, |n| n.clamp(1, 256) as usize);
        Ok(Self {
            s3,
            prefix,
            cache_dir,
            data_dir,
            cache_limits,
            in_flight,
            net,
        })
    }
}

/// `CAIRN_S3_TIMEOUT_SECS` bounds one S3 operation (all attempts); the default suits a
/// cluster, tests shorten it.
fn s3_timeouts(var: &impl Fn(&str) -> Option<String>) -> S3Timeouts {
    let mut t = S3Timeouts::default();
    if let Some(secs) = var("CAIRN_S3_TIMEOUT_SECS").and_then(|v| v.parse::<u64>().ok()) {
        let op = Duration::from_secs(secs.max(1));
        t.operation = op;
        t.attempt = t.attempt.min(op);
        t.connect = t.connect.min(op);
    }
    t
}

/// The opened archive and journal of one session.
#[derive(Clone)]
pub struct Storage {
    pub store: Arc<dyn Store>,
    /// The archive's durable tier as named objects (`<key>`), past any cache: what
    /// `cairn-agent context` reads through its overlay.
    pub originals: Arc<dyn ObjectStore>,
    pub journal: Arc<dyn ObjectStore>,
    pub counters: Arc<ArchiveCounters>,
    /// `s3` or `local`.
    pub kind: &'static str,
    /// What [`Storage::check`] probes.
    probe: Probe,
}

/// The durable tier, as [`Storage::check`] reaches it (past any cache).
#[derive(Clone)]
enum Probe {
    /// The store and where its AWS identity comes from.
    S3(S3Store, String),
    Local(PathBuf),
}

impl Storage {
    /// Whether the archive answers: a probe object written, read back and deleted on the
    /// durable tier with the agent's own credentials (for S3: past the local cache).
    pub async fn check(&self) -> cairn_crds::session::ArchiveCheck {
        let (location, result, credentials) = match &self.probe {
            Probe::S3(s3, source) => (
                s3.location(),
                s3.probe().await.map_err(|e| e.to_string()),
                Some(source.clone()),
            ),
            Probe::Local(dir) => (
                format!("local:{}", dir.display()),
                probe_dir(dir).map_err(|e| format!("local archive {}: {e}", dir.display())),
                None,
            ),
        };
        cairn_crds::session::ArchiveCheck {
            ok: result.is_ok(),
            location,
            message: result.err(),
            credentials,
            at: cairn_crds::time::rfc3339(std::time::SystemTime::now()),
        }
    }
}

fn probe_dir(dir: &Path) -> std::io::Result<()> {
    const BODY: &[u8] = b"cairn archive probe";
    let path = dir.join(format!(".probe-{:016x}", fastrand::u64(..)));
    std::fs::write(&path, BODY)?;
    let read = std::fs::read(&path);
    std::fs::remove_file(&path)?;
    if read? != BODY {
        return Err(std::io::Error::other("the probe file came back different"));
    }
    Ok(())
}

impl Storage {
    pub fn open(
        settings: &StorageSettings,
        namespace: &str,
        session: &str,
    ) -> Result<Self, ConfigError> {
        let scope = SessionScope::new(&settings.prefix, namespace, session)
            .map_err(|e| ConfigError::Archive(e.to_string()))?;
        let archive_err = |e: crate::ccr::ArchiveError| ConfigError::Archive(e.to_string());
        let objects_err = |e: crate::storage::ObjectError| ConfigError::Archive(e.to_string());
        match &settings.s3 {
            Some(cfg) => {
                let client = cfg
                    .client()
                    .map_err(|e| ConfigError::Archive(e.to_string()))?;
                let remote = S3Store::with_client(client.clone(), &cfg.bucket, scope.clone())
                    .with_in_flight(settings.in_flight);
                let probe = Probe::S3(remote.clone(), cfg.credentials.describe());
                let originals = Arc::new(remote.objects().clone());
                let layered =
                    LayeredStore::open(&settings.cache_dir, settings.cache_limits, remote)
                        .map_err(archive_err)?;
                let counters = Arc::clone(layered.counters());
                Ok(Self {
                    store: Arc::new(layered),
                    originals,
                    journal: Arc::new(journal_objects(client, &cfg.bucket, &scope)),
                    counters,
                    kind: "s3",
                    probe,
                })
            }
            None => {
                let root = settings.data_dir.join(namespace).join(session);
                // The only tier is the archive itself: nothing may be evicted from it.
                let limits = LocalLimits {
                    max_bytes: u64::MAX / 2,
                    ttl: Duration::from_secs(100 * 365 * 24 * 3600),
                };
                let local = LocalStore::open(root.join("ccr"), limits)
                    .map_err(archive_err)?
                    .with_in_flight(settings.in_flight);
                let counters = Arc::clone(local.counters());
                Ok(Self {
                    store: Arc::new(local),
                    originals: Arc::new(DirObjects::open(root.join("ccr")).map_err(objects_err)?),
                    journal: Arc::new(DirObjects::open(root.join("journal")).map_err(objects_err)?),
                    counters,
                    kind: "local",
                    probe: Probe::Local(root),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(extra: &str) -> Live {
        let c = ConfigFile::parse(
            &format!("name: demo\nprovider:\n  kind: openai-compatible\n  model: m\n  baseUrl: http://x/v1\ncontextWindow: 1000\n{extra}"),
            "t",
        )
        .unwrap();
        Live::resolve(&c.spec, c.policy.as_ref(), None).unwrap()
    }

    fn live_on(kind: &str, model: &str, extra: &str) -> Live {
        let c = ConfigFile::parse(
            &format!("name: demo\nprovider:\n  kind: {kind}\n  model: {model}\n  baseUrl: http://x/v1\n{extra}"),
            "t",
        )
        .unwrap();
        Live::resolve(&c.spec, c.policy.as_ref(), None).unwrap()
    }

    fn fields(live: &Live) -> Vec<String> {
        unsupported(live).into_iter().map(|u| u.field).collect()
    }

    #[test]
    fn effort_routing_on_a_model_without_effort_is_named() {
        let on = "compaction:\n  output:\n    effortRouting: true\n";
        let u = unsupported(&live_on("openai", "gpt-4o", on));
        assert_eq!(u.len(), 1, "{u:?}");
        assert_eq!(u[0].field, "output.effortRouting");
        assert!(u[0].reason.contains("\"gpt-4o\""), "{u:?}");
        assert!(fields(&live_on("openai-compatible", "m", on)) == ["output.effortRouting"]);
        // Honoured where the model has the setting; off is never reported.
        assert!(fields(&live_on("openai", "gpt-5", on)).is_empty());
        assert!(fields(&live_on("anthropic", "claude-opus-4-5", on)).is_empty());
        assert!(fields(&live_on("openai", "gpt-4o", "")).is_empty());
    }

    #[test]
    fn a_budget_for_a_model_without_a_price_is_named() {
        let budget = "budget:\n  maxCostUSD: 5\n";
        let u = unsupported(&live_on("openai-compatible", "my-local-model", budget));
        assert_eq!(u.len(), 1, "{u:?}");
        assert_eq!(u[0].field, "budget.maxCostUSD");
        assert!(u[0].reason.contains("never trips"), "{u:?}");
        // A priced model's budget works; no budget, nothing to report.
        assert!(fields(&live_on("anthropic", "claude-sonnet-4-5", budget)).is_empty());
        assert!(fields(&live_on("openai-compatible", "my-local-model", "")).is_empty());
    }

    #[test]
    fn provider_engine_fields_of_the_other_family_are_named() {
        let anthropic_fields = "compaction:\n  engine: provider\n  providerEngine:\n    triggerInputTokens: 50000\n    keepToolUses: 5\n    clearAtLeastInputTokens: 1000\n    excludeTools: [recall]\n";
        let responses_field = "compaction:\n  engine: provider\n  providerEngine:\n    compactThresholdTokens: 50000\n";
        // Each family's own fields are honoured.
        assert!(fields(&live_on("anthropic", "claude-sonnet-4-5", anthropic_fields)).is_empty());
        assert!(fields(&live_on("openai-responses", "gpt-5", responses_field)).is_empty());
        // The other family's are named, one by one.
        assert_eq!(
            fields(&live_on("openai-responses", "gpt-5", anthropic_fields)),
            [
                "providerEngine.triggerInputTokens",
                "providerEngine.keepToolUses",
                "providerEngine.clearAtLeastInputTokens",
                "providerEngine.excludeTools"
            ]
        );
        let u = unsupported(&live_on("anthropic", "claude-sonnet-4-5", responses_field));
        assert_eq!(u.len(), 1, "{u:?}");
        assert_eq!(u[0].field, "providerEngine.compactThresholdTokens");
        assert!(
            u[0].reason.contains("openai-responses' compaction"),
            "{u:?}"
        );
        // A provider without server-side context management reports `engine` alone.
        assert_eq!(
            fields(&live_on("openai-compatible", "m", anthropic_fields)),
            ["engine"]
        );
    }

    #[test]
    fn settings_the_agent_cannot_honour_are_named() {
        assert!(
            unsupported(&live("")).is_empty(),
            "the defaults are all honoured"
        );
        // engine: mcp is honoured once it names a declared server.
        let u = unsupported(&live("compaction:\n  engine: mcp\n"));
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].field, "engineServer");
        assert!(u[0].reason.contains("built-in summarizer"), "{u:?}");
        let u = unsupported(&live(
            "compaction:\n  engine: mcp\n  engineServer: compactor\n",
        ));
        assert!(u[0].reason.contains("does not declare"), "{u:?}");
        assert!(
            unsupported(&live(
                "tools:\n  mcpServers:\n  - {name: compactor, url: 'http://127.0.0.1:9/mcp'}\ncompaction:\n  engine: mcp\n  engineServer: compactor\n"
            ))
            .is_empty(),
            "engine: mcp with a declared server is honoured"
        );
        let u = unsupported(&live("compaction:\n  engine: provider\n"));
        assert_eq!(u[0].field, "engine");
        assert!(
            u[0].reason.contains("openai-compatible API has no"),
            "{u:?}"
        );
        assert!(
            unsupported(&live(
                "compaction:\n  summarizer: {provider: anthropic, model: claude-haiku-4-5}\n",
            ))
            .is_empty(),
            "a summarizer on another provider kind is honoured"
        );
        assert!(
            unsupported(&live(
                "compaction:\n  summarizer: {provider: openai-compatible, model: small}\n"
            ))
            .is_empty(),
            "a summarizer model on the session's own provider is honoured"
        );
        let anthropic = |extra: &str| {
            let c = ConfigFile::parse(
                &format!(
                    "name: demo\nprovider:\n  kind: anthropic\n  model: claude-sonnet-4-5\n{extra}"
                ),
                "t",
            )
            .unwrap();
            unsupported(&Live::resolve(&c.spec, c.policy.as_ref(), None).unwrap())
        };
        assert!(anthropic("compaction:\n  engine: provider\n").is_empty());
        let u =
            anthropic("compaction:\n  summarizer: {provider: openai-compatible, model: small}\n");
        assert_eq!(u[0].field, "summarizer.baseUrl", "{u:?}");
    }

    #[test]
    fn config_file_is_the_spec_plus_name() {
        let c = ConfigFile::parse(
            "name: demo\nprovider:\n  kind: openai-compatible\n  model: m\n  baseUrl: http://x/v1\ncontextWindow: 1000\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.name, "demo");
        assert_eq!(c.namespace, "default");
        assert_eq!(c.spec.context_window, Some(1000));
        assert!(ConfigFile::parse("name: x\n", "t").is_err());
    }

    #[test]
    fn env_overrides_spec_and_local_is_the_default() {
        let c = ConfigFile::parse(
            "name: demo\nprovider: {kind: openai-compatible, model: m}\narchive: {bucket: b, prefix: p}\n",
            "t",
        )
        .unwrap();
        let env = |k: &str| match k {
            "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("x".to_string()),
            "CAIRN_S3_PREFIX" => Some("q".to_string()),
            "XDG_DATA_HOME" => Some("/d".to_string()),
            _ => None,
        };
        let s = StorageSettings::from_spec(&c.spec, env).unwrap();
        assert_eq!(s.prefix, "q");
        assert_eq!(s.s3.unwrap().bucket, "b");
        assert_eq!(s.data_dir, PathBuf::from("/d/cairn"));
        let none = ConfigFile::parse(
            "name: d\nprovider: {kind: openai-compatible, model: m}\n",
            "t",
        )
        .unwrap();
        let s = StorageSettings::from_spec(&none.spec, |k| (k == "HOME").then(|| "/h".to_string()))
            .unwrap();
        assert!(s.s3.is_none());
        assert_eq!(s.data_dir, PathBuf::from("/h/.local/share/cairn"));
        assert_eq!(s.in_flight, DEFAULT_IN_FLIGHT);
        let serial = ConfigFile::parse(
            "name: d\nprovider: {kind: openai-compatible, model: m}\narchive: {maxInFlight: 1}\n",
            "t",
        )
        .unwrap();
        let s = StorageSettings::from_spec(&serial.spec, |_| None).unwrap();
        assert_eq!(s.in_flight, 1);
        assert!(parse_session_ref("ns/a").is_ok());
        assert!(parse_session_ref("a").is_err());
    }

    #[test]
    fn a_mounted_credentials_directory_wins_over_static_keys() {
        let c = ConfigFile::parse(
            "name: demo\nprovider: {kind: openai-compatible, model: m}\narchive: {bucket: b}\n",
            "t",
        )
        .unwrap();
        let env = |k: &str| match k {
            "CAIRN_S3_ACCESS_KEY_ID" | "CAIRN_S3_SECRET_ACCESS_KEY" => Some("static".to_string()),
            S3_CREDENTIALS_DIR_ENV => Some("/var/run/cairn/archive-credentials".to_string()),
            _ => None,
        };
        let creds = StorageSettings::from_spec(&c.spec, env)
            .unwrap()
            .s3
            .unwrap()
            .credentials;
        assert!(
            matches!(creds, crate::aws::AwsIdentity::Directory(_)),
            "{creds:?}"
        );
    }
}
