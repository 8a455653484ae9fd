//! Figures for the metrics, read by the database clock: how many runs wait for an approver
//! and for how long, how many leases expired unreaped, how long an approval took and how long
//! its writes took to land.
//!
//! Durations are differences of two timestamps the database wrote (the suspension's audit
//! event, the decision row, the journal row), so no process clock takes part. Every query
//! reads; none of them changes anything.

use std::time::Duration;

use crate::{millis, Store, StoreError};

/// The runs that wait on someone: approvers, or the reaper.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    /// Runs `waiting_for_approval`.
    pub waiting_for_approval: i64,
    /// Seconds the longest-waiting of them has waited since it suspended; 0 when none waits.
    pub oldest_waiting_secs: f64,
    /// Of those, the ones whose approval deadline falls within the window asked for.
    pub expiring: i64,
    /// `running` runs whose lease expired and that no reaper has handled yet.
    pub expired_leases: i64,
}

impl Store {
    /// The [`Backlog`] now, counting approvals that expire within `window` as expiring. One
    /// statement over the waiting and running runs. A waiting run's `updated_at` is the
    /// moment it suspended: nothing updates the row while it waits.
    pub async fn backlog(&self, window: Duration) -> Result<Backlog, StoreError> {
        let row = sqlx::query!(
            r#"SELECT
                   count(*) FILTER (WHERE status = 'waiting_for_approval') AS "waiting!",
                   coalesce(extract(epoch FROM now() - min(updated_at)
                       FILTER (WHERE status = 'waiting_for_approval'))::float8, 0) AS "oldest!",
                   count(*) FILTER (WHERE status = 'waiting_for_approval'
                       AND approval_deadline < now() + $1 * interval '1 millisecond') AS "expiring!",
                   count(*) FILTER (WHERE status = 'running'
                       AND lease_expires_at < now()) AS "expired_leases!"
               FROM runs WHERE status IN ('waiting_for_approval', 'running')"#,
            millis(window) as f64,
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            waiting_for_approval: row.waiting,
            oldest_waiting_secs: row.oldest,
            expiring: row.expiring,
            expired_leases: row.expired_leases,
        })
    }
}
