//! MCP tool servers of a session against real servers nobody on the project wrote: the
//! reference `@modelcontextprotocol/server-filesystem` (stdio, reading real files) and
//! `@modelcontextprotocol/server-everything` (streamable HTTP) from npm, and a server written
//! with the official Python SDK (`tests/mcp/compact_server.py`) for `engine: mcp`. The model
//! is cairn-sim, scripted to call the tools. The servers are installed (pinned, cached) by
//! `tests/harness/install-mcp-servers.sh`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cairn_agent::ccr::{Key, extract_markers};
use cairn_agent::history::{Message, Role};
use cairn_agent::server::AppState;
use cairn_sim::proxies::{Mitm, Squid};
use cairn_sim::{ScriptedReply, Sim};
use serde_json::{Value, json};

use crate::support::agent::*;

struct Installed {
    node_modules: PathBuf,
    python: PathBuf,
}

fn installed() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/harness/install-mcp-servers.sh");
        let out = Command::new("bash")
            .arg(script)
            .stderr(Stdio::inherit())
            .output()
            .expect("run install-mcp-servers.sh");
        assert!(out.status.success(), "install-mcp-servers.sh failed");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("no {k} in {text}"))
        };
        Installed {
            node_modules: get("node_modules="),
            python: get("python="),
        }
    })
}

fn bin(name: &str) -> String {
    installed()
        .node_modules
        .join(".bin")
        .join(name)
        .display()
        .to_string()
}

fn free_port() -> u16 {
    cairn_tests::harness::proc::free_port().expect("free port")
}

/// A server process of the test, stopped when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "server on port {port} did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `child` once its port answers; it must still run then (a server that could not bind
/// exits, and the port may be another process's).
fn started(mut child: Child, port: u16) -> Proc {
    wait_for_port(port);
    let status = child.try_wait().expect("server status");
    assert!(
        status.is_none(),
        "the server on port {port} exited: {status:?}"
    );
    Proc(child)
}

/// `server-everything` in streamable-HTTP mode on a loopback port.
fn everything(port: u16) -> Proc {
    let child = Command::new(bin("mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start server-everything");
    started(child, port)
}

/// The Python SDK's compactor in `mode`, logging its calls to `log`.
fn compactor(port: u16, mode: &str, log: &Path) -> Proc {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mcp/compact_server.py");
    let child = Command::new(&installed().python)
        .arg(script)
        .arg(port.to_string())
        .args(["--mode", mode, "--log"])
        .arg(log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start compact_server.py");
    started(child, port)
}

async fn session(sim: &Sim, dir: &Path, name: &str, extra: &str) -> Built {
    let env = storage_env(dir, None);
    let yaml = config_yaml(name, &format!("{}/v1", sim.url()), 200_000, extra);
    build_session(&yaml, &env, "a").await
}

fn tool_results(h: &[Message]) -> Vec<&Message> {
    h.iter().filter(|m| m.role == Role::Tool).collect()
}

/// Whether the model was offered a tool named `name` in the last request (the tools of a
/// Chat Completions body).
fn offered(sim: &Sim, name: &str) -> bool {
    let Some(last) = sim.requests().pop() else {
        return false;
    };
    let body: Value = serde_json::from_str(&last.body).expect("request body");
    body["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_reads_over_stdio_are_deduplicated_microcompacted_and_recalled_byte_identical() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let files_dir = files.path().canonicalize().unwrap();
    let a: String = (0..400)
        .map(|i| format!("fn a_{i}() -> u32 {{ {i} }}\n"))
        .collect();
    let b: String = (0..300)
        .map(|i| format!("b line {i}: value = {}\n", i * 7))
        .collect();
    let a_path = files_dir.join("a.rs");
    let b_path = files_dir.join("b.txt");
    std::fs::write(&a_path, &a).unwrap();
    std::fs::write(&b_path, &b).unwrap();
    // Microcompact counts a result's age in assistant messages (two per turn here): at 4, a
    // read is superseded by the next turn's read before microcompact would truncate it, and
    // the one read of b.txt is truncated a few turns later. Compression on entry is off, so
    // the reads enter whole and the cheap passes are what acts on them. The age rule runs
    // regardless of the prompt-cache rebuild it causes (`cacheHorizonTurns: 0`).
    let extra = format!(
        "tools:\n  mcpServers:\n  - name: fs\n    command: {}\n    args: [{}]\ncompaction:\n  compression:\n    mode: \"off\"\n  microcompact:\n    truncateAfterTurns: 4\n    summarizeAfterTurns: 50\n    minContentChars: 1000\n    cacheHorizonTurns: 0\n",
        bin("mcp-server-filesystem"),
        files_dir.display()
    );
    let mut built = session(&sim, dir.path(), "fsreads", &extra).await;
    let read = |p: &Path| {
        ScriptedReply::tool_call("read_text_file", json!({"path": p.display().to_string()}))
    };
    // Turn 1 reads b once; turns 1-5 read a each time.
    sim.push_reply(read(&b_path));
    sim.push_reply(read(&a_path));
    sim.push_reply(ScriptedReply::text("read both"));
    built
        .session
        .turn(vec![Message::user("read a and b")])
        .await
        .expect("turn 1");
    assert!(
        offered(&sim, "read_text_file"),
        "the filesystem tools are in the catalog"
    );
    assert!(
        offered(&sim, "recall") && offered(&sim, "compress"),
        "beside the built-ins"
    );
    {
        let results = tool_results(built.session.history());
        assert_eq!(results.len(), 2);
        assert_eq!(results[0].content, b, "a real read of b.txt, byte for byte");
        assert_eq!(results[1].content, a, "a real read of a.rs, byte for byte");
        assert_eq!(results[1].name.as_deref(), Some("read_text_file"));
    }
    for t in 2..=5 {
        sim.push_reply(read(&a_path));
        sim.push_reply(ScriptedReply::text(format!("read a again ({t})")));
        built
            .session
            .turn(vec![Message::user(format!("read a, turn {t}"))])
            .await
            .expect("turn");
    }
    // One more turn runs the cheap passes over the last read too.
    built
        .session
        .turn(vec![Message::user("status?")])
        .await
        .expect("turn 6");
    let passes = built.session.stats().passes;
    assert!(passes.deduplicated >= 4, "{passes:?}");
    assert!(passes.microcompacted >= 1, "{passes:?}");
    let h = built.session.history().to_vec();
    let results = tool_results(&h);
    assert_eq!(results.len(), 6);
    // Every earlier read of a.rs is a stub with the original's key; the newest is whole or
    // microcompacted, with its marker.
    let key_a = Key::of(a.as_bytes());
    let key_b = Key::of(b.as_bytes());
    let a_reads: Vec<&&Message> = results.iter().skip(1).collect();
    for m in &a_reads[..a_reads.len() - 1] {
        assert!(m.content.contains("superseded"), "{}", m.content);
        assert_eq!(extract_markers(&m.content), vec![key_a]);
    }
    assert!(
        results[0].content.len() < b.len(),
        "b.txt was microcompacted"
    );
    assert_eq!(extract_markers(&results[0].content), vec![key_b]);
    // recall, as the model calls it, gives both originals back byte for byte.
    sim.push_reply(ScriptedReply::tool_call(
        "recall",
        json!({"key": key_a.marker()}),
    ));
    sim.push_reply(ScriptedReply::tool_call(
        "recall",
        json!({"key": key_b.as_str()}),
    ));
    sim.push_reply(ScriptedReply::text("recalled"));
    built
        .session
        .turn(vec![Message::user("recall them")])
        .await
        .expect("recall turn");
    let h = built.session.history();
    let recalled = tool_results(h);
    let n = recalled.len();
    assert_eq!(recalled[n - 2].content, a);
    assert_eq!(recalled[n - 1].content, b);
}

/// A templated log read through the real filesystem MCP server is compressed on entry (the
/// default policy), and every anomaly stays in what the model is sent: a line of a kind of its
/// own, a line whose fields changed, a stack trace. The thousands of lines of the template
/// are counted behind a marker whose recall gives the original back byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_templated_log_read_over_mcp_keeps_every_anomaly_in_its_compressed_view() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let files_dir = files.path().canonicalize().unwrap();
    let unique = "2026-12-05T02:16:40.000Z INFO cache warmed from snapshot snap-7 in 2.1s";
    let changed =
        "2026-12-05T02:33:20.000Z INFO GET /api/items/2000 status=200 took=12ms retry=3 upstream=b";
    let trace = [
        "Exception in thread \"worker-3\" java.lang.IllegalStateException: pool exhausted",
        "\tat com.example.pool.Pool.acquire(Pool.java:42)",
        "\tat com.example.api.Items.get(Items.java:17)",
    ];
    let mut log = String::new();
    for i in 0..3_000 {
        log.push_str(&format!(
            "2026-12-05T02:{:02}:{:02}.{:03}Z INFO GET /api/items/{i} status=200 took={}ms\n",
            i / 60 % 60,
            i % 60,
            i % 1_000,
            i % 37 + 3
        ));
        let after: &[&str] = match i {
            1_000 => &[unique],
            2_000 => &[changed],
            2_500 => &trace,
            _ => &[],
        };
        for line in after {
            log.push_str(line);
            log.push('\n');
        }
    }
    let path = files_dir.join("server.log");
    std::fs::write(&path, &log).unwrap();
    let extra = format!(
        "tools:\n  mcpServers:\n  - name: fs\n    command: {}\n    args: [{}]\n",
        bin("mcp-server-filesystem"),
        files_dir.display()
    );
    let mut built = session(&sim, dir.path(), "fslog", &extra).await;
    sim.push_reply(ScriptedReply::tool_call(
        "read_text_file",
        json!({"path": path.display().to_string()}),
    ));
    sim.push_reply(ScriptedReply::text("read it"));
    built
        .session
        .turn(vec![Message::user("what happened in server.log?")])
        .await
        .expect("turn");
    let results = tool_results(built.session.history());
    assert_eq!(results.len(), 1);
    let view = results[0].content.clone();
    assert!(
        view.len() < log.len() / 10,
        "compressed on entry: {} of {} bytes",
        view.len(),
        log.len()
    );
    assert!(
        !view.contains("/api/items/1500 "),
        "the template's lines are counted"
    );
    // The model was sent the compressed view with every anomaly in it.
    let sent = sim
        .requests()
        .last()
        .map(|r| r.body.clone())
        .unwrap_or_default();
    for anomaly in [unique, changed].iter().chain(&trace) {
        assert!(view.contains(anomaly), "{anomaly:?} kept: {view}");
        let escaped = serde_json::to_string(anomaly).expect("json");
        assert!(
            sent.contains(escaped.trim_matches('"')),
            "{anomaly:?} sent to the model"
        );
    }
    let key = Key::of(log.as_bytes());
    let markers = extract_markers(&view);
    assert!(
        !markers.is_empty() && markers.iter().all(|m| *m == key),
        "every note names the original: {view}"
    );
    sim.push_reply(ScriptedReply::tool_call(
        "recall",
        json!({"key": key.marker()}),
    ));
    sim.push_reply(ScriptedReply::text("recalled"));
    built
        .session
        .turn(vec![Message::user("show me all of it")])
        .await
        .expect("recall turn");
    let recalled = tool_results(built.session.history());
    assert_eq!(recalled[recalled.len() - 1].content, log, "byte for byte");
}

/// A turn whose model calls `calls`, then one more turn, whose cheap passes see the newest
/// reads too.
async fn reads_then_status(sim: &Sim, built: &mut Built, calls: Vec<(&str, Value)>) {
    for (name, args) in calls {
        sim.push_reply(ScriptedReply::tool_call(name, args));
    }
    sim.push_reply(ScriptedReply::text("done"));
    built
        .session
        .turn(vec![Message::user("go on")])
        .await
        .expect("turn");
    sim.push_reply(ScriptedReply::text("ok"));
    built
        .session
        .turn(vec![Message::user("status?")])
        .await
        .expect("turn");
}

/// The filesystem server's ranged and multi-file reads, as the model calls them: a `head`
/// read leaves the whole read before it alone; `read_multiple_files` supersedes both reads of
/// a.rs, and is itself superseded only once both of its files were read whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_head_and_multi_file_reads_supersede_only_what_they_cover() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let files_dir = files.path().canonicalize().unwrap();
    let a: String = (0..400)
        .map(|i| format!("fn a_{i}() -> u32 {{ {i} }}\n"))
        .collect();
    let b: String = (0..300)
        .map(|i| format!("b line {i}: value = {}\n", i * 7))
        .collect();
    let (a_path, b_path) = (files_dir.join("a.rs"), files_dir.join("b.txt"));
    std::fs::write(&a_path, &a).unwrap();
    std::fs::write(&b_path, &b).unwrap();
    // Reads enter whole and microcompact leaves them: dedup is the only pass that acts.
    let extra = format!(
        "tools:\n  mcpServers:\n  - name: fs\n    command: {}\n    args: [{}]\ncompaction:\n  compression:\n    mode: \"off\"\n  microcompact:\n    truncateAfterTurns: 40\n    summarizeAfterTurns: 50\n",
        bin("mcp-server-filesystem"),
        files_dir.display()
    );
    let mut built = session(&sim, dir.path(), "fsranges", &extra).await;
    let path = |p: &Path| p.display().to_string();
    let superseded = |m: &Message| m.content.contains("superseded");

    reads_then_status(
        &sim,
        &mut built,
        vec![
            ("read_text_file", json!({"path": path(&a_path)})),
            ("read_text_file", json!({"path": path(&a_path), "head": 60})),
        ],
    )
    .await;
    {
        let results = tool_results(built.session.history());
        assert_eq!(results[0].content, a, "the whole read stays whole");
        assert!(
            results[1].content.starts_with("fn a_0()") && results[1].content.contains("fn a_59()"),
            "the server's first 60 lines: {}",
            results[1].content
        );
        assert!(!results[1].content.contains("fn a_60()"));
    }

    reads_then_status(
        &sim,
        &mut built,
        vec![(
            "read_multiple_files",
            json!({"paths": [path(&a_path), path(&b_path)]}),
        )],
    )
    .await;
    {
        let results = tool_results(built.session.history());
        assert!(superseded(results[0]) && superseded(results[1]));
        assert!(
            results[1].content.contains("(lines 1-60)"),
            "{}",
            results[1].content
        );
        assert!(results[2].content.contains(&a) && results[2].content.contains(&b));
    }

    // b.txt only in part, then a.rs whole: the multi-file read stays.
    reads_then_status(
        &sim,
        &mut built,
        vec![
            ("read_text_file", json!({"path": path(&b_path), "tail": 80})),
            ("read_text_file", json!({"path": path(&a_path)})),
        ],
    )
    .await;
    assert!(!superseded(tool_results(built.session.history())[2]));

    reads_then_status(
        &sim,
        &mut built,
        vec![("read_text_file", json!({"path": path(&b_path)}))],
    )
    .await;
    let h = built.session.history().to_vec();
    let results = tool_results(&h);
    assert_eq!(results.len(), 6);
    assert!(
        results[2].content.contains("earlier read of 2 files"),
        "{}",
        results[2].content
    );
    assert!(
        results[3].content.contains("(last 80 lines)"),
        "{}",
        results[3].content
    );
    assert_eq!(
        (results[4].content.as_str(), results[5].content.as_str()),
        (a.as_str(), b.as_str())
    );
    assert_eq!(built.session.stats().passes.deduplicated, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http_answers_errors_verbatim_and_enforces_allowed_tools() {
    let port = free_port();
    let _server = everything(port);
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "tools:\n  mcpServers:\n  - name: every\n    url: http://127.0.0.1:{port}/mcp\n    allowedTools: [echo, get-sum]\n"
    );
    let mut built = session(&sim, dir.path(), "every", &extra).await;
    sim.push_reply(ScriptedReply::tool_call(
        "echo",
        json!({"message": "hello over http"}),
    ));
    sim.push_reply(ScriptedReply::tool_call("get-sum", json!({"a": "x"})));
    sim.push_reply(ScriptedReply::tool_call("get-env", json!({})));
    sim.push_reply(ScriptedReply::text("done"));
    let out = built
        .session
        .turn(vec![Message::user("echo")])
        .await
        .expect("turn");
    assert_eq!(out.text, "done");
    assert!(offered(&sim, "echo") && offered(&sim, "get-sum"));
    assert!(
        !offered(&sim, "get-env"),
        "a tool outside allowedTools is not offered"
    );
    let h = built.session.history();
    let r = tool_results(h);
    assert_eq!(r[0].content, "Echo: hello over http");
    // The server's own error (isError) reaches the model as the server wrote it.
    assert!(
        !r[1].content.starts_with("error: MCP server"),
        "{}",
        r[1].content
    );
    assert!(!r[1].content.is_empty());
    // A listed tool outside allowedTools is refused without a call.
    assert!(
        r[2].content.contains("not in its allowedTools") && r[2].content.contains("get-env"),
        "{}",
        r[2].content
    );
}

async fn echo_turn(sim: &Sim, built: &mut Built) -> cairn_agent::session::TurnOutcome {
    sim.push_reply(ScriptedReply::tool_call(
        "echo",
        json!({"message": "through"}),
    ));
    sim.push_reply(ScriptedReply::text("done"));
    built
        .session
        .turn(vec![Message::user("echo")])
        .await
        .expect("turn")
}

/// `server-everything` behind mitmproxy terminating TLS with its own CA, reached through
/// Squid (CONNECT): the MCP client is on the agent's network path like the providers are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_behind_a_tls_inspecting_proxy_needs_the_ca_bundle_and_takes_the_forward_proxy() {
    let port = free_port();
    let _server = everything(port);
    let mitm = Mitm::reverse(([127, 0, 0, 1], port).into()).unwrap_or_else(|e| panic!("{e}"));
    let squid = Squid::start(10 << 20).unwrap_or_else(|e| panic!("{e}"));
    let sim = Sim::start().await.expect("sim");
    let extra = format!(
        "tools:\n  mcpServers:\n  - name: every\n    url: {}/mcp\n    allowedTools: [echo]\n",
        mitm.url()
    );
    let yaml = config_yaml("every-tls", &format!("{}/v1", sim.url()), 200_000, &extra);
    // Without the bundle the server is unavailable for a TLS reason, said in the turn's
    // notices; its tools are not offered and the turn goes on.
    let dir = tempfile::tempdir().unwrap();
    let mut built = build_session(&yaml, &storage_env(dir.path(), None), "a").await;
    sim.push_reply(ScriptedReply::text("done"));
    let out = built
        .session
        .turn(vec![Message::user("echo")])
        .await
        .expect("turn");
    assert_eq!(out.text, "done");
    assert!(!offered(&sim, "echo"));
    let why: Vec<&str> = out
        .notices
        .iter()
        .filter(|n| n.kind == "tools")
        .map(|n| n.message.as_str())
        .collect();
    assert!(
        why.iter()
            .any(|m| m.contains("MCP server \"every\" is unavailable")
                && (m.contains("certificate") || m.contains("UnknownIssuer"))),
        "{why:?}"
    );

    // With mitmproxy's CA as the bundle, and Squid as the HTTPS proxy, the call succeeds
    // and went through the tunnel.
    let dir = tempfile::tempdir().unwrap();
    let mut env = storage_env(dir.path(), None);
    env.push((
        "CAIRN_CA_BUNDLE".into(),
        mitm.ca_cert().display().to_string(),
    ));
    env.push(("HTTPS_PROXY".into(), squid.url()));
    env.push(("NO_PROXY".into(), "127.0.0.1".into()));
    let mut built = build_session(&yaml, &env, "a").await;
    let out = echo_turn(&sim, &mut built).await;
    assert_eq!(out.text, "done");
    let r = tool_results(built.session.history());
    assert_eq!(r[0].content, "Echo: through");
    // A tunnel is logged when it closes; one the MCP client keeps open is an active request.
    let target = format!("localhost:{}", mitm.port());
    let (log, active) = (squid.access_log(), squid.active_requests());
    assert!(
        log.contains(&target) || active.contains(&format!("uri {target}")),
        "the MCP traffic did not take the proxy:\n{log}\n{active}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_slow_down_or_failing_gives_clear_tool_errors_and_the_session_goes_on() {
    let port = free_port();
    let server = everything(port);
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "tools:\n  mcpServers:\n  - name: every\n    url: http://127.0.0.1:{port}/mcp\n    timeoutSeconds: 2\n  - name: broken\n    command: /bin/false\n"
    );
    let mut built = session(&sim, dir.path(), "faults", &extra).await;
    // Slow: a 20 s operation against a 2 s timeout.
    sim.push_reply(ScriptedReply::tool_call(
        "trigger-long-running-operation",
        json!({"duration": 20, "steps": 2}),
    ));
    sim.push_reply(ScriptedReply::text("after the slow call"));
    let t = Instant::now();
    let out = built
        .session
        .turn(vec![Message::user("slow")])
        .await
        .expect("turn survives");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert_eq!(out.text, "after the slow call");
    // The server that cannot start is reported, its absence is no failure.
    assert!(
        out.notices
            .iter()
            .any(|n| n.kind == "tools" && n.message.contains("\"broken\"")),
        "{:?}",
        out.notices
    );
    let last = tool_results(built.session.history())
        .last()
        .unwrap()
        .content
        .clone();
    assert!(
        last.contains("did not answer") && last.contains("timeoutSeconds"),
        "{last}"
    );

    // Down: the server goes away between turns.
    drop(server);
    sim.push_reply(ScriptedReply::tool_call(
        "echo",
        json!({"message": "anyone?"}),
    ));
    sim.push_reply(ScriptedReply::text("after the down call"));
    let out = built
        .session
        .turn(vec![Message::user("down")])
        .await
        .expect("turn survives");
    assert_eq!(out.text, "after the down call");
    let last = tool_results(built.session.history())
        .last()
        .unwrap()
        .content
        .clone();
    assert!(last.starts_with("error: MCP server \"every\""), "{last}");

    // Back: after its back-off the server is reached again.
    let _server = everything(port);
    tokio::time::sleep(Duration::from_secs(3)).await;
    sim.push_reply(ScriptedReply::tool_call("echo", json!({"message": "back"})));
    sim.push_reply(ScriptedReply::text("after the server came back"));
    let out = built
        .session
        .turn(vec![Message::user("back")])
        .await
        .expect("turn");
    assert_eq!(out.text, "after the server came back");
    let last = tool_results(built.session.history())
        .last()
        .unwrap()
        .content
        .clone();
    assert_eq!(last, "Echo: back");
}

/// A history worth summarizing.
fn padded_history(n: usize) -> Vec<Message> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(Message::user(format!(
            "question {i}: {}",
            "why does module_599 fail to build? ".repeat(40)
        )));
        out.push(Message::assistant(format!(
            "answer {i}: {}",
            "the types mismatch in module_599 (E0308). ".repeat(40)
        )));
    }
    out
}

/// A summary with the nine sections, long enough for the quality gate.
fn builtin_summary() -> String {
    let mut s = String::new();
    for (n, sec) in cairn_agent::compact::summarize::SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nbuilt-in summarizer: module_599 fails with E0308.\n",
            n + 1
        ));
    }
    while s.len() < 2_500 {
        s.push_str("Details: the failing build step is module_599.\n");
    }
    s
}

const SUMMARY_REQUEST: &str = "Summarize the conversation transcript below";

fn summary_of(h: &[Message]) -> String {
    h.iter()
        .find(|m| m.meta.is_summary)
        .map(|m| m.content.clone())
        .unwrap_or_default()
}

/// The compactor as the engine; its connection may take long on a machine busy with the
/// other tests' servers starting (the engine's own timeout bounds each call).
fn engine_yaml(port: u16, timeout: u32) -> String {
    format!(
        "tools:\n  mcpServers:\n  - name: compactor\n    url: http://127.0.0.1:{port}/mcp\n    timeoutSeconds: 120\ncompaction:\n  engine: mcp\n  engineServer: compactor\n  engineTimeoutSeconds: {timeout}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_mcp_writes_the_summary_through_context_compact() {
    let port = free_port();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("calls.jsonl");
    let _server = compactor(port, "ok", &log);
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let mut built = session(&sim, dir.path(), "engine", &engine_yaml(port, 180)).await;
    assert!(
        built.session.stats().unsupported.is_empty(),
        "{:?}",
        built.session.stats().unsupported
    );
    built
        .session
        .replace_history(padded_history(12))
        .await
        .expect("seed");
    let before = sim.requests().len();
    let out = built.session.compact_now(None).await.expect("compact");
    assert!(out.bytes_after < out.bytes_before, "{out:?}");
    let summary = summary_of(built.session.history());
    assert!(summary.contains("cairn-test-compactor"), "{summary}");
    assert!(
        summary.contains("module_599"),
        "the server summarized the segment it was given"
    );
    assert!(
        !sim.requests()[before..]
            .iter()
            .any(|r| r.contains(SUMMARY_REQUEST)),
        "the built-in summarizer was not called"
    );
    let calls: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(calls.len(), 1);
    assert!(calls[0]["segment_chars"].as_u64().unwrap() > 10_000);
    assert!(calls[0]["budget_chars"].as_u64().unwrap() > 0);
    assert!(calls[0]["instruction_chars"].as_u64().unwrap() > 100);
    // The segment is archived as always: its marker is in the summary's message.
    let h = built.session.history();
    assert!(
        h.iter()
            .any(|m| m.meta.is_summary && !m.meta.archived.is_empty())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_mcp_falls_back_to_the_builtin_summarizer_when_the_server_fails() {
    let logs = tempfile::tempdir().unwrap();
    let sim = Sim::start().await.expect("sim");
    // error: isError; empty: no text; slow: past engineTimeoutSeconds; down: nothing listens.
    for mode in ["error", "empty", "slow", "down"] {
        let port = free_port();
        let log = logs.path().join(format!("{mode}.jsonl"));
        let _server = (mode != "down").then(|| compactor(port, mode, &log));
        let dir = tempfile::tempdir().unwrap();
        let mut built = session(
            &sim,
            dir.path(),
            &format!("fallback-{mode}"),
            &engine_yaml(port, 2),
        )
        .await;
        built
            .session
            .replace_history(padded_history(12))
            .await
            .expect("seed");
        let before = sim.requests().len();
        sim.push_reply(ScriptedReply::text(builtin_summary()));
        let t = Instant::now();
        let out = built.session.compact_now(None).await.expect("compact");
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{mode}: {:?}",
            t.elapsed()
        );
        assert!(out.bytes_after < out.bytes_before, "{mode}: {out:?}");
        let summary = summary_of(built.session.history());
        assert!(summary.contains("built-in summarizer"), "{mode}: {summary}");
        assert!(
            sim.requests()[before..]
                .iter()
                .any(|r| r.contains(SUMMARY_REQUEST)),
            "{mode}: the built-in summarizer wrote it"
        );
        if mode != "down" {
            assert!(
                std::fs::read_to_string(&log)
                    .unwrap()
                    .contains("context_compact"),
                "{mode}: the server was asked first"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_mcp_without_a_declared_server_is_reported_unsupported() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let built = session(
        &sim,
        dir.path(),
        "nosrv",
        "compaction:\n  engine: mcp\n  engineServer: nowhere\n",
    )
    .await;
    let u = built.session.stats().unsupported;
    assert!(
        u.iter()
            .any(|s| s.field == "engineServer" && s.reason.contains("nowhere")),
        "{u:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_responses_api_selects_declared_servers_and_refuses_undeclared_ones() {
    let port = free_port();
    let _server = everything(port);
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let extra = format!(
        "tools:\n  mcpServers:\n  - name: every\n    url: http://127.0.0.1:{port}/mcp\n    allowedTools: [echo]\n  - name: fs\n    command: {}\n    args: [{}]\n",
        bin("mcp-server-filesystem"),
        files.path().canonicalize().unwrap().display()
    );
    let built = session(&sim, dir.path(), "select", &extra).await;
    let api = Api::new(serve(AppState::new(built.session, TOKEN)).await);
    for (tools, what) in [
        (
            json!([{"type": "mcp", "server_label": "elsewhere", "server_url": "http://127.0.0.1:1/mcp"}]),
            "not declared",
        ),
        (
            json!([{"type": "mcp", "server_label": "every", "server_url": "http://127.0.0.1:1/mcp"}]),
            "server_url",
        ),
    ] {
        let (status, v) = api
            .post(
                "/v1/responses",
                json!({"model": MODEL, "input": "hi", "tools": tools}),
            )
            .await;
        assert_eq!(status, 400, "{v}");
        assert!(v.to_string().contains(what), "{v}");
    }
    // Only the selected server's tools are offered, with the client's function tool.
    sim.push_reply(ScriptedReply::text("hello"));
    let (status, v) = api
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": "hi", "tools": [
                {"type": "mcp", "server_label": "every", "server_url": format!("http://127.0.0.1:{port}/mcp")},
                {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
            ]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(offered(&sim, "echo") && offered(&sim, "lookup") && offered(&sim, "recall"));
    assert!(!offered(&sim, "read_text_file"), "fs was not selected");
    // No selection: every declared server.
    sim.push_reply(ScriptedReply::text("hello again"));
    let (status, v) = api
        .post("/v1/responses", json!({"model": MODEL, "input": "hi"}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(offered(&sim, "echo") && offered(&sim, "read_text_file"));
}

/// The names of the tools a recorded Chat Completions request offered, with their
/// descriptions.
fn offered_tools(body: &str) -> Vec<(String, String)> {
    let body: Value = serde_json::from_str(body).expect("request body");
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                t["function"]["description"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

fn gauge(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A served session (`cairn-agent serve`) with the filesystem server's whole catalog and a
/// model of 2,048 tokens (cairn-sim rejects what exceeds it): the catalog gives way, shown
/// by the context inspector, a notice and a gauge; the model, scripted, finds a deferred
/// tool with `tool_search`, and its call then runs on the real server, as does a direct call
/// of a deferred tool the model never searched for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_filesystem_tool_is_found_with_tool_search_and_runs_on_the_real_server() {
    let sim = Sim::start().await.expect("sim");
    sim.set_window(MODEL, 2_048);
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let root = files.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("src")).unwrap();
    std::fs::write(root.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }\n").unwrap();
    std::fs::write(root.join("notes.txt"), "meeting on Tuesday\n").unwrap();
    let yaml = config_yaml(
        "catalog",
        &format!("{}/v1", sim.url()),
        2_048,
        &format!(
            "tools:\n  mcpServers:\n  - name: fs\n    command: {}\n    args: [{}]\n",
            bin("mcp-server-filesystem"),
            root.display()
        ),
    );
    let cfg = dir.path().join("session.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let agent = AgentProcess::start(
        &cfg,
        &storage_env(dir.path(), None),
        &dir.path().join("agent.log"),
    );
    let api = Api::new(&agent.url);

    // The inspector: the whole catalog would not fit, so tools are deferred behind the
    // search tool, and what is offered fits the room.
    let (status, body) = api.get("/v1/session/context?input=hello").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let report: Value = serde_json::from_slice(&body).unwrap();
    let catalog = &report["catalog"];
    let deferred: Vec<String> = catalog["deferred"]
        .as_array()
        .expect("deferred tools")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    assert!(!deferred.is_empty(), "{catalog}");
    eprintln!("the filesystem catalog on a 2,048-token window: {catalog}");
    assert!(
        catalog["offeredBytes"].as_u64() <= catalog["roomBytes"].as_u64()
            && catalog["offeredBytes"].as_u64() < catalog["wholeBytes"].as_u64(),
        "{catalog}"
    );
    let listed: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(listed.contains(&"tool_search"), "{listed:?}");
    assert!(deferred.iter().all(|d| !listed.contains(&d.as_str())));
    assert!(
        report["notices"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("deferred behind tool_search"))),
        "{report}"
    );

    // Turn 1: search, then call what was found.
    let wanted = [
        "list_directory",
        "directory_tree",
        "list_allowed_directories",
    ]
    .into_iter()
    .find(|t| deferred.iter().any(|d| d == t))
    .unwrap_or_else(|| panic!("no listing tool deferred: {deferred:?}"));
    let query = wanted.replace('_', " ");
    let path = root.display().to_string();
    sim.push_reply(ScriptedReply::tool_call(
        "tool_search",
        json!({"query": query}),
    ));
    sim.push_reply(ScriptedReply::tool_call(wanted, json!({"path": path})));
    sim.push_reply(ScriptedReply::text("listed"));
    let (status, body) = api.turn("What is in the folder?").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output_text(&body), "listed");
    let notices = body["cairn"]["notices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        notices.iter().any(|n| n["kind"] == "catalog"),
        "the turn says the catalog gave way: {body}"
    );
    let requests = sim.requests();
    assert_eq!(requests.len(), 3, "search, call, answer");
    assert!(requests.iter().all(|r| r.outcome == "ok"), "{requests:?}");
    let first = offered_tools(&requests[0].body);
    assert!(first.iter().any(|(n, _)| n == "tool_search"));
    assert!(
        !first.iter().any(|(n, _)| n == wanted),
        "{wanted} is deferred"
    );
    // The search result carries the tool's whole definition, as the server lists it; the
    // next request offers the tool.
    let second: Value = serde_json::from_str(&requests[1].body).unwrap();
    let messages = second["messages"].as_array().unwrap();
    let found = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("the search result");
    assert!(
        found.contains(&format!("\"name\":\"{wanted}\"")) && found.contains("\"parameters\""),
        "{found}"
    );
    assert!(
        offered_tools(&requests[1].body)
            .iter()
            .any(|(n, _)| n == wanted),
        "the found tool is offered after the search"
    );
    // The call ran on the real server: its listing names the real entries.
    let third: Value = serde_json::from_str(&requests[2].body).unwrap();
    let listing = third["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("the listing");
    assert!(
        listing.contains("notes.txt") && listing.contains("src"),
        "{listing}"
    );

    // Turn 2: a deferred tool called directly, without a search, runs all the same.
    let (status, body) = api.get("/v1/session/context").await;
    assert_eq!(status, 200);
    let report: Value = serde_json::from_slice(&body).unwrap();
    let still: Vec<String> = report["catalog"]["deferred"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    // Each reading tool's answer, from the real server, names what it read.
    let (direct, args, expected) = [
        ("read_text_file", "meeting on Tuesday"),
        ("read_file", "meeting on Tuesday"),
        ("get_file_info", "size: 19"),
        ("search_files", "notes.txt"),
    ]
    .into_iter()
    .find(|(t, _)| still.iter().any(|d| d == t))
    .map(|(t, expected)| {
        let args = if t == "search_files" {
            json!({"path": path, "pattern": "notes"})
        } else {
            json!({"path": root.join("notes.txt").display().to_string()})
        };
        (t, args, expected)
    })
    .unwrap_or_else(|| panic!("no reading tool deferred: {still:?}"));
    sim.push_reply(ScriptedReply::tool_call(direct, args));
    sim.push_reply(ScriptedReply::text("read"));
    let (status, body) = api.turn("And the notes?").await;
    assert_eq!(status, 200, "{body}");
    let requests = sim.requests();
    let last: Value = serde_json::from_str(&requests[requests.len() - 1].body).unwrap();
    let result = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("the direct call's result");
    assert!(result.contains(expected), "{direct}: {result}");
    assert!(requests.iter().all(|r| r.outcome == "ok"), "{requests:?}");

    let stats = api.session().await["stats"].clone();
    assert_eq!(stats["toolCalls"]["mcp"].as_u64(), Some(2), "{stats}");
    let metrics = String::from_utf8(api.get("/metrics").await.1).unwrap_or_default();
    assert!(
        gauge(&metrics, "cairn_agent_offered_tools{offer=\"deferred\"}").unwrap_or(0.0) >= 1.0,
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_agent_tool_calls_total{tool=\"tool_search\"} 1"),
        "{metrics}"
    );
}
