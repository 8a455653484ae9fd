//! Claims and heartbeats: how a segment wins its lease and keeps it.
//!
//! A claim is one statement (the function `claim_runs` of the migrations) that moves the run to
//! `running`, sets the owner and `lease_epoch + 1`, and returns what the segment starts from.
//! The epoch is never lower than the database timeline's floor (`lease_epoch_floor()`, 0 until
//! the server is promoted): after a failover to a standby that lost the last claims, the next
//! claim still hands out an epoch past every one a tool server may have seen.
//! A heartbeat extends the lease only while owner, epoch and status still match; a lease that
//! no longer does is lost, and its segment must stop and settle nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::{CallIndex, Effect, RunId, SuspensionSeq};
use uuid::Uuid;

use crate::agents::{AgentColumns, StoredAgent};
use crate::runs::{epoch, opt_seq, run_id, segment, Lease, SegmentKind};
use crate::{millis, Store, StoreError};

/// What one heartbeat did with a lease still held ([`Store::renew_all`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Extended to `now() + ttl`.
    Renewed,
    /// Not extended this beat: another transaction holds the run row (most often the lease's
    /// own turn). Neither renewed nor lost; the next beat asks again.
    Busy,
}

/// A won claim: the lease and what the segment needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub lease: Lease,
    /// By the database clock; renew every third of the ttl.
    pub lease_expires_at: DateTime<Utc>,
    pub segment: SegmentKind,
    pub agent: String,
    pub acting_user: String,
    /// The suspension a resume segment continues; `None` for a start that never suspended.
    pub suspension_seq: Option<SuspensionSeq>,
    pub requeue_count: i32,
    /// For a resume: the call of this suspension's turn that an earlier attempt sent outside
    /// the store and did not journal ([`SentCall`]). It may have landed.
    pub sent_call: Option<CallIndex>,
    /// What the segment starts from, read by the claim's own statement.
    pub inputs: ClaimedInputs,
}

/// What a segment starts from, returned by the statement that won its claim rather than read
/// by one statement each: the agent's configuration as it is now, and the sealed request (a
/// start) or the sealed state and the accepted decision (a resume). The claim holds the run,
/// so nothing here can change under the segment; the sealed parts are opened by
/// [`Store::open_request`], [`Store::open_state`] and [`Store::open_decision`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedInputs {
    /// `None` when the configuration is gone.
    pub agent: Option<StoredAgent>,
    /// The sealed request, for a start segment.
    pub request: Option<Vec<u8>>,
    /// The sealed suspended state, for a resume segment.
    pub state: Option<Vec<u8>>,
    /// The accepted decision of the suspension a resume continues, its comment still sealed.
    pub decision: Option<SealedDecision>,
}

/// An accepted decision as a claim reads it, its comment still sealed: opened by
/// [`Store::open_decision`] into what the segment resumes with.
#[derive(Debug, Clone, PartialEq)]
pub struct SealedDecision {
    pub approved: bool,
    pub comment: Option<Vec<u8>>,
    /// What a decision call by call or an edit said of each call, sealed.
    pub detail: Option<Vec<u8>>,
    /// Who made it: the editor of an edit.
    pub approver: String,
    /// How long before the claim it was recorded, in seconds by the database clock: where a
    /// segment starts timing decision → write.
    pub decided_secs_ago: Option<f64>,
}

/// The stamp a heartbeat may leave: only writes are stamped, a read needs no warning.
fn effect_stamp(effect: Option<Effect>) -> Option<&'static str> {
    effect.filter(|e| e.is_write()).map(Effect::as_str)
}

/// A call about to be sent outside the store, as its stamp records it: its effect (what the
/// reaper may do with the run if it dies now) and which call of which turn it is (what the
/// segment that retries the turn must send again rather than compare).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentCall {
    pub seq: SuspensionSeq,
    pub index: CallIndex,
    pub effect: Effect,
}

/// What a claim's statement (`claim_runs`) gives back: the claimed row, its agent and, for a
/// resume, the accepted decision.
struct ClaimRow {
    id: Uuid,
    lease_epoch: i64,
    lease_expires_at: DateTime<Utc>,
    segment: String,
    agent: String,
    acting_user: String,
    suspension_seq: Option<i32>,
    requeue_count: i32,
    sent_call: Option<i32>,
    request: Option<Vec<u8>>,
    state: Option<Vec<u8>>,
    settings: Option<AgentColumns>,
    decision_id: Option<Uuid>,
    approved: Option<bool>,
    comment: Option<Vec<u8>>,
    decided_secs_ago: Option<f64>,
    detail: Option<Vec<u8>>,
    approver: Option<String>,
}

/// Which runs a claim asks for.
#[derive(Clone, Copy)]
enum Asked<'a> {
    /// These runs, each waited for while another transaction holds its row.
    Waiting(&'a [Uuid]),
    /// These runs, skipping a row another transaction holds.
    Free(&'a [Uuid]),
    /// Any available runs, those available longest first, skipping held rows.
    Next(i64),
}

impl ClaimRow {
    fn into_claim(self, owner: &str) -> Result<Claim, StoreError> {
        let agent = self.settings.map(StoredAgent::from);
        let decision = match (self.decision_id, self.approved) {
            (Some(_), Some(approved)) => Some(SealedDecision {
                approved,
                comment: self.comment,
                detail: self.detail,
                approver: self.approver.unwrap_or_default(),
                decided_secs_ago: self.decided_secs_ago,
            }),
            _ => None,
        };
        Ok(Claim {
            lease: Lease {
                run_id: run_id(self.id)?,
                owner: owner.to_owned(),
                epoch: epoch(self.lease_epoch)?,
            },
            lease_expires_at: self.lease_expires_at,
            segment: segment(&self.segment)?,
            agent: self.agent,
            acting_user: self.acting_user,
            suspension_seq: opt_seq(self.suspension_seq)?,
            requeue_count: self.requeue_count,
            sent_call: self
                .sent_call
                .map(|i| {
                    CallIndex::from_i32(i).map_err(|_| StoreError::unreadable("runs.sent_call"))
                })
                .transpose()?,
            inputs: ClaimedInputs {
                agent,
                request: self.request,
                state: self.state,
                decision,
            },
        })
    }
}

impl Store {
    /// `queued` → `running`: one UPDATE that sets the owner, `lease_epoch + 1` and
    /// `lease_expires_at = now() + ttl`, only if the run is available by the database clock.
    /// `None` when it lost (another claimer, not queued, or not yet available). [`Store::claim_many`]
    /// of one, except that a row another transaction holds is waited for: the answer says
    /// whether the claim was truly lost.
    pub async fn claim(
        &self,
        run_id: RunId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Claim>, StoreError> {
        let ids = [run_id.as_uuid()];
        let row = self.claim_runs(Asked::Waiting(&ids), owner, ttl).await?;
        row.into_iter()
            .next()
            .map(|r| r.into_claim(owner))
            .transpose()
    }

    /// [`Store::claim`] for many wake-ups in one statement: each run is claimed as `claim`
    /// would claim it, but a row another transaction holds is skipped rather than waited for,
    /// so one busy row never holds up the others and two batches never wait on each other.
    /// The answer is in the order asked: the claim won, or `None` for a run lost or skipped
    /// (only [`Store::claim`] tells which); a run asked for twice is won once at most.
    pub async fn claim_many(
        &self,
        run_ids: &[RunId],
        owner: &str,
        ttl: Duration,
    ) -> Result<Vec<Option<Result<Claim, StoreError>>>, StoreError> {
        let ids: Vec<Uuid> = run_ids.iter().map(|r| r.as_uuid()).collect();
        let rows = self.claim_runs(Asked::Free(&ids), owner, ttl).await?;
        let mut won: Vec<Option<ClaimRow>> = rows.into_iter().map(Some).collect();
        Ok(ids
            .iter()
            .map(|id| {
                let row = won
                    .iter_mut()
                    .find(|r| r.as_ref().is_some_and(|r| r.id == *id))?;
                row.take().map(|r| r.into_claim(owner))
            })
            .collect())
    }

    /// Claims up to `limit` of the queued runs that have been available longest, skipping rows
    /// another transaction holds: the polling fallback when no wake-up arrived, one statement
    /// for as many runs as the worker has slots free. Empty when none is available.
    pub async fn claim_next(
        &self,
        owner: &str,
        ttl: Duration,
        limit: usize,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.claim_runs(Asked::Next(limit), owner, ttl).await?;
        Ok(rows.into_iter().map(|r| r.into_claim(owner)).collect())
    }

    /// The one claim statement (the function `claim_runs` of the migrations).
    async fn claim_runs(
        &self,
        asked: Asked<'_>,
        owner: &str,
        ttl: Duration,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        let (ids, skip_locked, limit) = match asked {
            Asked::Waiting(ids) => (Some(ids), false, None),
            Asked::Free(ids) => (Some(ids), true, None),
            Asked::Next(limit) => (None, true, Some(limit)),
        };
        Ok(sqlx::query_as!(
            ClaimRow,
            r#"SELECT id AS "id!", lease_epoch AS "lease_epoch!",
                      lease_expires_at AS "lease_expires_at!", segment AS "segment!",
                      agent AS "agent!", acting_user AS "acting_user!", suspension_seq,
                      requeue_count AS "requeue_count!", sent_call, request, state,
                      settings AS "settings: AgentColumns", decision_id, approved,
                      comment, decided_secs_ago, detail, approver
               FROM claim_runs($1, $2, $3, $4, $5)"#,
            ids as Option<&[Uuid]>,
            skip_locked,
            limit,
            owner,
            millis(ttl) as f64,
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Heartbeat: extends the lease to `now() + ttl` if this segment still holds it. `false`
    /// means the lease is lost: stop at the next step boundary and settle nothing.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"UPDATE runs SET lease_expires_at = now() + $4 * interval '1 millisecond'
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            millis(ttl) as f64,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// One heartbeat for many leases: extends every lease still held (owner, epoch, `running`)
    /// to `now() + ttl` in one statement. A lease missing from the answer is lost.
    ///
    /// The statement waits for no row: a run row another transaction has locked is skipped and
    /// answered [`Renewal::Busy`]. The lock is most often the lease's own turn transaction,
    /// which renewed the lease when it began and renews it again with its journal rows; waiting
    /// for it would stall the renewal of every other lease of the worker behind one turn that
    /// waits on a lock of its own (a colleague editing the same page). A transition that holds
    /// the row (a cancel, the reaper) shows as lost at the next beat.
    pub async fn renew_all(
        &self,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<(RunId, Renewal)>, StoreError> {
        let ids: Vec<Uuid> = leases.iter().map(|l| l.run_id.as_uuid()).collect();
        let owners: Vec<String> = leases.iter().map(|l| l.owner.clone()).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| l.epoch.get()).collect();
        let rows = sqlx::query!(
            r#"WITH leases AS (
                   SELECT * FROM unnest($1::uuid[], $2::text[], $3::int8[]) AS h (id, owner, epoch)),
               held AS (
                   SELECT r.id FROM runs r JOIN leases h ON r.id = h.id
                   WHERE r.lease_owner = h.owner AND r.lease_epoch = h.epoch
                     AND r.status = 'running'),
               -- The guard again: a row locked and changed meanwhile is checked against its
               -- newest version once its lock is taken.
               free AS (
                   SELECT r.id FROM runs r JOIN leases h ON r.id = h.id
                   WHERE r.lease_owner = h.owner AND r.lease_epoch = h.epoch
                     AND r.status = 'running'
                   FOR UPDATE OF r SKIP LOCKED),
               renewed AS (
                   UPDATE runs r SET lease_expires_at = now() + $4 * interval '1 millisecond'
                   FROM free WHERE r.id = free.id
                   RETURNING r.id)
               -- A hashed subplan, not a join: the planner cannot size the CTEs, and the join
               -- it chose compared every held lease with every renewed one.
               SELECT held.id AS "id!", held.id IN (SELECT id FROM renewed) AS "renewed!"
               FROM held"#,
            &ids,
            &owners,
            &epochs,
            millis(ttl) as f64,
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                let renewal = if r.renewed {
                    Renewal::Renewed
                } else {
                    Renewal::Busy
                };
                Ok((run_id(r.id)?, renewal))
            })
            .collect()
    }

    /// A heartbeat that also stamps the call about to be sent outside the store (or clears the
    /// stamp with `None`) in the same UPDATE, before its effect runs: the reaper never retries
    /// a run stamped `non_idempotent_write`, because the effect may already have happened; and
    /// the segment that retries a turn sends the stamped call again under its key.
    pub async fn renew_stamping(
        &self,
        lease: &Lease,
        ttl: Duration,
        sent: Option<SentCall>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"UPDATE runs SET lease_expires_at = now() + $4 * interval '1 millisecond',
                               pending_effect = $5, sent_seq = $6, sent_call = $7
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            millis(ttl) as f64,
            effect_stamp(sent.map(|s| s.effect)),
            sent.map(|s| s.seq.as_i32()),
            sent.map(|s| s.index.as_i32()),
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
