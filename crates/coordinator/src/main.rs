//! `countersign-coordinator`: takes run requests and decisions from RabbitMQ, gates them, and
//! dispatches segments.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use countersign_coordinator::{service, Coordinator};
use countersign_crypto::Keyring;
use countersign_service::{Connections, Ready};
use countersign_store::Store;

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
    let keyring = Keyring::from_env()
        .context("loading the keyring (COUNTERSIGN_KEYS or COUNTERSIGN_KEY_FILE)")?;
    let pool = args
        .connections
        .pool(8)
        .await
        .context("connecting to PostgreSQL")?;
    let broker = args
        .connections
        .broker()
        .await
        .context("connecting to RabbitMQ")?;
    let ready = Arc::new(Ready {
        pool: pool.clone(),
        broker: broker.clone(),
    });
    countersign_service::spawn_surfaces(args.http_addr, ready)
        .await
        .context("serving the HTTP surfaces")?;

    let store = Store::new(pool, Arc::new(keyring));
    let registry = countersign_service::tools::registry(&store)
        .await
        .context("discovering the remote tool servers (COUNTERSIGN_TOOL_SERVERS)")?;
    let users = countersign_service::tools::users(&store);
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
