//! The artifact ledger: what the messages a compaction removed had touched (the files and
//! commands their tool calls named, the errors their tool results reported, the requests
//! their user messages made), kept by the
//! stand-in that replaces them (a level-2 summary, a session memory standing in for a
//! summary, a level-3 notice) and shown in its content, so the model still knows what it did
//! after the messages are gone.
//!
//! Deterministic, no LLM: the entries come from [`crate::artifacts`]. A message whose
//! content a pass cuts in place keeps what it held in its own `meta.ledger` ([`note_cut`]),
//! so what a cut hides still reaches the stand-in that later replaces the message. They
//! travel in the stand-in's `meta.ledger`, so they are journaled with it, survive a restart and a rewind
//! with the history, and a later compaction that removes the stand-in carries them into its
//! own. Bounded: a stand-in keeps the newest [`MAX_ENTRIES`]; older ones are folded (counted
//! in `meta.ledger_folded`), never silently dropped: their messages are in the archived
//! segment whose marker the stand-in carries.
//!
//! The section is written once per compaction, into its stand-in, and only within the room
//! the history leaves under the compaction's target (at most a [`SHARE`]th of the target):
//! after a summary, what the history weighs; at level 3, what its kept tail weighs at its
//! floor. So it never costs a compaction its convergence. When the room is short, files and
//! commands come first, then the newest errors, then the newest requests; what is not shown
//! is counted in a line that carries the segment's marker. A summary written before level 3
//! runs takes less ([`before_level3`]): level 3 carries its entries into its own notice.
//!
//! A compaction that scores below the policy's `quality.minScore` widens the section of its
//! stand-in ([`Width::Wide`]): after a summary, all the room left under its target
//! ([`widen_newest`]); at level 3, level 3 runs again from the same history with all the
//! room left at its floor, cutting its kept tail further. Never past the target.

use crate::artifacts::{self, Artifact, Category};
use crate::history::Message;

/// Entries one stand-in keeps; older ones are folded.
pub const MAX_ENTRIES: usize = 1_024;
/// A section takes at most this fraction (1/N) of the compaction's target.
pub const SHARE: usize = 4;
/// The section of a summary that level 3 follows takes at most this fraction (1/N) of the
/// target ...
pub const BEFORE_LEVEL3_SHARE: usize = 20;
/// ... and at most this many bytes.
pub const BEFORE_LEVEL3_MAX_BYTES: usize = 4_096;
/// First line of the section in a stand-in's content.
pub const HEADING: &str =
    "[cairn: ledger of the messages above this point that were removed: what they touched";

/// The ledger of `removed`, oldest first, distinct: each message's files, commands, errors
/// and requests, and the entries of the stand-ins among them carried forward. Returns the
/// newest [`MAX_ENTRIES`] entries and how many older ones are folded.
pub fn of_removed<'a>(removed: impl IntoIterator<Item = &'a Message>) -> (Vec<Artifact>, u64) {
    let mut entries: Vec<Artifact> = Vec::new();
    let mut folded = 0u64;
    for m in removed {
        // A stand-in's ledger, or what a message whose content a pass cut held before.
        entries.extend(m.meta.ledger.iter().cloned());
        folded += m.meta.ledger_folded;
        if !m.meta.is_summary {
            entries.extend(artifacts::of_message(m));
        }
    }
    // Distinct, at the place of their last appearance (the newest use of a file counts).
    let mut seen = std::collections::HashSet::new();
    let mut newest_first: Vec<Artifact> = entries
        .into_iter()
        .rev()
        .filter(|a| seen.insert(a.clone()))
        .collect();
    newest_first.reverse();
    folded += keep_newest(&mut newest_first);
    (newest_first, folded)
}

/// Keeps the newest [`MAX_ENTRIES`] of `entries` (oldest first); returns how many older
/// ones it folded.
fn keep_newest(entries: &mut Vec<Artifact>) -> u64 {
    let extra = entries.len().saturating_sub(MAX_ENTRIES);
    entries.drain(..extra);
    extra as u64
}

/// Before a pass cuts `m`'s content in place (archiving the original): keeps the artifacts
/// of the message as it is in `m.meta.ledger` (the newest [`MAX_ENTRIES`], older ones
/// folded), so the compaction that later removes `m` carries them into its stand-in's
/// ledger, although the cut content may no longer show them (an error line past a
/// preview's head). Call it while the content is whole.
pub fn note_cut(m: &mut Message) {
    for a in artifacts::of_message(m) {
        if !m.meta.ledger.contains(&a) {
            m.meta.ledger.push(a);
        }
    }
    m.meta.ledger_folded += keep_newest(&mut m.meta.ledger);
}

/// Records the ledger of `removed` in `stand_in`.
pub fn record<'a>(stand_in: &mut Message, removed: impl IntoIterator<Item = &'a Message>) {
    let (entries, folded) = of_removed(removed);
    stand_in.meta.ledger = entries;
    stand_in.meta.ledger_folded = folded;
}

/// `content` without its ledger section, if it has one: the stand-in's own text.
pub fn without_section(content: &str) -> &str {
    match content.find(&format!("\n\n{HEADING}")) {
        Some(at) => &content[..at],
        None => content,
    }
}

/// How much of a compaction's target a section may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// At most a [`SHARE`]th of the target.
    Normal,
    /// All the room left under the target (`quality.minScore` asks for more).
    Wide,
}

/// The room a section may take under `target` when the history weighs (or can be cut to)
/// `weight`: what is left, at most a [`SHARE`]th of the target.
pub fn room(target: usize, weight: usize) -> usize {
    room_with(target, weight, Width::Normal)
}

/// [`room`] at `width`.
pub fn room_with(target: usize, weight: usize, width: Width) -> usize {
    let left = target.saturating_sub(weight);
    match width {
        Width::Normal => left.min(target / SHARE),
        Width::Wide => left,
    }
}

/// The room of the section of a summary level 3 follows: at most a
/// [`BEFORE_LEVEL3_SHARE`]th of `target` and [`BEFORE_LEVEL3_MAX_BYTES`], since level 3
/// keeps the summary whole and writes its entries into its own notice's section too.
pub fn before_level3(target: usize) -> usize {
    (target / BEFORE_LEVEL3_SHARE).min(BEFORE_LEVEL3_MAX_BYTES)
}

/// The section for `entries` (oldest first) in at most `room` bytes; empty when not even the
/// heading fits.
pub fn section(entries: &[Artifact], folded: u64, marker: Option<&str>, room: usize) -> String {
    let heading = format!("\n\n{HEADING}]\n");
    let fold_line = |n: u64| match marker {
        Some(k) => format!("{n} more not shown: recall {k}\n"),
        None => format!("{n} more not shown\n"),
    };
    // The fold line's room is kept back whatever happens (its count has at most 20 digits).
    let fold_room = fold_line(u64::MAX).len();
    if heading.len() + fold_room > room {
        return String::new();
    }
    let budget = room - heading.len() - fold_room;
    let skip = vec![false; entries.len()];
    let chosen = choose(entries, &skip, budget, |a| {
        format!("{} {}\n", label(a.category), one_line(&a.text))
    });
    let mut out = heading;
    for (_, line) in &chosen.lines {
        out.push_str(line);
    }
    let omitted = folded + chosen.omitted();
    if omitted > 0 {
        out.push_str(&fold_line(omitted));
    }
    out
}

/// The entries [`choose`] shows, as lines in the order they were touched, and how many it
/// could not show.
#[derive(Clone, Debug, Default)]
pub struct Chosen {
    /// `(index in entries, line)`, oldest first.
    pub lines: Vec<(usize, String)>,
    /// Entries neither shown, nor skipped as in sight elsewhere, nor named by a shown line,
    /// by category (in the order of [`Category::ALL`]).
    pub omitted: [u64; 4],
}

impl Chosen {
    /// Entries of `category` not shown.
    pub fn omitted_in(&self, category: Category) -> u64 {
        Category::ALL
            .iter()
            .position(|c| *c == category)
            .map_or(0, |i| self.omitted[i])
    }

    /// Entries not shown, in all.
    pub fn omitted(&self) -> u64 {
        self.omitted.iter().sum()
    }
}

/// Which of `entries` (oldest first) are shown in `budget` bytes, each as `line(entry)`:
/// those `skip` marks (in sight elsewhere) cost nothing; then files and commands, the newest
/// errors, the newest requests, newest first within a category, so a short budget keeps
/// the latest. An entry left out whose text a shown line holds (a path inside a command) is
/// in sight all the same and not counted as omitted.
pub fn choose(
    entries: &[Artifact],
    skip: &[bool],
    mut budget: usize,
    line: impl Fn(&Artifact) -> String,
) -> Chosen {
    let mut lines: Vec<(usize, String)> = Vec::new();
    let mut left: Vec<usize> = Vec::new();
    for category in Category::ALL {
        for (i, a) in entries
            .iter()
            .enumerate()
            .rev()
            .filter(|(i, a)| a.category == category && !skip.get(*i).copied().unwrap_or(false))
        {
            let l = line(a);
            if l.len() <= budget {
                budget -= l.len();
                lines.push((i, l));
            } else {
                left.push(i);
            }
        }
    }
    let mut omitted = [0u64; 4];
    for i in left {
        let text = one_line(&entries[i].text);
        if !lines.iter().any(|(_, l)| l.contains(text.as_ref()))
            && let Some(c) = Category::ALL.iter().position(|c| *c == entries[i].category)
        {
            omitted[c] += 1;
        }
    }
    lines.sort_by_key(|(i, _)| *i);
    Chosen { lines, omitted }
}

fn label(category: Category) -> &'static str {
    match category {
        Category::Files => "file",
        Category::Commands => "command",
        Category::Errors => "error",
        Category::Requests => "request",
    }
}

/// A multi-line entry on one line (its newlines as `\n`), so each entry is one line.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\n') {
        std::borrow::Cow::Owned(text.replace('\n', "\\n"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}
