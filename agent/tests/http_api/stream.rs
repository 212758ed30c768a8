//! `POST /v1/responses` with `stream: true` forwards the answer while the provider is still
//! sending it, against cairn-sim streaming slowly; a model call cut off mid-answer closes the
//! message it streamed as incomplete and leaves the history as it was.

use std::time::{Duration, Instant};

use cairn_agent::server::AppState;
use cairn_sim::{Fault, ScriptedReply, Sim, Stop};
use serde_json::{Value, json};

use crate::support::agent::*;

/// One SSE event with the time it reached the client.
struct Received {
    at: Instant,
    data: Value,
}

impl Received {
    fn ty(&self) -> &str {
        self.data["type"].as_str().unwrap_or_default()
    }
}

/// Posts a streamed turn and reads its events as they come.
async fn stream_turn(api: &Api, input: &str) -> Vec<Received> {
    let mut r = api
        .http
        .post(format!("{}/v1/responses", api.base))
        .bearer_auth(TOKEN)
        .json(&json!({"model": MODEL, "input": input, "stream": true}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let mut events = Vec::new();
    let mut buf = String::new();
    while let Some(chunk) = r.chunk().await.expect("chunk") {
        let at = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            for line in block.lines() {
                if let Some(d) = line.strip_prefix("data: ") {
                    events.push(Received {
                        at,
                        data: serde_json::from_str(d).expect("event json"),
                    });
                }
            }
        }
    }
    events
}

/// The value of an unlabelled series in a Prometheus text exposition.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

fn text_of_item(events: &[Received], item: &str) -> String {
    events
        .iter()
        .filter(|e| e.ty() == "response.output_text.delta" && e.data["item_id"] == item)
        .map(|e| e.data["delta"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_reach_the_client_while_the_provider_is_still_streaming() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("live", &format!("{}/v1", sim.url()), 200_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    // The provider sends the first half of its stream, then nothing for 3 s, then the rest.
    let stall = Duration::from_millis(3_000);
    let answer = "a slowly streamed answer ".repeat(20);
    sim.push_reply(ScriptedReply::text(answer.clone()));
    sim.push_fault(Fault::Stall {
        ms: stall.as_millis() as u64,
    });

    let streaming = {
        let api = api.clone();
        tokio::spawn(async move { stream_turn(&api, "tell me slowly").await })
    };
    // While the provider stalls, the session is busy: a second turn gets 409.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let (status, body) = api.turn("me too").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "session_busy");

    let events = streaming.await.expect("join");
    let first_delta = events
        .iter()
        .find(|e| e.ty() == "response.output_text.delta")
        .expect("a delta");
    let completed = events.last().expect("events");
    assert_eq!(completed.ty(), "response.completed");
    // The first text arrived before the provider's stall ended, not after the whole turn.
    let lead = completed.at.duration_since(first_delta.at);
    assert!(
        lead >= stall - Duration::from_millis(500),
        "the first delta came only {lead:?} before the end"
    );

    let item = first_delta.data["item_id"].as_str().expect("item id");
    assert_eq!(text_of_item(&events, item), answer);
    let response = &completed.data["response"];
    assert_eq!(output_text(response), answer);
    assert_eq!(response["output"][0]["id"], item);
    assert_eq!(response["status"], "completed");
    // Sequence numbers count up from 0 without gaps.
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.data["sequence_number"], json!(i), "{}", e.data);
    }
    // The turn was journaled before it was acknowledged.
    assert_eq!(api.session().await["stats"]["turns"], json!(1));
    assert!(sim.requests()[0].stream);
    // The metric agrees: the first text left well before the stall ended.
    let (_, metrics) = api.get("/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics);
    let first_text = metric(&metrics, "cairn_agent_first_text_seconds_sum");
    assert!(first_text < 2.0, "{first_text}");
    assert_eq!(
        metric(&metrics, "cairn_agent_first_text_seconds_count"),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_off_mid_answer_closes_its_message_and_the_history_stays_clean() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("cut", &format!("{}/v1", sim.url()), 200_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    let lost = "this answer is cut off halfway and never finished ".repeat(4);
    sim.push_reply(ScriptedReply::text(lost.clone()));
    sim.push_fault(Fault::Reset);
    let events = stream_turn(&api, "first question").await;
    let types: Vec<&str> = events.iter().map(Received::ty).collect();
    // Half the answer was streamed, then the message was closed as incomplete and the
    // response failed.
    let item = events
        .iter()
        .find(|e| e.ty() == "response.output_item.added")
        .map(|e| e.data["item"]["id"].clone())
        .expect("an output item");
    let streamed = text_of_item(&events, item.as_str().expect("id"));
    assert!(
        !streamed.is_empty() && streamed.len() < lost.len() && lost.starts_with(&streamed),
        "{streamed:?}"
    );
    let done = events
        .iter()
        .find(|e| e.ty() == "response.output_item.done")
        .expect("item done");
    assert_eq!(done.data["item"]["id"], item);
    assert_eq!(done.data["item"]["status"], "incomplete");
    assert_eq!(types.last(), Some(&"response.failed"), "{types:?}");
    let (_, metrics) = api.get("/metrics").await;
    assert_eq!(
        metric(
            &String::from_utf8_lossy(&metrics),
            "cairn_agent_stream_abandoned_total"
        ),
        1.0
    );
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == "response.output_item.added")
            .count(),
        1
    );

    // Nothing of the cut-off answer entered the history: the next turn does not carry it.
    sim.push_reply(ScriptedReply::text("whole answer"));
    let events = stream_turn(&api, "second question").await;
    let completed = events.last().expect("events");
    assert_eq!(completed.ty(), "response.completed");
    assert_eq!(output_text(&completed.data["response"]), "whole answer");
    let last = sim.requests().pop().expect("request");
    assert!(last.contains("second question"));
    assert!(!last.contains("cut off halfway"));
    assert_eq!(api.session().await["stats"]["turns"], json!(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_model_answer_of_a_turn_streams_into_the_one_message() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("rounds", &format!("{}/v1", sim.url()), 200_000, "")
        .replace("maxOutputTokens: 1000", "maxOutputTokens: 64000");
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    // Text with a tool call, then a reply cut at the output limit and its continuation.
    sim.push_reply(ScriptedReply {
        text: "Let me look it up.".into(),
        ..ScriptedReply::tool_call("recall", json!({"key": "0123456789abcdef"}))
    });
    sim.push_reply(ScriptedReply {
        text: "It is not archived,".into(),
        stop: Some(Stop::MaxTokens),
        ..Default::default()
    });
    sim.push_reply(ScriptedReply::text(" so I cannot say."));
    let events = stream_turn(&api, "what was in that file?").await;
    let types: Vec<&str> = events.iter().map(Received::ty).collect();
    let completed = events.last().expect("events");
    assert_eq!(completed.ty(), "response.completed", "{types:?}");
    let answer = "Let me look it up.\n\nIt is not archived, so I cannot say.";
    assert_eq!(output_text(&completed.data["response"]), answer);
    assert_eq!(completed.data["response"]["cairn"]["rounds"], 2);
    let item = completed.data["response"]["output"][0]["id"]
        .as_str()
        .expect("id");
    assert_eq!(text_of_item(&events, item), answer);
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == "response.output_item.added")
            .count(),
        1
    );
    // The escalation notice came while the turn ran, before the last text.
    let notice = types
        .iter()
        .position(|t| *t == "response.cairn.notice")
        .expect("notice");
    let last_delta = types
        .iter()
        .rposition(|t| *t == "response.output_text.delta")
        .expect("delta");
    assert!(notice < last_delta, "{types:?}");
    assert_eq!(sim.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_request_cut_off_mid_answer_is_recovered_into_a_new_message() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("cut-large", &format!("{}/v1", sim.url()), 1_000_000, "");
    let built = build_session(&yaml, &env, "a").await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);

    // A 600 KB request whose streamed answer dies halfway: a suspected payload failure, so
    // the recovery ladder retries, and the retried answer streams into a new message.
    let lost = "this answer is cut off halfway and never finished ".repeat(4);
    sim.push_reply(ScriptedReply::text(lost.clone()));
    sim.push_fault(Fault::Reset);
    sim.push_reply(ScriptedReply::text("the whole answer"));
    let question = format!(
        "summarise this log:\n{}",
        "a log line of the build\n".repeat(25_000)
    );
    let events = stream_turn(&api, &question).await;
    let types: Vec<&str> = events.iter().map(Received::ty).collect();

    let completed = events.last().expect("events");
    assert_eq!(completed.ty(), "response.completed", "{types:?}");
    let response = &completed.data["response"];
    assert_eq!(output_text(response), "the whole answer");
    let added: Vec<&Received> = events
        .iter()
        .filter(|e| e.ty() == "response.output_item.added")
        .collect();
    assert_eq!(added.len(), 2, "{types:?}");
    let (first, second) = (&added[0].data["item"]["id"], &added[1].data["item"]["id"]);
    assert_ne!(first, second);
    let cut = events
        .iter()
        .find(|e| e.ty() == "response.output_item.done" && e.data["item"]["id"] == *first)
        .expect("the cut message is closed");
    assert_eq!(cut.data["item"]["status"], "incomplete");
    let streamed = text_of_item(&events, first.as_str().expect("id"));
    assert!(
        lost.starts_with(&streamed) && streamed.len() < lost.len(),
        "{streamed:?}"
    );
    assert_eq!(
        text_of_item(&events, second.as_str().expect("id")),
        "the whole answer"
    );
    // Only the final message is the response's output.
    assert_eq!(response["output"].as_array().map(Vec::len), Some(1));
    assert_eq!(response["output"][0]["id"], *second);
    assert_eq!(sim.requests().len(), 2);
    let (_, metrics) = api.get("/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("cairn_agent_recoveries_total")
                && l.contains("suspected_payload")
                && !l.ends_with(" 0")),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("recover"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
