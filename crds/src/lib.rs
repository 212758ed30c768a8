//! cairn's custom resources and the pure logic that both the operator and the agent need:
//! the `AgentSession` and `CompactionPolicy` types (with their CEL rules and descriptions),
//! policy resolution with its stable hash, payload-size parsing, RFC 3339 timestamps, and
//! the names of a session's objects (`names`).

pub mod names;
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
/// The version of the Rust types: served, and the storage version.
pub const VERSION: &str = "v1beta1";
/// Earlier versions, still served (deprecated) with the same schema, never stored. Objects an
/// earlier release stored under one of them are rewritten by the operator at start-up
/// (docs/operator.md, "CRD versions"). Newest first.
pub const OLDER_VERSIONS: &[&str] = &["v1alpha1"];

/// All of cairn's CRDs, in a stable order: one per kind, serving [`VERSION`] (stored) and
/// every one of [`OLDER_VERSIONS`].
pub fn crds() -> Vec<CustomResourceDefinition> {
    [AgentSession::crd(), CompactionPolicy::crd()]
        .into_iter()
        .map(unwrap_descriptions)
        .map(with_older_versions)
        .collect()
}

/// The names of cairn's CRDs (`<plural>.<group>`), as RBAC's `resourceNames` lists them.
pub fn crd_names() -> Vec<String> {
    crds()
        .into_iter()
        .filter_map(|crd| crd.metadata.name)
        .collect()
}

/// `crd` (one version, [`VERSION`], generated from the types) with each of
/// [`OLDER_VERSIONS`] added after it: a copy of the same version entry (schema, printer
/// columns, subresources) that is served, not stored and deprecated. The schemas are
/// identical, so the API server converts between the versions by changing `apiVersion` alone
/// (conversion strategy `None`, no webhook). kube's `merge_crds` does the same from one Rust
/// type per version; one type and copied entries keep the schemas identical by construction.
fn with_older_versions(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let Some(current) = crd.spec.versions.first().cloned() else {
        return crd;
    };
    let kind = crd.spec.names.kind.clone();
    for old in OLDER_VERSIONS {
        let mut version = current.clone();
        version.name = (*old).to_string();
        version.served = true;
        version.storage = false;
        version.deprecated = Some(true);
        version.deprecation_warning = Some(format!(
            "{GROUP}/{old} {kind} is deprecated; use {GROUP}/{VERSION} (the same fields)"
        ));
        crd.spec.versions.push(version);
    }
    crd
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
mod version_tests {
    use super::*;

    #[test]
    fn every_kind_serves_both_versions_and_stores_only_the_current_one() {
        let crds = crds();
        assert_eq!(crds.len(), 2);
        for crd in &crds {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
            assert_eq!(versions, ["v1beta1", "v1alpha1"], "{name}");
            assert!(crd.spec.versions.iter().all(|v| v.served), "{name}");
            let stored: Vec<&str> = crd
                .spec
                .versions
                .iter()
                .filter(|v| v.storage)
                .map(|v| v.name.as_str())
                .collect();
            assert_eq!(stored, [VERSION], "{name}: exactly one storage version");
            // Identical schemas: no conversion webhook is needed.
            assert!(crd.spec.conversion.is_none(), "{name}: strategy None");
            let current = &crd.spec.versions[0];
            let old = &crd.spec.versions[1];
            assert_eq!(old.schema, current.schema, "{name}");
            assert_eq!(
                old.additional_printer_columns, current.additional_printer_columns,
                "{name}"
            );
            assert_eq!(old.subresources, current.subresources, "{name}");
            assert_eq!(current.deprecated, None, "{name}");
            assert_eq!(old.deprecated, Some(true), "{name}");
            assert!(
                old.deprecation_warning
                    .as_deref()
                    .is_some_and(|w| w.contains("cairn.dev/v1beta1")),
                "{name}: {:?}",
                old.deprecation_warning
            );
        }
    }

    #[test]
    fn the_types_speak_the_storage_version() {
        use kube_core::Resource;
        assert_eq!(AgentSession::api_version(&()), "cairn.dev/v1beta1");
        assert_eq!(CompactionPolicy::api_version(&()), "cairn.dev/v1beta1");
        assert_eq!(
            crd_names(),
            ["agentsessions.cairn.dev", "compactionpolicies.cairn.dev"]
        );
    }
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
