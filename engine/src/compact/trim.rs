//! Level 1: trimming without any LLM. Outside the protected recent tail: reasoning blocks of
//! assistant messages are stripped, tool outputs shrink to head+tail previews (previews to
//! stubs), and an error output repeated verbatim collapses to a reference to its first
//! occurrence. System messages, summaries, verbatim messages and user messages are never
//! touched. Every original is archived first.

use std::collections::HashSet;

use cairn_crds::EffectivePolicy;

use crate::ccr::{Key, Store, extract_markers};
use crate::history::{self, Message, Role};

use super::archive::{archive_all, distinct, note_archived};
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

/// What becomes of a staged message once its original is archived.
enum Render {
    StripReasoning,
    Preview,
    SameError,
    /// A preview promoted to a stub: already archived under `key`.
    Ready {
        content: String,
        key: Key,
    },
}

struct Edit {
    index: usize,
    render: Render,
}

impl Edit {
    fn original<'a>(&self, history: &'a [Message]) -> Option<&'a [u8]> {
        let m = &history[self.index];
        match self.render {
            Render::StripReasoning => m.reasoning.as_deref().map(str::as_bytes),
            Render::Preview | Render::SameError => Some(m.content.as_bytes()),
            Render::Ready { .. } => None,
        }
    }
}

/// Room a banner needs besides the kept text.
const BANNER_ROOM: usize = 160;

pub async fn trim(
    history: &mut [Message],
    policy: &EffectivePolicy,
    trigger: Trigger,
    store: &dyn Store,
) -> PassReport {
    let mut report = PassReport::new(Pass::Trim, trigger, history::weight(history));
    let protect_from = tail_start(history, policy.min_keep_recent as usize);
    let mc = &policy.microcompact;
    let (head_chars, tail_chars) = (mc.head_chars as usize, mc.tail_chars as usize);
    let mut edits: Vec<Edit> = Vec::new();
    let mut seen_errors: HashSet<&str> = HashSet::new();
    // Banners have the same length whatever the key.
    let placeholder = Key::of(b"");
    for (i, m) in history.iter().enumerate().take(protect_from) {
        if m.is_system() || m.meta.preserve_verbatim || m.meta.is_summary {
            continue;
        }
        match m.role {
            Role::Assistant => {
                if let Some(r) = &m.reasoning
                    && !r.is_empty()
                    && !text::quotes_marker(r)
                {
                    edits.push(Edit {
                        index: i,
                        render: Render::StripReasoning,
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
                            render: Render::Ready {
                                content: text::stub("tool result", st, &key),
                                key,
                            },
                        });
                    }
                    continue;
                }
                if text::quotes_marker(c) || c.is_empty() {
                    continue;
                }
                if looks_like_error(c) && !seen_errors.insert(c.as_str()) {
                    if text::keeping_errors(same_error(c.len(), &placeholder), m).is_some() {
                        edits.push(Edit {
                            index: i,
                            render: Render::SameError,
                        });
                    }
                    continue;
                }
                if c.len() >= mc.min_content_chars as usize
                    && c.len() > head_chars + tail_chars + BANNER_ROOM
                {
                    edits.push(Edit {
                        index: i,
                        render: Render::Preview,
                    });
                }
            }
            _ => {}
        }
    }
    if edits.is_empty() {
        return report;
    }
    let originals: Vec<&[u8]> = edits.iter().filter_map(|e| e.original(history)).collect();
    let keys = match archive_all(store, &originals).await {
        Ok(keys) => keys,
        Err(e) => {
            report.archive_error = Some(e.label());
            return report;
        }
    };
    report.archived = distinct(&keys);
    let mut keys = keys.into_iter();
    for e in edits {
        let m = &mut history[e.index];
        let key = match &e.render {
            Render::Ready { key, .. } => *key,
            _ => match keys.next() {
                Some(k) => k,
                None => break,
            },
        };
        let content = match e.render {
            Render::StripReasoning => None,
            Render::Ready { content, .. } => Some(content),
            Render::Preview => text::preview(&m.content, head_chars, tail_chars, &key),
            Render::SameError => Some(same_error(m.content.len(), &key)),
        };
        super::ledger::note_cut(m);
        match content {
            None if m.role == Role::Assistant => m.reasoning = None,
            None => continue,
            Some(c) => match text::keeping_errors(c, m) {
                Some(c) => m.content = c,
                None => continue,
            },
        }
        note_archived(m, &key);
        report.changed += 1;
    }
    report.bytes_after = history::weight(history);
    report
}

fn same_error(len: usize, key: &Key) -> String {
    format!(
        "{}same error output as an earlier tool result ({len} chars); original: {}]",
        text::BANNER_PREFIX,
        key.marker()
    )
}

/// Error output, by its first lines (tool errors repeat verbatim when a model retries).
fn looks_like_error(s: &str) -> bool {
    let head = s[..crate::utf8::floor_boundary(s, 512)].to_ascii_lowercase();
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
        let err = "error: cannot find value `x` in this scope\n".repeat(8);
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
        assert!(
            h[5].content
                .contains("error: cannot find value `x` in this scope")
        );
        assert_eq!(r.changed, 3);
        assert!(r.bytes_after < r.bytes_before);
    }
}
