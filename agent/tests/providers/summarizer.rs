//! `summarizer.provider`: level-2 summaries go to the summarizer's own endpoint (here an
//! Anthropic cairn-sim beside the session's OpenAI-compatible one), with its model, sized by
//! its own window; its tokens are counted apart and its failures are classified.

use cairn_agent::history::Message;
use cairn_agent::metrics::TokenLabels;
use cairn_sim::{Fault, ScriptedReply, Sim, Wire};

use crate::support::agent::*;

/// A summary with the nine sections, long enough for the quality gate.
fn summary_text() -> String {
    let mut s = String::new();
    for (n, sec) in cairn_agent::compact::summarize::SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe user asked twelve questions about the numbers; all answered.\n",
            n + 1
        ));
    }
    while s.len() < 2_500 {
        s.push_str("Details: every answer was given in full; nothing is pending.\n");
    }
    s
}

const SUMMARIZER_MODEL: &str = "claude-haiku-4-5";
/// The summarizer's own window, far smaller than the session's 200,000 tokens.
const SUMMARIZER_WINDOW: u64 = 12_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_go_to_the_summarizers_own_endpoint_and_its_tokens_are_counted_apart() {
    let session_sim = Sim::start().await.expect("sim");
    let summarizer_sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let extra = format!(
        "compaction:\n  summarizer:\n    provider: anthropic\n    model: {SUMMARIZER_MODEL}\n    baseUrl: {}\n    contextWindow: {SUMMARIZER_WINDOW}\n",
        summarizer_sim.url()
    );
    let yaml = config_yaml(
        "summarizer",
        &format!("{}/v1", session_sim.url()),
        200_000,
        &extra,
    );
    let mut built = build_session(&yaml, &env, "test").await;
    assert!(
        built.session.stats().unsupported.is_empty(),
        "a summarizer on another provider kind is honoured: {:?}",
        built.session.stats().unsupported
    );
    built
        .session
        .replace_history(padded_history(12))
        .await
        .expect("seed");
    for _ in 0..6 {
        summarizer_sim.push_reply(ScriptedReply::text(summary_text()));
    }
    let out = built.session.compact_now(None).await.expect("compaction");
    assert_eq!(out.level, Some(2), "a level-2 summary was written: {out:?}");

    // The summarizer's endpoint got the call, in its own wire format and with its model;
    // the session's endpoint got nothing.
    assert!(session_sim.requests().is_empty());
    let calls = summarizer_sim.requests();
    assert!(!calls.is_empty());
    for r in &calls {
        assert_eq!(r.wire, Wire::Anthropic);
        assert_eq!(r.model, SUMMARIZER_MODEL);
        assert_eq!(r.auth.as_deref(), Some("x-api-key"));
        // Its own window sized the input: the request fits the summarizer's window.
        assert!(
            r.estimated_tokens < SUMMARIZER_WINDOW,
            "a summary request of {} tokens for a {SUMMARIZER_WINDOW}-token window",
            r.estimated_tokens
        );
        assert_eq!(r.outcome, "ok");
    }
    let history = cairn_agent::history::to_jsonl(built.session.history());
    assert!(
        history.contains("all answered"),
        "the summary is in the history"
    );

    // Its tokens are counted apart from the session's.
    let stats = built.session.stats();
    let summarizer = stats.tokens.summarizer.clone().expect("summarizer tokens");
    assert!(
        summarizer.input > 0 && summarizer.output > 0,
        "{summarizer:?}"
    );
    assert_eq!(stats.tokens.input, 0, "no session reply yet");
    let metrics = std::sync::Arc::clone(built.session.metrics());
    assert_eq!(
        metrics
            .tokens
            .get(&TokenLabels {
                kind: "input",
                client: "summarizer"
            })
            .map_or(0, |c| c.get()),
        summarizer.input
    );

    // A session turn goes to the session's endpoint and counts as the session's.
    built
        .session
        .turn(vec![Message::user("and now?")])
        .await
        .expect("turn");
    assert_eq!(session_sim.requests().len(), 1);
    let stats = built.session.stats();
    assert!(stats.tokens.input > 0);
    assert_eq!(stats.tokens.summarizer, Some(summarizer.clone()));
    // Journaled with the session's own: another agent taking the session over reports both
    // (and carries on with it).
    let reopened = build_session(&yaml, &env, "other").await;
    let again = reopened.session.stats();
    assert_eq!(again.tokens.summarizer, Some(summarizer));
    assert_eq!(again.tokens.input, stats.tokens.input);
    built = reopened;

    // A failing summarizer is classified like any provider; the ladder goes on without it.
    summarizer_sim.reset();
    summarizer_sim.push_fault(Fault::Status {
        status: 529,
        retry_after: None,
    });
    built
        .session
        .replace_history(padded_history(12))
        .await
        .expect("seed");
    let out = built.session.compact_now(None).await.expect("compaction");
    assert_ne!(out.level, Some(2), "no summary from a failing summarizer");
    let text = built.session.metrics().render(None);
    assert!(
        text.lines()
            .any(|l| l.starts_with("cairn_agent_provider_errors_total")
                && l.contains("client=\"summarizer\"")
                && l.contains("error=\"http_5xx\"")),
        "{text}"
    );
}

/// `summarizer.structured`: the summary is asked for as a JSON object of the nine sections
/// (the `json_schema` output format), and the answer becomes the summary under its
/// headings, which the quality gate accepts. A Bedrock summarizer has no output format:
/// the setting is reported, not silently dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_structured_summary_is_asked_for_by_schema_and_written_under_its_headings() {
    use cairn_agent::compact::summarize::{SECTION_FIELDS, SECTIONS};
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml(
        "structured",
        &format!("{}/v1", sim.url()),
        200_000,
        "compaction:\n  summarizer:\n    structured: true\n",
    );
    let mut built = build_session(&yaml, &env, "test").await;
    assert!(built.session.stats().unsupported.is_empty());
    built
        .session
        .replace_history(padded_history(12))
        .await
        .expect("seed");
    let answer: serde_json::Map<String, serde_json::Value> = SECTION_FIELDS
        .iter()
        .map(|f| {
            (
                (*f).to_owned(),
                format!("SECTION-{f}: the user asked twelve questions; all answered. ")
                    .repeat(4)
                    .into(),
            )
        })
        .collect();
    sim.push_reply(ScriptedReply::text(
        serde_json::Value::Object(answer).to_string(),
    ));
    let out = built.session.compact_now(None).await.expect("compaction");
    assert_eq!(out.level, Some(2), "{out:?}");
    let request = sim.requests().pop().expect("a summary request");
    let body: serde_json::Value = serde_json::from_str(&request.body).expect("JSON body");
    let format = &body["response_format"];
    assert_eq!(format["type"], "json_schema", "{body}");
    let schema = &format["json_schema"]["schema"];
    assert_eq!(
        schema["required"],
        serde_json::json!(SECTION_FIELDS),
        "{format}"
    );
    assert!(schema["properties"]["current_work"]["minLength"].as_u64() > Some(8));
    let summary = built
        .session
        .history()
        .iter()
        .find(|m| m.meta.is_summary)
        .expect("the summary")
        .content
        .clone();
    assert!(
        summary.contains(&format!(
            "1. {}\nSECTION-{}",
            SECTIONS[0], SECTION_FIELDS[0]
        )),
        "{summary}"
    );
    assert!(
        !summary.contains("{\""),
        "written as text, not JSON: {summary}"
    );
    assert_eq!(built.session.stats().summaries.accepted, 1);

    // A Bedrock summarizer: reported in status.session.unsupported.
    let bedrock = config_yaml(
        "structured-bedrock",
        &format!("{}/v1", sim.url()),
        200_000,
        "compaction:\n  summarizer:\n    structured: true\n    provider: bedrock\n    model: anthropic.claude-haiku-4-5\n    region: us-east-1\n",
    );
    let built = build_session(&bedrock, &storage_env(dir.path(), None), "bedrock").await;
    let unsupported = built.session.stats().unsupported;
    assert!(
        unsupported
            .iter()
            .any(|u| u.field == "summarizer.structured" && u.reason.contains("bedrock")),
        "{unsupported:?}"
    );
}
