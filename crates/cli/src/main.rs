//! `countersign`: operations on a countersign installation, and the demo.

use clap::Parser;
use countersign_cli::Cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if matches!(cli.command, countersign_cli::Command::Bench { .. }) {
        // The bench counts the SQL statements it causes; the same log lines otherwise.
        countersign_cli::bench::init_tracing(cli.verbose);
    } else {
        countersign_service::init_tracing(cli.verbose);
    }
    countersign_cli::run(cli).await
}
