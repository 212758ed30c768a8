//! OpenAI Chat Completions, and every server that speaks it (xAI, Mistral, Groq, DeepSeek,
//! OpenRouter, vLLM, Ollama) through a base URL.

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde::Deserialize;
use serde_json::{Value, json};

use super::config::{BuildError, ClientOptions, Secret};
use super::http::{DecodeError, HeaderFn, HttpClient, Reply, StreamState, parse_json};
use super::sse::SseEvent;
use super::{ChatRequest, ChatResponse, Provider, ProviderError, StopReason, Usage};
use crate::history::{Message, Role, ToolCall};

/// Chat Completions client. `base` ends before `/chat/completions` (e.g.
/// `https://api.openai.com/v1`).
pub struct OpenAiChat {
    name: String,
    url: String,
    key: Option<Secret>,
    /// Compatible servers often only know the older `max_tokens` field.
    legacy_max_tokens: bool,
    http: HttpClient,
}

impl std::fmt::Debug for OpenAiChat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiChat")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl OpenAiChat {
    pub fn new(
        name: &str,
        base: impl Into<String>,
        key: Option<Secret>,
        legacy_max_tokens: bool,
        options: ClientOptions,
    ) -> Result<Self, BuildError> {
        let base = base.into();
        Ok(Self {
            name: name.to_string(),
            url: format!("{}/chat/completions", base.trim_end_matches('/')),
            key,
            legacy_max_tokens,
            http: HttpClient::new(name, options)?,
        })
    }

    /// The exact JSON body sent for `request`.
    pub fn body(&self, request: &ChatRequest) -> Value {
        let mut body = json!({
            "model": request.model,
            "messages": request.messages.iter().map(wire_message).collect::<Vec<_>>(),
        });
        let limit_field = if self.legacy_max_tokens {
            "max_tokens"
        } else {
            "max_completion_tokens"
        };
        body[limit_field] = json!(request.max_output_tokens);
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.parameters}})
                })
                .collect();
        }
        if request.stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }
}

fn wire_message(m: &Message) -> Value {
    match m.role {
        Role::System => json!({"role": "system", "content": m.content}),
        Role::User if !m.images.is_empty() => {
            let mut parts = vec![json!({"type": "text", "text": m.content})];
            parts.extend(m.images.iter().map(|i| {
                json!({"type": "image_url", "image_url": {
                    "url": format!("data:{};base64,{}", i.media_type, i.data)}})
            }));
            json!({"role": "user", "content": parts})
        }
        Role::User => json!({"role": "user", "content": m.content}),
        Role::Assistant => {
            let mut v = json!({"role": "assistant", "content": m.content});
            if !m.tool_calls.is_empty() {
                if m.content.is_empty() {
                    v["content"] = Value::Null;
                }
                v["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
            }
            v
        }
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": m.tool_call_id.as_deref().unwrap_or_default(),
            "content": m.content,
        }),
    }
}

#[async_trait]
impl Provider for OpenAiChat {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let body = serde_json::to_vec(&self.body(request))
            .map_err(|e| ProviderError::transport(&self.name, e.to_string(), 0))?;
        let key = self.key.clone();
        let headers = move |_: &[u8]| -> Result<HeaderMap, String> {
            let mut h = HeaderMap::new();
            if let Some(k) = &key {
                let mut v = HeaderValue::from_str(&format!("Bearer {}", k.expose()))
                    .map_err(|_| "the API key contains characters not allowed in a header")?;
                v.set_sensitive(true);
                h.insert(AUTHORIZATION, v);
            }
            Ok(h)
        };
        let headers: HeaderFn<'_> = &headers;
        if request.stream {
            self.http
                .post_sse(&self.url, headers, body, ChatStream::default())
                .await
        } else {
            self.http
                .post_json(&self.url, headers, body, decode_reply)
                .await
        }
    }
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<CachedDetails>,
}

#[derive(Deserialize, Default)]
struct CachedDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl WireUsage {
    fn usage(&self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            cache_read_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
        }
    }
}

#[derive(Deserialize)]
struct Completion {
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: Option<WireMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireCall>,
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    id: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

pub(crate) fn stop_reason(finish: &str) -> StopReason {
    match finish {
        "stop" | "end_turn" => StopReason::End,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "length" => StopReason::MaxTokens,
        _ => StopReason::Other,
    }
}

/// An `{"error": {...}}` object in a 200 body or a stream chunk.
fn embedded_error(v: &Value) -> Option<String> {
    v.get("error")
        .filter(|e| !e.is_null())
        .map(Value::to_string)
}

fn decode_reply(bytes: &[u8]) -> Result<Reply, DecodeError> {
    let raw: Value = parse_json("chat completion", bytes)?;
    if let Some(e) = embedded_error(&raw) {
        return Err(DecodeError::Provider(e));
    }
    let c: Completion =
        serde_json::from_value(raw).map_err(|e| DecodeError::json("chat completion", e))?;
    let choice = c
        .choices
        .ok_or(DecodeError::Missing("choices"))?
        .into_iter()
        .next()
        .ok_or(DecodeError::Empty)?;
    let msg = choice
        .message
        .ok_or(DecodeError::Missing("choices[0].message"))?;
    let mut calls = Vec::new();
    for (i, call) in msg.tool_calls.into_iter().enumerate() {
        let f = call
            .function
            .ok_or(DecodeError::Missing("tool_calls[].function"))?;
        calls.push(ToolCall {
            id: call.id.unwrap_or_else(|| format!("call_{i}")),
            name: f
                .name
                .ok_or(DecodeError::Missing("tool_calls[].function.name"))?,
            arguments: f.arguments.unwrap_or_default(),
        });
    }
    Ok(Reply {
        text: msg.content.unwrap_or_default(),
        reasoning: msg.reasoning_content.or(msg.reasoning).unwrap_or_default(),
        calls,
        stop: choice.finish_reason.as_deref().map(stop_reason),
        usage: c.usage.map(|u| u.usage()).unwrap_or_default(),
    })
}

/// Decodes a non-streamed Chat Completions body.
pub fn decode_response(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    decode_reply(bytes).map(|r| r.into_response(0))
}

/// Decodes a complete Chat Completions event stream.
pub fn decode_stream(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    super::http::decode_sse_bytes(bytes, ChatStream::default()).map(|r| r.into_response(0))
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Vec<CallDelta>,
}

#[derive(Deserialize)]
struct CallDelta {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Default)]
struct ChatStream {
    reply: Reply,
    /// Tool calls by their stream index.
    calls: Vec<ToolCall>,
    finished: bool,
}

impl StreamState for ChatStream {
    fn on_event(&mut self, ev: &SseEvent) -> Result<bool, DecodeError> {
        let data = ev.data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let raw: Value = parse_json("stream chunk", data.as_bytes())?;
        if let Some(e) = embedded_error(&raw) {
            return Err(DecodeError::Provider(e));
        }
        let chunk: Chunk =
            serde_json::from_value(raw).map_err(|e| DecodeError::json("stream chunk", e))?;
        if let Some(u) = chunk.usage {
            self.reply.usage = u.usage();
        }
        for choice in chunk.choices {
            if let Some(d) = choice.delta {
                if let Some(t) = d.content {
                    self.reply.text.push_str(&t);
                }
                if let Some(r) = d.reasoning_content.or(d.reasoning) {
                    self.reply.reasoning.push_str(&r);
                }
                for c in d.tool_calls {
                    let idx = c.index.unwrap_or(self.calls.len().saturating_sub(1));
                    if idx > self.calls.len() + 64 {
                        return Err(DecodeError::Stream(format!("tool call index {idx}")));
                    }
                    while self.calls.len() <= idx {
                        self.calls.push(ToolCall {
                            id: String::new(),
                            name: String::new(),
                            arguments: String::new(),
                        });
                    }
                    let slot = &mut self.calls[idx];
                    if let Some(id) = c.id {
                        slot.id = id;
                    }
                    if let Some(f) = c.function {
                        if let Some(n) = f.name {
                            slot.name.push_str(&n);
                        }
                        if let Some(a) = f.arguments {
                            slot.arguments.push_str(&a);
                        }
                    }
                }
            }
            if let Some(f) = choice.finish_reason {
                self.reply.stop = Some(stop_reason(&f));
                self.finished = true;
            }
        }
        Ok(false)
    }

    fn whole(bytes: &[u8]) -> Result<Reply, DecodeError> {
        decode_reply(bytes)
    }

    fn finish(mut self, saw_terminal: bool) -> Result<Reply, DecodeError> {
        if !self.finished {
            return Err(DecodeError::Incomplete(if saw_terminal {
                "[DONE] without a finish_reason"
            } else {
                "no finish_reason and no [DONE]"
            }));
        }
        for (i, c) in self.calls.iter_mut().enumerate() {
            if c.id.is_empty() {
                c.id = format!("call_{i}");
            }
        }
        self.reply.calls = self.calls;
        Ok(self.reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bodies_are_typed_errors() {
        let cases: [(&[u8], &str); 6] = [
            (b"{\"choices\":[]}", "empty_choices"),
            (b"{\"id\":\"x\"}", "missing_field"),
            (b"{\"choices\":[{\"message\":", "malformed_json"),
            (b"<html><body>blocked</body></html>", "html_body"),
            (b"{\"choices\":\"nope\"}", "malformed_json"),
            (
                b"{\"error\":{\"message\":\"boom\"}}",
                "provider_error_event",
            ),
        ];
        for (body, label) in cases {
            assert_eq!(
                decode_response(body).map(|_| ()).unwrap_err().label(),
                label
            );
        }
    }

    #[test]
    fn unexpected_fields_are_ignored() {
        let r = decode_response(
            br#"{"choices":[{"message":{"content":"hi","extra":1},"finish_reason":"length","x":2}],"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":1}},"new":true}"#,
        )
        .unwrap();
        assert_eq!(r.message.content, "hi");
        assert_eq!(r.stop, StopReason::MaxTokens);
        assert_eq!(r.usage.cache_read_tokens, 1);
    }

    #[test]
    fn stream_assembles_tool_call_argument_deltas() {
        let s = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"read\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"pa\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"th\\\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n",
            "data: [DONE]\n\n",
        );
        let r = decode_stream(s.as_bytes()).unwrap();
        assert_eq!(r.stop, StopReason::ToolUse);
        assert_eq!(r.tool_calls()[0].arguments, "{\"path\":1}");
        assert_eq!(r.usage.output_tokens, 6);
        let cut = &s[..s.find("data: {\"choices\":[{\"delta\":{},").unwrap()];
        assert_eq!(
            decode_stream(cut.as_bytes()).unwrap_err().label(),
            "stream_incomplete"
        );
    }
}
