//! `cairn-operator`: thin binary over the `cairn_operator` library.

use cairn_operator::config::{LogFormat, OperatorArgs};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "cairn-operator",
    version,
    about = "Reconciles cairn AgentSessions into per-session agent pods"
)]
struct Cli {
    /// Print the CRDs this operator installs (YAML) and exit.
    #[arg(long)]
    print_crds: bool,
    /// Install or upgrade the CRDs (server-side apply) and exit.
    #[arg(long)]
    apply_crds: bool,
    #[command(flatten)]
    operator: OperatorArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match cli.operator.log_format {
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
    }
    if cli.print_crds {
        print!("{}", cairn_crds::crds_yaml()?);
        return Ok(());
    }
    if cli.apply_crds {
        let client = kube::Client::try_default().await?;
        cairn_operator::crds::apply_crds(client).await?;
        return Ok(());
    }
    cairn_operator::run::run(cli.operator).await
}
