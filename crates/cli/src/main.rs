//! `countersign`: operations on a countersign installation.

use clap::Parser;
use countersign_cli::Cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    countersign_service::init_tracing(cli.verbose);
    countersign_cli::run(cli).await
}
