//! Idle suspend and wake-up (`spec.idle.suspendAfter`), as a pure function of what the
//! session says: its spec, the agent's last activity, its conditions and the wake-up
//! annotation the gateway sets.
//!
//! A session is idle-suspended when nobody used it for `suspendAfter`, counted from the
//! latest of the agent's `status.session.lastActivity`, the time its pod became ready and
//! its last wake-up. The agent says when that happened: once it saw no client work for
//! `suspendAfter` it writes `status.session.idleSince` (its last activity) at once, outside
//! its throttled status writes, and the session is suspended on that report. A report older
//! than the latest sign of use (written before a wake-up, or before activity reported since)
//! is stale and ignored. Without a report (an agent that does not send one, a pod with no
//! agent) the rule waits [`REPORT_LAG`] longer, for activity the throttled writes may not
//! have brought yet. The `Idle` condition records the suspension (True, reason `IdleTimeout`); its
//! `lastTransitionTime` is the time of the suspension. A wake-up annotation newer than that
//! starts the pod again (`Idle` False, reason `Woken`, the wake-up counting as activity). A
//! manual `spec.suspend: true` always wins: neither idle suspend nor wake-up applies then, and
//! the operator never changes `spec.suspend` itself.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

pub use crate::status::IDLE;
use crate::status::Problem;

/// How late the API server may learn of client activity: the agent reports
/// `lastActivity` with its throttled status write, at most one per status interval, so a
/// request in the interval after a write is not there yet. The idle clock allows for it when
/// the agent sent no `idleSince` report, so a session is never stopped less than
/// `suspendAfter` after its last use (it then sleeps between `suspendAfter` and
/// `suspendAfter` plus this after it). With a report it sleeps `suspendAfter` after its last
/// use.
pub const REPORT_LAG: Duration =
    Duration::from_secs(cairn_crds::session::DEFAULT_STATUS_INTERVAL_SECONDS);

/// What the idle rule decided for one reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Whether the pod is to be stopped for being idle.
    pub suspended: bool,
    /// The `Idle` condition (`None`: the session has no idle rule).
    pub condition: Option<(bool, Problem)>,
    /// When to look again: the idle deadline, if one is running.
    pub recheck: Option<Duration>,
    /// Set when this reconcile woke the session: the wake-up request's time.
    pub woken_at: Option<String>,
}

/// Inputs of [`decide`], read from the session.
#[derive(Clone, Debug, Default)]
pub struct Inputs<'a> {
    /// `spec.idle.suspendAfter`, parsed (`None`: no idle rule).
    pub suspend_after: Option<Duration>,
    /// `spec.suspend`.
    pub manual: bool,
    /// The previous `Idle` condition.
    pub previous: Option<&'a Condition>,
    /// `status.session.lastActivity`.
    pub last_activity: Option<&'a str>,
    /// `status.session.idleSince`: the agent saw no client activity since then.
    pub idle_since: Option<&'a str>,
    /// The previous `Ready` condition (its transition to True is the pod's start).
    pub ready: Option<&'a Condition>,
    /// The wake-up annotation.
    pub wake_requested: Option<&'a str>,
}

fn parse(text: &str) -> Option<Timestamp> {
    text.trim().parse().ok()
}

fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs / 3600, (secs % 3600) / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

/// What to do about idleness at `now`.
pub fn decide(inputs: &Inputs<'_>, now: Timestamp) -> Decision {
    let Some(after) = inputs.suspend_after else {
        return Decision {
            suspended: false,
            condition: None,
            recheck: None,
            woken_at: None,
        };
    };
    if inputs.manual {
        return Decision {
            suspended: false,
            condition: Some((
                false,
                Problem::new(
                    "ManuallySuspended",
                    "spec.suspend is true: the session stays suspended until it is set back to \
                     false; idle suspend and wake-up do not apply",
                ),
            )),
            recheck: None,
            woken_at: None,
        };
    }
    let previous = inputs.previous;
    let asleep = previous.filter(|c| c.status == "True");
    if let Some(sleep) = asleep {
        let since = sleep.last_transition_time.0;
        let wake = inputs
            .wake_requested
            .and_then(|w| parse(w).map(|t| (w, t)))
            .filter(|(_, t)| *t > since);
        return match wake {
            Some((text, _)) => Decision {
                suspended: false,
                condition: Some((
                    false,
                    Problem::new(
                        "Woken",
                        format!("woken by a request at the gateway at {}", text.trim()),
                    ),
                )),
                recheck: Some(after),
                woken_at: Some(text.trim().to_string()),
            },
            None => Decision {
                suspended: true,
                condition: Some((true, Problem::new(&sleep.reason, &sleep.message))),
                recheck: None,
                woken_at: None,
            },
        };
    }

    // Awake: the idle clock runs from the latest sign of use.
    let ready_since = inputs
        .ready
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0);
    let woke = previous
        .filter(|c| c.status == "False" && c.reason == "Woken")
        .map(|c| c.last_transition_time.0);
    let activity = inputs.last_activity.and_then(parse);
    let awake_condition = previous
        .filter(|c| c.status == "False" && c.reason != "ManuallySuspended")
        .map(|c| Problem::new(&c.reason, &c.message))
        .unwrap_or_else(|| {
            Problem::new(
                "Active",
                format!(
                    "the pod is stopped after {} without client activity",
                    human(after)
                ),
            )
        });
    // A pod that is not ready (starting, after a wake-up or a manual resume) is not idle.
    let Some(reference) =
        ready_since.and_then(|r| [activity, Some(r), woke].into_iter().flatten().max())
    else {
        return Decision {
            suspended: false,
            condition: Some((false, awake_condition)),
            recheck: None,
            woken_at: None,
        };
    };
    let elapsed =
        |since: Timestamp| Duration::try_from(now.duration_since(since)).unwrap_or_default();
    let suspend = |message: String| Decision {
        suspended: true,
        condition: Some((true, Problem::new("IdleTimeout", message))),
        recheck: None,
        woken_at: None,
    };
    const STOPPED: &str =
        "the pod is stopped, journal and archive are kept; a request at the gateway wakes it";
    // The agent's report, unless a later sign of use (a wake-up this agent has not seen,
    // activity reported since) makes it stale.
    let reported = inputs
        .idle_since
        .and_then(|text| parse(text).map(|t| (text.trim(), t)))
        .filter(|(_, t)| *t >= reference);
    if let Some((text, since)) = reported
        && elapsed(since) >= after
    {
        return suspend(format!(
            "the agent reported no client activity since {text} (idle.suspendAfter {}): {STOPPED}",
            human(after)
        ));
    }
    // Without a report, activity of the last status interval may not be known yet.
    let idle_for = elapsed(reference);
    let needed = after + REPORT_LAG;
    if idle_for >= needed {
        return suspend(format!(
            "no client activity for {} (idle.suspendAfter {}): {STOPPED}",
            human(idle_for),
            human(after)
        ));
    }
    let fallback = needed - idle_for;
    let recheck = match reported {
        Some((_, since)) => fallback.min(after.saturating_sub(elapsed(since))),
        None => fallback,
    };
    Decision {
        suspended: false,
        condition: Some((false, awake_condition)),
        recheck: Some(recheck),
        woken_at: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn cond(kind: &str, status: &str, reason: &str, secs: i64) -> Condition {
        Condition {
            type_: kind.into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            observed_generation: None,
            last_transition_time: Time(at(secs)),
        }
    }

    #[test]
    fn idle_for_long_enough_suspends_and_the_deadline_is_rechecked() {
        let ready = cond("Ready", "True", "AgentReady", 0);
        let activity = at(10).to_string();
        let inputs = Inputs {
            suspend_after: Some(Duration::from_secs(30)),
            ready: Some(&ready),
            last_activity: Some(&activity),
            ..Inputs::default()
        };
        let d = decide(&inputs, at(25));
        assert!(!d.suspended);
        assert_eq!(d.recheck, Some(Duration::from_secs(15) + REPORT_LAG));
        // Activity of the last status interval may not be reported yet: not before then.
        let lag = REPORT_LAG.as_secs() as i64;
        assert!(!decide(&inputs, at(39 + lag)).suspended);
        let d = decide(&inputs, at(40 + lag));
        assert!(d.suspended);
        let (status, p) = d.condition.expect("condition");
        assert!(status);
        assert_eq!(p.reason, "IdleTimeout");
        assert!(p.message.contains("30s"), "{}", p.message);
    }

    #[test]
    fn a_newer_wake_request_wakes_and_counts_as_activity() {
        let asleep = cond(IDLE, "True", "IdleTimeout", 100);
        let old = at(90).to_string();
        let inputs = Inputs {
            suspend_after: Some(Duration::from_secs(30)),
            previous: Some(&asleep),
            wake_requested: Some(&old),
            ..Inputs::default()
        };
        assert!(
            decide(&inputs, at(200)).suspended,
            "an older request does not wake"
        );
        let new = at(150).to_string();
        let d = decide(
            &Inputs {
                wake_requested: Some(&new),
                ..inputs.clone()
            },
            at(151),
        );
        assert!(!d.suspended);
        assert_eq!(
            d.condition.as_ref().map(|c| c.1.reason.as_str()),
            Some("Woken")
        );
        assert_eq!(d.woken_at.as_deref(), Some(new.as_str()));
        // Once woken (the condition's transition is the wake-up), the clock starts again.
        let woken = cond(IDLE, "False", "Woken", 151);
        let starting = Inputs {
            previous: Some(&woken),
            ..inputs.clone()
        };
        assert!(
            !decide(&starting, at(500)).suspended,
            "a starting pod is not idle"
        );
        let ready = cond("Ready", "True", "AgentReady", 140);
        let awake = Inputs {
            previous: Some(&woken),
            ready: Some(&ready),
            ..inputs
        };
        let d = decide(&awake, at(170));
        assert!(!d.suspended);
        assert_eq!(d.recheck, Some(Duration::from_secs(11) + REPORT_LAG));
        assert_eq!(d.condition.map(|c| c.1.reason), Some("Woken".to_string()));
        let lag = REPORT_LAG.as_secs() as i64;
        assert!(!decide(&awake, at(180 + lag)).suspended);
        assert!(decide(&awake, at(181 + lag)).suspended);
    }

    #[test]
    fn manual_suspend_wins_and_no_rule_means_no_condition() {
        let asleep = cond(IDLE, "True", "IdleTimeout", 100);
        let wake = at(150).to_string();
        let d = decide(
            &Inputs {
                suspend_after: Some(Duration::from_secs(30)),
                manual: true,
                previous: Some(&asleep),
                wake_requested: Some(&wake),
                ..Inputs::default()
            },
            at(200),
        );
        assert!(d.woken_at.is_none());
        assert_eq!(
            d.condition.map(|c| c.1.reason),
            Some("ManuallySuspended".to_string())
        );
        let d = decide(&Inputs::default(), at(0));
        assert_eq!(d.condition, None);
        assert!(!d.suspended);
    }

    #[test]
    fn the_agent_idle_report_suspends_exactly_suspend_after_past_it() {
        let ready = cond("Ready", "True", "AgentReady", 0);
        let activity = at(10).to_string();
        let inputs = Inputs {
            suspend_after: Some(Duration::from_secs(30)),
            ready: Some(&ready),
            last_activity: Some(&activity),
            idle_since: Some(&activity),
            ..Inputs::default()
        };
        let d = decide(&inputs, at(39));
        assert!(!d.suspended);
        assert_eq!(
            d.recheck,
            Some(Duration::from_secs(1)),
            "the report's deadline"
        );
        let d = decide(&inputs, at(40));
        assert!(d.suspended, "no status interval added");
        let (status, p) = d.condition.expect("condition");
        assert!(status);
        assert_eq!(p.reason, "IdleTimeout");
        assert!(
            p.message
                .contains(&format!("no client activity since {activity}")),
            "{}",
            p.message
        );
        // Sub-second activity times, as the agent writes them.
        let precise = "2027-01-15T08:00:10.250Z";
        let base: Timestamp = "2027-01-15T08:00:00Z".parse().expect("time");
        let ready_at_base = Condition {
            last_transition_time: Time(base),
            ..ready.clone()
        };
        let inputs = Inputs {
            ready: Some(&ready_at_base),
            last_activity: Some(precise),
            idle_since: Some(precise),
            ..inputs
        };
        let later = |ms: i64| {
            base.checked_add(k8s_openapi::jiff::SignedDuration::from_millis(ms))
                .unwrap_or(base)
        };
        assert!(!decide(&inputs, later(40_249)).suspended);
        assert!(decide(&inputs, later(40_250)).suspended);
        // Manual suspend still wins.
        let d = decide(
            &Inputs {
                manual: true,
                ..inputs
            },
            later(90_000),
        );
        assert!(!d.suspended);
        assert_eq!(
            d.condition.map(|c| c.1.reason),
            Some("ManuallySuspended".to_string())
        );
    }

    #[test]
    fn a_report_older_than_later_activity_is_ignored() {
        let ready = cond("Ready", "True", "AgentReady", 0);
        let reported = at(10).to_string();
        let activity = at(50).to_string();
        let inputs = Inputs {
            suspend_after: Some(Duration::from_secs(30)),
            ready: Some(&ready),
            last_activity: Some(&activity),
            idle_since: Some(&reported),
            ..Inputs::default()
        };
        let d = decide(&inputs, at(80));
        assert!(!d.suspended, "used at 50: not idle at 80");
        // The fallback rule: 50 + 30 s + the status interval.
        assert_eq!(d.recheck, Some(REPORT_LAG));
        let lag = REPORT_LAG.as_secs() as i64;
        assert!(!decide(&inputs, at(79 + lag)).suspended);
        let d = decide(&inputs, at(80 + lag));
        assert!(d.suspended);
        let message = d.condition.map(|c| c.1.message).unwrap_or_default();
        assert!(message.starts_with("no client activity for"), "{message}");
    }

    #[test]
    fn a_report_from_before_a_wake_up_is_ignored() {
        // The pod slept on the report of idleness since 10; a wake-up at 100 started a new
        // one, whose agent has not reported yet: the status still holds the old report.
        let woken = cond(IDLE, "False", "Woken", 100);
        let ready = cond("Ready", "True", "AgentReady", 105);
        let old = at(10).to_string();
        let inputs = Inputs {
            suspend_after: Some(Duration::from_secs(30)),
            previous: Some(&woken),
            ready: Some(&ready),
            last_activity: Some(&old),
            idle_since: Some(&old),
            ..Inputs::default()
        };
        let d = decide(&inputs, at(140));
        assert!(
            !d.suspended,
            "a stale report does not put the woken pod to sleep"
        );
        let lag = REPORT_LAG.as_secs() as i64;
        assert_eq!(d.recheck, Some(Duration::from_secs(135 + lag as u64 - 140)));
        assert!(!decide(&inputs, at(134 + lag)).suspended);
        assert!(
            decide(&inputs, at(135 + lag)).suspended,
            "the fallback still runs"
        );
        // The new agent's report after the wake-up counts.
        let fresh = at(120).to_string();
        let reported = Inputs {
            last_activity: Some(&fresh),
            idle_since: Some(&fresh),
            ..inputs
        };
        assert!(!decide(&reported, at(149)).suspended);
        assert!(decide(&reported, at(150)).suspended);
    }

    #[test]
    fn never_ready_never_idle() {
        let d = decide(
            &Inputs {
                suspend_after: Some(Duration::from_secs(5)),
                ..Inputs::default()
            },
            at(1000),
        );
        assert!(!d.suspended);
        assert_eq!(d.recheck, None);
    }
}
