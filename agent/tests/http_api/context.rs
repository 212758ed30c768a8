//! The context inspector (`GET /v1/session/context`) against cairn-sim, for every wire
//! format it speaks: a session with every kind of part (system prompt, built-in, MCP and
//! client tools, the client's instructions, a summary written by a compaction, a
//! PreserveVerbatim message, results of several tools, an image) is inspected, then the next
//! turn is sent; the breakdown sums to the size of the request cairn-sim received, to the
//! byte, and `?view=request` is that request's body.

use std::io::Cursor;
use std::path::Path;

use base64::Engine as _;
use cairn_agent::history::{Image, Message, ToolCall};
use cairn_agent::provider::ToolSpec;
use cairn_agent::server::AppState;
use cairn_agent::session::TurnOptions;
use cairn_crds::ProviderKind;
use cairn_sim::{ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;

use crate::support::mcp_node_modules as node_modules;

fn yaml(kind: ProviderKind, sim: &Sim, files: &Path) -> String {
    let base = match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses | ProviderKind::OpenaiCompatible => {
            format!("{}/v1", sim.url())
        }
        _ => sim.url(),
    };
    let fs = node_modules().join(".bin/mcp-server-filesystem");
    format!(
        "name: ctx-{kind}\nnamespace: tests\nprovider:\n  kind: {kind}\n  model: {MODEL}\n  baseUrl: {base}\n  region: us-east-1\ncontextWindow: 200000\nmaxOutputTokens: 1000\nsystemPrompt: You are a test agent. Be exact.\ntools:\n  mcpServers:\n  - name: fs\n    command: {}\n    args: [{}]\n",
        fs.display(),
        files.display(),
        kind = kind.as_str(),
    )
}

/// A summary with the nine sections, long enough for the quality gate.
fn summary() -> String {
    let mut s = String::new();
    for (n, sec) in cairn_agent::compact::summarize::SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe build of module_7 fails with E0308.\n",
            n + 1
        ));
    }
    while s.len() < 2_500 {
        s.push_str("Details: the failing build step is module_7.\n");
    }
    s
}

fn png() -> String {
    let img = image::RgbImage::from_fn(16, 16, |x, y| image::Rgb([x as u8 * 16, y as u8 * 16, 7]));
    let mut out = Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img)
        .write_to(&mut out, image::ImageFormat::Png)
        .expect("png");
    base64::engine::general_purpose::STANDARD.encode(out.into_inner())
}

fn client_options() -> TurnOptions {
    TurnOptions {
        tools: vec![ToolSpec {
            name: "lookup".into(),
            description: "Looks a symbol up in the client's index.".into(),
            parameters: json!({"type": "object", "properties": {"symbol": {"type": "string"}}}),
        }],
        instructions: Some("Answer in one sentence.".into()),
        ..TurnOptions::default()
    }
}

/// Old exchanges for the compaction to summarize.
fn old_exchanges() -> Vec<Message> {
    (0..12)
        .flat_map(|i| {
            [
                Message::user(format!(
                    "question {i}: {}",
                    "why does module_7 fail? ".repeat(60)
                )),
                Message::assistant(format!(
                    "answer {i}: {}",
                    "a type mismatch (E0308). ".repeat(60)
                )),
            ]
        })
        .collect()
}

/// The parts a compaction leaves alone and the other kinds: a PreserveVerbatim message,
/// results of two tools, an image.
fn recent_parts() -> Vec<Message> {
    let mut verbatim = Message::user("recalled exactly: fn module_7() -> u32 { \"7\".len() }");
    verbatim.meta.preserve_verbatim = true;
    let calls = vec![
        ToolCall {
            id: "call_r1".into(),
            name: "recall".into(),
            arguments: r#"{"key":"0123456789abcdef"}"#.into(),
        },
        ToolCall {
            id: "call_l1".into(),
            name: "lookup".into(),
            arguments: r#"{"symbol":"module_7"}"#.into(),
        },
    ];
    let mut recall = Message::tool("call_r1", "error: no archived object 0123456789abcdef");
    recall.name = Some("recall".into());
    let mut lookup = Message::tool(
        "call_l1",
        "module_7 is defined in src/m7.rs:12\n\"pub fn module_7\" <<ccr:00112233445566aa>>",
    );
    lookup.name = Some("lookup".into());
    let mut image = Message::user("and what is in this picture?");
    image.images.push(Image {
        media_type: "image/png".into(),
        data: png(),
    });
    vec![
        verbatim,
        Message::assistant("noted"),
        Message::user("look module_7 up"),
        Message::assistant_calls("", calls),
        recall,
        lookup,
        Message::assistant("it is in src/m7.rs"),
        image,
        Message::assistant("a gradient"),
    ]
}

async fn context(api: &Api, query: &str) -> (u16, Vec<u8>) {
    api.get(&format!("/v1/session/context?{query}")).await
}

async fn inspect_then_send(kind: ProviderKind) {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).expect("files dir");
    std::fs::write(files.join("a.txt"), "alpha\n").expect("file");
    let built = build_session(
        &yaml(kind, &sim, &files),
        &storage_env(&dir.path().join("data"), None),
        "a",
    )
    .await;
    let state = AppState::new(built.session, TOKEN);
    let api = Api::new(serve(state.clone()).await);
    {
        let mut s = state.session.lock().await;
        s.seed(old_exchanges()).await.expect("seed");
        sim.push_reply(ScriptedReply::text(summary()));
        let out = s.compact_now(None).await.expect("compaction");
        assert!(out.level.is_some(), "{kind:?}: no compaction ran");
        assert!(
            s.history().iter().any(|m| m.meta.is_summary),
            "{kind:?}: the compaction wrote no summary"
        );
        s.seed(recent_parts()).await.expect("seed");
        sim.push_reply(ScriptedReply::text("ready"));
        s.turn_with_options(vec![Message::user("warm up")], client_options(), None)
            .await
            .expect("turn");
    }

    let input = "final question about module_7";
    let (status, report) = context(&api, &format!("input={}", input.replace(' ', "%20"))).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&report));
    let report: Value = serde_json::from_slice(&report).expect("json");
    let (status, view) = context(
        &api,
        &format!("view=request&input={}", input.replace(' ', "%20")),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&view));

    let seen_before = sim.requests().len();
    sim.push_reply(ScriptedReply::text("it is a gradient"));
    state
        .session
        .lock()
        .await
        .turn_with_options(vec![Message::user(input)], client_options(), None)
        .await
        .expect("final turn");
    let seen = sim.requests();
    assert_eq!(seen.len(), seen_before + 1, "{kind:?}: one request");
    let sent = seen.last().expect("request");

    // (b) `?view=request` is the body cairn-sim received, byte for byte.
    assert!(
        view == sent.body.as_bytes(),
        "{kind:?}: the rendered request differs from the one sent:\n{}\n---\n{}",
        String::from_utf8_lossy(&view),
        sent.body
    );
    // (a) the parts sum to its size, to the byte.
    let n = |v: &Value| v["bytes"].as_u64().expect("bytes");
    let mut sum = 0;
    for part in [
        "systemPrompt",
        "instructions",
        "summaries",
        "preserveVerbatim",
        "images",
        "framing",
    ] {
        sum += n(&report[part]);
    }
    for group in ["toolsBySource", "messages", "toolResults"] {
        for v in report[group].as_object().expect(group).values() {
            sum += n(v);
        }
    }
    assert_eq!(report["bodyBytes"].as_u64(), Some(sent.bytes), "{kind:?}");
    assert_eq!(sum, sent.bytes, "{kind:?}: {report:#}");

    // Every kind of part is there, measured from the body.
    let positive = |path: &str, v: &Value| {
        assert!(n(v) > 0, "{kind:?}: {path} is empty: {report:#}");
    };
    positive("systemPrompt", &report["systemPrompt"]);
    positive("instructions", &report["instructions"]);
    positive("summaries", &report["summaries"]);
    positive("preserveVerbatim", &report["preserveVerbatim"]);
    positive("images", &report["images"]);
    positive("messages.user", &report["messages"]["user"]);
    positive("messages.assistant", &report["messages"]["assistant"]);
    positive("toolResults.recall", &report["toolResults"]["recall"]);
    positive("toolResults.lookup", &report["toolResults"]["lookup"]);
    for source in ["builtin", "mcp", "client"] {
        positive(source, &report["toolsBySource"][source]);
    }
    let tools: Vec<(&str, &str)> = report["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or(""),
                t["source"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(tools.contains(&("recall", "builtin")), "{tools:?}");
    assert!(tools.contains(&("lookup", "client")), "{tools:?}");
    assert!(tools.iter().any(|(_, s)| *s == "mcp"), "{tools:?}");
    // The framing is the JSON around the texts, not a hiding place for them.
    assert!(
        n(&report["framing"]) * 4 < sent.bytes,
        "{kind:?}: framing {} of {}",
        n(&report["framing"]),
        sent.bytes
    );
    assert!(
        report["markers"]
            .as_array()
            .expect("markers")
            .iter()
            .any(|m| m["key"] == "00112233445566aa" && m["part"] == "toolResults/lookup"),
        "{kind:?}: {}",
        report["markers"]
    );
    assert_eq!(report["headroom"]["state"], "normal");
    assert_eq!(report["window"]["contextWindow"], 200_000);
    assert!(report["uncompactableFloor"]["bytes"].as_u64() > Some(0));
    assert_eq!(report["compactsFirst"], Value::Null);
    // Credentials never show.
    let headers = report["headers"].to_string();
    assert!(!headers.contains("sk-sim"), "{headers}");
    assert!(headers.contains("[redacted]"), "{headers}");
}

#[tokio::test]
async fn openai_chat_breakdown_sums_to_the_request_received() {
    inspect_then_send(ProviderKind::OpenaiCompatible).await;
}

#[tokio::test]
async fn openai_responses_breakdown_sums_to_the_request_received() {
    inspect_then_send(ProviderKind::OpenaiResponses).await;
}

#[tokio::test]
async fn anthropic_breakdown_sums_to_the_request_received() {
    inspect_then_send(ProviderKind::Anthropic).await;
}

#[tokio::test]
async fn gemini_breakdown_sums_to_the_request_received() {
    inspect_then_send(ProviderKind::Gemini).await;
}

#[tokio::test]
async fn bedrock_breakdown_sums_to_the_request_received() {
    inspect_then_send(ProviderKind::Bedrock).await;
}

#[tokio::test]
async fn bad_queries_are_refused_and_the_route_needs_the_token() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let built = build_session(
        &config_yaml("ctx-bad", &format!("{}/v1", sim.url()), 200_000, ""),
        &storage_env(dir.path(), None),
        "a",
    )
    .await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    let (status, body) = context(&api, "view=everything").await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, _) = context(&api, "stream=maybe").await;
    assert_eq!(status, 400);
    let r = api
        .http
        .get(format!("{}/v1/session/context", api.base))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401);
    // An empty session still has a next request: the system prompt and the tools.
    let (status, body) = context(&api, "").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert!(v["systemPrompt"]["bytes"].as_u64() > Some(0), "{v:#}");
    assert!(sim.requests().is_empty(), "inspection sends nothing");
}
