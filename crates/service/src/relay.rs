//! The outbox relay every process that writes events runs: it publishes the rows of
//! `event_outbox` on the events exchange, with confirms, and deletes the confirmed ones.
//!
//! A transition that wrote outbox rows hands them to this process's relay and wakes it
//! ([`Store::take_handed_off`]), so an event leaves right after its transition, its confirm in
//! flight with those of the other rows handed off meanwhile, with no statement to claim it;
//! many confirmed rows are deleted by one statement ([`MARK_LINGER`]). A sweep
//! every [`RelayConfig::poll_interval`] claims what stayed unpublished for [`SWEEP_AFTER`]
//! (the broker was down, the process that wrote the row died), and the reaper republishes
//! what stayed unsent for long. The row is the truth; the relay only carries it, at least
//! once: consumers deduplicate by `event_id`.
//!
//! The events that hand a run to the workers (`run.accepted`, `decision.accepted`) are that
//! run's wake-ups as well: the segments queue is bound to them. The relay publishes a handed-off
//! row inside the span that committed it, so the worker's span continues that trace, and once
//! such an event is confirmed the run is recorded as dispatched with the row's delete. A swept
//! row does not record it: should the run still be queued after the reaper's dispatch grace,
//! the reaper wakes it once more, which a claim makes harmless.

use std::future::Future;
use std::time::Duration;

use countersign_queue::{Broker, QueueError};
use countersign_store::{EventPublisher, OutboxEvent, RelayReport, Store, StoreError};
use tracing::Instrument;

/// How a relay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayConfig {
    /// How often it looks for unpublished rows without a wake-up.
    pub poll_interval: Duration,
    /// Rows claimed per transaction.
    pub batch: i64,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            poll_interval: Duration::from_secs(2),
            batch: 100,
        }
    }
}

/// Publishes outbox rows on the broker's events exchange: the body as stored, the event name
/// as routing key, the event id as message id, waiting for the confirm.
#[derive(Debug, Clone, Copy)]
pub struct BrokerPublisher<'a>(pub &'a Broker);

impl EventPublisher for BrokerPublisher<'_> {
    type Error = QueueError;

    async fn publish(&self, event: &OutboxEvent) -> Result<(), QueueError> {
        self.0
            .publish_event_body(&event.kind, &event.id.to_string(), &event.body)
            .await
    }
}

/// Why a relay round stopped early. Only [`RelayError::code`] may leave the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("broker: {0}")]
    Queue(#[from] QueueError),
}

impl RelayError {
    pub fn code(&self) -> &'static str {
        match self {
            RelayError::Store(e) => e.code(),
            RelayError::Queue(e) => e.code(),
        }
    }
}

/// How long confirmed rows may wait to be marked, so that one statement marks many.
pub const MARK_LINGER: Duration = Duration::from_millis(100);

/// How old an unpublished row must be before a sweep claims it: a row younger than this is
/// still being published by the relay of the process that committed it.
pub const SWEEP_AFTER: Duration = Duration::from_secs(5);

/// Publishes the rows this process committed and handed to its relay, all at once with their
/// confirms in flight together, and notes the confirmed ones for [`Store::flush_marks`]. A row
/// whose publish failed is left to a sweep. Returns how many were confirmed.
pub async fn publish_handed_off(store: &Store, broker: &Broker) -> Result<u64, RelayError> {
    let handed = store.take_handed_off();
    if handed.is_empty() {
        return Ok(0);
    }
    let publisher = BrokerPublisher(broker);
    // Each inside the span that committed it: the message carries that trace on.
    let outcomes = futures_util::future::join_all(
        handed
            .iter()
            .map(|h| publisher.publish(&h.row).instrument(h.span.clone())),
    )
    .await;
    let mut first_error = None;
    let mut confirmed = Vec::with_capacity(handed.len());
    for (h, outcome) in handed.iter().zip(outcomes) {
        match outcome {
            Ok(()) => confirmed.push(&h.row),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let n = confirmed.len() as u64;
    store.note_published(confirmed);
    match first_error {
        Some(e) => Err(e.into()),
        None => Ok(n),
    }
}

/// Publishes what this process handed off, marks everything noted, then publishes unpublished
/// rows created at least `older_than` ago, claiming them batch after batch, until a batch
/// comes back short (at most `max_batches` of them, so a round ends under any load). Returns
/// how many were published; the first store or broker error ends the round, after marking
/// what was confirmed before it.
pub async fn relay_round(
    store: &Store,
    broker: &Broker,
    older_than: Duration,
    config: RelayConfig,
    max_batches: usize,
) -> Result<u64, RelayError> {
    let handed_off = publish_handed_off(store, broker).await;
    store.flush_marks().await?;
    Ok(handed_off? + sweep(store, broker, older_than, config, max_batches).await?)
}

/// Claims and publishes unpublished rows created at least `older_than` ago, batch after
/// batch, until a batch comes back short or `max_batches` were sent; what a process relay
/// failed to publish, or a process that died left behind. Returns how many were published.
pub async fn sweep(
    store: &Store,
    broker: &Broker,
    older_than: Duration,
    config: RelayConfig,
    max_batches: usize,
) -> Result<u64, RelayError> {
    let mut published = 0;
    let publisher = BrokerPublisher(broker);
    for _ in 0..max_batches.max(1) {
        let RelayReport {
            published: n,
            claimed,
            error,
        } = store
            .relay_batch(older_than, config.batch, &publisher)
            .await?;
        published += n;
        if let Some(e) = error {
            return Err(e.into());
        }
        if claimed < u64::try_from(config.batch).unwrap_or(0) {
            break;
        }
    }
    Ok(published)
}

/// Publishes what this process committed and marks it, logging a failure instead of
/// returning it: for a command that just committed an event and should not wait for a
/// service's next poll. What fails is left to the services' sweeps and the reaper.
pub async fn relay_now(store: &Store, broker: &Broker) -> u64 {
    let published = publish_handed_off(store, broker).await;
    let marked = store.flush_marks().await;
    match (published, marked) {
        (Ok(n), Ok(())) => n,
        (Err(e), _) => {
            tracing::warn!(code = e.code(), error = %e, "events not published now; a relay or the reaper will");
            0
        }
        (Ok(_), Err(e)) => {
            tracing::warn!(code = e.code(), error = %e, "published events not recorded as sent; a sweep sends them again");
            0
        }
    }
}

/// Runs the relay until `shutdown` resolves, then publishes what is left once more, so the
/// events of the last commits before a clean stop leave with the process.
///
/// Each wake-up publishes the rows handed off since the last one; their marks are written
/// once [`MARK_LINGER`] has passed since the last flush or a batch is full, so under load one
/// statement marks many rows. Every poll interval a sweep claims what is unpublished and
/// older than [`SWEEP_AFTER`].
pub async fn run(
    store: Store,
    broker: Broker,
    config: RelayConfig,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let batch = usize::try_from(config.batch).unwrap_or(100);
    let mut last_flush = tokio::time::Instant::now();
    // The first sweep runs at once: rows a previous process left behind.
    let mut next_sweep = tokio::time::Instant::now();
    loop {
        if let Err(e) = publish_handed_off(&store, &broker).await {
            tracing::warn!(code = e.code(), error = %e, "events not published; a sweep retries them");
        }
        let pending = store.pending_marks();
        if pending > 0 && (pending >= batch || last_flush.elapsed() >= MARK_LINGER) {
            if let Err(e) = store.flush_marks().await {
                tracing::warn!(code = e.code(), error = %e, "published events not recorded as sent; retrying");
            }
            last_flush = tokio::time::Instant::now();
        }
        if tokio::time::Instant::now() >= next_sweep {
            if let Err(e) = relay_round(&store, &broker, SWEEP_AFTER, config, 10).await {
                tracing::warn!(code = e.code(), error = %e, "events not published; retrying at the next poll");
            }
            next_sweep = tokio::time::Instant::now() + config.poll_interval;
        }
        let wake_at = if store.pending_marks() > 0 {
            next_sweep.min(last_flush + MARK_LINGER)
        } else {
            next_sweep
        };
        tokio::select! {
            () = &mut shutdown => break,
            () = store.relay_woken() => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
    if let Err(e) = relay_round(&store, &broker, SWEEP_AFTER, config, 10).await {
        tracing::warn!(code = e.code(), error = %e, "events left unpublished at shutdown; another relay or the reaper will publish them");
    }
}
