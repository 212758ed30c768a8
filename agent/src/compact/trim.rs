//! Level 1: trimming without any LLM. Outside the protected recent tail: reasoning blocks of
//! assistant messages are stripped, tool outputs shrink to head+tail previews (previews to
//! stubs), and an error output repeated verbatim collapses to a reference to its first
//! occurrence. System messages, summaries, verbatim messages and user messages are never
//! touched. Every original is archived first.

use std::collections::HashSet;

use cairn_crds::EffectivePolicy;

use crate::ccr::{Key, Store, extract_markers, has_marker};
use crate::history::{self, Message, Role};

use super::archive::{archive_all, note_archived};
use super::text;
use super::{Pass, PassReport, Trigger};

/// Index of the first message of the protected tail: the last `keep` non-system messages.
pub fn tail_start(history: &[Message], keep: usize) -> usize {
    let mut seen = 0;
    for (i, m) in history.iter().enumerate().rev() {
        if !m.is_system() {
            seen += 1;
            if seen >= keep {
                return i;
            }
        }
    }
    0
}

enum Field {
    Content,
    Reasoning,
}

struct Edit {
    index: usize,
    field: Field,
    original: Option<String>,
    new: Option<String>,
    key: Key,
}

pub async fn trim(
    history: &mut [Message],
    policy: &EffectivePolicy,
    trigger: Trigger,
    store: &dyn Store,
) -> PassReport {
    let mut report = PassReport::new(Pass::Trim, trigger, history::weight(history));
    let protect_from = tail_start(history, policy.min_keep_recent as usize);
    let mc = &policy.microcompact;
    let mut edits: Vec<Edit> = Vec::new();
    let mut seen_errors: HashSet<&str> = HashSet::new();
    for (i, m) in history.iter().enumerate().take(protect_from) {
        if m.is_system() || m.meta.preserve_verbatim || m.meta.is_summary {
            continue;
        }
        match m.role {
            Role::Assistant => {
                if let Some(r) = &m.reasoning
                    && !r.is_empty()
                    && !has_marker(r)
                {
                    edits.push(Edit {
                        index: i,
                        field: Field::Reasoning,
                        original: Some(r.clone()),
                        new: None,
                        key: Key::of(r.as_bytes()),
                    });
                }
            }
            Role::Tool => {
                let c = &m.content;
                if text::is_ours(c) {
                    if c.contains(" omitted; full original: ")
                        && let (Some(key), Some(st)) =
                            (extract_markers(c).first().copied(), text::parse_stats(c))
                    {
                        edits.push(Edit {
                            index: i,
                            field: Field::Content,
                            original: None,
                            new: Some(text::stub("tool result", st, &key)),
                            key,
                        });
                    }
                    continue;
                }
                if has_marker(c) || c.is_empty() {
                    continue;
                }
                let key = Key::of(c.as_bytes());
                if looks_like_error(c) && !seen_errors.insert(c.as_str()) {
                    let new = format!(
                        "{}same error output as an earlier tool result ({} chars); original: {}]",
                        text::BANNER_PREFIX,
                        c.len(),
                        key.marker()
                    );
                    if new.len() < c.len() {
                        edits.push(Edit {
                            index: i,
                            field: Field::Content,
                            original: Some(c.clone()),
                            new: Some(new),
                            key,
                        });
                    }
                    continue;
                }
                if c.len() >= mc.min_content_chars as usize
                    && let Some(p) =
                        text::preview(c, mc.head_chars as usize, mc.tail_chars as usize, &key)
                {
                    edits.push(Edit {
                        index: i,
                        field: Field::Content,
                        original: Some(c.clone()),
                        new: Some(p),
                        key,
                    });
                }
            }
            _ => {}
        }
    }
    if edits.is_empty() {
        return report;
    }
    let originals: Vec<&[u8]> = edits
        .iter()
        .filter_map(|e| e.original.as_deref().map(str::as_bytes))
        .collect();
    match archive_all(store, &originals).await {
        Ok(keys) => report.archived = keys,
        Err(e) => {
            report.archive_error = Some(e.label());
            return report;
        }
    }
    for e in edits {
        let m = &mut history[e.index];
        match e.field {
            Field::Reasoning => m.reasoning = e.new,
            Field::Content => m.content = e.new.unwrap_or_default(),
        }
        note_archived(m, &e.key);
        report.changed += 1;
    }
    report.bytes_after = history::weight(history);
    report
}

/// Error output, by its first lines (tool errors repeat verbatim when a model retries).
fn looks_like_error(s: &str) -> bool {
    let head = s[..text::floor_boundary(s, 512)].to_ascii_lowercase();
    head.starts_with("error")
        || head.contains("traceback (most recent call last)")
        || head.contains("exit code")
        || head.contains("exception")
        || head.contains("failed")
        || head.contains("panicked at")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::MemoryStore;
    use crate::history::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "bash".into(),
            arguments: "{}".into(),
        }
    }

    #[tokio::test]
    async fn trims_old_part_only_and_leaves_protected_kinds() {
        let store = MemoryStore::new();
        let policy = EffectivePolicy {
            min_keep_recent: 2,
            ..EffectivePolicy::default()
        };
        let big: String = "log line\n".repeat(2_000);
        let err = "error: cannot find value `x` in this scope\n".repeat(3);
        let mut with_reasoning =
            Message::assistant_calls("", vec![call("a"), call("b"), call("c")]);
        with_reasoning.reasoning = Some("thinking hard".repeat(20));
        let mut verbatim = Message::user("recalled".repeat(1000));
        verbatim.meta.preserve_verbatim = true;
        let mut h = vec![
            Message::system("sys".repeat(2000)),
            Message::user("u".repeat(5000)),
            with_reasoning,
            Message::tool("a", big.clone()),
            Message::tool("b", err.clone()),
            Message::tool("c", err.clone()),
            verbatim.clone(),
            Message::assistant("recent"),
            Message::user("recent too"),
        ];
        let before = h.clone();
        let r = trim(&mut h, &policy, Trigger::Auto, &store).await;
        assert_eq!(h[0], before[0]);
        assert_eq!(h[1], before[1]);
        assert_eq!(h[2].reasoning, None);
        assert!(h[3].content.contains("omitted; full original"));
        assert_eq!(h[4].content, err, "first occurrence kept");
        assert!(h[5].content.contains("same error output"));
        assert_eq!(h[6], verbatim);
        assert_eq!(h[7..], before[7..]);
        assert_eq!(r.changed, 3);
        assert!(r.bytes_after < r.bytes_before);
    }
}
