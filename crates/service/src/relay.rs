//! The outbox relay every process that writes events runs: it publishes the rows of
//! `event_outbox` on the events exchange, with confirms, and marks them sent.
//!
//! The store wakes it after each commit that wrote an outbox row ([`Store::wake_relay`]), so an
//! event leaves right after its transition; a poll every [`RelayConfig::poll_interval`] is the
//! fallback for a wake-up that could not help (the broker was down, another process wrote the
//! row). A failed publish leaves the row for the next round, and the reaper republishes what
//! stayed unsent for long. The row is the truth; the relay only carries it.

use std::future::Future;
use std::time::Duration;

use countersign_queue::{Broker, QueueError};
use countersign_store::{EventPublisher, OutboxEvent, RelayReport, Store, StoreError};

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

/// Publishes unpublished rows created at least `older_than` ago, batch after batch, until a
/// batch comes back short (at most `max_batches` of them, so a round ends under any load).
/// Returns how many were published; the first store or broker error ends the round, after
/// marking what was confirmed before it.
pub async fn relay_round(
    store: &Store,
    broker: &Broker,
    older_than: Duration,
    config: RelayConfig,
    max_batches: usize,
) -> Result<u64, RelayError> {
    let publisher = BrokerPublisher(broker);
    let mut published = 0;
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

/// Publishes once what is unpublished now, logging a failure instead of returning it: for a
/// command that just committed an event and should not wait for a service's next poll.
pub async fn relay_now(store: &Store, broker: &Broker) -> u64 {
    match relay_round(store, broker, Duration::ZERO, RelayConfig::default(), 10).await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(code = e.code(), error = %e, "events not published now; a relay or the reaper will");
            0
        }
    }
}

/// Runs the relay until `shutdown` resolves, then publishes what is left once more, so the
/// events of the last commits before a clean stop leave with the process.
pub async fn run(
    store: Store,
    broker: Broker,
    config: RelayConfig,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = relay_round(&store, &broker, Duration::ZERO, config, 10).await {
            tracing::warn!(code = e.code(), error = %e, "events not published; retrying at the next wake-up or poll");
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = store.relay_woken() => {}
            () = tokio::time::sleep(config.poll_interval) => {}
        }
    }
    if let Err(e) = relay_round(&store, &broker, Duration::ZERO, config, 10).await {
        tracing::warn!(code = e.code(), error = %e, "events left unpublished at shutdown; another relay or the reaper will publish them");
    }
}
