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

/// Prices of one model in USD per million tokens. Cache reads and writes are priced apart
/// from the other input tokens; a provider that charges nothing extra for writing its cache
/// (OpenAI, Gemini's implicit cache) has `cache_write` equal to `input`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prices {
    pub input: f64,
    pub output: f64,
    pub cache_read: f64,
    pub cache_write: f64,
}

impl Prices {
    const fn new(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Self {
        Self {
            input,
            output,
            cache_read,
            cache_write,
        }
    }

    /// What `usage` costs, in USD: the uncached input, the cache reads, the cache writes and
    /// the output, each at its price.
    pub fn cost(&self, usage: &crate::provider::Usage) -> f64 {
        (usage.uncached_input_tokens() as f64 * self.input
            + usage.cache_read_tokens as f64 * self.cache_read
            + usage.cache_write_tokens as f64 * self.cache_write
            + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }

    fn valid(&self) -> bool {
        [self.input, self.output, self.cache_read, self.cache_write]
            .iter()
            .all(|p| p.is_finite() && *p >= 0.0)
    }
}

/// `(prefix, prices)`, matched against the normalised name like [`MODELS`]: list prices per
/// million tokens (Anthropic and Bedrock Claude: cache writes of the 5-minute cache at 1.25×
/// input, reads at 0.1×). A fleet's own prices replace these through [`PriceTable`].
const PRICES: &[(&str, Prices)] = &[
    // Anthropic
    ("claude-opus-4-5", Prices::new(5.0, 25.0, 0.5, 6.25)),
    ("claude-opus-4", Prices::new(15.0, 75.0, 1.5, 18.75)),
    ("claude-sonnet-4", Prices::new(3.0, 15.0, 0.3, 3.75)),
    ("claude-haiku-4-5", Prices::new(1.0, 5.0, 0.1, 1.25)),
    ("claude-3-7-sonnet", Prices::new(3.0, 15.0, 0.3, 3.75)),
    ("claude-3-5-sonnet", Prices::new(3.0, 15.0, 0.3, 3.75)),
    ("claude-3-5-haiku", Prices::new(0.8, 4.0, 0.08, 1.0)),
    ("claude-3-opus", Prices::new(15.0, 75.0, 1.5, 18.75)),
    ("claude-3-haiku", Prices::new(0.25, 1.25, 0.03, 0.3)),
    // OpenAI
    ("gpt-5-nano", Prices::new(0.05, 0.4, 0.005, 0.05)),
    ("gpt-5-mini", Prices::new(0.25, 2.0, 0.025, 0.25)),
    ("gpt-5", Prices::new(1.25, 10.0, 0.125, 1.25)),
    ("gpt-4.1-nano", Prices::new(0.1, 0.4, 0.025, 0.1)),
    ("gpt-4.1-mini", Prices::new(0.4, 1.6, 0.1, 0.4)),
    ("gpt-4.1", Prices::new(2.0, 8.0, 0.5, 2.0)),
    ("gpt-4o-mini", Prices::new(0.15, 0.6, 0.075, 0.15)),
    ("gpt-4o", Prices::new(2.5, 10.0, 1.25, 2.5)),
    ("o4-mini", Prices::new(1.1, 4.4, 0.275, 1.1)),
    ("o3", Prices::new(2.0, 8.0, 0.5, 2.0)),
    ("o1", Prices::new(15.0, 60.0, 7.5, 15.0)),
    // Google
    ("gemini-2.5-pro", Prices::new(1.25, 10.0, 0.125, 1.25)),
    ("gemini-2.5-flash-lite", Prices::new(0.1, 0.4, 0.01, 0.1)),
    ("gemini-2.5-flash", Prices::new(0.3, 2.5, 0.03, 0.3)),
    ("gemini-2.0-flash", Prices::new(0.1, 0.4, 0.025, 0.1)),
    // Amazon
    ("nova-premier", Prices::new(2.5, 12.5, 0.625, 2.5)),
    ("nova-pro", Prices::new(0.8, 3.2, 0.2, 0.8)),
    ("nova-lite", Prices::new(0.06, 0.24, 0.015, 0.06)),
    ("nova-micro", Prices::new(0.035, 0.14, 0.00875, 0.035)),
];

/// Model prices: the catalog's, with a fleet's own entries in front (the ConfigMap the
/// operator mounts with `--price-table-configmap`; see [`PriceTable::parse`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PriceTable {
    overrides: Vec<(String, Prices)>,
}

/// Environment variable holding the fleet's price table (YAML), as the operator sets it.
pub const PRICE_TABLE_ENV: &str = "CAIRN_PRICE_TABLE";
/// Environment variable naming a file with the fleet's price table (outside a cluster).
pub const PRICE_TABLE_FILE_ENV: &str = "CAIRN_PRICE_TABLE_FILE";

impl PriceTable {
    /// A table from YAML or JSON: model name prefixes (normalised like the catalog's) to
    /// prices per million tokens, e.g. `claude-sonnet-4-5: {input: 3, output: 15,
    /// cacheRead: 0.3, cacheWrite: 3.75}`. A negative or non-finite price is refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        let map: std::collections::BTreeMap<String, Prices> =
            serde_yaml::from_str(text).map_err(|e| format!("price table: {e}"))?;
        let mut overrides = Vec::with_capacity(map.len());
        for (model, prices) in map {
            if !prices.valid() {
                return Err(format!(
                    "price table: {model}: prices must be finite and not negative"
                ));
            }
            overrides.push((normalise(&model), prices));
        }
        Ok(Self { overrides })
    }

    /// The fleet's table, read once from [`PRICE_TABLE_ENV`] (the table itself) or the file
    /// [`PRICE_TABLE_FILE_ENV`] names; the catalog's alone when neither is set. A table that
    /// cannot be read or parsed is reported in the log and [`PriceTable::fleet_error`] (and
    /// so in `status.session.unsupported`), and the catalog's prices apply.
    pub fn fleet() -> &'static PriceTable {
        &fleet_table().0
    }

    /// Why the fleet's price table was not applied, when it was not.
    pub fn fleet_error() -> Option<&'static str> {
        fleet_table().1.as_deref()
    }

    /// Prices of `model`: the longest matching prefix of the fleet's entries, else of the
    /// catalog's; `None` for a model neither knows (its cost is not counted).
    pub fn prices(&self, model: &str) -> Option<Prices> {
        let m = normalise(model);
        let longest = |entries: &mut dyn Iterator<Item = (&str, Prices)>| {
            entries
                .filter(|(p, _)| m.starts_with(p))
                .max_by_key(|(p, _)| p.len())
                .map(|(_, prices)| prices)
        };
        longest(&mut self.overrides.iter().map(|(p, x)| (p.as_str(), *x)))
            .or_else(|| longest(&mut PRICES.iter().map(|(p, x)| (*p, *x))))
    }
}

fn fleet_table() -> &'static (PriceTable, Option<String>) {
    static TABLE: std::sync::OnceLock<(PriceTable, Option<String>)> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let read = if let Ok(text) = std::env::var(PRICE_TABLE_ENV) {
            PriceTable::parse(&text)
        } else if let Some(path) = std::env::var_os(PRICE_TABLE_FILE_ENV) {
            std::fs::read_to_string(&path)
                .map_err(|e| format!("price table {}: {e}", path.to_string_lossy()))
                .and_then(|t| PriceTable::parse(&t))
        } else {
            return (PriceTable::default(), None);
        };
        match read {
            Ok(t) => (t, None),
            Err(e) => {
                tracing::warn!(error = %e, "the fleet's price table is not applied");
                (PriceTable::default(), Some(e))
            }
        }
    })
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

    #[test]
    fn prices_resolve_like_limits_and_cost_counts_each_kind_of_token() {
        let t = PriceTable::default();
        let sonnet = t.prices("us.anthropic.claude-sonnet-4-5-20250929-v1:0");
        assert_eq!(sonnet, Some(Prices::new(3.0, 15.0, 0.3, 3.75)));
        assert_eq!(
            t.prices("gpt-5-mini").map(|p| p.input),
            Some(0.25),
            "the longest prefix wins"
        );
        assert_eq!(t.prices("my-local-model"), None);
        let usage = crate::provider::Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cache_read_tokens: 500_000,
            cache_write_tokens: 200_000,
        };
        // 300k uncached at 3, 500k read at 0.3, 200k written at 3.75, 100k out at 15.
        let cost = sonnet.map(|p| p.cost(&usage)).unwrap_or_default();
        assert!((cost - (0.9 + 0.15 + 0.75 + 1.5)).abs() < 1e-9, "{cost}");
    }

    #[test]
    fn a_fleet_table_goes_before_the_catalog_and_bad_prices_are_refused() {
        let t = PriceTable::parse(
            "claude-sonnet-4-5: {input: 1, output: 2, cacheRead: 0.1, cacheWrite: 1.5}\n\
             my-local: {input: 0, output: 0, cacheRead: 0, cacheWrite: 0}\n",
        )
        .expect("table");
        assert_eq!(
            t.prices("claude-sonnet-4-5-20250929").map(|p| p.input),
            Some(1.0)
        );
        assert_eq!(t.prices("claude-sonnet-4-0").map(|p| p.input), Some(3.0));
        assert_eq!(t.prices("my-local-7b").map(|p| p.output), Some(0.0));
        assert!(
            PriceTable::parse("m: {input: -1, output: 0, cacheRead: 0, cacheWrite: 0}").is_err()
        );
        assert!(PriceTable::parse("m: {input: 1}").is_err());
        assert!(PriceTable::parse("[not a map").is_err());
    }
}
