//! The gateway's flags and their defaults. Every tunable lives here, in one place.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Largest request body forwarded to a session (bytes).
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Time to open a connection to a session's Service.
pub const DEFAULT_CONNECT_TIMEOUT_SECONDS: u64 = 5;
/// Time for a session to answer with its response headers (a non-streamed turn answers only
/// when the turn is done, so this bounds the whole turn).
pub const DEFAULT_RESPONSE_TIMEOUT_SECONDS: u64 = 600;
/// Longest silence between two chunks of a streamed answer.
pub const DEFAULT_STREAM_IDLE_TIMEOUT_SECONDS: u64 = 300;
/// How long a request for an idle-suspended session is held while it wakes.
pub const DEFAULT_WAKE_TIMEOUT_SECONDS: u64 = 120;
/// How long a session's token, read from its Secret for a JWT caller's request, is trusted
/// before it is read again.
pub const DEFAULT_TOKEN_TTL_SECONDS: u64 = 30;
/// How long SIGTERM waits for requests in flight before the gateway exits.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: u64 = 30;
/// The JWT claim naming the namespaces a caller may use.
pub const DEFAULT_OIDC_NAMESPACE_CLAIM: &str = "cairn.dev/namespaces";
/// The JWT claim naming the Kubernetes user the lifecycle API acts as.
pub const DEFAULT_OIDC_USERNAME_CLAIM: &str = "sub";
/// The JWT claim listing the Kubernetes groups the lifecycle API acts with.
pub const DEFAULT_OIDC_GROUPS_CLAIM: &str = "groups";

/// Command-line flags (each also an environment variable).
#[derive(Clone, Debug, clap::Args)]
pub struct GatewayArgs {
    /// Address of the API (sessions, lifecycle, health).
    #[arg(long, env = "CAIRN_GATEWAY_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Address of `/metrics` (and health), kept off the API port so an Ingress never serves it.
    #[arg(
        long,
        env = "CAIRN_GATEWAY_METRICS_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub metrics_listen: SocketAddr,
    /// Watch AgentSessions of this namespace only (default: every namespace).
    #[arg(long, env = "CAIRN_GATEWAY_NAMESPACE")]
    pub namespace: Option<String>,
    #[arg(long, env = "CAIRN_GATEWAY_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    #[arg(long, env = "CAIRN_GATEWAY_CONNECT_TIMEOUT_SECONDS", default_value_t = DEFAULT_CONNECT_TIMEOUT_SECONDS)]
    pub connect_timeout_seconds: u64,
    #[arg(long, env = "CAIRN_GATEWAY_RESPONSE_TIMEOUT_SECONDS", default_value_t = DEFAULT_RESPONSE_TIMEOUT_SECONDS)]
    pub response_timeout_seconds: u64,
    #[arg(long, env = "CAIRN_GATEWAY_STREAM_IDLE_TIMEOUT_SECONDS", default_value_t = DEFAULT_STREAM_IDLE_TIMEOUT_SECONDS)]
    pub stream_idle_timeout_seconds: u64,
    #[arg(long, env = "CAIRN_GATEWAY_WAKE_TIMEOUT_SECONDS", default_value_t = DEFAULT_WAKE_TIMEOUT_SECONDS)]
    pub wake_timeout_seconds: u64,
    #[arg(long, env = "CAIRN_GATEWAY_TOKEN_TTL_SECONDS", default_value_t = DEFAULT_TOKEN_TTL_SECONDS)]
    pub token_ttl_seconds: u64,
    #[arg(long, env = "CAIRN_GATEWAY_DRAIN_TIMEOUT_SECONDS", default_value_t = DEFAULT_DRAIN_TIMEOUT_SECONDS)]
    pub drain_timeout_seconds: u64,
    /// Issuer (`iss`) of the JWTs accepted instead of a session's own token. Unset: JWTs are
    /// not accepted and the lifecycle API is off.
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,
    /// The issuer's signing keys: a JWKS file path or an `https://` URL.
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_JWKS")]
    pub oidc_jwks: Option<String>,
    /// Audience (`aud`) the JWT must carry.
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_AUDIENCE")]
    pub oidc_audience: Option<String>,
    /// Claim listing the namespaces the caller may use (an array of strings or one string).
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_NAMESPACE_CLAIM", default_value = DEFAULT_OIDC_NAMESPACE_CLAIM)]
    pub oidc_namespace_claim: String,
    /// Only claim values with this prefix name namespaces (prefix removed), e.g. `cairn:` for
    /// a `groups` claim holding `cairn:team-a`.
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_NAMESPACE_PREFIX", default_value = "")]
    pub oidc_namespace_prefix: String,
    /// Claim naming the Kubernetes user the lifecycle API authorizes (as the API server's
    /// own `--oidc-username-claim`).
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_USERNAME_CLAIM", default_value = DEFAULT_OIDC_USERNAME_CLAIM)]
    pub oidc_username_claim: String,
    /// Prefix put before the user name (as the API server's `--oidc-username-prefix`), so
    /// RoleBindings written for the API server's OIDC users apply unchanged.
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_USERNAME_PREFIX", default_value = "")]
    pub oidc_username_prefix: String,
    /// Claim listing the Kubernetes groups the lifecycle API authorizes.
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_GROUPS_CLAIM", default_value = DEFAULT_OIDC_GROUPS_CLAIM)]
    pub oidc_groups_claim: String,
    /// Prefix put before every group name (as the API server's `--oidc-groups-prefix`).
    #[arg(long, env = "CAIRN_GATEWAY_OIDC_GROUPS_PREFIX", default_value = "")]
    pub oidc_groups_prefix: String,
    #[arg(long, env = "CAIRN_GATEWAY_LOG_FORMAT", default_value = "json")]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Where the issuer's keys come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwksSource {
    File(PathBuf),
    Url(String),
}

impl JwksSource {
    pub fn parse(s: &str) -> Self {
        if s.starts_with("https://") || s.starts_with("http://") {
            Self::Url(s.to_string())
        } else {
            Self::File(PathBuf::from(s))
        }
    }
}

/// OIDC settings, when JWTs are accepted.
#[derive(Clone, Debug)]
pub struct OidcSettings {
    pub issuer: String,
    pub jwks: JwksSource,
    pub audience: Option<String>,
    pub namespace_claim: String,
    pub namespace_prefix: String,
    /// How a JWT maps to the Kubernetes identity the lifecycle API authorizes.
    pub identity: IdentityClaims,
}

/// Which claims name the caller's Kubernetes user and groups, and the prefixes put before
/// them (the lifecycle API asks Kubernetes whether that identity may make the call, so RBAC
/// decides).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityClaims {
    pub username_claim: String,
    pub username_prefix: String,
    pub groups_claim: String,
    pub groups_prefix: String,
}

impl Default for IdentityClaims {
    fn default() -> Self {
        Self {
            username_claim: DEFAULT_OIDC_USERNAME_CLAIM.into(),
            username_prefix: String::new(),
            groups_claim: DEFAULT_OIDC_GROUPS_CLAIM.into(),
            groups_prefix: String::new(),
        }
    }
}

/// The settings the gateway runs with, resolved from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    pub max_body_bytes: usize,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub stream_idle_timeout: Duration,
    pub wake_timeout: Duration,
    pub token_ttl: Duration,
    pub drain_timeout: Duration,
    pub oidc: Option<OidcSettings>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            connect_timeout: Duration::from_secs(DEFAULT_CONNECT_TIMEOUT_SECONDS),
            response_timeout: Duration::from_secs(DEFAULT_RESPONSE_TIMEOUT_SECONDS),
            stream_idle_timeout: Duration::from_secs(DEFAULT_STREAM_IDLE_TIMEOUT_SECONDS),
            wake_timeout: Duration::from_secs(DEFAULT_WAKE_TIMEOUT_SECONDS),
            token_ttl: Duration::from_secs(DEFAULT_TOKEN_TTL_SECONDS),
            drain_timeout: Duration::from_secs(DEFAULT_DRAIN_TIMEOUT_SECONDS),
            oidc: None,
        }
    }
}

/// A flag combination that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--oidc-issuer needs --oidc-jwks (a JWKS file or URL)")]
    JwksMissing,
    #[error("--oidc-jwks is set without --oidc-issuer")]
    IssuerMissing,
}

impl GatewayArgs {
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let oidc = match (&self.oidc_issuer, &self.oidc_jwks) {
            (Some(issuer), Some(jwks)) => Some(OidcSettings {
                issuer: issuer.clone(),
                jwks: JwksSource::parse(jwks),
                audience: self.oidc_audience.clone(),
                namespace_claim: self.oidc_namespace_claim.clone(),
                namespace_prefix: self.oidc_namespace_prefix.clone(),
                identity: IdentityClaims {
                    username_claim: self.oidc_username_claim.clone(),
                    username_prefix: self.oidc_username_prefix.clone(),
                    groups_claim: self.oidc_groups_claim.clone(),
                    groups_prefix: self.oidc_groups_prefix.clone(),
                },
            }),
            (Some(_), None) => return Err(ConfigError::JwksMissing),
            (None, Some(_)) => return Err(ConfigError::IssuerMissing),
            (None, None) => None,
        };
        Ok(Settings {
            max_body_bytes: self.max_body_bytes,
            connect_timeout: Duration::from_secs(self.connect_timeout_seconds),
            response_timeout: Duration::from_secs(self.response_timeout_seconds),
            stream_idle_timeout: Duration::from_secs(self.stream_idle_timeout_seconds),
            wake_timeout: Duration::from_secs(self.wake_timeout_seconds),
            token_ttl: Duration::from_secs(self.token_ttl_seconds),
            drain_timeout: Duration::from_secs(self.drain_timeout_seconds),
            oidc,
        })
    }
}
