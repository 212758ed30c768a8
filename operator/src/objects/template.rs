//! The session pod's pass-through settings: the operator's fleet-wide pod defaults
//! (`--agent-pod-defaults`) and the session's `spec.template`. Pod labels and annotations
//! merge key by key with the session winning; pull secrets are the union; affinity,
//! tolerations, topology spread and priority class are the session's when it sets them, else
//! the defaults. Two are the platform's to enforce, because a session author could use them
//! to step out of what the platform decided: the ServiceAccount annotations the operator sets
//! (an IRSA role per session) and its runtime class (a sandbox) win over the session's. The
//! operator's own labels and the restart-hash annotation are set last, so nothing overrides
//! them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, PodSpec};

use crate::validate::Plan;

/// Replaces `{namespace}` and `{session}` in a ServiceAccount annotation value, e.g.
/// `arn:aws:iam::123:role/cairn-{namespace}-{session}`.
pub fn expand_placeholders(value: &str, namespace: &str, session: &str) -> String {
    value
        .replace("{namespace}", namespace)
        .replace("{session}", session)
}

fn merged(
    defaults: &BTreeMap<String, String>,
    session: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut out = defaults.clone();
    out.extend(
        session
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    out
}

/// The pod's labels: defaults, the session's, then the operator's (which win).
pub(super) fn pod_labels(plan: &Plan, own: BTreeMap<String, String>) -> BTreeMap<String, String> {
    let template = plan.spec.template.as_ref();
    let mut out = merged(&plan.pod.labels, template.and_then(|t| t.labels.as_ref()));
    out.extend(own);
    out
}

/// The pod's annotations before the operator adds its own.
pub(super) fn pod_annotations(plan: &Plan) -> BTreeMap<String, String> {
    let template = plan.spec.template.as_ref();
    merged(
        &plan.pod.annotations,
        template.and_then(|t| t.annotations.as_ref()),
    )
}

/// The ServiceAccount's annotations, placeholders expanded; `None` when there are none. The
/// operator's keys win: a session adds annotations but cannot point its identity at a role
/// the platform did not give it.
pub(super) fn service_account_annotations(plan: &Plan) -> Option<BTreeMap<String, String>> {
    let template = plan.spec.template.as_ref();
    let session = template
        .and_then(|t| t.service_account_annotations.clone())
        .unwrap_or_default();
    let out: BTreeMap<String, String> =
        merged(&session, Some(&plan.pod.service_account_annotations))
            .into_iter()
            .map(|(k, v)| {
                let v = expand_placeholders(&v, &plan.namespace, &plan.name);
                (k, v)
            })
            .collect();
    (!out.is_empty()).then_some(out)
}

/// Sets the scheduling and pull settings on `pod`.
pub(super) fn apply_to_pod(plan: &Plan, pod: &mut PodSpec) {
    let template = plan.spec.template.as_ref();
    let d = &plan.pod;
    let mut pull: Vec<String> = d.image_pull_secrets.clone();
    pull.extend(
        template
            .and_then(|t| t.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone()),
    );
    let mut seen = std::collections::BTreeSet::new();
    pull.retain(|n| !n.is_empty() && seen.insert(n.clone()));
    pod.image_pull_secrets = (!pull.is_empty()).then(|| {
        pull.into_iter()
            .map(|name| LocalObjectReference { name })
            .collect()
    });
    pod.affinity = template
        .and_then(|t| t.affinity.clone())
        .or_else(|| d.affinity.clone());
    pod.tolerations = template
        .and_then(|t| t.tolerations.clone())
        .or_else(|| (!d.tolerations.is_empty()).then(|| d.tolerations.clone()));
    pod.topology_spread_constraints = template
        .and_then(|t| t.topology_spread_constraints.clone())
        .or_else(|| {
            (!d.topology_spread_constraints.is_empty())
                .then(|| d.topology_spread_constraints.clone())
        });
    pod.priority_class_name = template
        .and_then(|t| t.priority_class_name.clone())
        .or_else(|| d.priority_class_name.clone());
    // The platform's sandbox, when it sets one, is not the session's to leave.
    pod.runtime_class_name = d
        .runtime_class_name
        .clone()
        .or_else(|| template.and_then(|t| t.runtime_class_name.clone()));
}
