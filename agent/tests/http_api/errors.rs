//! Every error of the HTTP API, on every route, is the documented JSON shape
//! `{"error": {"message", "type", "code"}}`: wrong methods, undecodable paths, unknown
//! routes, missing tokens, oversized and malformed bodies, and the same while the session is
//! still opening (the `Gate` the binary serves first).

use cairn_agent::server::{AppState, Gate, router};
use cairn_sim::Sim;
use serde_json::Value;

use crate::support::agent::*;

/// Sends `method path` (with the token when `auth`) and returns the status and the body,
/// which must be a JSON error with a message, a type and a code.
async fn error_of(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    auth: bool,
) -> (u16, String) {
    let mut req = http.request(
        reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
        format!("{base}{path}"),
    );
    if auth {
        req = req.bearer_auth(TOKEN);
    }
    if method == "POST" {
        req = req.header("content-type", "application/json").body("{");
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = r.text().await.unwrap_or_default();
    assert!(
        (400..600).contains(&status),
        "{method} {path}: expected an error, got {status}: {body}"
    );
    assert!(
        ct.starts_with("application/json"),
        "{method} {path} → {status}: content-type {ct:?}, body {body:?}"
    );
    let v: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{method} {path} → {status}: not JSON ({e}): {body:?}"));
    let err = &v["error"];
    for field in ["message", "type", "code"] {
        assert!(
            err[field].as_str().is_some_and(|s| !s.is_empty()),
            "{method} {path} → {status}: no error.{field}: {body}"
        );
    }
    (status, err["code"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_on_every_route_is_json() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("errors", &format!("{}/v1", sim.url()), 100_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let base = serve(AppState::new(built.session, TOKEN)).await;
    let http = reqwest::Client::new();

    let cases: &[(&str, &str, bool, u16, &str)] = &[
        ("DELETE", "/v1/responses", true, 405, "method_not_allowed"),
        ("GET", "/v1/responses", true, 405, "method_not_allowed"),
        ("PUT", "/v1/session", true, 405, "method_not_allowed"),
        (
            "GET",
            "/v1/session/compact",
            true,
            405,
            "method_not_allowed",
        ),
        ("GET", "/v1/session/rewind", true, 405, "method_not_allowed"),
        ("POST", "/v1/recall/abc", true, 405, "method_not_allowed"),
        ("POST", "/healthz", false, 405, "method_not_allowed"),
        ("DELETE", "/readyz", false, 405, "method_not_allowed"),
        ("POST", "/metrics", false, 405, "method_not_allowed"),
        // %FF is not UTF-8: the path parameter cannot be decoded.
        ("GET", "/v1/recall/%FF%FE", true, 400, "invalid_key"),
        ("GET", "/v1/nope", true, 404, "not_found"),
        ("GET", "/", false, 404, "not_found"),
        ("GET", "/v1/session", false, 401, "unauthorized"),
        ("POST", "/v1/responses", true, 400, "invalid_json"),
        ("POST", "/v1/session/compact", true, 400, "invalid_json"),
    ];
    for &(method, path, auth, want_status, want_code) in cases {
        let (status, code) = error_of(&http, &base, method, path, auth).await;
        assert_eq!(
            (status, code.as_str()),
            (want_status, want_code),
            "{method} {path}"
        );
    }
    let big = "x".repeat(2 * 1024 * 1024);
    let r = http
        .post(format!("{base}/v1/responses"))
        .bearer_auth(TOKEN)
        .body(big)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.expect("413 is JSON");
    assert_eq!(v["error"]["code"], "body_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_while_the_session_opens_are_json_too() {
    let gate = Gate::new("waiting for the journal Lease cairn-x of tests/x");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = gate.router();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let http = reqwest::Client::new();
    for (method, path, want_status, want_code) in [
        ("POST", "/healthz", 405, "method_not_allowed"),
        ("GET", "/readyz", 503, "not_ready"),
        ("GET", "/v1/session", 503, "starting"),
    ] {
        let (status, code) = error_of(&http, &base, method, path, true).await;
        assert_eq!((status, code.as_str()), (want_status, want_code), "{path}");
    }

    // Once open, the session's router answers through the gate with the same shapes.
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("gate", &format!("{}/v1", sim.url()), 100_000, "");
    let built = build_session(&yaml, &env, "a").await;
    gate.open(router(AppState::new(built.session, TOKEN), 1024 * 1024));
    for (method, path, want_status, want_code) in [
        ("POST", "/healthz", 405, "method_not_allowed"),
        ("DELETE", "/v1/session", 405, "method_not_allowed"),
        ("GET", "/v1/recall/%FF", 400, "invalid_key"),
        ("GET", "/nope", 404, "not_found"),
    ] {
        let (status, code) = error_of(&http, &base, method, path, true).await;
        assert_eq!((status, code.as_str()), (want_status, want_code), "{path}");
    }
}
