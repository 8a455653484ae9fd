//! The long-running worker: wake-ups from the segments queue, a polling fallback, and a
//! bounded number of segments at a time.
//!
//! A delivery only says "look at this run": the claim decides, and the delivery is acked as
//! soon as the claim committed or lost, so a long segment never holds a delivery open past the
//! broker's consumer timeout. A lost wake-up costs at most one poll interval: every interval,
//! while a slot is free, the worker claims the oldest available run itself.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{SecondsFormat, Utc};
use countersign_core::Event;
use countersign_queue::{parse_segment, Broker, Delivery};
use countersign_store::Claim;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::segment::{EventSink, SegmentRunner};

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The lease owner this process claims as; unique per process.
    pub owner: String,
    /// Segments run at once; also the consumer's prefetch.
    pub concurrency: usize,
    /// How often the worker looks for available runs without a wake-up.
    pub poll_interval: Duration,
    /// How long shutdown waits for running segments before abandoning them to the reaper.
    pub shutdown_grace: Duration,
}

/// Publishes the runner's events on the broker's events exchange.
#[derive(Debug, Clone)]
pub struct BrokerEvents(pub Broker);

#[async_trait]
impl EventSink for BrokerEvents {
    async fn publish(&self, event: &Event) {
        let at = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
        if let Err(e) = self.0.publish_event(event, &at).await {
            tracing::warn!(event = event.name, code = e.code(), error = %e, "event not published");
        }
    }
}

/// Runs until `shutdown` resolves, then waits up to the grace period for running segments.
pub async fn run(
    runner: SegmentRunner,
    broker: Broker,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let prefetch = u16::try_from(config.concurrency.max(1)).unwrap_or(u16::MAX);
    let queue = broker.topology().segments();
    let mut running: JoinSet<()> = JoinSet::new();
    let mut consumer = None;
    let mut poll = tokio::time::interval(config.poll_interval);
    tokio::pin!(shutdown);

    loop {
        if consumer.is_none() {
            match broker.consume(&queue, prefetch).await {
                Ok(c) => consumer = Some(c),
                Err(e) => {
                    tracing::warn!(code = e.code(), error = %e, "cannot consume segments; polling only")
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = running.join_next(), if !running.is_empty() => {}
            _ = poll.tick() => {
                while let Ok(permit) = slots.clone().try_acquire_owned() {
                    match runner.store.claim_next(&config.owner, runner.lease_ttl).await {
                        Ok(Some(claim)) => spawn(&mut running, &runner, claim, permit),
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(code = e.code(), error = %e, "poll claim failed");
                            break;
                        }
                    }
                }
            }
            delivery = next(&mut consumer) => match delivery {
                Some(delivery) => {
                    let Ok(permit) = slots.clone().acquire_owned().await else { break };
                    if let Some(claim) = take(&runner, &broker, &config, delivery).await {
                        spawn(&mut running, &runner, claim, permit);
                    }
                }
                None => {
                    consumer = None;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            },
        }
    }

    tracing::info!(
        running = running.len(),
        "shutting down; waiting for running segments"
    );
    let drained = tokio::time::timeout(config.shutdown_grace, async {
        while running.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            abandoned = running.len(),
            "segments abandoned at shutdown; their leases will expire"
        );
        running.abort_all();
    }
}

async fn next(consumer: &mut Option<countersign_queue::Consumer>) -> Option<Delivery> {
    let c = consumer.as_mut()?;
    match c.next().await {
        Some(Ok(delivery)) => Some(delivery),
        Some(Err(e)) => {
            tracing::warn!(code = e.code(), error = %e, "segment consumer failed");
            None
        }
        None => None,
    }
}

/// Claims the run a wake-up names, then acks it: won or lost, the row is the truth.
async fn take(
    runner: &SegmentRunner,
    broker: &Broker,
    config: &WorkerConfig,
    delivery: Delivery,
) -> Option<Claim> {
    let run_id = match parse_segment(&delivery.body) {
        Ok(run_id) => run_id,
        Err(e) => {
            if let Err(e) = delivery.dead_letter(broker, &e.reason()).await {
                tracing::warn!(code = e.code(), error = %e, "could not dead-letter a malformed wake-up");
            }
            return None;
        }
    };
    match runner
        .store
        .claim(run_id, &config.owner, runner.lease_ttl)
        .await
    {
        Ok(claim) => {
            if let Err(e) = delivery.ack().await {
                tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "ack failed");
            }
            claim
        }
        Err(e) => {
            tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "claim failed; wake-up requeued");
            if let Err(e) = delivery.requeue().await {
                tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "requeue failed");
            }
            None
        }
    }
}

fn spawn(
    running: &mut JoinSet<()>,
    runner: &SegmentRunner,
    claim: Claim,
    permit: OwnedSemaphorePermit,
) {
    let runner = runner.clone();
    running.spawn(async move {
        let _permit = permit;
        let run_id = claim.lease.run_id;
        match runner.run(&claim).await {
            Ok(end) => tracing::info!(run.id = %run_id, ?end, "segment ended"),
            Err(e) => tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "segment stopped on a store error"),
        }
    });
}
