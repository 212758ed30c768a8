//! Repeated reads: an earlier read whose lines later reads cover becomes a stub with a recall
//! marker. Reads are recognised from the tool call (name, path and range arguments), never
//! from one client's text markers. The newest read, verbatim messages and summaries are never
//! touched.
//!
//! Covering is conservative: when in doubt, a read is not covered.
//! - A read returns lines of a file: a span `start..=end` (1-based: `head: N` is `1..=N`;
//!   `offset`/`limit`, `view_range`, start and end lines) or the last N lines (`tail: N`).
//! - A whole-file read covers every read of the same path; a span covers the spans it
//!   contains (`head: N` covers `head: M` for M ≤ N); `tail: N` covers `tail: M` for M ≤ N.
//!   A span never covers a tail nor a tail a span: where a tail starts depends on the file's
//!   length at the time.
//! - A call whose range is unclear is not a read: `head` and `tail` together (the filesystem
//!   server refuses it), two range forms at once, a range argument that is not a line number,
//!   or a number argument the recogniser does not know (it may narrow the read).
//! - A multi-file read (`read_multiple_files`) reads each of its files whole. Its result
//!   cannot be split per file, so it is superseded only once later reads cover every file it
//!   read; it covers an earlier read of any of its files as a whole read of that file would.
//! - `read_media_file` is no read tool: its result is an image, not lines.
//! - A read that failed returned no lines: it covers nothing and is never superseded. A result
//!   fails when it is empty, or when its first non-empty line starts like an error (`Error`,
//!   `fatal`, `Traceback`, … as [`crate::artifacts`] reads them) or names a failure to open
//!   the file (`ENOENT`, `No such file or directory`, `Permission denied`, `Access denied`,
//!   `does not exist`). Only the first line is read: a file's own lines may say anything.

use std::collections::HashMap;

use cairn_crds::EffectivePolicy;
use cairn_crds::policy::ReadTool;
use serde_json::{Map, Value};

use crate::artifacts;
use crate::ccr::{Archivable, Key, Store};
use crate::history::{self, Message, Role};

use super::archive::{archive_all_checked, distinct, note_archived};
use super::{Pass, PassReport, Trigger, text};

/// Where the path is when a read tool does not name its path argument.
const PATH_KEYS: [&str; 7] = [
    "path",
    "file_path",
    "filePath",
    "filename",
    "file",
    "target_file",
    "absolute_path",
];
const START_KEYS: [&str; 4] = ["start_line", "line_start", "startLine", "start"];
const END_KEYS: [&str; 4] = ["end_line", "line_end", "endLine", "end"];
/// Every range argument, one form per row; the only number arguments a read may carry.
const RANGE_FORMS: [&[&str]; 4] = [
    &["head", "tail"],
    &["view_range"],
    &["offset", "limit"],
    &[
        "start_line",
        "line_start",
        "startLine",
        "start",
        "end_line",
        "line_end",
        "endLine",
        "end",
    ],
];

/// Phrases of a failed read's first line, lowercase: the filesystem server's and the shell's
/// answers to a missing or unreadable file.
const FAILED_READ: [&str; 7] = [
    "enoent",
    "no such file or directory",
    "eacces",
    "permission denied",
    "access denied",
    "does not exist",
    "tool_use_error",
];

/// The lines of a file one read returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lines {
    /// Lines `start..=end`, 1-based; `end == None`: to the end of the file.
    Span { start: u64, end: Option<u64> },
    /// The last `n` lines (`tail: n`).
    Tail(u64),
}

impl Lines {
    /// The whole file.
    pub const WHOLE: Self = Self::Span {
        start: 1,
        end: None,
    };

    /// True when a later read of `self` returns every line an earlier read of `earlier` did.
    pub fn covers(self, earlier: Self) -> bool {
        match (self, earlier) {
            (
                Self::Span {
                    start: a,
                    end: a_end,
                },
                Self::Span {
                    start: b,
                    end: b_end,
                },
            ) => {
                a <= b
                    && match (a_end, b_end) {
                        (None, _) => true,
                        (Some(_), None) => false,
                        (Some(x), Some(y)) => x >= y,
                    }
            }
            (Self::Span { start, end: None }, Self::Tail(_)) => start <= 1,
            (Self::Tail(n), Self::Tail(m)) => n >= m,
            _ => false,
        }
    }
}

/// The lines of one file a read returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRead {
    pub path: String,
    pub lines: Lines,
}

impl FileRead {
    /// True when `self` (part of a later read) covers `earlier`.
    pub fn covers(&self, earlier: &FileRead) -> bool {
        self.path == earlier.path && self.lines.covers(earlier.lines)
    }
}

/// What one call read: one file, or several whole files (a multi-file read). Never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub files: Vec<FileRead>,
}

/// Recognises a read from a tool call's name and JSON arguments, given the read tools.
pub fn recognise(tools: &[ReadTool], name: &str, arguments: &str) -> Option<Read> {
    // The pass looks at every call of the history on every turn: only a read tool's
    // arguments are worth parsing.
    let tool = tools.iter().find(|t| name.eq_ignore_ascii_case(&t.name))?;
    let args: Value = serde_json::from_str(arguments).ok()?;
    let obj = args.as_object()?;
    if let Some(command) = &tool.command
        && obj.get("command").and_then(Value::as_str) != Some(command.as_str())
    {
        return None;
    }
    // A number the recogniser does not know may narrow what was read.
    let is_range = |k: &str| RANGE_FORMS.iter().any(|f| f.contains(&k));
    if obj.iter().any(|(k, v)| !is_range(k) && is_number(v)) {
        return None;
    }
    if let Some(key) = &tool.paths_arg {
        // Several whole files: a range argument makes it unclear.
        if RANGE_FORMS.iter().any(|f| present(obj, f)) {
            return None;
        }
        let files = obj
            .get(key)?
            .as_array()?
            .iter()
            .map(|p| {
                p.as_str().map(|path| FileRead {
                    path: path.to_string(),
                    lines: Lines::WHOLE,
                })
            })
            .collect::<Option<Vec<FileRead>>>()?;
        return (!files.is_empty()).then_some(Read { files });
    }
    let path = match &tool.path_arg {
        Some(key) => obj.get(key)?.as_str()?,
        None => PATH_KEYS
            .iter()
            .find_map(|k| obj.get(*k).and_then(Value::as_str))?,
    };
    Some(Read {
        files: vec![FileRead {
            path: path.to_string(),
            lines: lines(obj)?,
        }],
    })
}

/// True when a read's result holds no lines of the file (see the module comment).
fn read_failed(result: &str) -> bool {
    let Some(first) = result.lines().map(str::trim).find(|l| !l.is_empty()) else {
        return true;
    };
    let lower = first.to_ascii_lowercase();
    artifacts::is_error_start(first) || FAILED_READ.iter().any(|p| lower.contains(p))
}

fn is_number(v: &Value) -> bool {
    v.is_number() || v.as_array().is_some_and(|a| a.iter().any(Value::is_number))
}

/// An argument that is there (JSON `null` is the same as absent).
fn arg<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn present(obj: &Map<String, Value>, keys: &[&str]) -> bool {
    keys.iter().any(|k| arg(obj, k).is_some())
}

/// The lines a read's arguments ask for; `None` when they are unclear.
fn lines(obj: &Map<String, Value>) -> Option<Lines> {
    // `Some(None)`: absent; `None`: present but not a line number.
    let count = |k: &str| arg(obj, k).map_or(Some(None), |v| v.as_u64().map(Some));
    match RANGE_FORMS.iter().position(|f| present(obj, f)) {
        None => Some(Lines::WHOLE),
        Some(_) if RANGE_FORMS.iter().filter(|f| present(obj, f)).count() > 1 => None,
        Some(0) => match (count("head")?, count("tail")?) {
            (Some(n), None) => Some(Lines::Span {
                start: 1,
                end: Some(n),
            }),
            (None, Some(n)) => Some(Lines::Tail(n)),
            _ => None,
        },
        Some(1) => {
            let [start, end] = arg(obj, "view_range")?.as_array()?.as_slice() else {
                return None;
            };
            // `[start, -1]`: to the end of the file.
            let end = match end.as_i64()? {
                -1 => None,
                e => Some(u64::try_from(e).ok()?),
            };
            Some(Lines::Span {
                start: start.as_u64()?,
                end,
            })
        }
        Some(2) => match (count("offset")?, count("limit")?) {
            (Some(offset), limit) => Some(Lines::Span {
                start: offset,
                end: limit.map(|l| offset.saturating_add(l.saturating_sub(1))),
            }),
            (None, limit) => Some(Lines::Span {
                start: 1,
                end: limit,
            }),
        },
        Some(_) => {
            let mut start = None;
            for k in START_KEYS {
                start = start.or(count(k)?);
            }
            let mut end = None;
            for k in END_KEYS {
                end = end.or(count(k)?);
            }
            Some(Lines::Span {
                start: start.unwrap_or(1),
                end,
            })
        }
    }
}

fn stub(read: &Read, key: &Key) -> String {
    let what = match &read.files[..] {
        [one] => {
            let range = match one.lines {
                Lines::Span {
                    start,
                    end: Some(e),
                } => format!("lines {start}-{e}"),
                Lines::Span { start, end: None } if start > 1 => format!("lines {start}-end"),
                Lines::Span { .. } => "whole file".to_string(),
                Lines::Tail(n) => format!("last {n} lines"),
            };
            format!(
                "read of {} ({range}) superseded by a later read of the same lines",
                one.path
            )
        }
        many => {
            let paths: Vec<&str> = many.iter().map(|f| f.path.as_str()).collect();
            format!(
                "read of {} files ({}) superseded by later reads of the same files",
                many.len(),
                paths.join(", ")
            )
        }
    };
    format!(
        "{}earlier {what}; original: {}]",
        text::BANNER_PREFIX,
        key.marker()
    )
}

/// For each read, in order: whether later reads cover every file and line it read. One pass
/// from the newest read back, keeping per path only the later lines no other later read
/// covers (covering is containment, so a covered read adds nothing): linear in the number of
/// reads for the usual histories, instead of comparing every pair.
fn superseded(results: &[(usize, &Read)]) -> Vec<bool> {
    let mut later: HashMap<&str, Vec<Lines>> = HashMap::new();
    let mut out = vec![false; results.len()];
    for (n, (_, read)) in results.iter().enumerate().rev() {
        let covered = |f: &FileRead, later: &HashMap<&str, Vec<Lines>>| {
            later
                .get(f.path.as_str())
                .is_some_and(|kept| kept.iter().any(|l| l.covers(f.lines)))
        };
        if !read.files.is_empty() && read.files.iter().all(|f| covered(f, &later)) {
            out[n] = true;
            continue;
        }
        for f in &read.files {
            if !covered(f, &later) {
                let kept = later.entry(f.path.as_str()).or_default();
                kept.retain(|l| !f.lines.covers(*l));
                kept.push(f.lines);
            }
        }
    }
    out
}

/// Stubs earlier reads covered by later ones; the policy's `dedup.readTools` say which calls
/// read.
pub async fn dedup_reads(
    history: &mut [Message],
    policy: &EffectivePolicy,
    store: &dyn Store,
) -> PassReport {
    let mut report = PassReport::new(Pass::Dedup, Trigger::Turn, history::weight(history));
    let tools = &policy.dedup.read_tools;
    // Call id → the read it performed.
    let mut reads: HashMap<&str, Read> = HashMap::new();
    for m in history.iter() {
        for c in &m.tool_calls {
            if let Some(r) = recognise(tools, &c.name, &c.arguments) {
                reads.insert(c.id.as_str(), r);
            }
        }
    }
    if reads.len() < 2 {
        return report;
    }
    // Results of reads that returned lines, in history order.
    let results: Vec<(usize, &Read)> = history
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Tool && !read_failed(&m.content))
        .filter_map(|(i, m)| Some((i, reads.get(m.tool_call_id.as_deref()?)?)))
        .collect();
    let superseded = superseded(&results);
    let mut edits: Vec<(usize, &Read)> = Vec::new();
    let mut originals: Vec<Archivable<'_>> = Vec::new();
    // Stubs have the same length whatever the key.
    let placeholder = Key::of(b"");
    for ((i, read), _) in results.iter().zip(&superseded).filter(|(_, s)| **s) {
        let m = &history[*i];
        if m.meta.preserve_verbatim
            || m.meta.is_summary
            || m.content.is_empty()
            || text::keeping_errors(stub(read, &placeholder), m).is_none()
        {
            continue;
        }
        // Content quoting a marker cannot be archived; the scan's proof goes to the store.
        if let Ok(original) = Archivable::check(m.content.as_bytes()) {
            edits.push((*i, *read));
            originals.push(original);
        }
    }
    if edits.is_empty() {
        return report;
    }
    let keys = match archive_all_checked(store, &originals).await {
        Ok(keys) => keys,
        Err(e) => {
            report.archive_error = Some(e.label());
            return report;
        }
    };
    report.archived = distinct(&keys);
    let staged: Vec<(usize, String, Key)> = edits
        .iter()
        .zip(&keys)
        .filter_map(|((i, read), key)| {
            Some((
                *i,
                text::keeping_errors(stub(read, key), &history[*i])?,
                *key,
            ))
        })
        .collect();
    let snapshot = super::probe::Snapshot::of(history);
    for (i, content, key) in staged {
        let m = &mut history[i];
        super::ledger::note_cut(m);
        m.content = content;
        note_archived(m, &key);
        report.changed += 1;
    }
    report.bytes_after = history::weight(history);
    super::probe::grade_pass(&mut report, &snapshot, history);
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::MemoryStore;
    use crate::history::ToolCall;
    use proptest::prelude::*;

    fn lines() -> impl Strategy<Value = Lines> {
        prop_oneof![
            (0..6u64, proptest::option::of(0..8u64)).prop_map(|(start, len)| Lines::Span {
                start,
                end: len.map(|l| start + l),
            }),
            (0..6u64).prop_map(Lines::Tail),
        ]
    }

    proptest! {
        #[test]
        fn superseded_matches_the_pairwise_definition(
            reads in proptest::collection::vec(
                proptest::collection::vec((0..3usize, lines()), 1..4),
                0..40,
            )
        ) {
            let reads: Vec<Read> = reads
                .into_iter()
                .map(|files| Read {
                    files: files
                        .into_iter()
                        .map(|(p, lines)| FileRead { path: format!("f{p}"), lines })
                        .collect(),
                })
                .collect();
            let results: Vec<(usize, &Read)> = reads.iter().enumerate().collect();
            // A read is superseded when every file and line it read is covered by one later
            // read's part.
            let naive: Vec<bool> = (0..reads.len())
                .map(|n| {
                    reads[n].files.iter().all(|f| {
                        reads[n + 1..].iter().any(|l| l.files.iter().any(|g| g.covers(f)))
                    })
                })
                .collect();
            prop_assert_eq!(superseded(&results), naive);
        }
    }

    fn read(id: &str, name: &str, args: &str, out: &str) -> Vec<Message> {
        vec![
            Message::assistant_calls(
                "",
                vec![ToolCall {
                    id: id.into(),
                    name: name.into(),
                    arguments: args.into(),
                }],
            ),
            Message::tool(id, out),
        ]
    }

    async fn dedup(h: &mut [Message], store: &dyn Store) -> PassReport {
        dedup_reads(h, &EffectivePolicy::default(), store).await
    }

    fn recognised(name: &str, args: &str) -> Option<Vec<(String, Lines)>> {
        recognise(&EffectivePolicy::default().dedup.read_tools, name, args)
            .map(|r| r.files.into_iter().map(|f| (f.path, f.lines)).collect())
    }

    fn one(name: &str, args: &str) -> Option<Lines> {
        match recognised(name, args)?.as_slice() {
            [(_, lines)] => Some(*lines),
            _ => None,
        }
    }

    fn span(start: u64, end: Option<u64>) -> Lines {
        Lines::Span { start, end }
    }

    #[test]
    fn recognises_common_shapes() {
        assert_eq!(
            one("Read", r#"{"file_path":"/a.rs","offset":10,"limit":20}"#),
            Some(span(10, Some(29)))
        );
        assert_eq!(
            one(
                "str_replace_based_edit_tool",
                r#"{"command":"view","path":"a.rs","view_range":[5,-1]}"#,
            ),
            Some(span(5, None))
        );
        assert_eq!(
            one(
                "str_replace_editor",
                r#"{"command":"view","path":"a.rs","view_range":[5,9]}"#,
            ),
            Some(span(5, Some(9)))
        );
        assert!(
            recognised(
                "str_replace_based_edit_tool",
                r#"{"command":"create","path":"a"}"#
            )
            .is_none()
        );
        assert!(recognised("bash", r#"{"command":"cat a.rs"}"#).is_none());
        assert_eq!(one("read_file", r#"{"path":"a.rs"}"#), Some(Lines::WHOLE));
        assert_eq!(
            one(
                "read_file",
                r#"{"path":"a.rs","start_line":3,"end_line":7}"#
            ),
            Some(span(3, Some(7)))
        );
    }

    #[test]
    fn recognises_the_filesystem_servers_ranges_and_multi_file_reads() {
        assert_eq!(
            one("read_text_file", r#"{"path":"a.rs","head":10}"#),
            Some(span(1, Some(10)))
        );
        assert_eq!(
            one("read_text_file", r#"{"path":"a.rs","tail":5}"#),
            Some(Lines::Tail(5))
        );
        assert_eq!(
            one("read_text_file", r#"{"path":"a.rs","head":null}"#),
            Some(Lines::WHOLE),
            "null is absent"
        );
        assert_eq!(
            recognised("read_multiple_files", r#"{"paths":["a.rs","b.rs"]}"#),
            Some(vec![
                ("a.rs".into(), Lines::WHOLE),
                ("b.rs".into(), Lines::WHOLE)
            ])
        );
        // Unclear: not a read.
        for (name, args) in [
            ("read_text_file", r#"{"path":"a.rs","head":10,"tail":5}"#),
            ("read_text_file", r#"{"path":"a.rs","head":"10"}"#),
            ("read_text_file", r#"{"path":"a.rs","head":-1}"#),
            ("read_text_file", r#"{"path":"a.rs","head":10,"offset":3}"#),
            ("read_file", r#"{"path":"a.rs","offset":3,"start_line":1}"#),
            ("read_file", r#"{"path":"a.rs","max_lines":40}"#),
            ("read_file", r#"{"path":"a.rs","lines":[1,40]}"#),
            (
                "str_replace_based_edit_tool",
                r#"{"command":"view","path":"a.rs","view_range":[5]}"#,
            ),
            ("read_multiple_files", r#"{"paths":[]}"#),
            ("read_multiple_files", r#"{"paths":["a.rs",3]}"#),
            ("read_multiple_files", r#"{"paths":["a.rs"],"head":3}"#),
            ("read_media_file", r#"{"path":"a.png"}"#),
        ] {
            assert!(recognised(name, args).is_none(), "{name} {args}");
        }
    }

    #[test]
    fn covering_is_transitive() {
        // The one-pass algorithm forgets a read covered by a kept one.
        let mut all = Vec::new();
        for start in 0..4 {
            all.push(Lines::Span { start, end: None });
            all.extend((start..start + 4).map(|e| Lines::Span {
                start,
                end: Some(e),
            }));
            all.push(Lines::Tail(start));
        }
        for a in &all {
            for b in all.iter().filter(|b| a.covers(**b)) {
                for c in all.iter().filter(|c| b.covers(**c)) {
                    assert!(a.covers(*c), "{a:?} {b:?} {c:?}");
                }
            }
        }
    }

    #[test]
    fn covering_rules() {
        let head = |n| span(1, Some(n));
        assert!(Lines::WHOLE.covers(head(10)));
        assert!(Lines::WHOLE.covers(Lines::Tail(10)));
        assert!(!head(10).covers(Lines::WHOLE));
        assert!(head(10).covers(head(10)) && head(10).covers(head(4)));
        assert!(!head(4).covers(head(10)));
        assert!(head(10).covers(span(3, Some(7))));
        assert!(Lines::Tail(10).covers(Lines::Tail(10)) && Lines::Tail(10).covers(Lines::Tail(3)));
        assert!(!Lines::Tail(3).covers(Lines::Tail(10)));
        assert!(!Lines::Tail(1_000).covers(head(1)));
        assert!(!head(1_000).covers(Lines::Tail(1)));
        assert!(!span(2, None).covers(Lines::Tail(1)));
    }

    #[tokio::test]
    async fn earlier_covered_read_becomes_stub_newest_stays() {
        let store = MemoryStore::new();
        let body = "fn a() {}\n".repeat(50);
        let mut h = vec![Message::user("go")];
        h.extend(read(
            "1",
            "read_file",
            r#"{"path":"a.rs","start_line":1,"end_line":20}"#,
            &body,
        ));
        h.extend(read("2", "read_file", r#"{"path":"b.rs"}"#, &body));
        h.extend(read("3", "read_file", r#"{"path":"a.rs"}"#, &body));
        let r = dedup(&mut h, &store).await;
        assert_eq!(r.changed, 1);
        assert!(h[2].content.contains("earlier read of a.rs"));
        assert_eq!(h[4].content, body);
        assert_eq!(h[6].content, body);
        let key = Key::parse(&h[2].meta.archived[0]).expect("key");
        assert_eq!(
            store.fetch(&key).await.expect("ok"),
            Some(body.into_bytes())
        );
        let again = dedup(&mut h, &store).await;
        assert!(!again.is_change());
    }

    #[tokio::test]
    async fn a_head_read_does_not_supersede_a_whole_read_and_a_later_whole_read_supersedes_both() {
        let store = MemoryStore::new();
        // Ten lines are longer than a stub.
        let body = "fn a_function_with_a_longer_name() { call(1, 2, 3); }\n".repeat(50);
        let head: String = body.lines().take(10).map(|l| format!("{l}\n")).collect();
        let mut h = vec![Message::user("go")];
        h.extend(read("1", "read_text_file", r#"{"path":"a.rs"}"#, &body));
        h.extend(read(
            "2",
            "read_text_file",
            r#"{"path":"a.rs","head":10}"#,
            &head,
        ));
        let r = dedup(&mut h, &store).await;
        assert!(!r.is_change(), "{r:?}");
        assert_eq!(
            (h[2].content.as_str(), h[4].content.as_str()),
            (body.as_str(), head.as_str())
        );

        h.extend(read(
            "3",
            "read_text_file",
            r#"{"path":"a.rs","tail":5}"#,
            &head,
        ));
        assert!(
            !dedup(&mut h, &store).await.is_change(),
            "a tail covers no head"
        );

        h.extend(read("4", "read_text_file", r#"{"path":"a.rs"}"#, &body));
        let r = dedup(&mut h, &store).await;
        assert_eq!(r.changed, 3);
        assert!(
            h[2].content.contains("earlier read of a.rs (whole file)"),
            "{}",
            h[2].content
        );
        assert!(
            h[4].content.contains("earlier read of a.rs (lines 1-10)"),
            "{}",
            h[4].content
        );
        assert!(
            h[6].content.contains("earlier read of a.rs (last 5 lines)"),
            "{}",
            h[6].content
        );
        assert_eq!(h[8].content, body);
    }

    #[tokio::test]
    async fn a_multi_file_read_is_superseded_only_once_every_file_is_read_again() {
        let store = MemoryStore::new();
        let body = "fn a() {}\n".repeat(50);
        let mut h = vec![Message::user("go")];
        h.extend(read("1", "read_text_file", r#"{"path":"a.rs"}"#, &body));
        h.extend(read(
            "2",
            "read_multiple_files",
            r#"{"paths":["a.rs","b.rs"]}"#,
            &body,
        ));
        h.extend(read("3", "read_text_file", r#"{"path":"a.rs"}"#, &body));
        let r = dedup(&mut h, &store).await;
        assert_eq!(r.changed, 1, "the first read of a.rs only");
        assert!(h[2].content.contains("earlier read of a.rs (whole file)"));
        assert_eq!(h[4].content, body, "b.rs was not read again");

        h.extend(read(
            "4",
            "read_text_file",
            r#"{"path":"b.rs","head":3}"#,
            &body,
        ));
        assert!(
            !dedup(&mut h, &store).await.is_change(),
            "b.rs only in part"
        );

        h.extend(read("5", "read_text_file", r#"{"path":"b.rs"}"#, &body));
        let r = dedup(&mut h, &store).await;
        assert_eq!(r.changed, 2);
        assert!(
            h[4].content
                .contains("earlier read of 2 files (a.rs, b.rs)"),
            "{}",
            h[4].content
        );
        assert!(h[8].content.contains("earlier read of b.rs (lines 1-3)"));
    }

    /// Failed reads as real tools answer them: `@modelcontextprotocol/server-filesystem`
    /// 2026.8.31's `read_text_file` (its `isError` results) for a missing file and for a path
    /// outside its allowed directory, and GNU `cat` run as an unprivileged user on a file mode
    /// 000.
    const FAILED_READS: [&str; 3] = [
        "ENOENT: no such file or directory, open '/tmp/fs/allowed/gone.rs'",
        "Access denied - path outside allowed directories: /etc/hostname not in /tmp/fs/allowed",
        "cat: /tmp/fs/allowed/locked.rs: Permission denied",
    ];

    #[test]
    fn a_failed_read_is_recognised_by_its_first_line() {
        for failed in FAILED_READS {
            assert!(read_failed(failed), "{failed}");
        }
        assert!(read_failed(""), "nothing returned");
        assert!(read_failed("\n  \n"), "nothing returned");
        assert!(read_failed(
            "Error: EISDIR: illegal operation on a directory, read"
        ));
        // A file's later lines may say anything.
        let source =
            "fn main() {\n    println!(\"hello\");\n}\n// error: No such file or directory\n";
        assert!(!read_failed(source));
    }

    #[tokio::test]
    async fn a_later_failed_read_supersedes_nothing() {
        let store = MemoryStore::new();
        let body = "fn a() {}\n".repeat(50);
        let mut h = vec![Message::user("go")];
        h.extend(read("1", "read_text_file", r#"{"path":"a.rs"}"#, &body));
        for (n, failed) in FAILED_READS.iter().enumerate() {
            h.extend(read(
                &format!("f{n}"),
                "read_text_file",
                r#"{"path":"a.rs"}"#,
                failed,
            ));
        }
        h.extend(read("e", "read_text_file", r#"{"path":"a.rs"}"#, ""));
        let r = dedup(&mut h, &store).await;
        assert!(!r.is_change(), "{r:?}");
        assert_eq!(h[2].content, body, "the only lines of a.rs the model has");

        // A later read that returned the file supersedes the first; the failures stay as
        // they are (they hold no lines to cover).
        h.extend(read("2", "read_text_file", r#"{"path":"a.rs"}"#, &body));
        let r = dedup(&mut h, &store).await;
        assert_eq!(r.changed, 1, "{r:?}");
        assert!(
            h[2].content.contains("earlier read of a.rs"),
            "{}",
            h[2].content
        );
        for (n, failed) in FAILED_READS.iter().enumerate() {
            assert_eq!(h[4 + 2 * n].content, *failed);
        }
        assert_eq!(h[12].content, body);
    }

    #[tokio::test]
    async fn the_policy_names_the_read_tools() {
        let store = MemoryStore::new();
        let body = "fn a() {}\n".repeat(50);
        let mut h = vec![Message::user("go")];
        h.extend(read("1", "fetch_source", r#"{"file":"a.rs"}"#, &body));
        h.extend(read("2", "fetch_source", r#"{"file":"a.rs"}"#, &body));
        assert!(
            !dedup(&mut h, &store).await.is_change(),
            "not a read tool by default"
        );
        let mut policy = EffectivePolicy::default();
        policy.dedup.read_tools = vec![ReadTool {
            name: "fetch_source".into(),
            path_arg: Some("file".into()),
            paths_arg: None,
            command: None,
        }];
        h.extend(read("3", "read_text_file", r#"{"path":"a.rs"}"#, &body));
        let r = dedup_reads(&mut h, &policy, &store).await;
        assert_eq!(r.changed, 1, "read_text_file is no longer listed");
        assert!(h[2].content.contains("earlier read of a.rs (whole file)"));
        assert_eq!(
            (h[4].content.as_str(), h[6].content.as_str()),
            (body.as_str(), body.as_str())
        );
        policy.dedup.read_tools.clear();
        h.extend(read("4", "fetch_source", r#"{"file":"a.rs"}"#, &body));
        assert!(
            !dedup_reads(&mut h, &policy, &store).await.is_change(),
            "off"
        );
    }
}
