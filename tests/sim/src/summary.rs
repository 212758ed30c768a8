//! What a model answers when it is asked for a summary and nothing was scripted: it follows
//! the request's instructions. A request whose text asks to "Summarize the conversation
//! transcript" and lists numbered sections ("1. Primary request and intent", ...) gets a
//! plain-text summary with each of those sections, in order, filled from the transcript: the
//! first line of each user message (quoted), the file paths, the error lines and the
//! `<<ccr:KEY>>` markers it holds. Its length follows the transcript's, as a real summary's
//! does, so it passes a quality gate that asks for the sections and a length in proportion.

use serde_json::Value;

/// The phrase that makes a request a summary request.
pub const SUMMARY_PHRASE: &str = "Summarize the conversation transcript";

/// Lines of each kind the summary quotes at most.
const MAX_ITEMS: usize = 12;

/// The summary `body` asks for, or `None` when it asks for none.
pub fn reply(body: &Value) -> Option<String> {
    let mut texts = Vec::new();
    strings(body, &mut texts);
    let instructions = texts.iter().find(|t| t.contains(SUMMARY_PHRASE))?;
    let sections = numbered_sections(instructions);
    if sections.len() < 3 {
        return None;
    }
    let transcript: Vec<&str> = texts
        .iter()
        .filter(|t| !t.contains(SUMMARY_PHRASE))
        .flat_map(|t| t.lines())
        .collect();
    let facts = Facts::read(&transcript);
    let mut out = String::new();
    for (n, title) in sections.iter().enumerate() {
        out.push_str(&format!("{}. {title}\n", n + 1));
        out.push_str(&facts.section(title));
        out.push('\n');
    }
    Some(out)
}

/// Every string value in `v`, depth first.
fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// The titles of the lines `N. Title` of `text`, numbered 1, 2, 3... in order.
fn numbered_sections(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let want = format!("{}. ", out.len() + 1);
        if let Some(title) = line.trim().strip_prefix(&want) {
            out.push(title.trim().to_string());
        }
    }
    out
}

/// What the transcript says, by kind.
#[derive(Default)]
struct Facts {
    requests: Vec<String>,
    paths: Vec<String>,
    errors: Vec<String>,
    markers: Vec<String>,
}

impl Facts {
    fn read(lines: &[&str]) -> Self {
        let mut f = Self::default();
        let mut user_next = false;
        for line in lines {
            let line = line.trim();
            if line.starts_with("--- ") && line.ends_with(" ---") {
                user_next = line == "--- user ---";
                continue;
            }
            if user_next && !line.is_empty() {
                push(&mut f.requests, line);
                user_next = false;
            }
            if line.to_lowercase().contains("error") {
                push(&mut f.errors, line);
            }
            for word in line.split(|c: char| c.is_whitespace() || "()[]{}\"',;".contains(c)) {
                if word.contains('/') && word.contains('.') && !word.contains("://") {
                    push(&mut f.paths, word.trim_end_matches(':'));
                }
            }
            let mut rest = line;
            while let Some(i) = rest.find("<<ccr:") {
                let Some(end) = rest[i..].find(">>") else {
                    break;
                };
                push(&mut f.markers, &rest[i..i + end + 2]);
                rest = &rest[i + end + 2..];
            }
        }
        f
    }

    /// The body of the section titled `title`.
    fn section(&self, title: &str) -> String {
        let t = title.to_lowercase();
        let list = |items: &[String], quote: bool| -> String {
            if items.is_empty() {
                return "- none\n".into();
            }
            items
                .iter()
                .map(|i| {
                    if quote {
                        format!("- \"{i}\"\n")
                    } else {
                        format!("- {i}\n")
                    }
                })
                .collect()
        };
        if t.contains("user messages") {
            list(&self.requests, true)
        } else if t.contains("request") || t.contains("intent") {
            match self.requests.first() {
                Some(r) => format!("The user asked: \"{r}\"\n"),
                None => "- none\n".into(),
            }
        } else if t.contains("files") {
            let mut s = list(&self.paths, false);
            if !self.markers.is_empty() {
                s.push_str("Archived originals:\n");
                s.push_str(&list(&self.markers, false));
            }
            s
        } else if t.contains("error") {
            list(&self.errors, false)
        } else if t.contains("current work") {
            match self.requests.last() {
                Some(r) => format!("Working on: \"{r}\"\n"),
                None => "- none\n".into(),
            }
        } else {
            "- none\n".into()
        }
    }
}

fn push(list: &mut Vec<String>, item: &str) {
    if list.len() < MAX_ITEMS && !list.iter().any(|i| i == item) {
        list.push(item.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const INSTRUCTIONS: &str = "Summarize the conversation transcript below so that the work \
        can continue without it. Write plain text with exactly these nine numbered sections, in \
        this order:\n1. Primary request and intent\n2. Key technical concepts\n3. Files and code\n\
        4. Errors and fixes\n5. Problem solving\n6. All user messages (verbatim)\n7. Pending \
        tasks\n8. Current work\n9. Optional next step\nQuote every user message.";

    #[test]
    fn a_summary_request_gets_every_section_filled_from_the_transcript() {
        let transcript = "--- user ---\nTurn 1: summarise this build log.\n   Compiling a\n\
            error[E0308]: mismatched types in src/module_17.rs\n--- assistant ---\nok\n\
            --- user ---\nTurn 2: and this one <<ccr:abc123>>\n";
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": transcript}]});
        let s = reply(&body).expect("a summary");
        let mut at = 0;
        for n in 1..=9 {
            let i = s[at..].find(&format!("{n}. ")).expect("section in order");
            at += i + 1;
        }
        assert!(s.contains("\"Turn 1: summarise this build log.\""), "{s}");
        assert!(s.contains("\"Turn 2: and this one <<ccr:abc123>>\""), "{s}");
        assert!(s.contains("src/module_17.rs"), "{s}");
        assert!(s.contains("error[E0308]"), "{s}");
        assert!(s.contains("- <<ccr:abc123>>"), "{s}");
    }

    #[test]
    fn other_requests_get_no_summary() {
        let body = json!({"messages": [{"role": "user", "content": "1. a\n2. b\n3. c"}]});
        assert_eq!(reply(&body), None);
        let few = json!({"input": format!("{SUMMARY_PHRASE}: 1. only one")});
        assert_eq!(reply(&few), None);
    }
}
