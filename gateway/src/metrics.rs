//! Prometheus metrics of the gateway. Label sets are bounded: routes are a fixed list, codes
//! are HTTP statuses, reasons are the gateway's own error codes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// Every wake-up outcome. Each series exists from the start at 0, so an alert on
/// `increase(...{outcome="timeout"}[15m])` sees the first timeout (a series born at 1 has no
/// increase).
pub const WAKE_OUTCOMES: [&str; 3] = ["requested", "ready", "timeout"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `requested` (annotation written), `ready` (forwarded after the wait), `timeout`.
    pub outcome: &'static str,
}

/// Which API a request is for (a bounded label).
pub fn route_of(rest: &str) -> &'static str {
    if rest.starts_with("chat/completions") {
        "chat_completions"
    } else if rest.starts_with("responses") {
        "responses"
    } else if rest.starts_with("session") {
        "session"
    } else {
        "other"
    }
}

#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    wakeups: Family<OutcomeLabels, Counter>,
    denials: Family<ReasonLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cairn_gateway");
        let requests = Family::<RequestLabels, Counter>::default();
        // 0.5 ms .. ~260 s
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 20))
        });
        let wakeups = Family::<OutcomeLabels, Counter>::default();
        for outcome in WAKE_OUTCOMES {
            let _created = wakeups.get_or_create(&OutcomeLabels { outcome });
        }
        let denials = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests by route and HTTP status",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its response headers, by route",
            latency.clone(),
        );
        registry.register(
            "wakeups",
            "Wake-ups of idle-suspended sessions by outcome",
            wakeups.clone(),
        );
        registry.register(
            "denials",
            "Requests refused with 401 or 403, by reason",
            denials.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            wakeups,
            denials,
        }
    }
}

impl Metrics {
    pub fn request(&self, route: &'static str, code: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels { route, code })
            .inc();
        self.latency
            .get_or_create(&RouteLabels { route })
            .observe(seconds);
    }

    pub fn denial(&self, reason: &'static str) {
        self.denials.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn wakeup(&self, outcome: &'static str) {
        self.wakeups.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
