//! `kubectl-cairn`: thin binary over the `kubectl_cairn` library (`kubectl cairn ...` once
//! it is on PATH).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use kubectl_cairn::{Cluster, Command, describe_compaction, describe_rewind};

#[derive(Parser)]
#[command(
    name = "kubectl-cairn",
    bin_name = "kubectl cairn",
    version,
    about = "A cairn session's agent from your kubeconfig: context, recall, compact, rewind"
)]
struct Cli {
    /// The session's namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// The kubeconfig context to use (default: the current one).
    #[arg(long, global = true)]
    context: Option<String>,
    /// How long the agent may take to answer, in seconds (a compaction waits for its
    /// summarizer).
    #[arg(long, global = true, default_value_t = 300)]
    timeout: u64,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum View {
    /// The next request by part, with the window, budget and headroom.
    Parts,
    /// The exact body of the next request, as the provider would receive it.
    Request,
}

#[derive(Subcommand)]
enum Cmd {
    /// What the session's next request will carry, by part (GET /v1/session/context).
    Context {
        session: String,
        #[arg(long, value_enum, default_value = "parts")]
        view: View,
        /// Print the agent's JSON report instead of the table.
        #[arg(long)]
        json: bool,
        /// A user message the next turn would bring (shown, never sent).
        #[arg(long)]
        input: Option<String>,
        /// Render the request as a streamed turn sends it.
        #[arg(long)]
        stream: bool,
        /// Where TEXT went instead: kept, summarized (in which section), in a ledger, or
        /// archived under a marker that `recall` returns.
        #[arg(long, value_name = "TEXT", conflicts_with_all = ["view", "input", "stream"])]
        why: Option<String>,
    },
    /// Print an archived original byte for byte (GET /v1/recall/KEY).
    Recall {
        session: String,
        /// A <<ccr:KEY>> marker or its 16-hex key.
        key: String,
    },
    /// Compact the session's history now (POST /v1/session/compact).
    Compact {
        session: String,
        /// What the summary must keep, for the summarizer.
        #[arg(long)]
        instruction: Option<String>,
        /// Print the agent's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Undo the session's last compaction (POST /v1/session/rewind).
    Rewind {
        session: String,
        /// Print the agent's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Serve the session's page (its window by part, the compaction timeline, recall and
    /// why) on a loopback port, through the same port-forward, until interrupted.
    Open {
        session: String,
        /// The local port (0: any free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}

/// How an answer is printed.
enum Output {
    Raw,
    Json,
    Table,
    Why,
    Compaction,
    Rewind,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (session, command, output) = match cli.command {
        Cmd::Open { session, port } => {
            return open(cli.namespace, cli.context, cli.timeout, &session, port);
        }
        Cmd::Context {
            session,
            json,
            why: Some(text),
            ..
        } => {
            let output = if json { Output::Json } else { Output::Why };
            (session, Command::Why { text }, output)
        }
        Cmd::Context {
            session,
            view,
            json,
            input,
            stream,
            why: None,
        } => {
            let request = matches!(view, View::Request);
            let output = match (request, json) {
                (true, _) => Output::Raw,
                (false, true) => Output::Json,
                (false, false) => Output::Table,
            };
            let command = Command::Context {
                request,
                input,
                stream,
            };
            (session, command, output)
        }
        Cmd::Recall { session, key } => (session, Command::Recall { key }, Output::Raw),
        Cmd::Compact {
            session,
            instruction,
            json,
        } => (
            session,
            Command::Compact { instruction },
            if json {
                Output::Json
            } else {
                Output::Compaction
            },
        ),
        Cmd::Rewind { session, json } => (
            session,
            Command::Rewind,
            if json { Output::Json } else { Output::Rewind },
        ),
    };
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let timeout = Duration::from_secs(cli.timeout);
    let answer = runtime.block_on(async {
        let (cluster, default_ns) = Cluster::from_kubeconfig(cli.context, timeout).await?;
        let namespace = cli.namespace.unwrap_or(default_ns);
        cluster.run(&namespace, &session, &command).await
    });
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kubectl cairn: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let text = match output {
        Output::Raw => answer.body.to_vec(),
        other => {
            let value: serde_json::Value = match serde_json::from_slice(&answer.body) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("kubectl cairn: the agent's answer is not JSON: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let text = match other {
                Output::Table => cairn_engine::breakdown::table(&value),
                Output::Why => cairn_engine::why::describe(&value),
                Output::Compaction => describe_compaction(&value) + "\n",
                Output::Rewind => describe_rewind(&value) + "\n",
                _ => serde_json::to_string_pretty(&value).unwrap_or_default() + "\n",
            };
            text.into_bytes()
        }
    };
    let mut out = std::io::stdout().lock();
    if out.write_all(&text).and_then(|()| out.flush()).is_err() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("kubectl cairn: cannot start the async runtime: {e}");
            None
        }
    }
}

/// `kubectl cairn open`: prints the page's address, then serves it until interrupted.
fn open(
    namespace: Option<String>,
    context: Option<String>,
    timeout: u64,
    session: &str,
    port: u16,
) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let served = runtime.block_on(async {
        let (cluster, default_ns) =
            Cluster::from_kubeconfig(context, Duration::from_secs(timeout)).await?;
        let namespace = namespace.unwrap_or(default_ns);
        // The session and its token first: a caller who cannot read them gets no page.
        let target = cluster.target(&namespace, session).await?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| kubectl_cairn::Error::Config(format!("127.0.0.1:{port}: {e}")))?;
        if let Ok(addr) = listener.local_addr() {
            println!("http://{addr}/ui");
            let _ = std::io::stdout().flush();
        }
        eprintln!("kubectl cairn: serving {namespace}/{session}'s page until interrupted");
        cluster.serve_page(target, listener).await
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kubectl cairn: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
