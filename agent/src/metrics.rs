//! Prometheus metrics of one agent, rendered in the text exposition format.
//!
//! Label values come from the closed sets of stable labels (`Pass::label`,
//! `FailureClass::label`, ...), never from user input, so the series count stays bounded.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use crate::ccr::stats::ArchiveSnapshot;

/// Bucket bounds of the latency histograms, in seconds.
const SECONDS_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bucket bounds of the request-size histogram, in bytes.
const BYTES_BUCKETS: [f64; 10] = [1e3, 1e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6, 1e7];

type Labels = Vec<(&'static str, String)>;

#[derive(Default)]
struct Histogram {
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct Inner {
    counters: BTreeMap<(&'static str, Labels), f64>,
    gauges: BTreeMap<(&'static str, Labels), f64>,
    histograms: BTreeMap<(&'static str, Labels), Histogram>,
}

/// What each metric means, for `# HELP`.
const HELP: &[(&str, &str, &str)] = &[
    ("cairn_agent_turns_total", "counter", "Turns by outcome."),
    (
        "cairn_agent_tokens_total",
        "counter",
        "Tokens reported by the provider, by kind.",
    ),
    (
        "cairn_agent_model_tokens_total",
        "counter",
        "Tokens reported by the provider, by model and kind (input, output, cache_read, cache_write).",
    ),
    (
        "cairn_agent_cost_usd_total",
        "counter",
        "Cost of provider calls in USD by the model price table, by client and model.",
    ),
    (
        "cairn_agent_compactions_total",
        "counter",
        "Compactions by ladder level and trigger.",
    ),
    (
        "cairn_agent_memory_updates_total",
        "counter",
        "Background updates of the session memory by outcome (ok, failed, rejected, archive, head, window_too_small, queue_failed).",
    ),
    (
        "cairn_agent_memory_compactions_total",
        "counter",
        "Compactions that replaced history with the session memory, with no summarizer call.",
    ),
    (
        "cairn_agent_memory_queued_segments_total",
        "counter",
        "Segments compactions handed to the session memory's queue.",
    ),
    (
        "cairn_agent_memory_queue_segments",
        "gauge",
        "Segments waiting in the session memory's queue.",
    ),
    (
        "cairn_agent_memory_queue_messages",
        "gauge",
        "Messages in the segments waiting in the session memory's queue.",
    ),
    (
        "cairn_agent_recoveries_total",
        "counter",
        "Recovery attempts by failure class, attempt and outcome.",
    ),
    (
        "cairn_agent_headroom_warnings_total",
        "counter",
        "Turns whose context headroom fell to autoCompact.warningBufferTokens.",
    ),
    (
        "cairn_agent_notices_total",
        "counter",
        "Notices (compaction, recovery, learned cap, floor, warning) by kind.",
    ),
    (
        "cairn_agent_provider_errors_total",
        "counter",
        "Failed provider calls by error label and class.",
    ),
    (
        "cairn_agent_journal_writes_total",
        "counter",
        "Journal entries written, by outcome.",
    ),
    (
        "cairn_agent_provider_context_edits_total",
        "counter",
        "Replies whose provider applied its own context management (engine: provider), by kind.",
    ),
    (
        "cairn_agent_compression_total",
        "counter",
        "Tool results through compression, by strategy and outcome (compressed, unchanged).",
    ),
    (
        "cairn_agent_compression_bytes_total",
        "counter",
        "Bytes of tool results before (in) and after (out) compression, by strategy.",
    ),
    (
        "cairn_agent_recall_keys_total",
        "counter",
        "Keys of the model's recall calls, by outcome (found, missing).",
    ),
    (
        "cairn_agent_tool_calls_total",
        "counter",
        "Built-in tool calls by tool.",
    ),
    (
        "cairn_agent_truncated_replies_total",
        "counter",
        "Replies cut short that no escalation could fix, by reason (context_full, window_bound, output_limit).",
    ),
    (
        "cairn_agent_learned_context_window_tokens",
        "gauge",
        "Context window a model server named, when smaller than the configured one (0: none).",
    ),
    (
        "cairn_agent_bytes_per_token",
        "gauge",
        "Bytes per token of the session's content as the model server counts it.",
    ),
    (
        "cairn_agent_learned_payload_cap_bytes",
        "gauge",
        "Payload cap learned from a rejection (0: none).",
    ),
    (
        "cairn_agent_history_bytes",
        "gauge",
        "Weight of the current history.",
    ),
    (
        "cairn_agent_context_utilization",
        "gauge",
        "Estimated context tokens / context window.",
    ),
    (
        "cairn_agent_request_bytes",
        "histogram",
        "Exact size of every request sent to the provider.",
    ),
    (
        "cairn_agent_turn_seconds",
        "histogram",
        "Duration of a turn, provider calls included.",
    ),
    (
        "cairn_agent_provider_seconds",
        "histogram",
        "Duration of one provider call.",
    ),
    (
        "cairn_agent_overhead_seconds",
        "histogram",
        "Time of a turn spent outside provider calls.",
    ),
    (
        "cairn_agent_first_text_seconds",
        "histogram",
        "Time from a streamed request to its first text event.",
    ),
    (
        "cairn_agent_stream_abandoned_total",
        "counter",
        "Streamed output messages closed as incomplete (their model call failed).",
    ),
];

/// The registry.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

fn labels(l: &[(&'static str, &str)]) -> Labels {
    l.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn inc(&self, name: &'static str, l: &[(&'static str, &str)], by: f64) {
        if let Ok(mut i) = self.inner.lock() {
            *i.counters.entry((name, labels(l))).or_default() += by;
        }
    }

    pub fn set(&self, name: &'static str, l: &[(&'static str, &str)], v: f64) {
        if let Ok(mut i) = self.inner.lock() {
            i.gauges.insert((name, labels(l)), v);
        }
    }

    pub fn observe(&self, name: &'static str, l: &[(&'static str, &str)], v: f64) {
        let bounds: &[f64] = if name.ends_with("_bytes") {
            &BYTES_BUCKETS
        } else {
            &SECONDS_BUCKETS
        };
        if let Ok(mut i) = self.inner.lock() {
            let h = i.histograms.entry((name, labels(l))).or_default();
            if h.buckets.is_empty() {
                h.buckets = vec![0; bounds.len()];
            }
            for (b, bound) in h.buckets.iter_mut().zip(bounds) {
                if v <= *bound {
                    *b += 1;
                }
            }
            h.sum += v;
            h.count += 1;
        }
    }

    /// A counter's current value (tests and status).
    pub fn counter(&self, name: &str, l: &[(&'static str, &str)]) -> f64 {
        let want = labels(l);
        self.inner
            .lock()
            .ok()
            .and_then(|i| {
                i.counters
                    .iter()
                    .find(|((n, ls), _)| *n == name && *ls == want)
                    .map(|(_, v)| *v)
            })
            .unwrap_or(0.0)
    }

    /// The text exposition format, archive counters included.
    pub fn render(&self, archive: Option<ArchiveSnapshot>) -> String {
        let mut out = String::new();
        let Ok(i) = self.inner.lock() else {
            return out;
        };
        let fmt_labels = |ls: &Labels, extra: Option<(&str, String)>| {
            let mut parts: Vec<String> = ls
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            if let Some((k, v)) = extra {
                parts.push(format!("{k}=\"{v}\""));
            }
            if parts.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", parts.join(","))
            }
        };
        for (name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            match *kind {
                "counter" => {
                    for ((n, ls), v) in &i.counters {
                        if n == name {
                            let _ = writeln!(out, "{name}{} {v}", fmt_labels(ls, None));
                        }
                    }
                }
                "gauge" => {
                    for ((n, ls), v) in &i.gauges {
                        if n == name {
                            let _ = writeln!(out, "{name}{} {v}", fmt_labels(ls, None));
                        }
                    }
                }
                _ => {
                    let bounds: &[f64] = if name.ends_with("_bytes") {
                        &BYTES_BUCKETS
                    } else {
                        &SECONDS_BUCKETS
                    };
                    for ((n, ls), h) in &i.histograms {
                        if n != name {
                            continue;
                        }
                        for (b, bound) in h.buckets.iter().zip(bounds) {
                            let _ = writeln!(
                                out,
                                "{name}_bucket{} {b}",
                                fmt_labels(ls, Some(("le", bound.to_string())))
                            );
                        }
                        let _ = writeln!(
                            out,
                            "{name}_bucket{} {}",
                            fmt_labels(ls, Some(("le", "+Inf".into()))),
                            h.count
                        );
                        let _ = writeln!(out, "{name}_sum{} {}", fmt_labels(ls, None), h.sum);
                        let _ = writeln!(out, "{name}_count{} {}", fmt_labels(ls, None), h.count);
                    }
                }
            }
        }
        if let Some(a) = archive {
            for (name, help, v) in [
                (
                    "cairn_agent_archive_puts_total",
                    "Originals archived.",
                    a.puts,
                ),
                (
                    "cairn_agent_archive_bytes_total",
                    "Bytes of originals archived.",
                    a.bytes_in,
                ),
                (
                    "cairn_agent_archive_hits_total",
                    "Archive fetches that found their key.",
                    a.hits,
                ),
                (
                    "cairn_agent_archive_misses_total",
                    "Archive fetches of unknown keys.",
                    a.misses,
                ),
                (
                    "cairn_agent_archive_failures_total",
                    "Archives refused by an unreachable store.",
                    a.failures,
                ),
            ] {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
                );
            }
        }
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The engine's countable events as this registry's series.
impl cairn_engine::meter::Meter for Metrics {
    fn model_tokens(&self, model: &str, kind: &'static str, n: u64) {
        self.inc(
            "cairn_agent_model_tokens_total",
            &[("model", model), ("kind", kind)],
            n as f64,
        );
    }

    fn cost_usd(&self, client: &'static str, model: &str, usd: f64) {
        self.inc(
            "cairn_agent_cost_usd_total",
            &[("client", client), ("model", model)],
            usd,
        );
    }

    fn compression(&self, strategy: &'static str, bytes_in: usize, bytes_out: Option<usize>) {
        let outcome = if bytes_out.is_some() {
            "compressed"
        } else {
            "unchanged"
        };
        let out = bytes_out.unwrap_or(bytes_in);
        self.inc(
            "cairn_agent_compression_total",
            &[("strategy", strategy), ("outcome", outcome)],
            1.0,
        );
        self.inc(
            "cairn_agent_compression_bytes_total",
            &[("strategy", strategy), ("direction", "in")],
            bytes_in as f64,
        );
        self.inc(
            "cairn_agent_compression_bytes_total",
            &[("strategy", strategy), ("direction", "out")],
            out as f64,
        );
    }

    fn recall_keys(&self, found: usize, missing: usize) {
        self.inc(
            "cairn_agent_recall_keys_total",
            &[("outcome", "found")],
            found as f64,
        );
        self.inc(
            "cairn_agent_recall_keys_total",
            &[("outcome", "missing")],
            missing as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_histograms() {
        let m = Metrics::new();
        m.inc("cairn_agent_turns_total", &[("outcome", "ok")], 1.0);
        m.inc("cairn_agent_turns_total", &[("outcome", "ok")], 1.0);
        m.set("cairn_agent_history_bytes", &[], 42.0);
        m.observe("cairn_agent_request_bytes", &[], 2_000.0);
        let t = m.render(Some(ArchiveSnapshot::default()));
        assert!(
            t.contains("cairn_agent_turns_total{outcome=\"ok\"} 2"),
            "{t}"
        );
        assert!(t.contains("cairn_agent_history_bytes 42"));
        assert!(t.contains("cairn_agent_request_bytes_bucket{le=\"1000\"} 0"));
        assert!(t.contains("cairn_agent_request_bytes_bucket{le=\"10000\"} 1"));
        assert!(t.contains("cairn_agent_request_bytes_count 1"));
        assert!(t.contains("cairn_agent_archive_hits_total 0"));
        assert_eq!(
            m.counter("cairn_agent_turns_total", &[("outcome", "ok")]),
            2.0
        );
    }
}
