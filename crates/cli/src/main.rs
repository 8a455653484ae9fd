//! `countersign`: operations on a countersign installation.

use clap::Parser;
use countersign_cli::Cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    cli.logging.verbose = cli.verbose;
    countersign_service::init_tracing(&cli.logging);
    countersign_cli::run(cli).await
}
