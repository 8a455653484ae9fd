//! `countersign-coordinator`: takes run requests and decisions from RabbitMQ, gates them, and
//! dispatches segments.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use countersign_coordinator::{service, Coordinator};
use countersign_core::ToolRegistry;
use countersign_crypto::Keyring;
use countersign_queue::{Broker, QueueConfig, Topology};
use countersign_store::Store;
use sqlx::postgres::PgPoolOptions;

#[derive(Debug, Parser)]
#[command(
    name = "countersign-coordinator",
    version,
    about = "Gates run requests and approval decisions from any queue producer."
)]
struct Args {
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    #[arg(
        long,
        env = "AMQP_ADDR",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp_addr: String,
    /// Prefix of every queue and exchange name.
    #[arg(long, env = "COUNTERSIGN_QUEUE_PREFIX", default_value = "countersign")]
    queue_prefix: String,
    /// Where to serve /metrics, /healthz and /readyz (e.g. 0.0.0.0:9465); none when unset.
    #[arg(long, env = "COUNTERSIGN_HTTP_ADDR")]
    http_addr: Option<std::net::SocketAddr>,
}

/// Ready while PostgreSQL answers and the broker connection is open.
struct Ready {
    pool: sqlx::PgPool,
    broker: Broker,
}

#[async_trait::async_trait]
impl countersign_telemetry::Readiness for Ready {
    async fn ready(&self) -> bool {
        self.broker.is_healthy().await && sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    countersign_telemetry::init_tracing(false);
    let keyring = Keyring::from_env()
        .context("loading the keyring (COUNTERSIGN_KEYS or COUNTERSIGN_KEY_FILE)")?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&args.database_url)
        .await
        .context("connecting to PostgreSQL")?;
    let store = Store::new(pool.clone(), Arc::new(keyring));
    let broker = Broker::connect(QueueConfig::new(
        &args.amqp_addr,
        Topology::new(&args.queue_prefix),
    ))
    .await
    .context("connecting to RabbitMQ")?;
    let ready = Arc::new(Ready {
        pool,
        broker: broker.clone(),
    });
    countersign_telemetry::spawn_surfaces(args.http_addr, ready)
        .await
        .context("serving the HTTP surfaces")?;
    let mut registry = ToolRegistry::new();
    countersign_content::register(&mut registry, store.clone());
    let coordinator = Coordinator::new(store, Arc::new(registry));
    tracing::info!("coordinator started");
    service::run(
        coordinator,
        broker,
        countersign_telemetry::shutdown_signal(),
    )
    .await;
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
