//! Line bookkeeping shared by the line-oriented compressors: which lines to keep, and one
//! note per dropped run naming how much went and where the original is.

/// Lines of `text` with their endings, so kept lines are reproduced byte for byte.
pub fn split(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// The line without its ending.
pub fn content(line: &str) -> &str {
    line.trim_end_matches(['\n', '\r'])
}

/// The note that replaces a dropped run.
pub fn note(what: &str, marker: &str) -> String {
    format!("[... {what} omitted; full original: {marker}]\n")
}

/// Kept lines verbatim, each dropped run replaced by one note — unless the note would be
/// longer than the run, which then stays. `None` when nothing is dropped.
pub fn emit(lines: &[&str], keep: &[bool], marker: &str) -> Option<String> {
    let mut out = String::new();
    let mut run: &[&str] = &[];
    let mut run_start = 0;
    let mut dropped_any = false;
    for (i, (line, kept)) in lines.iter().zip(keep).enumerate() {
        if *kept {
            dropped_any |= flush(&mut out, run, marker);
            run = &[];
            out.push_str(line);
        } else {
            if run.is_empty() {
                run_start = i;
            }
            run = &lines[run_start..=i];
        }
    }
    dropped_any |= flush(&mut out, run, marker);
    dropped_any.then_some(out)
}

/// Writes a dropped run (as a note, or verbatim when that is shorter); true if it was dropped.
fn flush(out: &mut String, run: &[&str], marker: &str) -> bool {
    if run.is_empty() {
        return false;
    }
    let what = if run.len() == 1 {
        "1 line".to_owned()
    } else {
        format!("{} lines", run.len())
    };
    let note = note(&what, marker);
    let run_bytes: usize = run.iter().map(|l| l.len()).sum();
    if run_bytes <= note.len() {
        run.iter().for_each(|l| out.push_str(l));
        return false;
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&note);
    true
}

/// Keeps the first `head` and last `tail` lines.
pub fn keep_ends(keep: &mut [bool], head: usize, tail: usize) {
    let n = keep.len();
    for (i, k) in keep.iter_mut().enumerate() {
        if i < head || i + tail >= n {
            *k = true;
        }
    }
}

/// ASCII case-insensitive substring search without allocating.
pub fn contains_ci(haystack: &str, needle: &str) -> bool {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    n.is_empty() || h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

/// Leading spaces (a tab counts as four).
pub fn indent(line: &str) -> usize {
    line.chars()
        .take_while(|c| *c == ' ' || *c == '\t')
        .map(|c| if c == '\t' { 4 } else { 1 })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_keeps_lines_verbatim_and_notes_runs() {
        let long = "x".repeat(60) + "\n";
        let text = format!("a\n{long}{long}d\n{long}short\n");
        let lines = split(&text);
        let m = "<<ccr:0123456789abcdef>>";
        let out = emit(&lines, &[true, false, false, true, false, true], m).expect("dropped");
        assert_eq!(
            out,
            format!("a\n[... 2 lines omitted; full original: {m}]\nd\n{long}short\n")
        );
        assert_eq!(emit(&lines, &[true; 6], m), None);
    }
}
