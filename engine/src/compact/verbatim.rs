//! The verbatim budget. Messages flagged `preserveVerbatim` (recall results, pinned notes)
//! survive every level, but together they may use at most a quarter of the budget; beyond
//! that the oldest are archived to stubs and lose the flag, so compaction always converges.

use crate::ccr::Store;
use crate::history::{self, Message};

use super::archive::{archive_all, distinct, note_archived};
use super::text::{self, Stats};
use super::{Budget, Pass, PassReport, Trigger};

/// Share of the budget verbatim messages may use.
pub const VERBATIM_SHARE_DIVISOR: usize = 4;

pub async fn enforce(
    history: &mut [Message],
    budget: Budget,
    trigger: Trigger,
    store: &dyn Store,
) -> PassReport {
    let mut report = PassReport::new(Pass::Verbatim, trigger, history::weight(history));
    let allowance = budget.chars / VERBATIM_SHARE_DIVISOR;
    let mut total: usize = history
        .iter()
        .filter(|m| m.meta.preserve_verbatim)
        .map(Message::weight)
        .sum();
    if total <= allowance {
        return report;
    }
    let mut edits: Vec<usize> = Vec::new();
    for (i, m) in history.iter().enumerate() {
        if total <= allowance {
            break;
        }
        if !m.meta.preserve_verbatim || m.is_system() || text::quotes_marker(&m.content) {
            continue;
        }
        total -= m.weight();
        edits.push(i);
    }
    let originals: Vec<&[u8]> = edits
        .iter()
        .map(|&i| history[i].content.as_bytes())
        .collect();
    let keys = match archive_all(store, &originals).await {
        Ok(keys) => keys,
        Err(e) => {
            report.archive_error = Some(e.label());
            return report;
        }
    };
    report.archived = distinct(&keys);
    for (i, key) in edits.into_iter().zip(keys) {
        let m = &mut history[i];
        m.content = text::stub("verbatim message", Stats::of(&m.content), &key);
        m.meta.preserve_verbatim = false;
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

    #[tokio::test]
    async fn oldest_verbatim_lose_the_flag_beyond_a_quarter() {
        let store = MemoryStore::new();
        let pinned = |s: &str| {
            let mut m = Message::user(s.repeat(1000));
            m.meta.preserve_verbatim = true;
            m
        };
        let mut h = vec![pinned("a"), pinned("b"), pinned("c")];
        let r = enforce(&mut h, Budget { chars: 4000 }, Trigger::Auto, &store).await;
        assert_eq!(r.changed, 2);
        assert!(!h[0].meta.preserve_verbatim && !h[1].meta.preserve_verbatim);
        assert!(h[2].meta.preserve_verbatim);
        assert_eq!(h[2].content, "c".repeat(1000));
    }
}
