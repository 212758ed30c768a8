//! The sections of a level-2 stand-in that cairn writes itself: *Files and code* (the files
//! and commands of the messages the summary replaced), *Errors and fixes* (their error lines)
//! and *All user messages (verbatim)* (the user's requests, a long one as its head and tail),
//! filled from the stand-in's ledger ([`super::ledger`]) whatever the summarizer wrote. The
//! summarizer's own text stays under each heading, after cairn's lines.
//!
//! Deterministic, in the room actually left under the compaction's target:
//!
//! - an entry the rest of the history already shows is not repeated;
//! - when the lines do not fit, the summarizer's text gives way first: each of its sections
//!   is cut to its head, down to a [`SUMMARY_FLOOR_SHARE`]th of the target in all, after its
//!   whole text was archived (as a one-message segment, [`summary_key`]); a line names it by
//!   its marker;
//! - [`Width::Wide`] (the compaction scored below `quality.minScore`) also cuts the largest
//!   messages of the kept tail towards their floor, each archived first with its error lines
//!   kept ([`emergency::shrink_largest`]);
//! - files and commands come first, then the newest errors, then the newest requests
//!   ([`ledger::choose`]); what still does not fit is counted in its section on a line that
//!   carries the segment's marker.
//!
//! Each block cairn writes opens with [`BLOCK_OPEN`] and ends at the first blank line after
//! it, so [`summarizer_text`] gives back what the summarizer wrote.

use crate::artifacts::{Artifact, Category};
use crate::ccr::{Key, Store};
use crate::history::{self, Message};

use super::archive::{archive_all, segment_text};
use super::ledger::{self, Width, one_line};
use super::summarize::SECTIONS;
use super::{PassReport, emergency, probe, text};

/// First line of each block cairn writes into a summary's section.
pub const BLOCK_OPEN: &str = "[cairn, from the history]";
/// The summarizer's text keeps at least this fraction (1/N) of the target when cairn's lines
/// need the room (or all of it, when shorter).
pub const SUMMARY_FLOOR_SHARE: usize = 10;

/// The sections cairn fills, by their index in [`SECTIONS`], and what each shows.
const FILLED: [(usize, &[Category]); 3] = [
    (2, &[Category::Files, Category::Commands]),
    (3, &[Category::Errors]),
    (5, &[Category::Requests]),
];

/// The room the blocks may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// What the history leaves under the target, the summarizer's text giving way first.
    UnderTarget(Width),
    /// At most this many bytes, the summarizer's text kept whole (level 3 follows: it keeps
    /// the stand-in and cuts around it).
    AtMost(usize),
}

/// The level-2 stand-in's opening line starts with this.
fn is_level2(m: &Message) -> bool {
    m.meta.is_summary
        && m.content.starts_with(&format!(
            "{}{}",
            text::BANNER_PREFIX,
            super::summarize::BANNER
        ))
}

/// Fills the sections of the newest level-2 stand-in not filled yet, in `room` under
/// `target`. Archives what it cuts first, naming the keys in `report`. Returns whether a
/// stand-in was filled.
pub async fn fill_newest(
    history: &mut [Message],
    target: usize,
    room: Room,
    store: &dyn Store,
    report: &mut PassReport,
) -> bool {
    let Some(i) = history
        .iter()
        .rposition(|m| is_level2(m) && !m.content.contains(BLOCK_OPEN))
    else {
        return false;
    };
    let raw = history[i].content.clone();
    let (banner, summary) = match raw.find("\n\n") {
        Some(at) => raw.split_at(at + 2),
        None => (raw.as_str(), ""),
    };
    let entries = history[i].meta.ledger.clone();
    let folded = history[i].meta.ledger_folded;
    let elsewhere = |h: &[Message]| {
        probe::in_sight(
            &entries,
            h.iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, m)| m),
        )
    };
    let mut skip = elsewhere(history);
    let marker = history[i]
        .meta
        .archived
        .first()
        .and_then(|k| Key::parse(k))
        .map(|k| k.marker())
        .unwrap_or_default();
    let need = lines_weight(&entries, &skip) + overhead(&marker, folded);
    let rest = |h: &[Message]| history::weight(h) - h[i].content.len() + banner.len();
    // The bytes the summarizer's text and the blocks may take together, and the summary's.
    let (total, summary_room) = match room {
        Room::AtMost(bytes) => (summary.len() + bytes, summary.len()),
        Room::UnderTarget(width) => {
            let floor = summary.len().min(target / SUMMARY_FLOOR_SHARE);
            let mut left = target.saturating_sub(rest(history));
            if width == Width::Wide && need + floor > left {
                // The kept tail gives way too, to what the rest leaves it.
                let tail: usize = history[i + 1..].iter().map(Message::weight).sum();
                let goal = target.saturating_sub(rest(history) - tail + need + floor);
                emergency::shrink_largest(&mut history[i + 1..], goal, store, report).await;
                skip = elsewhere(history);
                left = target.saturating_sub(rest(history));
            }
            (left, left.saturating_sub(need).clamp(floor, summary.len()))
        }
    };
    // The summary is cut only once its whole text is archived; a store that fails leaves it
    // whole and the blocks take what room is left.
    let mut cut_key = None;
    if summary_room < summary.len() {
        match archive_all(store, &[archived_form(summary).as_bytes()]).await {
            Ok(keys) if !keys.is_empty() => {
                if !report.archived.contains(&keys[0]) {
                    report.archived.push(keys[0]);
                }
                cut_key = Some((keys[0], cut_note(&keys[0])));
            }
            Ok(_) => {}
            Err(e) => report.archive_error = Some(e.label()),
        }
    }
    let own = match &cut_key {
        Some((_, note)) => cut_summary(summary, summary_room.saturating_sub(note.len())),
        None => summary.to_owned(),
    };
    let taken = own.len() + cut_key.as_ref().map_or(0, |(_, n)| n.len());
    let budget = total
        .saturating_sub(taken)
        .saturating_sub(overhead(&marker, folded));
    let chosen = ledger::choose(&entries, &skip, budget, line);
    let mut content = banner.to_owned();
    if let Some((key, note)) = &cut_key {
        content.push_str(note);
        let m = &mut history[i];
        if !m.meta.archived.contains(&key.as_str().to_owned()) {
            m.meta.archived.push(key.as_str().to_owned());
        }
    }
    if folded > 0 {
        content.push_str(&fold_line(folded, "older entries folded", &marker));
    }
    content.push_str(&compose(&own, &entries, &chosen, &marker));
    history[i].content = content;
    true
}

/// How a cut summary's whole text is archived: a segment of one message, so the markers it
/// quotes (summarizers are asked to keep them) are escaped as in any segment.
fn archived_form(summary: &str) -> String {
    segment_text(&[Message::user(summary)])
}

/// The key under which the whole text of a summary cut to fit is archived.
pub fn summary_key(summary: &str) -> Key {
    Key::of(archived_form(summary).as_bytes())
}

/// What the summarizer wrote in a stand-in's `content`: the content without cairn's blocks.
pub fn summarizer_text(content: &str) -> String {
    let mut out = String::with_capacity(content.len());
    let mut rest = content;
    while let Some(at) = rest.find(BLOCK_OPEN) {
        out.push_str(&rest[..at]);
        rest = match rest[at..].find("\n\n") {
            Some(end) => &rest[at + end + 2..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// How an entry reads in its block.
fn line(a: &Artifact) -> String {
    match a.category {
        Category::Commands => format!("$ {}\n", one_line(&a.text)),
        _ => format!("{}\n", one_line(&a.text)),
    }
}

fn lines_weight(entries: &[Artifact], skip: &[bool]) -> usize {
    entries
        .iter()
        .zip(skip)
        .filter(|(_, s)| !**s)
        .map(|(a, _)| line(a).len())
        .sum()
}

/// The bytes the blocks take besides their entries: the opening lines, the blank lines that
/// end them, a count line each, and the headings a summary without them gets.
fn overhead(marker: &str, folded: u64) -> usize {
    let count = fold_line(u64::MAX, "more not shown", marker).len();
    let headings: usize = FILLED.iter().map(|(k, _)| SECTIONS[*k].len() + 5).sum();
    let folded = if folded > 0 {
        fold_line(folded, "older entries folded", marker).len()
    } else {
        0
    };
    FILLED.len() * (BLOCK_OPEN.len() + 2 + count) + headings + folded
}

fn fold_line(n: u64, what: &str, marker: &str) -> String {
    if marker.is_empty() {
        format!("{}{n} {what}]\n", text::BANNER_PREFIX)
    } else {
        format!("{}{n} {what}: recall {marker}]\n", text::BANNER_PREFIX)
    }
}

fn cut_note(key: &Key) -> String {
    format!(
        "{}the summary below was cut to fit the window; the whole summary: recall {}]\n",
        text::BANNER_PREFIX,
        key.marker()
    )
}

/// `summary` in at most `max` bytes: each section (and the text before the first) cut to
/// its head, the longest first, so short sections stay whole.
fn cut_summary(summary: &str, max: usize) -> String {
    let parts = split(summary);
    let bodies: Vec<&str> = parts.iter().map(|p| p.1).collect();
    let fixed: usize = parts.iter().map(|p| p.0.len()).sum();
    let allowance = water_level(&bodies, max.saturating_sub(fixed));
    let mut out = String::with_capacity(max);
    for (heading, body) in parts {
        out.push_str(heading);
        if body.len() <= allowance {
            out.push_str(body);
        } else {
            // "…" is three bytes, with a newline four.
            let head = text::head(body, allowance.saturating_sub(4));
            out.push_str(head);
            // The next heading starts a line of its own.
            out.push_str(if head.ends_with('\n') || body.ends_with('\n') {
                "…\n"
            } else {
                "…"
            });
        }
    }
    out
}

/// The largest `c` with `Σ min(len, c)` of `bodies` at most `budget`.
fn water_level(bodies: &[&str], budget: usize) -> usize {
    let mut lens: Vec<usize> = bodies.iter().map(|b| b.len()).collect();
    lens.sort_unstable();
    let mut spent = 0;
    for (n, len) in lens.iter().enumerate() {
        let others = lens.len() - n;
        if spent + len * others > budget {
            return (budget - spent) / others;
        }
        spent += len;
    }
    usize::MAX
}

/// `summary` split at the headings of its nine sections: `(heading line, body)` pairs, the
/// first with an empty heading for the text before the first heading. One part, all body,
/// when the headings are not found in order at the starts of lines.
fn split(summary: &str) -> Vec<(&str, &str)> {
    let mut starts: Vec<(usize, usize)> = Vec::new();
    let mut from = 0;
    for heading in SECTIONS {
        let Some(at) = find_ascii_ci(summary, heading, from) else {
            return vec![("", summary)];
        };
        let line_start = summary[..at].rfind('\n').map_or(0, |n| n + 1);
        let line_end = summary[at..]
            .find('\n')
            .map_or(summary.len(), |n| at + n + 1);
        starts.push((line_start, line_end));
        from = line_end;
    }
    let mut parts = vec![("", &summary[..starts[0].0])];
    for (n, (line_start, line_end)) in starts.iter().enumerate() {
        let next = starts.get(n + 1).map_or(summary.len(), |s| s.0);
        parts.push((&summary[*line_start..*line_end], &summary[*line_end..next]));
    }
    parts
}

/// Where `needle` (ASCII) first occurs in `hay` at or after `from`, ASCII case ignored.
fn find_ascii_ci(hay: &str, needle: &str, from: usize) -> Option<usize> {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    (from..=h.len().checked_sub(n.len())?)
        .find(|&i| hay.is_char_boundary(i) && h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// The summarizer's text `own` with cairn's blocks under their headings: each after its
/// section's heading line, or, when `own` has no such headings, after it under headings of
/// their own.
fn compose(own: &str, entries: &[Artifact], chosen: &ledger::Chosen, marker: &str) -> String {
    let block = |categories: &[Category]| {
        let lines: Vec<&str> = chosen
            .lines
            .iter()
            .filter(|(i, _)| categories.contains(&entries[*i].category))
            .map(|(_, l)| l.as_str())
            .collect();
        let omitted: u64 = categories.iter().map(|c| chosen.omitted_in(*c)).sum();
        if lines.is_empty() && omitted == 0 {
            return String::new();
        }
        let mut b = format!("{BLOCK_OPEN}\n");
        b.extend(lines);
        if omitted > 0 {
            b.push_str(&fold_line(omitted, "more not shown", marker));
        }
        b.push('\n');
        b
    };
    let parts = split(own);
    let mut out = String::with_capacity(own.len() + 1_024);
    if parts.len() == 1 {
        out.push_str(own.trim_end());
        for (k, categories) in FILLED {
            out.push_str(&format!("\n\n{}. {}\n", k + 1, SECTIONS[k]));
            out.push_str(block(categories).trim_end());
        }
        return out;
    }
    for (n, (heading, body)) in parts.into_iter().enumerate() {
        out.push_str(heading);
        if n > 0 && !heading.ends_with('\n') {
            out.push('\n');
        }
        if let Some((_, categories)) = FILLED.iter().find(|(k, _)| n == k + 1) {
            out.push_str(&block(categories));
        }
        out.push_str(body);
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nine(body: &str) -> String {
        SECTIONS
            .iter()
            .enumerate()
            .map(|(n, s)| format!("{}. {s}\n{body}\n", n + 1))
            .collect()
    }

    #[test]
    fn a_summary_splits_at_its_nine_headings_whatever_their_case() {
        let s = format!("Preamble.\n{}", nine("text").to_uppercase());
        let parts = split(&s);
        assert_eq!(parts.len(), 10);
        assert_eq!(parts[0], ("", "Preamble.\n"));
        assert_eq!(parts[3], ("3. FILES AND CODE\n", "TEXT\n"));
        let joined: String = parts.iter().map(|(h, b)| format!("{h}{b}")).collect();
        assert_eq!(joined, s);
        // Out of order: one part.
        let swapped = s
            .replace("PENDING TASKS", "X")
            .replace("CURRENT WORK", "PENDING TASKS");
        assert_eq!(split(&swapped).len(), 1);
    }

    #[test]
    fn a_cut_summary_keeps_every_heading_and_short_sections_whole() {
        let mut s = nine("short");
        s = s.replace(
            "4. Errors and fixes\nshort",
            &format!("4. Errors and fixes\n{}", "long words ".repeat(200)),
        );
        let cut = cut_summary(&s, 600);
        assert!(cut.len() <= 600, "{}", cut.len());
        for h in SECTIONS {
            assert!(cut.contains(h), "{h}");
        }
        assert_eq!(cut.matches("short").count(), 8);
        assert!(cut.contains("4. Errors and fixes\nlong words long"));
        assert!(cut.contains("…\n5. Problem solving"), "{cut}");
    }

    #[test]
    fn blocks_open_after_their_headings_and_strip_back_out() {
        let own = nine("The summarizer's words.");
        let entries = vec![
            Artifact {
                category: Category::Files,
                text: "src/lib.rs".into(),
            },
            Artifact {
                category: Category::Errors,
                text: "error[E0308]: mismatched types".into(),
            },
            Artifact {
                category: Category::Requests,
                text: "fix the build".into(),
            },
        ];
        let chosen = ledger::choose(&entries, &[false; 3], 10_000, line);
        let filled = compose(&own, &entries, &chosen, "<<ccr:0123456789abcdef>>");
        assert!(filled.contains(&format!(
            "3. Files and code\n{BLOCK_OPEN}\nsrc/lib.rs\n\nThe summarizer's words."
        )));
        assert!(filled.contains("4. Errors and fixes\n[cairn, from the history]\nerror[E0308]"));
        assert!(filled.contains("(verbatim)\n[cairn, from the history]\nfix the build\n\n"));
        assert_eq!(summarizer_text(&filled), own.trim_end());
        // A summary without the headings gets its own.
        let plain = compose("Just prose.", &entries, &chosen, "");
        assert!(plain.starts_with("Just prose.\n\n3. Files and code\n"));
        assert!(
            plain.contains(
                "6. All user messages (verbatim)\n[cairn, from the history]\nfix the build"
            )
        );
    }
}
