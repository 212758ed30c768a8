//! Request bodies of both APIs as [`Incoming`] items, function tools and tool choices
//! (docs/agent.md "HTTP API"). Every field is either understood or refused with a 400 that
//! names it: nothing a caller relies on is dropped silently.

use axum::http::StatusCode;
use serde_json::{Map, Value};

use crate::history::Image;
use crate::provider::{Effort, OutputFormat, ToolChoice, ToolSpec};
use crate::replay::{Api, Incoming, Item, ItemRole};

use super::ApiError;

pub fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

/// A field that is absent or `null`.
pub fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// Refuses every field of `obj` not in `known`.
pub fn refuse_unknown(
    obj: &Map<String, Value>,
    known: &[&str],
    what: &str,
) -> Result<(), ApiError> {
    for (k, v) in obj {
        if !v.is_null() && !known.contains(&k.as_str()) {
            return Err(bad(
                "unsupported_field",
                format!("{what}: the field {k:?} is not supported by this session"),
            ));
        }
    }
    Ok(())
}

pub fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad("invalid_field", format!("{key} must be a boolean"))),
    }
}

pub fn opt_f64(
    obj: &Map<String, Value>,
    key: &str,
    range: std::ops::RangeInclusive<f64>,
) -> Result<Option<f64>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if range.contains(&x) => Ok(Some(x)),
            _ => Err(bad(
                "invalid_field",
                format!(
                    "{key} must be a number from {} to {}",
                    range.start(),
                    range.end()
                ),
            )),
        },
    }
}

pub fn opt_tokens(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(bad(
                "invalid_field",
                format!("{key} must be a positive integer"),
            )),
        },
    }
}

pub fn opt_str<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad("invalid_field", format!("{key} must be a string"))),
    }
}

/// `metadata`: at most 16 string values, as OpenAI defines it.
pub fn metadata(obj: &Map<String, Value>) -> Result<Value, ApiError> {
    match field(obj, "metadata") {
        None => Ok(Value::Object(Map::new())),
        Some(Value::Object(m)) if m.len() <= 16 && m.values().all(Value::is_string) => {
            Ok(Value::Object(m.clone()))
        }
        Some(_) => Err(bad(
            "invalid_field",
            "metadata must be an object of at most 16 string values",
        )),
    }
}

/// An image given as a `data:` URL (the only form a session can send on without fetching).
fn data_url_image(url: &str, at: &str) -> Result<Image, ApiError> {
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(bad(
            "unsupported_image",
            format!(
                "{at}: images must be data URLs (data:image/png;base64,...); the session fetches no URLs"
            ),
        ));
    };
    let Some((head, data)) = rest.split_once(',') else {
        return Err(bad("invalid_image", format!("{at}: malformed data URL")));
    };
    let Some(media_type) = head.strip_suffix(";base64") else {
        return Err(bad(
            "invalid_image",
            format!("{at}: the data URL must be base64"),
        ));
    };
    if !matches!(
        media_type,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    ) {
        return Err(bad(
            "unsupported_image",
            format!("{at}: image type {media_type:?} is not supported (png, jpeg, gif, webp)"),
        ));
    }
    Ok(Image {
        media_type: media_type.to_owned(),
        data: data.to_owned(),
    })
}

fn role_of(role: Option<&str>, at: &str, chat: bool) -> Result<ItemRole, ApiError> {
    match role {
        Some("user") => Ok(ItemRole::User),
        Some("system" | "developer") => Ok(ItemRole::System),
        Some("assistant") => Ok(ItemRole::Assistant),
        Some(r) if chat => Err(bad(
            "unsupported_role",
            format!("{at}: role {r:?} is not supported"),
        )),
        Some(r) => Err(bad(
            "unsupported_role",
            format!("{at}: role {r:?} is not supported (user, system, developer, assistant)"),
        )),
        None => Err(bad("missing_role", format!("{at}: role is required"))),
    }
}

/// Text and images of a content field: a string or a list of parts.
fn content(
    v: Option<&Value>,
    at: &str,
    text_types: &[&str],
    image_type: Option<&str>,
) -> Result<(String, Vec<Image>), ApiError> {
    match v {
        None | Some(Value::Null) => Ok((String::new(), Vec::new())),
        Some(Value::String(s)) => Ok((s.clone(), Vec::new())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            let mut images = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let ty = p.get("type").and_then(Value::as_str).unwrap_or("none");
                let here = format!("{at}.content[{j}]");
                if text_types.contains(&ty) {
                    let Some(t) = p.get("text").and_then(Value::as_str) else {
                        return Err(bad("invalid_content", format!("{here}: text is required")));
                    };
                    text.push_str(t);
                } else if Some(ty) == image_type {
                    let url = match p.get("image_url") {
                        Some(Value::String(u)) => Some(u.as_str()),
                        Some(Value::Object(o)) => o.get("url").and_then(Value::as_str),
                        _ => None,
                    };
                    let Some(url) = url else {
                        return Err(bad(
                            "unsupported_image",
                            format!(
                                "{here}: an image needs image_url (a data URL); file ids are not supported"
                            ),
                        ));
                    };
                    images.push(data_url_image(url, &here)?);
                } else {
                    return Err(bad(
                        "unsupported_content",
                        format!("{here}: part type {ty:?} is not supported"),
                    ));
                }
            }
            Ok((text, images))
        }
        Some(_) => Err(bad(
            "invalid_content",
            format!("{at}: content must be a string or a list of parts"),
        )),
    }
}

/// The `content` of a message that must have one: absent or null is a 400 that names it.
fn required<'a>(v: Option<&'a Value>, at: &str) -> Result<&'a Value, ApiError> {
    match v {
        None | Some(Value::Null) => {
            Err(bad("missing_content", format!("{at}.content is required")))
        }
        Some(v) => Ok(v),
    }
}

fn req_str<'a>(item: &'a Value, key: &str, at: &str) -> Result<&'a str, ApiError> {
    item.get(key).and_then(Value::as_str).ok_or_else(|| {
        bad(
            "invalid_item",
            format!("{at}: {key} (a string) is required"),
        )
    })
}

fn id_of(item: &Value) -> Option<String> {
    item.get("id").and_then(Value::as_str).map(str::to_owned)
}

/// `input` of a Responses request.
pub fn responses_input(obj: &Map<String, Value>) -> Result<Vec<Incoming>, ApiError> {
    match field(obj, "input") {
        // An empty string is an empty user message: the session's one check refuses it.
        Some(Value::String(s)) => Ok(vec![Incoming {
            item: Item::Message {
                role: ItemRole::User,
                text: s.clone(),
                images: Vec::new(),
            },
            id: None,
        }]),
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, item)| responses_item(i, item))
            .collect(),
        Some(Value::Array(_)) => Err(bad("empty_input", "input has no items")),
        None => Err(bad("missing_input", "`input` is required")),
        Some(_) => Err(bad(
            "invalid_input",
            "input must be a string or a list of items",
        )),
    }
}

fn responses_item(i: usize, item: &Value) -> Result<Incoming, ApiError> {
    let at = format!("input[{i}]");
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let parsed = match kind {
        "message" => {
            let role = role_of(item.get("role").and_then(Value::as_str), &at, false)?;
            let (text, images) = content(
                Some(required(item.get("content"), &at)?),
                &at,
                &["input_text", "output_text", "text"],
                Some("input_image"),
            )?;
            if role != ItemRole::User && !images.is_empty() {
                return Err(bad(
                    "unsupported_content",
                    format!("{at}: images are accepted in user messages only"),
                ));
            }
            Item::Message { role, text, images }
        }
        "function_call" => Item::FunctionCall {
            call_id: req_str(item, "call_id", &at)?.to_owned(),
            name: req_str(item, "name", &at)?.to_owned(),
            arguments: item
                .get("arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}")
                .to_owned(),
        },
        "function_call_output" => {
            let call_id = req_str(item, "call_id", &at)?.to_owned();
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Array(_)) => {
                    let (text, images) = content(
                        Some(v),
                        &format!("{at}.output"),
                        &["input_text", "output_text", "text"],
                        None,
                    )?;
                    debug_assert!(images.is_empty());
                    text
                }
                _ => {
                    return Err(bad(
                        "invalid_item",
                        format!("{at}: output must be a string or a list of input_text parts"),
                    ));
                }
            };
            Item::FunctionCallOutput { call_id, output }
        }
        other => {
            return Err(bad(
                "unsupported_item",
                format!(
                    "{at}: item type {other:?} is not supported (message, function_call, function_call_output)"
                ),
            ));
        }
    };
    Ok(Incoming {
        item: parsed,
        id: id_of(item),
    })
}

/// `messages` of a Chat Completions request.
pub fn chat_messages(obj: &Map<String, Value>) -> Result<Vec<Incoming>, ApiError> {
    let Some(Value::Array(messages)) = field(obj, "messages") else {
        return Err(bad("missing_messages", "`messages` (a list) is required"));
    };
    if messages.is_empty() {
        return Err(bad("empty_input", "messages is empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str);
        if role == Some("tool") {
            let (output, _) =
                content(Some(required(m.get("content"), &at)?), &at, &["text"], None)?;
            out.push(Incoming {
                item: Item::FunctionCallOutput {
                    call_id: req_str(m, "tool_call_id", &at)?.to_owned(),
                    output,
                },
                id: None,
            });
            continue;
        }
        let role = role_of(role, &at, true)?;
        // Only an assistant message that makes tool calls may come without content.
        let has_calls = m.get("tool_calls").is_some_and(|c| !c.is_null());
        if role != ItemRole::Assistant || !has_calls {
            required(m.get("content"), &at)?;
        }
        let (text, images) = content(m.get("content"), &at, &["text"], Some("image_url"))?;
        if role != ItemRole::User && !images.is_empty() {
            return Err(bad(
                "unsupported_content",
                format!("{at}: images are accepted in user messages only"),
            ));
        }
        let calls = match m.get("tool_calls") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(c)) if role == ItemRole::Assistant => c.as_slice(),
            Some(_) => {
                return Err(bad(
                    "invalid_message",
                    format!("{at}: tool_calls must be a list, on assistant messages only"),
                ));
            }
        };
        if !text.is_empty() || calls.is_empty() {
            out.push(Incoming {
                item: Item::Message { role, text, images },
                id: None,
            });
        }
        for (j, c) in calls.iter().enumerate() {
            let here = format!("{at}.tool_calls[{j}]");
            let f = c.get("function").unwrap_or(&Value::Null);
            out.push(Incoming {
                item: Item::FunctionCall {
                    call_id: req_str(c, "id", &here)?.to_owned(),
                    name: req_str(f, "name", &format!("{here}.function"))?.to_owned(),
                    arguments: f
                        .get("arguments")
                        .and_then(Value::as_str)
                        .unwrap_or("{}")
                        .to_owned(),
                },
                id: None,
            });
        }
    }
    Ok(out)
}

/// The client's function tools (`tools`).
pub fn function_tools(obj: &Map<String, Value>, api: Api) -> Result<Vec<ToolSpec>, ApiError> {
    let tools = match field(obj, "tools") {
        None => return Ok(Vec::new()),
        Some(Value::Array(t)) => t,
        Some(_) => return Err(bad("invalid_tools", "tools must be a list")),
    };
    let mut out: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("none");
        // MCP entries select among the session's declared servers (`mcp_selections`).
        if ty == "mcp" && matches!(api, Api::Responses) {
            continue;
        }
        if ty != "function" {
            return Err(bad(
                "unsupported_tool",
                format!(
                    "{at}: tool type {ty:?} is not supported (only function tools, which the client runs)"
                ),
            ));
        }
        let def = match api {
            Api::Responses => t,
            Api::Chat => t.get("function").unwrap_or(&Value::Null),
        };
        let name = req_str(def, "name", &at)?;
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(bad(
                "invalid_tool",
                format!("{at}: the name must be 1-64 letters, digits, '_' or '-'"),
            ));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(bad(
                "invalid_tool",
                format!("{at}: the tool {name:?} is defined twice"),
            ));
        }
        let parameters = match def.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(bad(
                    "invalid_tool",
                    format!("{at}: parameters must be a JSON Schema object"),
                ));
            }
        };
        out.push(ToolSpec {
            name: name.to_owned(),
            description: def
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            parameters,
        });
    }
    Ok(out)
}

/// The answer's format: `text.format` of the Responses API or `response_format` of Chat
/// Completions; `None` for plain text.
pub fn output_format(obj: &Map<String, Value>, api: Api) -> Result<Option<OutputFormat>, ApiError> {
    let (format, at) = match api {
        Api::Responses => match field(obj, "text") {
            None => return Ok(None),
            Some(Value::Object(text)) => {
                if let Some((k, _)) = text
                    .iter()
                    .find(|(k, v)| !v.is_null() && k.as_str() != "format")
                {
                    return Err(bad(
                        "unsupported_field",
                        format!("text.{k}: only text.format is supported"),
                    ));
                }
                (field(text, "format"), "text.format")
            }
            Some(_) => return Err(bad("invalid_field", "text must be an object")),
        },
        Api::Chat => (field(obj, "response_format"), "response_format"),
    };
    let Some(format) = format else {
        return Ok(None);
    };
    let ty = format.get("type").and_then(Value::as_str);
    let def = match (ty, api) {
        (Some("text"), _) => return Ok(None),
        (Some("json_object"), _) => return Ok(Some(OutputFormat::JsonObject)),
        (Some("json_schema"), Api::Responses) => format,
        (Some("json_schema"), Api::Chat) => format.get("json_schema").unwrap_or(&Value::Null),
        _ => {
            return Err(bad(
                "invalid_field",
                format!("{at}.type must be one of text, json_object, json_schema"),
            ));
        }
    };
    let name = req_str(def, "name", at)?;
    let schema = match def.get("schema") {
        Some(s @ Value::Object(_)) => s.clone(),
        _ => {
            return Err(bad(
                "invalid_field",
                format!("{at}: a json_schema format needs `schema`, a JSON Schema object"),
            ));
        }
    };
    let strict = match def.get("strict") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(bad(
                "invalid_field",
                format!("{at}.strict must be a boolean"),
            ));
        }
    };
    Ok(Some(OutputFormat::JsonSchema {
        name: name.to_owned(),
        description: def
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        schema,
        strict,
    }))
}

/// The reasoning effort: `reasoning.effort` of the Responses API or `reasoning_effort` of
/// Chat Completions.
pub fn effort(obj: &Map<String, Value>, api: Api) -> Result<Option<Effort>, ApiError> {
    let value = match api {
        Api::Responses => match field(obj, "reasoning") {
            None => return Ok(None),
            Some(Value::Object(r)) => {
                if let Some((k, _)) = r
                    .iter()
                    .find(|(k, v)| !v.is_null() && k.as_str() != "effort")
                {
                    return Err(bad(
                        "unsupported_field",
                        format!(
                            "reasoning.{k}: only reasoning.effort is supported (the session returns no reasoning summaries)"
                        ),
                    ));
                }
                field(r, "effort")
            }
            Some(_) => return Err(bad("invalid_field", "reasoning must be an object")),
        },
        Api::Chat => field(obj, "reasoning_effort"),
    };
    match value {
        None => Ok(None),
        Some(v) => v.as_str().and_then(Effort::parse).map(Some).ok_or_else(|| {
            bad(
                "invalid_field",
                format!(
                    "reasoning effort must be one of {}",
                    Effort::NAMES.join(", ")
                ),
            )
        }),
    }
}

/// The `{"type": "mcp", "server_label": ..., "server_url": ...}` entries of a Responses
/// request's `tools`: `None` when there are none (every declared server is offered).
pub fn mcp_selections(
    obj: &Map<String, Value>,
) -> Result<Option<Vec<crate::session::McpSelection>>, ApiError> {
    let Some(Value::Array(tools)) = field(obj, "tools") else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("mcp") {
            continue;
        }
        let at = format!("tools[{i}]");
        let label = req_str(t, "server_label", &at)?;
        let url = match t.get("server_url") {
            None | Some(Value::Null) => None,
            Some(Value::String(u)) => Some(u.clone()),
            Some(_) => {
                return Err(bad(
                    "invalid_tool",
                    format!("{at}: server_url must be a string"),
                ));
            }
        };
        for key in ["connector_id", "authorization", "headers"] {
            if t.get(key).is_some_and(|v| !v.is_null()) {
                return Err(bad(
                    "unsupported_tool",
                    format!(
                        "{at}: {key} is not supported: the session's spec.tools.mcpServers declares how each server is reached"
                    ),
                ));
            }
        }
        out.push(crate::session::McpSelection {
            label: label.to_owned(),
            url,
        });
    }
    Ok((!out.is_empty()).then_some(out))
}

/// `tool_choice`: `auto`, `none`, `required` (a call of any tool the turn offers) or a named
/// function among the client's tools.
pub fn tool_choice(
    obj: &Map<String, Value>,
    api: Api,
    tools: &[ToolSpec],
) -> Result<ToolChoice, ApiError> {
    let choice = match field(obj, "tool_choice") {
        None => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(
                    "invalid_tool_choice",
                    format!("tool_choice {other:?} is not one of auto, none, required"),
                ));
            }
        },
        Some(v @ Value::Object(_)) => {
            let name = match api {
                Api::Responses => v.get("name"),
                Api::Chat => v.get("function").and_then(|f| f.get("name")),
            };
            match (
                v.get("type").and_then(Value::as_str),
                name.and_then(Value::as_str),
            ) {
                (Some("function"), Some(n)) => ToolChoice::Function(n.to_owned()),
                _ => {
                    return Err(bad(
                        "invalid_tool_choice",
                        "tool_choice must be auto, none, required or a named function",
                    ));
                }
            }
        }
        Some(_) => {
            return Err(bad(
                "invalid_tool_choice",
                "tool_choice must be a string or an object",
            ));
        }
    };
    if let ToolChoice::Function(n) = &choice
        && !tools.iter().any(|t| &t.name == n)
    {
        return Err(bad(
            "invalid_tool_choice",
            format!("tool_choice names {n:?}, which is not one of the request's tools"),
        ));
    }
    // `required` needs no tools of the client's: the session offers its own (`recall`,
    // `compress`, the MCP servers' tools) with every request.
    Ok(choice)
}

/// Shrinks the images of new messages before they enter the session
/// (`crate::images`): each shrunk image's original is archived first, its key kept in the
/// message's `meta.archived`. Returns what was done, for the response's `cairn.images`.
pub async fn prepare_images(
    messages: &mut [crate::history::Message],
    store: &dyn crate::ccr::Store,
) -> Result<Vec<Value>, ApiError> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut report = Vec::new();
    for m in messages.iter_mut().filter(|m| !m.images.is_empty()) {
        for image in m.images.iter_mut() {
            let original = b64.decode(image.data.trim()).map_err(|e| {
                bad(
                    "invalid_image",
                    format!("an image's base64 data does not decode: {e}"),
                )
            })?;
            let claimed = image.media_type.clone();
            let bytes = original.clone();
            let prepared =
                tokio::task::spawn_blocking(move || crate::images::prepare(&bytes, &claimed))
                    .await
                    .map_err(|e| {
                        ApiError::new(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "image_failed",
                            format!("the image task failed: {e}"),
                        )
                    })?
                    .map_err(|e| bad("invalid_image", e.to_string()))?;
            let Some((ow, oh)) = prepared.original else {
                continue;
            };
            let key = store.archive(&original).await.map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "archive_unavailable",
                    format!("the original image could not be archived, so it was not shrunk: {e}"),
                )
            })?;
            report.push(serde_json::json!({
                "key": key.as_str(),
                "original": {"width": ow, "height": oh, "bytes": original.len(), "mediaType": image.media_type},
                "sent": {"width": prepared.width, "height": prepared.height, "bytes": prepared.bytes.len(), "mediaType": prepared.media_type},
            }));
            image.media_type = prepared.media_type.to_owned();
            image.data = b64.encode(&prepared.bytes);
            if !m.meta.archived.iter().any(|k| k == key.as_str()) {
                m.meta.archived.push(key.as_str().to_owned());
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn responses_items_of_every_kind() {
        let items = responses_input(&obj(json!({"input": [
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "x", "annotations": []}]},
            {"type": "function_call", "id": "fc_c1", "call_id": "c1", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "file"},
        ]})))
        .unwrap();
        assert_eq!(items.len(), 5);
        assert_eq!(items[2].id.as_deref(), Some("msg_1"));
        assert!(
            matches!(&items[4].item, Item::FunctionCallOutput { output, .. } if output == "file")
        );
        for bad in [
            json!({}),
            json!({"input": []}),
            json!({"input": [{"role": "tool", "content": "x"}]}),
            json!({"input": [{"type": "reasoning"}]}),
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]}),
            json!({"input": [{"type": "function_call_output"}]}),
        ] {
            assert!(responses_input(&obj(bad.clone())).is_err(), "{bad}");
        }
        for without_content in [
            json!({"input": [{"role": "user"}]}),
            json!({"input": [{"type": "message", "role": "user", "content": null}]}),
            json!({"input": [{"role": "developer"}, {"role": "user", "content": "q"}]}),
        ] {
            let err = responses_input(&obj(without_content.clone()))
                .expect_err("a message without content is refused");
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{without_content}");
            assert_eq!(err.code, "missing_content", "{without_content}");
            assert!(
                err.message.ends_with(".content is required"),
                "{}",
                err.message
            );
        }
    }

    #[test]
    fn chat_messages_split_into_items() {
        let items = chat_messages(&obj(json!({"messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
        ]})))
        .unwrap();
        let kinds: Vec<_> = items.iter().map(|i| i.item.kind()).collect();
        use crate::replay::Kind::*;
        assert_eq!(kinds, [System, User, Call, Output]);
        for without_content in [
            json!({"messages": [{"role": "user"}]}),
            json!({"messages": [{"role": "system", "content": null}]}),
            json!({"messages": [{"role": "assistant"}]}),
            json!({"messages": [{"role": "tool", "tool_call_id": "c1"}]}),
        ] {
            let err = chat_messages(&obj(without_content.clone()))
                .expect_err("a message without content is refused");
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{without_content}");
            assert_eq!(err.code, "missing_content", "{without_content}");
        }
    }

    #[test]
    fn tools_and_choices() {
        let o = obj(
            json!({"tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}], "tool_choice": {"type": "function", "name": "read"}}),
        );
        let tools = function_tools(&o, Api::Responses).unwrap();
        assert_eq!(tools[0].name, "read");
        assert_eq!(
            tool_choice(&o, Api::Responses, &tools).unwrap(),
            ToolChoice::Function("read".into())
        );
        let other = obj(json!({"tool_choice": {"type": "function", "name": "nope"}}));
        assert!(tool_choice(&other, Api::Responses, &tools).is_err());
        // The session's own tools are offered with every request: `required` needs none
        // of the client's.
        let required = obj(json!({"tool_choice": "required"}));
        assert_eq!(
            tool_choice(&required, Api::Chat, &[]).unwrap(),
            ToolChoice::Required
        );
        let web = obj(json!({"tools": [{"type": "web_search"}]}));
        assert!(function_tools(&web, Api::Responses).is_err());
    }
}
