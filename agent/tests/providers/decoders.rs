//! Response decoders: whatever bytes arrive, they return a reply or a typed error and never
//! panic; what cairn-sim renders in each wire format decodes back to the same reply; a
//! stream cut anywhere before its final event is an error.

use cairn_agent::provider::StopReason;
use cairn_agent::provider::decode;
use cairn_sim::Stop;
use cairn_sim::wire::{Turn, Wire, render_reply};
use proptest::prelude::*;
use serde_json::json;

type Decoder = fn(&[u8]) -> Result<cairn_agent::provider::ChatResponse, decode::DecodeError>;

const ALL: [Decoder; 10] = [
    decode::openai,
    decode::openai_stream,
    decode::responses,
    decode::responses_stream,
    decode::anthropic,
    decode::anthropic_stream,
    decode::gemini,
    decode::gemini_stream,
    decode::bedrock,
    decode::bedrock_stream,
];

fn decoders(wire: Wire) -> (Decoder, Option<Decoder>) {
    match wire {
        Wire::OpenaiChat => (decode::openai, Some(decode::openai_stream)),
        Wire::OpenaiResponses => (decode::responses, Some(decode::responses_stream)),
        Wire::Anthropic => (decode::anthropic, Some(decode::anthropic_stream)),
        Wire::Gemini => (decode::gemini, Some(decode::gemini_stream)),
        Wire::Bedrock => (decode::bedrock, Some(decode::bedrock_stream)),
    }
}

fn wires() -> impl Strategy<Value = Wire> {
    prop_oneof![
        Just(Wire::OpenaiChat),
        Just(Wire::OpenaiResponses),
        Just(Wire::Anthropic),
        Just(Wire::Gemini),
        Just(Wire::Bedrock),
    ]
}

fn turns() -> impl Strategy<Value = Turn> {
    (
        "[a-zA-Z0-9 éß😀\"\\\\\n]{0,60}",
        proptest::option::of("[a-z ]{1,20}"),
        proptest::collection::vec(("[a-z_]{1,10}", "[a-z0-9]{0,8}"), 0..3),
        prop_oneof![Just(Stop::End), Just(Stop::MaxTokens)],
        0u64..10_000,
        0u64..500,
    )
        .prop_map(|(text, reasoning, calls, stop, input, output)| {
            let text = if text.is_empty() && calls.is_empty() {
                "x".to_string()
            } else {
                text
            };
            let stop = if calls.is_empty() {
                stop
            } else {
                Stop::ToolUse
            };
            Turn {
                seq: 1,
                model: "m".into(),
                text,
                reasoning,
                calls: calls
                    .into_iter()
                    .enumerate()
                    .map(|(k, (name, v))| (format!("call_{k}"), name, json!({"v": v, "n": [1, k]})))
                    .collect(),
                stop,
                input_tokens: input,
                output_tokens: output,
                cached_tokens: input / 2,
                cache_write_tokens: input / 4,
                context_management: None,
                compaction: None,
            }
        })
}

fn expected_stop(s: Stop) -> StopReason {
    match s {
        Stop::End => StopReason::End,
        Stop::ToolUse => StopReason::ToolUse,
        Stop::MaxTokens => StopReason::MaxTokens,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for d in ALL {
            let _ = d(&bytes);
        }
    }

    #[test]
    fn json_shaped_garbage_never_panics(text in r#"[\{\}\[\]":,a-z0-9 \n]{0,200}"#) {
        let framed = format!("data: {text}\n\n");
        for d in ALL {
            let _ = d(text.as_bytes());
            let _ = d(framed.as_bytes());
        }
    }

    #[test]
    fn simulator_replies_decode_back(turn in turns(), wire in wires()) {
        let (whole, streamed) = decoders(wire);
        let mut variants = vec![(whole, render_reply(wire, &turn, false, true).frames.concat())];
        if let Some(s) = streamed {
            variants.push((s, render_reply(wire, &turn, true, true).frames.concat()));
        }
        for (d, bytes) in variants {
            let r = d(&bytes).map_err(|e| TestCaseError::fail(format!("{wire:?}: {e}")))?;
            prop_assert_eq!(&r.message.content, &turn.text);
            prop_assert_eq!(r.message.reasoning.as_deref(), turn.reasoning.as_deref());
            prop_assert_eq!(r.stop, expected_stop(turn.stop));
            prop_assert_eq!(r.usage.input_tokens, turn.input_tokens);
            prop_assert_eq!(r.usage.output_tokens, turn.output_tokens);
            // Every call of the reply, in order (parallel tool calls).
            prop_assert_eq!(r.tool_calls().len(), turn.calls.len(), "{:?}", wire);
            for (got, (id, name, args)) in r.tool_calls().iter().zip(&turn.calls) {
                prop_assert_eq!(&got.name, name);
                if wire != Wire::Gemini {
                    prop_assert_eq!(&got.id, id);
                }
                let parsed: serde_json::Value = serde_json::from_str(&got.arguments).unwrap();
                prop_assert_eq!(&parsed, args);
            }
        }
    }

    #[test]
    fn streams_cut_before_the_end_are_errors(turn in turns(), wire in wires(), cut in 0.0f64..1.0) {
        let (_, Some(streamed)) = decoders(wire) else { return Ok(()) };
        let frames = render_reply(wire, &turn, true, true).frames;
        // Everything but the last frame carries no completion for OpenAI ([DONE] follows the
        // finish chunk) so cut before the frame that completes the reply.
        let last_needed = match wire {
            Wire::OpenaiChat => frames.len() - 3,
            // messageStop completes the reply; metadata (usage) follows it.
            Wire::Bedrock => frames.len() - 2,
            _ => frames.len() - 1,
        };
        let bytes = frames[..last_needed].concat();
        let at = ((bytes.len() as f64) * cut) as usize;
        let r = streamed(&bytes[..at]);
        prop_assert!(r.is_err(), "{wire:?} cut at {at}/{}", bytes.len());
    }
}

/// A length stop of llama-server whose context filled is classified as the output limit.
#[test]
fn llama_cpp_length_stop_by_a_full_context_decodes_as_max_tokens() {
    use cairn_agent::classify::{FailureClass, classify_stop};
    use cairn_agent::provider::{StopReason, decode};

    // Verbatim from llama-server --ctx-size 256 (the reply text shortened, timings left out):
    // the context filled during generation, so the reply stopped at 256 tokens in total, far
    // below max_tokens 8000.
    let body = br#"{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"The sea has been a relentless companion to these islanders, and yet, it has also been a home."}}],"created":1796116139,"model":"/root/.cache/cairn/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion","usage":{"completion_tokens":209,"prompt_tokens":47,"total_tokens":256,"prompt_tokens_details":{"cached_tokens":0}},"id":"chatcmpl-iRTsgUrSQAhNAtFbCQYM3KUqxXTewIef"}"#;
    let r = decode::openai(body).expect("decodes");
    assert_eq!(r.stop, StopReason::MaxTokens);
    assert_eq!(classify_stop(r.stop), Some(FailureClass::MaxOutputTokens));
    assert_eq!(r.usage.input_tokens + r.usage.output_tokens, 256);
    // The same reply streamed: the last chunks, verbatim.
    let stream = concat!(
        r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1796116142,"id":"chatcmpl-uobgHCBLJaQ7M7HuRRIIETth31l9eGld","model":"/root/.cache/cairn/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
        "\n\n",
        r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" were"}}],"created":1796116142,"id":"chatcmpl-uobgHCBLJaQ7M7HuRRIIETth31l9eGld","model":"/root/.cache/cairn/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
        "\n\n",
        r#"data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1796116142,"id":"chatcmpl-uobgHCBLJaQ7M7HuRRIIETth31l9eGld","model":"/root/.cache/cairn/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
        "\n\n",
        r#"data: {"choices":[],"created":1796116142,"id":"chatcmpl-uobgHCBLJaQ7M7HuRRIIETth31l9eGld","model":"/root/.cache/cairn/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk","usage":{"completion_tokens":209,"prompt_tokens":47,"total_tokens":256,"prompt_tokens_details":{"cached_tokens":46}}}"#,
        "\n\ndata: [DONE]\n\n"
    );
    let r = decode::openai_stream(stream.as_bytes()).expect("decodes");
    assert_eq!(r.stop, StopReason::MaxTokens);
    assert_eq!(r.usage.input_tokens + r.usage.output_tokens, 256);
}
