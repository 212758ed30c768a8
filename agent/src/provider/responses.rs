//! OpenAI Responses API (`POST /responses`), stateless (`store: false`): the whole
//! conversation travels in `input` on every call, so the request size stays honest.

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{BuildError, ClientOptions, Secret};
use super::context_management::AppliedContext;
use super::http::{DecodeError, HttpClient, Reply, StreamState, parse_json, secret_header};
use super::sse::SseEvent;
use super::wire::{DataUrl, SystemText, is_false};
use super::{
    ChatRequest, ChatResponse, DeltaSink, Provider, ProviderError, StopReason, ToolChoice, Usage,
};
use crate::history::{Role, ToolCall};

/// `Debug` shows the key as redacted ([`Secret`]).
#[derive(Debug)]
pub struct OpenAiResponses {
    url: String,
    key: Secret,
    http: HttpClient,
}

impl OpenAiResponses {
    /// `base` ends before `/responses` (e.g. `https://api.openai.com/v1`).
    pub fn new(
        base: impl Into<String>,
        key: Secret,
        options: ClientOptions,
    ) -> Result<Self, BuildError> {
        let base = base.into();
        Ok(Self {
            url: format!("{}/responses", base.trim_end_matches('/')),
            key,
            http: HttpClient::new("openai-responses", options)?,
        })
    }

    /// The exact JSON body sent for `request`.
    pub fn body(request: &ChatRequest) -> impl Serialize + '_ {
        let mut input = Vec::with_capacity(request.messages.len());
        for m in &request.messages {
            if let Some(item) = &m.provider_item {
                input.push(Item::Opaque(item));
                continue;
            }
            match m.role {
                Role::System => {}
                Role::User => {
                    let mut content = vec![Part::InputText { text: &m.content }];
                    content.extend(m.images.iter().map(|i| Part::InputImage {
                        image_url: DataUrl(i),
                    }));
                    input.push(Item::Typed(TypedItem::Message {
                        role: "user",
                        content,
                    }));
                }
                Role::Assistant => {
                    if !m.content.is_empty() {
                        input.push(Item::Typed(TypedItem::Message {
                            role: "assistant",
                            content: vec![Part::OutputText { text: &m.content }],
                        }));
                    }
                    input.extend(m.tool_calls.iter().map(|c| {
                        Item::Typed(TypedItem::FunctionCall {
                            call_id: &c.id,
                            name: &c.name,
                            arguments: &c.arguments,
                        })
                    }));
                }
                Role::Tool => input.push(Item::Typed(TypedItem::FunctionCallOutput {
                    call_id: m.tool_call_id.as_deref().unwrap_or_default(),
                    output: &m.content,
                })),
            }
        }
        Body {
            model: &request.model,
            input,
            max_output_tokens: request.max_output_tokens,
            store: false,
            instructions: SystemText::of(&request.messages),
            tools: request
                .tools
                .iter()
                .map(|t| Tool {
                    kind: "function",
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                })
                .collect(),
            stream: request.stream,
            tool_choice: request
                .controls
                .choice(!request.tools.is_empty())
                .map(responses_tool_choice),
            parallel_tool_calls: request.controls.parallel(!request.tools.is_empty()),
            temperature: request.controls.temperature,
            top_p: request.controls.top_p,
            text: request
                .controls
                .format
                .as_ref()
                .map(|f| serde_json::json!({"format": f.responses_format()})),
            reasoning: request
                .controls
                .effort
                .map(|e| serde_json::json!({"effort": e.as_str()})),
            context_management: request.context.as_ref().and_then(|c| c.responses_body()),
        }
    }
}

/// `tool_choice` of the Responses API.
fn responses_tool_choice(c: &ToolChoice) -> Value {
    match c {
        ToolChoice::Auto => Value::from("auto"),
        ToolChoice::None => Value::from("none"),
        ToolChoice::Required => Value::from("required"),
        ToolChoice::Function(name) => serde_json::json!({"type": "function", "name": name}),
    }
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    input: Vec<Item<'a>>,
    max_output_tokens: u64,
    store: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<SystemText<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    #[serde(skip_serializing_if = "is_false")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_management: Option<Value>,
}

#[derive(Serialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// An input item: a message, a function call or its output. Every item names its `type`:
/// the Responses API reference lists it on message items too, and servers other than
/// OpenAI's (llama.cpp: "Cannot determine type of 'item'") refuse an assistant message
/// without it.
#[derive(Serialize)]
#[serde(untagged)]
enum Item<'a> {
    Typed(TypedItem<'a>),
    /// An item the server gave back (a compaction item), verbatim.
    Opaque(&'a Value),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum TypedItem<'a> {
    Message {
        role: &'static str,
        content: Vec<Part<'a>>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        #[serde(serialize_with = "super::wire::arguments_text")]
        arguments: &'a str,
    },
    FunctionCallOutput {
        call_id: &'a str,
        #[serde(serialize_with = "super::wire_cache::text")]
        output: &'a str,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    InputText {
        #[serde(serialize_with = "super::wire_cache::text")]
        text: &'a str,
    },
    InputImage {
        image_url: DataUrl<'a>,
    },
    OutputText {
        #[serde(serialize_with = "super::wire_cache::text")]
        text: &'a str,
    },
}

#[async_trait]
impl Provider for OpenAiResponses {
    fn name(&self) -> &str {
        "openai-responses"
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
                AUTHORIZATION,
                &format!("Bearer {}", self.key.expose()),
            )?;
            Ok(h)
        };
        self.http
            .exchange::<ResponseStream>(
                &self.url,
                &headers,
                request,
                &Self::body(request),
                on_delta,
            )
            .await
    }

    fn render(&self, request: &ChatRequest) -> Result<super::Rendered, Box<ProviderError>> {
        let auth = format!("Bearer {}", super::REDACTED);
        let body = super::http::encode(self.name(), &Self::body(request))?;
        Ok(super::Rendered::post(
            &self.url,
            &[("authorization", &auth)],
            body,
        ))
    }
}

#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    status: Option<String>,
    output: Option<Vec<Value>>,
    #[serde(default)]
    incomplete_details: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<Value>,
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn from_value(raw: Value) -> Result<Reply, DecodeError> {
    let r: WireResponse =
        serde_json::from_value(raw).map_err(|e| DecodeError::json("response", e))?;
    if let Some(e) = r.error.filter(|e| !e.is_null()) {
        return Err(DecodeError::Provider(e.to_string()));
    }
    let mut reply = Reply::default();
    for item in r.output.ok_or(DecodeError::Missing("output"))? {
        match str_field(&item, "type") {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if str_field(part, "type") == Some("output_text") {
                        reply
                            .text
                            .push_str(str_field(part, "text").unwrap_or_default());
                    }
                }
            }
            Some("function_call") => reply.calls.push(ToolCall {
                id: str_field(&item, "call_id")
                    .ok_or(DecodeError::Missing("function_call.call_id"))?
                    .to_string(),
                name: str_field(&item, "name")
                    .ok_or(DecodeError::Missing("function_call.name"))?
                    .to_string(),
                arguments: str_field(&item, "arguments").unwrap_or("{}").to_string(),
            }),
            Some("compaction") => {
                reply.context = Some(AppliedContext::Compaction { item: item.clone() });
            }
            Some("reasoning") => {
                for part in item
                    .get("summary")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    reply
                        .reasoning
                        .push_str(str_field(part, "text").unwrap_or_default());
                }
            }
            _ => {}
        }
    }
    reply.stop = Some(match r.status.as_deref() {
        Some("incomplete") => {
            let reason = r
                .incomplete_details
                .as_ref()
                .and_then(|d| str_field(d, "reason"));
            if reason == Some("max_output_tokens") {
                StopReason::MaxTokens
            } else {
                StopReason::Other
            }
        }
        _ if !reply.calls.is_empty() => StopReason::ToolUse,
        Some("completed") | None => StopReason::End,
        Some(_) => StopReason::Other,
    });
    if let Some(u) = r.usage {
        reply.usage = Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cache_read_tokens: u
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64)
                .unwrap_or(0),
            cache_write_tokens: 0,
        };
    }
    Ok(reply)
}

fn decode_reply(bytes: &[u8]) -> Result<Reply, DecodeError> {
    from_value(parse_json("response", bytes)?)
}

/// Decodes a non-streamed Responses body.
pub fn decode_response(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    decode_reply(bytes).map(|r| r.into_response(0))
}

/// Decodes a complete Responses event stream.
pub fn decode_stream(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    super::http::decode_sse_bytes(bytes, ResponseStream::default()).map(|r| r.into_response(0))
}

/// The terminal `response.completed` / `response.incomplete` event carries the whole
/// response, so deltas only feed the live display; the stream must reach that event.
#[derive(Default)]
struct ResponseStream {
    done: Option<Reply>,
    text: String,
    reasoning: String,
}

impl StreamState for ResponseStream {
    fn on_event(&mut self, ev: &SseEvent) -> Result<bool, DecodeError> {
        let v: Value = parse_json("stream event", ev.data.as_bytes())?;
        let kind = str_field(&v, "type").or(ev.event.as_deref()).unwrap_or("");
        match kind {
            "response.completed" | "response.incomplete" => {
                let r = v
                    .get("response")
                    .cloned()
                    .ok_or(DecodeError::Missing("response"))?;
                self.done = Some(from_value(r)?);
                Ok(true)
            }
            "response.output_text.delta" => {
                self.text
                    .push_str(str_field(&v, "delta").unwrap_or_default());
                Ok(false)
            }
            "response.reasoning_summary_text.delta" => {
                self.reasoning
                    .push_str(str_field(&v, "delta").unwrap_or_default());
                Ok(false)
            }
            "response.failed" | "error" => Err(DecodeError::Provider(ev.data.clone())),
            _ => Ok(false),
        }
    }

    fn progress(&self) -> (&str, &str) {
        // The final response is authoritative; it extends what the deltas showed.
        match &self.done {
            Some(r) => (&r.text, &r.reasoning),
            None => (&self.text, &self.reasoning),
        }
    }

    fn whole(bytes: &[u8]) -> Result<Reply, DecodeError> {
        decode_reply(bytes)
    }

    fn finish(self, _saw_terminal: bool) -> Result<Reply, DecodeError> {
        self.done
            .ok_or(DecodeError::Incomplete("response.completed"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::context_management::ServerContext;
    use super::super::wire::fixture;
    use super::*;
    use crate::history::Message;

    // Bodies written from OpenAI's compaction guide and Responses reference; the README
    // beside them names the pages and fields each follows.
    const RECORDED_REQUEST: &str =
        include_str!("../../tests/data/provider-bodies/responses-compaction-request.json");
    const RECORDED_RESPONSE: &str =
        include_str!("../../tests/data/provider-bodies/responses-compaction-response.json");
    const RECORDED_STREAM: &str =
        include_str!("../../tests/data/provider-bodies/responses-compaction-stream.sse");
    const RECORDED_NEXT_REQUEST: &str =
        include_str!("../../tests/data/provider-bodies/responses-compaction-next-request.json");

    /// A request on the history of the recorded conversation, with the compaction
    /// threshold `providerEngine` gives.
    fn recorded_request(messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            model: "gpt-5-mini".into(),
            messages,
            tools: Vec::new(),
            max_output_tokens: 4096,
            stream: false,
            controls: Default::default(),
            context: Some(ServerContext::Compaction {
                compact_threshold: 200_000,
            }),
        }
    }

    fn recorded_history() -> Vec<Message> {
        vec![
            Message::system("You are a careful migration assistant."),
            Message::user("Plan the migration from the v1 config format."),
            Message::assistant_calls(
                "I'll read the current config first.",
                vec![fixture::tool_call(
                    "call_7Qp2",
                    "read_file",
                    r#"{"path":"config/v1.toml"}"#,
                )],
            ),
            Message::tool(
                "call_7Qp2",
                "[server]\nport = 8080\n[storage]\npath = \"/var/lib/app\"",
            ),
        ]
    }

    fn body(request: &ChatRequest) -> Value {
        serde_json::to_value(OpenAiResponses::body(request)).unwrap()
    }

    #[test]
    fn recorded_compaction_request_is_the_body_cairn_sends() {
        let sent = body(&recorded_request(recorded_history()));
        assert_eq!(sent, fixture::recorded(RECORDED_REQUEST), "{sent:#}");
        let plain = ChatRequest {
            context: None,
            ..recorded_request(recorded_history())
        };
        assert!(body(&plain).get("context_management").is_none());
    }

    #[test]
    fn recorded_compaction_replies_decode_to_the_item_verbatim() {
        let recorded = fixture::recorded(RECORDED_RESPONSE);
        let item = recorded["output"][0].clone();
        assert_eq!(item["type"], "compaction");
        let replies = [
            (
                "json",
                decode_response(RECORDED_RESPONSE.as_bytes()).unwrap(),
            ),
            ("sse", decode_stream(RECORDED_STREAM.as_bytes()).unwrap()),
        ];
        for (form, r) in replies {
            assert_eq!(
                r.context,
                Some(AppliedContext::Compaction { item: item.clone() }),
                "{form}"
            );
            assert_eq!(
                r.message.content,
                "Move [server] and [storage] into the v2 layout; nothing else changes.",
                "{form}"
            );
            assert!(r.tool_calls().is_empty(), "{form}");
            assert_eq!(r.stop, StopReason::End, "{form}");
            assert_eq!(
                r.usage,
                Usage {
                    input_tokens: 201_432,
                    output_tokens: 420,
                    cache_read_tokens: 150_016,
                    cache_write_tokens: 0,
                },
                "{form}"
            );
        }
    }

    #[tokio::test]
    async fn recorded_compaction_item_goes_back_verbatim_in_the_next_request() {
        for (form, reply) in [
            (
                "json",
                decode_response(RECORDED_RESPONSE.as_bytes()).unwrap(),
            ),
            ("sse", decode_stream(RECORDED_STREAM.as_bytes()).unwrap()),
        ] {
            let Some(AppliedContext::Compaction { item }) = &reply.context else {
                panic!("{form}: no compaction item");
            };
            // What the session does with the reply: the item stands for the request's input,
            // the reply follows it, then the next user message.
            let mut history = recorded_history();
            let store = crate::ccr::MemoryStore::new();
            crate::compact::mirror::mirror_compaction(&mut history, item, &store)
                .await
                .expect("mirrored");
            history.push(reply.message.clone());
            history.push(Message::user("Write the v2 file."));
            let sent = body(&recorded_request(history));
            assert_eq!(
                sent,
                fixture::recorded(RECORDED_NEXT_REQUEST),
                "{form}: {sent:#}"
            );
            assert_eq!(&sent["input"][0], item, "{form}");
        }
    }

    #[test]
    fn body_matches_the_pinned_wire_json() {
        let body =
            |stream| serde_json::to_vec(&OpenAiResponses::body(&fixture::request(stream))).unwrap();
        fixture::assert_body(&body(false), include_str!("testdata/responses.json"));
        fixture::assert_body(&body(true), include_str!("testdata/responses_stream.json"));
    }

    #[test]
    fn incomplete_for_output_tokens_is_max_tokens() {
        let r = decode_response(br#"{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","content":[{"type":"output_text","text":"par"}]}],"usage":{"input_tokens":3,"output_tokens":9,"input_tokens_details":{"cached_tokens":2}}}"#).unwrap();
        assert_eq!(r.stop, StopReason::MaxTokens);
        assert_eq!(r.message.content, "par");
        assert_eq!(r.usage.cache_read_tokens, 2);
        assert_eq!(
            decode_response(br#"{"status":"completed"}"#)
                .unwrap_err()
                .label(),
            "missing_field"
        );
    }
}
