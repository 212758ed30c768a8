//! Pieces of request bodies that several providers share. Bodies are typed structs that
//! borrow from the [`ChatRequest`](super::ChatRequest) and serialize straight to bytes: a
//! multi-megabyte history is never copied into an intermediate JSON tree.

use std::fmt;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::history::{Image, Message};

/// Tool-call arguments as the JSON object the APIs require. The model's text is forwarded
/// as it is when it is an object; anything else is wrapped as `{"arguments": text}` so the
/// call still round-trips, and blank text becomes `{}`.
pub(crate) enum Arguments<'a> {
    Object(&'a RawValue),
    Empty,
    Wrapped(&'a str),
}

impl<'a> Arguments<'a> {
    pub fn new(text: &'a str) -> Self {
        match serde_json::from_str::<&RawValue>(text) {
            Ok(raw) if raw.get().starts_with('{') && escapes_decode(raw.get()) => Self::Object(raw),
            _ if text.trim().is_empty() => Self::Empty,
            _ => Self::Wrapped(text),
        }
    }
}

/// A syntax check alone lets a lone UTF-16 surrogate (`"\ud800"`) through, which strict
/// parsers refuse; such text is wrapped instead. Only text with `\u` escapes pays for
/// decoding.
fn escapes_decode(json: &str) -> bool {
    !json.contains("\\u") || serde_json::from_str::<Value>(json).is_ok()
}

impl Serialize for Arguments<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Object(raw) => raw.serialize(s),
            Self::Empty => s.serialize_map(Some(0))?.end(),
            Self::Wrapped(text) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("arguments", text)?;
                map.end()
            }
        }
    }
}

/// Tool-call arguments where an API takes them as a string (Chat Completions, Responses):
/// a JSON object goes as the model wrote it (the bytes of a cached prefix do not change);
/// anything else, such as a call the output limit cut off, goes as the text of the object
/// [`Arguments`] makes of it. Servers that parse the string refuse the whole request over
/// one unparseable call: llama.cpp renders its chat template from the parsed arguments and
/// answers HTTP 500 "Failed to parse tool call arguments as JSON" to every resend.
pub(crate) fn arguments_text<S: Serializer>(text: &&str, s: S) -> Result<S::Ok, S::Error> {
    match Arguments::new(text) {
        Arguments::Object(_) => super::wire_cache::text(text, s),
        other => {
            let object = serde_json::to_string(&other).map_err(serde::ser::Error::custom)?;
            super::wire_cache::text(&object.as_str(), s)
        }
    }
}

/// An image as a `data:` URL, written into the output without building the string first.
pub(crate) struct DataUrl<'a>(pub &'a Image);

impl Serialize for DataUrl<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!(
            "data:{};base64,{}",
            self.0.media_type, self.0.data
        ))
    }
}

/// The system messages as one text, separated by blank lines, for APIs with a single
/// system field.
pub(crate) struct SystemText<'a>(Vec<&'a str>);

impl<'a> SystemText<'a> {
    /// `None` when the conversation has no system message (the field is then left out).
    pub fn of(messages: &'a [Message]) -> Option<Self> {
        let parts: Vec<&str> = system_prompts(messages).collect();
        (!parts.is_empty()).then_some(Self(parts))
    }
}

impl fmt::Display for SystemText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n\n")?;
            }
            f.write_str(part)?;
        }
        Ok(())
    }
}

impl Serialize for SystemText<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The contents of the system messages, in order.
pub(crate) fn system_prompts(messages: &[Message]) -> impl Iterator<Item = &str> {
    messages
        .iter()
        .filter(|m| m.is_system())
        .map(|m| m.content.as_str())
}

/// One turn of a conversation for the APIs that want user and assistant turns to alternate.
#[derive(Serialize, Debug, PartialEq)]
pub(crate) struct Turn<B> {
    pub role: &'static str,
    pub content: Vec<B>,
}

/// Merges consecutive turns of one role into one and drops turns with nothing in them.
pub(crate) fn merge_turns<B>(
    turns: impl IntoIterator<Item = (&'static str, Vec<B>)>,
) -> Vec<Turn<B>> {
    let mut out: Vec<Turn<B>> = Vec::new();
    for (role, blocks) in turns {
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => out.push(Turn {
                role,
                content: blocks,
            }),
        }
    }
    out
}

/// `skip_serializing_if` for flags that are only sent when set.
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
pub(crate) mod fixture {
    use serde_json::{Value, json};

    use super::super::{ChatRequest, ToolSpec};
    use crate::history::{Image, Message, ToolCall};

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// A request with everything a body builder handles: two system prompts, an image,
    /// reasoning, tool calls with object / non-JSON / blank arguments, consecutive tool
    /// results (one naming its tool), an assistant turn with calls and no text, an empty
    /// tool result and an empty user message, a tool catalog and an output limit.
    pub fn request(stream: bool) -> ChatRequest {
        let mut image = Message::user("what is this?");
        image.images.push(Image {
            media_type: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
        });
        let mut look = Message::assistant_calls(
            "Let me look.",
            vec![
                call("c1", "read_file", "{\"path\":\"a.rs\",\"offset\":3}"),
                call("c2", "grep", "not json"),
                call("c3", "list", ""),
            ],
        );
        look.reasoning = Some("the user wants a look".into());
        let mut named = Message::tool("c2", "no matches");
        named.name = Some("grep".into());
        let mut done = Message::assistant("done \"quoted\" ünïcode\n");
        done.reasoning = Some("all read".into());
        ChatRequest {
            model: "m-1".into(),
            messages: vec![
                Message::system("be brief"),
                Message::system("cite files"),
                image,
                look,
                Message::tool("c1", "fn main() {}"),
                named,
                Message::tool("c3", "a.rs\nb.rs"),
                Message::user("thanks"),
                done,
                Message::assistant_calls("", vec![call("c4", "read_file", "{}")]),
                Message::tool("c4", ""),
                Message::user(""),
            ],
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Reads a file".into(),
                parameters: json!({"type": "object",
                    "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            }],
            max_output_tokens: 1234,
            stream,
            controls: Default::default(),
            context: None,
        }
    }

    /// Checks a serialized body against the pinned JSON: the same document, and the same
    /// size on the wire (request sizes feed the learned payload cap).
    pub fn assert_body(bytes: &[u8], pinned: &str) {
        let got: Value = serde_json::from_slice(bytes).expect("the body is JSON");
        let want: Value = serde_json::from_str(pinned).expect("the pinned body is JSON");
        assert_eq!(got, want, "{}", String::from_utf8_lossy(bytes));
        assert_eq!(bytes.len(), want.to_string().len());
    }

    /// A body recorded from a provider's public reference
    /// (`agent/tests/data/provider-bodies/`, whose README names the page each follows).
    pub fn recorded(text: &str) -> Value {
        serde_json::from_str(text).expect("the recorded body is JSON")
    }

    /// `v` without the object fields named `key`, at any depth: what cairn adds beyond a
    /// reference's example, or what it leaves at the reference's default.
    pub fn without(mut v: Value, key: &str, value: Option<&Value>) -> Value {
        fn walk(v: &mut Value, key: &str, value: Option<&Value>) {
            match v {
                Value::Object(map) => {
                    if map
                        .get(key)
                        .is_some_and(|x| value.is_none_or(|want| x == want))
                    {
                        map.remove(key);
                    }
                    map.values_mut().for_each(|x| walk(x, key, value));
                }
                Value::Array(items) => items.iter_mut().for_each(|x| walk(x, key, value)),
                _ => {}
            }
        }
        walk(&mut v, key, value);
        v
    }

    /// A tool call as the recorded bodies name it.
    pub fn tool_call(id: &str, name: &str, arguments: &str) -> ToolCall {
        call(id, name, arguments)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn arguments_are_forwarded_wrapped_or_emptied() {
        let cases = [
            ("{\"b\":1, \"a\":[2]}", "{\"b\":1, \"a\":[2]}"),
            ("  {\"a\":1}\n", "{\"a\":1}"),
            ("[1,2]", "{\"arguments\":\"[1,2]\"}"),
            ("{\"a\":", "{\"arguments\":\"{\\\"a\\\":\"}"),
            ("\"s\"", "{\"arguments\":\"\\\"s\\\"\"}"),
            (" \n", "{}"),
            ("", "{}"),
            ("{\"a\":\"\\ud83d\\ude00\"}", "{\"a\":\"\\ud83d\\ude00\"}"),
            (
                "{\"a\":\"\\ud800\"}",
                "{\"arguments\":\"{\\\"a\\\":\\\"\\\\ud800\\\"}\"}",
            ),
        ];
        for (text, wire) in cases {
            let got = serde_json::to_string(&Arguments::new(text)).unwrap();
            assert_eq!(got, wire, "{text:?}");
            assert_eq!(
                serde_json::to_value(Arguments::new(text)).unwrap(),
                serde_json::from_str::<serde_json::Value>(wire).unwrap()
            );
        }
    }

    #[test]
    fn string_arguments_are_always_the_text_of_an_object() {
        #[derive(Serialize)]
        struct Call<'a> {
            #[serde(serialize_with = "arguments_text")]
            arguments: &'a str,
        }
        let cut = "{\"path\": \"logs/app.lo";
        let cases = [
            ("{\"b\":1, \"a\":[2]}", "{\"b\":1, \"a\":[2]}"),
            (cut, "{\"arguments\":\"{\\\"path\\\": \\\"logs/app.lo\"}"),
            ("", "{}"),
            ("[1]", "{\"arguments\":\"[1]\"}"),
        ];
        for (text, sent) in cases {
            let json = serde_json::to_value(Call { arguments: text }).unwrap();
            let string = json["arguments"].as_str().unwrap();
            assert_eq!(string, sent, "{text:?}");
            assert!(
                serde_json::from_str::<serde_json::Value>(string)
                    .unwrap()
                    .is_object(),
                "{text:?}"
            );
        }
        // A long object keeps its bytes through the escape cache.
        let long = format!("{{\"text\": \"{}\"}}", "x".repeat(2_000));
        let json = serde_json::to_value(Call { arguments: &long }).unwrap();
        assert_eq!(json["arguments"].as_str(), Some(long.as_str()));
    }

    #[test]
    fn data_url_and_system_text_escape_like_strings() {
        let image = Image {
            media_type: "image/\"x\"".into(),
            data: "AA==".into(),
        };
        assert_eq!(
            serde_json::to_value(DataUrl(&image)).unwrap(),
            json!("data:image/\"x\";base64,AA==")
        );
        let messages = [
            Message::system("a\"b"),
            Message::user("u"),
            Message::system("c\n"),
        ];
        assert_eq!(
            serde_json::to_string(&SystemText::of(&messages)).unwrap(),
            "\"a\\\"b\\n\\nc\\n\""
        );
        assert!(SystemText::of(&messages[1..2]).is_none());
    }

    #[test]
    fn turns_of_one_role_merge_and_empty_turns_vanish() {
        let turns = merge_turns([
            ("user", vec![1]),
            ("user", vec![]),
            ("assistant", vec![]),
            ("user", vec![2, 3]),
            ("assistant", vec![4]),
        ]);
        let turn = |role, content| Turn { role, content };
        assert_eq!(
            turns,
            vec![turn("user", vec![1, 2, 3]), turn("assistant", vec![4])]
        );
    }
}
