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

use super::archive::{archive_all, note_archived};
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
    let mut report = PairingReport::default();
    if is_valid(messages) {
        return report;
    }
    let old = std::mem::take(messages);

    // Pass A: which calls survive, and which result each claims (the first with its id).
    let mut used: HashSet<&str> = HashSet::new();
    let mut kept_calls: Vec<Vec<bool>> = Vec::with_capacity(old.len());
    for m in &old {
        let keep = m
            .tool_calls
            .iter()
            .map(|c| !c.id.is_empty() && used.insert(c.id.as_str()))
            .collect::<Vec<_>>();
        kept_calls.push(keep);
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

    // Pass B: rebuild.
    let mut out: Vec<Message> = Vec::with_capacity(old.len() + 1);
    let mut pending_removed: Vec<String> = Vec::new();
    for (i, m) in old.iter().enumerate() {
        if m.role == Role::Tool {
            let id = m.tool_call_id.as_deref().unwrap_or_default();
            if claim.get(id) == Some(&i) {
                continue;
            }
            let duplicate = claim.contains_key(id);
            if m.meta.preserve_verbatim || mode == OrphanMode::ToUser {
                let mut u = m.clone();
                u.role = Role::User;
                u.tool_call_id = None;
                u.content = format!(
                    "[cairn: tool result {}whose call is no longer in the conversation{}]\n{}",
                    m.name
                        .as_deref()
                        .map(|n| format!("of {n} "))
                        .unwrap_or_default(),
                    if id.is_empty() {
                        String::new()
                    } else {
                        format!(" (call id {id})")
                    },
                    m.content
                );
                out.push(u);
                report.orphans_to_user += 1;
                continue;
            }
            if duplicate {
                report.removed_duplicates += 1;
            } else {
                report.removed_orphans += 1;
            }
            let identical_kept = claim.get(id).is_some_and(|&c| old[c].content == m.content);
            if !m.content.is_empty() && !identical_kept {
                pending_removed.push(m.content.clone());
            }
            continue;
        }
        let mut msg = m.clone();
        if !pending_removed.is_empty() {
            // Keys go on the closest earlier non-system message (system messages are never
            // altered), or on this one.
            let anchor = out
                .iter()
                .rposition(|o| !o.is_system())
                .or((!msg.is_system()).then_some(out.len()));
            if let Some(a) = anchor {
                report
                    .removed
                    .extend(pending_removed.drain(..).map(|t| (a, t)));
            }
        }
        if !m.tool_calls.is_empty() {
            let keep = &kept_calls[i];
            let mut calls = Vec::with_capacity(m.tool_calls.len());
            for (c, k) in m.tool_calls.iter().zip(keep) {
                if *k {
                    calls.push(c.clone());
                } else {
                    report.pruned_calls += 1;
                    let text =
                        serde_json::json!({"id": c.id, "name": c.name, "arguments": c.arguments})
                            .to_string();
                    if mode == OrphanMode::ToUser {
                        msg.content
                            .push_str(&format!("\n[cairn: malformed tool call dropped: {text}]"));
                    } else {
                        report.removed.push((out.len(), text));
                    }
                }
            }
            msg.tool_calls = calls;
            let block_start = i + 1;
            let ids: Vec<String> = msg.tool_calls.iter().map(|c| c.id.clone()).collect();
            out.push(msg);
            for (n, id) in ids.iter().enumerate() {
                match claim.get(id.as_str()) {
                    Some(&r) => {
                        if r != block_start + n {
                            report.relocated += 1;
                        }
                        out.push(old[r].clone());
                    }
                    None => {
                        let mut synthetic = Message::tool(id.clone(), SYNTHETIC_RESULT);
                        synthetic.name = m
                            .tool_calls
                            .iter()
                            .find(|c| &c.id == id)
                            .map(|c| c.name.clone());
                        out.push(synthetic);
                        report.injected += 1;
                    }
                }
            }
            continue;
        }
        out.push(msg);
    }
    if !pending_removed.is_empty() {
        if let Some(anchor) = out.iter().rposition(|o| !o.is_system()) {
            report
                .removed
                .extend(pending_removed.drain(..).map(|t| (anchor, t)));
        } else {
            // Nothing to hang a key on: keep the text as a user message instead.
            for text in pending_removed.drain(..) {
                out.push(Message::user(format!(
                    "[cairn: tool result whose call is no longer in the conversation]\n{text}"
                )));
                report.orphans_to_user += 1;
            }
        }
    }
    *messages = out;
    report
}

/// Repairs the pairing of `history`, archiving every removed text first. When the archive
/// fails, unmatched results become user-role messages instead, so nothing is lost and the
/// request is still valid.
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
    let mut staged = history.clone();
    let mut pr = repair(&mut staged, OrphanMode::Remove);
    if !pr.removed.is_empty() {
        let originals: Vec<&[u8]> = pr.removed.iter().map(|(_, t)| t.as_bytes()).collect();
        match archive_all(store, &originals).await {
            Ok(keys) => {
                for (anchor, text) in &pr.removed {
                    let key = crate::ccr::Key::of(text.as_bytes());
                    if let Some(m) = staged.get_mut(*anchor) {
                        note_archived(m, &key);
                    }
                }
                report.archived = keys;
            }
            Err(e) => {
                report.archive_error = Some(e.label());
                staged = history.clone();
                pr = repair(&mut staged, OrphanMode::ToUser);
            }
        }
    }
    report.changed = pr.relocated + pr.orphans_to_user + usize::from(pr.pruned_calls > 0);
    report.removed = pr.removed_orphans + pr.removed_duplicates;
    report.added = pr.injected;
    *history = staged;
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
