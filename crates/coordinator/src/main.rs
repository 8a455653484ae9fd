//! `countersign-coordinator`: takes run requests and decisions from RabbitMQ, gates them, and
//! dispatches segments.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use countersign_coordinator::{policies, service, Coordinator};
use countersign_policy::PolicySource;
use countersign_service::webhooks::{self, DeliveryConfig, Trust};
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
    /// The web inbox's address (e.g. https://countersign.example/inbox): webhook deliveries
    /// about a run link its card there. No link when unset.
    #[arg(long, env = "COUNTERSIGN_INBOX_URL")]
    inbox_url: Option<String>,
    /// Seconds before a failed webhook delivery is tried again, doubled after each further
    /// failure (at most an hour).
    #[arg(long, env = "COUNTERSIGN_WEBHOOK_RETRY_SECS", default_value_t = 5)]
    webhook_retry_secs: u64,
    /// Hours a webhook delivery is tried for before it is failed.
    #[arg(long, env = "COUNTERSIGN_WEBHOOK_GIVE_UP_HOURS", default_value_t = 24)]
    webhook_give_up_hours: u64,
    /// A PEM file of certificate authorities that `https://` webhook endpoints' certificates
    /// may chain to, besides the public roots (receivers under an internal CA).
    #[arg(long, env = "COUNTERSIGN_WEBHOOKS_CA_FILE")]
    webhooks_ca_file: Option<PathBuf>,
    /// PostgreSQL connections at most, shared by the gates, the relay and the webhook
    /// deliveries.
    #[arg(long, env = "COUNTERSIGN_COORDINATOR_POOL_SIZE", default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..))]
    pool_size: u32,
    /// Policy files (Cedar, with a `// policy:` / `// version:` / `// mode:` header), evaluated
    /// on every card in the order given; re-read when they change. A file that does not load
    /// at start stops the process, naming its line. None: every card waits for a person.
    #[arg(
        long = "policy-file",
        env = "COUNTERSIGN_POLICY_FILES",
        value_delimiter = ','
    )]
    policy_files: Vec<PathBuf>,
    /// Milliseconds between two looks for cards the policies have not seen.
    #[arg(long, env = "COUNTERSIGN_POLICY_POLL_MS", default_value_t = 250)]
    policy_poll_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Checked before anything starts: an unusable CA file stops the process.
    let webhook_trust = Trust::new(args.webhooks_ca_file.as_deref())
        .map_err(|e| anyhow::anyhow!("--webhooks-ca-file: {e} ({})", e.code()))?;
    let policies = PolicySource::open(&args.policy_files)
        .map_err(|e| anyhow::anyhow!("policy refused: {e} ({})", e.code()))?;
    let started = countersign_service::start(
        "countersign-coordinator",
        &args.connections,
        &args.keys,
        &args.tools,
        countersign_service::Pools::of(args.pool_size),
    )
    .await?;
    let tools = started.tools;
    let deliveries = DeliveryConfig {
        inbox_url: args.inbox_url,
        first_retry: Duration::from_secs(args.webhook_retry_secs.max(1)),
        give_up_after: Duration::from_secs(args.webhook_give_up_hours.saturating_mul(3600)),
        ..DeliveryConfig::default()
    };
    let (stop_webhooks, webhooks_stopped) = tokio::sync::oneshot::channel::<()>();
    let store = started.store.clone();
    let webhooks = tokio::spawn(async move {
        webhooks::run(store, deliveries, &webhook_trust, async move {
            let _ = webhooks_stopped.await;
        })
        .await
    });
    let coordinator = Coordinator::with_users(started.store, Arc::new(tools.registry), tools.users);
    let (stop_policies, policies_stopped) = tokio::sync::oneshot::channel::<()>();
    let every = Duration::from_millis(args.policy_poll_ms.max(10));
    let policies = tokio::spawn(policies::run(
        coordinator.clone(),
        policies,
        every,
        async move {
            let _ = policies_stopped.await;
        },
    ));
    tracing::info!("coordinator started");
    service::run(coordinator, started.broker, started.shutdown).await;
    let _ = stop_policies.send(());
    let _ = policies.await;
    let _ = stop_webhooks.send(());
    let _ = webhooks.await;
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
