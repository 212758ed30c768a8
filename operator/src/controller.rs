//! The AgentSession reconcile: the pipeline (dereference → validate → build → apply →
//! status), the finalizer that purges a session's archive, and `error_policy`. The watches
//! that trigger it are in [`crate::watches`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use tracing::Instrument;

use cairn_crds::time::rfc3339;
use cairn_crds::{AgentSession, AgentSessionStatus};

use crate::backoff::Backoff;
use crate::config::Defaults;
use crate::error::{Error, ErrorClass};
use crate::metrics::Metrics;
use crate::objects::{self, FIELD_MANAGER};
use crate::purge::{ArchivePurger, PurgeTarget};
use crate::status::{self, Blocker, Observed, Problem};
use crate::validate::{self, ArchivePlan};
use crate::{apply, cache, dereference, idle, scoped};

/// Finalizer that purges the session's archive and journal before the session goes away.
pub const FINALIZER: &str = "cairn.dev/archive";

/// Re-check of a session that waits for something outside it that is watched (a policy, a
/// Secret in a namespace with a Secret watch). The watch usually triggers sooner; this is
/// the safety net, slow on purpose.
const WAITING_REQUEUE: Duration = Duration::from_secs(300);

pub(crate) type Guarded = DeserializeGuard<AgentSession>;

/// Shared state of the controller.
pub struct Context {
    pub client: Client,
    pub defaults: Defaults,
    pub events: crate::events::Events,
    pub metrics: Arc<Metrics>,
    pub backoff: Backoff,
    pub purger: Arc<dyn ArchivePurger>,
    /// Period of the safety-net re-reconcile of a healthy session.
    pub resync: Duration,
    /// Namespaces whose Secrets' metadata the controller watches; elsewhere nothing tells it
    /// that a Secret appeared, so a session waiting for one is re-checked every `secret_wait`.
    pub secret_watch: BTreeSet<String>,
    /// Re-check period of a session waiting for a Secret in a namespace without a watch.
    pub secret_wait: Duration,
    /// The owned-object caches of each running controller, by scope (a namespace, or all).
    caches: std::sync::RwLock<Vec<(Option<String>, cache::Stores)>>,
    /// The writes the API server accepted that the watches have not delivered yet: owned
    /// objects, and per session the digest of the operator's part of the status (transition
    /// times left out). A reconcile that sees an object older than the operator's own last
    /// write (the watch lags under load) does not send the same object, or status and its
    /// Events, again.
    pub accepted: Arc<cache::Accepted>,
}

impl Context {
    pub fn new(
        client: Client,
        defaults: Defaults,
        metrics: Arc<Metrics>,
        purger: Arc<dyn ArchivePurger>,
        resync: Duration,
    ) -> Self {
        Self {
            events: crate::events::Events::new(
                client.clone(),
                "cairn-operator",
                std::env::var("POD_NAME").ok(),
            ),
            client,
            defaults,
            metrics,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
            purger,
            resync,
            secret_watch: BTreeSet::new(),
            secret_wait: Duration::from_secs(crate::config::DEFAULT_SECRET_WAIT_REQUEUE_SECONDS),
            caches: std::sync::RwLock::new(Vec::new()),
            accepted: Arc::new(cache::Accepted::default()),
        }
    }

    /// Registers the caches of a controller for `scope` (a namespace, or all); done by
    /// [`crate::watches::run`], and by tests that drive [`reconcile`] with stores of their own.
    pub fn add_stores(&self, scope: Option<String>, stores: cache::Stores) {
        if let Ok(mut caches) = self.caches.write() {
            caches.push((scope, stores));
        }
    }

    /// The caches of the controller that watches `namespace`, once they are synced; `None`
    /// (apply everything) without a running controller or before the first list arrived.
    async fn stores_for(&self, namespace: &str) -> Option<cache::Stores> {
        let stores = self.scope_stores(namespace)?;
        stores.ready(cache::READY_WAIT).await.then_some(stores)
    }

    /// The caches of the controller that watches `namespace`, synced or not.
    fn scope_stores(&self, namespace: &str) -> Option<cache::Stores> {
        self.caches
            .read()
            .ok()?
            .iter()
            .find(|(scope, _)| scope.as_deref().is_none_or(|s| s == namespace))
            .map(|(_, s)| s.clone())
    }

    /// Watches Secret metadata in `namespaces` (none by default) and re-checks a session
    /// waiting for a Secret elsewhere every `wait`.
    pub fn with_secret_watch(
        mut self,
        namespaces: impl IntoIterator<Item = String>,
        wait: Duration,
    ) -> Self {
        self.secret_watch = namespaces.into_iter().collect();
        self.secret_wait = wait;
        self
    }

    /// When to look again at a session of `namespace` that waits for a Secret.
    pub fn secret_recheck(&self, namespace: &str) -> Duration {
        if self.secret_watch.contains(namespace) {
            WAITING_REQUEUE
        } else {
            self.secret_wait
        }
    }

    async fn publish(
        &self,
        reference: &ObjectReference,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let note = truncate(note, 1000);
        let event = crate::events::Event {
            regarding: reference,
            warning,
            reason,
            note: &note,
            action: "Reconcile",
        };
        if let Err(e) = self.events.publish(&event).await {
            tracing::warn!(error = %e, reason, "publishing an Event failed");
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

pub(crate) fn key_of(meta: &kube::core::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

fn session_reference(meta: &kube::core::ObjectMeta) -> ObjectReference {
    ObjectReference {
        api_version: Some(AgentSession::api_version(&()).into()),
        kind: Some(AgentSession::kind(&()).into()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        ..Default::default()
    }
}

/// Entry point of one reconcile: counts, times and reports the pipeline's outcome.
pub async fn reconcile(guard: Arc<Guarded>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = match &guard.0 {
        Ok(session) => {
            let key = key_of(&session.metadata);
            let span = tracing::info_span!("reconcile", session = %key);
            reconcile_session(Arc::new(session.clone()), &ctx)
                .instrument(span)
                .await
        }
        Err(invalid) => {
            // The watch keeps running; the object is reported and waits for an edit.
            tracing::warn!(session = %key_of(&invalid.metadata), error = %invalid.error, "AgentSession does not deserialize");
            ctx.publish(
                &session_reference(&invalid.metadata),
                true,
                "InvalidObject",
                format!("the AgentSession cannot be read: {}", invalid.error),
            )
            .await;
            Ok(Action::await_change())
        }
    };
    let key = guard_key(&guard);
    match &result {
        Ok(_) => {
            ctx.backoff.reset(&key);
            ctx.metrics.reconciled("ok", started.elapsed());
        }
        Err(e) => {
            ctx.metrics.reconciled(e.label(), started.elapsed());
            tracing::warn!(session = %key, error = %e, label = e.label(), "reconcile failed");
            if let Some(meta) = guard_meta(&guard) {
                ctx.publish(&session_reference(meta), true, e.label(), e.to_string())
                    .await;
            }
        }
    }
    result
}

fn guard_meta(guard: &Guarded) -> Option<&kube::core::ObjectMeta> {
    match &guard.0 {
        Ok(s) => Some(&s.metadata),
        Err(i) => Some(&i.metadata),
    }
}

fn guard_key(guard: &Guarded) -> String {
    guard_meta(guard).map(key_of).unwrap_or_default()
}

/// Retries by class: an invalid spec waits for an edit, a missing dependency is re-checked
/// slowly, anything else backs off per object with jitter.
pub fn error_policy(guard: Arc<Guarded>, error: &Error, ctx: Arc<Context>) -> Action {
    match error.class() {
        ErrorClass::Invalid => Action::await_change(),
        ErrorClass::Waiting => {
            let namespace = guard_meta(&guard)
                .and_then(|m| m.namespace.clone())
                .unwrap_or_default();
            Action::requeue(ctx.secret_recheck(&namespace))
        }
        ErrorClass::Transient => Action::requeue(ctx.backoff.next_delay(&guard_key(&guard))),
    }
}

async fn reconcile_session(session: Arc<AgentSession>, ctx: &Context) -> Result<Action, Error> {
    let namespace =
        session
            .namespace()
            .ok_or(Error::Invalid(validate::ValidationError::NotStored(
                "namespace",
            )))?;
    let ours = session.finalizers().iter().any(|f| f == FINALIZER);
    if !ours && !needs_finalizer(&session, &ctx.defaults) {
        // Nothing to purge when it goes: no finalizer (one write less per session, and a
        // deletion that does not wait for the operator).
        if session.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        return apply_session(session, ctx).await;
    }
    let api: Api<AgentSession> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, session, |event| async {
        match event {
            finalizer::Event::Apply(s) => apply_session(s, ctx).await,
            finalizer::Event::Cleanup(s) => cleanup_session(s, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Whether deleting `session` has anything to do: purge (or deliberately keep) an archive in
/// a bucket, or report an archive setting that cannot be read. Without a bucket the archive
/// and journal live on the pod's volume and go with it.
pub fn needs_finalizer(session: &AgentSession, defaults: &Defaults) -> bool {
    validate::archive_plan(session.spec.archive.as_ref(), defaults)
        .map_or(true, |a| a.bucket.is_some())
}

fn archive_state(archive: &ArchivePlan, namespace: &str, name: &str) -> Result<String, Problem> {
    validate::archive_usable(archive).map_err(|e| Problem::new(e.label(), e.to_string()))?;
    match &archive.bucket {
        Some(bucket) => Ok(format!(
            "s3://{bucket}/{}",
            archive.session_prefix(namespace, name)
        )),
        None => Err(Problem::new(
            "ArchiveNotConfigured",
            "no archive bucket is configured: archive and journal live on the pod's scratch \
             volume and are lost with the pod; set spec.archive.bucket, or the operator's \
             --archive-bucket (chart value archive.bucket), with S3 credentials \
             (spec.archive.credentials or chart value archive.credentialsSecret)",
        )),
    }
}

async fn apply_session(session: Arc<AgentSession>, ctx: &Context) -> Result<Action, Error> {
    let name = session.name_any();
    let namespace = session.namespace().unwrap_or_default();
    let policy = dereference::policy(&ctx.client, &namespace, &session).await?;
    let idle = idle_decision(&session);

    let mut obs = Observed {
        name: name.clone(),
        namespace: namespace.clone(),
        generation: session.metadata.generation,
        suspended: session.spec.suspend || idle.suspended,
        idle: idle.condition.clone(),
        policy: Err(Problem::new("Unknown", "")),
        blocker: None,
        ready_pods: None,
        api_token_hash: None,
        archive: validate::archive_plan(session.spec.archive.as_ref(), &ctx.defaults)
            .map_err(|e| Problem::new(e.label(), e.to_string()))
            .and_then(|a| archive_state(&a, &namespace, &name)),
    };

    let mut scoped_failure = None;
    let action = match policy {
        Err(problem) => {
            obs.policy = Err(problem);
            Action::requeue(WAITING_REQUEUE)
        }
        Ok(policy) => {
            obs.policy = cairn_crds::resolve(policy.as_ref(), session.spec.compaction.as_ref())
                .map(|p| p.hash())
                .map_err(|e| Problem::new("InvalidPolicy", e.to_string()));
            match validate::validate(&session, policy.as_ref(), &ctx.defaults) {
                Err(e) => {
                    obs.blocker = Some(Blocker::Invalid(Problem::new(e.label(), e.to_string())));
                    Action::await_change()
                }
                Ok(mut plan) => {
                    // An idle-suspended session stops its pod exactly as `spec.suspend` does.
                    plan.spec.suspend = obs.suspended;
                    let requeue = match scoped_credentials(&plan, ctx).await {
                        Ok(refresh) => refresh.map_or(ctx.resync, |r| r.min(ctx.resync)),
                        Err(failure) => {
                            let problem =
                                Problem::new(failure.error.label(), failure.error.to_string());
                            obs.archive = Err(problem.clone());
                            if !failure.usable {
                                // Without credentials the pod could not start: wait for them.
                                obs.blocker = Some(Blocker::Waiting(problem));
                            }
                            scoped_failure = Some(failure.error);
                            // Retried with the per-session backoff instead (see below).
                            ctx.resync
                        }
                    };
                    if obs.blocker.is_some() {
                        Action::requeue(requeue)
                    } else {
                        let stores = ctx.stores_for(&namespace).await;
                        let token = apply::TokenSecret::plan(
                            &objects::token_secret(&plan, &objects::ApiToken::generate()),
                            stores.as_ref(),
                            &ctx.accepted,
                        );
                        // A session whose status has no token digest yet (made before the
                        // operator published it) has its token read once to publish it.
                        let publish = session
                            .status
                            .as_ref()
                            .is_none_or(|s| s.api_token_hash.is_none());
                        let read = token.reads_token()
                            || (publish && token == apply::TokenSecret::Current);
                        match dereference::build_inputs(&ctx.client, &plan, read).await {
                            Err(e) if e.class() == ErrorClass::Waiting => {
                                obs.blocker =
                                    Some(Blocker::Waiting(Problem::new(e.label(), e.to_string())));
                                Action::requeue(ctx.secret_recheck(&namespace))
                            }
                            Err(e) => return Err(e),
                            Ok(inputs) => {
                                let built = objects::build(&plan, &inputs);
                                let applied = apply::apply_all(
                                    &ctx.client,
                                    &plan,
                                    &built,
                                    stores.as_ref(),
                                    token,
                                    &ctx.accepted,
                                )
                                .await?;
                                obs.ready_pods = Some(i32::from(applied.ready));
                                obs.api_token_hash = applied
                                    .token
                                    .as_ref()
                                    .or(read.then_some(&inputs.api_token))
                                    .map(|t| {
                                        cairn_crds::session::api_token_hash(
                                            &namespace,
                                            &name,
                                            t.expose(),
                                        )
                                    });
                                // The idle deadline, a moment after it so that it has passed.
                                let requeue = idle
                                    .recheck
                                    .map_or(requeue, |r| requeue.min(r + Duration::from_secs(1)));
                                Action::requeue(requeue)
                            }
                        }
                    }
                }
            }
        }
    };

    write_status(&session, &obs, ctx).await?;
    // A failed minting is retried with the per-session backoff (and reported as an Event by
    // `reconcile`), after the status says what is wrong.
    if let Some(e) = scoped_failure {
        return Err(e.into());
    }
    Ok(action)
}

/// The idle rule's decision for `session` now (see [`idle`]).
fn idle_decision(session: &AgentSession) -> idle::Decision {
    let text = session
        .spec
        .idle
        .as_ref()
        .and_then(|i| i.suspend_after.as_deref());
    let suspend_after = text.and_then(cairn_crds::session::parse_duration);
    let status = session.status.as_ref();
    let condition = |kind: &str| status.and_then(|s| s.conditions.iter().find(|c| c.type_ == kind));
    let decision = idle::decide(
        &idle::Inputs {
            suspend_after: suspend_after.filter(|d| !d.is_zero()),
            manual: session.spec.suspend,
            previous: condition(idle::IDLE),
            last_activity: status
                .and_then(|s| s.session.as_ref())
                .and_then(|s| s.last_activity.as_deref()),
            idle_since: status
                .and_then(|s| s.session.as_ref())
                .and_then(|s| s.idle_since.as_deref()),
            ready: condition(status::READY),
            wake_requested: session
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(cairn_crds::session::WAKE_ANNOTATION))
                .map(String::as_str),
        },
        Timestamp::now(),
    );
    match (text, suspend_after) {
        // The CRD's validation keeps this out; an object written around it is reported.
        (Some(t), None) => idle::Decision {
            condition: Some((
                false,
                Problem::new(
                    "InvalidSuspendAfter",
                    format!(
                        "idle.suspendAfter {t:?} is not a duration like 30s, 15m or 1h30m: the \
                         session is never suspended for being idle"
                    ),
                ),
            )),
            ..decision
        },
        _ => decision,
    }
}

/// In scoped mode, keeps the session's credentials Secret fresh; returns how long until the
/// next refresh is due (`None`: not in scoped mode).
async fn scoped_credentials(
    plan: &validate::Plan,
    ctx: &Context,
) -> Result<Option<Duration>, scoped::Failure> {
    let (Some(config), Some(target)) = (
        ctx.defaults
            .archive
            .scoped
            .as_ref()
            .filter(|_| plan.archive.scoped),
        scoped::MintTarget::for_plan(plan),
    ) else {
        return Ok(None);
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &plan.namespace);
    let ensured = scoped::ensure(&secrets, plan, config, &target).await?;
    if let Some(expiration) = ensured.minted {
        let reference = ObjectReference {
            api_version: Some(AgentSession::api_version(&()).into()),
            kind: Some(AgentSession::kind(&()).into()),
            name: Some(plan.name.clone()),
            namespace: Some(plan.namespace.clone()),
            uid: Some(plan.owner.uid.clone()),
            ..Default::default()
        };
        ctx.publish(
            &reference,
            false,
            "ScopedCredentialsIssued",
            format!(
                "credentials for {} only, valid until {}, refreshed at {}",
                target.scope(),
                rfc3339(expiration),
                rfc3339(ensured.refresh_at)
            ),
        )
        .await;
    }
    let wait = ensured
        .refresh_at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    Ok(Some(wait.max(Duration::from_secs(1))))
}

/// Writes the status if the operator's part changed, and publishes an Event per transition.
async fn write_status(session: &AgentSession, obs: &Observed, ctx: &Context) -> Result<(), Error> {
    let prev = session.status.as_ref();
    let next = status::desired(prev, obs, &now());
    ctx.metrics
        .set_phase(&key_of(&session.metadata), next.phase);
    if prev.map(status::operator_part) == Some(status::operator_part(&next)) {
        return Ok(());
    }
    let key = cache::Key::of(session);
    let digest = written_digest(&next);
    if ctx.accepted.pending(&key, &digest) {
        return Ok(());
    }
    let written = patch_status(session, &next, ctx).await?;
    let sessions = ctx
        .scope_stores(&key.namespace)
        .map(|stores| stores.sessions);
    ctx.accepted.record(key.clone(), digest, written, || {
        sessions.and_then(|s| {
            s.get(&ObjectRef::<Guarded>::new(&key.name).within(&key.namespace))
                .and_then(|g| g.meta().resource_version.clone())
        })
    });
    let reference = session_reference(&session.metadata);
    for t in status::transitions(prev, &next) {
        ctx.publish(&reference, t.warning, &t.reason, t.note).await;
    }
    Ok(())
}

/// Digest of the operator's part of `status` without the conditions' transition times (which
/// a reconcile of an outdated object computes anew).
fn written_digest(status: &AgentSessionStatus) -> String {
    let mut part = status::operator_part(status);
    for c in &mut part.conditions {
        c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
    }
    cache::digest(&serde_json::to_value(&part).unwrap_or_default())
}

/// Writes the operator's part of the status; returns the resourceVersion it was stored as.
async fn patch_status(
    session: &AgentSession,
    next: &AgentSessionStatus,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    let api: Api<AgentSession> = Api::namespaced(
        ctx.client.clone(),
        session.namespace().as_deref().unwrap_or_default(),
    );
    // Only the operator's fields: `status.session` belongs to the agent's field manager.
    let body = serde_json::json!({
        "apiVersion": AgentSession::api_version(&()),
        "kind": AgentSession::kind(&()),
        "status": status::operator_part(next),
    });
    let written = api
        .patch_status(
            &session.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(written.metadata.resource_version)
}

fn now() -> Time {
    // Conditions carry whole seconds on the wire; dropping the fraction here keeps a freshly
    // built status equal to what the API server hands back.
    let secs = Timestamp::now().as_second();
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

async fn cleanup_session(session: Arc<AgentSession>, ctx: &Context) -> Result<Action, Error> {
    let name = session.name_any();
    let namespace = session.namespace().unwrap_or_default();
    let reference = session_reference(&session.metadata);
    ctx.metrics.set_phase(&key_of(&session.metadata), None);
    ctx.accepted.forget(&cache::Key::of(session.as_ref()));

    let archive = match validate::archive_plan(session.spec.archive.as_ref(), &ctx.defaults) {
        Ok(a) => a,
        Err(e) => {
            // An unusable prefix could point anywhere: never delete on a guess.
            ctx.publish(
                &reference,
                true,
                "PurgeSkipped",
                format!("archive not purged: {e}"),
            )
            .await;
            return Ok(Action::await_change());
        }
    };
    if archive.retain_on_delete {
        ctx.publish(
            &reference,
            false,
            "ArchiveRetained",
            "spec.archive.retainOnDelete: archive and journal are kept".into(),
        )
        .await;
        return Ok(Action::await_change());
    }
    let Some(bucket) = archive.bucket.clone() else {
        return Ok(Action::await_change());
    };

    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    // Scoped mode: the purge runs with the operator's admin credentials (the session's own
    // may have expired, and DeleteObjects is not theirs to call).
    let keys = match ctx
        .defaults
        .archive
        .scoped
        .as_ref()
        .filter(|_| archive.scoped)
    {
        Some(config) => scoped::admin_keys(&config.admin_credentials_dir)
            .map(Some)
            .map_err(Error::from),
        None => dereference::s3_keys(&secrets, &namespace, &archive).await,
    };
    let target = match keys {
        Ok(credentials) => PurgeTarget {
            endpoint: archive.endpoint.clone(),
            bucket,
            region: archive.region.clone(),
            force_path_style: archive.force_path_style,
            prefix: archive.session_prefix(&namespace, &name),
            credentials,
        },
        Err(e) => {
            report_purge_failure(&session, ctx, &e.to_string()).await;
            return Err(e);
        }
    };
    match ctx.purger.purge(&target).await {
        Ok(deleted) => {
            tracing::info!(session = %format!("{namespace}/{name}"), deleted, "purged session archive");
            ctx.publish(
                &reference,
                false,
                "ArchivePurged",
                format!(
                    "deleted {deleted} objects under s3://{}/{}",
                    target.bucket, target.prefix
                ),
            )
            .await;
            Ok(Action::await_change())
        }
        Err(e) => {
            report_purge_failure(&session, ctx, &e.to_string()).await;
            Err(e.into())
        }
    }
}

/// A stuck cleanup says why, in the ArchiveReady condition and in an Event.
async fn report_purge_failure(session: &AgentSession, ctx: &Context, message: &str) {
    let prev = session.status.clone().unwrap_or_default();
    let next = status::with_condition(
        &prev,
        status::ARCHIVE_READY,
        false,
        Problem::new("PurgeFailed", message),
        session.metadata.generation,
        &now(),
    );
    if status::operator_part(&prev) != status::operator_part(&next)
        && let Err(e) = patch_status(session, &next, ctx).await
    {
        tracing::warn!(error = %e, "recording the purge failure in status failed");
    }
    ctx.publish(
        &session_reference(&session.metadata),
        true,
        "PurgeFailed",
        message.to_string(),
    )
    .await;
}
