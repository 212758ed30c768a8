//! Anthropic Messages API (`POST /v1/messages`), plain and streamed (content blocks: text,
//! tool_use with `input_json_delta`, thinking).

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{BuildError, ClientOptions, Secret};
use super::context_management::{AppliedContext, CLEAR_TOOL_USES};
use super::http::{DecodeError, HttpClient, Reply, StreamState, parse_json, secret_header};
use super::sse::SseEvent;
use super::wire::{Arguments, SystemText, Turn, is_false, merge_turns};
use super::{
    ChatRequest, ChatResponse, DeltaSink, Provider, ProviderError, StopReason, ToolChoice, Usage,
};
use crate::history::{Message, Role, ToolCall};

const API_VERSION: &str = "2023-06-01";

/// `Debug` shows the key as redacted ([`Secret`]).
#[derive(Debug)]
pub struct Anthropic {
    url: String,
    key: Secret,
    http: HttpClient,
}

impl Anthropic {
    /// `base` is the API root (`https://api.anthropic.com`); a trailing `/v1` is accepted.
    pub fn new(
        base: impl Into<String>,
        key: Secret,
        options: ClientOptions,
    ) -> Result<Self, BuildError> {
        let base = base.into();
        let base = base.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        Ok(Self {
            url: format!("{base}/v1/messages"),
            key,
            http: HttpClient::new("anthropic", options)?,
        })
    }

    /// The exact JSON body sent for `request`.
    ///
    /// Prompt-cache breakpoints (`cache_control: {"type": "ephemeral"}`, at most four, in
    /// the order the server reads the prompt: tools, system, messages): the last tool, the
    /// system text, the last block of the newest compaction summary, and the last block of
    /// the conversation, so the next request reads everything before its new turn from the
    /// cache.
    pub fn body(request: &ChatRequest) -> impl Serialize + '_ {
        let last_tool = request.tools.len().checked_sub(1);
        Body {
            model: &request.model,
            max_tokens: request.max_output_tokens,
            messages: wire_messages(&request.messages),
            system: SystemText::of(&request.messages).map(|text| {
                [SystemBlock {
                    kind: "text",
                    text,
                    cache_control: EPHEMERAL,
                }]
            }),
            tools: request
                .tools
                .iter()
                .enumerate()
                .map(|(i, t)| Tool {
                    name: &t.name,
                    description: &t.description,
                    input_schema: &t.parameters,
                    cache_control: (Some(i) == last_tool).then_some(EPHEMERAL),
                })
                .collect(),
            stream: request.stream,
            tool_choice: anthropic_tool_choice(request),
            temperature: request.controls.temperature,
            top_p: request.controls.top_p,
            output_config: anthropic_output_config(request),
            context_management: request.context.as_ref().and_then(|c| c.anthropic_body()),
        }
    }
}

/// Anthropic's `output_config`: the effort and the JSON Schema the answer must follow.
fn anthropic_output_config(request: &ChatRequest) -> Option<Value> {
    let c = &request.controls;
    if c.format.is_none() && c.effort.is_none() {
        return None;
    }
    let mut v = serde_json::json!({});
    if let Some(e) = c.effort {
        v["effort"] = Value::from(e.as_str());
    }
    if let Some(schema) = c.format.as_ref().and_then(|f| f.schema()) {
        v["format"] = serde_json::json!({"type": "json_schema", "schema": schema});
    }
    Some(v)
}

/// Anthropic's `tool_choice`: `auto`, `any` (required), `tool` (named) or `none`, with
/// `disable_parallel_tool_use` for `parallel_tool_calls: false`.
fn anthropic_tool_choice(request: &ChatRequest) -> Option<Value> {
    let has_tools = !request.tools.is_empty();
    let choice = request.controls.choice(has_tools);
    let single = request.controls.parallel(has_tools) == Some(false);
    if choice.is_none() && !single {
        return None;
    }
    let mut v = match choice.unwrap_or(&ToolChoice::Auto) {
        ToolChoice::Auto => serde_json::json!({"type": "auto"}),
        ToolChoice::None => return Some(serde_json::json!({"type": "none"})),
        ToolChoice::Required => serde_json::json!({"type": "any"}),
        ToolChoice::Function(name) => serde_json::json!({"type": "tool", "name": name}),
    };
    if single {
        v["disable_parallel_tool_use"] = Value::Bool(true);
    }
    Some(v)
}

/// A prompt-cache breakpoint: the server caches the prompt up to and including the block
/// that carries it.
#[derive(Serialize, Clone, Copy)]
struct CacheControl {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: CacheControl = CacheControl { kind: "ephemeral" };

#[derive(Serialize)]
struct SystemBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: SystemText<'a>,
    cache_control: CacheControl,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    max_tokens: u64,
    messages: Vec<Turn<WireBlock<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<[SystemBlock<'a>; 1]>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    #[serde(skip_serializing_if = "is_false")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_config: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_management: Option<Value>,
}

#[derive(Serialize)]
struct Tool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

/// A content block, with a cache breakpoint when it ends a cached prefix.
#[derive(Serialize)]
struct WireBlock<'a> {
    #[serde(flatten)]
    block: ContentBlock<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

impl<'a> From<ContentBlock<'a>> for WireBlock<'a> {
    fn from(block: ContentBlock<'a>) -> Self {
        Self {
            block,
            cache_control: None,
        }
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentBlock<'a> {
    Image {
        source: ImageSource<'a>,
    },
    Text {
        #[serde(serialize_with = "super::wire_cache::text")]
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Arguments<'a>,
    },
    ToolResult {
        tool_use_id: &'a str,
        #[serde(serialize_with = "super::wire_cache::text")]
        content: &'a str,
    },
}

#[derive(Serialize)]
struct ImageSource<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    media_type: &'a str,
    #[serde(serialize_with = "super::wire_cache::text")]
    data: &'a str,
}

/// Messages alternate user/assistant; tool results travel as user content blocks, and
/// consecutive messages of one role merge into one. The last block of the newest summary and
/// the last block of all carry cache breakpoints.
fn wire_messages(messages: &[Message]) -> Vec<Turn<WireBlock<'_>>> {
    let summary = messages
        .iter()
        .rposition(|m| m.meta.is_summary && !m.is_system());
    let turns = messages.iter().enumerate().filter_map(|(i, m)| {
        let (role, blocks) = blocks_of(m)?;
        let mut blocks: Vec<WireBlock<'_>> = blocks.into_iter().map(WireBlock::from).collect();
        if Some(i) == summary
            && let Some(last) = blocks.last_mut()
        {
            last.cache_control = Some(EPHEMERAL);
        }
        Some((role, blocks))
    });
    let mut turns = merge_turns(turns);
    if let Some(last) = turns.last_mut().and_then(|t| t.content.last_mut()) {
        last.cache_control = Some(EPHEMERAL);
    }
    turns
}

/// The role and content blocks of one message (`None` for a system message).
fn blocks_of(m: &Message) -> Option<(&'static str, Vec<ContentBlock<'_>>)> {
    match m.role {
        Role::System => None,
        Role::User => {
            let mut blocks: Vec<ContentBlock<'_>> = m
                .images
                .iter()
                .map(|i| ContentBlock::Image {
                    source: ImageSource {
                        kind: "base64",
                        media_type: &i.media_type,
                        data: &i.data,
                    },
                })
                .collect();
            if !m.content.is_empty() {
                blocks.push(ContentBlock::Text { text: &m.content });
            }
            Some(("user", blocks))
        }
        Role::Assistant => {
            let mut blocks = Vec::with_capacity(1 + m.tool_calls.len());
            if !m.content.is_empty() {
                blocks.push(ContentBlock::Text { text: &m.content });
            }
            blocks.extend(m.tool_calls.iter().map(|c| ContentBlock::ToolUse {
                id: &c.id,
                name: &c.name,
                input: Arguments::new(&c.arguments),
            }));
            Some(("assistant", blocks))
        }
        Role::Tool => Some((
            "user",
            vec![ContentBlock::ToolResult {
                tool_use_id: m.tool_call_id.as_deref().unwrap_or_default(),
                content: &m.content,
            }],
        )),
    }
}

#[async_trait]
impl Provider for Anthropic {
    fn name(&self) -> &str {
        "anthropic"
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
                HeaderName::from_static("x-api-key"),
                self.key.expose(),
            )?;
            h.insert(
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static(API_VERSION),
            );
            if request
                .context
                .as_ref()
                .is_some_and(|c| c.anthropic_body().is_some())
            {
                h.insert(
                    HeaderName::from_static("anthropic-beta"),
                    HeaderValue::from_static(super::context_management::ANTHROPIC_BETA),
                );
            }
            Ok(h)
        };
        self.http
            .exchange::<MessageStream>(&self.url, &headers, request, &Self::body(request), on_delta)
            .await
    }

    fn render(&self, request: &ChatRequest) -> Result<super::Rendered, Box<ProviderError>> {
        let mut headers = vec![
            ("x-api-key", super::REDACTED),
            ("anthropic-version", API_VERSION),
        ];
        if request
            .context
            .as_ref()
            .is_some_and(|c| c.anthropic_body().is_some())
        {
            headers.push(("anthropic-beta", super::context_management::ANTHROPIC_BETA));
        }
        let body = super::http::encode(self.name(), &Self::body(request))?;
        Ok(super::Rendered::post(&self.url, &headers, body))
    }
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireReply {
    content: Option<Vec<Value>>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    context_management: Option<Value>,
}

/// `context_management.applied_edits` of a reply: the tool uses the server cleared.
fn applied_edits(v: &Value) -> Option<AppliedContext> {
    let mut uses = 0;
    let mut tokens = 0;
    for e in v.get("applied_edits")?.as_array()? {
        if str_field(e, "type") == Some(CLEAR_TOOL_USES) {
            uses += e
                .get("cleared_tool_uses")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            tokens += e
                .get("cleared_input_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
        }
    }
    (uses > 0).then_some(AppliedContext::ClearedToolUses {
        cleared_tool_uses: uses,
        cleared_input_tokens: tokens,
    })
}

fn stop_reason(s: &str) -> StopReason {
    match s {
        "end_turn" | "stop_sequence" => StopReason::End,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" => StopReason::MaxTokens,
        _ => StopReason::Other,
    }
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn decode_reply(bytes: &[u8]) -> Result<Reply, DecodeError> {
    let raw: Value = parse_json("message", bytes)?;
    if str_field(&raw, "type") == Some("error") {
        return Err(DecodeError::Provider(raw.to_string()));
    }
    let r: WireReply = serde_json::from_value(raw).map_err(|e| DecodeError::json("message", e))?;
    let mut reply = Reply {
        stop: r.stop_reason.as_deref().map(stop_reason),
        ..Reply::default()
    };
    for block in r.content.ok_or(DecodeError::Missing("content"))? {
        match str_field(&block, "type") {
            Some("text") => reply
                .text
                .push_str(str_field(&block, "text").unwrap_or_default()),
            Some("thinking") => reply
                .reasoning
                .push_str(str_field(&block, "thinking").unwrap_or_default()),
            Some("tool_use") => reply.calls.push(ToolCall {
                id: str_field(&block, "id")
                    .ok_or(DecodeError::Missing("tool_use.id"))?
                    .to_string(),
                name: str_field(&block, "name")
                    .ok_or(DecodeError::Missing("tool_use.name"))?
                    .to_string(),
                arguments: block.get("input").map_or("{}".into(), Value::to_string),
            }),
            _ => {}
        }
    }
    if let Some(u) = r.usage {
        reply.usage = usage(u, Usage::default());
    }
    reply.context = r.context_management.as_ref().and_then(applied_edits);
    Ok(reply)
}

/// Folds a `usage` object into what earlier events reported (a stream reports the input in
/// `message_start` and the output in `message_delta`). Anthropic's `input_tokens` leaves the
/// cache reads and writes out; the normalised [`Usage`] counts them in.
fn usage(u: WireUsage, prev: Usage) -> Usage {
    let uncached = u.input_tokens.unwrap_or(prev.uncached_input_tokens());
    let read = u.cache_read_input_tokens.unwrap_or(prev.cache_read_tokens);
    let write = u
        .cache_creation_input_tokens
        .unwrap_or(prev.cache_write_tokens);
    Usage {
        input_tokens: uncached + read + write,
        output_tokens: u.output_tokens.unwrap_or(prev.output_tokens),
        cache_read_tokens: read,
        cache_write_tokens: write,
    }
}

/// Decodes a non-streamed Messages body.
pub fn decode_response(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    decode_reply(bytes).map(|r| r.into_response(0))
}

/// Decodes a complete Messages event stream.
pub fn decode_stream(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    super::http::decode_sse_bytes(bytes, MessageStream::default()).map(|r| r.into_response(0))
}

enum Block {
    Text,
    Thinking,
    Tool {
        id: String,
        name: String,
        json: String,
    },
    Other,
}

#[derive(Default)]
struct MessageStream {
    reply: Reply,
    blocks: Vec<(usize, Block)>,
    stopped: bool,
}

impl MessageStream {
    fn block(&mut self, index: usize) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, b)| b)
    }
}

impl StreamState for MessageStream {
    fn on_event(&mut self, ev: &SseEvent) -> Result<bool, DecodeError> {
        let v: Value = parse_json("stream event", ev.data.as_bytes())?;
        let kind = str_field(&v, "type").or(ev.event.as_deref()).unwrap_or("");
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        match kind {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage") {
                    let u: WireUsage = serde_json::from_value(u.clone()).unwrap_or_default();
                    self.reply.usage = usage(u, self.reply.usage);
                }
            }
            "content_block_start" => {
                let b = v.get("content_block").cloned().unwrap_or(Value::Null);
                let block = match str_field(&b, "type") {
                    Some("text") => {
                        self.reply
                            .text
                            .push_str(str_field(&b, "text").unwrap_or_default());
                        Block::Text
                    }
                    Some("thinking") => Block::Thinking,
                    Some("tool_use") => Block::Tool {
                        id: str_field(&b, "id").unwrap_or_default().to_string(),
                        name: str_field(&b, "name").unwrap_or_default().to_string(),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                self.blocks.push((index, block));
            }
            "content_block_delta" => {
                let d = v.get("delta").cloned().unwrap_or(Value::Null);
                let text = |k| str_field(&d, k).unwrap_or_default().to_string();
                match (str_field(&d, "type"), self.block(index)) {
                    (Some("text_delta"), _) => self.reply.text.push_str(&text("text")),
                    (Some("thinking_delta"), _) => {
                        self.reply.reasoning.push_str(&text("thinking"));
                    }
                    (Some("input_json_delta"), Some(Block::Tool { json, .. })) => {
                        json.push_str(&text("partial_json"));
                    }
                    (Some("input_json_delta"), _) => {
                        return Err(DecodeError::Stream(format!(
                            "input_json_delta for block {index}, which is not a tool_use"
                        )));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(s) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.reply.stop = Some(stop_reason(s));
                    self.stopped = true;
                }
                if let Some(u) = v.get("usage") {
                    let u: WireUsage = serde_json::from_value(u.clone()).unwrap_or_default();
                    self.reply.usage = usage(u, self.reply.usage);
                }
                if let Some(c) = v.get("context_management").and_then(applied_edits) {
                    self.reply.context = Some(c);
                }
            }
            "message_stop" => return Ok(true),
            "error" => return Err(DecodeError::Provider(ev.data.clone())),
            _ => {}
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
        if !saw_terminal {
            return Err(DecodeError::Incomplete("message_stop"));
        }
        if !self.stopped {
            return Err(DecodeError::Missing("stop_reason"));
        }
        for (_, b) in std::mem::take(&mut self.blocks) {
            if let Block::Tool { id, name, json } = b {
                let arguments = if json.trim().is_empty() {
                    "{}".to_string()
                } else {
                    json
                };
                self.reply.calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                });
            }
        }
        Ok(self.reply)
    }
}

#[cfg(test)]
mod tests {
    use super::super::context_management::{ANTHROPIC_BETA, ServerContext};
    use super::super::wire::fixture;
    use super::super::{REDACTED, ToolSpec};
    use super::*;

    // Bodies written from Anthropic's context editing reference; the README beside them names
    // the pages and fields each follows.
    const RECORDED_REQUEST: &str =
        include_str!("../../tests/data/provider-bodies/anthropic-context-editing-request.json");
    const RECORDED_HEADERS: &str = include_str!(
        "../../tests/data/provider-bodies/anthropic-context-editing-request.headers.json"
    );
    const RECORDED_RESPONSE: &str =
        include_str!("../../tests/data/provider-bodies/anthropic-context-editing-response.json");
    const RECORDED_STREAM: &str =
        include_str!("../../tests/data/provider-bodies/anthropic-context-editing-stream.sse");

    /// The conversation of the recorded request as cairn holds it, with the edit's settings
    /// as `providerEngine` gives them.
    fn recorded_conversation() -> ChatRequest {
        let calls = |id, name, arguments| vec![fixture::tool_call(id, name, arguments)];
        let tool = |name: &str, description: &str, field: &str| ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters: serde_json::json!({"type": "object",
                "properties": {field: {"type": "string"}}, "required": [field]}),
        };
        ChatRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![
                Message::user("Compare the two release notes and look up anything unclear."),
                Message::assistant_calls(
                    "I'll read both files first.",
                    calls("toolu_01A", "read_file", r#"{"path":"notes/v1.md"}"#),
                ),
                Message::tool("toolu_01A", "# v1\n- first release\n- CLI only"),
                Message::assistant_calls(
                    "",
                    calls("toolu_01B", "read_file", r#"{"path":"notes/v2.md"}"#),
                ),
                Message::tool(
                    "toolu_01B",
                    "# v2\n- HTTP API\n- drops the v1 config format",
                ),
                Message::assistant_calls(
                    "",
                    calls(
                        "toolu_01C",
                        "web_search",
                        r#"{"query":"v1 config format migration"}"#,
                    ),
                ),
                Message::tool("toolu_01C", "1 result: the migration guide"),
            ],
            tools: vec![
                tool("read_file", "Read a file of the workspace.", "path"),
                tool("web_search", "Search the web.", "query"),
            ],
            max_output_tokens: 4096,
            stream: false,
            controls: Default::default(),
            context: Some(ServerContext::ClearToolUses {
                trigger_input_tokens: 30_000,
                keep_tool_uses: 3,
                clear_at_least_input_tokens: Some(5000),
                exclude_tools: vec!["web_search".into()],
            }),
        }
    }

    #[test]
    fn recorded_context_editing_request_is_the_body_and_headers_cairn_sends() {
        let request = recorded_conversation();
        // cairn adds prompt-cache breakpoints; it leaves `clear_tool_inputs` at the
        // reference's default (false: only results are cleared, which is what the mirror
        // stubs).
        let sent = fixture::without(
            serde_json::to_value(Anthropic::body(&request)).unwrap(),
            "cache_control",
            None,
        );
        let recorded = fixture::without(
            fixture::recorded(RECORDED_REQUEST),
            "clear_tool_inputs",
            Some(&Value::Bool(false)),
        );
        assert_eq!(sent, recorded, "{sent:#}");

        let client = Anthropic::new(
            "https://api.anthropic.com",
            Secret::new("sk-ant-test"),
            ClientOptions::default(),
        )
        .unwrap();
        let headers = |request: &ChatRequest| client.render(request).unwrap().headers;
        let sent = headers(&request);
        let header = |name: &str| {
            sent.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        for (name, value) in fixture::recorded(RECORDED_HEADERS).as_object().unwrap() {
            assert_eq!(header(name), value.as_str(), "{name}: {sent:?}");
        }
        assert_eq!(header("x-api-key"), Some(REDACTED));
        assert_eq!(header("anthropic-beta"), Some(ANTHROPIC_BETA));
        // Without `engine: provider` neither the beta nor the field is sent.
        let plain = ChatRequest {
            context: None,
            ..recorded_conversation()
        };
        assert!(headers(&plain).iter().all(|(k, _)| k != "anthropic-beta"));
        let body = serde_json::to_value(Anthropic::body(&plain)).unwrap();
        assert!(body.get("context_management").is_none());
    }

    #[test]
    fn recorded_context_editing_replies_decode_to_the_cleared_tool_uses() {
        // The numbers of the recorded `clear_tool_uses_20250919` entry; the
        // `clear_thinking_20251015` entry beside it is no edit cairn asked for.
        let recorded = fixture::recorded(RECORDED_RESPONSE);
        let entry = recorded["context_management"]["applied_edits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == CLEAR_TOOL_USES)
            .unwrap();
        let want = AppliedContext::ClearedToolUses {
            cleared_tool_uses: entry["cleared_tool_uses"].as_u64().unwrap(),
            cleared_input_tokens: entry["cleared_input_tokens"].as_u64().unwrap(),
        };
        assert_eq!(
            want,
            AppliedContext::ClearedToolUses {
                cleared_tool_uses: 2,
                cleared_input_tokens: 18_250
            }
        );
        let replies = [
            (
                "json",
                decode_response(RECORDED_RESPONSE.as_bytes()).unwrap(),
            ),
            ("sse", decode_stream(RECORDED_STREAM.as_bytes()).unwrap()),
        ];
        for (form, r) in replies {
            assert_eq!(r.context.as_ref(), Some(&want), "{form}");
            assert_eq!(
                r.usage,
                Usage {
                    input_tokens: 24_310 + 1_200 + 800,
                    output_tokens: 96,
                    cache_read_tokens: 800,
                    cache_write_tokens: 1_200,
                },
                "{form}"
            );
            assert_eq!(
                r.message.content, "v2 drops the v1 config format; the migration guide covers it.",
                "{form}"
            );
            assert_eq!(r.stop, StopReason::ToolUse, "{form}");
            let [call] = r.tool_calls() else {
                panic!("{form}: one tool call, got {:?}", r.tool_calls());
            };
            assert_eq!(
                (call.id.as_str(), call.name.as_str()),
                ("toolu_01D", "read_file")
            );
            let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
            assert_eq!(
                arguments,
                serde_json::json!({"path": "docs/migration.md"}),
                "{form}"
            );
        }
    }

    #[test]
    fn body_matches_the_pinned_wire_json() {
        let body =
            |stream| serde_json::to_vec(&Anthropic::body(&fixture::request(stream))).unwrap();
        fixture::assert_body(&body(false), include_str!("testdata/anthropic.json"));
        fixture::assert_body(&body(true), include_str!("testdata/anthropic_stream.json"));
    }

    #[test]
    fn breakpoints_end_the_tools_the_system_the_newest_summary_and_the_conversation() {
        let mut request = fixture::request(false);
        let mut summary = Message::user("summary of what came before");
        summary.meta.is_summary = true;
        request.messages.insert(2, summary);
        let body = serde_json::to_value(Anthropic::body(&request)).unwrap();
        let marked: Vec<String> = {
            let mut at = Vec::new();
            let mut walk = |place: String, v: &Value| {
                if v.get("cache_control") == Some(&serde_json::json!({"type": "ephemeral"})) {
                    at.push(place);
                }
            };
            for (i, t) in body["tools"].as_array().unwrap().iter().enumerate() {
                walk(format!("tools[{i}]"), t);
            }
            for (i, t) in body["system"].as_array().unwrap().iter().enumerate() {
                walk(format!("system[{i}]"), t);
            }
            for (i, m) in body["messages"].as_array().unwrap().iter().enumerate() {
                for (j, b) in m["content"].as_array().unwrap().iter().enumerate() {
                    walk(format!("messages[{i}].content[{j}]"), b);
                }
            }
            at
        };
        // The summary leads the first user turn, which the image message joins.
        assert_eq!(
            marked,
            [
                "tools[0]",
                "system[0]",
                "messages[0].content[0]",
                "messages[4].content[0]"
            ]
        );
        assert_eq!(
            body["messages"][0]["content"][0]["text"],
            "summary of what came before"
        );
    }

    #[test]
    fn stream_handles_thinking_text_and_tool_blocks() {
        let s = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":4,\"cache_creation_input_tokens\":2,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
            "event: ping\ndata: {\"type\":\"ping\"}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"tu1\",\"name\":\"read\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"p\\\":\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"2}\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let r = decode_stream(s.as_bytes()).unwrap();
        assert_eq!(r.message.content, "Hi");
        assert_eq!(r.message.reasoning.as_deref(), Some("hmm"));
        assert_eq!(r.tool_calls()[0].arguments, "{\"p\":2}");
        assert_eq!(r.stop, StopReason::ToolUse);
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 16,
                output_tokens: 7,
                cache_read_tokens: 4,
                cache_write_tokens: 2,
            }
        );
        let cut = &s[..s.find("event: message_delta").unwrap()];
        assert_eq!(
            decode_stream(cut.as_bytes()).unwrap_err().label(),
            "stream_incomplete"
        );
        let overloaded = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        assert_eq!(
            decode_stream(overloaded.as_bytes()).unwrap_err().label(),
            "provider_error_event"
        );
    }
}
