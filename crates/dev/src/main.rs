//! `countersign-dev`: the demo and the bench, beside the binaries they run.

use clap::Parser;
use countersign_dev::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    cli.logging.verbose = cli.verbose;
    if matches!(cli.command, Command::Bench { .. }) {
        // The bench counts the SQL statements it causes; the same log lines otherwise.
        countersign_dev::bench::init_tracing(&cli.logging);
    } else {
        countersign_service::init_tracing(&cli.logging);
    }
    countersign_dev::run(cli).await
}
