//! `countersign-coordinator`: takes run requests and decisions from RabbitMQ, gates them, and
//! dispatches segments.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use countersign_coordinator::{service, Coordinator};
use countersign_service::Connections;

#[derive(Debug, Parser)]
#[command(
    name = "countersign-coordinator",
    version,
    about = "Gates run requests and approval decisions from any queue producer."
)]
struct Args {
    #[command(flatten)]
    connections: Connections,
    /// Where to serve /metrics, /healthz and /readyz (e.g. 0.0.0.0:9465); none when unset.
    #[arg(long, env = "COUNTERSIGN_HTTP_ADDR")]
    http_addr: Option<std::net::SocketAddr>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Before anything can report ready (see `shutdown_signal`).
    let shutdown = countersign_service::shutdown_signal();
    let telemetry = args
        .connections
        .init_telemetry("countersign-coordinator")
        .context("setting up traces")?;
    let (store, broker) = args.connections.open(8, args.http_addr).await?;
    let countersign_service::tools::Tools {
        registry, users, ..
    } = countersign_service::tools::tools(&store).await?;
    let coordinator = Coordinator::with_users(store, Arc::new(registry), users);
    tracing::info!("coordinator started");
    service::run(coordinator, broker, shutdown).await;
    telemetry.shutdown().await;
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
