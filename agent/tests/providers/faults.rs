//! Provider clients under the simulator's injected faults: retries (429 with Retry-After,
//! 5xx, 529) and their limits, truncated and stalled streams, resets mid-body, malformed
//! JSON, cancellation.

use std::time::{Duration, Instant};

use cairn_agent::history::Message;
use cairn_agent::provider::{
    ChatRequest, ClientOptions, Credentials, Provider, ProviderError, RetryPolicy, build,
};
use cairn_crds::{ProviderKind, ProviderSpec};
use cairn_sim::{Fault, ScriptedReply, Sim};
use tokio_util::sync::CancellationToken;

const STREAMING: [ProviderKind; 5] = [
    ProviderKind::Openai,
    ProviderKind::OpenaiResponses,
    ProviderKind::Anthropic,
    ProviderKind::Gemini,
    ProviderKind::Bedrock,
];

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_retries: 2,
        base: Duration::from_millis(5),
        max_delay: Duration::from_millis(1500),
        jitter: 0.5,
    }
}

fn client(sim: &Sim, kind: ProviderKind, options: ClientOptions) -> Box<dyn Provider> {
    let base = match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses => format!("{}/v1", sim.url()),
        _ => sim.url(),
    };
    let spec = ProviderSpec {
        kind,
        model: "m-1".into(),
        base_url: Some(base),
        credentials: None,
        region: Some("us-east-1".into()),
        ca_bundle: None,
    };
    build(&spec, Credentials::api_key("sk-fault-secret"), options).unwrap()
}

fn request(stream: bool) -> ChatRequest {
    ChatRequest {
        model: "m-1".into(),
        messages: vec![Message::user("hello")],
        tools: vec![],
        max_output_tokens: 100,
        stream,
        controls: Default::default(),
        context: None,
    }
}

fn retrying() -> ClientOptions {
    ClientOptions {
        retry: fast_retries(),
        ..ClientOptions::default()
    }
}

#[tokio::test]
async fn rate_limit_is_retried_after_the_servers_delay() {
    let sim = Sim::start().await.unwrap();
    for kind in [
        ProviderKind::Openai,
        ProviderKind::Anthropic,
        ProviderKind::Bedrock,
    ] {
        sim.push_fault(Fault::Status {
            status: 429,
            retry_after: Some(1),
        });
        sim.push_reply(ScriptedReply::text("after the wait"));
        let started = Instant::now();
        let r = client(&sim, kind, retrying())
            .send(&request(false))
            .await
            .unwrap();
        assert_eq!(r.message.content, "after the wait");
        assert!(
            started.elapsed() >= Duration::from_millis(950),
            "{kind:?}: Retry-After honoured, waited {:?}",
            started.elapsed()
        );
        let log = sim.requests();
        assert_eq!(log[log.len() - 2].outcome, "fault:429");
        assert_eq!(log[log.len() - 1].outcome, "ok");
    }
}

#[tokio::test]
async fn server_errors_and_overload_are_retried_then_reported() {
    let sim = Sim::start().await.unwrap();
    sim.push_fault(Fault::Status {
        status: 529,
        retry_after: None,
    });
    sim.push_fault(Fault::Status {
        status: 503,
        retry_after: None,
    });
    sim.push_reply(ScriptedReply::text("third time"));
    let r = client(&sim, ProviderKind::Anthropic, retrying())
        .send(&request(true))
        .await
        .unwrap();
    assert_eq!(r.message.content, "third time");
    assert_eq!(sim.requests().len(), 3);

    sim.reset();
    for _ in 0..3 {
        sim.push_fault(Fault::Status {
            status: 500,
            retry_after: None,
        });
    }
    let e = client(&sim, ProviderKind::Gemini, retrying())
        .send(&request(false))
        .await
        .unwrap_err();
    assert_eq!(e.status, Some(500));
    assert!(e.body.contains("INTERNAL"));
    assert_eq!(sim.requests().len(), 3, "first try + 2 retries");
}

#[tokio::test]
async fn overflow_and_payload_rejections_are_never_retried() {
    let sim = Sim::start().await.unwrap();
    sim.set_window("m-1", 10);
    let e = client(&sim, ProviderKind::Openai, retrying())
        .send(&request(false))
        .await
        .unwrap_err();
    assert_eq!(e.status, Some(400));
    sim.push_fault(Fault::Status {
        status: 413,
        retry_after: None,
    });
    let e = client(&sim, ProviderKind::Anthropic, retrying())
        .send(&request(false))
        .await
        .unwrap_err();
    assert_eq!(e.status, Some(413));
    assert_eq!(sim.requests().len(), 2, "one attempt each");
}

fn assert_clear(e: &ProviderError, what: &str) {
    assert_eq!(e.status, Some(200), "{what}: {e}");
    let t = e.transport.as_deref().unwrap_or_default();
    assert!(!t.is_empty(), "{what}: {e}");
    assert!(e.request_bytes > 0);
    assert_eq!(e.label(), "bad_response");
    assert!(!format!("{e} {e:?}").contains("sk-fault-secret"));
}

#[tokio::test]
async fn truncated_streams_end_in_a_clear_error() {
    let sim = Sim::start().await.unwrap();
    for kind in STREAMING {
        sim.push_fault(Fault::TruncateStream);
        sim.push_reply(ScriptedReply::text(
            "a reply that will be cut in the middle of it",
        ));
        let e = client(&sim, kind, retrying())
            .send(&request(true))
            .await
            .unwrap_err();
        assert_clear(&e, &format!("{kind:?} truncated"));
        assert!(
            e.transport
                .as_deref()
                .unwrap()
                .contains("stream ended before"),
            "{kind:?}: {e}"
        );
    }
    // A non-streamed body cut short is malformed JSON, not a panic.
    sim.push_fault(Fault::TruncateStream);
    let e = client(&sim, ProviderKind::Bedrock, retrying())
        .send(&request(false))
        .await
        .unwrap_err();
    assert_clear(&e, "bedrock truncated");
    assert!(e.transport.as_deref().unwrap().contains("malformed JSON"));
}

#[tokio::test]
async fn reset_mid_body_is_a_transport_error_not_a_hang() {
    let sim = Sim::start().await.unwrap();
    for kind in [
        ProviderKind::Openai,
        ProviderKind::Anthropic,
        ProviderKind::Gemini,
    ] {
        for stream in [false, true] {
            sim.push_fault(Fault::Reset);
            let e = tokio::time::timeout(
                Duration::from_secs(10),
                client(&sim, kind, retrying()).send(&request(stream)),
            )
            .await
            .expect("no hang")
            .unwrap_err();
            assert_clear(&e, &format!("{kind:?} reset stream={stream}"));
            assert!(
                e.transport.as_deref().unwrap().contains("connection broke"),
                "{kind:?}: {e}"
            );
        }
    }
}

#[tokio::test]
async fn malformed_json_is_reported_as_such() {
    let sim = Sim::start().await.unwrap();
    for kind in [
        ProviderKind::Openai,
        ProviderKind::OpenaiResponses,
        ProviderKind::Anthropic,
        ProviderKind::Gemini,
        ProviderKind::Bedrock,
    ] {
        for stream in [false, true] {
            sim.push_fault(Fault::MalformedJson);
            let e = client(&sim, kind, retrying())
                .send(&request(stream))
                .await
                .unwrap_err();
            assert_clear(&e, &format!("{kind:?} malformed stream={stream}"));
            assert!(
                e.transport.as_deref().unwrap().contains("malformed JSON"),
                "{kind:?}: {e}"
            );
        }
    }
}

#[tokio::test]
async fn a_stalled_stream_times_out() {
    let sim = Sim::start().await.unwrap();
    sim.push_fault(Fault::Stall { ms: 5_000 });
    let options = ClientOptions {
        idle_timeout: Duration::from_millis(300),
        ..retrying()
    };
    let started = Instant::now();
    let e = client(&sim, ProviderKind::Anthropic, options)
        .send(&request(true))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(e.transport.as_deref().unwrap().contains("stalled"), "{e}");
}

#[tokio::test]
async fn cancellation_stops_a_slow_call() {
    let sim = Sim::start().await.unwrap();
    sim.push_fault(Fault::Latency { ms: 5_000 });
    let cancel = CancellationToken::new();
    let options = ClientOptions {
        cancel: Some(cancel.clone()),
        ..retrying()
    };
    let p = client(&sim, ProviderKind::Openai, options);
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let e = p.send(&request(false)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(e.transport.as_deref(), Some("cancelled"));
    assert!(e.request_bytes > 0);
}

#[tokio::test]
async fn a_json_403_from_the_provider_stays_json() {
    let sim = Sim::start().await.unwrap();
    sim.push_fault(Fault::Status {
        status: 403,
        retry_after: None,
    });
    let e = client(&sim, ProviderKind::Anthropic, retrying())
        .send(&request(false))
        .await
        .unwrap_err();
    assert_eq!(e.status, Some(403));
    assert!(!e.is_html());
    assert_eq!(e.label(), "http_4xx");
    let body: serde_json::Value = serde_json::from_str(&e.body).unwrap();
    assert_eq!(body["error"]["type"], "permission_error");
}

#[tokio::test]
async fn a_stream_request_answered_with_one_json_body_still_decodes() {
    let sim = Sim::start().await.unwrap();
    for kind in STREAMING {
        sim.push_reply(ScriptedReply::text("not streamed after all"));
        let options = ClientOptions {
            extra_headers: vec![("x-sim-ignore-stream".into(), "1".into())],
            ..retrying()
        };
        let r = client(&sim, kind, options)
            .send(&request(true))
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_eq!(r.message.content, "not streamed after all", "{kind:?}");
        assert!(!sim.requests().last().unwrap().stream);
    }
}

#[tokio::test]
async fn per_request_fault_header_and_extra_headers_reach_the_server() {
    let sim = Sim::start().await.unwrap();
    let options = ClientOptions {
        extra_headers: vec![("x-sim-fault".into(), "503".into())],
        retry: RetryPolicy::none(),
        ..ClientOptions::default()
    };
    let e = client(&sim, ProviderKind::OpenaiResponses, options)
        .send(&request(false))
        .await
        .unwrap_err();
    assert_eq!(e.status, Some(503));
    assert_eq!(e.label(), "http_5xx");
    let options = ClientOptions {
        extra_headers: vec![("bad header".into(), "x".into())],
        ..ClientOptions::default()
    };
    let e = client(&sim, ProviderKind::Openai, options)
        .send(&request(false))
        .await
        .unwrap_err();
    assert!(e.transport.unwrap().contains("not a valid HTTP header"));
}
