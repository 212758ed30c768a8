//! `apply`: server-side apply of a session's objects, forced, under one field manager. The
//! API server turns an unchanged apply into a no-op (no new resourceVersion, no watch event),
//! which is what keeps an idle operator from looping; with the controller's caches
//! ([`crate::cache`]) an object that is already current is not sent at all. The pod is not
//! applied: it is created, and replaced (deleted, then created again once it is gone) when
//! what was built for it changes ([`pod_step`]).

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cache::{self, Accepted, Key, Packed, Stores};
use cairn_crds::names::{SESSIONS, TOKEN_KEY, object_name, pod_name};

use crate::objects::{ApiToken, FIELD_MANAGER, SessionObjects};
use crate::validate::Plan;

async fn apply<K>(client: &Client, object: &K) -> Result<K, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let namespace = object.namespace().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    // k8s-openapi types serialize their apiVersion and kind, which SSA requires.
    api.patch(
        &object.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
}

/// `object` stamped with its digest, and the digest.
fn stamp<K: Resource + Clone + Serialize>(object: &K) -> (K, String) {
    let digest = cache::digest(&serde_json::to_value(object).unwrap_or_default());
    (cache::stamped(object, digest.clone()), digest)
}

/// Applies `object` (stamped with its digest) unless the cached copy is current or the
/// operator's own accepted write of it has not reached the cache yet; returns the object as
/// the API server has it (as far as the operator knows).
async fn ensure<K>(
    client: &Client,
    object: &K,
    store: Option<&Store<Packed<K>>>,
    accepted: &Accepted,
) -> Result<K, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug
        + 'static,
{
    let (stamped, digest) = stamp(object);
    let Some(store) = store else {
        return apply(client, &stamped).await;
    };
    if let Some(cached) = cache::current(store, &stamped) {
        return Ok(cached);
    }
    let key = Key::of(&stamped);
    if accepted.pending(&key, &digest) {
        // The cache lags behind the operator's own write: the object is as built.
        return Ok(cache::cached(store, &stamped).unwrap_or(stamped));
    }
    let applied = apply(client, &stamped).await?;
    accepted.record(key, digest, applied.meta().resource_version.clone(), || {
        cache::cached_version(store, &stamped)
    });
    Ok(applied)
}

/// What to do with the session's token Secret, decided before its token is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSecret {
    /// The cached metadata is current: nothing is read or sent (the token is never
    /// regenerated, so it needs no rewrite).
    Current,
    /// The cache (synced) has no such Secret: create it with a fresh token; if it exists
    /// after all, its token is read and kept.
    Create,
    /// Read the existing token (done by `dereference::build_inputs`) and apply.
    Apply,
}

impl TokenSecret {
    /// The plan for `secret` (as built, not stamped) given the caches, if any, and the
    /// writes the API server accepted.
    pub fn plan(secret: &Secret, stores: Option<&Stores>, accepted: &Accepted) -> Self {
        let Some(stores) = stores else {
            return Self::Apply;
        };
        let digest = cache::secret_digest(secret);
        let stamped = cache::stamped(secret, digest.clone());
        if cache::secret_current(&stores.secrets, &stamped)
            || accepted.pending(&Key::of(&stamped), &digest)
        {
            Self::Current
        } else if cache::secret_cached(
            &stores.secrets,
            secret.metadata.namespace.as_deref().unwrap_or_default(),
            secret.metadata.name.as_deref().unwrap_or_default(),
        ) {
            Self::Apply
        } else {
            Self::Create
        }
    }

    /// Whether the existing token must be read before building.
    pub fn reads_token(self) -> bool {
        self == Self::Apply
    }
}

/// Brings the token Secret to `plan`; gives the token the Secret holds when it was written
/// (`None`: it was current and nothing was read or sent).
async fn ensure_token_secret(
    client: &Client,
    secret: &Secret,
    plan: TokenSecret,
    stores: Option<&Stores>,
    accepted: &Accepted,
) -> Result<Option<ApiToken>, kube::Error> {
    let digest = cache::secret_digest(secret);
    let stamped = cache::stamped(secret, digest.clone());
    let written = match plan {
        TokenSecret::Current => return Ok(None),
        TokenSecret::Apply => apply(client, &stamped).await?,
        TokenSecret::Create => create_token_secret(client, &stamped).await?,
    };
    if let Some(stores) = stores {
        let (namespace, name) = (stamped.namespace().unwrap_or_default(), stamped.name_any());
        accepted.record(
            Key::of(&stamped),
            digest,
            written.metadata.resource_version.clone(),
            || cache::secret_version(&stores.secrets, &namespace, &name),
        );
    }
    Ok(written
        .data
        .as_ref()
        .or(stamped.data.as_ref())
        .and_then(|d| d.get(TOKEN_KEY))
        .and_then(|t| String::from_utf8(t.0.clone()).ok())
        .map(ApiToken::from_existing))
}

/// Creates the token Secret; if it exists after all, applies it with the token it holds.
async fn create_token_secret(client: &Client, stamped: &Secret) -> Result<Secret, kube::Error> {
    let api: Api<Secret> =
        Api::namespaced(client.clone(), &stamped.namespace().unwrap_or_default());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&params, stamped).await {
        Ok(created) => Ok(created),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            // Created meanwhile (or the cache lags): keep the token it holds.
            let mut kept = stamped.clone();
            if let Some(token) = api
                .get_opt(&stamped.name_any())
                .await?
                .and_then(|s| s.data)
                .and_then(|d| d.get(TOKEN_KEY).cloned())
                .filter(|t| !t.0.is_empty())
            {
                kept.data = Some([(TOKEN_KEY.to_string(), token)].into());
            }
            apply(client, &kept).await
        }
        Err(e) => Err(e),
    }
}

/// What the session's pod needs, decided from the digest of the pod as built (`None`:
/// suspended) and the pod as it is. Pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodStep {
    /// The pod is as built (or, suspended, there is none).
    Keep,
    /// No pod: create it.
    Create,
    /// The pod is not as built (a change that needs a new process, a finished pod, or a
    /// suspended session): delete this one (by uid); its deletion brings the next reconcile,
    /// which creates the new one.
    Delete { uid: String },
    /// A pod is terminating, or one of another owner holds the name (the StatefulSet of an
    /// earlier operator version, which is retired at start-up): wait for it to go.
    Wait,
}

/// The step for the session `owner` (its uid), the digest of the pod as built, and the pod
/// as it is.
pub fn pod_step(built: Option<&str>, actual: Option<&Pod>, owner: &str) -> PodStep {
    let Some(actual) = actual else {
        return if built.is_some() {
            PodStep::Create
        } else {
            PodStep::Keep
        };
    };
    let meta = &actual.metadata;
    let ours = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == owner);
    if meta.deletion_timestamp.is_some() || !ours {
        return PodStep::Wait;
    }
    let uid = meta.uid.clone().unwrap_or_default();
    let applied = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(cache::APPLIED_ANNOTATION));
    let finished = actual
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Failed" || p == "Succeeded");
    if built.is_none() || finished || applied.map(String::as_str) != built {
        PodStep::Delete { uid }
    } else {
        PodStep::Keep
    }
}

/// Whether `pod` is ready to serve: not terminating, its `Ready` condition true.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Brings the session's pod to what was built (`desired`, `None` while suspended) and says
/// whether it is ready. Without a synced cache the pod is read first.
async fn ensure_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    owner: &str,
    desired: Option<&Pod>,
    store: Option<&Store<Packed<Pod>>>,
    accepted: &Accepted,
) -> Result<PodState, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let desired = desired.map(stamp);
    let reference = ObjectRef::new(name).within(namespace);
    let actual = match store {
        Some(store) => store.get(&reference).and_then(|p| p.unpack()),
        None => api.get_opt(name).await?,
    };
    let key = Key {
        kind: "Pod".into(),
        namespace: namespace.into(),
        name: name.into(),
    };
    let step = pod_step(
        desired.as_ref().map(|(_, d)| d.as_str()),
        actual.as_ref(),
        owner,
    );
    let version = || {
        store
            .and_then(|s| s.get(&reference))
            .and_then(|p| p.meta().resource_version.clone())
    };
    let created = actual
        .as_ref()
        .and_then(|p| p.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    let not_ready = |created| PodState {
        ready: false,
        created,
    };
    match step {
        PodStep::Keep => Ok(PodState {
            ready: actual.as_ref().is_some_and(pod_ready),
            created,
        }),
        PodStep::Wait => Ok(not_ready(created)),
        PodStep::Create => {
            let Some((pod, digest)) = desired else {
                return Ok(not_ready(None));
            };
            // Created by an earlier reconcile whose write the cache has not shown yet.
            if accepted.pending(&key, &digest) {
                return Ok(not_ready(Some(Timestamp::now())));
            }
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            match api.create(&params, &pod).await {
                Ok(created) => {
                    let at = created.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    accepted.record(key, digest, created.metadata.resource_version, version);
                    Ok(not_ready(Some(at.unwrap_or_else(Timestamp::now))))
                }
                // The cache lags: the watch brings the pod, and the next reconcile judges it.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(not_ready(Some(Timestamp::now()))),
                Err(e) => Err(e),
            }
        }
        PodStep::Delete { uid } => {
            let marker = format!("delete:{uid}");
            if accepted.pending(&key, &marker) {
                return Ok(not_ready(None));
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &params).await {
                Ok(deleted) => {
                    let version_now = deleted.left().and_then(|p| p.metadata.resource_version);
                    accepted.record(key, marker, version_now, version);
                    Ok(not_ready(None))
                }
                // Gone already, or replaced meanwhile: the watch tells.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(not_ready(None)),
                Err(e) => Err(e),
            }
        }
    }
}

/// Applies the namespace's shared Service. A Service of that name with a ClusterIP (which is
/// immutable) is refused as invalid: it is deleted and the headless one applied in its place.
async fn ensure_service(
    client: &Client,
    service: &Service,
    stores: Option<&Stores>,
    accepted: &Accepted,
) -> Result<(), kube::Error> {
    match ensure(client, service, stores.map(|s| &s.services), accepted).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 422 => {
            tracing::info!(service = %service.name_any(), error = %e.message,
                "replacing a Service that cannot be changed in place");
            let api: Api<Service> =
                Api::namespaced(client.clone(), &service.namespace().unwrap_or_default());
            match api
                .delete(&service.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
            apply(client, &stamp(service).0).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Deletes the namespace's shared Service and NetworkPolicy once its last session is gone (a
/// session created meanwhile has them applied again by its reconcile, which their deletion
/// triggers).
pub async fn release_namespace(client: Client, namespace: String) {
    async fn delete<K>(client: &Client, namespace: &str)
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + DeserializeOwned
            + Clone
            + Debug,
    {
        let api: Api<K> = Api::namespaced(client.clone(), namespace);
        match api.delete(SESSIONS, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(kind = %K::kind(&()), %namespace,
                "deleted the namespace's shared object with its last session"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(kind = %K::kind(&()), %namespace, error = %e,
                "deleting the namespace's shared object failed"),
        }
    }
    delete::<Service>(&client, &namespace).await;
    delete::<NetworkPolicy>(&client, &namespace).await;
}

/// Deletes the session's own Service or NetworkPolicy (`cairn-NAME`, owned by it) that is
/// not built: a Service or NetworkPolicy an earlier version of the operator made for every
/// session (the namespace's shared ones replace them), or the clients NetworkPolicy of a
/// session that names no clients any more; if the cache holds one. Without a cache nothing
/// is looked up: garbage collection takes them with the session.
async fn remove_per_session<K>(
    client: &Client,
    plan: &Plan,
    store: Option<&Store<Packed<K>>>,
    accepted: &Accepted,
) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let Some(store) = store else { return Ok(()) };
    let name = object_name(&plan.name);
    let Some(cached) = store.get(&ObjectRef::new(&name).within(&plan.namespace)) else {
        return Ok(());
    };
    let owned = cached
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == plan.owner.uid);
    // What a deletion leaves in `accepted` until the watch delivers it (a digest no built
    // object has), so an outdated cache does not send the deletion again.
    const DELETED: &str = "deleted";
    let key = Key::of(&*cached);
    if !owned || accepted.pending(&key, DELETED) {
        return Ok(());
    }
    tracing::info!(kind = %K::kind(&()), %name, namespace = %plan.namespace,
        "deleting a session's own object the namespace's shared one replaces");
    let api: Api<K> = Api::namespaced(client.clone(), &plan.namespace);
    let precondition = DeleteParams {
        preconditions: Some(Preconditions {
            uid: cached.meta().uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &precondition).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => return Err(e),
    }
    accepted.record(
        key,
        DELETED.into(),
        cached.meta().resource_version.clone(),
        || None,
    );
    Ok(())
}

/// What [`apply_all`] did that the status reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The session's pod is ready.
    pub ready: bool,
    /// When the session's pod was created (now, when this reconcile or one the cache has not
    /// caught up with created it); `None` without a pod.
    pub pod_created: Option<Timestamp>,
    /// The token the token Secret holds, when it was written (created, or applied with the
    /// token read from it); `None` when it was current.
    pub token: Option<ApiToken>,
}

/// Applies every object that is not current (identity and permissions before the pod),
/// brings the pod to what was built and says whether it is ready.
pub async fn apply_all(
    client: &Client,
    plan: &Plan,
    objects: &SessionObjects,
    stores: Option<&Stores>,
    token: TokenSecret,
    accepted: &Accepted,
) -> Result<Applied, kube::Error> {
    ensure(
        client,
        &objects.service_account,
        stores.map(|s| &s.service_accounts),
        accepted,
    )
    .await?;
    ensure(client, &objects.role, stores.map(|s| &s.roles), accepted).await?;
    ensure(
        client,
        &objects.role_binding,
        stores.map(|s| &s.role_bindings),
        accepted,
    )
    .await?;
    let token = ensure_token_secret(client, &objects.token_secret, token, stores, accepted).await?;
    ensure_service(client, &objects.service, stores, accepted).await?;
    ensure(
        client,
        &objects.network_policy,
        stores.map(|s| &s.network_policies),
        accepted,
    )
    .await?;
    remove_per_session(client, plan, stores.map(|s| &s.services), accepted).await?;
    match &objects.clients_network_policy {
        Some(policy) => {
            ensure(
                client,
                policy,
                stores.map(|s| &s.network_policies),
                accepted,
            )
            .await?;
        }
        None => {
            remove_per_session(client, plan, stores.map(|s| &s.network_policies), accepted).await?;
        }
    }
    let pod = ensure_pod(
        client,
        &plan.namespace,
        &pod_name(&plan.name),
        &plan.owner.uid,
        objects.pod.as_ref(),
        stores.map(|s| &s.pods),
        accepted,
    )
    .await?;
    Ok(Applied {
        ready: pod.ready,
        pod_created: pod.created,
        token,
    })
}

/// What the pod step found or did: readiness, and when the pod was created.
struct PodState {
    ready: bool,
    created: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(owner: &str, digest: &str, extra: serde_json::Value) -> Pod {
        let mut value = json!({
            "metadata": {"name": "cairn-a-0", "uid": "p-1",
                         "ownerReferences": [{"apiVersion": "cairn.dev/v1beta1",
                             "kind": "AgentSession", "name": "a", "uid": owner,
                             "controller": true}],
                         "annotations": {"cairn.dev/applied": digest}},
            "status": {"phase": "Running"},
        });
        if let (Some(v), Some(e)) = (value.as_object_mut(), extra.as_object()) {
            for (k, x) in e {
                v.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(value).expect("pod fixture")
    }

    #[test]
    fn the_pod_step_follows_the_build_and_the_pod() {
        let delete = PodStep::Delete { uid: "p-1".into() };
        assert_eq!(pod_step(Some("d1"), None, "u"), PodStep::Create);
        assert_eq!(pod_step(None, None, "u"), PodStep::Keep, "suspended, gone");
        let current = pod("u", "d1", json!({}));
        assert_eq!(pod_step(Some("d1"), Some(&current), "u"), PodStep::Keep);
        assert_eq!(
            pod_step(Some("d2"), Some(&current), "u"),
            delete,
            "another build replaces the pod"
        );
        assert_eq!(pod_step(None, Some(&current), "u"), delete, "suspended");
        let failed = pod("u", "d1", json!({"status": {"phase": "Failed"}}));
        assert_eq!(
            pod_step(Some("d1"), Some(&failed), "u"),
            delete,
            "an evicted pod is replaced"
        );
        let mut terminating = current.clone();
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(pod_step(Some("d2"), Some(&terminating), "u"), PodStep::Wait);
        let foreign = pod("statefulset-uid", "", json!({}));
        assert_eq!(
            pod_step(Some("d1"), Some(&foreign), "u"),
            PodStep::Wait,
            "a pod of another owner is never deleted by the session"
        );
    }

    #[test]
    fn ready_means_the_ready_condition_of_a_pod_not_terminating() {
        let ready = pod(
            "u",
            "d",
            json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        assert!(pod_ready(&ready));
        assert!(!pod_ready(&pod("u", "d", json!({}))));
        let mut going = ready.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!pod_ready(&going));
    }
}
