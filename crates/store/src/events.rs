//! The audit trail of a run: `run_events`, numbered 1, 2, … per run without gaps.
//!
//! The sequence is taken from the run's trail counter (`run_trails.last_sequence`), which the
//! appending statement increments with an upsert. That acts on the counter's latest version and
//! locks it until the transaction ends, so a second appender waits for the first and gets the
//! next number, even within one statement with the transition it audits (a `max(sequence)`
//! read there could see an older snapshot). A transaction that rolls back takes its number with
//! it, so no gap is left; a refusal's audit row leaves the run's own row untouched.

//! The payload is in clear and carries only ids, codes and counts; anything with content goes
//! into the sealed part.

use chrono::{DateTime, Utc};
use countersign_core::RunId;
use countersign_crypto::{Keyring, Purpose};
use serde_json::Value;
use sqlx::PgConnection;

use crate::{Store, StoreError};

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent<'a> {
    /// Lowercase code, e.g. `run.suspended`, `tool_write`.
    pub kind: &'a str,
    /// The tool-loop round the event belongs to, if any.
    pub round: Option<i32>,
    pub duration_ms: Option<i64>,
    /// A JSON object of ids, codes and counts. Never content.
    pub payload: Value,
    /// Content (a tool result, a transcript excerpt), sealed before it is stored.
    pub content: Option<&'a [u8]>,
}

impl<'a> NewEvent<'a> {
    pub fn new(kind: &'a str, payload: Value) -> Self {
        NewEvent {
            kind,
            round: None,
            duration_ms: None,
            payload,
            content: None,
        }
    }
}

/// A stored event. `sealed` is opened with [`Store::open_event_content`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    pub sequence: i64,
    pub kind: String,
    pub round: Option<i32>,
    pub duration_ms: Option<i64>,
    pub payload: Value,
    pub sealed: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
}

/// Locks the run row for the rest of the transaction. `false` when the run does not exist.
pub(crate) async fn lock_run(conn: &mut PgConnection, run_id: RunId) -> Result<bool, StoreError> {
    let found = sqlx::query_scalar!(
        "SELECT id FROM runs WHERE id = $1 FOR UPDATE",
        run_id.as_uuid()
    )
    .fetch_optional(conn)
    .await?;
    Ok(found.is_some())
}

/// Appends an event, numbered from the run's trail counter (`run_trails`): the upsert that
/// takes the number locks the counter until the transaction ends, so appenders serialise there
/// and the numbers stay gap-free, whatever else the transaction holds.
pub(crate) async fn append_locked(
    conn: &mut PgConnection,
    keyring: &Keyring,
    run_id: RunId,
    event: &NewEvent<'_>,
) -> Result<i64, StoreError> {
    let sealed = event
        .content
        .map(|c| keyring.seal(Purpose::Event, run_id, c))
        .transpose()?;
    let sequence = sqlx::query_scalar!(
        r#"SELECT trail_append($1, $2, $5, $6, $3, $4) AS "sequence!""#,
        run_id.as_uuid(),
        event.kind,
        event.round,
        event.duration_ms,
        event.payload,
        sealed,
    )
    .fetch_one(conn)
    .await?;
    Ok(sequence)
}

impl Store {
    /// Appends an event to the run's trail and returns its sequence number.
    pub async fn append_event(
        &self,
        run_id: RunId,
        event: &NewEvent<'_>,
    ) -> Result<i64, StoreError> {
        let mut tx = self.pool.begin().await?;
        if !lock_run(&mut tx, run_id).await? {
            return Err(StoreError::RunNotFound(run_id));
        }
        let sequence = append_locked(&mut tx, &self.keyring, run_id, event).await?;
        tx.commit().await?;
        Ok(sequence)
    }

    /// The run's events in sequence order, content still sealed.
    pub async fn events(&self, run_id: RunId) -> Result<Vec<RunEvent>, StoreError> {
        let rows = sqlx::query_as!(
            RunEvent,
            r#"SELECT sequence, kind, round, duration_ms, payload, sealed, created_at
               FROM run_events WHERE run_id = $1 ORDER BY sequence"#,
            run_id.as_uuid(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Opens the sealed content of one of the run's events; `None` when it has none.
    pub fn open_event_content(
        &self,
        run_id: RunId,
        event: &RunEvent,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        event
            .sealed
            .as_deref()
            .map(|s| self.keyring.open(Purpose::Event, run_id, s))
            .transpose()
            .map_err(StoreError::from)
    }
}
