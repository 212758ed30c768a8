//! Text surgery shared by the passes: head+tail cuts at line boundaries, content-kind
//! detection, and the banners and stubs cairn writes in place of archived text.
//!
//! Sizes are in bytes of UTF-8 (what a request really carries); cuts always land on
//! character boundaries, and on line boundaries when a newline is near.

use std::sync::LazyLock;

use memchr::memmem;

use crate::artifacts::{self, Category};
use crate::ccr::Key;
use crate::history::Message;
use crate::utf8::{ceil_boundary, floor_boundary};

/// Every banner and stub cairn writes starts with this, so passes recognise their own work.
pub const BANNER_PREFIX: &str = "[cairn: ";

/// A head of at most `max` bytes, ending after a newline when one is in the second half of
/// the allowance (so a cut never splits a line unless the line is huge).
pub fn head(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let end = floor_boundary(s, max);
    let candidate = &s[..end];
    match candidate.rfind('\n') {
        Some(nl) if nl + 1 >= end / 2 => &s[..nl + 1],
        _ => candidate,
    }
}

/// A tail of at most `max` bytes, starting after a newline when one is in the first half of
/// the allowance.
pub fn tail(s: &str, max: usize) -> &str {
    if max == 0 {
        return "";
    }
    if s.len() <= max {
        return s;
    }
    let start = ceil_boundary(s, s.len() - max);
    let candidate = &s[start..];
    match candidate.find('\n') {
        Some(nl) if nl < candidate.len() / 2 => &candidate[nl + 1..],
        _ => candidate,
    }
}

/// Lines in `s` (a trailing partial line counts).
pub fn line_count(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        count_newlines(s.as_bytes()) + usize::from(!s.ends_with('\n'))
    }
}

/// Newlines in `bytes`. Tool outputs are megabytes and every stub and banner states the line
/// count of its original, so this is written for the vectoriser: a byte-wide counter per run
/// of 255 bytes cannot overflow, and that loop compiles to wide compares and adds.
pub fn count_newlines(bytes: &[u8]) -> usize {
    bytes
        .chunks(255)
        .map(|run| {
            let n = run
                .iter()
                .fold(0u8, |n, &b| n.wrapping_add(u8::from(b == b'\n')));
            usize::from(n)
        })
        .sum()
}

/// A coarse label of what a text is, for stubs: the model decides from it whether to recall.
pub fn detect_kind(s: &str) -> &'static str {
    let t = s.trim_start();
    let sample = &t[..floor_boundary(t, SAMPLE)];
    let end = t.trim_end();
    // Shape only: parsing a multi-megabyte output just to label it would cost more than the
    // whole pass.
    if (t.starts_with('{') && end.ends_with('}')) || (t.starts_with('[') && end.ends_with(']')) {
        return "json";
    }
    if sample.starts_with("diff --git")
        || sample.starts_with("--- ")
        || sample.contains("\n@@ ")
        || sample.starts_with("@@ ")
    {
        return "diff";
    }
    // Every stub labels its original, so the checks below work on one upper-cased copy of the
    // sample on the stack, with vectorised searches instead of per-line scans.
    let mut buf = [0u8; SAMPLE];
    let upper = &mut buf[..sample.len()];
    upper.copy_from_slice(sample.as_bytes());
    upper.make_ascii_uppercase();
    let upper = &*upper;
    if finders().html.find(upper).is_some() {
        return "html";
    }
    let mut lines = [""; 40];
    let mut n = 0;
    for (slot, line) in lines.iter_mut().zip(sample.lines()) {
        *slot = line;
        n += 1;
    }
    let lines = &lines[..n];
    // Line `k` of the sample ends before `ends[k]` (its newline, or the end of the sample).
    let mut ends = [sample.len(); 40];
    for (end, nl) in ends.iter_mut().zip(memchr::memchr_iter(b'\n', upper)) {
        *end = nl;
    }
    let mut loggy_lines = 0u64;
    for level in &finders().levels {
        for at in level.find_iter(upper) {
            let k = ends[..n].partition_point(|&e| e < at);
            if k < n {
                loggy_lines |= 1 << k;
            }
        }
    }
    for (k, l) in lines.iter().enumerate() {
        if l.starts_with("20") && l.len() > 10 && l.as_bytes().get(4) == Some(&b'-') {
            loggy_lines |= 1 << k;
        }
    }
    let loggy = loggy_lines.count_ones() as usize;
    let n = n.max(1);
    if loggy * 3 >= n && loggy > 0 {
        return "log";
    }
    let code = lines
        .iter()
        .filter(|l| {
            let l = l.trim();
            l.ends_with('{')
                || l.ends_with(';')
                || l.ends_with(':')
                || l.starts_with("fn ")
                || l.starts_with("def ")
                || l.starts_with("import ")
                || l.starts_with("use ")
                || l.starts_with("pub ")
                || l.starts_with("func ")
                || l.starts_with("class ")
                || l == "}"
        })
        .count();
    if code * 4 >= n && code > 1 {
        return "source";
    }
    "text"
}

/// Bytes of an output [`detect_kind`] looks at.
const SAMPLE: usize = 4096;

/// The upper-case words [`detect_kind`] searches for, built once.
struct KindFinders {
    html: memmem::Finder<'static>,
    levels: [memmem::Finder<'static>; 4],
}

fn finders() -> &'static KindFinders {
    static FINDERS: LazyLock<KindFinders> = LazyLock::new(|| KindFinders {
        html: memmem::Finder::new(b"<HTML"),
        levels: [b"ERROR".as_slice(), b"WARN", b"INFO", b"DEBUG"].map(memmem::Finder::new),
    });
    &FINDERS
}

/// Statistics of an archived original, written into banners and stubs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    pub chars: usize,
    pub lines: usize,
    pub kind: &'static str,
}

impl Stats {
    pub fn of(s: &str) -> Self {
        Self {
            chars: s.len(),
            lines: line_count(s),
            kind: detect_kind(s),
        }
    }
}

/// The banner between head and tail of a truncated text.
pub fn omission_banner(st: Stats, omitted_chars: usize, omitted_lines: usize, key: &Key) -> String {
    format!(
        "\n{BANNER_PREFIX}{omitted_chars} of {} chars ({omitted_lines} of {} lines, {}) omitted; full original: {}]\n",
        st.chars,
        st.lines,
        st.kind,
        key.marker()
    )
}

/// Head + banner + tail of `original`, archived under `key`, fitting `max` bytes when it
/// can (the banner is never cut). `None` when the preview would not be shorter.
pub fn preview(original: &str, head_max: usize, tail_max: usize, key: &Key) -> Option<String> {
    let total_newlines = count_newlines(original.as_bytes());
    let st = Stats {
        chars: original.len(),
        lines: total_newlines + usize::from(!original.is_empty() && !original.ends_with('\n')),
        kind: detect_kind(original),
    };
    let h = head(original, head_max);
    let t = tail(&original[h.len()..], tail_max);
    let omitted = &original[h.len()..original.len() - t.len()];
    let omitted_newlines =
        total_newlines - count_newlines(h.as_bytes()) - count_newlines(t.as_bytes());
    let omitted_lines = if omitted.is_empty() {
        0
    } else {
        omitted_newlines + usize::from(!omitted.ends_with('\n'))
    };
    let banner = omission_banner(st, omitted.len(), omitted_lines, key);
    let out_len = h.len() + banner.len() + t.len();
    if out_len >= original.len() {
        return None;
    }
    let mut out = String::with_capacity(out_len);
    out.push_str(h);
    out.push_str(&banner);
    out.push_str(t);
    Some(out)
}

/// A preview that fits in `max` bytes total, head and tail in a 3:1 ratio. Byte-stable: the
/// same original and `max` always give the same text.
pub fn preview_within(original: &str, max: usize, key: &Key) -> Option<String> {
    let st = Stats::of(original);
    let banner_len = omission_banner(st, original.len(), st.lines, key).len();
    let room = max.saturating_sub(banner_len);
    let text = preview(original, room * 3 / 4, room / 4, key)?;
    (text.len() <= max.max(banner_len)).then_some(text)
}

/// A one-line typed stub for an archived original.
pub fn stub(what: &str, st: Stats, key: &Key) -> String {
    format!(
        "{BANNER_PREFIX}{what} archived: {} lines, {} chars, {}; recall {}]",
        st.lines,
        st.chars,
        st.kind,
        key.marker()
    )
}

/// The line that opens the error lines a cut keeps in sight.
pub const KEPT_ERRORS: &str = "[cairn: error lines of the archived original]";

/// The error lines of tool result `m` that a cut must keep in sight: those its content shows
/// and those its ledger recorded from earlier cuts ([`super::ledger::note_cut`]), distinct,
/// in that order.
pub fn errors_to_keep(m: &Message) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let found = m
        .meta
        .ledger
        .iter()
        .cloned()
        .chain(artifacts::of_message(m));
    for a in found.filter(|a| a.category == Category::Errors) {
        if !out.contains(&a.text) {
            out.push(a.text);
        }
    }
    out
}

/// `cut`, the text that replaces tool result `m`'s content (a stub, a preview), with the
/// error lines of `m` ([`errors_to_keep`]) that `cut` does not show, one a line after
/// [`KEPT_ERRORS`]: every pass that cuts a result in place writes its text through here, so
/// no cut hides an error. Byte-stable. `None` when the text would not be shorter than `m`'s
/// content: the cut is not worth making.
pub fn keeping_errors(cut: String, m: &Message) -> Option<String> {
    let text = with_errors(cut, &errors_to_keep(m));
    (text.len() < m.content.len()).then_some(text)
}

/// `cut` with those of `errors` it does not show appended after [`KEPT_ERRORS`].
pub fn with_errors(mut cut: String, errors: &[String]) -> String {
    let missing: Vec<&String> = errors
        .iter()
        .filter(|e| !cut.contains(e.as_str()))
        .collect();
    if missing.is_empty() {
        return cut;
    }
    cut.push('\n');
    cut.push_str(KEPT_ERRORS);
    for e in missing {
        cut.push('\n');
        cut.push_str(e);
    }
    cut
}

/// Parses the statistics back out of a banner or stub cairn wrote (used to turn a preview
/// into a stub without fetching the original).
pub fn parse_stats(text: &str) -> Option<Stats> {
    let start = text.find(BANNER_PREFIX)?;
    let rest = &text[start + BANNER_PREFIX.len()..];
    let rest = &rest[..rest.find(']')?];
    // "N of C chars (M of L lines, KIND) omitted; ..."
    let (_, after_of) = rest.split_once(" of ")?;
    let (chars, after) = after_of.split_once(" chars (")?;
    let (_, after) = after.split_once(" of ")?;
    let (lines, after) = after.split_once(" lines, ")?;
    let (kind, _) = after.split_once(')')?;
    Some(Stats {
        chars: chars.parse().ok()?,
        lines: lines.parse().ok()?,
        kind: static_kind(kind),
    })
}

fn static_kind(k: &str) -> &'static str {
    match k {
        "json" => "json",
        "diff" => "diff",
        "html" => "html",
        "log" => "log",
        "source" => "source",
        _ => "text",
    }
}

/// True when `text` is (or contains) a banner or stub cairn wrote.
pub fn is_ours(text: &str) -> bool {
    quotes_marker(text) && text.contains(BANNER_PREFIX)
}

/// True when `text` carries a canonical marker (a vectorised search for `<<ccr:`, then the
/// strict parser at each hit).
pub fn quotes_marker(text: &str) -> bool {
    crate::ccr::has_marker(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newline_count_matches_a_plain_count_at_every_block_edge() {
        // Lengths around the 32-byte rows and the 255-row blocks, dense and sparse newlines.
        for len in [0, 1, 31, 32, 33, 8159, 8160, 8161, 20_000] {
            for every in [1, 2, 7, 64] {
                let bytes: Vec<u8> = (0..len)
                    .map(|i| if i % every == 0 { b'\n' } else { b'x' })
                    .collect();
                let plain = bytes.iter().filter(|&&b| b == b'\n').count();
                assert_eq!(count_newlines(&bytes), plain, "len {len}, every {every}");
            }
        }
    }

    #[test]
    fn kind_detection_ignores_case() {
        assert_eq!(detect_kind("<!doctype x><HTML><body>hi</body>"), "html");
        assert_eq!(
            detect_kind("t=1 level=error boom\nt=2 Warn disk\nt=3 ok\n"),
            "log"
        );
        assert_eq!(detect_kind("plain words and more words"), "text");
    }

    #[test]
    fn head_and_tail_cut_at_lines() {
        let s = "aaaa\nbbbb\ncccc\ndddd\n";
        assert_eq!(head(s, 12), "aaaa\nbbbb\n");
        assert_eq!(tail(s, 12), "cccc\ndddd\n");
        assert_eq!(head("héllo", 2), "h");
    }

    #[test]
    fn preview_round_trips_stats() {
        let original: String = (0..500).map(|i| format!("line {i}\n")).collect();
        let key = Key::of(original.as_bytes());
        let p = preview(&original, 200, 50, &key).expect("shorter");
        assert!(p.starts_with("line 0\n"));
        assert!(p.ends_with("line 499\n"));
        assert!(p.contains(&key.marker()));
        let st = parse_stats(&p).expect("parses");
        assert_eq!(st, Stats::of(&original));
        let w = preview_within(&original, 1000, &key).expect("fits");
        assert!(w.len() <= 1000);
        assert_eq!(w, preview_within(&original, 1000, &key).expect("fits"));
    }

    #[test]
    fn newline_count_matches_naive() {
        for s in [
            "",
            "\n",
            "a\nb",
            "\n\n\n\n\n\n\n\n\n",
            "ab\ncd\nef\ngh\nij\nkl\nmn\nop\nqr\n\u{e9}\u{0a}\u{7f}\u{8a}",
        ] {
            let naive = s.bytes().filter(|&b| b == b'\n').count();
            assert_eq!(count_newlines(s.as_bytes()), naive, "{s:?}");
        }
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 256) as u8).collect();
        let naive = bytes.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(count_newlines(&bytes), naive);
    }

    #[test]
    fn kinds() {
        assert_eq!(detect_kind("{\"a\": 1}"), "json");
        assert_eq!(detect_kind("diff --git a/x b/x\n@@ -1 +1 @@\n"), "diff");
        assert_eq!(
            detect_kind("2024-01-01 INFO start\n2024-01-01 ERROR boom\n"),
            "log"
        );
        assert_eq!(detect_kind("fn main() {\n    let x = 1;\n}\n"), "source");
        assert_eq!(detect_kind("hello there"), "text");
    }
}
