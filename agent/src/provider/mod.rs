//! Provider clients: each speaks one provider's wire format behind the engine's
//! [`Provider`] trait (the shapes and the trait are re-exported from `cairn_engine::provider`).

pub use cairn_engine::provider::*;

mod anthropic;
mod bedrock;
mod config;
pub mod deadline;
pub mod eventstream;
mod factory;
mod gemini;
mod http;
pub mod live;
mod openai;
mod responses;
pub mod sse;
mod wire;
mod wire_cache;

pub use anthropic::Anthropic;
pub use bedrock::{Bedrock, BedrockAuth};
pub use config::{BuildError, ClientOptions, Credentials, Secret, default_base_url};
pub use factory::build;
pub use gemini::Gemini;
pub use live::{LiveProvider, summarizer_provider};
pub use openai::OpenAiChat;
pub use responses::OpenAiResponses;
pub use wire_cache::WireCache;

/// Response decoders exposed for fuzzing and tests: each takes raw bytes as a provider would
/// send them and never panics.
pub mod decode {
    pub use super::anthropic::{decode_response as anthropic, decode_stream as anthropic_stream};
    pub use super::bedrock::{decode_response as bedrock, decode_stream as bedrock_stream};
    pub use super::gemini::{decode_response as gemini, decode_stream as gemini_stream};
    pub use super::http::DecodeError;
    pub use super::openai::{decode_response as openai, decode_stream as openai_stream};
    pub use super::responses::{decode_response as responses, decode_stream as responses_stream};
}

#[cfg(test)]
mod controls_tests {
    use serde_json::{Value, json};

    use super::wire::fixture;
    use super::*;

    /// The body of every wire format for the fixture request with `controls`.
    fn bodies(controls: Controls) -> Vec<(&'static str, Value)> {
        let mut request = fixture::request(false);
        request.controls = controls;
        let chat = OpenAiChat::new(
            "openai",
            "http://x/v1",
            None,
            false,
            ClientOptions::default(),
        )
        .expect("client");
        let v = |b: Vec<u8>| serde_json::from_slice::<Value>(&b).expect("json");
        vec![
            (
                "chat",
                v(serde_json::to_vec(&chat.body(&request)).unwrap_or_default()),
            ),
            (
                "responses",
                v(serde_json::to_vec(&OpenAiResponses::body(&request)).unwrap_or_default()),
            ),
            (
                "anthropic",
                v(serde_json::to_vec(&Anthropic::body(&request)).unwrap_or_default()),
            ),
            (
                "gemini",
                v(serde_json::to_vec(&Gemini::body(&request)).unwrap_or_default()),
            ),
            (
                "bedrock",
                v(serde_json::to_vec(&Bedrock::body(&request)).unwrap_or_default()),
            ),
        ]
    }

    #[test]
    fn the_default_controls_send_nothing() {
        for (name, b) in bodies(Controls::default()) {
            let text = b.to_string();
            for field in [
                "tool_choice",
                "toolChoice",
                "functionCallingConfig",
                "temperature",
                "top_p",
                "topP",
                "parallel",
                "response_format",
                "effort",
                "thinking",
                "output_config",
                "responseMimeType",
            ] {
                assert!(!text.contains(field), "{name}: {field} in {text}");
            }
        }
    }

    #[test]
    fn a_named_tool_choice_and_sampling_reach_every_format() {
        let controls = Controls {
            tool_choice: ToolChoice::Function("read_file".into()),
            parallel_tool_calls: Some(false),
            temperature: Some(0.5),
            top_p: Some(0.25),
            ..Controls::default()
        };
        let b: std::collections::HashMap<_, _> = bodies(controls).into_iter().collect();
        assert_eq!(
            b["chat"]["tool_choice"],
            json!({"type": "function", "function": {"name": "read_file"}})
        );
        assert_eq!(b["chat"]["parallel_tool_calls"], json!(false));
        assert_eq!(
            (&b["chat"]["temperature"], &b["chat"]["top_p"]),
            (&json!(0.5), &json!(0.25))
        );
        assert_eq!(
            b["responses"]["tool_choice"],
            json!({"type": "function", "name": "read_file"})
        );
        assert_eq!(b["responses"]["parallel_tool_calls"], json!(false));
        assert_eq!(
            b["anthropic"]["tool_choice"],
            json!({"type": "tool", "name": "read_file", "disable_parallel_tool_use": true})
        );
        assert_eq!(b["anthropic"]["top_p"], json!(0.25));
        assert_eq!(
            b["gemini"]["toolConfig"],
            json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["read_file"]}})
        );
        assert_eq!(b["gemini"]["generationConfig"]["topP"], json!(0.25));
        assert_eq!(
            b["bedrock"]["toolConfig"]["toolChoice"],
            json!({"tool": {"name": "read_file"}})
        );
        assert_eq!(b["bedrock"]["inferenceConfig"]["temperature"], json!(0.5));
    }

    #[test]
    fn a_json_schema_format_and_an_effort_reach_the_families_that_have_them() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let b: std::collections::HashMap<_, _> = bodies(Controls {
            format: Some(OutputFormat::JsonSchema {
                name: "count".into(),
                description: None,
                schema: schema.clone(),
                strict: Some(true),
            }),
            effort: Some(Effort::Low),
            ..Controls::default()
        })
        .into_iter()
        .collect();
        assert_eq!(
            b["chat"]["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "count", "schema": schema, "strict": true}})
        );
        assert_eq!(b["chat"]["reasoning_effort"], json!("low"));
        assert_eq!(
            b["responses"]["text"],
            json!({"format": {"type": "json_schema", "name": "count", "schema": schema, "strict": true}})
        );
        assert_eq!(b["responses"]["reasoning"], json!({"effort": "low"}));
        assert_eq!(
            b["anthropic"]["output_config"],
            json!({"effort": "low", "format": {"type": "json_schema", "schema": schema}})
        );
        let g = &b["gemini"]["generationConfig"];
        assert_eq!(g["responseMimeType"], json!("application/json"));
        assert_eq!(g["responseJsonSchema"], schema);
        assert_eq!(g["thinkingConfig"], json!({"thinkingLevel": "low"}));
        // Bedrock refuses both before anything is sent (`unsupported_by`).
        let bedrock = b["bedrock"].to_string();
        assert!(
            !bedrock.contains("count") && !bedrock.contains("low"),
            "{bedrock}"
        );
    }

    #[test]
    fn none_and_required_in_each_format() {
        let with = |c| {
            bodies(Controls {
                tool_choice: c,
                ..Controls::default()
            })
            .into_iter()
            .collect::<std::collections::HashMap<_, _>>()
        };
        let none = with(ToolChoice::None);
        assert_eq!(none["chat"]["tool_choice"], json!("none"));
        assert_eq!(none["responses"]["tool_choice"], json!("none"));
        assert_eq!(none["anthropic"]["tool_choice"], json!({"type": "none"}));
        assert_eq!(
            none["gemini"]["toolConfig"]["functionCallingConfig"]["mode"],
            json!("NONE")
        );
        let required = with(ToolChoice::Required);
        assert_eq!(required["chat"]["tool_choice"], json!("required"));
        assert_eq!(required["anthropic"]["tool_choice"], json!({"type": "any"}));
        assert_eq!(
            required["gemini"]["toolConfig"]["functionCallingConfig"]["mode"],
            json!("ANY")
        );
        assert_eq!(
            required["bedrock"]["toolConfig"]["toolChoice"],
            json!({"any": {}})
        );
    }
}
