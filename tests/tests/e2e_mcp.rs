//! MCP servers of AgentSessions in a cluster: the chart-installed operator and harness-run
//! agent pods (as in `e2e_demo`), two sessions declaring the same MCP server (written with
//! the official Python SDK, `tests/mcp/compact_server.py`, on a loopback port). Session A
//! names a `headersFrom` Secret holding a bearer token; its agent reaches the server with
//! it. Session B's pod has no path to that Secret: its spec names it nowhere, its
//! ServiceAccount may not read it, and its calls reach the server without the token.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_sim::ScriptedReply;
use cairn_tests::demo::{self, DemoOptions};
use cairn_tests::harness::repo_root;
use serde_json::{Value, json};

const NS: &str = "demo";
const TOKEN_A: &str = "Bearer mcp-a-4f1d9c";

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python_with_mcp() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo_root().join("tests/harness/install-mcp-servers.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("install-mcp-servers.sh runs");
    assert!(out.status.success(), "install-mcp-servers.sh failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("python="))
        .map(PathBuf::from)
        .expect("python= line")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn session_yaml(name: &str, base_url: &str, port: u16, headers: bool) -> String {
    let headers = if headers {
        "\n        headersFrom: mcp-a-headers"
    } else {
        ""
    };
    format!(
        r#"apiVersion: cairn.dev/v1beta1
kind: AgentSession
metadata: {{name: {name}, namespace: {NS}}}
spec:
  provider:
    kind: openai-compatible
    model: demo-model
    baseUrl: "{base_url}"
    credentials: {{secretName: demo-provider}}
  contextWindow: 64000
  maxOutputTokens: 1024
  tools:
    mcpServers:
      - name: tools
        url: http://127.0.0.1:{port}/mcp{headers}
"#
    )
}

#[test]
fn an_mcp_server_is_reached_with_a_header_secret_only_its_session_can_read() {
    let python = python_with_mcp();
    let port = free_port();
    let logs = std::env::temp_dir().join(format!("cairn-e2e-mcp-{}", std::process::id()));
    std::fs::create_dir_all(&logs).expect("log dir");
    let log = logs.join("calls.jsonl");
    let _ = std::fs::remove_file(&log);
    let server = Command::new(&python)
        .arg(repo_root().join("tests/mcp/compact_server.py"))
        .arg(port.to_string())
        .arg("--log")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the MCP server");
    let _server = Server(server);

    let opts = DemoOptions {
        bin_dir: demo::default_bin_dir(),
        turns: 1,
        ..DemoOptions::default()
    };
    let mut say = |m: &str| eprintln!("e2e_mcp: {m}");
    let d = demo::start(&opts, &mut say).unwrap_or_else(|e| panic!("{e}"));
    let base_url = format!("{}/v1", d.nginx.url("/limit"));
    d.cp.apply_yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: mcp-a-headers, namespace: {NS}}}\nstringData: {{Authorization: \"{TOKEN_A}\"}}\n---\n{}---\n{}",
        session_yaml("mcp-a", &base_url, port, true),
        session_yaml("mcp-b", &base_url, port, false)
    ))
    .expect("sessions applied");

    let http = reqwest::Client::new();
    // One turn of a session whose model calls the server's `whoami`; the tool's answer as
    // the agent journaled it.
    let whoami_turn = |session: &str| -> String {
        let pod = d
            .pods
            .as_ref()
            .expect("the demo runs on kwok's node")
            .wait_for(NS, &format!("cairn-{session}-0"), Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{session}: {e}"));
        let url = format!("http://127.0.0.1:{}", pod.ports["listen"]);
        let token_b64 =
            d.cp.kubectl_ok(&[
                "get",
                "secret",
                &format!("cairn-{session}-api-token"),
                "-n",
                NS,
                "-o",
                "jsonpath={.data.token}",
            ])
            .expect("api token");
        let token = String::from_utf8(base64_decode(token_b64.trim()).expect("token is base64"))
            .expect("utf-8 token");
        d.rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(90);
            while !http
                .get(format!("{url}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                assert!(
                    Instant::now() < deadline,
                    "{session} never became ready:\n{}",
                    std::fs::read_to_string(&pod.log).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            d.sim
                .push_reply(ScriptedReply::tool_call("whoami", json!({})));
            d.sim.push_reply(ScriptedReply::text("checked"));
            let r = http
                .post(format!("{url}/v1/responses"))
                .bearer_auth(&token)
                .json(&json!({"model": "demo-model", "input": "who am I to the tool server?"}))
                .send()
                .await
                .expect("turn");
            assert_eq!(r.status(), 200, "{session}");
            let body: Value = r.json().await.expect("json");
            assert!(body.to_string().contains("checked"), "{body}");
            // The last request to the model carries the tool's answer.
            let last = d.sim.requests().pop().expect("a model request");
            let sent: Value = serde_json::from_str(&last.body).expect("body");
            let content = sent["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
                .to_owned();
            if !content.starts_with("error:") {
                return content;
            }
            let log = std::fs::read_to_string(&pod.log).unwrap_or_default();
            let mcp: Vec<&str> = log.lines().filter(|l| l.contains("MCP") || l.contains("mcp")).collect();
            let spec = d
                .cp
                .kubectl_ok(&["get", "pod", &format!("cairn-{session}-0"), "-n", NS, "-o", "jsonpath={.spec.containers[0].env}"])
                .unwrap_or_default();
            panic!("{session}: the tool call failed: {content}\nreply: {body}\npod env: {spec}\nagent log (MCP lines):\n{}", mcp.join("\n"));
        })
    };

    assert_eq!(
        whoami_turn("mcp-a"),
        TOKEN_A,
        "session A's token reached the server"
    );
    assert_eq!(
        whoami_turn("mcp-b"),
        "(no authorization header)",
        "session B reaches the same server without A's token"
    );
    let calls = std::fs::read_to_string(&log).expect("server log");
    assert_eq!(calls.matches(TOKEN_A).count(), 1, "{calls}");

    // B's pod names A's Secret nowhere, and B's identity may not read it.
    let pod_b =
        d.cp.kubectl_ok(&["get", "pod", "cairn-mcp-b-0", "-n", NS, "-o", "json"])
            .expect("pod b");
    assert!(!pod_b.contains("mcp-a-headers"), "{pod_b}");
    let pod_a =
        d.cp.kubectl_ok(&["get", "pod", "cairn-mcp-a-0", "-n", NS, "-o", "json"])
            .expect("pod a");
    assert!(pod_a.contains("mcp-a-headers"), "A mounts its Secret");
    for sa in ["cairn-mcp-b", "cairn-mcp-a"] {
        let can =
            d.cp.kubectl(&[
                "auth",
                "can-i",
                "get",
                "secret/mcp-a-headers",
                "-n",
                NS,
                &format!("--as=system:serviceaccount:{NS}:{sa}"),
            ])
            .expect("kubectl auth can-i");
        assert_eq!(
            String::from_utf8_lossy(&can.stdout).trim(),
            "no",
            "{sa} has no API access to the headers Secret (only A's pod mounts it)"
        );
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}
