//! Level 2: a structured summary of the middle of the conversation, written by an LLM behind
//! the [`Summarizer`] trait.
//!
//! The segment runs from after the system prefix to the start of the recent tail (snapped
//! back so a tool call is never separated from its results). The summarizer's input is
//! budgeted to half its window (in bytes at the session's real bytes per token) less the
//! instructions, an equal share per message; a window too small for [`MIN_INPUT_CHARS`] of
//! transcript skips level 2 visibly instead of sending a request that cannot fit,
//! cut 3:1 head/tail; stubs whose archived original fits its share are restored. The reply
//! must pass a quality gate (not empty, not a refusal, not too short for the segment, shorter
//! than it, with the nine section headings) or is retried once. The whole segment is archived and the summary carries its marker; system
//! messages and verbatim messages of the segment stay in the history.

use async_trait::async_trait;
use cairn_crds::EffectivePolicy;

use crate::ccr::{Store, extract_markers};
use crate::history::{self, Message, Role};

use super::archive::{archive_all, referenced_keys, segment_text};
use super::pairing::{self, OrphanMode};
use super::text;
use super::trim::tail_start;
use super::{Pass, PassReport, Trigger};

/// A summary stand-in's opening line, after the banner prefix, starts with this.
pub const BANNER: &str = "summary of ";

/// Transcript bytes below which a summary is not worth asking for: level 2 is skipped.
pub const MIN_INPUT_CHARS: usize = 2_000;
/// A summary must be at least segment/[`SUMMARY_RATIO`] chars, within these bounds.
pub const SUMMARY_MIN_CHARS: usize = 200;
pub const SUMMARY_MIN_CHARS_CAP: usize = 2_000;
pub const SUMMARY_RATIO: usize = 50;

/// The nine sections every summary has, in order.
pub const SECTIONS: [&str; 9] = [
    "Primary request and intent",
    "Key technical concepts",
    "Files and code",
    "Errors and fixes",
    "Problem solving",
    "All user messages (verbatim)",
    "Pending tasks",
    "Current work",
    "Optional next step",
];

/// What the summarizer is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRequest {
    /// The instructions (sections, rules).
    pub instructions: String,
    /// The budgeted transcript of the segment.
    pub transcript: String,
    /// 1 for the first try, 2 for the retry after a rejected summary.
    pub attempt: u32,
}

/// Why the summarizer gave no summary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummarizeError {
    #[error("summarizer call failed: {0}")]
    Failed(String),
    #[error("no summarizer is configured")]
    Unavailable,
    #[error(
        "the summarizer's window ({window_chars} bytes) cannot hold its instructions and a useful transcript; level 2 was skipped"
    )]
    WindowTooSmall { window_chars: usize },
}

impl SummarizeError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Failed(_) => "failed",
            Self::Unavailable => "unavailable",
            Self::WindowTooSmall { .. } => "window_too_small",
        }
    }
}

/// A summary that needs no model call: the session memory, and where the part of the
/// history it covers ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryCover {
    /// The memory's text (the nine sections).
    pub text: String,
    /// The memory covers `history[start..end)` of the segment; `end` never splits a tool
    /// call from its results.
    pub end: usize,
}

/// The model that writes level-2 summaries (the session's own or a dedicated cheaper one).
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// The summarizer model's context window, in characters.
    fn window_chars(&self) -> usize;
    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError>;
    /// The session memory, when it covers the start of the segment `history[start..end)`:
    /// level 2 then replaces the covered part with it at once, no model call.
    fn memory_cover(
        &self,
        _history: &[Message],
        _start: usize,
        _end: usize,
    ) -> Option<MemoryCover> {
        None
    }
}

/// The note a summary pass leaves when the session memory stood in for the summary.
pub const FROM_MEMORY_NOTE: &str = "summary from the session memory (no summarizer call)";

/// Why a summary was rejected by the quality gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    Empty,
    Refusal,
    TooShort,
    NotShorter,
    /// One of the nine [`SECTIONS`] headings is missing.
    MissingSections,
}

impl Rejection {
    pub fn label(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Refusal => "refusal",
            Self::TooShort => "too_short",
            Self::NotShorter => "not_shorter",
            Self::MissingSections => "missing_sections",
        }
    }
}

/// The [`SECTIONS`] whose heading `text` lacks (compared case-insensitively), in order: the
/// one check of a summary's layout, shared by the level-2 gate and the session memory's.
pub fn missing_sections(text: &str) -> Vec<&'static str> {
    let lower = text.to_lowercase();
    SECTIONS
        .iter()
        .copied()
        .filter(|s| !lower.contains(&s.to_lowercase()))
        .collect()
}

/// The shortest summary the quality gate accepts for a segment of `segment_chars` bytes.
pub fn required_chars(segment_chars: usize) -> usize {
    (segment_chars / SUMMARY_RATIO)
        .clamp(SUMMARY_MIN_CHARS, SUMMARY_MIN_CHARS_CAP)
        .min(segment_chars / 4)
}

/// The JSON field of each of [`SECTIONS`], in order, in a structured summary
/// (`summarizer.structured`).
pub const SECTION_FIELDS: [&str; 9] = [
    "primary_request_and_intent",
    "key_technical_concepts",
    "files_and_code",
    "errors_and_fixes",
    "problem_solving",
    "all_user_messages",
    "pending_tasks",
    "current_work",
    "optional_next_step",
];

/// The JSON Schema of a structured summary: an object with one string per section, each
/// `min_chars` to `max_chars` long, nothing else.
pub fn sections_schema(min_chars: usize, max_chars: usize) -> serde_json::Value {
    let max_chars = max_chars.max(min_chars);
    let properties: serde_json::Map<String, serde_json::Value> = SECTION_FIELDS
        .iter()
        .zip(SECTIONS)
        .map(|(field, heading)| {
            (
                (*field).to_owned(),
                serde_json::json!({
                    "type": "string",
                    "description": heading,
                    "minLength": min_chars,
                    "maxLength": max_chars,
                }),
            )
        })
        .collect();
    serde_json::json!({
        "type": "object",
        "properties": properties,
        "required": SECTION_FIELDS,
        "additionalProperties": false,
    })
}

/// The summary a structured answer stands for: each section under its numbered heading, in
/// order; `None` when `answer` is not a JSON object with a string for every section.
pub fn from_sections(answer: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(answer.trim()).ok()?;
    let mut out = String::new();
    for (n, (field, heading)) in SECTION_FIELDS.iter().zip(SECTIONS).enumerate() {
        let text = v.get(field)?.as_str()?;
        out.push_str(&format!("{}. {heading}\n{}\n\n", n + 1, text.trim()));
    }
    Some(out.trim_end().to_owned())
}

/// The quality gate.
pub fn check_quality(summary: &str, segment_chars: usize) -> Result<(), Rejection> {
    let s = summary.trim();
    if s.is_empty() {
        return Err(Rejection::Empty);
    }
    if is_refusal(s) {
        return Err(Rejection::Refusal);
    }
    if s.len() < required_chars(segment_chars) {
        return Err(Rejection::TooShort);
    }
    if s.len() >= segment_chars {
        return Err(Rejection::NotShorter);
    }
    if !missing_sections(s).is_empty() {
        return Err(Rejection::MissingSections);
    }
    Ok(())
}

/// True when `text` opens like a refusal ("I'm sorry", "As an AI", ...).
pub fn is_refusal(text: &str) -> bool {
    let s = text.trim();
    let head = s[..crate::utf8::floor_boundary(s, 120)].to_lowercase();
    const REFUSALS: [&str; 9] = [
        "i'm sorry",
        "i am sorry",
        "sorry,",
        "i cannot",
        "i can't",
        "i can not",
        "i'm unable",
        "i am unable",
        "as an ai",
    ];
    REFUSALS.iter().any(|r| head.starts_with(r))
}

/// The instructions sent with every summary request.
pub fn instructions() -> String {
    let mut out = String::from(
        "Summarize the conversation transcript below so that the work can continue without it. \
         Write plain text with exactly these nine numbered sections, in this order:\n",
    );
    for (n, s) in SECTIONS.iter().enumerate() {
        out.push_str(&format!("{}. {s}\n", n + 1));
    }
    out.push_str(
        "Quote every user message in section 6 word for word. Keep file paths, identifiers, \
         commands, error messages and numbers exact. Keep every <<ccr:KEY>> marker you see \
         (they let the original text be recalled). Section 9 may say \"none\".",
    );
    out
}

/// Where the segment starts and ends: `[start, end)`.
pub fn segment_bounds(history: &[Message], keep_recent: usize) -> (usize, usize) {
    let start = history.iter().take_while(|m| m.is_system()).count();
    let mut end = tail_start(history, keep_recent).max(start);
    while end > start && history.get(end).is_some_and(|m| m.role == Role::Tool) {
        end -= 1;
    }
    (start, end)
}

/// The transcript of `segment` within `budget` bytes.
pub async fn transcript(segment: &[&Message], budget: usize, store: &dyn Store) -> String {
    let share = budget / segment.len().max(1);
    let mut out = String::new();
    for m in segment {
        let mut body = m.content.clone();
        // A stub is worth more restored than as a stub, when its original fits the share.
        if text::is_ours(&body)
            && let [key] = extract_markers(&body)[..]
            && let Ok(Some(orig)) = store.fetch(&key).await
            && orig.len() <= share
            && let Ok(orig) = String::from_utf8(orig)
        {
            body = orig;
        }
        for c in &m.tool_calls {
            body.push_str(&format!(
                "\n[tool call {} {}({})]",
                c.id, c.name, c.arguments
            ));
        }
        let cut = if body.len() > share {
            let h = text::head(&body, share * 3 / 4);
            let t = text::tail(&body[h.len()..], share / 4);
            format!(
                "{h}\n[... {} chars cut ...]\n{t}",
                body.len() - h.len() - t.len()
            )
        } else {
            body
        };
        out.push_str(&format!("--- {} ---\n{cut}\n", m.role.as_str()));
    }
    out
}

/// How level 2 ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SummaryOutcome {
    /// The history now holds the summary.
    Applied,
    /// Nothing between the system prefix and the tail.
    NothingToSummarize,
    /// Both tries were rejected by the gate.
    Rejected(Rejection),
    Failed(SummarizeError),
    /// The summary was fine but the archive refused the segment; nothing changed.
    ArchiveFailed,
}

/// Runs level 2 on `history`.
pub async fn summarize(
    history: &mut Vec<Message>,
    policy: &EffectivePolicy,
    trigger: Trigger,
    summarizer: &dyn Summarizer,
    store: &dyn Store,
) -> (PassReport, SummaryOutcome) {
    let mut report = PassReport::new(Pass::Summary, trigger, history::weight(history));
    let (start, end) = segment_bounds(history, policy.min_keep_recent as usize);
    // The session memory stands in for the part of the segment it covers, when it passes
    // the same quality gate as a summary; otherwise level 2 runs as without it.
    if let Some(cover) = summarizer.memory_cover(history, start, end)
        && cover.end > start
        && cover.end <= end
    {
        let covered: Vec<&Message> = history[start..cover.end]
            .iter()
            .filter(|m| !m.is_system() && !m.meta.preserve_verbatim)
            .collect();
        let chars: usize = covered.iter().map(|m| m.weight()).sum();
        if !covered.is_empty() {
            match check_quality(&cover.text, chars) {
                Ok(()) => {
                    let mut r = report.clone();
                    r.notes.push(FROM_MEMORY_NOTE.into());
                    let applied = apply(history, start, cover.end, &cover.text, r, store).await;
                    if applied.1 == SummaryOutcome::Applied {
                        return applied;
                    }
                    report.notes.extend(applied.0.notes);
                    report.archive_error = applied.0.archive_error;
                }
                Err(r) => report.notes.push(format!(
                    "session memory rejected by the quality gate: {}; level 2 runs",
                    r.label()
                )),
            }
        }
    }
    let dropped: Vec<&Message> = history[start..end]
        .iter()
        .filter(|m| !m.is_system() && !m.meta.preserve_verbatim)
        .collect();
    if dropped.is_empty() {
        return (report, SummaryOutcome::NothingToSummarize);
    }
    let segment_chars: usize = dropped.iter().map(|m| m.weight()).sum();
    let instructions = instructions();
    let window_chars = summarizer.window_chars();
    let budget = (window_chars / 2).saturating_sub(instructions.len());
    if budget < MIN_INPUT_CHARS {
        let e = SummarizeError::WindowTooSmall { window_chars };
        report.notes.push(e.to_string());
        return (report, SummaryOutcome::Failed(e));
    }
    let mut request = SummaryRequest {
        instructions,
        transcript: transcript(&dropped, budget, store).await,
        attempt: 1,
    };
    let mut summary = None;
    let mut last_rejection = Rejection::Empty;
    for attempt in 1..=2 {
        request.attempt = attempt;
        match summarizer.summarize(&request).await {
            Ok(s) => match check_quality(&s, segment_chars) {
                Ok(()) => {
                    summary = Some(s);
                    break;
                }
                Err(r) => {
                    report
                        .notes
                        .push(format!("summary attempt {attempt} rejected: {}", r.label()));
                    last_rejection = r;
                }
            },
            Err(e) => {
                report.notes.push(e.to_string());
                return (report, SummaryOutcome::Failed(e));
            }
        }
    }
    let Some(summary) = summary else {
        return (report, SummaryOutcome::Rejected(last_rejection));
    };
    apply(history, start, end, &summary, report, store).await
}

/// Replaces the summarisable messages of `history[start..end)` with `summary`, once the
/// segment is archived.
async fn apply(
    history: &mut Vec<Message>,
    start: usize,
    end: usize,
    summary: &str,
    mut report: PassReport,
    store: &dyn Store,
) -> (PassReport, SummaryOutcome) {
    let owned: Vec<Message> = history[start..end]
        .iter()
        .filter(|m| !m.is_system() && !m.meta.preserve_verbatim)
        .cloned()
        .collect();
    let segment_chars: usize = owned.iter().map(|m| m.weight()).sum();
    let archive_text = segment_text(&owned);
    let keys = match archive_all(store, &[archive_text.as_bytes()]).await {
        Ok(k) if !k.is_empty() => k,
        Ok(_) => return (report, SummaryOutcome::ArchiveFailed),
        Err(e) => {
            report.archive_error = Some(e.label());
            return (report, SummaryOutcome::ArchiveFailed);
        }
    };
    let segment_key = keys[0];
    let mut msg = Message::user(format!(
        "{}{BANNER}{} earlier messages ({} chars); the full transcript can be recalled with {}]\n\n{}",
        text::BANNER_PREFIX,
        owned.len(),
        segment_chars,
        segment_key.marker(),
        summary.trim()
    ));
    msg.meta.is_summary = true;
    super::ledger::record(&mut msg, &owned);
    msg.meta.archived.push(segment_key.as_str().to_string());
    for k in referenced_keys(&owned) {
        if k != segment_key {
            msg.meta.archived.push(k.as_str().to_string());
        }
    }

    let mut staged: Vec<Message> = Vec::with_capacity(history.len() - owned.len() + 1);
    staged.extend(history[..start].iter().cloned());
    staged.extend(
        history[start..end]
            .iter()
            .filter(|m| m.is_system())
            .cloned(),
    );
    staged.push(msg);
    staged.extend(
        history[start..end]
            .iter()
            .filter(|m| !m.is_system() && m.meta.preserve_verbatim)
            .cloned(),
    );
    staged.extend(history[end..].iter().cloned());
    // Verbatim results whose call was summarised become user messages; nothing is removed.
    pairing::repair(&mut staged, OrphanMode::ToUser);

    report.archived = keys;
    report.removed = owned.len();
    report.added = 1;
    *history = staged;
    report.bytes_after = history::weight(history);
    (report, SummaryOutcome::Applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_structured_answer_becomes_a_summary_the_gate_accepts() {
        let schema = sections_schema(40, 30);
        assert_eq!(schema["required"].as_array().map(Vec::len), Some(9));
        assert_eq!(schema["properties"]["errors_and_fixes"]["minLength"], 40);
        assert_eq!(schema["properties"]["errors_and_fixes"]["maxLength"], 40);
        assert_eq!(schema["additionalProperties"], false);
        let answer: serde_json::Map<String, serde_json::Value> = SECTION_FIELDS
            .iter()
            .map(|f| {
                (
                    (*f).to_owned(),
                    format!("  what {f} says about the build.  ").into(),
                )
            })
            .collect();
        let summary =
            from_sections(&serde_json::Value::Object(answer).to_string()).expect("a summary");
        assert!(summary.starts_with(
            "1. Primary request and intent\nwhat primary_request_and_intent says about the build.\n\n2. "
        ));
        assert!(missing_sections(&summary).is_empty(), "{summary}");
        assert_eq!(check_quality(&summary, 20_000), Ok(()));
        // Not the object: no summary from it.
        assert_eq!(from_sections("1. Primary request and intent ..."), None);
        assert_eq!(
            from_sections(r#"{"primary_request_and_intent": "only one"}"#),
            None
        );
    }

    #[test]
    fn quality_gate() {
        use crate::testing::well_formed_summary;
        assert_eq!(check_quality("  ", 10_000), Err(Rejection::Empty));
        assert_eq!(
            check_quality(
                &format!("I'm sorry, I can't help. {}", "x".repeat(500)),
                10_000
            ),
            Err(Rejection::Refusal)
        );
        assert_eq!(check_quality("short", 100_000), Err(Rejection::TooShort));
        assert_eq!(
            check_quality(&"s".repeat(300), 100_000),
            Err(Rejection::TooShort)
        );
        assert!(check_quality(&well_formed_summary(2_000), 100_000).is_ok());
        assert_eq!(
            check_quality(&well_formed_summary(2_000), 1_500),
            Err(Rejection::NotShorter)
        );
    }

    #[test]
    fn the_gate_wants_the_nine_sections() {
        use crate::testing::well_formed_summary;
        // Long enough, shorter than the segment, no refusal: only the layout is wrong.
        let prose =
            "The user asked to fix the build; the failing test was parse_config. ".repeat(40);
        assert_eq!(
            check_quality(&prose, 100_000),
            Err(Rejection::MissingSections)
        );
        assert_eq!(Rejection::MissingSections.label(), "missing_sections");
        let all = well_formed_summary(2_500);
        assert!(missing_sections(&all).is_empty());
        assert!(check_quality(&all, 100_000).is_ok());
        // Headings are matched whatever their case; one missing is enough to reject.
        assert!(check_quality(&all.to_uppercase(), 100_000).is_ok());
        let eight = all.replace("Pending tasks", "Later");
        assert_eq!(missing_sections(&eight), vec!["Pending tasks"]);
        assert_eq!(
            check_quality(&eight, 100_000),
            Err(Rejection::MissingSections)
        );
    }

    #[tokio::test]
    async fn transcript_shares_the_budget_and_restores_stubs_that_fit() {
        use crate::ccr::MemoryStore;
        let store = MemoryStore::new();
        let original = "fn small() {}\n".repeat(20);
        let key = store.archive(original.as_bytes()).await.expect("stored");
        let stub = Message::tool(
            "c1",
            text::stub("tool result", text::Stats::of(&original), &key),
        );
        let huge = Message::user(format!("{}{}", "H".repeat(60_000), "T".repeat(60_000)));
        let small = Message::assistant("short reply");
        let segment = [&stub, &huge, &small];
        // A 20,000-byte budget: 20,000 / 3 per message.
        let t = transcript(&segment, 20_000, &store).await;
        assert!(
            t.contains(&original),
            "the stub's original fits its share and is restored"
        );
        assert!(t.contains("short reply"));
        let share = 20_000 / 3;
        let heads = t.matches('H').count();
        let tails = t.matches('T').count();
        assert!(
            heads <= share * 3 / 4 && heads > share * 3 / 4 - 100,
            "{heads}"
        );
        assert!(tails <= share / 4 && tails > share / 4 - 100, "{tails}");
        assert!(t.contains("chars cut"));
        assert!(t.len() < 20_000 + 1_000);
    }

    #[test]
    fn instructions_name_all_nine_sections() {
        let i = instructions();
        for s in SECTIONS {
            assert!(i.contains(s), "{s}");
        }
    }
}
