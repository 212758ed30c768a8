//! cairn's custom resources and the pure logic that both the operator and the agent need:
//! the `AgentSession` and `CompactionPolicy` types (with their CEL rules and descriptions),
//! policy resolution with its stable hash, and payload-size parsing.

pub mod payload;
pub mod policy;
pub mod session;
#[doc(hidden)]
pub mod testing;

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
    [AgentSession::crd(), CompactionPolicy::crd()]
        .into_iter()
        .map(unwrap_descriptions)
        .collect()
}

/// Doc comments are wrapped at ~100 columns; the line breaks would reach `kubectl explain`
/// verbatim (which wraps again, and does not render some multi-line descriptions of object
/// fields at all). Joins the lines of each paragraph; blank-line paragraph breaks stay.
fn unwrap_descriptions(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, child) in map.iter_mut() {
                    match child {
                        serde_json::Value::String(s) if k == "description" => {
                            *s = s
                                .split("\n\n")
                                .map(|para| {
                                    para.split('\n')
                                        .map(str::trim)
                                        .collect::<Vec<_>>()
                                        .join(" ")
                                })
                                .collect::<Vec<_>>()
                                .join("\n\n");
                        }
                        _ => walk(child),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    walk(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
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
