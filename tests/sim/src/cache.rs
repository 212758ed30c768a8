//! Prompt caching as the providers do it, for requests of one simulator.
//!
//! - Anthropic Messages: the prompt is read in the order tools, system, messages; a block
//!   with `cache_control` ends a cacheable prefix (at most four per request, more is the
//!   API's 400). Each such prefix that an earlier request of the model already wrote is a
//!   cache read; the longest read counts, and the rest up to the last breakpoint is written.
//! - Bedrock Converse: the same, with `cachePoint` blocks in `toolConfig.tools`, `system`
//!   and message contents ending the prefixes.
//! - OpenAI (both APIs) and Gemini: automatic; the longest byte prefix the request shares
//!   with an earlier request of the model is read from the cache, nothing is reported
//!   written.
//!
//! A prefix's tokens are its canonical text's bytes over the model's bytes per token; the
//! cache key leaves the breakpoint markers out, as the providers' do (a breakpoint that
//! moves on to a later block does not change the prefix before it).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::wire::Wire;

/// The most bodies kept per model for automatic caching.
const KEPT_BODIES: usize = 64;
/// Anthropic and Bedrock refuse more breakpoints than this.
pub const MAX_BREAKPOINTS: usize = 4;

/// What the cache held for one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub read_tokens: u64,
    pub write_tokens: u64,
    /// Where the request's breakpoints sit (`tools[2]`, `system[0]`,
    /// `messages[3].content[1]`), in prompt order.
    pub breakpoints: Vec<String>,
}

/// The simulator's prompt cache, across requests.
#[derive(Debug, Default)]
pub struct PromptCache {
    /// Prefixes written, by model.
    written: BTreeMap<String, BTreeSet<String>>,
    /// Recent bodies, by model, for the automatic caches.
    bodies: BTreeMap<String, Vec<String>>,
}

impl PromptCache {
    /// Looks `body` up and stores what it writes. `Err` for more breakpoints than allowed.
    pub fn request(
        &mut self,
        wire: Wire,
        model: &str,
        body: &Value,
        raw: &str,
        bytes_per_token: f64,
    ) -> Result<Outcome, String> {
        let tokens = |bytes: usize| (bytes as f64 / bytes_per_token).ceil() as u64;
        match wire {
            Wire::Anthropic | Wire::Bedrock => {
                let boundaries = if wire == Wire::Anthropic {
                    anthropic_prefixes(body)
                } else {
                    bedrock_prefixes(body)
                };
                let breakpoints: Vec<String> = boundaries
                    .iter()
                    .filter_map(|b| b.breakpoint.clone())
                    .collect();
                if breakpoints.len() > MAX_BREAKPOINTS {
                    return Err(format!(
                        "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {}.",
                        breakpoints.len()
                    ));
                }
                let written = self.written.entry(model.to_owned()).or_default();
                // Each breakpoint looks for a hit at itself and the block boundaries before
                // it, up to LOOKBACK of them.
                let mut read = 0;
                for (i, b) in boundaries.iter().enumerate() {
                    if b.breakpoint.is_none() {
                        continue;
                    }
                    let from = i.saturating_sub(LOOKBACK);
                    if let Some(hit) = boundaries[from..=i]
                        .iter()
                        .rev()
                        .find(|c| written.contains(&c.prefix))
                    {
                        read = read.max(tokens(hit.prefix.len()));
                    }
                }
                let last = boundaries.iter().rev().find(|b| b.breakpoint.is_some());
                let write = match last {
                    Some(b) if !written.contains(&b.prefix) => {
                        tokens(b.prefix.len()).saturating_sub(read)
                    }
                    _ => 0,
                };
                written.extend(
                    boundaries
                        .into_iter()
                        .filter(|b| b.breakpoint.is_some())
                        .map(|b| b.prefix),
                );
                Ok(Outcome {
                    read_tokens: read,
                    write_tokens: write,
                    breakpoints,
                })
            }
            Wire::OpenaiChat | Wire::OpenaiResponses | Wire::Gemini => {
                let kept = self.bodies.entry(model.to_owned()).or_default();
                let shared = kept
                    .iter()
                    .map(|b| common_prefix(b, raw))
                    .max()
                    .unwrap_or(0);
                kept.push(raw.to_owned());
                if kept.len() > KEPT_BODIES {
                    kept.remove(0);
                }
                Ok(Outcome {
                    read_tokens: (shared as f64 / bytes_per_token).floor() as u64,
                    write_tokens: 0,
                    breakpoints: Vec::new(),
                })
            }
        }
    }
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// A block's text for the cache key: the block without its breakpoint marker.
fn key_text(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut m = m.clone();
            m.remove("cache_control");
            Value::Object(m).to_string()
        }
        other => other.to_string(),
    }
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A block boundary of the prompt: the prompt up to it, and the breakpoint there, if any.
struct Boundary {
    prefix: String,
    breakpoint: Option<String>,
}

/// Block boundaries a breakpoint looks back over for a cache hit (Anthropic's is 20).
const LOOKBACK: usize = 20;

/// The block boundaries of an Anthropic body, in prompt order.
fn anthropic_prefixes(body: &Value) -> Vec<Boundary> {
    let mut text = String::new();
    let mut out = Vec::new();
    let mut block = |place: String, v: &Value, text: &mut String| {
        text.push_str(&key_text(v));
        text.push('\n');
        out.push(Boundary {
            prefix: text.clone(),
            breakpoint: v.get("cache_control").is_some().then_some(place),
        });
    };
    for (i, t) in array(body, "tools").iter().enumerate() {
        block(format!("tools[{i}]"), t, &mut text);
    }
    match body.get("system") {
        Some(Value::Array(blocks)) => {
            for (i, b) in blocks.iter().enumerate() {
                block(format!("system[{i}]"), b, &mut text);
            }
        }
        Some(other) => {
            text.push_str(&other.to_string());
            text.push('\n');
        }
        None => {}
    }
    for (i, m) in array(body, "messages").iter().enumerate() {
        text.push_str(m.get("role").and_then(Value::as_str).unwrap_or_default());
        text.push(':');
        match m.get("content") {
            Some(Value::Array(blocks)) => {
                for (j, b) in blocks.iter().enumerate() {
                    block(format!("messages[{i}].content[{j}]"), b, &mut text);
                }
            }
            Some(other) => {
                text.push_str(&other.to_string());
                text.push('\n');
            }
            None => {}
        }
    }
    out
}

/// The block boundaries of a Converse body; a `cachePoint` is a breakpoint at the boundary
/// before it.
fn bedrock_prefixes(body: &Value) -> Vec<Boundary> {
    let mut text = String::new();
    let mut out: Vec<Boundary> = Vec::new();
    let mut walk = |place: String, v: &Value, text: &mut String| {
        if v.get("cachePoint").is_some() {
            out.push(Boundary {
                prefix: text.clone(),
                breakpoint: Some(place),
            });
        } else {
            text.push_str(&v.to_string());
            text.push('\n');
            out.push(Boundary {
                prefix: text.clone(),
                breakpoint: None,
            });
        }
    };
    let tools = body
        .pointer("/toolConfig/tools")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for (i, t) in tools.iter().enumerate() {
        walk(format!("toolConfig.tools[{i}]"), t, &mut text);
    }
    for (i, s) in array(body, "system").iter().enumerate() {
        walk(format!("system[{i}]"), s, &mut text);
    }
    for (i, m) in array(body, "messages").iter().enumerate() {
        text.push_str(m.get("role").and_then(Value::as_str).unwrap_or_default());
        text.push(':');
        for (j, b) in array(m, "content").iter().enumerate() {
            walk(format!("messages[{i}].content[{j}]"), b, &mut text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_anthropic_prefix_written_once_is_read_after_and_the_tail_is_written() {
        let mut c = PromptCache::default();
        let eph = json!({"type": "ephemeral"});
        let first = json!({
            "tools": [{"name": "a", "cache_control": eph}],
            "system": [{"type": "text", "text": "sys", "cache_control": eph}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": eph}]}],
        });
        let o = c
            .request(Wire::Anthropic, "m", &first, "", 1.0)
            .expect("ok");
        assert_eq!(o.read_tokens, 0);
        assert!(o.write_tokens > 0);
        assert_eq!(
            o.breakpoints,
            ["tools[0]", "system[0]", "messages[0].content[0]"]
        );
        // The next turn: the old tail lost its marker, a new tail has it.
        let second = json!({
            "tools": [{"name": "a", "cache_control": eph}],
            "system": [{"type": "text", "text": "sys", "cache_control": eph}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "yo"}]},
                {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": eph}]},
            ],
        });
        let o2 = c
            .request(Wire::Anthropic, "m", &second, "", 1.0)
            .expect("ok");
        assert_eq!(
            o2.read_tokens, o.write_tokens,
            "the whole first prompt is read"
        );
        assert!(o2.write_tokens > 0);
        let five = json!({"tools": [
            {"name": "a", "cache_control": eph}, {"name": "b", "cache_control": eph},
            {"name": "c", "cache_control": eph}, {"name": "d", "cache_control": eph},
            {"name": "e", "cache_control": eph}]});
        assert!(c.request(Wire::Anthropic, "m", &five, "", 1.0).is_err());
    }

    #[test]
    fn automatic_caches_read_the_shared_byte_prefix() {
        let mut c = PromptCache::default();
        let v = json!({});
        assert_eq!(
            c.request(Wire::OpenaiChat, "m", &v, "abcdefgh", 2.0)
                .expect("ok")
                .read_tokens,
            0
        );
        let o = c
            .request(Wire::OpenaiChat, "m", &v, "abcdefXY", 2.0)
            .expect("ok");
        assert_eq!((o.read_tokens, o.write_tokens), (3, 0));
        let o = c
            .request(Wire::OpenaiChat, "other", &v, "abcdefXY", 2.0)
            .expect("ok");
        assert_eq!(o.read_tokens, 0, "caches are per model");
    }
}
