//! When the agent writes `status.session`: a pure schedule that `cluster::write_status` follows.
//!
//! Counters that changed are written at most once per status interval while the session is
//! in use, and nothing is written while it is idle. With `spec.idle.suspendAfter = S` two
//! writes go out at once, outside the interval:
//!
//! - the idle report: `S` after the last client activity, with no client work in flight (a
//!   model call may take longer than `S`), `idleSince` = `lastActivity` and the current
//!   counters. The operator suspends the session on it, without waiting for the next
//!   throttled write;
//! - the wake report: the first write after client work started again, with the new
//!   `lastActivity` and without `idleSince`.
//!
//! Each happens at most once per idle period, and an idle period needs `S` without activity,
//! so a session in use still costs at most one status write per interval, and an idle one
//! none after its idle report.

use std::time::Duration;

use cairn_crds::SessionStats;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// When the idle report is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleDue {
    /// Not while things stay as they are: no idle rule, no client activity yet, client work
    /// in flight, or this idle period was reported already.
    Never,
    /// At this time, unless client work comes first.
    At(Timestamp),
    /// Now.
    Now,
}

/// When to report that the session is idle: `suspend_after` past the last activity, while no
/// client work is in flight, once per idle period (`reported`: this one was).
pub fn idle_due(
    last_activity: Option<Timestamp>,
    in_flight: usize,
    suspend_after: Option<Duration>,
    reported: bool,
    now: Timestamp,
) -> IdleDue {
    let (Some(last), Some(after)) = (last_activity, suspend_after) else {
        return IdleDue::Never;
    };
    if reported || in_flight > 0 {
        return IdleDue::Never;
    }
    let Some(due) = SignedDuration::try_from(after)
        .ok()
        .and_then(|d| last.checked_add(d).ok())
    else {
        return IdleDue::Never;
    };
    if now >= due {
        IdleDue::Now
    } else {
        IdleDue::At(due)
    }
}

/// What the status writer does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Write these counters now.
    Write(Box<SessionStats>),
    /// Nothing to write before this time (`None`: before something changes).
    Wait(Option<Timestamp>),
}

/// The status writer's state: what it wrote, when it may write again, which idle period it
/// reported.
#[derive(Clone, Debug)]
pub struct Schedule {
    interval: Duration,
    /// What the last successful write sent.
    written: Option<SessionStats>,
    /// No throttled write before this.
    next_write: Option<Timestamp>,
    /// After a failed write, no write at all before this (the idle and wake reports
    /// included): the API server is not asked again at once.
    retry_at: Option<Timestamp>,
    /// The `lastActivity` of the idle period reported, while no activity followed it.
    reported: Option<String>,
}

fn after(t: Timestamp, d: Duration) -> Option<Timestamp> {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
}

fn reached(deadline: Option<Timestamp>, now: Timestamp) -> bool {
    deadline.is_none_or(|t| now >= t)
}

impl Schedule {
    /// A schedule writing at most once per `interval` while the session is in use.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            written: None,
            next_write: None,
            retry_at: None,
            reported: None,
        }
    }

    /// What to do at `now`, given the current counters (`lastActivity` included), the
    /// client work in flight and `spec.idle.suspendAfter`.
    pub fn step(
        &mut self,
        current: Option<&SessionStats>,
        in_flight: usize,
        suspend_after: Option<Duration>,
        now: Timestamp,
    ) -> Step {
        let Some(current) = current else {
            return Step::Wait(None);
        };
        let last = current.last_activity.as_deref();
        // Activity since the reported idle period ends it.
        if self.reported.is_some() && self.reported.as_deref() != last {
            self.reported = None;
        }
        let due = idle_due(
            last.and_then(|l| l.parse().ok()),
            in_flight,
            suspend_after,
            self.reported.is_some(),
            now,
        );
        if due == IdleDue::Now {
            self.reported = last.map(str::to_owned);
        }
        let mut desired = current.clone();
        desired.idle_since.clone_from(&self.reported);
        // Client work in flight is activity: while it runs (a model call can outlast
        // `suspendAfter` and the operator's fallback), `lastActivity` moves to now with each
        // throttled write, at most once per interval.
        if in_flight > 0 && reached(self.next_write, now) && reached(self.retry_at, now) {
            desired.last_activity = Some(now.to_string());
        }
        let idle_at = match due {
            IdleDue::At(t) => Some(t),
            _ => None,
        };
        if self.written.as_ref() == Some(&desired) {
            return Step::Wait(idle_at);
        }
        let was_idle = self.written.as_ref().and_then(|w| w.idle_since.as_ref());
        // The idle report, and the first write after it (the session is used again).
        let report = desired.idle_since.as_ref() != was_idle;
        if reached(self.retry_at, now) && (report || reached(self.next_write, now)) {
            return Step::Write(Box::new(desired));
        }
        let throttled = if report {
            self.retry_at
        } else {
            self.retry_at.max(self.next_write)
        };
        Step::Wait(match (throttled, idle_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// The `idleSince` of the last successful write.
    pub fn reported_written(&self) -> Option<&str> {
        self.written.as_ref().and_then(|w| w.idle_since.as_deref())
    }

    /// The write of `stats` at `now` succeeded.
    pub fn written(&mut self, stats: SessionStats, now: Timestamp) {
        self.written = Some(stats);
        self.next_write = after(now, self.interval);
        self.retry_at = None;
    }

    /// A write at `now` failed: tried again after the interval.
    pub fn failed(&mut self, now: Timestamp) {
        self.next_write = after(now, self.interval);
        self.retry_at = self.next_write;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(30);
    const INTERVAL: Duration = Duration::from_secs(30);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn stats(turns: u64, last_activity: Option<i64>) -> SessionStats {
        SessionStats {
            turns,
            last_activity: last_activity.map(|s| at(s).to_string()),
            ..SessionStats::default()
        }
    }

    /// Runs `step` and, for a write, records it as successful.
    fn run(
        s: &mut Schedule,
        current: &SessionStats,
        in_flight: usize,
        now: i64,
    ) -> Option<SessionStats> {
        match s.step(Some(current), in_flight, Some(S), at(now)) {
            Step::Write(w) => {
                s.written((*w).clone(), at(now));
                Some(*w)
            }
            Step::Wait(_) => None,
        }
    }

    #[test]
    fn work_in_flight_refreshes_the_last_activity_once_per_interval() {
        let mut s = Schedule::new(INTERVAL);
        // A model call starts at 0 and runs for 100 s: nothing else changes.
        let busy = stats(1, Some(0));
        let mut writes = Vec::new();
        for now in 0..100 {
            if let Some(w) = run(&mut s, &busy, 1, now) {
                assert_eq!(w.idle_since, None, "never idle while work runs");
                writes.push((now, w.last_activity));
            }
        }
        let times: Vec<i64> = writes.iter().map(|(t, _)| *t).collect();
        assert_eq!(times, vec![0, 30, 60, 90], "one write per interval");
        for (t, last) in &writes {
            assert_eq!(last.as_deref(), Some(at(*t).to_string().as_str()));
        }
    }

    #[test]
    fn the_idle_report_is_due_suspend_after_past_the_last_activity() {
        let last = Some(at(10));
        assert_eq!(
            idle_due(last, 0, Some(S), false, at(20)),
            IdleDue::At(at(40))
        );
        assert_eq!(idle_due(last, 0, Some(S), false, at(40)), IdleDue::Now);
        assert_eq!(idle_due(last, 0, Some(S), false, at(90)), IdleDue::Now);
        assert_eq!(
            idle_due(last, 1, Some(S), false, at(90)),
            IdleDue::Never,
            "work runs"
        );
        assert_eq!(
            idle_due(last, 0, Some(S), true, at(90)),
            IdleDue::Never,
            "reported"
        );
        assert_eq!(
            idle_due(last, 0, None, false, at(90)),
            IdleDue::Never,
            "no rule"
        );
        assert_eq!(
            idle_due(None, 0, Some(S), false, at(90)),
            IdleDue::Never,
            "never used"
        );
        let precise: Timestamp = "2027-01-15T08:00:10.250Z".parse().expect("time");
        assert_eq!(
            idle_due(Some(precise), 0, Some(S), false, precise),
            IdleDue::At("2027-01-15T08:00:40.250Z".parse().expect("time"))
        );
    }

    #[test]
    fn the_idle_report_goes_out_at_once_and_once_per_idle_period() {
        let mut s = Schedule::new(INTERVAL);
        // Work from 0 to 10; the end of it was written at 12 (throttled until 42).
        assert!(run(&mut s, &stats(1, Some(0)), 1, 0).is_some());
        let done = stats(2, Some(10));
        assert_eq!(run(&mut s, &done, 0, 12), None, "within the interval");
        assert_eq!(
            s.step(Some(&done), 0, Some(S), at(12)),
            Step::Wait(Some(at(30))),
            "the throttled write at 30"
        );
        assert!(run(&mut s, &done, 0, 30).is_some());
        assert_eq!(
            s.step(Some(&done), 0, Some(S), at(31)),
            Step::Wait(Some(at(40))),
            "the idle timer"
        );
        // At 40, within the interval of the last write: the report bypasses the throttle.
        let report = run(&mut s, &done, 0, 40).expect("the idle report");
        assert_eq!(report.idle_since, done.last_activity);
        assert_eq!(report.turns, 2, "with the current counters");
        for now in [41, 70, 500] {
            assert_eq!(
                s.step(Some(&done), 0, Some(S), at(now)),
                Step::Wait(None),
                "nothing more while idle"
            );
        }
        // A background change while idle is an ordinary throttled write, still idle.
        let checked = stats(3, Some(10));
        let w = run(&mut s, &checked, 0, 600).expect("written");
        assert_eq!(w.idle_since, checked.last_activity);
    }

    #[test]
    fn never_idle_while_work_is_in_flight() {
        let mut s = Schedule::new(INTERVAL);
        let started = stats(1, Some(0));
        assert!(run(&mut s, &started, 1, 0).is_some());
        // A model call far longer than suspendAfter: never reported idle, and its
        // lastActivity keeps moving with the throttled writes.
        let w = run(&mut s, &started, 1, 300).expect("a refresh while busy");
        assert_eq!(w.idle_since, None);
        assert_eq!(w.last_activity, Some(at(300).to_string()));
        let done = stats(2, Some(310));
        assert_eq!(
            s.step(Some(&done), 0, Some(S), at(310)),
            Step::Wait(Some(at(330))),
            "the end of the work waits for the interval"
        );
        let w = run(&mut s, &done, 0, 330).expect("the end of the work");
        assert_eq!(w.idle_since, None);
        assert_eq!(
            s.step(Some(&done), 0, Some(S), at(331)),
            Step::Wait(Some(at(340)))
        );
    }

    #[test]
    fn work_after_the_report_is_written_at_once_without_idle_since() {
        let mut s = Schedule::new(INTERVAL);
        let done = stats(1, Some(0));
        assert!(run(&mut s, &done, 0, 0).is_some());
        assert!(run(&mut s, &done, 0, 30).is_some_and(|w| w.idle_since.is_some()));
        // Client work starts at 35, within the interval of the report: written at once.
        let started = stats(1, Some(35));
        let w = run(&mut s, &started, 1, 35).expect("the wake report");
        assert_eq!(w.idle_since, None);
        assert_eq!(w.last_activity, started.last_activity);
        // Back to the throttle: the end of the work waits for the interval.
        let done = stats(2, Some(40));
        assert_eq!(
            s.step(Some(&done), 0, Some(S), at(40)),
            Step::Wait(Some(at(65)))
        );
        assert!(run(&mut s, &done, 0, 65).is_some());
        // And the next idle period is reported again.
        assert!(run(&mut s, &done, 0, 70).is_some_and(|w| w.idle_since == done.last_activity));
    }

    #[test]
    fn without_an_idle_rule_the_writer_only_throttles() {
        let mut s = Schedule::new(INTERVAL);
        let first = stats(1, Some(0));
        assert!(matches!(
            s.step(Some(&first), 0, None, at(0)),
            Step::Write(_)
        ));
        s.written(first.clone(), at(0));
        assert_eq!(s.step(Some(&first), 0, None, at(500)), Step::Wait(None));
        let next = stats(2, Some(5));
        assert_eq!(
            s.step(Some(&next), 0, None, at(5)),
            Step::Wait(Some(at(30)))
        );
        assert!(matches!(
            s.step(Some(&next), 0, None, at(30)),
            Step::Write(_)
        ));
        assert_eq!(s.step(None, 0, None, at(40)), Step::Wait(None));
    }

    #[test]
    fn a_failed_report_is_tried_again_after_the_interval() {
        let mut s = Schedule::new(INTERVAL);
        let done = stats(1, Some(0));
        assert!(run(&mut s, &done, 0, 0).is_some());
        assert!(matches!(
            s.step(Some(&done), 0, Some(S), at(30)),
            Step::Write(_)
        ));
        s.failed(at(30));
        assert_eq!(
            s.step(Some(&done), 0, Some(S), at(31)),
            Step::Wait(Some(at(60)))
        );
        let w = run(&mut s, &done, 0, 60).expect("tried again");
        assert_eq!(w.idle_since, done.last_activity);
    }
}
