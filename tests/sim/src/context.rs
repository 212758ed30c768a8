//! The providers' server-side context management, as their documentation describes it.
//!
//! - Anthropic context editing (beta `context-management-2025-06-27`): a request's
//!   `context_management.edits` may hold a `clear_tool_uses_20250919` edit. Once the prompt
//!   reaches `trigger` input tokens (default 100,000), the results of every tool use but the
//!   `keep` most recent (default 3) are cleared, oldest first, never those of `exclude_tools`;
//!   when that would free fewer than `clear_at_least` tokens nothing is cleared. The reply
//!   reports `context_management.applied_edits` (`cleared_tool_uses`,
//!   `cleared_input_tokens`), and its input tokens count the edited prompt. Without the beta
//!   header the field is refused.
//! - OpenAI Responses compaction: `context_management: [{"type": "compaction",
//!   "compact_threshold": N}]`. Once the input reaches N tokens the server compacts it: the
//!   output starts with an opaque `compaction` item (`encrypted_content`) that stands for all
//!   the input before it; a later request sends the item back in its place.

use serde_json::{Value, json};

/// The beta header value that enables Anthropic's context editing.
pub const ANTHROPIC_BETA: &str = "context-management-2025-06-27";
pub const CLEAR_TOOL_USES: &str = "clear_tool_uses_20250919";

/// One applied `clear_tool_uses_20250919` edit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleared {
    pub tool_uses: u64,
    pub input_tokens: u64,
}

/// What Anthropic's context editing does to `body`: `Ok(None)` when the request asks for
/// none, `Err` when it asks without the beta header.
pub fn anthropic_edits(
    body: &Value,
    beta: Option<&str>,
    estimated_tokens: u64,
    bytes_per_token: f64,
) -> Result<Option<Cleared>, String> {
    let Some(cm) = body.get("context_management") else {
        return Ok(None);
    };
    if !beta.is_some_and(|b| b.split(',').any(|v| v.trim() == ANTHROPIC_BETA)) {
        return Err(format!(
            "context_management: Extra inputs are not permitted (requires the anthropic-beta header {ANTHROPIC_BETA})"
        ));
    }
    let edits = cm
        .get("edits")
        .and_then(Value::as_array)
        .ok_or("context_management.edits: Field required")?;
    let mut total = Cleared::default();
    for edit in edits {
        if edit.get("type").and_then(Value::as_str) != Some(CLEAR_TOOL_USES) {
            return Err(format!(
                "context_management.edits: unknown edit type {edit}"
            ));
        }
        let value = |k: &str, d: u64| {
            edit.pointer(&format!("/{k}/value"))
                .and_then(Value::as_u64)
                .unwrap_or(d)
        };
        let (trigger, keep, at_least) = (
            value("trigger", 100_000),
            value("keep", 3),
            value("clear_at_least", 0),
        );
        if estimated_tokens < trigger {
            continue;
        }
        let exclude: Vec<&str> = edit
            .get("exclude_tools")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let results = tool_results(body, &exclude);
        let clear = results.len().saturating_sub(keep as usize);
        let bytes: usize = results[..clear].iter().sum();
        let tokens = (bytes as f64 / bytes_per_token).ceil() as u64;
        if clear == 0 || tokens < at_least {
            continue;
        }
        total.tool_uses += clear as u64;
        total.input_tokens += tokens;
    }
    Ok(Some(total))
}

/// Sizes of the `tool_result` blocks of `body`, oldest first, without those of `exclude`d
/// tools.
fn tool_results(body: &Value, exclude: &[&str]) -> Vec<usize> {
    let mut names = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for block in m
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match block.get("type").and_then(Value::as_str) {
                Some("tool_use") => {
                    let id = block.get("id").and_then(Value::as_str).unwrap_or_default();
                    let name = block
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    names.insert(id.to_owned(), name.to_owned());
                }
                Some("tool_result") => {
                    let id = block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if names.get(id).is_some_and(|n| exclude.contains(&n.as_str())) {
                        continue;
                    }
                    out.push(block.get("content").map_or(0, |c| c.to_string().len()));
                }
                _ => {}
            }
        }
    }
    out
}

/// The `context_management` field of an Anthropic reply.
pub fn anthropic_applied(c: Cleared) -> Value {
    let edits = if c.tool_uses > 0 {
        json!([{"type": CLEAR_TOOL_USES, "cleared_tool_uses": c.tool_uses,
                "cleared_input_tokens": c.input_tokens}])
    } else {
        json!([])
    };
    json!({"applied_edits": edits})
}

/// The Responses API's compaction threshold of `body`, if it asks for compaction.
pub fn compaction_threshold(body: &Value) -> Option<u64> {
    body.get("context_management")?
        .as_array()?
        .iter()
        .find(|e| e.get("type").and_then(Value::as_str) == Some("compaction"))?
        .get("compact_threshold")?
        .as_u64()
}

/// The opaque compaction item of request `seq`, standing for `items` input items.
pub fn compaction_item(seq: u64, items: usize) -> Value {
    json!({"type": "compaction", "id": format!("cmp_sim_{seq}"),
           "encrypted_content": format!("gAAAAsim{seq:08}x{items:04}")})
}

#[cfg(test)]
mod tests {
    use super::*;

    // The bodies cairn's encoders and decoders are tested against, written from the
    // providers' references (their README names the pages): the simulator reads the same
    // field names and answers in the same shapes.
    const ANTHROPIC_REQUEST: &str = include_str!(
        "../../../agent/tests/data/provider-bodies/anthropic-context-editing-request.json"
    );
    const ANTHROPIC_RESPONSE: &str = include_str!(
        "../../../agent/tests/data/provider-bodies/anthropic-context-editing-response.json"
    );
    const RESPONSES_REQUEST: &str =
        include_str!("../../../agent/tests/data/provider-bodies/responses-compaction-request.json");
    const RESPONSES_RESPONSE: &str = include_str!(
        "../../../agent/tests/data/provider-bodies/responses-compaction-response.json"
    );

    fn recorded(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn the_recorded_anthropic_edit_is_read_field_by_field() {
        let mut body = recorded(ANTHROPIC_REQUEST);
        assert!(anthropic_edits(&body, None, 40_000, 4.0).is_err());
        // Keep one: of the two results not excluded (web_search's is), the older is cleared;
        // tiny tokens per byte so that `clear_at_least` is met.
        body["context_management"]["edits"][0]["keep"]["value"] = json!(1);
        let at = |tokens| anthropic_edits(&body, Some(ANTHROPIC_BETA), tokens, 0.001).unwrap();
        assert_eq!(at(29_999), Some(Cleared::default()), "below the trigger");
        assert_eq!(at(30_000).map(|c| c.tool_uses), Some(1));
        // Clearing less than `clear_at_least` clears nothing.
        let few = anthropic_edits(&body, Some(ANTHROPIC_BETA), 30_000, 1000.0).unwrap();
        assert_eq!(few, Some(Cleared::default()));
    }

    #[test]
    fn the_anthropic_applied_edit_has_the_recorded_shape() {
        let recorded = recorded(ANTHROPIC_RESPONSE);
        let entry = recorded["context_management"]["applied_edits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == CLEAR_TOOL_USES)
            .unwrap();
        let ours = anthropic_applied(Cleared {
            tool_uses: 2,
            input_tokens: 18_250,
        });
        assert_eq!(&ours["applied_edits"][0], entry);
    }

    #[test]
    fn the_recorded_compaction_request_and_item_match_the_simulator() {
        assert_eq!(
            compaction_threshold(&recorded(RESPONSES_REQUEST)),
            Some(200_000)
        );
        let recorded = recorded(RESPONSES_RESPONSE);
        let item = &recorded["output"][0];
        let ours = compaction_item(7, 3);
        let (mut a, mut b) = (keys(&ours), keys(item));
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        assert_eq!(ours["type"], item["type"]);
        assert!(ours["encrypted_content"].is_string() && ours["id"].is_string());
    }
}
