//! The execution journal: what a resume segment has already executed.
//!
//! A resume segment can die during its turn and be retried by another worker. The journal row
//! of a call, keyed `(run, suspension_seq, call_index)`, is what lets the retry hand the model
//! the recorded result instead of writing twice. For a turn written to this database the rows
//! of every call are inserted in the turn's one transaction, together with the writes, so the
//! journal of such a turn is all or nothing: a retry finds every result or none, and compares
//! again. A call that acts outside the store is journaled on its own, with its `tool_write`
//! audit event, in the transaction that also clears the run's `pending_effect` stamp
//! ([`Store::record_effect`]).

use countersign_core::{CallIndex, Effect, LeaseEpoch, RunId, SuspensionSeq, ToolOutput};
use countersign_crypto::{Keyring, Purpose};
use sqlx::PgConnection;

use crate::{Lease, Store, StoreError};

/// Which call a journal row is for, and the epoch of the lease it ran under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JournalKey {
    pub run_id: RunId,
    pub seq: SuspensionSeq,
    pub index: CallIndex,
    pub epoch: LeaseEpoch,
}

/// Inserts the journal row of a call and, with `audit` (the payload in clear, the sealed
/// content), its `tool_write` audit event numbered from the run's trail counter — in one
/// statement. `false`, and nothing inserted, when the call was journaled already.
pub(crate) async fn insert_audited(
    conn: &mut PgConnection,
    keyring: &Keyring,
    key: &JournalKey,
    tool: &str,
    effect: Effect,
    output: &ToolOutput,
    audit: Option<(serde_json::Value, Vec<u8>)>,
) -> Result<bool, StoreError> {
    let plain =
        serde_json::to_vec(output).map_err(|_| StoreError::unreadable("run_journal.result"))?;
    let sealed = keyring.seal(Purpose::Journal, key.run_id, &plain)?;
    let audited = audit.is_some();
    let (payload, content) = audit.unzip();
    let inserted = sqlx::query_scalar!(
        r#"WITH journaled AS (
               INSERT INTO run_journal (run_id, suspension_seq, call_index, tool, effect, result,
                                        lease_epoch, created_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())
               ON CONFLICT (run_id, suspension_seq, call_index) DO NOTHING
               RETURNING call_index),
           next AS (
               INSERT INTO run_trails (run_id, last_sequence)
               SELECT $1, 1 FROM journaled WHERE $8
               ON CONFLICT (run_id) DO UPDATE SET last_sequence = run_trails.last_sequence + 1
               RETURNING last_sequence),
           audit AS (
               INSERT INTO run_events (run_id, sequence, kind, payload, sealed)
               SELECT $1, next.last_sequence, 'tool_write', $9::jsonb, $10::bytea FROM next
               RETURNING sequence)
           SELECT EXISTS (SELECT 1 FROM journaled) AS "inserted!""#,
        key.run_id.as_uuid(),
        key.seq.as_i32(),
        key.index.as_i32(),
        tool,
        effect.as_str(),
        sealed,
        key.epoch.get(),
        audited,
        payload,
        content,
    )
    .fetch_one(conn)
    .await?;
    Ok(inserted)
}

/// The `tool_write` audit event of a write: in clear the tool, effect, call index, suspension
/// number, lease epoch and whether the output is an error — never content; the output itself
/// sealed.
pub(crate) fn audit_event(
    keyring: &Keyring,
    key: &JournalKey,
    tool: &str,
    effect: Effect,
    output: &ToolOutput,
) -> Result<(serde_json::Value, Vec<u8>), StoreError> {
    let payload = serde_json::json!({
        "tool": tool,
        "effect": effect.as_str(),
        "call_index": key.index.get(),
        "suspension_seq": key.seq.get(),
        "lease_epoch": key.epoch.get(),
        "is_error": output.is_error,
    });
    let content = keyring.seal(Purpose::Event, key.run_id, output.content.as_bytes())?;
    Ok((payload, content))
}

/// Every journaled result of suspension `seq`'s turn, in call order.
pub(crate) async fn turn(
    conn: &mut PgConnection,
    keyring: &Keyring,
    run_id: RunId,
    seq: SuspensionSeq,
) -> Result<Vec<(CallIndex, ToolOutput)>, StoreError> {
    let rows = sqlx::query!(
        r#"SELECT call_index, result FROM run_journal
           WHERE run_id = $1 AND suspension_seq = $2 ORDER BY call_index"#,
        run_id.as_uuid(),
        seq.as_i32(),
    )
    .fetch_all(conn)
    .await?;
    let rows: Vec<(i32, Vec<u8>)> = rows.into_iter().map(|r| (r.call_index, r.result)).collect();
    opened(keyring, run_id, &rows)
}

/// Journal rows (call index, sealed result) as read, their results opened.
pub(crate) fn opened(
    keyring: &Keyring,
    run_id: RunId,
    rows: &[(i32, Vec<u8>)],
) -> Result<Vec<(CallIndex, ToolOutput)>, StoreError> {
    rows.iter()
        .map(|(call_index, result)| {
            let index = usize::try_from(*call_index)
                .map(CallIndex::new)
                .map_err(|_| StoreError::unreadable("run_journal.call_index"))?;
            Ok((index, open(keyring, run_id, result)?))
        })
        .collect()
}

fn open(keyring: &Keyring, run_id: RunId, sealed: &[u8]) -> Result<ToolOutput, StoreError> {
    let plain = keyring.open(Purpose::Journal, run_id, sealed)?;
    serde_json::from_slice(&plain).map_err(|_| StoreError::unreadable("run_journal.result"))
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
        sealed
            .map(|sealed| open(&self.keyring, run_id, &sealed))
            .transpose()
    }

    /// Records the result of a call executed outside this database (an external effect, whose
    /// idempotency key the resource enforces) with, for a write, its `tool_write` audit event,
    /// and clears the run's stamp (`pending_effect` and the sent call), in one transaction
    /// guarded by the lease: an audit event that cannot be stored keeps the result from being
    /// recorded too. Idempotent: a second record of the same call keeps the first and returns
    /// `false`. [`StoreError::FenceLost`] when the lease is gone: the result is not recorded,
    /// and the stamp stays for the reaper to judge.
    pub async fn record_effect(
        &self,
        lease: &Lease,
        seq: SuspensionSeq,
        index: CallIndex,
        tool: &str,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let held = sqlx::query!(
            r#"UPDATE runs SET pending_effect = NULL, sent_seq = NULL, sent_call = NULL
               WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3"#,
            lease.run_id.as_uuid(),
            lease.owner,
            lease.epoch.get(),
        )
        .execute(&mut *tx)
        .await?;
        if held.rows_affected() != 1 {
            tx.rollback().await?;
            return Err(StoreError::FenceLost);
        }
        let key = JournalKey {
            run_id: lease.run_id,
            seq,
            index,
            epoch: lease.epoch,
        };
        let audit = effect
            .is_write()
            .then(|| audit_event(&self.keyring, &key, tool, effect, output))
            .transpose()?;
        let inserted =
            insert_audited(&mut tx, &self.keyring, &key, tool, effect, output, audit).await?;
        tx.commit().await?;
        Ok(inserted)
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
