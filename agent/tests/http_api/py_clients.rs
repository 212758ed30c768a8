//! Official agent-framework clients drive a served session, executing their own tools:
//! the OpenAI Python SDK's `chat.completions.create` (streamed and not) and LangChain's
//! `ChatOpenAI`, both resending the whole conversation each call, and the OpenAI Agents SDK
//! running a tool-using agent for more than 30 model calls past the context window, in
//! replay mode and in `previous_response_id` mode. cairn-sim scripts the model's tool calls.
//! The clients come pinned from PyPI (`tests/harness/install-py-clients.sh`).

use cairn_agent::server::AppState;
use cairn_sim::{ScriptedReply, Sim};
use cairn_tests::harness::python::{self, line};
use serde_json::json;

use crate::support::agent::*;

async fn run_python(script: &'static str, base: String, extra: Vec<(String, String)>) -> String {
    let mut env = vec![
        ("BASE".to_owned(), base),
        ("TOKEN".to_owned(), TOKEN.to_owned()),
    ];
    env.extend(extra);
    tokio::task::spawn_blocking(move || python::run(script, &env))
        .await
        .expect("join")
}

const CHAT: &str = r#"
import json, os
from openai import OpenAI

client = OpenAI(base_url=os.environ["BASE"] + "/v1", api_key=os.environ["TOKEN"])
tools = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
messages = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is in a.txt? (question one)"}]

r = client.chat.completions.create(model="m-1", messages=messages, tools=tools)
choice = r.choices[0]
print("FINISH1=" + choice.finish_reason)
messages.append(choice.message.model_dump(exclude_none=True))
for tc in choice.message.tool_calls:
    print("CALL1=" + tc.function.name + " " + tc.function.arguments)
    messages.append({"role": "tool", "tool_call_id": tc.id, "content": "CONTENTS-OF-A " * 20})

r = client.chat.completions.create(model="m-1", messages=messages, tools=tools)
print("ANSWER1=" + r.choices[0].message.content)
messages.append({"role": "assistant", "content": r.choices[0].message.content})
messages.append({"role": "user", "content": "And b.txt? (question two)"})

calls = {}
finish = None
usage = None
for chunk in client.chat.completions.create(model="m-1", messages=messages, tools=tools,
                                            stream=True, stream_options={"include_usage": True}):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        for d in c.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id: entry["id"] = d.id
            if d.function and d.function.name: entry["name"] += d.function.name
            if d.function and d.function.arguments: entry["arguments"] += d.function.arguments
        if c.finish_reason: finish = c.finish_reason
print("FINISH2=" + str(finish))
print("USAGE2=" + str(usage is not None and usage.prompt_tokens > 0))
tool_calls = [{"id": v["id"], "type": "function", "function": {"name": v["name"], "arguments": v["arguments"]}}
              for _, v in sorted(calls.items())]
print("CALL2=" + " ".join(t["function"]["name"] + " " + t["function"]["arguments"] for t in tool_calls))
messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
for t in tool_calls:
    messages.append({"role": "tool", "tool_call_id": t["id"], "content": "CONTENTS-OF-B " * 20})

text = ""
for chunk in client.chat.completions.create(model="m-1", messages=messages, tools=tools, stream=True):
    for c in chunk.choices:
        text += c.delta.content or ""
print("ANSWER2=" + text)

# A conversation that contradicts the session is refused and changes nothing.
try:
    client.chat.completions.create(model="m-1", messages=[{"role": "user", "content": "another story"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}])
    print("DIVERGED=accepted")
except Exception as e:
    print("DIVERGED=" + str(getattr(e, "status_code", "")) + " " + str(e.body.get("code") if isinstance(getattr(e, "body", None), dict) else e))

# LangChain's ChatOpenAI, resending its message list (arguments re-serialized by LangChain).
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

@tool
def search(query: str) -> str:
    """Search the code base."""
    return "MATCHES-FOR-" + query

history = [SystemMessage(content="You are terse."), HumanMessage(content="What is in a.txt? (question one)")]
# LangChain keeps its own copy of the conversation: the one the OpenAI SDK built above.
from langchain_core.messages import AIMessage
history.append(AIMessage(content="", tool_calls=[{"id": messages[2]["tool_calls"][0]["id"], "name": "read_file", "args": json.loads(messages[2]["tool_calls"][0]["function"]["arguments"])}]))
history.append(ToolMessage(content="CONTENTS-OF-A " * 20, tool_call_id=messages[2]["tool_calls"][0]["id"]))
history.append(AIMessage(content=messages[4]["content"]))
history.append(HumanMessage(content="And b.txt? (question two)"))
history.append(AIMessage(content="", tool_calls=[{"id": tool_calls[0]["id"], "name": "read_file", "args": json.loads(tool_calls[0]["function"]["arguments"])}]))
history.append(ToolMessage(content="CONTENTS-OF-B " * 20, tool_call_id=tool_calls[0]["id"]))
history.append(AIMessage(content=text))
history.append(HumanMessage(content="Search for main (question three)"))

llm = ChatOpenAI(model="m-1", base_url=os.environ["BASE"] + "/v1", api_key=os.environ["TOKEN"], max_retries=0)
bound = llm.bind_tools([search])
ai = bound.invoke(history)
print("LC_CALL=" + ai.tool_calls[0]["name"] + " " + json.dumps(ai.tool_calls[0]["args"]))
history.append(ai)
for tc in ai.tool_calls:
    history.append(ToolMessage(content=search.invoke(tc["args"]), tool_call_id=tc["id"]))
final = bound.invoke(history)
print("LC_ANSWER=" + final.content)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_and_langchain_drive_a_session_through_chat_completions_in_replay_mode() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let built = build_session(
        &config_yaml("chat", &format!("{}/v1", sim.url()), 200_000, ""),
        &env,
        "t",
    )
    .await;
    let base = serve(AppState::new(built.session, TOKEN)).await;

    sim.push_reply(ScriptedReply::tool_call(
        "read_file",
        json!({"path": "a.txt"}),
    ));
    sim.push_reply(ScriptedReply::text("a.txt holds CONTENTS-OF-A."));
    sim.push_reply(ScriptedReply::tool_call(
        "read_file",
        json!({"path": "b.txt"}),
    ));
    sim.push_reply(ScriptedReply::text("b.txt holds CONTENTS-OF-B."));
    sim.push_reply(ScriptedReply::tool_call("search", json!({"query": "main"})));
    sim.push_reply(ScriptedReply::text("main is in src/main.rs."));

    let out = run_python(CHAT, base.clone(), vec![]).await;
    assert_eq!(line(&out, "FINISH1"), "tool_calls");
    assert_eq!(line(&out, "CALL1"), r#"read_file {"path":"a.txt"}"#);
    assert_eq!(line(&out, "ANSWER1"), "a.txt holds CONTENTS-OF-A.");
    assert_eq!(line(&out, "FINISH2"), "tool_calls");
    assert_eq!(line(&out, "USAGE2"), "True");
    assert_eq!(line(&out, "CALL2"), r#"read_file {"path":"b.txt"}"#);
    assert_eq!(line(&out, "ANSWER2"), "b.txt holds CONTENTS-OF-B.");
    assert!(
        line(&out, "DIVERGED").starts_with("409"),
        "{}",
        line(&out, "DIVERGED")
    );
    assert_eq!(line(&out, "LC_CALL"), r#"search {"query": "main"}"#);
    assert_eq!(line(&out, "LC_ANSWER"), "main is in src/main.rs.");

    // Six model calls, one per client call: the refused request reached no provider. Each
    // request carries every item of the conversation exactly once, although every client
    // resent the whole conversation each time.
    let reqs = sim.requests();
    assert_eq!(reqs.len(), 6);
    let last = &reqs[5].body;
    for (needle, times) in [
        ("(question one)", 1),
        ("(question two)", 1),
        ("(question three)", 1),
        ("MATCHES-FOR-main", 1),
        ("You are terse.", 1),
        ("a.txt holds CONTENTS-OF-A.", 1),
    ] {
        assert_eq!(last.matches(needle).count(), times, "{needle} in {last}");
    }
    assert_eq!(last.matches(&"CONTENTS-OF-A ".repeat(20)).count(), 1);
    assert!(!last.contains("another story"));
}

const AGENT: &str = r#"
import asyncio, json, os
import httpx
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

set_tracing_disabled(True)
OUT = os.environ["OUT"]
state = {"n": 0}

def record(text):
    state["n"] += 1
    text = f"OUT-{state['n']:03}\n" + text
    with open(os.path.join(OUT, f"{state['n']:03}.txt"), "w") as f:
        f.write(text)
    return text

LINES = [f"{i:05} fn item_{i}() {{ let value = {i} * 7; println!(\"{{}}\", value); }}" for i in range(4000)]

@function_tool
def read_file(path: str, start: int, end: int) -> str:
    """Read lines start..end (inclusive) of a file."""
    return record(f"{path} lines {start}-{end}\n" + "\n".join(LINES[start:end + 1]))

@function_tool
def run_command(command: str) -> str:
    """Run a shell command and return its output."""
    log = "\n".join(f"[{i:05}] {command}: compiling crate-{i % 37} v0.{i % 5}.0 ... ok" for i in range(500))
    return record(f"$ {command}\n{log}\nerror: test failed at step 499")

@function_tool
def search(query: str) -> str:
    """Search the code base for a pattern."""
    return record("\n".join(f"src/lib.rs:{i}: {LINES[i]}" for i in range(0, 4000, 97) if query in LINES[i] or i % 3 == 0))

async def main():
    sent = {"previous": 0, "items": 0}
    async def count(request):
        body = json.loads(request.content or b"{}")
        sent["previous"] += 1 if body.get("previous_response_id") else 0
        sent["items"] += len(body.get("input") or [])
    client = AsyncOpenAI(base_url=os.environ["BASE"] + "/v1", api_key=os.environ["TOKEN"], max_retries=0,
                         http_client=httpx.AsyncClient(event_hooks={"request": [count]}, timeout=120))
    agent = Agent(name="coder", instructions="You are a careful coding agent.",
                  model=OpenAIResponsesModel(model="m-1", openai_client=client),
                  tools=[read_file, run_command, search])
    question = "Find out why the tests fail (MISSION-START)."
    if os.environ["MODE"] == "replay":
        result = await Runner.run(agent, question, max_turns=100)
    else:
        result = Runner.run_streamed(agent, question, max_turns=100, auto_previous_response_id=True)
        async for _ in result.stream_events():
            pass
    print("FINAL=" + str(result.final_output))
    print("CALLS=" + str(state["n"]))
    print("PREVIOUS=" + str(sent["previous"]))
    print("ITEMS=" + str(sent["items"]))

asyncio.run(main())
"#;

/// The model calls of the agent run: reads (some of them re-reading a range), long command
/// logs and searches, then the answer.
fn script_agent(sim: &Sim) -> usize {
    let mut calls = 0;
    for i in 0..33u64 {
        let reply = match i % 4 {
            0 => ScriptedReply::tool_call(
                "read_file",
                json!({"path": "src/lib.rs", "start": i * 60, "end": i * 60 + 199}),
            ),
            // The same lines again: the earlier read is superseded.
            1 => ScriptedReply::tool_call(
                "read_file",
                json!({"path": "src/lib.rs", "start": (i - 1) * 60, "end": (i - 1) * 60 + 199}),
            ),
            2 => ScriptedReply::tool_call(
                "run_command",
                json!({"command": format!("cargo test -p crate{i}")}),
            ),
            _ => ScriptedReply::tool_call("search", json!({"query": format!("item_{i}")})),
        };
        sim.push_reply(reply);
        calls += 1;
    }
    sim.push_reply(ScriptedReply::text(
        "The tests fail at step 499 (MISSION-DONE).",
    ));
    calls
}

async fn agent_run(mode: &str) {
    let sim = Sim::start().await.expect("sim");
    let window = 40_000;
    sim.set_window(MODEL, window);
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("outputs");
    std::fs::create_dir_all(&out_dir).expect("outputs dir");
    let env = storage_env(dir.path(), None);
    let built = build_session(
        &config_yaml(
            &format!("agents-{mode}"),
            &format!("{}/v1", sim.url()),
            window,
            "compaction: {summarizer: {enabled: false}, toolResults: {perResultChars: 12000}}\n",
        ),
        &env,
        "t",
    )
    .await;
    let state = AppState::new(built.session, TOKEN);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = cairn_agent::server::router(state, 16 * 1024 * 1024);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let calls = script_agent(&sim);

    let out = run_python(
        AGENT,
        base.clone(),
        vec![
            ("OUT".into(), out_dir.display().to_string()),
            ("MODE".into(), mode.into()),
        ],
    )
    .await;
    assert_eq!(
        line(&out, "FINAL"),
        "The tests fail at step 499 (MISSION-DONE)."
    );
    assert_eq!(line(&out, "CALLS"), calls.to_string());

    // Replay mode resends the whole conversation every call; the other mode names the
    // previous response and sends only the new items.
    let previous: usize = line(&out, "PREVIOUS").parse().expect("count");
    let items: usize = line(&out, "ITEMS").parse().expect("count");
    if mode == "replay" {
        assert_eq!(previous, 0);
        assert!(items > calls * calls, "{items} items sent");
    } else {
        assert_eq!(
            previous, calls,
            "every call but the first names its predecessor"
        );
        assert!(items <= 3 * (calls + 1), "{items} items sent");
    }
    let api = Api::new(base);
    let session = api.session().await;
    eprintln!(
        "{mode}: {} model calls, {items} items sent, passes {}, {} compactions, {} bytes of history",
        calls + 1,
        session["stats"]["passes"],
        session["stats"]["compactions"],
        session["stats"]["historyBytes"]
    );
    let passes = &session["stats"]["passes"];
    for pass in ["microcompacted", "deduplicated", "toolResultsCut"] {
        assert!(passes[pass].as_u64().unwrap_or(0) > 0, "{pass}: {session}");
    }
    let reqs = sim.requests();
    assert_eq!(reqs.len(), calls + 1, "one model call per agent turn");
    // Well past the window: the tool outputs add up to several windows, every request stayed
    // within it.
    let outputs: Vec<String> = (1..=calls)
        .map(|n| std::fs::read_to_string(out_dir.join(format!("{n:03}.txt"))).expect("output"))
        .collect();
    let total: usize = outputs.iter().map(String::len).sum();
    assert!(
        total as u64 > 3 * window * 4,
        "{total} bytes of tool output"
    );
    assert!(
        reqs.iter().all(|r| r.outcome == "ok"),
        "a request overflowed"
    );
    // No item twice in any request, the question once in each.
    for r in &reqs {
        assert_eq!(r.body.matches("MISSION-START").count(), 1, "seq {}", r.seq);
        for n in 1..=calls {
            let tag = format!("OUT-{n:03}");
            assert!(
                r.body.matches(&tag).count() <= 1,
                "{tag} twice in request {}",
                r.seq
            );
        }
    }
    // A tool output archived along the way comes back byte for byte.
    let last = &reqs.last().expect("requests").body;
    let mut recalled = 0;
    for m in last.match_indices("<<ccr:") {
        let key = &last[m.0 + 6..(m.0 + 22).min(last.len())];
        if key.len() < 16 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue; // the recall tool's own description names the marker form
        }
        let (s, body) = api.get(&format!("/v1/recall/{key}")).await;
        assert_eq!(s, 200);
        if outputs.iter().any(|o| o.as_bytes() == body.as_slice()) {
            recalled += 1;
        }
    }
    assert!(
        recalled > 0,
        "no archived tool output among the markers of the last request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_agents_sdk_runs_a_tool_agent_past_the_window_in_replay_mode() {
    agent_run("replay").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_agents_sdk_runs_a_tool_agent_past_the_window_with_previous_response_id() {
    agent_run("previous").await;
}
