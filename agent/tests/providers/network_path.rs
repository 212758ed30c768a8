//! The corporate network path through real middleboxes nobody here wrote: Squid as the
//! forward proxy (its own 413 above `request_body_max_size`, recovered with a learned cap;
//! CONNECT tunnels for HTTPS; S3 traffic through it too; `NO_PROXY` honoured) and mitmproxy
//! as a TLS-inspecting proxy (refused without its CA, trusted with `CAIRN_CA_BUNDLE`).

use cairn_agent::server::AppState;
use cairn_sim::Sim;
use cairn_sim::proxies::{Mitm, Squid};

use crate::support::agent::*;
use crate::support::moto::Moto;

fn with(env: &[(String, String)], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = env.to_vec();
    v.extend(
        extra
            .iter()
            .map(|(k, val)| (k.to_string(), val.to_string())),
    );
    v
}

/// Lines of squid's access log for requests to `port`.
fn lines_for(log: &str, port: u16) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains(&format!("127.0.0.1:{port}")) || l.contains(&format!("localhost:{port}"))
        })
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_squid_413_is_recovered_with_a_learned_cap() {
    let sim = Sim::start().await.expect("sim");
    let squid = Squid::start(64 * 1024).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let env = with(
        &storage_env(dir.path(), None),
        &[("HTTP_PROXY", &squid.url())],
    );
    let yaml = config_yaml("squid", &format!("{}/v1", sim.url()), 200_000, "");
    let mut built = build_session(&yaml, &env, "a").await;
    built
        .session
        .replace_history(padded_history(10))
        .await
        .expect("seed");
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    let (status, body) = api.turn("and now?").await;
    assert_eq!(status, 200, "{body}");
    let log = squid.access_log();
    let to_sim = lines_for(&log, sim.addr().port());
    assert!(
        to_sim.first().is_some_and(|l| l.contains("/413 ")),
        "squid refused the first request itself: {log}"
    );
    assert!(
        to_sim.len() > 1 && to_sim[1..].iter().all(|l| l.contains("/200 ")),
        "then everything fit: {log}"
    );
    let notices = body["cairn"]["notices"].as_array().expect("notices");
    assert!(notices.iter().any(|n| n["kind"] == "learned_cap"), "{body}");
    let cap = api.session().await["stats"]["learnedPayloadCap"]
        .as_u64()
        .expect("learned cap");
    // Learned from the ~100 KB request squid refused (¾ of it); what the model received
    // afterwards all fitted squid's limit.
    assert!(cap < 100_000, "learned {cap} from the refused request");
    for r in sim.requests() {
        assert!(
            r.body.len() <= 64 * 1024,
            "{} bytes reached the model",
            r.body.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_traffic_takes_the_proxy_too_and_no_proxy_bypasses_it() {
    let sim = Sim::start().await.expect("sim");
    let moto = Moto::start().await;
    let squid = Squid::start(64 * 1024 * 1024).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let env = with(
        &storage_env(dir.path(), Some(&moto.endpoint)),
        &[("HTTP_PROXY", &squid.url())],
    );
    let yaml = config_yaml("s3-proxy", &format!("{}/v1", sim.url()), 200_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let (status, body) = api.turn("hello").await;
    assert_eq!(status, 200, "{body}");
    let log = squid.access_log();
    let moto_port = moto
        .endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .expect("moto port");
    assert!(
        lines_for(&log, moto_port)
            .iter()
            .any(|l| l.contains(" PUT ")),
        "the journal's S3 writes went through squid: {log}"
    );
    assert!(
        lines_for(&log, sim.addr().port())
            .iter()
            .any(|l| l.contains(" POST ")),
        "and the model call: {log}"
    );

    // NO_PROXY: another model endpoint and another session's S3 keys, reached directly.
    let sim2 = Sim::start().await.expect("sim");
    let direct = with(
        &storage_env(&dir.path().join("direct"), Some(&moto.endpoint)),
        &[
            ("HTTP_PROXY", &squid.url()),
            ("NO_PROXY", "127.0.0.1,localhost"),
        ],
    );
    let yaml = config_yaml("direct", &format!("{}/v1", sim2.url()), 200_000, "");
    let built = build_session(&yaml, &direct, "b").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let (status, body) = api.turn("hello").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(sim2.requests().len(), 1);
    let log = squid.access_log();
    assert!(
        lines_for(&log, sim2.addr().port()).is_empty() && !log.contains("/tests/direct/"),
        "NO_PROXY bypasses squid: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_inspection_is_refused_without_the_ca_bundle_and_trusted_with_it_also_through_a_connect_tunnel()
 {
    let sim = Sim::start().await.expect("sim");
    let mitm = Mitm::reverse(sim.addr()).unwrap_or_else(|e| panic!("{e}"));
    let squid = Squid::start(64 * 1024 * 1024).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let base = format!("{}/v1", mitm.url());

    // Without the bundle: a clear TLS error naming the issuer problem; nothing reached the
    // model.
    let env = storage_env(&dir.path().join("a"), None);
    let built = build_session(&config_yaml("no-bundle", &base, 200_000, ""), &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let (status, body) = api.turn("hello").await;
    assert!(status >= 500, "{status} {body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        message.contains("unknownissuer") || message.contains("unknown issuer"),
        "the error names the untrusted issuer: {body}"
    );
    assert!(sim.requests().is_empty());

    // With mitmproxy's CA as the bundle, turns succeed.
    let ca = mitm.ca_cert();
    let ca = ca.to_str().expect("path");
    let env = with(
        &storage_env(&dir.path().join("b"), None),
        &[("CAIRN_CA_BUNDLE", ca)],
    );
    let built = build_session(&config_yaml("bundle", &base, 200_000, ""), &env, "b").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let (status, body) = api.turn("hello").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(sim.requests().len(), 1);

    // And through squid: HTTPS goes in a CONNECT tunnel (the bundle given inline this time,
    // as the operator passes the fleet's).
    let pem = std::fs::read_to_string(mitm.ca_cert()).expect("ca");
    let env = with(
        &storage_env(&dir.path().join("c"), None),
        &[("CAIRN_CA_BUNDLE_PEM", &pem), ("HTTPS_PROXY", &squid.url())],
    );
    let built = build_session(&config_yaml("tunnel", &base, 200_000, ""), &env, "c").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let (status, body) = api.turn("hello").await;
    assert_eq!(status, 200, "{body}");
    // The tunnel is still open (pooled): squid's cache manager lists it.
    let active = squid.active_requests();
    assert!(
        active.contains(&format!("uri localhost:{}", mitm.port())) && active.contains("TCP_TUNNEL"),
        "a CONNECT tunnel to the TLS endpoint: {active}"
    );
    assert_eq!(sim.requests().len(), 2);
}
