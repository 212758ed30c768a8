//! Model catalog: context window and largest reply of current models, with fallbacks per
//! model family and per provider, overridable by the AgentSession.
//!
//! Lookup normalises what gateways add around a model name (Bedrock regional and vendor
//! prefixes, ARNs, `-v1:0` suffixes, OpenRouter's `vendor/` prefix, dotted Claude versions),
//! then takes the longest known prefix. A name no prefix knows falls back to its family
//! (anything containing `claude` gets a Claude-sized window, wherever it is served), then
//! to the provider's default.

use cairn_crds::{AgentSessionSpec, ProviderKind};

/// Limits of one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Context window in tokens (input + output).
    pub context_window: u64,
    /// Largest reply in tokens.
    pub max_output_tokens: u64,
    pub source: LimitSource,
}

/// Where the limits came from, for logs and status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitSource {
    /// A catalog entry for this model.
    Model,
    /// The model's family (e.g. an unknown Claude).
    Family,
    /// The provider's default for unknown models.
    Provider,
    /// At least one value came from the AgentSession spec.
    Override,
}

const K: u64 = 1024;

/// `(prefix, context window, max output)`, matched against the normalised name.
const MODELS: &[(&str, u64, u64)] = &[
    // Anthropic
    ("claude-opus-4-5", 200_000, 64_000),
    ("claude-opus-4-1", 200_000, 32_000),
    ("claude-opus-4", 200_000, 32_000),
    ("claude-sonnet-4-5", 200_000, 64_000),
    ("claude-sonnet-4", 200_000, 64_000),
    ("claude-haiku-4-5", 200_000, 64_000),
    ("claude-3-7-sonnet", 200_000, 64_000),
    ("claude-3-5-sonnet", 200_000, 8_192),
    ("claude-3-5-haiku", 200_000, 8_192),
    ("claude-3-opus", 200_000, 4_096),
    ("claude-3-haiku", 200_000, 4_096),
    // OpenAI
    ("gpt-5-chat", 128_000, 16_384),
    ("gpt-5", 400_000, 128_000),
    ("gpt-4.1", 1_047_576, 32_768),
    ("gpt-4o", 128_000, 16_384),
    ("gpt-4-turbo", 128_000, 4_096),
    ("gpt-4", 8_192, 8_192),
    ("gpt-3.5-turbo", 16_385, 4_096),
    ("gpt-oss", 131_072, 32_768),
    ("o1-mini", 128_000, 65_536),
    ("o1", 200_000, 100_000),
    ("o3", 200_000, 100_000),
    ("o4-mini", 200_000, 100_000),
    // Google
    ("gemini-3", 1_048_576, 65_536),
    ("gemini-2.5", 1_048_576, 65_536),
    ("gemini-2.0-flash", 1_048_576, 8_192),
    ("gemini-1.5-pro", 2_097_152, 8_192),
    ("gemini-1.5-flash", 1_048_576, 8_192),
    // Amazon
    ("nova-premier", 1_000_000, 10_000),
    ("nova-pro", 300_000, 10_000),
    ("nova-lite", 300_000, 10_000),
    ("nova-micro", 128_000, 10_000),
    // Mistral
    ("mistral-large", 128 * K, 32 * K),
    ("mistral-medium", 128 * K, 32 * K),
    ("mistral-small", 128 * K, 32 * K),
    ("magistral", 128 * K, 40 * K),
    ("codestral", 256 * K, 32 * K),
    ("devstral", 128 * K, 32 * K),
    ("ministral", 128 * K, 32 * K),
    ("pixtral", 128 * K, 32 * K),
    ("open-mistral-nemo", 128 * K, 32 * K),
    // xAI
    ("grok-4-fast", 2_000_000, 30_000),
    ("grok-4", 256_000, 64_000),
    ("grok-code-fast", 256_000, 10_000),
    ("grok-3", 131_072, 16_384),
    // DeepSeek
    ("deepseek-reasoner", 128 * K, 64 * K),
    ("deepseek-chat", 128 * K, 8 * K),
    ("deepseek-r1", 128 * K, 32 * K),
    ("deepseek-v3", 128 * K, 8 * K),
    // Llama (Groq, Bedrock)
    ("llama-3.3-70b-versatile", 131_072, 32_768),
    ("llama-3.1-8b-instant", 131_072, 131_072),
    ("llama-4-scout", 131_072, 8_192),
    ("llama-4-maverick", 131_072, 8_192),
    ("llama3-3-70b", 128_000, 8_192),
    ("llama3-1", 128_000, 8_192),
    ("llama4", 128_000, 8_192),
];

/// `(substring, context window, max output)` for families, tried when no prefix matched.
const FAMILIES: &[(&str, u64, u64)] = &[
    ("claude", 200_000, 8_192),
    ("gpt-5", 400_000, 128_000),
    ("gpt-4", 128_000, 16_384),
    ("gemini", 1_048_576, 8_192),
    ("nova", 300_000, 10_000),
    ("mistral", 128 * K, 32 * K),
    ("grok", 131_072, 16_384),
    ("deepseek", 128 * K, 8 * K),
    ("llama", 128_000, 8_192),
    ("qwen", 32_768, 8_192),
];

/// Default for an unknown model of a provider kind.
fn provider_default(kind: ProviderKind) -> (u64, u64) {
    match kind {
        ProviderKind::Anthropic => (200_000, 8_192),
        ProviderKind::Openai | ProviderKind::OpenaiResponses => (128_000, 16_384),
        ProviderKind::Gemini => (1_048_576, 8_192),
        ProviderKind::Bedrock => (128_000, 4_096),
        // vLLM and Ollama serve whatever was configured; stay small and let the session say.
        ProviderKind::OpenaiCompatible => (32_768, 4_096),
    }
}

/// Bedrock geography prefixes of cross-region inference profiles.
const REGION_PREFIXES: &[&str] = &[
    "us.", "eu.", "apac.", "global.", "jp.", "au.", "ca.", "us-gov.",
];
/// Vendor prefixes of Bedrock model ids.
const VENDOR_PREFIXES: &[&str] = &[
    "anthropic.",
    "amazon.",
    "meta.",
    "mistral.",
    "deepseek.",
    "openai.",
    "cohere.",
    "ai21.",
    "qwen.",
    "writer.",
];

/// The catalog's spelling of a model name.
pub fn normalise(model: &str) -> String {
    let mut m = model.trim().to_ascii_lowercase();
    // ARNs and OpenRouter-style `vendor/model`: the model is the last segment.
    if let Some(last) = m.rsplit('/').next() {
        m = last.to_string();
    }
    m = m.strip_prefix("models/").unwrap_or(&m).to_string();
    for p in REGION_PREFIXES {
        if let Some(rest) = m.strip_prefix(p) {
            m = rest.to_string();
            break;
        }
    }
    for p in VENDOR_PREFIXES {
        if let Some(rest) = m.strip_prefix(p) {
            m = rest.to_string();
            break;
        }
    }
    if let Some(i) = m.find("-v1:").or_else(|| m.find("-v2:")) {
        m.truncate(i);
    }
    if m.contains("claude") {
        m = m.replace('.', "-");
    }
    m
}

/// Catalog limits of `model` served through `kind`, without overrides.
pub fn lookup(kind: ProviderKind, model: &str) -> Limits {
    let m = normalise(model);
    let best = MODELS
        .iter()
        .filter(|(p, ..)| m.starts_with(p))
        .max_by_key(|(p, ..)| p.len());
    if let Some((_, w, o)) = best {
        return limits(*w, *o, LimitSource::Model);
    }
    if let Some((_, w, o)) = FAMILIES.iter().find(|(f, ..)| m.contains(f)) {
        return limits(*w, *o, LimitSource::Family);
    }
    let (w, o) = provider_default(kind);
    limits(w, o, LimitSource::Provider)
}

fn limits(context_window: u64, max_output_tokens: u64, source: LimitSource) -> Limits {
    Limits {
        context_window,
        max_output_tokens,
        source,
    }
}

/// Limits for a session: the catalog's, with `contextWindow` / `maxOutputTokens` from the
/// spec taking precedence. A catalog output limit never exceeds the (overridden) window.
pub fn resolve_limits(
    kind: ProviderKind,
    model: &str,
    context_window: Option<u64>,
    max_output_tokens: Option<u64>,
) -> Limits {
    let base = lookup(kind, model);
    let window = context_window.unwrap_or(base.context_window);
    let output = max_output_tokens.unwrap_or(base.max_output_tokens.min(window));
    let source = if context_window.is_some() || max_output_tokens.is_some() {
        LimitSource::Override
    } else {
        base.source
    };
    limits(window, output, source)
}

/// [`resolve_limits`] for an AgentSession spec.
pub fn limits_for(spec: &AgentSessionSpec) -> Limits {
    resolve_limits(
        spec.provider.kind,
        &spec.provider.model,
        spec.context_window,
        spec.max_output_tokens,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProviderKind::*;

    #[test]
    fn current_models_resolve_exactly() {
        let cases = [
            (Anthropic, "claude-sonnet-4-5-20250929", 200_000, 64_000),
            (Anthropic, "claude-opus-4-1", 200_000, 32_000),
            (Openai, "gpt-5-mini", 400_000, 128_000),
            (Openai, "gpt-4.1-nano", 1_047_576, 32_768),
            (OpenaiResponses, "o4-mini", 200_000, 100_000),
            (Gemini, "gemini-2.5-flash-lite", 1_048_576, 65_536),
            (Gemini, "models/gemini-2.5-pro", 1_048_576, 65_536),
            (OpenaiCompatible, "grok-4-fast-reasoning", 2_000_000, 30_000),
            (OpenaiCompatible, "deepseek-reasoner", 131_072, 65_536),
            (OpenaiCompatible, "mistral-large-latest", 131_072, 32_768),
            (OpenaiCompatible, "llama-3.3-70b-versatile", 131_072, 32_768),
            (
                OpenaiCompatible,
                "anthropic/claude-sonnet-4.5",
                200_000,
                64_000,
            ),
        ];
        for (kind, model, w, o) in cases {
            let l = lookup(kind, model);
            assert_eq!(
                (l.context_window, l.max_output_tokens, l.source),
                (w, o, LimitSource::Model),
                "{model}"
            );
        }
    }

    #[test]
    fn bedrock_ids_with_region_and_version_resolve() {
        for id in [
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "eu.anthropic.claude-sonnet-4-20250514-v1:0",
            "anthropic.claude-sonnet-4-5-20250929-v1:0",
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/global.anthropic.claude-sonnet-4-5-20250929-v1:0",
        ] {
            let l = lookup(Bedrock, id);
            assert_eq!(
                (l.context_window, l.max_output_tokens),
                (200_000, 64_000),
                "{id}"
            );
        }
        assert_eq!(
            lookup(Bedrock, "us.amazon.nova-pro-v1:0").context_window,
            300_000
        );
        assert_eq!(
            lookup(Bedrock, "us.meta.llama3-3-70b-instruct-v1:0").context_window,
            128_000
        );
    }

    #[test]
    fn unknown_claude_anywhere_gets_a_claude_window() {
        for kind in [Bedrock, Anthropic, OpenaiCompatible] {
            let l = lookup(kind, "us.anthropic.claude-zephyr-9-20300101-v1:0");
            assert_eq!(l.context_window, 200_000);
            assert_eq!(l.source, LimitSource::Family);
        }
        let l = lookup(Bedrock, "cohere.command-r-plus-v1:0");
        assert_eq!(
            (l.context_window, l.source),
            (128_000, LimitSource::Provider)
        );
    }

    #[test]
    fn spec_overrides_win_and_output_fits_the_window() {
        let l = resolve_limits(Anthropic, "claude-sonnet-4-5", Some(50_000), None);
        assert_eq!(
            (l.context_window, l.max_output_tokens, l.source),
            (50_000, 50_000, LimitSource::Override)
        );
        let l = resolve_limits(Openai, "gpt-5", None, Some(1000));
        assert_eq!((l.context_window, l.max_output_tokens), (400_000, 1000));
        let l = resolve_limits(Openai, "gpt-5", Some(10_000), Some(1000));
        assert_eq!((l.context_window, l.max_output_tokens), (10_000, 1000));
    }
}
