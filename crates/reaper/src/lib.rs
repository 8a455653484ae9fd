//! The countersign reaper: one reconciling pass, run by cron (or `--every` in a loop).
//!
//! A pass takes no input and decides nothing from memory: it scans PostgreSQL for work that
//! the system promised and is not doing, and repairs it with the store's guarded statements,
//! each of which repeats the predicate that made the scan pick the run. So a pass is
//! idempotent and safe to run twice at once — the second pass's updates simply lose — and it
//! has no retries inside: the next activation is the retry.
//!
//! 1. `running` runs whose lease expired: failed `not_retryable` when a non-idempotent
//!    external write may have happened, failed `retries_exhausted` past the requeue limit,
//!    otherwise back to `queued` with an exponential backoff.
//! 2. `queued` runs whose wake-up was lost (never dispatched since they became available):
//!    published again.
//! 3. `waiting_for_approval` runs past their approval deadline: cancelled
//!    `approval_expired`.
//!
//! It must never run a segment, never touch a run that moved since its scan, and never
//! retry a run that may have performed a non-idempotent write.

use std::fmt;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use countersign_core::{Event, RunId, TerminationReason};
use countersign_queue::{Broker, QueueError};
use countersign_store::{NewEvent, ReapOutcome, Store, StoreError};
use serde_json::json;

/// How a pass treats what it finds.
#[derive(Debug, Clone)]
pub struct ReaperConfig {
    /// Requeues of one run before it fails `retries_exhausted`.
    pub max_requeues: i32,
    /// The first backoff; doubled for every earlier requeue of the run, up to 64 times.
    pub backoff: Duration,
    /// How long a queued run may wait for its wake-up before it counts as lost.
    pub dispatch_grace: Duration,
    /// Runs handled per scan.
    pub batch: i64,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            max_requeues: 3,
            backoff: Duration::from_secs(5),
            dispatch_grace: Duration::from_secs(30),
            batch: 500,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassSummary {
    pub requeued: u64,
    pub retries_exhausted: u64,
    pub not_retryable: u64,
    /// Runs that moved between the scan and the update (a heartbeat or a settle won).
    pub skipped: u64,
    pub redispatched: u64,
    pub approvals_expired: u64,
}

impl fmt::Display for PassSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reaper pass: requeued={} retries_exhausted={} not_retryable={} skipped={} redispatched={} approvals_expired={}",
            self.requeued,
            self.retries_exhausted,
            self.not_retryable,
            self.skipped,
            self.redispatched,
            self.approvals_expired
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReaperError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("broker: {0}")]
    Queue(#[from] QueueError),
}

impl ReaperError {
    pub fn code(&self) -> &'static str {
        match self {
            ReaperError::Store(e) => e.code(),
            ReaperError::Queue(e) => e.code(),
        }
    }
}

/// One pass. Stops at the first store or broker error: what it did so far is committed, and
/// the next pass picks up the rest.
pub async fn pass(
    store: &Store,
    broker: &Broker,
    config: &ReaperConfig,
) -> Result<PassSummary, ReaperError> {
    let mut summary = PassSummary::default();

    for lease in store.expired_leases(config.batch).await? {
        let backoff = config.backoff * 2u32.pow(lease.requeue_count.clamp(0, 6) as u32);
        let outcome = store
            .reap_expired(&lease, config.max_requeues, backoff)
            .await?;
        tracing::info!(run.id = %lease.run_id, ?outcome, "expired lease reaped");
        match outcome {
            ReapOutcome::Requeued => summary.requeued += 1,
            ReapOutcome::Lost => summary.skipped += 1,
            ReapOutcome::RetriesExhausted => {
                summary.retries_exhausted += 1;
                failed(
                    store,
                    broker,
                    lease.run_id,
                    TerminationReason::RetriesExhausted,
                )
                .await?;
            }
            ReapOutcome::NotRetryable => {
                summary.not_retryable += 1;
                failed(store, broker, lease.run_id, TerminationReason::NotRetryable).await?;
            }
        }
    }

    for run_id in store
        .lost_dispatches(config.dispatch_grace, config.batch)
        .await?
    {
        broker.publish_segment(run_id).await?;
        if store.mark_dispatched(run_id).await? {
            summary.redispatched += 1;
        }
        tracing::info!(run.id = %run_id, "lost dispatch published again");
    }

    for waiting in store.expired_approvals(config.batch).await? {
        if store
            .expire_approval(waiting.run_id, waiting.suspension_seq)
            .await?
        {
            summary.approvals_expired += 1;
            let fields =
                json!({"run_id": waiting.run_id, "termination_reason": "approval_expired"});
            announce(
                store,
                broker,
                waiting.run_id,
                Event::new("run.cancelled", fields),
            )
            .await?;
        }
    }
    for (action, n) in [
        ("requeued", summary.requeued),
        ("retries_exhausted", summary.retries_exhausted),
        ("not_retryable", summary.not_retryable),
        ("skipped", summary.skipped),
        ("redispatched", summary.redispatched),
        ("approval_expired", summary.approvals_expired),
    ] {
        metrics::counter!("countersign_reaper_actions_total", "action" => action).increment(n);
    }
    Ok(summary)
}

async fn failed(
    store: &Store,
    broker: &Broker,
    run_id: RunId,
    reason: TerminationReason,
) -> Result<(), ReaperError> {
    let fields = json!({"run_id": run_id, "termination_reason": reason.as_str()});
    announce(store, broker, run_id, Event::new("run.failed", fields)).await
}

/// Records the event in the run's audit trail and publishes it.
async fn announce(
    store: &Store,
    broker: &Broker,
    run_id: RunId,
    event: Event,
) -> Result<(), ReaperError> {
    let payload = serde_json::Value::Object(event.fields.clone());
    store
        .append_event(run_id, &NewEvent::new(event.name, payload))
        .await?;
    let at = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    broker.publish_event(&event, &at).await?;
    Ok(())
}
