//! Every provider client against cairn-sim: plain turn, tool-call round trip, streaming,
//! usage, `max_tokens` stop, and the provider's genuine overflow error with the request size.

use cairn_agent::aws::AwsIdentity;
use cairn_agent::history::Message;
use cairn_agent::provider::{
    ChatRequest, ClientOptions, Credentials, Provider, RetryPolicy, StopReason, ToolSpec, build,
};
use cairn_crds::{ProviderKind, ProviderSpec};
use cairn_sim::{ScriptedReply, Sim, Stop};
use serde_json::json;

const KINDS: [ProviderKind; 6] = [
    ProviderKind::Openai,
    ProviderKind::OpenaiResponses,
    ProviderKind::Anthropic,
    ProviderKind::Gemini,
    ProviderKind::Bedrock,
    ProviderKind::OpenaiCompatible,
];

fn model(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses => "gpt-5",
        ProviderKind::Anthropic => "claude-sonnet-4-5",
        ProviderKind::Gemini => "gemini-2.5-pro",
        ProviderKind::Bedrock => "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        ProviderKind::OpenaiCompatible => "llama-3.3-70b-versatile",
    }
}

fn client(sim: &Sim, kind: ProviderKind) -> Box<dyn Provider> {
    let base = match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses | ProviderKind::OpenaiCompatible => {
            format!("{}/v1", sim.url())
        }
        _ => sim.url(),
    };
    let spec = ProviderSpec {
        kind,
        model: model(kind).into(),
        base_url: Some(base),
        credentials: None,
        region: Some("us-east-1".into()),
        ca_bundle: None,
    };
    // The simulator checks Bedrock's signatures against this secret.
    sim.add_aws_key("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
    let credentials = match kind {
        ProviderKind::Bedrock => Credentials {
            api_key: None,
            aws: Some(AwsIdentity::fixed(
                "AKIDEXAMPLE",
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                None,
            )),
        },
        _ => Credentials::api_key("sk-test-secret"),
    };
    let options = ClientOptions {
        retry: RetryPolicy::none(),
        ..ClientOptions::default()
    };
    match build(&spec, credentials, options) {
        Ok(p) => p,
        Err(e) => panic!("{kind:?}: {e}"),
    }
}

fn request(kind: ProviderKind, messages: Vec<Message>, stream: bool) -> ChatRequest {
    ChatRequest {
        model: model(kind).into(),
        messages,
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        max_output_tokens: 1024,
        stream,
        controls: Default::default(),
        context: None,
    }
}

#[tokio::test]
async fn plain_turn_with_usage_and_exact_request_size() {
    let sim = Sim::start().await.unwrap();
    for kind in KINDS {
        for stream in [false, true] {
            sim.push_reply(ScriptedReply {
                text: "Hello from the simulator, a reply long enough to stream in pieces.".into(),
                cached_tokens: 3,
                ..ScriptedReply::default()
            });
            let p = client(&sim, kind);
            let req = request(
                kind,
                vec![Message::system("be brief"), Message::user("hi there")],
                stream,
            );
            let r = p
                .send(&req)
                .await
                .unwrap_or_else(|e| panic!("{kind:?} stream={stream}: {e}"));
            let seen = sim.requests().pop().unwrap();
            assert_eq!(
                r.message.content,
                "Hello from the simulator, a reply long enough to stream in pieces.",
                "{kind:?} stream={stream}"
            );
            assert_eq!(r.stop, StopReason::End, "{kind:?} stream={stream}");
            assert_eq!(r.request_bytes, seen.bytes, "{kind:?} stream={stream}");
            assert_eq!(r.usage.input_tokens, seen.estimated_tokens, "{kind:?}");
            assert!(r.usage.output_tokens > 0, "{kind:?}");
            assert_eq!(r.usage.cache_read_tokens, 3, "{kind:?} stream={stream}");
            assert!(seen.contains("be brief") && seen.contains("hi there"));
            assert_eq!(seen.stream, stream, "{kind:?}");
            if kind == ProviderKind::Bedrock {
                let op = if stream {
                    "converse-stream"
                } else {
                    "converse"
                };
                assert!(seen.path.ends_with(op), "{}", seen.path);
            }
            let auth = seen.auth.as_deref();
            let expected = match kind {
                ProviderKind::Anthropic => "x-api-key",
                ProviderKind::Gemini => "x-goog-api-key",
                ProviderKind::Bedrock => "aws4-hmac-sha256",
                _ => "bearer",
            };
            assert_eq!(auth, Some(expected), "{kind:?}");
            if kind == ProviderKind::Bedrock {
                let sig = seen.sigv4.as_ref().expect("a SigV4 request");
                assert_eq!(sig.verdict, "valid", "{kind:?} stream={stream}");
                assert_eq!(sig.access_key_id, "AKIDEXAMPLE");
            }
            assert!(
                !seen.body.contains("sk-test-secret"),
                "the key must not travel in the body"
            );
        }
    }
}

#[tokio::test]
async fn tool_call_round_trip() {
    let sim = Sim::start().await.unwrap();
    for kind in KINDS {
        for stream in [false, true] {
            sim.push_reply(ScriptedReply::tool_call(
                "read_file",
                json!({"path": "src/main.rs", "lines": [1, 2]}),
            ));
            let p = client(&sim, kind);
            let mut history = vec![Message::system("sys"), Message::user("read main")];
            let r = p
                .send(&request(kind, history.clone(), stream))
                .await
                .unwrap_or_else(|e| panic!("{kind:?} stream={stream}: {e}"));
            assert_eq!(r.stop, StopReason::ToolUse, "{kind:?} stream={stream}");
            let call = r.tool_calls()[0].clone();
            assert_eq!(call.name, "read_file");
            let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
            assert_eq!(
                args,
                json!({"path": "src/main.rs", "lines": [1, 2]}),
                "{kind:?}"
            );
            assert!(!call.id.is_empty());

            let marker = format!("RESULT-MARKER-{kind:?}-{stream}");
            history.push(r.message.clone());
            history.push(Message::tool(
                call.id.clone(),
                format!("fn main() {{}} {marker}"),
            ));
            sim.push_reply(ScriptedReply::text("main is empty"));
            let r2 = p
                .send(&request(kind, history, stream))
                .await
                .unwrap_or_else(|e| panic!("{kind:?} stream={stream}: {e}"));
            assert_eq!(r2.message.content, "main is empty");
            assert_eq!(r2.stop, StopReason::End);
            let seen = sim.requests().pop().unwrap();
            assert!(seen.contains(&marker), "{kind:?}: tool result sent");
            assert!(seen.contains("read_file"), "{kind:?}: the call is replayed");
            // user, assistant call, tool result; system is lifted except for OpenAI chat.
            let expected = match kind {
                ProviderKind::Openai | ProviderKind::OpenaiCompatible => 4,
                _ => 3,
            };
            assert_eq!(seen.messages, expected, "{kind:?} stream={stream}");
        }
    }
}

#[tokio::test]
async fn reasoning_is_kept() {
    let sim = Sim::start().await.unwrap();
    for kind in KINDS {
        for stream in [false, true] {
            sim.push_reply(ScriptedReply {
                text: "answer".into(),
                reasoning: Some("thinking it through".into()),
                ..ScriptedReply::default()
            });
            let r = client(&sim, kind)
                .send(&request(kind, vec![Message::user("q")], stream))
                .await
                .unwrap();
            assert_eq!(
                r.message.reasoning.as_deref(),
                Some("thinking it through"),
                "{kind:?} stream={stream}"
            );
        }
    }
}

#[tokio::test]
async fn max_tokens_stop_is_normalised() {
    let sim = Sim::start().await.unwrap();
    for kind in KINDS {
        for stream in [false, true] {
            sim.push_reply(ScriptedReply::text("x".repeat(400)));
            let mut req = request(kind, vec![Message::user("write a lot")], stream);
            req.max_output_tokens = 10;
            let r = client(&sim, kind).send(&req).await.unwrap();
            assert_eq!(r.stop, StopReason::MaxTokens, "{kind:?} stream={stream}");
            assert_eq!(r.message.content.len(), 40, "{kind:?}");
            assert_eq!(sim.requests().pop().unwrap().max_tokens, 10, "{kind:?}");
        }
        sim.push_reply(ScriptedReply {
            text: "short".into(),
            stop: Some(Stop::MaxTokens),
            ..ScriptedReply::default()
        });
        let r = client(&sim, kind)
            .send(&request(kind, vec![Message::user("q")], false))
            .await
            .unwrap();
        assert_eq!(r.stop, StopReason::MaxTokens, "{kind:?} scripted stop");
    }
}

#[tokio::test]
async fn overflow_is_the_providers_own_error_with_the_request_size() {
    let sim = Sim::start().await.unwrap();
    for kind in KINDS {
        sim.set_window(model(kind), 2_000);
        for stream in [false, true] {
            let req = request(kind, vec![Message::user("y".repeat(20_000))], stream);
            let e = client(&sim, kind)
                .send(&req)
                .await
                .expect_err("over the window");
            let seen = sim.requests().pop().unwrap();
            assert_eq!(seen.outcome, "overflow");
            assert_eq!(e.status, Some(400), "{kind:?}");
            assert_eq!(e.request_bytes, seen.bytes, "{kind:?}");
            assert!(e.request_bytes > 20_000);
            assert!(
                e.content_type
                    .as_deref()
                    .is_some_and(|c| c.starts_with("application/json")),
                "{kind:?}: {:?}",
                e.content_type
            );
            assert!(!e.is_html());
            assert_eq!(
                cairn_agent::classify::classify(&e),
                cairn_agent::classify::FailureClass::ContextOverflow,
                "{kind:?}: the shared classifier recognises the provider's own overflow error"
            );
            let body: serde_json::Value = serde_json::from_str(&e.body).unwrap();
            match kind {
                ProviderKind::Openai | ProviderKind::OpenaiCompatible => {
                    assert_eq!(body["error"]["code"], "context_length_exceeded");
                    assert!(e.body.contains("maximum context length is 2000 tokens"));
                }
                ProviderKind::OpenaiResponses => {
                    assert_eq!(body["error"]["code"], "context_length_exceeded");
                }
                ProviderKind::Anthropic => {
                    assert_eq!(body["error"]["type"], "invalid_request_error");
                    assert!(e.body.contains("prompt is too long"));
                    assert!(e.headers.contains_key("request-id"));
                }
                ProviderKind::Gemini => {
                    assert_eq!(body["error"]["status"], "INVALID_ARGUMENT");
                    assert!(
                        e.body
                            .contains("exceeds the maximum number of tokens allowed (2000)")
                    );
                }
                ProviderKind::Bedrock => {
                    assert!(e.body.contains("Input is too long for requested model"));
                    assert!(
                        e.headers["x-amzn-errortype"].starts_with("ValidationException"),
                        "{:?}",
                        e.headers
                    );
                }
            }
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("sk-test-secret") && !shown.contains("wJalrXUtnFEMI"));
        }
    }
}

#[tokio::test]
async fn images_travel_in_each_providers_native_shape() {
    use cairn_agent::history::Image;
    let sim = Sim::start().await.unwrap();
    for kind in KINDS {
        let mut m = Message::user("what is this?");
        m.images.push(Image {
            media_type: "image/png".into(),
            data: "iVBORw0KGgoAAAANSUhEUg==".into(),
        });
        client(&sim, kind)
            .send(&request(kind, vec![m], false))
            .await
            .unwrap();
        let seen = sim.requests().pop().unwrap();
        assert!(seen.contains("iVBORw0KGgoAAAANSUhEUg=="), "{kind:?}");
        let shape = match kind {
            ProviderKind::Openai | ProviderKind::OpenaiCompatible => {
                "\"url\":\"data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==\""
            }
            ProviderKind::OpenaiResponses => "\"type\":\"input_image\"",
            ProviderKind::Anthropic => "\"media_type\":\"image/png\"",
            ProviderKind::Gemini => "\"inlineData\"",
            ProviderKind::Bedrock => "\"format\":\"png\"",
        };
        assert!(seen.contains(shape), "{kind:?}: {}", seen.body);
    }
}

#[tokio::test]
async fn deltas_arrive_while_the_reply_streams() {
    use cairn_agent::provider::Delta;
    use std::sync::Mutex;
    let sim = Sim::start().await.unwrap();
    for kind in KINDS {
        for stream in [false, true] {
            let text = "A reply streamed in many small pieces, one delta at a time.";
            sim.push_reply(ScriptedReply {
                text: text.into(),
                reasoning: Some("first think, then answer".into()),
                ..ScriptedReply::default()
            });
            let seen: Mutex<Vec<(bool, String)>> = Mutex::new(Vec::new());
            let sink = |d: Delta<'_>| {
                let entry = match d {
                    Delta::Text(t) => (false, t.to_string()),
                    Delta::Reasoning(t) => (true, t.to_string()),
                };
                seen.lock().unwrap().push(entry);
            };
            let r = client(&sim, kind)
                .send_streaming(&request(kind, vec![Message::user("q")], stream), &sink)
                .await
                .unwrap_or_else(|e| panic!("{kind:?} stream={stream}: {e}"));
            let seen = seen.into_inner().unwrap();
            let joined = |reasoning: bool| -> String {
                seen.iter()
                    .filter(|(r, _)| *r == reasoning)
                    .map(|(_, t)| t.as_str())
                    .collect()
            };
            assert_eq!(joined(false), r.message.content, "{kind:?} stream={stream}");
            assert_eq!(r.message.content, text);
            assert_eq!(
                joined(true),
                "first think, then answer",
                "{kind:?} stream={stream}"
            );
            let text_deltas = seen.iter().filter(|(r, _)| !r).count();
            if stream {
                assert!(text_deltas > 3, "{kind:?}: {text_deltas} text deltas");
            } else {
                assert_eq!(text_deltas, 1, "{kind:?}");
            }
        }
    }
}
