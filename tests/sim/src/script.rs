//! What the simulator answers: scripted replies, per-model windows and injected faults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Why a scripted reply stops.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    End,
    ToolUse,
    MaxTokens,
}

/// A tool call the model "issues".
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScriptedCall {
    pub name: String,
    /// JSON arguments object.
    #[serde(default = "empty_object")]
    pub arguments: serde_json::Value,
    /// Call id; generated when absent.
    #[serde(default)]
    pub id: Option<String>,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// One reply, consumed by the next model request (any provider).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ScriptedReply {
    #[serde(default)]
    pub text: String,
    /// Reasoning/thinking text, where the wire format has it.
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_call: Option<ScriptedCall>,
    /// More calls in the same reply (after `tool_call`): parallel tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ScriptedCall>,
    /// Default: `tool_use` with a tool call, else `end`; a reply longer than the request's
    /// output limit (chars/4 tokens) is cut and stops with `max_tokens` regardless.
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Cached input tokens to report.
    #[serde(default)]
    pub cached_tokens: u64,
}

impl ScriptedReply {
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }

    /// A reply with several tool calls at once.
    pub fn tool_calls(calls: Vec<(String, serde_json::Value)>) -> Self {
        Self {
            tool_calls: calls
                .into_iter()
                .map(|(name, arguments)| ScriptedCall {
                    name,
                    arguments,
                    id: None,
                })
                .collect(),
            ..Self::default()
        }
    }

    pub fn tool_call(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        Self {
            tool_call: Some(ScriptedCall {
                name: name.into(),
                arguments,
                id: None,
            }),
            ..Self::default()
        }
    }
}

/// A failure injected into one request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// Wait before answering normally.
    Latency { ms: u64 },
    /// Answer with this status and the provider's error body for it (429 gets the rate-limit
    /// body, 529 Anthropic's overloaded body, 5xx a server error).
    Status {
        status: u16,
        #[serde(default)]
        retry_after: Option<u64>,
    },
    /// Send the first half of the body or stream, then end it cleanly.
    TruncateStream,
    /// Send the first half, then abort the connection.
    Reset,
    /// A 200 whose JSON (or first stream event) is broken.
    MalformedJson,
    /// Send the first half of a stream, go silent for `ms`, then finish.
    Stall { ms: u64 },
    /// Send the whole answer (JSON body or stream) one byte every `ms`: never silent long
    /// enough for an idle timeout, yet it takes as long as the answer has bytes.
    Drip { ms: u64 },
    /// Send the first half of a stream, then an SSE comment every `ms`, forever: the
    /// connection is never idle and the answer never ends.
    Heartbeat { ms: u64 },
}

impl Fault {
    /// Short form of the `x-sim-fault` request header: `429`, `429:2` (Retry-After 2 s),
    /// `503`, `529`, `latency:200`, `truncate`, `reset`, `malformed`, `stall:5000`,
    /// `drip:1000`, `heartbeat:500`.
    pub fn parse_header(v: &str) -> Option<Self> {
        let (head, arg) = match v.trim().split_once(':') {
            Some((h, a)) => (h, Some(a)),
            None => (v.trim(), None),
        };
        let num = || arg.and_then(|a| a.trim().parse::<u64>().ok());
        Some(match head {
            "latency" => Self::Latency { ms: num()? },
            "stall" => Self::Stall { ms: num()? },
            "drip" => Self::Drip { ms: num()? },
            "heartbeat" => Self::Heartbeat { ms: num()? },
            "truncate" => Self::TruncateStream,
            "reset" => Self::Reset,
            "malformed" => Self::MalformedJson,
            s => Self::Status {
                status: s.parse().ok().filter(|s| (100..600).contains(s))?,
                retry_after: num(),
            },
        })
    }
}

/// A standing answer for every request whose body contains `contains` (a summarizer's
/// instructions, say): it is answered with `reply` after `delay_ms`, and neither consumes
/// the reply queue nor a queued fault. The first matching route wins.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Route {
    pub contains: String,
    pub reply: ScriptedReply,
    #[serde(default)]
    pub delay_ms: u64,
}

/// A script file (JSON or YAML) or the body of `POST /_sim/script`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Script {
    #[serde(default)]
    pub replies: Vec<ScriptedReply>,
    /// Context windows in tokens by model name.
    #[serde(default)]
    pub windows: BTreeMap<String, u64>,
    /// Bytes per token of a model's tokenizer (default 4): real small-vocabulary tokenizers
    /// count logs at 1.6–1.8.
    #[serde(default, rename = "bytesPerToken")]
    pub bytes_per_token: BTreeMap<String, f64>,
    /// Server dialects by model name: `llama.cpp` answers an overflow with llama-server's
    /// own body on every API and stops a reply with `length` when the context fills.
    #[serde(default)]
    pub dialects: BTreeMap<String, String>,
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Standing answers by body content (see [`Route`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// Simulate the providers' prompt caches (`cache`): usage reports cache reads and
    /// writes as each provider does.
    #[serde(default, rename = "promptCache")]
    pub prompt_cache: bool,
}

impl Script {
    /// Parses JSON, or YAML when it is not JSON.
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).or_else(|je| {
            serde_yaml::from_str(text).map_err(|ye| format!("neither JSON ({je}) nor YAML ({ye})"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_short_forms() {
        assert_eq!(
            Fault::parse_header("429:2"),
            Some(Fault::Status {
                status: 429,
                retry_after: Some(2)
            })
        );
        assert_eq!(Fault::parse_header("reset"), Some(Fault::Reset));
        assert_eq!(
            Fault::parse_header("latency:20"),
            Some(Fault::Latency { ms: 20 })
        );
        assert_eq!(Fault::parse_header("drip:5"), Some(Fault::Drip { ms: 5 }));
        assert_eq!(
            Fault::parse_header("heartbeat:7"),
            Some(Fault::Heartbeat { ms: 7 })
        );
        assert_eq!(Fault::parse_header("nope"), None);
        assert_eq!(Fault::parse_header("999"), None);
    }

    #[test]
    fn scripts_load_from_yaml_and_json() {
        let y = "replies:\n  - text: hi\n  - tool_call: {name: read, arguments: {path: a}}\n    stop: tool_use\nwindows: {tiny: 100}\nfaults:\n  - {kind: status, status: 429, retry_after: 1}\n";
        let s = Script::parse(y).unwrap();
        assert_eq!(s.replies.len(), 2);
        assert_eq!(s.windows["tiny"], 100);
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(Script::parse(&j).unwrap(), s);
    }
}
