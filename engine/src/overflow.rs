//! What a context-overflow error says in numbers: the server's own count of the rejected
//! prompt and the window it enforces.
//!
//! Every provider that knows why it rejected a prompt says so, each in its own words:
//!
//! | server | phrasing |
//! |---|---|
//! | llama.cpp | `n_prompt_tokens` / `n_ctx` fields; "request (N tokens) exceeds the available context size (M tokens)" |
//! | OpenAI, DeepSeek, vLLM, OpenRouter | "maximum context length is M tokens. However, your messages resulted in N tokens" / "you requested T tokens (N in the messages, C in the completion)" / "you requested about N tokens" |
//! | Anthropic (also on Bedrock) | "prompt is too long: N tokens > M maximum"; "input length and `max_tokens` exceed context limit: N + C > M" |
//! | Gemini | "The input token count (N) exceeds the maximum number of tokens allowed (M)" |
//! | xAI | "maximum prompt length is M but the request contains N tokens" |
//! | Mistral | "Prompt contains N tokens and 0 draft tokens, too large for model with M maximum context length" |
//! | Ollama, generic | "context window of M tokens", "context length of M" |
//!
//! A server's count always wins over cairn's estimate: `N` divided into the weight of the
//! request that failed gives the real bytes per token of that request, and `M` is the real
//! window whatever the spec or the model catalog claimed.

use crate::classify::ParsedBody;
use crate::provider::ProviderError;

/// The numbers an overflow error carried. Every field is optional: servers say what they say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerCount {
    /// The server's count of the rejected prompt (input only), in tokens.
    pub prompt_tokens: Option<u64>,
    /// The context window the server enforces, in tokens.
    pub window: Option<u64>,
    /// Output tokens the server counted against the window together with the prompt.
    pub completion_tokens: Option<u64>,
}

impl ServerCount {
    pub fn is_empty(&self) -> bool {
        self.prompt_tokens.is_none() && self.window.is_none()
    }
}

/// The numbers of an overflow error (an empty count when it carries none).
pub fn server_count(err: &ProviderError) -> ServerCount {
    let parsed = ParsedBody::parse(&err.body);
    let mut out = ServerCount::default();
    if parsed.is_json
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(err.body.trim())
    {
        let field = |name: &str| find_u64(&v, name, 0);
        out.prompt_tokens = field("n_prompt_tokens");
        out.window = field("n_ctx");
    }
    let msg = parsed.message.to_lowercase();
    let msg = msg.as_str();
    if out.window.is_none() {
        out.window = first_of(
            msg,
            &[
                After("maximum context length is "),
                After("available context size ("),
                After("maximum number of tokens allowed ("),
                After("maximum prompt length is "),
                After("context window of "),
                After("context length of "),
                After("context_length of "),
                Before(" maximum context length"),
                Before(" maximum"),
            ],
        )
        .or_else(|| after_symbol(msg, "context limit:", '>'));
    }
    if out.prompt_tokens.is_none() {
        out.prompt_tokens = first_of(
            msg,
            &[
                After("resulted in "),
                After("prompt is too long: "),
                After("input token count ("),
                After("request contains "),
                After("prompt contains "),
                After("request ("),
                After("context limit: "),
                After("requested about "),
                After("you requested "),
            ],
        );
        // "(N in the messages, ...)": the number comes before the phrase.
        if let Some(n) = first_of(msg, &[Before(" in the messages")]) {
            out.prompt_tokens = Some(n);
        }
    }
    out.completion_tokens = first_of(msg, &[Before(" in the completion")])
        .or_else(|| after_symbol(msg, "context limit:", '+'));
    // A window no larger than the prompt it rejected is what the error is about; anything
    // else (a window reported as 0, a count that makes no sense) is not evidence.
    if out.window == Some(0) {
        out.window = None;
    }
    if out.prompt_tokens == Some(0) {
        out.prompt_tokens = None;
    }
    out
}

/// Where a number sits relative to a phrase.
enum Anchor {
    /// The number follows the phrase.
    After(&'static str),
    /// The number precedes the phrase.
    Before(&'static str),
}
use Anchor::{After, Before};

fn first_of(msg: &str, anchors: &[Anchor]) -> Option<u64> {
    anchors.iter().find_map(|a| match a {
        After(p) => {
            let at = msg.find(p)? + p.len();
            leading_number(&msg[at..])
        }
        Before(p) => {
            let at = msg.find(p)?;
            trailing_number(&msg[..at])
        }
    })
}

/// After `phrase`, the number that follows the next `symbol` ("N + C > M": `+` gives C,
/// `>` gives M).
fn after_symbol(msg: &str, phrase: &str, symbol: char) -> Option<u64> {
    let rest = &msg[msg.find(phrase)? + phrase.len()..];
    let rest = &rest[rest.find(symbol)? + symbol.len_utf8()..];
    leading_number(rest)
}

/// A number at the start of `s` (after spaces); digit groups with `,` or `_` are joined.
fn leading_number(s: &str) -> Option<u64> {
    let s = s.trim_start_matches([' ', '~', '(']);
    let mut n: u64 = 0;
    let mut digits = 0;
    for c in s.chars() {
        match c {
            '0'..='9' => {
                n = n.checked_mul(10)?.checked_add(u64::from(c as u8 - b'0'))?;
                digits += 1;
            }
            ',' | '_' if digits > 0 => {}
            _ => break,
        }
    }
    (digits > 0).then_some(n)
}

/// A number at the end of `s` (before spaces).
fn trailing_number(s: &str) -> Option<u64> {
    let s = s.trim_end_matches([' ', '(']);
    let start = s
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_digit() || *c == ',')
        .last()
        .map(|(i, _)| i)?;
    leading_number(&s[start..])
}

fn find_u64(v: &serde_json::Value, name: &str, depth: usize) -> Option<u64> {
    if depth > 4 {
        return None;
    }
    match v {
        serde_json::Value::Object(map) => map.get(name).and_then(|x| x.as_u64()).or_else(|| {
            map.values()
                .find_map(|child| find_u64(child, name, depth + 1))
        }),
        serde_json::Value::Array(items) => items
            .iter()
            .take(8)
            .find_map(|child| find_u64(child, name, depth + 1)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(body: &str) -> ServerCount {
        server_count(&ProviderError::http("t", 400, None, body, 1000))
    }

    #[test]
    fn numbers_are_read_with_their_separators() {
        assert_eq!(leading_number(" 204,831 tokens"), Some(204_831));
        assert_eq!(trailing_number("model with 32768"), Some(32_768));
        assert_eq!(leading_number("tokens"), None);
    }

    #[test]
    fn llama_cpp_fields_win() {
        let c = count(
            r#"{"error":{"code":400,"message":"request (27905 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":27905,"n_ctx":2048}}"#,
        );
        assert_eq!(c.prompt_tokens, Some(27_905));
        assert_eq!(c.window, Some(2_048));
    }
}
