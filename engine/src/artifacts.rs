//! What a session touched: the files it named, the commands it ran, the errors it met and
//! what the user asked for, read from the messages without an LLM.
//!
//! Extraction is deterministic and deliberately simple, so two runs over the same history
//! agree byte for byte and a person can predict the result:
//!
//! - an assistant message's tool calls: `arguments` parsed as JSON (invalid JSON is skipped),
//!   walked through nested objects and arrays. A string under `path`, `file_path`,
//!   `filename` or `file`, and each string of an array under `paths` or `files`, is a file.
//!   A string under `command`, `cmd` or `script`, or an array of strings there joined by
//!   single spaces, is a command.
//! - a tool message: its error line, when its first non-empty line starts with `Error`,
//!   `error`, `ERROR`, `fatal`, `panic`, `Traceback` or is `thread '…' panicked…`, that line;
//!   otherwise the first line starting with `error[E` or `error:` (compiler and cargo
//!   output); otherwise none.
//! - a user message: its content, trimmed.
//!
//! Texts are trimmed; errors and requests are cut to [`MAX_TEXT`] bytes on a character
//! boundary. System messages and cairn's own summaries and notices (`meta.is_summary`) yield
//! nothing: they are not what the session did.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::compact::text::floor_boundary;
pub use crate::history::{Artifact, Category};
use crate::history::{Message, Role, ToolCall};

/// Errors and requests are cut to this many bytes.
pub const MAX_TEXT: usize = 200;

/// JSON nesting walked inside tool-call arguments.
const MAX_DEPTH: usize = 8;

/// Keys whose string value names a file.
const FILE_KEYS: &[&str] = &["path", "file_path", "filename", "file"];
/// Keys whose array of strings names files.
const FILE_LIST_KEYS: &[&str] = &["paths", "files"];
/// Keys whose value (a string, or an array of strings) is a command.
const COMMAND_KEYS: &[&str] = &["command", "cmd", "script"];

/// Prefixes of a first line that make a tool result an error.
const ERROR_STARTS: &[&str] = &["Error", "error", "ERROR", "fatal", "panic", "Traceback"];
/// Prefixes of any line that make a tool result an error (compiler and cargo diagnostics).
const ERROR_LINES: &[&str] = &["error[E", "error:"];

impl Artifact {
    fn new(category: Category, text: &str) -> Option<Self> {
        let text = text.trim();
        (!text.is_empty()).then(|| Self {
            category,
            text: text.to_owned(),
        })
    }
}

/// The artifacts of one message, distinct, in order of first appearance (calls in order, the
/// keys of a JSON object in sorted order).
pub fn of_message(m: &Message) -> Vec<Artifact> {
    if m.meta.is_summary {
        return Vec::new();
    }
    let found: Vec<Artifact> = match m.role {
        Role::System => Vec::new(),
        Role::Assistant => of_calls(&m.tool_calls),
        Role::Tool => error_line(&m.content)
            .and_then(|l| Artifact::new(Category::Errors, cut(l)))
            .into_iter()
            .collect(),
        Role::User => Artifact::new(Category::Requests, cut(m.content.trim()))
            .into_iter()
            .collect(),
    };
    distinct(found)
}

/// The artifacts of a whole history.
pub fn of_history(messages: &[Message]) -> BTreeSet<Artifact> {
    messages.iter().flat_map(of_message).collect()
}

/// Files and commands named in `calls`' arguments, distinct, in order.
pub fn of_calls(calls: &[ToolCall]) -> Vec<Artifact> {
    let mut out = Vec::new();
    for c in calls {
        out.extend(of_arguments(&c.arguments));
    }
    distinct(out)
}

/// Files and commands named in one call's arguments (JSON text); none when it is not JSON.
pub fn of_arguments(arguments: &str) -> Vec<Artifact> {
    let mut out = Vec::new();
    if let Ok(v) = serde_json::from_str::<Value>(arguments) {
        walk(&v, 0, &mut out);
    }
    out
}

fn walk(v: &Value, depth: usize, out: &mut Vec<Artifact>) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(map) => {
            // Sorted here, whatever order the map keeps (serde_json's `preserve_order`).
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by_key(|(k, _)| *k);
            for (k, v) in entries {
                let k = k.as_str();
                if FILE_KEYS.contains(&k)
                    && let Value::String(s) = v
                {
                    out.extend(Artifact::new(Category::Files, s));
                } else if FILE_LIST_KEYS.contains(&k)
                    && let Value::Array(items) = v
                {
                    for item in items {
                        if let Value::String(s) = item {
                            out.extend(Artifact::new(Category::Files, s));
                        }
                    }
                } else if COMMAND_KEYS.contains(&k)
                    && let Some(cmd) = command_text(v)
                {
                    out.extend(Artifact::new(Category::Commands, &cmd));
                    continue;
                }
                walk(v, depth + 1, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(item, depth + 1, out);
            }
        }
        _ => {}
    }
}

/// A command given as a string, or as an array of strings (argv) joined by spaces.
fn command_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) if !items.is_empty() => {
            let parts: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            parts.map(|p| p.join(" "))
        }
        _ => None,
    }
}

/// The line that says a tool result is an error (see the module comment), trimmed.
pub fn error_line(content: &str) -> Option<&str> {
    let mut lines = content.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next()?;
    if is_error_start(first) || ERROR_LINES.iter().any(|p| first.starts_with(p)) {
        return Some(first);
    }
    // Most results hold no diagnostic at all: one substring search skips the line walk.
    memchr::memmem::find(content.as_bytes(), b"error")?;
    lines.find(|l| ERROR_LINES.iter().any(|p| l.starts_with(p)))
}

/// True when `line` (trimmed) starts like an error (see the module comment).
pub(crate) fn is_error_start(line: &str) -> bool {
    ERROR_STARTS.iter().any(|p| line.starts_with(p))
        || (line.starts_with("thread '") && line.contains("' panicked"))
}

/// `s` cut to at most [`MAX_TEXT`] bytes on a character boundary.
fn cut(s: &str) -> &str {
    &s[..floor_boundary(s, MAX_TEXT)]
}

fn distinct(found: Vec<Artifact>) -> Vec<Artifact> {
    let mut out: Vec<Artifact> = Vec::with_capacity(found.len());
    for a in found {
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}
