//! `POST /v1/chat/completions`: the OpenAI Chat Completions API on the same session.
//!
//! `messages` is always the whole conversation (that is how the API is defined): the session
//! recognises what it holds and takes only the new suffix (`crate::replay`), so a client that
//! resends everything each call appends nothing twice. Client tools work as on
//! `/v1/responses`: the model's call of one ends the turn with `tool_calls` and
//! `finish_reason: "tool_calls"`, and the next request carries the `role: tool` results.
//! With `stream: true` the answer arrives as `chat.completion.chunk`s (text deltas as the
//! provider sends them, then the tool-call deltas, the finish reason, the usage chunk when
//! `stream_options.include_usage` is set, and `[DONE]`).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::provider::Controls;
use crate::replay::Api;
use crate::session::{LedgerTurn, TurnEvent, TurnOptions, TurnOutcome};

use super::items::{self, bad, field, refuse_unknown};
use super::responses::{chunks, new_id, now_secs, reconciled, tokio_stream_from};
use super::{ApiError, AppState, busy, parse_json};

const KNOWN_FIELDS: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "user",
    "response_format",
    "reasoning_effort",
];

/// Text of one content delta chunk.
const DELTA_CHARS: usize = 256;

struct Request {
    input: Vec<crate::replay::Incoming>,
    stream: bool,
    include_usage: bool,
    model: Option<String>,
    options: TurnOptions,
}

fn parse_request(body: &Value) -> Result<Request, ApiError> {
    let Some(obj) = body.as_object() else {
        return Err(bad(
            "invalid_body",
            "the body must be a JSON object with `messages`",
        ));
    };
    refuse_unknown(obj, KNOWN_FIELDS, "POST /v1/chat/completions")?;
    let input = items::chat_messages(obj)?;
    let stream = items::opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) if o.keys().all(|k| k == "include_usage") => {
            match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(bad(
                        "invalid_field",
                        "stream_options.include_usage must be a boolean",
                    ));
                }
            }
        }
        Some(_) => {
            return Err(bad(
                "unsupported_field",
                "stream_options: only include_usage is supported",
            ));
        }
    };
    match field(obj, "n") {
        None => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => {
            return Err(bad(
                "unsupported_field",
                "n: a session gives one answer per turn (n must be 1)",
            ));
        }
    }
    items::opt_str(obj, "user")?;
    let tools = items::function_tools(obj, Api::Chat)?;
    let tool_choice = items::tool_choice(obj, Api::Chat, &tools)?;
    let max_output_tokens = match items::opt_tokens(obj, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => items::opt_tokens(obj, "max_tokens")?,
    };
    Ok(Request {
        input,
        stream,
        include_usage,
        model: items::opt_str(obj, "model")?.map(str::to_owned),
        options: TurnOptions {
            tools,
            instructions: None,
            controls: Controls {
                tool_choice,
                parallel_tool_calls: items::opt_bool(obj, "parallel_tool_calls")?,
                temperature: items::opt_f64(obj, "temperature", 0.0..=2.0)?,
                top_p: items::opt_f64(obj, "top_p", 0.0..=1.0)?,
                format: items::output_format(obj, Api::Chat)?,
                effort: items::effort(obj, Api::Chat)?,
            },
            max_output_tokens,
            ledger: None,
            mcp_servers: None,
        },
    })
}

struct Ids {
    id: String,
    created: u64,
    model: String,
}

fn finish_reason(o: &TurnOutcome) -> &'static str {
    if !o.calls.is_empty() {
        "tool_calls"
    } else if o.truncated.is_some() {
        "length"
    } else {
        "stop"
    }
}

fn tool_calls(o: &TurnOutcome) -> Value {
    Value::Array(
        o.calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect(),
    )
}

fn usage(o: &TurnOutcome) -> Value {
    json!({
        "prompt_tokens": o.usage.input_tokens,
        "completion_tokens": o.usage.output_tokens,
        "total_tokens": o.usage.input_tokens + o.usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": o.usage.cache_read_tokens},
    })
}

fn cairn(o: &TurnOutcome, images: &[Value]) -> Value {
    json!({"notices": o.notices, "rounds": o.rounds, "stopped": o.stopped, "truncated": o.truncated, "images": images})
}

fn completion(ids: &Ids, o: &TurnOutcome, images: &[Value]) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": if o.text.is_empty() && !o.calls.is_empty() { Value::Null } else { json!(o.text) },
        "refusal": null,
    });
    if !o.calls.is_empty() {
        message["tool_calls"] = tool_calls(o);
    }
    json!({
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(o), "logprobs": null}],
        "usage": usage(o),
        "cairn": cairn(o, images),
    })
}

fn chunk(ids: &Ids, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": ids.id,
        "object": "chat.completion.chunk",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
    })
}

pub async fn create(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = parse_json(&body?)?;
    let request = parse_request(&body)?;
    state.check_owned()?;
    let session = state.session.clone().try_lock_owned().map_err(|_| busy())?;
    let (mut input, held) = reconciled(session.ledger(), Api::Chat, &request.input, None)?;
    let ids = Ids {
        id: new_id("chatcmpl"),
        created: now_secs(),
        model: request
            .model
            .clone()
            .unwrap_or_else(|| session.live().spec.provider.model.clone()),
    };
    let mut options = request.options;
    options.ledger = Some(LedgerTurn {
        input: held,
        response_id: ids.id.clone(),
    });
    session.check_request(&input, &options)?;
    let images = items::prepare_images(&mut input, state.store.as_ref()).await?;
    if !request.stream {
        let outcome = super::detached_turn(&state, session, input, options).await?;
        return Ok(axum::Json(completion(&ids, &outcome, &images)).into_response());
    }

    let include_usage = request.include_usage;
    let (tx, rx) = tokio::sync::mpsc::channel::<Value>(64);
    let (head, head_wait) = super::hold_head();
    let task_state = state.clone();
    tokio::spawn(async move {
        let mut session = session;
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                // A client that went away does not stop the turn.
                let _ = tx.send(v).await;
            }
        };
        // The head and the role chunk go out with the first thing to send: a turn that fails
        // before it is answered with its own status.
        let begun = std::sync::atomic::AtomicBool::new(false);
        let begin = || {
            let send = &send;
            let (head, ids, begun) = (&head, &ids, &begun);
            async move {
                if !begun.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    head.start();
                    send(chunk(
                        ids,
                        json!({"role": "assistant", "content": ""}),
                        None,
                    ))
                    .await;
                }
            }
        };
        let (ev_tx, mut ev_rx) = tokio::sync::mpsc::unbounded_channel();
        let turn = session.turn_with_options(input, options, Some(ev_tx));
        // Text is forwarded live until a streamed call is void (its text cannot be taken
        // back in this API); what is sent is then settled against the answer at the end.
        let mut sent = String::new();
        let mut live = true;
        let forward = async {
            while let Some(ev) = ev_rx.recv().await {
                match ev {
                    TurnEvent::Text(t) if live => {
                        begin().await;
                        for piece in chunks(&t, DELTA_CHARS) {
                            sent.push_str(piece);
                            send(chunk(&ids, json!({"content": piece}), None)).await;
                        }
                    }
                    TurnEvent::Discarded { .. } => live = false,
                    _ => {}
                }
            }
        };
        let work = task_state.begin();
        let (result, ()) = tokio::join!(turn, forward);
        task_state.publish(&session);
        drop(work);
        drop(session);
        match result {
            Ok(outcome) => {
                begin().await;
                match outcome.text.strip_prefix(sent.as_str()) {
                    Some(rest) => {
                        for piece in chunks(rest, DELTA_CHARS) {
                            send(chunk(&ids, json!({"content": piece}), None)).await;
                        }
                    }
                    None => {
                        send(json!({"error": {
                            "message": "a model call whose text was already streamed failed and was retried; the streamed text is void. The turn is in the session: resend the conversation without this reply",
                            "type": "server_error",
                            "code": "stream_diverged",
                            "param": null,
                        }}))
                        .await;
                        return;
                    }
                }
                for (i, c) in outcome.calls.iter().enumerate() {
                    let head = json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                                      "function": {"name": c.name, "arguments": ""}}]});
                    send(chunk(&ids, head, None)).await;
                    let args = json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]});
                    send(chunk(&ids, args, None)).await;
                }
                send(chunk(&ids, json!({}), Some(finish_reason(&outcome)))).await;
                if include_usage {
                    let mut u = chunk(&ids, json!({}), None);
                    u["choices"] = json!([]);
                    u["usage"] = usage(&outcome);
                    send(u).await;
                }
            }
            Err(e) => {
                let e = ApiError::from(e);
                let in_stream = if begun.load(std::sync::atomic::Ordering::SeqCst) {
                    Some(e)
                } else {
                    head.fail(e)
                };
                if let Some(e) = in_stream {
                    begin().await;
                    send(e.body()).await;
                }
            }
        }
    });
    head_wait.wait(super::STREAM_HEAD_HOLD).await?;
    let stream = tokio_stream_from(rx)
        .map(|v| Ok::<_, Infallible>(Event::default().data(v.to_string())))
        .chain(futures::stream::once(async {
            Ok::<_, Infallible>(Event::default().data("[DONE]"))
        }));
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_understood_or_refused() {
        let ok = parse_request(&json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true,
            "stream_options": {"include_usage": true}, "max_tokens": 50, "n": 1,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}
        }))
        .ok()
        .unwrap();
        assert!(ok.include_usage);
        assert_eq!(ok.options.max_output_tokens, Some(50));
        let structured = parse_request(&json!({
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
            "reasoning_effort": "minimal"
        }))
        .ok()
        .unwrap();
        let c = &structured.options.controls;
        assert_eq!(c.effort, Some(crate::provider::Effort::Minimal));
        assert_eq!(
            c.format.as_ref().map(|f| f.chat_format()),
            Some(
                json!({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}})
            )
        );
        for (body, named) in [
            (
                json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
                "n",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}),
                "response_format",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "max"}),
                "reasoning effort",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true}),
                "logprobs",
            ),
        ] {
            let e = parse_request(&body).err().unwrap();
            assert!(e.message.contains(named), "{}", e.message);
        }
    }
}
