//! Source code: the outline stays — imports, declarations, signatures, top-level structure and
//! the file's ends — and bodies become notes. Enough to navigate and decide what to recall.

use super::lines;
use super::profile::Limits;

/// Openings of lines that declare something, across the common languages.
const DECLARATIONS: [&str; 33] = [
    "fn ",
    "pub ",
    "async fn",
    "impl",
    "trait ",
    "struct ",
    "enum ",
    "mod ",
    "use ",
    "type ",
    "static ",
    "def ",
    "async def",
    "class ",
    "import ",
    "from ",
    "func ",
    "package ",
    "interface ",
    "function ",
    "export ",
    "module ",
    "#include",
    "#define",
    "#[",
    "@",
    "public ",
    "private ",
    "protected ",
    "namespace ",
    "template",
    "extern ",
    "unsafe ",
];

pub fn is_declaration(line: &str) -> bool {
    let t = line.trim_start();
    DECLARATIONS.iter().any(|d| t.starts_with(d))
}

pub fn compress(text: &str, limits: &Limits, marker: &str) -> Option<String> {
    let all = lines::split(text);
    let mut keep: Vec<bool> = all
        .iter()
        .map(|l| {
            let content = lines::content(l);
            !content.trim().is_empty()
                && (lines::indent(content) <= limits.code_indent || is_declaration(content))
        })
        .collect();
    lines::keep_ends(&mut keep, limits.head_lines / 2, limits.tail_lines / 2);
    lines::emit(&all, &keep, marker)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_crds::policy::CompressionProfile;

    #[test]
    fn outline_stays_bodies_go() {
        let mut src = String::from("use std::fmt;\n\n");
        for f in 0..20 {
            src.push_str(&format!("/// Doc {f}.\npub fn f{f}(x: u32) -> u32 {{\n"));
            for i in 0..15 {
                src.push_str(&format!("    let v{i} = x + {i};\n"));
            }
            src.push_str("    x\n}\n\n");
        }
        let out = compress(
            &src,
            &Limits::of(CompressionProfile::Default),
            "<<ccr:0123456789abcdef>>",
        )
        .expect("dropped");
        for f in 0..20 {
            assert!(out.contains(&format!("pub fn f{f}(x: u32) -> u32 {{\n")));
        }
        assert!(out.contains("use std::fmt;\n"));
        assert!(out.len() < src.len() / 2);
    }
}
