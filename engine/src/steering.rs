//! Output-token steering: the verbosity directive that follows the system prompt, and the
//! reasoning effort lowered for clearly trivial prompts. Pure functions of the policy, the
//! model and the turn's input.

use cairn_crds::policy::{Output, Verbosity};
use cairn_crds::session::ProviderKind;

use crate::history::{Message, Role};
use crate::provider::Effort;

/// The directive of a verbosity: fixed text, so it stays byte-stable inside the cached
/// prompt prefix. `None` for `full`.
pub fn directive(v: Verbosity) -> Option<&'static str> {
    match v {
        Verbosity::Full => None,
        Verbosity::Concise => Some(
            "Answer concisely: lead with the answer, skip preamble and recaps, and give no more detail than the question needs.",
        ),
        Verbosity::Minimal => Some(
            "Answer as briefly as possible: the answer alone, without explanation unless asked.",
        ),
    }
}

/// The system prompt with the verbosity directive after it (the directive alone when there
/// is no prompt; the prompt alone for `full`).
pub fn system_prompt(prompt: Option<String>, v: Verbosity) -> Option<String> {
    match (prompt, directive(v)) {
        (Some(p), Some(d)) => Some(format!("{p}\n\n{d}")),
        (None, Some(d)) => Some(d.to_owned()),
        (p, None) => p,
    }
}

/// Longest prompt that counts as trivial, in characters.
pub const TRIVIAL_CHARS: usize = 160;

/// Whether the model has a reasoning-effort setting the request can lower.
pub fn has_effort(kind: ProviderKind, model: &str) -> bool {
    let m = crate::catalog::normalise(model);
    match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses => {
            (m.starts_with("gpt-5") && !m.starts_with("gpt-5-chat"))
                || ["o1", "o3", "o4"].iter().any(|p| m.starts_with(p))
        }
        ProviderKind::Anthropic => m.starts_with("claude-opus-4-5"),
        ProviderKind::Gemini => m.starts_with("gemini-3"),
        ProviderKind::Bedrock | ProviderKind::OpenaiCompatible => false,
    }
}

/// A clearly trivial input: one user message of one short line, no code, no images.
pub fn is_trivial(input: &[Message]) -> bool {
    let [m] = input else { return false };
    m.role == Role::User
        && m.images.is_empty()
        && !m.content.contains('\n')
        && !m.content.contains('`')
        && m.content.trim().chars().count() <= TRIVIAL_CHARS
}

/// The effort to send: the client's when it chose one; `low` for a trivial input when the
/// policy routes effort and the model has the setting; else none (the provider's default,
/// which is never below `low` on the models routed).
pub fn route_effort(
    chosen: Option<Effort>,
    output: &Output,
    kind: ProviderKind,
    model: &str,
    input: &[Message],
) -> Option<Effort> {
    if chosen.is_some() || !output.effort_routing {
        return chosen;
    }
    (has_effort(kind, model) && is_trivial(input)).then_some(Effort::Low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directive_follows_the_prompt_and_full_adds_nothing() {
        assert_eq!(
            system_prompt(Some("p".into()), Verbosity::Full).as_deref(),
            Some("p")
        );
        assert_eq!(system_prompt(None, Verbosity::Full), None);
        let c = system_prompt(Some("p".into()), Verbosity::Concise).unwrap_or_default();
        assert!(c.starts_with("p\n\nAnswer concisely"), "{c}");
        assert_eq!(
            system_prompt(None, Verbosity::Minimal).as_deref(),
            directive(Verbosity::Minimal)
        );
    }

    #[test]
    fn effort_is_lowered_only_for_trivial_prompts_on_models_with_the_setting() {
        let on = Output {
            verbosity: Verbosity::Concise,
            effort_routing: true,
        };
        let hi = [Message::user("hi, what time zone is UTC+1?")];
        let k = ProviderKind::OpenaiResponses;
        assert_eq!(route_effort(None, &on, k, "gpt-5", &hi), Some(Effort::Low));
        // The client's choice stands, even above low.
        assert_eq!(
            route_effort(Some(Effort::High), &on, k, "gpt-5", &hi),
            Some(Effort::High)
        );
        assert_eq!(
            route_effort(None, &Output::default(), k, "gpt-5", &hi),
            None
        );
        assert_eq!(
            route_effort(None, &on, k, "gpt-4o", &hi),
            None,
            "no setting"
        );
        assert_eq!(
            route_effort(None, &on, ProviderKind::Bedrock, "claude-opus-4-5", &hi),
            None
        );
        for hard in [
            vec![Message::user("fix this:\n```rust\nfn main() {}\n```")],
            vec![Message::user("x".repeat(TRIVIAL_CHARS + 1))],
            vec![Message::user("a"), Message::user("b")],
            vec![Message::tool("c1", "ok")],
        ] {
            assert_eq!(route_effort(None, &on, k, "gpt-5", &hard), None, "{hard:?}");
        }
    }
}
