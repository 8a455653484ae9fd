//! `countersign`: operations on a countersign installation.

use std::process::ExitCode;

use clap::Parser;
use countersign_cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let mut cli = Cli::parse();
    cli.logging.verbose = cli.verbose;
    countersign_service::init_tracing(&cli.logging);
    match countersign_cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", countersign_cli::render::error(&e));
            ExitCode::FAILURE
        }
    }
}
