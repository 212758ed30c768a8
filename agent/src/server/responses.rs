//! `POST /v1/responses`: the subset of the OpenAI Responses API that drives a session.
//!
//! Accepted: `input` as a string or a list of message items (`{"role", "content"}` with a
//! string or `input_text` parts; `type: "message"` optional), `stream`, `model` (echoed;
//! the session's model answers). `instructions`, `tools` and sampling parameters are
//! ignored: the session's spec decides them. The answer is a Response object whose `output`
//! holds one assistant message with one `output_text` part; with `stream: true` the same
//! arrives as the SSE events the OpenAI SDKs expect (`response.created`, `.in_progress`,
//! `.output_item.added`, `.content_part.added`, `.output_text.delta`, `.output_text.done`,
//! `.content_part.done`, `.output_item.done`, `.completed`; `.failed` on error), the text
//! forwarded as the provider sends it and each notice as a `response.cairn.notice` event
//! when it happens. Only `response.completed` acknowledges the turn: it is sent once the
//! turn is in the journal.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::history::Message;
use crate::metrics::Metrics;
use crate::session::{Notice, TurnEvent, TurnOutcome};

use super::{ApiError, AppState, busy, parse_json};

/// Text of one `response.output_text.delta` event.
const DELTA_CHARS: usize = 256;

fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}_{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    )
}

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

/// The input messages of a request.
pub fn parse_input(body: &Value) -> Result<Vec<Message>, ApiError> {
    let Some(obj) = body.as_object() else {
        return Err(bad(
            "invalid_body",
            "the body must be a JSON object with an `input`",
        ));
    };
    match obj.get("input") {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(vec![Message::user(s.clone())]),
        Some(Value::String(_)) => Err(bad("empty_input", "input is empty")),
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, item)| parse_item(i, item))
            .collect(),
        Some(Value::Array(_)) => Err(bad("empty_input", "input has no items")),
        None => Err(bad("missing_input", "`input` is required")),
        Some(_) => Err(bad(
            "invalid_input",
            "input must be a string or a list of message items",
        )),
    }
}

fn parse_item(i: usize, item: &Value) -> Result<Message, ApiError> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    if kind != "message" {
        return Err(bad(
            "unsupported_item",
            format!("input[{i}]: item type {kind:?} is not supported (only messages)"),
        ));
    }
    let text = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "text" | "output_text"), Some(t)) => text.push_str(t),
                    (t, _) => {
                        return Err(bad(
                            "unsupported_content",
                            format!(
                                "input[{i}].content[{j}]: part type {:?} is not supported (only text)",
                                t.unwrap_or("none")
                            ),
                        ));
                    }
                }
            }
            text
        }
        _ => {
            return Err(bad(
                "invalid_content",
                format!("input[{i}]: content must be a string or a list of text parts"),
            ));
        }
    };
    match item.get("role").and_then(Value::as_str) {
        Some("user") => Ok(Message::user(text)),
        Some("system" | "developer") => Ok(Message::system(text)),
        Some(r) => Err(bad(
            "unsupported_role",
            format!(
                "input[{i}]: role {r:?} is not accepted; the session keeps its own assistant messages"
            ),
        )),
        None => Err(bad("missing_role", format!("input[{i}]: role is required"))),
    }
}

struct Ids {
    response: String,
    message: String,
    created: u64,
    model: String,
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
        Some(o) => json!([message_item(
            item_id.unwrap_or(&ids.message),
            status,
            Some(&o.text)
        )]),
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
        "instructions": null,
        "metadata": {},
        "parallel_tool_calls": false,
        "temperature": null,
        "top_p": null,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "cairn": {
            "notices": outcome.map(|o| o.notices.clone()).unwrap_or_default(),
            "rounds": outcome.map(|o| o.rounds),
            "stopped": outcome.and_then(|o| o.stopped),
        },
    })
}

fn message_item(id: &str, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        Some(t) => json!([{"type": "output_text", "text": t, "annotations": []}]),
        None => json!([]),
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

pub async fn create(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = parse_json(&body?)?;
    let input = parse_input(&body)?;
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("invalid_stream", "stream must be a boolean")),
    };
    state.check_owned()?;
    let session = state.session.clone().try_lock_owned().map_err(|_| busy())?;
    let ids = Ids {
        response: new_id("resp"),
        message: new_id("msg"),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| session.live().spec.provider.model.clone()),
    };
    if !stream {
        // The turn runs in its own task, as a streamed one does: a client that goes away
        // mid-turn (dropping this handler) does not cancel it; it runs to the end and is
        // journaled, so the next request never finds a question without its answer.
        let task_state = state.clone();
        let turn = tokio::spawn(async move {
            let mut session = session;
            let result = session.turn(input).await;
            task_state.publish(&session);
            result
        });
        let outcome = turn.await.map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "turn_failed",
                format!("the turn task failed: {e}"),
            )
        })??;
        return Ok(axum::Json(response_object(
            &ids,
            None,
            "completed",
            Some(&outcome),
            None,
        ))
        .into_response());
    }

    let (tx, rx) = tokio::sync::mpsc::channel::<Sent>(64);
    let task_state = state.clone();
    tokio::spawn(async move {
        let mut session = session;
        let mut out = Writer::new(tx, ids, Arc::clone(&task_state.metrics));
        let created = response_object(&out.ids, None, "in_progress", None, None);
        out.send("response.created", json!({ "response": created }))
            .await;
        out.send("response.in_progress", json!({ "response": created }))
            .await;
        let (ev_tx, mut ev_rx) = tokio::sync::mpsc::unbounded_channel();
        let turn = session.turn_streaming(input, ev_tx);
        let forward = async {
            while let Some(ev) = ev_rx.recv().await {
                out.on_event(ev).await;
            }
        };
        let (result, ()) = tokio::join!(turn, forward);
        task_state.publish(&session);
        drop(session);
        match result {
            Ok(outcome) => out.complete(&outcome).await,
            Err(e) => out.fail(ApiError::from(e)).await,
        }
    });
    let stream = tokio_stream_from(rx)
        .map(|(ty, data)| Ok::<_, Infallible>(Event::default().event(ty).data(data.to_string())));
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response())
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
}

impl Writer {
    fn new(tx: tokio::sync::mpsc::Sender<Sent>, ids: Ids, metrics: Arc<Metrics>) -> Self {
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
        }
    }

    /// A client that went away does not stop the turn: it is journaled all the same.
    async fn send(&mut self, ty: &'static str, mut data: Value) {
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
            self.metrics.observe(
                "cairn_agent_first_text_seconds",
                &[],
                self.started.elapsed().as_secs_f64(),
            );
        }
        for chunk in chunks(text, DELTA_CHARS) {
            self.item.text.push_str(chunk);
            let data = self.part(json!({"delta": chunk, "logprobs": []}));
            self.send("response.output_text.delta", data).await;
        }
    }

    /// Ends the current message as `incomplete`: its text is not part of the answer.
    async fn abandon(&mut self) {
        self.metrics
            .inc("cairn_agent_stream_abandoned_total", &[], 1.0);
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

    async fn complete(&mut self, outcome: &TurnOutcome) {
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
        self.send(event, json!({ "response": response })).await;
    }

    async fn fail(&mut self, err: ApiError) {
        if self.item.opened {
            self.abandon().await;
        }
        let error = json!({"code": err.code, "message": err.message});
        let response = response_object(&self.ids, None, "failed", None, Some(error));
        self.send("response.failed", json!({ "response": response }))
            .await;
    }
}

fn notice_json(n: &Notice) -> Value {
    json!({"kind": n.kind, "message": n.message})
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Splits on char boundaries into pieces of about `n` bytes.
fn chunks(s: &str, n: usize) -> Vec<&str> {
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
    fn input_forms() {
        assert_eq!(
            parse_input(&json!({"input": "hi"})).ok().unwrap(),
            vec![Message::user("hi")]
        );
        let items = json!({"input": [
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}
        ]});
        assert_eq!(
            parse_input(&items).ok().unwrap(),
            vec![Message::system("be brief"), Message::user("ab")]
        );
        for bad in [
            json!({}),
            json!({"input": ""}),
            json!({"input": []}),
            json!({"input": 3}),
            json!({"input": [{"role": "assistant", "content": "x"}]}),
            json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
            json!({"input": [{"type": "function_call_output"}]}),
        ] {
            assert!(parse_input(&bad).is_err(), "{bad}");
        }
    }

    fn ids() -> Ids {
        Ids {
            response: "resp_1".into(),
            message: "msg_1".into(),
            created: 0,
            model: "m".into(),
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
        }
    }

    async fn written(events: Vec<TurnEvent>, end: Result<&str, ()>) -> Vec<Sent> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        let mut w = Writer::new(tx, ids(), Arc::new(Metrics::new()));
        for ev in events {
            w.on_event(ev).await;
        }
        match end {
            Ok(text) => w.complete(&outcome(text)).await,
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
