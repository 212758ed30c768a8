//! Google Gemini `generateContent` and `streamGenerateContent?alt=sse`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{BuildError, ClientOptions, Secret};
use super::http::{DecodeError, HttpClient, Reply, StreamState, parse_json, secret_header};
use super::sse::SseEvent;
use super::wire::{Arguments, merge_turns, system_prompts};
use super::{
    ChatRequest, ChatResponse, DeltaSink, Provider, ProviderError, StopReason, ToolChoice, Usage,
};
use crate::history::{Message, Role, ToolCall};

/// `Debug` shows the key as redacted ([`Secret`]).
#[derive(Debug)]
pub struct Gemini {
    base: String,
    key: Secret,
    http: HttpClient,
}

impl Gemini {
    /// `base` is the API root (`https://generativelanguage.googleapis.com`); a trailing
    /// `/v1beta` is accepted.
    pub fn new(
        base: impl Into<String>,
        key: Secret,
        options: ClientOptions,
    ) -> Result<Self, BuildError> {
        let base = base.into();
        let base = base.trim_end_matches('/');
        let base = base.strip_suffix("/v1beta").unwrap_or(base).to_string();
        Ok(Self {
            base,
            key,
            http: HttpClient::new("gemini", options)?,
        })
    }

    fn url(&self, model: &str, stream: bool) -> String {
        let model = model.strip_prefix("models/").unwrap_or(model);
        let model = percent_encoding::utf8_percent_encode(model, super::http::PATH_SEGMENT);
        if stream {
            format!(
                "{}/v1beta/models/{model}:streamGenerateContent?alt=sse",
                self.base
            )
        } else {
            format!("{}/v1beta/models/{model}:generateContent", self.base)
        }
    }

    /// The exact JSON body sent for `request`.
    pub fn body(request: &ChatRequest) -> impl Serialize + '_ {
        let system: Vec<Text<'_>> = system_prompts(&request.messages)
            .map(|text| Text { text })
            .collect();
        Body {
            contents: wire_contents(&request.messages),
            generation_config: GenerationConfig {
                max_output_tokens: request.max_output_tokens,
                temperature: request.controls.temperature,
                top_p: request.controls.top_p,
                response_mime_type: request.controls.format.as_ref().map(|_| "application/json"),
                response_json_schema: request.controls.format.as_ref().and_then(|f| f.schema()),
                thinking_config: request
                    .controls
                    .effort
                    .map(|e| serde_json::json!({"thinkingLevel": e.as_str()})),
            },
            tool_config: request
                .controls
                .choice(!request.tools.is_empty())
                .map(gemini_tool_config),
            system_instruction: (!system.is_empty()).then_some(SystemInstruction { parts: system }),
            tools: if request.tools.is_empty() {
                Vec::new()
            } else {
                vec![Tools {
                    function_declarations: request
                        .tools
                        .iter()
                        .map(|t| Declaration {
                            name: &t.name,
                            description: &t.description,
                            parameters: &t.parameters,
                        })
                        .collect(),
                }]
            },
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    contents: Vec<Content<'a>>,
    generation_config: GenerationConfig<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<SystemInstruction<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tools<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig<'a> {
    max_output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    /// `application/json` with a structured-output format.
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_json_schema: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_config: Option<Value>,
}

/// Gemini's `toolConfig.functionCallingConfig`: `NONE`, `ANY`, or `ANY` limited to one name.
fn gemini_tool_config(c: &ToolChoice) -> Value {
    let config = match c {
        ToolChoice::Auto => serde_json::json!({"mode": "AUTO"}),
        ToolChoice::None => serde_json::json!({"mode": "NONE"}),
        ToolChoice::Required => serde_json::json!({"mode": "ANY"}),
        ToolChoice::Function(name) => {
            serde_json::json!({"mode": "ANY", "allowedFunctionNames": [name]})
        }
    };
    serde_json::json!({ "functionCallingConfig": config })
}

#[derive(Serialize)]
struct SystemInstruction<'a> {
    parts: Vec<Text<'a>>,
}

#[derive(Serialize)]
struct Text<'a> {
    #[serde(serialize_with = "super::wire_cache::text")]
    text: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Tools<'a> {
    function_declarations: Vec<Declaration<'a>>,
}

#[derive(Serialize)]
struct Declaration<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Serialize)]
struct Content<'a> {
    role: &'static str,
    parts: Vec<Part<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Part<'a> {
    #[serde(serialize_with = "super::wire_cache::text")]
    Text(&'a str),
    #[serde(rename_all = "camelCase")]
    InlineData {
        mime_type: &'a str,
        #[serde(serialize_with = "super::wire_cache::text")]
        data: &'a str,
    },
    FunctionCall {
        name: &'a str,
        args: Arguments<'a>,
    },
    FunctionResponse {
        name: &'a str,
        response: FunctionOutput<'a>,
    },
}

#[derive(Serialize)]
struct FunctionOutput<'a> {
    #[serde(serialize_with = "super::wire_cache::text")]
    content: &'a str,
}

/// Tool results answer a function by name, so the name comes from the call they answer.
fn wire_contents(messages: &[Message]) -> Vec<Content<'_>> {
    let names: HashMap<&str, &str> = messages
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    let turns = messages.iter().filter_map(|m| match m.role {
        Role::System => None,
        Role::User => {
            let mut parts = Vec::with_capacity(1 + m.images.len());
            if !m.content.is_empty() {
                parts.push(Part::Text(&m.content));
            }
            parts.extend(m.images.iter().map(|i| Part::InlineData {
                mime_type: &i.media_type,
                data: &i.data,
            }));
            Some(("user", parts))
        }
        Role::Assistant => {
            let mut parts = Vec::with_capacity(1 + m.tool_calls.len());
            if !m.content.is_empty() {
                parts.push(Part::Text(&m.content));
            }
            parts.extend(m.tool_calls.iter().map(|c| Part::FunctionCall {
                name: &c.name,
                args: Arguments::new(&c.arguments),
            }));
            Some(("model", parts))
        }
        Role::Tool => {
            let id = m.tool_call_id.as_deref().unwrap_or_default();
            let name = m
                .name
                .as_deref()
                .or_else(|| names.get(id).copied())
                .unwrap_or(id);
            Some((
                "user",
                vec![Part::FunctionResponse {
                    name,
                    response: FunctionOutput {
                        content: &m.content,
                    },
                }],
            ))
        }
    });
    merge_turns(turns)
        .into_iter()
        .map(|t| Content {
            role: t.role,
            parts: t.content,
        })
        .collect()
}

#[async_trait]
impl Provider for Gemini {
    fn name(&self) -> &str {
        "gemini"
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
            secret_header(
                &mut h,
                HeaderName::from_static("x-goog-api-key"),
                self.key.expose(),
            )?;
            Ok(h)
        };
        let url = self.url(&request.model, request.stream);
        self.http
            .exchange::<ChunkStream>(&url, &headers, request, &Self::body(request), on_delta)
            .await
    }

    fn render(&self, request: &ChatRequest) -> Result<super::Rendered, Box<ProviderError>> {
        let body = super::http::encode(self.name(), &Self::body(request))?;
        Ok(super::Rendered::post(
            self.url(&request.model, request.stream),
            &[("x-goog-api-key", super::REDACTED)],
            body,
        ))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse {
    #[serde(default)]
    candidates: Option<Vec<Candidate>>,
    #[serde(default)]
    usage_metadata: Option<WireUsage>,
    #[serde(default)]
    prompt_feedback: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<ReplyContent>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ReplyContent {
    #[serde(default)]
    parts: Vec<Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
    #[serde(default)]
    cached_content_token_count: u64,
}

/// Gemini's calls often carry no id; results are matched to calls by id across the whole
/// history, so generated ids must not repeat within the process.
fn next_call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("gemini-call-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn stop_reason(s: &str) -> StopReason {
    match s {
        "STOP" => StopReason::End,
        "MAX_TOKENS" => StopReason::MaxTokens,
        _ => StopReason::Other,
    }
}

/// Folds one response (whole or a stream chunk) into `reply`; true when it carried a
/// finish reason.
fn apply(reply: &mut Reply, r: WireResponse, first: bool) -> Result<bool, DecodeError> {
    if let Some(u) = r.usage_metadata {
        reply.usage = Usage {
            input_tokens: u.prompt_token_count,
            output_tokens: u.candidates_token_count + u.thoughts_token_count,
            cache_read_tokens: u.cached_content_token_count,
            cache_write_tokens: 0,
        };
    }
    let candidates = r.candidates.unwrap_or_default();
    let Some(c) = candidates.into_iter().next() else {
        if let Some(reason) = r
            .prompt_feedback
            .as_ref()
            .and_then(|f| f.get("blockReason"))
            .and_then(Value::as_str)
        {
            return Err(DecodeError::Blocked(reason.to_string()));
        }
        // A stream may carry a usage-only chunk; a whole reply must have a candidate.
        return if first {
            Err(DecodeError::Empty)
        } else {
            Ok(false)
        };
    };
    for part in c.content.map(|c| c.parts).unwrap_or_default() {
        if let Some(call) = part.get("functionCall") {
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .ok_or(DecodeError::Missing("functionCall.name"))?;
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(next_call_id);
            reply.calls.push(ToolCall {
                id,
                name: name.to_string(),
                arguments: call.get("args").map_or("{}".into(), Value::to_string),
            });
        } else if let Some(t) = part.get("text").and_then(Value::as_str) {
            if part.get("thought").and_then(Value::as_bool) == Some(true) {
                reply.reasoning.push_str(t);
            } else {
                reply.text.push_str(t);
            }
        }
    }
    let Some(f) = c.finish_reason else {
        return Ok(false);
    };
    let stop = stop_reason(&f);
    // Gemini reports STOP when it calls a function.
    reply.stop = Some(if stop == StopReason::End && !reply.calls.is_empty() {
        StopReason::ToolUse
    } else {
        stop
    });
    Ok(true)
}

fn decode_reply(bytes: &[u8]) -> Result<Reply, DecodeError> {
    let raw: Value = parse_json("generateContent response", bytes)?;
    if let Some(e) = raw.get("error") {
        return Err(DecodeError::Provider(e.to_string()));
    }
    let r: WireResponse = serde_json::from_value(raw)
        .map_err(|e| DecodeError::json("generateContent response", e))?;
    let mut reply = Reply::default();
    apply(&mut reply, r, true)?;
    Ok(reply)
}

/// Decodes a non-streamed generateContent body.
pub fn decode_response(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    decode_reply(bytes).map(|r| r.into_response(0))
}

/// Decodes a complete `streamGenerateContent?alt=sse` stream.
pub fn decode_stream(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    super::http::decode_sse_bytes(bytes, ChunkStream::default()).map(|r| r.into_response(0))
}

#[derive(Default)]
struct ChunkStream {
    reply: Reply,
    finished: bool,
    chunks: usize,
}

impl StreamState for ChunkStream {
    fn on_event(&mut self, ev: &SseEvent) -> Result<bool, DecodeError> {
        let raw: Value = parse_json("stream chunk", ev.data.as_bytes())?;
        if let Some(e) = raw.get("error") {
            return Err(DecodeError::Provider(e.to_string()));
        }
        let r: WireResponse =
            serde_json::from_value(raw).map_err(|e| DecodeError::json("stream chunk", e))?;
        self.chunks += 1;
        if apply(&mut self.reply, r, false)? {
            self.finished = true;
        }
        // The usage of the final chunk may follow its finish reason; read to the end.
        Ok(false)
    }

    fn progress(&self) -> (&str, &str) {
        (&self.reply.text, &self.reply.reasoning)
    }

    fn whole(bytes: &[u8]) -> Result<Reply, DecodeError> {
        decode_reply(bytes)
    }

    fn finish(self, _saw_terminal: bool) -> Result<Reply, DecodeError> {
        if !self.finished {
            return Err(DecodeError::Incomplete("a chunk with finishReason"));
        }
        Ok(self.reply)
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::fixture;
    use super::*;

    #[test]
    fn body_matches_the_pinned_wire_json() {
        let body = serde_json::to_vec(&Gemini::body(&fixture::request(false))).unwrap();
        fixture::assert_body(&body, include_str!("testdata/gemini.json"));
        let streamed = serde_json::to_vec(&Gemini::body(&fixture::request(true))).unwrap();
        assert_eq!(
            streamed, body,
            "streaming is chosen by the URL, not the body"
        );
    }

    #[test]
    fn function_calls_stop_as_tool_use_and_results_find_their_name() {
        let r = decode_response(br#"{"candidates":[{"content":{"role":"model","parts":[{"text":"think","thought":true},{"functionCall":{"name":"read","args":{"p":1}}}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":2,"thoughtsTokenCount":3}}"#).unwrap();
        assert_eq!(r.stop, StopReason::ToolUse);
        assert_eq!(r.usage.output_tokens, 5);
        assert_eq!(r.message.reasoning.as_deref(), Some("think"));
        let req = ChatRequest {
            model: "gemini-2.5-pro".into(),
            messages: vec![
                Message::user("go"),
                r.message.clone(),
                Message::tool(r.tool_calls()[0].id.clone(), "out"),
            ],
            tools: vec![],
            max_output_tokens: 10,
            stream: false,
            controls: Default::default(),
            context: None,
        };
        let body = serde_json::to_value(Gemini::body(&req)).unwrap();
        assert_eq!(
            body["contents"][2]["parts"][0]["functionResponse"]["name"],
            "read"
        );
        assert_eq!(
            decode_response(br#"{"promptFeedback":{"blockReason":"SAFETY"}}"#)
                .unwrap_err()
                .label(),
            "blocked"
        );
        assert_eq!(decode_response(b"{}").unwrap_err().label(), "empty_choices");
    }
}
