//! cairn's custom resources and the pure logic that both the operator and the agent need:
//! the `AgentSession` and `CompactionPolicy` types (with their CEL rules and descriptions),
//! policy resolution with its stable hash, payload-size parsing and RFC 3339 timestamps.

pub mod payload;
pub mod policy;
pub mod provider;
pub mod session;
#[doc(hidden)]
pub mod testing;
pub mod time;

pub use payload::{PayloadSize, PayloadSizeError, parse_payload_size};
pub use policy::{CompactionPolicy, CompactionPolicySpec, EffectivePolicy, PolicyError, resolve};
pub use session::{
    AgentSession, AgentSessionSpec, AgentSessionStatus, Phase, ProviderKind, ProviderSpec,
    SessionStats,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;

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
        out.push_str(&to_yaml(&crd)?);
    }
    Ok(out)
}

/// One CRD as YAML that YAML 1.1 readers read the same: serde_yaml writes YAML 1.2, where
/// `off`, `on`, `yes` and `no` are plain strings, but Helm and kubectl read them as booleans
/// (an enum value `off` would arrive as `false`). Those words are quoted.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    let yaml = serde_yaml::to_string(crd)?;
    Ok(yaml.lines().map(yaml11_safe_line).fold(
        String::with_capacity(yaml.len()),
        |mut out, line| {
            out.push_str(&line);
            out.push('\n');
            out
        },
    ))
}

/// Plain scalars YAML 1.1 reads as booleans and YAML 1.2 as strings.
const YAML11_BOOLEANS: [&str; 16] = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
    "OFF",
];

/// `line` with a YAML 1.1 boolean word quoted where it stands as a whole plain value (a list
/// item `- off` or a mapping value `key: off`).
fn yaml11_safe_line(line: &str) -> String {
    let quote = |prefix: &str, value: &str| format!("{prefix}'{value}'");
    let trimmed = line.trim_start();
    let indent = &line[..line.len() - trimmed.len()];
    if let Some(value) = trimmed.strip_prefix("- ")
        && YAML11_BOOLEANS.contains(&value)
    {
        return quote(&format!("{indent}- "), value);
    }
    if let Some((key, value)) = trimmed.split_once(": ")
        && YAML11_BOOLEANS.contains(&value)
        && !key.contains(' ')
    {
        return quote(&format!("{indent}{key}: "), value);
    }
    line.to_owned()
}

#[cfg(test)]
mod yaml_tests {
    #[test]
    fn yaml11_booleans_are_quoted_and_read_back_as_strings() {
        let yaml = super::crds_yaml().expect("yaml");
        assert!(
            yaml.contains("- 'off'"),
            "the compression mode off is quoted"
        );
        for line in yaml.lines() {
            let t = line.trim_start();
            let value = t
                .strip_prefix("- ")
                .or_else(|| t.split_once(": ").map(|(_, v)| v));
            assert!(
                !value.is_some_and(|v| super::YAML11_BOOLEANS.contains(&v)),
                "unquoted YAML 1.1 boolean: {line}"
            );
        }
        assert_eq!(super::yaml11_safe_line("  key: on"), "  key: 'on'");
        assert_eq!(super::yaml11_safe_line("  - offline"), "  - offline");
        assert_eq!(
            super::yaml11_safe_line("  description: no way"),
            "  description: no way"
        );
    }
}
