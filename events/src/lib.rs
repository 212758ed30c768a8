//! `cairn-events`: the Events (`events.k8s.io/v1`) of the operator and of the agent (one
//! mechanism for both). Each is created once; the same event again within six minutes (the
//! same object, type, reason and note: a reconcile failing on every retry) is folded into the first one's `series` with a PATCH, as `kube`'s
//! `Recorder` does. What is remembered of a published event is its name, count and time under
//! a 64-bit digest of what makes it the same, and expired entries are dropped at most once a
//! minute. `Recorder` keeps every event whole (about 2 KB each, two per session at creation)
//! and scans all of them under one lock before each new one: at 10,000 sessions that was tens
//! of megabytes of the operator's memory and a quadratic amount of work.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// How long a published event takes repeats into its series.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How often expired entries are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One event to publish about `regarding`.
#[derive(Clone, Debug)]
pub struct Event<'a> {
    pub regarding: &'a ObjectReference,
    pub warning: bool,
    pub reason: &'a str,
    pub note: &'a str,
    pub action: &'a str,
}

impl Event<'_> {
    /// What makes two events the same one.
    fn digest(&self) -> u64 {
        let mut h = DefaultHasher::new();
        (
            &self.regarding.namespace,
            &self.regarding.name,
            &self.regarding.uid,
            self.warning,
            self.reason,
            self.note,
            self.action,
        )
            .hash(&mut h);
        h.finish()
    }
}

struct Published {
    name: String,
    count: i32,
    at: Instant,
}

#[derive(Default)]
struct Seen {
    entries: HashMap<u64, Published>,
    swept: Option<Instant>,
}

impl Seen {
    /// Drops expired entries, at most once per [`SWEEP_EVERY`].
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|t| now.duration_since(t) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        self.entries
            .retain(|_, p| now.duration_since(p.at) < SERIES_WINDOW);
    }

    /// The name and new count of the event `digest` if it is a repeat within the window.
    fn repeat(&mut self, digest: u64, now: Instant) -> Option<(String, i32)> {
        self.sweep(now);
        let p = self.entries.get_mut(&digest)?;
        if now.duration_since(p.at) >= SERIES_WINDOW {
            return None;
        }
        p.count += 1;
        p.at = now;
        Some((p.name.clone(), p.count))
    }

    fn remember(&mut self, digest: u64, name: String, now: Instant) {
        self.entries.insert(
            digest,
            Published {
                name,
                count: 1,
                at: now,
            },
        );
    }

    fn forget(&mut self, digest: u64) {
        self.entries.remove(&digest);
    }
}

/// Publishes Events as one reporting controller (`cairn-operator`, `cairn-agent`).
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    seen: Mutex<Seen>,
}

impl Events {
    /// `instance`: the operator's pod, if known (else the controller name).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Creates the event, or counts a repeat of it in the first one's series.
    pub async fn publish(&self, event: &Event<'_>) -> Result<(), kube::Error> {
        let namespace = event
            .regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let digest = event.digest();
        let now = Instant::now();
        let repeat = self
            .seen
            .lock()
            .map(|mut seen| seen.repeat(digest, now))
            .unwrap_or_default();
        if let Some((name, count)) = repeat {
            let series = json!({"series": {
                "count": count,
                "lastObservedTime": MicroTime(Timestamp::now()),
            }});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                .await
            {
                Ok(_) => return Ok(()),
                // Expired in the API server (Events live an hour by default): a new one.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let created = api
            .create(&PostParams::default(), &self.build(event, &namespace))
            .await;
        if let Ok(mut seen) = self.seen.lock() {
            match &created {
                Ok(e) => seen.remember(digest, e.metadata.name.clone().unwrap_or_default(), now),
                Err(_) => seen.forget(digest),
            }
        }
        created.map(|_| ())
    }

    fn build(&self, event: &Event<'_>, namespace: &str) -> K8sEvent {
        let now = Timestamp::now();
        let regarding = event.regarding.name.as_deref().unwrap_or(&self.controller);
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!("{regarding}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(event.action.to_string()),
            reason: Some(event.reason.to_string()),
            note: Some(event.note.to_string()),
            regarding: Some(event.regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if event.warning { "Warning" } else { "Normal" }.into()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_within_the_window_counts_into_the_series_and_expires_after_it() {
        let mut seen = Seen::default();
        let t0 = Instant::now();
        assert_eq!(seen.repeat(1, t0), None, "never published");
        seen.remember(1, "a.1".into(), t0);
        assert_eq!(
            seen.repeat(1, t0 + Duration::from_secs(10)),
            Some(("a.1".into(), 2))
        );
        assert_eq!(
            seen.repeat(1, t0 + Duration::from_secs(20)),
            Some(("a.1".into(), 3))
        );
        assert_eq!(seen.repeat(2, t0), None, "another event");
        let later = t0 + Duration::from_secs(20) + SERIES_WINDOW;
        assert_eq!(seen.repeat(1, later), None, "the window has passed");
        assert!(seen.entries.is_empty(), "and the sweep dropped it");
    }

    #[test]
    fn the_sweep_runs_at_most_once_a_minute() {
        let mut seen = Seen::default();
        let t0 = Instant::now();
        seen.remember(1, "a.1".into(), t0);
        seen.sweep(t0 + SERIES_WINDOW);
        assert!(seen.entries.is_empty(), "expired: swept");
        seen.remember(2, "b.1".into(), t0);
        seen.sweep(t0 + SERIES_WINDOW + Duration::from_secs(30));
        assert_eq!(seen.entries.len(), 1, "swept a moment ago: kept for now");
        seen.sweep(t0 + SERIES_WINDOW + SWEEP_EVERY);
        assert!(seen.entries.is_empty());
    }

    #[test]
    fn what_makes_an_event_the_same() {
        let r = ObjectReference {
            namespace: Some("ns".into()),
            name: Some("s".into()),
            uid: Some("u".into()),
            ..Default::default()
        };
        let e = |reason: &'static str, note: &'static str| Event {
            regarding: &r,
            warning: true,
            reason,
            note,
            action: "Reconcile",
        };
        assert_eq!(e("A", "x").digest(), e("A", "x").digest());
        assert_ne!(e("A", "x").digest(), e("B", "x").digest());
        assert_ne!(e("A", "x").digest(), e("A", "y").digest());
    }
}
