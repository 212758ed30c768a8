//! Prometheus metrics of the operator. Label sets are bounded: results are error labels,
//! phases are the five of the CRD.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use cairn_crds::Phase;

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
    phases: Mutex<HashMap<String, Phase>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cairn_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        // 1 ms .. ~33 s
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let sessions = Family::<PhaseLabels, Gauge>::default();
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
            phases: Mutex::new(HashMap::new()),
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

    /// Records the phase of a session (`None`: the session is gone).
    pub fn set_phase(&self, key: &str, phase: Option<Phase>) {
        let mut phases = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        let before = match phase {
            Some(p) => phases.insert(key.to_string(), p),
            None => phases.remove(key),
        };
        if before == phase {
            return;
        }
        if let Some(p) = before {
            self.sessions
                .get_or_create(&PhaseLabels {
                    phase: p.as_str().into(),
                })
                .dec();
        }
        if let Some(p) = phase {
            self.sessions
                .get_or_create(&PhaseLabels {
                    phase: p.as_str().into(),
                })
                .inc();
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
    use super::*;

    #[test]
    fn phase_gauge_follows_sessions() {
        let m = Metrics::default();
        m.set_phase("ns/a", Some(Phase::Pending));
        m.set_phase("ns/b", Some(Phase::Pending));
        m.set_phase("ns/a", Some(Phase::Running));
        m.set_phase("ns/a", Some(Phase::Running));
        m.set_phase("ns/b", None);
        m.reconciled("ok", Duration::from_millis(3));
        let text = m.encode();
        assert!(
            text.contains("cairn_operator_sessions{phase=\"Running\"} 1"),
            "{text}"
        );
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
