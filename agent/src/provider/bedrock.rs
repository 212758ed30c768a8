//! AWS Bedrock Converse (`POST /model/{modelId}/converse`) and ConverseStream
//! (`/converse-stream`, AWS event-stream framing), signed with SigV4 or a Bedrock API key.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{BuildError, ClientOptions, Secret};
use super::http::{
    DecodeError, HttpClient, PATH_SEGMENT, Reply, StreamState, parse_json, secret_header,
};
use super::sse::SseEvent;
use super::wire::{Arguments, Turn, merge_turns, system_prompts};
use super::{
    ChatRequest, ChatResponse, DeltaSink, Provider, ProviderError, StopReason, ToolChoice, Usage,
};
use crate::aws::{AwsIdentity, CachedCredentials};
use crate::history::{Message, Role, ToolCall};

/// How Bedrock requests authenticate.
#[derive(Clone, Debug)]
pub enum BedrockAuth {
    /// SigV4 with the identity of a credentials provider (static keys, a mounted directory,
    /// the default chain), cached until shortly before it expires.
    SigV4(Arc<CachedCredentials>),
    /// A Bedrock API key, sent as a bearer token.
    ApiKey(Secret),
}

impl BedrockAuth {
    /// SigV4 with `identity`, reaching STS or IMDS (for the chain) over `net`.
    pub fn sigv4(identity: &AwsIdentity, region: &str, net: &crate::net::NetPath) -> Self {
        let provider = identity.provider("bedrock", region, crate::aws::http_client(net));
        Self::SigV4(Arc::new(CachedCredentials::new(provider)))
    }
}

pub struct Bedrock {
    base: reqwest::Url,
    region: String,
    auth: BedrockAuth,
    http: HttpClient,
}

impl std::fmt::Debug for Bedrock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bedrock")
            .field("base", &self.base.as_str())
            .field("region", &self.region)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl Bedrock {
    pub fn new(
        base: impl Into<String>,
        region: impl Into<String>,
        auth: BedrockAuth,
        options: ClientOptions,
    ) -> Result<Self, BuildError> {
        let base = base.into();
        let base = reqwest::Url::parse(base.trim_end_matches('/'))
            .map_err(|e| BuildError::BaseUrl(e.to_string()))?;
        if base.host_str().is_none() {
            return Err(BuildError::BaseUrl("no host".into()));
        }
        Ok(Self {
            base,
            region: region.into(),
            auth,
            http: HttpClient::new("bedrock", options)?,
        })
    }

    /// Path of the Converse call for `model` (ids and ARNs contain `:` and `/`, which the
    /// path must carry encoded).
    fn path(&self, model: &str, stream: bool) -> String {
        format!(
            "{}/model/{}/{}",
            self.base.path().trim_end_matches('/'),
            percent_encoding::utf8_percent_encode(model, PATH_SEGMENT),
            if stream {
                "converse-stream"
            } else {
                "converse"
            }
        )
    }

    /// The exact JSON body sent for `request`.
    ///
    /// For models with prompt caching on Bedrock (Claude, Nova; see [`caches_prompts`]),
    /// `cachePoint` blocks end the cacheable prefixes, at most four: after the tools, after
    /// the system prompts, after the newest compaction summary and after the conversation.
    pub fn body(request: &ChatRequest) -> impl Serialize + '_ {
        let cache = caches_prompts(&request.model);
        let mut system: Vec<SystemBlock<'_>> = system_prompts(&request.messages)
            .map(SystemBlock::Text)
            .collect();
        if cache && !system.is_empty() {
            system.push(SystemBlock::CachePoint(DEFAULT_CACHE_POINT));
        }
        Body {
            messages: wire_messages(&request.messages, cache),
            inference_config: InferenceConfig {
                max_tokens: request.max_output_tokens,
                temperature: request.controls.temperature,
                top_p: request.controls.top_p,
            },
            system,
            tool_config: (!request.tools.is_empty()).then(|| ToolConfig {
                tools: request
                    .tools
                    .iter()
                    .map(|t| {
                        Tool::ToolSpec(ToolSpec {
                            name: &t.name,
                            description: &t.description,
                            input_schema: Schema {
                                json: &t.parameters,
                            },
                        })
                    })
                    .chain(cache.then_some(Tool::CachePoint(DEFAULT_CACHE_POINT)))
                    .collect(),
                tool_choice: request.controls.choice(true).and_then(bedrock_tool_choice),
            }),
        }
    }
}

/// Converse's `toolChoice`: `any` (required) or `tool` (named). Converse has no choice that
/// forbids tool calls; the session refuses `none` for this provider before any call.
fn bedrock_tool_choice(c: &ToolChoice) -> Option<Value> {
    match c {
        ToolChoice::Auto | ToolChoice::None => None,
        ToolChoice::Required => Some(serde_json::json!({"any": {}})),
        ToolChoice::Function(name) => Some(serde_json::json!({"tool": {"name": name}})),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    messages: Vec<Turn<Block<'a>>>,
    inference_config: InferenceConfig,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<SystemBlock<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InferenceConfig {
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
}

#[derive(Serialize)]
struct Text<'a> {
    #[serde(serialize_with = "super::wire_cache::text")]
    text: &'a str,
}

#[derive(Serialize)]
struct ToolConfig<'a> {
    tools: Vec<Tool<'a>>,
    #[serde(rename = "toolChoice", skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Tool<'a> {
    ToolSpec(ToolSpec<'a>),
    CachePoint(CachePoint),
}

/// A prompt-cache checkpoint: the prompt up to here is cached.
#[derive(Serialize, Clone, Copy)]
struct CachePoint {
    #[serde(rename = "type")]
    kind: &'static str,
}

const DEFAULT_CACHE_POINT: CachePoint = CachePoint { kind: "default" };

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum SystemBlock<'a> {
    Text(&'a str),
    CachePoint(CachePoint),
}

/// Whether Bedrock caches prompts for `model` (Anthropic Claude and Amazon Nova); other
/// models refuse `cachePoint` blocks.
pub(crate) fn caches_prompts(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    m.contains("claude") || m.contains("nova")
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolSpec<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: Schema<'a>,
}

#[derive(Serialize)]
struct Schema<'a> {
    json: &'a Value,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Block<'a> {
    #[serde(serialize_with = "super::wire_cache::text")]
    Text(&'a str),
    Image {
        format: &'a str,
        source: ImageBytes<'a>,
    },
    #[serde(rename_all = "camelCase")]
    ToolUse {
        tool_use_id: &'a str,
        name: &'a str,
        input: Arguments<'a>,
    },
    #[serde(rename_all = "camelCase")]
    ToolResult {
        tool_use_id: &'a str,
        content: [Text<'a>; 1],
    },
    CachePoint(CachePoint),
}

#[derive(Serialize)]
struct ImageBytes<'a> {
    #[serde(serialize_with = "super::wire_cache::text")]
    bytes: &'a str,
}

fn image_format(media_type: &str) -> &str {
    media_type.strip_prefix("image/").unwrap_or(media_type)
}

/// The conversation in Converse turns; with `cache`, a `cachePoint` follows the newest
/// summary and ends the last turn.
fn wire_messages(messages: &[Message], cache: bool) -> Vec<Turn<Block<'_>>> {
    let summary = messages
        .iter()
        .rposition(|m| m.meta.is_summary && !m.is_system())
        .filter(|_| cache);
    let turns = messages.iter().enumerate().filter_map(|(i, m)| {
        let (role, mut blocks) = blocks_of(m)?;
        if Some(i) == summary && !blocks.is_empty() {
            blocks.push(Block::CachePoint(DEFAULT_CACHE_POINT));
        }
        Some((role, blocks))
    });
    let mut turns = merge_turns(turns);
    if cache
        && let Some(last) = turns.last_mut()
        && !matches!(last.content.last(), Some(Block::CachePoint(_)))
    {
        last.content.push(Block::CachePoint(DEFAULT_CACHE_POINT));
    }
    turns
}

/// The role and content blocks of one message (`None` for a system message).
fn blocks_of(m: &Message) -> Option<(&'static str, Vec<Block<'_>>)> {
    match m.role {
        Role::System => None,
        Role::User => {
            let mut blocks = Vec::with_capacity(1 + m.images.len());
            if !m.content.is_empty() {
                blocks.push(Block::Text(&m.content));
            }
            blocks.extend(m.images.iter().map(|i| Block::Image {
                format: image_format(&i.media_type),
                source: ImageBytes { bytes: &i.data },
            }));
            Some(("user", blocks))
        }
        Role::Assistant => {
            let mut blocks = Vec::with_capacity(1 + m.tool_calls.len());
            if !m.content.is_empty() {
                blocks.push(Block::Text(&m.content));
            }
            blocks.extend(m.tool_calls.iter().map(|c| Block::ToolUse {
                tool_use_id: &c.id,
                name: &c.name,
                input: Arguments::new(&c.arguments),
            }));
            Some(("assistant", blocks))
        }
        Role::Tool => Some((
            "user",
            vec![Block::ToolResult {
                tool_use_id: m.tool_call_id.as_deref().unwrap_or_default(),
                content: [Text { text: &m.content }],
            }],
        )),
    }
}

#[async_trait]
impl Provider for Bedrock {
    fn name(&self) -> &str {
        "bedrock"
    }

    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        self.send_streaming(request, &super::no_deltas).await
    }

    async fn send_streaming(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let path = self.path(&request.model, request.stream);
        let mut url = self.base.clone();
        url.set_path(&path);
        let credentials = match &self.auth {
            BedrockAuth::SigV4(c) => Some(c.get().await.map_err(|e| {
                ProviderError::transport(
                    "bedrock",
                    format!(
                        "no AWS credentials: {}",
                        aws_sdk_s3::error::DisplayErrorContext(&e)
                    ),
                    0,
                )
            })?),
            BedrockAuth::ApiKey(_) => None,
        };
        let headers = |payload: &[u8]| -> Result<HeaderMap, String> {
            let mut h = HeaderMap::new();
            match (&self.auth, &credentials) {
                (BedrockAuth::ApiKey(k), _) => {
                    secret_header(&mut h, AUTHORIZATION, &format!("Bearer {}", k.expose()))?;
                }
                (BedrockAuth::SigV4(_), Some(c)) => {
                    let signed = sigv4_headers(
                        "POST",
                        url.as_str(),
                        &[("content-type", "application/json")],
                        payload,
                        &self.region,
                        "bedrock",
                        c,
                        SystemTime::now(),
                    )?;
                    for (k, v, sensitive) in signed {
                        let name =
                            HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
                        let mut value = HeaderValue::from_str(&v).map_err(
                            |_| "credentials contain characters not allowed in a header",
                        )?;
                        value.set_sensitive(sensitive);
                        h.insert(name, value);
                    }
                }
                (BedrockAuth::SigV4(_), None) => return Err("no AWS credentials".into()),
            }
            Ok(h)
        };
        self.http
            .exchange::<ConverseStream>(
                url.as_str(),
                &headers,
                request,
                &Self::body(request),
                on_delta,
            )
            .await
    }

    /// The SigV4 signature (or the API key) is redacted: signing needs the credentials and
    /// the moment of the send.
    fn render(&self, request: &ChatRequest) -> Result<super::Rendered, Box<ProviderError>> {
        let mut url = self.base.clone();
        url.set_path(&self.path(&request.model, request.stream));
        let body = super::http::encode(self.name(), &Self::body(request))?;
        let auth = match self.auth {
            BedrockAuth::SigV4(_) => format!("AWS4-HMAC-SHA256 {}", super::REDACTED),
            BedrockAuth::ApiKey(_) => format!("Bearer {}", super::REDACTED),
        };
        Ok(super::Rendered::post(
            url.as_str(),
            &[("authorization", &auth)],
            body,
        ))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireReply {
    output: Option<Value>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_write_input_tokens: u64,
}

fn stop_reason(s: &str) -> StopReason {
    match s {
        "end_turn" | "stop_sequence" => StopReason::End,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" => StopReason::MaxTokens,
        _ => StopReason::Other,
    }
}

/// Converse's `inputTokens` leaves the cache reads and writes out; the normalised [`Usage`]
/// counts them in.
fn usage(u: WireUsage) -> Usage {
    Usage {
        input_tokens: u.input_tokens + u.cache_read_input_tokens + u.cache_write_input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_input_tokens,
        cache_write_tokens: u.cache_write_input_tokens,
    }
}

fn decode_reply(bytes: &[u8]) -> Result<Reply, DecodeError> {
    let r: WireReply = parse_json("converse response", bytes)?;
    let content = r
        .output
        .as_ref()
        .and_then(|o| o.pointer("/message/content"))
        .and_then(Value::as_array)
        .ok_or(DecodeError::Missing("output.message.content"))?;
    let mut reply = Reply {
        stop: r.stop_reason.as_deref().map(stop_reason),
        ..Reply::default()
    };
    for block in content {
        if let Some(t) = block.get("text").and_then(Value::as_str) {
            reply.text.push_str(t);
        } else if let Some(t) = block
            .pointer("/reasoningContent/reasoningText/text")
            .and_then(Value::as_str)
        {
            reply.reasoning.push_str(t);
        } else if let Some(u) = block.get("toolUse") {
            let field = |k: &'static str| {
                u.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or(DecodeError::Missing(k))
            };
            reply.calls.push(ToolCall {
                id: field("toolUseId")?,
                name: field("name")?,
                arguments: u.get("input").map_or("{}".into(), Value::to_string),
            });
        }
    }
    if let Some(u) = r.usage {
        reply.usage = usage(u);
    }
    Ok(reply)
}

/// Decodes a Converse body.
pub fn decode_response(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    decode_reply(bytes).map(|r| r.into_response(0))
}

/// Decodes a complete ConverseStream body (AWS event-stream frames).
pub fn decode_stream(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    super::http::decode_sse_bytes(bytes, ConverseStream::default()).map(|r| r.into_response(0))
}

/// Assembles ConverseStream events: messageStart, contentBlockStart/Delta/Stop, messageStop
/// (stop reason), metadata (usage). Exceptions mid-stream are provider errors.
#[derive(Default)]
struct ConverseStream {
    reply: Reply,
    /// Tool calls by content block index: (index, id, name, input JSON text).
    tools: Vec<(u64, String, String, String)>,
    stopped: bool,
}

impl StreamState for ConverseStream {
    const EVENT_STREAM: bool = true;

    fn on_event(&mut self, ev: &SseEvent) -> Result<bool, DecodeError> {
        let kind = ev.event.as_deref().unwrap_or_default();
        if kind.starts_with("exception:") {
            return Err(DecodeError::Provider(format!("{kind}: {}", ev.data)));
        }
        let v: Value = parse_json("stream event", ev.data.as_bytes())?;
        let index = v
            .get("contentBlockIndex")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        match kind {
            "contentBlockStart" => {
                if let Some(t) = v.pointer("/start/toolUse") {
                    let field = |k| t.get(k).and_then(Value::as_str).unwrap_or_default();
                    self.tools.push((
                        index,
                        field("toolUseId").to_string(),
                        field("name").to_string(),
                        String::new(),
                    ));
                }
            }
            "contentBlockDelta" => {
                let d = v.get("delta").cloned().unwrap_or(Value::Null);
                if let Some(t) = d.get("text").and_then(Value::as_str) {
                    self.reply.text.push_str(t);
                } else if let Some(t) = d.pointer("/reasoningContent/text").and_then(Value::as_str)
                {
                    self.reply.reasoning.push_str(t);
                } else if let Some(t) = d.pointer("/toolUse/input").and_then(Value::as_str) {
                    match self.tools.iter_mut().find(|(i, ..)| *i == index) {
                        Some((.., input)) => input.push_str(t),
                        None => {
                            return Err(DecodeError::Stream(format!(
                                "toolUse delta for block {index}, which is not a tool use"
                            )));
                        }
                    }
                }
            }
            "messageStop" => {
                let stop = v
                    .get("stopReason")
                    .and_then(Value::as_str)
                    .ok_or(DecodeError::Missing("stopReason"))?;
                self.reply.stop = Some(stop_reason(stop));
                self.stopped = true;
            }
            "metadata" => {
                if let Some(u) = v.get("usage") {
                    let u: WireUsage = serde_json::from_value(u.clone())
                        .map_err(|e| DecodeError::json("metadata.usage", e))?;
                    self.reply.usage = usage(u);
                }
                // Metadata is the last event of a complete stream.
                return Ok(self.stopped);
            }
            _ => {}
        }
        Ok(false)
    }

    fn finish(mut self, _saw_terminal: bool) -> Result<Reply, DecodeError> {
        if !self.stopped {
            return Err(DecodeError::Incomplete("messageStop"));
        }
        for (_, id, name, input) in self.tools {
            let arguments = if input.trim().is_empty() {
                "{}".to_string()
            } else {
                input
            };
            self.reply.calls.push(ToolCall {
                id,
                name,
                arguments,
            });
        }
        Ok(self.reply)
    }

    fn progress(&self) -> (&str, &str) {
        (&self.reply.text, &self.reply.reasoning)
    }

    fn whole(bytes: &[u8]) -> Result<Reply, DecodeError> {
        decode_reply(bytes)
    }
}

/// SigV4 headers (`x-amz-date`, `x-amz-security-token` with a session token,
/// `authorization`) for a request to `url` (as sent: path already percent-encoded, which the
/// signature encodes once more), with whether each is sensitive.
#[allow(clippy::too_many_arguments)]
pub fn sigv4_headers(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    payload: &[u8],
    region: &str,
    service: &str,
    credentials: &aws_credential_types::Credentials,
    time: SystemTime,
) -> Result<Vec<(String, String, bool)>, String> {
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("cannot sign: {e}"))?
        .into();
    let request = SignableRequest::new(
        method,
        url,
        headers.iter().copied(),
        SignableBody::Bytes(payload),
    )
    .map_err(|e| format!("cannot sign: {e}"))?;
    // The signer traces the canonical request, session token included: no subscriber sees it.
    let signed =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            sign(request, &params)
        });
    let (instructions, _) = signed
        .map_err(|e| format!("cannot sign: {e}"))?
        .into_parts();
    Ok(instructions
        .into_parts()
        .0
        .into_iter()
        .map(|h| {
            let sensitive = h.sensitive() || h.name() != "x-amz-date";
            (h.name().to_string(), h.value().to_string(), sensitive)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::wire::fixture;
    use super::*;

    #[test]
    fn claude_and_nova_get_cache_points_after_tools_system_summary_and_conversation() {
        let mut request = fixture::request(false);
        request.model = "us.anthropic.claude-sonnet-4-5-20250929-v1:0".into();
        let mut summary = Message::user("summary of what came before");
        summary.meta.is_summary = true;
        request.messages.insert(2, summary);
        let body = serde_json::to_value(Bedrock::body(&request)).unwrap();
        let point = serde_json::json!({"cachePoint": {"type": "default"}});
        let tools = body["toolConfig"]["tools"].as_array().unwrap();
        assert_eq!(tools.last(), Some(&point));
        assert_eq!(tools.len(), 2);
        let system = body["system"].as_array().unwrap();
        assert_eq!(system.len(), 3, "two prompts and the point");
        assert_eq!(system.last(), Some(&point));
        let messages = body["messages"].as_array().unwrap();
        let first = messages[0]["content"].as_array().unwrap();
        assert_eq!(
            first[0],
            serde_json::json!({"text": "summary of what came before"})
        );
        assert_eq!(first[1], point, "after the summary");
        let last = messages.last().unwrap()["content"].as_array().unwrap();
        assert_eq!(last.last(), Some(&point));
        let points = body.to_string().matches("cachePoint").count();
        assert_eq!(points, 4, "at most four");
        // Other models refuse the blocks: none is sent.
        request.model = "meta.llama3-1-70b-instruct-v1:0".into();
        let body = serde_json::to_string(&Bedrock::body(&request)).unwrap();
        assert!(!body.contains("cachePoint"), "{body}");
    }

    #[test]
    fn body_matches_the_pinned_wire_json() {
        let body = serde_json::to_vec(&Bedrock::body(&fixture::request(false))).unwrap();
        fixture::assert_body(&body, include_str!("testdata/bedrock.json"));
        let streamed = serde_json::to_vec(&Bedrock::body(&fixture::request(true))).unwrap();
        assert_eq!(
            streamed, body,
            "streaming is chosen by the path, not the body"
        );
    }

    fn example_keys(token: Option<&str>) -> aws_credential_types::Credentials {
        aws_credential_types::Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            token.map(str::to_string),
            None,
            "test",
        )
    }

    fn authorization(headers: &[(String, String, bool)]) -> &str {
        &headers
            .iter()
            .find(|(k, ..)| k == "authorization")
            .expect("authorization")
            .1
    }

    /// The worked example of AWS's Signature Version 4 documentation (IAM ListUsers).
    #[test]
    fn signing_matches_the_documented_example() {
        let out = sigv4_headers(
            "GET",
            "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08",
            &[(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            )],
            b"",
            "us-east-1",
            "iam",
            &example_keys(None),
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_440_938_160),
        )
        .unwrap();
        assert_eq!(
            authorization(&out),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
        assert!(
            out.iter()
                .any(|(k, v, s)| k == "x-amz-date" && v == "20150830T123600Z" && !s)
        );
    }

    /// A Bedrock Converse request signed by botocore (the AWS SDK for Python): the model id's
    /// `:` travels as `%3A` and is signed as `%253A`; the session token is signed.
    #[test]
    fn signing_matches_botocore_for_a_bedrock_request() {
        let body = br#"{"messages":[{"role":"user","content":[{"text":"hi"}]}],"inferenceConfig":{"maxTokens":64}}"#;
        let out = sigv4_headers(
            "POST",
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse",
            &[("content-type", "application/json")],
            body,
            "us-east-1",
            "bedrock",
            &example_keys(Some("session-token-xyz")),
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_031_248),
        )
        .unwrap();
        assert_eq!(
            authorization(&out),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/us-east-1/bedrock/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, \
             Signature=deb1800b25e2cdfa7c7fc42a12f3f2ff0fdb37665d2211ec677a55aa7a81d192"
        );
        assert!(
            out.iter()
                .any(|(k, v, s)| k == "x-amz-security-token" && v == "session-token-xyz" && *s)
        );
    }

    #[test]
    fn model_ids_with_colons_are_encoded_in_the_path() {
        let b = Bedrock::new(
            "https://bedrock-runtime.us-east-1.amazonaws.com",
            "us-east-1",
            BedrockAuth::ApiKey(Secret::new("k")),
            ClientOptions::default(),
        )
        .unwrap();
        assert_eq!(
            b.path("us.anthropic.claude-sonnet-4-5-20250929-v1:0", false),
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse"
        );
        assert!(!format!("{b:?}").contains("\"k\""));
    }

    #[test]
    fn converse_reply_decodes_tool_use_and_usage() {
        let r = decode_response(br#"{"output":{"message":{"role":"assistant","content":[{"text":"ok"},{"toolUse":{"toolUseId":"t1","name":"read","input":{"a":1}}}]}},"stopReason":"tool_use","usage":{"inputTokens":3,"outputTokens":4,"totalTokens":7}}"#).unwrap();
        assert_eq!(r.stop, StopReason::ToolUse);
        assert_eq!(r.tool_calls()[0].arguments, "{\"a\":1}");
        assert_eq!(r.usage.output_tokens, 4);
        assert_eq!(
            decode_response(br#"{"output":{}}"#).unwrap_err().label(),
            "missing_field"
        );
    }
}
