//! A provider's failure reaches the API client with its own class (docs/agent.md, "Provider
//! failures"): cairn-sim scripts each provider answer (429 with `Retry-After`, an invalid
//! key, 529 and 503 overloads, a call past its deadline, a 500) and every API answers with
//! the mapped status, `type`, `code` and `Retry-After`, non-streamed and streamed (the
//! status itself while nothing was sent, the stream's error event after). The official
//! OpenAI Python SDK then meets these answers (its retries, its exception classes), and a
//! real nginx in front of the provider answers 429 and 503 with `Retry-After`, which reach
//! the SDK intact.

use std::time::{Duration, Instant};

use cairn_agent::provider::RetryPolicy;
use cairn_agent::server::AppState;
use cairn_sim::nginx::{MIDDLEBOX_RETRY_AFTER, Middlebox, MiddleboxConfig};
use cairn_sim::{Fault, ScriptedReply, Sim};
use cairn_tests::harness::python::{self, line};
use serde_json::{Value, json};

use crate::support::agent::*;

/// What one API answer said about a failure.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    should_retry: Option<String>,
    /// The error object: the body's `error`, a chunk's `error`, or `response.failed`'s
    /// `response.error`.
    error: Value,
    /// For a stream: whether anything came before the error.
    streamed_before: bool,
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The `data:` payloads of an SSE body, with their event names.
fn sse(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for block in body.split("\n\n") {
        let mut event = String::new();
        let mut data = String::new();
        for l in block.lines() {
            if let Some(e) = l.strip_prefix("event: ") {
                event = e.to_owned();
            } else if let Some(d) = l.strip_prefix("data: ") {
                data.push_str(d);
            }
        }
        if !data.is_empty() && data != "[DONE]" {
            out.push((
                event,
                serde_json::from_str(&data).expect("SSE data is JSON"),
            ));
        }
    }
    out
}

/// One turn on `path` (`/v1/chat/completions` or `/v1/responses`), streamed or not.
async fn failing_turn(api: &Api, path: &str, stream: bool, input: &str) -> Answer {
    let body = if path.ends_with("chat/completions") {
        json!({"model": MODEL, "messages": [{"role": "user", "content": input}], "stream": stream})
    } else {
        json!({"model": MODEL, "input": input, "stream": stream})
    };
    let r = api.send(path, &body).await;
    let status = r.status().as_u16();
    let retry_after = header(&r, "retry-after");
    let should_retry = header(&r, "x-should-retry");
    let ct = header(&r, "content-type").unwrap_or_default();
    let text = r.text().await.expect("body");
    if !ct.starts_with("text/event-stream") {
        assert!(ct.starts_with("application/json"), "{ct}: {text}");
        let v: Value = serde_json::from_str(&text).expect("JSON error");
        return Answer {
            status,
            retry_after,
            should_retry,
            error: v["error"].clone(),
            streamed_before: false,
        };
    }
    let events = sse(&text);
    let (last_event, last) = events.last().cloned().expect("events");
    let error = if path.ends_with("chat/completions") {
        last["error"].clone()
    } else {
        assert_eq!(last_event, "response.failed", "{text}");
        assert_eq!(last["response"]["status"], "failed");
        last["response"]["error"].clone()
    };
    Answer {
        status,
        retry_after,
        should_retry,
        error,
        streamed_before: events.len() > 1,
    }
}

const APIS: [&str; 2] = ["/v1/chat/completions", "/v1/responses"];

/// Serves a session on `sim` (its client never retries unless `retry` says so) with the
/// policy lines in `extra`.
async fn serve_session(sim: &Sim, dir: &std::path::Path, extra: &str, retry: RetryPolicy) -> Api {
    let env = storage_env(dir, None);
    let yaml = config_yaml("perr", &format!("{}/v1", sim.url()), 200_000, extra);
    let built = build_retrying_session(&yaml, &env, "a", retry).await;
    Api::new(serve(AppState::new(built.session, TOKEN)).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_provider_failure_reaches_the_client_with_its_class() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let api = serve_session(
        &sim,
        dir.path(),
        "compaction:\n  timeouts: {providerCallSeconds: 1, turnSeconds: 60}\n",
        RetryPolicy::none(),
    )
    .await;

    // (fault, status, type, code, Retry-After, x-should-retry)
    type Case = (
        Fault,
        u16,
        &'static str,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            Fault::Status {
                status: 429,
                retry_after: Some(3),
            },
            429,
            "rate_limit_error",
            "rate_limit_exceeded",
            Some("3"),
            None,
        ),
        (
            Fault::Status {
                status: 401,
                retry_after: None,
            },
            502,
            "server_error",
            "provider_auth",
            None,
            Some("false"),
        ),
        // The provider's JSON 403 is an authorization answer (a WAF's HTML one is a proxy
        // rejection for the recovery ladder: middlebox_nginx and the session suites).
        (
            Fault::Status {
                status: 403,
                retry_after: None,
            },
            502,
            "server_error",
            "provider_auth",
            None,
            Some("false"),
        ),
        (
            Fault::Status {
                status: 529,
                retry_after: None,
            },
            503,
            "server_error",
            "provider_overloaded",
            // None came, none is invented.
            None,
            None,
        ),
        (
            Fault::Status {
                status: 503,
                retry_after: Some(4),
            },
            503,
            "server_error",
            "provider_overloaded",
            Some("4"),
            None,
        ),
        // Past `providerCallSeconds`: the provider's answer comes too late.
        (
            Fault::Latency { ms: 2_500 },
            504,
            "server_error",
            "provider_timeout",
            None,
            None,
        ),
        (
            Fault::Status {
                status: 500,
                retry_after: None,
            },
            502,
            "server_error",
            "provider",
            None,
            None,
        ),
    ];
    for (fault, status, ty, code, retry_after, should_retry) in cases {
        for path in APIS {
            for stream in [false, true] {
                let what = format!("{fault:?} on {path} (stream: {stream})");
                sim.push_fault(fault.clone());
                let a = failing_turn(&api, path, stream, "a question that fails").await;
                assert_eq!(a.status, status, "{what}: {a:?}");
                assert_eq!(a.error["type"], ty, "{what}: {a:?}");
                assert_eq!(a.error["code"], code, "{what}: {a:?}");
                assert!(
                    a.error["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("provider")),
                    "{what}: {a:?}"
                );
                assert_eq!(a.retry_after.as_deref(), retry_after, "{what}");
                assert_eq!(a.should_retry.as_deref(), should_retry, "{what}");
                // Nothing was streamed: the failure is the answer's own status, in the
                // OpenAI error shape.
                assert!(!a.streamed_before, "{what}: {a:?}");
                assert!(
                    a.error.get("param").is_some_and(Value::is_null),
                    "{what}: {a:?}"
                );
            }
        }
    }
    // A failed turn changed nothing: the next one answers.
    sim.push_reply(ScriptedReply::text("fine again"));
    let (status, v) = api.turn("now it works").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(output_text(&v), "fine again");
    assert_eq!(api.session().await["stats"]["turns"], json!(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_the_stream_started_carries_the_same_type_and_code() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let api = serve_session(&sim, dir.path(), "", RetryPolicy::none()).await;
    for path in APIS {
        // The first model call streams text and calls a built-in tool; the second gets a
        // 429 once the head and that text are out.
        sim.push_reply(ScriptedReply {
            text: "let me look that up".into(),
            ..ScriptedReply::tool_call("recall", json!({"key": "0123456789abcdef"}))
        });
        // Faults apply to requests in order: the first call answers normally.
        sim.push_fault(Fault::Latency { ms: 1 });
        sim.push_fault(Fault::Status {
            status: 429,
            retry_after: Some(2),
        });
        let a = failing_turn(&api, path, true, "a question that fails late").await;
        assert_eq!(a.status, 200, "{path}: {a:?}");
        assert!(a.streamed_before, "{path}: {a:?}");
        assert_eq!(a.error["type"], "rate_limit_error", "{path}: {a:?}");
        assert_eq!(a.error["code"], "rate_limit_exceeded", "{path}: {a:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_passes_through_after_the_agents_own_retries() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let retry = RetryPolicy {
        max_retries: 2,
        base: Duration::from_millis(5),
        max_delay: Duration::from_secs(5),
        jitter: 0.5,
    };
    let api = serve_session(&sim, dir.path(), "", retry).await;
    for _ in 0..3 {
        sim.push_fault(Fault::Status {
            status: 429,
            retry_after: Some(1),
        });
    }
    let started = Instant::now();
    let a = failing_turn(&api, "/v1/responses", false, "rate limited").await;
    assert_eq!(a.status, 429, "{a:?}");
    assert_eq!(a.retry_after.as_deref(), Some("1"));
    assert_eq!(sim.requests().len(), 3, "the first try and two retries");
    assert!(
        started.elapsed() >= Duration::from_millis(1_900),
        "the agent waited the provider's Retry-After twice: {:?}",
        started.elapsed()
    );
    // One 429 is absorbed by the agent's retry: the client sees the answer.
    sim.push_fault(Fault::Status {
        status: 429,
        retry_after: Some(1),
    });
    sim.push_reply(ScriptedReply::text("after the wait"));
    let (status, v) = api.turn("rate limited once").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(output_text(&v), "after the wait");
}

const SDK: &str = r#"
import os, time
import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["BASE"] + "/v1", api_key=os.environ["TOKEN"],
                max_retries=int(os.environ["RETRIES"]))
started = time.monotonic()
try:
    if os.environ["API"] == "chat":
        r = client.chat.completions.create(model="m-1", stream=os.environ["STREAM"] == "1",
                                           messages=[{"role": "user", "content": os.environ["INPUT"]}])
        if os.environ["STREAM"] == "1":
            r = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
        else:
            r = r.choices[0].message.content
    else:
        r = client.responses.create(model="m-1", input=os.environ["INPUT"]).output_text
    print("RESULT=ok " + r)
except openai.APIStatusError as e:
    print("RESULT=" + type(e).__name__)
    print("STATUS=" + str(e.status_code))
    print("CODE=" + str(e.code))
    print("TYPE=" + str(e.type))
    print("RETRY_AFTER=" + str(e.response.headers.get("retry-after")))
print("ELAPSED=" + str(time.monotonic() - started))
"#;

/// Runs the SDK script once; returns its output.
async fn sdk(base: &str, api: &str, stream: bool, retries: u32, input: &str) -> String {
    let env = vec![
        ("BASE".to_owned(), base.to_owned()),
        ("TOKEN".to_owned(), TOKEN.to_owned()),
        ("API".to_owned(), api.to_owned()),
        (
            "STREAM".to_owned(),
            if stream { "1" } else { "0" }.to_owned(),
        ),
        ("RETRIES".to_owned(), retries.to_string()),
        ("INPUT".to_owned(), input.to_owned()),
    ];
    tokio::task::spawn_blocking(move || python::run(SDK, &env))
        .await
        .expect("join")
}

fn elapsed(out: &str) -> f64 {
    line(out, "ELAPSED").parse().expect("seconds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_retries_and_raises_by_the_class() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    // A fresh session for each call: a Chat Completions client sends its whole conversation,
    // which must be the session's.
    let sessions = std::sync::atomic::AtomicUsize::new(0);
    let fresh = || async {
        let n = sessions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let data = dir.path().join(format!("s{n}"));
        std::fs::create_dir(&data).expect("session dir");
        serve_session(&sim, &data, "", RetryPolicy::none())
            .await
            .base
    };
    let base = fresh().await;

    // A rate limit the SDK's own retries outlast: it waits the passed-through Retry-After.
    sim.push_fault(Fault::Status {
        status: 429,
        retry_after: Some(1),
    });
    sim.push_reply(ScriptedReply::text("after one wait"));
    let out = sdk(&base, "responses", false, 2, "q1").await;
    assert_eq!(line(&out, "RESULT"), "ok after one wait", "{out}");
    assert!(elapsed(&out) >= 0.95, "{out}");
    assert_eq!(sim.requests().len(), 2);

    // A rate limit that outlasts them: three tries (the SDK's default two retries), each
    // after the Retry-After, then RateLimitError with the status, code and header intact.
    sim.reset();
    for _ in 0..3 {
        sim.push_fault(Fault::Status {
            status: 429,
            retry_after: Some(1),
        });
    }
    let base = fresh().await;
    let out = sdk(&base, "chat", false, 2, "q2").await;
    assert_eq!(line(&out, "RESULT"), "RateLimitError", "{out}");
    assert_eq!(line(&out, "STATUS"), "429");
    assert_eq!(line(&out, "CODE"), "rate_limit_exceeded");
    assert_eq!(line(&out, "TYPE"), "rate_limit_error");
    assert_eq!(line(&out, "RETRY_AFTER"), "1");
    assert!(elapsed(&out) >= 1.9, "{out}");
    assert_eq!(sim.requests().len(), 3);

    // Streamed: the failure comes before any byte, so the SDK sees the status at create().
    sim.reset();
    sim.push_fault(Fault::Status {
        status: 529,
        retry_after: Some(1),
    });
    let base = fresh().await;
    let out = sdk(&base, "chat", true, 0, "q3").await;
    assert_eq!(line(&out, "RESULT"), "InternalServerError", "{out}");
    assert_eq!(line(&out, "STATUS"), "503");
    assert_eq!(line(&out, "CODE"), "provider_overloaded");
    assert_eq!(line(&out, "RETRY_AFTER"), "1");
    // With retries, an overload it outlasts is an answer.
    sim.reset();
    sim.push_fault(Fault::Status {
        status: 503,
        retry_after: Some(1),
    });
    sim.push_reply(ScriptedReply::text("streamed after the overload"));
    let base = fresh().await;
    let out = sdk(&base, "chat", true, 2, "q4").await;
    assert_eq!(
        line(&out, "RESULT"),
        "ok streamed after the overload",
        "{out}"
    );
    assert!(elapsed(&out) >= 0.95, "{out}");

    // A provider that refuses the agent's key: 502 provider_auth, which the SDK raises as
    // an InternalServerError (an APIStatusError) at once: x-should-retry: false stops its
    // retries, so the provider is asked once.
    sim.reset();
    for _ in 0..3 {
        sim.push_fault(Fault::Status {
            status: 401,
            retry_after: None,
        });
    }
    let base = fresh().await;
    let out = sdk(&base, "responses", false, 2, "q5").await;
    assert_eq!(line(&out, "RESULT"), "InternalServerError", "{out}");
    assert_eq!(line(&out, "STATUS"), "502");
    assert_eq!(line(&out, "CODE"), "provider_auth");
    assert_eq!(line(&out, "RETRY_AFTER"), "None");
    assert_eq!(sim.requests().len(), 1, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nginx_429_and_503_reach_the_sdk_with_their_retry_after() {
    let sim = Sim::start().await.expect("sim");
    let nginx =
        Middlebox::start(sim.addr(), &MiddleboxConfig::default()).unwrap_or_else(|e| panic!("{e}"));
    let wait = MIDDLEBOX_RETRY_AFTER.to_string();
    for (location, status, class, code) in [
        ("/throttle", "429", "RateLimitError", "rate_limit_exceeded"),
        (
            "/unavailable",
            "503",
            "InternalServerError",
            "provider_overloaded",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = storage_env(dir.path(), None);
        let yaml = config_yaml("nginx", &format!("{}/v1", nginx.url(location)), 200_000, "");
        let built = build_session(&yaml, &env, "a").await;
        let base = serve(AppState::new(built.session, TOKEN)).await;
        for (api, stream) in [("responses", false), ("chat", true)] {
            let out = sdk(&base, api, stream, 0, "through nginx").await;
            assert_eq!(line(&out, "RESULT"), class, "{location} {api}: {out}");
            assert_eq!(line(&out, "STATUS"), status, "{location} {api}: {out}");
            assert_eq!(line(&out, "CODE"), code, "{location} {api}: {out}");
            assert_eq!(line(&out, "RETRY_AFTER"), wait, "{location} {api}: {out}");
        }
    }
    // nginx answered every request itself.
    assert!(sim.requests().is_empty());
    let log = nginx.access_log();
    assert_eq!(
        log.lines().filter(|l| l.contains("\" 429 ")).count(),
        2,
        "{log}"
    );
    assert_eq!(
        log.lines().filter(|l| l.contains("\" 503 ")).count(),
        2,
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captive_portals_page_is_its_own_failure_not_a_size_limit() {
    let sim = Sim::start().await.expect("sim");
    let nginx =
        Middlebox::start(sim.addr(), &MiddleboxConfig::default()).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml(
        "portal",
        &format!("{}/v1", nginx.url("/portal")),
        200_000,
        "",
    );
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    for path in APIS {
        for stream in [false, true] {
            let what = format!("{path} (stream: {stream})");
            let a = failing_turn(&api, path, stream, "behind a captive portal").await;
            assert_eq!(a.status, 502, "{what}: {a:?}");
            assert_eq!(a.error["type"], "server_error", "{what}: {a:?}");
            assert_eq!(a.error["code"], "provider_captive_portal", "{what}: {a:?}");
            let message = a.error["message"].as_str().unwrap_or_default();
            assert!(message.contains("captive portal"), "{what}: {message}");
            assert!(!message.contains("system prompt"), "{what}: {message}");
            assert_eq!(a.should_retry.as_deref(), Some("false"), "{what}");
            assert_eq!(a.retry_after, None, "{what}");
            assert!(!a.streamed_before, "{what}: {a:?}");
        }
    }
    // The portal answered every request, once: no smaller request was tried, no byte cap
    // learned from a page that took the request whatever its size.
    assert!(sim.requests().is_empty());
    let log = nginx.access_log();
    assert_eq!(
        log.lines().filter(|l| l.contains("\" 200 ")).count(),
        4,
        "{log}"
    );
    let (status, session) = api.get("/v1/session").await;
    assert_eq!(status, 200);
    let session: Value = serde_json::from_slice(&session).expect("JSON");
    assert!(session["stats"]["learnedPayloadCap"].is_null(), "{session}");
}
