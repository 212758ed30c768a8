//! Level 3: emergency truncation. Keeps the system messages, the verbatim messages and the
//! recent tail (starting at a user message), with a notice that says truthfully what
//! happened (the middle was truncated, not summarized) and carries the recall marker of the
//! archived segment. Then, while still over budget, the largest non-system message is cut
//! first (its original archived before the first cut, never below [`FLOOR_CHARS`]), until
//! the budget is met or nothing can shrink any more.
//!
//! The tail kept is `minKeepRecent` messages first; when even that tail, every message cut
//! to its floor, cannot meet the target, fewer are kept (`emergencyKeepMessages`, then
//! `nuclearKeepMessages`, then only the newest user message), so the level converges on any
//! window that can hold the system prompt and the newest message at all.

use std::collections::{HashMap, HashSet};

use cairn_crds::EffectivePolicy;

use crate::ccr::{Key, Store, extract_markers};
use crate::history::{self, Message, Role};

use super::archive::{archive_all, note_archived, referenced_keys, segment_text};
use super::ledger::Width;
use super::pairing::{self, OrphanMode};
use super::text;
use super::trim::tail_start;
use super::{Pass, PassReport, Trigger};

/// No message is cut below this many bytes.
pub const FLOOR_CHARS: usize = 400;

/// First index of the kept tail: at or after the protected tail start, on a user message.
pub fn user_tail_start(history: &[Message], keep: usize) -> usize {
    let first_non_system = history
        .iter()
        .position(|m| !m.is_system())
        .unwrap_or(history.len());
    let ts = tail_start(history, keep).max(first_non_system);
    let is_user = |m: &Message| m.role == Role::User;
    if let Some(off) = history[ts..].iter().position(is_user) {
        return ts + off;
    }
    if let Some(back) = history[..ts].iter().rposition(is_user) {
        return back;
    }
    first_non_system
}

/// The truthful notice that replaces a truncated segment.
pub fn notice(dropped: usize, chars: usize, key: &Key) -> String {
    format!(
        "{}the conversation outgrew the model's context window, so {dropped} earlier messages ({chars} chars) were truncated, not summarized. They are archived; recall {} to read them.]",
        text::BANNER_PREFIX,
        key.marker()
    )
}

/// Room the truncation notice takes (its text with the marker and counts).
const NOTICE_ROOM: usize = 400;

/// Bytes a message weighs at the least once level 3 has cut it: content at its floor (the
/// preview's banner included), plus everything that is not content (tool calls, images,
/// reasoning).
fn floor_weight(m: &Message) -> usize {
    if m.is_system() || m.meta.preserve_verbatim || m.content.len() <= FLOOR_CHARS {
        return m.weight();
    }
    m.weight() - m.content.len() + FLOOR_CHARS
}

/// The tail sizes level 3 tries, largest first, ending with the newest user message alone.
pub fn keep_schedule(policy: &EffectivePolicy) -> Vec<usize> {
    let r = &policy.recovery;
    let first = (policy.min_keep_recent as usize).max(1);
    let mut keeps = vec![first];
    for k in [
        r.emergency_keep_messages as usize,
        r.nuclear_keep_messages as usize,
        1,
    ] {
        if k >= 1 && keeps.last().is_some_and(|last| k < *last) {
            keeps.push(k);
        }
    }
    keeps
}

/// The least weight level 3 can reach keeping a tail of `keep` messages: what it never cuts,
/// the notice, and every kept message at its floor.
pub fn floor_with_keep(history: &[Message], keep: usize) -> usize {
    let ts = user_tail_start(history, keep);
    let notice = if history[..ts]
        .iter()
        .any(|m| !m.is_system() && !m.meta.preserve_verbatim)
    {
        NOTICE_ROOM
    } else {
        0
    };
    history
        .iter()
        .enumerate()
        .filter(|(i, m)| *i >= ts || m.is_system() || m.meta.preserve_verbatim)
        .map(|(_, m)| floor_weight(m))
        .sum::<usize>()
        + notice
}

/// Runs level 3 towards `target` bytes. Returns the report and whether the target was met.
pub async fn emergency(
    history: &mut Vec<Message>,
    policy: &EffectivePolicy,
    target: usize,
    trigger: Trigger,
    store: &dyn Store,
) -> (PassReport, bool) {
    emergency_with(history, policy, target, trigger, store, Width::Normal).await
}

/// [`emergency`] with the notice's ledger section `width` wide.
pub async fn emergency_with(
    history: &mut Vec<Message>,
    policy: &EffectivePolicy,
    target: usize,
    trigger: Trigger,
    store: &dyn Store,
    width: Width,
) -> (PassReport, bool) {
    let schedule = keep_schedule(policy);
    // The largest tail whose floor meets the target; the smallest one when none does.
    let keep = schedule
        .iter()
        .copied()
        .find(|k| floor_with_keep(history, *k) <= target)
        .unwrap_or(1);
    let mut report = PassReport::new(Pass::Emergency, trigger, history::weight(history));
    if keep < policy.min_keep_recent as usize {
        report.notes.push(format!(
            "kept only the newest {keep} message(s): a longer tail could not fit {target} bytes"
        ));
    }
    let ts = user_tail_start(history, keep);
    let dropped: Vec<Message> = history[..ts]
        .iter()
        .filter(|m| !m.is_system() && !m.meta.preserve_verbatim)
        .cloned()
        .collect();
    let mut staged: Vec<Message> = Vec::with_capacity(history.len() - dropped.len() + 1);
    staged.extend(history.iter().filter(|m| m.is_system()).cloned());
    if !dropped.is_empty() {
        let archive_text = segment_text(&dropped);
        let key = match archive_all(store, &[archive_text.as_bytes()]).await {
            Ok(keys) if !keys.is_empty() => keys[0],
            Ok(_) => return (report, history::weight(history) <= target),
            Err(e) => {
                report.archive_error = Some(e.label());
                return (report, history::weight(history) <= target);
            }
        };
        report.archived.push(key);
        let chars: usize = dropped.iter().map(Message::weight).sum();
        let mut n = Message::user(notice(dropped.len(), chars, &key));
        n.meta.is_summary = true;
        // The ledger's section, in the room the kept tail's floor leaves under the target:
        // the cuts below can still meet it.
        super::ledger::record(&mut n, &dropped);
        let room = super::ledger::room_with(target, floor_with_keep(history, keep), width);
        let section = super::ledger::section(
            &n.meta.ledger,
            n.meta.ledger_folded,
            Some(&key.marker()),
            room,
        );
        n.content.push_str(&section);
        n.meta.archived.push(key.as_str().to_string());
        for k in referenced_keys(&dropped) {
            if k != key {
                n.meta.archived.push(k.as_str().to_string());
            }
        }
        staged.push(n);
        report.removed = dropped.len();
        report.added = 1;
    }
    staged.extend(
        history[..ts]
            .iter()
            .filter(|m| !m.is_system() && m.meta.preserve_verbatim)
            .cloned(),
    );
    staged.extend(history[ts..].iter().filter(|m| !m.is_system()).cloned());
    pairing::repair(&mut staged, OrphanMode::ToUser);

    // Forced down to the nuclear tail, every kept message is also cut to nuclearMessageChars:
    // cutting the largest first to the total those caps leave ends with each at its cap.
    let mut goal = target;
    if keep < policy.min_keep_recent as usize
        && keep <= policy.recovery.nuclear_keep_messages as usize
    {
        let cap = (policy.recovery.nuclear_message_chars as usize).max(FLOOR_CHARS);
        let excess: usize = staged
            .iter()
            .filter(|m| !m.is_system() && !m.meta.preserve_verbatim && !m.meta.is_summary)
            .map(|m| m.content.len().saturating_sub(cap))
            .sum();
        goal = goal.min(history::weight(&staged).saturating_sub(excess));
    }
    shrink_largest(&mut staged, goal, store, &mut report).await;
    *history = staged;
    report.bytes_after = history::weight(history);
    let met = report.bytes_after <= target;
    if !met {
        report.notes.push(format!(
            "floor reached at {} bytes (target {target})",
            report.bytes_after
        ));
    }
    (report, met)
}

/// Cuts the largest message first (never a system or verbatim message, nor cairn's own
/// stand-ins) until `target` is met or no message can shrink further. Each original is
/// archived before its first cut.
pub async fn shrink_largest(
    history: &mut [Message],
    target: usize,
    store: &dyn Store,
    report: &mut PassReport,
) {
    let mut weight = history::weight(history);
    let mut originals: HashMap<usize, (String, Key)> = HashMap::new();
    let mut exhausted = vec![false; history.len()];
    // Previews cut again from their fetched original: counted as changed once actually cut.
    let mut refetched: HashSet<usize> = HashSet::new();
    while weight > target {
        let Some(i) = (0..history.len())
            .filter(|&i| {
                let m = &history[i];
                !exhausted[i]
                    && !m.is_system()
                    && !m.meta.preserve_verbatim
                    && !m.meta.is_summary
                    && m.content.len() > FLOOR_CHARS
            })
            .max_by_key(|&i| (history[i].content.len(), std::cmp::Reverse(i)))
        else {
            break;
        };
        let excess = weight - target;
        let current = history[i].content.len();
        if !originals.contains_key(&i) && text::is_ours(&history[i].content) {
            // Already a cairn preview: cut again from its archived original (so the floor
            // holds), or fall back to a stub, which loses nothing either.
            let c = &history[i].content;
            let key = extract_markers(c).first().copied();
            if c.contains(" omitted; full original: ")
                && let Some(key) = key
                && let Ok(Some(orig)) = store.fetch(&key).await
                && let Ok(orig) = String::from_utf8(orig)
            {
                originals.insert(i, (orig, key));
                refetched.insert(i);
            } else {
                // A stub or preview: a stub of its original. A text cairn derived from one
                // archived original (a result compressed on entry): a stub of that original,
                // which holds all the text shows.
                let stats = text::parse_stats(c)
                    .or_else(|| (extract_markers(c).len() == 1).then(|| text::Stats::of(c)));
                if let (Some(k), Some(st)) = (key, stats) {
                    let s = text::keeping_errors(text::stub("message", st, &k), &history[i]);
                    if let Some(s) = s {
                        weight = weight - current + s.len();
                        super::ledger::note_cut(&mut history[i]);
                        history[i].content = s;
                        report.changed += 1;
                    }
                }
                exhausted[i] = true;
                continue;
            }
        }
        #[allow(clippy::map_entry)] // the archive call between lookup and insert is async
        if !originals.contains_key(&i) {
            let c = &history[i].content;
            if text::quotes_marker(c) {
                exhausted[i] = true;
                continue;
            }
            let key = match archive_all(store, &[c.as_bytes()]).await {
                Ok(keys) if !keys.is_empty() => keys[0],
                Ok(_) => break,
                Err(e) => {
                    report.archive_error = Some(e.label());
                    exhausted[i] = true;
                    continue;
                }
            };
            if !report.archived.contains(&key) {
                report.archived.push(key);
            }
            // The original moves into `originals`; every cut below is made from it.
            super::ledger::note_cut(&mut history[i]);
            let original = std::mem::take(&mut history[i].content);
            originals.insert(i, (original, key));
            note_archived(&mut history[i], &key);
            report.changed += 1;
        }
        let Some((orig, key)) = originals.get(&i) else {
            break;
        };
        let want = current.saturating_sub(excess).max(FLOOR_CHARS);
        // The original moved out of the message: its errors are in its ledger.
        let errors = text::errors_to_keep(&history[i]);
        match text::preview_within(orig, want, key).map(|p| text::with_errors(p, &errors)) {
            Some(p) if p.len() < current => {
                weight = weight - current + p.len();
                history[i].content = p;
                if refetched.remove(&i) {
                    report.changed += 1;
                }
                exhausted[i] = want <= FLOOR_CHARS;
            }
            _ => {
                if history[i].content.len() != current {
                    history[i].content = orig.clone();
                }
                exhausted[i] = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::MemoryStore;

    #[tokio::test]
    async fn shrinks_largest_first_down_to_the_floor_then_stops() {
        let store = MemoryStore::new();
        let line = |c: char| format!("{}\n", c.to_string().repeat(39));
        let big_user: String = line('u').repeat(500);
        let big_asst: String = line('a').repeat(250);
        let mut h = vec![
            Message::system("s".repeat(1_000)),
            Message::user(big_user.clone()),
            Message::assistant(big_asst.clone()),
        ];
        let mut report = PassReport::new(Pass::Emergency, Trigger::Auto, history::weight(&h));
        // Only the largest needs to shrink.
        shrink_largest(&mut h, 1_000 + 15_000 + 10_000, &store, &mut report).await;
        assert!(h[1].content.len() <= 15_000 && h[1].content.len() > 14_000);
        assert_eq!(h[2].content, big_asst);
        // An impossible target: both stop at the floor, the system message is untouched.
        shrink_largest(&mut h, 10, &store, &mut report).await;
        assert_eq!(h[0].content.len(), 1_000);
        for m in &h[1..] {
            assert!(
                m.content.len() <= FLOOR_CHARS && m.content.len() > FLOOR_CHARS / 2,
                "{}",
                m.content.len()
            );
        }
        for original in [&big_user, &big_asst] {
            let key = Key::of(original.as_bytes());
            assert_eq!(
                store.fetch(&key).await.expect("ok").as_deref(),
                Some(original.as_bytes())
            );
        }
    }
}
