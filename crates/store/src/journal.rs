//! The execution journal: what a resume segment has already executed.
//!
//! A resume segment can die between two calls and be retried by another worker. The journal
//! row of a call, keyed `(run, suspension_seq, call_index)`, is what lets the retry skip a call
//! that already ran and hand the model the recorded result instead of writing twice. For
//! writes to this database the row is inserted inside the fenced write's transaction, so it
//! exists exactly when the write does. The comparator may only run while no call of the turn
//! has been journaled ([`Store::any_journaled`]): once a call executed, the turn is committed
//! to.

use countersign_core::{CallIndex, Effect, FenceToken, RunId, SuspensionSeq, ToolOutput};
use countersign_crypto::{Keyring, Purpose};
use sqlx::PgConnection;

use crate::{Store, StoreError};

/// Inserts the journal row of `token`'s call; `false` when one exists already.
pub(crate) async fn insert(
    conn: &mut PgConnection,
    keyring: &Keyring,
    token: &FenceToken,
    tool: &str,
    effect: Effect,
    output: &ToolOutput,
) -> Result<bool, StoreError> {
    let plain =
        serde_json::to_vec(output).map_err(|_| StoreError::unreadable("run_journal.result"))?;
    let sealed = keyring.seal(Purpose::Journal, token.run_id, &plain)?;
    let inserted = sqlx::query_scalar!(
        r#"INSERT INTO run_journal (run_id, suspension_seq, call_index, tool, effect, result, lease_epoch)
           VALUES ($1, $2, $3, $4, $5, $6, $7)
           ON CONFLICT (run_id, suspension_seq, call_index) DO NOTHING
           RETURNING call_index"#,
        token.run_id.as_uuid(),
        token.suspension_seq.as_i32(),
        token.call_index.as_i32(),
        tool,
        effect.as_str(),
        sealed,
        token.lease_epoch.get(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(inserted.is_some())
}

impl Store {
    /// The recorded result of a call, if it was executed already.
    pub async fn journaled(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
        index: CallIndex,
    ) -> Result<Option<ToolOutput>, StoreError> {
        let sealed = sqlx::query_scalar!(
            r#"SELECT result FROM run_journal
               WHERE run_id = $1 AND suspension_seq = $2 AND call_index = $3"#,
            run_id.as_uuid(),
            seq.as_i32(),
            index.as_i32(),
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(sealed) = sealed else {
            return Ok(None);
        };
        let plain = self.keyring.open(Purpose::Journal, run_id, &sealed)?;
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(|_| StoreError::unreadable("run_journal.result"))
    }

    /// Records the result of a call executed outside this database (an external effect, whose
    /// idempotency key the resource already enforced). Idempotent: a second record of the same
    /// call keeps the first and returns `false`.
    pub async fn record_journal(
        &self,
        token: &FenceToken,
        tool: &str,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<bool, StoreError> {
        let mut conn = self.pool.acquire().await?;
        insert(&mut conn, &self.keyring, token, tool, effect, output).await
    }

    /// Whether any call of the suspension has been journaled.
    pub async fn any_journaled(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
    ) -> Result<bool, StoreError> {
        let found = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM run_journal WHERE run_id = $1 AND suspension_seq = $2)
               AS "found!""#,
            run_id.as_uuid(),
            seq.as_i32(),
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(found)
    }
}
