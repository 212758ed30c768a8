//! AWS Bedrock Converse (`POST /model/{modelId}/converse`), signed with SigV4 or a Bedrock
//! API key.
//!
//! Streaming uses non-streaming Converse: `converse-stream` answers in the binary AWS
//! event-stream encoding, and a streamed reply here is assembled in full before it is
//! returned anyway, so a `stream: true` request is sent to `converse` and carries the same
//! reply, usage and stop reason.

use std::time::SystemTime;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{Value, json};

use super::anthropic::arguments_object;
use super::config::{BuildError, ClientOptions, Secret};
use super::http::{DecodeError, HeaderFn, HttpClient, Reply, parse_json};
use super::sigv4::{PATH_SEGMENT, SigningInput, sign};
use super::{ChatRequest, ChatResponse, Provider, ProviderError, StopReason, Usage};
use crate::history::{Message, Role, ToolCall};

/// AWS access keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

/// How Bedrock requests authenticate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BedrockAuth {
    SigV4(AwsCredentials),
    /// A Bedrock API key, sent as a bearer token.
    ApiKey(Secret),
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
    fn path(&self, model: &str) -> String {
        format!(
            "{}/model/{}/converse",
            self.base.path().trim_end_matches('/'),
            percent_encoding::utf8_percent_encode(model, PATH_SEGMENT)
        )
    }

    fn host(&self) -> String {
        let host = self.base.host_str().unwrap_or_default();
        match self.base.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        }
    }

    /// The exact JSON body sent for `request`.
    pub fn body(request: &ChatRequest) -> Value {
        let system: Vec<Value> = request
            .messages
            .iter()
            .filter(|m| m.is_system())
            .map(|m| json!({"text": m.content}))
            .collect();
        let mut body = json!({
            "messages": wire_messages(&request.messages),
            "inferenceConfig": {"maxTokens": request.max_output_tokens},
        });
        if !system.is_empty() {
            body["system"] = json!(system);
        }
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|t| {
                    json!({"toolSpec": {"name": t.name, "description": t.description,
                           "inputSchema": {"json": t.parameters}}})
                })
                .collect();
            body["toolConfig"] = json!({"tools": tools});
        }
        body
    }
}

fn image_format(media_type: &str) -> &str {
    media_type.strip_prefix("image/").unwrap_or(media_type)
}

fn wire_messages(messages: &[Message]) -> Vec<Value> {
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in messages {
        let (role, blocks) = match m.role {
            Role::System => continue,
            Role::User => {
                let mut blocks = Vec::new();
                if !m.content.is_empty() {
                    blocks.push(json!({"text": m.content}));
                }
                blocks.extend(m.images.iter().map(|i| {
                    json!({"image": {"format": image_format(&i.media_type),
                                     "source": {"bytes": i.data}}})
                }));
                ("user", blocks)
            }
            Role::Assistant => {
                let mut blocks = Vec::new();
                if !m.content.is_empty() {
                    blocks.push(json!({"text": m.content}));
                }
                blocks.extend(m.tool_calls.iter().map(|c| {
                    json!({"toolUse": {"toolUseId": c.id, "name": c.name,
                                       "input": arguments_object(&c.arguments)}})
                }));
                ("assistant", blocks)
            }
            Role::Tool => (
                "user",
                vec![json!({"toolResult": {
                    "toolUseId": m.tool_call_id.as_deref().unwrap_or_default(),
                    "content": [{"text": m.content}]}})],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((r, b)) if *r == role => b.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }
    out.into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

#[async_trait]
impl Provider for Bedrock {
    fn name(&self) -> &str {
        "bedrock"
    }

    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let body = serde_json::to_vec(&Self::body(request))
            .map_err(|e| ProviderError::transport("bedrock", e.to_string(), 0))?;
        let path = self.path(&request.model);
        let mut url = self.base.clone();
        url.set_path(&path);
        let host = self.host();
        let headers = |payload: &[u8]| -> Result<HeaderMap, String> {
            let mut h = HeaderMap::new();
            let pairs = match &self.auth {
                BedrockAuth::ApiKey(k) => {
                    vec![(
                        "authorization".to_string(),
                        format!("Bearer {}", k.expose()),
                    )]
                }
                BedrockAuth::SigV4(c) => sign(&SigningInput {
                    method: "POST",
                    host: &host,
                    path: &path,
                    query: "",
                    headers: &[("content-type", "application/json")],
                    payload,
                    region: &self.region,
                    service: "bedrock",
                    time: SystemTime::now(),
                    access_key_id: &c.access_key_id,
                    secret_access_key: c.secret_access_key.expose(),
                    session_token: c.session_token.as_ref().map(Secret::expose),
                    double_encode_path: true,
                }),
            };
            for (k, v) in pairs {
                let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
                let mut value = HeaderValue::from_str(&v)
                    .map_err(|_| "credentials contain characters not allowed in a header")?;
                value.set_sensitive(k != "x-amz-date");
                h.insert(name, value);
            }
            Ok(h)
        };
        let headers: HeaderFn<'_> = &headers;
        self.http
            .post_json(url.as_str(), headers, body, decode_reply)
            .await
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
}

fn stop_reason(s: &str) -> StopReason {
    match s {
        "end_turn" | "stop_sequence" => StopReason::End,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" => StopReason::MaxTokens,
        _ => StopReason::Other,
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
        reply.usage = Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cache_read_tokens: u.cache_read_input_tokens,
        };
    }
    Ok(reply)
}

/// Decodes a Converse body.
pub fn decode_response(bytes: &[u8]) -> Result<ChatResponse, DecodeError> {
    decode_reply(bytes).map(|r| r.into_response(0))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            b.path("us.anthropic.claude-sonnet-4-5-20250929-v1:0"),
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
