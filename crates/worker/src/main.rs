//! `countersign-worker`: claims and runs segments of agent runs until stopped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use countersign_model::ModelCatalog;
use countersign_service::{Connections, KeySettings, Pools, SessionLimits, ToolSettings};
use countersign_worker::service::{self, WorkerConfig};
use countersign_worker::{Models, SegmentRunner};

#[derive(Debug, Parser)]
#[command(
    name = "countersign-worker",
    version,
    about = "Runs leased segments of agent runs."
)]
struct Args {
    #[command(flatten)]
    connections: Connections,
    #[command(flatten)]
    keys: KeySettings,
    #[command(flatten)]
    tools: ToolSettings,
    /// The script of agents whose model settings are `{"provider": "scripted"}` without one.
    #[arg(long, env = "COUNTERSIGN_MODEL_SCRIPT")]
    model_script: Option<PathBuf>,
    /// Segments run at once.
    #[arg(long, env = "COUNTERSIGN_WORKER_CONCURRENCY", default_value_t = 4)]
    concurrency: usize,
    /// PostgreSQL connections at most, shared by the segments (a segment holds one only while
    /// it talks to the database, never while it waits on a model or a tool server). Never more
    /// than twice the concurrency plus two. Approved turns' transactions, which wait on a
    /// colleague's lock on the content for as long as it is held, take half of them at most.
    #[arg(long, env = "COUNTERSIGN_WORKER_POOL_SIZE", default_value_t = 32)]
    pool_size: u32,
    /// Lease time to live, in seconds; renewed every third of it.
    #[arg(long, default_value_t = 30)]
    lease_ttl_secs: u64,
    /// Seconds between looks for runs whose wake-up was lost.
    #[arg(long, default_value_t = 5)]
    poll_interval_secs: u64,
    /// The lease owner name; defaults to the host name and process id.
    #[arg(long, env = "COUNTERSIGN_WORKER_ID")]
    owner: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pool_size = u32::try_from(args.concurrency.saturating_mul(2).saturating_add(2))
        .unwrap_or(u32::MAX)
        .min(args.pool_size.max(2));
    let lease_ttl = Duration::from_secs(args.lease_ttl_secs.max(3));
    let started = countersign_service::start(
        "countersign-worker",
        &args.connections,
        &args.keys,
        &args.tools,
        Pools {
            connections: pool_size,
            turns: Some(pool_size / 2),
            limits: SessionLimits::for_lease(lease_ttl),
        },
    )
    .await?;
    let catalog = ModelCatalog::new(countersign_service::settings::environment);
    let catalog = match &args.model_script {
        Some(path) => catalog.with_default_script(path),
        None => catalog,
    };
    let models = Models::PerAgent(Arc::new(catalog));
    let runner = SegmentRunner::new(started.store, started.tools, models, lease_ttl);
    let config = WorkerConfig {
        owner: args.owner.unwrap_or_else(default_owner),
        concurrency: args.concurrency.max(1),
        poll_interval: Duration::from_secs(args.poll_interval_secs.max(1)),
        shutdown_grace: lease_ttl,
    };
    tracing::info!(owner = %config.owner, concurrency = config.concurrency, "worker started");
    service::run(runner, started.broker, config, started.shutdown).await;
    started.telemetry.shutdown().await;
    Ok(())
}

fn default_owner() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    format!(
        "{}:{}",
        if host.is_empty() { "worker" } else { &host },
        std::process::id()
    )
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
