//! The connection flags every service takes, and the readiness they give.

use std::time::Duration;

use async_trait::async_trait;
use countersign_queue::{Broker, QueueConfig, QueueError, Topology};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::Readiness;

/// `--database-url`, `--amqp-addr` and `--queue-prefix`, with their environment fallbacks.
#[derive(Debug, Clone, clap::Args)]
pub struct Connections {
    /// PostgreSQL, the source of truth.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// RabbitMQ.
    #[arg(
        long,
        env = "AMQP_ADDR",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_addr: String,
    /// Prefix of every queue and exchange name.
    #[arg(long, env = "COUNTERSIGN_QUEUE_PREFIX", default_value = "countersign")]
    pub queue_prefix: String,
}

impl Connections {
    /// A pool of at most `max` connections; fails after ten seconds without an answer.
    pub async fn pool(&self, max: u32) -> Result<PgPool, sqlx::Error> {
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&self.database_url)
            .await
    }

    /// The broker, with the topology declared.
    pub async fn broker(&self) -> Result<Broker, QueueError> {
        Broker::connect(QueueConfig::new(
            &self.amqp_addr,
            Topology::new(&self.queue_prefix),
        ))
        .await
    }
}

/// Ready while PostgreSQL answers and the broker connection is open.
#[derive(Debug, Clone)]
pub struct Ready {
    pub pool: PgPool,
    pub broker: Broker,
}

#[async_trait]
impl Readiness for Ready {
    async fn ready(&self) -> bool {
        self.broker.is_healthy().await && sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }
}
