//! Prometheus metrics of the operator. Label sets are bounded: results are error labels,
//! phases are the five of the CRD, conditions and their reasons are the operator's own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use cairn_crds::{AgentSessionStatus, Phase};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or the error's label.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    /// The condition's type: `Ready`, `ArchiveReady`, ...
    pub condition: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The condition's reason, one of the operator's own (`ArchiveUnreachable`, ...).
    pub reason: String,
}

/// What the session gauges count of one session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counted {
    phase: Option<Phase>,
    conditions: Vec<ConditionLabels>,
}

impl Counted {
    fn of(status: &AgentSessionStatus) -> Self {
        Self {
            phase: status.phase,
            conditions: status
                .conditions
                .iter()
                .map(|c| ConditionLabels {
                    condition: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// HTTP method: GET (get, list, watch), POST, PUT, PATCH, DELETE.
    pub method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// HTTP method: POST, PUT, PATCH, DELETE.
    pub method: String,
    /// The resource written, with its subresource: `statefulsets`, `agentsessions/status`.
    pub resource: String,
}

#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    api_requests: Family<RequestLabels, Counter>,
    api_writes: Family<WriteLabels, Counter>,
    duration: Histogram,
    sessions: Family<PhaseLabels, Gauge>,
    conditions: Family<ConditionLabels, Gauge>,
    counted: Mutex<HashMap<String, Counted>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cairn_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        // 1 ms .. ~33 s
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let sessions = Family::<PhaseLabels, Gauge>::default();
        let conditions = Family::<ConditionLabels, Gauge>::default();
        let api_requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests sent to the Kubernetes API by HTTP method",
            api_requests.clone(),
        );
        let api_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "api_writes",
            "Writes sent to the Kubernetes API by HTTP method and resource",
            api_writes.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciles of AgentSessions by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one AgentSession reconcile",
            duration.clone(),
        );
        registry.register(
            "sessions",
            "Managed AgentSessions by phase",
            sessions.clone(),
        );
        registry.register(
            "session_conditions",
            "Managed AgentSessions by condition type, status and reason",
            conditions.clone(),
        );
        for phase in [
            Phase::Pending,
            Phase::Running,
            Phase::Suspended,
            Phase::Degraded,
            Phase::Failed,
        ] {
            sessions
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().into(),
                })
                .set(0);
        }
        Self {
            registry,
            reconciles,
            api_requests,
            api_writes,
            duration,
            sessions,
            conditions,
            counted: Mutex::new(HashMap::new()),
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Counts one request to the Kubernetes API.
    pub fn api_request(&self, method: &http::Method) {
        self.api_requests
            .get_or_create(&RequestLabels {
                method: method.as_str().to_string(),
            })
            .inc();
    }

    /// Counts one write (any method but GET) to `resource`.
    pub fn api_write(&self, method: &http::Method, resource: &str) {
        self.api_writes
            .get_or_create(&WriteLabels {
                method: method.as_str().to_string(),
                resource: resource.to_string(),
            })
            .inc();
    }

    /// Writes sent so far with `method` to `resource`.
    pub fn api_writes(&self, method: &http::Method, resource: &str) -> u64 {
        self.api_writes
            .get_or_create(&WriteLabels {
                method: method.as_str().to_string(),
                resource: resource.to_string(),
            })
            .get()
    }

    /// Requests sent so far with `method`.
    pub fn api_requests(&self, method: &http::Method) -> u64 {
        self.api_requests
            .get_or_create(&RequestLabels {
                method: method.as_str().to_string(),
            })
            .get()
    }

    /// Records the phase and conditions of a session (`None`: the session is gone).
    pub fn set_session(&self, key: &str, status: Option<&AgentSessionStatus>) {
        let now = status.map(Counted::of);
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        let before = match now.clone() {
            Some(c) => counted.insert(key.to_string(), c),
            None => counted.remove(key),
        };
        if before == now {
            return;
        }
        for (counts, step) in [(before, -1), (now, 1)] {
            let Some(c) = counts else { continue };
            if let Some(p) = c.phase {
                self.sessions
                    .get_or_create(&PhaseLabels {
                        phase: p.as_str().into(),
                    })
                    .inc_by(step);
            }
            for labels in &c.conditions {
                self.conditions.get_or_create(labels).inc_by(step);
            }
        }
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use super::*;

    fn status(phase: Phase, archive_ready: &str) -> AgentSessionStatus {
        let reason = match archive_ready {
            "True" => "ArchiveAnswered",
            "False" => "ArchiveUnreachable",
            _ => "ArchiveNotChecked",
        };
        AgentSessionStatus {
            phase: Some(phase),
            conditions: vec![Condition {
                type_: "ArchiveReady".into(),
                status: archive_ready.into(),
                reason: reason.into(),
                message: String::new(),
                observed_generation: None,
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            }],
            ..AgentSessionStatus::default()
        }
    }

    #[test]
    fn phase_and_condition_gauges_follow_sessions() {
        let m = Metrics::default();
        m.set_session("ns/a", Some(&status(Phase::Pending, "Unknown")));
        m.set_session("ns/b", Some(&status(Phase::Pending, "False")));
        m.set_session("ns/c", Some(&status(Phase::Running, "False")));
        m.set_session("ns/a", Some(&status(Phase::Running, "True")));
        m.set_session("ns/a", Some(&status(Phase::Running, "True")));
        m.set_session("ns/b", None);
        m.reconciled("ok", Duration::from_millis(3));
        let text = m.encode();
        assert!(
            text.contains("cairn_operator_sessions{phase=\"Running\"} 2"),
            "{text}"
        );
        for (status, reason, n) in [
            ("True", "ArchiveAnswered", 1),
            ("False", "ArchiveUnreachable", 1),
            ("Unknown", "ArchiveNotChecked", 0),
        ] {
            let line = format!(
                "cairn_operator_session_conditions{{condition=\"ArchiveReady\",status=\"{status}\",reason=\"{reason}\"}} {n}\n"
            );
            assert!(text.contains(&line), "{line}{text}");
        }
        assert!(
            text.contains("cairn_operator_sessions{phase=\"Pending\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("cairn_operator_reconciles_total{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("cairn_operator_reconcile_duration_seconds_count 1"),
            "{text}"
        );
    }
}
