//! Prose (documentation, web pages, long answers): the opening and closing lines, every
//! heading, and the first line of every paragraph — the skeleton a reader skims.

use super::lines;
use super::profile::Limits;

fn is_heading(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with('#') || t.starts_with("==") || t.starts_with("--")
}

pub fn compress(text: &str, limits: &Limits, marker: &str) -> Option<String> {
    let all = lines::split(text);
    let mut keep = vec![false; all.len()];
    let mut previous_blank = true;
    for (i, line) in all.iter().enumerate() {
        let content = lines::content(line);
        let blank = content.trim().is_empty();
        keep[i] = is_heading(content) || (previous_blank && !blank);
        previous_blank = blank;
    }
    lines::keep_ends(&mut keep, limits.head_lines / 2, limits.tail_lines / 2);
    lines::emit(&all, &keep, marker)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_crds::policy::CompressionProfile;

    #[test]
    fn headings_and_paragraph_openings_stay() {
        let mut text = String::from("# Title\n\n");
        for p in 0..30 {
            text.push_str(&format!("Paragraph {p} opens here.\n"));
            for l in 0..6 {
                text.push_str(&format!(
                    "detail line {l} of paragraph {p}, which goes on.\n"
                ));
            }
            text.push('\n');
        }
        let out = compress(
            &text,
            &Limits::of(CompressionProfile::Aggressive),
            "<<ccr:0123456789abcdef>>",
        )
        .expect("dropped");
        assert!(out.starts_with("# Title\n"));
        for p in 0..30 {
            assert!(out.contains(&format!("Paragraph {p} opens here.\n")));
        }
        assert!(!out.contains("detail line 3 of paragraph 15"));
    }
}
