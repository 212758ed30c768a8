//! `cairn-operator`: thin binary over the `cairn_operator` library.

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let cli = Cli::parse();
    if cli.print_crds {
        print!("{}", cairn_crds::crds_yaml()?);
        return Ok(());
    }
    if cli.apply_crds {
        let client = kube::Client::try_default().await?;
        cairn_operator::crds::apply_crds(client).await?;
        return Ok(());
    }
    anyhow::bail!(
        "the reconcile loop is not part of this build yet; use --print-crds or --apply-crds"
    )
}
