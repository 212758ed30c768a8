//! Which API a provider speaks and where its key lives: the vocabulary both an AgentSession's
//! provider and a CompactionPolicy's summarizer use (`session` and `policy` build on it).

use kube_derive::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API family of a provider.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    Openai,
    OpenaiResponses,
    Anthropic,
    Gemini,
    Bedrock,
    OpenaiCompatible,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 6] = [
        Self::Openai,
        Self::OpenaiResponses,
        Self::Anthropic,
        Self::Gemini,
        Self::Bedrock,
        Self::OpenaiCompatible,
    ];

    /// The name used in the CRD, in metrics labels and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::OpenaiResponses => "openai-responses",
            Self::Anthropic => "anthropic",
            Self::Gemini => "gemini",
            Self::Bedrock => "bedrock",
            Self::OpenaiCompatible => "openai-compatible",
        }
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key of a Secret in the session's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')").message("secretName must be a valid Secret name"))]
    pub secret_name: String,
    /// Key within the Secret. Default: `api-key`.
    #[serde(default = "default_api_key")]
    #[x_kube(validation = Rule::new("size(self) > 0 && size(self) <= 253").message("key must be 1 to 253 characters"))]
    pub key: String,
}

fn default_api_key() -> String {
    "api-key".into()
}
