//! How the session is reached: a Service in front of its pod, and a NetworkPolicy that admits
//! only its own namespace and the operator's.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{AGENT_PORT, meta, object_name, selector_labels};
use crate::validate::Plan;

pub(super) fn service(plan: &Plan) -> Service {
    Service {
        metadata: meta(plan, object_name(&plan.name)),
        spec: Some(ServiceSpec {
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

pub(super) fn network_policy(plan: &Plan) -> NetworkPolicy {
    let same_namespace = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector::default()),
        ..Default::default()
    };
    let operator_namespace = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(
                [(
                    "kubernetes.io/metadata.name".to_string(),
                    plan.operator_namespace.clone(),
                )]
                .into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    NetworkPolicy {
        metadata: meta(plan, object_name(&plan.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&plan.name)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![same_namespace, operator_namespace]),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(AGENT_PORT)),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
            }]),
            ..Default::default()
        }),
    }
}
