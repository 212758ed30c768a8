//! The real `cairn-agent serve` exports its spans over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set: a receiver in the test decodes the protobuf
//! requests and finds the turn, provider-call and tool-call spans with their OpenTelemetry
//! GenAI attributes, the session in the resource, no message bodies, and the last spans
//! flushed at SIGTERM.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use cairn_sim::{ScriptedReply, Sim};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;

use crate::support::agent::*;

/// What the receiver got: raw bodies and their decoding.
#[derive(Clone, Default)]
struct Received {
    raw: Arc<Mutex<Vec<Vec<u8>>>>,
    decoded: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

async fn traces(State(r): State<Received>, body: Bytes) -> (axum::http::StatusCode, Vec<u8>) {
    r.raw.lock().expect("lock").push(body.to_vec());
    match ExportTraceServiceRequest::decode(body) {
        Ok(req) => {
            r.decoded.lock().expect("lock").push(req);
            // An empty ExportTraceServiceResponse.
            (axum::http::StatusCode::OK, Vec::new())
        }
        Err(_) => (axum::http::StatusCode::BAD_REQUEST, Vec::new()),
    }
}

/// An OTLP/HTTP receiver on a free port; returns its base URL.
async fn receiver(received: Received) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new()
        .route("/v1/traces", post(traces))
        .with_state(received);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn string(v: &Option<AnyValue>) -> Option<&str> {
    match v.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| string(&kv.value))
}

fn int(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attrs
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        any_value::Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

fn strings(attrs: &[KeyValue], key: &str) -> Option<Vec<String>> {
    match attrs
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        any_value::Value::ArrayValue(a) => Some(
            a.values
                .iter()
                .filter_map(|v| string(&Some(v.clone())).map(str::to_owned))
                .collect(),
        ),
        _ => None,
    }
}

/// Prompt tokens the sim reports served from its cache on the turn's first call.
const CACHED_TOKENS: u64 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_with_the_session_and_without_bodies() {
    let received = Received::default();
    let endpoint = receiver(received.clone()).await;
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("otel.yaml");
    std::fs::write(
        &config,
        config_yaml(
            "traced",
            &format!("{}/v1", sim.url()),
            200_000,
            "compaction: {minKeepRecent: 2}\n",
        ),
    )
    .expect("config");
    let mut env = storage_env(dir.path(), None);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint));
    // Nothing is sent on a timer during the test: what arrives was flushed at shutdown.
    env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "600000".into()));
    let mut agent = AgentProcess::start(&config, &env, &dir.path().join("agent.log"));

    let question = "QUESTION-7f3a9c: what is the secret plan?";
    let answer = "ANSWER-2b8e41: there is no plan.";
    // The model calls a tool, then answers; the sim reports cached prompt tokens.
    sim.push_reply(ScriptedReply {
        cached_tokens: CACHED_TOKENS,
        ..ScriptedReply::tool_call("recall", json!({"key": "0123456789abcdef"}))
    });
    sim.push_reply(ScriptedReply::text(answer));
    let (status, body) = agent.api().turn(question).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output_text(&body), answer);
    // More turns, then a compaction that replaces the older ones.
    for i in 0..4 {
        sim.push_reply(ScriptedReply::text(format!(
            "answer {i}: {}",
            "ok. ".repeat(200)
        )));
        let (status, body) = agent
            .api()
            .turn(&format!("question {i}: {}", "z".repeat(2_000)))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    sim.push_reply(ScriptedReply::text(
        cairn_engine::testing::well_formed_summary(2_500),
    ));
    let (status, body) = agent.api().post("/v1/session/compact", json!({})).await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        received.raw.lock().expect("lock").is_empty(),
        "spans were sent before the shutdown"
    );

    let exit = agent.terminate();
    assert!(exit.success(), "{exit}: {}", agent.log());
    let deadline = Instant::now() + Duration::from_secs(10);
    while received.decoded.lock().expect("lock").is_empty() {
        assert!(
            Instant::now() < deadline,
            "no spans arrived: {}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let requests = received.decoded.lock().expect("lock").clone();
    let mut spans: Vec<Span> = Vec::new();
    for req in &requests {
        for rs in &req.resource_spans {
            let resource = rs.resource.as_ref().expect("resource");
            assert_eq!(
                attr(&resource.attributes, "service.name"),
                Some("cairn-agent")
            );
            assert_eq!(
                attr(&resource.attributes, "cairn.session.namespace"),
                Some("tests")
            );
            assert_eq!(
                attr(&resource.attributes, "cairn.session.name"),
                Some("traced")
            );
            spans.extend(rs.scope_spans.iter().flat_map(|s| s.spans.clone()));
        }
    }
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let turn = spans
        .iter()
        .find(|s| s.name == "turn")
        .unwrap_or_else(|| panic!("no turn span in {names:?}"));
    assert_eq!(attr(&turn.attributes, "session"), Some("traced"));
    assert_eq!(attr(&turn.attributes, "namespace"), Some("tests"));
    // The turn is the GenAI agent's invocation.
    for (key, value) in [
        ("gen_ai.operation.name", "invoke_agent"),
        ("gen_ai.agent.name", "traced"),
        ("gen_ai.conversation.id", "tests/traced"),
        ("gen_ai.provider.name", "openai-compatible"),
        ("gen_ai.request.model", MODEL),
    ] {
        assert_eq!(
            attr(&turn.attributes, key),
            Some(value),
            "{key}: {:?}",
            turn.attributes
        );
    }
    // The turn's provider calls are children of the turn, GenAI chats: the first asked for
    // the tool, the second answered.
    let calls: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "provider_call" && s.parent_span_id == turn.span_id)
        .collect();
    assert_eq!(calls.len(), 2, "provider calls under the turn in {names:?}");
    for call in &calls {
        assert_eq!(call.trace_id, turn.trace_id);
        for (key, value) in [
            ("provider", "openai-compatible"),
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "openai-compatible"),
            ("gen_ai.request.model", MODEL),
        ] {
            assert_eq!(
                attr(&call.attributes, key),
                Some(value),
                "{key}: {:?}",
                call.attributes
            );
        }
        assert_eq!(
            int(&call.attributes, "gen_ai.request.max_tokens"),
            Some(1000)
        );
        let input = int(&call.attributes, "gen_ai.usage.input_tokens").expect("input tokens");
        let output = int(&call.attributes, "gen_ai.usage.output_tokens").expect("output tokens");
        assert!(
            input > CACHED_TOKENS as i64 && output > 0,
            "{:?}",
            call.attributes
        );
        assert!(attr(&call.attributes, "error.type").is_none());
    }
    let (first, second) = if calls[0].start_time_unix_nano < calls[1].start_time_unix_nano {
        (calls[0], calls[1])
    } else {
        (calls[1], calls[0])
    };
    let finish = |call: &Span| strings(&call.attributes, "gen_ai.response.finish_reasons");
    assert_eq!(finish(first), Some(vec!["tool_call".to_owned()]));
    assert_eq!(finish(second), Some(vec!["stop".to_owned()]));
    assert_eq!(
        int(&first.attributes, "gen_ai.usage.cache_read.input_tokens"),
        Some(CACHED_TOKENS as i64)
    );
    assert_eq!(
        int(&second.attributes, "gen_ai.usage.cache_read.input_tokens"),
        Some(0)
    );
    // The tool ran between the two calls, in its own span under the turn.
    let tool = spans
        .iter()
        .find(|s| s.name == "tool_call" && s.parent_span_id == turn.span_id)
        .unwrap_or_else(|| panic!("no tool_call under the turn in {names:?}"));
    for (key, value) in [
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "recall"),
        ("gen_ai.tool.type", "function"),
    ] {
        assert_eq!(
            attr(&tool.attributes, key),
            Some(value),
            "{key}: {:?}",
            tool.attributes
        );
    }
    assert!(attr(&tool.attributes, "gen_ai.tool.call.id").is_some_and(|id| !id.is_empty()));
    assert!(
        first.end_time_unix_nano <= tool.start_time_unix_nano
            && tool.end_time_unix_nano <= second.start_time_unix_nano,
        "the tool ran between the calls"
    );
    // The compaction's span: the GenAI attributes, its level, sizes and score.
    let compaction = spans
        .iter()
        .find(|s| s.name == "compaction" && attr(&s.attributes, "trigger") == Some("manual"))
        .unwrap_or_else(|| panic!("no manual compaction span in {names:?}"));
    assert_eq!(
        attr(&compaction.attributes, "gen_ai.operation.name"),
        Some("compaction")
    );
    assert_eq!(
        attr(&compaction.attributes, "gen_ai.request.model"),
        Some(MODEL)
    );
    let number = |key: &str| {
        compaction
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .and_then(|v| match v {
                any_value::Value::IntValue(i) => Some(*i as f64),
                any_value::Value::DoubleValue(d) => Some(*d),
                _ => None,
            })
    };
    let (before, after) = (
        number("cairn.compaction.bytes_before")
            .unwrap_or_else(|| panic!("bytes before: {:?}", compaction.attributes)),
        number("cairn.compaction.bytes_after").expect("bytes after"),
    );
    assert!(after < before, "{:?}", compaction.attributes);
    assert!(number("cairn.compaction.level").is_some());
    let score = number("cairn.compaction.score").expect("a score");
    assert!((0.0..=1.0).contains(&score), "{score}");

    // Neither the question nor the answer left the agent in a span.
    for raw in received.raw.lock().expect("lock").iter() {
        let text = String::from_utf8_lossy(raw);
        assert!(
            !text.contains("QUESTION-7f3a9c"),
            "the question was exported"
        );
        assert!(!text.contains("ANSWER-2b8e41"), "the answer was exported");
    }
}
