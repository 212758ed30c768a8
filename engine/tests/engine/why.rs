//! `--why TEXT`: where a piece of text went after compactions (`cairn_engine::why`).

use cairn_crds::EffectivePolicy;
use cairn_engine::ccr::{Key, MemoryStore, Store};
use cairn_engine::compact::summarize::SECTIONS;
use cairn_engine::compact::{BudgetInputs, LadderContext, SessionState, Trigger, compact};
use cairn_engine::history::{self, Message, Role};
use cairn_engine::testing::*;
use cairn_engine::why::{Place, describe, why};

/// The marker's key.
fn key_of(marker: &str) -> Key {
    let inner = marker
        .strip_prefix("<<ccr:")
        .and_then(|m| m.strip_suffix(">>"))
        .expect("a marker");
    Key::parse(inner).expect("a key")
}

/// The ladder to `target` bytes on `h`, with `summarizer` or without one.
async fn compact_to(
    h: &mut Vec<Message>,
    target: usize,
    summarizer: Option<&ScriptedSummarizer>,
    store: &MemoryStore,
    state: &mut SessionState,
) -> Option<u8> {
    let policy = EffectivePolicy::default();
    let ctx = LadderContext {
        policy: &policy,
        inputs: BudgetInputs {
            context_window: 1_000_000,
            payload_cap: None,
            reserve_bytes: 0,
        },
        store,
        summarizer: summarizer.map(|s| s as _),
        trigger: Trigger::Manual,
        budget_ratio: None,
        target: Some(target),
    };
    let out = compact(h, &ctx, state).await;
    assert!(out.met, "{out:?}");
    out.level
}

/// A line of an early tool result, after three level-3 compactions, is in the archive,
/// three markers deep (each notice was replaced by the next), and recall of the marker `--why` prints returns the original with
/// it. The text of the newest turn is kept, an early file path sits in the ledger, and a
/// text the session never saw is nowhere.
#[tokio::test]
async fn an_early_line_is_found_in_the_archive_after_three_compactions() {
    let store = MemoryStore::new();
    let mut state = SessionState::new();
    let mut h = session(400_000);
    let needle = "needle-7f3a: the one line only the first result had";
    let first_result = h
        .iter()
        .position(|m| m.role == Role::Tool)
        .expect("a tool result");
    h[first_result].content.push_str(&format!("\n{needle}\n"));
    // Three rounds of more work, each ending in a level-3 compaction to a quarter.
    for round in 0..3 {
        let target = history::weight(&h) / 4;
        let level = compact_to(&mut h, target, None, &store, &mut state).await;
        assert_eq!(level, Some(3), "round {round}");
        h.extend(session(200_000).into_iter().skip(1));
    }
    let found = why(&h, needle, &store).await;
    eprintln!("{}", serde_json::to_string_pretty(&found).expect("json"));
    assert!(found.unreadable.is_empty(), "{found:?}");
    let archived: Vec<(&String, &Vec<String>)> = found
        .places
        .iter()
        .filter_map(|p| match p {
            Place::Archived { marker, via, .. } => Some((marker, via)),
            _ => None,
        })
        .collect();
    let (marker, via) = archived.first().expect("found in the archive");

    assert_eq!(via.last(), Some(*marker));
    assert!(via.len() >= 3, "three compactions deep: {via:?}");
    let original = store
        .fetch(&key_of(marker))
        .await
        .expect("reads")
        .expect("stored");
    assert!(String::from_utf8_lossy(&original).contains(needle));
    // The outermost marker is one the history shows.
    assert!(h.iter().any(|m| m.content.contains(&via[0])), "{via:?}");
    let lines = describe(&serde_json::to_value(&found).expect("json"));
    assert!(
        lines.contains(&format!("archived under {marker}"))
            && lines.contains(&format!("reached through {}", via.join(" -> "))),
        "{lines}"
    );

    let newest = h.last().expect("a message").content.clone();
    let tail: String = newest.chars().take(40).collect();
    let kept = why(&h, &tail, &store).await;
    assert!(
        kept.places
            .iter()
            .any(|p| matches!(p, Place::Kept { message, .. } if *message == h.len() - 1)),
        "{kept:?}"
    );

    let in_ledger = why(&h, "src/module_0.rs", &store).await;
    assert!(
        in_ledger
            .places
            .iter()
            .any(|p| matches!(p, Place::Ledger { markers, .. } if !markers.is_empty())),
        "{in_ledger:?}"
    );

    let nowhere = why(&h, "a text this session never saw", &store).await;
    assert!(
        nowhere.places.is_empty() && !nowhere.truncated,
        "{nowhere:?}"
    );
    let lines = describe(&serde_json::to_value(&nowhere).expect("json"));
    assert!(lines.contains(": nowhere: "), "{lines}");
}

/// A request a level-2 summary quotes in its section 6 is found there, with the summary's
/// marker, and in the archived segment that marker recalls.
#[tokio::test]
async fn a_request_quoted_by_a_summary_is_in_its_section() {
    let store = MemoryStore::new();
    let mut state = SessionState::new();
    let mut h = session(200_000);
    let request = h
        .iter()
        .find(|m| m.role == Role::User)
        .expect("a request")
        .content
        .clone();
    let mut summary = String::new();
    for (n, heading) in SECTIONS.iter().enumerate() {
        summary.push_str(&format!("{}. {heading}\n", n + 1));
        if n == 5 {
            summary.push_str(&format!("- {request}\n"));
        } else {
            summary.push_str("The build of module 3 fails; the tests were run again.\n");
        }
    }
    while summary.len() < 6_000 {
        summary.push_str("Details: the failing step reads src/module_3.rs first.\n");
    }
    let summarizer = ScriptedSummarizer::new(vec![Ok(summary)]);
    let weight = history::weight(&h);
    let level = compact_to(&mut h, weight / 3, Some(&summarizer), &store, &mut state).await;
    assert_eq!(level, Some(2));
    assert_eq!(summarizer.calls(), 1);
    let found = why(&h, &request, &store).await;
    eprintln!("{}", serde_json::to_string_pretty(&found).expect("json"));
    let Some(Place::Summary {
        section,
        heading,
        markers,
        ..
    }) = found
        .places
        .iter()
        .find(|p| matches!(p, Place::Summary { .. }))
    else {
        panic!("in the summary: {found:?}");
    };
    assert_eq!((*section, *heading), (Some(6), Some(SECTIONS[5])));
    let lines = describe(&serde_json::to_value(&found).expect("json"));
    assert!(
        lines.contains(
            "summarized: message 1, section 6 (All user messages (verbatim)); recall <<ccr:"
        ),
        "{lines}"
    );
    assert!(!markers.is_empty());
    assert!(
        found
            .places
            .iter()
            .any(|p| matches!(p, Place::Archived { via, .. } if via.first() == markers.first())),
        "{found:?}"
    );
}
