//! The transactional outbox of the public events.
//!
//! Publishing an event after the commit of the transition it announces loses it whenever the
//! process dies in between — and a lost `run.suspended` is a run nobody is ever asked to
//! approve. So an event is a row of `event_outbox`, written by [`append`] in the transaction of
//! its transition: the announcement exists exactly when the change does. A relay
//! ([`Store::relay_batch`]) then claims a batch of unpublished rows with one `UPDATE` that
//! sets a short claim (`claimed_until`), hands each to a publisher that waits for the broker's
//! confirm, and deletes the sent ones with a second: the outbox holds what is still to be sent,
//! and the audit trail (`run_events`) is the record of what happened. No transaction is held
//! open while the broker is waited on. A crash after the confirm and before the delete sends
//! the row again once its claim ran out, so delivery is at least once, and the body
//! carries `event_id` (the row's id) for consumers to deduplicate by. Two relays never claim
//! the same row at once: the claim's subquery skips rows another claim is updating, and a row
//! claimed by another relay is not claimable until that claim runs out.
//!
//! The rows a process commits itself need no claim: the transition returns them and hands
//! them to the process's relay ([`Store::take_handed_off`]), which publishes them at once and
//! notes the confirmed ones; many rows are deleted (and the `dispatched_at` of the runs whose
//! wake-ups were confirmed written) together by [`Store::flush_marks`]. A delete rather than a
//! `published_at` mark: an `UPDATE` of a column the unpublished index names writes a new copy
//! of the row, body and index entries included, for a row nobody reads again. A claiming sweep
//! (`relay_batch` with an age) is what publishes the rows no relay was handed: those of a
//! process that died, or whose publish failed.
//!
//! The body is [`Event::to_json`] with `at` from the database clock (`now()`, the time of the
//! transaction, so the same instant as the transition's `updated_at`), never a process's.
//! Order is by `(created_at, id)` within one relay; relays in several processes may interleave,
//! so a consumer orders by the facts the events carry (`suspension_seq`, `at`), not by arrival.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::{Event, EventName, RunId};
use countersign_crypto::Keyring;
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{millis, Store, StoreError};
use countersign_crypto::Purpose;

/// An outbox row as the relay hands it to a publisher.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    /// The event id, also the body's `event_id`.
    pub id: Uuid,
    /// `None` for an event about no stored run (a refused run request).
    pub run_id: Option<Uuid>,
    /// The event name: the routing key.
    pub kind: String,
    /// The full public body.
    pub body: Value,
    pub created_at: DateTime<Utc>,
}

/// Where the relay sends events: the broker's events exchange, with confirms.
pub trait EventPublisher: Send + Sync {
    type Error: Send;

    /// Publishes one event and resolves once the broker confirmed it. An error leaves the row
    /// unpublished for the next attempt.
    fn publish(&self, event: &OutboxEvent) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// What one [`Store::relay_batch`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayReport<E> {
    /// Rows published (and deleted from the outbox).
    pub published: u64,
    /// Rows the batch claimed (published, failed, or not tried after a failure).
    pub claimed: u64,
    /// The publish failure that stopped the batch; the rest of its rows stay unpublished.
    pub error: Option<E>,
}

/// Appends `event` to the outbox inside the caller's transaction and returns its id. The body
/// is `event.to_json` with `at` = the database's `now()` (RFC 3339, UTC) and `event_id` = the
/// id. It is published only if the transaction commits; call [`Store::wake_relay`] after the
/// commit to publish it at once rather than at the relay's next poll.
pub async fn append(
    conn: &mut PgConnection,
    run_id: Option<RunId>,
    event: &Event,
) -> Result<OutboxEvent, StoreError> {
    announce(conn, run_id, event, None, None).await
}

/// The statement both [`append`] and [`announce_locked`] are: the SQL function `announce`
/// writes the outbox row and, when a payload is given, the audit row first.
async fn announce(
    conn: &mut PgConnection,
    run_id: Option<RunId>,
    event: &Event,
    payload: Option<Value>,
    sealed: Option<Vec<u8>>,
) -> Result<OutboxEvent, StoreError> {
    let row = sqlx::query_as!(
        Row,
        r#"SELECT e.id AS "id!", e.run_id, e.kind AS "kind!", e.body AS "body!",
                  e.created_at AS "created_at!"
           FROM announce($1, $2, $3, $4, $5, $6) AS e"#,
        run_id.map(|r| r.as_uuid()),
        Uuid::now_v7(),
        event.name.as_str(),
        stored_body(event),
        payload,
        sealed,
    )
    .fetch_one(conn)
    .await?;
    Ok(row.into())
}

/// The body of `event` as a statement stores it: without `at` and `event_id`, which the
/// statement adds from the database clock and the row's id.
pub(crate) fn stored_body(event: &Event) -> Value {
    let mut body = event.to_json("");
    if let Value::Object(map) = &mut body {
        map.remove("at");
        map.remove("event_id");
    }
    body
}

/// Events to announce in one statement, column by column (for `unnest`): their names, audit
/// payloads (the fields but `run_id`), outbox ids and stored bodies.
pub(crate) struct Batch {
    pub(crate) kinds: Vec<String>,
    pub(crate) payloads: Vec<Value>,
    pub(crate) ids: Vec<Uuid>,
    pub(crate) bodies: Vec<Value>,
}

impl Batch {
    pub(crate) fn of(events: &[Event]) -> Batch {
        Batch {
            kinds: events.iter().map(|e| e.name.as_str().to_owned()).collect(),
            payloads: events.iter().map(audit_payload).collect(),
            ids: events.iter().map(|_| Uuid::now_v7()).collect(),
            bodies: events.iter().map(stored_body).collect(),
        }
    }
}

/// The payload of an event's audit row: its fields but `run_id`, which the row names.
pub(crate) fn audit_payload(event: &Event) -> Value {
    let mut payload = event.fields.clone();
    payload.remove("run_id");
    Value::Object(payload)
}

/// Appends the event's audit row to the run's trail (its fields but `run_id` as the payload,
/// `content` sealed) and its outbox row, in one statement, inside a transaction that holds the
/// run row's lock (the audit row's sequence number relies on it).
pub(crate) async fn announce_locked(
    conn: &mut PgConnection,
    keyring: &Keyring,
    run_id: RunId,
    event: &Event,
    content: Option<&[u8]>,
) -> Result<OutboxEvent, StoreError> {
    let sealed = content
        .map(|c| keyring.seal(Purpose::Event, run_id, c))
        .transpose()?;
    announce(
        conn,
        Some(run_id),
        event,
        Some(audit_payload(event)),
        sealed,
    )
    .await
}

/// How many handed-off rows a process keeps for its relay at most.
pub const HANDOFF_LIMIT: usize = 10_000;

/// What this process committed and its relay has not finished with: rows to publish, rows
/// confirmed and runs dispatched that are not yet marked.
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    fresh: Vec<HandedOff>,
    published: Vec<Uuid>,
    /// Each run woken, with the time of the event that woke it.
    dispatched: Vec<(Uuid, DateTime<Utc>)>,
}

/// A row this process committed, handed to its relay with the span of the work that committed
/// it: the relay publishes it inside that span, so the message carries that trace on — to the
/// worker a wake-up event wakes, and to any consumer of the events.
#[derive(Debug)]
pub struct HandedOff {
    pub row: OutboxEvent,
    pub span: tracing::Span,
}

impl OutboxEvent {
    /// The run this event hands to the workers, when it is one of [`EventName::WAKE_UPS`]: its
    /// publish is that run's wake-up.
    pub fn wakes(&self) -> Option<Uuid> {
        self.run_id
            .filter(|_| EventName::wakes_a_worker(&self.kind))
    }
}

/// How long a relay's claim on a batch lasts: longer than publishing a batch can take.
const RELAY_CLAIM: Duration = Duration::from_secs(30);

/// An `event_outbox` row as a statement returns it.
pub(crate) struct Row {
    pub(crate) id: Uuid,
    pub(crate) run_id: Option<Uuid>,
    pub(crate) kind: String,
    pub(crate) body: Value,
    pub(crate) created_at: DateTime<Utc>,
}

impl Row {
    /// The row a statement announced, from its columns read through an outer join: `None`
    /// when it announced nothing.
    pub(crate) fn announced(
        id: Option<Uuid>,
        run_id: Option<Uuid>,
        kind: Option<String>,
        body: Option<Value>,
        created_at: Option<DateTime<Utc>>,
    ) -> Option<Row> {
        Some(Row {
            id: id?,
            run_id,
            kind: kind?,
            body: body?,
            created_at: created_at?,
        })
    }
}

impl From<Row> for OutboxEvent {
    fn from(r: Row) -> Self {
        OutboxEvent {
            id: r.id,
            run_id: r.run_id,
            kind: r.kind,
            body: r.body,
            created_at: r.created_at,
        }
    }
}

impl Store {
    /// Appends `event` to the outbox in a transaction of its own (for an event that announces
    /// no transition, such as a refused run request) and wakes the relay.
    pub async fn announce(&self, run_id: Option<RunId>, event: &Event) -> Result<Uuid, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let row = append(&mut conn, run_id, event).await?;
        let id = row.id;
        self.hand_off(vec![row]);
        Ok(id)
    }

    /// Tells this process's relay that outbox rows were committed. A wake-up while the relay
    /// is busy is kept for its next wait, so none is lost.
    pub fn wake_relay(&self) {
        self.relay_kick.notify_one();
    }

    /// Hands rows this process has just committed to its relay, which publishes them without
    /// claiming them first, and wakes it. Past [`HANDOFF_LIMIT`] waiting rows (a process whose
    /// relay does not run) rows are not kept: they stay in the table for a sweep.
    pub(crate) fn hand_off(&self, rows: Vec<OutboxEvent>) {
        let span = tracing::Span::current();
        {
            let mut handoff = self.handoff.lock().unwrap_or_else(|p| p.into_inner());
            let room = HANDOFF_LIMIT.saturating_sub(handoff.fresh.len());
            handoff
                .fresh
                .extend(rows.into_iter().take(room).map(|row| HandedOff {
                    row,
                    span: span.clone(),
                }));
        }
        self.wake_relay();
    }

    /// The rows committed by this process since the last call, oldest first, for the relay to
    /// publish; it reports what the broker confirmed with [`Store::note_published`].
    pub fn take_handed_off(&self) -> Vec<HandedOff> {
        std::mem::take(&mut self.handoff.lock().unwrap_or_else(|p| p.into_inner()).fresh)
    }

    /// Notes outbox rows the broker confirmed: [`Store::flush_marks`] deletes them, and records
    /// the runs the wake-up events among them woke as dispatched (what [`Store::mark_dispatched`]
    /// does for one run, batched), so the reaper's lost-dispatch scan leaves those runs alone.
    pub fn note_published<'a>(&self, rows: impl IntoIterator<Item = &'a OutboxEvent>) {
        let mut handoff = self.handoff.lock().unwrap_or_else(|p| p.into_inner());
        for row in rows {
            handoff.published.push(row.id);
            if let Some(run_id) = row.wakes() {
                handoff.dispatched.push((run_id, row.created_at));
            }
        }
    }

    /// How many confirmed rows and dispatches wait for [`Store::flush_marks`].
    pub fn pending_marks(&self) -> usize {
        let handoff = self.handoff.lock().unwrap_or_else(|p| p.into_inner());
        handoff.published.len() + handoff.dispatched.len()
    }

    /// Records what was noted since the last flush, with at most two statements whatever the
    /// number: the confirmed rows deleted from the outbox, the dispatched runs that are still
    /// queued marked `dispatched_at = now()`. On an error the notes are kept for the next flush.
    ///
    /// A run is marked only while the segment its event woke is the one queued: the event's
    /// time is the transaction's that queued that segment (`available_at`), so a mark flushed
    /// late — after the run was claimed, suspended and released again — leaves the later
    /// segment undispatched until its own event is confirmed, and the reaper's lost-dispatch
    /// scan still covers it.
    /// A crash before the flush loses only notes: the rows are published again by a sweep
    /// (consumers deduplicate by `event_id`) and the runs woken again by the reaper.
    pub async fn flush_marks(&self) -> Result<(), StoreError> {
        let (published, dispatched) = {
            let mut handoff = self.handoff.lock().unwrap_or_else(|p| p.into_inner());
            (
                std::mem::take(&mut handoff.published),
                std::mem::take(&mut handoff.dispatched),
            )
        };
        if published.is_empty() && dispatched.is_empty() {
            return Ok(());
        }
        // Within the deadline: the relay's loop waits on it.
        let result = self
            .within(async {
                if !published.is_empty() {
                    self.delete_sent(&published).await?;
                }
                if !dispatched.is_empty() {
                    let (runs, woken_at): (Vec<Uuid>, Vec<DateTime<Utc>>) =
                        dispatched.iter().copied().unzip();
                    sqlx::query!(
                        "UPDATE runs SET dispatched_at = now()
                     FROM unnest($1::uuid[], $2::timestamptz[]) AS woken (id, at)
                     WHERE runs.id = woken.id AND runs.status = 'queued'
                       AND runs.available_at <= woken.at",
                        &runs,
                        &woken_at,
                    )
                    .execute(&self.pool)
                    .await?;
                }
                Ok::<(), StoreError>(())
            })
            .await;
        if result.is_err() {
            let mut handoff = self.handoff.lock().unwrap_or_else(|p| p.into_inner());
            handoff.published.extend(published);
            handoff.dispatched.extend(dispatched);
        }
        result
    }

    /// Resolves at the next [`Store::wake_relay`] (or at once if one is pending): what the relay
    /// waits on besides its polling interval.
    pub async fn relay_woken(&self) {
        self.relay_kick.notified().await;
    }

    /// One relay step: claims up to `limit` unpublished rows created at least `older_than`
    /// ago (by the database clock), oldest first, that no other relay has claimed, for
    /// thirty seconds; hands them to `publisher` one by one; deletes the confirmed ones. The
    /// first publish failure stops the batch: it and the rows after it are released for the
    /// next attempt.
    pub async fn relay_batch<P: EventPublisher>(
        &self,
        older_than: Duration,
        limit: i64,
        publisher: &P,
    ) -> Result<RelayReport<P::Error>, StoreError> {
        // One statement claims the batch (a lease on the rows, not locks held while the broker
        // is waited on), one deletes what was confirmed.
        let mut rows = self.claim_unpublished(older_than, limit).await?;
        rows.sort_by_key(|r| (r.created_at, r.id));
        let claimed = rows.len() as u64;
        let claimed_ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let mut sent = Vec::with_capacity(rows.len());
        let mut error = None;
        for row in rows {
            let event = OutboxEvent::from(row);
            match publisher.publish(&event).await {
                Ok(()) => sent.push(event.id),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        if !sent.is_empty() {
            self.within(self.delete_sent(&sent)).await?;
        }
        if sent.len() < claimed_ids.len() {
            // What was not sent is claimable again at once, not only once the claim runs out.
            let unsent: Vec<Uuid> = claimed_ids
                .into_iter()
                .filter(|id| !sent.contains(id))
                .collect();
            self.release_claims(&unsent).await?;
        }
        Ok(RelayReport {
            published: sent.len() as u64,
            claimed,
            error,
        })
    }

    /// Claims up to `limit` unpublished rows created at least `older_than` ago that no other
    /// relay holds, for [`RELAY_CLAIM`].
    async fn claim_unpublished(
        &self,
        older_than: Duration,
        limit: i64,
    ) -> Result<Vec<Row>, StoreError> {
        self.within(async {
            Ok(sqlx::query_as!(
                Row,
                r#"UPDATE event_outbox SET claimed_until = now() + $3 * interval '1 millisecond'
               WHERE id IN (
                   SELECT id FROM event_outbox
                   WHERE published_at IS NULL
                     AND (claimed_until IS NULL OR claimed_until < now())
                     AND created_at <= now() - $1 * interval '1 millisecond'
                   ORDER BY created_at, id LIMIT $2
                   FOR UPDATE SKIP LOCKED)
               RETURNING id, run_id, kind, body, created_at"#,
                millis(older_than) as f64,
                limit,
                millis(RELAY_CLAIM) as f64,
            )
            .fetch_all(&self.pool)
            .await?)
        })
        .await
    }

    /// Deletes the rows the broker confirmed: the outbox holds what is still to be sent.
    async fn delete_sent(&self, ids: &[Uuid]) -> Result<(), StoreError> {
        sqlx::query!("DELETE FROM event_outbox WHERE id = ANY($1)", ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Makes rows claimable again at once, rather than once their claim runs out.
    async fn release_claims(&self, ids: &[Uuid]) -> Result<(), StoreError> {
        self.within(async {
            sqlx::query!(
                "UPDATE event_outbox SET claimed_until = NULL WHERE id = ANY($1)",
                ids,
            )
            .execute(&self.pool)
            .await?;
            Ok(())
        })
        .await
    }

    /// Deletes up to `limit` outbox rows marked published more than `retention` ago; returns how
    /// many. A relay deletes what the broker confirmed; marked rows are those a relay of an
    /// earlier version kept after sending them (it set `published_at`). A row not yet published
    /// is never deleted. The outbox is a handoff, not the record: the audit trail (`run_events`)
    /// keeps what happened to every run.
    pub async fn prune_published_events(
        &self,
        retention: Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        // Row ids are UUIDv7: every row created before the bound sorts before it, so the
        // primary key finds the candidates without a scan of the whole table.
        let bound = v7_floor(std::time::SystemTime::now() - retention);
        let done = sqlx::query!(
            r#"DELETE FROM event_outbox
               WHERE id IN (
                   SELECT id FROM event_outbox
                   WHERE id < $1 AND published_at IS NOT NULL
                     AND published_at < now() - $2 * interval '1 millisecond'
                   ORDER BY id LIMIT $3
                   FOR UPDATE SKIP LOCKED)"#,
            bound,
            millis(retention) as f64,
            limit,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// The outbox rows about a run, oldest first: what it announced that has not gone out yet
    /// (a relay deletes what the broker confirmed).
    pub async fn outbox(&self, run_id: RunId) -> Result<Vec<OutboxEvent>, StoreError> {
        let rows = sqlx::query_as!(
            Row,
            r#"SELECT id, run_id, kind, body, created_at FROM event_outbox
               WHERE run_id = $1 AND published_at IS NULL ORDER BY created_at, id"#,
            run_id.as_uuid(),
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(OutboxEvent::from).collect())
    }
}

/// The smallest UUIDv7 of the millisecond `at`: every id created earlier sorts before it.
fn v7_floor(at: std::time::SystemTime) -> Uuid {
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70; // version 7
    bytes[8] = 0x80; // the RFC 4122 variant
    Uuid::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v7_floor_of_a_moment_sorts_after_every_id_made_before_it_and_before_those_made_after() {
        let earlier = Uuid::now_v7();
        std::thread::sleep(Duration::from_millis(2));
        let moment = std::time::SystemTime::now();
        std::thread::sleep(Duration::from_millis(2));
        let later = Uuid::now_v7();
        let floor = v7_floor(moment);
        assert!(earlier < floor, "{earlier} < {floor}");
        assert!(floor < later, "{floor} < {later}");
        assert_eq!(floor.get_version_num(), 7);
    }
}
