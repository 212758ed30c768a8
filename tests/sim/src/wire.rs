//! Each provider's wire format: reading the request, writing replies (whole and streamed)
//! and the provider's own error bodies (overflow, rate limit, overload, server error).

use serde::Serialize;
use serde_json::{Value, json};

use crate::script::Stop;

/// The API a request was addressed to.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Wire {
    OpenaiChat,
    OpenaiResponses,
    Anthropic,
    Gemini,
    Bedrock,
}

/// What the simulator needs from a request body.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    pub model: String,
    pub messages: usize,
    pub max_tokens: u64,
    pub stream: bool,
    /// OpenAI chat: `stream_options.include_usage`.
    pub include_usage: bool,
}

fn u64_at(v: &Value, ptr: &str) -> Option<u64> {
    v.pointer(ptr).and_then(Value::as_u64)
}

fn len_at(v: &Value, key: &str) -> usize {
    v.get(key).and_then(Value::as_array).map_or(0, Vec::len)
}

/// Reads a request body; `path_model` is the model named in the URL (Gemini, Bedrock).
pub fn parse(
    wire: Wire,
    body: &Value,
    path_model: Option<&str>,
    stream_path: bool,
) -> Result<Parsed, String> {
    let body_model = || {
        body.get("model")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| "model: field required".to_string())
    };
    let stream_flag = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok(match wire {
        Wire::OpenaiChat => Parsed {
            model: body_model()?,
            messages: {
                let n = len_at(body, "messages");
                if n == 0 {
                    return Err("messages: must be a non-empty array".into());
                }
                n
            },
            max_tokens: u64_at(body, "/max_completion_tokens")
                .or_else(|| u64_at(body, "/max_tokens"))
                .unwrap_or(4096),
            stream: stream_flag,
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        },
        Wire::OpenaiResponses => Parsed {
            model: body_model()?,
            messages: match body.get("input") {
                Some(Value::Array(a)) => a.len(),
                Some(Value::String(_)) => 1,
                _ => return Err("input: field required".into()),
            },
            max_tokens: u64_at(body, "/max_output_tokens").unwrap_or(4096),
            stream: stream_flag,
            include_usage: true,
        },
        Wire::Anthropic => Parsed {
            model: body_model()?,
            messages: len_at(body, "messages"),
            max_tokens: u64_at(body, "/max_tokens")
                .ok_or_else(|| "max_tokens: Field required".to_string())?,
            stream: stream_flag,
            include_usage: true,
        },
        Wire::Gemini => Parsed {
            model: path_model.unwrap_or_default().to_string(),
            messages: len_at(body, "contents"),
            max_tokens: u64_at(body, "/generationConfig/maxOutputTokens").unwrap_or(8192),
            stream: stream_path,
            include_usage: true,
        },
        Wire::Bedrock => Parsed {
            model: path_model.unwrap_or_default().to_string(),
            messages: len_at(body, "messages"),
            max_tokens: u64_at(body, "/inferenceConfig/maxTokens").unwrap_or(4096),
            stream: stream_path,
            include_usage: true,
        },
    })
}

/// The reply to render.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub seq: u64,
    pub model: String,
    pub text: String,
    pub reasoning: Option<String>,
    /// `(id, name, arguments object)` of each tool call, in order.
    pub calls: Vec<(String, String, Value)>,
    pub stop: Stop,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache (part of `input_tokens`).
    pub cached_tokens: u64,
    /// Input tokens written to the prompt cache (part of `input_tokens`; Anthropic and
    /// Bedrock report them).
    pub cache_write_tokens: u64,
    /// Anthropic: the reply's `context_management` (applied edits).
    pub context_management: Option<Value>,
    /// OpenAI Responses: the compaction item that leads the output.
    pub compaction: Option<Value>,
}

impl Turn {
    /// Input tokens neither read from nor written to the cache: what Anthropic and Bedrock
    /// report as their input tokens.
    pub fn uncached_input_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cached_tokens)
            .saturating_sub(self.cache_write_tokens)
    }
}

/// A rendered HTTP answer; `frames` concatenated are the body (a stream's events one by one).
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub frames: Vec<Vec<u8>>,
}

impl Rendered {
    fn json(status: u16, body: &Value, headers: Vec<(String, String)>) -> Self {
        Self {
            status,
            content_type: "application/json",
            headers,
            frames: vec![body.to_string().into_bytes()],
        }
    }

    fn sse(frames: Vec<String>) -> Self {
        Self {
            status: 200,
            content_type: "text/event-stream",
            headers: vec![("cache-control".into(), "no-cache".into())],
            frames: frames.into_iter().map(String::into_bytes).collect(),
        }
    }
}

/// Splits text into small pieces on character boundaries, as models stream it.
fn pieces(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size.max(1))
        .map(|c| c.iter().collect())
        .collect()
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn event(name: &str, v: &Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// A successful reply in `wire`'s format.
pub fn render_reply(wire: Wire, t: &Turn, stream: bool, include_usage: bool) -> Rendered {
    match (wire, stream) {
        (Wire::OpenaiChat, false) => chat(t),
        (Wire::OpenaiChat, true) => chat_stream(t, include_usage),
        (Wire::OpenaiResponses, false) => Rendered::json(200, &responses(t, true), vec![]),
        (Wire::OpenaiResponses, true) => responses_stream(t),
        (Wire::Anthropic, false) => Rendered::json(200, &anthropic(t), vec![]),
        (Wire::Anthropic, true) => anthropic_stream(t),
        (Wire::Gemini, false) => Rendered::json(200, &gemini(t, true), vec![]),
        (Wire::Gemini, true) => gemini_stream(t),
        (Wire::Bedrock, false) => Rendered::json(
            200,
            &bedrock(t),
            vec![("x-amzn-requestid".into(), format!("sim-{}", t.seq))],
        ),
        (Wire::Bedrock, true) => bedrock_stream(t),
    }
}

fn chat_finish(stop: Stop) -> &'static str {
    match stop {
        Stop::End => "stop",
        Stop::ToolUse => "tool_calls",
        Stop::MaxTokens => "length",
    }
}

fn chat_usage(t: &Turn) -> Value {
    json!({"prompt_tokens": t.input_tokens, "completion_tokens": t.output_tokens,
           "total_tokens": t.input_tokens + t.output_tokens,
           "prompt_tokens_details": {"cached_tokens": t.cached_tokens}})
}

fn chat(t: &Turn) -> Rendered {
    let mut message = json!({"role": "assistant", "content": t.text, "refusal": null});
    if !t.calls.is_empty() {
        if t.text.is_empty() {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = Value::Array(
            t.calls
                .iter()
                .map(|(id, name, args)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": args.to_string()}})
                })
                .collect(),
        );
    }
    if let Some(r) = &t.reasoning {
        message["reasoning_content"] = json!(r);
    }
    Rendered::json(
        200,
        &json!({
            "id": format!("chatcmpl-sim-{}", t.seq), "object": "chat.completion",
            "created": 1_700_000_000u64 + t.seq, "model": t.model,
            "choices": [{"index": 0, "message": message, "logprobs": null,
                         "finish_reason": chat_finish(t.stop)}],
            "usage": chat_usage(t),
        }),
        vec![("x-request-id".into(), format!("req_sim_{}", t.seq))],
    )
}

fn chat_stream(t: &Turn, include_usage: bool) -> Rendered {
    let id = format!("chatcmpl-sim-{}", t.seq);
    let chunk = |delta: Value, finish: Value| {
        data(
            &json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000u64,
            "model": t.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let mut frames = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(r) = &t.reasoning {
        for p in pieces(r, 8) {
            frames.push(chunk(json!({"reasoning_content": p}), Value::Null));
        }
    }
    for p in pieces(&t.text, 8) {
        frames.push(chunk(json!({"content": p}), Value::Null));
    }
    for (k, (cid, name, args)) in t.calls.iter().enumerate() {
        frames.push(chunk(
            json!({"tool_calls": [{"index": k, "id": cid, "type": "function",
                                   "function": {"name": name, "arguments": ""}}]}),
            Value::Null,
        ));
        for p in pieces(&args.to_string(), 6) {
            frames.push(chunk(
                json!({"tool_calls": [{"index": k, "function": {"arguments": p}}]}),
                Value::Null,
            ));
        }
    }
    frames.push(chunk(json!({}), json!(chat_finish(t.stop))));
    if include_usage {
        frames.push(data(&json!({"id": id, "object": "chat.completion.chunk",
            "model": t.model, "choices": [], "usage": chat_usage(t)})));
    }
    frames.push("data: [DONE]\n\n".into());
    Rendered::sse(frames)
}

fn responses_output(t: &Turn) -> Vec<Value> {
    let mut out: Vec<Value> = t.compaction.iter().cloned().collect();
    if let Some(r) = &t.reasoning {
        out.push(
            json!({"type": "reasoning", "id": format!("rs_sim_{}", t.seq),
            "summary": [{"type": "summary_text", "text": r}]}),
        );
    }
    if !t.text.is_empty() {
        out.push(
            json!({"type": "message", "id": format!("msg_sim_{}", t.seq),
            "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": t.text, "annotations": []}]}),
        );
    }
    for (k, (id, name, args)) in t.calls.iter().enumerate() {
        let item_id = if k == 0 {
            format!("fc_sim_{}", t.seq)
        } else {
            format!("fc_sim_{}_{k}", t.seq)
        };
        out.push(json!({"type": "function_call", "id": item_id,
            "call_id": id, "name": name, "arguments": args.to_string(),
            "status": "completed"}));
    }
    out
}

fn responses(t: &Turn, done: bool) -> Value {
    let incomplete = t.stop == Stop::MaxTokens;
    json!({
        "id": format!("resp_sim_{}", t.seq), "object": "response",
        "created_at": 1_700_000_000u64 + t.seq, "model": t.model,
        "status": if !done { "in_progress" } else if incomplete { "incomplete" } else { "completed" },
        "incomplete_details": if incomplete && done { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "error": null,
        "output": if done { json!(responses_output(t)) } else { json!([]) },
        "usage": if done { json!({"input_tokens": t.input_tokens,
            "input_tokens_details": {"cached_tokens": t.cached_tokens},
            "output_tokens": t.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": t.input_tokens + t.output_tokens}) } else { Value::Null },
    })
}

fn responses_stream(t: &Turn) -> Rendered {
    let mut seq = 0u64;
    let mut frames = Vec::new();
    let mut push = |name: &str, mut v: Value| {
        v["type"] = json!(name);
        v["sequence_number"] = json!(seq);
        seq += 1;
        frames.push(event(name, &v));
    };
    push("response.created", json!({"response": responses(t, false)}));
    for (i, item) in responses_output(t).into_iter().enumerate() {
        push(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        );
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for p in pieces(&t.text, 8) {
                    push(
                        "response.output_text.delta",
                        json!({"output_index": i, "content_index": 0, "delta": p}),
                    );
                }
            }
            Some("reasoning") => {
                for p in pieces(t.reasoning.as_deref().unwrap_or_default(), 8) {
                    push(
                        "response.reasoning_summary_text.delta",
                        json!({"output_index": i, "summary_index": 0, "delta": p}),
                    );
                }
            }
            Some("function_call") => {
                let args = item
                    .get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                for p in pieces(&args, 6) {
                    push(
                        "response.function_call_arguments.delta",
                        json!({"output_index": i, "delta": p}),
                    );
                }
            }
            _ => {}
        }
        push(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
    }
    let last = if t.stop == Stop::MaxTokens {
        "response.incomplete"
    } else {
        "response.completed"
    };
    push(last, json!({"response": responses(t, true)}));
    Rendered::sse(frames)
}

fn anthropic_stop(stop: Stop) -> &'static str {
    match stop {
        Stop::End => "end_turn",
        Stop::ToolUse => "tool_use",
        Stop::MaxTokens => "max_tokens",
    }
}

fn anthropic(t: &Turn) -> Value {
    let mut content = Vec::new();
    if let Some(r) = &t.reasoning {
        content.push(json!({"type": "thinking", "thinking": r, "signature": "c2lt"}));
    }
    if !t.text.is_empty() {
        content.push(json!({"type": "text", "text": t.text}));
    }
    for (id, name, args) in &t.calls {
        content.push(json!({"type": "tool_use", "id": id, "name": name, "input": args}));
    }
    let mut v = json!({
        "id": format!("msg_sim_{}", t.seq), "type": "message", "role": "assistant",
        "model": t.model, "content": content,
        "stop_reason": anthropic_stop(t.stop), "stop_sequence": null,
        "usage": {"input_tokens": t.uncached_input_tokens(), "output_tokens": t.output_tokens,
                  "cache_read_input_tokens": t.cached_tokens,
                  "cache_creation_input_tokens": t.cache_write_tokens},
    });
    if let Some(c) = &t.context_management {
        v["context_management"] = c.clone();
    }
    v
}

fn anthropic_stream(t: &Turn) -> Rendered {
    let mut frames = Vec::new();
    let mut start = anthropic(t);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    frames.push(event(
        "message_start",
        &json!({"type": "message_start", "message": start}),
    ));
    let mut index = 0;
    let mut block = |frames: &mut Vec<String>, first: Value, deltas: Vec<Value>| {
        frames.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": first}),
        ));
        for d in deltas {
            frames.push(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": d}),
            ));
        }
        frames.push(event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    };
    if let Some(r) = &t.reasoning {
        let mut deltas: Vec<Value> = pieces(r, 8)
            .into_iter()
            .map(|p| json!({"type": "thinking_delta", "thinking": p}))
            .collect();
        deltas.push(json!({"type": "signature_delta", "signature": "c2lt"}));
        block(
            &mut frames,
            json!({"type": "thinking", "thinking": "", "signature": ""}),
            deltas,
        );
    }
    if !t.text.is_empty() {
        let deltas = pieces(&t.text, 8)
            .into_iter()
            .map(|p| json!({"type": "text_delta", "text": p}))
            .collect();
        block(&mut frames, json!({"type": "text", "text": ""}), deltas);
    }
    frames.push(event("ping", &json!({"type": "ping"})));
    for (id, name, args) in &t.calls {
        let deltas = pieces(&args.to_string(), 6)
            .into_iter()
            .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
            .collect();
        block(
            &mut frames,
            json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
            deltas,
        );
    }
    let mut delta = json!({"type": "message_delta",
            "delta": {"stop_reason": anthropic_stop(t.stop), "stop_sequence": null},
            "usage": {"output_tokens": t.output_tokens}});
    if let Some(c) = &t.context_management {
        delta["context_management"] = c.clone();
    }
    frames.push(event("message_delta", &delta));
    frames.push(event("message_stop", &json!({"type": "message_stop"})));
    Rendered::sse(frames)
}

fn gemini_usage(t: &Turn) -> Value {
    let mut u = json!({"promptTokenCount": t.input_tokens,
        "candidatesTokenCount": t.output_tokens,
        "totalTokenCount": t.input_tokens + t.output_tokens});
    if t.cached_tokens > 0 {
        u["cachedContentTokenCount"] = json!(t.cached_tokens);
    }
    u
}

fn gemini_finish(stop: Stop) -> &'static str {
    match stop {
        Stop::End | Stop::ToolUse => "STOP",
        Stop::MaxTokens => "MAX_TOKENS",
    }
}

fn gemini_parts(t: &Turn, text: Option<&str>, first: bool, with_call: bool) -> Vec<Value> {
    let mut parts = Vec::new();
    if let Some(r) = &t.reasoning
        && first
    {
        parts.push(json!({"text": r, "thought": true}));
    }
    let text = text.unwrap_or(&t.text);
    if !text.is_empty() {
        parts.push(json!({"text": text}));
    }
    if with_call {
        for (_, name, args) in &t.calls {
            parts.push(json!({"functionCall": {"name": name, "args": args}}));
        }
    }
    parts
}

fn gemini(t: &Turn, whole: bool) -> Value {
    json!({
        "candidates": [{"content": {"parts": gemini_parts(t, None, true, whole), "role": "model"},
                        "finishReason": gemini_finish(t.stop), "index": 0}],
        "usageMetadata": gemini_usage(t),
        "modelVersion": t.model,
        "responseId": format!("sim-{}", t.seq),
    })
}

fn gemini_stream(t: &Turn) -> Rendered {
    let mut frames = Vec::new();
    let texts = pieces(&t.text, 8);
    let n = texts.len();
    for (i, p) in texts[..n.saturating_sub(1)].iter().enumerate() {
        frames.push(data(&json!({
            "candidates": [{"content": {"parts": gemini_parts(t, Some(p), i == 0, false), "role": "model"},
                            "index": 0}],
            "usageMetadata": {"promptTokenCount": t.input_tokens},
            "modelVersion": t.model,
        })));
    }
    let last = texts.last().map(String::as_str).unwrap_or("");
    frames.push(data(&json!({
        "candidates": [{"content": {"parts": gemini_parts(t, Some(last), n <= 1, true), "role": "model"},
                        "finishReason": gemini_finish(t.stop), "index": 0}],
        "usageMetadata": gemini_usage(t),
        "modelVersion": t.model,
    })));
    Rendered::sse(frames)
}

fn bedrock(t: &Turn) -> Value {
    let mut content = Vec::new();
    if let Some(r) = &t.reasoning {
        content
            .push(json!({"reasoningContent": {"reasoningText": {"text": r, "signature": "c2lt"}}}));
    }
    if !t.text.is_empty() {
        content.push(json!({"text": t.text}));
    }
    for (id, name, args) in &t.calls {
        content.push(json!({"toolUse": {"toolUseId": id, "name": name, "input": args}}));
    }
    // Converse's inputTokens leaves the cache reads and writes out, as Anthropic's does.
    let mut usage = json!({"inputTokens": t.uncached_input_tokens(), "outputTokens": t.output_tokens,
                           "totalTokens": t.input_tokens + t.output_tokens});
    if t.cached_tokens > 0 {
        usage["cacheReadInputTokens"] = json!(t.cached_tokens);
    }
    if t.cache_write_tokens > 0 {
        usage["cacheWriteInputTokens"] = json!(t.cache_write_tokens);
    }
    json!({
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": anthropic_stop(t.stop),
        "usage": usage,
        "metrics": {"latencyMs": 1},
    })
}

/// Content type of Bedrock's ConverseStream answers.
pub const EVENT_STREAM: &str = "application/vnd.amazon.eventstream";

/// CRC-32 (IEEE 802.3) as the AWS event-stream framing uses it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// One AWS event-stream message carrying a JSON event.
pub fn aws_event(event_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (k, v) in [
        (":event-type", event_type),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ] {
        h.push(k.len() as u8);
        h.extend_from_slice(k.as_bytes());
        h.push(7);
        h.extend_from_slice(&(v.len() as u16).to_be_bytes());
        h.extend_from_slice(v.as_bytes());
    }
    let total = 12 + h.len() + payload.len() + 4;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude = crc32(&out);
    out.extend_from_slice(&prelude.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

fn bedrock_stream(t: &Turn) -> Rendered {
    let mut frames = Vec::new();
    let mut ev = |name: &str, v: Value| frames.push(aws_event(name, v.to_string().as_bytes()));
    ev("messageStart", json!({"role": "assistant"}));
    let mut index = 0;
    if let Some(r) = &t.reasoning {
        for p in pieces(r, 8) {
            ev(
                "contentBlockDelta",
                json!({"contentBlockIndex": index, "delta": {"reasoningContent": {"text": p}}}),
            );
        }
        ev("contentBlockStop", json!({"contentBlockIndex": index}));
        index += 1;
    }
    if !t.text.is_empty() {
        for p in pieces(&t.text, 8) {
            ev(
                "contentBlockDelta",
                json!({"contentBlockIndex": index, "delta": {"text": p}}),
            );
        }
        ev("contentBlockStop", json!({"contentBlockIndex": index}));
        index += 1;
    }
    for (id, name, args) in &t.calls {
        ev(
            "contentBlockStart",
            json!({"contentBlockIndex": index,
                   "start": {"toolUse": {"toolUseId": id, "name": name}}}),
        );
        for p in pieces(&args.to_string(), 6) {
            ev(
                "contentBlockDelta",
                json!({"contentBlockIndex": index, "delta": {"toolUse": {"input": p}}}),
            );
        }
        ev("contentBlockStop", json!({"contentBlockIndex": index}));
        index += 1;
    }
    ev("messageStop", json!({"stopReason": anthropic_stop(t.stop)}));
    let b = bedrock(t);
    ev(
        "metadata",
        json!({"usage": b["usage"], "metrics": {"latencyMs": 1}}),
    );
    Rendered {
        status: 200,
        content_type: EVENT_STREAM,
        headers: vec![("x-amzn-requestid".into(), format!("sim-{}", t.seq))],
        frames,
    }
}

/// An error the provider itself would send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// The request does not fit the model's window.
    Overflow { tokens: u64, window: u64 },
    /// The same, from a llama.cpp server: its body on every API.
    LlamaOverflow { tokens: u64, window: u64 },
    /// A status injected by a fault (429, 500, 503, 529, 403, ...).
    Status {
        status: u16,
        retry_after: Option<u64>,
    },
    /// The request body is not valid for the API.
    BadRequest(String),
    /// No credentials were sent.
    Unauthorized,
}

/// `ApiError` in `wire`'s format: status, headers and the JSON body the real API sends.
pub fn render_error(wire: Wire, e: &ApiError, seq: u64) -> Rendered {
    let status = match e {
        ApiError::Overflow { .. } | ApiError::LlamaOverflow { .. } | ApiError::BadRequest(_) => 400,
        ApiError::Status { status, .. } => *status,
        ApiError::Unauthorized => match wire {
            Wire::Bedrock => 403,
            Wire::Gemini => 400,
            _ => 401,
        },
    };
    let mut headers = Vec::new();
    if let ApiError::Status {
        retry_after: Some(s),
        ..
    } = e
    {
        headers.push(("retry-after".to_string(), s.to_string()));
    }
    if let ApiError::LlamaOverflow { tokens, window } = e {
        // Verbatim llama-server (b11434), whatever the API.
        let body = json!({"error": {"code": 400, "message": format!("request ({tokens} tokens) exceeds the available context size ({window} tokens), try increasing it"), "type": "exceed_context_size_error", "n_prompt_tokens": tokens, "n_ctx": window}});
        let mut r = Rendered::json(400, &body, Vec::new());
        r.content_type = "application/json; charset=utf-8";
        return r;
    }
    let (body, mut extra) = match wire {
        Wire::OpenaiChat | Wire::OpenaiResponses => openai_error(wire, e, status),
        Wire::Anthropic => anthropic_error(e, status, seq),
        Wire::Gemini => gemini_error(e, status),
        Wire::Bedrock => bedrock_error(e, status, seq),
    };
    headers.append(&mut extra);
    let mut r = Rendered::json(status, &body, headers);
    if wire == Wire::Gemini {
        r.content_type = "application/json; charset=UTF-8";
    }
    r
}

fn openai_error(wire: Wire, e: &ApiError, status: u16) -> (Value, Vec<(String, String)>) {
    let (message, kind, param, code) = match e {
        ApiError::Overflow { tokens, window } | ApiError::LlamaOverflow { tokens, window }
            if wire == Wire::OpenaiChat =>
        {
            (
                format!(
                    "This model's maximum context length is {window} tokens. However, your \
                 messages resulted in {tokens} tokens. Please reduce the length of the messages."
                ),
                "invalid_request_error",
                json!("messages"),
                json!("context_length_exceeded"),
            )
        }
        ApiError::Overflow { .. } | ApiError::LlamaOverflow { .. } => (
            "Your input exceeds the context window of this model. Please adjust your input \
             and try again."
                .to_string(),
            "invalid_request_error",
            json!("input"),
            json!("context_length_exceeded"),
        ),
        ApiError::Status { status: 429, .. } => (
            "Rate limit reached for requests per min (RPM). Please try again in 1s.".into(),
            "requests",
            Value::Null,
            json!("rate_limit_exceeded"),
        ),
        ApiError::Status { status: 401, .. } => (
            "Incorrect API key provided: sk-sim***. You can find your API key at \
             https://platform.openai.com/account/api-keys."
                .into(),
            "invalid_request_error",
            Value::Null,
            json!("invalid_api_key"),
        ),
        ApiError::Status { status: 403, .. } => (
            "Country, region, or territory not supported".into(),
            "request_forbidden",
            Value::Null,
            json!("unsupported_country_region_territory"),
        ),
        ApiError::Status { .. } => (
            "The server had an error while processing your request. Sorry about that!".into(),
            "server_error",
            Value::Null,
            Value::Null,
        ),
        ApiError::BadRequest(m) => (m.clone(), "invalid_request_error", Value::Null, Value::Null),
        ApiError::Unauthorized => (
            "You didn't provide an API key.".into(),
            "invalid_request_error",
            Value::Null,
            Value::Null,
        ),
    };
    let mut headers = vec![("x-request-id".to_string(), "req_sim".to_string())];
    if status == 429 {
        headers.push(("x-ratelimit-remaining-requests".into(), "0".into()));
    }
    (
        json!({"error": {"message": message, "type": kind, "param": param, "code": code}}),
        headers,
    )
}

fn anthropic_error(e: &ApiError, status: u16, seq: u64) -> (Value, Vec<(String, String)>) {
    let (kind, message) = match e {
        ApiError::Overflow { tokens, window } | ApiError::LlamaOverflow { tokens, window } => (
            "invalid_request_error",
            format!("prompt is too long: {tokens} tokens > {window} maximum"),
        ),
        ApiError::BadRequest(m) => ("invalid_request_error", m.clone()),
        ApiError::Unauthorized => (
            "authentication_error",
            "x-api-key header is required".into(),
        ),
        ApiError::Status { .. } => match status {
            429 => (
                "rate_limit_error",
                "This request would exceed the rate limit for your organization.".into(),
            ),
            529 => ("overloaded_error", "Overloaded".into()),
            401 => ("authentication_error", "invalid x-api-key".into()),
            403 => (
                "permission_error",
                "Your API key does not have permission to use the specified resource.".into(),
            ),
            413 => (
                "request_too_large",
                "Request exceeds the maximum allowed number of bytes.".into(),
            ),
            s if s >= 500 => ("api_error", "Internal server error".into()),
            _ => ("invalid_request_error", "Invalid request".into()),
        },
    };
    let id = format!("req_sim_{seq}");
    let headers = vec![
        ("request-id".to_string(), id.clone()),
        (
            "x-should-retry".to_string(),
            (status == 429 || status >= 500).to_string(),
        ),
    ];
    (
        json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": id}),
        headers,
    )
}

fn gemini_error(e: &ApiError, status: u16) -> (Value, Vec<(String, String)>) {
    let (message, code) = match e {
        ApiError::Overflow { tokens, window } | ApiError::LlamaOverflow { tokens, window } => (
            format!(
                "The input token count ({tokens}) exceeds the maximum number of tokens \
                 allowed ({window})."
            ),
            "INVALID_ARGUMENT",
        ),
        ApiError::BadRequest(m) => (m.clone(), "INVALID_ARGUMENT"),
        ApiError::Unauthorized => (
            "API key not valid. Please pass a valid API key.".into(),
            "INVALID_ARGUMENT",
        ),
        ApiError::Status { .. } => match status {
            429 => (
                "Resource has been exhausted (e.g. check quota).".into(),
                "RESOURCE_EXHAUSTED",
            ),
            401 => (
                "Request had invalid authentication credentials. Expected OAuth 2 access \
                 token, login cookie or other valid authentication credential."
                    .into(),
                "UNAUTHENTICATED",
            ),
            403 => (
                "The caller does not have permission".into(),
                "PERMISSION_DENIED",
            ),
            503 => (
                "The model is overloaded. Please try again later.".into(),
                "UNAVAILABLE",
            ),
            s if s >= 500 => ("An internal error has occurred.".into(), "INTERNAL"),
            _ => (
                "Request contains an invalid argument.".into(),
                "INVALID_ARGUMENT",
            ),
        },
    };
    (
        json!({"error": {"code": status, "message": message, "status": code}}),
        vec![],
    )
}

fn bedrock_error(e: &ApiError, status: u16, seq: u64) -> (Value, Vec<(String, String)>) {
    let (kind, message) = match e {
        ApiError::Overflow { .. } | ApiError::LlamaOverflow { .. } => (
            "ValidationException",
            "Input is too long for requested model.".to_string(),
        ),
        ApiError::BadRequest(m) => ("ValidationException", m.clone()),
        ApiError::Unauthorized => (
            "AccessDeniedException",
            "Missing Authentication Token".into(),
        ),
        ApiError::Status { .. } => match status {
            429 => (
                "ThrottlingException",
                "Too many requests, please wait before trying again.".into(),
            ),
            401 => (
                "UnrecognizedClientException",
                "The security token included in the request is invalid.".into(),
            ),
            403 => (
                "AccessDeniedException",
                "You don't have access to the model with the specified model ID.".into(),
            ),
            503 => (
                "ServiceUnavailableException",
                "Bedrock is unable to process your request.".into(),
            ),
            s if s >= 500 => (
                "InternalServerException",
                "The server encountered an internal error.".into(),
            ),
            _ => ("ValidationException", "Invalid request.".into()),
        },
    };
    (
        json!({"message": message}),
        vec![
            (
                "x-amzn-errortype".to_string(),
                format!("{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            ),
            ("x-amzn-requestid".to_string(), format!("sim-{seq}")),
        ],
    )
}
