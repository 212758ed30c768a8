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
use cairn_crds::{AgentSession, AgentSessionStatus, CompactionPolicySpec};

use crate::backoff::Backoff;
use crate::config::Defaults;
use crate::error::{Error, ErrorClass};
use crate::metrics::Metrics;
use crate::objects::{self, BuildInputs, FIELD_MANAGER};
use crate::purge::{ArchivePurger, PurgeTarget};
use crate::status::{self, Blocker, Observed, Problem};
use crate::validate::{self, ArchivePlan, Plan};
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

/// Whether deleting `session` has anything to do: purge an archive in a bucket, or report an
/// archive setting that cannot be read. Without a bucket the archive and journal live on the
/// pod's volume and go with it; with `retainOnDelete` (the default) they stay in the bucket
/// and there is nothing to do (decision 0088).
pub fn needs_finalizer(session: &AgentSession, defaults: &Defaults) -> bool {
    validate::archive_plan(session.spec.archive.as_ref(), defaults)
        .map_or(true, |a| a.bucket.is_some() && !a.retain_on_delete)
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

/// Where one pass over a live session stopped short of applying; the status reports it.
#[derive(Clone, Debug, PartialEq)]
enum Stop {
    /// dereference: `spec.policyRef` names no CompactionPolicy (the PolicyResolved condition
    /// says so; nothing else blocks).
    PolicyMissing,
    /// validate: the spec cannot become a plan; only an edit helps.
    Invalid(Problem),
    /// credentials: the scoped credentials could not be issued and the stored ones cannot
    /// start the pod.
    NoCredentials(Problem),
    /// dereference: a Secret the plan names is missing or lacks a key.
    SecretMissing(Problem),
}

/// Why the steps ended early: a [`Stop`] the status reports, or a failed request it does not
/// (the reconcile fails and backs off).
#[derive(Debug)]
enum Halt {
    Stopped(Stop),
    Failed(Error),
}

impl From<Stop> for Halt {
    fn from(stop: Stop) -> Self {
        Self::Stopped(stop)
    }
}

impl From<Error> for Halt {
    fn from(e: Error) -> Self {
        Self::Failed(e)
    }
}

impl From<kube::Error> for Halt {
    fn from(e: kube::Error) -> Self {
        Self::Failed(e.into())
    }
}

/// The scoped credentials' outcome: how long until their refresh is due (`None`: not in
/// scoped mode), or why they could not be issued.
type Credentials = Result<Option<Duration>, scoped::Failure>;

/// One pass over a live session: dereference the policy → validate → the scoped credentials →
/// dereference the plan's Secrets → build → apply, then the status. I/O happens in the
/// dereference, credentials and apply steps and the status write; validate, build, what the
/// status says and when to look again are pure.
async fn apply_session(session: Arc<AgentSession>, ctx: &Context) -> Result<Action, Error> {
    let namespace = session.namespace().unwrap_or_default();
    let policy = dereference::policy(&ctx.client, &namespace, &session).await?;
    let idle = idle_decision(&session);
    let suspended = session.spec.suspend || idle.suspended;

    // Outlives a later stop: a failure is reported in ArchiveReady and fails the reconcile.
    let mut credentials: Credentials = Ok(None);
    let reached: Result<apply::Applied, Halt> = async {
        let policy = policy.as_ref().map_err(|_| Stop::PolicyMissing)?;
        let plan = validate_session(&session, policy.as_ref(), &ctx.defaults, suspended)?;
        credentials = scoped_credentials(&plan, ctx).await;
        credentials_usable(&credentials)?;
        let stores = ctx.stores_for(&namespace).await;
        let token = apply::TokenSecret::plan(
            &objects::token_secret(&plan, &objects::ApiToken::generate()),
            stores.as_ref(),
            &ctx.accepted,
        );
        let read = reads_token(&session, token);
        let inputs = dereference_inputs(&ctx.client, &plan, read).await?;
        let built = objects::build(&plan, &inputs);
        let mut applied = apply::apply_all(
            &ctx.client,
            &plan,
            &built,
            stores.as_ref(),
            token,
            &ctx.accepted,
        )
        .await?;
        // Not written (current), a token read to publish its digest is the one it holds.
        applied.token = applied.token.or(read.then_some(inputs.api_token));
        Ok(applied)
    }
    .await;
    let reached = match reached {
        Ok(applied) => Ok(applied),
        Err(Halt::Stopped(stop)) => Err(stop),
        Err(Halt::Failed(e)) => return Err(e),
    };

    let sharing = credentials_sharers(&session, &ctx.defaults, || {
        ctx.scope_stores(&namespace)
            .map(|stores| stores.sessions.state())
            .unwrap_or_default()
    });
    let obs = observed(
        &session,
        &idle,
        &ctx.defaults,
        &policy,
        &credentials,
        &reached,
        &sharing,
    );
    let pod_created = reached.as_ref().ok().and_then(|a| a.pod_created);
    let status_wait = write_status(&session, &obs, pod_created, ctx).await?;
    let action = next_look(
        &reached,
        credentials.as_ref().ok().copied().flatten(),
        idle.recheck.into_iter().chain(status_wait).min(),
        ctx.resync,
        ctx.secret_recheck(&namespace),
    );
    // A failed minting is retried with the per-session backoff (and reported as an Event by
    // `reconcile`), after the status says what is wrong.
    match credentials {
        Err(failure) => Err(failure.error.into()),
        Ok(_) => Ok(action),
    }
}

/// validate: the plan for `session` under its policyRef target. `suspended` includes an idle
/// suspension, which stops the pod exactly as `spec.suspend` does.
fn validate_session(
    session: &AgentSession,
    policy: Option<&CompactionPolicySpec>,
    defaults: &Defaults,
    suspended: bool,
) -> Result<Plan, Stop> {
    let mut plan = validate::validate(session, policy, defaults)
        .map_err(|e| Stop::Invalid(Problem::new(e.label(), e.to_string())))?;
    plan.spec.suspend = suspended;
    Ok(plan)
}

/// credentials: a failure stops the steps only when the stored credentials cannot start the
/// pod; otherwise the pod keeps them until the next attempt.
fn credentials_usable(credentials: &Credentials) -> Result<(), Stop> {
    match credentials {
        Err(failure) if !failure.usable => Err(Stop::NoCredentials(credentials_problem(failure))),
        _ => Ok(()),
    }
}

fn credentials_problem(failure: &scoped::Failure) -> Problem {
    Problem::new(failure.error.label(), failure.error.to_string())
}

/// Whether the token Secret is read before building: to keep its token when it is applied,
/// or once to publish the digest of a token the session's status does not carry yet (a
/// session made before the operator published it).
fn reads_token(session: &AgentSession, token: apply::TokenSecret) -> bool {
    let publish = session
        .status
        .as_ref()
        .is_none_or(|s| s.api_token_hash.is_none());
    token.reads_token() || (publish && token == apply::TokenSecret::Current)
}

/// dereference: the API token (read when `read_token`) and the digests of the credentials
/// the plan names; a missing Secret or key stops the steps, any other failure fails the
/// reconcile.
async fn dereference_inputs(
    client: &Client,
    plan: &Plan,
    read_token: bool,
) -> Result<BuildInputs, Halt> {
    dereference::build_inputs(client, plan, read_token)
        .await
        .map_err(|e| match e.class() {
            ErrorClass::Waiting => {
                Stop::SecretMissing(Problem::new(e.label(), e.to_string())).into()
            }
            _ => Halt::Failed(e),
        })
}

/// The other sessions of `session`'s namespace whose pods hold the same static key pair: a
/// credentials Secret of its own that they name too, or get as the operator's default. Only a
/// session with a Secret of its own looks (`sessions` is called then): the operator's default
/// Secret is shared by construction, scoped credentials and pod identities never are.
pub fn credentials_sharers(
    session: &AgentSession,
    defaults: &Defaults,
    sessions: impl FnOnce() -> Vec<Arc<DeserializeGuard<AgentSession>>>,
) -> Vec<String> {
    let secret = |s: &AgentSession| {
        validate::archive_plan(s.spec.archive.as_ref(), defaults)
            .ok()
            .filter(|a| a.bucket.is_some())
            .and_then(|a| a.credentials.map(|c| c.secret_name))
    };
    let own = validate::archive_plan(session.spec.archive.as_ref(), defaults)
        .ok()
        .filter(|a| a.bucket.is_some() && !a.default_credentials)
        .and_then(|a| a.credentials.map(|c| c.secret_name));
    let Some(own) = own else {
        return Vec::new();
    };
    let (namespace, name) = (session.namespace(), session.name_any());
    let mut sharers: Vec<String> = sessions()
        .iter()
        .filter_map(|g| g.0.as_ref().ok())
        .filter(|s| s.namespace() == namespace && s.name_any() != name)
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter(|s| secret(s).as_ref() == Some(&own))
        .map(|s| s.name_any())
        .collect();
    sharers.sort();
    sharers
}

/// What the status reports after the steps: the session's own settings and idleness, its
/// policy (found or missing), the scoped credentials' failure, how far the steps got
/// (applied: the pod's readiness and the digest of the token written or read), and the
/// other sessions holding its storage credentials (`sharing`).
fn observed(
    session: &AgentSession,
    idle: &idle::Decision,
    defaults: &Defaults,
    policy: &Result<Option<CompactionPolicySpec>, Problem>,
    credentials: &Credentials,
    reached: &Result<apply::Applied, Stop>,
    sharing: &[String],
) -> Observed {
    let name = session.name_any();
    let namespace = session.namespace().unwrap_or_default();
    let plan = validate::archive_plan(session.spec.archive.as_ref(), defaults)
        .map_err(|e| Problem::new(e.label(), e.to_string()));
    let archive_credentials = plan
        .as_ref()
        .ok()
        .and_then(|a| status::archive_credentials(a, &namespace, &name, sharing));
    let archive = match credentials {
        Err(failure) => Err(credentials_problem(failure)),
        Ok(_) => plan.and_then(|a| archive_state(&a, &namespace, &name)),
    };
    let policy = match policy {
        Err(problem) => Err(problem.clone()),
        Ok(policy) => cairn_crds::resolve(policy.as_ref(), session.spec.compaction.as_ref())
            .map(|p| p.hash())
            .map_err(|e| Problem::new("InvalidPolicy", e.to_string())),
    };
    let applied = reached.as_ref().ok();
    let blocker = match reached {
        Err(Stop::Invalid(problem)) => Some(Blocker::Invalid(problem.clone())),
        Err(Stop::NoCredentials(problem) | Stop::SecretMissing(problem)) => {
            Some(Blocker::Waiting(problem.clone()))
        }
        Err(Stop::PolicyMissing) | Ok(_) => None,
    };
    Observed {
        generation: session.metadata.generation,
        suspended: session.spec.suspend || idle.suspended,
        idle: idle.condition.clone(),
        policy,
        blocker,
        ready_pods: applied.map(|a| i32::from(a.ready)),
        api_token_hash: applied
            .and_then(|a| a.token.as_ref())
            .map(|t| cairn_crds::session::api_token_hash(&namespace, &name, t.expose())),
        archive,
        archive_credentials,
        name,
        namespace,
    }
}

/// When to look at the session again: a missing policy slowly (its watch usually comes
/// first), an invalid spec on its next edit, a missing Secret after `secret_recheck`;
/// otherwise at the safety-net `resync`, or sooner when the scoped credentials' `refresh` or,
/// once applied, `recheck` (the idle deadline, or the end of the first status's wait for the
/// pod) comes first.
fn next_look(
    reached: &Result<apply::Applied, Stop>,
    refresh: Option<Duration>,
    recheck: Option<Duration>,
    resync: Duration,
    secret_recheck: Duration,
) -> Action {
    let refresh = refresh.map_or(resync, |r| r.min(resync));
    match reached {
        Err(Stop::PolicyMissing) => Action::requeue(WAITING_REQUEUE),
        Err(Stop::Invalid(_)) => Action::await_change(),
        Err(Stop::NoCredentials(_)) => Action::requeue(refresh),
        Err(Stop::SecretMissing(_)) => Action::requeue(secret_recheck),
        // A moment after the deadline, so that it has passed.
        Ok(_) => {
            Action::requeue(recheck.map_or(refresh, |r| refresh.min(r + Duration::from_secs(1))))
        }
    }
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
/// A new session's first status that only says its pod is starting waits for the pod, up to
/// [`status::FIRST_STATUS_GRACE`] after the pod's creation (`pod_created`): returns how much
/// longer.
async fn write_status(
    session: &AgentSession,
    obs: &Observed,
    pod_created: Option<Timestamp>,
    ctx: &Context,
) -> Result<Option<Duration>, Error> {
    let prev = session.status.as_ref();
    let next = status::desired(prev, obs, &now());
    ctx.metrics
        .set_session(&key_of(&session.metadata), Some(&next));
    if prev.map(status::operator_part) == Some(status::operator_part(&next)) {
        return Ok(None);
    }
    if let Some(wait) = first_status_wait(session, &next, pod_created, Timestamp::now()) {
        return Ok(Some(wait));
    }
    let key = cache::Key::of(session);
    let digest = written_digest(&next);
    if ctx.accepted.pending(&key, &digest) {
        return Ok(None);
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
    Ok(None)
}

/// How much longer the first status of `session` may wait for its pod, created at
/// `pod_created` ([`status::first_write_waits`]); `None`: write it now (something to
/// report, the grace is over, or there is no pod).
fn first_status_wait(
    session: &AgentSession,
    next: &AgentSessionStatus,
    pod_created: Option<Timestamp>,
    now: Timestamp,
) -> Option<Duration> {
    if !status::first_write_waits(session.status.as_ref(), next) {
        return None;
    }
    let created = pod_created?;
    // A creation time ahead of this clock counts as just now.
    let age = Duration::try_from(now.duration_since(created)).unwrap_or_default();
    status::FIRST_STATUS_GRACE
        .checked_sub(age)
        .filter(|wait| !wait.is_zero())
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
    ctx.metrics.set_session(&key_of(&session.metadata), None);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scoped::ScopedError;
    use serde_json::json;

    const RESYNC: Duration = Duration::from_secs(3600);
    const SECRET_RECHECK: Duration = Duration::from_secs(30);

    fn session(spec: serde_json::Value) -> AgentSession {
        serde_json::from_value(json!({
            "apiVersion": "cairn.dev/v1beta1",
            "kind": "AgentSession",
            "metadata": {"name": "chat", "namespace": "team-a", "uid": "u-1", "generation": 3},
            "spec": spec,
        }))
        .expect("session fixture")
    }

    fn minimal() -> AgentSession {
        session(json!({"provider": {"kind": "openai", "model": "gpt-5"}}))
    }

    fn awake() -> idle::Decision {
        idle::Decision {
            suspended: false,
            condition: None,
            recheck: None,
            woken_at: None,
        }
    }

    fn failure(usable: bool) -> Credentials {
        Err(scoped::Failure {
            error: ScopedError::Sts {
                endpoint: "https://sts.example".into(),
                message: "denied".into(),
            },
            usable,
        })
    }

    fn applied(ready: bool) -> apply::Applied {
        apply::Applied {
            ready,
            pod_created: None,
            token: None,
        }
    }

    fn problem(reason: &str) -> Problem {
        Problem::new(reason, "why")
    }

    fn look(
        reached: Result<apply::Applied, Stop>,
        refresh: Option<u64>,
        idle: Option<u64>,
    ) -> Action {
        next_look(
            &reached,
            refresh.map(Duration::from_secs),
            idle.map(Duration::from_secs),
            RESYNC,
            SECRET_RECHECK,
        )
    }

    #[test]
    fn only_a_session_whose_archive_is_purged_waits_for_the_operator_when_deleted() {
        let with = |archive: serde_json::Value| {
            session(json!({"provider": {"kind": "openai", "model": "gpt-5"}, "archive": archive}))
        };
        let defaults = Defaults::default();
        // No bucket: archive and journal go with the pod's volume.
        assert!(!needs_finalizer(&minimal(), &defaults));
        // A bucket, kept on delete (the default): nothing to do when it goes.
        let kept = with(json!({"bucket": "b", "credentials": {"secretName": "s3"}}));
        assert!(!needs_finalizer(&kept, &defaults));
        // A bucket purged on delete: the finalizer holds the deletion until it is empty.
        let purged = with(json!({"bucket": "b", "credentials": {"secretName": "s3"},
                                 "retainOnDelete": false}));
        assert!(needs_finalizer(&purged, &defaults));
        // The operator's bucket counts as the session's own.
        let mut operator_bucket = defaults.clone();
        operator_bucket.archive.bucket = Some("b".into());
        operator_bucket.archive.ambient_credentials = true;
        assert!(!needs_finalizer(&minimal(), &operator_bucket));
        assert!(needs_finalizer(
            &with(json!({"retainOnDelete": false})),
            &operator_bucket
        ));
        // A setting that cannot be read is reported when the session goes, never guessed.
        assert!(needs_finalizer(
            &with(json!({"bucket": "b", "prefix": "../x", "retainOnDelete": true})),
            &defaults
        ));
    }

    #[test]
    fn the_next_look_follows_where_the_steps_stopped() {
        let secs = |s| Action::requeue(Duration::from_secs(s));
        assert_eq!(look(Err(Stop::PolicyMissing), None, None), secs(300));
        assert_eq!(
            look(
                Err(Stop::Invalid(problem("MissingModel"))),
                Some(5),
                Some(5)
            ),
            Action::await_change()
        );
        assert_eq!(
            look(
                Err(Stop::SecretMissing(problem("SecretNotFound"))),
                Some(5),
                None
            ),
            secs(30)
        );
        assert_eq!(
            look(Err(Stop::NoCredentials(problem("Sts"))), None, Some(5)),
            secs(3600),
            "the failure's own backoff decides; the idle deadline needs a pod"
        );
        assert_eq!(
            look(Ok(applied(true)), None, None),
            secs(3600),
            "the safety net"
        );
        assert_eq!(
            look(Ok(applied(true)), Some(600), None),
            secs(600),
            "credentials due"
        );
        assert_eq!(look(Ok(applied(true)), Some(7200), None), secs(3600));
        assert_eq!(
            look(Ok(applied(false)), None, Some(60)),
            secs(61),
            "just past the idle deadline"
        );
        assert_eq!(look(Ok(applied(false)), Some(30), Some(60)), secs(30));
    }

    #[test]
    fn a_new_sessions_first_status_waits_for_its_pod_until_the_grace_is_over() {
        let created = Timestamp::from_second(1_800_000_000).expect("time");
        let session = minimal();
        let starting = AgentSessionStatus {
            phase: Some(cairn_crds::Phase::Pending),
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: status::READY.into(),
                status: "False".into(),
                reason: status::POD_NOT_READY.into(),
                message: String::new(),
                last_transition_time: Time(created),
                observed_generation: None,
            }],
            ..Default::default()
        };
        let at = |secs: i64| created + k8s_openapi::jiff::SignedDuration::from_secs(secs);
        let pod = Some(created);
        assert_eq!(
            first_status_wait(&session, &starting, pod, at(3)),
            Some(Duration::from_secs(7))
        );
        assert_eq!(first_status_wait(&session, &starting, pod, at(10)), None);
        assert_eq!(
            first_status_wait(&session, &starting, pod, at(-5)),
            Some(status::FIRST_STATUS_GRACE),
            "a creation time ahead of the clock counts as now"
        );
        assert_eq!(
            first_status_wait(&session, &starting, None, at(3)),
            None,
            "no pod: written at once"
        );
    }

    #[test]
    fn validate_applies_an_idle_suspension_and_stops_an_invalid_spec() {
        let defaults = Defaults::default();
        let plan = validate_session(&minimal(), None, &defaults, true).expect("valid");
        assert!(
            plan.spec.suspend,
            "an idle session's pod stops as a suspended one's"
        );
        let plan = validate_session(&minimal(), None, &defaults, false).expect("valid");
        assert!(!plan.spec.suspend);
        let no_model = session(json!({"provider": {"kind": "openai", "model": " "}}));
        match validate_session(&no_model, None, &defaults, false) {
            Err(Stop::Invalid(p)) => assert_eq!(p.reason, "MissingModel"),
            other => panic!("expected Stop::Invalid, got {other:?}"),
        }
    }

    #[test]
    fn failed_credentials_stop_the_steps_only_when_the_stored_ones_cannot_serve() {
        assert_eq!(credentials_usable(&Ok(None)), Ok(()));
        assert_eq!(credentials_usable(&Ok(Some(RESYNC))), Ok(()));
        assert_eq!(credentials_usable(&failure(true)), Ok(()));
        match credentials_usable(&failure(false)) {
            Err(Stop::NoCredentials(p)) => assert_eq!(p.reason, "ScopedCredentialsFailed"),
            other => panic!("expected Stop::NoCredentials, got {other:?}"),
        }
    }

    #[test]
    fn the_status_says_where_the_steps_stopped() {
        let s = minimal();
        let defaults = Defaults::default();
        let found = Ok(None);
        let hash = cairn_crds::resolve(None, None).expect("defaults").hash();
        let obs = |policy: &Result<Option<CompactionPolicySpec>, Problem>,
                   credentials: &Credentials,
                   reached: Result<apply::Applied, Stop>| {
            observed(&s, &awake(), &defaults, policy, credentials, &reached, &[])
        };

        let missing = Err(problem("PolicyNotFound"));
        let o = obs(&missing, &Ok(None), Err(Stop::PolicyMissing));
        assert_eq!(o.policy, Err(problem("PolicyNotFound")));
        assert_eq!((o.blocker, o.ready_pods), (None, None));

        let o = obs(
            &found,
            &Ok(None),
            Err(Stop::Invalid(problem("MissingModel"))),
        );
        assert_eq!(o.policy, Ok(hash.clone()));
        assert_eq!(o.blocker, Some(Blocker::Invalid(problem("MissingModel"))));

        let o = obs(
            &found,
            &Ok(None),
            Err(Stop::SecretMissing(problem("SecretNotFound"))),
        );
        assert_eq!(o.blocker, Some(Blocker::Waiting(problem("SecretNotFound"))));
        assert_eq!(o.ready_pods, None);

        let unusable = failure(false);
        let Err(Stop::NoCredentials(why)) = credentials_usable(&unusable) else {
            panic!("unusable credentials stop the steps");
        };
        let o = obs(&found, &unusable, Err(Stop::NoCredentials(why.clone())));
        assert_eq!(o.archive, Err(why.clone()));
        assert_eq!(o.blocker, Some(Blocker::Waiting(why.clone())));

        let o = obs(&found, &failure(true), Ok(applied(true)));
        assert_eq!(o.archive, Err(why), "a usable failure is still reported");
        assert_eq!((o.blocker, o.ready_pods), (None, Some(1)));

        let o = obs(&found, &Ok(Some(RESYNC)), Ok(applied(false)));
        assert_eq!(o.ready_pods, Some(0));
        assert_eq!(
            o.archive.map_err(|p| p.reason),
            Err("ArchiveNotConfigured".to_string())
        );
        assert_eq!(
            (o.name.as_str(), o.namespace.as_str(), o.generation),
            ("chat", "team-a", Some(3))
        );
        assert!(!o.suspended);
        assert_eq!(
            o.api_token_hash, None,
            "no token written or read: the digest stays"
        );

        let token = apply::Applied {
            ready: true,
            pod_created: None,
            token: Some(objects::ApiToken::from_existing("t0ken".into())),
        };
        let o = obs(&found, &Ok(None), Ok(token));
        assert_eq!(
            o.api_token_hash,
            Some(cairn_crds::session::api_token_hash(
                "team-a", "chat", "t0ken"
            ))
        );
        let o = obs(
            &found,
            &Ok(None),
            Err(Stop::SecretMissing(problem("SecretNotFound"))),
        );
        assert_eq!(o.api_token_hash, None);

        let sleeping = idle::Decision {
            suspended: true,
            condition: Some((true, problem("Idle"))),
            ..awake()
        };
        let o = observed(
            &s,
            &sleeping,
            &defaults,
            &found,
            &Ok(None),
            &Ok(applied(false)),
            &[],
        );
        assert!(o.suspended);
        assert_eq!(o.idle, Some((true, problem("Idle"))));
    }

    #[test]
    fn the_token_is_read_to_keep_it_or_once_to_publish_its_digest() {
        use apply::TokenSecret::{Apply, Create, Current};
        let unpublished = minimal();
        let mut published = minimal();
        published.status = Some(AgentSessionStatus {
            api_token_hash: Some("digest".into()),
            ..Default::default()
        });
        assert!(reads_token(&unpublished, Apply));
        assert!(reads_token(&published, Apply));
        assert!(
            reads_token(&unpublished, Current),
            "once, to publish the digest"
        );
        assert!(!reads_token(&published, Current));
        assert!(
            !reads_token(&unpublished, Create),
            "a fresh token is written"
        );
        assert!(!reads_token(&published, Create));
    }
}
