//! How sessions are reached, one pair of objects per namespace rather than per session: a
//! headless Service over every session pod of the namespace (each pod's hostname and
//! subdomain give it its own DNS name; see [`sessions_service`]), and a NetworkPolicy that
//! admits only its own namespace, the operator's and the configured monitoring namespace,
//! and, when the operator restricts egress, lets the pods reach only DNS and the configured
//! blocks. Both depend on the namespace and the operator's configuration alone, never on a
//! session, so one of each serves every session of the namespace: a session costs the API
//! server no Service, no EndpointSlice and no NetworkPolicy of its own, and the
//! EndpointSlice controller syncs one Service per namespace instead of scanning every
//! Service of the namespace for each pod event.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{AGENT_PORT, SESSIONS};
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
                port: AGENT_PORT,
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

/// The namespace's NetworkPolicy over every session pod.
pub(super) fn sessions_network_policy(plan: &Plan) -> NetworkPolicy {
    let same_namespace = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector::default()),
        ..Default::default()
    };
    let mut from = vec![same_namespace, namespace_peer(&plan.operator_namespace)];
    if let Some(monitoring) = &plan.network_policy.monitoring_namespace
        && monitoring != &plan.operator_namespace
    {
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
                ports: Some(vec![tcp(AGENT_PORT)]),
            }]),
            egress: egress.map(egress_rules),
        }),
    }
}
