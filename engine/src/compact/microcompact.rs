//! Microcompaction: old tool results shrink without any LLM call.
//!
//! Age is counted in assistant turns after the result. At `truncateAfterTurns` a result of at
//! least `minContentChars` becomes a head+tail preview with an omission banner; at
//! `summarizeAfterTurns` it becomes a one-line typed stub. The original is archived first; a
//! preview promoted to a stub keeps the key its banner already carries. A second run over the
//! same history changes nothing.
//!
//! The idle rule: after `idleMinutes` without an assistant message (the provider's prompt
//! cache has expired, so rewriting old results costs nothing extra), every tool result but
//! the [`IDLE_KEEP_RECENT`] most recent becomes a stub.

use std::time::Duration;

use cairn_crds::EffectivePolicy;

use crate::ccr::{Archivable, Key, Store, extract_markers};
use crate::history::{self, Message, Role};

use super::archive::{archive_all_checked, distinct, note_archived};
use super::text::{self, Stats};
use super::{Pass, PassReport, Trigger, probe};

/// Tool results the idle rule leaves alone.
pub const IDLE_KEEP_RECENT: usize = 5;

/// Price of a cache read and of a cache write as multiples of the input price: Anthropic's
/// (and Bedrock Claude's) 5-minute cache, the dearest rebuild among the providers (OpenAI and
/// Gemini charge no write premium and read at 0.1–0.5×).
pub const CACHE_READ_RATIO: f64 = 0.1;
pub const CACHE_WRITE_RATIO: f64 = 1.25;

/// Whether rewriting the history from position `from` on pays for the prompt-cache rebuild
/// it causes. The rewrite saves `saved` bytes on each of the next `horizon` requests, read
/// from the cache at [`CACHE_READ_RATIO`]; the next request writes the `suffix` bytes from
/// `from` on (as rewritten) to the cache at [`CACHE_WRITE_RATIO`] instead of reading them.
/// It pays when `saved × read × horizon ≥ suffix × (write − read)`: with the default
/// horizon of 20, when the saving is at least 0.575× the rewritten suffix. A horizon of 0
/// always rewrites.
pub fn pays_for_cache_rebuild(saved: usize, suffix: usize, horizon: u32) -> bool {
    horizon == 0
        || saved as f64 * CACHE_READ_RATIO * f64::from(horizon)
            >= suffix as f64 * (CACHE_WRITE_RATIO - CACHE_READ_RATIO)
}

/// What the microcompaction of one message should become.
enum Plan {
    Preview,
    /// `any_size`: the idle rule stubs results of any size (when the stub is shorter).
    Stub {
        any_size: bool,
    },
}

/// How a staged message gets its new content once its original is archived.
enum Render {
    Preview,
    Stub,
    /// A preview promoted to a stub: already archived under `key`.
    Ready {
        content: String,
        key: Key,
    },
}

/// One staged change.
struct Edit {
    index: usize,
    render: Render,
}

/// A staged change and, unless it reuses an earlier archive, its original checked for markers.
struct Staged<'h> {
    edit: Edit,
    original: Option<Archivable<'h>>,
}

/// Runs the age rule and, when `idle_for` reaches `idleMinutes`, the idle rule.
pub async fn microcompact(
    history: &mut [Message],
    policy: &EffectivePolicy,
    idle_for: Option<Duration>,
    store: &dyn Store,
) -> PassReport {
    let mc = &policy.microcompact;
    let idle = mc.idle_minutes > 0
        && idle_for.is_some_and(|d| d >= Duration::from_secs(u64::from(mc.idle_minutes) * 60));
    let pass = if idle {
        Pass::IdleClear
    } else {
        Pass::Microcompact
    };
    let mut report = PassReport::new(pass, Trigger::Turn, history::weight(history));

    let ages = assistant_ages(history);
    let idle_cutoff = if idle {
        let tool_positions: Vec<usize> = history
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::Tool)
            .map(|(i, _)| i)
            .collect();
        tool_positions
            .len()
            .checked_sub(IDLE_KEEP_RECENT)
            .and_then(|n| tool_positions.get(n).copied())
    } else {
        None
    };

    let mut staged: Vec<Staged<'_>> = Vec::new();
    for (i, m) in history.iter().enumerate() {
        if m.role != Role::Tool || m.meta.preserve_verbatim || m.meta.is_summary {
            continue;
        }
        let age = ages[i];
        let plan = if idle_cutoff.is_some_and(|cut| i < cut) {
            Plan::Stub { any_size: true }
        } else if age >= mc.summarize_after_turns {
            Plan::Stub { any_size: false }
        } else if age >= mc.truncate_after_turns {
            Plan::Preview
        } else {
            continue;
        };
        if let Some(s) = plan_edit(i, m, plan, policy) {
            staged.push(s);
        }
    }
    if staged.is_empty() {
        return report;
    }
    // The age rule rewrites bytes inside the provider's cached prefix; it waits while the
    // saving does not pay for the rebuild (the idle rule runs once the cache has expired).
    if !idle && !pays_off(history, &staged, policy) {
        report.notes.push(format!(
            "{} old tool result(s) left as they are: the saving does not pay for rebuilding the prompt cache",
            staged.len()
        ));
        return report;
    }
    let originals: Vec<Archivable<'_>> = staged.iter().filter_map(|s| s.original).collect();
    let keys = match archive_all_checked(store, &originals).await {
        Ok(keys) => keys,
        Err(e) => {
            report.archive_error = Some(e.label());
            return report;
        }
    };
    report.archived = distinct(&keys);
    let edits: Vec<Edit> = staged.into_iter().map(|s| s.edit).collect();
    let snapshot = probe::Snapshot::of(history);
    apply_edits(history, edits, keys, policy, &mut report);
    probe::grade_pass(&mut report, &snapshot, history);
    report
}

/// Whether the staged edits, together, pay for the cache rebuild from the first of them on.
fn pays_off(history: &[Message], staged: &[Staged<'_>], policy: &EffectivePolicy) -> bool {
    let mc = &policy.microcompact;
    let Some(from) = staged.iter().map(|s| s.edit.index).min() else {
        return true;
    };
    let mut saved = 0;
    for s in staged {
        let len = history[s.edit.index].content.len();
        let after = match &s.edit.render {
            Render::Preview => (mc.head_chars + mc.tail_chars) as usize + BANNER_ROOM,
            Render::Stub => BANNER_ROOM,
            Render::Ready { content, .. } => content.len(),
        }
        .min(len);
        saved += len - after;
    }
    let suffix = history::weight(&history[from..]).saturating_sub(saved);
    pays_for_cache_rebuild(saved, suffix, mc.cache_horizon_turns)
}

/// Assistant messages after each position.
pub(crate) fn assistant_ages(history: &[Message]) -> Vec<u32> {
    let mut ages = vec![0u32; history.len()];
    let mut seen = 0u32;
    for (i, m) in history.iter().enumerate().rev() {
        ages[i] = seen;
        if m.role == Role::Assistant {
            seen = seen.saturating_add(1);
        }
    }
    ages
}

/// Room a banner or stub needs besides the kept text: a pass only stages a change that can
/// make the message shorter.
const BANNER_ROOM: usize = 160;

fn tool_label(m: &Message) -> String {
    match &m.name {
        Some(n) => format!("{TOOL_LABEL} of {n}"),
        None => TOOL_LABEL.to_string(),
    }
}

const TOOL_LABEL: &str = "tool result";

/// `tool_label(m).len()` without building it (planning looks at every tool result).
fn tool_label_len(m: &Message) -> usize {
    TOOL_LABEL.len() + m.name.as_ref().map_or(0, |n| " of ".len() + n.len())
}

fn plan_edit<'h>(
    index: usize,
    m: &'h Message,
    plan: Plan,
    policy: &EffectivePolicy,
) -> Option<Staged<'h>> {
    let mc = &policy.microcompact;
    // One scan for markers serves the checks below and the store: tool outputs are megabytes.
    let checked = Archivable::check(m.content.as_bytes()).ok();
    if checked.is_none() && m.content.contains(text::BANNER_PREFIX) {
        // Already a preview or a stub: a preview may be promoted, using the key it carries.
        let Plan::Stub { .. } = plan else {
            return None;
        };
        if !m.content.contains(" omitted; full original: ") {
            return None;
        }
        let key = *extract_markers(&m.content).first()?;
        let st = text::parse_stats(&m.content)?;
        return Some(Staged {
            edit: Edit {
                index,
                render: Render::Ready {
                    content: text::stub(&tool_label(m), st, &key),
                    key,
                },
            },
            original: None,
        });
    }
    let Some(original) = checked else {
        // Content quoting someone else's marker cannot be archived; leave it whole.
        return None;
    };
    let len = m.content.len();
    let large = len >= mc.min_content_chars as usize;
    let render = match plan {
        Plan::Preview if large && len > (mc.head_chars + mc.tail_chars) as usize + BANNER_ROOM => {
            Render::Preview
        }
        Plan::Stub { any_size } if (large || any_size) && len > BANNER_ROOM + tool_label_len(m) => {
            Render::Stub
        }
        _ => return None,
    };
    Some(Staged {
        edit: Edit { index, render },
        original: Some(original),
    })
}

/// Applies every edit once its original is archived under the next of `keys`.
fn apply_edits(
    history: &mut [Message],
    edits: Vec<Edit>,
    keys: Vec<Key>,
    policy: &EffectivePolicy,
    report: &mut PassReport,
) {
    let mc = &policy.microcompact;
    let mut keys = keys.into_iter();
    for e in edits {
        let m = &mut history[e.index];
        let (content, key) = match e.render {
            Render::Ready { content, key } => (Some(content), key),
            Render::Preview => {
                let Some(key) = keys.next() else { break };
                let p = text::preview(
                    &m.content,
                    mc.head_chars as usize,
                    mc.tail_chars as usize,
                    &key,
                );
                (p, key)
            }
            Render::Stub => {
                let Some(key) = keys.next() else { break };
                let s = text::stub(&tool_label(m), Stats::of(&m.content), &key);
                (Some(s), key)
            }
        };
        let Some(content) = content.and_then(|c| text::keeping_errors(c, m)) else {
            continue;
        };
        report.bytes_after = report.bytes_after - m.content.len() + content.len();
        super::ledger::note_cut(m);
        m.content = content;
        note_archived(m, &key);
        report.changed += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::MemoryStore;
    use crate::history::ToolCall;

    fn big(n: usize) -> String {
        (0..n).map(|i| format!("output line {i}\n")).collect()
    }

    fn turn(id: &str, out: String) -> Vec<Message> {
        vec![
            Message::assistant_calls(
                "",
                vec![ToolCall {
                    id: id.into(),
                    name: "bash".into(),
                    arguments: "{}".into(),
                }],
            ),
            Message::tool(id, out),
        ]
    }

    fn history_with_ages() -> Vec<Message> {
        let mut h = vec![Message::system("sys"), Message::user("go")];
        for i in 0..6 {
            h.extend(turn(&format!("c{i}"), big(400)));
        }
        h.push(Message::assistant("done"));
        h
    }

    #[test]
    fn a_rewrite_pays_when_the_saving_over_the_horizon_beats_the_rebuild() {
        // 20 turns × 0.1 = 2 per saved byte against 1.15 per rewritten byte.
        assert!(pays_for_cache_rebuild(5_750, 10_000, 20));
        assert!(!pays_for_cache_rebuild(5_749, 10_000, 20));
        assert!(!pays_for_cache_rebuild(10_000, 100_000, 20));
        assert!(pays_for_cache_rebuild(1, 1_000_000, 0), "0 always rewrites");
    }

    #[tokio::test]
    async fn a_small_saving_deep_in_the_cached_prefix_waits_and_the_idle_rule_still_runs() {
        let store = MemoryStore::new();
        let policy = EffectivePolicy::default();
        // One old 10 kB result, then 100 kB of later conversation the rewrite would make the
        // provider cache again.
        let mut h = vec![Message::system("sys"), Message::user("go")];
        h.extend(turn("c0", big(600)));
        for i in 0..10 {
            h.push(Message::assistant(format!("step {i}")));
            h.push(Message::user("x".repeat(10_000)));
        }
        h.push(Message::assistant("done"));
        let before = h.clone();
        let r = microcompact(&mut h, &policy, None, &store).await;
        assert_eq!(r.changed, 0, "{:?}", r.notes);
        assert_eq!(h, before);
        assert!(
            r.notes.iter().any(|n| n.contains("prompt cache")),
            "{:?}",
            r.notes
        );
        // With the horizon off the same history is rewritten.
        let mut eager = policy.clone();
        eager.microcompact.cache_horizon_turns = 0;
        assert_eq!(
            microcompact(&mut h.clone(), &eager, None, &store)
                .await
                .changed,
            1
        );
        // Once idle (the cache has expired) the rewrite costs no rebuild.
        let idle = microcompact(&mut h, &policy, Some(Duration::from_secs(61 * 60)), &store).await;
        assert_eq!(idle.changed, 1);
    }

    #[tokio::test]
    async fn previews_then_stubs_by_age_and_is_idempotent() {
        let store = MemoryStore::new();
        let policy = EffectivePolicy::default();
        let mut h = history_with_ages();
        let original = h[3].content.clone();
        let r = microcompact(&mut h, &policy, None, &store).await;
        assert!(r.changed > 0);
        // c0's result (index 3) is 6 assistant turns old: a stub.
        assert!(
            h[3].content.starts_with("[cairn: tool result archived"),
            "{}",
            h[3].content
        );
        // c4's result is 2 turns old: a preview.
        let c4 = &h[11].content;
        assert!(c4.starts_with("output line 0\n") && c4.contains("omitted; full original"));
        // c5's result is 1 turn old: untouched.
        assert_eq!(h[13].content, big(400));
        let key = Key::parse(&h[3].meta.archived[0]).expect("key");
        assert_eq!(
            store.fetch(&key).await.expect("ok"),
            Some(original.into_bytes())
        );

        let snapshot = h.clone();
        let again = microcompact(&mut h, &policy, None, &store).await;
        assert!(!again.is_change());
        assert_eq!(h, snapshot);

        // Two more turns: the preview is promoted to a stub with the same key.
        let key4 = h[11].meta.archived[0].clone();
        h.extend(turn("c6", "x".into()));
        h.extend(turn("c7", "y".into()));
        microcompact(&mut h, &policy, None, &store).await;
        assert!(h[11].content.starts_with("[cairn: tool result archived"));
        assert!(h[11].content.contains("400 lines"));
        assert_eq!(h[11].meta.archived, vec![key4]);
    }

    #[tokio::test]
    async fn idle_rule_keeps_five_most_recent() {
        let store = MemoryStore::new();
        let policy = EffectivePolicy::default();
        let mut h = vec![Message::user("go")];
        for i in 0..8 {
            h.extend(turn(
                &format!("c{i}"),
                format!("small result {i} {}", "z".repeat(300)),
            ));
        }
        let r = microcompact(&mut h, &policy, Some(Duration::from_secs(61 * 60)), &store).await;
        assert_eq!(r.pass, Pass::IdleClear);
        let tools: Vec<&Message> = h.iter().filter(|m| m.role == Role::Tool).collect();
        assert!(tools[..3].iter().all(|m| m.content.starts_with("[cairn:")));
        assert!(
            tools[3..]
                .iter()
                .all(|m| m.content.starts_with("small result"))
        );
        let short = microcompact(&mut h, &policy, Some(Duration::from_secs(59 * 60)), &store).await;
        assert_eq!(short.pass, Pass::Microcompact);
    }
}
