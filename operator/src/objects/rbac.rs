//! The session's identity: a ServiceAccount and a Role that reaches only the session's own
//! objects.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use cairn_crds::names::{lease_name, object_name, token_secret_name};

use super::meta;
use crate::validate::Plan;

pub(super) fn service_account(plan: &Plan) -> ServiceAccount {
    let mut metadata = meta(plan, object_name(&plan.name));
    metadata.annotations = super::template::service_account_annotations(plan);
    ServiceAccount {
        metadata,
        // The agent talks to the API server with this identity.
        automount_service_account_token: Some(true),
        ..Default::default()
    }
}

pub(super) fn role(plan: &Plan) -> Role {
    Role {
        metadata: meta(plan, object_name(&plan.name)),
        rules: Some(rules(plan)),
    }
}

pub(super) fn role_binding(plan: &Plan) -> RoleBinding {
    let name = object_name(&plan.name);
    RoleBinding {
        metadata: meta(plan, name.clone()),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(plan.namespace.clone()),
            ..Default::default()
        }]),
    }
}

/// Every rule names its objects. Three exceptions the API forces: `create` on leases cannot be
/// limited by name (the name is not known when the request is authorized), nor can the
/// Events the agent creates and patches (each gets a new name), and `list`/`watch`
/// by name only work with a `metadata.name` field selector, which is how the agent watches.
fn rules(plan: &Plan) -> Vec<PolicyRule> {
    let session = plan.name.clone();
    let lease = lease_name(&plan.name);
    let mut secrets = vec![token_secret_name(&plan.name)];
    if let Some(creds) = &plan.spec.provider.credentials {
        secrets.push(creds.secret_name.clone());
    }
    if let Some(creds) = &plan.archive.credentials {
        secrets.push(creds.secret_name.clone());
    }
    if let Some(creds) = &plan.policy.summarizer.credentials {
        secrets.push(creds.secret_name.clone());
    }
    secrets.sort();
    secrets.dedup();

    let mut rules = vec![
        rule(
            "cairn.dev",
            "agentsessions",
            &[&session],
            &["get", "list", "watch"],
        ),
        rule(
            "cairn.dev",
            "agentsessions/status",
            &[&session],
            &["patch", "update"],
        ),
        rule(
            "",
            "secrets",
            &secrets.iter().map(String::as_str).collect::<Vec<_>>(),
            &["get"],
        ),
        rule(
            "coordination.k8s.io",
            "leases",
            &[&lease],
            &["get", "update"],
        ),
        rule("coordination.k8s.io", "leases", &[], &["create"]),
        // The agent's Events about its session (`Compacted`, `Recovered`, `RecoveryFailed`):
        // `create`, and `patch` to count a repeat into the first one's series. Not limited by
        // name: an Event's name is chosen when it is created.
        rule("events.k8s.io", "events", &[], &["create", "patch"]),
    ];
    if let Some(policy) = &plan.spec.policy_ref {
        rules.push(rule(
            "cairn.dev",
            "compactionpolicies",
            &[&policy.name],
            &["get", "list", "watch"],
        ));
    }
    rules
}

fn rule(group: &str, resource: &str, names: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(vec![resource.to_string()]),
        resource_names: (!names.is_empty()).then(|| strings(names)),
        verbs: strings(verbs),
        ..Default::default()
    }
}
