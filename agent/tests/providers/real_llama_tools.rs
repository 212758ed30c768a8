//! Real tool calls from a real model server: llama.cpp's `llama-server` with SmolLM2-135M and
//! the tool-calling chat template (`tests/harness/smollm2-tools.jinja`, see
//! docs/llama-tool-calls.md), through each provider client that speaks one of its APIs
//! (Chat Completions, Responses, Messages), streamed and not.
//!
//! What the model writes varies: the tests assert the shape of a call (a name among the
//! tools, arguments that are a JSON object with the required key, an id echoed back), never
//! its values.

use cairn_agent::history::{Message, ToolCall};
use cairn_agent::provider::{
    ChatRequest, ChatResponse, ClientOptions, Controls, Credentials, Provider, RetryPolicy,
    StopReason, ToolChoice, ToolSpec, build,
};
use cairn_crds::{ProviderKind, ProviderSpec};
use cairn_tests::harness::LlamaServer;
use serde_json::{Value, json};

use super::real_llama::model_slot;

/// The three API families llama-server speaks.
const KINDS: [ProviderKind; 3] = [
    ProviderKind::OpenaiCompatible,
    ProviderKind::OpenaiResponses,
    ProviderKind::Anthropic,
];

const FILES: [&str; 6] = [
    "src/main.rs",
    "README.md",
    "Cargo.toml",
    "notes.txt",
    "logs/app.log",
    "Makefile",
];

fn client(server: &LlamaServer, kind: ProviderKind) -> Box<dyn Provider> {
    let spec = ProviderSpec {
        kind,
        model: "smollm2-135m-instruct".into(),
        base_url: Some(format!("{}/v1", server.url)),
        credentials: None,
        region: None,
        ca_bundle: None,
    };
    let options = ClientOptions {
        retry: RetryPolicy::none(),
        ..ClientOptions::default()
    };
    // llama-server wants no key; the Responses and Anthropic clients insist on one.
    build(&spec, Credentials::api_key("sk-none"), options)
        .unwrap_or_else(|e| panic!("{kind:?}: {e}"))
}

/// Two tools, each string bounded (`maxLength`: the grammar then bounds the call).
fn tools() -> Vec<ToolSpec> {
    let path = json!({"type": "object",
        "properties": {"path": {"type": "string", "maxLength": 64}}, "required": ["path"]});
    vec![
        ToolSpec {
            name: "read_file".into(),
            description: "Read a text file and return its contents.".into(),
            parameters: path.clone(),
        },
        ToolSpec {
            name: "list_dir".into(),
            description: "List the entries of a directory.".into(),
            parameters: path,
        },
    ]
}

fn request(messages: Vec<Message>, stream: bool, choice: ToolChoice) -> ChatRequest {
    ChatRequest {
        model: "smollm2-135m-instruct".into(),
        messages,
        tools: tools(),
        // Room for the longest call the schema allows (docs/llama-tool-calls.md).
        max_output_tokens: 128,
        stream,
        controls: Controls {
            tool_choice: choice,
            parallel_tool_calls: Some(false),
            ..Controls::default()
        },
        context: None,
    }
}

/// The one call of a reply, checked for shape: a name among the tools, a non-empty id, and
/// arguments that are a JSON object with a string `path` (the schema's required key).
fn the_call(what: &str, r: &ChatResponse) -> ToolCall {
    let calls = r.tool_calls();
    assert_eq!(calls.len(), 1, "{what}: one call: {:?}", r.message);
    let call = calls[0].clone();
    assert!(
        tools().iter().any(|t| t.name == call.name),
        "{what}: a tool of the request: {call:?}"
    );
    assert!(
        !call.id.trim().is_empty(),
        "{what}: the server's id: {call:?}"
    );
    let args: Value = serde_json::from_str(&call.arguments)
        .unwrap_or_else(|e| panic!("{what}: arguments are JSON ({e}): {call:?}"));
    assert!(
        args["path"].as_str().is_some_and(|p| p.len() <= 64),
        "{what}: the schema holds: {args}"
    );
    assert!(
        r.message.content.trim().is_empty(),
        "{what}: nothing but the call: {:?}",
        r.message.content
    );
    assert_eq!(r.stop, StopReason::ToolUse, "{what}: {:?}", r.message);
    assert!(r.usage.output_tokens > 0, "{what}: {:?}", r.usage);
    call
}

/// `tool_choice: required` gets one parsed call from each API, streamed (argument deltas
/// assembled) and not; the call and its result then go back in the server's own ids and the
/// server takes them: the next reply is another call (Messages, which cannot say "none" to
/// llama-server) or text (`tool_choice: none`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_api_returns_a_parsed_tool_call_streamed_or_not() {
    let _slot = model_slot().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = LlamaServer::start_with_tools(dir.path(), 2_048).expect("llama-server");
    let mut n = 0;
    for kind in KINDS {
        let p = client(&server, kind);
        for stream in [false, true] {
            for round in 0..3 {
                n += 1;
                let file = FILES[n % FILES.len()];
                let what = format!("{kind:?} stream={stream} #{round}");
                let ask = vec![
                    Message::system("You are a helpful assistant with file tools."),
                    Message::user(format!("Read the file {file} and tell me what it says.")),
                ];
                let r = p
                    .send(&request(ask.clone(), stream, ToolChoice::Required))
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let call = the_call(&what, &r);
                if round > 0 {
                    continue;
                }
                // The round trip: the call as the server sent it, and a result for its id.
                let mut history = ask;
                history.push(r.message.clone());
                let mut result = Message::tool(call.id.clone(), "The meeting is on Tuesday at 10.");
                result.name = Some(call.name.clone());
                history.push(result);
                let next = if kind == ProviderKind::Anthropic {
                    ToolChoice::Required
                } else {
                    ToolChoice::None
                };
                let again = p
                    .send(&request(history, stream, next.clone()))
                    .await
                    .unwrap_or_else(|e| panic!("{what}, after the result: {e}"));
                if next == ToolChoice::None {
                    assert!(again.tool_calls().is_empty(), "{what}: {:?}", again.message);
                    assert!(
                        !again.message.content.trim().is_empty(),
                        "{what}: a text answer after the result: {:?}",
                        again.message
                    );
                } else {
                    the_call(&format!("{what}, after the result"), &again);
                }
            }
        }
    }
}

/// A call the output limit cut off (a string without `maxLength`, like the filesystem
/// server's `path`) comes back as the model wrote it, not JSON, with the stop reason
/// `MaxTokens` (Responses: "completed", as llama-server reports it); sent back in the history
/// with a result for it, the server takes the request (llama-server parses every call's
/// arguments in the history and refuses the whole request when one does not parse). On the
/// APIs that carry arguments as a string; on Messages the server itself makes a cut call's
/// input `{}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_by_the_output_limit_goes_back_and_the_server_takes_it() {
    let _slot = model_slot().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = LlamaServer::start_with_tools(dir.path(), 2_048).expect("llama-server");
    let unbounded = vec![ToolSpec {
        name: "read_text_file".into(),
        description: "Read a text file and return its contents.".into(),
        parameters: json!({"type": "object",
            "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    }];
    for kind in [
        ProviderKind::OpenaiCompatible,
        ProviderKind::OpenaiResponses,
    ] {
        let p = client(&server, kind);
        for stream in [false, true] {
            let what = format!("{kind:?} stream={stream}");
            let ask = vec![
                Message::system("You are a helpful assistant with file tools."),
                Message::user("Read the file logs/app.log and tell me what it says."),
            ];
            let mut cut = None;
            for limit in [10, 12, 14, 16, 18] {
                let mut req = request(ask.clone(), stream, ToolChoice::Required);
                req.tools = unbounded.clone();
                req.max_output_tokens = limit;
                let r = p.send(&req).await.unwrap_or_else(|e| panic!("{what}: {e}"));
                let unparsed = r.tool_calls().iter().any(|c| {
                    serde_json::from_str::<Value>(&c.arguments).map_or(true, |v| !v.is_object())
                });
                // llama-server's Responses reply says "completed" even when the limit cut it.
                if unparsed {
                    if kind != ProviderKind::OpenaiResponses {
                        assert_eq!(r.stop, StopReason::MaxTokens, "{what}: {:?}", r.message);
                    }
                    cut = Some(r);
                    break;
                }
            }
            let cut = cut.unwrap_or_else(|| panic!("{what}: no limit cut a call"));
            let call = cut.tool_calls()[0].clone();
            let mut history = ask;
            history.push(cut.message.clone());
            let mut result = Message::tool(call.id.clone(), "error: the call was cut off");
            result.name = Some(call.name.clone());
            history.push(result);
            let mut req = request(history, stream, ToolChoice::Required);
            req.tools = unbounded.clone();
            let again = p.send(&req).await.unwrap_or_else(|e| {
                panic!("{what}: the history with the cut call {call:?} was refused: {e}")
            });
            assert!(
                !again.tool_calls().is_empty() || !again.message.content.is_empty(),
                "{what}: {:?}",
                again.message
            );
        }
    }
}

/// A model that answers in prose when a call was required (the model's own template gives
/// llama.cpp no call syntax, so nothing forces a call): every client returns the text as
/// the answer, with no call and no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_answer_to_a_required_tool_call_is_a_plain_answer() {
    let _slot = model_slot().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = LlamaServer::start(dir.path(), 2_048).expect("llama-server");
    for kind in KINDS {
        let p = client(&server, kind);
        for stream in [false, true] {
            let what = format!("{kind:?} stream={stream}");
            let mut req = request(
                vec![Message::user(
                    "Read the file notes.txt and tell me what it says.",
                )],
                stream,
                ToolChoice::Required,
            );
            req.max_output_tokens = 48;
            let r = p.send(&req).await.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(r.tool_calls().is_empty(), "{what}: {:?}", r.message);
            assert!(
                !r.message.content.trim().is_empty(),
                "{what}: {:?}",
                r.message
            );
            assert!(
                matches!(r.stop, StopReason::End | StopReason::MaxTokens),
                "{what}: {:?}",
                r.stop
            );
        }
    }
}

use crate::support::mcp_node_modules as node_modules;

/// Files for the model to read: logs as a service writes them and pieces of this
/// repository's own code, each small enough for one read to fit the 2,048-token window
/// (SmolLM2 counts 1.6–1.8 bytes per token) and together far more than it.
fn workspace(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for i in 0..4 {
        let log: String = (0..14)
            .map(|n| {
                let status = if (n + i) % 5 == 0 { 503 } else { 200 };
                format!(
                    "2026-11-30T08:{:02}:{:02}Z INFO svc-{i} request_id={:08x} path=/v1/items/{} status={status} latency_ms={}\n",
                    (i * 7 + n) % 60,
                    (n * 13) % 60,
                    i * 977 + n,
                    n * 7,
                    (n * 37 + i) % 311
                )
            })
            .collect();
        files.push((format!("svc-{i}.log"), log.into_bytes()));
    }
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (name, source) in [
        ("controls.rs", "engine/src/provider/mod.rs"),
        ("deadline.rs", "agent/src/provider/deadline.rs"),
        ("Makefile", "Makefile"),
        ("sse.rs", "agent/src/provider/sse.rs"),
    ] {
        let text = std::fs::read_to_string(repo.join(source)).expect(source);
        // Whole lines, about 1 KB.
        let mut piece = String::new();
        for line in text.lines() {
            if piece.len() + line.len() > 1_100 {
                break;
            }
            piece.push_str(line);
            piece.push('\n');
        }
        files.push((name.to_string(), piece.into_bytes()));
    }
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes).expect("file");
    }
    files
}

fn metric(text: &str, name: &str, labels: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The client of the tool loop: the OpenAI Agents SDK with one function tool of its own,
/// `read_log`, whose parameter is an enum of the folder's file names (the grammar llama-server
/// builds from the schema then makes every call name a real file). Each turn names the tool
/// to call; every `MCP_EVERY`th turn asks for the filesystem server's `read_text_file`
/// instead (run by the session). `tool_use_behavior="stop_on_first_tool"`: a turn is one
/// model call with `tool_choice` required, and its function output reaches the session with
/// the next turn's input (the whole conversation again, as the SDK replays it). Odd turns
/// stream. A turn prints one `TURN {json}` line.
const TOOL_LOOP: &str = r#"
import asyncio, json, os
from typing import Literal
import httpx, openai
from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.exceptions import ModelBehaviorError
from agents.models.openai_responses import OpenAIResponsesModel

set_tracing_disabled(True)
ROOT = os.environ["ROOT"]
NAMES = sorted(os.listdir(ROOT))
runs = {"n": 0}

@function_tool
def read_log(name: Literal[tuple(NAMES)]) -> str:
    """Read one file of the service's folder and return its contents."""
    runs["n"] += 1
    with open(os.path.join(ROOT, name)) as f:
        return f.read()

async def main():
    client = AsyncOpenAI(base_url=os.environ["BASE"] + "/v1", api_key=os.environ["TOKEN"],
                         max_retries=0, http_client=httpx.AsyncClient(timeout=600))
    agent = Agent(name="ops", instructions="You read files with tools.",
                  model=OpenAIResponsesModel(model="smollm2-135m-instruct", openai_client=client),
                  tools=[read_log], tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required"))
    every = int(os.environ["MCP_EVERY"])
    items = []
    for turn in range(int(os.environ["TURNS"])):
        name = NAMES[turn % len(NAMES)]
        tool = "read_text_file" if turn % every == every - 1 else "read_log"
        inp = items + [{"role": "user", "content": f"Call {tool} to read {name}."}]
        stream = turn % 2 == 1
        out = {"turn": turn, "stream": stream, "asked": tool}
        try:
            if stream:
                result = Runner.run_streamed(agent, inp, max_turns=3)
                async for _ in result.stream_events():
                    pass
            else:
                result = await Runner.run(agent, inp, max_turns=3)
            items = result.to_input_list()
            out["status"] = 200
            out["calls"] = [i.raw_item.name for i in result.new_items if i.type == "tool_call_item"]
        except ModelBehaviorError as e:
            # The session answered 200 with an incomplete response (the reply ran into the
            # output limit); the session keeps the turn, the client keeps its question.
            items = inp
            out["status"] = 200
            out["incomplete"] = str(e)[:200]
        except openai.APIStatusError as e:
            items = inp
            out["status"] = e.status_code
            out["error"] = str(e)[:300]
        print("TURN " + json.dumps(out), flush=True)
    print("RUNS=" + str(runs["n"]))

from openai import AsyncOpenAI
asyncio.run(main())
"#;

/// How many turns each API's tool loop runs (`CAIRN_LLAMA_TOOL_LOOP_TURNS` overrides).
fn loop_turns() -> usize {
    std::env::var("CAIRN_LLAMA_TOOL_LOOP_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

/// The 30-turn tool loop on the real model, once per API cairn speaks to llama-server with
/// (Chat Completions and Responses; the client's turns alternate streamed and not): a served
/// session on the 2,048-token server with the default compaction policy, the session memory
/// on and a dedicated 8,192-token summarizer endpoint, the filesystem MCP server over stdio,
/// and the Agents SDK running its own function tool. Every turn answers 200, every call is
/// run and counted (status and metrics agree with the client's own count), archived reads
/// come back byte for byte from the archive, no rejected request is resent unchanged, the
/// window holds after its first overflow, and the session memory's and level 2's outcomes on
/// the real model are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_sdk_tool_loop_runs_thirty_turns_on_the_real_model() {
    use cairn_agent::ccr::Key;
    use cairn_tests::harness::{RecordingProxy, python};

    use super::real_llama::{assert_no_unchanged_resend, calls};
    use crate::support::agent::*;

    let _slot = model_slot().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = LlamaServer::start_with_tools(dir.path(), 2_048).expect("llama-server");
    let summarizer = LlamaServer::start(dir.path(), 8_192).expect("summarizer llama-server");
    let root = tempfile::tempdir().expect("files");
    let root_dir = root.path().canonicalize().expect("root");
    let files = workspace(&root_dir);
    let turns = loop_turns();
    let mut report = Vec::new();
    for kind in ["openai-compatible", "openai-responses"] {
        let proxy = RecordingProxy::start(&server.url).await.expect("proxy");
        let data = dir.path().join(kind);
        std::fs::create_dir_all(&data).expect("dir");
        let cfg = data.join("session.yaml");
        std::fs::write(
            &cfg,
            format!(
                "name: llama-loop\nnamespace: tests\nprovider:\n  kind: {kind}\n  model: smollm2-135m-instruct\n  baseUrl: {}/v1\nmaxOutputTokens: 256\nsystemPrompt: You are a concise assistant with file tools.\ncompaction:\n  memory: {{enabled: true, everyTurns: 4}}\n  summarizer:\n    provider: openai-compatible\n    model: smollm2-135m-instruct\n    baseUrl: {}/v1\n    contextWindow: 8192\ntools:\n  mcpServers:\n  - name: fs\n    command: sh\n    args: [-c, 'cd \"$0\" && exec \"$1\" \"$0\"', {}, {}]\n    allowedTools: [read_text_file]\n",
                proxy.url,
                summarizer.url,
                root_dir.display(),
                node_modules().join(".bin/mcp-server-filesystem").display(),
            ),
        )
        .expect("config");
        let mut env = storage_env(&data, None);
        env.push(("CAIRN_SUMMARIZER_API_KEY".into(), "sk-none".into()));
        let agent = AgentProcess::start(&cfg, &env, &data.join("agent.log"));
        let started = std::time::Instant::now();
        let out = {
            let env = vec![
                ("BASE".to_owned(), agent.url.clone()),
                ("TOKEN".to_owned(), TOKEN.to_owned()),
                ("ROOT".to_owned(), root_dir.display().to_string()),
                ("TURNS".to_owned(), turns.to_string()),
                ("MCP_EVERY".to_owned(), "10".to_owned()),
            ];
            tokio::task::spawn_blocking(move || python::run(TOOL_LOOP, &env))
                .await
                .expect("join")
        };
        let elapsed = started.elapsed();
        let turn_lines: Vec<serde_json::Value> = out
            .lines()
            .filter_map(|l| l.strip_prefix("TURN "))
            .map(|l| serde_json::from_str(l).expect("turn json"))
            .collect();
        let log_tail = || {
            let log = agent.log();
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        };
        assert_eq!(turn_lines.len(), turns, "{kind}: {out}");
        for t in &turn_lines {
            assert_eq!(
                t["status"],
                200,
                "{kind}: {t}\nagent log tail:\n{}",
                log_tail()
            );
        }
        let incomplete = turn_lines
            .iter()
            .filter(|t| t.get("incomplete").is_some())
            .count();
        assert!(
            incomplete * 5 <= turns,
            "{kind}: {incomplete} of {turns} turns ran into the output limit: {out}"
        );
        // The client's streamed turns went upstream streamed, the others not.
        let answered = calls(&proxy);
        let streamed = |r: &&cairn_tests::harness::llama::Recorded| {
            r.answer_head.starts_with("data:") || r.answer_head.starts_with("event:")
        };
        let ok = answered.iter().filter(|r| r.status == 200);
        let (up_streamed, up_plain) =
            ok.fold(
                (0, 0),
                |(s, p), r| {
                    if streamed(&r) { (s + 1, p) } else { (s, p + 1) }
                },
            );
        assert!(
            up_streamed > 0 && up_plain > 0,
            "{kind}: {up_streamed} streamed and {up_plain} plain model calls"
        );
        let runs: u64 = python::line(&out, "RUNS").parse().expect("runs");
        let api = Api {
            base: agent.url.clone(),
            http: reqwest::Client::new(),
        };
        let stats = api.session().await["stats"].clone();
        let metrics = String::from_utf8(api.get("/metrics").await.1).unwrap_or_default();
        // Every call the model made was run by whoever owns the tool, and counted.
        assert_eq!(
            stats["toolCalls"]["client"].as_u64(),
            Some(runs),
            "{kind}: the client ran every call the session handed back: {stats}"
        );
        assert_eq!(
            metric(&metrics, "cairn_agent_tool_calls_total", "tool=\"client\""),
            runs,
            "{kind}: {metrics}"
        );
        let mcp = stats["toolCalls"]["mcp"].as_u64().unwrap_or(0);
        assert_eq!(
            metric(&metrics, "cairn_agent_tool_calls_total", "tool=\"mcp\""),
            mcp
        );
        assert_eq!(
            metric(&metrics, "cairn_agent_mcp_calls_total", "server=\"fs\""),
            mcp,
            "{kind}: every MCP call has its outcome"
        );
        assert!(
            runs as usize * 2 >= turns,
            "{kind}: the model called the client's tool in {runs} of {turns} turns: {out}"
        );
        // Archived reads come back byte for byte.
        let mut recalled = Vec::new();
        for (name, bytes) in &files {
            let (status, body) = api
                .get(&format!("/v1/recall/{}", Key::of(bytes).as_str()))
                .await;
            if status == 200 {
                assert_eq!(&body, bytes, "{kind}: {name} recalled byte for byte");
                recalled.push(name.as_str());
            }
        }
        assert!(
            !recalled.is_empty(),
            "{kind}: no file read was archived whole: {stats}"
        );
        // The proxy saw every model call: none resent unchanged after a rejection, and after
        // the first overflow no turn needed more than one retry.
        let log = calls(&proxy);
        assert_no_unchanged_resend(&log);
        let rejected = log
            .iter()
            .filter(|r| (400..500).contains(&r.status))
            .count();
        assert!(
            rejected <= 3,
            "{kind}: {rejected} rejected requests: the window learned at the first overflow holds"
        );
        assert!(
            stats["effectiveContextWindow"].as_u64().unwrap_or(u64::MAX) <= 2_048,
            "{kind}: {stats}"
        );
        // The session memory's nine-section updates ran on the real model: accepted or
        // rejected, each counted in status and metrics.
        let memory = &stats["memory"];
        let attempts =
            memory["updates"].as_u64().unwrap_or(0) + memory["failures"].as_u64().unwrap_or(0);
        assert!(attempts >= 1, "{kind}: no memory update ran: {stats}");
        assert_eq!(
            metric(&metrics, "cairn_agent_memory_updates_total", ""),
            attempts,
            "{kind}: {metrics}"
        );
        let summaries = &stats["summaries"];
        for outcome in ["accepted", "rejected", "failed", "skipped"] {
            assert_eq!(
                metric(
                    &metrics,
                    "cairn_agent_summaries_total",
                    &format!("outcome=\"{outcome}\"")
                ),
                summaries[outcome].as_u64().unwrap_or(0),
                "{kind}: {outcome} summaries: {stats}"
            );
        }
        let line = format!(
            "{kind}: {turns} turns in {:.0}s, {} model calls ({} rejected), {runs} client calls, {mcp} mcp calls, {incomplete} incomplete, recalled {recalled:?}, memory {} ok / {} failed ({:?}), summaries {summaries}",
            elapsed.as_secs_f64(),
            log.len(),
            rejected,
            memory["updates"],
            memory["failures"],
            memory["lastError"]
                .as_str()
                .map(|e| e.chars().take(80).collect::<String>()),
        );
        eprintln!("tool loop: {line}");
        report.push(line);
    }
    for line in report {
        eprintln!("tool loop: {line}");
    }
}

/// The text of every message item of a Response object, joined.
fn answer_text(response: &serde_json::Value) -> String {
    response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(str::to_owned))
        .collect::<Vec<_>>()
        .join("")
}

/// The filesystem MCP server's whole catalog (14 tools, no `allowedTools`) on the
/// 2,048-token server with the tool-calling template, in a served session that assumes the
/// default window of 32,768 tokens: the system prompt and the catalog alone would fill the
/// window, so once the first rejection teaches the real window and ratio the catalog gives
/// way (descriptions shortened, tools deferred behind `tool_search`) and every turn answers
/// 200 with text, a turn that requires a tool call included. The context inspector then shows a catalog within its room and a request
/// that fits the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_filesystem_catalog_fits_a_2048_token_window_and_every_turn_answers() {
    use cairn_tests::harness::RecordingProxy;

    use super::real_llama::{assert_no_unchanged_resend, calls};
    use crate::support::agent::*;

    let _slot = model_slot().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = LlamaServer::start_with_tools(dir.path(), 2_048).expect("llama-server");
    let proxy = RecordingProxy::start(&server.url).await.expect("proxy");
    let root = tempfile::tempdir().expect("files");
    let root_dir = root.path().canonicalize().expect("root");
    workspace(&root_dir);
    let cfg = dir.path().join("session.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: llama-catalog\nnamespace: tests\nprovider:\n  kind: openai-compatible\n  model: smollm2-135m-instruct\n  baseUrl: {}/v1\nmaxOutputTokens: 128\nsystemPrompt: You are a concise assistant with file tools.\ncompaction:\n  summarizer: {{enabled: false}}\ntools:\n  mcpServers:\n  - name: fs\n    command: {}\n    args: [{}]\n",
            proxy.url,
            node_modules().join(".bin/mcp-server-filesystem").display(),
            root_dir.display(),
        ),
    )
    .expect("config");
    let agent = AgentProcess::start(
        &cfg,
        &storage_env(dir.path(), None),
        &dir.path().join("agent.log"),
    );
    let api = Api {
        base: agent.url.clone(),
        http: reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(600))
            .build()
            .expect("client"),
    };
    // With this template "auto" answers 500 to prose (docs/llama-tool-calls.md, Limits): the
    // text turns send "none"; the middle turn requires a call of whatever the offered
    // catalog holds, which the session runs before the turn's next call answers in text.
    let turns = [
        ("Say hello in one short sentence.", "none"),
        ("List the files of the folder with a tool.", "required"),
        ("What is the capital of France? Answer in one word.", "none"),
    ];
    let mut catalog_noticed = false;
    for (turn, (question, choice)) in turns.iter().enumerate() {
        let (status, body) = api
            .post(
                "/v1/responses",
                serde_json::json!({"model": MODEL, "input": question, "tool_choice": choice}),
            )
            .await;
        let log = agent.log();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        assert_eq!(
            status, 200,
            "turn {turn}: {body}\nagent log tail:\n{tail:?}"
        );
        assert!(
            !answer_text(&body).trim().is_empty(),
            "turn {turn}: an answer: {body}"
        );
        catalog_noticed |= body["cairn"]["notices"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|n| n["kind"] == "catalog");
    }
    let stats = api.session().await["stats"].clone();
    eprintln!("tool calls on the fitted catalog: {}", stats["toolCalls"]);
    assert!(catalog_noticed, "a turn said the catalog gave way");
    assert_no_unchanged_resend(&calls(&proxy));
    let (status, body) = api.get("/v1/session/context").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let report: serde_json::Value = serde_json::from_slice(&body).expect("report");
    let catalog = &report["catalog"];
    let count = |k: &str| catalog[k].as_array().map_or(0, Vec::len);
    assert!(
        count("deferred") + count("shortened") > 0
            && catalog["offeredBytes"].as_u64() <= catalog["roomBytes"].as_u64(),
        "{catalog}"
    );
    let window = report["window"]["effectiveContextWindow"]
        .as_u64()
        .unwrap_or(u64::MAX);
    assert!(window <= 2_048, "the learned window: {}", report["window"]);
    assert!(
        report["bodyTokens"].as_u64().unwrap_or(u64::MAX) < window,
        "the next request fits the window: {report}"
    );
    assert_ne!(report["headroom"]["state"], "blocking", "{report}");
    eprintln!(
        "catalog on the 2,048-token server: {catalog}; {} model calls",
        calls(&proxy).len()
    );
}
