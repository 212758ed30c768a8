//! `cairn-agent`: thin binary over the `cairn_agent` library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Policy { session, policy } => match print_policy(&session, policy.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cairn-agent: {e:#}");
                ExitCode::from(2)
            }
        },
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
