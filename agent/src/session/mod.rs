//! One session: its history, what it learned, its journal, and the turn loop
//! ([`Session::turn`], in `turn`).
//!
//! The in-memory history only ever moves forward from what the journal holds: every change
//! is persisted as one journal entry before the turn (or compaction, or rewind) that made it
//! is acknowledged, and a failure takes the in-memory history back to the journal's. A write
//! whose outcome stayed unknown is settled before the next operation starts, and the history
//! then becomes whatever the journal turned out to hold: what a restart would rebuild.

mod memory_updates;
mod next_request;
pub(crate) mod summarizer;
pub mod tools;
mod tracked;
mod turn;
mod validity;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cairn_crds::session::{
    ArchiveCheck, CompactionScore, HeadroomReport, LastRecovery, SessionStats, TokenStats,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::ccr::Store;
use crate::ccr::stats::{ArchiveCounters, CompressionCounters};
use crate::compact::ladder::LadderContext;
use crate::compact::window::{Buffers, Headroom};
use crate::compact::{
    BudgetInputs, CompactionOutcome, SessionState, SummaryVerdict, Trigger, compact,
};
use crate::compress;
use crate::config::Live;
use crate::history::{self, Message};
use crate::journal::{
    Change, CompactionRecord, Journal, JournalError, ObjectStore, PersistedState, Undo,
};
use crate::mcp::summarizer::McpSummarizer;
use crate::mcp::{McpCatalog, McpHub};
use crate::metrics::{
    CompactionLabels, Metrics, OutcomeLabels, SummaryEngine, SummaryLabels, SummaryOutcomeLabels,
    SummaryWriter, TokenLabels, gauge_value,
};
use crate::provider::deadline::Deadlined;
use crate::provider::{Provider, Usage};
use crate::replay::Ledger;

pub use next_request::{ContextReport, InspectOptions};
pub use summarizer::ProviderSummarizer;
pub use turn::{LedgerTurn, McpSelection, Notice, TurnEvent, TurnEvents, TurnOptions, TurnOutcome};
pub use validity::InvalidRequest;

/// Why a turn (or a compaction, or a rewind) failed. The history is as before it.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("bad input: {0}")]
    BadInput(#[from] InvalidRequest),
    #[error("the provider failed ({class}): {message}")]
    Provider {
        class: &'static str,
        message: String,
        /// What the provider's last answer said, for the API's error class.
        answer: ProviderAnswer,
    },
    #[error("{0}")]
    Floor(String),
    #[error("the turn was not persisted, history unchanged: {0}")]
    Journal(JournalError),
    /// The journal may hold the change: see the message (the outcome is settled before the
    /// next write, and the history then follows the journal).
    #[error("{0}")]
    Unsettled(JournalError),
    #[error("{0}")]
    Fenced(JournalError),
    #[error("nothing to rewind: no compaction left to undo")]
    NothingToRewind,
    /// The turn ran past `timeouts.turnSeconds`.
    #[error("{0}")]
    Deadline(String),
    /// The request would not fit the window and compaction could not make room.
    #[error("{0}")]
    ContextFull(String),
    /// The agent is stopping: the turn was aborted before its grace period ran out.
    #[error(
        "the agent is shutting down: the turn was aborted before it finished; it was not persisted and its input was dropped"
    )]
    ShuttingDown,
    /// The session's cost reached spec.budget.maxCostUSD and the policy suspends it.
    #[error("{0}")]
    BudgetExceeded(String),
}

/// The facts of a provider's failed answer that an API client is told about: its status,
/// the delay it asked for (`Retry-After`), and whether a 429 was an exhausted quota rather
/// than a rate limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProviderAnswer {
    pub status: Option<u16>,
    pub retry_after: Option<Duration>,
    pub quota_exhausted: bool,
}

impl ProviderAnswer {
    pub fn of(err: &crate::provider::ProviderError) -> Self {
        Self {
            status: err.status,
            retry_after: err.retry_after,
            quota_exhausted: err
                .status
                .is_some_and(|s| crate::provider::retry::is_quota_exhausted(s, &err.body)),
        }
    }
}

impl TurnError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::BadInput(_) => "bad_input",
            Self::Provider { .. } => "provider",
            Self::Floor(_) => "floor",
            Self::Journal(_) => "journal",
            Self::Unsettled(_) => "journal_unknown",
            Self::Fenced(_) => "fenced",
            Self::NothingToRewind => "nothing_to_rewind",
            Self::Deadline(_) => "deadline",
            Self::ContextFull(_) => "context_full",
            Self::ShuttingDown => "shutting_down",
            Self::BudgetExceeded(_) => "budget_exceeded",
        }
    }
}

impl From<JournalError> for TurnError {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Fenced { .. } => Self::Fenced(e),
            e if e.outcome_unknown() => Self::Unsettled(e),
            e => Self::Journal(e),
        }
    }
}

/// What a session is built from.
pub struct SessionParts {
    pub namespace: String,
    pub name: String,
    /// Who writes the journal (pod name or host and pid).
    pub holder: String,
    pub live: watch::Receiver<Arc<Live>>,
    pub provider: Arc<dyn Provider>,
    /// The summarizer's own client ([`crate::provider::summarizer_provider`]), used when
    /// the policy gives the summarizer another endpoint than the session's.
    pub summarizer_provider: Option<Arc<dyn Provider>>,
    pub store: Arc<dyn Store>,
    pub journal: Arc<dyn ObjectStore>,
    pub archive_counters: Arc<ArchiveCounters>,
    pub metrics: Arc<Metrics>,
    /// Trust and proxies of the MCP servers reached over HTTP.
    pub net: crate::net::NetPath,
}

/// One agent session.
pub struct Session {
    pub namespace: String,
    pub name: String,
    history: tracked::Tracked,
    state: SessionState,
    live: Arc<Live>,
    live_rx: watch::Receiver<Arc<Live>>,
    provider: Arc<dyn Provider>,
    summarizer_provider: Option<Arc<dyn Provider>>,
    store: Arc<dyn Store>,
    journal: Journal,
    archive_counters: Arc<ArchiveCounters>,
    compression_counters: CompressionCounters,
    /// Tool calls since the agent started (`status.session.toolCalls`).
    tool_call_counts: cairn_crds::session::ToolCallStats,
    metrics: Arc<Metrics>,
    /// The session's Events (`Compacted`, `Recovered`, `RecoveryFailed`); none outside a
    /// cluster.
    events: crate::events::EventSink,
    turns: u64,
    tokens: Usage,
    /// Tokens of the level-2 summarizer's calls since the agent started, counted apart.
    summarizer_tokens: Usage,
    /// Cache writes and cost of the session's and the summarizer's calls.
    accounting: crate::cost::Accounting,
    /// When the last reply was journaled: the idle rule's clock (journaled with it).
    last_reply_at: Option<SystemTime>,
    last_recovery: Option<LastRecovery>,
    /// History length before the input of the turn that failed last, until the write it
    /// left unsettled is settled (see [`Session::follow_journal`]).
    failed_turn: Option<usize>,
    /// The ledger before the input of that turn.
    failed_ledger: Ledger,
    /// Fired at shutdown: a turn in flight stops (see [`Session::abort_handle`]).
    abort: CancellationToken,
    /// The session state changed without a history change (a reset learned cap): the next
    /// commit writes an entry even if nothing else changed.
    state_dirty: bool,
    /// Notices of changes made between turns, given with the next turn's.
    pending_notices: Vec<(&'static str, String)>,
    /// The latest archive check, for `status.session` (written by whoever runs the checks,
    /// also while a turn holds the session).
    archive_check: Arc<std::sync::RwLock<Option<ArchiveCheck>>>,
    /// The items the API clients see, journaled with the state (`crate::replay`).
    ledger: Ledger,
    /// The client's part of the turn in progress (its tools, instructions, controls).
    options: TurnOptions,
    /// The client's part of the latest turn (without its ledger items): the context
    /// inspector assumes the next turn brings the same tools, instructions and controls.
    last_options: TurnOptions,
    /// What the cheap passes did over the session's life.
    passes: PassCounters,
    /// The MCP tool servers of the spec (connected on first use).
    mcp: Arc<McpHub>,
    net: crate::net::NetPath,
    /// The MCP tools of the turn in progress (offered or deferred), and where their calls
    /// go.
    mcp_catalog: McpCatalog,
    /// How the latest request offered each tool of the catalog
    /// ([`cairn_engine::offer::plan`]); empty before the first.
    tool_plan: cairn_engine::offer::Plan,
    /// Tools called or found lately, most recent first: the last to give way.
    recent_tools: Vec<String>,
    /// The session memory and its queue (`compaction.memory`), once enabled.
    memory: Option<Arc<crate::memory::SessionMemory>>,
    /// Its update in progress.
    memory_task: Option<memory_updates::UpdateTask>,
}

/// Messages the cheap passes changed over the session's life (`status.session.passes`,
/// journaled with the session state).
pub type PassCounters = cairn_crds::session::PassStats;

impl Session {
    /// Claims the journal (fencing any earlier writer) and rebuilds the history from it.
    pub async fn open(parts: SessionParts) -> Result<Self, JournalError> {
        let (journal, rebuilt) =
            Journal::open_archiving(parts.journal, parts.holder, Arc::clone(&parts.store)).await?;
        let mut state = SessionState::new();
        rebuilt.state.restore_into(&mut state);
        let mut live_rx = parts.live;
        let live = live_rx.borrow_and_update().clone();
        if state.rebase_window(&window_basis(&live)) {
            tracing::info!(
                "the learned context window belonged to another model or configured window; forgotten"
            );
        }
        let mut pending_notices = Vec::new();
        if let Some(old) = state.rebase_payload_cap(live.payload_cap) {
            tracing::info!(
                learned = old,
                "spec.payloadCap changed while the agent was down; learned payload cap reset"
            );
            pending_notices.push(cap_reset_notice(old));
        }
        let state_dirty = !pending_notices.is_empty();
        warn_unsupported(&live, None);
        let mcp = Arc::new(McpHub::new(live.spec.mcp_servers(), None, &parts.net));
        // Every provider call of the session (replies and summaries) has a total deadline.
        let deadlined = |p: Arc<dyn Provider>| -> Arc<dyn Provider> {
            let policy_rx = live_rx.clone();
            Arc::new(Deadlined::new(
                p,
                Box::new(move || {
                    Duration::from_secs(u64::from(
                        policy_rx.borrow().policy.timeouts.provider_call_seconds,
                    ))
                }),
            ))
        };
        let provider = deadlined(parts.provider);
        let summarizer_provider = parts.summarizer_provider.map(deadlined);
        let mut s = Self {
            namespace: parts.namespace,
            name: parts.name,
            history: tracked::Tracked::new(rebuilt.history),
            state,
            live,
            live_rx,
            provider,
            summarizer_provider,
            store: parts.store,
            journal,
            archive_counters: parts.archive_counters,
            compression_counters: CompressionCounters::with_metrics(parts.metrics.clone()),
            tool_call_counts: Default::default(),
            metrics: parts.metrics,
            events: crate::events::EventSink::none(),
            turns: rebuilt.state.turns,
            tokens: Usage {
                input_tokens: rebuilt.state.input_tokens,
                output_tokens: rebuilt.state.output_tokens,
                cache_read_tokens: rebuilt.state.cache_read_tokens,
                cache_write_tokens: rebuilt.state.accounting.cache_write_tokens[0],
            },
            summarizer_tokens: Usage {
                input_tokens: rebuilt.state.summarizer_tokens[0],
                output_tokens: rebuilt.state.summarizer_tokens[1],
                cache_read_tokens: rebuilt.state.summarizer_tokens[2],
                cache_write_tokens: rebuilt.state.accounting.cache_write_tokens[1],
            },
            accounting: rebuilt.state.accounting.clone(),
            // The idle clock survives the restart (and an idle suspend): the first turn after
            // it knows how long the provider's cache has been cold.
            last_reply_at: rebuilt
                .state
                .last_reply_ms
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
            last_recovery: None,
            failed_turn: None,
            failed_ledger: Ledger::default(),
            abort: CancellationToken::new(),
            state_dirty,
            pending_notices,
            archive_check: Arc::default(),
            ledger: rebuilt.state.replay.clone(),
            options: TurnOptions::default(),
            last_options: TurnOptions::default(),
            passes: rebuilt.state.passes,
            mcp,
            net: parts.net,
            mcp_catalog: McpCatalog::default(),
            tool_plan: cairn_engine::offer::Plan::default(),
            recent_tools: Vec::new(),
            memory: None,
            memory_task: None,
        };
        // A restarted agent absorbs what its predecessor queued, right away.
        s.ensure_memory().await;
        s.maybe_update_memory();
        s.publish_gauges();
        Ok(s)
    }

    /// The conversation as the API clients see it (what a replayed input is matched with).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn history(&self) -> &[Message] {
        &self.history
    }

    pub fn state(&self) -> &SessionState {
        &self.state
    }

    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }

    pub fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live)
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn archive_counters(&self) -> &Arc<ArchiveCounters> {
        &self.archive_counters
    }

    /// The journal's object store (the session's other small named objects, such as its
    /// stored Response objects, sit beside the entries under their own prefix).
    pub fn journal_objects(&self) -> Arc<dyn crate::journal::ObjectStore> {
        Arc::clone(self.journal.objects())
    }

    pub fn journal_epoch(&self) -> u64 {
        self.journal.epoch()
    }

    /// False while a journal write's outcome is unknown or unconfirmed: the history is then
    /// what the journal is known to hold, and the next operation settles it first.
    pub fn journal_settled(&self) -> bool {
        self.journal.settled()
    }

    /// Set once another agent took this session over: it must not run turns any more.
    pub fn fenced(&self) -> Option<String> {
        self.journal.fenced().map(ToString::to_string)
    }

    /// Cancels the turn in flight (and refuses later ones) when fired: `serve` fires it
    /// before the pod's grace period ends.
    pub fn abort_handle(&self) -> CancellationToken {
        self.abort.clone()
    }

    /// Where the latest archive check is kept; its content is reported in `status.session`.
    pub fn archive_check_slot(&self) -> Arc<std::sync::RwLock<Option<ArchiveCheck>>> {
        Arc::clone(&self.archive_check)
    }

    /// Picks up a changed policy or spec; called at the start of every turn.
    fn refresh_live(&mut self) {
        if self.live_rx.has_changed().unwrap_or(false) {
            let next = self.live_rx.borrow_and_update().clone();
            if next.policy_hash != self.live.policy_hash {
                tracing::info!(from = %self.live.policy_hash, to = %next.policy_hash, "effective policy changed");
            }
            if self.state.rebase_window(&window_basis(&next)) {
                tracing::info!(
                    "the model or the configured context window changed; the learned window is forgotten"
                );
            }
            // A cap learned under the old setting may have been an artefact of the old
            // network path; the platform team's new number is the evidence now.
            warn_unsupported(&next, Some(&self.live));
            // Changed servers are connected anew; unchanged ones keep their connection.
            if next.spec.tools != self.live.spec.tools {
                tracing::info!("spec.tools changed; MCP servers are reconnected on next use");
                self.mcp = Arc::new(McpHub::new(next.spec.mcp_servers(), None, &self.net));
            }
            if let Some(old) = self.state.rebase_payload_cap(next.payload_cap) {
                self.state_dirty = true;
                tracing::info!(learned = old, "learned payload cap reset");
                self.pending_notices.push(cap_reset_notice(old));
            }
            self.live = next;
        }
    }

    fn forget_payload_cap(&mut self) -> Option<u64> {
        let old = self.state.learned_payload_cap.take()?;
        // The guidance told the model about the old cap; a new rejection adds it again.
        self.state.payload_notice_injected = false;
        self.state_dirty = true;
        tracing::info!(learned = old, "learned payload cap reset");
        Some(old)
    }

    /// `POST /v1/session/reset-payload-cap` and `cairn-agent reset-payload-cap`: forgets the
    /// learned payload cap (journaled). Returns the cap that was in force, if any.
    pub async fn reset_payload_cap(&mut self) -> Result<Option<u64>, TurnError> {
        if let Some(f) = self.journal.fenced() {
            return Err(TurnError::Fenced(JournalError::Unavailable(f.to_string())));
        }
        self.settle().await?;
        let before = self.state.clone();
        let old = self.forget_payload_cap();
        if let Err(e) = self.commit(Vec::new(), None, false).await {
            self.state = before;
            return Err(e);
        }
        self.publish_gauges();
        Ok(old)
    }

    /// Appends messages without a model call (seeding from `--history`), persisted at once.
    pub async fn seed(&mut self, messages: Vec<Message>) -> Result<(), TurnError> {
        if messages.is_empty() {
            return Ok(());
        }
        self.settle().await?;
        self.history.extend(messages);
        self.commit(Vec::new(), None, false).await
    }

    /// Replaces the whole history (`run --history`), persisted at once.
    pub async fn replace_history(&mut self, messages: Vec<Message>) -> Result<(), TurnError> {
        self.settle().await?;
        self.history.replace(messages);
        // The API clients' conversation is gone with the history it was part of.
        self.ledger = Ledger::default();
        self.commit(Vec::new(), None, false).await
    }

    /// Settles a journal write whose outcome is not known yet (nothing else is written
    /// before), and takes the history the journal turned out to hold. Called before every
    /// operation that changes the history.
    async fn settle(&mut self) -> Result<(), TurnError> {
        if self.journal.settled() {
            // Whatever a failed turn left is settled: its input, if written, stays out of
            // memory until the next entry rewrites it away.
            self.failed_turn = None;
            return Ok(());
        }
        let result = self.journal.resolve().await;
        self.follow_journal();
        if self.journal.settled() {
            self.failed_turn = None;
        }
        result.map_err(TurnError::from)
    }

    /// The history (and the turn count) become what the journal holds. The input of a
    /// failed turn that the journal turned out to hold stays out of memory, as it does when
    /// a turn fails after journaling its input: the next entry rewrites it away.
    fn follow_journal(&mut self) {
        self.history.follow(self.journal.history());
        self.turns = self.journal.state().turns;
        self.ledger = self.journal.state().replay.clone();
        if let Some(n) = self.failed_turn
            && self.history.len() > n
            && self.history[n..]
                .iter()
                .all(|m| matches!(m.role, history::Role::User | history::Role::System))
        {
            self.history.truncate(n);
            self.ledger = self.failed_ledger.clone();
        }
    }

    /// Persists the difference between the journal and the history as one entry. On failure
    /// the history is what the journal holds (for an unknown outcome: as far as is known).
    async fn commit(
        &mut self,
        compactions: Vec<CompactionRecord>,
        undo: Option<Undo>,
        rewinds: bool,
    ) -> Result<(), TurnError> {
        if !compactions.is_empty() {
            let at = cairn_crds::time::rfc3339(SystemTime::now());
            for r in &compactions {
                self.state.timeline.push(r.timeline_entry(at.clone()));
            }
            self.state_dirty = true;
        }
        let mut state = PersistedState::capture(
            &self.state,
            self.turns,
            [
                self.tokens.input_tokens,
                self.tokens.output_tokens,
                self.tokens.cache_read_tokens,
            ],
        );
        state.replay = self.ledger.clone();
        state.passes = self.passes;
        state.summarizer_tokens = [
            self.summarizer_tokens.input_tokens,
            self.summarizer_tokens.output_tokens,
            self.summarizer_tokens.cache_read_tokens,
        ];
        state.accounting = self.accounting.clone();
        state.last_reply_ms = self
            .last_reply_at
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64);
        let change = Change {
            state,
            compactions,
            undo,
            rewinds,
            persist_state: self.state_dirty,
        };
        let synced = self.history.synced();
        match self
            .journal
            .write_synced(&self.history, synced, change)
            .await
        {
            Ok(written) => {
                self.history.mark_synced();
                self.state_dirty = false;
                if written.is_some() {
                    self.failed_turn = None;
                    self.metrics
                        .journal_writes
                        .get_or_create(&OutcomeLabels { outcome: "ok" })
                        .inc();
                }
                Ok(())
            }
            Err(e) => {
                self.metrics
                    .journal_writes
                    .get_or_create(&OutcomeLabels { outcome: e.label() })
                    .inc();
                self.history.follow(self.journal.history());
                self.turns = self.journal.state().turns;
                self.ledger = self.journal.state().replay.clone();
                self.state.timeline = self.journal.state().timeline.clone();
                Err(e.into())
            }
        }
    }

    /// Every tool result enters the history through here (client outputs with the turn's
    /// input, built-in tool results inside the turn): see [`compress::admit_tool_result`].
    pub(crate) async fn admit_tool_result(
        &mut self,
        message: &mut Message,
        origin: compress::ToolOrigin,
    ) -> compress::Admission {
        let admission = compress::admit_tool_result(
            message,
            origin,
            &self.live.policy.compression,
            self.store.as_ref(),
            &self.compression_counters,
        )
        .await;
        if let Some(q) = compress::admission_score(&admission, message) {
            self.publish_cut_score(crate::compact::Pass::Admission.label(), &q);
        }
        if admission != compress::Admission::Whole {
            tracing::debug!(
                ?admission,
                bytes = message.content.len(),
                "tool result admitted"
            );
        }
        admission
    }

    /// Publishes the score of a pass that cut outside the ladder (a cheap pass, the mirror
    /// of a provider's clearing, admission; the ladder scores its own compactions): in
    /// `status.session.compactionQuality`, the metrics, and an Event when it put something
    /// out of sight.
    pub(crate) fn publish_cut_score(&mut self, pass: &'static str, q: &CompactionScore) {
        self.state.quality.record(q.clone());
        self.metrics.compaction_scored(q, pass);
        self.events.emit(crate::events::cut(pass, q));
    }

    /// The context window requests are budgeted against (configured, or learned if tighter).
    fn window(&self) -> u64 {
        self.state
            .effective_window(self.live.limits.context_window)
            .max(1)
    }

    /// Budget inputs for the current live settings.
    fn budget_inputs(&self) -> BudgetInputs {
        BudgetInputs {
            context_window: self.window(),
            payload_cap: self.live.payload_cap,
            reserve_bytes: self.catalog_bytes() + self.options.extra_bytes(),
        }
    }

    /// Bytes the tool catalog adds to every request: as the latest request offered it, or
    /// the built-in tools' before the first.
    fn catalog_bytes(&self) -> usize {
        if self.tool_plan.offers.is_empty() {
            tools::catalog().iter().map(|t| t.weight()).sum()
        } else {
            self.tool_plan.bytes
        }
    }

    /// The client summaries go through: the summarizer's own when the policy gives it another
    /// endpoint, else the session's.
    fn summarizer_client(&self) -> Arc<dyn Provider> {
        match &self.summarizer_provider {
            Some(p) if crate::config::summarizer_has_own_endpoint(&self.live) => Arc::clone(p),
            _ => Arc::clone(&self.provider),
        }
    }

    /// The summarizer model's limits: the session's for the session's own model, else the
    /// catalog's for the summarizer's kind and model (or `summarizer.contextWindow`).
    fn summarizer_limits(&self) -> Option<crate::catalog::Limits> {
        let s = &self.live.policy.summarizer;
        let spec = crate::config::summarizer_spec(&self.live);
        if spec.kind == self.live.spec.provider.kind
            && spec.model == self.live.spec.provider.model
            && s.context_window.is_none()
        {
            return None;
        }
        Some(crate::catalog::limits_for(&cairn_crds::AgentSessionSpec {
            provider: spec,
            context_window: s.context_window,
            max_output_tokens: None,
            ..self.live.spec.clone()
        }))
    }

    fn summarizer(&self, extra: Option<String>) -> ProviderSummarizer {
        let own_limits = self.summarizer_limits();
        // A dedicated summarizer model has a window of its own, learned the same way.
        let tokens = match &own_limits {
            None => self.window(),
            Some(l) => self
                .state
                .summarizer_window
                .map_or(l.context_window, |w| w.min(l.context_window)),
        };
        let mut window = self.state.chars_per_token.chars(tokens);
        // The summary request crosses the same network path as every other request.
        if let Some(cap) = self.state.effective_payload_cap(self.live.payload_cap) {
            window = window.min((cap as f64 * crate::compact::window::PAYLOAD_CAP_SHARE) as usize);
        }
        // The summary must fit beside its input: at most a quarter of the window.
        let max_output =
            own_limits.map_or(self.live.limits.max_output_tokens, |l| l.max_output_tokens);
        ProviderSummarizer::new(self.summarizer_client(), &self.live, window, extra)
            .with_max_output(max_output.min(tokens / 4))
            .with_chars_per_token(self.state.chars_per_token.get())
            .with_metrics(Arc::clone(&self.metrics))
    }

    /// Counts tokens the summarizer used (its own calls or the memory's updates) and what
    /// they cost at `model`'s prices.
    pub(super) fn charge_summarizer(&mut self, model: &str, used: &Usage) {
        count_tokens(
            &mut self.summarizer_tokens,
            used,
            &self.metrics,
            crate::cost::Client::Summarizer,
        );
        if *used != Usage::default() {
            self.accounting.charge(
                crate::cost::Client::Summarizer,
                model,
                used,
                crate::catalog::PriceTable::fleet(),
                self.metrics.as_ref(),
            );
        }
    }

    /// Learns what the summarizer's own overflow said: the session's window and ratio when it
    /// used the session's model, its own window otherwise.
    fn learn_from_summarizer(&mut self, summarizer: &ProviderSummarizer) {
        let used = summarizer.take_usage();
        self.charge_summarizer(summarizer.model(), &used);
        let Some((count, sent)) = summarizer.take_learned() else {
            return;
        };
        let limits = self.summarizer_limits();
        let own = limits.is_none();
        if own && let Some(p) = count.prompt_tokens {
            self.state.chars_per_token.set_counted(sent as u64, p);
        }
        let configured = limits.map_or(self.live.limits.context_window, |l| l.context_window);
        if let Some(w) = count.window.filter(|w| *w < configured) {
            if own {
                self.state.learn_window(w);
            } else {
                self.state.summarizer_window =
                    Some(self.state.summarizer_window.map_or(w, |old| old.min(w)));
            }
        }
    }

    /// `engine: mcp` with its server declared: the server's `context_compact` writes the
    /// summaries, the built-in summarizer standing by.
    fn mcp_engine(
        &self,
        live: &Live,
        extra: Option<String>,
        builtin: &ProviderSummarizer,
    ) -> Option<McpSummarizer<ProviderSummarizer>> {
        if live.policy.engine != cairn_crds::policy::SummaryEngine::Mcp {
            return None;
        }
        let server = live.policy.engine_server.clone()?;
        if !self.mcp.specs().any(|s| s.name == server) {
            return None;
        }
        let budget_chars =
            (builtin.max_output() as f64 * self.state.chars_per_token.get()) as usize;
        Some(McpSummarizer::new(
            Arc::clone(&self.mcp),
            server,
            Duration::from_secs(u64::from(live.policy.engine_timeout_seconds)),
            budget_chars,
            extra.clone(),
            self.summarizer(extra),
        ))
    }

    /// Runs the ladder with `trigger` and counts it.
    async fn run_ladder(
        &mut self,
        trigger: Trigger,
        ratio: Option<f64>,
        extra_instruction: Option<String>,
    ) -> CompactionOutcome {
        let builtin = self.summarizer(extra_instruction.clone());
        let live = Arc::clone(&self.live);
        let engine = self.mcp_engine(&live, extra_instruction, &builtin);
        let summarizer = match engine {
            Some(engine) => Summary::Mcp(engine),
            None => Summary::Builtin(builtin),
        };
        // With the session memory, the ladder's level 2 replaces what the memory covers at
        // once, and what the compaction removes past it goes to the memory's queue first.
        let memory = self.memory_on().cloned();
        let pre = memory.as_ref().map(|_| self.history.to_vec());
        let with_memory = memory.as_deref().map(|m| crate::memory::WithMemory {
            inner: summarizer.as_dyn(),
            memory: m,
        });
        let ctx = LadderContext {
            policy: &live.policy,
            inputs: self.budget_inputs(),
            store: self.store.as_ref(),
            summarizer: Some(match &with_memory {
                Some(w) => w,
                None => summarizer.as_dyn(),
            }),
            trigger,
            budget_ratio: ratio,
            target: None,
        };
        // GenAI semantic-convention attributes (the model a level-2 summary would be asked
        // of) and the compaction's outcome, recorded once it is known.
        let model = self
            .accounting
            .summarizer_model
            .clone()
            .unwrap_or_else(|| live.spec.provider.model.clone());
        let span = tracing::info_span!(
            "compaction",
            trigger = trigger.label(),
            gen_ai.operation.name = "compaction",
            gen_ai.request.model = %model,
            cairn.compaction.level = tracing::field::Empty,
            cairn.compaction.bytes_before = tracing::field::Empty,
            cairn.compaction.bytes_after = tracing::field::Empty,
            cairn.compaction.score = tracing::field::Empty,
        );
        let mut out = compact(&mut self.history, &ctx, &mut self.state)
            .instrument(span.clone())
            .await;
        // As signed integers: the OTLP export writes a u64 as a string.
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        span.record("cairn.compaction.level", i64::from(out.level.unwrap_or(0)));
        span.record("cairn.compaction.bytes_before", int(out.bytes_before));
        span.record("cairn.compaction.bytes_after", int(out.bytes_after));
        if let Some(q) = &out.quality {
            span.record("cairn.compaction.score", q.score);
        }
        if let (Some(memory), Some(pre)) = (&memory, pre) {
            if self.queue_removed(&pre).await.is_err() {
                self.history.replace(pre);
                out.bytes_after = out.bytes_before;
                out.met = out.bytes_after <= out.target;
                if let Some(r) = out.reports.last_mut() {
                    r.notes.push(
                        "the session memory's queue could not be written: the compaction was undone"
                            .into(),
                    );
                }
            } else if out.reports.iter().any(|r| {
                r.notes
                    .iter()
                    .any(|n| n == crate::compact::summarize::FROM_MEMORY_NOTE)
            }) {
                memory.used_by_compaction(&self.history);
            }
        }
        if let Summary::Mcp(e) = &summarizer {
            for (writer, n) in [
                (
                    SummaryWriter::Mcp,
                    e.counts.mcp.load(std::sync::atomic::Ordering::Relaxed),
                ),
                (
                    SummaryWriter::Fallback,
                    e.counts.fallback.load(std::sync::atomic::Ordering::Relaxed),
                ),
            ] {
                if n > 0 {
                    self.metrics
                        .engine_summaries
                        .get_or_create(&SummaryLabels {
                            engine: SummaryEngine::Mcp,
                            writer,
                        })
                        .inc_by(n);
                }
            }
        }
        self.learn_from_summarizer(summarizer.builtin());
        tracing::info!(
            trigger = trigger.label(),
            level = out.level,
            bytes_before = out.bytes_before,
            bytes_after = out.bytes_after,
            met = out.met,
            "compaction"
        );
        let summary = out
            .summary
            .map(|v| match v {
                SummaryVerdict::Rejected(reason) => (v.label(), reason),
                _ => (v.label(), ""),
            })
            .or(out.level2_skipped.then_some(("skipped", "")));
        if let Some((outcome, reason)) = summary {
            self.metrics
                .summaries
                .get_or_create(&SummaryOutcomeLabels { outcome, reason })
                .inc();
        }
        if let Some(q) = &out.quality {
            let pass = out
                .reports
                .iter()
                .rev()
                .find(|r| r.is_change())
                .map_or("compaction", |r| r.pass.label());
            self.metrics.compaction_scored(q, pass);
        }
        if out.below_min_score.is_some() {
            self.metrics.compactions_below_min_score.inc();
        }
        if out.not_run.is_none() {
            self.metrics
                .compactions
                .get_or_create(&CompactionLabels {
                    level: out.level.unwrap_or(0),
                    trigger: trigger.label(),
                })
                .inc();
        }
        self.events.emit(crate::events::compacted(&out));
        out
    }

    /// Sends the session's Events to `sink` from now on.
    pub fn set_events(&mut self, sink: crate::events::EventSink) {
        self.events = sink;
    }

    /// `POST /v1/session/compact`: a compaction asked for by a person, with an optional
    /// instruction for the summary.
    pub async fn compact_now(
        &mut self,
        instruction: Option<String>,
    ) -> Result<CompactionOutcome, TurnError> {
        if let Some(f) = self.journal.fenced() {
            return Err(TurnError::Fenced(JournalError::Unavailable(f.to_string())));
        }
        self.settle().await?;
        self.refresh_live();
        let pre = self.history.to_vec();
        let abort = self.abort.clone();
        let out = tokio::select! {
            out = self.run_ladder(Trigger::Manual, None, instruction) => out,
            // A summary may take minutes; at shutdown the compaction is given up whole.
            () = abort.cancelled() => {
                self.history.replace(pre);
                return Err(TurnError::ShuttingDown);
            }
        };
        // A compaction that changed nothing writes nothing.
        if *self.history != pre {
            let undo = Undo {
                pre,
                post_len: self.history.len(),
            };
            self.commit(vec![record(&out)], Some(undo), false).await?;
        }
        self.maybe_update_memory();
        self.publish_gauges();
        Ok(out)
    }

    /// `POST /v1/session/rewind`: undoes the newest compaction not yet undone — the history
    /// before it, plus every message added since. Rewinds in a row undo compactions newest
    /// first, up to [`crate::journal::REWIND_LEVELS`] ([`Session::rewind_levels`]).
    pub async fn rewind(&mut self) -> Result<usize, TurnError> {
        self.settle().await?;
        let Some(undo) = self.journal.rewindable().map(|l| l.undo.clone()) else {
            return Err(TurnError::NothingToRewind);
        };
        let tail = self
            .history
            .get(undo.post_len.min(self.history.len())..)
            .unwrap_or_default()
            .to_vec();
        self.history.replace(undo.pre);
        self.history.extend(tail);
        self.commit(Vec::new(), None, true).await?;
        self.publish_gauges();
        Ok(self.history.len())
    }

    /// How many rewinds in a row would each undo a compaction.
    pub fn rewind_levels(&self) -> usize {
        self.journal.rewind_levels()
    }

    /// Persists anything not yet in the journal (graceful shutdown).
    pub async fn flush(&mut self) -> Result<(), TurnError> {
        if self.journal.fenced().is_some() {
            return Ok(());
        }
        self.settle().await?;
        self.commit(Vec::new(), None, false).await
    }

    /// Counters for `status.session` and `GET /v1/session`.
    pub fn stats(&self) -> SessionStats {
        let bytes = history::weight(&self.history) as u64;
        let tokens = self.state.chars_per_token.tokens(bytes as usize);
        let window = self.window();
        SessionStats {
            learned_context_window: self
                .state
                .learned_window
                .filter(|w| *w < self.live.limits.context_window),
            effective_context_window: window,
            bytes_per_token: (self.state.chars_per_token.get() * 1000.0).round() / 1000.0,
            truncated_replies: self.state.truncated_replies,
            turns: self.turns,
            messages: self.history.len() as u64,
            history_bytes: bytes,
            context_tokens: tokens,
            utilization: ((tokens as f64 / window as f64).min(1.0) * 1000.0).round() / 1000.0,
            learned_payload_cap: self.state.learned_payload_cap,
            compactions: self.state.compactions,
            level3_compactions: self.state.level3_compactions,
            recoveries: self.state.recoveries,
            last_recovery: self.last_recovery.clone(),
            archive: self.archive_counters.snapshot().session_stats(),
            archive_check: self.archive_check.read().ok().and_then(|c| c.clone()),
            tokens: TokenStats {
                input: self.tokens.input_tokens,
                output: self.tokens.output_tokens,
                cache_read: self.tokens.cache_read_tokens,
                cache_write: self.tokens.cache_write_tokens,
                model: Some(self.live.spec.provider.model.clone()),
                summarizer: (self.summarizer_tokens != Usage::default()).then(|| {
                    cairn_crds::session::SummarizerTokens {
                        input: self.summarizer_tokens.input_tokens,
                        output: self.summarizer_tokens.output_tokens,
                        cache_read: self.summarizer_tokens.cache_read_tokens,
                        cache_write: self.summarizer_tokens.cache_write_tokens,
                        model: self.accounting.summarizer_model.clone(),
                    }
                }),
            },
            cost_usd: self.cost_status(),
            passes: self.passes,
            summaries: self.state.summaries.clone(),
            headroom: Some(self.headroom()),
            compression: self.compression_counters.session_stats(),
            tool_calls: self.tool_call_counts,
            unsupported: crate::config::unsupported(&self.live),
            // The server knows when a client last had work done (`AppState::touch`).
            last_activity: None,
            idle_since: None,
            memory: self.memory_on().map(|m| m.stats(&self.history, self.turns)),
            compaction_quality: (!self.state.quality.is_empty())
                .then(|| self.state.quality.clone()),
        }
    }

    /// The headroom the next request would leave, by the policy's tiers.
    fn headroom(&self) -> HeadroomReport {
        let inputs = self.budget_inputs();
        let request_bytes = history::weight(&self.history) + inputs.reserve_bytes;
        let policy = &self.live.policy;
        let (tier, left) = Headroom::of(request_bytes, &inputs, policy, &self.state);
        HeadroomReport {
            tier: tier.status_name().to_owned(),
            tokens_left: left,
            warning_buffer_tokens: Buffers::of(inputs.context_window, policy).warning,
        }
    }

    fn publish_gauges(&self) {
        let s = self.stats();
        let m = &self.metrics;
        m.history_bytes.set(gauge_value(s.history_bytes));
        m.context_utilization.set(s.utilization);
        m.learned_payload_cap_bytes
            .set(gauge_value(s.learned_payload_cap.unwrap_or(0)));
        m.learned_context_window_tokens
            .set(gauge_value(s.learned_context_window.unwrap_or(0)));
        m.bytes_per_token.set(s.bytes_per_token);
    }
}

impl Session {
    /// `status.session.costUSD`: once anything was spent, or a budget is set.
    fn cost_status(&self) -> Option<cairn_crds::session::CostStats> {
        let max = self.live.spec.budget.as_ref().and_then(|b| b.max_cost_usd);
        let spent = self.tokens != Usage::default() || self.summarizer_tokens != Usage::default();
        (spent || max.is_some()).then(|| {
            let mut c = self.accounting.status();
            c.max_usd = max;
            c.budget_exceeded = max.is_some_and(|m| c.total >= m);
            c.on_budget_exceeded = max.map(|_| self.live.policy.on_budget_exceeded.as_str().into());
            c
        })
    }

    /// Refuses a turn once the cost reached the budget, when the policy suspends the session.
    pub(crate) fn check_budget(&self) -> Result<(), TurnError> {
        if self.live.policy.on_budget_exceeded != cairn_crds::policy::BudgetAction::Suspend {
            return Ok(());
        }
        match self.cost_status() {
            Some(c) if c.budget_exceeded => Err(TurnError::BudgetExceeded(format!(
                "the session's cost of {:.6} USD reached spec.budget.maxCostUSD ({} USD) and the policy's onBudgetExceeded is suspend: no new turns until the budget is raised",
                c.total,
                c.max_usd.unwrap_or_default()
            ))),
            _ => Ok(()),
        }
    }

    /// Counts a reply of the session model: its tokens, and its cost at the model's prices.
    pub(crate) fn count_session_tokens(&mut self, used: &Usage) {
        count_tokens(
            &mut self.tokens,
            used,
            &self.metrics,
            crate::cost::Client::Session,
        );
        let model = self.live.spec.provider.model.clone();
        self.accounting.charge(
            crate::cost::Client::Session,
            &model,
            used,
            crate::catalog::PriceTable::fleet(),
            self.metrics.as_ref(),
        );
    }
}

/// Adds `used` to `total` and to `cairn_agent_tokens_total{client}` (`session` for the
/// session's replies, `summarizer` for level-2 summaries).
pub(crate) fn count_tokens(
    total: &mut Usage,
    used: &Usage,
    metrics: &Metrics,
    client: crate::cost::Client,
) {
    total.add(used);
    for (kind, v) in used.by_kind() {
        if v > 0 {
            metrics
                .tokens
                .get_or_create(&TokenLabels {
                    kind,
                    client: client.label(),
                })
                .inc_by(v);
        }
    }
}

/// The summarizer of one compaction.
enum Summary {
    Builtin(ProviderSummarizer),
    Mcp(McpSummarizer<ProviderSummarizer>),
}

impl Summary {
    fn as_dyn(&self) -> &dyn crate::compact::Summarizer {
        match self {
            Self::Builtin(s) => s,
            Self::Mcp(s) => s,
        }
    }

    fn builtin(&self) -> &ProviderSummarizer {
        match self {
            Self::Builtin(s) => s,
            Self::Mcp(s) => s.fallback(),
        }
    }
}

/// Logs the settings the agent does not honour, when they differ from `before`'s.
fn warn_unsupported(live: &Live, before: Option<&Live>) {
    let now = crate::config::unsupported(live);
    if before.is_some_and(|b| crate::config::unsupported(b) == now) {
        return;
    }
    for u in &now {
        tracing::warn!(field = %u.field, "setting not honoured: {}", u.reason);
    }
}

fn cap_reset_notice(old: u64) -> (&'static str, String) {
    (
        "learned_cap",
        format!("spec.payloadCap changed: the learned cap of {old} bytes was reset"),
    )
}

/// What a learned window belongs to: the model and the configured window. A change of
/// either makes the learned window meaningless.
fn window_basis(live: &Live) -> String {
    format!(
        "{}@{}",
        live.spec.provider.model, live.limits.context_window
    )
}

fn record(out: &CompactionOutcome) -> CompactionRecord {
    CompactionRecord {
        trigger: out.trigger.label().into(),
        level: out.level.unwrap_or(0),
        bytes_before: out.bytes_before as u64,
        bytes_after: out.bytes_after as u64,
        archived: out
            .reports
            .iter()
            .flat_map(|r| r.archived.iter().map(|k| k.as_str().to_owned()))
            .collect(),
        score: out.quality.as_ref().map(|q| q.score),
    }
}
