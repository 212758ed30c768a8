//! OpenAI Chat Completions, and every server that speaks it (xAI, Mistral, Groq, DeepSeek,
//! OpenRouter, vLLM, Ollama) through a base URL.

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{BuildError, ClientOptions, Secret};
use super::http::{DecodeError, HttpClient, Reply, StreamState, parse_json, secret_header};
use super::sse::SseEvent;
use super::wire::{DataUrl, is_false};
use super::{
    ChatRequest, ChatResponse, DeltaSink, Provider, ProviderError, StopReason, ToolChoice, Usage,
};
use crate::history::{Message, Role, ToolCall};

/// Chat Completions client. `base` ends before `/chat/completions` (e.g.
/// `https://api.openai.com/v1`).
/// `Debug` shows the key as redacted ([`Secret`]).
#[derive(Debug)]
pub struct OpenAiChat {
    name: String,
    url: String,
    key: Option<Secret>,
    /// Compatible servers often only know the older `max_tokens` field.
    legacy_max_tokens: bool,
    http: HttpClient,
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
    pub fn body<'a>(&self, request: &'a ChatRequest) -> impl Serialize + 'a {
        let limit = request.max_output_tokens;
        let (max_tokens, max_completion_tokens) = if self.legacy_max_tokens {
            (Some(limit), None)
        } else {
            (None, Some(limit))
        };
        Body {
            model: &request.model,
            messages: request.messages.iter().map(wire_message).collect(),
            max_tokens,
            max_completion_tokens,
            tools: request
                .tools
                .iter()
                .map(|t| Tool {
                    kind: "function",
                    function: Function {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect(),
            stream: request.stream,
            stream_options: request.stream.then_some(StreamOptions {
                include_usage: true,
            }),
            tool_choice: request
                .controls
                .choice(!request.tools.is_empty())
                .map(chat_tool_choice),
            parallel_tool_calls: request.controls.parallel(!request.tools.is_empty()),
            temperature: request.controls.temperature,
            top_p: request.controls.top_p,
            response_format: request.controls.format.as_ref().map(|f| f.chat_format()),
            reasoning_effort: request.controls.effort.map(|e| e.as_str()),
        }
    }
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<OutMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    #[serde(skip_serializing_if = "is_false")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
}

/// `tool_choice` of Chat Completions.
fn chat_tool_choice(c: &ToolChoice) -> Value {
    match c {
        ToolChoice::Auto => Value::from("auto"),
        ToolChoice::None => Value::from("none"),
        ToolChoice::Required => Value::from("required"),
        ToolChoice::Function(name) => {
            serde_json::json!({"type": "function", "function": {"name": name}})
        }
    }
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum OutMessage<'a> {
    System {
        #[serde(serialize_with = "super::wire_cache::text")]
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` when the message only calls tools.
        #[serde(serialize_with = "super::wire_cache::opt_text")]
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<OutCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        #[serde(serialize_with = "super::wire_cache::text")]
        content: &'a str,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    #[serde(serialize_with = "super::wire_cache::text")]
    Text(&'a str),
    Parts(Vec<Part<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    Text {
        #[serde(serialize_with = "super::wire_cache::text")]
        text: &'a str,
    },
    ImageUrl {
        image_url: ImageUrl<'a>,
    },
}

#[derive(Serialize)]
struct ImageUrl<'a> {
    url: DataUrl<'a>,
}

#[derive(Serialize)]
struct OutCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunction<'a>,
}

#[derive(Serialize)]
struct OutFunction<'a> {
    name: &'a str,
    #[serde(serialize_with = "super::wire::arguments_text")]
    arguments: &'a str,
}

fn wire_message(m: &Message) -> OutMessage<'_> {
    match m.role {
        Role::System => OutMessage::System {
            content: &m.content,
        },
        Role::User if !m.images.is_empty() => {
            let mut parts = vec![Part::Text { text: &m.content }];
            parts.extend(m.images.iter().map(|i| Part::ImageUrl {
                image_url: ImageUrl { url: DataUrl(i) },
            }));
            OutMessage::User {
                content: UserContent::Parts(parts),
            }
        }
        Role::User => OutMessage::User {
            content: UserContent::Text(&m.content),
        },
        Role::Assistant => OutMessage::Assistant {
            content: Some(m.content.as_str()).filter(|c| !c.is_empty() || m.tool_calls.is_empty()),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| OutCall {
                    id: &c.id,
                    kind: "function",
                    function: OutFunction {
                        name: &c.name,
                        arguments: &c.arguments,
                    },
                })
                .collect(),
        },
        Role::Tool => OutMessage::Tool {
            tool_call_id: m.tool_call_id.as_deref().unwrap_or_default(),
            content: &m.content,
        },
    }
}

#[async_trait]
impl Provider for OpenAiChat {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        self.send_streaming(request, &super::no_deltas).await
    }

    async fn send_streaming(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let headers = |_: &[u8]| -> Result<HeaderMap, String> {
            let mut h = HeaderMap::new();
            if let Some(k) = &self.key {
                secret_header(&mut h, AUTHORIZATION, &format!("Bearer {}", k.expose()))?;
            }
            Ok(h)
        };
        self.http
            .exchange::<ChatStream>(&self.url, &headers, request, &self.body(request), on_delta)
            .await
    }

    fn render(&self, request: &ChatRequest) -> Result<super::Rendered, Box<ProviderError>> {
        let auth = format!("Bearer {}", super::REDACTED);
        let headers: &[(&str, &str)] = match self.key {
            Some(_) => &[("authorization", &auth)],
            None => &[],
        };
        let body = super::http::encode(&self.name, &self.body(request))?;
        Ok(super::Rendered::post(&self.url, headers, body))
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
            cache_write_tokens: 0,
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
        context: None,
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

    fn progress(&self) -> (&str, &str) {
        (&self.reply.text, &self.reply.reasoning)
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
    use super::super::wire::fixture;
    use super::*;

    #[test]
    fn body_matches_the_pinned_wire_json() {
        let client = |legacy| {
            OpenAiChat::new(
                "openai",
                "http://x/v1",
                None,
                legacy,
                ClientOptions::default(),
            )
            .unwrap()
        };
        let body = |legacy, stream| {
            serde_json::to_vec(&client(legacy).body(&fixture::request(stream))).unwrap()
        };
        fixture::assert_body(&body(false, false), include_str!("testdata/openai.json"));
        fixture::assert_body(
            &body(false, true),
            include_str!("testdata/openai_stream.json"),
        );
        fixture::assert_body(
            &body(true, false),
            include_str!("testdata/openai_legacy.json"),
        );
    }

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
