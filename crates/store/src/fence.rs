//! The fenced write: how a tool writing to this database proves, at the resource, that its
//! segment still holds the lease — and how an approved turn is compared and written at once.
//!
//! A heartbeat that failed a moment ago, a paused process, a lease the reaper has already
//! handed to another worker: a segment cannot know by itself that it became a zombie. So the
//! check happens inside the same transaction as the write. [`Store::begin_turn`] renews the
//! lease with one guarded `UPDATE` of the run row — which also locks the row until the
//! transaction ends, so no claim, requeue, cancel or settle can move the run meanwhile. The
//! turn's tools then lock their subjects, re-plan, compare and write on
//! [`FencedWrite::conn`], and [`TurnTransaction::commit`] appends the `tool_write` audit events
//! and the journal rows before committing once: the writes, their audit and their journal
//! entries are kept together or lost together. Dropping a `FencedWrite` rolls everything back.
//!
//! Lock order, for every transaction that writes content on behalf of a run: the run row
//! first, then the turn's subjects in [`countersign_core::LockSubject`] order.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::{
    CallIndex, Effect, FenceToken, HookError, JournalEntry, SuspensionSeq, ToolOutput,
    TurnTransaction,
};
use countersign_crypto::{Keyring, Purpose};
use serde_json::json;
use sqlx::{PgConnection, Postgres, Transaction};

use crate::journal::{self, JournalKey};
use crate::{millis, Lease, Store, StoreError};

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
    /// A turn's lease: its time to live, and when this transaction last renewed it.
    renewal: Option<(Duration, std::time::Instant)>,
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
    /// Opens the transaction of an approved turn of suspension `seq`: renews the lease to
    /// `now() + ttl` in one `UPDATE` guarded by owner, epoch and `running`, which locks the run
    /// row until the transaction ends. Otherwise [`StoreError::FenceLost`], nothing written.
    /// The same statement reads what the turn has journaled already: nothing can journal for
    /// it but the holder of the lease.
    pub async fn begin_turn(
        &self,
        lease: &Lease,
        seq: SuspensionSeq,
        ttl: Duration,
    ) -> Result<FencedWrite, StoreError> {
        let mut tx = self.pool.begin().await?;
        let held = sqlx::query!(
            r#"UPDATE runs SET lease_expires_at = now() + $4 * interval '1 millisecond'
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3
               RETURNING
                   (SELECT coalesce(array_agg(j.call_index ORDER BY j.call_index), '{}')
                    FROM run_journal j WHERE j.run_id = $1 AND j.suspension_seq = $5)
                       AS "indexes!: Vec<i32>",
                   (SELECT coalesce(array_agg(j.result ORDER BY j.call_index), '{}')
                    FROM run_journal j WHERE j.run_id = $1 AND j.suspension_seq = $5)
                       AS "results!: Vec<Vec<u8>>""#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
            millis(ttl) as f64,
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
            renewal: Some((ttl, std::time::Instant::now())),
        })
    }

    /// Opens a transaction for one call's write, locks the run row `FOR UPDATE` and verifies
    /// that `token`'s owner and epoch still hold it and the run is `running`. Otherwise
    /// [`StoreError::FenceLost`], with nothing written.
    pub async fn fenced_write(&self, token: &FenceToken) -> Result<FencedWrite, StoreError> {
        let mut tx = self.pool.begin().await?;
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
            renewal: None,
        })
    }
}

impl FencedWrite {
    /// The transaction's connection: the tools lock, plan, write and read back here.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// Appends the `tool_write` audit event of a write (in clear: tool, effect, call index,
    /// suspension number, lease epoch, whether the output is an error — never content; the
    /// output itself sealed) and the journal row of the call (its result sealed).
    async fn journal(&mut self, entry: &JournalEntry<'_>) -> Result<(), StoreError> {
        let audit = if entry.effect.is_write() {
            let payload = json!({
                "tool": entry.tool,
                "effect": entry.effect.as_str(),
                "call_index": entry.index.get(),
                "suspension_seq": self.seq.get(),
                "lease_epoch": self.lease.epoch.get(),
                "is_error": entry.output.is_error,
            });
            let content = self.keyring.seal(
                Purpose::Event,
                self.lease.run_id,
                entry.output.content.as_bytes(),
            )?;
            Some((payload, content))
        } else {
            None
        };
        let key = JournalKey {
            run_id: self.lease.run_id,
            seq: self.seq,
            index: entry.index,
            epoch: self.lease.epoch,
        };
        // A turn that has held its row for a third of the ttl (waiting on a lock, most often)
        // renews its lease with the journal row: the heartbeat skips a locked row, and the
        // reaper, waiting on it, reads the renewal once the turn commits.
        let renew = self
            .renewal
            .filter(|(ttl, at)| at.elapsed() >= *ttl / 3)
            .map(|(ttl, _)| ttl);
        let inserted = journal::insert_audited(
            &mut self.tx,
            &self.keyring,
            &key,
            entry.tool,
            entry.effect,
            entry.output,
            audit,
            renew,
        )
        .await?;
        if let (Some(ttl), Some(renewal)) = (renew, self.renewal.as_mut()) {
            *renewal = (ttl, std::time::Instant::now());
        }
        if !inserted {
            return Err(StoreError::AlreadyJournaled);
        }
        Ok(())
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
        if let Err(e) = self.journal(&entry).await {
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

/// What a store error means to the loop: a lost fence stops the segment, a sealed value that
/// does not open fails the run, anything else interrupts it for a retry.
pub fn hook_error(e: StoreError) -> HookError {
    match e {
        StoreError::FenceLost => HookError::LeaseLost,
        StoreError::Unreadable { what } => HookError::Unreadable { what },
        StoreError::Crypto(_) => HookError::Unreadable {
            what: "sealed run data",
        },
        other => HookError::Unavailable {
            code: other.code(),
            detail: other.to_string(),
        },
    }
}

#[async_trait]
impl TurnTransaction for FencedWrite {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    async fn journaled(&mut self) -> Result<Vec<(CallIndex, ToolOutput)>, HookError> {
        match &self.journal {
            Some(rows) => journal::opened(&self.keyring, self.lease.run_id, rows),
            None => journal::turn(&mut self.tx, &self.keyring, self.lease.run_id, self.seq).await,
        }
        .map_err(hook_error)
    }

    async fn commit(mut self: Box<Self>, entries: &[JournalEntry<'_>]) -> Result<(), HookError> {
        for entry in entries {
            self.journal(entry).await.map_err(hook_error)?;
        }
        self.tx
            .commit()
            .await
            .map_err(|e| hook_error(StoreError::Database(e)))
    }

    async fn rollback(self: Box<Self>) {
        let run_id = self.lease.run_id;
        if let Err(e) = self.tx.rollback().await {
            tracing::warn!(run.id = %run_id, error = %e, "turn rollback failed; the connection drops it");
        }
    }
}
