//! `countersign-dev`: the demo and the bench, beside the binaries they run.

use clap::Parser;
use countersign_dev::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Bench { .. }) {
        // The bench counts the SQL statements it causes; the same log lines otherwise.
        countersign_dev::bench::init_tracing(cli.verbose);
    } else {
        countersign_service::init_tracing(cli.verbose);
    }
    countersign_dev::run(cli).await
}
