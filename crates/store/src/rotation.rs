//! Key rotation: re-sealing every stored envelope under the active key.
//!
//! Only the data key of an envelope is re-wrapped ([`Keyring::reseal`]); the payload
//! ciphertext is untouched, so a rotation costs the same for a 64 KiB state as for a short
//! comment. Each sealed column is walked in primary-key order, one transaction per batch, so a
//! rotation never holds locks on the whole table and can be interrupted and run again: rows
//! already under the active key are skipped. The UPDATE of a batch is a compare-and-set on the
//! old envelope — a row rewritten meanwhile (a new state at a suspend) was sealed under the
//! active key anyway and is left as it is. Once a rotation reports nothing unreadable, the old
//! key can be retired from the keyring.
//!
//! [`Keyring::reseal`]: countersign_crypto::Keyring::reseal

use countersign_crypto::{Keyring, Purpose};
use uuid::Uuid;

use crate::runs::run_id;
use crate::{Store, StoreError};

/// What a rotation did to one sealed column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRotation {
    /// `table.column`.
    pub column: &'static str,
    pub examined: u64,
    /// Re-sealed under the active key.
    pub resealed: u64,
    /// Opened by no key of the keyring: left as it is, and reported so the old key is not
    /// retired while something still needs it.
    pub unreadable: u64,
}

/// What [`Store::rotate_keys`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationReport {
    pub columns: Vec<ColumnRotation>,
    /// Transactions committed.
    pub batches: u64,
}

impl RotationReport {
    pub fn resealed(&self) -> u64 {
        self.columns.iter().map(|c| c.resealed).sum()
    }

    pub fn unreadable(&self) -> u64 {
        self.columns.iter().map(|c| c.unreadable).sum()
    }
}

/// The rows of a batch whose envelope changed: primary keys, old and new envelopes, as the
/// parallel arrays an `unnest` UPDATE takes.
struct Resealed<K> {
    keys: Vec<K>,
    olds: Vec<Vec<u8>>,
    news: Vec<Vec<u8>>,
}

/// Re-seals the envelopes of one batch of `(primary key, run id, envelope)` rows.
fn reseal_batch<K>(
    keyring: &Keyring,
    purpose: Purpose,
    rows: Vec<(K, Uuid, Vec<u8>)>,
    stats: &mut ColumnRotation,
) -> Result<Resealed<K>, StoreError> {
    let mut out = Resealed {
        keys: Vec::new(),
        olds: Vec::new(),
        news: Vec::new(),
    };
    for (key, run, old) in rows {
        stats.examined += 1;
        match keyring.reseal(purpose, run_id(run)?, &old) {
            Ok(Some(new)) => {
                out.keys.push(key);
                out.olds.push(old);
                out.news.push(new);
            }
            Ok(None) => {}
            Err(e) => {
                stats.unreadable += 1;
                tracing::warn!(column = stats.column, run.id = %run, code = e.code(),
                    "envelope opens under no key of the keyring; left as it is");
            }
        }
    }
    Ok(out)
}

fn column(column: &'static str) -> ColumnRotation {
    ColumnRotation {
        column,
        examined: 0,
        resealed: 0,
        unreadable: 0,
    }
}

impl Store {
    /// Re-seals every sealed column (`runs.state`, `runs.request`, `run_events.sealed`,
    /// `run_decisions.comment`, `run_journal.result`) under the active key, `batch_size` rows
    /// per transaction.
    pub async fn rotate_keys(&self, batch_size: i64) -> Result<RotationReport, StoreError> {
        let batch_size = batch_size.max(1);
        let mut report = RotationReport {
            columns: Vec::new(),
            batches: 0,
        };
        report.columns.push(
            self.rotate_run_states(batch_size, &mut report.batches)
                .await?,
        );
        report.columns.push(
            self.rotate_run_requests(batch_size, &mut report.batches)
                .await?,
        );
        report
            .columns
            .push(self.rotate_events(batch_size, &mut report.batches).await?);
        report.columns.push(
            self.rotate_comments(batch_size, &mut report.batches)
                .await?,
        );
        report
            .columns
            .push(self.rotate_journal(batch_size, &mut report.batches).await?);
        Ok(report)
    }

    async fn rotate_run_states(
        &self,
        limit: i64,
        batches: &mut u64,
    ) -> Result<ColumnRotation, StoreError> {
        let mut stats = column("runs.state");
        let mut after = Uuid::nil();
        loop {
            let mut tx = self.pool.begin().await?;
            let rows = sqlx::query!(
                r#"SELECT id, state AS "state!" FROM runs
                   WHERE id > $1 AND state IS NOT NULL ORDER BY id LIMIT $2"#,
                after,
                limit,
            )
            .fetch_all(&mut *tx)
            .await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            let full = rows.len() as i64 == limit;
            let rows = rows.into_iter().map(|r| (r.id, r.id, r.state)).collect();
            let Resealed {
                keys: ids,
                olds,
                news,
            } = reseal_batch(&self.keyring, Purpose::State, rows, &mut stats)?;
            let done = sqlx::query!(
                r#"UPDATE runs r SET state = v.new
                   FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS v(id, old, new)
                   WHERE r.id = v.id AND r.state = v.old"#,
                &ids,
                &olds,
                &news,
            )
            .execute(&mut *tx)
            .await?;
            stats.resealed += done.rows_affected();
            tx.commit().await?;
            *batches += 1;
            if !full {
                break;
            }
        }
        Ok(stats)
    }

    async fn rotate_run_requests(
        &self,
        limit: i64,
        batches: &mut u64,
    ) -> Result<ColumnRotation, StoreError> {
        let mut stats = column("runs.request");
        let mut after = Uuid::nil();
        loop {
            let mut tx = self.pool.begin().await?;
            let rows = sqlx::query!(
                "SELECT id, request FROM runs WHERE id > $1 ORDER BY id LIMIT $2",
                after,
                limit,
            )
            .fetch_all(&mut *tx)
            .await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            let full = rows.len() as i64 == limit;
            let rows = rows.into_iter().map(|r| (r.id, r.id, r.request)).collect();
            let Resealed {
                keys: ids,
                olds,
                news,
            } = reseal_batch(&self.keyring, Purpose::Request, rows, &mut stats)?;
            let done = sqlx::query!(
                r#"UPDATE runs r SET request = v.new
                   FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS v(id, old, new)
                   WHERE r.id = v.id AND r.request = v.old"#,
                &ids,
                &olds,
                &news,
            )
            .execute(&mut *tx)
            .await?;
            stats.resealed += done.rows_affected();
            tx.commit().await?;
            *batches += 1;
            if !full {
                break;
            }
        }
        Ok(stats)
    }

    async fn rotate_events(
        &self,
        limit: i64,
        batches: &mut u64,
    ) -> Result<ColumnRotation, StoreError> {
        let mut stats = column("run_events.sealed");
        let mut after = (Uuid::nil(), 0_i64);
        loop {
            let mut tx = self.pool.begin().await?;
            let rows = sqlx::query!(
                r#"SELECT run_id, sequence, sealed AS "sealed!" FROM run_events
                   WHERE (run_id, sequence) > ($1, $2) AND sealed IS NOT NULL
                   ORDER BY run_id, sequence LIMIT $3"#,
                after.0,
                after.1,
                limit,
            )
            .fetch_all(&mut *tx)
            .await?;
            let Some(last) = rows.last() else { break };
            after = (last.run_id, last.sequence);
            let full = rows.len() as i64 == limit;
            let rows = rows
                .into_iter()
                .map(|r| ((r.run_id, r.sequence), r.run_id, r.sealed))
                .collect();
            let Resealed { keys, olds, news } =
                reseal_batch(&self.keyring, Purpose::Event, rows, &mut stats)?;
            let (runs, sequences): (Vec<Uuid>, Vec<i64>) = keys.into_iter().unzip();
            let done = sqlx::query!(
                r#"UPDATE run_events e SET sealed = v.new
                   FROM unnest($1::uuid[], $2::int8[], $3::bytea[], $4::bytea[])
                        AS v(run_id, sequence, old, new)
                   WHERE e.run_id = v.run_id AND e.sequence = v.sequence AND e.sealed = v.old"#,
                &runs,
                &sequences,
                &olds,
                &news,
            )
            .execute(&mut *tx)
            .await?;
            stats.resealed += done.rows_affected();
            tx.commit().await?;
            *batches += 1;
            if !full {
                break;
            }
        }
        Ok(stats)
    }

    async fn rotate_comments(
        &self,
        limit: i64,
        batches: &mut u64,
    ) -> Result<ColumnRotation, StoreError> {
        let mut stats = column("run_decisions.comment");
        let mut after = Uuid::nil();
        loop {
            let mut tx = self.pool.begin().await?;
            let rows = sqlx::query!(
                r#"SELECT decision_id, run_id, comment AS "comment!" FROM run_decisions
                   WHERE decision_id > $1 AND comment IS NOT NULL
                   ORDER BY decision_id LIMIT $2"#,
                after,
                limit,
            )
            .fetch_all(&mut *tx)
            .await?;
            let Some(last) = rows.last() else { break };
            after = last.decision_id;
            let full = rows.len() as i64 == limit;
            let rows = rows
                .into_iter()
                .map(|r| (r.decision_id, r.run_id, r.comment))
                .collect();
            let Resealed {
                keys: ids,
                olds,
                news,
            } = reseal_batch(&self.keyring, Purpose::Comment, rows, &mut stats)?;
            let done = sqlx::query!(
                r#"UPDATE run_decisions d SET comment = v.new
                   FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS v(id, old, new)
                   WHERE d.decision_id = v.id AND d.comment = v.old"#,
                &ids,
                &olds,
                &news,
            )
            .execute(&mut *tx)
            .await?;
            stats.resealed += done.rows_affected();
            tx.commit().await?;
            *batches += 1;
            if !full {
                break;
            }
        }
        Ok(stats)
    }

    async fn rotate_journal(
        &self,
        limit: i64,
        batches: &mut u64,
    ) -> Result<ColumnRotation, StoreError> {
        let mut stats = column("run_journal.result");
        let mut after = (Uuid::nil(), 0_i32, -1_i32);
        loop {
            let mut tx = self.pool.begin().await?;
            let rows = sqlx::query!(
                r#"SELECT run_id, suspension_seq, call_index, result FROM run_journal
                   WHERE (run_id, suspension_seq, call_index) > ($1, $2, $3)
                   ORDER BY run_id, suspension_seq, call_index LIMIT $4"#,
                after.0,
                after.1,
                after.2,
                limit,
            )
            .fetch_all(&mut *tx)
            .await?;
            let Some(last) = rows.last() else { break };
            after = (last.run_id, last.suspension_seq, last.call_index);
            let full = rows.len() as i64 == limit;
            let rows = rows
                .into_iter()
                .map(|r| {
                    (
                        (r.run_id, r.suspension_seq, r.call_index),
                        r.run_id,
                        r.result,
                    )
                })
                .collect();
            let Resealed { keys, olds, news } =
                reseal_batch(&self.keyring, Purpose::Journal, rows, &mut stats)?;
            let mut runs = Vec::with_capacity(keys.len());
            let mut seqs = Vec::with_capacity(keys.len());
            let mut indexes = Vec::with_capacity(keys.len());
            for (run, seq, index) in keys {
                runs.push(run);
                seqs.push(seq);
                indexes.push(index);
            }
            let done = sqlx::query!(
                r#"UPDATE run_journal j SET result = v.new
                   FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::bytea[], $5::bytea[])
                        AS v(run_id, suspension_seq, call_index, old, new)
                   WHERE j.run_id = v.run_id AND j.suspension_seq = v.suspension_seq
                     AND j.call_index = v.call_index AND j.result = v.old"#,
                &runs,
                &seqs,
                &indexes,
                &olds,
                &news,
            )
            .execute(&mut *tx)
            .await?;
            stats.resealed += done.rows_affected();
            tx.commit().await?;
            *batches += 1;
            if !full {
                break;
            }
        }
        Ok(stats)
    }
}
