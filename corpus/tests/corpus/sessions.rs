//! The generated sessions: deterministic, of the size asked for, well formed, and as varied
//! as real ones (many files, commands, requests, and errors below the first line).

use std::collections::BTreeSet;

use cairn_corpus::session::{REQUESTS, session};
use cairn_engine::artifacts::{self, Category};
use cairn_engine::compact::pairing;
use cairn_engine::history::{self, Message, Role};
use serde_json::Value;

use super::corpus;

#[test]
fn the_same_seed_gives_the_same_session_byte_for_byte() {
    let c = corpus();
    let a = history::to_jsonl(&session(c, 7, 200_000));
    let b = history::to_jsonl(&session(c, 7, 200_000));
    assert_eq!(a, b);
    assert_ne!(a, history::to_jsonl(&session(c, 8, 200_000)));
}

#[test]
fn sessions_come_in_every_size_from_50_kb_to_4_mb() {
    let c = corpus();
    for bytes in [50_000, 200_000, 1_000_000, 4_000_000] {
        let h = session(c, 1, bytes);
        let weight = history::weight(&h);
        assert!(
            weight >= bytes && weight < bytes + 200_000,
            "{bytes}: {weight}"
        );
        assert!(pairing::is_valid(&h), "{bytes}: every call is answered");
        assert_eq!(h[0].role, Role::System);
    }
}

/// Every tool result is the corpus's: a fixture's content, a recorded output or diff.
#[test]
fn every_tool_result_comes_from_the_recording() {
    let c = corpus();
    let recorded: BTreeSet<&str> = c
        .files
        .iter()
        .map(|f| f.content.as_str())
        .chain(c.runs.iter().map(|r| r.output.as_str()))
        .chain(c.edits.iter().map(|e| e.diff.as_str()))
        .collect();
    let h = session(c, 3, 1_000_000);
    let results: Vec<&Message> = h.iter().filter(|m| m.role == Role::Tool).collect();
    assert!(results.len() > 100, "{}", results.len());
    for m in results {
        assert!(recorded.contains(m.content.as_str()), "{:.200}", m.content);
    }
}

#[test]
fn a_session_touches_what_real_sessions_touch() {
    let c = corpus();
    assert!(
        REQUESTS
            .iter()
            .map(|(_, r)| r)
            .collect::<BTreeSet<_>>()
            .len()
            >= 40,
        "at least 40 distinct requests to deal"
    );
    for bytes in [200_000, 1_000_000] {
        let h = session(c, 11, bytes);
        let found = artifacts::of_history(&h);
        let count = |c: Category| found.iter().filter(|a| a.category == c).count();
        // Errors whose line is not the first line of their output: the ones a summary of
        // the output's head would miss.
        let below_first_line: BTreeSet<&str> = h
            .iter()
            .filter(|m| m.role == Role::Tool)
            .filter_map(|m| {
                let line = artifacts::error_line(&m.content)?;
                let first = m.content.lines().map(str::trim).find(|l| !l.is_empty());
                (first != Some(line)).then_some(line)
            })
            .collect();
        let (files, commands, requests) = (
            count(Category::Files),
            count(Category::Commands),
            count(Category::Requests),
        );
        eprintln!(
            "{bytes} bytes: {files} files, {commands} commands, {} errors ({} below the first line), {requests} requests",
            count(Category::Errors),
            below_first_line.len()
        );
        assert!(files >= 40, "{bytes}: {files} files");
        assert!(commands >= 20, "{bytes}: {commands} commands");
        assert!(requests >= 40, "{bytes}: {requests} requests");
        assert!(
            below_first_line.len() >= 15,
            "{bytes}: {below_first_line:#?}"
        );
        // Files are named as agents name them: `path` to read, an absolute `file_path` to edit.
        let keys: BTreeSet<String> = h
            .iter()
            .flat_map(|m| &m.tool_calls)
            .filter_map(|c| serde_json::from_str::<Value>(&c.arguments).ok())
            .filter_map(|v| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()))
            .flatten()
            .collect();
        for key in ["path", "file_path", "command", "old_string", "new_string"] {
            assert!(keys.contains(key), "{bytes}: no `{key}` argument");
        }
    }
}
