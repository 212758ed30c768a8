//! The per-request tool-result budget, applied to the outgoing copy of the history (the
//! history itself keeps the full text).
//!
//! A result over `perResultChars` is cut to a head+tail preview of that size; the results
//! that answer one assistant message (one "turn" of tool calls) may together carry at most
//! `perTurnChars`, the largest cut first (a common cap is chosen so that every result under
//! it stays whole). Previews depend only on the result and the limit, so the same history
//! yields byte-identical requests turn after turn and provider prompt caches stay warm.

use crate::ccr::Store;
use crate::history::{self, Message, Role};

use super::archive::{archive_all, distinct};
use super::state::ToolResultLimits;
use super::{Pass, PassReport, Trigger, text};

/// The outgoing copy of `history` with tool results within `limits`. On an archive failure
/// the copy carries the full results (the report says why).
pub async fn apply(
    history: &[Message],
    limits: ToolResultLimits,
    store: &dyn Store,
) -> (Vec<Message>, PassReport) {
    let mut out = history.to_vec();
    let (_, report) = cut(&mut out, limits, store).await;
    (out, report)
}

/// The full texts of the results one request carries cut; [`Cuts::restore`] puts them back.
#[derive(Debug, Default)]
#[must_use = "the history keeps the cut results until the cuts are restored"]
pub struct Cuts(Vec<(usize, String)>);

impl Cuts {
    pub fn restore(self, history: &mut [Message]) {
        for (i, full) in self.0 {
            if let Some(m) = history.get_mut(i) {
                m.content = full;
            }
        }
    }
}

/// [`apply`] in place, for a history lent to one request: cuts the results and returns their
/// full texts, which the caller restores once the request is sent. Spares copying megabytes
/// of history per request when, as usual, few results (or none) need cutting.
pub async fn cut(
    history: &mut [Message],
    limits: ToolResultLimits,
    store: &dyn Store,
) -> (Cuts, PassReport) {
    let mut report = PassReport::new(
        Pass::ToolResultBudget,
        Trigger::Turn,
        history::weight(history),
    );
    let caps = plan_caps(history, limits);
    if caps.is_empty() {
        return (Cuts::default(), report);
    }
    let originals: Vec<&[u8]> = caps
        .iter()
        .map(|&(i, _)| history[i].content.as_bytes())
        .collect();
    let keys = match archive_all(store, &originals).await {
        Ok(keys) => keys,
        Err(e) => {
            report.archive_error = Some(e.label());
            return (Cuts::default(), report);
        }
    };
    report.archived = distinct(&keys);
    let mut cuts = Vec::with_capacity(caps.len());
    for ((i, cap), key) in caps.into_iter().zip(keys) {
        if let Some(p) = text::preview_within(&history[i].content, cap, &key)
            .and_then(|p| text::keeping_errors(p, &history[i]))
        {
            cuts.push((i, std::mem::replace(&mut history[i].content, p)));
            report.changed += 1;
        }
    }
    report.bytes_after = history::weight(history);
    (Cuts(cuts), report)
}

/// (message index, byte cap) for every result that must be cut.
fn plan_caps(history: &[Message], limits: ToolResultLimits) -> Vec<(usize, usize)> {
    let mut caps = Vec::new();
    let mut i = 0;
    while i < history.len() {
        if history[i].role != Role::Tool {
            i += 1;
            continue;
        }
        let start = i;
        while i < history.len() && history[i].role == Role::Tool {
            i += 1;
        }
        let group: Vec<usize> = (start..i)
            .filter(|&j| {
                let m = &history[j];
                !m.meta.preserve_verbatim && !m.meta.is_summary && !text::quotes_marker(&m.content)
            })
            .collect();
        let sizes: Vec<usize> = group
            .iter()
            .map(|&j| history[j].content.len().min(limits.per_result))
            .collect();
        let fixed: usize = (start..i)
            .filter(|j| !group.contains(j))
            .map(|j| history[j].content.len())
            .sum();
        let turn_room = limits.per_turn.saturating_sub(fixed);
        let cap = water_level(&sizes, turn_room).min(limits.per_result);
        for &j in &group {
            if history[j].content.len() > cap {
                caps.push((j, cap));
            }
        }
    }
    caps
}

/// The largest cap `c` with `Σ min(size, c) <= room` (largest results cut first).
fn water_level(sizes: &[usize], room: usize) -> usize {
    let total: usize = sizes.iter().sum();
    if total <= room {
        return usize::MAX;
    }
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    let mut below = 0usize;
    for (n, &s) in sorted.iter().enumerate() {
        let remaining = sorted.len() - n;
        // Every remaining result is at least `s`; can they all get `s`?
        if below + s * remaining > room {
            return (room - below) / remaining;
        }
        below += s;
    }
    room
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::MemoryStore;
    use crate::history::ToolCall;

    fn block(sizes: &[usize]) -> Vec<Message> {
        let calls = sizes
            .iter()
            .enumerate()
            .map(|(n, _)| ToolCall {
                id: format!("c{n}"),
                name: "bash".into(),
                arguments: "{}".into(),
            })
            .collect();
        let mut h = vec![Message::user("go"), Message::assistant_calls("", calls)];
        for (n, s) in sizes.iter().enumerate() {
            h.push(Message::tool(format!("c{n}"), "abcdefghi\n".repeat(s / 10)));
        }
        h
    }

    #[test]
    fn water_level_cuts_largest_first() {
        assert_eq!(water_level(&[10, 20, 30], 100), usize::MAX);
        assert_eq!(water_level(&[10, 20, 30], 45), 17);
        assert_eq!(water_level(&[10, 100, 100], 110), 50);
    }

    #[tokio::test]
    async fn per_result_and_per_turn_limits_are_byte_stable() {
        let store = MemoryStore::new();
        let h = block(&[1_000, 30_000, 90_000]);
        let limits = ToolResultLimits {
            per_result: 20_000,
            per_turn: 30_000,
        };
        let (out, r) = apply(&h, limits, &store).await;
        assert_eq!(out[2].content, h[2].content, "small result untouched");
        assert!(out[3].content.len() <= 14_500 && out[4].content.len() <= 14_500);
        let total: usize = out[2..].iter().map(|m| m.content.len()).sum();
        assert!(total <= 30_000, "{total}");
        assert_eq!(r.archived.len(), 2);
        assert_eq!(h[4].content.len(), 90_000, "history keeps the full text");
        let (again, _) = apply(&h, limits, &store).await;
        assert_eq!(again, out, "same input, same request bytes");
        let key = crate::ccr::extract_markers(&out[4].content)[0];
        assert_eq!(
            store.fetch(&key).await.expect("ok"),
            Some(h[4].content.clone().into_bytes())
        );
    }
}
