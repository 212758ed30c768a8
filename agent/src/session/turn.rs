//! One turn: journal the input → cheap passes → pre-flight → compaction ladder → send →
//! classify → recovery ladder / output-token escalation → run built-in tool calls and send
//! again (bounded, with a stagnation guard) → journal. What to do at each step is decided by
//! `cairn_engine::turn`; this module performs it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use cairn_crds::session::LastRecovery;
use tracing::Instrument;

use cairn_engine::offer::{self, Candidate, Offer, TOOL_SEARCH};
use cairn_engine::turn::{self, GiveUp, Plan, StopVerdict, Truncation, output_limit};

use crate::classify::{FailureClass, classify};
use crate::compact::dedup::dedup_reads;
use crate::compact::microcompact::microcompact;
use crate::compact::pairing;
use crate::compact::{Budget, BudgetInputs, PassReport, Trigger, budget};
use crate::history::{self, Message, Role};
use crate::journal::{CompactionRecord, JournalError, Undo};
use crate::provider::{ChatRequest, ChatResponse, Controls, Delta, ProviderError, ToolSpec, Usage};
use crate::recovery::{
    self, RecoveryContext, RecoveryError, RecoveryOutcome, escalate_output, recover,
};
use crate::replay::{self, Held, Ledger};
use crate::telemetry;

use crate::mcp::{McpCatalog, Route};
use crate::metrics::{
    Attempt, CompactionLabels, KindLabels, McpCallLabels, McpServerLabels, OfferLabels,
    OutcomeLabels, ProviderErrorLabels, ReasonLabels, RecoveryLabels, SpecName, ToolLabels,
};

use super::tools::{self, StagnationGuard};
use super::{Session, TurnError, record};

/// Model rounds one turn may take (each tool-call batch costs one).
pub const MAX_TOOL_ROUNDS: u32 = 16;
/// First output-token limit of a turn; escalation doubles it up to the model's maximum.
pub const INITIAL_OUTPUT_TOKENS: u64 = 8_192;

/// Something a person should know about a turn (stderr in `run`; events, logs and metrics
/// in `serve`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Notice {
    /// `compaction`, `recovery`, `learned_cap`, `floor`, `warning`, `escalation`, `tools`,
    /// `catalog`.
    pub kind: &'static str,
    pub message: String,
}

/// An acknowledged turn.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnOutcome {
    /// The answer.
    pub text: String,
    pub usage: Usage,
    pub notices: Vec<Notice>,
    /// Model calls made.
    pub rounds: u32,
    /// Why the tool-call loop stopped early, if it did.
    pub stopped: Option<&'static str>,
    /// Set when the answer is incomplete: a reply was cut short and nothing could fix it
    /// (`context_full`, `window_bound`, `output_limit`).
    pub truncated: Option<&'static str>,
    /// Calls of the client's tools the turn ended with: the client runs them and sends their
    /// outputs with the next turn.
    pub calls: Vec<crate::history::ToolCall>,
}

/// What an API client adds to one turn: its own tools (which end the turn when the model
/// calls them), instructions for this turn only, and how the model is asked to answer.
#[derive(Clone, Debug, Default)]
pub struct TurnOptions {
    /// The client's function tools, offered beside the built-in ones.
    pub tools: Vec<ToolSpec>,
    /// A system part of this turn's requests only: never journaled, but counted in the
    /// uncompactable floor like the system prompt.
    pub instructions: Option<String>,
    pub controls: Controls,
    /// The client's output-token ceiling for each model call of the turn.
    pub max_output_tokens: Option<u64>,
    /// The replay ledger's part of the turn (API turns).
    pub ledger: Option<LedgerTurn>,
    /// The MCP servers of the spec this turn may use (`tools: [{"type": "mcp"}]` of the
    /// Responses API); `None`: all of them.
    pub mcp_servers: Option<Vec<McpSelection>>,
}

/// One `{"type": "mcp", "server_label": ..., "server_url": ...}` of a request: a server the
/// spec declares, never a new one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct McpSelection {
    pub label: String,
    /// Must be the declared server's `url` when given.
    pub url: Option<String>,
}

impl TurnOptions {
    /// Bytes the client's instructions and output controls add to every request of the
    /// turn (its tools are part of the catalog).
    pub fn extra_bytes(&self) -> usize {
        self.instructions.as_ref().map_or(0, String::len) + self.controls.weight()
    }

    fn is_client_tool(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name == name)
    }
}

/// The items a turn's input adds to the replay ledger, and the id of the response that will
/// answer it.
#[derive(Clone, Debug, Default)]
pub struct LedgerTurn {
    pub input: Vec<Held>,
    pub response_id: String,
}

/// Per-turn bookkeeping of compactions (for the journal and rewind).
#[derive(Default)]
struct Changes {
    records: Vec<CompactionRecord>,
    /// The history before the first compaction of the turn.
    pre: Option<Vec<Message>>,
    /// History length after the last compaction of the turn.
    post_len: usize,
}

impl Changes {
    /// Keeps `before` as the history before the turn's first compaction.
    fn keep_pre(&mut self, before: Vec<Message>) {
        if self.pre.is_none() {
            self.pre = Some(before);
        }
    }

    fn undo(&mut self) -> Option<Undo> {
        self.pre.take().map(|pre| Undo {
            pre,
            post_len: self.post_len,
        })
    }
}

/// What a streaming turn reports while it runs ([`Session::turn_streaming`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnEvent {
    /// Text of the answer as the provider sends it. Concatenated, the `Text` events since
    /// the last `Discarded` are a prefix of the final [`TurnOutcome::text`].
    Text(String),
    /// A model call that had already streamed text failed and is retried: the text streamed
    /// since the last `Discarded` is void. `kept` is the answer accepted before that call;
    /// the next `Text` events continue it.
    Discarded { kept: String },
    /// A notice, as it happens.
    Notice(Notice),
}

/// The events of a streaming turn.
pub type TurnEvents = tokio::sync::mpsc::UnboundedSender<TurnEvent>;

/// The notices of a turn, forwarded as they happen when the turn streams.
pub(super) struct Notices {
    pub(super) list: Vec<Notice>,
    pub(super) live: Option<TurnEvents>,
}

fn notice(notices: &mut Notices, kind: &'static str, message: String) {
    tracing::info!(kind, %message, "notice");
    let n = Notice { kind, message };
    if let Some(tx) = &notices.live {
        let _ = tx.send(TurnEvent::Notice(n.clone()));
    }
    notices.list.push(n);
}

/// The answer of a turn: the text of every model reply, in order. A reply that follows tool
/// calls starts a new paragraph; an escalated continuation goes on where the cut reply
/// stopped.
#[derive(Default)]
struct Answer {
    text: String,
    after_tools: bool,
    /// Why the last reply was cut short, when nothing could fix it.
    truncated: Option<&'static str>,
}

/// Separates the text of a reply that follows tool calls from the text before it.
const ROUND_SEPARATOR: &str = "\n\n";

impl Answer {
    /// What goes before the next reply's text, if it has any.
    fn lead(&self) -> &'static str {
        if self.after_tools && !self.text.is_empty() {
            ROUND_SEPARATOR
        } else {
            ""
        }
    }

    fn push(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.text.push_str(self.lead());
        self.text.push_str(text);
        self.after_tools = false;
    }
}

/// What belongs to one turn while it runs: its notices, its compactions, the answer so far,
/// the usage of its model calls, its output-token limit and its whole tool catalog.
struct TurnScope {
    notices: Notices,
    catalog: Catalog,
    /// The catalog's plan the turn last gave notice of.
    noticed_plan: Option<Vec<(String, Offer)>>,
    changes: Changes,
    answer: Answer,
    usage: Usage,
    /// The output-token limit of the next request; escalation raises it.
    max_out: u64,
    /// The model's (or the client's) ceiling for `max_out`.
    model_max: u64,
}

impl TurnScope {
    fn new(events: Option<TurnEvents>) -> Self {
        Self {
            notices: Notices {
                list: Vec::new(),
                live: events,
            },
            catalog: Catalog::default(),
            noticed_plan: None,
            changes: Changes::default(),
            answer: Answer::default(),
            usage: Usage::default(),
            max_out: 0,
            model_max: 0,
        }
    }

    /// The turn's outcome so far, ended by `stopped` (`None`: a whole answer), with the
    /// client's tool calls to run.
    fn outcome(
        &mut self,
        rounds: u32,
        stopped: Option<&'static str>,
        calls: Vec<crate::history::ToolCall>,
    ) -> TurnOutcome {
        TurnOutcome {
            text: std::mem::take(&mut self.answer.text),
            usage: self.usage,
            notices: Vec::new(),
            rounds,
            stopped,
            truncated: self.answer.truncated,
            calls,
        }
    }
}

/// The whole tool catalog of a turn: the built-in tools, the MCP servers' tools and the
/// client's, in that order, before [`cairn_engine::offer::plan`] fits it to the room.
#[derive(Clone, Debug, Default)]
pub(super) struct Catalog {
    pub(super) specs: Vec<ToolSpec>,
}

/// The catalog one request offers and the bytes it (with the client's instructions and
/// output format) adds to the request.
pub(super) struct Offered {
    pub(super) specs: Vec<ToolSpec>,
    pub(super) bytes: usize,
}

/// Tools the session remembers as recently called or found (most recent first): the last to
/// give way when the catalog must.
const RECENT_TOOLS: usize = 8;

/// What one model call sent: the request's weight and its output limit.
struct Sent {
    sent_weight: usize,
    limit: u64,
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.add(u);
}

impl Session {
    /// Runs one turn. On `Ok`, the new messages are in the journal; on `Err`, the history is
    /// as before the turn.
    pub async fn turn(&mut self, input: Vec<Message>) -> Result<TurnOutcome, TurnError> {
        self.turn_with(input, TurnOptions::default(), None).await
    }

    /// A turn with an API client's tools, instructions and controls; streamed when `events`
    /// is given (see [`Session::turn_streaming`]).
    pub async fn turn_with_options(
        &mut self,
        input: Vec<Message>,
        options: TurnOptions,
        events: Option<TurnEvents>,
    ) -> Result<TurnOutcome, TurnError> {
        self.turn_with(input, options, events).await
    }

    /// Like [`Session::turn`], reporting the answer's text and the notices on `events` as
    /// they arrive from the provider. Streamed text is not acknowledged: only an `Ok` is.
    pub async fn turn_streaming(
        &mut self,
        input: Vec<Message>,
        events: TurnEvents,
    ) -> Result<TurnOutcome, TurnError> {
        self.turn_with(input, TurnOptions::default(), Some(events))
            .await
    }

    async fn turn_with(
        &mut self,
        input: Vec<Message>,
        options: TurnOptions,
        events: Option<TurnEvents>,
    ) -> Result<TurnOutcome, TurnError> {
        if let Some(f) = self.journal.fenced() {
            return Err(TurnError::Fenced(JournalError::Unavailable(f.to_string())));
        }
        self.refresh_live();
        self.check_request(&input, &options)?;
        self.check_budget()?;
        let mut options = options;
        options.controls.effort = crate::steering::route_effort(
            options.controls.effort,
            &self.live.policy.output,
            self.live.spec.provider.kind,
            &self.live.spec.provider.model,
            &input,
        );
        let span = tracing::info_span!(
            "turn",
            namespace = %self.namespace,
            session = %self.name,
            turn = self.turns + 1,
            policy = %self.live.policy_hash,
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = %self.name,
            gen_ai.conversation.id = %format!("{}/{}", self.namespace, self.name),
            gen_ai.provider.name = telemetry::genai_provider_name(self.provider.name()),
            gen_ai.request.model = %self.live.spec.provider.model,
        );
        let started = Instant::now();
        let mut provider_time = Duration::ZERO;
        self.last_options = TurnOptions {
            ledger: None,
            ..options.clone()
        };
        self.options = options;
        let result = self
            .turn_inner(input, events, &mut provider_time)
            .instrument(span.clone())
            .await;
        self.options = TurnOptions::default();
        let elapsed = started.elapsed();
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => {
                telemetry::failed(&span, e.label());
                e.label()
            }
        };
        self.metrics
            .turns
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        self.metrics.turn_seconds.observe(elapsed.as_secs_f64());
        self.metrics
            .overhead_seconds
            .observe(elapsed.saturating_sub(provider_time).as_secs_f64());
        self.publish_gauges();
        result
    }

    /// Runs one call of an MCP tool; every failure is a tool error for the model. The flag
    /// is true for an error (the server's own `isError` or a failed call), which enters the
    /// history verbatim.
    async fn run_mcp(&self, call: &crate::history::ToolCall, route: &Route) -> (Message, bool) {
        let t = Instant::now();
        let result = self
            .mcp
            .call(&route.server, &route.tool, &call.arguments)
            .await;
        let (content, outcome, is_error) = match result {
            Ok(r) => {
                let outcome = if r.is_error { "tool_error" } else { "ok" };
                (r.text, outcome, r.is_error)
            }
            Err(e) => (format!("error: {e}"), e.label(), true),
        };
        let server = SpecName::from(route.server.as_str());
        self.metrics
            .mcp_calls
            .get_or_create(&McpCallLabels {
                server: server.clone(),
                outcome,
            })
            .inc();
        self.metrics
            .mcp_call_seconds
            .get_or_create(&McpServerLabels { server })
            .observe(t.elapsed().as_secs_f64());
        let mut message = Message::tool(call.id.clone(), content);
        message.name = Some(call.name.clone());
        (message, is_error)
    }

    /// The system prompt leads the history; a changed prompt replaces the old one.
    pub(super) fn ensure_system_prompt(&mut self) {
        let Some(prompt) = self.live.system_prompt.clone() else {
            return;
        };
        match self.history.first() {
            Some(m) if m.is_system() => {
                if m.content != prompt
                    && let Some(m) = self.history.first_mut()
                {
                    m.content = prompt;
                }
            }
            _ => self.history.insert(0, Message::system(prompt)),
        }
    }

    async fn turn_inner(
        &mut self,
        input: Vec<Message>,
        events: Option<TurnEvents>,
        provider_time: &mut Duration,
    ) -> Result<TurnOutcome, TurnError> {
        // An earlier write whose outcome is unknown is settled first: the turn starts from
        // what the journal holds.
        self.settle().await?;
        self.state.begin_turn();
        // 1. The input is journaled before anything else happens to it, once its tool
        // results are admitted (compressed or cut to the ceiling, originals archived first).
        self.ensure_system_prompt();
        let pre_turn_len = self.history.len();
        let mut input = input;
        for i in 0..input.len() {
            if input[i].role != Role::Tool {
                continue;
            }
            if input[i].name.is_none() {
                let id = input[i].tool_call_id.clone();
                input[i].name = self
                    .history
                    .iter()
                    .chain(&input[..i])
                    .rev()
                    .flat_map(|m| &m.tool_calls)
                    .find(|c| Some(&c.id) == id.as_ref())
                    .map(|c| c.name.clone());
            }
            let origin = crate::compress::ToolOrigin { is_error: false };
            self.admit_tool_result(&mut input[i], origin).await;
        }
        self.history.extend(input);
        let ledger_before = self.ledger.clone();
        let ledger_turn = self.options.ledger.take();
        if let Some(l) = &ledger_turn {
            self.ledger.items.extend(l.input.iter().cloned());
        }
        match self.commit(Vec::new(), None, false).await {
            Ok(()) => {}
            // The input is in the journal; the claims check that confirms it is repeated
            // before the reply is written, so the turn can go on.
            Err(TurnError::Unsettled(JournalError::Unconfirmed(e))) => {
                tracing::warn!(error = %e, "journal: the input is written but not confirmed yet");
            }
            Err(e) => {
                self.fail_turn(pre_turn_len, &ledger_before, &e);
                return Err(e);
            }
        }

        let mut scope = TurnScope::new(events);
        self.ensure_memory().await;
        self.absorb_memory_events();
        for (kind, message) in std::mem::take(&mut self.pending_notices) {
            notice(&mut scope.notices, kind, message);
        }
        // The turn's deadline and a shutdown cut the model calls, tool rounds and
        // compactions short, never a journal write (the entries around them stay whole).
        let turn_secs = self.live.policy.timeouts.turn_seconds;
        let abort = self.abort.clone();
        let rounds = tokio::select! {
            r = self.rounds(&mut scope, provider_time) => r,
            () = tokio::time::sleep(Duration::from_secs(u64::from(turn_secs))) => {
                Err(TurnError::Deadline(format!(
                    "the turn did not finish within its deadline of {turn_secs}s (timeouts.turnSeconds); it was not persisted and its input was dropped"
                )))
            }
            () = abort.cancelled() => Err(TurnError::ShuttingDown),
        };
        let result = match rounds {
            Ok(out) => {
                self.turns += 1;
                // Recovery no longer halves the tool-result budgets, but a journal written by
                // an older agent may carry halvings: once a turn went through they are whole.
                let halvings = std::mem::take(&mut self.state.tool_budget_halvings);
                let undo = scope.changes.undo();
                if let Some(l) = ledger_turn {
                    let outputs = replay::output_items(&out.text, &out.calls)
                        .into_iter()
                        .map(|(item, id)| Held::output(&item, id))
                        .collect();
                    self.ledger.complete(outputs, l.response_id);
                }
                // 6. The reply and the compactions are journaled before the turn is answered,
                // with the time of the reply (the idle rule's clock).
                let idle_clock = self.last_reply_at.replace(SystemTime::now());
                match self
                    .commit(std::mem::take(&mut scope.changes.records), undo, false)
                    .await
                {
                    Ok(()) => Ok(out),
                    Err(e) => {
                        // The turn count follows the journal (see `commit`).
                        self.state.tool_budget_halvings = halvings;
                        self.last_reply_at = idle_clock;
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(mut out) => {
                self.failed_turn = None;
                // Off the turn's path: the update runs while the client reads the answer.
                self.maybe_update_memory();
                for n in &scope.notices.list {
                    self.metrics
                        .notices
                        .get_or_create(&KindLabels { kind: n.kind })
                        .inc();
                }
                out.notices = scope.notices.list;
                Ok(out)
            }
            Err(e) => {
                self.fail_turn(pre_turn_len, &ledger_before, &e);
                // Back to the history before the input in the journal too: a restart before
                // the next entry would otherwise find a question without its answer (and the
                // next turn would send two user messages in a row). When the journal itself
                // failed, the next entry rewrites the input away.
                if !matches!(
                    e,
                    TurnError::Journal(_) | TurnError::Unsettled(_) | TurnError::Fenced(_)
                ) && self.commit(Vec::new(), None, false).await.is_err()
                {
                    self.history.truncate(pre_turn_len);
                    self.ledger = ledger_before;
                }
                Err(e)
            }
        }
    }

    /// Back to the history before the input; the journal may still hold the input, which the
    /// next entry rewrites away. A reply the journal may hold stays: the history is then what
    /// the journal holds, as far as is known, and is settled before the next turn.
    fn fail_turn(&mut self, pre_turn_len: usize, ledger_before: &Ledger, e: &TurnError) {
        self.history.follow(self.journal.history());
        self.turns = self.journal.state().turns;
        self.ledger = self.journal.state().replay.clone();
        self.failed_turn = Some(pre_turn_len);
        self.failed_ledger = ledger_before.clone();
        let reply_in_journal = matches!(e, TurnError::Unsettled(_))
            && self.history.len() > pre_turn_len
            && self
                .history
                .last()
                .is_some_and(|m| m.role == Role::Assistant || m.role == Role::Tool);
        if !reply_in_journal {
            self.history.truncate(pre_turn_len);
            self.ledger = ledger_before.clone();
        }
    }

    async fn rounds(
        &mut self,
        scope: &mut TurnScope,
        provider_time: &mut Duration,
    ) -> Result<TurnOutcome, TurnError> {
        let live = Arc::clone(&self.live);
        let policy = &live.policy;
        let store = Arc::clone(&self.store);

        // 2. Cheap passes.
        let reports = self.cheap_passes().await;
        self.passes.microcompacted += (reports[0].changed + reports[0].removed) as u64;
        self.passes.deduplicated += (reports[1].changed + reports[1].removed) as u64;
        for r in reports.iter().filter(|r| r.is_change()) {
            tracing::debug!(
                pass = r.pass.label(),
                changed = r.changed,
                removed = r.removed,
                "cheap pass"
            );
        }

        scope.catalog = self.offer_tools(&mut scope.notices).await;
        scope.model_max = self.model_max();
        scope.max_out = scope.model_max.min(INITIAL_OUTPUT_TOKENS);
        let mut guard = StagnationGuard::default();
        let mut rounds = 0;

        loop {
            if rounds >= MAX_TOOL_ROUNDS {
                notice(
                    &mut scope.notices,
                    "tools",
                    format!("the tool-call loop stopped after {MAX_TOOL_ROUNDS} model calls"),
                );
                return Ok(scope.outcome(rounds, Some("max_rounds"), Vec::new()));
            }
            // 3-4. Pre-flight and the compaction ladder.
            self.prepare(scope).await?;
            // 5. Send, recovering from classified failures.
            let resp = self.send(scope, provider_time).await?;
            rounds += 1;
            let mut resp = resp;
            // `parallel_tool_calls: false` holds whatever the provider did with it.
            if self.options.controls.parallel_tool_calls == Some(false) {
                resp.message.tool_calls.truncate(1);
            }
            let calls = resp.message.tool_calls.clone();
            self.history.push(resp.message.clone());
            scope.answer.push(&resp.message.content);
            if calls.is_empty() {
                return Ok(scope.outcome(rounds, None, Vec::new()));
            }
            let stagnating = guard.record(&calls);
            let compression = policy.compression.clone();
            // The client runs its own tools: the turn ends with their calls, once the
            // built-in ones of the same reply have run.
            let (client, own): (Vec<_>, Vec<_>) = calls
                .into_iter()
                .partition(|c| self.options.is_client_tool(&c.name));
            self.tool_call_counts.client += client.len() as u64;
            if !client.is_empty() {
                self.metrics
                    .tool_calls
                    .get_or_create(&ToolLabels { tool: "client" })
                    .inc_by(client.len() as u64);
            }
            for call in &own {
                self.used_tool(&call.name);
                let route = self.mcp_catalog.route(&call.name).cloned();
                let tool = if route.is_some() {
                    self.tool_call_counts.mcp += 1;
                    "mcp"
                } else {
                    self.tool_call_counts.builtin += 1;
                    tool_label(&call.name)
                };
                self.metrics
                    .tool_calls
                    .get_or_create(&ToolLabels { tool })
                    .inc();
                let span = tracing::info_span!(
                    "tool_call",
                    tool,
                    gen_ai.operation.name = "execute_tool",
                    gen_ai.tool.name = %call.name,
                    gen_ai.tool.call.id = %call.id,
                    gen_ai.tool.type = if route.is_some() { "extension" } else { "function" },
                );
                let (mut message, is_error) = async {
                    if let Some(route) = route {
                        self.run_mcp(call, &route).await
                    } else if call.name == TOOL_SEARCH {
                        (self.search_tools(call, &scope.catalog), false)
                    } else if let Some(refusal) = self.mcp.refused(&call.name).await {
                        let mut m = Message::tool(call.id.clone(), format!("error: {refusal}"));
                        m.name = Some(call.name.clone());
                        (m, true)
                    } else {
                        let r = tools::run(
                            call,
                            &mut self.history,
                            store.as_ref(),
                            &compression,
                            &self.compression_counters,
                        )
                        .await;
                        (r.message, r.is_error)
                    }
                }
                .instrument(span.clone())
                .await;
                if is_error {
                    telemetry::failed(&span, "tool_error");
                }
                // Every tool result enters the history here, whoever ran the tool.
                self.admit_tool_result(&mut message, crate::compress::ToolOrigin { is_error })
                    .await;
                self.history.push(message);
            }
            scope.answer.after_tools = true;
            // A required or named choice is met once the session's own tools have run: the
            // turn's later calls send `none`, so the model answers from the results. Held for
            // every call, it would leave the model no way to answer and end the turn only at
            // the call limit or as stagnation.
            if matches!(
                self.options.controls.tool_choice,
                crate::provider::ToolChoice::Required | crate::provider::ToolChoice::Function(_)
            ) {
                self.options.controls.tool_choice = crate::provider::ToolChoice::None;
            }
            if !client.is_empty() {
                return Ok(scope.outcome(rounds, None, client));
            }
            if stagnating {
                notice(
                    &mut scope.notices,
                    "tools",
                    format!(
                        "the same tool calls came {} times in a row; the tool-call loop was stopped",
                        tools::STAGNATION_REPEATS
                    ),
                );
                return Ok(scope.outcome(rounds, Some("stagnation"), Vec::new()));
            }
        }
    }

    /// The cheap passes of a turn's start (microcompact, read dedup, archived-pair repair),
    /// in place; their reports in that order.
    pub(super) async fn cheap_passes(&mut self) -> Vec<PassReport> {
        let live = Arc::clone(&self.live);
        let store = Arc::clone(&self.store);
        let idle_for = self.last_reply_at.and_then(|t| t.elapsed().ok());
        // Each pass counts every message it changes, removes or adds; only a pass that
        // changed nothing leaves the journal's mark where it was.
        let history = self.history.keeping_mark();
        let mut reports: Vec<PassReport> = Vec::new();
        reports.push(microcompact(history, &live.policy, idle_for, store.as_ref()).await);
        reports.push(dedup_reads(history, &live.policy, store.as_ref()).await);
        let (report, repaired) =
            pairing::repair_archived(history, store.as_ref(), Trigger::Turn).await;
        reports.push(report);
        if repaired.is_change() || reports.iter().any(PassReport::is_change) {
            self.history.changed(0);
        }
        for r in &reports {
            if let Some(q) = &r.quality {
                self.publish_cut_score(r.pass.label(), q);
            }
        }
        reports
    }

    /// The output-token ceiling of the turn's model calls: the model's, lowered by the
    /// client's.
    pub(super) fn model_max(&self) -> u64 {
        match self.options.max_output_tokens {
            Some(client) => self.live.limits.max_output_tokens.min(client).max(1),
            None => self.live.limits.max_output_tokens.max(1),
        }
    }

    /// The turn's whole tool catalog: the built-in tools, the MCP servers' tools, the
    /// client's tools.
    pub(super) async fn offer_tools(&mut self, notices: &mut Notices) -> Catalog {
        // An MCP tool whose name is taken is offered as `<server>__<tool>`.
        self.mcp_catalog = if self.mcp.is_empty() {
            McpCatalog::default()
        } else {
            let client: Vec<&str> = self.options.tools.iter().map(|t| t.name.as_str()).collect();
            let mut taken = vec![tools::RECALL, tools::COMPRESS, TOOL_SEARCH];
            taken.extend(client);
            let only: Option<Vec<String>> = self
                .options
                .mcp_servers
                .as_ref()
                .map(|s| s.iter().map(|x| x.label.clone()).collect());
            self.mcp.catalog(only.as_deref(), &taken).await
        };
        for why in self.mcp_catalog.unavailable.clone() {
            notice(
                notices,
                "tools",
                format!("{why}; its tools are not offered this turn"),
            );
        }
        let mut specs = tools::catalog();
        specs.extend(self.mcp_catalog.specs.iter().cloned());
        specs.extend(self.options.tools.iter().cloned());
        Catalog { specs }
    }

    /// Plans what of `catalog` the next request offers, with the room the session's window,
    /// bytes per token and payload cap leave now ([`cairn_engine::offer`]): only the MCP
    /// servers' tools give way. The plan is the session's until the next one (the budget
    /// counts its bytes).
    pub(super) fn fit_catalog(&mut self, catalog: &Catalog) {
        let candidates: Vec<Candidate> = catalog
            .specs
            .iter()
            .map(|t| Candidate::of(t, self.mcp_catalog.route(&t.name).is_some()))
            .collect();
        let inputs = BudgetInputs {
            reserve_bytes: self.options.extra_bytes(),
            ..self.budget_inputs()
        };
        let system = cairn_engine::compact::window::system_weight(self.history.iter());
        let room = offer::room(&inputs, &self.live.policy, &self.state, system);
        let search = offer::search_tool().weight();
        self.tool_plan = offer::plan(&candidates, &self.recent_tools, search, room);
    }

    /// The catalog the next request offers, as the session's plan says.
    pub(super) fn offered(&self, catalog: &Catalog) -> Offered {
        let mut specs: Vec<ToolSpec> = Vec::with_capacity(catalog.specs.len() + 1);
        for t in &catalog.specs {
            match self.tool_plan.offer(&t.name) {
                Offer::Whole => specs.push(t.clone()),
                Offer::Short => specs.push(offer::shorten(t)),
                Offer::Deferred => {}
            }
        }
        if self.tool_plan.searches() {
            specs.push(offer::search_tool());
        }
        let bytes = specs.iter().map(ToolSpec::weight).sum::<usize>() + self.options.extra_bytes();
        Offered { specs, bytes }
    }

    /// Remembers `name` as the most recently used tool.
    fn used_tool(&mut self, name: &str) {
        self.recent_tools.retain(|n| n != name);
        self.recent_tools.insert(0, name.to_owned());
        self.recent_tools.truncate(RECENT_TOOLS);
    }

    /// Runs a call of [`TOOL_SEARCH`]: the full definitions of the tools the request did not
    /// offer whole that match the query; the found ones count as used, so the next request
    /// offers them whole while anything else can give way.
    fn search_tools(&mut self, call: &crate::history::ToolCall, catalog: &Catalog) -> Message {
        let query = serde_json::from_str::<serde_json::Value>(&call.arguments)
            .ok()
            .and_then(|v| v.get("query").and_then(|q| q.as_str()).map(str::to_owned))
            .unwrap_or_else(|| call.arguments.clone());
        let hidden: Vec<ToolSpec> = catalog
            .specs
            .iter()
            .filter(|t| self.tool_plan.offer(&t.name) != Offer::Whole)
            .cloned()
            .collect();
        let found = offer::search(&hidden, &query);
        let text = offer::search_result(&found, &query, &hidden);
        let names: Vec<String> = found.iter().rev().map(|t| t.name.clone()).collect();
        for name in names {
            self.used_tool(&name);
        }
        let mut message = Message::tool(call.id.clone(), text);
        message.name = Some(call.name.clone());
        message
    }

    /// Pre-flight against a known payload cap, then the ladder when over budget; a request
    /// still in the blocking buffer after that is refused.
    async fn prepare(&mut self, scope: &mut TurnScope) -> Result<(), TurnError> {
        self.fit_turn_catalog(scope);
        let inputs = self.budget_inputs();
        let weight = history::weight(&self.history);
        let live = Arc::clone(&self.live);
        let prep = turn::before_send(weight, &inputs, &live.policy, &mut self.state);
        if let Some(bytes) = prep.large_history {
            let message = turn::large_history_notice(bytes);
            notice(&mut scope.notices, "warning", message);
        }
        let (trigger, ratio) = match prep.plan {
            Plan::Send => return Ok(()),
            Plan::WarnHeadroom { left } => {
                self.headroom_warning(&mut scope.notices, left);
                return Ok(());
            }
            Plan::Compact {
                trigger,
                budget_ratio,
            } => (trigger, budget_ratio),
        };
        let before = self.history.to_vec();
        let out = self.run_ladder(trigger, ratio, None).await;
        if out.not_run.is_some() || *self.history == before {
            if out.breaker_opened
                || out.not_run == Some(crate::compact::ladder::NotRun::CircuitOpen)
            {
                tracing::warn!(
                    "auto-compaction is disabled for this session (circuit breaker open)"
                );
            }
            return self.refuse_if_blocking();
        }
        // A summary that failed is never silent: the ladder went on to level 3 without it.
        for r in out
            .reports
            .iter()
            .filter(|r| r.pass == crate::compact::Pass::Summary && r.bytes_after == r.bytes_before)
        {
            if let Some(why) = r.notes.last() {
                notice(
                    &mut scope.notices,
                    "summary",
                    format!("no summary this time: {why}"),
                );
            }
        }
        scope.changes.keep_pre(before);
        scope.changes.post_len = self.history.len();
        scope.changes.records.push(record(&out));
        let message = turn::compaction_notice(
            trigger,
            out.level.unwrap_or(0),
            out.bytes_before,
            out.bytes_after,
            out.breaker_opened,
        );
        notice(&mut scope.notices, "compaction", message);
        self.refuse_if_blocking()
    }

    /// The `warning` tier of the CRD: a notice (once per turn) and a metric.
    fn headroom_warning(&self, notices: &mut Notices, left: i64) {
        if notices
            .list
            .iter()
            .any(|n| n.kind == "warning" && n.message.contains("headroom"))
        {
            return;
        }
        self.metrics.headroom_warnings.inc();
        let message = turn::headroom_notice(left, &self.live.policy);
        notice(notices, "warning", message);
    }

    /// The `blocking` tier of the CRD: a request that leaves no more than
    /// `blockingBufferTokens` of headroom is not sent.
    fn refuse_if_blocking(&self) -> Result<(), TurnError> {
        let inputs = self.budget_inputs();
        let request_bytes = history::weight(&self.history) + inputs.reserve_bytes;
        match turn::blocking(request_bytes, &inputs, &self.live.policy, &self.state) {
            Some(full) => Err(TurnError::ContextFull(full.to_string())),
            None => Ok(()),
        }
    }

    /// Sends until a usable reply arrives or recovery gives up: each rejection either ends
    /// the turn or leaves a recovered history to send again, each reply cut at the output
    /// limit an escalated continuation.
    async fn send(
        &mut self,
        scope: &mut TurnScope,
        provider_time: &mut Duration,
    ) -> Result<ChatResponse, TurnError> {
        loop {
            let tools = self.offered(&scope.catalog);
            let (result, sent) = self.call_provider(&tools, scope, provider_time).await;
            match result {
                Ok(reply) => {
                    if let Some(reply) = self.on_reply(reply, &sent, scope).await? {
                        return Ok(reply);
                    }
                }
                Err(err) => self.on_rejection(&err, tools.bytes, &sent, scope).await?,
            }
        }
    }

    /// One model call with the history lent to it, streamed to the client when the turn
    /// streams; its time and size counted.
    ///
    /// Each request carries the history itself, lent with that request's tool-result cuts
    /// (see [`Loan`]), not a copy of it.
    async fn call_provider(
        &mut self,
        tools: &Offered,
        scope: &mut TurnScope,
        provider_time: &mut Duration,
    ) -> (Result<ChatResponse, ProviderError>, Sent) {
        let provider = Arc::clone(&self.provider);
        let max_out = scope.max_out;
        let Lent {
            loan,
            sent_weight,
            limit,
            cuts_made,
        } = self
            .lend_request(
                &tools.specs,
                tools.bytes,
                max_out,
                scope.notices.live.is_some(),
            )
            .await;
        let request = &loan.request;
        let span = telemetry::chat_span(provider.name(), request);
        let t = Instant::now();
        let lead = scope.answer.lead();
        let streamed = AtomicBool::new(false);
        let result = match &scope.notices.live {
            Some(tx) => {
                let sink = |d: Delta<'_>| {
                    if let Delta::Text(text) = d
                        && !text.is_empty()
                    {
                        if !streamed.swap(true, Ordering::Relaxed) && !lead.is_empty() {
                            let _ = tx.send(TurnEvent::Text(lead.to_owned()));
                        }
                        let _ = tx.send(TurnEvent::Text(text.to_owned()));
                    }
                };
                provider
                    .send_streaming(request, &sink)
                    .instrument(span.clone())
                    .await
            }
            None => provider.send(request).instrument(span.clone()).await,
        };
        telemetry::record_chat(&span, &result);
        drop(loan);
        self.passes.tool_results_cut += cuts_made;
        *provider_time += t.elapsed();
        if result.is_err()
            && streamed.load(Ordering::Relaxed)
            && let Some(tx) = &scope.notices.live
        {
            let _ = tx.send(TurnEvent::Discarded {
                kept: scope.answer.text.clone(),
            });
        }
        let seconds = t.elapsed().as_secs_f64();
        self.metrics.provider_seconds.observe(seconds);
        let bytes = match &result {
            Ok(reply) => reply.request_bytes,
            Err(err) => err.request_bytes,
        };
        self.metrics.request_bytes.observe(bytes as f64);
        (result, Sent { sent_weight, limit })
    }

    /// A reply arrived: calibrate on it, count it, and judge its stop. `None` when it was cut
    /// at the output limit and an escalated continuation is to be sent instead.
    async fn on_reply(
        &mut self,
        reply: ChatResponse,
        call: &Sent,
        scope: &mut TurnScope,
    ) -> Result<Option<ChatResponse>, TurnError> {
        // The server's context management counted a request other than the one sent: its
        // token count calibrates nothing.
        if reply.context.is_none() {
            self.state
                .chars_per_token
                .observe(call.sent_weight as u64, reply.usage.input_tokens);
        } else {
            self.mirror_server_context(&reply, &mut scope.changes, &mut scope.notices)
                .await;
        }
        add_usage(&mut scope.usage, &reply.usage);
        self.count_session_tokens(&reply.usage);
        let cut = match turn::judge_stop(&reply, call.limit, scope.max_out, self.window()) {
            StopVerdict::Complete => return Ok(Some(reply)),
            StopVerdict::Truncated(cut) => cut,
            StopVerdict::Escalate => {
                let policy = &self.live.policy;
                let Some(esc) = escalate_output(
                    &mut self.history,
                    &reply.message,
                    scope.max_out,
                    scope.model_max,
                    policy,
                    &mut self.state,
                ) else {
                    scope.answer.truncated = Some(self.report_truncation(
                        Truncation::OutputLimit,
                        &reply.usage,
                        call.limit,
                        &mut scope.notices,
                    ));
                    return Ok(Some(reply));
                };
                scope.answer.push(&reply.message.content);
                let message = turn::escalation_notice(call.limit, esc.max_output_tokens);
                notice(&mut scope.notices, "escalation", message);
                scope.max_out = esc.max_output_tokens;
                // The continuation carries the partial reply: it is compacted to fit like any
                // other request.
                self.prepare(scope).await?;
                return Ok(None);
            }
        };
        scope.answer.truncated =
            Some(self.report_truncation(cut, &reply.usage, call.limit, &mut scope.notices));
        Ok(Some(reply))
    }

    /// A request was rejected: classify it, and either recover (the history is rewritten to
    /// be sent again) or end the turn with what recovery could not fix.
    async fn on_rejection(
        &mut self,
        err: &ProviderError,
        tools_bytes: usize,
        call: &Sent,
        scope: &mut TurnScope,
    ) -> Result<(), TurnError> {
        let class = classify(err);
        self.metrics
            .provider_errors
            .get_or_create(&ProviderErrorLabels {
                error: err.label(),
                class: class.label(),
                client: crate::cost::Client::Session.label(),
            })
            .inc();
        let uncompactable =
            cairn_engine::compact::window::system_weight(self.history.iter()) + tools_bytes;
        if let Some(floor) =
            turn::floor_before_recovery(class, &self.state, uncompactable as u64, err.request_bytes)
        {
            return Err(TurnError::Floor(floor.to_string()));
        }
        let before = self.history.to_vec();
        let live = Arc::clone(&self.live);
        let store = Arc::clone(&self.store);
        let ctx = RecoveryContext {
            policy: &live.policy,
            store: store.as_ref(),
            uncompactable_bytes: uncompactable as u64,
            inputs: BudgetInputs {
                context_window: live.limits.context_window,
                payload_cap: live.payload_cap,
                reserve_bytes: tools_bytes,
            },
            sent_weight: call.sent_weight,
        };
        let span = tracing::info_span!("recovery", class = class.label());
        let outcome = recover(&mut self.history, err, class, &ctx, &mut self.state)
            .instrument(span)
            .await;
        // What recovery removed goes to the memory's queue before the rewritten history is
        // journaled; without the queue the step is undone, and the attempt fails rather than
        // resend the request that was just rejected.
        let queued = match &outcome {
            Ok(_) => self.queue_removed(&before).await,
            Err(_) => Ok(()),
        };
        if queued.is_err() {
            self.history.replace(before.clone());
        }
        match recovery::after_memory_queue(outcome, queued) {
            Ok(o) => {
                self.recovered(class, err, &o, call.sent_weight, before, scope);
                // A learned cap takes effect on the retry itself.
                self.prepare(scope).await
            }
            Err(RecoveryError::Floor { .. } | RecoveryError::WindowFloor { .. })
                if self.catalog_gives_way(tools_bytes, scope) =>
            {
                self.prepare(scope).await
            }
            Err(re) => Err(self.gave_up(class, err, &re)),
        }
    }

    /// After a rejection whose recovery found the floor too high: whether the catalog, fitted
    /// to what the rejection taught (a window, the bytes per token), now weighs less than
    /// the `sent_bytes` it weighed in the rejected request. The request then changes, and is
    /// sent again.
    fn catalog_gives_way(&mut self, sent_bytes: usize, scope: &mut TurnScope) -> bool {
        self.fit_turn_catalog(scope);
        self.offered(&scope.catalog).bytes < sent_bytes
    }

    /// Fits the turn's catalog to the room; a plan that gives way is noticed once per turn
    /// and again when what gives way changes.
    fn fit_turn_catalog(&mut self, scope: &mut TurnScope) {
        self.fit_catalog(&scope.catalog);
        let plan = &self.tool_plan;
        for (label, kind) in [
            ("whole", Offer::Whole),
            ("short", Offer::Short),
            ("deferred", Offer::Deferred),
        ] {
            self.metrics
                .offered_tools
                .get_or_create(&OfferLabels { offer: label })
                .set(plan.named(kind).len() as i64);
        }
        if plan.is_whole() || scope.noticed_plan.as_ref() == Some(&plan.offers) {
            return;
        }
        scope.noticed_plan = Some(plan.offers.clone());
        notice(&mut scope.notices, "catalog", offer::notice(plan));
    }

    /// Records a recovery attempt: metrics, `status.session.lastRecovery`, the turn's
    /// compaction record and its notices.
    fn recovered(
        &mut self,
        class: FailureClass,
        err: &ProviderError,
        o: &RecoveryOutcome,
        sent_weight: usize,
        before: Vec<Message>,
        scope: &mut TurnScope,
    ) {
        self.metrics
            .recoveries
            .get_or_create(&RecoveryLabels {
                class: class.label(),
                attempt: Attempt::Nth(o.attempt),
                outcome: "retried",
            })
            .inc();
        if let Some(q) = &o.quality {
            self.metrics.compaction_scored(q, "recovery");
        }
        // The recovery's cut is a compaction of the timeline and the journal (level 0): the
        // counter of compactions counts it too.
        self.metrics
            .compactions
            .get_or_create(&CompactionLabels {
                level: 0,
                trigger: "recovery",
            })
            .inc();
        self.events.emit(Some(crate::events::recovered(class, o)));
        self.last_recovery = Some(LastRecovery {
            at: cairn_crds::time::rfc3339(SystemTime::now()),
            trigger: format!("{class:?}"),
            level: o.attempt,
            outcome: "Recovered".into(),
        });
        scope.changes.keep_pre(before);
        scope.changes.post_len = self.history.len();
        scope.changes.records.push(CompactionRecord {
            trigger: "recovery".into(),
            level: 0,
            bytes_before: o.report.bytes_before as u64,
            bytes_after: o.report.bytes_after as u64,
            archived: o
                .report
                .archived
                .iter()
                .map(|k| k.as_str().to_owned())
                .collect(),
            score: o.quality.as_ref().map(|q| q.score),
        });
        let ratio = self.state.chars_per_token.get();
        for (kind, message) in turn::recovery_notices(class, err, o, sent_weight, ratio) {
            notice(&mut scope.notices, kind, message);
        }
    }

    /// Recovery from `err` ended in `re`: counted, recorded, and the turn's error.
    fn gave_up(
        &mut self,
        class: FailureClass,
        err: &ProviderError,
        re: &RecoveryError,
    ) -> TurnError {
        self.metrics
            .recoveries
            .get_or_create(&RecoveryLabels {
                class: class.label(),
                attempt: Attempt::None,
                outcome: re.label(),
            })
            .inc();
        self.events.emit(crate::events::recovery_failed(
            class,
            self.state.recovery_attempts,
            re,
        ));
        if class.is_recoverable() {
            self.last_recovery = Some(LastRecovery {
                at: cairn_crds::time::rfc3339(SystemTime::now()),
                trigger: format!("{class:?}"),
                level: self.state.recovery_attempts,
                outcome: "Failed".into(),
            });
        }
        match turn::give_up(class, err, re) {
            GiveUp::Floor(message) => TurnError::Floor(message),
            GiveUp::Provider { class, message } => TurnError::Provider {
                class,
                message,
                answer: super::ProviderAnswer::of(err),
            },
        }
    }
}

impl Session {
    /// The next request of the turn, the history lent to it with that request's tool-result
    /// cuts: what [`Session::send`] sends and what the context inspector renders (one
    /// assembly for both).
    pub(super) async fn lend_request(
        &mut self,
        tool_specs: &[ToolSpec],
        tools_bytes: usize,
        max_out: u64,
        stream: bool,
    ) -> Lent<'_> {
        let live = Arc::clone(&self.live);
        let policy = &live.policy;
        let limits = self.state.tool_result_limits(policy);
        // The cuts are undone when the loan is dropped (see `Loan`), so the journal's mark
        // stays.
        let (cuts, cut_report) =
            budget::cut(self.history.keeping_mark(), limits, self.store.as_ref()).await;
        // What this request weighs as cairn measures it: the basis every token count of
        // the server is converted with.
        let sent_weight = history::weight(&self.history) + tools_bytes;
        let limit = output_limit(max_out, self.window(), &self.state, sent_weight);
        let mut messages = std::mem::take(self.history.keeping_mark());
        // The turn's instructions follow the system prompt in this request only.
        let instructions = self.options.instructions.as_ref().map(|text| {
            let at = messages.iter().take_while(|m| m.is_system()).count();
            messages.insert(at, Message::system(text.clone()));
            at
        });
        let context = crate::provider::context_management::server_context(
            live.spec.provider.kind,
            policy,
            self.state
                .chars_per_token
                .tokens(Budget::compute(&self.budget_inputs(), policy, &self.state).chars),
        );
        Lent {
            loan: Loan {
                request: ChatRequest {
                    model: live.spec.provider.model.clone(),
                    messages,
                    tools: tool_specs.to_vec(),
                    max_output_tokens: limit,
                    stream,
                    controls: self.options.controls.clone(),
                    context,
                },
                cuts,
                instructions,
                home: self.history.keeping_mark(),
            },
            sent_weight,
            limit,
            cuts_made: cut_report.changed as u64,
        }
    }
}

/// One request's [`Loan`] and what its assembly measured.
pub(super) struct Lent<'h> {
    pub(super) loan: Loan<'h>,
    /// The request's weight as cairn measures it (history after the cuts plus the reserve).
    pub(super) sent_weight: usize,
    /// The output-token limit sent.
    pub(super) limit: u64,
    /// Tool results the request carries cut.
    pub(super) cuts_made: u64,
}

impl Session {
    /// Mirrors what the provider's context management did (`engine: provider`): the tool
    /// results it cleared become stubs with their originals archived.
    async fn mirror_server_context(
        &mut self,
        resp: &ChatResponse,
        changes: &mut Changes,
        notices: &mut Notices,
    ) {
        use crate::provider::context_management::AppliedContext;
        let live = Arc::clone(&self.live);
        let e = &live.policy.provider_engine;
        let before = self.history.to_vec();
        let (kind, out, message) = match &resp.context {
            Some(AppliedContext::ClearedToolUses {
                cleared_tool_uses,
                cleared_input_tokens,
            }) => {
                let out = crate::compact::mirror::mirror_cleared_tool_uses(
                    &mut self.history,
                    *cleared_tool_uses as usize,
                    e.keep_tool_uses as usize,
                    &e.exclude_tools,
                    self.store.as_ref(),
                )
                .await;
                let message = format!(
                    "the provider cleared {cleared_tool_uses} old tool results ({cleared_input_tokens} input tokens); {} are stubs here now, their originals recallable",
                    out.stubbed
                );
                ("clear_tool_uses", out, message)
            }
            Some(AppliedContext::Compaction { item }) => {
                let Some(out) = crate::compact::mirror::mirror_compaction(
                    &mut self.history,
                    item,
                    self.store.as_ref(),
                )
                .await
                else {
                    return;
                };
                let message = format!(
                    "the provider compacted {} earlier messages into its compaction item; the originals are archived and recallable",
                    out.stubbed
                );
                ("compaction", out, message)
            }
            None => return,
        };
        self.metrics
            .provider_context_edits
            .get_or_create(&KindLabels { kind })
            .inc();
        if out.stubbed == 0 {
            return;
        }
        if let Some(q) = &out.quality {
            self.publish_cut_score(crate::compact::Pass::Mirror.label(), q);
        }
        if changes.pre.is_none() {
            changes.pre = Some(before);
        }
        changes.post_len = self.history.len();
        changes.records.push(CompactionRecord {
            trigger: "provider".into(),
            level: 0,
            bytes_before: out.bytes_before as u64,
            bytes_after: out.bytes_after as u64,
            archived: out.archived.iter().map(|k| k.as_str().to_owned()).collect(),
            score: out.quality.as_ref().map(|q| q.score),
        });
        notice(notices, "compaction", message);
    }

    /// A reply cut short that no escalation fixes is never silent: a notice (an SSE event
    /// when streaming), a counter in `status.session`, a metric.
    fn report_truncation(
        &mut self,
        cut: Truncation,
        usage: &Usage,
        limit: u64,
        notices: &mut Notices,
    ) -> &'static str {
        if let Some(window) = cut.learned_window(usage, self.live.limits.context_window) {
            self.state.learn_window(window);
        }
        let reason = cut.label();
        let why = cut.explain(usage, limit, self.window());
        self.state.truncated_replies += 1;
        self.metrics
            .truncated_replies
            .get_or_create(&ReasonLabels { reason })
            .inc();
        notice(
            notices,
            "truncated",
            format!("the reply is incomplete: {why}"),
        );
        reason
    }
}

fn tool_label(name: &str) -> &'static str {
    match name {
        tools::RECALL => tools::RECALL,
        tools::COMPRESS => tools::COMPRESS,
        TOOL_SEARCH => TOOL_SEARCH,
        _ => "unknown",
    }
}

/// The history lent to one provider request: the request's messages are the session's
/// history with that request's tool-result cuts applied in place. Dropping the loan — after
/// the call, or when the turn is cancelled in the middle of it — puts the history back whole.
pub(super) struct Loan<'h> {
    pub(super) request: ChatRequest,
    cuts: budget::Cuts,
    /// Where the turn's instructions were inserted (they are not part of the history).
    pub(super) instructions: Option<usize>,
    home: &'h mut Vec<Message>,
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        let mut messages = std::mem::take(&mut self.request.messages);
        if let Some(at) = self.instructions
            && at < messages.len()
        {
            messages.remove(at);
        }
        std::mem::take(&mut self.cuts).restore(&mut messages);
        *self.home = messages;
    }
}
