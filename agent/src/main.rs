//! `cairn-agent`: thin binary over the `cairn_agent` library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use cairn_agent::app::{self, Prompt, Source};
use cairn_agent::telemetry;
use clap::{Parser, Subcommand};

/// mimalloc, configured by [`cairn_agent::allocator::configure`] at start-up.
#[global_allocator]
static ALLOCATOR: cairn_agent::allocator::Allocator = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "cairn-agent",
    version,
    about = "The cairn agent: an LLM session that never dies of a full context window"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the effective compaction policy of a session and its hash
    /// (built-in defaults ← CompactionPolicy ← the session's inline overrides).
    Policy {
        /// An AgentSession manifest (YAML).
        #[arg(long)]
        session: PathBuf,
        /// The CompactionPolicy manifest it references (YAML), if any.
        #[arg(long)]
        policy: Option<PathBuf>,
    },
    /// One turn: the answer on stdout, notices on stderr. Exit codes: 0 ok, 1 journal or
    /// archive failure, 2 bad input, 3 provider failure not recoverable, 4 floor diagnosis.
    Run {
        /// The session: YAML of the AgentSession spec plus `name` and `namespace`.
        #[arg(long)]
        config: PathBuf,
        /// JSON Lines history that replaces the session's history before the turn.
        #[arg(long)]
        history: Option<PathBuf>,
        #[arg(
            long,
            conflicts_with = "prompt_file",
            required_unless_present = "prompt_file"
        )]
        prompt: Option<String>,
        #[arg(long)]
        prompt_file: Option<PathBuf>,
    },
    /// Serve the session's HTTP API.
    Serve {
        /// NAMESPACE/NAME of the AgentSession (in a cluster).
        #[arg(
            long,
            env = "CAIRN_SESSION",
            conflicts_with = "config",
            required_unless_present = "config"
        )]
        session: Option<String>,
        /// Standalone: the session's config file (re-read when it changes).
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
    },
    /// Forget the session's learned payload cap (journaled). Opens the session's journal
    /// as `run` does; against a running `serve` use `POST /v1/session/reset-payload-cap`.
    ResetPayloadCap {
        #[arg(long)]
        config: PathBuf,
    },
    /// What the session's next request would carry, by part, as `GET /v1/session/context`
    /// reports it: read from the config, the journal and the archive, nothing sent and
    /// nothing written (an agent serving the session is not disturbed).
    Context {
        #[arg(long)]
        config: PathBuf,
        /// `parts`: the report; `request`: the exact body the provider would receive.
        #[arg(long, value_parser = ["parts", "request"], default_value = "parts")]
        view: String,
        /// Print the report as the endpoint's JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// A user message the next turn would bring (shown, never sent).
        #[arg(long)]
        input: Option<String>,
        /// Render the request as a streamed turn sends it.
        #[arg(long)]
        stream: bool,
    },
    /// Print an archived original, byte for byte.
    Recall {
        /// A <<ccr:KEY>> marker or its 16-hex key.
        key: String,
        #[arg(long)]
        config: PathBuf,
    },
}

fn session_ref(s: &Option<(String, String)>) -> Option<(&str, &str)> {
    s.as_ref().map(|(ns, name)| (ns.as_str(), name.as_str()))
}

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cairn-agent: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    }
}

fn fail(e: app::AppError) -> ExitCode {
    eprintln!("cairn-agent: {e}");
    ExitCode::from(e.code)
}

fn main() -> ExitCode {
    cairn_agent::allocator::configure();
    let cli = Cli::parse();
    match cli.command {
        Command::Policy { session, policy } => match print_policy(&session, policy.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cairn-agent: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Run {
            config,
            history,
            prompt,
            prompt_file,
        } => {
            let session = app::session_name(&Source::File(config.clone()));
            let telemetry = telemetry::init(false, session_ref(&session));
            let prompt = match (prompt, prompt_file) {
                (Some(t), _) => Prompt::Text(t),
                (None, Some(f)) => Prompt::File(f),
                (None, None) => {
                    return fail(app::AppError {
                        code: 2,
                        message: "--prompt or --prompt-file is required".into(),
                    });
                }
            };
            let result = runtime().block_on(app::run(&config, history.as_deref(), prompt));
            telemetry.shutdown();
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Serve {
            session,
            config,
            listen,
        } => {
            let source = match (session, config) {
                (_, Some(c)) => Source::File(c),
                (Some(s), None) => Source::Cluster(s),
                (None, None) => {
                    return fail(app::AppError {
                        code: 2,
                        message: "--session or --config is required".into(),
                    });
                }
            };
            let session = app::session_name(&source);
            let telemetry = telemetry::init(true, session_ref(&session));
            let result = runtime().block_on(app::serve(source, listen));
            // The runtime is gone: the last spans are sent now, before the process exits.
            telemetry.shutdown();
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::ResetPayloadCap { config } => {
            let session = app::session_name(&Source::File(config.clone()));
            let telemetry = telemetry::init(false, session_ref(&session));
            let result = runtime().block_on(app::reset_payload_cap_cmd(&config));
            telemetry.shutdown();
            match result {
                Ok(Some(cap)) => {
                    println!("the learned payload cap of {cap} bytes was reset");
                    ExitCode::SUCCESS
                }
                Ok(None) => {
                    println!("no payload cap was learned");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Context {
            config,
            view,
            json,
            input,
            stream,
        } => {
            let session = app::session_name(&Source::File(config.clone()));
            let telemetry = telemetry::init(false, session_ref(&session));
            let options = cairn_agent::session::InspectOptions { input, stream };
            let result = runtime().block_on(app::context_cmd(&config, options));
            telemetry.shutdown();
            let report = match result {
                Ok(r) => r,
                Err(e) => return fail(e),
            };
            let out = if view == "request" {
                report.body.clone()
            } else {
                match serde_json::to_value(&report) {
                    Ok(v) if json => {
                        let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
                        text.push('\n');
                        text.into_bytes()
                    }
                    Ok(v) => cairn_agent::breakdown::table(&v).into_bytes(),
                    Err(e) => {
                        eprintln!("cairn-agent: the report cannot be written: {e}");
                        return ExitCode::from(1);
                    }
                }
            };
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            if stdout
                .write_all(&out)
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Command::Recall { key, config } => {
            let session = app::session_name(&Source::File(config.clone()));
            let telemetry = telemetry::init(false, session_ref(&session));
            let result = runtime().block_on(app::recall_cmd(&key, &config));
            telemetry.shutdown();
            match result {
                Ok(bytes) => {
                    use std::io::Write;
                    let mut out = std::io::stdout().lock();
                    if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                        return ExitCode::from(1);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
    }
}

fn print_policy(session: &std::path::Path, policy: Option<&std::path::Path>) -> anyhow::Result<()> {
    use anyhow::Context;
    let session: cairn_crds::AgentSession = serde_yaml::from_str(
        &std::fs::read_to_string(session)
            .with_context(|| format!("reading {}", session.display()))?,
    )
    .with_context(|| format!("parsing {}", session.display()))?;
    let policy: Option<cairn_crds::CompactionPolicy> = policy
        .map(|p| -> anyhow::Result<_> {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_yaml::from_str(&text).with_context(|| format!("parsing {}", p.display()))
        })
        .transpose()?;
    let effective = cairn_crds::resolve(
        policy.as_ref().map(|p| &p.spec),
        session.spec.compaction.as_ref(),
    )?;
    let cap = session.spec.payload_cap()?;
    println!(
        "# session {}",
        session.metadata.name.as_deref().unwrap_or("-")
    );
    println!(
        "# provider {} model {}",
        session.spec.provider.kind, session.spec.provider.model
    );
    if let Some(cap) = cap {
        println!("# payloadCap {cap} ({} bytes)", cap.bytes());
    }
    println!("# policyHash {}", effective.hash());
    print!("{}", serde_yaml::to_string(&effective)?);
    Ok(())
}
