//! The built-in tools offered to the model — `recall` and `compress` — and the guard that
//! stops a tool-call loop going round in circles.

use cairn_crds::policy::{Compression, CompressionMode};
use serde_json::{Value, json};

use crate::ccr::stats::CompressionCounters;
use crate::ccr::{Store, recall};
use crate::compress::{self, Outcome};
use crate::history::{Message, Role, ToolCall};
use crate::provider::ToolSpec;

pub const RECALL: &str = "recall";
pub const COMPRESS: &str = "compress";

/// The same batch of tool calls this many times in a row ends the tool-call loop.
pub const STAGNATION_REPEATS: usize = 3;

/// The tool catalog sent with every request.
pub fn catalog() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: RECALL.into(),
            description: "Return the original, byte-identical content behind a <<ccr:KEY>> marker that replaced archived text in this conversation. Pass the marker or its 16-hex key; several markers may be given at once.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "key": {"type": "string", "description": "A <<ccr:KEY>> marker or its 16-hex key (several may be given)."}
                },
                "required": ["key"]
            }),
        },
        ToolSpec {
            name: COMPRESS.into(),
            description: "Shrink a large earlier tool result in place (tool_call_id), or compress a text you pass (text), keeping what matters (errors, changed lines, first/last matches). The original is archived and stays recallable with the marker the result carries.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "tool_call_id": {"type": "string", "description": "Id of the earlier tool call whose result to shrink."},
                    "text": {"type": "string", "description": "Text to compress (when no tool_call_id is given)."},
                    "kind": {"type": "string", "enum": ["log", "search", "diff", "json", "code", "prose"], "description": "What the content is, when you know."}
                }
            }),
        },
    ]
}

/// Detects the same batch of calls repeated.
#[derive(Default, Debug)]
pub struct StagnationGuard {
    last: Option<Vec<(String, String)>>,
    repeats: usize,
}

impl StagnationGuard {
    /// Records a batch; true when it is the [`STAGNATION_REPEATS`]th identical one in a row.
    pub fn record(&mut self, calls: &[ToolCall]) -> bool {
        let mut batch: Vec<(String, String)> = calls
            .iter()
            .map(|c| (c.name.clone(), normalise_args(&c.arguments)))
            .collect();
        batch.sort();
        if self.last.as_ref() == Some(&batch) {
            self.repeats += 1;
        } else {
            self.last = Some(batch);
            self.repeats = 1;
        }
        self.repeats >= STAGNATION_REPEATS
    }
}

fn normalise_args(args: &str) -> String {
    serde_json::from_str::<Value>(args)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| args.trim().to_owned())
}

/// The result of one call.
pub struct ToolResult {
    pub message: Message,
    /// The call failed: its output is an error message (kept verbatim on entry).
    pub is_error: bool,
    /// The call changed an earlier message of the history (compress in place).
    pub rewrote: bool,
}

/// Runs one built-in tool call against the history.
pub async fn run(
    call: &ToolCall,
    history: &mut [Message],
    store: &dyn Store,
    compression: &Compression,
    counters: &CompressionCounters,
) -> ToolResult {
    let mut rewrote = false;
    let mut is_error = false;
    let (content, verbatim) = match call.name.as_str() {
        RECALL => match recall(store, &call.arguments).await {
            Ok(r) => {
                counters.record_recall(r.found.len(), r.missing.len());
                (String::from_utf8_lossy(&r.output).into_owned(), true)
            }
            Err(e) => {
                is_error = true;
                (format!("recall failed: {e}"), false)
            }
        },
        COMPRESS => {
            let (text, r) = compress_call(call, history, store, compression, counters).await;
            rewrote = r;
            (text, false)
        }
        other => {
            is_error = true;
            (
                format!(
                    "error: unknown tool {other:?}; the tools available are {RECALL} and {COMPRESS}"
                ),
                false,
            )
        }
    };
    let mut message = Message::tool(call.id.clone(), content);
    message.name = Some(call.name.clone());
    message.meta.preserve_verbatim = verbatim;
    ToolResult {
        message,
        is_error,
        rewrote,
    }
}

async fn compress_call(
    call: &ToolCall,
    history: &mut [Message],
    store: &dyn Store,
    compression: &Compression,
    counters: &CompressionCounters,
) -> (String, bool) {
    let args: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
    let kind = args.get("kind").and_then(Value::as_str);
    if compression.mode != CompressionMode::Lossy {
        return (
            "compress is disabled by this session's policy (compression.mode is not lossy)".into(),
            false,
        );
    }
    // Asked for explicitly: no size threshold.
    let policy = Compression {
        threshold_bytes: 0,
        ..compression.clone()
    };
    if let Some(id) = args.get("tool_call_id").and_then(Value::as_str) {
        let Some(m) = history.iter_mut().find(|m| {
            m.role == Role::Tool
                && m.tool_call_id.as_deref() == Some(id)
                && !m.meta.preserve_verbatim
        }) else {
            return (format!("no compressible tool result with id {id:?}"), false);
        };
        let tool = kind.or(m.name.as_deref()).map(str::to_owned);
        let before = m.content.len();
        match compress::compress(
            store,
            m.content.as_bytes(),
            tool.as_deref(),
            &policy,
            counters,
        )
        .await
        {
            Outcome::Compressed { text, key, .. } => {
                let after = text.len();
                m.content = text;
                m.meta.archived.push(key.as_str().to_owned());
                (
                    format!(
                        "compressed the result of {id} from {before} to {after} bytes; the original is recallable with {}",
                        key.marker()
                    ),
                    true,
                )
            }
            Outcome::Unchanged { reason, .. } => (
                format!("left the result of {id} unchanged ({})", reason.label()),
                false,
            ),
        }
    } else if let Some(text) = args.get("text").and_then(Value::as_str) {
        match compress::compress(store, text.as_bytes(), kind, &policy, counters).await {
            Outcome::Compressed { text, .. } => (text, false),
            Outcome::Unchanged { reason, .. } => (
                format!("not compressed ({}):\n{text}", reason.label()),
                false,
            ),
        }
    } else {
        ("compress needs tool_call_id or text".into(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn stagnation_needs_three_identical_batches_in_a_row() {
        let mut g = StagnationGuard::default();
        let a = [call("recall", r#"{"key": "x"}"#)];
        let a2 = [call("recall", r#"{"key":"x"}"#)];
        let b = [call("recall", r#"{"key":"y"}"#)];
        assert!(!g.record(&a));
        assert!(!g.record(&a2));
        assert!(!g.record(&b));
        assert!(!g.record(&b));
        assert!(g.record(&b));
    }

    #[tokio::test]
    async fn recall_result_is_verbatim_and_unknown_tools_answer_an_error() {
        let store = crate::ccr::MemoryStore::new();
        let key = store.archive(b"original bytes\n").await.unwrap();
        let counters = CompressionCounters::default();
        let policy = cairn_crds::EffectivePolicy::default().compression;
        let r = run(
            &call(
                "recall",
                &format!("{{\"key\":\"ccr:{}\"}}", key.as_str().to_uppercase()),
            ),
            &mut [],
            &store,
            &policy,
            &counters,
        )
        .await;
        assert_eq!(r.message.content, "original bytes\n");
        assert!(r.message.meta.preserve_verbatim);
        let r = run(&call("shell", "{}"), &mut [], &store, &policy, &counters).await;
        assert!(r.message.content.contains("unknown tool"));
    }
}
