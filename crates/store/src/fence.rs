//! The fenced write: how a tool writing to this database proves, at the resource, that its
//! segment still holds the lease.
//!
//! A heartbeat that failed a moment ago, a paused process, a lease the reaper has already
//! handed to another worker: a segment cannot know by itself that it became a zombie. So the
//! check happens inside the same transaction as the write. [`Store::fenced_write`] locks the
//! run row `FOR UPDATE` and verifies owner, epoch and `running`; while the lock is held no
//! claim, requeue, cancel or settle can move the run. The tool then writes and reads its write
//! back on [`FencedWrite::conn`], and [`FencedWrite::commit`] appends the `tool_write` audit
//! event and the journal row before committing — the write, its audit and its journal entry
//! are kept together or lost together. Dropping a `FencedWrite` rolls everything back.

use std::fmt;
use std::sync::Arc;

use countersign_core::{Effect, FenceToken, ToolOutput};
use countersign_crypto::Keyring;
use serde_json::json;
use sqlx::{PgConnection, Postgres, Transaction};

use crate::events::{append_locked, NewEvent};
use crate::{Store, StoreError};

/// An open transaction in which the run's lease has been verified and the run row is locked.
pub struct FencedWrite {
    tx: Transaction<'static, Postgres>,
    token: FenceToken,
    keyring: Arc<Keyring>,
}

impl fmt::Debug for FencedWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedWrite")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens a transaction, locks the run row `FOR UPDATE` and verifies that `token`'s owner
    /// and epoch still hold it and the run is `running`. Otherwise [`StoreError::FenceLost`],
    /// with nothing written.
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
            token: token.clone(),
            keyring: Arc::clone(&self.keyring),
        })
    }
}

impl FencedWrite {
    /// The transaction's connection: the tool performs its write and its read-back here.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    pub fn token(&self) -> &FenceToken {
        &self.token
    }

    /// Appends the `tool_write` audit event (in clear: tool, effect, call index, suspension
    /// number, lease epoch, whether the output is an error — never content; the output itself
    /// sealed) and the journal row of the call (its result sealed), then commits. All or
    /// nothing: if the call was journaled already, [`StoreError::AlreadyJournaled`] and the
    /// write is rolled back with everything else.
    pub async fn commit(
        mut self,
        tool: &str,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<(), StoreError> {
        let t = &self.token;
        let payload = json!({
            "tool": tool,
            "effect": effect.as_str(),
            "call_index": t.call_index.get(),
            "suspension_seq": t.suspension_seq.get(),
            "lease_epoch": t.lease_epoch.get(),
            "is_error": output.is_error,
        });
        let event = NewEvent {
            content: Some(output.content.as_bytes()),
            ..NewEvent::new("tool_write", payload)
        };
        append_locked(&mut self.tx, &self.keyring, t.run_id, &event).await?;
        let inserted = crate::journal::insert(
            &mut self.tx,
            &self.keyring,
            &self.token,
            tool,
            effect,
            output,
        )
        .await?;
        if !inserted {
            self.tx.rollback().await?;
            return Err(StoreError::AlreadyJournaled);
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
