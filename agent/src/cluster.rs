//! The agent inside a cluster: it follows its own AgentSession (and the CompactionPolicy it
//! references) so policy edits apply on the next turn, writes `status.session`, and holds
//! the Lease `cairn-<session>` that keeps a second pod from running turns on the session.
//!
//! Only what the session's Role allows is used: get/list/watch of its own AgentSession and
//! of the referenced CompactionPolicy (each watched with a `metadata.name` field selector),
//! patch of its own status, get/create/update of its Lease, create/patch of Events (the
//! session's, [`crate::events`]).

use std::sync::Arc;
use std::time::Duration;

use cairn_crds::names::lease_name;
use cairn_crds::{AgentSession, CompactionPolicy, CompactionPolicySpec, SessionStats};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::config::{ConfigError, Live};

/// Field manager of everything the agent writes.
pub const FIELD_MANAGER: &str = "cairn-agent";
/// Status is written at most this often by default.
pub const STATUS_INTERVAL: Duration =
    Duration::from_secs(cairn_crds::session::DEFAULT_STATUS_INTERVAL_SECONDS);
/// Environment variable overriding [`STATUS_INTERVAL`] (whole seconds, at least 1).
pub const STATUS_INTERVAL_ENV: &str = "CAIRN_STATUS_INTERVAL_SECS";
/// How long a Lease holds without renewal.
pub const LEASE_SECONDS: i32 = 15;
/// Annotation on the Lease carrying the holder's journal epoch (its fencing token).
pub const EPOCH_ANNOTATION: &str = "cairn.dev/journal-epoch";

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("AgentSession {0} has no spec the agent can run: {1}")]
    Spec(String, String),
}

impl KubeError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Api(_) => "api",
            Self::Config(e) => e.label(),
            Self::Spec(..) => "spec",
        }
    }
}

fn system_prompt_env() -> Option<String> {
    crate::config::system_prompt_override()
}

/// Reads the session and its policy once: the settings the agent starts with.
pub async fn load(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<(AgentSession, Live), KubeError> {
    let sessions: Api<AgentSession> = Api::namespaced(client.clone(), ns);
    let s = sessions.get(name).await?;
    let policy = match &s.spec.policy_ref {
        Some(r) => {
            let policies: Api<CompactionPolicy> = Api::namespaced(client.clone(), ns);
            Some(policies.get(&r.name).await?.spec)
        }
        None => None,
    };
    let live = Live::resolve(&s.spec, policy.as_ref(), system_prompt_env())?;
    Ok((s, live))
}

fn by_name(name: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={name}"))
}

/// Follows the session and its policy; every change of the resolved settings is sent on
/// `tx` (the session picks it up at its next turn). Runs until `tx` has no receivers.
pub async fn follow(client: Client, ns: String, name: String, tx: watch::Sender<Arc<Live>>) {
    let sessions: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
    let policies: Api<CompactionPolicy> = Api::namespaced(client, &ns);
    let mut session_events = watcher(sessions, by_name(&name))
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut spec = tx.borrow().spec.clone();
    let mut policy: Option<CompactionPolicySpec> = None;
    let mut policy_name: Option<String> = None;
    let mut policy_events: Option<BoxStream<'static, Result<CompactionPolicy, watcher::Error>>> =
        None;
    loop {
        tokio::select! {
            ev = session_events.next() => match ev {
                Some(Ok(s)) => {
                    spec = s.spec;
                    let wanted = spec.policy_ref.as_ref().map(|r| r.name.clone());
                    if wanted != policy_name {
                        policy_name.clone_from(&wanted);
                        policy = None;
                        policy_events = wanted.map(|p| {
                            watcher(policies.clone(), by_name(&p))
                                .default_backoff()
                                .applied_objects()
                                .boxed()
                        });
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching the AgentSession");
                    continue;
                }
                None => return,
            },
            Some(ev) = next_policy(&mut policy_events) => match ev {
                Ok(p) => policy = Some(p.spec),
                Err(e) => {
                    tracing::warn!(error = %e, "watching the CompactionPolicy");
                    continue;
                }
            },
        }
        if policy_name.is_some() && policy.is_none() {
            // Wait for the referenced policy before resolving with it missing.
            continue;
        }
        match Live::resolve(&spec, policy.as_ref(), system_prompt_env()) {
            Ok(live) => {
                if *tx.borrow().as_ref() != live {
                    tracing::info!(policy = %live.policy_hash, "settings changed; applied from the next turn");
                    if tx.send(Arc::new(live)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the changed session spec does not resolve; keeping the previous settings")
            }
        }
    }
}

async fn next_policy(
    s: &mut Option<BoxStream<'static, Result<CompactionPolicy, watcher::Error>>>,
) -> Option<Result<CompactionPolicy, watcher::Error>> {
    match s {
        Some(s) => s.next().await,
        None => futures::future::pending().await,
    }
}

/// The status interval: `value` (of [`STATUS_INTERVAL_ENV`]) in whole seconds, at least 1;
/// [`STATUS_INTERVAL`] when absent or not a number.
pub fn status_interval(value: Option<&str>) -> Duration {
    match value.map(str::trim).map(str::parse::<u64>) {
        Some(Ok(secs)) => Duration::from_secs(secs.max(1)),
        Some(Err(_)) => {
            tracing::warn!(
                variable = STATUS_INTERVAL_ENV,
                "not a whole number of seconds; using the default status interval"
            );
            STATUS_INTERVAL
        }
        None => STATUS_INTERVAL,
    }
}

/// What the status writer follows besides the counters, for the idle report
/// (`crate::report`).
pub struct IdleFeeds {
    /// Client work in flight (`AppState::in_flight`).
    pub in_flight: watch::Receiver<usize>,
    /// The live settings: `spec.idle.suspendAfter`, a `kubectl edit` included.
    pub live: watch::Receiver<Arc<Live>>,
}

/// `spec.idle.suspendAfter` of the live settings (`None`: no idle rule).
fn suspend_after(live: &Live) -> Option<Duration> {
    live.spec
        .idle
        .as_ref()
        .and_then(|i| i.suspend_after.as_deref())
        .and_then(cairn_crds::session::parse_duration)
        .filter(|d| !d.is_zero())
}

/// Waits for a change of `rx`; never returns for a closed channel or none.
async fn changed<T>(rx: &mut Option<watch::Receiver<T>>) {
    if let Some(rx) = rx
        && rx.changed().await.is_ok()
    {
        return;
    }
    futures::future::pending().await
}

/// Writes `status.session` (server-side apply, field manager [`FIELD_MANAGER`]) whenever the
/// counters change, at most once per `interval`: an idle session writes nothing. With
/// `idle`, a session with `spec.idle.suspendAfter` also gets the idle report and the write
/// after it at once (`crate::report`: at most one of each per idle period, so the budget of
/// one write per interval holds for a session in use). A failed write is tried again after
/// the interval. Runs until `stats` has no sender.
pub async fn write_status(
    client: Client,
    ns: String,
    name: String,
    mut stats: watch::Receiver<Option<SessionStats>>,
    interval: Duration,
    idle: Option<IdleFeeds>,
) {
    let api: Api<AgentSession> = Api::namespaced(client, &ns);
    let mut schedule = crate::report::Schedule::new(interval);
    let (mut in_flight, mut live) = match idle {
        Some(f) => (Some(f.in_flight), Some(f.live)),
        None => (None, None),
    };
    loop {
        let current = stats.borrow_and_update().clone();
        let busy = in_flight.as_mut().map_or(0, |r| *r.borrow_and_update());
        let after = live
            .as_mut()
            .and_then(|r| suspend_after(&r.borrow_and_update()));
        let now = Timestamp::now();
        match schedule.step(current.as_ref(), busy, after, now) {
            crate::report::Step::Write(session) => {
                let patch = serde_json::json!({
                    "apiVersion": format!("{}/{}", cairn_crds::GROUP, cairn_crds::VERSION),
                    "kind": "AgentSession",
                    "status": {"session": session},
                });
                match api
                    .patch_status(
                        &name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&patch),
                    )
                    .await
                {
                    Ok(_) => {
                        if session.idle_since.as_deref() != schedule.reported_written() {
                            match &session.idle_since {
                                Some(since) => {
                                    tracing::info!(idle_since = %since, "reported the session idle")
                                }
                                None => tracing::info!("reported the session in use again"),
                            }
                        }
                        schedule.written(*session, Timestamp::now());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "writing status.session");
                        schedule.failed(Timestamp::now());
                    }
                }
            }
            crate::report::Step::Wait(until) => {
                let wait = until.map(|t| {
                    Duration::try_from(t.duration_since(Timestamp::now())).unwrap_or_default()
                });
                tokio::select! {
                    done = stats.changed() => if done.is_err() {
                        return;
                    },
                    () = changed(&mut in_flight) => {}
                    () = changed(&mut live) => {}
                    () = async {
                        match wait {
                            Some(d) => tokio::time::sleep(d).await,
                            None => futures::future::pending().await,
                        }
                    } => {}
                }
            }
        }
    }
}

/// Writes one archive check into `status.session.archiveCheck` (a merge patch: the
/// counters an earlier incarnation wrote stay until this one's first status write). Used
/// before the session is open, when the regular status writer is not running yet.
pub async fn report_archive_check(
    client: &Client,
    ns: &str,
    name: &str,
    check: &cairn_crds::session::ArchiveCheck,
) {
    let api: Api<AgentSession> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({"status": {"session": {"archiveCheck": check}}});
    if let Err(e) = api
        .patch_status(
            name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!(error = %e, "writing status.session.archiveCheck");
    }
}

/// A held Lease.
pub struct LeaseHold {
    api: Api<Lease>,
    name: String,
    holder: String,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn expired(spec: &LeaseSpec) -> bool {
    let Some(renew) = &spec.renew_time else {
        return true;
    };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
    Timestamp::now().as_second() > renew.0.as_second() + secs
}

impl LeaseHold {
    /// Takes the Lease `cairn-<session>`, waiting while another live holder has it.
    pub async fn acquire(
        client: Client,
        ns: &str,
        session: &str,
        holder: &str,
    ) -> Result<Self, KubeError> {
        let api: Api<Lease> = Api::namespaced(client, ns);
        let name = lease_name(session);
        let mut waited = false;
        loop {
            let spec = LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(LEASE_SECONDS),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            };
            match api.get_opt(&name).await? {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(spec),
                    };
                    match api.create(&PostParams::default(), &lease).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(e)) if e.code == 409 => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Some(mut lease) => {
                    let current = lease.spec.clone().unwrap_or_default();
                    let held_by = current.holder_identity.clone().filter(|h| !h.is_empty());
                    let free = held_by.is_none()
                        || held_by.as_deref() == Some(holder)
                        || expired(&current);
                    if !free {
                        if !waited {
                            tracing::warn!(holder = ?held_by, "session lease held by another agent; waiting for it to end or expire");
                            waited = true;
                        }
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        continue;
                    }
                    let transitions = current.lease_transitions.unwrap_or(0)
                        + i32::from(held_by.as_deref() != Some(holder));
                    lease.spec = Some(LeaseSpec {
                        lease_transitions: Some(transitions),
                        ..spec
                    });
                    match api.replace(&name, &PostParams::default(), &lease).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(e)) if e.code == 409 => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        tracing::info!(lease = %name, "session lease acquired");
        Ok(Self {
            api,
            name,
            holder: holder.to_owned(),
        })
    }

    /// Renews the Lease; `Err` with the new holder when it was lost.
    pub async fn renew(&self, epoch: Option<u64>) -> Result<(), String> {
        let mut lease = self.api.get(&self.name).await.map_err(|e| e.to_string())?;
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
            return Err(format!(
                "the session lease {} is now held by {}",
                self.name,
                spec.holder_identity.as_deref().unwrap_or("nobody")
            ));
        }
        spec.renew_time = Some(now());
        lease.spec = Some(spec);
        if let Some(epoch) = epoch {
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(EPOCH_ANNOTATION.into(), epoch.to_string());
        }
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Gives the Lease up (graceful shutdown) so the next pod takes it at once.
    pub async fn release(&self) {
        if let Ok(mut lease) = self.api.get(&self.name).await
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(self.holder.as_str())
        {
            spec.holder_identity = None;
            spec.renew_time = None;
            if let Err(e) = self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                tracing::warn!(error = %e, "releasing the session lease");
            }
        }
    }

    /// Renews every third of the lease duration until it is lost; returns why.
    pub async fn keep(&self, epoch: u64) -> String {
        let period = Duration::from_secs((LEASE_SECONDS / 3).max(1) as u64);
        let mut failures = 0;
        loop {
            tokio::time::sleep(period).await;
            match self.renew(Some(epoch)).await {
                Ok(()) => failures = 0,
                Err(e) if e.contains("now held by") => return e,
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "renewing the session lease");
                    if failures * period.as_secs() as i32 >= LEASE_SECONDS {
                        return format!(
                            "the session lease could not be renewed for {LEASE_SECONDS}s: {e}"
                        );
                    }
                }
            }
        }
    }
}
