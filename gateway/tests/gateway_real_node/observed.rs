//! What a platform team sees of the real node's pods: a real Prometheus scraping the
//! operator, the gateway and the agents as the chart's monitors say, with every dashboard
//! panel's query and every alert's expression returning series; a real OpenTelemetry
//! Collector receiving the agents' GenAI spans.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cairn_sim::{Fault, ScriptedReply, Sim};
use cairn_tests::harness::otelcol::Collector;
use cairn_tests::harness::prometheus::{Prometheus, ScrapeTarget};
use cairn_tests::harness::{ControlPlane, RealNode};
use cairn_tests::monitoring;
use serde_json::json;

use super::{NODE, OPERATOR_NS, kubectl, wait_for};

/// A question of about `bytes` bytes: rows to summarise.
fn big_question(tag: &str, bytes: usize) -> String {
    let mut s = format!("{tag}: please summarise these rows.\n");
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!("row {i}: {}\n", i * 7919 % 100_003));
        i += 1;
    }
    s
}

/// One turn of the session at `path` (`ns/name`) through the gateway, on the Responses API
/// (the session holds the conversation): the status and the body.
fn turn(
    rt: &tokio::runtime::Runtime,
    gw: &str,
    path: &str,
    token: &str,
    text: &str,
) -> (u16, String) {
    rt.block_on(async {
        let sent = reqwest::Client::new()
            .post(format!("{gw}/{path}/v1/responses"))
            .bearer_auth(token)
            .json(&json!({"model": "m-1", "input": text}))
            .timeout(Duration::from_secs(300))
            .send()
            .await;
        match sent {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    })
}

/// Turns of `ns/session` through the gateway that make the agent recover: a 413 of a small
/// request (recovery gives up: a floor, not a cap), a tool call, and a 413 of a large
/// request (a cap learned, the turn retried), all with prompt-cache usage.
pub fn recover(
    rt: &tokio::runtime::Runtime,
    sim: &Sim,
    gw: &str,
    (ns, session): (&str, &str),
    token: &str,
) {
    let path = format!("{ns}/{session}");
    let status413 = || Fault::Status {
        status: 413,
        retry_after: None,
    };
    sim.enable_prompt_cache();
    sim.push_fault(status413());
    let (status, body) = turn(rt, gw, &path, token, "a short question");
    assert!(
        body.contains("floor") || body.contains("413"),
        "a 413 of a tiny request is not recovered ({status}): {body}"
    );

    sim.push_reply(ScriptedReply::tool_call(
        "recall",
        json!({"key": "0000000000000000"}),
    ));
    sim.push_reply(ScriptedReply::text("nothing under that key"));
    let (status, body) = turn(rt, gw, &path, token, "recall a key, please");
    assert_eq!(status, 200, "{body}");

    sim.push_fault(status413());
    sim.push_reply(ScriptedReply::text("recovered from a 413"));
    let (status, body) = turn(rt, gw, &path, token, &big_question("rows", 30_000));
    assert_eq!(status, 200, "{body}");
}

/// Turns of `ns/session` through the gateway whose window overflows: the provider's window
/// shrinks under the session (the new question fits it, the history with it does not), so
/// the agent learns the window and compacts. A session of its own: one that learned a
/// payload cap keeps its requests under that instead.
pub fn overflow_window(
    rt: &tokio::runtime::Runtime,
    sim: &Sim,
    gw: &str,
    (ns, session): (&str, &str),
    token: &str,
) {
    let path = format!("{ns}/{session}");
    sim.push_reply(ScriptedReply::text("rows read"));
    let (status, body) = turn(rt, gw, &path, token, &big_question("rows", 12_000));
    assert_eq!(status, 200, "{body}");
    // 6,000 tokens are 24 KB to the simulator: the next 12 KB question fits, not beside the
    // first one.
    sim.set_window("m-1", 6_000);
    sim.push_reply(ScriptedReply::text("more rows read"));
    let (status, body) = turn(rt, gw, &path, token, &big_question("more rows", 12_000));
    sim.set_window("m-1", 10_000_000);
    assert_eq!(
        status, 200,
        "the overflow was recovered by compaction: {body}"
    );
}

fn json_of(cp: &ControlPlane, what: &str) -> serde_json::Value {
    serde_json::from_str(&kubectl(cp, &["get", what, "-A", "-o", "json"])).expect("JSON")
}

/// A real Prometheus scrapes the pods the chart's monitors select (the operator, the gateway
/// and every running agent, through the node); every panel of the dashboard (the session
/// panels showing `ns/session`) and every alert's expression, its threshold taken off,
/// returns series.
pub fn prometheus_sees_every_panel_and_alert(
    cp: &ControlPlane,
    node: &RealNode,
    dir: &std::path::Path,
    sets: &[String],
    (ns, session): (&str, &str),
) {
    let in_cluster = monitoring::scrape_targets(
        &monitoring::chart_monitors(dir, "cairn", OPERATOR_NS, sets),
        &json_of(cp, "pods"),
        &json_of(cp, "services"),
    );
    let jobs: BTreeSet<&str> = in_cluster.iter().map(|t| t.job.as_str()).collect();
    assert_eq!(
        jobs,
        BTreeSet::from([
            "cairn-metrics",
            "cairn-gateway-metrics",
            "cairn-system/cairn-agents"
        ]),
        "the operator's, the gateway's and the agents' monitors each select pods: {in_cluster:?}"
    );
    assert!(
        in_cluster
            .iter()
            .any(|t| t.labels.get("cairn_dev_session").map(String::as_str) == Some(session)),
        "{ns}/{session} is scraped: {in_cluster:?}"
    );
    let targets: Vec<ScrapeTarget> = in_cluster
        .into_iter()
        .map(|t| ScrapeTarget {
            addr: node.forward_from_host(t.addr).expect("forwarder"),
            ..t
        })
        .collect();
    let mut prom = Prometheus::start(dir, &targets).expect("prometheus");
    let started = Instant::now();
    wait_for(
        "Prometheus to scrape every target a few times",
        Duration::from_secs(90),
        || {
            prom.query("count_over_time(up[1m]) >= 3")
                .is_ok_and(|r| r.len() == targets.len())
        },
    );
    // Every target answers but an agent still opening its session (gamma waits for its
    // archive): such an agent serves only its probes, and `up == 0` is what it shows.
    let down: BTreeSet<String> = prom
        .query("up == 0")
        .expect("up")
        .iter()
        .map(|s| s["metric"]["pod"].as_str().unwrap_or_default().to_string())
        .collect();
    eprintln!(
        "prometheus: {} targets scraped in {:?}, down: {down:?}",
        targets.len(),
        started.elapsed()
    );
    assert_eq!(
        down,
        BTreeSet::from(["cairn-gamma-0".to_string()]),
        "only the agent waiting for its archive is down"
    );

    let mut empty = Vec::new();
    let mut asked = 0;
    for (what, expr) in monitoring::dashboard_queries(&monitoring::dashboard()) {
        let q = monitoring::with_variables(&expr, "2m", ns, session);
        asked += 1;
        if prom.query(&q).expect("the query runs").is_empty() {
            empty.push(format!("{what}: {q}"));
        }
    }
    for alert in monitoring::alerts(&monitoring::rules()) {
        let q = monitoring::watched(alert["expr"].as_str().unwrap_or_default());
        asked += 1;
        if prom.query(&q).expect("the expression runs").is_empty() {
            empty.push(format!(
                "alert {}: {q}",
                alert["alert"].as_str().unwrap_or_default()
            ));
        }
    }
    assert!(
        empty.is_empty(),
        "{} of {asked} queries returned no series:\n{}",
        empty.len(),
        empty.join("\n")
    );
    eprintln!("prometheus: all {asked} dashboard queries and alert expressions return series");
}

/// The agents' spans reached the collector: every provider call a GenAI `chat` with the
/// provider, the model, finish reasons and token usage (cached tokens too), from a pod of
/// the node; turns (`invoke_agent`) and tool runs (`execute_tool`) beside them.
pub fn the_collector_has_genai_spans(collector: &mut Collector) {
    let mut spans = Vec::new();
    wait_for(
        "the agents' chat, turn and tool spans at the collector",
        Duration::from_secs(90),
        || {
            spans = collector.spans().expect("collector alive");
            ["chat", "invoke_agent", "execute_tool"].iter().all(|op| {
                spans
                    .iter()
                    .any(|s| s.value("gen_ai.operation.name") == Some(op))
            })
        },
    );
    let chats: Vec<_> = spans
        .iter()
        .filter(|s| s.value("gen_ai.operation.name") == Some("chat"))
        .collect();
    let answered: Vec<_> = chats
        .iter()
        .filter(|s| s.attributes.contains_key("gen_ai.response.finish_reasons"))
        .collect();
    assert!(!answered.is_empty(), "{chats:?}");
    for s in &answered {
        assert_eq!(
            s.value("gen_ai.provider.name"),
            Some("openai-compatible"),
            "{s:?}"
        );
        assert_eq!(s.value("gen_ai.request.model"), Some("m-1"), "{s:?}");
        for key in [
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "gen_ai.usage.cache_read.input_tokens",
            "gen_ai.usage.cache_creation.input_tokens",
        ] {
            assert!(
                s.value(key).and_then(|v| v.parse::<u64>().ok()).is_some(),
                "{key} on {s:?}"
            );
        }
        assert_eq!(
            s.resource.get("service.name").map(String::as_str),
            Some("Str(cairn-agent)"),
            "{s:?}"
        );
        let session = s.resource.get("cairn.session.name").map(String::as_str);
        assert!(
            matches!(session, Some("Str(alpha)" | "Str(beta)")),
            "sent by a session's agent pod: {s:?}"
        );
    }
    assert!(
        answered.iter().any(|s| s
            .value("gen_ai.usage.input_tokens")
            .is_some_and(|v| v != "0")),
        "token usage is reported: {answered:?}"
    );
    assert!(
        answered.iter().any(|s| s
            .value("gen_ai.usage.cache_read.input_tokens")
            .is_some_and(|v| v != "0")),
        "cached tokens are reported: {answered:?}"
    );
    eprintln!(
        "collector: {} spans, {} provider calls answered, on the node {NODE}",
        spans.len(),
        answered.len()
    );
}
