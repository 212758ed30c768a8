//! The watches of one controller (a namespace, or all): the AgentSession watch, the owned
//! kinds' caches that also trigger their owner's reconcile, the policy and Secret watches and
//! their mappers to sessions, and the start-up retirement of an earlier version's StatefulSets.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::core::{ObjectMeta, PartialObjectMeta};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use cairn_crds::{AgentSession, CompactionPolicy};

use crate::config::Defaults;
use crate::controller::{Context, Guarded, error_policy, key_of, reconcile};
use crate::{apply, cache};

/// Applying a session's objects sends a burst of watch events for its children; waiting this
/// long folds the burst into one reconcile.
const DEBOUNCE: Duration = Duration::from_secs(1);

/// Sessions (from the controller's cache) whose policyRef names `policy`.
pub fn sessions_for_policy(
    sessions: &[Arc<Guarded>],
    policy: &CompactionPolicy,
) -> Vec<ObjectRef<Guarded>> {
    let namespace = policy.namespace();
    let name = policy.name_any();
    sessions
        .iter()
        .filter(|g| {
            g.0.as_ref().is_ok_and(|s| {
                s.namespace() == namespace
                    && s.spec.policy_ref.as_ref().is_some_and(|r| r.name == name)
            })
        })
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

/// Sessions that read the Secret of `secret` (its metadata): their token Secret, provider
/// credentials, S3 credentials (their own or the operator's default) or the OTLP export
/// headers.
pub fn sessions_for_secret(
    sessions: &[Arc<Guarded>],
    secret: &ObjectMeta,
    defaults: &Defaults,
) -> Vec<ObjectRef<Guarded>> {
    let namespace = secret.namespace.clone();
    let name = secret.name.clone().unwrap_or_default();
    let otlp_headers = defaults
        .otlp
        .as_ref()
        .and_then(|o| o.headers_secret.as_ref());
    sessions
        .iter()
        .filter(|g| {
            g.0.as_ref().is_ok_and(|s| {
                if s.namespace() != namespace {
                    return false;
                }
                let session = s.name_any();
                let provider = s.spec.provider.credentials.as_ref().map(|c| &c.secret_name);
                let archive = s
                    .spec
                    .archive
                    .as_ref()
                    .and_then(|a| a.credentials.as_ref())
                    .map(|c| &c.secret_name)
                    .or(defaults.archive.credentials_secret.as_ref());
                cairn_crds::names::token_secret_name(&session) == name
                    || provider == Some(&name)
                    || archive == Some(&name)
                    || otlp_headers == Some(&name)
            })
        })
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

/// The AgentSession that controls the object of `meta`, if one does.
fn controlling_session(meta: &ObjectMeta) -> Option<&OwnerReference> {
    let group = format!("{}/", AgentSession::group(&()));
    meta.owner_references.iter().flatten().find(|o| {
        o.kind == AgentSession::kind(&())
            && o.api_version.starts_with(&group)
            && o.controller == Some(true)
    })
}

/// The session that controls an owned object, whatever `cairn.dev` version its owner
/// reference names.
pub fn session_of_owned(meta: &ObjectMeta) -> Option<ObjectRef<Guarded>> {
    let owner = controlling_session(meta)?;
    Some(ObjectRef::new(&owner.name).within(meta.namespace.as_deref()?))
}

/// The reconciles an owned kind's changes call for: the session that controls each object,
/// whatever API version its owner reference names. Objects made by an operator of an earlier
/// release name `cairn.dev/v1alpha1`, and kube-runtime's `owns` matches the version too: the
/// deletion of such a pod, replaced after an upgrade, would reconcile nothing, and the
/// session would wait for its next resync without a pod.
fn owner_triggers<T>(
    stream: impl futures::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    kind: &'static str,
    meta: fn(&T) -> &ObjectMeta,
) -> impl futures::Stream<Item = ObjectRef<Guarded>> + Send + 'static
where
    T: Send + 'static,
{
    stream.filter_map(move |event| {
        let target = match event {
            Ok(object) => session_of_owned(meta(&object)),
            Err(e) => {
                tracing::debug!(error = %e, kind, "watch failed");
                None
            }
        };
        futures::future::ready(target)
    })
}

/// The session a Service or NetworkPolicy event concerns: its controlling session for one
/// of an earlier version's per-session objects; for the namespace's shared object, the first
/// live session of that namespace (one reconcile repairs the namespace's objects, as the
/// reconcile of any of its sessions would). `sessions` is read only for a shared object.
pub fn session_for_network_object(
    sessions: impl FnOnce() -> Vec<Arc<Guarded>>,
    meta: &ObjectMeta,
) -> Option<ObjectRef<Guarded>> {
    let namespace = meta.namespace.as_deref()?;
    if let Some(owner) = controlling_session(meta) {
        return Some(ObjectRef::new(&owner.name).within(namespace));
    }
    if meta.name.as_deref() != Some(cairn_crds::names::SESSIONS) {
        return None;
    }
    sessions()
        .iter()
        .filter(|g| g.namespace().as_deref() == Some(namespace))
        .filter(|g| g.meta().deletion_timestamp.is_none())
        .filter_map(|g| g.meta().name.clone())
        .min()
        .map(|name| ObjectRef::new(&name).within(namespace))
}

/// Reconcile triggers from a watch of the Services or NetworkPolicies ([`session_for_network_object`]).
fn network_triggers<K>(
    stream: impl futures::Stream<Item = Result<cache::Packed<K>, watcher::Error>> + Send + 'static,
    sessions: Store<Guarded>,
) -> impl futures::Stream<Item = ObjectRef<Guarded>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Send + 'static,
{
    stream.filter_map(move |event| {
        let target = match event {
            Ok(object) => session_for_network_object(|| sessions.state(), object.meta()),
            Err(e) => {
                tracing::warn!(error = %e, kind = %K::kind(&()), "watch failed");
                None
            }
        };
        futures::future::ready(target)
    })
}

fn scoped<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

/// The namespaces of `watched` inside `scope` (a namespace, or all).
fn secret_scopes(watched: &BTreeSet<String>, scope: Option<&str>) -> Vec<String> {
    watched
        .iter()
        .filter(|ns| scope.is_none_or(|s| s == ns.as_str()))
        .cloned()
        .collect()
}

/// A cache of one owned kind and the watch stream that fills it (managed fields dropped:
/// the operator never reads them, and they are most of an object's size; objects packed as
/// JSON, see [`cache::Packed`]).
fn owned_cache<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    accepted: Arc<cache::Accepted>,
) -> (
    Store<cache::Packed<K>>,
    impl futures::Stream<Item = Result<cache::Packed<K>, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(move |o| {
            o.managed_fields_mut().clear();
            trim(o);
        })
        .map_ok(cache::pack_event)
        .reflect(writer)
        .inspect(move |event| {
            if let Ok(event) = event {
                accepted.observe(event);
            }
        })
        .touched_objects();
    (reader, stream)
}

/// Deletes the StatefulSets through which an earlier operator version ran sessions' pods
/// (labelled as the operator's, owned by an AgentSession); their pods go with them, and each
/// session's own pod takes the name once the old one is gone. One list per scope at start.
async fn retire_stateful_sets(client: &Client, ns: Option<&str>) {
    let params = ListParams::default().labels("app.kubernetes.io/managed-by=cairn-operator");
    let listed = match scoped::<StatefulSet>(client.clone(), ns)
        .list_metadata(&params)
        .await
    {
        Ok(listed) => listed,
        Err(e) => {
            tracing::warn!(error = %e, "listing StatefulSets of an earlier version failed");
            return;
        }
    };
    for sts in listed.items {
        let session_owned = controlling_session(&sts.metadata).is_some();
        let (Some(namespace), Some(name)) = (&sts.metadata.namespace, &sts.metadata.name) else {
            continue;
        };
        if !session_owned {
            continue;
        }
        let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(%namespace, %name, "retired the StatefulSet of an earlier version")
            }
            Err(e) => {
                tracing::warn!(error = %e, %namespace, %name, "retiring a StatefulSet failed")
            }
        }
    }
}

/// Whether the operator may list and watch Secrets in `ns` (every namespace when `None`), as
/// the API server answers a SelfSubjectAccessReview (which every authenticated user may ask).
/// The chart grants it only in `secretWatchNamespaces`. No answer counts as no.
async fn may_watch_secrets(client: &Client, ns: Option<&str>) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for verb in ["list", "watch"] {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: ns.map(str::to_owned),
                    verb: Some(verb.into()),
                    resource: Some("secrets".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => return false,
            Err(e) => {
                tracing::warn!(error = %e, verb, "asking whether Secrets may be watched");
                return false;
            }
        }
    }
    true
}

/// Runs the controller for one scope (a namespace, or all) until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let ns = namespace.as_deref();
    retire_stateful_sets(&client, ns).await;
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=cairn-operator");
    // The sessions' own watch, as `Controller::new` builds it (managed fields dropped), plus:
    // the event of an accepted
    // status write ends what is remembered of it, and a deleted session (one without a
    // finalizer is never cleaned up) leaves the phase gauge.
    let (sessions, sessions_writer) = reflector::store::<Guarded>();
    let session_stream = {
        let accepted = ctx.accepted.clone();
        let metrics = ctx.metrics.clone();
        watcher(
            scoped::<Guarded>(client.clone(), ns),
            watcher::Config::default().any_semantic(),
        )
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(sessions_writer)
        .inspect({
            let sessions = sessions.clone();
            let client = client.clone();
            move |event| {
                if let Ok(event) = event {
                    accepted.observe(event);
                    if let watcher::Event::Delete(session) = event {
                        metrics.set_session(&key_of(session.meta()), None);
                        // The namespace's last session is gone: so are its shared objects.
                        if let Some(namespace) = session.namespace()
                            && sessions
                                .find(|g| g.namespace().as_deref() == Some(&namespace))
                                .is_none()
                        {
                            tokio::spawn(apply::release_namespace(client.clone(), namespace));
                        }
                    }
                }
            }
        })
        .applied_objects()
    };
    let controller = Controller::for_stream(session_stream, sessions.clone());
    let policy_store = controller.store();
    // Each owned kind is watched once: the watch both triggers the owner's reconcile and
    // fills the cache that lets a reconcile skip what is current.
    let accepted = &ctx.accepted;
    let (pods, pod_stream) = owned_cache(
        scoped::<Pod>(client.clone(), ns),
        owned.clone(),
        cache::trim_pod,
        accepted.clone(),
    );
    let (services, svc_stream) = owned_cache(
        scoped::<Service>(client.clone(), ns),
        owned.clone(),
        |_| {},
        accepted.clone(),
    );
    let (service_accounts, sa_stream) = owned_cache(
        scoped::<ServiceAccount>(client.clone(), ns),
        owned.clone(),
        |_| {},
        accepted.clone(),
    );
    let (roles, role_stream) = owned_cache(
        scoped::<Role>(client.clone(), ns),
        owned.clone(),
        |_| {},
        accepted.clone(),
    );
    let (role_bindings, rb_stream) = owned_cache(
        scoped::<RoleBinding>(client.clone(), ns),
        owned.clone(),
        |_| {},
        accepted.clone(),
    );
    let (network_policies, np_stream) = owned_cache(
        scoped::<NetworkPolicy>(client.clone(), ns),
        owned.clone(),
        |_| {},
        accepted.clone(),
    );
    // The operator's own Secrets (the token Secrets): metadata only, where it may list them.
    // Elsewhere the store stays empty (a reconcile then creates a token Secret by name,
    // keeping the token of one that exists), rather than a watch refused again and again.
    let (secrets_writer, secrets) = {
        let (reader, writer) = reflector::store();
        (writer, reader)
    };
    let secret_stream = if may_watch_secrets(&client, ns).await {
        watcher(
            scoped::<PartialObjectMeta<Secret>>(client.clone(), ns),
            owned,
        )
        .default_backoff()
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(secrets_writer)
        .inspect({
            let accepted = accepted.clone();
            move |event| {
                if let Ok(event) = event {
                    accepted.observe(event);
                }
            }
        })
        .touched_objects()
        .boxed()
    } else {
        tracing::info!(
            scope = ns.unwrap_or("all namespaces"),
            "Secrets may not be listed here: the token Secrets are written by name, not cached"
        );
        futures::stream::empty().boxed()
    };
    let sessions_for_network = sessions.clone();
    ctx.add_stores(
        namespace.clone(),
        cache::Stores {
            sessions,
            service_accounts,
            roles,
            role_bindings,
            secrets,
            services,
            network_policies,
            pods,
        },
    );
    let mut controller = controller
        .reconcile_on(owner_triggers(pod_stream, "Pod", |o| o.meta()))
        .reconcile_on(owner_triggers(sa_stream, "ServiceAccount", |o| o.meta()))
        .reconcile_on(owner_triggers(role_stream, "Role", |o| o.meta()))
        .reconcile_on(owner_triggers(rb_stream, "RoleBinding", |o| o.meta()))
        .reconcile_on(network_triggers(svc_stream, sessions_for_network.clone()))
        .reconcile_on(network_triggers(np_stream, sessions_for_network))
        .reconcile_on(owner_triggers(secret_stream, "Secret", |o| &o.metadata))
        .watches(
            scoped::<CompactionPolicy>(client.clone(), ns),
            watcher::Config::default(),
            move |policy| sessions_for_policy(&policy_store.state(), &policy),
        );
    // Secrets: metadata only (an `Api` of `PartialObjectMeta` asks the API server for
    // metadata, never the values), and only in the namespaces configured for it, each its
    // own namespaced watch; elsewhere the reconcile reads a session's Secrets by name.
    for secret_ns in secret_scopes(&ctx.secret_watch, ns) {
        let store = controller.store();
        let defaults = ctx.defaults.clone();
        let api: Api<PartialObjectMeta<Secret>> = Api::namespaced(client.clone(), &secret_ns);
        controller = controller.watches(api, watcher::Config::default(), move |secret| {
            sessions_for_secret(&store.state(), &secret.metadata, &defaults)
        });
    }
    controller
        .with_config(
            controller::Config::default()
                .concurrency(concurrency)
                .debounce(DEBOUNCE),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(session = %object, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "controller event"),
            }
        })
        .await;
}
