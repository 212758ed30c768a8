//! `cairn-gateway`: thin binary over the `cairn_gateway` library.

use cairn_gateway::config::{GatewayArgs, LogFormat};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "cairn-gateway",
    version,
    about = "One authenticated endpoint for every cairn session"
)]
struct Cli {
    #[command(flatten)]
    gateway: GatewayArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match cli.gateway.log_format {
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
    }
    cairn_gateway::run::run(cli.gateway).await
}
