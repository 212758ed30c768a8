//! The answer's shape and the model's reasoning effort: what a client may ask for beyond
//! tools and sampling, and which provider families can honour it.
//!
//! Each family spells the settings its own way (the provider modules translate); a family
//! without a setting refuses the request up front ([`unsupported_by`]) instead of sending a
//! request that silently ignores what the caller relies on.

use cairn_crds::session::ProviderKind;
use serde_json::{Value, json};

/// The shape the reply must take (`text.format` of the Responses API, `response_format` of
/// Chat Completions).
#[derive(Clone, Debug, PartialEq)]
pub enum OutputFormat {
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `schema`.
    JsonSchema {
        name: String,
        description: Option<String>,
        schema: Value,
        strict: Option<bool>,
    },
}

impl OutputFormat {
    /// Bytes the format adds to every request (like the tool catalog, it is never compacted).
    pub fn weight(&self) -> usize {
        match self {
            Self::JsonObject => 0,
            Self::JsonSchema {
                name,
                description,
                schema,
                ..
            } => {
                name.len() + description.as_ref().map_or(0, String::len) + schema.to_string().len()
            }
        }
    }

    /// The Responses API's `text.format` object (what the Response object echoes too).
    pub fn responses_format(&self) -> Value {
        match self {
            Self::JsonObject => json!({"type": "json_object"}),
            Self::JsonSchema {
                name,
                description,
                schema,
                strict,
            } => {
                let mut f = json!({"type": "json_schema", "name": name, "schema": schema});
                if let Some(d) = description {
                    f["description"] = json!(d);
                }
                if let Some(s) = strict {
                    f["strict"] = json!(s);
                }
                f
            }
        }
    }

    /// Chat Completions' `response_format` object.
    pub fn chat_format(&self) -> Value {
        match self {
            Self::JsonObject => json!({"type": "json_object"}),
            Self::JsonSchema {
                name,
                description,
                schema,
                strict,
            } => {
                let mut inner = json!({"name": name, "schema": schema});
                if let Some(d) = description {
                    inner["description"] = json!(d);
                }
                if let Some(s) = strict {
                    inner["strict"] = json!(s);
                }
                json!({"type": "json_schema", "json_schema": inner})
            }
        }
    }

    /// The JSON Schema, when the format has one.
    pub fn schema(&self) -> Option<&Value> {
        match self {
            Self::JsonObject => None,
            Self::JsonSchema { schema, .. } => Some(schema),
        }
    }
}

/// How much the model reasons before it answers, on OpenAI's scale (`reasoning.effort`,
/// `reasoning_effort`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

impl Effort {
    pub const NAMES: [&'static str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Self::None,
            "minimal" => Self::Minimal,
            "low" => Self::Low,
            "medium" => Self::Medium,
            "high" => Self::High,
            "xhigh" => Self::Xhigh,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// Efforts Anthropic's `output_config.effort` has.
const ANTHROPIC_EFFORTS: [Effort; 3] = [Effort::Low, Effort::Medium, Effort::High];
/// Efforts Gemini's `thinkingConfig.thinkingLevel` has.
const GEMINI_EFFORTS: [Effort; 4] = [Effort::Minimal, Effort::Low, Effort::Medium, Effort::High];

/// Why a provider family cannot honour `format` or `effort`; `None` when it can.
pub fn unsupported_by(
    kind: ProviderKind,
    format: Option<&OutputFormat>,
    effort: Option<Effort>,
) -> Option<String> {
    let kind_name = kind.as_str();
    let efforts = |allowed: &[Effort]| {
        effort.filter(|e| !allowed.contains(e)).map(|e| {
            let names: Vec<_> = allowed.iter().map(|a| a.as_str()).collect();
            format!(
                "reasoning effort {:?}: the session's provider ({kind_name}) accepts {}",
                e.as_str(),
                names.join(", ")
            )
        })
    };
    match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses | ProviderKind::OpenaiCompatible => {
            None
        }
        ProviderKind::Anthropic => match format {
            Some(OutputFormat::JsonObject) => Some(format!(
                "json_object: the session's provider ({kind_name}) only constrains output by a JSON Schema; send a json_schema format"
            )),
            _ => efforts(&ANTHROPIC_EFFORTS),
        },
        ProviderKind::Gemini => efforts(&GEMINI_EFFORTS),
        ProviderKind::Bedrock => {
            if format.is_some() {
                Some(format!(
                    "structured output: the session's provider ({kind_name}, Converse API) has no output-format setting"
                ))
            } else if effort.is_some() {
                Some(format!(
                    "reasoning effort: the session's provider ({kind_name}, Converse API) has no effort setting"
                ))
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_either_takes_a_setting_or_says_why_not() {
        let schema = OutputFormat::JsonSchema {
            name: "answer".into(),
            description: None,
            schema: json!({"type": "object"}),
            strict: Some(true),
        };
        for kind in ProviderKind::ALL {
            let took = unsupported_by(kind, Some(&schema), Some(Effort::High));
            match kind {
                ProviderKind::Bedrock => assert!(took.is_some_and(|m| m.contains("bedrock"))),
                _ => assert_eq!(took, None, "{kind:?}"),
            }
        }
        let anthropic = unsupported_by(
            ProviderKind::Anthropic,
            Some(&OutputFormat::JsonObject),
            None,
        );
        assert!(anthropic.is_some_and(|m| m.contains("json_schema")));
        let gemini = unsupported_by(ProviderKind::Gemini, None, Some(Effort::Xhigh));
        assert!(gemini.is_some_and(|m| m.contains("minimal, low, medium, high")));
    }

    #[test]
    fn effort_names_round_trip() {
        for name in Effort::NAMES {
            assert_eq!(Effort::parse(name).map(Effort::as_str), Some(name));
        }
        assert_eq!(Effort::parse("maximal"), None);
    }
}
