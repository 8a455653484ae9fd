//! The reaper's scans and transitions.
//!
//! A scan only proposes: between the scan and the UPDATE for one run, its worker may have
//! renewed the lease, a decision may have arrived, an operator may have cancelled. So every
//! UPDATE repeats the predicate that made the scan pick the run (`lease_expires_at < now()`,
//! the epoch seen, the deadline passed), and a run that no longer matches is left alone —
//! the heartbeat, the decision or the cancel wins. That makes a pass idempotent and safe to
//! run twice at once: the second reaper's UPDATEs simply lose.
//!
//! Nor does an UPDATE wait for a run row another transaction holds (`FOR UPDATE SKIP LOCKED`):
//! that transaction may belong to a process that is paused or cut off, and holds the row until
//! its session is ended (`idle_in_transaction_session_timeout`). The run is left for the next
//! pass, as one that moved is, and the pass goes on with the others.
//!
//! A transition that ends a run announces it in its own transaction — `run.failed` or
//! `run.cancelled`, an audit row and an outbox row — so a reaper that dies after its commit
//! has still said what it did.

use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::{Effect, EventName, LeaseEpoch, RunId, SuspensionSeq, TerminationReason};

use crate::runs::{epoch, pending_effect, run_id, segment, seq};
use crate::{millis, SegmentKind, Store, StoreError};

/// A running run whose lease expired, as the scan saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredLease {
    pub run_id: RunId,
    pub epoch: LeaseEpoch,
    pub segment: SegmentKind,
    pub requeue_count: i32,
    pub pending_effect: Option<Effect>,
    /// A call of its turn was sent outside the store and not journaled (`sent_call`).
    pub sent_call: bool,
}

/// What [`Store::reap_expired`] did with one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReapOutcome {
    /// Back to `queued` with `requeue_count + 1`.
    Requeued,
    /// Failed `retries_exhausted`.
    RetriesExhausted,
    /// Failed `outcome_unknown`: its retries are spent while a write it sent outside the store
    /// is still in doubt.
    OutcomeUnknown,
    /// The run moved since the scan (a heartbeat, a settle, a cancel), or another transaction
    /// holds its row: left alone, for the next pass.
    Lost,
}

/// A waiting run whose approval deadline passed, as the scan saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingDeadline {
    pub run_id: RunId,
    pub suspension_seq: SuspensionSeq,
    pub approval_deadline: DateTime<Utc>,
}

impl Store {
    /// Running runs whose lease expired by the database clock, oldest expiry first.
    pub async fn expired_leases(&self, limit: i64) -> Result<Vec<ExpiredLease>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT id, lease_epoch, segment, requeue_count, pending_effect,
                      sent_call IS NOT NULL AS "sent_call!" FROM runs
               WHERE status = 'running' AND lease_expires_at < now()
               ORDER BY lease_expires_at LIMIT $1"#,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(ExpiredLease {
                    run_id: run_id(r.id)?,
                    epoch: epoch(r.lease_epoch)?,
                    segment: segment(&r.segment)?,
                    requeue_count: r.requeue_count,
                    pending_effect: pending_effect(r.pending_effect)?,
                    sent_call: r.sent_call,
                })
            })
            .collect()
    }

    /// `running` → `queued` (same segment), `requeue_count + 1`, available after `backoff`;
    /// only while the lease seen is still expired and `requeue_count < max_requeues`. A call
    /// stamped as sent stays stamped (`sent_seq`, `sent_call`): the next segment resolves it by
    /// its idempotency key before anything else, and never sends a non-idempotent write again
    /// blindly.
    pub async fn reaper_requeue(
        &self,
        run: &ExpiredLease,
        max_requeues: i32,
        backoff: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"UPDATE runs
               SET status = 'queued', requeue_count = requeue_count + 1,
                   available_at = now() + $4 * interval '1 millisecond', updated_at = now()
               WHERE id = $1 AND status = 'running' AND lease_epoch = $2
                 AND lease_expires_at < now()
                 AND requeue_count < $3
                 AND id IN (SELECT id FROM runs WHERE id = $1 FOR UPDATE SKIP LOCKED)"#,
            run.run_id.as_uuid(),
            run.epoch.get(),
            max_requeues,
            millis(backoff) as f64,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `running` → `failed`, while the lease seen is still expired and `requeue_count >=
    /// max_requeues`: `outcome_unknown` when a call of its turn is stamped as sent and not
    /// journaled (it may have landed, and nobody will learn whether; the stamp stays, naming
    /// the call), `retries_exhausted` otherwise. Announced as `run.failed` in the same
    /// transaction.
    pub async fn reaper_fail_exhausted(
        &self,
        run: &ExpiredLease,
        max_requeues: i32,
    ) -> Result<bool, StoreError> {
        let reason = if run.sent_call {
            TerminationReason::OutcomeUnknown
        } else {
            TerminationReason::RetriesExhausted
        };
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query!(
            r#"UPDATE runs
               SET status = 'failed', termination_reason = $4,
                   error_code = CASE WHEN $5 THEN $4 ELSE error_code END, updated_at = now()
               WHERE id = $1 AND status = 'running' AND lease_epoch = $2
                 AND lease_expires_at < now()
                 AND requeue_count >= $3
                 AND (sent_call IS NOT NULL) = $5
                 AND id IN (SELECT id FROM runs WHERE id = $1 FOR UPDATE SKIP LOCKED)"#,
            run.run_id.as_uuid(),
            run.epoch.get(),
            max_requeues,
            reason.as_str(),
            run.sent_call,
        )
        .execute(&mut *tx)
        .await?;
        self.end_announced(
            tx,
            done.rows_affected(),
            EventName::RunFailed,
            run.run_id,
            reason,
        )
        .await
    }

    /// Applies the reaper's order to one expired lease: exhausted retries fail it
    /// (`outcome_unknown` when a write is in doubt, `retries_exhausted` otherwise), anything
    /// else is requeued. The choice follows the scan, and the chosen UPDATE repeats it.
    pub async fn reap_expired(
        &self,
        run: &ExpiredLease,
        max_requeues: i32,
        backoff: Duration,
    ) -> Result<ReapOutcome, StoreError> {
        let (won, outcome) = if run.requeue_count >= max_requeues {
            let outcome = if run.sent_call {
                ReapOutcome::OutcomeUnknown
            } else {
                ReapOutcome::RetriesExhausted
            };
            (
                self.reaper_fail_exhausted(run, max_requeues).await?,
                outcome,
            )
        } else {
            (
                self.reaper_requeue(run, max_requeues, backoff).await?,
                ReapOutcome::Requeued,
            )
        };
        Ok(if won { outcome } else { ReapOutcome::Lost })
    }

    /// Queued runs whose wake-up may have been lost: available for at least `grace` and never
    /// dispatched since they became available (a publish lost between commit and broker).
    pub async fn lost_dispatches(
        &self,
        grace: Duration,
        limit: i64,
    ) -> Result<Vec<RunId>, StoreError> {
        let ids = sqlx::query_scalar!(
            r#"SELECT id FROM runs
               WHERE status = 'queued'
                 AND available_at <= now() - $1 * interval '1 millisecond'
                 AND (dispatched_at IS NULL OR dispatched_at < available_at)
               ORDER BY available_at LIMIT $2"#,
            millis(grace) as f64,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        ids.into_iter().map(run_id).collect()
    }

    /// Waiting runs whose approval deadline passed by the database clock.
    pub async fn expired_approvals(&self, limit: i64) -> Result<Vec<WaitingDeadline>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT id, suspension_seq AS "suspension_seq!",
                      approval_deadline AS "approval_deadline!"
               FROM runs
               WHERE status = 'waiting_for_approval' AND approval_deadline < now()
               ORDER BY approval_deadline LIMIT $1"#,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(WaitingDeadline {
                    run_id: run_id(r.id)?,
                    suspension_seq: seq(r.suspension_seq)?,
                    approval_deadline: r.approval_deadline,
                })
            })
            .collect()
    }

    /// `waiting_for_approval` → `cancelled` (`approval_expired`), while the run still waits on
    /// the same suspension and its deadline has passed; announced as `run.cancelled` in the
    /// same transaction.
    pub async fn expire_approval(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query!(
            r#"UPDATE runs
               SET status = 'cancelled', termination_reason = 'approval_expired',
                   updated_at = now()
               WHERE id = $1 AND status = 'waiting_for_approval' AND suspension_seq = $2
                 AND approval_deadline < now()
                 AND id IN (SELECT id FROM runs WHERE id = $1 FOR UPDATE SKIP LOCKED)"#,
            run_id.as_uuid(),
            seq.as_i32(),
        )
        .execute(&mut *tx)
        .await?;
        self.end_announced(
            tx,
            done.rows_affected(),
            EventName::RunCancelled,
            run_id,
            TerminationReason::ApprovalExpired,
        )
        .await
    }
}
