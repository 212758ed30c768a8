//! cairn's custom resources and the pure logic that both the operator and the agent need:
//! the `AgentSession` and `CompactionPolicy` types (with their CEL rules and descriptions),
//! policy resolution with its stable hash, and payload-size parsing.

pub mod payload;
pub mod policy;
pub mod session;

pub use payload::{PayloadSize, PayloadSizeError, parse_payload_size};
pub use policy::{CompactionPolicy, CompactionPolicySpec, EffectivePolicy, PolicyError, resolve};
pub use session::{
    AgentSession, AgentSessionSpec, AgentSessionStatus, Phase, ProviderKind, ProviderSpec,
    SessionStats,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// API group of every cairn resource.
pub const GROUP: &str = "cairn.dev";
/// Served and stored version.
pub const VERSION: &str = "v1alpha1";

/// All of cairn's CRDs, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![AgentSession::crd(), CompactionPolicy::crd()]
}

/// The CRDs as one multi-document YAML stream (what `crdgen` writes and the operator applies).
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
