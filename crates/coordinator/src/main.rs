//! `countersign-coordinator`: takes run requests and decisions from RabbitMQ, gates them, and
//! dispatches segments.

use std::sync::Arc;

use clap::Parser;
use countersign_coordinator::{service, Coordinator};
use countersign_service::{Connections, KeySettings, ToolSettings};

#[derive(Debug, Parser)]
#[command(
    name = "countersign-coordinator",
    version,
    about = "Gates run requests and approval decisions from any queue producer."
)]
struct Args {
    #[command(flatten)]
    connections: Connections,
    #[command(flatten)]
    keys: KeySettings,
    #[command(flatten)]
    tools: ToolSettings,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let started = countersign_service::start(
        "countersign-coordinator",
        &args.connections,
        &args.keys,
        &args.tools,
        8,
    )
    .await?;
    let tools = started.tools;
    let coordinator = Coordinator::with_users(started.store, Arc::new(tools.registry), tools.users);
    tracing::info!("coordinator started");
    service::run(coordinator, started.broker, started.shutdown).await;
    started.telemetry.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Args::command().debug_assert();
    }
}
