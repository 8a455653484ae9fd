//! `countersign-reaper`: one reconciling pass per invocation (a cron job), or one every
//! `--every` seconds. Prints one summary line per pass; exits non-zero when PostgreSQL or
//! RabbitMQ could not be reached.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use countersign_crypto::Keyring;
use countersign_queue::Broker;
use countersign_reaper::{pass, ReaperConfig};
use countersign_service::{Connections, Ready, SessionLimits};
use countersign_store::Store;
use tracing::Instrument;

/// The service's name, in its logs, its traces and `pg_stat_activity`.
const NAME: &str = "countersign-reaper";

#[derive(Debug, Parser)]
#[command(
    name = "countersign-reaper",
    version,
    about = "Rescues runs whose lease expired, re-dispatches lost wake-ups, expires approvals, republishes unsent events."
)]
struct Args {
    #[command(flatten)]
    connections: Connections,
    /// Requeues of one run before it fails `retries_exhausted`.
    #[arg(long, env = "COUNTERSIGN_MAX_REQUEUES", default_value_t = 3)]
    max_requeues: i32,
    /// First backoff of a requeued run, in seconds (doubled per earlier requeue).
    #[arg(long, default_value_t = 5)]
    backoff_secs: u64,
    /// Seconds a queued run may wait for its wake-up before it is published again.
    #[arg(long, default_value_t = 30)]
    dispatch_grace_secs: u64,
    /// Seconds an event may stay unpublished in the outbox before it is published again.
    #[arg(long, default_value_t = 10)]
    republish_after_secs: u64,
    /// Hours a delivered webhook delivery, and an outbox row a relay before migration 0023
    /// marked published, stay before a pass deletes them (relays delete what the broker
    /// confirmed; the audit trail keeps every run's history).
    #[arg(
        long,
        env = "COUNTERSIGN_OUTBOX_RETENTION_HOURS",
        default_value_t = 168
    )]
    outbox_retention_hours: u64,
    /// Run a pass every this many seconds instead of once (needed by --http-addr).
    #[arg(long)]
    every: Option<u64>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.connections.http_addr.is_some() && args.every.is_none() {
        eprintln!("reaper: --http-addr (COUNTERSIGN_HTTP_ADDR) serves only with --every");
        return ExitCode::from(2);
    }
    // Before anything can report ready (see `shutdown_signal`); one for every pass.
    let shutdown = countersign_service::shutdown_signal();
    let telemetry = match args.connections.init_telemetry(NAME) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("reaper: cannot set up traces: {e}");
            return ExitCode::from(2);
        }
    };
    let code = reap(args, shutdown).await;
    // A cron job's spans are sent before it exits.
    telemetry.shutdown().await;
    code
}

impl Args {
    /// What a pass does, as the arguments set it.
    fn config(&self) -> ReaperConfig {
        ReaperConfig {
            max_requeues: self.max_requeues,
            backoff: Duration::from_secs(self.backoff_secs),
            dispatch_grace: Duration::from_secs(self.dispatch_grace_secs),
            republish_after: Duration::from_secs(self.republish_after_secs),
            outbox_retention: Duration::from_secs(self.outbox_retention_hours.saturating_mul(3600)),
            ..ReaperConfig::default()
        }
    }
}

/// The store and the broker a pass works with; the exit code when either is unreachable.
async fn connect(args: &Args, limits: &SessionLimits) -> Result<(Store, Broker), ExitCode> {
    let pool = match args.connections.pool(NAME, 2, limits).await {
        Ok(pool) => pool,
        Err(e) => {
            tracing::error!(error = %e, "PostgreSQL unreachable");
            eprintln!("reaper: PostgreSQL unreachable (database_error)");
            return Err(ExitCode::from(2));
        }
    };
    // The reaper seals and opens nothing: a key that lives only in this process will do.
    let keyring = Keyring::ephemeral();
    let store = Store::new(pool, Arc::new(keyring)).with_deadline(limits.call);
    let broker = match args.connections.broker().await {
        Ok(broker) => broker,
        Err(e) => {
            tracing::error!(code = e.code(), error = %e, "RabbitMQ unreachable");
            eprintln!("reaper: RabbitMQ unreachable ({})", e.code());
            return Err(ExitCode::from(2));
        }
    };
    Ok((store, broker))
}

async fn reap(args: Args, shutdown: impl std::future::Future<Output = ()>) -> ExitCode {
    tokio::pin!(shutdown);
    let config = args.config();
    let limits = SessionLimits::default();
    let (store, broker) = match connect(&args, &limits).await {
        Ok(connected) => connected,
        Err(code) => return code,
    };

    let probe = match args.connections.probe(NAME, &limits) {
        Ok(probe) => probe,
        Err(e) => {
            eprintln!("reaper: PostgreSQL address unusable: {e}");
            return ExitCode::from(2);
        }
    };
    let ready = Arc::new(Ready {
        probe,
        broker: broker.clone(),
        vitals: store.vitals().clone(),
    });
    if let Err(e) = countersign_service::spawn_surfaces(args.connections.http_addr, ready).await {
        eprintln!("reaper: cannot serve the HTTP surfaces: {e}");
        return ExitCode::from(2);
    }
    countersign_reaper::register_metrics();

    // A pass waits on no row (it skips what another transaction holds) and each statement has
    // its limits; the pass as a whole has one too, so a silent database cannot hold a loop.
    let within = limits.statement * 2;
    loop {
        if !one_pass(&store, &broker, &config, within).await && args.every.is_none() {
            return ExitCode::from(1);
        }
        let Some(every) = args.every else {
            return ExitCode::SUCCESS;
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(every)) => {}
            () = &mut shutdown => return ExitCode::SUCCESS,
        }
    }
}

/// One pass within `within`, timed into `countersign_reaper_pass_duration_seconds`; prints its
/// summary line, or logs why it failed. Whether it succeeded.
async fn one_pass(store: &Store, broker: &Broker, config: &ReaperConfig, within: Duration) -> bool {
    let started = std::time::Instant::now();
    let passed = tokio::time::timeout(
        within,
        pass(store, broker, config).instrument(tracing::info_span!("reaper_pass")),
    )
    .await;
    metrics::histogram!("countersign_reaper_pass_duration_seconds")
        .record(started.elapsed().as_secs_f64());
    match passed {
        Ok(Ok(summary)) => {
            println!("{summary}");
            true
        }
        Err(_) => {
            tracing::error!(?within, "reaper pass did not end in time");
            eprintln!("reaper pass failed (reaper_pass_timeout)");
            false
        }
        Ok(Err(e)) => {
            tracing::error!(code = e.code(), error = %e, "reaper pass failed");
            eprintln!("reaper pass failed ({})", e.code());
            false
        }
    }
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
