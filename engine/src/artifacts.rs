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
//! - a tool message: its error lines, the first [`MAX_ERRORS`] distinct ones. Its first
//!   non-empty line when it starts with `Error`, `error`, `ERROR`, `fatal` or `panic`, or is
//!   `thread '…' panicked…`; then any line that reads as a diagnostic of a common tool:
//!   rustc and cargo (`error[E…`, `error:`, never `warning:`), a Rust panic (`thread '…'
//!   panicked at`), pytest (`E   …` assertion lines other than their `+` explanations,
//!   `FAILED …`, `ERROR …`), Go (`--- FAIL: …`, `panic: …`, `FAIL\t…`), `exit status N`,
//!   npm (`npm ERR! …`, `npm error …`), kubectl (`Error from server (…): …`, `error: …`),
//!   git (`fatal: …`), and for a Python `Traceback (most recent call last):` the exception
//!   line that ends it (`ValueError: …`; the header itself when the traceback is cut short).
//! - a user message: its content, trimmed.
//!
//! Texts are trimmed; errors are cut to [`MAX_TEXT`] bytes on a character boundary, a
//! request longer than that is its head and its tail around [`REQUEST_GAP`] (the user's
//! words, both ends). System messages and cairn's own summaries and notices (`meta.is_summary`) yield
//! nothing: they are not what the session did.

use std::collections::BTreeSet;

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;
use serde_json::Value;

pub use crate::history::{Artifact, Category};
use crate::history::{Message, Role, ToolCall};
use crate::utf8::floor_boundary;

/// Errors and requests are cut to this many bytes (a request to its head and tail).
pub const MAX_TEXT: usize = 200;
/// Error lines taken from one tool result.
pub const MAX_ERRORS: usize = 3;

/// JSON nesting walked inside tool-call arguments.
const MAX_DEPTH: usize = 8;

/// Keys whose string value names a file.
const FILE_KEYS: &[&str] = &["path", "file_path", "filename", "file"];
/// Keys whose array of strings names files.
const FILE_LIST_KEYS: &[&str] = &["paths", "files"];
/// Keys whose value (a string, or an array of strings) is a command.
const COMMAND_KEYS: &[&str] = &["command", "cmd", "script"];

/// Prefixes of a first line that make a tool result an error.
const ERROR_STARTS: &[&str] = &["Error", "error", "ERROR", "fatal", "panic"];
/// Prefixes of any line (trimmed) that make it an error line: compiler and test-runner
/// diagnostics. Each must be followed by some text.
const ERROR_LINES: &[&str] = &[
    "error[E",
    "error:",
    "FAILED ",
    "ERROR ",
    "--- FAIL: ",
    "panic: ",
    "FAIL\t",
    "npm ERR! ",
    "npm error ",
    "Error from server (",
    "fatal: ",
];
/// The header of a Python traceback; its exception line is the error.
const TRACEBACK: &str = "Traceback (most recent call last):";
/// Lines between the tracebacks of a chained Python exception.
const TRACEBACK_CHAINS: &[&str] = &[
    "During handling of the above exception",
    "The above exception was the direct cause",
];
/// Words one of which every error line holds (ASCII case ignored): the prefilter that lets
/// a result holding none skip the line walk.
const ERROR_WORDS: &[&str] = &[
    "error",
    "fail",
    "panic",
    "fatal",
    "traceback",
    "exit status",
    "err!",
    "\nE ",
];

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
        Role::Tool => error_lines(&m.content)
            .into_iter()
            .filter_map(|l| Artifact::new(Category::Errors, l))
            .collect(),
        Role::User => Artifact::new(Category::Requests, &request(m.content.trim()))
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

/// The error lines of a tool result (see the module comment): the first [`MAX_ERRORS`]
/// distinct ones, each trimmed and cut to [`MAX_TEXT`] bytes.
pub fn error_lines(content: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    // Most results hold no diagnostic at all: one search for all the words skips the walk.
    if !may_hold_errors(content) {
        return out;
    }
    let mut lines = content.lines();
    let mut first = true;
    while let Some(raw) = lines.next() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let is_first = std::mem::take(&mut first);
        if line.starts_with(TRACEBACK) {
            let exception = lines.by_ref().map(str::trim_end).find(|l| {
                !l.is_empty()
                    && !l.starts_with(char::is_whitespace)
                    && !TRACEBACK_CHAINS.iter().any(|c| l.starts_with(c))
            });
            if push_distinct(&mut out, exception.unwrap_or(line)) {
                break;
            }
            continue;
        }
        let error = (is_first && is_error_start(line))
            || is_error_line(line)
            || is_pytest_assertion(raw)
            || is_exit_status(line);
        if error && push_distinct(&mut out, line) {
            break;
        }
    }
    out
}

/// Adds `line` (trimmed, cut) to `out` unless there already; true once `out` is full.
fn push_distinct<'a>(out: &mut Vec<&'a str>, line: &'a str) -> bool {
    let line = cut(line.trim());
    if !line.is_empty() && !out.contains(&line) {
        out.push(line);
    }
    out.len() >= MAX_ERRORS
}

/// The first of [`error_lines`]: the line that says a tool result is an error.
pub fn error_line(content: &str) -> Option<&str> {
    error_lines(content).into_iter().next()
}

/// True when `content` holds one of [`ERROR_WORDS`] (or the automaton could not be built).
fn may_hold_errors(content: &str) -> bool {
    static WORDS: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
        AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(ERROR_WORDS)
            .ok()
    });
    WORDS.as_ref().is_none_or(|w| w.is_match(content))
}

/// True when `line` (trimmed) starts like an error (see the module comment).
pub(crate) fn is_error_start(line: &str) -> bool {
    ERROR_STARTS.iter().any(|p| line.starts_with(p)) || is_rust_panic(line)
}

fn is_error_line(line: &str) -> bool {
    ERROR_LINES
        .iter()
        .any(|p| line.len() > p.len() && line.starts_with(p))
        || is_rust_panic(line)
}

/// `thread 'main' panicked at …`, with or without the thread id newer Rust prints.
fn is_rust_panic(line: &str) -> bool {
    line.starts_with("thread '") && line.contains(" panicked")
}

/// pytest's `E   assert 2 == 3`, not its `E    +  where …` explanations.
fn is_pytest_assertion(raw: &str) -> bool {
    raw.strip_prefix("E ").is_some_and(|rest| {
        let rest = rest.trim_start();
        !rest.is_empty() && !rest.starts_with('+')
    })
}

/// `exit status 2`.
fn is_exit_status(line: &str) -> bool {
    line.strip_prefix("exit status ")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `s` cut to at most [`MAX_TEXT`] bytes on a character boundary.
/// Between a long request's head and tail.
pub const REQUEST_GAP: &str = " […] ";

/// A request as the ledger keeps it: the user's words, verbatim up to [`MAX_TEXT`] bytes; a
/// longer one as its head and its tail around [`REQUEST_GAP`], within [`MAX_TEXT`].
fn request(s: &str) -> std::borrow::Cow<'_, str> {
    if s.len() <= MAX_TEXT {
        return std::borrow::Cow::Borrowed(s);
    }
    let room = MAX_TEXT - REQUEST_GAP.len();
    let head = &s[..floor_boundary(s, room * 2 / 3)];
    let tail_from = crate::utf8::ceil_boundary(s, s.len() - (room - head.len()));
    std::borrow::Cow::Owned(format!("{head}{REQUEST_GAP}{}", &s[tail_from..]))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Output recorded from the real tool.
    fn recorded(name: &str) -> &'static str {
        match name {
            "cargo_build" => include_str!("../tests/fixtures/tool_output/cargo_build.txt"),
            "cargo_test" => include_str!("../tests/fixtures/tool_output/cargo_test.txt"),
            "pytest" => include_str!("../tests/fixtures/tool_output/pytest.txt"),
            "pytest_fail" => include_str!("../tests/fixtures/tool_output/pytest_fail.txt"),
            "traceback" => include_str!("../tests/fixtures/tool_output/traceback.txt"),
            "go_test" => include_str!("../tests/fixtures/tool_output/go_test.txt"),
            "npm_missing" => include_str!("../tests/fixtures/tool_output/npm_missing.txt"),
            "git" => include_str!("../tests/fixtures/tool_output/git.txt"),
            "kubectl_apply" => include_str!("../tests/fixtures/tool_output/kubectl_apply.txt"),
            _ => "",
        }
    }

    #[test]
    fn real_tool_failures_give_their_error_lines() {
        let cases: [(&str, &[&str]); 9] = [
            (
                "cargo_build",
                &[
                    "error[E0425]: cannot find value `undefined_name` in this scope",
                    "error[E0308]: mismatched types",
                    "error: could not compile `rsfail` (bin \"rsfail\") due to 2 previous errors",
                ],
            ),
            (
                "cargo_test",
                &[
                    "thread 'tests::adds' (10422) panicked at src/lib.rs:6:17:",
                    "error: test failed, to rerun pass `--lib`",
                ],
            ),
            (
                "pytest",
                &[
                    "E   ModuleNotFoundError: No module named 'nonexistent_module_xyz'",
                    "ERROR test_broken.py",
                    "exit status 2",
                ],
            ),
            (
                "pytest_fail",
                &[
                    "E       assert 2 == 3",
                    "E       KeyError: 'value'",
                    "FAILED test_calc.py::test_parse_value - assert 2 == 3",
                ],
            ),
            (
                "traceback",
                &[
                    "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
                ],
            ),
            (
                "go_test",
                &[
                    "--- FAIL: TestAdd (0.00s)",
                    "--- FAIL: TestIndex (0.00s)",
                    "panic: runtime error: index out of range [3] with length 1 [recovered, repanicked]",
                ],
            ),
            (
                "npm_missing",
                &[
                    "npm error Missing script: \"nonexistent-script\"",
                    "npm error To see a list of scripts, run:",
                    "npm error   npm run",
                ],
            ),
            (
                "git",
                &["fatal: not a git repository (or any of the parent directories): .git"],
            ),
            (
                "kubectl_apply",
                &["error: the path \"/nonexistent.yaml\" does not exist"],
            ),
        ];
        for (name, want) in cases {
            let output = recorded(name);
            assert!(!output.is_empty(), "{name} is recorded");
            assert_eq!(error_lines(output), want.to_vec(), "{name}");
            for line in want {
                assert!(output.contains(line), "{name}: {line} is verbatim");
            }
        }
    }

    #[test]
    fn warnings_and_passing_runs_are_no_errors() {
        let warning = "warning: unused variable: `unused`\n --> src/main.rs:4:9\n";
        assert!(error_lines(warning).is_empty());
        assert!(error_lines("test result: ok. 3 passed; 0 failed\n").is_empty());
        assert!(error_lines("E\nE    +  where 2 = f()\n").is_empty());
        assert_eq!(error_lines("ok\nexit status 1\n"), ["exit status 1"]);
        assert!(error_lines("exit status unknown").is_empty());
    }
}
