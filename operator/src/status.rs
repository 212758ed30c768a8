//! The session's status as a pure function of what a reconcile observed, plus the transitions
//! worth an Event. `lastTransitionTime` moves only when a condition's status flips, so an
//! unchanged session yields a byte-identical status and no write.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use cairn_crds::{AgentSessionStatus, Phase};

pub const READY: &str = "Ready";
pub const POLICY_RESOLVED: &str = "PolicyResolved";
pub const ARCHIVE_READY: &str = "ArchiveReady";
/// Type of the condition that says whose storage credentials the session's pod holds.
pub const ARCHIVE_CREDENTIALS: &str = "ArchiveCredentials";
pub const CONTEXT_HEADROOM: &str = "ContextHeadroom";
pub const POLICY_SUPPORTED: &str = "PolicySupported";
pub const COST_BUDGET: &str = "CostBudget";
/// Type of the condition that says why a session sleeps or woke (`crate::idle` decides it).
pub const IDLE: &str = "Idle";

/// How long after its creation a new session's first status may wait for its pod
/// ([`first_write_waits`]).
pub const FIRST_STATUS_GRACE: Duration = Duration::from_secs(10);

/// Whether the first status of a new session may wait for its pod: none was written yet, and
/// all it would say is that the pod is starting (phase Pending, Ready False for PodNotReady).
/// The pod is usually ready within seconds; one write then says Running, with the Events of
/// its conditions, where there would have been two. Anything else (a missing policy or
/// Secret, an invalid spec, a suspension) is written at once.
pub fn first_write_waits(prev: Option<&AgentSessionStatus>, next: &AgentSessionStatus) -> bool {
    prev.is_none_or(|s| s.phase.is_none())
        && next.phase == Some(Phase::Pending)
        && next
            .conditions
            .iter()
            .any(|c| c.type_ == READY && c.reason == POD_NOT_READY)
}

/// Reason of Ready while the session's pod starts.
pub const POD_NOT_READY: &str = "PodNotReady";

/// A reason (CamelCase, stable) and a human message, for a condition or an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
}

impl Problem {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Why nothing was applied this time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// The spec is invalid: only an edit helps (phase Failed).
    Invalid(Problem),
    /// Something the session depends on is missing or unreachable; retried.
    Waiting(Problem),
}

/// What one reconcile saw and did.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub name: String,
    pub namespace: String,
    pub generation: Option<i64>,
    pub suspended: bool,
    /// The effective policy's hash, or why it could not be resolved.
    pub policy: Result<String, Problem>,
    pub blocker: Option<Blocker>,
    /// Ready pods of the session (0 or 1); `None` when its objects were not applied.
    pub ready_pods: Option<i32>,
    /// Digest of the token the token Secret holds, when this reconcile wrote or read it
    /// (`None`: unchanged, the previous one stays).
    pub api_token_hash: Option<String>,
    /// Where the archive lives, or why it is not durable / not healthy.
    pub archive: Result<String, Problem>,
    /// The `ArchiveCredentials` condition ([`archive_credentials`]); `None`: no bucket, or
    /// archive settings that cannot be read.
    pub archive_credentials: Option<(bool, Problem)>,
    /// The `Idle` condition of a session with an idle rule (`crate::idle`); True: the pod is
    /// stopped for being idle (and `suspended` is true).
    pub idle: Option<(bool, Problem)>,
}

/// The status the operator wants, given the previous one (whose agent-written `session` block
/// is carried over untouched).
pub fn desired(
    prev: Option<&AgentSessionStatus>,
    obs: &Observed,
    now: &Time,
) -> AgentSessionStatus {
    let prev_phase = prev.and_then(|s| s.phase);
    let ready = obs.ready_pods.unwrap_or(0) > 0;
    let phase = match (&obs.blocker, obs.suspended) {
        (Some(Blocker::Invalid(_)), _) => Phase::Failed,
        (_, true) => Phase::Suspended,
        (None, false) if ready && obs.policy.is_ok() => Phase::Running,
        _ if matches!(prev_phase, Some(Phase::Running | Phase::Degraded)) => Phase::Degraded,
        _ => Phase::Pending,
    };

    let ready_cond = match (&obs.blocker, &obs.policy) {
        (Some(Blocker::Invalid(p) | Blocker::Waiting(p)), _) => (false, p.clone()),
        (None, _) if obs.suspended && matches!(obs.idle, Some((true, _))) => (
            false,
            Problem::new(
                "IdleSuspended",
                "idle (see the Idle condition): the pod is stopped, journal and archive are \
                 kept; a request at the gateway wakes it",
            ),
        ),
        (None, _) if obs.suspended => (
            false,
            Problem::new(
                "Suspended",
                "spec.suspend is true: the pod is stopped, journal and archive are kept",
            ),
        ),
        (None, Err(p)) => (false, Problem::new("PolicyUnresolved", p.message.clone())),
        (None, Ok(_)) if ready => (
            true,
            Problem::new("AgentReady", "the agent is serving the session"),
        ),
        (None, Ok(_)) => (
            false,
            Problem::new(
                POD_NOT_READY,
                format!(
                    "waiting for pod {} to become ready",
                    cairn_crds::names::pod_name(&obs.name)
                ),
            ),
        ),
    };
    let policy_cond = match &obs.policy {
        Ok(hash) => (
            true,
            Problem::new("Resolved", format!("effective policy hash {hash}")),
        ),
        Err(p) => (false, p.clone()),
    };
    let archive_cond = match &obs.archive {
        Ok(location) => archive_answered(
            location,
            prev.and_then(|s| s.session.as_ref())
                .and_then(|s| s.archive_check.as_ref()),
        ),
        Err(p) => (FALSE, p.clone()),
    };

    // The agent's report of the next request's headroom; absent until an agent reported.
    let agent = prev.and_then(|s| s.session.as_ref());
    let headroom_cond = agent
        .and_then(|s| s.headroom.as_ref())
        .map(|h| (CONTEXT_HEADROOM, headroom_status(h)));
    // What the running agent said it cannot honour; absent until an agent reported.
    let supported_cond = agent.map(|s| (POLICY_SUPPORTED, supported_status(&s.unsupported)));
    let credentials_cond = obs
        .archive_credentials
        .clone()
        .map(|(own, p)| (ARCHIVE_CREDENTIALS, (bool_status(own), p)));
    let idle_cond = obs
        .idle
        .clone()
        .map(|(asleep, p)| (IDLE, (bool_status(asleep), p)));

    // The agent's cost against spec.budget.maxCostUSD; absent without a budget.
    let budget_cond = agent
        .and_then(|s| s.cost_usd.as_ref())
        .and_then(|c| c.max_usd.map(|max| (COST_BUDGET, budget_status(c, max))));

    let prev_conditions = prev.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let conditions = [
        (READY, bool_status(ready_cond.0), ready_cond.1),
        (POLICY_RESOLVED, bool_status(policy_cond.0), policy_cond.1),
        (ARCHIVE_READY, archive_cond.0, archive_cond.1),
    ]
    .into_iter()
    .chain(
        [
            credentials_cond,
            headroom_cond,
            supported_cond,
            idle_cond,
            budget_cond,
        ]
        .into_iter()
        .flatten()
        .map(|(kind, (status, p))| (kind, status, p)),
    )
    .map(|(kind, status, p)| condition(prev_conditions, kind, status, p, obs.generation, now))
    .collect();

    let applied = obs.ready_pods.is_some();
    AgentSessionStatus {
        phase: Some(phase),
        observed_generation: obs.generation,
        conditions,
        pod: (applied && !obs.suspended).then(|| cairn_crds::names::pod_name(&obs.name)),
        service_url: applied
            .then(|| cairn_crds::names::service_url(&obs.name, &obs.namespace))
            .or_else(|| prev.and_then(|s| s.service_url.clone())),
        policy_hash: obs
            .policy
            .as_ref()
            .ok()
            .cloned()
            .or_else(|| prev.and_then(|s| s.policy_hash.clone())),
        api_token_hash: obs
            .api_token_hash
            .clone()
            .or_else(|| prev.and_then(|s| s.api_token_hash.clone())),
        session: prev.and_then(|s| s.session.clone()),
    }
}

const TRUE: &str = "True";
const FALSE: &str = "False";
const UNKNOWN: &str = "Unknown";

fn bool_status(ok: bool) -> &'static str {
    if ok { TRUE } else { FALSE }
}

/// ArchiveReady of a configured archive: what the agent found when it last probed it
/// (a configured bucket alone proves nothing: wrong credentials, a missing bucket or an
/// unreachable endpoint only show when something is written). A check of another location
/// (the settings changed, the new pod has not checked yet) does not count.
fn archive_answered(
    location: &str,
    check: Option<&cairn_crds::session::ArchiveCheck>,
) -> (&'static str, Problem) {
    match check {
        Some(c) if c.location == location && c.ok => (
            TRUE,
            Problem::new(
                "ArchiveAnswered",
                format!(
                    "archive and journal in {location}: the agent wrote, read back and deleted a probe object at {}",
                    c.at
                ),
            ),
        ),
        Some(c) if c.location == location => (
            FALSE,
            Problem::new(
                "ArchiveUnreachable",
                format!(
                    "{location} did not answer the agent's check at {}: {}",
                    c.at,
                    c.message.as_deref().unwrap_or("no error reported")
                ),
            ),
        ),
        _ => (
            UNKNOWN,
            Problem::new(
                "ArchiveNotChecked",
                format!(
                    "archive and journal in {location}; waiting for the agent to check that it answers"
                ),
            ),
        ),
    }
}

/// Reason of a static key pair other sessions hold too, accepted by no one: a Warning.
pub const SHARED_CREDENTIALS: &str = "SharedArchiveCredentials";
/// Reason of a shared key pair the session or the operator accepted: still said, no Warning.
pub const SHARED_CREDENTIALS_ACCEPTED: &str = "SharedArchiveCredentialsAccepted";

/// ArchiveCredentials of a session with a bucket: True when its pod holds credentials no
/// other session holds (scoped ones minted for its prefix, a Secret no other session of the
/// namespace names) or an identity of its own; False when the sessions share storage
/// credentials — the operator's default Secret (every session of the namespace without its
/// own gets it) or a Secret `sharing` (other sessions of the namespace) name too. Shared
/// without `spec.archive.sharedCredentials` or the operator's
/// `--archive-allow-shared-credentials` it is a Warning; accepted, the message still says so.
/// `None` without a bucket: the archive then lives on the pod's own volume.
pub fn archive_credentials(
    archive: &crate::validate::ArchivePlan,
    namespace: &str,
    name: &str,
    sharing: &[String],
) -> Option<(bool, Problem)> {
    let bucket = archive.bucket.as_ref()?;
    if archive.scoped {
        return Some((
            true,
            Problem::new(
                "ScopedCredentials",
                format!(
                    "the operator mints this session's storage credentials for s3://{bucket}/{} only (Secret {})",
                    archive.session_prefix(namespace, name),
                    crate::scoped::secret_name(name)
                ),
            ),
        ));
    }
    let Some(secret) = archive.credentials.as_ref().map(|c| c.secret_name.as_str()) else {
        return archive.ambient.then(|| {
            (
                true,
                Problem::new(
                    "PodIdentity",
                    "the pod's own identity (IRSA, EKS Pod Identity, a node role) through the \
                     AWS default chain: what it reaches is that identity's policy",
                ),
            )
        });
    };
    let who = if archive.default_credentials {
        format!(
            "every session of namespace {namespace} that names no credentials of its own gets the key pair of the operator's default Secret {secret} (--archive-credentials-secret, chart archive.credentialsSecret)"
        )
    } else if sharing.is_empty() {
        return Some((
            true,
            Problem::new(
                "OwnCredentials",
                format!(
                    "the key pair of Secret {secret}, which no other session of namespace {namespace} names"
                ),
            ),
        ));
    } else {
        const SHOWN: usize = 5;
        let mut names = sharing
            .iter()
            .take(SHOWN)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        if sharing.len() > SHOWN {
            names.push_str(&format!(" and {} more", sharing.len() - SHOWN));
        }
        format!(
            "the key pair of Secret {secret} is held by sessions {names} of namespace {namespace} too"
        )
    };
    let shared = format!(
        "sessions share storage credentials: {who}, so each of their pods can read, overwrite and delete the others' archive and journal"
    );
    Some(if archive.shared_credentials_accepted {
        (
            false,
            Problem::new(
                SHARED_CREDENTIALS_ACCEPTED,
                format!(
                    "{shared}; accepted by spec.archive.sharedCredentials or the operator's --archive-allow-shared-credentials"
                ),
            ),
        )
    } else {
        (
            false,
            Problem::new(
                SHARED_CREDENTIALS,
                format!(
                    "{shared}. To give each session credentials for its own prefix only, let the operator mint scoped credentials (chart archive.scoped.adminCredentialsSecret, archive.scoped.enabled not false); to accept the shared key pair, set spec.archive.sharedCredentials: true, or the operator's --archive-allow-shared-credentials (chart archive.allowSharedCredentials)"
                ),
            ),
        )
    })
}

/// PolicySupported: False with the fields and what the agent does instead when the running
/// agent cannot honour a setting (a Warning Event when it turns), never a silent drop.
fn supported_status(
    unsupported: &[cairn_crds::session::UnsupportedSetting],
) -> (&'static str, Problem) {
    if unsupported.is_empty() {
        return (
            TRUE,
            Problem::new(
                "AllSupported",
                "the agent honours every setting of the session",
            ),
        );
    }
    let fields: Vec<&str> = unsupported.iter().map(|u| u.field.as_str()).collect();
    let reasons: Vec<&str> = unsupported.iter().map(|u| u.reason.as_str()).collect();
    (
        FALSE,
        Problem::new(
            "SettingUnsupported",
            format!(
                "not honoured by the running agent: {} ({})",
                fields.join(", "),
                reasons.join("; ")
            ),
        ),
    )
}

/// CostBudget: True below spec.budget.maxCostUSD; False (a Warning Event when it turns) once
/// the session's cost reached it. The message names no running cost, so a turn that moves
/// the figure rewrites nothing.
fn budget_status(c: &cairn_crds::session::CostStats, max: f64) -> (&'static str, Problem) {
    if !c.budget_exceeded {
        return (
            TRUE,
            Problem::new(
                "WithinBudget",
                format!(
                    "the session's cost is below spec.budget.maxCostUSD ({max} USD; status.session.costUSD has the figure)"
                ),
            ),
        );
    }
    let then = match c.on_budget_exceeded.as_deref() {
        Some("suspend") => {
            "onBudgetExceeded is suspend: the agent refuses new turns until the budget is raised"
        }
        _ => "onBudgetExceeded is warn: turns go on",
    };
    (
        FALSE,
        Problem::new(
            "BudgetExceeded",
            format!("the session's cost reached spec.budget.maxCostUSD ({max} USD); {then}"),
        ),
    )
}

/// The message names no token count, so a turn that moves the figure rewrites nothing.
/// ContextHeadroom: True while the next request leaves more than the policy's warning
/// buffer; False (a Warning Event when it turns) at or below it, the CRD's `warning` tier.
fn headroom_status(h: &cairn_crds::session::HeadroomReport) -> (&'static str, Problem) {
    if h.tier == "Ok" {
        return (
            TRUE,
            Problem::new(
                "HeadroomSufficient",
                format!(
                    "the next request leaves more than autoCompact.warningBufferTokens ({}) tokens of context headroom",
                    h.warning_buffer_tokens
                ),
            ),
        );
    }
    (
        FALSE,
        Problem::new(
            "HeadroomLow",
            format!(
                "the next request leaves no more than autoCompact.warningBufferTokens ({}) tokens of context headroom (tier {}; status.session.headroom has the figure): the history will be compacted soon",
                h.warning_buffer_tokens, h.tier
            ),
        ),
    )
}

fn condition(
    prev: &[Condition],
    kind: &str,
    status: &str,
    p: Problem,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = prev
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: p.reason,
        message: p.message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// `prev` with one condition set (the others untouched), for outcomes outside the normal
/// pipeline such as a failing cleanup.
pub fn with_condition(
    prev: &AgentSessionStatus,
    kind: &str,
    ok: bool,
    problem: Problem,
    generation: Option<i64>,
    now: &Time,
) -> AgentSessionStatus {
    let updated = condition(
        &prev.conditions,
        kind,
        bool_status(ok),
        problem,
        generation,
        now,
    );
    let mut next = prev.clone();
    match next.conditions.iter_mut().find(|c| c.type_ == kind) {
        Some(c) => *c = updated,
        None => next.conditions.push(updated),
    }
    next
}

/// The operator's part of a status (everything but the agent-written `session`), for the
/// "did it change" test.
pub fn operator_part(status: &AgentSessionStatus) -> AgentSessionStatus {
    AgentSessionStatus {
        session: None,
        ..status.clone()
    }
}

/// A change worth an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// Events for the differences between two statuses: a new phase, every condition whose status
/// or reason changed, and conditions that start out in trouble.
pub fn transitions(
    prev: Option<&AgentSessionStatus>,
    next: &AgentSessionStatus,
) -> Vec<Transition> {
    let mut out = Vec::new();
    let prev_phase = prev.and_then(|s| s.phase);
    // A new session starting out Pending, or Running at its first status, is what every
    // creation does: not news (at scale every Event is a write).
    let first_start =
        prev_phase.is_none() && matches!(next.phase, Some(Phase::Pending | Phase::Running));
    if let Some(phase) = next.phase
        && prev_phase != Some(phase)
        && !first_start
    {
        out.push(Transition {
            warning: matches!(phase, Phase::Failed | Phase::Degraded),
            reason: phase.as_str().to_string(),
            note: format!(
                "phase {} -> {}",
                prev_phase.map(Phase::as_str).unwrap_or("none"),
                phase.as_str()
            ),
        });
    }
    let prev_conditions = prev.map(|s| s.conditions.as_slice()).unwrap_or_default();
    for c in &next.conditions {
        let before = prev_conditions.iter().find(|p| p.type_ == c.type_);
        let changed = before.is_none_or(|p| p.status != c.status || p.reason != c.reason);
        // Not ready while starting or suspended is expected, not a warning.
        let expected = matches!(
            c.reason.as_str(),
            POD_NOT_READY
                | "Suspended"
                | "IdleSuspended"
                | "ArchiveNotChecked"
                | "Active"
                | "Woken"
                | "ManuallySuspended"
                | SHARED_CREDENTIALS_ACCEPTED
        );
        let warning = c.status != "True" && !expected;
        // At scale every Event is a write: a condition that starts out fine, and Ready
        // turning True (the phase Event says Running), are not news.
        let news = match before {
            None => warning,
            Some(_) => !(c.type_ == READY && c.status == "True"),
        };
        if changed && news {
            out.push(Transition {
                warning,
                reason: c.reason.clone(),
                note: format!("{}={}: {}", c.type_, c.status, c.message),
            });
        }
    }
    out
}
