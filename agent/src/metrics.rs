//! Prometheus metrics of one agent: typed `prometheus-client` families, like the operator's
//! and the gateway's, rendered in the OpenMetrics text format.
//!
//! A label set is a struct, so a label name cannot be misspelt. Label values are either
//! small enums ([`Attempt`], [`CompressionOutcome`], [`Direction`], [`RecallOutcome`],
//! [`SummaryWriter`]) or the stable labels of closed sets (`FailureClass::label`,
//! `Client::label`, ...), never user input, so the series count stays bounded. The names
//! of the spec's models and MCP servers are the one exception, bounded by the spec.
//!
//! The exposed series names are a contract with dashboards: `tests/data/metrics-series.txt`
//! lists them and the tests hold this registry to it. Counters are registered without
//! `_total`, which the encoder appends (OpenMetrics names the family without it: `# TYPE
//! cairn_agent_turns counter` over `cairn_agent_turns_total{...}` samples). A family with no
//! series yet is left out of the exposition.

use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder, text};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::ccr::stats::ArchiveSnapshot;

/// The prefix of every series.
const PREFIX: &str = "cairn_agent";
/// Bucket bounds of the latency histograms, in seconds.
const SECONDS_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bucket bounds of the request-size histogram, in bytes.
const BYTES_BUCKETS: [f64; 10] = [1e3, 1e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6, 1e7];

/// Bucket bounds of the compaction score histogram (a share, 0 to 1).
const SCORE_BUCKETS: [f64; 7] = [0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0];

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}

/// A counter of fractional amounts (USD).
pub type FloatCounter = Counter<f64, AtomicU64>;
/// A gauge of a ratio.
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// A name the spec chose (a model, an MCP server), escaped for the exposition: the encoder
/// writes label values verbatim, and one quote would break the whole scrape.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct SpecName(pub String);

impl From<&str> for SpecName {
    fn from(name: &str) -> Self {
        Self(name.to_owned())
    }
}

impl EncodeLabelValue for SpecName {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Which attempt of the recovery ladder retried a call; `none` when recovery gave up.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Attempt {
    Nth(u32),
    None,
}

impl EncodeLabelValue for Attempt {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        match self {
            Self::Nth(n) => EncodeLabelValue::encode(n, encoder),
            Self::None => encoder.write_str("none"),
        }
    }
}

/// A label value of a closed set: an enum whose variants encode as the given strings.
macro_rules! label_value {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $label:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            pub fn label(self) -> &'static str {
                match self {
                    $(Self::$variant => $label),+
                }
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
                encoder.write_str(self.label())
            }
        }
    };
}

label_value!(CompressionOutcome {
    Compressed => "compressed",
    Unchanged => "unchanged",
});

label_value!(
    /// Bytes into a compression strategy, or out of it.
    Direction { In => "in", Out => "out" }
);

label_value!(RecallOutcome {
    Found => "found",
    Missing => "missing",
});

label_value!(
    /// Who wrote a summary asked of an MCP summarization engine: the engine, or the
    /// built-in summarizer it fell back to.
    SummaryWriter { Mcp => "mcp", Fallback => "fallback" }
);

label_value!(
    /// The summarization engine (only MCP engines are counted).
    SummaryEngine { Mcp => "mcp" }
);

/// `ok` or an error's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// input, output, cache_read, cache_write.
    pub kind: &'static str,
    /// `Client::label`: session, summarizer.
    pub client: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelTokenLabels {
    pub model: SpecName,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CostLabels {
    pub client: &'static str,
    pub model: SpecName,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CompactionLabels {
    /// The ladder level reached, 0 when none.
    pub level: u8,
    pub trigger: &'static str,
}

/// Artifacts a compaction put at stake, by category (`files`, `commands`, `errors`,
/// `requests`) and whether the compacted history still shows them (`in_sight`) or only its
/// markers reach them (`recallable`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ArtifactLabels {
    pub category: &'static str,
    pub state: &'static str,
    /// The pass that cut (`microcompact`, `idle_clear`, `dedup`, `mirror`, `admission`) or
    /// the ladder's highest level (`trim`, `summary`, `emergency`), or `recovery`.
    pub pass: &'static str,
}

/// How a level-2 summary ended: `accepted`, `rejected` (with the gate's reason), `failed`,
/// or `skipped` (level 2 backed off).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SummaryOutcomeLabels {
    pub outcome: &'static str,
    /// The quality gate's reason for a rejection (`missing_sections`, ...), else empty.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecoveryLabels {
    pub class: &'static str,
    pub attempt: Attempt,
    /// `retried` or the reason recovery gave up.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderErrorLabels {
    pub error: &'static str,
    pub class: &'static str,
    /// `Client::label`: session, summarizer.
    pub client: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CompressionLabels {
    pub strategy: &'static str,
    pub outcome: CompressionOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CompressionBytesLabels {
    pub strategy: &'static str,
    pub direction: Direction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecallLabels {
    pub outcome: RecallOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// A built-in tool's label, `mcp`, or `client` (a client's function tool, handed back).
    pub tool: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OfferLabels {
    /// How a tool was offered: `whole`, `short` or `deferred`.
    pub offer: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpCallLabels {
    pub server: SpecName,
    /// `ok`, `tool_error` or the failure's label.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpServerLabels {
    pub server: SpecName,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SummaryLabels {
    pub engine: SummaryEngine,
    pub writer: SummaryWriter,
}

/// The registry: one field per metric family, named after its series (prefix and `_total`
/// left out).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub turns: Family<OutcomeLabels, Counter>,
    pub tokens: Family<TokenLabels, Counter>,
    pub model_tokens: Family<ModelTokenLabels, Counter>,
    pub cost_usd: Family<CostLabels, FloatCounter>,
    pub compactions: Family<CompactionLabels, Counter>,
    pub compaction_score: Histogram,
    pub compactions_below_min_score: Counter,
    pub compaction_artifacts: Family<ArtifactLabels, Counter>,
    pub summaries: Family<SummaryOutcomeLabels, Counter>,
    pub memory_updates: Family<OutcomeLabels, Counter>,
    pub memory_compactions: Counter,
    pub memory_queued_segments: Counter,
    pub memory_queue_segments: Gauge,
    pub memory_queue_messages: Gauge,
    pub recoveries: Family<RecoveryLabels, Counter>,
    pub headroom_warnings: Counter,
    pub notices: Family<KindLabels, Counter>,
    pub provider_errors: Family<ProviderErrorLabels, Counter>,
    pub journal_writes: Family<OutcomeLabels, Counter>,
    pub provider_context_edits: Family<KindLabels, Counter>,
    pub compression: Family<CompressionLabels, Counter>,
    pub compression_bytes: Family<CompressionBytesLabels, Counter>,
    pub recall_keys: Family<RecallLabels, Counter>,
    pub tool_calls: Family<ToolLabels, Counter>,
    pub offered_tools: Family<OfferLabels, Gauge>,
    pub truncated_replies: Family<ReasonLabels, Counter>,
    pub learned_context_window_tokens: Gauge,
    pub bytes_per_token: FloatGauge,
    pub learned_payload_cap_bytes: Gauge,
    pub history_bytes: Gauge,
    pub context_utilization: FloatGauge,
    pub request_bytes: Histogram,
    pub turn_seconds: Histogram,
    pub provider_seconds: Histogram,
    pub overhead_seconds: Histogram,
    pub first_text_seconds: Histogram,
    pub stream_abandoned: Counter,
    pub mcp_calls: Family<McpCallLabels, Counter>,
    pub mcp_call_seconds: Family<McpServerLabels, Histogram>,
    pub engine_summaries: Family<SummaryLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix(PREFIX),
            turns: Family::default(),
            tokens: Family::default(),
            model_tokens: Family::default(),
            cost_usd: Family::default(),
            compactions: Family::default(),
            compaction_score: Histogram::new(SCORE_BUCKETS),
            compactions_below_min_score: Counter::default(),
            compaction_artifacts: Family::default(),
            summaries: Family::default(),
            memory_updates: Family::default(),
            memory_compactions: Counter::default(),
            memory_queued_segments: Counter::default(),
            memory_queue_segments: Gauge::default(),
            memory_queue_messages: Gauge::default(),
            recoveries: Family::default(),
            headroom_warnings: Counter::default(),
            notices: Family::default(),
            provider_errors: Family::default(),
            journal_writes: Family::default(),
            provider_context_edits: Family::default(),
            compression: Family::default(),
            compression_bytes: Family::default(),
            recall_keys: Family::default(),
            tool_calls: Family::default(),
            offered_tools: Family::default(),
            truncated_replies: Family::default(),
            learned_context_window_tokens: Gauge::default(),
            bytes_per_token: FloatGauge::default(),
            learned_payload_cap_bytes: Gauge::default(),
            history_bytes: Gauge::default(),
            context_utilization: FloatGauge::default(),
            request_bytes: Histogram::new(BYTES_BUCKETS),
            turn_seconds: seconds_histogram(),
            provider_seconds: seconds_histogram(),
            overhead_seconds: seconds_histogram(),
            first_text_seconds: seconds_histogram(),
            stream_abandoned: Counter::default(),
            mcp_calls: Family::default(),
            mcp_call_seconds: Family::new_with_constructor(seconds_histogram),
            engine_summaries: Family::default(),
        };
        // The encoder ends every HELP text with a period.
        let r = &mut m.registry;
        r.register("turns", "Turns by outcome", m.turns.clone());
        r.register(
            "tokens",
            "Tokens reported by the provider, by kind",
            m.tokens.clone(),
        );
        r.register(
            "model_tokens",
            "Tokens reported by the provider, by model and kind (input, output, cache_read, cache_write)",
            m.model_tokens.clone(),
        );
        r.register(
            "cost_usd",
            "Cost of provider calls in USD by the model price table, by client and model",
            m.cost_usd.clone(),
        );
        r.register(
            "compactions",
            "Compactions by ladder level and trigger (a recovery's cut: level 0, trigger recovery)",
            m.compactions.clone(),
        );
        r.register(
            "compaction_score",
            "Scores of compactions that replaced messages: the mean share, over files, commands, errors and requests, of what they replaced that the compacted history still shows",
            m.compaction_score.clone(),
        );
        r.register(
            "compactions_below_min_score",
            "Compactions whose best attempt stayed below the policy's compaction.quality.minScore",
            m.compactions_below_min_score.clone(),
        );
        r.register(
            "compaction_artifacts",
            "Artifacts compactions put at stake, by category and state (in_sight, or recallable through markers only)",
            m.compaction_artifacts.clone(),
        );
        r.register(
            "summaries",
            "Level-2 summaries by outcome (accepted, rejected with the quality gate's reason, failed, skipped while level 2 backs off)",
            m.summaries.clone(),
        );
        r.register(
            "memory_updates",
            "Background updates of the session memory by outcome (ok, failed, rejected, archive, head, window_too_small, queue_failed)",
            m.memory_updates.clone(),
        );
        r.register(
            "memory_compactions",
            "Compactions that replaced history with the session memory, with no summarizer call",
            m.memory_compactions.clone(),
        );
        r.register(
            "memory_queued_segments",
            "Segments compactions handed to the session memory's queue",
            m.memory_queued_segments.clone(),
        );
        r.register(
            "memory_queue_segments",
            "Segments waiting in the session memory's queue",
            m.memory_queue_segments.clone(),
        );
        r.register(
            "memory_queue_messages",
            "Messages in the segments waiting in the session memory's queue",
            m.memory_queue_messages.clone(),
        );
        r.register(
            "recoveries",
            "Recovery attempts by failure class, attempt and outcome",
            m.recoveries.clone(),
        );
        r.register(
            "headroom_warnings",
            "Turns whose context headroom fell to autoCompact.warningBufferTokens",
            m.headroom_warnings.clone(),
        );
        r.register(
            "notices",
            "Notices (compaction, recovery, learned cap, floor, warning) by kind",
            m.notices.clone(),
        );
        r.register(
            "provider_errors",
            "Failed provider calls by error label and class",
            m.provider_errors.clone(),
        );
        r.register(
            "journal_writes",
            "Journal entries written, by outcome",
            m.journal_writes.clone(),
        );
        r.register(
            "provider_context_edits",
            "Replies whose provider applied its own context management (engine: provider), by kind",
            m.provider_context_edits.clone(),
        );
        r.register(
            "compression",
            "Tool results through compression, by strategy and outcome (compressed, unchanged)",
            m.compression.clone(),
        );
        r.register(
            "compression_bytes",
            "Bytes of tool results before (in) and after (out) compression, by strategy",
            m.compression_bytes.clone(),
        );
        r.register(
            "recall_keys",
            "Keys of the model's recall calls, by outcome (found, missing)",
            m.recall_keys.clone(),
        );
        r.register(
            "tool_calls",
            "Tool calls by tool: a built-in tool's name, mcp, or client (handed back to the client to run)",
            m.tool_calls.clone(),
        );
        r.register(
            "offered_tools",
            "Tools of the catalog the latest request offered, by offer: whole, short (a shortened description) or deferred (behind tool_search)",
            m.offered_tools.clone(),
        );
        r.register(
            "truncated_replies",
            "Replies cut short that no escalation could fix, by reason (context_full, window_bound, output_limit)",
            m.truncated_replies.clone(),
        );
        r.register(
            "learned_context_window_tokens",
            "Context window a model server named, when smaller than the configured one (0: none)",
            m.learned_context_window_tokens.clone(),
        );
        r.register(
            "bytes_per_token",
            "Bytes per token of the session's content as the model server counts it",
            m.bytes_per_token.clone(),
        );
        r.register(
            "learned_payload_cap_bytes",
            "Payload cap learned from a rejection (0: none)",
            m.learned_payload_cap_bytes.clone(),
        );
        r.register(
            "history_bytes",
            "Weight of the current history",
            m.history_bytes.clone(),
        );
        r.register(
            "context_utilization",
            "Estimated context tokens / context window",
            m.context_utilization.clone(),
        );
        r.register(
            "request_bytes",
            "Exact size of every request sent to the provider",
            m.request_bytes.clone(),
        );
        r.register(
            "turn_seconds",
            "Duration of a turn, provider calls included",
            m.turn_seconds.clone(),
        );
        r.register(
            "provider_seconds",
            "Duration of one provider call",
            m.provider_seconds.clone(),
        );
        r.register(
            "overhead_seconds",
            "Time of a turn spent outside provider calls",
            m.overhead_seconds.clone(),
        );
        r.register(
            "first_text_seconds",
            "Time from a streamed request to its first text event",
            m.first_text_seconds.clone(),
        );
        r.register(
            "stream_abandoned",
            "Streamed output messages closed as incomplete (their model call failed)",
            m.stream_abandoned.clone(),
        );
        r.register(
            "mcp_calls",
            "Calls of MCP tools by server and outcome",
            m.mcp_calls.clone(),
        );
        r.register(
            "mcp_call_seconds",
            "Duration of one call of an MCP tool, by server",
            m.mcp_call_seconds.clone(),
        );
        r.register(
            "engine_summaries",
            "Summaries asked of an MCP summarization engine, by who wrote them (mcp, fallback)",
            m.engine_summaries.clone(),
        );
        // Alerts watch `increase(...{reason="context_full"}[30m])`: every reason's series
        // exists from the start at 0, so the first truncation shows as an increase.
        for reason in cairn_engine::turn::Truncation::ALL.map(|t| t.label()) {
            let _created = m.truncated_replies.get_or_create(&ReasonLabels { reason });
        }
        m
    }
}

/// A count as a gauge value.
pub fn gauge_value(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// The score of a compaction or of a pass that cut: the histogram, and its artifacts by
    /// category, state and pass.
    pub fn compaction_scored(
        &self,
        score: &cairn_crds::session::CompactionScore,
        pass: &'static str,
    ) {
        self.compaction_score.observe(score.score);
        for (category, c) in score.categories() {
            for (state, n) in [
                ("in_sight", c.in_sight),
                ("recallable", c.at_stake.saturating_sub(c.in_sight)),
            ] {
                if n > 0 {
                    self.compaction_artifacts
                        .get_or_create(&ArtifactLabels {
                            category,
                            state,
                            pass,
                        })
                        .inc_by(n);
                }
            }
        }
    }

    /// The OpenMetrics text exposition, the archive's counters included.
    pub fn render(&self, archive: Option<ArchiveSnapshot>) -> String {
        let mut out = String::new();
        let mut encoded = text::encode_registry(&mut out, &self.registry);
        if let Some(a) = archive {
            encoded = encoded.and_then(|()| text::encode_registry(&mut out, &archive_registry(a)));
        }
        if encoded.and_then(|()| text::encode_eof(&mut out)).is_err() {
            out.clear();
        }
        out
    }
}

/// The archive's counters, kept by the archive itself: a registry of constants per scrape.
fn archive_registry(a: ArchiveSnapshot) -> Registry {
    let mut r = Registry::with_prefix(PREFIX);
    for (name, help, v) in [
        ("archive_puts", "Originals archived", a.puts),
        ("archive_bytes", "Bytes of originals archived", a.bytes_in),
        (
            "archive_hits",
            "Archive fetches that found their key",
            a.hits,
        ),
        (
            "archive_misses",
            "Archive fetches of unknown keys",
            a.misses,
        ),
        (
            "archive_failures",
            "Archives refused by an unreachable store",
            a.failures,
        ),
    ] {
        r.register(name, help, ConstCounter::new(v));
    }
    r
}

/// The families an exposition declares, one `name type` line each, named as their series
/// are: a counter family `x` exposes `x_total` (OpenMetrics names the family without the
/// suffix). The form of `tests/data/metrics-series.txt`.
pub fn exposed_families(exposition: &str) -> Vec<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            Some(match kind {
                "counter" => format!("{name}_total {kind}"),
                _ => format!("{name} {kind}"),
            })
        })
        .collect()
}

/// The engine's countable events as this registry's series.
impl cairn_engine::meter::Meter for Metrics {
    fn model_tokens(&self, model: &str, kind: &'static str, n: u64) {
        self.model_tokens
            .get_or_create(&ModelTokenLabels {
                model: model.into(),
                kind,
            })
            .inc_by(n);
    }

    fn cost_usd(&self, client: &'static str, model: &str, usd: f64) {
        self.cost_usd
            .get_or_create(&CostLabels {
                client,
                model: model.into(),
            })
            .inc_by(usd);
    }

    fn compression(&self, strategy: &'static str, bytes_in: usize, bytes_out: Option<usize>) {
        let outcome = if bytes_out.is_some() {
            CompressionOutcome::Compressed
        } else {
            CompressionOutcome::Unchanged
        };
        let out = bytes_out.unwrap_or(bytes_in);
        self.compression
            .get_or_create(&CompressionLabels { strategy, outcome })
            .inc();
        for (direction, n) in [(Direction::In, bytes_in), (Direction::Out, out)] {
            self.compression_bytes
                .get_or_create(&CompressionBytesLabels {
                    strategy,
                    direction,
                })
                .inc_by(n as u64);
        }
    }

    fn recall_keys(&self, found: usize, missing: usize) {
        for (outcome, n) in [
            (RecallOutcome::Found, found),
            (RecallOutcome::Missing, missing),
        ] {
            self.recall_keys
                .get_or_create(&RecallLabels { outcome })
                .inc_by(n as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use cairn_engine::meter::Meter;

    use super::*;

    /// The series names dashboards read, checked in.
    const SERIES: &str = include_str!("../tests/data/metrics-series.txt");

    fn listed() -> Vec<&'static str> {
        SERIES
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }

    /// One sample in every family.
    fn one_of_each(m: &Metrics) {
        m.turns
            .get_or_create(&OutcomeLabels { outcome: "ok" })
            .inc();
        m.tokens
            .get_or_create(&TokenLabels {
                kind: "input",
                client: "session",
            })
            .inc_by(3);
        m.model_tokens("claude-haiku-4-5", "output", 2);
        m.cost_usd("session", "claude-haiku-4-5", 0.25);
        m.compactions
            .get_or_create(&CompactionLabels {
                level: 2,
                trigger: "auto",
            })
            .inc();
        m.compaction_score.observe(0.8);
        m.compactions_below_min_score.inc();
        m.compaction_artifacts
            .get_or_create(&ArtifactLabels {
                category: "files",
                state: "in_sight",
                pass: "summary",
            })
            .inc();
        m.summaries
            .get_or_create(&SummaryOutcomeLabels {
                outcome: "rejected",
                reason: "missing_sections",
            })
            .inc();
        m.memory_updates
            .get_or_create(&OutcomeLabels { outcome: "ok" })
            .inc();
        m.memory_compactions.inc();
        m.memory_queued_segments.inc();
        m.memory_queue_segments.set(1);
        m.memory_queue_messages.set(4);
        m.recoveries
            .get_or_create(&RecoveryLabels {
                class: "suspected_payload",
                attempt: Attempt::Nth(1),
                outcome: "retried",
            })
            .inc();
        m.headroom_warnings.inc();
        m.notices
            .get_or_create(&KindLabels { kind: "warning" })
            .inc();
        m.provider_errors
            .get_or_create(&ProviderErrorLabels {
                error: "http_5xx",
                class: "transient",
                client: "session",
            })
            .inc();
        m.journal_writes
            .get_or_create(&OutcomeLabels { outcome: "ok" })
            .inc();
        m.provider_context_edits
            .get_or_create(&KindLabels { kind: "compaction" })
            .inc();
        m.compression("json", 100, Some(40));
        m.recall_keys(1, 0);
        m.tool_calls
            .get_or_create(&ToolLabels { tool: "recall" })
            .inc();
        m.truncated_replies
            .get_or_create(&ReasonLabels {
                reason: "output_limit",
            })
            .inc();
        m.offered_tools
            .get_or_create(&OfferLabels { offer: "deferred" })
            .set(3);
        m.learned_context_window_tokens.set(32_768);
        m.bytes_per_token.set(3.5);
        m.learned_payload_cap_bytes.set(1_000_000);
        m.history_bytes.set(42);
        m.context_utilization.set(0.5);
        m.request_bytes.observe(2_000.0);
        m.turn_seconds.observe(0.2);
        m.provider_seconds.observe(0.1);
        m.overhead_seconds.observe(0.01);
        m.first_text_seconds.observe(0.05);
        m.stream_abandoned.inc();
        m.mcp_calls
            .get_or_create(&McpCallLabels {
                server: "docs".into(),
                outcome: "ok",
            })
            .inc();
        m.mcp_call_seconds
            .get_or_create(&McpServerLabels {
                server: "docs".into(),
            })
            .observe(0.3);
        m.engine_summaries
            .get_or_create(&SummaryLabels {
                engine: SummaryEngine::Mcp,
                writer: SummaryWriter::Fallback,
            })
            .inc();
    }

    /// The metric name of a sample line.
    fn sample_name(line: &str) -> &str {
        line.split(['{', ' ']).next().unwrap_or_default()
    }

    #[test]
    fn exposes_the_listed_series_and_no_other() {
        let m = Metrics::new();
        one_of_each(&m);
        let text = m.render(Some(ArchiveSnapshot::default()));
        assert_eq!(exposed_families(&text), listed(), "{text}");
        // Every sample belongs to a listed family, under the name the list gives it.
        let mut allowed = Vec::new();
        for l in listed() {
            let (name, kind) = l.split_once(' ').expect("name type");
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    allowed.push(format!("{name}{suffix}"));
                }
            } else {
                allowed.push(name.to_owned());
            }
        }
        let samples: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(sample_name)
            .collect();
        for s in &samples {
            assert!(allowed.iter().any(|a| a == s), "{s} is not listed");
        }
        // ... and every family has one.
        for a in allowed.iter().filter(|a| !a.ends_with("_bucket")) {
            assert!(samples.contains(&a.as_str()), "no sample of {a}\n{text}");
        }
    }

    #[test]
    fn renders_counters_gauges_histograms() {
        let m = Metrics::new();
        let ok = OutcomeLabels { outcome: "ok" };
        m.turns.get_or_create(&ok).inc();
        m.turns.get_or_create(&ok).inc();
        m.history_bytes.set(42);
        m.request_bytes.observe(2_000.0);
        m.cost_usd("session", "m\"x", 0.5);
        m.recoveries
            .get_or_create(&RecoveryLabels {
                class: "overflow",
                attempt: Attempt::None,
                outcome: "exhausted",
            })
            .inc();
        let t = m.render(Some(ArchiveSnapshot::default()));
        assert!(
            t.contains("# HELP cairn_agent_turns Turns by outcome.\n"),
            "{t}"
        );
        assert!(
            t.contains("cairn_agent_turns_total{outcome=\"ok\"} 2\n"),
            "{t}"
        );
        assert!(t.contains("cairn_agent_history_bytes 42\n"), "{t}");
        assert!(t.contains("cairn_agent_request_bytes_bucket{le=\"1000.0\"} 0\n"));
        assert!(t.contains("cairn_agent_request_bytes_bucket{le=\"10000.0\"} 1\n"));
        assert!(t.contains("cairn_agent_request_bytes_bucket{le=\"+Inf\"} 1\n"));
        assert!(t.contains("cairn_agent_request_bytes_count 1\n"));
        assert!(t.contains("cairn_agent_turn_seconds_bucket{le=\"30.0\"} 0\n"));
        assert!(
            t.contains("cairn_agent_cost_usd_total{client=\"session\",model=\"m\\\"x\"} 0.5\n"),
            "{t}"
        );
        assert!(t.contains("attempt=\"none\""), "{t}");
        assert!(t.contains("cairn_agent_archive_hits_total 0\n"));
        assert!(t.ends_with("# EOF\n"));
        assert_eq!(m.turns.get(&ok).map(|c| c.get()), Some(2));
        assert!(!m.render(None).contains("archive"));
    }
}
