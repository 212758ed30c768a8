//! What a provider is built with from an AgentSession's `spec.provider`: endpoints,
//! credentials, client options and the build errors (`factory` picks the client).

use std::time::Duration;

use cairn_crds::ProviderKind;
use tokio_util::sync::CancellationToken;

use super::retry::RetryPolicy;
use crate::aws::AwsIdentity;

/// A credential string. Its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for building an authentication header and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What a provider authenticates with.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// API key (OpenAI, Anthropic, Gemini, OpenAI-compatible) or Bedrock API key (bearer).
    pub api_key: Option<Secret>,
    /// The AWS identity for SigV4 (Bedrock); `None` is the SDK's default chain.
    pub aws: Option<AwsIdentity>,
}

impl Credentials {
    pub fn api_key(key: impl Into<String>) -> Self {
        Self {
            api_key: Some(Secret::new(key)),
            aws: None,
        }
    }

    /// The conventional environment variables of each provider: `OPENAI_API_KEY`,
    /// `ANTHROPIC_API_KEY`, `GEMINI_API_KEY` (or `GOOGLE_API_KEY`), and for Bedrock
    /// `AWS_BEARER_TOKEN_BEDROCK`, else a credentials directory `CAIRN_BEDROCK_CREDENTIALS_DIR`,
    /// else the SDK's default chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/
    /// `AWS_SESSION_TOKEN`, a web identity token, the container endpoint, IMDS).
    pub fn from_env(kind: ProviderKind) -> Self {
        Self::from_lookup(kind, |name| std::env::var(name).ok())
    }

    /// Like [`Credentials::from_env`] with an injected lookup (testable without touching the
    /// process environment).
    pub fn from_lookup(kind: ProviderKind, get: impl Fn(&str) -> Option<String>) -> Self {
        let first = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| get(n).filter(|v| !v.is_empty()))
                .map(Secret::new)
        };
        match kind {
            ProviderKind::Openai | ProviderKind::OpenaiResponses => Self {
                api_key: first(&["OPENAI_API_KEY"]),
                aws: None,
            },
            ProviderKind::OpenaiCompatible => Self {
                api_key: first(&["OPENAI_COMPATIBLE_API_KEY", "OPENAI_API_KEY"]),
                aws: None,
            },
            ProviderKind::Anthropic => Self {
                api_key: first(&["ANTHROPIC_API_KEY"]),
                aws: None,
            },
            ProviderKind::Gemini => Self {
                api_key: first(&["GEMINI_API_KEY", "GOOGLE_API_KEY"]),
                aws: None,
            },
            ProviderKind::Bedrock => Self {
                api_key: first(&["AWS_BEARER_TOKEN_BEDROCK"]),
                aws: Some(
                    get("CAIRN_BEDROCK_CREDENTIALS_DIR")
                        .filter(|d| !d.trim().is_empty())
                        .map_or(AwsIdentity::Chain, |d| {
                            AwsIdentity::Directory(crate::aws::DirectoryCredentials::new(d))
                        }),
                ),
            },
        }
    }
}

/// Timeouts, retries and cancellation of one provider client.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    /// Longest wait for the response headers (a model may think for minutes before
    /// answering a non-streamed request).
    pub response_timeout: Duration,
    /// Longest silence between two chunks of a body or stream: a stream cut without a close
    /// ends in an error instead of a hang.
    pub idle_timeout: Duration,
    pub retry: RetryPolicy,
    /// Cancels every in-flight call of this client when fired.
    pub cancel: Option<CancellationToken>,
    /// Headers added to every request (gateways, OpenRouter's attribution headers). Their
    /// values are treated as sensitive and never logged.
    pub extra_headers: Vec<(String, String)>,
    /// Trusted authorities and forward proxies (`crate::net`).
    pub net: crate::net::NetPath,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(120),
            retry: RetryPolicy::default(),
            cancel: None,
            extra_headers: Vec::new(),
            net: crate::net::NetPath::default(),
        }
    }
}

/// A provider could not be built from its spec.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("provider {kind} needs credentials: {hint}")]
    MissingCredentials { kind: &'static str, hint: String },
    #[error("bedrock needs provider.region (or a baseUrl)")]
    MissingRegion,
    #[error("invalid provider.baseUrl: {0}")]
    BaseUrl(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl BuildError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::MissingCredentials { .. } => "missing_credentials",
            Self::MissingRegion => "missing_region",
            Self::BaseUrl(_) => "bad_base_url",
            Self::Client(_) => "http_client",
        }
    }
}

/// The public endpoint of a provider kind (Bedrock needs a region).
pub fn default_base_url(kind: ProviderKind, region: Option<&str>) -> Option<String> {
    Some(match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses => "https://api.openai.com/v1".into(),
        ProviderKind::Anthropic => "https://api.anthropic.com".into(),
        ProviderKind::Gemini => "https://generativelanguage.googleapis.com".into(),
        ProviderKind::Bedrock => format!("https://bedrock-runtime.{}.amazonaws.com", region?),
        ProviderKind::OpenaiCompatible => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Anthropic, Bedrock, BedrockAuth, Gemini, OpenAiChat, OpenAiResponses};
    use super::*;

    #[test]
    fn secrets_never_show_in_debug_or_display() {
        let c = Credentials {
            api_key: Some(Secret::new("sk-live-123")),
            aws: Some(AwsIdentity::fixed(
                "AKIDEXAMPLE",
                "wJalrXUtnFEMI",
                Some("tok-abc".into()),
            )),
        };
        let text = format!("{c:?} {}", Secret::new("sk-live-123"));
        for s in ["sk-live-123", "wJalrXUtnFEMI", "tok-abc"] {
            assert!(!text.contains(s), "{s} leaked: {text}");
        }
    }

    #[test]
    fn provider_debug_output_redacts_keys() {
        let o = ClientOptions::default;
        let key = || Secret::new("sk-very-secret");
        let shown = [
            format!(
                "{:?}",
                OpenAiChat::new("openai", "http://h/v1", Some(key()), false, o()).unwrap()
            ),
            format!(
                "{:?}",
                OpenAiResponses::new("http://h/v1", key(), o()).unwrap()
            ),
            format!("{:?}", Anthropic::new("http://h", key(), o()).unwrap()),
            format!("{:?}", Gemini::new("http://h", key(), o()).unwrap()),
            format!(
                "{:?}",
                Bedrock::new("http://h", "us-east-1", BedrockAuth::ApiKey(key()), o()).unwrap()
            ),
        ];
        for s in shown {
            assert!(
                !s.contains("sk-very-secret") && s.contains("redacted"),
                "{s}"
            );
        }
    }

    #[test]
    fn env_lookup_follows_each_providers_convention() {
        let env = |n: &str| match n {
            "ANTHROPIC_API_KEY" => Some("a".to_string()),
            "GOOGLE_API_KEY" => Some("g".to_string()),
            "CAIRN_BEDROCK_CREDENTIALS_DIR" => Some("/run/bedrock".to_string()),
            _ => None,
        };
        let a = Credentials::from_lookup(ProviderKind::Anthropic, env);
        assert_eq!(a.api_key.as_ref().map(Secret::expose), Some("a"));
        let g = Credentials::from_lookup(ProviderKind::Gemini, env);
        assert_eq!(g.api_key.as_ref().map(Secret::expose), Some("g"));
        let b = Credentials::from_lookup(ProviderKind::Bedrock, env);
        assert!(b.api_key.is_none());
        assert!(
            matches!(&b.aws, Some(AwsIdentity::Directory(d)) if d.dir() == std::path::Path::new("/run/bedrock"))
        );
        assert!(
            Credentials::from_lookup(ProviderKind::Openai, env)
                .api_key
                .is_none()
        );
    }
}
