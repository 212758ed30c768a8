//! How sessions are reached. One pair of objects per namespace rather than per session: a
//! headless Service over every session pod of the namespace (each pod's hostname and
//! subdomain give it its own DNS name; see [`sessions_service`]), and a NetworkPolicy that
//! admits, on the agent's port, only the gateway's pods, the namespace's pods labelled
//! [`CLIENT_LABEL`]` = "true"` that are no session's agent, and the configured monitoring
//! namespace, and, when the operator restricts egress, lets the pods reach only DNS and the
//! configured blocks. Both depend on the namespace and the operator's configuration alone,
//! never on a session, so one of each serves every session of the namespace: a session
//! costs the API server no Service, no EndpointSlice and no NetworkPolicy of its own, and
//! the EndpointSlice controller syncs one Service per namespace instead of scanning every
//! Service of the namespace for each pod event. No session's agent can reach another's.
//!
//! A session that names clients of its own (`spec.network.clients`) gets one more
//! NetworkPolicy, `cairn-NAME`, owned by it, over its pod alone, admitting those pods
//! (NetworkPolicies add up: the shared one still admits the rest).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use cairn_crds::names::{AGENT_PORT, CLIENT_LABEL, SESSION_LABEL, SESSIONS, object_name};

use super::meta;
use crate::config::EgressPolicy;
use crate::validate::Plan;

/// `spec.clusterIP` of a headless Service.
pub const HEADLESS: &str = "None";

/// The labels every session pod carries and the shared objects select.
fn session_pods() -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", "cairn-agent"),
        ("app.kubernetes.io/managed-by", "cairn-operator"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Labels of the namespace's shared objects: the operator's, and no session's.
fn shared_labels() -> BTreeMap<String, String> {
    let mut labels = session_pods();
    labels.insert("app.kubernetes.io/component".into(), SESSIONS.into());
    labels
}

/// A shared object's metadata: no owner (it outlives any one session; the operator deletes
/// it when the namespace's last session is gone).
fn shared_meta(plan: &Plan) -> ObjectMeta {
    ObjectMeta {
        name: Some(SESSIONS.to_string()),
        namespace: Some(plan.namespace.clone()),
        labels: Some(shared_labels()),
        ..Default::default()
    }
}

/// The namespace's Service: headless, over every session pod. A pod's `hostname`
/// (`cairn-NAME`) and `subdomain` (this Service) make `cairn-NAME.cairn-sessions.NS.svc`
/// resolve to that session's ready pod. No ClusterIP: the API server allocates ClusterIPs one
/// at a time (an IPAddress object each; about eight a second on a two-core control plane, so
/// 10,000 sessions would wait twenty minutes for theirs), and every ClusterIP costs
/// kube-proxy rules on every node. A session has one pod, so a virtual IP balances nothing;
/// a client that resolves the name per connection follows a replaced pod.
pub(super) fn sessions_service(plan: &Plan) -> Service {
    Service {
        metadata: shared_meta(plan),
        spec: Some(ServiceSpec {
            cluster_ip: Some(HEADLESS.into()),
            selector: Some(session_pods()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: i32::from(AGENT_PORT),
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Peer: every pod of the namespace named `name`.
fn namespace_peer(name: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(
                [("kubernetes.io/metadata.name".to_string(), name.to_string())].into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// The egress rules when egress is restricted: DNS anywhere (if allowed) and each block.
fn egress_rules(egress: &EgressPolicy) -> Vec<NetworkPolicyEgressRule> {
    let mut rules = Vec::new();
    if egress.dns {
        rules.push(NetworkPolicyEgressRule {
            to: None,
            ports: Some(vec![
                NetworkPolicyPort {
                    port: Some(IntOrString::Int(53)),
                    protocol: Some("UDP".into()),
                    ..Default::default()
                },
                tcp(53),
            ]),
        });
    }
    for rule in &egress.to {
        rules.push(NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                ip_block: Some(IPBlock {
                    cidr: rule.cidr.clone(),
                    except: (!rule.except.is_empty()).then(|| rule.except.clone()),
                }),
                ..Default::default()
            }]),
            ports: (!rule.ports.is_empty())
                .then(|| rule.ports.iter().map(|p| tcp(i32::from(*p))).collect()),
        });
    }
    rules
}

/// Peer: the gateway's pods (by their namespace and labels).
fn gateway_peer(plan: &Plan) -> NetworkPolicyPeer {
    let gateway = &plan.network_policy.gateway;
    let namespace = gateway
        .namespace
        .as_deref()
        .unwrap_or(&plan.operator_namespace);
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(gateway.labels.clone()),
            ..Default::default()
        }),
        ..namespace_peer(namespace)
    }
}

/// Peer: the pods of the policy's namespace labelled as clients of every session, except
/// session pods (an agent pod labelled so through its template reaches no other session).
fn namespace_clients_peer() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some([(CLIENT_LABEL.to_string(), "true".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: SESSION_LABEL.into(),
                operator: "DoesNotExist".into(),
                values: None,
            }]),
        }),
        ..Default::default()
    }
}

/// The namespace's NetworkPolicy over every session pod.
pub(super) fn sessions_network_policy(plan: &Plan) -> NetworkPolicy {
    let mut from = vec![gateway_peer(plan), namespace_clients_peer()];
    if let Some(monitoring) = &plan.network_policy.monitoring_namespace {
        from.push(namespace_peer(monitoring));
    }
    let egress = plan.network_policy.egress.as_ref();
    let mut policy_types = vec!["Ingress".to_string()];
    if egress.is_some() {
        policy_types.push("Egress".into());
    }
    NetworkPolicy {
        metadata: shared_meta(plan),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(session_pods()),
                ..Default::default()
            }),
            policy_types: Some(policy_types),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(vec![tcp(i32::from(AGENT_PORT))]),
            }]),
            egress: egress.map(egress_rules),
        }),
    }
}

/// The session's own NetworkPolicy (`cairn-NAME`, owned by the session) when it names
/// clients: over its pod alone, admitting the pods of its namespace that `spec.network.clients`
/// selects on the agent's port. Ingress only: egress stays the shared policy's.
pub(super) fn clients_network_policy(plan: &Plan) -> Option<NetworkPolicy> {
    let clients = plan.spec.network.as_ref()?.clients.clone()?;
    let mut own_pod = session_pods();
    own_pod.insert(SESSION_LABEL.into(), plan.name.clone());
    Some(NetworkPolicy {
        metadata: meta(plan, object_name(&plan.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(own_pod),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(clients),
                    ..Default::default()
                }]),
                ports: Some(vec![tcp(i32::from(AGENT_PORT))]),
            }]),
            egress: None,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Defaults, GatewayPods, NetworkPolicyDefaults};
    use cairn_crds::AgentSession;
    use serde_json::{Value, json};

    fn plan(name: &str, spec: Value, network_policy: NetworkPolicyDefaults) -> Plan {
        let session: AgentSession = serde_json::from_value(json!({
            "apiVersion": "cairn.dev/v1alpha1",
            "kind": "AgentSession",
            "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
            "spec": spec,
        }))
        .expect("session fixture");
        let defaults = Defaults {
            operator_namespace: "cairn-system".into(),
            network_policy,
            ..Defaults::default()
        };
        crate::validate::validate(&session, None, &defaults).expect("fixture validates")
    }

    fn minimal() -> Value {
        json!({"provider": {"kind": "openai", "model": "gpt-5"}})
    }

    fn ingress(policy: &NetworkPolicy) -> Value {
        serde_json::to_value(&policy.spec.as_ref().expect("spec").ingress).expect("serializes")
    }

    const GATEWAY: &str = r#"{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "cairn-system"}},
                              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cairn-gateway"}}}"#;
    const CLIENTS: &str = r#"{"podSelector": {"matchLabels": {"cairn.dev/client": "true"},
                              "matchExpressions": [{"key": "cairn.dev/session", "operator": "DoesNotExist"}]}}"#;

    fn peer(text: &str) -> Value {
        serde_json::from_str(text).expect("peer fixture")
    }

    #[test]
    fn the_shared_policy_admits_the_gateway_and_labelled_clients_but_no_session_pod() {
        let policy = sessions_network_policy(&plan("a", minimal(), Default::default()));
        assert_eq!(
            ingress(&policy),
            json!([{"from": [peer(GATEWAY), peer(CLIENTS)],
                    "ports": [{"port": 8080, "protocol": "TCP"}]}])
        );
        let spec = policy.spec.as_ref().expect("spec");
        assert_eq!(
            spec.pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone()),
            Some(session_pods()),
            "every session pod of the namespace"
        );
        // Every agent pod carries the session label, so the client peer never selects one,
        // whatever labels its template adds.
        assert!(
            crate::objects::labels("a").contains_key(SESSION_LABEL),
            "agent pods carry the session label"
        );
        assert!(
            policy.metadata.owner_references.is_none(),
            "shared: no owner"
        );
    }

    #[test]
    fn the_shared_policy_is_the_same_for_every_session_of_the_namespace() {
        let a = sessions_network_policy(&plan("a", minimal(), Default::default()));
        let clients = json!({"provider": {"kind": "openai", "model": "gpt-5"},
                             "network": {"clients": {"matchLabels": {"app": "ui"}}}});
        let b = sessions_network_policy(&plan("b", clients, Default::default()));
        assert_eq!(a, b, "a session's clients never reach the shared policy");
    }

    #[test]
    fn the_gateway_peer_follows_the_configured_namespace_and_labels_and_monitoring_is_kept() {
        let configured = NetworkPolicyDefaults {
            monitoring_namespace: Some("monitoring".into()),
            gateway: GatewayPods {
                namespace: Some("edge".into()),
                labels: [
                    (
                        "app.kubernetes.io/name".to_string(),
                        "cairn-gateway".to_string(),
                    ),
                    ("app.kubernetes.io/instance".to_string(), "prod".to_string()),
                ]
                .into(),
            },
            egress: None,
        };
        let policy = sessions_network_policy(&plan("a", minimal(), configured));
        assert_eq!(
            ingress(&policy)[0]["from"],
            json!([
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cairn-gateway",
                                                 "app.kubernetes.io/instance": "prod"}}},
                peer(CLIENTS),
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
            ])
        );
        // The monitoring namespace is admitted even when it is the operator's: the operator's
        // namespace as a whole no longer is.
        let same = NetworkPolicyDefaults {
            monitoring_namespace: Some("cairn-system".into()),
            ..Default::default()
        };
        let policy = sessions_network_policy(&plan("a", minimal(), same));
        assert_eq!(
            ingress(&policy)[0]["from"][2],
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "cairn-system"}}})
        );
    }

    #[test]
    fn a_session_without_clients_has_no_policy_of_its_own() {
        assert_eq!(
            clients_network_policy(&plan("a", minimal(), Default::default())),
            None
        );
        let empty = json!({"provider": {"kind": "openai", "model": "gpt-5"}, "network": {}});
        assert_eq!(
            clients_network_policy(&plan("a", empty, Default::default())),
            None
        );
    }

    #[test]
    fn a_session_naming_clients_admits_them_to_its_own_pod_only() {
        let spec = json!({"provider": {"kind": "openai", "model": "gpt-5"},
                          "network": {"clients": {"matchLabels": {"app": "ui"},
                              "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}}});
        let policy = clients_network_policy(&plan("a", spec, Default::default())).expect("built");
        assert_eq!(policy.metadata.name.as_deref(), Some("cairn-a"));
        assert_eq!(policy.metadata.namespace.as_deref(), Some("team-a"));
        let owners = policy.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "owned by the session: deleted with it");
        assert_eq!(owners[0].uid, "uid-a");
        assert_eq!(owners[0].controller, Some(true));
        let spec = policy.spec.as_ref().expect("spec");
        assert_eq!(
            spec.pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref())
                .and_then(|l| l.get(SESSION_LABEL))
                .map(String::as_str),
            Some("a"),
            "selects this session's pod alone"
        );
        assert_eq!(spec.policy_types.clone().unwrap_or_default(), ["Ingress"]);
        assert!(spec.egress.is_none(), "egress stays the shared policy's");
        assert_eq!(
            ingress(&policy),
            json!([{"from": [{"podSelector": {"matchLabels": {"app": "ui"},
                      "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}}],
                    "ports": [{"port": 8080, "protocol": "TCP"}]}]),
            "only pods of the session's own namespace (no namespace selector)"
        );
    }
}
