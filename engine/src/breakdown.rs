//! The context inspector's arithmetic: what one rendered request carries, by part
//! (`GET /v1/session/context`, `cairn-agent context`).
//!
//! [`breakdown`] is pure: it takes the request as assembled for a send, the exact body bytes
//! the provider client would send for it, and where each tool comes from. A part's bytes are
//! the bytes of its text as they stand in the body (JSON-escaped; a piece the wire format does
//! not carry, such as reasoning some formats drop, counts nothing). What no part claims — the
//! JSON structure, field names, roles, ids the format rewrites, the model name and settings —
//! is `framing`, so the parts always sum to the body's size exactly.

use std::collections::BTreeMap;

use memchr::memmem;
use serde::Serialize;

use crate::ccr;
use crate::history::{Message, Role};
use crate::provider::{ChatRequest, ToolSpec};
use crate::tokens::CharsPerToken;

/// Where a tool of the catalog comes from.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ToolSource {
    /// The session's own tools (`recall`, `compress`).
    Builtin,
    /// A tool of an MCP server of the spec.
    Mcp,
    /// A function tool of the API client.
    Client,
}

/// Bytes of a part in the body and their estimated tokens.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    pub bytes: u64,
    pub tokens: u64,
    /// Messages (or tools, images) in the part.
    pub count: u64,
}

/// One tool of the catalog.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ToolPart {
    pub name: String,
    pub source: ToolSource,
    pub bytes: u64,
    pub tokens: u64,
}

/// A `<<ccr:KEY>>` marker the request carries.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MarkerInView {
    pub key: String,
    /// Index of the message in the request's messages.
    pub message: usize,
    /// The part the message belongs to (`summaries`, `toolResults/read_file`, ...).
    pub part: String,
}

/// The request by part. `bodyBytes` is the sum of every part's bytes, `framing` included.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Breakdown {
    pub body_bytes: u64,
    pub body_tokens: u64,
    pub system_prompt: Part,
    /// The API client's instructions of the turn (a system part of its requests only).
    pub instructions: Part,
    pub tools: Vec<ToolPart>,
    /// The catalog's totals by source.
    pub tools_by_source: BTreeMap<&'static str, Part>,
    pub summaries: Part,
    pub preserve_verbatim: Part,
    /// The other messages by role (`user`, `assistant`, `system`).
    pub messages: BTreeMap<&'static str, Part>,
    /// Tool results by tool name (`unknown` when the result names no tool).
    pub tool_results: BTreeMap<String, Part>,
    pub images: Part,
    pub framing: Part,
    pub markers: Vec<MarkerInView>,
}

/// Finds pieces of text in the body, searching on from the last find first (the parts stand
/// in the body in the order of the request), then from the start.
struct Finder<'b> {
    body: &'b [u8],
    cursor: usize,
}

impl Finder<'_> {
    /// The bytes `piece` takes in the body, JSON-escaped, or 0 when the body does not carry it.
    fn escaped(&mut self, piece: &str) -> u64 {
        if piece.is_empty() {
            return 0;
        }
        let quoted = serde_json::to_string(piece).unwrap_or_default();
        let inner = quoted
            .get(1..quoted.len().saturating_sub(1))
            .unwrap_or_default();
        self.raw(inner.as_bytes())
    }

    /// Like [`Finder::escaped`] for a JSON value written as JSON (tool schemas, arguments).
    fn json(&mut self, value: &serde_json::Value) -> u64 {
        self.raw(value.to_string().as_bytes())
    }

    fn raw(&mut self, needle: &[u8]) -> u64 {
        if needle.is_empty() || needle.len() > self.body.len() {
            return 0;
        }
        let tail = &self.body[self.cursor.min(self.body.len())..];
        if let Some(at) = memmem::find(tail, needle) {
            self.cursor += at + needle.len();
            return needle.len() as u64;
        }
        if memmem::find(self.body, needle).is_some() {
            return needle.len() as u64;
        }
        0
    }

    /// Arguments of a tool call: as a JSON string (OpenAI) or as the JSON object (the others).
    fn arguments(&mut self, arguments: &str) -> u64 {
        match self.escaped(arguments) {
            0 => serde_json::from_str::<serde_json::Value>(arguments).map_or(0, |v| self.json(&v)),
            n => n,
        }
    }

    /// A message's text pieces, images apart.
    fn message(&mut self, m: &Message) -> u64 {
        if let Some(item) = &m.provider_item {
            let n = self.json(item);
            if n > 0 {
                return n;
            }
        }
        let mut n = self.escaped(&m.content);
        if let Some(r) = &m.reasoning {
            n += self.escaped(r);
        }
        for c in &m.tool_calls {
            n += self.escaped(&c.name) + self.arguments(&c.arguments);
        }
        n
    }

    fn tool(&mut self, t: &ToolSpec) -> u64 {
        self.escaped(&t.name) + self.escaped(&t.description) + self.json(&t.parameters)
    }
}

fn add(part: &mut Part, bytes: u64) {
    part.bytes += bytes;
    part.count += 1;
}

/// What `request`, rendered as `body`, carries by part. `source` says where a tool of the
/// catalog comes from; `instructions` is the index of the turn's instructions among the
/// request's messages.
pub fn breakdown(
    request: &ChatRequest,
    body: &[u8],
    source: &dyn Fn(&str) -> ToolSource,
    instructions: Option<usize>,
    cpt: &CharsPerToken,
) -> Breakdown {
    let mut b = Breakdown {
        body_bytes: body.len() as u64,
        ..Breakdown::default()
    };
    let mut find = Finder { body, cursor: 0 };
    let leading_system = request
        .messages
        .iter()
        .take_while(|m| m.is_system())
        .count();
    for (i, m) in request.messages.iter().enumerate() {
        let bytes = find.message(m);
        let part = if Some(i) == instructions {
            add(&mut b.instructions, bytes);
            "instructions".to_owned()
        } else if m.meta.is_summary {
            add(&mut b.summaries, bytes);
            "summaries".to_owned()
        } else if m.is_system() && i < leading_system {
            add(&mut b.system_prompt, bytes);
            "systemPrompt".to_owned()
        } else if m.meta.preserve_verbatim {
            add(&mut b.preserve_verbatim, bytes);
            "preserveVerbatim".to_owned()
        } else if m.role == Role::Tool {
            let name = m.name.clone().unwrap_or_else(|| "unknown".to_owned());
            add(b.tool_results.entry(name.clone()).or_default(), bytes);
            format!("toolResults/{name}")
        } else {
            let role = m.role.as_str();
            add(b.messages.entry(role).or_default(), bytes);
            format!("messages/{role}")
        };
        for image in &m.images {
            add(
                &mut b.images,
                find.escaped(&image.data) + find.escaped(&image.media_type),
            );
        }
        for key in ccr::extract_markers(&m.content) {
            b.markers.push(MarkerInView {
                key: key.as_str().to_owned(),
                message: i,
                part: part.clone(),
            });
        }
    }
    let mut find = Finder { body, cursor: 0 };
    for t in &request.tools {
        let bytes = find.tool(t);
        let from = source(&t.name);
        add(b.tools_by_source.entry(label(from)).or_default(), bytes);
        b.tools.push(ToolPart {
            name: t.name.clone(),
            source: from,
            bytes,
            tokens: cpt.tokens(bytes as usize),
        });
    }
    let claimed: u64 = [
        b.system_prompt,
        b.instructions,
        b.summaries,
        b.preserve_verbatim,
        b.images,
    ]
    .iter()
    .chain(b.tools_by_source.values())
    .chain(b.messages.values())
    .chain(b.tool_results.values())
    .map(|p| p.bytes)
    .sum();
    // Every claimed piece was found in the body; should overlapping finds ever claim more than
    // the body, the parts are scaled back by the framing going to zero and the excess shown
    // on the largest part, so the sum still holds.
    b.framing.bytes = b.body_bytes.saturating_sub(claimed);
    if claimed > b.body_bytes {
        let excess = claimed - b.body_bytes;
        shave(&mut b, excess);
    }
    let tokens = |p: &mut Part| p.tokens = cpt.tokens(p.bytes as usize);
    b.body_tokens = cpt.tokens(body.len());
    for p in [
        &mut b.system_prompt,
        &mut b.instructions,
        &mut b.summaries,
        &mut b.preserve_verbatim,
        &mut b.images,
        &mut b.framing,
    ] {
        tokens(p);
    }
    b.tools_by_source.values_mut().for_each(tokens);
    b.messages.values_mut().for_each(tokens);
    b.tool_results.values_mut().for_each(tokens);
    b
}

/// Takes `excess` bytes off the largest message part (only reachable when one text is found
/// inside another).
fn shave(b: &mut Breakdown, excess: u64) {
    let largest = [
        &mut b.system_prompt,
        &mut b.summaries,
        &mut b.preserve_verbatim,
        &mut b.images,
    ]
    .into_iter()
    .chain(b.messages.values_mut())
    .chain(b.tool_results.values_mut())
    .max_by_key(|p| p.bytes);
    if let Some(p) = largest {
        p.bytes = p.bytes.saturating_sub(excess);
    }
}

fn label(s: ToolSource) -> &'static str {
    match s {
        ToolSource::Builtin => "builtin",
        ToolSource::Mcp => "mcp",
        ToolSource::Client => "client",
    }
}

/// The sum of every part's bytes (equal to `body_bytes`).
pub fn sum(b: &Breakdown) -> u64 {
    [
        b.system_prompt,
        b.instructions,
        b.summaries,
        b.preserve_verbatim,
        b.images,
        b.framing,
    ]
    .iter()
    .chain(b.tools_by_source.values())
    .chain(b.messages.values())
    .chain(b.tool_results.values())
    .map(|p| p.bytes)
    .sum()
}

/// The report of `GET /v1/session/context` (its JSON) as a table for a person: every part
/// with its bytes, estimated tokens and share of the body, then the window, the budget, the
/// headroom state, the payload caps, the floor and the markers in view. `cairn-agent
/// context` and `kubectl cairn context` print it; both take the JSON so one report feeds
/// every view.
pub fn table(report: &serde_json::Value) -> String {
    use serde_json::Value;
    use std::fmt::Write as _;
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_owned();
    let body = num(report, "bodyBytes");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "next request: {} {} ({}; provider {}, model {})",
        text(report, "method"),
        text(report, "url"),
        if report.get("stream").and_then(Value::as_bool) == Some(true) {
            "streamed"
        } else {
            "not streamed"
        },
        text(report, "provider"),
        text(report, "model"),
    );
    let _ = writeln!(
        out,
        "body: {body} bytes, ~{} tokens; max output {} tokens\n",
        num(report, "bodyTokens"),
        num(report, "maxOutputTokens")
    );
    let _ = writeln!(
        out,
        "{:<36} {:>10} {:>9} {:>6} {:>7}",
        "PART", "BYTES", "TOKENS", "COUNT", "SHARE"
    );
    let mut row = |label: String, part: &Value| {
        let bytes = num(part, "bytes");
        let share = if body == 0 {
            0.0
        } else {
            bytes as f64 * 100.0 / body as f64
        };
        let count = part
            .get("count")
            .and_then(Value::as_u64)
            .map_or_else(String::new, |c| c.to_string());
        let _ = writeln!(
            out,
            "{label:<36} {bytes:>10} {:>9} {count:>6} {share:>6.1}%",
            num(part, "tokens")
        );
    };
    let empty = Value::Null;
    let part = |k: &str| report.get(k).unwrap_or(&empty);
    row("system prompt".into(), part("systemPrompt"));
    row("instructions".into(), part("instructions"));
    let by_source = report.get("toolsBySource").and_then(Value::as_object);
    for source in ["builtin", "mcp", "client"] {
        let Some(p) = by_source.and_then(|m| m.get(source)) else {
            continue;
        };
        row(format!("tools: {source}"), p);
        for tool in report
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|t| t.get("source").and_then(Value::as_str) == Some(source))
        {
            row(format!("  {}", text(tool, "name")), tool);
        }
    }
    row("summaries".into(), part("summaries"));
    row("preserveVerbatim".into(), part("preserveVerbatim"));
    for (group, label) in [("messages", "messages"), ("toolResults", "tool results")] {
        if let Some(map) = report.get(group).and_then(Value::as_object) {
            for (name, p) in map {
                row(format!("{label}: {name}"), p);
            }
        }
    }
    row("images".into(), part("images"));
    row("framing (JSON structure, settings)".into(), part("framing"));
    let _ = writeln!(
        out,
        "{:<36} {body:>10} {:>9}\n",
        "total",
        num(report, "bodyTokens")
    );
    let window = part("window");
    let _ = writeln!(
        out,
        "window: {} tokens (in force {}); budget {} bytes, ~{} tokens; {:.2} bytes/token",
        num(window, "contextWindow"),
        num(window, "effectiveContextWindow"),
        num(window, "budgetBytes"),
        num(window, "budgetTokens"),
        window
            .get("bytesPerToken")
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    );
    let headroom = part("headroom");
    let _ = writeln!(
        out,
        "headroom: {}, {} tokens left (warning at {}, auto-compact at {}, blocking at {})",
        text(headroom, "state"),
        headroom
            .get("tokensLeft")
            .and_then(Value::as_i64)
            .unwrap_or(0),
        num(headroom, "warningBufferTokens"),
        num(headroom, "autoCompactBufferTokens"),
        num(headroom, "blockingBufferTokens")
    );
    let cap = |k: &str| {
        report
            .get(k)
            .and_then(Value::as_u64)
            .map_or_else(|| "none".to_owned(), |c| format!("{c} bytes"))
    };
    let _ = writeln!(
        out,
        "payload cap: {}; learned payload cap: {}",
        cap("payloadCap"),
        cap("learnedPayloadCap")
    );
    let floor = part("uncompactableFloor");
    let _ = writeln!(
        out,
        "uncompactable floor: {} bytes, ~{} tokens",
        num(floor, "bytes"),
        num(floor, "tokens")
    );
    let catalog = part("catalog");
    let names = |k: &str| -> Vec<&str> {
        catalog
            .get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let (shortened, deferred) = (names("shortened"), names("deferred"));
    if !shortened.is_empty() || !deferred.is_empty() {
        let _ = writeln!(
            out,
            "tool catalog: {} of {} bytes offered (room {} bytes); shortened {}: {}; deferred behind tool_search {}: {}",
            num(catalog, "offeredBytes"),
            num(catalog, "wholeBytes"),
            num(catalog, "roomBytes"),
            shortened.len(),
            shortened.join(", "),
            deferred.len(),
            deferred.join(", ")
        );
    }
    if let Some(why) = report.get("compactsFirst").and_then(Value::as_str) {
        let _ = writeln!(out, "the next turn compacts first: {why}");
    }
    if let Some(q) = report.get("compactionQuality") {
        let score = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let _ = write!(
            out,
            "compaction score: {} scored, rolling {:.2}, lowest {:.2}, {} below minScore",
            num(q, "scored"),
            score(q, "rolling"),
            score(q, "lowest"),
            num(q, "belowMinScore")
        );
        if let Some(last) = q.get("last") {
            let kept: Vec<String> = ["files", "commands", "errors", "requests"]
                .iter()
                .filter_map(|c| {
                    let t = last.get(*c)?;
                    (num(t, "atStake") > 0)
                        .then(|| format!("{c} {}/{}", num(t, "inSight"), num(t, "atStake")))
                })
                .collect();
            let _ = write!(
                out,
                "; last {:.2} at level {} (in sight: {})",
                score(last, "score"),
                num(last, "level"),
                if kept.is_empty() {
                    "nothing at stake".to_owned()
                } else {
                    kept.join(", ")
                }
            );
        }
        let _ = writeln!(out);
    }
    let markers = report
        .get("markers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let _ = writeln!(out, "markers in view: {}", markers.len());
    for m in &markers {
        let _ = writeln!(
            out,
            "  <<ccr:{}>> in message {} ({})",
            text(m, "key"),
            num(m, "message"),
            text(m, "part")
        );
    }
    for n in report
        .get("notices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let _ = writeln!(out, "notice: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Image;

    fn request() -> ChatRequest {
        let mut tool = Message::tool(
            "c1",
            "file body \"quoted\"\nline 2 <<ccr:0123456789abcdef>>",
        );
        tool.name = Some("read_file".into());
        let mut user = Message::user("look at this");
        user.images.push(Image {
            media_type: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
        });
        let mut summary = Message::system("summary of earlier turns");
        summary.meta.is_summary = true;
        ChatRequest {
            model: "m".into(),
            messages: vec![Message::system("You are terse."), summary, user, tool],
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Reads a file.".into(),
                parameters: serde_json::json!({"type": "object"}),
            }],
            max_output_tokens: 10,
            ..ChatRequest::default()
        }
    }

    #[test]
    fn parts_sum_to_the_body_and_claim_what_it_carries() {
        let r = request();
        let body = serde_json::to_vec(&serde_json::json!({
            "model": "m",
            "messages": r.messages.iter().map(|m| serde_json::json!({
                "role": m.role.as_str(), "content": m.content,
                "images": m.images.iter().map(|i| (i.media_type.clone(), i.data.clone())).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "tools": [{"name": "read_file", "description": "Reads a file.", "parameters": {"type": "object"}}],
        }))
        .unwrap();
        let b = breakdown(
            &r,
            &body,
            &|_| ToolSource::Client,
            None,
            &CharsPerToken::default(),
        );
        assert_eq!(sum(&b), body.len() as u64);
        assert_eq!(b.system_prompt.bytes, "You are terse.".len() as u64);
        assert_eq!(b.summaries.count, 1);
        assert_eq!(
            b.images.bytes,
            ("iVBORw0KGgo=".len() + "image/png".len()) as u64
        );
        // The escaped form: two quotes and a newline each take two bytes.
        assert_eq!(
            b.tool_results["read_file"].bytes,
            r.messages[3].content.len() as u64 + 3
        );
        assert_eq!(b.tools_by_source["client"].count, 1);
        assert_eq!(b.markers.len(), 1);
        assert_eq!(b.markers[0].part, "toolResults/read_file");
        assert!(b.framing.bytes > 0);
    }

    #[test]
    fn a_piece_the_body_does_not_carry_counts_nothing() {
        let mut r = request();
        r.messages[2].reasoning = Some("hidden thoughts".into());
        let body = br#"{"messages":[{"content":"look at this"}]}"#;
        let b = breakdown(
            &r,
            body,
            &|_| ToolSource::Builtin,
            None,
            &CharsPerToken::default(),
        );
        assert_eq!(b.messages["user"].bytes, "look at this".len() as u64);
        assert_eq!(b.system_prompt.bytes, 0);
        assert_eq!(sum(&b), body.len() as u64);
    }

    #[test]
    fn the_table_shows_every_part_and_the_limits() {
        let r = request();
        let body = br#"{"messages":[{"content":"look at this"}],"x":"You are terse."}"#;
        let b = breakdown(
            &r,
            body,
            &|_| ToolSource::Client,
            None,
            &CharsPerToken::default(),
        );
        let mut report = serde_json::to_value(&b).unwrap();
        report["window"] =
            serde_json::json!({"contextWindow": 1000, "effectiveContextWindow": 900});
        report["headroom"] = serde_json::json!({"state": "warning", "tokensLeft": -5});
        report["payloadCap"] = serde_json::json!(4096);
        let t = table(&report);
        assert!(
            t.contains(&format!("{:<36} {:>10}", "total", body.len())),
            "{t}"
        );
        assert!(t.contains("system prompt"), "{t}");
        assert!(t.contains("messages: user"), "{t}");
        assert!(t.contains("headroom: warning, -5 tokens left"), "{t}");
        assert!(t.contains("window: 1000 tokens (in force 900)"), "{t}");
        assert!(
            t.contains("payload cap: 4096 bytes; learned payload cap: none"),
            "{t}"
        );
        assert!(
            t.contains("markers in view: 1\n  <<ccr:0123456789abcdef>> in message 3 (toolResults/read_file)"),
            "{t}"
        );
        assert!(
            !t.contains("tool catalog:"),
            "a whole catalog says nothing: {t}"
        );
    }

    #[test]
    fn the_table_names_the_tools_that_gave_way() {
        let plan = crate::offer::Plan {
            offers: vec![
                ("recall".into(), crate::offer::Offer::Whole),
                ("read_text_file".into(), crate::offer::Offer::Short),
                ("move_file".into(), crate::offer::Offer::Deferred),
                ("write_file".into(), crate::offer::Offer::Deferred),
            ],
            bytes: 900,
            whole_bytes: 4_000,
            room: 1_000,
        };
        let report = serde_json::json!({"catalog": plan.report()});
        let t = table(&report);
        assert!(
            t.contains("tool catalog: 900 of 4000 bytes offered (room 1000 bytes); shortened 1: read_text_file; deferred behind tool_search 2: move_file, write_file"),
            "{t}"
        );
    }
}
