//! The history model: what a session remembers and sends.
//!
//! One [`Message`] per line of a history file (JSON Lines):
//! `{"role":"tool","content":"...","tool_call_id":"c1"}`,
//! `{"role":"assistant","content":"","tool_calls":[{"id":"c1","name":"read_file","arguments":"{...}"}]}`.
//! Fields that are empty are omitted, so a plain chat line stays `{"role":"user","content":"hi"}`.

use serde::{Deserialize, Serialize};

/// Who said it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// A native tool call issued by the assistant. `arguments` is the JSON text exactly as the
/// model produced it (it is forwarded byte for byte and may be invalid JSON).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

/// An image attached to a message, base64-encoded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// e.g. `image/png`.
    pub media_type: String,
    /// Base64 of the image bytes.
    pub data: String,
}

/// Bookkeeping that travels with a message but is never sent to the provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageMeta {
    /// Never compacted or truncated (e.g. a `recall` result), within the verbatim budget.
    #[serde(default, skip_serializing_if = "is_false")]
    pub preserve_verbatim: bool,
    /// Written by the compaction engine (a level-2 summary or a level-3 notice).
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_summary: bool,
    /// Archive keys of originals this message stands in for (16 lowercase hex each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub archived: Vec<String>,
    /// The artifact ledger of a compaction's stand-in: the files, commands and errors of the
    /// messages it replaced, oldest first (see [`crate::compact::ledger`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ledger: Vec<Artifact>,
    /// Older ledger entries folded away: counted here, their messages in the archive.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ledger_folded: u64,
}

/// Kind of thing a session touched (see [`crate::artifacts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    Files,
    Commands,
    Errors,
    Requests,
}

impl Category {
    /// Every category, in order.
    pub const ALL: [Category; 4] = [
        Category::Files,
        Category::Commands,
        Category::Errors,
        Category::Requests,
    ];

    /// Short stable label for reports and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Files => "files",
            Self::Commands => "commands",
            Self::Errors => "errors",
            Self::Requests => "requests",
        }
    }
}

/// One thing a session touched: a file path, a command, an error line, a request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Artifact {
    pub category: Category,
    pub text: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One message of the conversation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    #[serde(default)]
    pub content: String,
    /// Reasoning/thinking text of an assistant message, where the provider returns it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Name of the tool that produced a tool message, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
    /// An opaque item of the provider's own (the OpenAI Responses compaction item of
    /// `engine: provider`), sent back verbatim in this message's place by that provider's
    /// encoder; every other encoder sends `content`, which says what the item replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_item: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "is_default_meta")]
    pub meta: MessageMeta,
}

fn is_default_meta(m: &MessageMeta) -> bool {
    *m == MessageMeta::default()
}

impl Message {
    /// The texts this message sends: its content, its reasoning, its tool calls' arguments.
    pub fn sent_texts(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.content.as_str())
            .chain(self.reasoning.as_deref())
            .chain(self.tool_calls.iter().map(|c| c.arguments.as_str()))
    }

    fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            images: Vec::new(),
            provider_item: None,
            meta: MessageMeta::default(),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// An assistant message that issues tool calls.
    pub fn assistant_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls: calls,
            ..Self::new(Role::Assistant, content)
        }
    }

    /// The result of tool call `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::new(Role::Tool, content)
        }
    }

    /// Bytes this message adds to a request: content, reasoning, tool-call names and
    /// arguments, ids, image payloads. Honest about what is really sent, so budgets built
    /// on it hold for the serialized request (minus a small per-message framing overhead).
    pub fn weight(&self) -> usize {
        self.content.len()
            + self.reasoning.as_ref().map_or(0, String::len)
            + self
                .tool_calls
                .iter()
                .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                .sum::<usize>()
            + self.tool_call_id.as_ref().map_or(0, String::len)
            + self
                .images
                .iter()
                .map(|i| i.data.len() + i.media_type.len())
                .sum::<usize>()
            + self
                .provider_item
                .as_ref()
                .map_or(0, |v| v.to_string().len())
    }

    pub fn is_system(&self) -> bool {
        self.role == Role::System
    }
}

/// Total weight of a history.
pub fn weight(messages: &[Message]) -> usize {
    messages.iter().map(Message::weight).sum()
}

/// Errors reading a history file.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("history line {line}: {source}")]
    Parse {
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// Parses JSON Lines; blank lines are skipped; the first bad line is reported by number.
pub fn parse_jsonl(text: &str) -> Result<Vec<Message>, HistoryError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| HistoryError::Parse {
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// Writes JSON Lines, one message per line, newline-terminated.
pub fn to_jsonl(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        // Serializing these plain structs cannot fail (string keys, no maps with non-string keys).
        if let Ok(line) = serde_json::to_string(m) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_round_trip_and_documented_shapes() {
        let text = concat!(
            r#"{"role":"system","content":"be brief"}"#,
            "\n",
            r#"{"role":"user","content":"read it"}"#,
            "\n",
            r#"{"role":"assistant","content":"","tool_calls":[{"id":"c1","name":"read_file","arguments":"{\"path\":\"a.rs\"}"}]}"#,
            "\n",
            "\n",
            r#"{"role":"tool","content":"fn main() {}","tool_call_id":"c1"}"#,
            "\n",
        );
        let msgs = parse_jsonl(text).expect("parses");
        assert_eq!(msgs.len(), 4);
        assert_eq!(msgs[2].tool_calls[0].name, "read_file");
        assert_eq!(msgs[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(to_jsonl(&msgs), text.replace("\n\n", "\n"));
    }

    #[test]
    fn bad_line_is_reported_by_number() {
        let err = parse_jsonl("{\"role\":\"user\",\"content\":\"x\"}\n{\"role\":\"robot\"}\n")
            .unwrap_err();
        assert!(err.to_string().starts_with("history line 2:"), "{err}");
    }

    #[test]
    fn weight_counts_everything_sent() {
        let mut m = Message::assistant_calls(
            "abc",
            vec![ToolCall {
                id: "i".into(),
                name: "nm".into(),
                arguments: "{}".into(),
            }],
        );
        m.images.push(Image {
            media_type: "image/png".into(),
            data: "AAAA".into(),
        });
        assert_eq!(m.weight(), 3 + 1 + 2 + 2 + 9 + 4);
    }
}
