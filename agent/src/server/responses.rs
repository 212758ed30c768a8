//! `POST /v1/responses`: the subset of the OpenAI Responses API that drives a session.
//!
//! Accepted: `input` as a string or a list of message items (`{"role", "content"}` with a
//! string or `input_text` parts; `type: "message"` optional), `stream`, `model` (echoed;
//! the session's model answers). `instructions`, `tools` and sampling parameters are
//! ignored: the session's spec decides them. The answer is a Response object whose `output`
//! holds one assistant message with one `output_text` part; with `stream: true` the same
//! arrives as the SSE events the OpenAI SDKs expect (`response.created`, `.in_progress`,
//! `.output_item.added`, `.content_part.added`, `.output_text.delta`, `.output_text.done`,
//! `.content_part.done`, `.output_item.done`, `.completed`; `.failed` on error), with each
//! notice as a `response.cairn.notice` event before the output.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::history::Message;
use crate::session::{Notice, TurnOutcome};

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

fn response_object(
    ids: &Ids,
    status: &str,
    outcome: Option<&TurnOutcome>,
    error: Option<Value>,
) -> Value {
    let output = match outcome {
        Some(o) => json!([message_item(ids, "completed", Some(&o.text))]),
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
        "incomplete_details": null,
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

fn message_item(ids: &Ids, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        Some(t) => json!([{"type": "output_text", "text": t, "annotations": []}]),
        None => json!([]),
    };
    json!({"type": "message", "id": ids.message, "status": status, "role": "assistant", "content": content})
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
        let mut session = session;
        let result = session.turn(input).await;
        state.publish(&session);
        let outcome = result?;
        return Ok(
            axum::Json(response_object(&ids, "completed", Some(&outcome), None)).into_response(),
        );
    }

    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let task_state = state.clone();
    tokio::spawn(async move {
        let mut session = session;
        let mut seq = 0u64;
        let mut send = |ty: &str, mut data: Value| {
            if let Some(o) = data.as_object_mut() {
                o.insert("type".into(), json!(ty));
                o.insert("sequence_number".into(), json!(seq));
            }
            seq += 1;
            Event::default().event(ty).data(data.to_string())
        };
        let created = response_object(&ids, "in_progress", None, None);
        let _ = tx
            .send(send("response.created", json!({"response": created})))
            .await;
        let _ = tx
            .send(send("response.in_progress", json!({"response": created})))
            .await;
        let result = session.turn(input).await;
        task_state.publish(&session);
        drop(session);
        match result {
            Ok(outcome) => {
                for n in &outcome.notices {
                    let _ = tx.send(send("response.cairn.notice", notice_json(n))).await;
                }
                let base = json!({"item_id": ids.message, "output_index": 0, "content_index": 0});
                let with = |mut v: Value, extra: Value| {
                    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                        for (k, x) in e {
                            o.insert(k.clone(), x.clone());
                        }
                    }
                    v
                };
                let events = [
                    (
                        "response.output_item.added",
                        json!({"output_index": 0, "item": message_item(&ids, "in_progress", None)}),
                    ),
                    (
                        "response.content_part.added",
                        with(
                            base.clone(),
                            json!({"part": {"type": "output_text", "text": "", "annotations": []}}),
                        ),
                    ),
                ];
                for (ty, data) in events {
                    let _ = tx.send(send(ty, data)).await;
                }
                for chunk in chunks(&outcome.text, DELTA_CHARS) {
                    let _ = tx
                        .send(send(
                            "response.output_text.delta",
                            with(base.clone(), json!({"delta": chunk, "logprobs": []})),
                        ))
                        .await;
                }
                let done = [
                    (
                        "response.output_text.done",
                        with(base.clone(), json!({"text": outcome.text, "logprobs": []})),
                    ),
                    (
                        "response.content_part.done",
                        with(
                            base.clone(),
                            json!({"part": {"type": "output_text", "text": outcome.text, "annotations": []}}),
                        ),
                    ),
                    (
                        "response.output_item.done",
                        json!({"output_index": 0, "item": message_item(&ids, "completed", Some(&outcome.text))}),
                    ),
                    (
                        "response.completed",
                        json!({"response": response_object(&ids, "completed", Some(&outcome), None)}),
                    ),
                ];
                for (ty, data) in done {
                    let _ = tx.send(send(ty, data)).await;
                }
            }
            Err(e) => {
                let err = ApiError::from(e);
                let error = json!({"code": err.code, "message": err.message});
                let _ = tx
                    .send(send(
                        "response.failed",
                        json!({"response": response_object(&ids, "failed", None, Some(error))}),
                    ))
                    .await;
            }
        }
    });
    let stream = tokio_stream_from(rx).map(Ok::<_, Infallible>);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response())
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

    #[test]
    fn chunks_respect_char_boundaries() {
        let s = "é".repeat(300);
        let c = chunks(&s, 255);
        assert_eq!(c.concat(), s);
        assert!(c.len() > 1);
    }
}
