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
//! The columns differ only in their table, key and run, so their statements are the branches of
//! two SQL functions (migration 0022: `sealed_page`, `sealed_write`) and the walk is one loop
//! over their names.
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

/// The sealed columns, in the order a rotation walks them: `table.column`, as the migrations'
/// `sealed_page` and `sealed_write` name it, and what its envelopes are sealed for.
const SEALED_COLUMNS: [(&str, Purpose); 7] = [
    ("runs.state", Purpose::State),
    ("runs.request", Purpose::Request),
    ("run_events.sealed", Purpose::Event),
    ("run_decisions.comment", Purpose::Comment),
    ("run_decisions.detail", Purpose::Comment),
    ("run_journal.result", Purpose::Journal),
    ("webhook_endpoints.secret", Purpose::WebhookSecret),
];

/// A row's key in its column: a column keyed by one uuid leaves the other two at 0.
type Key = (Uuid, i64, i64);

/// Before every key.
const FIRST: Key = (Uuid::nil(), -1, -1);

/// The rows of a batch whose envelope changed: their keys, old and new envelopes, as the
/// parallel arrays `sealed_write` takes.
#[derive(Default)]
struct Resealed {
    ids: Vec<Uuid>,
    seqs: Vec<i64>,
    indexes: Vec<i64>,
    olds: Vec<Vec<u8>>,
    news: Vec<Vec<u8>>,
}

/// Re-seals the envelopes of one batch of `(key, sealed under, envelope)` rows.
fn reseal_batch(
    keyring: &Keyring,
    purpose: Purpose,
    rows: Vec<(Key, Uuid, Vec<u8>)>,
    stats: &mut ColumnRotation,
) -> Result<Resealed, StoreError> {
    let mut out = Resealed::default();
    for ((id, seq, index), run, old) in rows {
        stats.examined += 1;
        match keyring.reseal(purpose, run_id(run)?, &old) {
            Ok(Some(new)) => {
                out.ids.push(id);
                out.seqs.push(seq);
                out.indexes.push(index);
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

impl Store {
    /// Re-seals every sealed column (`runs.state`, `runs.request`, `run_events.sealed`,
    /// `run_decisions.comment` and `.detail`, `run_journal.result`,
    /// `webhook_endpoints.secret`) under the
    /// active key, `batch_size` rows per transaction.
    pub async fn rotate_keys(&self, batch_size: i64) -> Result<RotationReport, StoreError> {
        let limit = batch_size.max(1);
        let mut report = RotationReport {
            columns: Vec::new(),
            batches: 0,
        };
        for (column, purpose) in SEALED_COLUMNS {
            let stats = self
                .rotate_column(column, purpose, limit, &mut report.batches)
                .await?;
            report.columns.push(stats);
        }
        Ok(report)
    }

    /// Walks `column` in key order, one transaction per batch of `limit` rows.
    async fn rotate_column(
        &self,
        column: &'static str,
        purpose: Purpose,
        limit: i64,
        batches: &mut u64,
    ) -> Result<ColumnRotation, StoreError> {
        let mut stats = ColumnRotation {
            column,
            examined: 0,
            resealed: 0,
            unreadable: 0,
        };
        let mut after = FIRST;
        loop {
            let mut tx = self.pool.begin().await?;
            let rows = sealed_page(&mut tx, column, after, limit).await?;
            let Some((last, _, _)) = rows.last() else {
                break;
            };
            after = *last;
            let full = rows.len() as i64 == limit;
            let r = reseal_batch(&self.keyring, purpose, rows, &mut stats)?;
            let written = sqlx::query_scalar!(
                r#"SELECT sealed_write($1, $2, $3, $4, $5, $6) AS "written!""#,
                column,
                &r.ids,
                &r.seqs,
                &r.indexes,
                &r.olds,
                &r.news,
            )
            .fetch_one(&mut *tx)
            .await?;
            stats.resealed += written.unsigned_abs();
            tx.commit().await?;
            *batches += 1;
            if !full {
                break;
            }
        }
        Ok(stats)
    }
}
/// One page of `column`'s envelopes after `after`, in key order: each row's key, the run (or
/// endpoint) it is sealed under, and the envelope.
async fn sealed_page(
    tx: &mut sqlx::PgConnection,
    column: &str,
    after: Key,
    limit: i64,
) -> Result<Vec<(Key, Uuid, Vec<u8>)>, StoreError> {
    let rows = sqlx::query!(
        r#"SELECT key_id AS "key_id!", key_seq AS "key_seq!", key_index AS "key_index!",
                          sealed_under AS "sealed_under!", envelope AS "envelope!"
                   FROM sealed_page($1, $2, $3, $4, $5)"#,
        column,
        after.0,
        after.1,
        after.2,
        limit,
    )
    .fetch_all(tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            (
                (r.key_id, r.key_seq, r.key_index),
                r.sealed_under,
                r.envelope,
            )
        })
        .collect())
}
