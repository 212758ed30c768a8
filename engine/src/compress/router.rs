//! What is this content? Decided from the tool's name when it is unambiguous, else from a
//! sample of the head and tail. The sample is bounded (64 KiB) so routing a multi-megabyte
//! tool output costs microseconds, whatever its size.

use super::lines::contains_ci;
use super::{code, json, log, search};

/// Bytes of the input the router may look at: half from the head, half from the tail.
pub const SAMPLE_BYTES: usize = 64 * 1024;
/// Of those, the bytes at each end whose lines are classified: a few hundred lines decide as
/// well as a thousand.
const LINE_SAMPLE_BYTES: usize = 8 * 1024;

/// The kinds of content with a dedicated compressor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Log,
    Search,
    Diff,
    Json,
    Code,
    Prose,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Log,
        Kind::Search,
        Kind::Diff,
        Kind::Json,
        Kind::Code,
        Kind::Prose,
    ];

    /// Stable label, also the strategy label of the counters.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Log => "log",
            Self::Search => "search",
            Self::Diff => "diff",
            Self::Json => "json",
            Self::Code => "code",
            Self::Prose => "prose",
        }
    }

    /// A kind named outright (the `compress` tool's `kind` argument).
    pub fn from_label(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.label().eq_ignore_ascii_case(s.trim()))
    }
}

/// True for the tools whose output is an archived original that must reach the model as is.
pub fn is_recall_tool(tool: &str) -> bool {
    tool.eq_ignore_ascii_case("recall") || tool.eq_ignore_ascii_case("ccr_recall")
}

/// The kind a tool's name settles, if it does.
fn kind_of_tool(tool: &str) -> Option<Kind> {
    if let Some(kind) = Kind::from_label(tool) {
        return Some(kind);
    }
    let t = tool.to_ascii_lowercase();
    let t = t.rsplit(['.', '/', ':']).next().unwrap_or_default();
    if t.contains("diff") {
        return Some(Kind::Diff);
    }
    if matches!(
        t,
        "grep" | "rg" | "ripgrep" | "git_grep" | "search" | "search_files" | "find_in_files"
    ) {
        return Some(Kind::Search);
    }
    None
}

/// Tools whose output is a command's output: a log unless the content is clearly something
/// else.
fn is_command_tool(tool: &str) -> bool {
    const COMMANDS: [&str; 12] = [
        "bash", "shell", "sh", "exec", "run", "terminal", "command", "cmd", "make", "cargo", "npm",
        "pytest",
    ];
    COMMANDS.iter().any(|c| contains_ci(tool, c))
}

/// The kind of `text`, from the tool's name and a bounded sample.
pub fn detect(tool: Option<&str>, text: &str) -> Kind {
    if let Some(kind) = tool.and_then(kind_of_tool) {
        return kind;
    }
    let (head, tail) = sample(text);
    if json::looks_like_json(head) && ends_like_json(tail) {
        return Kind::Json;
    }
    let stats = if text.len() <= 2 * LINE_SAMPLE_BYTES {
        LineStats::of(text, "")
    } else {
        LineStats::of(
            prefix(text, LINE_SAMPLE_BYTES),
            suffix(text, LINE_SAMPLE_BYTES),
        )
    };
    if stats.diff_headers > 0 && stats.hunks > 0 {
        return Kind::Diff;
    }
    if stats.lines > 0 && stats.search * 10 >= stats.lines * 6 {
        return Kind::Search;
    }
    if stats.log * 10 >= stats.lines * 3 || tool.is_some_and(is_command_tool) {
        return Kind::Log;
    }
    if stats.code * 10 >= stats.lines * 3 {
        return Kind::Code;
    }
    if stats.lines >= 20 && stats.long_lines * 10 < stats.lines {
        // Many short lines without prose's long ones: line-oriented command output.
        return Kind::Log;
    }
    Kind::Prose
}

fn ends_like_json(tail: &str) -> bool {
    tail.trim_end().ends_with(['}', ']'])
}

/// The first and last `SAMPLE_BYTES / 2` bytes (cut at character boundaries); both are the
/// whole text when it fits.
fn sample(text: &str) -> (&str, &str) {
    if text.len() <= SAMPLE_BYTES {
        return (text, text);
    }
    (
        prefix(text, SAMPLE_BYTES / 2),
        suffix(text, SAMPLE_BYTES / 2),
    )
}

/// At most the first `n` bytes, ending at a character boundary.
fn prefix(text: &str, n: usize) -> &str {
    let mut end = n.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// At most the last `n` bytes, starting at a character boundary.
fn suffix(text: &str, n: usize) -> &str {
    let mut start = text.len().saturating_sub(n);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[derive(Default)]
struct LineStats {
    lines: usize,
    diff_headers: usize,
    hunks: usize,
    search: usize,
    log: usize,
    code: usize,
    long_lines: usize,
}

impl LineStats {
    fn of(head: &str, tail: &str) -> Self {
        let mut s = Self::default();
        for line in head.lines().chain(tail.lines()) {
            if line.trim().is_empty() {
                continue;
            }
            s.lines += 1;
            if line.starts_with("diff --git ") || line.starts_with("+++ ") {
                s.diff_headers += 1;
            }
            if line.starts_with("@@ ") {
                s.hunks += 1;
            }
            if search::result_path(line).is_some() {
                s.search += 1;
            }
            if is_log_line(line) {
                s.log += 1;
            }
            if is_code_line(line) {
                s.code += 1;
            }
            if line.len() > 100 {
                s.long_lines += 1;
            }
        }
        s
    }
}

fn is_log_line(line: &str) -> bool {
    const LEVELS: [&str; 10] = [
        "INFO",
        "WARN",
        "DEBUG",
        "TRACE",
        "ERROR",
        "Compiling",
        "Running",
        "Finished",
        "PASS",
        "FAIL",
    ];
    let starts_with_time = line.bytes().take(4).filter(u8::is_ascii_digit).count() >= 2
        && line.bytes().take(20).any(|c| c == b':' || c == b'-');
    starts_with_time
        || line.starts_with('[')
        || LEVELS.iter().any(|l| line.contains(l))
        || line.starts_with("test ")
        || log::is_error_line(line)
}

fn is_code_line(line: &str) -> bool {
    let t = line.trim_end();
    code::is_declaration(t)
        || t.ends_with(['{', '}', ';'])
        || t.trim_start().starts_with("//")
        || t.trim_start().starts_with("return")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repeat(line: &str, n: usize) -> String {
        (0..n)
            .map(|i| line.replace("{i}", &i.to_string()))
            .collect()
    }

    #[test]
    fn detects_each_kind() {
        let cases = [
            (
                repeat("2026-01-01T10:00:{i} INFO request handled\n", 50),
                Kind::Log,
            ),
            (repeat("src/lib.rs:{i}:    let x = 1;\n", 50), Kind::Search),
            (
                "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n".to_string(),
                Kind::Diff,
            ),
            (
                format!("[{}{{\"i\": 0}}]", repeat("{\"i\": {i}},", 50)),
                Kind::Json,
            ),
            (
                repeat("pub fn f{i}() -> u32 {\n    let x = {i};\n    x\n}\n", 20),
                Kind::Code,
            ),
            (
                repeat(
                    "This is a long paragraph of ordinary English prose that keeps going past one hundred characters, number {i}.\n\n",
                    30,
                ),
                Kind::Prose,
            ),
        ];
        for (text, kind) in cases {
            assert_eq!(detect(None, &text), kind, "{}", &text[..60.min(text.len())]);
        }
    }

    #[test]
    fn tool_names_settle_the_kind() {
        assert_eq!(detect(Some("git_diff"), "anything"), Kind::Diff);
        assert_eq!(detect(Some("grep"), "anything"), Kind::Search);
        assert_eq!(detect(Some("json"), "anything"), Kind::Json);
        assert_eq!(detect(Some("bash"), "short words\nhere\n"), Kind::Log);
        assert!(is_recall_tool("Recall"));
    }

    #[test]
    fn only_the_ends_decide() {
        let log = repeat("2026-01-01T10:00:{i} INFO request handled\n", 1500);
        let diff = repeat(
            "diff --git a/f{i} b/f{i}\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n",
            40_000,
        );
        let text = format!("{log}{diff}{log}");
        assert!(diff.len() > 1_000_000 && log.len() > SAMPLE_BYTES / 2);
        assert_eq!(detect(None, &text), Kind::Log);
        let items = repeat("{\"id\": {i}, \"name\": \"item\"},\n", 100_000);
        let json = format!("[\n{items}{{\"id\": -1}}\n]\n");
        assert_eq!(detect(None, &json), Kind::Json);
    }

    #[test]
    fn sample_is_bounded_and_on_char_boundaries() {
        let text = "é".repeat(100_000);
        let (head, tail) = sample(&text);
        assert!(head.len() <= SAMPLE_BYTES / 2 && tail.len() <= SAMPLE_BYTES / 2);
    }
}
