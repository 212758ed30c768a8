//! Mirrors locally what a provider's server-side context management did to a request, so
//! the history stays what the model saw and every original stays recallable.
//!
//! Anthropic's `clear_tool_uses_20250919` clears the results of the oldest tool uses, keeping
//! the most recent `keep` and never those of `exclude_tools`; the reply reports how many it
//! cleared. The same results become stubs here, their originals archived first.

use crate::ccr::{Key, Store};
use crate::history::{Message, Role};

use cairn_crds::session::CompactionScore;

use super::archive::{archive_all, note_archived};
use super::{probe, text};

/// What mirroring did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mirrored {
    /// Tool results turned into stubs.
    pub stubbed: usize,
    pub archived: Vec<Key>,
    pub bytes_before: usize,
    pub bytes_after: usize,
    /// What the history still shows of what the mirror cut or replaced ([`probe::score`]),
    /// when it changed anything.
    pub quality: Option<CompactionScore>,
}

/// Indexes of the tool results the server cleared: the oldest `cleared` of those it may
/// clear (not of an excluded tool, not among the `keep` most recent).
fn cleared_results(
    history: &[Message],
    cleared: usize,
    keep: usize,
    exclude: &[String],
) -> Vec<usize> {
    let name_of = |m: &Message| -> Option<String> {
        m.name.clone().or_else(|| {
            let id = m.tool_call_id.as_deref()?;
            history
                .iter()
                .flat_map(|h| &h.tool_calls)
                .find(|c| c.id == id)
                .map(|c| c.name.clone())
        })
    };
    let eligible: Vec<usize> = history
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Tool)
        .filter(|(_, m)| !name_of(m).is_some_and(|n| exclude.contains(&n)))
        .map(|(i, _)| i)
        .collect();
    let clearable = eligible.len().saturating_sub(keep);
    eligible.into_iter().take(clearable.min(cleared)).collect()
}

/// Turns the tool results the server cleared into stubs. Their originals are archived
/// first; a result that already quotes a marker (compressed on entry) keeps pointing at the
/// original archived then. On an archive failure nothing changes: the history keeps the
/// whole results (the server still cleared them on its side).
pub async fn mirror_cleared_tool_uses(
    history: &mut [Message],
    cleared: usize,
    keep: usize,
    exclude: &[String],
    store: &dyn Store,
) -> Mirrored {
    let picked: Vec<usize> = cleared_results(history, cleared, keep, exclude)
        .into_iter()
        .filter(|&i| !text::is_ours(&history[i].content))
        .collect();
    let mut out = Mirrored {
        bytes_before: picked.iter().map(|&i| history[i].content.len()).sum(),
        ..Mirrored::default()
    };
    let (plain, quoted): (Vec<usize>, Vec<usize>) = picked
        .into_iter()
        .partition(|&i| !text::quotes_marker(&history[i].content));
    let originals: Vec<&[u8]> = plain
        .iter()
        .map(|&i| history[i].content.as_bytes())
        .collect();
    let keys = match archive_all(store, &originals).await {
        Ok(keys) => keys,
        Err(e) => {
            tracing::warn!(error = %e, "cleared tool results not archived; the history keeps them whole");
            return Mirrored::default();
        }
    };
    let mut pairs: Vec<(usize, Key)> = plain.into_iter().zip(keys).collect();
    for i in quoted {
        if let Some(key) = history[i].meta.archived.first().and_then(|k| Key::parse(k)) {
            pairs.push((i, key));
        }
    }
    let snapshot = probe::Snapshot::of(history);
    for (i, key) in pairs {
        let m = &mut history[i];
        let st = text::Stats::of(&m.content);
        super::ledger::note_cut(m);
        // The provider cleared it whatever its size: the stub keeps its errors even when
        // that makes it no shorter.
        let stub = text::stub("tool result (cleared by the provider)", st, &key);
        m.content = text::with_errors(stub, &text::errors_to_keep(m));
        note_archived(m, &key);
        out.stubbed += 1;
        out.bytes_after += m.content.len();
        out.archived.push(key);
    }
    if out.stubbed > 0 {
        out.quality = Some(probe::score(&snapshot.at_stake(history), history, 0));
    }
    out
}

/// OpenAI's compaction item stands for the whole input of the request that returned it: the
/// non-system messages of `history` are archived (as one segment, recallable) and replaced
/// by one message that carries the item, sent back verbatim next time. On an archive
/// failure nothing changes and `None` is returned: the item is not kept, the history stays
/// whole (the next request sends it all again).
pub async fn mirror_compaction(
    history: &mut Vec<Message>,
    item: &serde_json::Value,
    store: &dyn Store,
) -> Option<Mirrored> {
    let (system, segment): (Vec<Message>, Vec<Message>) = std::mem::take(history)
        .into_iter()
        .partition(Message::is_system);
    let text = super::archive::segment_text(&segment);
    let key = match store.archive(text.as_bytes()).await {
        Ok(key) => key,
        Err(e) => {
            tracing::warn!(error = %e, "the segment the provider compacted is not archived; the compaction item is not kept");
            *history = system;
            history.extend(segment);
            return None;
        }
    };
    // The item stands for the whole segment: all of it is at stake.
    let stake = probe::Snapshot::of(&segment).at_stake(&[]);
    let st = text::Stats::of(&text);
    let mut m = Message::user(text::stub(
        &format!(
            "{} earlier messages, compacted by the provider into an opaque item,",
            segment.len()
        ),
        st,
        &key,
    ));
    m.provider_item = Some(item.clone());
    m.meta.is_summary = true;
    note_archived(&mut m, &key);
    let out = Mirrored {
        stubbed: segment.len(),
        archived: vec![key],
        bytes_before: crate::history::weight(&segment),
        bytes_after: m.weight(),
        quality: None,
    };
    *history = system;
    history.push(m);
    let quality = probe::score(&stake, history, 0);
    Some(Mirrored {
        quality: Some(quality),
        ..out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::{MemoryStore, recall};
    use crate::history::ToolCall;

    fn history() -> Vec<Message> {
        let mut h = vec![Message::user("go")];
        for i in 0..6 {
            let name = if i == 1 { "recall" } else { "read_file" };
            h.push(Message::assistant_calls(
                "",
                vec![ToolCall {
                    id: format!("c{i}"),
                    name: name.into(),
                    arguments: "{}".into(),
                }],
            ));
            h.push(Message::tool(
                format!("c{i}"),
                format!("result {i} {}", "x".repeat(500)),
            ));
        }
        h
    }

    #[tokio::test]
    async fn the_oldest_clearable_results_become_recallable_stubs() {
        let store = MemoryStore::new();
        let mut h = history();
        let before = h.clone();
        let out = mirror_cleared_tool_uses(&mut h, 2, 3, &["recall".to_string()], &store).await;
        assert_eq!(out.stubbed, 2);
        // c0 and c2 (c1 is an excluded tool); c3..c5 are the three kept.
        for (i, m) in h.iter().enumerate() {
            let cleared = matches!(m.tool_call_id.as_deref(), Some("c0" | "c2"));
            assert_eq!(m.content != before[i].content, cleared, "message {i}");
            if cleared {
                let back = recall(&store, &m.content).await.expect("recall");
                assert_eq!(back.output, before[i].content.as_bytes());
            }
        }
        // More cleared than clearable: only the clearable ones.
        let mut h = history();
        let out = mirror_cleared_tool_uses(&mut h, 10, 3, &[], &store).await;
        assert_eq!(out.stubbed, 3);
    }
}
