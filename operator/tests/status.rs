//! The status a reconcile writes, and the Events it publishes, as pure functions of what it
//! observed; and the watch mappers that re-trigger sessions when a policy or Secret changes.

use std::sync::Arc;

use cairn_crds::{AgentSession, AgentSessionStatus, CompactionPolicy, Phase};
use cairn_operator::Defaults;
use cairn_operator::config::OtlpExport;
use cairn_operator::status::{self, Blocker, Observed, Problem};
use cairn_operator::watches::{
    session_for_network_object, session_of_owned, sessions_for_policy, sessions_for_secret,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::core::DeserializeGuard;

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + secs).expect("valid timestamp"))
}

fn observed() -> Observed {
    Observed {
        name: "chat".into(),
        namespace: "team-a".into(),
        generation: Some(2),
        suspended: false,
        policy: Ok("abc123".into()),
        blocker: None,
        ready_pods: Some(1),
        api_token_hash: None,
        archive: Ok("s3://b/cairn/team-a/chat/".into()),
        archive_credentials: None,
        idle: None,
    }
}

fn condition<'a>(
    s: &'a AgentSessionStatus,
    kind: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == kind)
        .unwrap_or_else(|| panic!("condition {kind} missing"))
}

/// A previous status carrying the agent's archive check, written as the agent writes it.
fn checked(ok: bool, location: &str, message: Option<&str>) -> AgentSessionStatus {
    serde_json::from_value(serde_json::json!({
        "session": {"turns": 3, "archiveCheck": {
            "ok": ok, "location": location, "message": message, "at": "2027-01-15T08:00:00Z"
        }}
    }))
    .expect("status")
}

#[test]
fn archive_ready_means_the_archive_answered_the_agent() {
    let location = "s3://b/cairn/team-a/chat/";
    // A configured bucket alone proves nothing.
    let unchecked = status::desired(None, &observed(), &at(0));
    let c = condition(&unchecked, status::ARCHIVE_READY);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("Unknown", "ArchiveNotChecked"),
        "{c:?}"
    );
    assert!(
        status::transitions(None, &unchecked)
            .iter()
            .all(|t| t.reason != "ArchiveNotChecked"),
        "waiting for the first check is not a warning"
    );

    let error = "S3 put: service error: NoSuchBucket: The specified bucket does not exist";
    let failed = status::desired(
        Some(&checked(false, location, Some(error))),
        &observed(),
        &at(5),
    );
    let c = condition(&failed, status::ARCHIVE_READY);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "ArchiveUnreachable"),
        "{c:?}"
    );
    assert!(c.message.contains("NoSuchBucket"), "{}", c.message);
    assert!(
        status::transitions(Some(&unchecked), &failed)
            .iter()
            .any(|t| t.warning && t.reason == "ArchiveUnreachable")
    );

    let fine = status::desired(Some(&checked(true, location, None)), &observed(), &at(9));
    let c = condition(&fine, status::ARCHIVE_READY);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "ArchiveAnswered")
    );

    // A check of another location (the archive settings changed since) does not count.
    let stale = status::desired(
        Some(&checked(true, "s3://old/cairn/team-a/chat/", None)),
        &observed(),
        &at(9),
    );
    assert_eq!(condition(&stale, status::ARCHIVE_READY).status, "Unknown");
}

#[test]
fn running_session_reports_pod_url_hash_and_true_conditions() {
    let prev = checked(true, "s3://b/cairn/team-a/chat/", None);
    let s = status::desired(Some(&prev), &observed(), &at(0));
    assert_eq!(s.phase, Some(Phase::Running));
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.pod.as_deref(), Some("cairn-chat-0"));
    assert_eq!(
        s.service_url.as_deref(),
        Some("http://cairn-chat.cairn-sessions.team-a.svc:8080")
    );
    assert_eq!(s.policy_hash.as_deref(), Some("abc123"));
    for kind in [
        status::READY,
        status::POLICY_RESOLVED,
        status::ARCHIVE_READY,
    ] {
        let c = condition(&s, kind);
        assert_eq!(c.status, "True", "{kind}");
        assert_eq!(c.observed_generation, Some(2));
        assert_eq!(c.last_transition_time, at(0));
    }
    assert_eq!(condition(&s, status::READY).reason, "AgentReady");
}

#[test]
fn an_unchanged_session_yields_an_identical_status() {
    let first = status::desired(None, &observed(), &at(0));
    let again = status::desired(Some(&first), &observed(), &at(60));
    assert_eq!(status::operator_part(&first), status::operator_part(&again));
    assert!(status::transitions(Some(&first), &again).is_empty());
}

#[test]
fn last_transition_time_moves_only_when_status_flips() {
    let running = status::desired(None, &observed(), &at(0));
    let mut obs = observed();
    obs.policy = Err(Problem::new(
        "PolicyNotFound",
        "CompactionPolicy team-a/frugal does not exist",
    ));
    let broken = status::desired(Some(&running), &obs, &at(30));
    let policy = condition(&broken, status::POLICY_RESOLVED);
    assert_eq!(policy.status, "False");
    assert_eq!(policy.reason, "PolicyNotFound");
    assert_eq!(policy.last_transition_time, at(30));
    // Archive did not flip: its time stays.
    assert_eq!(
        condition(&broken, status::ARCHIVE_READY).last_transition_time,
        at(0)
    );
    // The agent keeps running with the last resolved policy: its hash stays.
    assert_eq!(broken.policy_hash.as_deref(), Some("abc123"));
    assert_eq!(broken.phase, Some(Phase::Degraded));
    assert_eq!(condition(&broken, status::READY).reason, "PolicyUnresolved");

    // Same failure, new message: the reason/message update, the time does not.
    let mut obs2 = obs.clone();
    obs2.policy = Err(Problem::new("PolicyNotFound", "still missing"));
    let still = status::desired(Some(&broken), &obs2, &at(90));
    let policy = condition(&still, status::POLICY_RESOLVED);
    assert_eq!(policy.message, "still missing");
    assert_eq!(policy.last_transition_time, at(30));
}

#[test]
fn missing_policy_on_a_new_session_is_pending_not_failed() {
    let mut obs = observed();
    obs.policy = Err(Problem::new("PolicyNotFound", "missing"));
    obs.ready_pods = None;
    let s = status::desired(None, &obs, &at(0));
    assert_eq!(s.phase, Some(Phase::Pending));
    assert_eq!(s.policy_hash, None);
    assert_eq!(s.pod, None);
    assert_eq!(
        condition(&s, status::POLICY_RESOLVED).reason,
        "PolicyNotFound"
    );
}

#[test]
fn phases_follow_suspend_invalid_waiting_and_readiness() {
    let mut obs = observed();
    obs.suspended = true;
    obs.ready_pods = Some(0);
    let s = status::desired(None, &obs, &at(0));
    assert_eq!(s.phase, Some(Phase::Suspended));
    assert_eq!(s.pod, None, "no pod while suspended");
    assert_eq!(condition(&s, status::READY).reason, "Suspended");

    let mut obs = observed();
    obs.blocker = Some(Blocker::Invalid(Problem::new("InvalidPayloadCap", "bad")));
    obs.ready_pods = None;
    let s = status::desired(None, &obs, &at(0));
    assert_eq!(s.phase, Some(Phase::Failed));
    assert_eq!(condition(&s, status::READY).reason, "InvalidPayloadCap");

    let mut obs = observed();
    obs.blocker = Some(Blocker::Waiting(Problem::new(
        "SecretNotFound",
        "Secret team-a/k not found",
    )));
    obs.ready_pods = None;
    let s = status::desired(None, &obs, &at(0));
    assert_eq!(s.phase, Some(Phase::Pending));
    assert_eq!(condition(&s, status::READY).reason, "SecretNotFound");

    let mut obs = observed();
    obs.ready_pods = Some(0);
    let s = status::desired(None, &obs, &at(0));
    assert_eq!(s.phase, Some(Phase::Pending));
    assert_eq!(condition(&s, status::READY).reason, "PodNotReady");
    let running = status::desired(None, &observed(), &at(0));
    let s = status::desired(Some(&running), &obs, &at(10));
    assert_eq!(
        s.phase,
        Some(Phase::Degraded),
        "a running pod that stops being ready"
    );
}

#[test]
fn agent_written_counters_are_kept_but_not_compared() {
    let mut prev = status::desired(None, &observed(), &at(0));
    prev.session = Some(cairn_crds::SessionStats {
        turns: 7,
        ..Default::default()
    });
    let next = status::desired(Some(&prev), &observed(), &at(5));
    assert_eq!(next.session.as_ref().map(|s| s.turns), Some(7));
    assert_eq!(status::operator_part(&next).session, None);
}

#[test]
fn transitions_name_the_new_phase_and_changed_conditions() {
    let pending = {
        let mut o = observed();
        o.ready_pods = Some(0);
        status::desired(None, &o, &at(0))
    };
    let first = status::transitions(None, &pending);
    assert!(
        !first.iter().any(|t| t.reason == "Pending"),
        "a new session starting Pending is not news"
    );
    let suspended = {
        let mut o = observed();
        o.suspended = true;
        status::desired(None, &o, &at(0))
    };
    assert!(
        status::transitions(None, &suspended)
            .iter()
            .any(|t| t.reason == "Suspended"),
        "any other first phase is"
    );
    let running = status::desired(Some(&pending), &observed(), &at(10));
    let t = status::transitions(Some(&pending), &running);
    assert_eq!(
        t.iter().map(|t| t.reason.as_str()).collect::<Vec<_>>(),
        ["Running"],
        "Ready turning True is said by the phase Event"
    );
    assert!(
        !first.iter().any(|t| t.reason == "Resolved"),
        "a condition that starts out fine is not news"
    );
    let mut no_archive = observed();
    no_archive.archive = Err(Problem::new("ArchiveNotConfigured", "no bucket"));
    let t = status::transitions(None, &status::desired(None, &no_archive, &at(0)));
    assert!(
        t.iter()
            .any(|t| t.reason == "ArchiveNotConfigured" && t.warning)
    );
    let mut lost = observed();
    lost.policy = Err(Problem::new("PolicyNotFound", "gone"));
    let t = status::transitions(
        Some(&running),
        &status::desired(Some(&running), &lost, &at(30)),
    );
    assert!(t.iter().any(|t| t.reason == "PolicyNotFound" && t.warning));
    let mut failed_obs = observed();
    failed_obs.blocker = Some(Blocker::Invalid(Problem::new("InvalidPolicy", "x")));
    let failed = status::desired(Some(&running), &failed_obs, &at(20));
    let t = status::transitions(Some(&running), &failed);
    assert!(t.iter().any(|t| t.reason == "Failed" && t.warning));
    let first_running = status::desired(None, &no_archive, &at(0));
    let t = status::transitions(None, &first_running);
    assert_eq!(
        t.iter().map(|t| t.reason.as_str()).collect::<Vec<_>>(),
        ["ArchiveNotConfigured"],
        "a first status that says Running is not news; its warnings are"
    );
}

#[test]
fn only_a_first_status_that_says_the_pod_is_starting_waits_for_the_pod() {
    let starting = |o: &mut Observed| o.ready_pods = Some(0);
    let with = |change: &dyn Fn(&mut Observed)| {
        let mut o = observed();
        change(&mut o);
        status::desired(None, &o, &at(0))
    };
    let pending = with(&starting);
    assert!(status::first_write_waits(None, &pending));
    let mut no_archive = observed();
    starting(&mut no_archive);
    no_archive.archive = Err(Problem::new("ArchiveNotConfigured", "no bucket"));
    assert!(
        status::first_write_waits(None, &status::desired(None, &no_archive, &at(0))),
        "its warning Event goes out with the first status"
    );
    assert!(
        !status::first_write_waits(Some(&pending), &pending),
        "a status already written is kept current"
    );
    for (why, next) in [
        ("running", with(&|_| ())),
        ("suspended", with(&|o| o.suspended = true)),
        (
            "a missing policy",
            with(&|o| {
                starting(o);
                o.policy = Err(Problem::new("PolicyNotFound", "missing"));
            }),
        ),
        (
            "a missing Secret",
            with(&|o| {
                o.ready_pods = None;
                o.blocker = Some(Blocker::Waiting(Problem::new("SecretNotFound", "k")));
            }),
        ),
        (
            "an invalid spec",
            with(&|o| {
                o.ready_pods = None;
                o.blocker = Some(Blocker::Invalid(Problem::new("InvalidPayloadCap", "bad")));
            }),
        ),
    ] {
        assert!(!status::first_write_waits(None, &next), "{why}");
    }
}

#[test]
fn purge_failure_sets_only_archive_ready() {
    let running = status::desired(None, &observed(), &at(0));
    let next = status::with_condition(
        &running,
        status::ARCHIVE_READY,
        false,
        Problem::new("PurgeFailed", "listing s3://b: timeout"),
        Some(2),
        &at(40),
    );
    let c = condition(&next, status::ARCHIVE_READY);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PurgeFailed")
    );
    assert_eq!(c.last_transition_time, at(40));
    assert_eq!(
        condition(&next, status::READY),
        condition(&running, status::READY)
    );
    assert_eq!(next.phase, running.phase);
}

fn guarded(name: &str, ns: &str, spec: &str) -> Arc<DeserializeGuard<AgentSession>> {
    let mut s = AgentSession::new(name, serde_yaml::from_str(spec).expect("spec parses"));
    s.metadata.namespace = Some(ns.into());
    Arc::new(DeserializeGuard(Ok(s)))
}

fn names(
    refs: Vec<kube::runtime::reflector::ObjectRef<DeserializeGuard<AgentSession>>>,
) -> Vec<String> {
    let mut out: Vec<String> = refs
        .into_iter()
        .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
        .collect();
    out.sort();
    out
}

#[test]
fn policy_changes_map_to_the_sessions_that_reference_them() {
    let sessions = vec![
        guarded(
            "a",
            "team-a",
            "provider: {kind: openai, model: m}\npolicyRef: {name: frugal}",
        ),
        guarded(
            "b",
            "team-a",
            "provider: {kind: openai, model: m}\npolicyRef: {name: other}",
        ),
        guarded(
            "c",
            "team-b",
            "provider: {kind: openai, model: m}\npolicyRef: {name: frugal}",
        ),
        guarded("d", "team-a", "provider: {kind: openai, model: m}"),
    ];
    let mut policy = CompactionPolicy::new("frugal", Default::default());
    policy.metadata.namespace = Some("team-a".into());
    assert_eq!(names(sessions_for_policy(&sessions, &policy)), ["team-a/a"]);
}

#[test]
fn a_shared_network_object_maps_to_the_first_live_session_of_its_namespace() {
    let m = "provider: {kind: openai, model: m}";
    let mut going = AgentSession::new("a", serde_yaml::from_str(m).expect("spec"));
    going.metadata.namespace = Some("team-a".into());
    going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    let sessions = vec![
        Arc::new(DeserializeGuard(Ok(going))),
        guarded("c", "team-a", m),
        guarded("b", "team-a", m),
        guarded("a", "team-b", m),
    ];
    let meta = |name: &str, ns: &str, owner: Option<&str>| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        owner_references: owner.map(|o| {
            vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "cairn.dev/v1beta1".into(),
                    kind: "AgentSession".into(),
                    name: o.into(),
                    uid: "u".into(),
                    controller: Some(true),
                    ..Default::default()
                },
            ]
        }),
        ..Default::default()
    };
    let target = |m: ObjectMeta| {
        names(
            session_for_network_object(|| sessions.clone(), &m)
                .into_iter()
                .collect(),
        )
    };
    assert_eq!(
        target(meta("cairn-sessions", "team-a", None)),
        ["team-a/b"],
        "the first session of the namespace not being deleted"
    );
    assert_eq!(
        target(meta("cairn-x", "team-a", Some("x"))),
        ["team-a/x"],
        "an earlier version's per-session object: its owner"
    );
    assert!(
        target(meta("cairn-sessions", "team-c", None)).is_empty(),
        "no session there"
    );
    assert!(target(meta("unrelated", "team-a", None)).is_empty());
}

#[test]
fn an_owned_object_maps_to_its_session_whatever_version_its_owner_reference_names() {
    let meta = |api_version: &str, kind: &str| ObjectMeta {
        name: Some("cairn-a-0".into()),
        namespace: Some("team-a".into()),
        owner_references: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "a".into(),
                uid: "u".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let target = |m: ObjectMeta| names(session_of_owned(&m).into_iter().collect());
    // A pod made by the previous release names v1alpha1: its deletion must still reconcile.
    assert_eq!(
        target(meta("cairn.dev/v1alpha1", "AgentSession")),
        ["team-a/a"]
    );
    assert_eq!(
        target(meta("cairn.dev/v1beta1", "AgentSession")),
        ["team-a/a"]
    );
    assert!(target(meta("other.example/v1", "AgentSession")).is_empty());
    assert!(target(meta("cairn.dev/v1beta1", "CompactionPolicy")).is_empty());
}

#[test]
fn secret_changes_map_to_the_sessions_that_read_them() {
    let sessions = vec![
        guarded(
            "a",
            "team-a",
            "provider: {kind: anthropic, model: m, credentials: {secretName: key}}",
        ),
        guarded(
            "b",
            "team-a",
            "provider: {kind: openai, model: m}\narchive: {credentials: {secretName: s3}}",
        ),
        guarded("c", "team-a", "provider: {kind: openai, model: m}"),
        guarded(
            "d",
            "team-b",
            "provider: {kind: anthropic, model: m, credentials: {secretName: key}}",
        ),
    ];
    let secret = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some("team-a".into()),
        ..Default::default()
    };
    let d = Defaults::default();
    assert_eq!(
        names(sessions_for_secret(&sessions, &secret("key"), &d)),
        ["team-a/a"]
    );
    assert_eq!(
        names(sessions_for_secret(&sessions, &secret("s3"), &d)),
        ["team-a/b"]
    );
    assert_eq!(
        names(sessions_for_secret(
            &sessions,
            &secret("cairn-c-api-token"),
            &d
        )),
        ["team-a/c"]
    );
    assert!(sessions_for_secret(&sessions, &secret("unrelated"), &d).is_empty());

    let mut with_default = Defaults::default();
    with_default.archive.credentials_secret = Some("shared-s3".into());
    assert_eq!(
        names(sessions_for_secret(
            &sessions,
            &secret("shared-s3"),
            &with_default
        )),
        ["team-a/a", "team-a/c"],
        "sessions without their own S3 Secret use the default"
    );

    assert!(sessions_for_secret(&sessions, &secret("otlp-auth"), &d).is_empty());
    let with_otlp = Defaults {
        otlp: Some(OtlpExport {
            endpoint: "http://collector:4318".into(),
            headers_secret: Some("otlp-auth".into()),
            resource_attributes: None,
        }),
        ..Default::default()
    };
    assert_eq!(
        names(sessions_for_secret(
            &sessions,
            &secret("otlp-auth"),
            &with_otlp
        )),
        ["team-a/a", "team-a/b", "team-a/c"],
        "every session of the namespace reads the OTLP headers"
    );
}

/// The status after the agent reported the next request's headroom tier.
fn with_headroom(prev: &AgentSessionStatus, tier: &str, left: i64) -> AgentSessionStatus {
    let mut s = prev.clone();
    s.session = Some(
        serde_json::from_value(serde_json::json!({
            "turns": 3,
            "headroom": {"tier": tier, "tokensLeft": left, "warningBufferTokens": 20000}
        }))
        .expect("session stats"),
    );
    s
}

#[test]
fn the_warning_headroom_tier_is_a_condition_and_a_warning_event_on_the_way_down() {
    let start = status::desired(None, &observed(), &at(0));
    assert!(
        start
            .conditions
            .iter()
            .all(|c| c.type_ != status::CONTEXT_HEADROOM),
        "no condition before the agent reported"
    );
    let ok = status::desired(
        Some(&with_headroom(&start, "Ok", 90_000)),
        &observed(),
        &at(1),
    );
    let c = condition(&ok, status::CONTEXT_HEADROOM);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "HeadroomSufficient")
    );
    assert!(
        status::transitions(Some(&start), &ok).is_empty(),
        "headroom that starts out fine is not news"
    );

    let low_seen = with_headroom(&ok, "Warning", 15_000);
    let low = status::desired(Some(&low_seen), &observed(), &at(2));
    let c = condition(&low, status::CONTEXT_HEADROOM);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "HeadroomLow")
    );
    assert!(
        c.message.contains("warningBufferTokens (20000)"),
        "{}",
        c.message
    );
    let t = status::transitions(Some(&ok), &low);
    assert!(
        t.iter().any(|t| t.reason == "HeadroomLow" && t.warning),
        "dropping into the warning tier is a Warning Event: {t:?}"
    );

    // A turn that moves the figure but not the tier changes nothing the operator writes.
    let lower = status::desired(
        Some(&with_headroom(&low, "Warning", 14_000)),
        &observed(),
        &at(3),
    );
    assert_eq!(status::operator_part(&lower), status::operator_part(&low));
    assert!(status::transitions(Some(&low), &lower).is_empty());

    // Compacted: the condition turns back, said once, as a Normal Event.
    let back = status::desired(
        Some(&with_headroom(&lower, "Ok", 80_000)),
        &observed(),
        &at(4),
    );
    let t = status::transitions(Some(&lower), &back);
    assert!(
        t.iter()
            .any(|t| t.reason == "HeadroomSufficient" && !t.warning),
        "{t:?}"
    );
}

#[test]
fn a_setting_the_agent_cannot_honour_is_a_condition_and_a_warning_event() {
    let start = status::desired(None, &observed(), &at(0));
    assert!(
        start
            .conditions
            .iter()
            .all(|c| c.type_ != status::POLICY_SUPPORTED),
        "no condition before the agent reported"
    );
    let mut reported = start.clone();
    reported.session = Some(cairn_crds::SessionStats {
        turns: 1,
        ..Default::default()
    });
    let fine = status::desired(Some(&reported), &observed(), &at(1));
    let c = condition(&fine, status::POLICY_SUPPORTED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "AllSupported")
    );
    assert!(status::transitions(Some(&start), &fine).is_empty());

    let mut unsupported = fine.clone();
    unsupported.session = Some(
        serde_json::from_value(serde_json::json!({
            "turns": 2,
            "unsupported": [{"field": "engine", "reason": "engine: provider is not implemented"}]
        }))
        .expect("session stats"),
    );
    let next = status::desired(Some(&unsupported), &observed(), &at(2));
    let c = condition(&next, status::POLICY_SUPPORTED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SettingUnsupported")
    );
    assert!(
        c.message.contains("engine") && c.message.contains("not implemented"),
        "{}",
        c.message
    );
    let t = status::transitions(Some(&fine), &next);
    assert!(
        t.iter()
            .any(|t| t.reason == "SettingUnsupported" && t.warning),
        "{t:?}"
    );
}

/// The status after the agent reported its cost against a budget.
fn with_cost(prev: &AgentSessionStatus, total: f64, action: &str) -> AgentSessionStatus {
    let mut s = prev.clone();
    s.session = Some(
        serde_json::from_value(serde_json::json!({
            "turns": 3,
            "costUSD": {"total": total, "session": total, "summarizer": 0.0, "maxUSD": 1.5,
                        "budgetExceeded": total >= 1.5, "onBudgetExceeded": action}
        }))
        .expect("session stats"),
    );
    s
}

#[test]
fn crossing_the_cost_budget_is_a_condition_and_a_warning_event() {
    let start = status::desired(None, &observed(), &at(0));
    assert!(
        start
            .conditions
            .iter()
            .all(|c| c.type_ != status::COST_BUDGET),
        "no condition without a budget"
    );
    let within = status::desired(
        Some(&with_cost(&start, 0.2, "suspend")),
        &observed(),
        &at(1),
    );
    let c = condition(&within, status::COST_BUDGET);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "WithinBudget")
    );
    assert!(status::transitions(Some(&start), &within).is_empty());
    // More spending below the budget rewrites nothing.
    let more = status::desired(
        Some(&with_cost(&within, 0.9, "suspend")),
        &observed(),
        &at(2),
    );
    assert_eq!(status::operator_part(&more), status::operator_part(&within));

    let over = status::desired(Some(&with_cost(&more, 1.6, "suspend")), &observed(), &at(3));
    let c = condition(&over, status::COST_BUDGET);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "BudgetExceeded")
    );
    assert!(c.message.contains("refuses new turns"), "{}", c.message);
    let t = status::transitions(Some(&more), &over);
    assert!(
        t.iter().any(|t| t.reason == "BudgetExceeded" && t.warning),
        "{t:?}"
    );
    let warned = status::desired(Some(&with_cost(&more, 1.6, "warn")), &observed(), &at(3));
    assert!(
        condition(&warned, status::COST_BUDGET)
            .message
            .contains("turns go on")
    );
}

#[test]
fn the_token_digest_is_published_kept_and_replaced_never_the_token() {
    let token = "f".repeat(64);
    let hash = cairn_crds::session::api_token_hash("team-a", "chat", &token);
    assert!(
        hash.starts_with("sha256:") && !hash.contains(&token),
        "{hash}"
    );
    assert_ne!(
        hash,
        cairn_crds::session::api_token_hash("team-b", "chat", &token),
        "the same token in another session has another digest"
    );
    let first = status::desired(
        None,
        &Observed {
            api_token_hash: Some(hash.clone()),
            ..observed()
        },
        &at(0),
    );
    assert_eq!(first.api_token_hash.as_deref(), Some(hash.as_str()));
    // A reconcile that neither wrote nor read the Secret keeps the digest.
    let kept = status::desired(Some(&first), &observed(), &at(5));
    assert_eq!(kept.api_token_hash, first.api_token_hash);
    // A token minted anew (the Secret was deleted) replaces it.
    let other = cairn_crds::session::api_token_hash("team-a", "chat", &"0".repeat(64));
    let minted = status::desired(
        Some(&kept),
        &Observed {
            api_token_hash: Some(other.clone()),
            ..observed()
        },
        &at(9),
    );
    assert_eq!(minted.api_token_hash, Some(other));
    let json = serde_json::to_value(&minted).expect("status");
    assert!(json["apiTokenHash"].is_string(), "{json}");
}

/// The archive settings of a session with `spec` under `defaults`.
fn archive_plan(spec: &str, defaults: &Defaults) -> cairn_operator::validate::ArchivePlan {
    let spec: cairn_crds::AgentSessionSpec = serde_yaml::from_str(spec).expect("spec parses");
    cairn_operator::validate::archive_plan(spec.archive.as_ref(), defaults).expect("plan")
}

/// The operator's defaults with a bucket and, unless `scoped`, the shared `shared-s3` Secret.
fn bucket_defaults(scoped: bool) -> Defaults {
    let mut d = Defaults::default();
    d.archive.bucket = Some("cairn".into());
    d.archive.credentials_secret = Some("shared-s3".into());
    d.archive.scoped = scoped.then(|| cairn_operator::config::ScopedArchive {
        role_arn: None,
        sts_endpoint: None,
        duration: std::time::Duration::from_secs(3600),
        refresh_before: None,
        admin_credentials_dir: "/var/run/cairn/archive-admin".into(),
    });
    d
}

/// The status of a new session whose archive credentials are `plan`, shared with `sharing`,
/// and the Events its ArchiveCredentials condition publishes.
fn credentials_status(
    plan: &cairn_operator::validate::ArchivePlan,
    sharing: &[&str],
) -> (AgentSessionStatus, Vec<status::Transition>) {
    let sharing: Vec<String> = sharing.iter().map(|s| s.to_string()).collect();
    let obs = Observed {
        archive_credentials: status::archive_credentials(plan, "team-a", "chat", &sharing),
        ..observed()
    };
    let next = status::desired(None, &obs, &at(0));
    let events = status::transitions(None, &next)
        .into_iter()
        .filter(|t| t.note.starts_with("ArchiveCredentials="))
        .collect();
    (next, events)
}

const PROVIDER: &str = "provider: {kind: openai, model: gpt-5}";

#[test]
fn sessions_sharing_a_key_pair_are_a_warning_condition_and_event_unless_accepted() {
    // Scoped mode: credentials for the session's own prefix; nothing to warn about.
    let (scoped, events) = credentials_status(&archive_plan(PROVIDER, &bucket_defaults(true)), &[]);
    let c = condition(&scoped, status::ARCHIVE_CREDENTIALS);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "ScopedCredentials")
    );
    assert!(
        c.message.contains("s3://cairn/cairn/team-a/chat/"),
        "{}",
        c.message
    );
    assert!(events.is_empty(), "{events:?}");

    // Scoped mode off: every session of the namespace gets the operator's Secret.
    let off = bucket_defaults(false);
    let shared_plan = archive_plan(PROVIDER, &off);
    assert!(shared_plan.default_credentials);
    let (shared, events) = credentials_status(&shared_plan, &[]);
    let c = condition(&shared, status::ARCHIVE_CREDENTIALS);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SharedArchiveCredentials")
    );
    for needle in [
        "sessions share storage credentials",
        "shared-s3",
        "team-a",
        "archive.scoped.adminCredentialsSecret",
        "spec.archive.sharedCredentials: true",
        "archive.allowSharedCredentials",
    ] {
        assert!(c.message.contains(needle), "{needle} in {}", c.message);
    }
    let warning = events
        .iter()
        .find(|t| t.reason == "SharedArchiveCredentials")
        .expect("an Event");
    assert!(warning.warning, "{warning:?}");
    assert!(warning.note.contains("shared-s3"), "{}", warning.note);
    // Only the credentials condition says it: the session still runs.
    assert_eq!(shared.phase, Some(cairn_crds::Phase::Running));
    assert_eq!(condition(&shared, status::READY).status, "True");

    // Accepted by the session: the condition still says so, with no Warning.
    let accepting = format!("{PROVIDER}\narchive: {{sharedCredentials: true}}");
    let (accepted, events) = credentials_status(&archive_plan(&accepting, &off), &[]);
    let c = condition(&accepted, status::ARCHIVE_CREDENTIALS);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SharedArchiveCredentialsAccepted")
    );
    assert!(
        c.message.contains("sessions share storage credentials") && c.message.contains("shared-s3"),
        "{}",
        c.message
    );
    assert!(events.iter().all(|t| !t.warning), "{events:?}");
    // Accepting it later turns the Warning into a Normal Event that still says it.
    let turned = status::desired(
        Some(&shared),
        &Observed {
            archive_credentials: status::archive_credentials(
                &archive_plan(&accepting, &off),
                "team-a",
                "chat",
                &[],
            ),
            ..observed()
        },
        &at(5),
    );
    let t = status::transitions(Some(&shared), &turned);
    let normal = t
        .iter()
        .find(|t| t.reason == "SharedArchiveCredentialsAccepted")
        .expect("an Event");
    assert!(!normal.warning);
    assert!(
        normal.note.contains("share storage credentials"),
        "{}",
        normal.note
    );

    // Accepted by the operator, for every session.
    let mut allowed = off.clone();
    allowed.archive.allow_shared_credentials = true;
    let (fleet, _) = credentials_status(&archive_plan(PROVIDER, &allowed), &[]);
    assert_eq!(
        condition(&fleet, status::ARCHIVE_CREDENTIALS).reason,
        "SharedArchiveCredentialsAccepted"
    );

    // A Secret of the session's own: shared only when another session names it too.
    let own = archive_plan(
        &format!("{PROVIDER}\narchive: {{credentials: {{secretName: mine}}}}"),
        &off,
    );
    assert!(!own.default_credentials);
    let (alone, events) = credentials_status(&own, &[]);
    let c = condition(&alone, status::ARCHIVE_CREDENTIALS);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "OwnCredentials")
    );
    assert!(events.is_empty(), "{events:?}");
    let (together, events) = credentials_status(&own, &["other"]);
    let c = condition(&together, status::ARCHIVE_CREDENTIALS);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SharedArchiveCredentials")
    );
    assert!(
        c.message.contains("mine") && c.message.contains("other"),
        "{}",
        c.message
    );
    assert!(
        events
            .iter()
            .any(|t| t.warning && t.reason == "SharedArchiveCredentials")
    );

    // No bucket: the archive is on the pod's own volume; no credentials to speak of.
    let (none, _) = credentials_status(&archive_plan(PROVIDER, &Defaults::default()), &[]);
    assert!(
        none.conditions
            .iter()
            .all(|c| c.type_ != status::ARCHIVE_CREDENTIALS)
    );
}

#[test]
fn the_sessions_sharing_a_key_pair_are_those_of_the_namespace_holding_the_same_secret() {
    let mut defaults = bucket_defaults(false);
    defaults.archive.credentials_secret = Some("s3-a".into());
    let own =
        |secret: &str| format!("{PROVIDER}\narchive: {{credentials: {{secretName: {secret}}}}}");
    let mut deleted = guarded("gone", "team-a", &own("s3-a"));
    Arc::make_mut(&mut deleted)
        .0
        .as_mut()
        .expect("session")
        .metadata
        .deletion_timestamp = Some(at(0));
    let sessions = vec![
        guarded("a", "team-a", &own("s3-a")),
        guarded("b", "team-a", &own("s3-a")),
        guarded("c", "team-a", &own("s3-c")),
        guarded("d", "team-b", &own("s3-a")),
        // The operator's default Secret has the same name: the same key pair.
        guarded("e", "team-a", PROVIDER),
        deleted,
    ];
    let session = |g: &Arc<DeserializeGuard<AgentSession>>| g.0.as_ref().expect("session").clone();
    let sharers = |i: usize| {
        cairn_operator::controller::credentials_sharers(&session(&sessions[i]), &defaults, || {
            sessions.clone()
        })
    };
    assert_eq!(sharers(0), ["b", "e"]);
    assert_eq!(sharers(2), Vec::<String>::new());
    // The operator's default Secret is shared by construction: no lookup.
    let default_user = session(&sessions[4]);
    let looked = cairn_operator::controller::credentials_sharers(&default_user, &defaults, || {
        panic!("no lookup for the operator's default Secret")
    });
    assert!(looked.is_empty());
    // Scoped mode: a session without a Secret of its own holds none.
    let scoped = bucket_defaults(true);
    assert!(
        cairn_operator::controller::credentials_sharers(&default_user, &scoped, || {
            panic!("no lookup in scoped mode")
        })
        .is_empty()
    );
}
