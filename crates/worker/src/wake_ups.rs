//! The wake-up consumer, and what the worker does when its broker or its database goes silent.
//!
//! Consuming again after a lost consumer means reconnecting to the broker, which may not answer
//! for as long as the network is cut: it happens in a task of its own, so the worker's loop goes
//! on meanwhile — polling for runs, joining segments, heeding a shutdown.
//!
//! A worker that cannot reach RabbitMQ or PostgreSQL is unready (`/readyz`), and stops claiming:
//! whatever it claimed now, it could not announce or write. A worker that lost RabbitMQ for
//! longer than [`Standing::give_up_after`] hands its running segments' runs back to the queue
//! (without spending their retry budget), so that the workers that can reach both finish them;
//! one that lost PostgreSQL cannot hand anything back, and its heartbeat declares its leases
//! lost before they expire instead. Once both answer again, it claims again: no restart.

use std::time::Duration;

use countersign_queue::{Broker, Consumer, Delivery, QueueError};
use countersign_store::Vitals;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long after a lost consumer (or a failed attempt to consume) the next attempt starts.
const CONSUME_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// The consumer of the segments queue, consuming again in the background when it is lost.
#[derive(Debug)]
pub(crate) struct WakeUps {
    broker: Broker,
    queue: String,
    prefetch: u16,
    /// How long the consumer may get nothing while its queue holds wake-ups ready.
    deaf_after: Duration,
    consumer: Option<Consumer>,
    subscribing: Option<JoinHandle<Result<Consumer, QueueError>>>,
    /// When the next attempt to consume may start.
    next_attempt: Instant,
}

impl WakeUps {
    pub(crate) fn new(broker: Broker, prefetch: u16, deaf_after: Duration) -> WakeUps {
        let queue = broker.topology().segments();
        WakeUps {
            broker,
            queue,
            prefetch,
            deaf_after,
            consumer: None,
            subscribing: None,
            next_attempt: Instant::now(),
        }
    }

    /// The next wake-up. Consumes (again) whenever there is no consumer; cancel-safe: what it
    /// waits on stays in `self` when the future is dropped.
    pub(crate) async fn next(&mut self) -> Delivery {
        loop {
            if let Some(consumer) = self.consumer.as_mut() {
                match consumer.next().await {
                    Some(Ok(delivery)) => return delivery,
                    Some(Err(e)) => {
                        tracing::warn!(code = e.code(), error = %e, "segment consumer failed");
                        self.lost();
                    }
                    None => self.lost(),
                }
                continue;
            }
            if let Some(subscribing) = self.subscribing.as_mut() {
                let subscribed = subscribing.await;
                self.subscribing = None;
                self.subscribed(subscribed);
                continue;
            }
            tokio::time::sleep_until(self.next_attempt).await;
            self.subscribe();
        }
    }

    /// Consumes again if there is no consumer and no attempt under way, without waiting for
    /// it: called on every turn of the worker's loop, so that the broker is reconnected while
    /// the worker takes no wake-up (it does not while the broker is lost).
    pub(crate) async fn tend(&mut self) {
        if let Some(finished) = self.subscribing.take_if(|s| s.is_finished()) {
            self.subscribed(finished.await);
        }
        if self.consumer.is_none()
            && self.subscribing.is_none()
            && Instant::now() >= self.next_attempt
        {
            self.subscribe();
        }
    }

    fn subscribe(&mut self) {
        let (broker, queue, prefetch) = (self.broker.clone(), self.queue.clone(), self.prefetch);
        self.subscribing = Some(tokio::spawn(async move {
            broker.consume(&queue, prefetch).await
        }));
    }

    fn subscribed(
        &mut self,
        subscribed: Result<Result<Consumer, QueueError>, tokio::task::JoinError>,
    ) {
        match subscribed {
            Ok(Ok(consumer)) => self.consumer = Some(consumer.watch_ready(self.deaf_after)),
            Ok(Err(e)) => {
                tracing::warn!(code = e.code(), error = %e, "cannot consume segments; polling only");
                self.next_attempt = Instant::now() + CONSUME_AGAIN_AFTER;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the task consuming segments stopped");
                self.next_attempt = Instant::now() + CONSUME_AGAIN_AFTER;
            }
        }
    }

    fn lost(&mut self) {
        self.consumer = None;
        self.next_attempt = Instant::now() + CONSUME_AGAIN_AFTER;
    }

    /// The consumer, for the shutdown to cancel; an attempt still under way is abandoned.
    pub(crate) fn take(mut self) -> Option<Consumer> {
        if let Some(subscribing) = self.subscribing.take() {
            subscribing.abort();
        }
        self.consumer.take()
    }
}

/// What the worker knows of its broker and its database, checked every second.
#[derive(Debug)]
pub(crate) struct Standing {
    broker: Broker,
    vitals: Vitals,
    /// Since when the broker connection has been down.
    broker_lost_since: Option<Instant>,
    /// How long the broker may be down before the running segments are handed back.
    pub(crate) give_up_after: Duration,
    /// Whether the running segments were told to hand their runs back.
    released: bool,
}

impl Standing {
    pub(crate) fn new(broker: Broker, vitals: Vitals, give_up_after: Duration) -> Standing {
        Standing {
            broker,
            vitals,
            broker_lost_since: None,
            give_up_after,
            released: false,
        }
    }

    /// Whether the worker may claim: its broker connection is open, its statements are not
    /// failing one after another, and its running segments are not handing their runs back.
    pub(crate) async fn may_claim(&self) -> bool {
        !self.released && self.broker.is_healthy().await && !self.vitals.failing()
    }

    /// Looks again: once the broker has been down for [`Standing::give_up_after`], tells the
    /// running segments to hand their runs back (`release`); once it is back and none of them
    /// runs any more, lets new segments run again.
    pub(crate) async fn check(&mut self, running: usize, release: &watch::Sender<bool>) {
        if self.broker.is_healthy().await {
            self.broker_lost_since = None;
            if self.released && running == 0 {
                self.released = false;
                let _ = release.send(false);
                tracing::info!("the broker answers again; claiming again");
            }
            return;
        }
        let since = *self.broker_lost_since.get_or_insert_with(Instant::now);
        if !self.released && since.elapsed() >= self.give_up_after {
            self.released = true;
            let _ = release.send(true);
            tracing::warn!(
                running,
                lost_for = ?since.elapsed(),
                "the broker does not answer; handing the running segments' runs back"
            );
        }
    }
}
