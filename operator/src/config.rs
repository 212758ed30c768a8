//! The operator's configuration: command-line flags, each also readable from an environment
//! variable (so the Helm chart can set either), and the per-session defaults derived from it.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Image run for sessions that do not set `template.image`.
pub const DEFAULT_AGENT_IMAGE: &str =
    concat!("ghcr.io/cairn-dev/cairn-agent:", env!("CARGO_PKG_VERSION"));

/// Default of `--secret-wait-requeue-seconds`.
pub const DEFAULT_SECRET_WAIT_REQUEUE_SECONDS: u64 = 10;

/// How logs are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// A setting that is on, off, or decided by what the operator finds at start-up.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    Auto,
    #[value(name = "true")]
    On,
    #[value(name = "false")]
    Off,
}

/// Flags of `cairn-operator run` (the default command).
#[derive(clap::Args, Clone, Debug)]
pub struct OperatorArgs {
    /// Agent image for sessions that do not set `spec.template.image`.
    #[arg(long, env = "CAIRN_AGENT_IMAGE", default_value = DEFAULT_AGENT_IMAGE)]
    pub agent_image: String,

    /// Default S3 endpoint (MinIO, Garage, Ceph, ...). Unset: AWS.
    #[arg(long, env = "CAIRN_ARCHIVE_ENDPOINT")]
    pub archive_endpoint: Option<String>,
    /// Default S3 bucket. Unset and not set on a session: the agent keeps its archive and
    /// journal on the pod's scratch volume only (ArchiveReady=False).
    #[arg(long, env = "CAIRN_ARCHIVE_BUCKET")]
    pub archive_bucket: Option<String>,
    /// Default key prefix inside the bucket.
    #[arg(long, env = "CAIRN_ARCHIVE_PREFIX", default_value = "cairn")]
    pub archive_prefix: String,
    /// Default S3 region.
    #[arg(long, env = "CAIRN_ARCHIVE_REGION", default_value = "us-east-1")]
    pub archive_region: String,
    /// Default path-style addressing. Unset: true when an endpoint is configured.
    #[arg(long, env = "CAIRN_ARCHIVE_FORCE_PATH_STYLE")]
    pub archive_force_path_style: Option<bool>,
    /// Default Secret (looked up in each session's namespace) holding the S3 key pair under
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    #[arg(long, env = "CAIRN_ARCHIVE_CREDENTIALS_SECRET")]
    pub archive_credentials_secret: Option<String>,
    /// The agent pods get their S3 identity from their environment (IRSA, EKS Pod Identity,
    /// a node role through IMDS): a session with a bucket and no credentials Secret then
    /// uses the AWS default credential chain instead of being refused. A session whose
    /// ServiceAccount gets an `eks.amazonaws.com/role-arn` annotation counts as such
    /// without this flag.
    #[arg(
        long,
        env = "CAIRN_ARCHIVE_AMBIENT_CREDENTIALS",
        default_value_t = false
    )]
    pub archive_ambient_credentials: bool,
    /// Scoped archive credentials: for each session the operator calls STS `AssumeRole` with
    /// its own admin credentials and a session policy that allows only that session's
    /// prefix, and writes the temporary credentials into the session's own Secret (mounted
    /// into its pod, refreshed before they expire). Replaces `--archive-credentials-secret`
    /// for sessions that name no credentials of their own. `auto` (the default): on when the
    /// admin credentials directory holds a key pair at start-up; `false` turns it off even
    /// then.
    #[arg(long, env = "CAIRN_ARCHIVE_SCOPED", value_enum, default_value = "auto")]
    pub archive_scoped: Switch,
    /// Sessions may share a static S3 key pair without a Warning: the operator's default
    /// Secret, or a `credentials` Secret several sessions of a namespace name. Each such
    /// session still says in its `ArchiveCredentials` condition that its credentials are
    /// shared. A session accepts it for itself with `spec.archive.sharedCredentials: true`.
    #[arg(
        long,
        env = "CAIRN_ARCHIVE_ALLOW_SHARED_CREDENTIALS",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub archive_allow_shared_credentials: bool,
    /// Role the scoped credentials assume (`arn:aws:iam::<account>:role/<name>`); its own
    /// policies bound what any session policy can grant. Unset: the admin identity assumes
    /// a session of itself (stores that allow it, e.g. SeaweedFS; AWS needs a role).
    #[arg(long, env = "CAIRN_ARCHIVE_SCOPED_ROLE_ARN")]
    pub archive_scoped_role_arn: Option<String>,
    /// STS endpoint. Unset: the archive endpoint when one is configured (self-hosted stores
    /// serve STS on their S3 port), else AWS STS of the archive region.
    #[arg(long, env = "CAIRN_ARCHIVE_SCOPED_STS_ENDPOINT")]
    pub archive_scoped_sts_endpoint: Option<String>,
    /// Lifetime asked for the scoped credentials, in seconds (STS allows 900 to 43200; the
    /// store may grant less, the operator follows the expiry it gets).
    #[arg(
        long,
        env = "CAIRN_ARCHIVE_SCOPED_DURATION_SECONDS",
        default_value_t = SCOPED_DURATION_SECONDS,
        value_parser = clap::value_parser!(u32).range(900..=43200)
    )]
    pub archive_scoped_duration_seconds: u32,
    /// Refresh the scoped credentials this many seconds before they expire. 0 (or a value
    /// not shorter than the lifetime): at half the lifetime.
    #[arg(
        long,
        env = "CAIRN_ARCHIVE_SCOPED_REFRESH_BEFORE_SECONDS",
        default_value_t = 0
    )]
    pub archive_scoped_refresh_before_seconds: u64,
    /// Directory of the operator's own mounted Secret with the bucket's admin key pair
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`), read at each minting and purge. It
    /// stays in the operator's pod: no agent pod ever mounts it.
    #[arg(
        long,
        env = "CAIRN_ARCHIVE_SCOPED_ADMIN_CREDENTIALS_DIR",
        default_value = "/var/run/cairn/archive-admin"
    )]
    pub archive_scoped_admin_credentials_dir: std::path::PathBuf,
    /// Default size of the pod-local archive cache (also bounds the pod's scratch volume).
    #[arg(long, env = "CAIRN_ARCHIVE_LOCAL_CACHE_SIZE", default_value = "256Mi")]
    pub archive_local_cache_size: String,
    /// Default TTL of entries in the pod-local archive cache.
    #[arg(long, env = "CAIRN_ARCHIVE_TTL", default_value = "168h")]
    pub archive_ttl: String,

    /// Default CPU request of agent pods.
    #[arg(long, env = "CAIRN_DEFAULT_CPU_REQUEST", default_value = "100m")]
    pub default_cpu_request: String,
    /// Default memory request of agent pods.
    #[arg(long, env = "CAIRN_DEFAULT_MEMORY_REQUEST", default_value = "256Mi")]
    pub default_memory_request: String,
    /// Default CPU limit of agent pods (empty: none).
    #[arg(long, env = "CAIRN_DEFAULT_CPU_LIMIT", default_value = "")]
    pub default_cpu_limit: String,
    /// Default memory limit of agent pods (empty: none).
    #[arg(long, env = "CAIRN_DEFAULT_MEMORY_LIMIT", default_value = "1Gi")]
    pub default_memory_limit: String,

    /// File with the fleet's model price table (YAML: model name prefix to `input`, `output`,
    /// `cacheRead`, `cacheWrite` in USD per million tokens; the chart mounts its `prices`
    /// ConfigMap here). Its entries go before the agent's built-in catalog prices in every
    /// session's cost (`status.session.costUSD`). Read at start-up; unset: the catalog's.
    #[arg(long, env = "CAIRN_PRICE_TABLE_FILE")]
    pub price_table_file: Option<std::path::PathBuf>,

    /// OTLP/HTTP collector base URL the agent pods export their spans to (the agent appends
    /// `/v1/traces`), e.g. `http://otel-collector.observability:4318`. Unset: no export.
    #[arg(long, env = "CAIRN_AGENT_OTLP_ENDPOINT", value_parser = otlp_endpoint)]
    pub agent_otlp_endpoint: Option<String>,
    /// Secret (looked up in each session's namespace) whose `OTEL_EXPORTER_OTLP_HEADERS` key
    /// holds the export headers, e.g. `authorization=Bearer <token>`. Only with an endpoint.
    #[arg(long, env = "CAIRN_AGENT_OTLP_HEADERS_SECRET")]
    pub agent_otlp_headers_secret: Option<String>,
    /// Extra resource attributes of the agents' spans, `key=value` pairs separated by commas
    /// (e.g. `k8s.cluster.name=prod-eu`). Only with an endpoint.
    #[arg(long, env = "CAIRN_AGENT_OTLP_RESOURCE_ATTRIBUTES", value_parser = resource_attributes)]
    pub agent_otlp_resource_attributes: Option<String>,

    /// Forward proxy of the agents' `https://` connections (provider, S3, MCP), e.g.
    /// `http://proxy.corp:3128`; a session's `template.proxy` replaces it.
    #[arg(long, env = "CAIRN_AGENT_HTTPS_PROXY")]
    pub agent_https_proxy: Option<String>,
    /// Forward proxy of the agents' `http://` connections.
    #[arg(long, env = "CAIRN_AGENT_HTTP_PROXY")]
    pub agent_http_proxy: Option<String>,
    /// Hosts the agents reach directly, comma-separated.
    #[arg(long, env = "CAIRN_AGENT_NO_PROXY")]
    pub agent_no_proxy: Option<String>,
    /// Extra certificate authorities (PEM text) every agent trusts, e.g. a TLS-inspecting
    /// proxy's CA; a session's `provider.caBundle` adds its own.
    #[arg(long, env = "CAIRN_AGENT_CA_BUNDLE")]
    pub agent_ca_bundle: Option<String>,

    /// Pod and ServiceAccount settings of every agent pod, as JSON (the chart's `agent.pod`):
    /// `imagePullSecrets` (names), `serviceAccountAnnotations` (values may hold `{namespace}`
    /// and `{session}`), `labels`, `annotations`, `affinity`, `tolerations`,
    /// `topologySpreadConstraints`, `priorityClassName`, `runtimeClassName`. A session's
    /// `spec.template` overrides them. Empty: none.
    #[arg(long, env = "CAIRN_AGENT_POD_DEFAULTS", value_parser = pod_defaults, default_value = "")]
    pub agent_pod_defaults: PodDefaults,

    /// Namespace of the monitoring stack (e.g. Prometheus) that scrapes the agents' `/metrics`:
    /// each session's NetworkPolicy admits it on the agent's port. Empty: none.
    #[arg(long, env = "CAIRN_AGENT_MONITORING_NAMESPACE")]
    pub agent_monitoring_namespace: Option<String>,
    /// Namespace of the gateway, whose pods (`--agent-gateway-pod-labels`) every session's
    /// NetworkPolicy admits on the agent's port. Default: the operator's namespace.
    #[arg(long, env = "CAIRN_AGENT_GATEWAY_NAMESPACE")]
    pub agent_gateway_namespace: Option<String>,
    /// Labels of the gateway's pods, `key=value` pairs, comma-separated (the chart's gateway
    /// selector labels).
    #[arg(
        long,
        env = "CAIRN_AGENT_GATEWAY_POD_LABELS",
        value_parser = label_pairs,
        default_value = DEFAULT_GATEWAY_POD_LABELS
    )]
    pub agent_gateway_pod_labels: Labels,
    /// Egress rules of every session's NetworkPolicy, as JSON:
    /// `{"dns": true, "to": [{"cidr": "10.0.0.0/8", "except": [], "ports": [443]}]}`. Empty:
    /// egress is not restricted. NetworkPolicy names addresses, never hostnames.
    #[arg(long, env = "CAIRN_AGENT_EGRESS", value_parser = egress_policy)]
    pub agent_egress: Option<EgressPolicy>,

    /// Namespaces to watch, comma-separated. Empty: all namespaces.
    #[arg(
        long,
        env = "CAIRN_WATCH_NAMESPACES",
        value_delimiter = ',',
        default_value = ""
    )]
    pub watch_namespaces: Vec<String>,
    /// Namespaces where the operator watches the metadata of Secrets (never their values),
    /// comma-separated, so that a Secret a session names and that appears or rotates there
    /// is picked up at once. Empty: no Secret watch at all; the operator reads a session's
    /// Secrets by name when it reconciles it, re-checks a session that waits for a Secret
    /// every `--secret-wait-requeue-seconds`, and notices a rotation at the next resync.
    #[arg(
        long,
        env = "CAIRN_SECRET_WATCH_NAMESPACES",
        value_delimiter = ',',
        default_value = ""
    )]
    pub secret_watch_namespaces: Vec<String>,
    /// Re-check period of a session that waits for a Secret (missing, or without the named
    /// key) in a namespace without a Secret watch, in seconds.
    #[arg(long, env = "CAIRN_SECRET_WAIT_REQUEUE_SECONDS", default_value_t = DEFAULT_SECRET_WAIT_REQUEUE_SECONDS)]
    pub secret_wait_requeue_seconds: u64,
    /// Namespace the operator runs in: agent pods accept traffic from it (NetworkPolicy), and
    /// it holds the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "cairn-system")]
    pub operator_namespace: String,

    /// Log format.
    #[arg(long, env = "CAIRN_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Address of the HTTP server for `/healthz`, `/readyz` and `/metrics`.
    #[arg(long, env = "CAIRN_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,

    /// Run the controller only while holding the leader Lease (safe with several replicas).
    #[arg(long, env = "CAIRN_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "CAIRN_LEADER_ELECTION_LEASE",
        default_value = "cairn-operator"
    )]
    pub leader_election_lease: String,
    /// Namespace of the leader-election Lease. Default: the operator's namespace.
    #[arg(long, env = "CAIRN_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Identity in the leader Lease. Default: the pod name (`POD_NAME`) or the host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Do not install or upgrade the CRDs at start-up (when the chart or GitOps owns them).
    #[arg(long, env = "CAIRN_SKIP_CRD_INSTALL")]
    pub skip_crd_install: bool,

    /// Sessions reconciled at once.
    #[arg(long, env = "CAIRN_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Period of the safety-net re-reconcile of a healthy session, in seconds.
    #[arg(long, env = "CAIRN_RESYNC_SECONDS", default_value_t = 3600)]
    pub resync_seconds: u64,
}

/// Defaults applied to every session that does not override them: the pure part of the
/// configuration that `validate` and `build` read.
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    pub image: String,
    pub archive: ArchiveDefaults,
    pub resources: ResourceRequirements,
    pub operator_namespace: String,
    /// Span export of every agent pod; `None`: the pods export nothing.
    pub otlp: Option<OtlpExport>,
    /// The fleet's model price table (YAML text), handed to every agent pod.
    pub price_table: Option<String>,
    /// Proxies and trusted CAs of every agent pod.
    pub network: AgentNetwork,
    /// Scheduling, identity and metadata settings of every agent pod.
    pub pod: PodDefaults,
    /// Who else may reach the agents, and where the agents may connect to.
    pub network_policy: NetworkPolicyDefaults,
}

/// Default of `--agent-gateway-pod-labels`: the label every gateway pod of the chart has.
pub const DEFAULT_GATEWAY_POD_LABELS: &str = "app.kubernetes.io/name=cairn-gateway";

/// Pod labels given as `key=value` pairs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(pub BTreeMap<String, String>);

/// Parses `key=value,key=value` (blanks around each part ignored; at least one pair).
pub fn label_pairs(raw: &str) -> Result<Labels, String> {
    let mut labels = BTreeMap::new();
    for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            return Err(format!("{pair:?} has no key"));
        }
        labels.insert(key.to_string(), value.to_string());
    }
    if labels.is_empty() {
        return Err("at least one key=value pair is needed".into());
    }
    Ok(Labels(labels))
}

/// Where the gateway's pods are, for the sessions' NetworkPolicies.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayPods {
    /// `None`: the operator's namespace.
    pub namespace: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl Default for GatewayPods {
    fn default() -> Self {
        Self {
            namespace: None,
            labels: label_pairs(DEFAULT_GATEWAY_POD_LABELS)
                .map(|l| l.0)
                .unwrap_or_default(),
        }
    }
}

/// The fleet-wide parts of every session's NetworkPolicy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetworkPolicyDefaults {
    /// Namespace admitted on the agent's port (metrics scraping).
    pub monitoring_namespace: Option<String>,
    /// The gateway's pods, admitted on the agent's port.
    pub gateway: GatewayPods,
    /// `None`: egress unrestricted.
    pub egress: Option<EgressPolicy>,
}

/// Egress allowed to agent pods when egress is restricted (`--agent-egress`).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressPolicy {
    /// Allow DNS (port 53, UDP and TCP) to any destination.
    #[serde(default = "yes")]
    pub dns: bool,
    /// Allowed destinations: address blocks and ports.
    #[serde(default)]
    pub to: Vec<EgressRule>,
}

fn yes() -> bool {
    true
}

/// One allowed destination block.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressRule {
    /// CIDR, e.g. `10.0.0.0/8` or `203.0.113.7/32`.
    pub cidr: String,
    /// CIDRs inside `cidr` that stay closed.
    #[serde(default)]
    pub except: Vec<String>,
    /// TCP ports; empty: every port.
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// The labels the operator sets on a session's pod and selects it by: neither the operator's
/// pod defaults nor a session's `template.labels` may set them.
pub const RESERVED_POD_LABELS: [&str; 4] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "cairn.dev/session",
];

/// Fleet-wide settings of every agent pod and its ServiceAccount (`--agent-pod-defaults`);
/// a session's `spec.template` overrides most (maps key by key, pull secrets added, the rest
/// replaced), but not the ServiceAccount annotations and the runtime class set here.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodDefaults {
    /// Names of pull Secrets (in each session's namespace).
    #[serde(default)]
    pub image_pull_secrets: Vec<String>,
    /// ServiceAccount annotations; `{namespace}` and `{session}` in a value are replaced.
    #[serde(default)]
    pub service_account_annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub affinity: Option<Affinity>,
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    #[serde(default)]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    #[serde(default)]
    pub priority_class_name: Option<String>,
    #[serde(default)]
    pub runtime_class_name: Option<String>,
}

/// The fleet-wide network path of agent pods (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY` and
/// `CAIRN_CA_BUNDLE_PEM` in each pod).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentNetwork {
    pub https_proxy: Option<String>,
    pub http_proxy: Option<String>,
    pub no_proxy: Option<String>,
    /// PEM text.
    pub ca_bundle: Option<String>,
}

/// Key of the export headers in the OTLP headers Secret, named after the variable it feeds.
pub const OTLP_HEADERS_KEY: &str = "OTEL_EXPORTER_OTLP_HEADERS";

/// Where and how agent pods export their spans (the standard `OTEL_*` variables).
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpExport {
    /// Collector base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`), http or https.
    pub endpoint: String,
    /// Secret in the session's namespace holding [`OTLP_HEADERS_KEY`].
    pub headers_secret: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, `key=value` pairs separated by commas.
    pub resource_attributes: Option<String>,
}

/// Archive settings a session inherits.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchiveDefaults {
    pub endpoint: Option<String>,
    pub bucket: Option<String>,
    pub prefix: String,
    pub region: String,
    pub force_path_style: Option<bool>,
    pub credentials_secret: Option<String>,
    /// Pods have an S3 identity of their own (`--archive-ambient-credentials`).
    pub ambient_credentials: bool,
    /// Per-session credentials minted by the operator; `None`: sessions get the static
    /// `credentials_secret` (or their own).
    pub scoped: Option<ScopedArchive>,
    /// Sessions may share a static key pair without a Warning
    /// (`--archive-allow-shared-credentials`).
    pub allow_shared_credentials: bool,
    pub local_cache_size: String,
    pub ttl: String,
}

/// Lifetime the operator asks for scoped credentials by default.
pub const SCOPED_DURATION_SECONDS: u32 = 3600;

/// How the operator mints a session's scoped archive credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopedArchive {
    pub role_arn: Option<String>,
    /// `None`: the archive endpoint, else AWS STS.
    pub sts_endpoint: Option<String>,
    pub duration: std::time::Duration,
    /// `None`: at half the lifetime.
    pub refresh_before: Option<std::time::Duration>,
    pub admin_credentials_dir: std::path::PathBuf,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            image: DEFAULT_AGENT_IMAGE.to_string(),
            archive: ArchiveDefaults {
                endpoint: None,
                bucket: None,
                prefix: "cairn".into(),
                region: "us-east-1".into(),
                force_path_style: None,
                credentials_secret: None,
                ambient_credentials: false,
                scoped: None,
                allow_shared_credentials: false,
                local_cache_size: "256Mi".into(),
                ttl: "168h".into(),
            },
            resources: resources("100m", "256Mi", "", "1Gi"),
            operator_namespace: "cairn-system".into(),
            otlp: None,
            price_table: None,
            network: AgentNetwork::default(),
            pod: PodDefaults::default(),
            network_policy: NetworkPolicyDefaults::default(),
        }
    }
}

impl OperatorArgs {
    pub fn defaults(&self) -> Defaults {
        let non_empty = |s: &Option<String>| s.clone().filter(|v| !v.trim().is_empty());
        Defaults {
            image: self.agent_image.clone(),
            archive: ArchiveDefaults {
                endpoint: non_empty(&self.archive_endpoint),
                bucket: non_empty(&self.archive_bucket),
                prefix: self.archive_prefix.clone(),
                region: self.archive_region.clone(),
                force_path_style: self.archive_force_path_style,
                credentials_secret: non_empty(&self.archive_credentials_secret),
                ambient_credentials: self.archive_ambient_credentials,
                scoped: self.scoped_mode().then(|| ScopedArchive {
                    role_arn: non_empty(&self.archive_scoped_role_arn).map(|s| s.trim().into()),
                    sts_endpoint: non_empty(&self.archive_scoped_sts_endpoint)
                        .map(|s| s.trim().into()),
                    duration: std::time::Duration::from_secs(
                        self.archive_scoped_duration_seconds.into(),
                    ),
                    refresh_before: (self.archive_scoped_refresh_before_seconds > 0).then(|| {
                        std::time::Duration::from_secs(self.archive_scoped_refresh_before_seconds)
                    }),
                    admin_credentials_dir: self.archive_scoped_admin_credentials_dir.clone(),
                }),
                allow_shared_credentials: self.archive_allow_shared_credentials,
                local_cache_size: self.archive_local_cache_size.clone(),
                ttl: self.archive_ttl.clone(),
            },
            resources: resources(
                &self.default_cpu_request,
                &self.default_memory_request,
                &self.default_cpu_limit,
                &self.default_memory_limit,
            ),
            operator_namespace: self.operator_namespace.clone(),
            otlp: non_empty(&self.agent_otlp_endpoint).map(|endpoint| OtlpExport {
                endpoint: endpoint.trim().to_string(),
                headers_secret: non_empty(&self.agent_otlp_headers_secret)
                    .map(|s| s.trim().to_string()),
                resource_attributes: non_empty(&self.agent_otlp_resource_attributes)
                    .map(|s| s.trim().to_string()),
            }),
            price_table: self.price_table_file.as_deref().and_then(read_price_table),
            network: AgentNetwork {
                https_proxy: non_empty(&self.agent_https_proxy).map(|s| s.trim().to_string()),
                http_proxy: non_empty(&self.agent_http_proxy).map(|s| s.trim().to_string()),
                no_proxy: non_empty(&self.agent_no_proxy).map(|s| s.trim().to_string()),
                ca_bundle: non_empty(&self.agent_ca_bundle),
            },
            pod: self.agent_pod_defaults.clone(),
            network_policy: NetworkPolicyDefaults {
                monitoring_namespace: non_empty(&self.agent_monitoring_namespace)
                    .map(|s| s.trim().to_string()),
                gateway: GatewayPods {
                    namespace: non_empty(&self.agent_gateway_namespace)
                        .map(|s| s.trim().to_string()),
                    labels: self.agent_gateway_pod_labels.0.clone(),
                },
                egress: self.agent_egress.clone(),
            },
        }
    }

    /// Whether the operator mints scoped credentials: as `--archive-scoped` says, or with
    /// `auto` whenever it holds admin credentials that can mint them. Read once, at start-up:
    /// the chart mounts the admin Secret exactly when it names one.
    fn scoped_mode(&self) -> bool {
        match self.archive_scoped {
            Switch::On => true,
            Switch::Off => false,
            Switch::Auto => {
                let dir = &self.archive_scoped_admin_credentials_dir;
                let on = holds_key_pair(dir);
                tracing::info!(
                    dir = %dir.display(),
                    scoped = on,
                    "--archive-scoped=auto: scoped archive credentials {}",
                    if on {
                        "on (the admin credentials are there)"
                    } else {
                        "off (no admin credentials)"
                    }
                );
                on
            }
        }
    }

    /// The namespaces to watch; empty means all.
    pub fn namespaces(&self) -> Vec<String> {
        namespace_list(&self.watch_namespaces)
    }

    /// The namespaces where Secret metadata is watched; empty means none.
    pub fn secret_watch_namespaces(&self) -> Vec<String> {
        namespace_list(&self.secret_watch_namespaces)
    }
}

/// Whether `dir` holds a non-empty `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, the files
/// of the admin Secret `scoped::admin_keys` reads at each minting.
fn holds_key_pair(dir: &std::path::Path) -> bool {
    ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .iter()
        .all(|key| std::fs::read_to_string(dir.join(key)).is_ok_and(|v| !v.trim().is_empty()))
}

/// Trimmed, sorted, deduplicated, without empty entries.
fn namespace_list(raw: &[String]) -> Vec<String> {
    let mut out: Vec<String> = raw
        .iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `--agent-egress`: JSON of [`EgressPolicy`] (leave the flag out for unrestricted egress).
/// Each `cidr` must be an IPv4 or IPv6 block.
pub fn egress_policy(value: &str) -> Result<EgressPolicy, String> {
    let parsed: EgressPolicy =
        serde_json::from_str(value).map_err(|e| format!("not an agent egress policy: {e}"))?;
    for block in parsed
        .to
        .iter()
        .flat_map(|r| std::iter::once(&r.cidr).chain(&r.except))
    {
        cidr(block)?;
    }
    if parsed.to.iter().flat_map(|r| &r.ports).any(|p| *p == 0) {
        return Err("egress port 0 is not a port".into());
    }
    Ok(parsed)
}

fn cidr(block: &str) -> Result<(), String> {
    let (addr, len) = block
        .split_once('/')
        .ok_or_else(|| format!("{block:?} is not a CIDR (address/length)"))?;
    let max = match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => 32,
        Ok(std::net::IpAddr::V6(_)) => 128,
        Err(_) => return Err(format!("{block:?} is not a CIDR: bad address")),
    };
    match len.parse::<u8>() {
        Ok(l) if l <= max => Ok(()),
        _ => Err(format!("{block:?} is not a CIDR: bad prefix length")),
    }
}

/// `--agent-pod-defaults`: JSON of [`PodDefaults`]; empty stands for none. Unknown fields and
/// the operator's own pod labels are refused, so a typo stops the operator at start-up
/// rather than being ignored.
pub fn pod_defaults(value: &str) -> Result<PodDefaults, String> {
    let value = value.trim();
    if value.is_empty() || value == "{}" || value == "null" {
        return Ok(PodDefaults::default());
    }
    let parsed: PodDefaults =
        serde_json::from_str(value).map_err(|e| format!("not agent pod defaults: {e}"))?;
    if let Some(key) = RESERVED_POD_LABELS
        .iter()
        .find(|k| parsed.labels.contains_key(**k))
    {
        return Err(format!(
            "labels cannot set {key}: the operator sets it and selects the pod by it"
        ));
    }
    Ok(parsed)
}

/// An OTLP endpoint must be an absolute http(s) URL; empty stands for unset (the chart may
/// pass an empty variable).
/// The price table file's text, when it is a YAML mapping; anything else is logged and
/// left out (the agents then use their catalog's prices).
fn read_price_table(path: &std::path::Path) -> Option<String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the price table; the agents use their catalog's prices");
            return None;
        }
    };
    match serde_yaml::from_str::<serde_yaml::Value>(&text) {
        Ok(serde_yaml::Value::Mapping(m)) if !m.is_empty() => Some(text),
        Ok(serde_yaml::Value::Mapping(_)) | Ok(serde_yaml::Value::Null) => None,
        Ok(_) | Err(_) => {
            tracing::warn!(path = %path.display(), "the price table is not a YAML mapping of models to prices; the agents use their catalog's prices");
            None
        }
    }
}

pub fn otlp_endpoint(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(String::new());
    }
    let uri: ::http::Uri = value
        .parse()
        .map_err(|e| format!("{value:?} is not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(host)) if !host.is_empty() => Ok(value.to_string()),
        _ => Err(format!(
            "{value:?} must be an http:// or https:// URL with a host"
        )),
    }
}

/// `OTEL_RESOURCE_ATTRIBUTES` syntax: `key=value` pairs separated by commas, keys not empty.
/// Empty stands for unset.
pub fn resource_attributes(value: &str) -> Result<String, String> {
    let value = value.trim();
    for pair in value.split(',').filter(|_| !value.is_empty()) {
        match pair.split_once('=') {
            Some((key, _)) if !key.trim().is_empty() => {}
            _ => {
                return Err(format!(
                    "{pair:?} is not a key=value pair (expected e.g. k8s.cluster.name=prod)"
                ));
            }
        }
    }
    Ok(value.to_string())
}

fn resources(cpu_req: &str, mem_req: &str, cpu_lim: &str, mem_lim: &str) -> ResourceRequirements {
    let pairs = |cpu: &str, mem: &str| {
        let map: BTreeMap<String, Quantity> = [("cpu", cpu), ("memory", mem)]
            .into_iter()
            .filter(|(_, v)| !v.trim().is_empty())
            .map(|(k, v)| (k.to_string(), Quantity(v.trim().to_string())))
            .collect();
        (!map.is_empty()).then_some(map)
    };
    ResourceRequirements {
        requests: pairs(cpu_req, mem_req),
        limits: pairs(cpu_lim, mem_lim),
        ..Default::default()
    }
}
