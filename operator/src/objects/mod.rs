//! `build`: every Kubernetes object of one session, as plain data. Pure: the same plan and
//! inputs always give the same objects, so the reconciler can apply them blindly and tests can
//! assert them field by field.

mod network;
mod rbac;
mod template;
mod workload;

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

use cairn_crds::names::SESSION_LABEL;

use crate::validate::Plan;

pub use template::expand_placeholders;
pub use workload::{RESTART_HASH_ANNOTATION, provider_key_env, restart_hash};

/// Field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "cairn-operator";

/// Labels on every object of a session (and on its pod).
pub fn labels(session: &str) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", "cairn-agent"),
        ("app.kubernetes.io/instance", session),
        ("app.kubernetes.io/managed-by", "cairn-operator"),
        (SESSION_LABEL, session),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The session's API bearer token. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(String);

impl ApiToken {
    /// 32 random bytes from the OS generator, hex-encoded.
    pub fn generate() -> Self {
        let bytes: [u8; 32] = rand::random();
        Self(hex::encode(bytes))
    }

    pub fn from_existing(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiToken(<redacted>)")
    }
}

/// What `build` needs beyond the plan: values read from Secrets by `dereference`.
#[derive(Clone, Debug, PartialEq)]
pub struct BuildInputs {
    pub api_token: ApiToken,
    /// Digest of the provider credential the pod sees (`None`: no credentials Secret).
    pub provider_secret_digest: Option<String>,
    /// Digest of the S3 key pair the pod sees.
    pub s3_secret_digest: Option<String>,
    /// Digest of the OTLP export headers the pod sees (`None`: no headers Secret configured,
    /// or it does not exist in the session's namespace yet).
    pub otlp_headers_digest: Option<String>,
}

/// All objects of one session, in apply order (identity and permissions first, so the pod
/// never starts without its ServiceAccount and Role): the ones it owns, and the namespace's
/// shared ones it needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionObjects {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub token_secret: Secret,
    /// The namespace's shared headless Service ([`cairn_crds::names::SESSIONS`]).
    pub service: Service,
    /// The namespace's shared NetworkPolicy ([`cairn_crds::names::SESSIONS`]).
    pub network_policy: NetworkPolicy,
    /// The session's own NetworkPolicy admitting the clients it names (`cairn-NAME`);
    /// `None` when it names none.
    pub clients_network_policy: Option<NetworkPolicy>,
    /// `None` while the session is suspended.
    pub pod: Option<Pod>,
}

/// Builds every object of the planned session.
pub fn build(plan: &Plan, inputs: &BuildInputs) -> SessionObjects {
    SessionObjects {
        service_account: rbac::service_account(plan),
        role: rbac::role(plan),
        role_binding: rbac::role_binding(plan),
        token_secret: workload::token_secret(plan, &inputs.api_token),
        service: network::sessions_service(plan),
        network_policy: network::sessions_network_policy(plan),
        clients_network_policy: network::clients_network_policy(plan),
        pod: workload::pod(plan, inputs),
    }
}

/// The session's token Secret alone; everything but its value depends on the plan only.
pub fn token_secret(plan: &Plan, token: &ApiToken) -> Secret {
    workload::token_secret(plan, token)
}

/// Metadata every owned object carries: name, namespace, labels and the controller owner
/// reference that garbage-collects it with the session.
fn meta(plan: &Plan, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(plan.namespace.clone()),
        labels: Some(labels(&plan.name)),
        owner_references: Some(vec![plan.owner.clone()]),
        ..Default::default()
    }
}

/// Digest of named Secret values, stable across key order; feeds the restart hash so that a
/// rotated credential rolls the pod.
pub fn secret_digest<'a>(values: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut pairs: Vec<(&str, &[u8])> = values.into_iter().collect();
    pairs.sort();
    let mut hasher = Sha256::new();
    for (key, value) in pairs {
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key.as_bytes());
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value);
    }
    hex::encode(&hasher.finalize()[..8])
}
