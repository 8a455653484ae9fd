//! The execution journal: what a resume segment has already executed.
//!
//! A resume segment can die during its turn and be retried by another worker. The journal row
//! of a call, keyed `(run, suspension_seq, call_index)`, is what lets the retry hand the model
//! the recorded result instead of writing twice. For a turn written to this database the rows
//! of every call are inserted in the turn's one transaction, together with the writes, so the
//! journal of such a turn is all or nothing: a retry finds every result or none, and compares
//! again. A call that acts outside the store is journaled on its own, with its `tool_write`
//! audit event, by the statement that also clears the run's `pending_effect` stamp
//! ([`Store::record_effect`]).

use std::time::Duration;

use countersign_core::{
    CallIndex, Effect, JournalEntry, LeaseEpoch, RunId, SuspensionSeq, ToolOutput,
};
use countersign_crypto::{Keyring, Purpose};
use sqlx::PgExecutor;

use crate::{millis, Lease, Store, StoreError};

/// Which call a journal row is for, and the epoch of the lease it ran under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JournalKey {
    pub run_id: RunId,
    pub seq: SuspensionSeq,
    pub index: CallIndex,
    pub epoch: LeaseEpoch,
}

/// What the guarded `UPDATE` of the run row that journals calls does besides proving the lease
/// is held (owner, epoch, `running`): renew the lease for a time to live, clear the stamp of a
/// call sent outside the store (`pending_effect` and the sent call), both, or neither.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Guard<'a> {
    pub renew: Option<Duration>,
    /// Clears the stamp of the call sent, and the debt of its commit if the turn owes one: the
    /// answer of a call outside the store is being journaled.
    pub clear_stamp: bool,
    /// The commits the turn owes from now on ([`crate::FencedWrite::commit_turn`]).
    pub owed: &'a [CallIndex],
}

/// What [`journal_guarded`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Journaled {
    /// The lease was no longer held: nothing was written.
    FenceLost,
    /// The guard held; this many of the entries were new (the rest had been journaled already
    /// and were kept as they were, without an audit event).
    Inserted(usize),
}

/// In ONE statement: the lease's guarded `UPDATE` of the run row ([`Guard`]), which locks the
/// row until the transaction ends; the journal row of every entry (its result sealed), unless
/// the call was journaled already; and the `tool_write` audit event of every write among the
/// new rows, numbered from the run's trail counter. Nothing is written when the guard loses.
pub(crate) async fn journal_guarded<'e, E: PgExecutor<'e>>(
    executor: E,
    keyring: &Keyring,
    lease: &Lease,
    seq: SuspensionSeq,
    guard: Guard<'_>,
    entries: &[JournalEntry<'_>],
) -> Result<Journaled, StoreError> {
    let mut rows = JournalRows::default();
    for entry in entries {
        rows.push(keyring, lease, seq, entry)?;
    }
    // The statement begins with a comment that names it in `pg_stat_activity`, where the fault
    // tests find it.
    let done = sqlx::query_file!(
        "sql/journal_guarded.sql",
        lease.run_id.as_uuid(),
        lease.owner,
        lease.epoch.get(),
        seq.as_i32(),
        guard.renew.map(|ttl| millis(ttl) as f64),
        guard.clear_stamp,
        &rows.indexes,
        &rows.tools,
        &rows.effects,
        &rows.results,
        &rows.payloads as &[Option<serde_json::Value>],
        &rows.sealed as &[Option<Vec<u8>>],
        &guard.owed.iter().map(|i| i.as_i32()).collect::<Vec<_>>(),
    )
    .fetch_one(executor)
    .await?;
    if done.fenced == 0 {
        return Ok(Journaled::FenceLost);
    }
    Ok(Journaled::Inserted(
        usize::try_from(done.inserted).unwrap_or_default(),
    ))
}

/// The columns of [`journal_guarded`]'s entries, one array each.
#[derive(Default)]
struct JournalRows {
    indexes: Vec<i32>,
    tools: Vec<String>,
    effects: Vec<String>,
    results: Vec<Vec<u8>>,
    /// A write's audit payload in clear, `None` for a call that is no write.
    payloads: Vec<Option<serde_json::Value>>,
    /// A write's output sealed for its audit event.
    sealed: Vec<Option<Vec<u8>>>,
}

impl JournalRows {
    fn push(
        &mut self,
        keyring: &Keyring,
        lease: &Lease,
        seq: SuspensionSeq,
        entry: &JournalEntry<'_>,
    ) -> Result<(), StoreError> {
        let key = JournalKey {
            run_id: lease.run_id,
            seq,
            index: entry.index,
            epoch: lease.epoch,
        };
        let plain = serde_json::to_vec(entry.output)
            .map_err(|_| StoreError::unreadable("run_journal.result"))?;
        let (payload, sealed) = entry
            .effect
            .is_write()
            .then(|| audit_event(keyring, &key, entry.tool, entry.effect, entry.output))
            .transpose()?
            .unzip();
        self.indexes.push(entry.index.as_i32());
        self.tools.push(entry.tool.to_owned());
        self.effects.push(entry.effect.as_str().to_owned());
        self.results
            .push(keyring.seal(Purpose::Journal, lease.run_id, &plain)?);
        self.payloads.push(payload);
        self.sealed.push(sealed);
        Ok(())
    }
}

/// The `tool_write` audit event of a write: in clear the tool, effect, call index, suspension
/// number, lease epoch and whether the output is an error — never content; the output itself
/// sealed.
fn audit_event(
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
    /// and clears the run's stamp (`pending_effect` and the sent call), in one statement
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
        let guard = Guard {
            renew: None,
            clear_stamp: true,
            owed: &[],
        };
        let entry = JournalEntry {
            index,
            tool,
            effect,
            output,
        };
        match journal_guarded(&self.pool, &self.keyring, lease, seq, guard, &[entry]).await? {
            Journaled::FenceLost => Err(StoreError::FenceLost),
            Journaled::Inserted(n) => Ok(n == 1),
        }
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
