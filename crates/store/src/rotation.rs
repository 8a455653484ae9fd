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
use sqlx::PgConnection;
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

/// One sealed column: how to read a page of its envelopes after a primary key, and how to write
/// back those a batch re-sealed (a compare-and-set on the old envelope).
trait SealedColumn {
    type Key: Send;
    /// `table.column`.
    const NAME: &'static str;
    const PURPOSE: Purpose;
    /// Before every primary key.
    const FIRST: Self::Key;

    /// Up to `limit` rows after `after`, in key order: `(key, run id, envelope)`.
    async fn page(
        tx: &mut PgConnection,
        after: &Self::Key,
        limit: i64,
    ) -> Result<Vec<(Self::Key, Uuid, Vec<u8>)>, sqlx::Error>;

    /// Writes the new envelopes whose row still holds the old one; the number written.
    async fn write(
        tx: &mut PgConnection,
        resealed: Resealed<Self::Key>,
    ) -> Result<u64, sqlx::Error>;
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

impl Store {
    /// Re-seals every sealed column (`runs.state`, `runs.request`, `run_events.sealed`,
    /// `run_decisions.comment`, `run_journal.result`, `webhook_endpoints.secret`) under the
    /// active key, `batch_size` rows
    /// per transaction.
    pub async fn rotate_keys(&self, batch_size: i64) -> Result<RotationReport, StoreError> {
        let limit = batch_size.max(1);
        let mut batches = 0;
        let columns = vec![
            self.rotate_column::<RunColumn<true>>(limit, &mut batches)
                .await?,
            self.rotate_column::<RunColumn<false>>(limit, &mut batches)
                .await?,
            self.rotate_column::<EventPayloads>(limit, &mut batches)
                .await?,
            self.rotate_column::<Comments>(limit, &mut batches).await?,
            self.rotate_column::<JournalResults>(limit, &mut batches)
                .await?,
            self.rotate_column::<WebhookSecrets>(limit, &mut batches)
                .await?,
        ];
        Ok(RotationReport { columns, batches })
    }

    /// Walks column `C` in key order, one transaction per batch of `limit` rows.
    async fn rotate_column<C: SealedColumn>(
        &self,
        limit: i64,
        batches: &mut u64,
    ) -> Result<ColumnRotation, StoreError>
    where
        C::Key: Clone,
    {
        let mut stats = ColumnRotation {
            column: C::NAME,
            examined: 0,
            resealed: 0,
            unreadable: 0,
        };
        let mut after = C::FIRST;
        loop {
            let mut tx = self.pool.begin().await?;
            let rows = C::page(&mut tx, &after, limit).await?;
            let Some((last, _, _)) = rows.last() else {
                break;
            };
            after = last.clone();
            let full = rows.len() as i64 == limit;
            let resealed = reseal_batch(&self.keyring, C::PURPOSE, rows, &mut stats)?;
            stats.resealed += C::write(&mut tx, resealed).await?;
            tx.commit().await?;
            *batches += 1;
            if !full {
                break;
            }
        }
        Ok(stats)
    }
}

/// `runs.state` (`STATE`) or `runs.request`, by run id: the two sealed columns of a run row,
/// read and written by the same two statements.
struct RunColumn<const STATE: bool>;

impl<const STATE: bool> SealedColumn for RunColumn<STATE> {
    type Key = Uuid;
    const NAME: &'static str = if STATE { "runs.state" } else { "runs.request" };
    const PURPOSE: Purpose = if STATE {
        Purpose::State
    } else {
        Purpose::Request
    };
    const FIRST: Uuid = Uuid::nil();

    async fn page(
        tx: &mut PgConnection,
        after: &Uuid,
        limit: i64,
    ) -> Result<Vec<(Uuid, Uuid, Vec<u8>)>, sqlx::Error> {
        let rows = sqlx::query!(
            r#"SELECT id AS "id!", sealed AS "sealed!" FROM (
                   SELECT id, CASE WHEN $3 THEN state ELSE request END AS sealed FROM runs
                   WHERE id > $1) AS r
               WHERE sealed IS NOT NULL ORDER BY id LIMIT $2"#,
            after,
            limit,
            STATE,
        )
        .fetch_all(tx)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.id, r.sealed)).collect())
    }

    async fn write(tx: &mut PgConnection, r: Resealed<Uuid>) -> Result<u64, sqlx::Error> {
        sqlx::query!(
            r#"UPDATE runs r SET state = CASE WHEN $4 THEN v.new ELSE r.state END,
                                 request = CASE WHEN $4 THEN r.request ELSE v.new END
               FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS v(id, old, new)
               WHERE r.id = v.id AND v.old = CASE WHEN $4 THEN r.state ELSE r.request END"#,
            &r.keys,
            &r.olds,
            &r.news,
            STATE,
        )
        .execute(tx)
        .await
        .map(|done| done.rows_affected())
    }
}

/// `webhook_endpoints.secret`, by endpoint id (which it is sealed under).
struct WebhookSecrets;

impl SealedColumn for WebhookSecrets {
    type Key = Uuid;
    const NAME: &'static str = "webhook_endpoints.secret";
    const PURPOSE: Purpose = Purpose::WebhookSecret;
    const FIRST: Uuid = Uuid::nil();

    async fn page(
        tx: &mut PgConnection,
        after: &Uuid,
        limit: i64,
    ) -> Result<Vec<(Uuid, Uuid, Vec<u8>)>, sqlx::Error> {
        let rows = sqlx::query!(
            r#"SELECT id, secret FROM webhook_endpoints WHERE id > $1 ORDER BY id LIMIT $2"#,
            after,
            limit,
        )
        .fetch_all(tx)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.id, r.secret)).collect())
    }

    async fn write(tx: &mut PgConnection, r: Resealed<Uuid>) -> Result<u64, sqlx::Error> {
        sqlx::query!(
            r#"UPDATE webhook_endpoints e SET secret = v.new
               FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS v(id, old, new)
               WHERE e.id = v.id AND e.secret = v.old"#,
            &r.keys,
            &r.olds,
            &r.news,
        )
        .execute(tx)
        .await
        .map(|done| done.rows_affected())
    }
}

/// `run_events.sealed`, by run and sequence.
struct EventPayloads;

impl SealedColumn for EventPayloads {
    type Key = (Uuid, i64);
    const NAME: &'static str = "run_events.sealed";
    const PURPOSE: Purpose = Purpose::Event;
    const FIRST: (Uuid, i64) = (Uuid::nil(), 0);

    async fn page(
        tx: &mut PgConnection,
        after: &(Uuid, i64),
        limit: i64,
    ) -> Result<Vec<((Uuid, i64), Uuid, Vec<u8>)>, sqlx::Error> {
        let rows = sqlx::query!(
            r#"SELECT run_id, sequence, sealed AS "sealed!" FROM run_events
               WHERE (run_id, sequence) > ($1, $2) AND sealed IS NOT NULL
               ORDER BY run_id, sequence LIMIT $3"#,
            after.0,
            after.1,
            limit,
        )
        .fetch_all(tx)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| ((r.run_id, r.sequence), r.run_id, r.sealed))
            .collect())
    }

    async fn write(tx: &mut PgConnection, r: Resealed<(Uuid, i64)>) -> Result<u64, sqlx::Error> {
        let (runs, sequences): (Vec<Uuid>, Vec<i64>) = r.keys.into_iter().unzip();
        sqlx::query!(
            r#"UPDATE run_events e SET sealed = v.new
               FROM unnest($1::uuid[], $2::int8[], $3::bytea[], $4::bytea[])
                    AS v(run_id, sequence, old, new)
               WHERE e.run_id = v.run_id AND e.sequence = v.sequence AND e.sealed = v.old"#,
            &runs,
            &sequences,
            &r.olds,
            &r.news,
        )
        .execute(tx)
        .await
        .map(|done| done.rows_affected())
    }
}

/// `run_decisions.comment`, by decision id.
struct Comments;

impl SealedColumn for Comments {
    type Key = Uuid;
    const NAME: &'static str = "run_decisions.comment";
    const PURPOSE: Purpose = Purpose::Comment;
    const FIRST: Uuid = Uuid::nil();

    async fn page(
        tx: &mut PgConnection,
        after: &Uuid,
        limit: i64,
    ) -> Result<Vec<(Uuid, Uuid, Vec<u8>)>, sqlx::Error> {
        let rows = sqlx::query!(
            r#"SELECT decision_id, run_id, comment AS "comment!" FROM run_decisions
               WHERE decision_id > $1 AND comment IS NOT NULL
               ORDER BY decision_id LIMIT $2"#,
            after,
            limit,
        )
        .fetch_all(tx)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.decision_id, r.run_id, r.comment))
            .collect())
    }

    async fn write(tx: &mut PgConnection, r: Resealed<Uuid>) -> Result<u64, sqlx::Error> {
        sqlx::query!(
            r#"UPDATE run_decisions d SET comment = v.new
               FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS v(id, old, new)
               WHERE d.decision_id = v.id AND d.comment = v.old"#,
            &r.keys,
            &r.olds,
            &r.news,
        )
        .execute(tx)
        .await
        .map(|done| done.rows_affected())
    }
}

/// `run_journal.result`, by run, suspension and call.
struct JournalResults;

impl SealedColumn for JournalResults {
    type Key = (Uuid, i32, i32);
    const NAME: &'static str = "run_journal.result";
    const PURPOSE: Purpose = Purpose::Journal;
    const FIRST: (Uuid, i32, i32) = (Uuid::nil(), 0, -1);

    async fn page(
        tx: &mut PgConnection,
        after: &(Uuid, i32, i32),
        limit: i64,
    ) -> Result<Vec<((Uuid, i32, i32), Uuid, Vec<u8>)>, sqlx::Error> {
        let rows = sqlx::query!(
            r#"SELECT run_id, suspension_seq, call_index, result FROM run_journal
               WHERE (run_id, suspension_seq, call_index) > ($1, $2, $3)
               ORDER BY run_id, suspension_seq, call_index LIMIT $4"#,
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
                    (r.run_id, r.suspension_seq, r.call_index),
                    r.run_id,
                    r.result,
                )
            })
            .collect())
    }

    async fn write(
        tx: &mut PgConnection,
        r: Resealed<(Uuid, i32, i32)>,
    ) -> Result<u64, sqlx::Error> {
        let (runs, (seqs, indexes)): (Vec<Uuid>, (Vec<i32>, Vec<i32>)) = r
            .keys
            .into_iter()
            .map(|(run, seq, index)| (run, (seq, index)))
            .unzip();
        sqlx::query!(
            r#"UPDATE run_journal j SET result = v.new
               FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::bytea[], $5::bytea[])
                    AS v(run_id, suspension_seq, call_index, old, new)
               WHERE j.run_id = v.run_id AND j.suspension_seq = v.suspension_seq
                 AND j.call_index = v.call_index AND j.result = v.old"#,
            &runs,
            &seqs,
            &indexes,
            &r.olds,
            &r.news,
        )
        .execute(tx)
        .await
        .map(|done| done.rows_affected())
    }
}
