//! The fenced write: how a tool writing to this database proves, at the resource, that its
//! segment still holds the lease — and how an approved turn is compared and written at once.
//!
//! A heartbeat that failed a moment ago, a paused process, a lease the reaper has already
//! handed to another worker: a segment cannot know by itself that it became a zombie. So the
//! check happens inside the same transaction as the write. [`Store::begin_turn`] opens the
//! transaction of an approved turn and checks the lease; the turn's local writers then lock
//! their subjects and what they read, re-plan, compare and write on [`FencedWrite::conn`];
//! [`FencedWrite::commit_turn`] renews the lease with a guarded `UPDATE` of the run row —
//! which locks the row until the commit, so no claim, requeue, cancel or settle can move the
//! run in between — and appends the `tool_write` audit events and the journal rows in the same
//! statement, and commits once: the writes, their audit and their journal entries are kept
//! together or lost together. A zombie's guard matches no row, and its writes roll back unseen.
//! Dropping a `FencedWrite` rolls everything back.
//!
//! The run row is not locked while the turn runs, so the heartbeat keeps renewing the lease
//! however long the turn waits on a colleague's lock, and the turn's calls outside the store
//! are stamped and journaled in statements of their own.
//!
//! Lock order, for every transaction that writes content on behalf of a run: the turn's
//! subjects in [`countersign_core::LockSubject`] order, then what each call reads, then the run
//! row.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::{
    CallIndex, Effect, Fault, FenceToken, HookError, JournalEntry, RunId, SuspensionSeq,
    ToolOutput, TurnRecord,
};
use countersign_crypto::Keyring;
use sqlx::{PgConnection, Postgres, Transaction};
use tokio::sync::OwnedSemaphorePermit;

use crate::error::classify;
use crate::journal::{self, Journaled};
use crate::{Lease, Store, StoreError};

/// How long a suspension's preview transaction waits for a row lock ([`Store::begin_preview`]).
pub const PREVIEW_LOCK_TIMEOUT: Duration = Duration::from_millis(500);

/// An open transaction in which the run's lease has been verified: a turn's, or one call's write
/// with the run row locked.
pub struct FencedWrite {
    tx: Transaction<'static, Postgres>,
    lease: Lease,
    seq: SuspensionSeq,
    /// The call a single-call write ([`Store::fenced_write`]) is for.
    call: Option<CallIndex>,
    keyring: Arc<Keyring>,
    /// The turn's share of the pool, given back when the transaction ends.
    _permit: Option<OwnedSemaphorePermit>,
}

impl fmt::Debug for FencedWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedWrite")
            .field("lease", &self.lease)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens the transaction of suspension `seq`'s turn — an approved turn's, or the one whose
    /// local writes a suspension previews in sequence and rolls back — checking that the lease
    /// is still held (otherwise [`StoreError::FenceLost`], nothing written). The lease is held
    /// to again, and renewed, at [`FencedWrite::commit_turn`].
    pub async fn begin_turn(
        &self,
        lease: &Lease,
        seq: SuspensionSeq,
    ) -> Result<FencedWrite, StoreError> {
        let permit = self.turn_permit().await;
        let mut tx = self.begin_turn_transaction().await?;
        let held = sqlx::query_scalar!(
            r#"SELECT id FROM runs
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
        )
        .fetch_optional(&mut *tx)
        .await?;
        if held.is_none() {
            tx.rollback().await?;
            return Err(StoreError::FenceLost);
        }
        Ok(FencedWrite {
            tx,
            lease: lease.clone(),
            seq,
            call: None,
            keyring: Arc::clone(&self.keyring),
            _permit: permit,
        })
    }

    /// Opens the transaction a suspension previews its local writes in (rolled back once the
    /// previews are taken), checking that the lease is still held. It does not take one of the
    /// turns' share of the pool, and waits at most [`PREVIEW_LOCK_TIMEOUT`] for a row lock: a
    /// row someone else holds makes its statement fail `database_conflict` at once, and the
    /// suspension previews its writes each on its own instead of waiting.
    pub async fn begin_preview(
        &self,
        lease: &Lease,
        seq: SuspensionSeq,
    ) -> Result<FencedWrite, StoreError> {
        let mut tx = self.pool.begin().await?;
        let held = sqlx::query_scalar!(
            r#"SELECT set_config('lock_timeout', $4, true) AS "set!" FROM runs
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            format!("{}ms", PREVIEW_LOCK_TIMEOUT.as_millis()),
        )
        .fetch_optional(&mut *tx)
        .await?;
        if held.is_none() {
            tx.rollback().await?;
            return Err(StoreError::FenceLost);
        }
        Ok(FencedWrite {
            tx,
            lease: lease.clone(),
            seq,
            call: None,
            keyring: Arc::clone(&self.keyring),
            _permit: None,
        })
    }

    /// What earlier attempts of suspension `seq`'s turn left: every journaled result, in call
    /// order, and the commits the turn owes ([`FencedWrite::commit_turn`]), in one statement.
    pub async fn turn_record(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
    ) -> Result<TurnRecord, StoreError> {
        let row = sqlx::query!(
            r#"SELECT
                   (SELECT coalesce(array_agg(j.call_index ORDER BY j.call_index), '{}')
                    FROM run_journal j WHERE j.run_id = $1 AND j.suspension_seq = $2)
                       AS "indexes!: Vec<i32>",
                   (SELECT coalesce(array_agg(j.result ORDER BY j.call_index), '{}')
                    FROM run_journal j WHERE j.run_id = $1 AND j.suspension_seq = $2)
                       AS "results!: Vec<Vec<u8>>",
                   (SELECT coalesce(array_agg(o.call_index ORDER BY o.call_index), '{}')
                    FROM run_owed_commits o WHERE o.run_id = $1 AND o.suspension_seq = $2)
                       AS "owed!: Vec<i32>""#,
            run_id.as_uuid(),
            seq.as_i32(),
        )
        .fetch_one(&self.pool)
        .await?;
        let rows: Vec<(i32, Vec<u8>)> = row.indexes.into_iter().zip(row.results).collect();
        let owed = row
            .owed
            .into_iter()
            .map(|i| {
                usize::try_from(i)
                    .map(CallIndex::new)
                    .map_err(|_| StoreError::unreadable("run_owed_commits.call_index"))
            })
            .collect::<Result<_, _>>()?;
        Ok(TurnRecord {
            journaled: journal::opened(&self.keyring, run_id, &rows)?,
            owed,
        })
    }

    /// Opens a transaction for one call's write, locks the run row `FOR UPDATE` and verifies
    /// that `token`'s owner and epoch still hold it and the run is `running`. Otherwise
    /// [`StoreError::FenceLost`], with nothing written.
    pub async fn fenced_write(&self, token: &FenceToken) -> Result<FencedWrite, StoreError> {
        let permit = self.turn_permit().await;
        let mut tx = self.begin_turn_transaction().await?;
        // The guard is in the WHERE clause: a row locked by a concurrent transition is
        // re-checked against its newest version once that transaction ends.
        let held = sqlx::query_scalar!(
            r#"SELECT id FROM runs
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3
               FOR UPDATE"#,
            token.run_id.as_uuid(),
            token.lease_owner,
            token.lease_epoch.get(),
        )
        .fetch_optional(&mut *tx)
        .await?;
        if held.is_none() {
            tx.rollback().await?;
            return Err(StoreError::FenceLost);
        }
        Ok(FencedWrite {
            tx,
            lease: Lease {
                run_id: token.run_id,
                owner: token.lease_owner.clone(),
                epoch: token.lease_epoch,
            },
            seq: token.suspension_seq,
            call: Some(token.call_index),
            keyring: Arc::clone(&self.keyring),
            _permit: permit,
        })
    }
}

impl FencedWrite {
    /// The transaction's connection: the tools lock, plan, write and read back here.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// Journals `entries` with their audit events under the lease's guard, and records the
    /// commits `owed`, in one statement ([`journal::journal_guarded`]). Every entry must be new:
    /// a call journaled already is [`StoreError::AlreadyJournaled`], a lease no longer held
    /// [`StoreError::FenceLost`]; the caller rolls back either way.
    async fn journal(
        &mut self,
        guard: journal::Guard<'_>,
        entries: &[JournalEntry<'_>],
    ) -> Result<(), StoreError> {
        let journaled = journal::journal_guarded(
            &mut *self.tx,
            &self.keyring,
            &self.lease,
            self.seq,
            guard,
            entries,
        )
        .await?;
        match journaled {
            Journaled::FenceLost => Err(StoreError::FenceLost),
            Journaled::Inserted(n) if n == entries.len() => Ok(()),
            Journaled::Inserted(_) => Err(StoreError::AlreadyJournaled),
        }
    }

    /// Journals a single-call write ([`Store::fenced_write`]) with its audit event and commits.
    /// All or nothing: if the call was journaled already, [`StoreError::AlreadyJournaled`] and
    /// the write is rolled back with everything else.
    pub async fn commit(
        mut self,
        tool: &str,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<(), StoreError> {
        let index = self.call.unwrap_or(CallIndex::new(0));
        let entry = JournalEntry {
            index,
            tool,
            effect,
            output,
        };
        // The run row is locked and its lease checked already (`fenced_write`): the guard
        // proves it again and changes nothing.
        let guard = journal::Guard {
            renew: None,
            clear_stamp: false,
            owed: &[],
        };
        if let Err(e) = self.journal(guard, &[entry]).await {
            self.tx.rollback().await?;
            return Err(e);
        }
        self.tx.commit().await?;
        Ok(())
    }

    /// Abandons the write explicitly (dropping does the same).
    pub async fn rollback(self) -> Result<(), StoreError> {
        self.tx.rollback().await?;
        Ok(())
    }
}

/// What a store error means to the loop: a lost fence stops the segment; a sealed value that
/// does not open fails the run `state_unreadable`; a persistent database error (an audit event
/// or journal row that cannot be stored) fails it with its code; anything else interrupts it
/// for a retry.
pub fn hook_error(e: StoreError) -> HookError {
    match e {
        StoreError::FenceLost => HookError::LeaseLost,
        StoreError::Unreadable { what } => HookError::Unreadable { what },
        StoreError::Crypto(_) => HookError::Unreadable {
            what: "sealed run data",
        },
        StoreError::Database(ref db) if classify(db).0 == Fault::Persistent => HookError::Broken {
            code: e.code(),
            detail: e.to_string(),
        },
        other => HookError::Unavailable {
            code: other.code(),
            detail: other.to_string(),
        },
    }
}

impl FencedWrite {
    /// The turn's commit point: one statement renews the lease to `now() + ttl` with an
    /// `UPDATE` guarded by owner, epoch and `running` (which locks the run row until the commit),
    /// appends the audit event and journal row of every entry, and records the commit of every
    /// call in `owed` as owed (`run_owed_commits`); then the commit. A lease no longer held is
    /// [`StoreError::FenceLost`] and nothing of the turn is kept. A turn with neither an entry
    /// nor a debt wrote nothing: it is rolled back.
    pub async fn commit_turn(
        mut self,
        ttl: Duration,
        entries: &[JournalEntry<'_>],
        owed: &[CallIndex],
    ) -> Result<(), StoreError> {
        if entries.is_empty() && owed.is_empty() {
            return self.rollback().await;
        }
        let guard = journal::Guard {
            renew: Some(ttl),
            clear_stamp: false,
            owed,
        };
        if let Err(e) = self.journal(guard, entries).await {
            self.tx.rollback().await?;
            return Err(e);
        }
        self.tx.commit().await?;
        Ok(())
    }
}
