//! Deliveries with manual acknowledgement, settled only by the code that did the work.
//!
//! A [`Delivery`] must be settled exactly once, and only after the outcome of the work it
//! triggered is durable elsewhere (PostgreSQL): `ack` when done, `requeue` when the work
//! should be tried again (the quorum queue counts the attempt and dead-letters the
//! message once the delivery limit is reached), `dead_letter` when the message itself is
//! the problem. A delivery dropped without being settled is redelivered when its channel
//! closes, which is the safe default for a crash.

use std::time::SystemTime;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicNackOptions};
use lapin::types::{AMQPValue, LongString, ShortString};
use lapin::Acker;
use lapin::{BasicProperties, Channel};

use crate::broker::Broker;
use crate::error::QueueError;
use crate::trace_context;

/// Header naming why a message was dead-lettered by countersign.
pub const REASON_HEADER: &str = "x-countersign-reason";
/// Header naming the queue a dead-lettered message came from.
pub const SOURCE_QUEUE_HEADER: &str = "x-countersign-source-queue";
/// Header keeping the producer's `user_id`, which cannot be re-asserted on the copy.
pub const ORIGINAL_USER_HEADER: &str = "x-countersign-user-id";

/// A stream of deliveries from one queue, on a channel of its own.
#[derive(Debug)]
pub struct Consumer {
    channel: Channel,
    stream: lapin::Consumer,
    queue: String,
    /// The label its deliveries' queue wait is recorded under; none for a private queue.
    wait_label: Option<&'static str>,
    /// How long the broker may take to answer the cancel, a settle or a count (the publish
    /// timeout).
    answer_within: std::time::Duration,
    /// See [`watch_ready`](Self::watch_ready).
    ready_watch: Option<std::time::Duration>,
    /// Since when [`next`](Self::next) has been waited on without a delivery, across calls
    /// whose futures were dropped (a `select!` that another branch won).
    quiet_since: Option<tokio::time::Instant>,
    /// The watch found this consumer deaf: [`next`](Self::next) returns `None` from now on.
    ended: bool,
}

impl Consumer {
    pub(crate) fn new(
        channel: Channel,
        stream: lapin::Consumer,
        queue: String,
        answer_within: std::time::Duration,
    ) -> Self {
        Consumer {
            channel,
            stream,
            queue,
            wait_label: None,
            answer_within,
            ready_watch: None,
            quiet_since: None,
            ended: false,
        }
    }

    /// Ends the stream with `consume_failed` when it has delivered nothing for `idle` while its
    /// queue holds messages ready: the broker or the client lost this consumer without closing
    /// its channel (a node stopping while the consumer started, a leader moving), and it would
    /// otherwise wait forever while the queue fills. For a consumer whose caller only waits on
    /// it with prefetch to spare; the caller consumes again, as after any failure. The wait is
    /// counted from the first call of `next` after the last delivery, so a caller that drops
    /// the `next` future in a `select!` (another branch won) does not restart it.
    pub fn watch_ready(mut self, idle: std::time::Duration) -> Self {
        self.ready_watch = Some(idle);
        self
    }

    /// Records the queue wait of every delivery (`countersign_queue_wait_seconds{queue}`).
    pub(crate) fn with_wait_label(mut self, label: Option<&'static str>) -> Self {
        self.wait_label = label;
        self
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Stops the broker's deliveries to this consumer and hands back, requeued, those it had
    /// sent and nobody took yet; returns how many. A process that stops consuming and goes on
    /// (a worker draining its segments at shutdown) would otherwise keep up to its prefetch of
    /// messages from every other consumer until its channel closes.
    pub async fn cancel(self) -> Result<usize, QueueError> {
        let untaken = self.cancel_untaken().await?;
        let handed_back = untaken.len();
        for delivery in untaken {
            delivery.requeue().await?;
        }
        Ok(handed_back)
    }

    /// [`cancel`](Self::cancel), but the deliveries nobody took are returned unsettled, for
    /// the caller to hand back its own way. A cancel the broker does not answer within the
    /// publish timeout fails `consume_failed`; the deliveries then return when the connection
    /// closes.
    pub async fn cancel_untaken(mut self) -> Result<Vec<Delivery>, QueueError> {
        let tag = self.stream.tag().to_string();
        let cancel = self
            .channel
            .basic_cancel(tag.as_str().into(), BasicCancelOptions::default());
        within(
            self.answer_within,
            "the broker did not answer the cancel in time",
            cancel,
        )
        .await
        .map_err(QueueError::Consume)?;
        let mut untaken = Vec::new();
        let drain = std::time::Duration::from_millis(200);
        while let Ok(Some(Ok(delivery))) = tokio::time::timeout(drain, self.stream.next()).await {
            untaken.push(self.wrap(delivery));
        }
        Ok(untaken)
    }

    /// The next delivery; `None` once the channel or connection has closed (after an
    /// `Err` describing why, when there is one). The caller then consumes again.
    pub async fn next(&mut self) -> Option<Result<Delivery, QueueError>> {
        if self.ended {
            return None;
        }
        let next = match self.ready_watch {
            None => self.stream.next().await,
            Some(idle) => loop {
                let since = *self
                    .quiet_since
                    .get_or_insert_with(tokio::time::Instant::now);
                // `next` of a stream holds nothing when it is dropped: cancel-safe.
                if let Ok(next) = tokio::time::timeout_at(since + idle, self.stream.next()).await {
                    self.quiet_since = None;
                    break next;
                }
                match self.ready().await {
                    Ok(0) => {
                        self.quiet_since = Some(tokio::time::Instant::now());
                        continue;
                    }
                    Ok(ready) => {
                        tracing::warn!(queue = self.queue, ready, ?idle, "the consumer got nothing while its queue held messages ready; consuming again");
                        self.ended = true;
                        return Some(Err(QueueError::Consume(crate::broker::timed_out(
                            "nothing was delivered while the queue held messages ready",
                        ))));
                    }
                    Err(e) => {
                        self.ended = true;
                        return Some(Err(e));
                    }
                }
            },
        };
        let delivery = match next? {
            Ok(delivery) => delivery,
            Err(e) => return Some(Err(QueueError::Consume(e))),
        };
        if let Some(label) = self.wait_label {
            let properties = &delivery.properties;
            let timestamp = *properties.timestamp();
            let now = SystemTime::now();
            if let Some(wait) = trace_context::waited(properties.headers().as_ref(), timestamp, now)
            {
                metrics::histogram!("countersign_queue_wait_seconds", "queue" => label)
                    .record(wait.as_secs_f64());
            }
        }
        Some(Ok(self.wrap(delivery)))
    }

    /// How many messages the queue holds ready, asked on this consumer's channel, answered
    /// within the publish timeout.
    async fn ready(&self) -> Result<u32, QueueError> {
        let asking = crate::broker::ready_count(&self.channel, self.queue.as_str().into());
        within(
            self.answer_within,
            "the broker did not count the queue in time",
            asking,
        )
        .await
        .map_err(QueueError::Consume)
    }

    fn wrap(&self, delivery: lapin::message::Delivery) -> Delivery {
        let properties = delivery.properties;
        let text = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_owned());
        Delivery {
            body: delivery.data,
            user_id: text(properties.user_id()),
            reply_to: text(properties.reply_to()),
            correlation_id: text(properties.correlation_id()),
            message_id: text(properties.message_id()),
            redelivered: delivery.redelivered,
            acker: delivery.acker,
            properties,
            queue: self.queue.clone(),
            answer_within: self.answer_within,
            _channel: self.channel.clone(),
        }
    }
}

/// One message, to be settled exactly once with [`ack`](Self::ack),
/// [`requeue`](Self::requeue) or [`dead_letter`](Self::dead_letter).
#[derive(Debug)]
pub struct Delivery {
    pub body: Vec<u8>,
    /// The producer's AMQP user, validated by the broker against its connection.
    pub user_id: Option<String>,
    pub reply_to: Option<String>,
    pub correlation_id: Option<String>,
    /// The publisher's message id: for an event, its `event_id`.
    pub message_id: Option<String>,
    /// The broker delivered it before (to this or another consumer).
    pub redelivered: bool,
    acker: Acker,
    properties: BasicProperties,
    queue: String,
    /// How long the broker may take to take a settle (the publish timeout).
    answer_within: std::time::Duration,
    /// Keeps the channel open until the delivery is settled, even if the consumer is
    /// dropped first.
    _channel: Channel,
}

impl Delivery {
    /// The queue this delivery came from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The trace context its publisher sent (`traceparent`, `tracestate`): the parent of the
    /// consumer's span, so that the publisher's trace goes on. Empty when it sent none.
    pub fn trace_context(&self) -> opentelemetry::Context {
        trace_context::extract(self.properties.headers().as_ref())
    }

    /// A string-valued header, if present.
    pub fn header(&self, name: &str) -> Option<String> {
        header_text(self.properties.headers().as_ref()?.inner().get(name)?)
    }

    /// How many earlier deliveries of this message failed (`x-delivery-count`, set by
    /// quorum queues on redelivery); 0 on the first.
    pub fn delivery_count(&self) -> u64 {
        self.properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count"))
            .and_then(header_int)
            .unwrap_or(0)
    }

    /// Why the message is in the dead-letter queue: countersign's reason header, or the
    /// broker's (`delivery_limit`, `rejected`, …).
    pub fn dead_letter_reason(&self) -> Option<String> {
        self.header(REASON_HEADER)
            .or_else(|| self.header("x-first-death-reason"))
    }

    /// The queue a dead-lettered message came from.
    pub fn dead_letter_source(&self) -> Option<String> {
        self.header(SOURCE_QUEUE_HEADER)
            .or_else(|| self.header("x-first-death-queue"))
    }

    /// Done: the outcome is durable elsewhere.
    pub async fn ack(self) -> Result<(), QueueError> {
        let acking = self.acker.ack(BasicAckOptions::default());
        settled(within(self.answer_within, SETTLE_LATE, acking).await)
    }

    /// Try again later: nack with requeue. The quorum queue counts the attempt and
    /// dead-letters the message once the delivery limit is reached.
    pub async fn requeue(self) -> Result<(), QueueError> {
        requeue(&self.acker, self.answer_within).await
    }

    /// Poison: publishes a copy (body, properties, and the headers
    /// `x-countersign-reason` and `x-countersign-source-queue`) to the dead-letter
    /// exchange, waits for the confirm, and only then acks the original. If the copy
    /// fails the original is left unsettled and the error returned, so nothing is lost.
    pub async fn dead_letter(self, broker: &Broker, reason: &str) -> Result<(), QueueError> {
        let properties = dead_letter_properties(&self.properties, &self.queue, reason);
        let exchange = broker.topology().dead_letter_exchange();
        broker
            .publish_properties(&exchange, &self.queue, &self.body, properties)
            .await?;
        self.ack().await
    }
}

/// `step`, or a timeout error naming `what` when it is not answered within `limit`. A step the
/// client lost (a settle queued as its channel ended, a cancel or a count a stopping node took
/// with it) would otherwise hold the task that waits for it, and the consumer loop behind it,
/// forever; an unsettled message comes back when its channel closes, and its redelivery is
/// replayed.
async fn within<T>(
    limit: std::time::Duration,
    what: &'static str,
    step: impl std::future::Future<Output = Result<T, lapin::Error>>,
) -> Result<T, lapin::Error> {
    tokio::time::timeout(limit, step)
        .await
        .unwrap_or_else(|_| Err(crate::broker::timed_out(what)))
}

/// What a settle that is not sent in time fails with.
const SETTLE_LATE: &str = "the settle was not sent in time";

fn settled(result: Result<bool, lapin::Error>) -> Result<(), QueueError> {
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(QueueError::ChannelClosed),
        Err(e) => Err(QueueError::Settle(e)),
    }
}

/// The copy's properties: everything of the original except what would make the broker
/// refuse or drop it (`user_id` is re-asserted by whoever publishes, so it moves to a
/// header; an `expiration` would let the dead letter expire), made persistent.
fn dead_letter_properties(
    original: &BasicProperties,
    queue: &str,
    reason: &str,
) -> BasicProperties {
    let mut headers = original.headers().clone().unwrap_or_default();
    headers.insert(REASON_HEADER.into(), long(reason));
    headers.insert(SOURCE_QUEUE_HEADER.into(), long(queue));
    if let Some(user) = original.user_id() {
        headers.insert(ORIGINAL_USER_HEADER.into(), long(user.as_str()));
    }
    let mut copy = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(v) = original.content_type() {
        copy = copy.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        copy = copy.with_content_encoding(v.clone());
    }
    if let Some(v) = original.correlation_id() {
        copy = copy.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        copy = copy.with_reply_to(v.clone());
    }
    if let Some(v) = original.message_id() {
        copy = copy.with_message_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        copy = copy.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        copy = copy.with_type(v.clone());
    }
    if let Some(v) = original.app_id() {
        copy = copy.with_app_id(v.clone());
    }
    copy
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn header_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

fn header_int(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::ShortShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::ShortShortUInt(n) => Some(u64::from(n)),
        AMQPValue::ShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::ShortUInt(n) => Some(u64::from(n)),
        AMQPValue::LongInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(n)),
        AMQPValue::LongLongInt(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

/// Nack with requeue: the message goes back to its queue, for any consumer.
async fn requeue(acker: &Acker, limit: std::time::Duration) -> Result<(), QueueError> {
    let nacking = acker.nack(BasicNackOptions {
        multiple: false,
        requeue: true,
    });
    settled(within(limit, SETTLE_LATE, nacking).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldTable;

    #[test]
    fn a_dead_letter_copy_keeps_the_message_and_drops_what_the_broker_would_refuse() {
        let mut headers = FieldTable::default();
        headers.insert("trace".into(), long("t-1"));
        let original = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_user_id("producer".into())
            .with_reply_to("replies".into())
            .with_correlation_id("c-1".into())
            .with_expiration("1000".into())
            .with_headers(headers);
        let copy = dead_letter_properties(&original, "p.decisions", "invalid_field:run_id");
        let h = copy.headers().clone().unwrap();
        let text = |k: &str| header_text(h.inner().get(k).unwrap());
        assert_eq!(text(REASON_HEADER).as_deref(), Some("invalid_field:run_id"));
        assert_eq!(text(SOURCE_QUEUE_HEADER).as_deref(), Some("p.decisions"));
        assert_eq!(text(ORIGINAL_USER_HEADER).as_deref(), Some("producer"));
        assert_eq!(text("trace").as_deref(), Some("t-1"));
        assert_eq!(copy.user_id(), &None);
        assert_eq!(copy.expiration(), &None);
        assert_eq!(copy.delivery_mode(), &Some(2));
        assert_eq!(
            copy.reply_to().as_ref().map(|s| s.as_str()),
            Some("replies")
        );
        assert_eq!(
            copy.correlation_id().as_ref().map(|s| s.as_str()),
            Some("c-1")
        );
        assert_eq!(
            copy.content_type().as_ref().map(|s| s.as_str()),
            Some("application/json")
        );
    }

    #[test]
    fn delivery_counts_are_read_from_any_integer_type() {
        assert_eq!(header_int(&AMQPValue::LongLongInt(3)), Some(3));
        assert_eq!(header_int(&AMQPValue::ShortShortUInt(2)), Some(2));
        assert_eq!(header_int(&AMQPValue::LongInt(-1)), None);
        assert_eq!(header_int(&long("3")), None);
    }
}
