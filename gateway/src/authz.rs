//! Whether a lifecycle caller may make a call: a SubjectAccessReview for the caller's
//! Kubernetes identity, asked of the API server before the gateway makes the call with its
//! own, narrow role (the pattern of kube-rbac-proxy). The gateway never acts as its caller:
//! it needs no `impersonate`, and Kubernetes RBAC still decides.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::auth::Identity;

/// The API group and resource of every lifecycle call.
pub const GROUP: &str = "cairn.dev";
pub const RESOURCE: &str = "agentsessions";

/// A lifecycle call to authorize: a verb on AgentSessions of a namespace (one by name, or
/// the collection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    pub verb: &'static str,
    pub namespace: &'a str,
    pub name: Option<&'a str>,
}

/// The review asking whether `who` may make `call`. Pure.
pub fn review(who: &Identity, call: &Call<'_>) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(who.user.clone()),
            groups: Some(who.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(RESOURCE.into()),
                verb: Some(call.verb.into()),
                namespace: Some(call.namespace.into()),
                name: call.name.filter(|n| !n.is_empty()).map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The refusal in the API server's own words (who, which verb, which resource, where), with
/// the authorizer's reason when it gave one. Pure.
pub fn refusal(who: &Identity, call: &Call<'_>, reason: Option<&str>) -> String {
    let object = match call.name.filter(|n| !n.is_empty()) {
        Some(n) => format!("{RESOURCE}.{GROUP} {n:?}"),
        None => format!("{RESOURCE}.{GROUP}"),
    };
    let mut m = format!(
        "{object} is forbidden: User {:?} cannot {} resource {RESOURCE:?} in API group {GROUP:?} in the namespace {:?}",
        who.user, call.verb, call.namespace
    );
    if let Some(r) = reason.filter(|r| !r.is_empty()) {
        m.push_str(": ");
        m.push_str(r);
    }
    m
}

/// The API server's answer to a review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Not allowed, with the authorizer's reason (may be empty).
    Denied(String),
}

/// Asks the API server (with the gateway's own identity: `create` on
/// `subjectaccessreviews`).
pub async fn authorize(
    client: &kube::Client,
    who: &Identity,
    call: &Call<'_>,
) -> Result<Decision, kube::Error> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let answered = api
        .create(&PostParams::default(), &review(who, call))
        .await?;
    let status = answered.status.unwrap_or_default();
    if status.allowed && status.denied != Some(true) {
        Ok(Decision::Allowed)
    } else {
        let reason = [status.reason, status.evaluation_error]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        Ok(Decision::Denied(reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        Identity {
            user: "oidc:alice".into(),
            groups: vec!["oidc:devs".into()],
        }
    }

    #[test]
    fn the_review_names_the_caller_and_exactly_the_call() {
        let call = Call {
            verb: "delete",
            namespace: "team-a",
            name: Some("chat"),
        };
        let r = review(&alice(), &call);
        assert_eq!(r.spec.user.as_deref(), Some("oidc:alice"));
        assert_eq!(r.spec.groups, Some(vec!["oidc:devs".to_string()]));
        let a = r.spec.resource_attributes.expect("resource attributes");
        assert_eq!(
            (
                a.group.as_deref(),
                a.resource.as_deref(),
                a.verb.as_deref(),
                a.namespace.as_deref(),
                a.name.as_deref()
            ),
            (
                Some("cairn.dev"),
                Some("agentsessions"),
                Some("delete"),
                Some("team-a"),
                Some("chat")
            )
        );
        let list = review(
            &alice(),
            &Call {
                verb: "list",
                namespace: "team-a",
                name: None,
            },
        );
        assert_eq!(list.spec.resource_attributes.and_then(|a| a.name), None);
    }

    #[test]
    fn the_refusal_reads_like_the_api_servers() {
        let m = refusal(
            &alice(),
            &Call {
                verb: "create",
                namespace: "team-b",
                name: Some("chat"),
            },
            None,
        );
        assert_eq!(
            m,
            r#"agentsessions.cairn.dev "chat" is forbidden: User "oidc:alice" cannot create resource "agentsessions" in API group "cairn.dev" in the namespace "team-b""#
        );
    }
}
