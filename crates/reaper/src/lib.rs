//! The countersign reaper: one reconciling pass, run by cron (or `--every` in a loop).
//!
//! A pass takes no input and decides nothing from memory: it scans PostgreSQL for work that
//! the system promised and is not doing, and repairs it with the store's guarded statements,
//! each of which repeats the predicate that made the scan pick the run. So a pass is
//! idempotent and safe to run twice at once — the second pass's updates simply lose — and it
//! has no retries inside: the next activation is the retry.
//!
//! 1. `running` runs whose lease expired: back to `queued` with an exponential backoff, or,
//!    past the requeue limit, failed — `outcome_unknown` when a write it sent outside the
//!    store is still in doubt, `retries_exhausted` otherwise. A run requeued with a call in
//!    doubt keeps it stamped: its next segment asks the resource what became of the call's
//!    idempotency key before anything else, and never sends a non-idempotent write again
//!    blindly.
//! 2. `queued` runs whose wake-up was lost (never dispatched since they became available):
//!    published again.
//! 3. `waiting_for_approval` runs past their approval deadline: cancelled
//!    `approval_expired`.
//! 4. Events: every transition above announces itself in its own transaction (`run.failed`,
//!    `run.cancelled` in the outbox), and the pass publishes what is unpublished — first the
//!    rows left unpublished longer than [`ReaperConfig::republish_after`], whose process relay
//!    failed or died (`events_republished`), then its own and the rest older than the
//!    relays' sweep age (`events_published`). Publishing is confirmed; a row is deleted only
//!    once the broker took it, so a failure leaves it for the next pass.
//! 5. The outbox is a handoff, not the record: a relay deletes what it sent, and rows a relay
//!    before migration 0023 kept marked published are deleted once older than
//!    [`ReaperConfig::outbox_retention`] (`events_pruned`), never one unpublished. What
//!    happened to every run stays in its audit trail.
//!
//! It must never run a segment, never touch a run that moved since its scan, never wait on a
//! run row another transaction holds (the run is the next pass's; see the store's reaper
//! module), and never clear the stamp of a call in doubt.

use std::fmt;
use std::time::Duration;

use countersign_queue::{Broker, QueueError};
use countersign_service::relay::{relay_round, sweep, RelayConfig, RelayError, SWEEP_AFTER};
use countersign_store::{ReapOutcome, Store, StoreError};

/// How a pass treats what it finds.
#[derive(Debug, Clone)]
pub struct ReaperConfig {
    /// Requeues of one run before it fails `retries_exhausted`.
    pub max_requeues: i32,
    /// The first backoff; doubled for every earlier requeue of the run, up to 64 times.
    pub backoff: Duration,
    /// How long a queued run may wait for its wake-up before it counts as lost.
    pub dispatch_grace: Duration,
    /// Runs handled per scan, and outbox rows per relay transaction.
    pub batch: i64,
    /// How long an event may stay unpublished before the pass republishes it: longer than a
    /// process relay's polling interval, so a healthy relay is not raced.
    pub republish_after: Duration,
    /// How long a delivered webhook delivery, and an outbox row a relay before migration 0023
    /// marked published, stay before a pass deletes them.
    pub outbox_retention: Duration,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            max_requeues: 3,
            backoff: Duration::from_secs(5),
            dispatch_grace: Duration::from_secs(30),
            batch: 500,
            republish_after: Duration::from_secs(10),
            outbox_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassSummary {
    pub requeued: u64,
    pub retries_exhausted: u64,
    /// Failed `outcome_unknown`: retries spent with a write in doubt.
    pub outcome_unknown: u64,
    /// Runs that moved between the scan and the update (a heartbeat or a settle won), or whose
    /// row another transaction held: the next pass looks again.
    pub skipped: u64,
    pub redispatched: u64,
    pub approvals_expired: u64,
    /// Cards announced `card.reminded` by this pass.
    pub cards_reminded: u64,
    /// Cards escalated to their backup group by this pass.
    pub cards_escalated: u64,
    /// Events left unpublished longer than the grace, published by this pass.
    pub events_republished: u64,
    /// Other unpublished events (this pass's own among them), published by this pass.
    pub events_published: u64,
    /// Published events older than the retention, deleted from the outbox.
    pub events_pruned: u64,
    /// Webhook deliveries finished (delivered or failed) longer than the retention ago, deleted
    /// with their attempts.
    pub webhook_deliveries_pruned: u64,
}

/// What a pass did to one run or event: the `action` label of
/// `countersign_reaper_actions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ReaperAction {
    Requeued,
    RetriesExhausted,
    OutcomeUnknown,
    Skipped,
    Redispatched,
    ApprovalExpired,
    CardReminded,
    CardEscalated,
    EventRepublished,
    EventPublished,
    EventPruned,
    WebhookDeliveryPruned,
}

impl ReaperAction {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl PassSummary {
    /// Each action with its count.
    pub fn actions(&self) -> [(ReaperAction, u64); 12] {
        [
            (ReaperAction::Requeued, self.requeued),
            (ReaperAction::RetriesExhausted, self.retries_exhausted),
            (ReaperAction::OutcomeUnknown, self.outcome_unknown),
            (ReaperAction::Skipped, self.skipped),
            (ReaperAction::Redispatched, self.redispatched),
            (ReaperAction::ApprovalExpired, self.approvals_expired),
            (ReaperAction::CardReminded, self.cards_reminded),
            (ReaperAction::CardEscalated, self.cards_escalated),
            (ReaperAction::EventRepublished, self.events_republished),
            (ReaperAction::EventPublished, self.events_published),
            (ReaperAction::EventPruned, self.events_pruned),
            (
                ReaperAction::WebhookDeliveryPruned,
                self.webhook_deliveries_pruned,
            ),
        ]
    }
}

impl fmt::Display for PassSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reaper pass: requeued={} retries_exhausted={} outcome_unknown={} skipped={} redispatched={} approvals_expired={} cards_reminded={} cards_escalated={} events_republished={} events_published={} events_pruned={} webhook_deliveries_pruned={}",
            self.requeued,
            self.retries_exhausted,
            self.outcome_unknown,
            self.skipped,
            self.redispatched,
            self.approvals_expired,
            self.cards_reminded,
            self.cards_escalated,
            self.events_republished,
            self.events_published,
            self.events_pruned,
            self.webhook_deliveries_pruned
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
    /// Publishing the outbox failed (its store or its broker).
    #[error("relay: {0}")]
    Relay(#[from] RelayError),
}

impl ReaperError {
    pub fn code(&self) -> &'static str {
        match self {
            ReaperError::Store(e) => e.code(),
            ReaperError::Queue(e) => e.code(),
            ReaperError::Relay(e) => e.code(),
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

    reap_expired_leases(store, config, &mut summary).await?;
    summary.redispatched = redispatch_lost(store, broker, config).await?;
    // Reminders and escalations before expiries: a card due for both is escalated first.
    (summary.cards_reminded, summary.cards_escalated) = store.remind_and_escalate().await?;
    summary.approvals_expired = expire_approvals(store, config).await?;

    let relay = RelayConfig {
        batch: config.batch,
        ..RelayConfig::default()
    };
    summary.events_republished = sweep(store, broker, config.republish_after, relay, 1).await?;
    // Its own, handed off by its transitions, and the rest no process relay is still sending.
    summary.events_published = relay_round(store, broker, SWEEP_AFTER, relay, 1).await?;
    summary.events_pruned = store
        .prune_published_events(config.outbox_retention, config.batch)
        .await?;
    summary.webhook_deliveries_pruned = store
        .prune_webhook_deliveries(config.outbox_retention, config.batch)
        .await?;
    for (action, n) in summary.actions() {
        metrics::counter!("countersign_reaper_actions_total", "action" => action.as_str())
            .increment(n);
    }
    Ok(summary)
}

/// Requeues or fails the runs whose lease expired, counting each outcome in `summary`. A run
/// whose reap fails transiently is skipped, left for the next pass.
async fn reap_expired_leases(
    store: &Store,
    config: &ReaperConfig,
    summary: &mut PassSummary,
) -> Result<(), ReaperError> {
    let expired = store.expired_leases(config.batch).await;
    store.vitals().record(&expired);
    for lease in expired? {
        let backoff = config.backoff * 2u32.pow(lease.requeue_count.clamp(0, 6) as u32);
        let outcome = match store
            .reap_expired(&lease, config.max_requeues, backoff)
            .await
        {
            Ok(outcome) => outcome,
            // A lock it could not have in time, a statement cut short: this run is the next
            // pass's, the others are still this one's.
            Err(e) if e.is_transient() => {
                tracing::warn!(run.id = %lease.run_id, code = e.code(), error = %e, "expired lease left for the next pass");
                ReapOutcome::Lost
            }
            Err(e) => return Err(e.into()),
        };
        tracing::info!(run.id = %lease.run_id, ?outcome, "expired lease reaped");
        match outcome {
            ReapOutcome::Requeued => summary.requeued += 1,
            ReapOutcome::Lost => summary.skipped += 1,
            ReapOutcome::RetriesExhausted => summary.retries_exhausted += 1,
            ReapOutcome::OutcomeUnknown => summary.outcome_unknown += 1,
        }
    }
    Ok(())
}

/// Publishes the wake-up of each queued run whose dispatch was lost again; how many it marked
/// dispatched.
async fn redispatch_lost(
    store: &Store,
    broker: &Broker,
    config: &ReaperConfig,
) -> Result<u64, ReaperError> {
    let mut redispatched = 0;
    for run_id in store
        .lost_dispatches(config.dispatch_grace, config.batch)
        .await?
    {
        broker.publish_segment(run_id).await?;
        if store.mark_dispatched(run_id).await? {
            redispatched += 1;
        }
        tracing::info!(run.id = %run_id, "lost dispatch published again");
    }
    Ok(redispatched)
}

/// Expires the approvals past their deadline; how many it expired. One whose expiry fails
/// transiently is left for the next pass.
async fn expire_approvals(store: &Store, config: &ReaperConfig) -> Result<u64, ReaperError> {
    let mut expired = 0;
    for waiting in store.expired_approvals(config.batch).await? {
        match store
            .expire_approval(waiting.run_id, waiting.suspension_seq)
            .await
        {
            Ok(true) => expired += 1,
            Ok(false) => {}
            Err(e) if e.is_transient() => {
                tracing::warn!(run.id = %waiting.run_id, code = e.code(), error = %e, "expired approval left for the next pass");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(expired)
}

/// Registers `countersign_reaper_actions_total` at zero for every action, and the pass duration
/// histogram, so that a looping reaper serves each from its start.
pub fn register_metrics() {
    for (action, _) in PassSummary::default().actions() {
        let _ = metrics::counter!("countersign_reaper_actions_total", "action" => action.as_str());
    }
    let _ = metrics::histogram!("countersign_reaper_pass_duration_seconds");
}
