//! Provider clients through a real nginx in front of cairn-sim: nginx's own 413 page for a
//! body over `client_max_body_size`, a WAF-style HTML 403 above a size, a dropped
//! connection on large bodies, and a provider's JSON 403 passing through unchanged.

use cairn_agent::classify::{FailureClass, classify};
use std::time::Duration;

use cairn_agent::history::Message;
use cairn_agent::provider::{
    Anthropic, Bedrock, ChatRequest, ClientOptions, Credentials, Gemini, OpenAiResponses, Provider,
    RetryPolicy, build,
};
use cairn_crds::{ProviderKind, ProviderSpec};
use cairn_sim::nginx::{BLOCK_PAGE, Middlebox, MiddleboxConfig};
use cairn_sim::{Fault, ScriptedReply, Sim};

const KINDS: [ProviderKind; 6] = [
    ProviderKind::Openai,
    ProviderKind::OpenaiResponses,
    ProviderKind::Anthropic,
    ProviderKind::Gemini,
    ProviderKind::Bedrock,
    ProviderKind::OpenaiCompatible,
];

struct Rig {
    sim: Sim,
    nginx: Middlebox,
}

async fn rig() -> Rig {
    let sim = Sim::start().await.unwrap();
    let cfg = MiddleboxConfig {
        limit: "64k".into(),
        block_at: 100_000,
    };
    let nginx = match Middlebox::start(sim.addr(), &cfg) {
        Ok(n) => n,
        Err(e) => panic!("{e}"),
    };
    Rig { sim, nginx }
}

fn client(rig: &Rig, kind: ProviderKind, location: &str) -> Box<dyn Provider> {
    let mut base = rig.nginx.url(location);
    if matches!(
        kind,
        ProviderKind::Openai | ProviderKind::OpenaiResponses | ProviderKind::OpenaiCompatible
    ) {
        base.push_str("/v1");
    }
    let spec = ProviderSpec {
        kind,
        model: "m-1".into(),
        base_url: Some(base),
        credentials: None,
        region: Some("us-east-1".into()),
        ca_bundle: None,
    };
    // Retries on: a payload rejection must still be sent exactly once.
    let options = ClientOptions {
        retry: RetryPolicy {
            max_retries: 2,
            base: Duration::from_millis(5),
            ..RetryPolicy::default()
        },
        ..ClientOptions::default()
    };
    build(&spec, Credentials::api_key("sk-middlebox-secret"), options).unwrap()
}

fn request(chars: usize) -> ChatRequest {
    ChatRequest {
        model: "m-1".into(),
        messages: vec![Message::system("sys"), Message::user("z".repeat(chars))],
        tools: vec![],
        max_output_tokens: 64,
        stream: false,
        controls: Default::default(),
        context: None,
    }
}

/// The body size a client sends, computed independently of the client where the wire
/// builder is public.
fn expected_bytes(kind: ProviderKind, req: &ChatRequest) -> Option<u64> {
    let body = match kind {
        ProviderKind::OpenaiResponses => serde_json::to_vec(&OpenAiResponses::body(req)),
        ProviderKind::Anthropic => serde_json::to_vec(&Anthropic::body(req)),
        ProviderKind::Gemini => serde_json::to_vec(&Gemini::body(req)),
        ProviderKind::Bedrock => serde_json::to_vec(&Bedrock::body(req)),
        _ => return None,
    };
    Some(body.unwrap().len() as u64)
}

async fn count_413(nginx: &Middlebox) -> usize {
    nginx
        .access_log()
        .lines()
        .filter(|l| l.contains("\" 413 "))
        .count()
}

#[tokio::test]
async fn nginx_413_is_html_and_carries_the_rejected_size() {
    let rig = rig().await;
    for kind in KINDS {
        rig.sim.push_reply(ScriptedReply::text("small ok"));
        let small = client(&rig, kind, "/limit").send(&request(1_000)).await;
        assert_eq!(
            small
                .map(|r| r.message.content)
                .unwrap_or_else(|e| e.to_string()),
            "small ok",
            "{kind:?}: a small body passes the proxy"
        );

        let before = rig.sim.requests().len();
        let rejected_before = count_413(&rig.nginx).await;
        let req = request(200_000);
        let e = client(&rig, kind, "/limit").send(&req).await.unwrap_err();
        assert_eq!(e.status, Some(413), "{kind:?}: {e}");
        assert!(e.is_html(), "{kind:?}");
        assert_eq!(e.content_type.as_deref(), Some("text/html"), "{kind:?}");
        assert!(
            e.body.contains("413 Request Entity Too Large"),
            "{}",
            e.body
        );
        assert!(
            e.headers
                .get("server")
                .is_some_and(|s| s.starts_with("nginx"))
        );
        assert!(e.request_bytes > 200_000, "{kind:?}");
        if let Some(n) = expected_bytes(kind, &req) {
            assert_eq!(e.request_bytes, n, "{kind:?}: exact rejected size");
        }
        assert_eq!(classify(&e), FailureClass::PayloadTooLarge, "{kind:?}");
        assert_eq!(e.label(), "http_html");
        assert!(e.to_string().contains("HTML page"), "{e}");
        assert!(!format!("{e} {e:?}").contains("sk-middlebox-secret"));
        assert_eq!(
            rig.sim.requests().len(),
            before,
            "nginx answered, not the sim"
        );
        // nginx logs a request when it finalises it, which may be after the client has the
        // answer: wait for the line, then make sure no second one follows.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while count_413(&rig.nginx).await == rejected_before && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            count_413(&rig.nginx).await,
            rejected_before + 1,
            "{kind:?}: a 413 is sent once, never retried"
        );
    }
}

#[tokio::test]
async fn waf_403_is_an_html_block_page() {
    let rig = rig().await;
    for kind in KINDS {
        rig.sim.push_reply(ScriptedReply::text("passed"));
        let ok = client(&rig, kind, "/waf")
            .send(&request(10_000))
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: {e}\n{}", rig.nginx.error_log()));
        assert_eq!(ok.message.content, "passed");

        let req = request(150_000);
        let e = client(&rig, kind, "/waf").send(&req).await.unwrap_err();
        assert_eq!(e.status, Some(403), "{kind:?}: {e}");
        assert!(e.is_html(), "{kind:?}");
        assert_eq!(e.body, BLOCK_PAGE);
        assert!(e.content_type.as_deref().unwrap().starts_with("text/html"));
        assert_eq!(classify(&e), FailureClass::ProxyRejection, "{kind:?}");
        if let Some(n) = expected_bytes(kind, &req) {
            assert_eq!(e.request_bytes, n, "{kind:?}");
        }
        assert_eq!(e.label(), "http_html");
    }
}

#[tokio::test]
async fn a_providers_json_403_through_nginx_stays_json() {
    let rig = rig().await;
    for kind in KINDS {
        rig.sim.push_fault(Fault::Status {
            status: 403,
            retry_after: None,
        });
        let e = client(&rig, kind, "/waf")
            .send(&request(1_000))
            .await
            .unwrap_err();
        assert_eq!(e.status, Some(403), "{kind:?}");
        assert!(!e.is_html(), "{kind:?}: {e}");
        assert!(
            !classify(&e).is_recoverable(),
            "{kind:?}: a provider's JSON 403 is an auth answer, not a proxy rejection"
        );
        assert!(
            e.content_type
                .as_deref()
                .is_some_and(|c| c.starts_with("application/json")),
            "{kind:?}"
        );
        assert!(serde_json::from_str::<serde_json::Value>(&e.body).is_ok());
        assert_eq!(e.label(), "http_4xx");
    }
}

#[tokio::test]
async fn large_bodies_get_the_connection_dropped() {
    let rig = rig().await;
    for kind in KINDS {
        rig.sim.push_reply(ScriptedReply::text("fine"));
        let ok = client(&rig, kind, "/reset")
            .send(&request(1_000))
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: {e}\n{}", rig.nginx.error_log()));
        assert_eq!(ok.message.content, "fine");

        let req = request(300_000);
        let e = tokio::time::timeout(
            Duration::from_secs(20),
            client(&rig, kind, "/reset").send(&req),
        )
        .await
        .expect("a dropped connection is an error, not a hang")
        .unwrap_err();
        assert_eq!(e.status, None, "{kind:?}: {e}");
        assert!(e.transport.is_some());
        assert_eq!(e.label(), "transport");
        assert!(e.request_bytes > 300_000);
        if let Some(n) = expected_bytes(kind, &req) {
            assert_eq!(e.request_bytes, n, "{kind:?}");
        }
    }
}

#[tokio::test]
async fn streams_pass_through_the_proxy() {
    let rig = rig().await;
    for kind in [
        ProviderKind::Openai,
        ProviderKind::OpenaiResponses,
        ProviderKind::Anthropic,
        ProviderKind::Gemini,
    ] {
        rig.sim.push_reply(ScriptedReply::text(
            "streamed through nginx in many small pieces",
        ));
        let mut req = request(100);
        req.stream = true;
        let r = client(&rig, kind, "").send(&req).await.unwrap();
        assert_eq!(
            r.message.content,
            "streamed through nginx in many small pieces"
        );
        assert!(rig.sim.requests().last().unwrap().stream);
    }
}
