//! Tool-result pairing: every assistant tool call is followed by exactly one result for it,
//! and no tool result stands anywhere else. Providers reject a request that breaks this, so
//! it is checked every turn and after every pass that drops messages.
//!
//! Repair works per assistant block: prune calls with an empty or already-used id, claim each
//! call's result from wherever it ended up, move it next to its call, inject a synthetic
//! error result for a call nobody answered, and remove results that answer no call. A removed
//! result's content is archived and its key noted on the preceding message; a verbatim one
//! (e.g. a recall result) becomes a user-role message instead.

use std::collections::{HashMap, HashSet};

use crate::ccr::Store;
use crate::history::{self, Message, Role};

use super::archive::{archive_all, distinct, note_archived};
use super::{Pass, PassReport, Trigger};

/// Content of the result injected for a call that has none.
pub const SYNTHETIC_RESULT: &str = "[cairn: no result was recorded for this tool call (the turn was interrupted or the result was lost); treat the call as failed]";

/// What a repair changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PairingReport {
    pub pruned_calls: usize,
    pub relocated: usize,
    pub injected: usize,
    pub removed_orphans: usize,
    pub removed_duplicates: usize,
    pub orphans_to_user: usize,
    /// Text removed from the history, with the index (in the repaired history) of the
    /// message that should carry its archive key.
    pub removed: Vec<(usize, String)>,
}

impl PairingReport {
    pub fn is_change(&self) -> bool {
        self.pruned_calls
            + self.relocated
            + self.injected
            + self.removed_orphans
            + self.removed_duplicates
            + self.orphans_to_user
            > 0
    }
}

/// True when every call has exactly one result right after its assistant message and no
/// result stands elsewhere. Allocates nothing.
pub fn is_valid(messages: &[Message]) -> bool {
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        match m.role {
            Role::Tool => return false,
            Role::Assistant if !m.tool_calls.is_empty() => {
                let calls = &m.tool_calls;
                for (a, c) in calls.iter().enumerate() {
                    if c.id.is_empty() || calls[..a].iter().any(|d| d.id == c.id) {
                        return false;
                    }
                }
                let block = &messages[i + 1..];
                let n = block.iter().take_while(|r| r.role == Role::Tool).count();
                if n != calls.len() {
                    return false;
                }
                for (a, r) in block[..n].iter().enumerate() {
                    let Some(id) = r.tool_call_id.as_deref() else {
                        return false;
                    };
                    if !calls.iter().any(|c| c.id == id)
                        || block[..a]
                            .iter()
                            .any(|p| p.tool_call_id.as_deref() == Some(id))
                    {
                        return false;
                    }
                }
                i += 1 + n;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    true
}

/// How unmatched results are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrphanMode {
    /// Removed (the caller archives [`PairingReport::removed`] first).
    Remove,
    /// Kept as user-role messages (nothing leaves the history).
    ToUser,
}

/// Repairs the pairing in place. Pure: the caller archives what the report lists as removed.
pub fn repair(messages: &mut Vec<Message>, mode: OrphanMode) -> PairingReport {
    if is_valid(messages) {
        return PairingReport::default();
    }
    let plan = Plan::of(messages, mode);
    plan.apply(messages)
}

/// One message of the repaired history, by where it comes from.
enum Step {
    /// The original message, unchanged.
    Keep(usize),
    /// An unmatched result turned into a user message.
    ToUser(usize),
    /// An assistant message with its surviving calls (`keep[c]`), followed by its results.
    Calls { at: usize, keep: Vec<bool> },
    /// The result a call claimed, from wherever it stood.
    Result(usize),
    /// The injected result of a call nobody answered.
    Synthetic { id: String, name: String },
    /// An unmatched result with no message to carry its key: kept as a user message.
    Loose(usize),
}

/// Text leaving the history: an unmatched result, or a malformed call (as JSON).
enum Gone {
    Result(usize),
    Call(String),
}

/// A repair decided on the borrowed history and applied by moving its messages: nothing is
/// copied but the messages that change.
struct Plan {
    mode: OrphanMode,
    steps: Vec<Step>,
    /// What leaves the history, with the index (in the repaired history) of its anchor.
    gone: Vec<(usize, Gone)>,
    report: PairingReport,
}

impl Plan {
    fn of(old: &[Message], mode: OrphanMode) -> Self {
        let mut report = PairingReport::default();
        // Which calls survive, and which result each claims (the first with its id).
        let mut used: HashSet<&str> = HashSet::new();
        let mut kept_calls: HashMap<usize, Vec<bool>> = HashMap::new();
        for (i, m) in old.iter().enumerate() {
            if !m.tool_calls.is_empty() {
                let keep = m
                    .tool_calls
                    .iter()
                    .map(|c| !c.id.is_empty() && used.insert(c.id.as_str()))
                    .collect::<Vec<_>>();
                kept_calls.insert(i, keep);
            }
        }
        let mut claim: HashMap<&str, usize> = HashMap::new();
        for (i, m) in old.iter().enumerate() {
            if m.role == Role::Tool
                && let Some(id) = m.tool_call_id.as_deref()
                && used.contains(id)
            {
                claim.entry(id).or_insert(i);
            }
        }

        let mut steps: Vec<Step> = Vec::with_capacity(old.len() + 1);
        let mut gone: Vec<(usize, Gone)> = Vec::new();
        let mut pending: Vec<usize> = Vec::new();
        // The last non-system message of the repaired history so far.
        let mut anchor: Option<usize> = None;
        for (i, m) in old.iter().enumerate() {
            if m.role == Role::Tool {
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                if claim.get(id) == Some(&i) {
                    continue;
                }
                if m.meta.preserve_verbatim || mode == OrphanMode::ToUser {
                    anchor = Some(steps.len());
                    steps.push(Step::ToUser(i));
                    report.orphans_to_user += 1;
                    continue;
                }
                if claim.contains_key(id) {
                    report.removed_duplicates += 1;
                } else {
                    report.removed_orphans += 1;
                }
                let identical_kept = claim.get(id).is_some_and(|&c| old[c].content == m.content);
                if !m.content.is_empty() && !identical_kept {
                    pending.push(i);
                }
                continue;
            }
            if !pending.is_empty() {
                // Keys go on the closest earlier non-system message (system messages are
                // never altered), or on this one.
                let a = anchor.or((!m.is_system()).then_some(steps.len()));
                if let Some(a) = a {
                    gone.extend(pending.drain(..).map(|r| (a, Gone::Result(r))));
                }
            }
            let Some(keep) = kept_calls.remove(&i) else {
                if !m.is_system() {
                    anchor = Some(steps.len());
                }
                steps.push(Step::Keep(i));
                continue;
            };
            let here = steps.len();
            for (c, k) in m.tool_calls.iter().zip(&keep) {
                if !*k {
                    report.pruned_calls += 1;
                    if mode == OrphanMode::Remove {
                        gone.push((here, Gone::Call(call_text(c))));
                    }
                }
            }
            let surviving: Vec<&crate::history::ToolCall> = m
                .tool_calls
                .iter()
                .zip(&keep)
                .filter_map(|(c, k)| k.then_some(c))
                .collect();
            steps.push(Step::Calls { at: i, keep });
            for (n, c) in surviving.into_iter().enumerate() {
                match claim.get(c.id.as_str()) {
                    Some(&r) => {
                        if r != i + 1 + n {
                            report.relocated += 1;
                        }
                        steps.push(Step::Result(r));
                    }
                    None => {
                        steps.push(Step::Synthetic {
                            id: c.id.clone(),
                            name: c.name.clone(),
                        });
                        report.injected += 1;
                    }
                }
            }
            anchor = Some(steps.len() - 1);
        }
        if !pending.is_empty() {
            match anchor {
                Some(a) => gone.extend(pending.drain(..).map(|r| (a, Gone::Result(r)))),
                // Nothing to hang a key on: keep the text as a user message instead.
                None => {
                    for r in pending.drain(..) {
                        steps.push(Step::Loose(r));
                        report.orphans_to_user += 1;
                    }
                }
            }
        }
        Self {
            mode,
            steps,
            gone,
            report,
        }
    }

    /// The text of each thing that leaves the history, in [`PairingReport::removed`] order.
    fn gone_texts<'a>(&'a self, old: &'a [Message]) -> Vec<&'a [u8]> {
        self.gone
            .iter()
            .map(|(_, g)| match g {
                Gone::Result(r) => old[*r].content.as_bytes(),
                Gone::Call(text) => text.as_bytes(),
            })
            .collect()
    }

    /// Rebuilds `messages` by moving each original to its place.
    fn apply(self, messages: &mut Vec<Message>) -> PairingReport {
        let Self {
            mode,
            steps,
            gone,
            mut report,
        } = self;
        let mut old: Vec<Option<Message>> =
            std::mem::take(messages).into_iter().map(Some).collect();
        let mut out: Vec<Message> = Vec::with_capacity(steps.len());
        for step in steps {
            let msg = match step {
                Step::Keep(i) | Step::Result(i) => old[i].take(),
                Step::ToUser(i) => old[i].take().map(orphan_to_user),
                Step::Calls { at, keep } => old[at].take().map(|mut m| {
                    let calls = std::mem::take(&mut m.tool_calls);
                    for (c, k) in calls.into_iter().zip(keep) {
                        if k {
                            m.tool_calls.push(c);
                        } else if mode == OrphanMode::ToUser {
                            m.content.push_str(&format!(
                                "\n[cairn: malformed tool call dropped: {}]",
                                call_text(&c)
                            ));
                        }
                    }
                    m
                }),
                Step::Synthetic { id, name } => {
                    let mut synthetic = Message::tool(id, SYNTHETIC_RESULT);
                    synthetic.name = Some(name);
                    Some(synthetic)
                }
                Step::Loose(i) => old[i].as_ref().map(|m| {
                    Message::user(format!(
                        "[cairn: tool result whose call is no longer in the conversation]\n{}",
                        m.content
                    ))
                }),
            };
            out.extend(msg);
        }
        report.removed = gone
            .into_iter()
            .map(|(a, g)| match g {
                Gone::Result(r) => (
                    a,
                    old[r]
                        .as_mut()
                        .map(|m| std::mem::take(&mut m.content))
                        .unwrap_or_default(),
                ),
                Gone::Call(text) => (a, text),
            })
            .collect();
        *messages = out;
        report
    }
}

fn call_text(c: &crate::history::ToolCall) -> String {
    serde_json::json!({"id": c.id, "name": c.name, "arguments": c.arguments}).to_string()
}

fn orphan_to_user(mut u: Message) -> Message {
    let id = u.tool_call_id.take().unwrap_or_default();
    u.role = Role::User;
    u.content = format!(
        "[cairn: tool result {}whose call is no longer in the conversation{}]\n{}",
        u.name
            .as_deref()
            .map(|n| format!("of {n} "))
            .unwrap_or_default(),
        if id.is_empty() {
            String::new()
        } else {
            format!(" (call id {id})")
        },
        u.content
    );
    u
}

/// Repairs the pairing of `history`, archiving every removed text first. When the archive
/// fails, unmatched results become user-role messages instead, so nothing is lost and the
/// request is still valid. The repair is decided on the history as it stands and applied by
/// moving messages; only the messages that change are rebuilt.
pub async fn repair_archived(
    history: &mut Vec<Message>,
    store: &dyn Store,
    trigger: Trigger,
) -> (PassReport, PairingReport) {
    let before = history::weight(history);
    let mut report = PassReport::new(Pass::Pairing, trigger, before);
    if is_valid(history) {
        return (report, PairingReport::default());
    }
    let plan = Plan::of(history, OrphanMode::Remove);
    let archived = if plan.gone.is_empty() {
        Ok(Vec::new())
    } else {
        archive_all(store, &plan.gone_texts(history)).await
    };
    let pr = match archived {
        Ok(keys) => {
            let pr = plan.apply(history);
            for ((anchor, _), key) in pr.removed.iter().zip(&keys) {
                if let Some(m) = history.get_mut(*anchor) {
                    note_archived(m, key);
                }
            }
            report.archived = distinct(&keys);
            pr
        }
        Err(e) => {
            report.archive_error = Some(e.label());
            Plan::of(history, OrphanMode::ToUser).apply(history)
        }
    };
    report.changed = pr.relocated + pr.orphans_to_user + usize::from(pr.pruned_calls > 0);
    report.removed = pr.removed_orphans + pr.removed_duplicates;
    report.added = pr.injected;
    report.bytes_after = history::weight(history);
    (report, pr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: "{}".into(),
        }
    }

    #[test]
    fn valid_history_is_untouched() {
        let mut h = vec![
            Message::user("hi"),
            Message::assistant_calls("", vec![call("a"), call("b")]),
            Message::tool("b", "B"),
            Message::tool("a", "A"),
            Message::assistant("done"),
        ];
        let before = h.clone();
        assert!(is_valid(&h));
        let r = repair(&mut h, OrphanMode::Remove);
        assert!(!r.is_change());
        assert_eq!(h, before);
    }

    #[test]
    fn relocates_injects_prunes_and_removes() {
        let mut h = vec![
            Message::user("hi"),
            Message::assistant_calls("", vec![call("a"), call(""), call("b"), call("a")]),
            Message::user("interjection"),
            Message::tool("a", "A"),
            Message::tool("zzz", "orphan"),
            Message::tool("a", "A again"),
        ];
        let r = repair(&mut h, OrphanMode::Remove);
        assert!(is_valid(&h), "{h:?}");
        assert_eq!(r.pruned_calls, 2);
        assert_eq!(r.relocated, 1);
        assert_eq!(r.injected, 1);
        assert_eq!(r.removed_orphans, 1);
        assert_eq!(r.removed_duplicates, 1);
        assert_eq!(h[2].content, "A");
        assert_eq!(h[3].content, SYNTHETIC_RESULT);
        assert_eq!(h[4].content, "interjection");
        let removed: Vec<&str> = r.removed.iter().map(|(_, t)| t.as_str()).collect();
        assert!(removed.contains(&"orphan") && removed.contains(&"A again"));
    }

    #[test]
    fn verbatim_orphan_becomes_user_message() {
        let mut orphan = Message::tool("gone", "recalled text");
        orphan.meta.preserve_verbatim = true;
        let mut h = vec![Message::user("hi"), orphan];
        let r = repair(&mut h, OrphanMode::Remove);
        assert_eq!(r.orphans_to_user, 1);
        assert_eq!(h[1].role, Role::User);
        assert!(h[1].content.ends_with("recalled text"));
        assert!(h[1].meta.preserve_verbatim);
    }
}
