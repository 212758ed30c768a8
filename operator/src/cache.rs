//! Caches of the objects the operator owns: reflector stores fed by the controller's own
//! watches of them, so that a reconcile which would change nothing sends nothing.
//!
//! Every applied object carries [`APPLIED_ANNOTATION`], a digest of the object as the operator
//! built it. An object is current when the cached copy carries the digest of what the
//! reconcile just built (nothing was added or removed since the last apply) and every field
//! the operator sets still has the built value (nobody edited one of them). Only then is the
//! apply skipped; in any doubt (a cache not synced yet, a value the API server normalised) the
//! object is applied, which the API server turns into a no-op.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Resource;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Annotation holding the digest of the object as last built and applied by the operator.
pub const APPLIED_ANNOTATION: &str = "cairn.dev/applied";

/// How long a reconcile waits for the caches' first list before it applies without them.
pub const READY_WAIT: Duration = Duration::from_secs(30);

/// The stores of one controller (one watched scope).
#[derive(Clone)]
pub struct Stores {
    pub service_accounts: Store<ServiceAccount>,
    pub roles: Store<Role>,
    pub role_bindings: Store<RoleBinding>,
    /// Metadata only: the operator never caches a Secret's values.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    pub services: Store<Service>,
    pub network_policies: Store<NetworkPolicy>,
    pub stateful_sets: Store<StatefulSet>,
}

impl Stores {
    /// Whether every store has seen its first complete list (waiting up to `wait`). The
    /// token Secrets' store is not waited for: where the operator may not list Secrets
    /// (the chart grants list/watch on Secrets only in `secretWatchNamespaces`) it never
    /// fills, and a Secret it does not hold is simply created, keeping an existing token.
    pub async fn ready(&self, wait: Duration) -> bool {
        let all = async {
            self.service_accounts.wait_until_ready().await.is_ok()
                && self.roles.wait_until_ready().await.is_ok()
                && self.role_bindings.wait_until_ready().await.is_ok()
                && self.services.wait_until_ready().await.is_ok()
                && self.network_policies.wait_until_ready().await.is_ok()
                && self.stateful_sets.wait_until_ready().await.is_ok()
        };
        tokio::time::timeout(wait, all).await.unwrap_or(false)
    }
}

/// Hex digest (128 bits) of a JSON value; serde_json writes maps in key order, so equal
/// objects give equal digests.
pub fn digest(value: &Value) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..16])
}

/// `object` with [`APPLIED_ANNOTATION`] set to `digest`.
pub fn stamped<K: Resource + Clone>(object: &K, digest: String) -> K {
    let mut out = object.clone();
    out.meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(APPLIED_ANNOTATION.to_string(), digest);
    out
}

/// Whether `actual` holds every value of `desired`: objects key by key (extra keys in
/// `actual` are the API server's defaults and other managers' fields), arrays element by
/// element with the same length, scalars equal. An empty object or array in `desired` also
/// matches a missing one (the API server drops them).
pub fn covers(desired: &Value, actual: Option<&Value>) -> bool {
    match (desired, actual) {
        (Value::Object(d), None) => d.is_empty(),
        (Value::Array(d), None) => d.is_empty(),
        (Value::Null, None) => true,
        (_, None) => false,
        (Value::Object(d), Some(Value::Object(a))) => d.iter().all(|(k, v)| covers(v, a.get(k))),
        (Value::Array(d), Some(Value::Array(a))) => {
            d.len() == a.len() && d.iter().zip(a).all(|(x, y)| covers(x, Some(y)))
        }
        (d, Some(a)) => d == a,
    }
}

/// Whether the cached copy of `stamped` (an object stamped with its digest) is current.
pub fn current<K>(store: &Store<K>, stamped: &K) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + 'static,
{
    let cached = store.get(&ObjectRef::from_obj(stamped))?;
    let desired = serde_json::to_value(stamped).ok()?;
    let actual = serde_json::to_value(cached.as_ref()).ok()?;
    covers(&desired, Some(&actual)).then_some(cached)
}

/// The token Secret's digest covers its metadata and type, never its value: the token is
/// never regenerated, so its value is not read again once the Secret is current.
pub fn secret_digest(secret: &Secret) -> String {
    digest(&serde_json::json!({
        "metadata": secret.metadata,
        "type": secret.type_,
    }))
}

/// Whether the cached metadata of the stamped token Secret is current.
pub fn secret_current(store: &Store<PartialObjectMeta<Secret>>, stamped: &Secret) -> bool {
    let reference = ObjectRef::<PartialObjectMeta<Secret>>::new(
        stamped.metadata.name.as_deref().unwrap_or_default(),
    )
    .within(stamped.metadata.namespace.as_deref().unwrap_or_default());
    let Some(cached) = store.get(&reference) else {
        return false;
    };
    match (
        serde_json::to_value(&stamped.metadata),
        serde_json::to_value(&cached.metadata),
    ) {
        (Ok(desired), Ok(actual)) => covers(&desired, Some(&actual)),
        _ => false,
    }
}

/// Whether the store holds the Secret at all.
pub fn secret_cached(
    store: &Store<PartialObjectMeta<Secret>>,
    namespace: &str,
    name: &str,
) -> bool {
    store
        .get(&ObjectRef::<PartialObjectMeta<Secret>>::new(name).within(namespace))
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn covers_ignores_server_defaults_but_not_edits() {
        let desired = json!({"spec": {"replicas": 1, "ports": [{"port": 8080}]}, "labels": {}});
        let defaulted = json!({"spec": {"replicas": 1, "ports": [{"port": 8080, "protocol": "TCP"}], "revisionHistoryLimit": 10}});
        assert!(covers(&desired, Some(&defaulted)));
        let edited = json!({"spec": {"replicas": 0, "ports": [{"port": 8080}]}});
        assert!(!covers(&desired, Some(&edited)));
        let extra_port = json!({"spec": {"replicas": 1, "ports": [{"port": 8080}, {"port": 1}]}});
        assert!(!covers(&desired, Some(&extra_port)));
        assert!(!covers(&json!({"a": "x"}), Some(&json!({}))));
    }

    #[test]
    fn the_digest_follows_the_object() {
        let a = json!({"metadata": {"name": "a", "labels": {"x": "1"}}});
        let b = json!({"metadata": {"name": "a"}});
        assert_eq!(digest(&a), digest(&a.clone()));
        assert_ne!(digest(&a), digest(&b));
    }
}
