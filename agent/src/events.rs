//! The session's Events: one per compaction (`Compacted`) and per recovery (`Recovered`,
//! `RecoveryFailed`), about the AgentSession, so `kubectl describe asess` shows them.
//!
//! What an Event says is decided here from the engine's reports (pure); publishing is a
//! background task fed by a bounded channel, so a turn never waits on the API server: when
//! the channel is full the Event is dropped and counted. A session outside a cluster has an
//! [`EventSink::none`] and emits nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_crds::AgentSession;
use cairn_crds::session::CompactionScore;
use cairn_engine::classify::FailureClass;
use cairn_engine::compact::Trigger;
use cairn_engine::compact::ladder::CompactionOutcome;
use cairn_engine::recovery::{RecoveryError, RecoveryOutcome};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use tokio::sync::mpsc;

/// Events waiting to be published; more are dropped.
const QUEUE: usize = 64;
/// The longest note the API server takes is 1 KB.
const MAX_NOTE: usize = 1000;

/// One Event about the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionEvent {
    pub warning: bool,
    pub reason: &'static str,
    /// `Compact` or `Recover`.
    pub action: &'static str,
    pub note: String,
}

/// What the failure was, in the words an operator knows.
fn trigger(class: FailureClass) -> &'static str {
    match class {
        FailureClass::ContextOverflow => "context overflow",
        FailureClass::PayloadTooLarge => "payload too large (413)",
        FailureClass::ProxyRejection => "proxy rejection (WAF 403)",
        FailureClass::SuspectedPayload => "connection dropped (EOF)",
        FailureClass::MaxOutputTokens => "output limit",
        FailureClass::Other(_) => class.label(),
    }
}

/// The Event of a compaction, if it changed the history (routine cheap passes that change
/// nothing, and ladders the breaker kept from running, are not news).
/// One that put something out of sight always is.
pub fn compacted(out: &CompactionOutcome) -> Option<SessionEvent> {
    let lost_sight = out
        .quality
        .as_ref()
        .is_some_and(CompactionScore::lost_sight);
    if out.not_run.is_some() || (out.bytes_after >= out.bytes_before && !lost_sight) {
        return None;
    }
    let level = match out.level {
        Some(l) => format!("level {l}"),
        None => "cheap passes".to_owned(),
    };
    let passes = out
        .reports
        .iter()
        .filter(|r| r.bytes_after != r.bytes_before || !r.archived.is_empty())
        .map(|r| format!("{:?}", r.pass).to_lowercase())
        .collect::<Vec<_>>();
    let archived: usize = out.reports.iter().map(|r| r.archived.len()).sum();
    let mut note = format!(
        "{} compaction, {level} ({}): {} → {} bytes",
        trigger_label(out.trigger),
        passes.join(", "),
        out.bytes_before,
        out.bytes_after
    );
    if archived > 0 {
        note.push_str(&format!(", {}", originals_archived(archived)));
    }
    if !out.met {
        note.push_str(&format!("; still above the {}-byte target", out.target));
    }
    if let Some(q) = &out.quality {
        note.push_str(&format!("; {}", in_sight(q)));
    }
    if let Some(min) = out.below_min_score {
        note.push_str(&format!(
            ", below the policy's quality.minScore {min} even keeping the most its target leaves room for"
        ));
    }
    Some(SessionEvent {
        warning: out.below_min_score.is_some(),
        reason: "Compacted",
        action: "Compact",
        note,
    })
}

/// The Event of a pass outside the ladder that cut (`pass`: a cheap pass, the mirror of a
/// provider's clearing, admission of a tool result), when its score says it put something
/// out of sight; one that kept everything in sight is not news.
pub fn cut(pass: &'static str, q: &CompactionScore) -> Option<SessionEvent> {
    q.lost_sight().then(|| SessionEvent {
        warning: false,
        reason: "Compacted",
        action: "Compact",
        note: format!(
            "{pass} cut tool results; {}, the rest recallable through their markers",
            in_sight(q)
        ),
    })
}

/// A compaction's score and what it kept in sight of what it replaced, by category (the
/// categories with nothing at stake left out).
fn in_sight(q: &CompactionScore) -> String {
    let kept: Vec<String> = q
        .categories()
        .iter()
        .filter(|(_, c)| c.at_stake > 0)
        .map(|(name, c)| format!("{name} {}/{}", c.in_sight, c.at_stake))
        .collect();
    if kept.is_empty() {
        return format!("score {:.2}", q.score);
    }
    format!("score {:.2}, in sight: {}", q.score, kept.join(", "))
}

fn originals_archived(n: usize) -> String {
    if n == 1 {
        "1 original archived".to_owned()
    } else {
        format!("{n} originals archived")
    }
}

fn trigger_label(t: Trigger) -> &'static str {
    match t {
        Trigger::Turn => "turn",
        Trigger::Auto => "automatic",
        Trigger::PreFlight => "pre-flight",
        Trigger::Manual => "manual",
        Trigger::Recovery => "recovery",
    }
}

/// The Event of a recovery attempt that shrank the request (the retry follows).
pub fn recovered(class: FailureClass, o: &RecoveryOutcome) -> SessionEvent {
    let mut note = format!(
        "after {}: attempt {} shrank the history {} → {} bytes",
        trigger(class),
        o.attempt,
        o.report.bytes_before,
        o.report.bytes_after
    );
    if !o.report.archived.is_empty() {
        note.push_str(&format!(
            ", {}",
            originals_archived(o.report.archived.len())
        ));
    }
    if let Some(cap) = o.learned_cap {
        note.push_str(&format!("; payload cap learned: {cap} bytes"));
    }
    if let Some(window) = o.learned_window {
        note.push_str(&format!("; context window learned: {window} tokens"));
    }
    if let Some(q) = &o.quality {
        note.push_str(&format!("; {}", in_sight(q)));
    }
    note.push_str("; the request is retried");
    SessionEvent {
        warning: false,
        reason: "Recovered",
        action: "Recover",
        note,
    }
}

/// The Event of a recovery that gave up, if the failure was one recovery handles.
pub fn recovery_failed(
    class: FailureClass,
    attempts: u32,
    e: &RecoveryError,
) -> Option<SessionEvent> {
    if !class.is_recoverable() {
        return None;
    }
    Some(SessionEvent {
        warning: true,
        reason: "RecoveryFailed",
        action: "Recover",
        note: format!(
            "after {} ({attempts} attempts this turn): {} ({e})",
            trigger(class),
            e.label()
        ),
    })
}

/// Where the session's Events go: a bounded queue to the publisher, or nowhere.
#[derive(Clone, Default)]
pub struct EventSink {
    tx: Option<mpsc::Sender<SessionEvent>>,
    dropped: Arc<AtomicU64>,
}

impl EventSink {
    /// Emits nothing (a session outside a cluster, tests).
    pub fn none() -> Self {
        Self::default()
    }

    /// Publishes the session's Events about `session` (its uid included) from a background
    /// task as the reporting controller `cairn-agent`, instance `instance` (the pod).
    pub fn start(client: kube::Client, session: &AgentSession, instance: String) -> Self {
        let regarding = ObjectReference {
            api_version: Some(AgentSession::api_version(&()).into()),
            kind: Some(AgentSession::kind(&()).into()),
            name: session.metadata.name.clone(),
            namespace: session.metadata.namespace.clone(),
            uid: session.metadata.uid.clone(),
            ..Default::default()
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let events = cairn_events::Events::new(client, "cairn-agent", Some(instance));
        tokio::spawn(publish(events, regarding, rx));
        Self {
            tx: Some(tx),
            dropped: Arc::default(),
        }
    }

    /// Queues `event`; never waits. A full queue drops it.
    pub fn emit(&self, event: Option<SessionEvent>) {
        let (Some(tx), Some(event)) = (&self.tx, event) else {
            return;
        };
        if let Err(e) = tx.try_send(event) {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            let reason = match &e {
                mpsc::error::TrySendError::Full(ev) | mpsc::error::TrySendError::Closed(ev) => {
                    ev.reason
                }
            };
            tracing::warn!(
                reason,
                dropped = n,
                "an Event was dropped: the queue is full"
            );
        }
    }

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

async fn publish(
    events: cairn_events::Events,
    regarding: ObjectReference,
    mut rx: mpsc::Receiver<SessionEvent>,
) {
    while let Some(ev) = rx.recv().await {
        let note = truncate(ev.note, MAX_NOTE);
        let event = cairn_events::Event {
            regarding: &regarding,
            warning: ev.warning,
            reason: ev.reason,
            note: &note,
            action: ev.action,
        };
        if let Err(e) = events.publish(&event).await {
            tracing::warn!(error = %e, reason = ev.reason, "publishing an Event failed");
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

#[cfg(test)]
mod tests {
    use cairn_engine::compact::{Pass, PassReport};

    use super::*;

    fn report(pass: Pass, before: usize, after: usize, archived: usize) -> PassReport {
        PassReport {
            pass,
            trigger: Trigger::Manual,
            changed: 1,
            removed: 0,
            added: 0,
            bytes_before: before,
            bytes_after: after,
            archived: (0..archived)
                .map(|i| cairn_engine::ccr::Key::of(format!("original {i}").as_bytes()))
                .collect(),
            archive_error: None,
            notes: vec![],
            quality: None,
        }
    }

    fn outcome(before: usize, after: usize, reports: Vec<PassReport>) -> CompactionOutcome {
        CompactionOutcome {
            trigger: Trigger::Manual,
            target: 5_000,
            bytes_before: before,
            bytes_after: after,
            met: after <= 5_000,
            level: Some(2),
            not_run: None,
            reports,
            breaker_opened: false,
            summary: None,
            level2_skipped: false,
            quality: None,
            below_min_score: None,
        }
    }

    #[test]
    fn a_compaction_names_its_level_passes_bytes_and_archived_originals() {
        let out = outcome(
            20_000,
            4_000,
            vec![
                report(Pass::Microcompact, 20_000, 20_000, 0),
                report(Pass::Trim, 20_000, 9_000, 3),
                report(Pass::Summary, 9_000, 4_000, 2),
            ],
        );
        let ev = compacted(&out).expect("an event");
        assert_eq!(
            (ev.warning, ev.reason, ev.action),
            (false, "Compacted", "Compact")
        );
        assert_eq!(
            ev.note,
            "manual compaction, level 2 (trim, summary): 20000 → 4000 bytes, 5 originals archived"
        );
    }

    #[test]
    fn a_scored_compaction_says_what_it_kept_in_sight() {
        let mut out = outcome(
            20_000,
            4_000,
            vec![report(Pass::Emergency, 20_000, 4_000, 1)],
        );
        let seen = |in_sight, at_stake| cairn_crds::session::InSight { at_stake, in_sight };
        out.quality = Some(CompactionScore {
            score: 0.75,
            level: 3,
            files: seen(4, 4),
            commands: seen(2, 2),
            errors: seen(0, 0),
            requests: seen(0, 3),
        });
        let ev = compacted(&out).expect("an event");
        assert!(
            ev.note
                .ends_with("; score 0.75, in sight: files 4/4, commands 2/2, requests 0/3"),
            "{}",
            ev.note
        );
        assert!(!ev.warning);
        // Below the policy's threshold: a Warning that says so.
        out.below_min_score = Some(0.9);
        let ev = compacted(&out).expect("an event");
        assert_eq!((ev.warning, ev.reason), (true, "Compacted"));
        assert!(
            ev.note.ends_with(
                "requests 0/3, below the policy's quality.minScore 0.9 even keeping the most its target leaves room for"
            ),
            "{}",
            ev.note
        );
    }

    #[test]
    fn a_cut_outside_the_ladder_is_an_event_only_when_it_put_something_out_of_sight() {
        let seen = |in_sight, at_stake| cairn_crds::session::InSight { at_stake, in_sight };
        let mut q = CompactionScore {
            score: 1.0,
            level: 0,
            files: seen(0, 0),
            commands: seen(0, 0),
            errors: seen(3, 3),
            requests: seen(0, 0),
        };
        assert_eq!(cut("dedup", &q), None);
        q.errors = seen(1, 3);
        q.score = 1.0 / 3.0;
        let ev = cut("microcompact", &q).expect("an event");
        assert_eq!((ev.warning, ev.reason), (false, "Compacted"));
        assert!(
            ev.note
                .starts_with("microcompact cut tool results; score 0.33, in sight: errors 1/3"),
            "{}",
            ev.note
        );
        // A compaction that lost sight of something is news even when it did not shrink.
        let mut out = outcome(5_000, 5_000, vec![report(Pass::Trim, 5_000, 5_000, 1)]);
        out.quality = Some(q);
        assert!(compacted(&out).is_some());
    }

    #[test]
    fn a_compaction_that_changed_nothing_or_did_not_run_is_no_event() {
        assert_eq!(compacted(&outcome(1_000, 1_000, vec![])), None);
        let mut out = outcome(9_000, 4_000, vec![]);
        out.not_run = Some(cairn_engine::compact::ladder::NotRun::CircuitOpen);
        assert_eq!(compacted(&out), None);
    }

    #[test]
    fn a_recovery_names_its_trigger_and_step_and_a_failed_one_is_a_warning() {
        let o = RecoveryOutcome {
            attempt: 2,
            class: FailureClass::PayloadTooLarge,
            learned_cap: Some(750_000),
            counted: Default::default(),
            learned_window: None,
            target: 600_000,
            notice_injected: false,
            floor_warning: None,
            report: report(Pass::Recovery, 1_000_000, 600_000, 4),
            quality: None,
        };
        let ev = recovered(FailureClass::PayloadTooLarge, &o);
        assert_eq!((ev.warning, ev.reason), (false, "Recovered"));
        assert_eq!(
            ev.note,
            "after payload too large (413): attempt 2 shrank the history 1000000 → 600000 bytes, \
             4 originals archived; payload cap learned: 750000 bytes; the request is retried"
        );

        let failed = recovery_failed(
            FailureClass::ProxyRejection,
            3,
            &RecoveryError::Exhausted(3),
        )
        .expect("an event");
        assert_eq!((failed.warning, failed.reason), (true, "RecoveryFailed"));
        assert!(
            failed
                .note
                .starts_with("after proxy rejection (WAF 403) (3 attempts this turn): exhausted"),
            "{}",
            failed.note
        );
        assert_eq!(
            recovery_failed(
                FailureClass::Other(cairn_engine::classify::OtherReason::RateLimit),
                0,
                &RecoveryError::NotRecoverable(FailureClass::Other(
                    cairn_engine::classify::OtherReason::RateLimit
                )),
            ),
            None,
            "a rate limit is not recovery's business"
        );
    }

    #[test]
    fn a_sink_outside_a_cluster_takes_everything_and_sends_nothing() {
        let sink = EventSink::none();
        sink.emit(recovery_failed(
            FailureClass::ContextOverflow,
            1,
            &RecoveryError::Exhausted(1),
        ));
        assert_eq!(sink.dropped(), 0);
    }
}
