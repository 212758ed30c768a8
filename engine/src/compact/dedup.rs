//! Repeated reads: an earlier read of a file whose line range a later read covers becomes a
//! stub with a recall marker. Reads are recognised from the tool call (name, path argument,
//! range arguments), never from one client's text markers. The newest read, verbatim
//! messages and summaries are never touched.

use std::collections::HashMap;

use crate::ccr::{Archivable, Key, Store};
use crate::history::{self, Message, Role};

use super::archive::{archive_all_checked, distinct, note_archived};
use super::{Pass, PassReport, Trigger, text};

/// Tool names that read a file (compared case-insensitively).
const READ_TOOLS: [&str; 10] = [
    "read_file",
    "read",
    "readfile",
    "file_read",
    "view",
    "view_file",
    "open_file",
    "cat",
    "get_file_contents",
    "read_text_file",
];
/// Editor tools that read when their `command` is `view`.
const EDITOR_TOOLS: [&str; 2] = ["str_replace_based_edit_tool", "str_replace_editor"];
const PATH_KEYS: [&str; 7] = [
    "path",
    "file_path",
    "filePath",
    "filename",
    "file",
    "target_file",
    "absolute_path",
];

/// A file read: path and inclusive line range (`end == None`: to the end of the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub path: String,
    pub start: u64,
    pub end: Option<u64>,
}

impl Read {
    /// True when `self` (a later read) covers every line of `earlier`.
    pub fn covers(&self, earlier: &Read) -> bool {
        self.path == earlier.path
            && self.start <= earlier.start
            && match (self.end, earlier.end) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(a), Some(b)) => a >= b,
            }
    }
}

/// Recognises a read from a tool call's name and JSON arguments.
pub fn recognise(name: &str, arguments: &str) -> Option<Read> {
    let named = |tools: &[&str]| tools.iter().any(|t| name.eq_ignore_ascii_case(t));
    // The pass looks at every call of the history on every turn: only a read tool's
    // arguments are worth parsing.
    let (read_tool, editor) = (named(&READ_TOOLS), named(&EDITOR_TOOLS));
    if !read_tool && !editor {
        return None;
    }
    let args: serde_json::Value = serde_json::from_str(arguments).ok()?;
    let obj = args.as_object()?;
    if !read_tool && obj.get("command").and_then(|c| c.as_str()) != Some("view") {
        return None;
    }
    let path = PATH_KEYS
        .iter()
        .find_map(|k| obj.get(*k).and_then(|v| v.as_str()))?
        .to_string();
    let num = |k: &str| obj.get(k).and_then(serde_json::Value::as_u64);
    let (start, end) = if let Some(r) = obj.get("view_range").and_then(|v| v.as_array()) {
        let a = r.first().and_then(serde_json::Value::as_u64).unwrap_or(1);
        let b = r.get(1).and_then(serde_json::Value::as_i64).unwrap_or(-1);
        (a, u64::try_from(b).ok())
    } else if let Some(offset) = num("offset") {
        (offset, num("limit").map(|l| offset + l.saturating_sub(1)))
    } else if obj.contains_key("limit") {
        (1, num("limit"))
    } else {
        let start = ["start_line", "line_start", "startLine", "start"]
            .iter()
            .find_map(|k| num(k))
            .unwrap_or(1);
        let end = ["end_line", "line_end", "endLine", "end"]
            .iter()
            .find_map(|k| num(k));
        (start, end)
    };
    Some(Read { path, start, end })
}

fn stub(read: &Read, key: &Key) -> String {
    let range = match read.end {
        Some(e) => format!("lines {}-{e}", read.start),
        None if read.start > 1 => format!("lines {}-end", read.start),
        None => "whole file".to_string(),
    };
    format!(
        "{}earlier read of {} ({range}) superseded by a later read of the same lines; original: {}]",
        text::BANNER_PREFIX,
        read.path,
        key.marker()
    )
}

/// For each read, in order: whether a later read covers it. One pass from the newest read
/// back, keeping per path only the later reads no other later read covers (covering is
/// containment, so a covered read adds nothing): linear in the number of reads for the usual
/// histories, instead of comparing every pair.
fn superseded(results: &[(usize, &Read)]) -> Vec<bool> {
    let mut later: HashMap<&str, Vec<&Read>> = HashMap::new();
    let mut out = vec![false; results.len()];
    for (n, (_, read)) in results.iter().enumerate().rev() {
        let kept = later.entry(read.path.as_str()).or_default();
        if kept.iter().any(|l| l.covers(read)) {
            out[n] = true;
        } else {
            kept.retain(|l| !read.covers(l));
            kept.push(read);
        }
    }
    out
}

/// Stubs earlier reads covered by later ones.
pub async fn dedup_reads(history: &mut [Message], store: &dyn Store) -> PassReport {
    let mut report = PassReport::new(Pass::Dedup, Trigger::Turn, history::weight(history));
    // Call id → the read it performed.
    let mut reads: HashMap<&str, Read> = HashMap::new();
    for m in history.iter() {
        for c in &m.tool_calls {
            if let Some(r) = recognise(&c.name, &c.arguments) {
                reads.insert(c.id.as_str(), r);
            }
        }
    }
    if reads.len() < 2 {
        return report;
    }
    // Results of reads, in history order.
    let results: Vec<(usize, &Read)> = history
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Tool)
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
            || stub(read, &placeholder).len() >= m.content.len()
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
        .map(|((i, read), key)| (*i, stub(read, key), *key))
        .collect();
    for (i, content, key) in staged {
        let m = &mut history[i];
        m.content = content;
        note_archived(m, &key);
        report.changed += 1;
    }
    report.bytes_after = history::weight(history);
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::MemoryStore;
    use crate::history::ToolCall;

    proptest::proptest! {
        #[test]
        fn superseded_matches_the_pairwise_definition(
            reads in proptest::collection::vec(
                (0..3usize, 1..6u64, proptest::option::of(0..8u64)),
                0..40,
            )
        ) {
            let reads: Vec<Read> = reads
                .into_iter()
                .map(|(p, start, len)| Read {
                    path: format!("f{p}"),
                    start,
                    end: len.map(|l| start + l),
                })
                .collect();
            let results: Vec<(usize, &Read)> = reads.iter().enumerate().collect();
            let naive: Vec<bool> = (0..reads.len())
                .map(|n| reads[n + 1..].iter().any(|l| l.covers(&reads[n])))
                .collect();
            proptest::prop_assert_eq!(superseded(&results), naive);
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

    #[test]
    fn recognises_common_shapes() {
        let r = recognise("Read", r#"{"file_path":"/a.rs","offset":10,"limit":20}"#).expect("read");
        assert_eq!((r.start, r.end), (10, Some(29)));
        let r = recognise(
            "str_replace_based_edit_tool",
            r#"{"command":"view","path":"a.rs","view_range":[5,-1]}"#,
        )
        .expect("read");
        assert_eq!((r.start, r.end), (5, None));
        assert!(
            recognise(
                "str_replace_based_edit_tool",
                r#"{"command":"create","path":"a"}"#
            )
            .is_none()
        );
        assert!(recognise("bash", r#"{"command":"cat a.rs"}"#).is_none());
        let whole = recognise("read_file", r#"{"path":"a.rs"}"#).expect("read");
        assert!(whole.covers(&r));
        assert!(!r.covers(&whole));
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
        let r = dedup_reads(&mut h, &store).await;
        assert_eq!(r.changed, 1);
        assert!(h[2].content.contains("earlier read of a.rs"));
        assert_eq!(h[4].content, body);
        assert_eq!(h[6].content, body);
        let key = Key::parse(&h[2].meta.archived[0]).expect("key");
        assert_eq!(
            store.fetch(&key).await.expect("ok"),
            Some(body.into_bytes())
        );
        let again = dedup_reads(&mut h, &store).await;
        assert!(!again.is_change());
    }
}
