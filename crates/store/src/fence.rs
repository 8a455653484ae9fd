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
    CallIndex, Effect, Fault, FenceToken, HookError, JournalEntry, SuspensionSeq, ToolOutput,
};
use countersign_crypto::Keyring;
use sqlx::{PgConnection, Postgres, Transaction};
use tokio::sync::OwnedSemaphorePermit;

use crate::error::classify;
use crate::journal::{self, Journaled};
use crate::{Lease, Store, StoreError};

/// An open transaction in which the run's lease has been verified and the run row is locked.
pub struct FencedWrite {
    tx: Transaction<'static, Postgres>,
    lease: Lease,
    seq: SuspensionSeq,
    /// The call a single-call write ([`Store::fenced_write`]) is for.
    call: Option<CallIndex>,
    keyring: Arc<Keyring>,
    /// The turn's journal rows (call index, sealed result) as the statement that opened a turn
    /// transaction read them; `None` for a single-call write.
    journal: Option<Vec<(i32, Vec<u8>)>>,
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
    /// Opens the transaction of an approved turn of suspension `seq`, checking that the lease
    /// is still held (otherwise [`StoreError::FenceLost`], nothing written). The same statement
    /// reads what the turn has journaled already. The lease is held to again, and renewed, at
    /// [`FencedWrite::commit_turn`].
    pub async fn begin_turn(
        &self,
        lease: &Lease,
        seq: SuspensionSeq,
    ) -> Result<FencedWrite, StoreError> {
        let permit = self.turn_permit().await;
        let mut tx = self.begin_turn_transaction().await?;
        let held = sqlx::query!(
            r#"SELECT
                   (SELECT coalesce(array_agg(j.call_index ORDER BY j.call_index), '{}')
                    FROM run_journal j WHERE j.run_id = $1 AND j.suspension_seq = $4)
                       AS "indexes!: Vec<i32>",
                   (SELECT coalesce(array_agg(j.result ORDER BY j.call_index), '{}')
                    FROM run_journal j WHERE j.run_id = $1 AND j.suspension_seq = $4)
                       AS "results!: Vec<Vec<u8>>"
               FROM runs
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            seq.as_i32(),
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(held) = held else {
            tx.rollback().await?;
            return Err(StoreError::FenceLost);
        };
        Ok(FencedWrite {
            tx,
            lease: lease.clone(),
            seq,
            call: None,
            keyring: Arc::clone(&self.keyring),
            journal: Some(held.indexes.into_iter().zip(held.results).collect()),
            _permit: permit,
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
            journal: None,
            _permit: permit,
        })
    }
}

impl FencedWrite {
    /// The transaction's connection: the tools lock, plan, write and read back here.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// Journals `entries` with their audit events under the lease's guard, in one statement
    /// ([`journal::journal_guarded`]). Every entry must be new: a call journaled already is
    /// [`StoreError::AlreadyJournaled`], a lease no longer held [`StoreError::FenceLost`]; the
    /// caller rolls back either way.
    async fn journal(
        &mut self,
        guard: journal::Guard,
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
    /// Every result the turn has journaled, in call order, as [`Store::begin_turn`] read them
    /// (a single-call write reads them now).
    pub async fn journaled(&mut self) -> Result<Vec<(CallIndex, ToolOutput)>, StoreError> {
        match &self.journal {
            Some(rows) => journal::opened(&self.keyring, self.lease.run_id, rows),
            None => journal::turn(&mut self.tx, &self.keyring, self.lease.run_id, self.seq).await,
        }
    }

    /// The fence of an approved turn, then its commit: one statement renews the lease to
    /// `now() + ttl` with an `UPDATE` guarded by owner, epoch and `running` (which locks the run
    /// row until the commit) and appends the audit event and journal row of every entry; then
    /// the commit. A lease no longer held is [`StoreError::FenceLost`] and nothing of the turn is
    /// kept. A turn with no entry wrote nothing: it is rolled back.
    pub async fn commit_turn(
        mut self,
        ttl: Duration,
        entries: &[JournalEntry<'_>],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return self.rollback().await;
        }
        let guard = journal::Guard {
            renew: Some(ttl),
            clear_stamp: false,
        };
        if let Err(e) = self.journal(guard, entries).await {
            self.tx.rollback().await?;
            return Err(e);
        }
        self.tx.commit().await?;
        Ok(())
    }
}
