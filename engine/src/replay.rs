//! The conversation of a served session as its clients see it, and how a request's input is
//! matched against it (docs/agent.md "Replay").
//!
//! Both HTTP APIs map their input onto [`Item`]s: messages, function calls and function-call
//! outputs (a Chat Completions assistant message with `tool_calls` is a message item followed
//! by one function-call item per call; a `role: tool` message is a function-call output).
//! Every item the session accepts — the client's and the ones it answered with — is kept in
//! the [`Ledger`] as a fingerprint (and, for its own output items, the id it issued). The
//! ledger is journaled with the session state and never compacted, so a client that resends
//! the whole conversation is recognised after any compaction and any restart: [`reconcile`]
//! finds the held prefix and returns where the new items start, or refuses the input.
//!
//! Everything here is a pure function of plain data.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use crate::history::{Image, Message, ToolCall};

/// Response ids kept to tell a stale `previous_response_id` from an unknown one.
pub const KEPT_RESPONSE_IDS: usize = 32;

/// Who wrote a message item. `developer` is `system`: cairn treats them alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemRole {
    User,
    System,
    Assistant,
}

/// One item of the conversation.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Message {
        role: ItemRole,
        text: String,
        images: Vec<Image>,
    },
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
    },
    FunctionCallOutput {
        call_id: String,
        output: String,
    },
}

/// What kind of item a held fingerprint stands for (for error messages and the
/// dropped-assistant-text rule).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    #[serde(rename = "u")]
    User,
    #[serde(rename = "s")]
    System,
    #[serde(rename = "a")]
    Assistant,
    #[serde(rename = "c")]
    Call,
    #[serde(rename = "r")]
    Output,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Self::User => "a user message",
            Self::System => "a system/developer message",
            Self::Assistant => "an assistant message",
            Self::Call => "a function_call",
            Self::Output => "a function_call_output",
        }
    }
}

impl Item {
    pub fn kind(&self) -> Kind {
        match self {
            Self::Message {
                role: ItemRole::User,
                ..
            } => Kind::User,
            Self::Message {
                role: ItemRole::System,
                ..
            } => Kind::System,
            Self::Message {
                role: ItemRole::Assistant,
                ..
            } => Kind::Assistant,
            Self::FunctionCall { .. } => Kind::Call,
            Self::FunctionCallOutput { .. } => Kind::Output,
        }
    }

    /// The item's fingerprint: XXH3-64 (a fixed, specified hash: fingerprints are journaled)
    /// over a canonical encoding. Function-call arguments are compared as JSON (key order
    /// and spacing do not matter: frameworks re-serialize the arguments they parsed),
    /// everything else byte for byte.
    pub fn fingerprint(&self) -> u64 {
        self.hash(true)
    }

    /// The fingerprint of the item as sent: function-call arguments byte for byte. Equal to
    /// [`Item::fingerprint`] for every other item; checked first, so that a replay resending
    /// the arguments as they were given parses no JSON.
    pub fn raw_fingerprint(&self) -> u64 {
        self.hash(false)
    }

    fn hash(&self, canonical: bool) -> u64 {
        let mut h = Xxh3::new();
        let mut field = |b: &[u8]| {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        };
        match self {
            Self::Message { role, text, images } => {
                field(match role {
                    ItemRole::User => b"user",
                    ItemRole::System => b"system",
                    ItemRole::Assistant => b"assistant",
                });
                field(text.as_bytes());
                for i in images {
                    field(i.media_type.as_bytes());
                    field(i.data.as_bytes());
                }
            }
            Self::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                field(b"function_call");
                field(call_id.as_bytes());
                field(name.as_bytes());
                if canonical {
                    field(canonical_json(arguments).as_bytes());
                } else {
                    field(arguments.as_bytes());
                }
            }
            Self::FunctionCallOutput { call_id, output } => {
                field(b"function_call_output");
                field(call_id.as_bytes());
                field(output.as_bytes());
            }
        }
        h.digest()
    }
}

/// JSON text with sorted keys and no spacing; text that is not JSON is kept, trimmed.
fn canonical_json(text: &str) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&m[k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) => {
            let mut out = String::with_capacity(text.len());
            write(&v, &mut out);
            out
        }
        Err(_) => text.trim().to_owned(),
    }
}

/// An item of a request, with the id the client gave it (if any).
#[derive(Clone, Debug, PartialEq)]
pub struct Incoming {
    pub item: Item,
    pub id: Option<String>,
}

/// A held item: its fingerprint, its kind, and the id cairn issued for it (its own output
/// items only).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Held {
    #[serde(rename = "f")]
    pub fingerprint: u64,
    #[serde(rename = "k")]
    pub kind: Kind,
    /// [`Item::raw_fingerprint`], when it differs from the canonical one.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<u64>,
    /// Issued by this session (an output item), so a replay that carries it is recognised.
    #[serde(rename = "o", default, skip_serializing_if = "is_false")]
    pub output: bool,
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Held {
    /// An item the client sent.
    pub fn input(item: &Item) -> Self {
        let fingerprint = item.fingerprint();
        let raw = item.raw_fingerprint();
        Self {
            fingerprint,
            kind: item.kind(),
            raw: (raw != fingerprint).then_some(raw),
            output: false,
            id: None,
        }
    }

    /// An item the session answered with, under the id it issued.
    pub fn output(item: &Item, id: Option<String>) -> Self {
        Self {
            output: true,
            id,
            ..Self::input(item)
        }
    }

    /// Whether `incoming` (whose raw fingerprint is `raw`) is this item: the id cairn
    /// issued, the same bytes, or — for a function call — the same arguments as JSON.
    fn matches(&self, incoming: &Incoming, raw: u64) -> bool {
        (self.id.is_some() && incoming.id.is_some() && self.id == incoming.id)
            || self.raw == Some(raw)
            || self.fingerprint == raw
            || (matches!(incoming.item, Item::FunctionCall { .. })
                && incoming.item.fingerprint() == self.fingerprint)
    }
}

/// Every item a served session accepted, in order, and its recent response ids (journaled
/// with the session state).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Ledger {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<Held>,
    /// Newest last; at most [`KEPT_RESPONSE_IDS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub responses: Vec<String>,
}

impl Ledger {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.responses.is_empty()
    }

    pub fn latest_response(&self) -> Option<&str> {
        self.responses.last().map(String::as_str)
    }

    /// Records a completed response: its output items and its id.
    pub fn complete(&mut self, outputs: Vec<Held>, response_id: String) {
        self.items.extend(outputs);
        self.responses.push(response_id);
        let extra = self.responses.len().saturating_sub(KEPT_RESPONSE_IDS);
        self.responses.drain(..extra);
    }
}

/// Which API the request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/responses`: incremental or replay.
    Responses,
    /// `POST /v1/chat/completions`: the messages are always the whole conversation.
    Chat,
}

/// Why an input was refused; nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("previous_response_id {0:?} is not a response of this session")]
    PreviousNotFound(String),
    #[error(
        "previous_response_id {given:?} is not the session's latest response ({latest}); send the items that follow the latest response, or the whole conversation without previous_response_id"
    )]
    Stale { given: String, latest: String },
    #[error("{message}")]
    Diverged { index: usize, message: String },
    #[error(
        "the input holds no item the session does not already have: all {0} items are the conversation so far"
    )]
    NothingNew(usize),
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Self::PreviousNotFound(_) => "previous_response_not_found",
            Self::Stale { .. } => "stale_response",
            Self::Diverged { .. } => "history_diverged",
            Self::NothingNew(_) => "nothing_new",
        }
    }
}

/// Where the new items of `input` start, given what the session holds.
///
/// - With `previous_response_id` (Responses only) the input is new items only, and the id
///   must be the session's latest response.
/// - Otherwise, on the Responses API, an input that carries an item the session answered
///   with (by the id it issued or by fingerprint) is a replay of the whole conversation; any
///   other input is new items only. On Chat Completions every input is a replay.
/// - A replay must start with every held item, in order; an assistant message the client
///   left out (some frameworks keep only the tool calls of a reply; a streamed reply the
///   client could not assemble) is allowed. The first item that differs, or an input that
///   ends before the held items do, is a divergence.
pub fn reconcile(
    ledger: &Ledger,
    api: Api,
    input: &[Incoming],
    previous_response_id: Option<&str>,
) -> Result<usize, Refusal> {
    if let Some(prev) = previous_response_id {
        return match ledger.latest_response() {
            Some(latest) if latest == prev => Ok(0),
            Some(latest) if ledger.responses.iter().any(|r| r == prev) => Err(Refusal::Stale {
                given: prev.to_owned(),
                latest: latest.to_owned(),
            }),
            _ => Err(Refusal::PreviousNotFound(prev.to_owned())),
        };
    }
    let held = &ledger.items;
    if held.is_empty() {
        return Ok(0);
    }
    let fingerprints: Vec<u64> = input.iter().map(|i| i.item.raw_fingerprint()).collect();
    if api == Api::Responses && !carries_an_output(held, input, &fingerprints) {
        return Ok(0);
    }
    let (mut i, mut j) = (0, 0);
    while j < held.len() {
        let Some(incoming) = input.get(i) else {
            if held[j..].iter().all(|h| h.kind == Kind::Assistant) {
                break;
            }
            return Err(Refusal::Diverged {
                index: i,
                message: format!(
                    "the input ends after {i} items, but the session holds {} items of this conversation (item {j} is {}); resend the whole conversation, or only the new items",
                    held.len(),
                    held[j].kind.describe()
                ),
            });
        };
        if held[j].matches(incoming, fingerprints[i]) {
            i += 1;
            j += 1;
        } else if held[j].kind == Kind::Assistant && incoming.item.kind() != Kind::Assistant {
            // The text of a reply the client did not keep (a different text in its place is
            // a contradiction).
            j += 1;
        } else {
            return Err(Refusal::Diverged {
                index: i,
                message: format!(
                    "item {i} of the input ({}) differs from item {j} the session holds ({}): the input contradicts the conversation so far; nothing was changed",
                    incoming.item.kind().describe(),
                    held[j].kind.describe()
                ),
            });
        }
    }
    if i == input.len() {
        return Err(Refusal::NothingNew(i));
    }
    Ok(i)
}

/// Whether an input resends an item the session answered with (by id, or by its bytes).
fn carries_an_output(held: &[Held], input: &[Incoming], fingerprints: &[u64]) -> bool {
    let mut ids: HashSet<&str> = HashSet::new();
    let mut fps: HashSet<u64> = HashSet::new();
    for h in held.iter().filter(|h| h.output) {
        fps.insert(h.fingerprint);
        fps.extend(h.raw);
        if let Some(id) = &h.id {
            ids.insert(id);
        }
    }
    input.iter().zip(fingerprints).any(|(inc, fp)| {
        fps.contains(fp)
            || inc.id.as_deref().is_some_and(|id| ids.contains(id))
            || (matches!(inc.item, Item::FunctionCall { .. })
                && fps.contains(&inc.item.fingerprint()))
    })
}

/// The id of the function-call item that hands the client call `call_id`.
pub fn call_item_id(call_id: &str) -> String {
    format!("fc_{call_id}")
}

/// The output items of a completed response: the answer's text (if any), then each client
/// call.
pub fn output_items(text: &str, calls: &[ToolCall]) -> Vec<(Item, Option<String>)> {
    let mut out = Vec::with_capacity(1 + calls.len());
    if !text.is_empty() {
        out.push((
            Item::Message {
                role: ItemRole::Assistant,
                text: text.to_owned(),
                images: Vec::new(),
            },
            None,
        ));
    }
    out.extend(calls.iter().map(|c| {
        (
            Item::FunctionCall {
                call_id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
            Some(call_item_id(&c.id)),
        )
    }));
    out
}

/// The session's messages for new items: an assistant message and the function calls that
/// follow it are one assistant message with tool calls; a function-call output is a tool
/// message.
pub fn to_messages(items: &[Item]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(items.len());
    let mut open_assistant = false;
    for item in items {
        match item {
            Item::Message { role, text, images } => {
                let mut m = match role {
                    ItemRole::User => Message::user(text.clone()),
                    ItemRole::System => Message::system(text.clone()),
                    ItemRole::Assistant => Message::assistant(text.clone()),
                };
                m.images = images.clone();
                open_assistant = *role == ItemRole::Assistant;
                out.push(m);
            }
            Item::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                let call = ToolCall {
                    id: call_id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                };
                match out.last_mut() {
                    Some(m) if open_assistant => m.tool_calls.push(call),
                    _ => out.push(Message::assistant_calls("", vec![call])),
                }
                open_assistant = true;
            }
            Item::FunctionCallOutput { call_id, output } => {
                out.push(Message::tool(call_id.clone(), output.clone()));
                open_assistant = false;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(t: &str) -> Item {
        Item::Message {
            role: ItemRole::User,
            text: t.into(),
            images: vec![],
        }
    }

    fn inc(item: Item) -> Incoming {
        Incoming { item, id: None }
    }

    #[test]
    fn arguments_compare_as_json() {
        let a = Item::FunctionCall {
            call_id: "c".into(),
            name: "f".into(),
            arguments: r#"{"b":1,"a":[1, 2]}"#.into(),
        };
        let b = Item::FunctionCall {
            call_id: "c".into(),
            name: "f".into(),
            arguments: r#"{"a": [1,2], "b": 1}"#.into(),
        };
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(user("x").fingerprint(), user("x ").fingerprint());
    }

    #[test]
    fn an_incremental_input_is_all_new_and_a_replay_only_its_suffix() {
        let mut l = Ledger::default();
        l.items.push(Held::input(&user("q1")));
        let answer = Item::Message {
            role: ItemRole::Assistant,
            text: "a1".into(),
            images: vec![],
        };
        l.complete(vec![Held::output(&answer, None)], "resp_1".into());
        assert_eq!(
            reconcile(&l, Api::Responses, &[inc(user("q2"))], None),
            Ok(0)
        );
        let replay = [inc(user("q1")), inc(answer.clone()), inc(user("q2"))];
        assert_eq!(reconcile(&l, Api::Responses, &replay, None), Ok(2));
        assert_eq!(reconcile(&l, Api::Chat, &replay, None), Ok(2));
        let diverged = [inc(user("other")), inc(answer), inc(user("q2"))];
        assert!(matches!(
            reconcile(&l, Api::Responses, &diverged, None),
            Err(Refusal::Diverged { index: 0, .. })
        ));
        assert_eq!(
            reconcile(&l, Api::Responses, &[inc(user("q2"))], Some("resp_1")),
            Ok(0)
        );
        assert_eq!(
            reconcile(&l, Api::Responses, &[inc(user("q2"))], Some("resp_0"))
                .unwrap_err()
                .code(),
            "previous_response_not_found"
        );
    }

    #[test]
    fn items_become_messages() {
        let items = [
            Item::Message {
                role: ItemRole::Assistant,
                text: "let me".into(),
                images: vec![],
            },
            Item::FunctionCall {
                call_id: "c1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            },
            Item::FunctionCall {
                call_id: "c2".into(),
                name: "g".into(),
                arguments: "{}".into(),
            },
            Item::FunctionCallOutput {
                call_id: "c1".into(),
                output: "o".into(),
            },
        ];
        let m = to_messages(&items);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].tool_calls.len(), 2);
        assert_eq!(m[0].content, "let me");
        assert_eq!(m[1].tool_call_id.as_deref(), Some("c1"));
    }
}
