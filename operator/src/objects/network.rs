//! How the session is reached: a headless Service in front of its pod (its DNS name resolves
//! to the ready pod; see [`service`]), and a NetworkPolicy that admits
//! only its own namespace, the operator's and the configured monitoring namespace, and, when
//! the operator restricts egress, lets the pod reach only DNS and the configured blocks.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{AGENT_PORT, meta, object_name, selector_labels};
use crate::config::EgressPolicy;
use crate::validate::Plan;

/// `spec.clusterIP` of a headless Service.
pub const HEADLESS: &str = "None";

/// The session's Service: headless. `cairn-NAME.NS.svc` resolves to the session's ready pod,
/// with no ClusterIP: the API server allocates ClusterIPs one at a time (an IPAddress object
/// each; about eight a second on a two-core control plane, so 10,000 sessions would wait
/// twenty minutes for theirs), and every ClusterIP costs kube-proxy rules on every node. A
/// session has one pod, so a virtual IP balances nothing; a client that resolves the name
/// per connection follows a replaced pod.
pub(super) fn service(plan: &Plan) -> Service {
    Service {
        metadata: meta(plan, object_name(&plan.name)),
        spec: Some(ServiceSpec {
            cluster_ip: Some(HEADLESS.into()),
            selector: Some(selector_labels(&plan.name)),
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

pub(super) fn network_policy(plan: &Plan) -> NetworkPolicy {
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
        metadata: meta(plan, object_name(&plan.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&plan.name)),
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
