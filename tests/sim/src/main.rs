//! `cairn-sim --listen ADDR [--script FILE]`: serves the provider simulator and prints the
//! bound address on the first line of stdout.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(name = "cairn-sim", about = "LLM provider simulator for cairn's tests")]
struct Args {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Script (JSON or YAML): replies, per-model windows, faults.
    #[arg(long)]
    script: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let script = match &args.script {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            cairn_sim::Script::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => cairn_sim::Script::default(),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let mut out = std::io::stdout();
    writeln!(out, "cairn-sim listening on http://{addr}")?;
    out.flush()?;
    cairn_sim::serve(listener, script).await?;
    Ok(())
}
