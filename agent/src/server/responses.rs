//! `POST /v1/responses`: the OpenAI Responses API on a session (docs/agent.md "Responses
//! API" lists every field: what is sent on, what is echoed, what is refused).
//!
//! The input is reconciled with the session's ledger (`crate::replay`), so incremental and
//! replaying clients both append each item once. The answer is a Response object whose
//! `output` holds the assistant message and one `function_call` item per call of a client
//! tool; with `stream: true` the same arrives as the SSE events the OpenAI SDKs parse
//! (`response.created`, `.in_progress`, the message's `.output_item.*`, `.content_part.*`
//! and `.output_text.*` events, the function-call events, `.completed`; `.failed` on
//! error), the text forwarded as the provider sends it and each notice as a
//! `response.cairn.notice` event when it happens. Only `response.completed` acknowledges
//! the turn: it is sent once the turn is in the journal.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::history::{Message, ToolCall};
use crate::metrics::Metrics;
use crate::provider::Controls;
use crate::replay::{self, Api, Held, Incoming, Ledger, Refusal};
use crate::session::{LedgerTurn, Notice, TurnEvent, TurnOptions, TurnOutcome};

use super::items::{self, bad, field, refuse_unknown};
use super::{ApiError, AppState, Head, busy, parse_json};

/// Text of one `response.output_text.delta` event.
const DELTA_CHARS: usize = 256;

pub(super) fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}_{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    )
}

/// The fields of a Responses request this session understands; any other field that is
/// set gets a 400.
const KNOWN_FIELDS: &[&str] = &[
    "model",
    "input",
    "stream",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "metadata",
    "store",
    "previous_response_id",
    "text",
    "include",
    "truncation",
    "reasoning",
    "user",
    "safety_identifier",
    "prompt_cache_key",
];

/// A parsed request.
pub struct Request {
    pub input: Vec<Incoming>,
    pub stream: bool,
    pub store: bool,
    pub previous_response_id: Option<String>,
    pub options: TurnOptions,
    /// What the Response object echoes of the request.
    pub echo: Echo,
}

/// The request's settings as the Response object repeats them.
#[derive(Clone, Debug, Default)]
pub struct Echo {
    model: Option<String>,
    instructions: Value,
    tools: Value,
    tool_choice: Value,
    parallel_tool_calls: Value,
    max_output_tokens: Value,
    temperature: Value,
    top_p: Value,
    metadata: Value,
    store: bool,
    previous_response_id: Value,
    truncation: Value,
    text: Value,
    reasoning: Value,
    /// Images shrunk before they entered the session (`cairn.images`).
    images: Vec<Value>,
}

/// Parses and checks a request body.
pub fn parse_request(body: &Value) -> Result<Request, ApiError> {
    let Some(obj) = body.as_object() else {
        return Err(bad(
            "invalid_body",
            "the body must be a JSON object with an `input`",
        ));
    };
    refuse_unknown(obj, KNOWN_FIELDS, "POST /v1/responses")?;
    let input = items::responses_input(obj)?;
    let stream = items::opt_bool(obj, "stream")?.unwrap_or(false);
    let store = items::opt_bool(obj, "store")?.unwrap_or(true);
    let tools = items::function_tools(obj, Api::Responses)?;
    let mcp_servers = items::mcp_selections(obj)?;
    let tool_choice = items::tool_choice(obj, Api::Responses, &tools)?;
    let controls = Controls {
        tool_choice,
        parallel_tool_calls: items::opt_bool(obj, "parallel_tool_calls")?,
        temperature: items::opt_f64(obj, "temperature", 0.0..=2.0)?,
        top_p: items::opt_f64(obj, "top_p", 0.0..=1.0)?,
        format: items::output_format(obj, Api::Responses)?,
        effort: items::effort(obj, Api::Responses)?,
    };
    let instructions = items::opt_str(obj, "instructions")?
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let max_output_tokens = items::opt_tokens(obj, "max_output_tokens")?;
    let metadata = items::metadata(obj)?;
    let previous_response_id = items::opt_str(obj, "previous_response_id")?.map(str::to_owned);
    match field(obj, "include") {
        None => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(_) => {
            return Err(bad(
                "unsupported_field",
                "include: no additional output data is supported (send an empty list or omit it)",
            ));
        }
    }
    match items::opt_str(obj, "truncation")? {
        None | Some("disabled" | "auto") => {}
        Some(t) => {
            return Err(bad(
                "invalid_field",
                format!("truncation {t:?} is not one of disabled, auto"),
            ));
        }
    }
    for key in ["user", "safety_identifier", "prompt_cache_key"] {
        items::opt_str(obj, key)?;
    }
    let echo = Echo {
        model: items::opt_str(obj, "model")?.map(str::to_owned),
        instructions: json!(instructions),
        tools: field(obj, "tools").cloned().unwrap_or_else(|| json!([])),
        tool_choice: field(obj, "tool_choice")
            .cloned()
            .unwrap_or_else(|| json!("auto")),
        parallel_tool_calls: json!(controls.parallel_tool_calls.unwrap_or(true)),
        max_output_tokens: json!(max_output_tokens),
        temperature: json!(controls.temperature),
        top_p: json!(controls.top_p),
        metadata,
        store,
        previous_response_id: json!(previous_response_id),
        truncation: json!(items::opt_str(obj, "truncation")?.unwrap_or("disabled")),
        text: json!({"format": controls
            .format
            .as_ref()
            .map_or_else(|| json!({"type": "text"}), |f| f.responses_format())}),
        reasoning: json!({"effort": controls.effort.map(|e| e.as_str())}),
        images: Vec::new(),
    };
    Ok(Request {
        input,
        stream,
        store,
        previous_response_id,
        options: TurnOptions {
            tools,
            instructions,
            controls,
            max_output_tokens,
            ledger: None,
            mcp_servers,
        },
        echo,
    })
}

/// The new items of a request, as messages of the session and entries of its ledger; or why
/// the input does not fit the conversation the session holds (nothing is changed then).
pub fn reconciled(
    ledger: &Ledger,
    api: Api,
    input: &[Incoming],
    previous_response_id: Option<&str>,
) -> Result<(Vec<Message>, Vec<Held>), ApiError> {
    let from = replay::reconcile(ledger, api, input, previous_response_id).map_err(|r| {
        let status = match r {
            Refusal::PreviousNotFound(_) | Refusal::NothingNew(_) => StatusCode::BAD_REQUEST,
            Refusal::Stale { .. } | Refusal::Diverged { .. } => StatusCode::CONFLICT,
        };
        ApiError::new(status, r.code(), r.to_string())
    })?;
    let new: Vec<replay::Item> = input[from..].iter().map(|i| i.item.clone()).collect();
    let held = new.iter().map(Held::input).collect();
    Ok((replay::to_messages(&new), held))
}

pub struct Ids {
    pub response: String,
    pub message: String,
    pub created: u64,
    pub model: String,
    pub echo: Echo,
}

/// A Response object; its output message is `item_id` (the request's message id when
/// `None`).
fn response_object(
    ids: &Ids,
    item_id: Option<&str>,
    status: &str,
    outcome: Option<&TurnOutcome>,
    error: Option<Value>,
) -> Value {
    // A reply cut short that nothing could fix is an incomplete response, as OpenAI marks one
    // stopped by its output limit.
    let truncated = outcome.and_then(|o| o.truncated);
    let status = if status == "completed" && truncated.is_some() {
        "incomplete"
    } else {
        status
    };
    let output = match outcome {
        Some(o) => {
            let mut out = Vec::new();
            if has_message(o) {
                out.push(message_item(
                    item_id.unwrap_or(&ids.message),
                    status,
                    Some(&o.text),
                ));
            }
            out.extend(o.calls.iter().map(|c| call_item(c, "completed", true)));
            Value::Array(out)
        }
        None => json!([]),
    };
    let usage = outcome.map(|o| {
        json!({
            "input_tokens": o.usage.input_tokens,
            "input_tokens_details": {"cached_tokens": o.usage.cache_read_tokens},
            "output_tokens": o.usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": o.usage.input_tokens + o.usage.output_tokens,
        })
    });
    let e = &ids.echo;
    json!({
        "id": ids.response,
        "object": "response",
        "created_at": ids.created,
        "status": status,
        "model": ids.model,
        "output": output,
        "usage": usage,
        "error": error,
        "incomplete_details": truncated.map(|reason| json!({"reason": "max_output_tokens", "cairn_reason": reason})),
        "instructions": e.instructions,
        "metadata": e.metadata,
        "parallel_tool_calls": e.parallel_tool_calls,
        "max_output_tokens": e.max_output_tokens,
        "previous_response_id": e.previous_response_id,
        "store": e.store,
        "temperature": e.temperature,
        "top_p": e.top_p,
        "tool_choice": e.tool_choice,
        "tools": e.tools,
        "text": e.text,
        "reasoning": e.reasoning,
        "truncation": e.truncation,
        "cairn": {
            "notices": outcome.map(|o| o.notices.clone()).unwrap_or_default(),
            "rounds": outcome.map(|o| o.rounds),
            "stopped": outcome.and_then(|o| o.stopped),
            "images": e.images,
        },
    })
}

/// A response carries a message when it has text, or when it has nothing else.
fn has_message(o: &TurnOutcome) -> bool {
    !o.text.is_empty() || o.calls.is_empty()
}

fn message_item(id: &str, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        Some(t) => json!([{"type": "output_text", "text": t, "annotations": []}]),
        None => json!([]),
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

/// A `function_call` output item (its arguments empty while it is being streamed).
fn call_item(c: &ToolCall, status: &str, with_arguments: bool) -> Value {
    json!({
        "type": "function_call",
        "id": replay::call_item_id(&c.id),
        "call_id": c.id,
        "name": c.name,
        "arguments": if with_arguments { c.arguments.as_str() } else { "" },
        "status": status,
    })
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub async fn create(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = parse_json(&body?)?;
    let request = parse_request(&body)?;
    state.check_owned()?;
    let session = state.session.clone().try_lock_owned().map_err(|_| busy())?;
    let (mut input, held) = reconciled(
        session.ledger(),
        Api::Responses,
        &request.input,
        request.previous_response_id.as_deref(),
    )?;
    let Request {
        stream,
        store,
        mut options,
        mut echo,
        ..
    } = request;
    let response = new_id("resp");
    options.ledger = Some(LedgerTurn {
        input: held,
        response_id: response.clone(),
    });
    session.check_request(&input, &options)?;
    echo.images = items::prepare_images(&mut input, state.store.as_ref()).await?;
    let ids = Ids {
        response,
        message: new_id("msg"),
        created: now_secs(),
        model: echo
            .model
            .clone()
            .unwrap_or_else(|| session.live().spec.provider.model.clone()),
        echo,
    };
    if !stream {
        let outcome = super::detached_turn(&state, session, input, options).await?;
        let response = response_object(&ids, None, "completed", Some(&outcome), None);
        if store {
            state.remember(&ids.response, &response).await;
        }
        return Ok(axum::Json(response).into_response());
    }

    let (tx, rx) = tokio::sync::mpsc::channel::<Sent>(64);
    let (head, head_wait) = super::hold_head();
    let task_state = state.clone();
    tokio::spawn(async move {
        let mut session = session;
        let mut out = Writer::new(tx, ids, Arc::clone(&task_state.metrics), head);
        let (ev_tx, mut ev_rx) = tokio::sync::mpsc::unbounded_channel();
        let turn = session.turn_with_options(input, options, Some(ev_tx));
        let forward = async {
            while let Some(ev) = ev_rx.recv().await {
                out.on_event(ev).await;
            }
        };
        let work = task_state.begin();
        let (result, ()) = tokio::join!(turn, forward);
        task_state.publish(&session);
        drop(work);
        drop(session);
        match result {
            Ok(outcome) => {
                let response = out.complete(&outcome).await;
                if store {
                    task_state.remember(&out.ids.response, &response).await;
                }
            }
            Err(e) => out.fail(ApiError::from(e)).await,
        }
    });
    head_wait.wait(super::STREAM_HEAD_HOLD).await?;
    let stream = tokio_stream_from(rx)
        .map(|(ty, data)| Ok::<_, Infallible>(Event::default().event(ty).data(data.to_string())));
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response())
}

/// `GET /v1/responses/{id}`: one of the session's recent responses.
pub async fn get(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id.map_err(|e| bad("invalid_id", e.body_text()))?;
    state
        .recalled(&id)
        .await
        .map(|r| axum::Json(r).into_response())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "response_not_found",
                format!(
                    "no recent response {id:?} in this session (the last {} stored ones are kept)",
                    super::RECENT_RESPONSES
                ),
            )
        })
}

/// An SSE event: its type and its data.
type Sent = (&'static str, Value);

/// The output message being streamed.
struct Item {
    id: String,
    index: usize,
    text: String,
    /// `response.output_item.added` was sent.
    opened: bool,
    /// Text it starts with once opened: the answer accepted before a retried call.
    kept: String,
}

/// Writes the SSE events of one streamed response. Text is forwarded as the provider sends
/// it into one output message; when a model call that already streamed text fails and is
/// retried, that message is closed as `incomplete` and a new one starts with the answer
/// accepted before the failed call, so the last message always ends up holding exactly the
/// final answer, which `response.completed` carries. The replacement message opens with the
/// first text that follows, so a turn that fails after the retry leaves no empty message.
struct Writer {
    tx: tokio::sync::mpsc::Sender<Sent>,
    ids: Ids,
    seq: u64,
    item: Item,
    metrics: Arc<Metrics>,
    started: Instant,
    first_text: bool,
    /// The response head, held until the first event (`response.created` goes with it).
    head: Head,
    begun: bool,
}

impl Writer {
    fn new(
        tx: tokio::sync::mpsc::Sender<Sent>,
        ids: Ids,
        metrics: Arc<Metrics>,
        head: Head,
    ) -> Self {
        let item = Item {
            id: ids.message.clone(),
            index: 0,
            text: String::new(),
            opened: false,
            kept: String::new(),
        };
        Self {
            tx,
            ids,
            seq: 0,
            item,
            metrics,
            started: Instant::now(),
            first_text: false,
            head,
            begun: false,
        }
    }

    /// Sends an event; the first one releases the held head and goes after
    /// `response.created` and `response.in_progress`.
    async fn send(&mut self, ty: &'static str, data: Value) {
        if !self.begun {
            self.begun = true;
            self.head.start();
            let created = response_object(&self.ids, None, "in_progress", None, None);
            self.emit("response.created", json!({ "response": created }))
                .await;
            self.emit("response.in_progress", json!({ "response": created }))
                .await;
        }
        self.emit(ty, data).await;
    }

    /// A client that went away does not stop the turn: it is journaled all the same.
    async fn emit(&mut self, ty: &'static str, mut data: Value) {
        if let Some(o) = data.as_object_mut() {
            o.insert("type".into(), json!(ty));
            o.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        let _ = self.tx.send((ty, data)).await;
    }

    fn part(&self, extra: Value) -> Value {
        let mut v =
            json!({"item_id": self.item.id, "output_index": self.item.index, "content_index": 0});
        if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        v
    }

    async fn open_item(&mut self) {
        if self.item.opened {
            return;
        }
        self.item.opened = true;
        let item = message_item(&self.item.id, "in_progress", None);
        self.send(
            "response.output_item.added",
            json!({"output_index": self.item.index, "item": item}),
        )
        .await;
        let part =
            self.part(json!({"part": {"type": "output_text", "text": "", "annotations": []}}));
        self.send("response.content_part.added", part).await;
        let kept = std::mem::take(&mut self.item.kept);
        self.delta(&kept).await;
    }

    async fn delta(&mut self, text: &str) {
        if !self.first_text && !text.is_empty() {
            self.first_text = true;
            self.metrics
                .first_text_seconds
                .observe(self.started.elapsed().as_secs_f64());
        }
        for chunk in chunks(text, DELTA_CHARS) {
            self.item.text.push_str(chunk);
            let data = self.part(json!({"delta": chunk, "logprobs": []}));
            self.send("response.output_text.delta", data).await;
        }
    }

    /// Ends the current message as `incomplete`: its text is not part of the answer.
    async fn abandon(&mut self) {
        self.metrics.stream_abandoned.inc();
        let item = message_item(&self.item.id, "incomplete", Some(&self.item.text));
        self.send(
            "response.output_item.done",
            json!({"output_index": self.item.index, "item": item}),
        )
        .await;
    }

    /// Abandons the current message; the next one starts with `kept`.
    async fn restart(&mut self, kept: String) {
        if self.item.opened {
            self.abandon().await;
            self.item = Item {
                id: new_id("msg"),
                index: self.item.index + 1,
                text: String::new(),
                opened: false,
                kept,
            };
        } else {
            self.item.kept = kept;
        }
    }

    async fn on_event(&mut self, ev: TurnEvent) {
        match ev {
            TurnEvent::Text(t) => {
                self.open_item().await;
                self.delta(&t).await;
            }
            TurnEvent::Discarded { kept } => self.restart(kept).await,
            TurnEvent::Notice(n) => self.send("response.cairn.notice", notice_json(&n)).await,
        }
    }

    /// Ends the stream with the answer and the client's calls; returns the Response object.
    async fn complete(&mut self, outcome: &TurnOutcome) -> Value {
        let mut next_index = self.item.index;
        if has_message(outcome) {
            self.finish_message(outcome).await;
            next_index = self.item.index + 1;
        } else if self.item.opened {
            // Text was streamed but the answer has none (a void call): not part of it.
            self.abandon().await;
            next_index = self.item.index + 1;
        }
        for (i, call) in outcome.calls.iter().enumerate() {
            let index = next_index + i;
            let item_id = replay::call_item_id(&call.id);
            self.send(
                "response.output_item.added",
                json!({"output_index": index, "item": call_item(call, "in_progress", false)}),
            )
            .await;
            self.send(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": call.arguments}),
            )
            .await;
            self.send(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "name": call.name, "arguments": call.arguments}),
            )
            .await;
            self.send(
                "response.output_item.done",
                json!({"output_index": index, "item": call_item(call, "completed", true)}),
            )
            .await;
        }
        let response = response_object(
            &self.ids,
            Some(&self.item.id),
            "completed",
            Some(outcome),
            None,
        );
        let event = if outcome.truncated.is_some() {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.send(event, json!({ "response": response.clone() }))
            .await;
        response
    }

    async fn finish_message(&mut self, outcome: &TurnOutcome) {
        self.open_item().await;
        // A provider whose stream did not add up to its reply still ends in the right text.
        if self.item.text != outcome.text {
            tracing::warn!(
                streamed = self.item.text.len(),
                answer = outcome.text.len(),
                "the streamed text differs from the answer; resending it whole"
            );
            self.restart(outcome.text.clone()).await;
            self.open_item().await;
        }
        let text = &outcome.text;
        let done = self.part(json!({"text": text, "logprobs": []}));
        self.send("response.output_text.done", done).await;
        let part =
            self.part(json!({"part": {"type": "output_text", "text": text, "annotations": []}}));
        self.send("response.content_part.done", part).await;
        let item_status = if outcome.truncated.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        let item = message_item(&self.item.id, item_status, Some(text));
        self.send(
            "response.output_item.done",
            json!({"output_index": self.item.index, "item": item}),
        )
        .await;
    }

    /// Ends the stream with `response.failed`; a turn that failed before its first event is
    /// answered with the error's own status instead, while the head is held.
    async fn fail(&mut self, err: ApiError) {
        let err = if self.begun {
            err
        } else {
            match self.head.fail(err) {
                Some(err) => err,
                None => return,
            }
        };
        if self.item.opened {
            self.abandon().await;
        }
        let error = err.response_error();
        let response = response_object(&self.ids, None, "failed", None, Some(error));
        self.send("response.failed", json!({ "response": response }))
            .await;
    }
}

pub(super) fn notice_json(n: &Notice) -> Value {
    json!({"kind": n.kind, "message": n.message})
}

pub(super) fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Splits on char boundaries into pieces of about `n` bytes.
pub(super) fn chunks(s: &str, n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < s.len() {
        let mut end = (start + n).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        out.push(&s[start..end]);
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        for (body, named) in [
            (json!({"input": "x", "background": true}), "background"),
            (
                json!({"input": "x", "text": {"format": {"type": "json_schema"}}}),
                "text",
            ),
            (
                json!({"input": "x", "reasoning": {"summary": "auto"}}),
                "reasoning.summary",
            ),
            (
                json!({"input": "x", "reasoning": {"effort": "maximal"}}),
                "minimal, low",
            ),
            (
                json!({"input": "x", "text": {"verbosity": "low"}}),
                "text.verbosity",
            ),
            (
                json!({"input": "x", "include": ["reasoning.encrypted_content"]}),
                "include",
            ),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "web_search",
            ),
        ] {
            let err = parse_request(&body).err().unwrap();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert!(err.message.contains(named), "{}", err.message);
        }
        let ok = parse_request(&json!({
            "input": "x", "model": "m", "instructions": "be brief", "store": false,
            "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": 100,
            "temperature": 0.2, "top_p": 0.9, "metadata": {"k": "v"}, "include": [],
            "text": {"format": {"type": "text"}}, "truncation": "disabled"
        }))
        .ok()
        .unwrap();
        assert_eq!(ok.options.instructions.as_deref(), Some("be brief"));
        assert_eq!(ok.options.controls.parallel_tool_calls, Some(false));
        assert_eq!(ok.options.max_output_tokens, Some(100));
        assert!(!ok.store);
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let structured = parse_request(&json!({
            "input": "x", "reasoning": {"effort": "high", "summary": null},
            "text": {"format": {"type": "json_schema", "name": "count", "schema": schema, "strict": true}}
        }))
        .ok()
        .unwrap();
        let controls = &structured.options.controls;
        assert_eq!(controls.effort, Some(crate::provider::Effort::High));
        assert_eq!(
            controls.format.as_ref().map(|f| f.responses_format()),
            Some(json!({"type": "json_schema", "name": "count", "schema": schema, "strict": true}))
        );
        assert_eq!(structured.echo.text["format"]["name"], json!("count"));
    }

    fn ids() -> Ids {
        Ids {
            response: "resp_1".into(),
            message: "msg_1".into(),
            created: 0,
            model: "m".into(),
            echo: Echo::default(),
        }
    }

    fn outcome(text: &str) -> TurnOutcome {
        TurnOutcome {
            text: text.into(),
            usage: crate::provider::Usage::default(),
            notices: Vec::new(),
            rounds: 1,
            stopped: None,
            truncated: None,
            calls: Vec::new(),
        }
    }

    async fn written(events: Vec<TurnEvent>, end: Result<&str, ()>) -> Vec<Sent> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        let mut w = Writer::new(
            tx,
            ids(),
            Arc::new(Metrics::new()),
            super::super::hold_head().0,
        );
        for ev in events {
            w.on_event(ev).await;
        }
        match end {
            Ok(text) => {
                w.complete(&outcome(text)).await;
            }
            Err(()) => {
                w.fail(ApiError::new(StatusCode::BAD_GATEWAY, "provider", "cut"))
                    .await
            }
        }
        drop(w);
        let mut out = Vec::new();
        while let Some(e) = rx.recv().await {
            out.push(e);
        }
        out
    }

    fn deltas(sent: &[Sent], item: &str) -> String {
        sent.iter()
            .filter(|(t, d)| *t == "response.output_text.delta" && d["item_id"] == item)
            .filter_map(|(_, d)| d["delta"].as_str())
            .collect()
    }

    fn items(sent: &[Sent], ty: &str) -> Vec<Value> {
        sent.iter()
            .filter(|(t, _)| *t == ty)
            .map(|(_, d)| d["item"].clone())
            .collect()
    }

    #[tokio::test]
    async fn a_retried_call_closes_its_message_and_the_next_one_carries_the_answer() {
        let text = |t: &str| TurnEvent::Text(t.into());
        let sent = written(
            vec![
                text("Let me look."),
                text("\n\n"),
                text("The ans"),
                TurnEvent::Discarded {
                    kept: "Let me look.".into(),
                },
                text("\n\n"),
                text("The answer."),
            ],
            Ok("Let me look.\n\nThe answer."),
        )
        .await;
        let added = items(&sent, "response.output_item.added");
        let done = items(&sent, "response.output_item.done");
        assert_eq!(added.len(), 2);
        assert_eq!(done.len(), 2);
        assert_eq!(done[0]["status"], "incomplete");
        assert_eq!(done[0]["content"][0]["text"], "Let me look.\n\nThe ans");
        assert_eq!(done[1]["status"], "completed");
        let second = added[1]["id"].as_str().unwrap();
        assert_ne!(added[0]["id"], added[1]["id"]);
        assert_eq!(deltas(&sent, second), "Let me look.\n\nThe answer.");
        let (last, data) = sent.last().unwrap();
        assert_eq!(*last, "response.completed");
        assert_eq!(data["response"]["output"][0]["id"], second);
        for (i, (_, d)) in sent.iter().enumerate() {
            assert_eq!(d["sequence_number"], json!(i));
        }
    }

    #[tokio::test]
    async fn a_failure_after_a_retry_leaves_no_empty_message() {
        let sent = written(
            vec![
                TurnEvent::Text("partial".into()),
                TurnEvent::Discarded {
                    kept: String::new(),
                },
            ],
            Err(()),
        )
        .await;
        let types: Vec<&str> = sent.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_item.done",
                "response.failed"
            ]
        );
    }

    #[tokio::test]
    async fn a_stream_that_does_not_add_up_is_replaced_by_the_answer() {
        let sent = written(vec![TurnEvent::Text("abc".into())], Ok("abcd")).await;
        let added = items(&sent, "response.output_item.added");
        assert_eq!(added.len(), 2);
        let second = added[1]["id"].as_str().unwrap();
        assert_eq!(deltas(&sent, second), "abcd");
        assert_eq!(
            sent.last().unwrap().1["response"]["output"][0]["content"][0]["text"],
            "abcd"
        );
    }

    #[test]
    fn chunks_respect_char_boundaries() {
        let s = "é".repeat(300);
        let c = chunks(&s, 255);
        assert_eq!(c.concat(), s);
        assert!(c.len() > 1);
    }
}
