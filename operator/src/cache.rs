//! Caches of the objects the operator owns: reflector stores fed by the controller's own
//! watches of them, so that a reconcile which would change nothing sends nothing.
//!
//! Every applied object carries [`APPLIED_ANNOTATION`], a digest of the object as the operator
//! built it. An object is current when the cached copy carries the digest of what the
//! reconcile just built (nothing was added or removed since the last apply) and every field
//! the operator sets still has the built value (nobody edited one of them). Only then is the
//! apply skipped; in any doubt (a cache not synced yet, a value the API server normalised) the
//! object is applied, which the API server turns into a no-op.
//!
//! The watches lag behind the API server (by seconds on a loaded control plane), so a reconcile
//! can find a cached copy older than what the operator itself wrote a moment ago. [`Accepted`]
//! remembers, per object, the digest and resourceVersion of each write the API server accepted
//! until the watch delivers that version: an outdated cached copy of an object the operator
//! already brought up to date is no reason to send it again. A deleted object (its Delete
//! event) or any change after the operator's write (which the watch delivers after the write
//! itself) is judged on the cache as before, so deletions and drift are still repaired.

use std::borrow::Cow;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_crds::AgentSession;
use k8s_openapi::api::core::v1::{Pod, PodStatus, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Resource;
use kube::core::{DeserializeGuard, ObjectMeta, PartialObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Annotation holding the digest of the object as last built and applied by the operator.
pub const APPLIED_ANNOTATION: &str = "cairn.dev/applied";

/// How long a reconcile waits for the caches' first list before it applies without them.
pub const READY_WAIT: Duration = Duration::from_secs(30);

/// How long an accepted write the watch has not delivered stands in for the cached copy. A
/// safety net: the watch delivers a write within seconds, and where no watch runs (the token
/// Secrets without list/watch RBAC) the object is looked at again after this long.
pub const ACCEPTED_TTL: Duration = Duration::from_secs(300);

/// Identifies one object the operator writes: its kind (`AgentSession` stands for the
/// session's status), namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn of<K: Resource<DynamicType = ()>>(object: &K) -> Self {
        let meta = object.meta();
        Self {
            kind: K::kind(&()).into_owned(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    digest: String,
    resource_version: String,
    at: Instant,
}

/// Writes the API server accepted and the watches have not delivered yet (see the module
/// docs). Entries are few: one per write in flight between the API server and the cache.
#[derive(Debug, Default)]
pub struct Accepted {
    entries: Mutex<HashMap<Key, Entry>>,
}

impl Accepted {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the API server accepted `digest` for `key` as `resource_version`, unless
    /// the cache already holds that version (`cached_version`, read under the same lock as
    /// [`Accepted::observe`] so a watch event cannot slip in between).
    pub fn record(
        &self,
        key: Key,
        digest: String,
        resource_version: Option<String>,
        cached_version: impl FnOnce() -> Option<String>,
    ) {
        let mut entries = self.entries();
        let Some(resource_version) = resource_version.filter(|v| !v.is_empty()) else {
            entries.remove(&key);
            return;
        };
        if cached_version().as_deref() == Some(resource_version.as_str()) {
            entries.remove(&key);
            return;
        }
        if entries.len() >= 1024 {
            entries.retain(|_, e| e.at.elapsed() < ACCEPTED_TTL);
        }
        entries.insert(
            key,
            Entry {
                digest,
                resource_version,
                at: Instant::now(),
            },
        );
    }

    /// Whether the operator's last accepted write of `key` was `digest` and the watch has not
    /// delivered it yet: the object is as built, whatever the (outdated) cache says.
    pub fn pending(&self, key: &Key, digest: &str) -> bool {
        let mut entries = self.entries();
        match entries.get(key) {
            Some(e) if e.at.elapsed() >= ACCEPTED_TTL => {
                entries.remove(key);
                false
            }
            Some(e) => e.digest == digest,
            None => false,
        }
    }

    /// Follows a watch of one kind (called after the event reached the store): the event of
    /// an accepted write, a deletion, or a fresh list ends what is remembered of the object
    /// (of the kind), and the cache speaks for it again.
    pub fn observe<K: Resource<DynamicType = ()>>(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                let key = Key::of(o);
                let mut entries = self.entries();
                if entries.get(&key).is_some_and(|e| {
                    o.meta().resource_version.as_deref() == Some(&e.resource_version)
                }) {
                    entries.remove(&key);
                }
            }
            watcher::Event::Delete(o) => {
                self.entries().remove(&Key::of(o));
            }
            watcher::Event::InitDone => {
                // The list may have skipped the version of a remembered write (a relist after
                // a desync): its cache is complete and current, so it decides again.
                let kind = K::kind(&());
                self.entries().retain(|k, _| k.kind != kind);
            }
            watcher::Event::Init => {}
        }
    }

    /// Forgets what is remembered of `key` (its object is gone).
    pub fn forget(&self, key: &Key) {
        self.entries().remove(key);
    }

    /// Writes remembered now (for tests and metrics).
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The resourceVersion of the cached copy of `object`, if any.
pub fn cached_version<K>(store: &Store<Packed<K>>, object: &K) -> Option<String>
where
    K: Resource<DynamicType = ()> + 'static,
{
    store
        .get(&packed_ref(object))
        .and_then(|c| c.meta().resource_version.clone())
}

/// The stores of one controller (one watched scope).
#[derive(Clone)]
pub struct Stores {
    /// The controller's own store of the sessions.
    pub sessions: Store<DeserializeGuard<AgentSession>>,
    pub service_accounts: Store<Packed<ServiceAccount>>,
    pub roles: Store<Packed<Role>>,
    pub role_bindings: Store<Packed<RoleBinding>>,
    /// Metadata only: the operator never caches a Secret's values.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    pub services: Store<Packed<Service>>,
    pub network_policies: Store<Packed<NetworkPolicy>>,
    /// The sessions' pods, trimmed to what [`crate::apply::pod_step`] reads ([`trim_pod`]).
    pub pods: Store<Packed<Pod>>,
}

/// A cached object kept as its JSON text, with the few metadata fields a store and the
/// owner triggers read (name, namespace, uid, resourceVersion, owner references). A
/// k8s-openapi struct takes five to seven times the memory of its JSON (a session's pod
/// spec about 20 KiB against 3 KiB): at 10,000 sessions that is the operator's memory.
#[derive(Debug)]
pub struct Packed<K> {
    metadata: ObjectMeta,
    json: Box<str>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            json: self.json.clone(),
            kind: PhantomData,
        }
    }
}

impl<K: Resource<DynamicType = ()> + Serialize> Packed<K> {
    /// Packs `object` (its managed fields are best dropped first).
    pub fn pack(object: &K) -> Self {
        let meta = object.meta();
        Self {
            metadata: ObjectMeta {
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
                resource_version: meta.resource_version.clone(),
                owner_references: meta.owner_references.clone(),
                ..ObjectMeta::default()
            },
            json: serde_json::to_string(object).unwrap_or_default().into(),
            kind: PhantomData,
        }
    }

    /// The object as JSON.
    pub fn value(&self) -> Option<Value> {
        serde_json::from_str(&self.json).ok()
    }

    /// The object itself.
    pub fn unpack(&self) -> Option<K>
    where
        K: serde::de::DeserializeOwned,
    {
        serde_json::from_str(&self.json).ok()
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Packed<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// `event` with its objects packed.
pub fn pack_event<K: Resource<DynamicType = ()> + Serialize>(
    event: watcher::Event<K>,
) -> watcher::Event<Packed<K>> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(Packed::pack(&o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(Packed::pack(&o)),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(Packed::pack(&o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

fn packed_ref<K: Resource<DynamicType = ()>>(object: &K) -> ObjectRef<Packed<K>> {
    let meta = object.meta();
    ObjectRef::new(meta.name.as_deref().unwrap_or_default())
        .within(meta.namespace.as_deref().unwrap_or_default())
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
                && self.pods.wait_until_ready().await.is_ok()
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

/// Keeps of a watched pod only what the operator reads: its identity, creation time (how long
/// a new session's first status may wait for it), owners, deletion, the digest it was built
/// with, its phase and its `Ready` condition. The spec (most of a
/// pod) is immutable where it matters and judged by that digest.
pub fn trim_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.generate_name = None;
    meta.annotations = meta.annotations.take().and_then(|mut a| {
        let applied = a.remove(APPLIED_ANNOTATION)?;
        Some([(APPLIED_ANNOTATION.to_string(), applied)].into())
    });
    pod.spec = None;
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        conditions: s
            .conditions
            .map(|c| c.into_iter().filter(|c| c.type_ == "Ready").collect()),
        ..PodStatus::default()
    });
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

/// The cached copy of `stamped` (an object stamped with its digest), if it is current.
pub fn current<K>(store: &Store<Packed<K>>, stamped: &K) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + serde::de::DeserializeOwned + 'static,
{
    let cached = store.get(&packed_ref(stamped))?;
    let desired = serde_json::to_value(stamped).ok()?;
    let actual = cached.value()?;
    if !covers(&desired, Some(&actual)) {
        return None;
    }
    serde_json::from_value(actual).ok()
}

/// The cached copy of `object`, current or not.
pub fn cached<K>(store: &Store<Packed<K>>, object: &K) -> Option<K>
where
    K: Resource<DynamicType = ()> + Serialize + serde::de::DeserializeOwned + 'static,
{
    store.get(&packed_ref(object))?.unpack()
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

/// The resourceVersion of the cached metadata of the Secret `namespace`/`name`, if any.
pub fn secret_version(
    store: &Store<PartialObjectMeta<Secret>>,
    namespace: &str,
    name: &str,
) -> Option<String> {
    store
        .get(&ObjectRef::<PartialObjectMeta<Secret>>::new(name).within(namespace))
        .and_then(|c| c.metadata.resource_version.clone())
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

    fn account(version: &str) -> ServiceAccount {
        serde_json::from_value(json!({
            "metadata": {"name": "cairn-a", "namespace": "ns", "resourceVersion": version},
        }))
        .expect("fixture")
    }

    #[test]
    fn an_accepted_write_stands_until_the_watch_delivers_it() {
        let accepted = Accepted::default();
        let key = Key::of(&account("1"));
        accepted.record(key.clone(), "d1".into(), Some("5".into()), || {
            Some("3".into())
        });
        assert!(accepted.pending(&key, "d1"));
        assert!(!accepted.pending(&key, "d2"), "another build is sent");
        // An older event (the lag) changes nothing; the write's own event ends it.
        accepted.observe(&watcher::Event::Apply(account("4")));
        assert!(accepted.pending(&key, "d1"));
        accepted.observe(&watcher::Event::Apply(account("5")));
        assert!(!accepted.pending(&key, "d1"));

        // A deletion and a relist end it too.
        accepted.record(key.clone(), "d1".into(), Some("6".into()), || None);
        accepted.observe(&watcher::Event::Delete(account("5")));
        assert!(!accepted.pending(&key, "d1"));
        accepted.record(key.clone(), "d1".into(), Some("7".into()), || None);
        accepted.observe(&watcher::Event::<Role>::InitDone);
        assert!(accepted.pending(&key, "d1"), "another kind's relist");
        accepted.observe(&watcher::Event::<ServiceAccount>::InitDone);
        assert!(!accepted.pending(&key, "d1"));

        // A write the cache already holds (a no-op apply) is not remembered.
        accepted.record(key.clone(), "d1".into(), Some("7".into()), || {
            Some("7".into())
        });
        assert!(accepted.is_empty());
    }

    #[test]
    fn the_digest_follows_the_object() {
        let a = json!({"metadata": {"name": "a", "labels": {"x": "1"}}});
        let b = json!({"metadata": {"name": "a"}});
        assert_eq!(digest(&a), digest(&a.clone()));
        assert_ne!(digest(&a), digest(&b));
    }

    #[test]
    fn a_trimmed_pod_keeps_what_the_pod_step_reads() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "cairn-a-0", "uid": "p", "resourceVersion": "9",
                         "creationTimestamp": "2026-12-05T10:00:00Z", "labels": {"x": "y"},
                         "ownerReferences": [{"apiVersion": "cairn.dev/v1beta1",
                             "kind": "AgentSession", "name": "a", "uid": "u", "controller": true}],
                         "annotations": {"cairn.dev/applied": "d", "other": "z"}},
            "spec": {"containers": [{"name": "agent", "image": "i"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "PodScheduled", "status": "True"}]},
        }))
        .expect("pod fixture");
        trim_pod(&mut pod);
        assert_eq!(
            serde_json::to_value(&pod).expect("json"),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "cairn-a-0", "uid": "p", "resourceVersion": "9",
                             "creationTimestamp": "2026-12-05T10:00:00Z",
                             "ownerReferences": [{"apiVersion": "cairn.dev/v1beta1",
                                 "kind": "AgentSession", "name": "a", "uid": "u",
                                 "controller": true}],
                             "annotations": {"cairn.dev/applied": "d"}},
                "status": {"phase": "Running",
                           "conditions": [{"type": "Ready", "status": "True"}]},
            })
        );
    }
}
