//! What the agent adds to an MCP tool call: the same `echo` call of a real rmcp server (this
//! bench binary started again with `--mcp-server`, speaking MCP over stdio) made straight
//! through the rmcp client, and through the session's `McpHub` (argument parsing, the
//! allowedTools check, routing, result rendering); and the per-round tool listing the turn
//! does (served from the hub's cache once connected).
//!
//! `cargo bench -p cairn-agent --bench mcp`; results are recorded in docs/benchmarks.md.

use std::hint::black_box;
use std::sync::Arc;

use cairn_agent::mcp::McpHub;
use cairn_crds::session::McpServerSpec;
use criterion::{Criterion, criterion_group};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::TokioChildProcess;
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::json;

/// A tool server with one tool, `echo(text)`.
#[derive(Clone)]
struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
        let schema = match schema {
            serde_json::Value::Object(o) => o,
            _ => serde_json::Map::new(),
        };
        Ok(ListToolsResult::with_all_items(vec![Tool::new(
            "echo",
            "Returns its text.",
            schema,
        )]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("text"))
            .and_then(|t| t.as_str())
            .unwrap_or_default()
            .to_owned();
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

fn serve_stdio() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let service = Echo
            .serve(rmcp::transport::io::stdio())
            .await
            .expect("serve");
        let _ = service.waiting().await;
    });
}

fn server_spec() -> McpServerSpec {
    let exe = std::env::current_exe().expect("current exe");
    serde_json::from_value(json!({
        "name": "bench",
        "command": exe.display().to_string(),
        "args": ["--mcp-server"],
    }))
    .expect("spec")
}

fn bench_mcp(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let text = "x".repeat(4096);
    let args = json!({"text": text}).to_string();
    let arguments = match json!({"text": text}) {
        serde_json::Value::Object(o) => o,
        _ => serde_json::Map::new(),
    };

    // Straight through the SDK: the server's own time (transport and handler included).
    let raw = rt.block_on(async {
        let mut cmd = tokio::process::Command::new(std::env::current_exe().expect("exe"));
        cmd.arg("--mcp-server");
        ().serve(TokioChildProcess::new(cmd).expect("spawn"))
            .await
            .expect("raw client")
    });
    let mut g = c.benchmark_group("mcp");
    g.bench_function("call_4k_rmcp_client", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = raw
                    .call_tool(CallToolRequestParams::new("echo").with_arguments(arguments.clone()))
                    .await
                    .expect("call");
                black_box(r);
            })
        });
    });

    // Through the agent's hub, as a turn makes the call.
    let hub = Arc::new(McpHub::new(&[server_spec()], None, &Default::default()));
    let catalog = rt.block_on(hub.catalog(None, &["recall", "compress"]));
    assert_eq!(catalog.specs.len(), 1, "the bench server lists echo");
    g.bench_function("call_4k_agent_hub", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = hub.call("bench", "echo", &args).await.expect("call");
                assert_eq!(r.text.len(), 4096);
                black_box(r);
            })
        });
    });
    g.bench_function("list_per_round_agent_hub", |b| {
        b.iter(|| {
            rt.block_on(async {
                black_box(hub.catalog(None, &["recall", "compress"]).await);
            })
        });
    });
    g.finish();
}

criterion_group!(benches, bench_mcp);

fn main() {
    // The bench binary is its own MCP server when the hub launches it.
    if std::env::args().any(|a| a == "--mcp-server") {
        serve_stdio();
        return;
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
