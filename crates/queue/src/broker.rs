//! One connection per process, one publishing channel in confirm mode, and the way back
//! when either is lost.
//!
//! Every publish is persistent and waits for the broker's confirm, because the caller
//! acts on "sent" (a coordinator marks a segment dispatched, a producer forgets its
//! request): a message the broker never took must surface as an error, never as success.
//! Publishes to a queue are `mandatory`, so a missing queue is an error too instead of a
//! silent drop; events are not, because an event nobody subscribed to is not a loss.
//!
//! The broker closes a channel when it refuses a message (a `user_id` that is not the
//! connection's user, for instance) and the connection when the network fails. Neither
//! is fatal here: the next operation notices the closed channel or connection, opens a
//! new channel or reconnects with exponential backoff (`backon`), and declares the
//! topology again on the new connection (what is missing, unless the process declares
//! nothing), so a broker that lost its definitions is repaired too. Consumers are not resurrected behind the caller's back: their stream
//! ends and the caller consumes again, which is where it decides what to do with work in
//! flight.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use countersign_core::{Event, RunId};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use crate::consumer::Consumer;
use crate::error::QueueError;
use crate::segment::segment_body;
use crate::topology::{self, short, QueueConfig, Topology};
use crate::trace_context;

/// `delivery_mode` 2: the broker writes the message to disk.
const PERSISTENT: u8 = 2;
const JSON: &str = "application/json";
const CONSUMER_TAG: &str = "countersign";

/// Optional AMQP properties a producer sets on a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageProperties {
    /// The AMQP user asserted by the producer; the broker refuses the message unless it
    /// is the connection's user.
    pub user_id: Option<String>,
    /// A queue the outcome is also published to.
    pub reply_to: Option<String>,
    /// Echoed on the reply.
    pub correlation_id: Option<String>,
}

/// The properties of every message this crate publishes.
pub(crate) fn base_properties() -> BasicProperties {
    BasicProperties::default()
        .with_content_type(JSON.into())
        .with_delivery_mode(PERSISTENT)
}

/// The properties of a producer's message: the base ones and what the producer set.
fn producer_properties(message: &MessageProperties) -> Result<BasicProperties, QueueError> {
    let mut properties = base_properties();
    if let Some(user) = &message.user_id {
        properties = properties.with_user_id(short(user)?);
    }
    if let Some(reply_to) = &message.reply_to {
        properties = properties.with_reply_to(short(reply_to)?);
    }
    if let Some(id) = &message.correlation_id {
        properties = properties.with_correlation_id(short(id)?);
    }
    Ok(properties)
}

/// Messages this process published and the broker confirmed, for the benchmark.
static PUBLISHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many messages this process has published and the broker has confirmed.
pub fn published_total() -> u64 {
    PUBLISHED.load(std::sync::atomic::Ordering::Relaxed)
}

/// A handle on the broker: cheap to clone, shared by every task of a process.
#[derive(Clone, Debug)]
pub struct Broker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: QueueConfig,
    /// The live link, read without waiting (`is_healthy` must not queue behind a
    /// reconnect).
    link: RwLock<Option<Link>>,
    /// Held while a link is being replaced, so concurrent callers reconnect once.
    replacing: tokio::sync::Mutex<()>,
    /// Which of the configured addresses the last connection went to: a new connection tries
    /// that one first and then the others in turn, so losing a node moves the process to the
    /// next node of the cluster instead of waiting for the lost one.
    node: std::sync::atomic::AtomicUsize,
}

#[derive(Clone, Debug)]
struct Link {
    connection: Arc<Connection>,
    publisher: Channel,
}

impl Link {
    fn usable(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }
}

impl Broker {
    /// Connects (retrying with backoff) and declares the topology as
    /// [`QueueConfig::declare`] says: by default what is missing, or nothing (only checked).
    /// Declaring is idempotent: any number of processes may connect with the same prefix.
    pub async fn connect(config: QueueConfig) -> Result<Broker, QueueError> {
        let broker = Broker {
            inner: Arc::new(Inner {
                config,
                link: RwLock::new(None),
                replacing: tokio::sync::Mutex::new(()),
                node: std::sync::atomic::AtomicUsize::new(0),
            }),
        };
        broker.link().await?;
        Ok(broker)
    }

    pub fn topology(&self) -> &Topology {
        &self.inner.config.topology
    }

    pub fn config(&self) -> &QueueConfig {
        &self.inner.config
    }

    /// The AMQP user of the current connection: the only `user_id` the broker accepts on
    /// a message published through this broker.
    pub fn user(&self) -> Option<String> {
        self.current()
            .map(|link| link.connection.status().username())
    }

    /// Whether the connection is open right now. Does not reconnect and never waits.
    pub async fn is_healthy(&self) -> bool {
        self.current()
            .is_some_and(|link| link.connection.status().connected())
    }

    /// Wakes a worker for `run_id` with a bare segment body: persistent, mandatory, confirmed.
    /// What the reaper sends for a run whose wake-up event went missing, and a stopping worker
    /// for a wake-up it hands back. Through the segments exchange, which reaches the segments
    /// queue only, so the publisher needs no write on `amq.default`, which reaches every queue.
    pub async fn publish_segment(&self, run_id: RunId) -> Result<(), QueueError> {
        let body = serde_json::to_vec(&segment_body(run_id))?;
        let exchange = self.topology().segments_exchange();
        self.publish(&exchange, "", &body, base_properties(), true)
            .await
    }

    /// Publishes an outcome to the events exchange with the event's name as routing key,
    /// stamped with `at`. Confirmed, persistent; not mandatory: an event nobody listens to is
    /// not an error. The services announce their events through the store's outbox and
    /// [`publish_event_body`](Self::publish_event_body) instead; this is for a body built here.
    pub async fn publish_event(&self, event: &Event, at: &str) -> Result<(), QueueError> {
        let body = serde_json::to_vec(&event.to_json(at))?;
        let exchange = self.topology().events_exchange();
        self.publish(
            &exchange,
            event.name.as_str(),
            &body,
            base_properties(),
            false,
        )
        .await
    }

    /// Publishes a pre-built event body (an outbox row's) to the events exchange under
    /// `routing_key` (the event name), with `event_id` as the AMQP `message_id` so a consumer
    /// can deduplicate without parsing. Confirmed, persistent, not mandatory, like
    /// [`publish_event`](Self::publish_event): `Ok` only once the broker has taken it.
    pub async fn publish_event_body(
        &self,
        routing_key: &str,
        event_id: &str,
        body: &serde_json::Value,
    ) -> Result<(), QueueError> {
        let bytes = serde_json::to_vec(body)?;
        let exchange = self.topology().events_exchange();
        let properties = base_properties().with_message_id(short(event_id)?);
        self.publish(&exchange, routing_key, &bytes, properties, false)
            .await
    }

    /// Answers a producer on its `reply_to` queue (default exchange), echoing its
    /// `correlation_id`. A reply queue that is gone is `unroutable`, which the caller may
    /// log and ignore: the outcome is on the events exchange as well.
    pub async fn publish_reply(
        &self,
        reply_to: &str,
        correlation_id: Option<&str>,
        body: &serde_json::Value,
    ) -> Result<(), QueueError> {
        let body = serde_json::to_vec(body)?;
        let mut properties = base_properties();
        if let Some(id) = correlation_id {
            properties = properties.with_correlation_id(short(id)?);
        }
        self.publish("", reply_to, &body, properties, true).await
    }

    /// What a producer does: a JSON body to a queue, persistent, mandatory, confirmed,
    /// optionally asserting an AMQP `user_id`.
    pub async fn publish_to_queue(
        &self,
        queue: &str,
        body: &[u8],
        user_id: Option<&str>,
    ) -> Result<(), QueueError> {
        let properties = MessageProperties {
            user_id: user_id.map(str::to_owned),
            ..MessageProperties::default()
        };
        self.publish_message(queue, body, &properties).await
    }

    /// [`publish_to_queue`](Self::publish_to_queue) with `reply_to` and `correlation_id`
    /// as well.
    pub async fn publish_message(
        &self,
        queue: &str,
        body: &[u8],
        message: &MessageProperties,
    ) -> Result<(), QueueError> {
        let properties = producer_properties(message)?;
        self.publish("", queue, body, properties, true).await
    }

    /// Publishes to a public queue (`queue` is [`Topology::run_requests`] or
    /// [`Topology::decisions`]) through the fanout exchange of the same name, rather than
    /// through the default exchange as [`publish_message`](Self::publish_message) does.
    /// RabbitMQ checks a publish against the exchange it names, and write permission on the
    /// default exchange (`amq.default`) reaches every queue of the vhost: this is the way in
    /// for a producer whose user may write to the two public queues and nothing else.
    /// Persistent, mandatory, confirmed.
    pub async fn publish_public(
        &self,
        queue: &str,
        body: &[u8],
        message: &MessageProperties,
    ) -> Result<(), QueueError> {
        let properties = producer_properties(message)?;
        self.publish(queue, "", body, properties, true).await
    }

    /// Consumes `queue` on a channel of its own with manual acks and at most `prefetch`
    /// unacknowledged deliveries (at least 1: 0 would mean unlimited). The consumer ends
    /// when its channel or the connection closes; consume again to go on.
    ///
    /// Opening the channel, setting its prefetch and starting the consumer are each a round
    /// trip to the broker; all three must be answered within the publish timeout, or the link
    /// is abandoned (as for a publish) and `consume_failed` returned. A consumer whose start a
    /// node going away left unanswered would otherwise wait forever, and the loop that consumes
    /// again with it.
    pub async fn consume(&self, queue: &str, prefetch: u16) -> Result<Consumer, QueueError> {
        let queue_name = short(queue)?;
        let link = self.link().await?;
        let opening = async {
            let channel = link.connection.create_channel().await?;
            channel
                .basic_qos(prefetch.max(1), BasicQosOptions::default())
                .await?;
            let stream = channel
                .basic_consume(
                    queue_name,
                    CONSUMER_TAG.into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok((channel, stream))
        };
        let (channel, stream) = self
            .answered(&link, "consume", opening)
            .await
            .ok_or_else(|| {
                QueueError::Consume(timed_out("the broker did not start the consumer in time"))
            })?
            .map_err(QueueError::Consume)?;
        Ok(Consumer::new(
            channel,
            stream,
            queue.to_owned(),
            self.inner.config.publish_timeout,
        )
        .with_wait_label(self.topology().queue_label(queue)))
    }

    /// How many messages `queue` holds ready for delivery, by a passive declare (which needs
    /// no configure permission), on a short-lived channel of its own; answered within the
    /// publish timeout, or the link is abandoned, as for a consume.
    pub async fn message_count(&self, queue: &str) -> Result<u32, QueueError> {
        let queue_name = short(queue)?;
        let link = self.link().await?;
        let asking = async {
            let channel = link.connection.create_channel().await?;
            let ready = ready_count(&channel, queue_name).await?;
            let _ = channel.close(200, "done".into()).await;
            Ok(ready)
        };
        self.answered(&link, "message count", asking)
            .await
            .ok_or_else(|| {
                QueueError::Topology(timed_out("the broker did not count the queue in time"))
            })?
            .map_err(QueueError::Topology)
    }

    /// Declares a server-named, exclusive, auto-delete queue on this connection, for
    /// replies or for watching events; it disappears with the connection.
    pub async fn declare_private_queue(&self) -> Result<String, QueueError> {
        let channel = self.admin_channel().await?;
        let queue = channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(QueueError::Topology)?;
        Ok(queue.name().as_str().to_owned())
    }

    /// Binds `queue` to the events exchange with a topic pattern such as `run.*`.
    pub async fn bind_events(&self, queue: &str, pattern: &str) -> Result<(), QueueError> {
        let channel = self.admin_channel().await?;
        channel
            .queue_bind(
                short(queue)?,
                short(&self.topology().events_exchange())?,
                short(pattern)?,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(QueueError::Topology)
    }

    /// Deletes every queue (with its messages) and exchange of the topology. For tests,
    /// which each use their own prefix.
    pub async fn delete_topology(&self) -> Result<(), QueueError> {
        let channel = self.admin_channel().await?;
        topology::delete(&channel, self.topology()).await
    }

    /// A mandatory, confirmed publish with the given properties (the dead-letter copy).
    pub(crate) async fn publish_properties(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), QueueError> {
        self.publish(exchange, routing_key, body, properties, true)
            .await
    }

    /// Publishes and waits for the confirm. A publish that could not even be handed to
    /// the channel (it was already closed) is retried once on a fresh link: the broker
    /// never saw it, so this cannot duplicate it.
    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<(), QueueError> {
        let exchange_name = short(exchange)?;
        let key = short(routing_key)?;
        let options = BasicPublishOptions {
            mandatory,
            ..BasicPublishOptions::default()
        };
        // The current span's trace context and the publish time travel in the headers.
        let mut headers = properties.headers().clone().unwrap_or_default();
        trace_context::stamp(&mut headers);
        let properties = properties.with_headers(headers);
        let mut retried = false;
        let (link, confirm) = loop {
            let link = self.link().await?;
            let sent = link.publisher.basic_publish(
                exchange_name.clone(),
                key.clone(),
                options,
                body,
                properties.clone(),
            );
            match self.within_publish_timeout(&link, sent).await? {
                Ok(confirm) => break (link, confirm),
                Err(e) if !retried && never_sent(&e) => {
                    tracing::debug!(error = %e, "publishing channel closed; retrying on a new one");
                    retried = true;
                }
                Err(e) => return Err(QueueError::publish(e)),
            }
        };
        let confirmed = self.within_publish_timeout(&link, confirm).await?;
        match confirmed.map_err(QueueError::publish)? {
            Confirmation::Ack(None) => {
                PUBLISHED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Confirmation::Ack(Some(_returned)) => Err(QueueError::Unroutable {
                exchange: exchange.to_owned(),
                routing_key: routing_key.to_owned(),
            }),
            // NotRequested cannot happen on a channel in confirm mode; an unconfirmed
            // message is treated as not taken.
            Confirmation::Nack(_) | Confirmation::NotRequested => Err(QueueError::PublishNacked),
        }
    }

    /// `step` of a publish on `link`, or `publish_timeout` when the broker does not answer
    /// within the configured time (see [`answered`](Self::answered)).
    async fn within_publish_timeout<T>(
        &self,
        link: &Link,
        step: impl std::future::Future<Output = T>,
    ) -> Result<T, QueueError> {
        self.answered(link, "publish", step)
            .await
            .ok_or(QueueError::PublishTimeout)
    }

    /// `step`, a round trip to the broker on `link` (`what` names it in the log), or `None`
    /// when the broker does not answer it within the publish timeout; the link is then dropped
    /// and its connection closed, so that the next operation reconnects and the consumers on
    /// it end and consume again.
    async fn answered<T>(
        &self,
        link: &Link,
        what: &'static str,
        step: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let timeout = self.inner.config.publish_timeout;
        match tokio::time::timeout(timeout, step).await {
            Ok(answered) => Some(answered),
            Err(_) => {
                tracing::warn!(
                    ?timeout,
                    what,
                    "the broker did not answer in time; reconnecting"
                );
                self.abandon(link);
                None
            }
        }
    }

    /// Drops `link` if it is still the current one, and closes its connection in the
    /// background (a connection that stopped answering may not answer the close either).
    fn abandon(&self, link: &Link) {
        {
            let mut current = self
                .inner
                .link
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if current
                .as_ref()
                .is_some_and(|c| Arc::ptr_eq(&c.connection, &link.connection))
            {
                *current = None;
            }
        }
        let connection = link.connection.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                connection.close(320, "the broker did not answer in time".into()),
            )
            .await;
        });
    }

    fn current(&self) -> Option<Link> {
        self.inner
            .link
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The live link, replacing what was lost: a new publishing channel when only the
    /// channel closed, a new connection (with the topology re-declared) otherwise.
    async fn link(&self) -> Result<Link, QueueError> {
        if let Some(link) = self.current().filter(Link::usable) {
            return Ok(link);
        }
        let _replacing = self.inner.replacing.lock().await;
        let current = self.current();
        if let Some(link) = current.clone().filter(Link::usable) {
            return Ok(link);
        }
        let reopened = match current {
            Some(old) if old.connection.status().connected() => {
                match open_publisher(&old.connection).await {
                    Ok(publisher) => {
                        tracing::info!("publishing channel reopened");
                        Some(Link {
                            connection: old.connection,
                            publisher,
                        })
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reopening the publishing channel failed; reconnecting");
                        None
                    }
                }
            }
            _ => None,
        };
        let link = match reopened {
            Some(link) => link,
            None => self.establish().await?,
        };
        *self
            .inner
            .link
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(link.clone());
        Ok(link)
    }

    async fn establish(&self) -> Result<Link, QueueError> {
        let config = &self.inner.config;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(5))
            .with_max_times(config.reconnect_attempts)
            .with_jitter();
        let link = (|| self.connect_any())
            .retry(backoff)
            .when(|e| matches!(e, QueueError::BrokerUnavailable(_)))
            .notify(|e, wait| {
                tracing::warn!(error = %e, cause = ?std::error::Error::source(e), ?wait, "broker unreachable; retrying");
            })
            .await?;
        tracing::info!(prefix = %config.topology.prefix, node = self.inner.node.load(std::sync::atomic::Ordering::Relaxed), "connected to the broker; topology declared");
        Ok(link)
    }

    /// One connection attempt to each configured node in turn, from the one the last
    /// connection went to; the first that connects is remembered. The last node's error when
    /// none does.
    async fn connect_any(&self) -> Result<Link, QueueError> {
        use std::sync::atomic::Ordering;
        let config = &self.inner.config;
        let addrs = config.addrs();
        let first = self.inner.node.load(Ordering::Relaxed);
        let mut last = QueueError::BrokerUnavailable(lapin::Error::from(
            lapin::ErrorKind::InvalidConnectionState(lapin::ConnectionState::Closed),
        ));
        for step in 0..addrs.len().max(1) {
            let node = (first + step) % addrs.len().max(1);
            let addr = addrs.get(node).copied().unwrap_or(config.addr.as_str());
            match connect_once(config, addr).await {
                Ok(link) => {
                    self.inner.node.store(node, Ordering::Relaxed);
                    return Ok(link);
                }
                Err(e @ QueueError::BrokerUnavailable(_)) => {
                    tracing::warn!(node, nodes = addrs.len(), error = %e, cause = ?std::error::Error::source(&e), "broker node unreachable; trying the next");
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// A short-lived channel for declarations, so a refused declaration closes it and not
    /// the publishing channel.
    async fn admin_channel(&self) -> Result<Channel, QueueError> {
        let link = self.link().await?;
        link.connection
            .create_channel()
            .await
            .map_err(QueueError::Topology)
    }
}

/// One connection to `addr` with the topology declared or checked and the publishing channel
/// open, within the publish timeout: a node that accepts the connection and then answers
/// nothing is unavailable, and the next node is tried.
async fn connect_once(config: &QueueConfig, addr: &str) -> Result<Link, QueueError> {
    let properties = ConnectionProperties::default().with_connection_name(LongString::from(
        format!("countersign ({})", config.topology.prefix),
    ));
    let addr = config.with_heartbeat(addr);
    let connecting = async {
        let connection = Connection::connect(&addr, properties)
            .await
            .map_err(QueueError::BrokerUnavailable)?;
        topology::declare(&connection, config).await?;
        let publisher = open_publisher(&connection)
            .await
            .map_err(QueueError::BrokerUnavailable)?;
        Ok(Link {
            connection: Arc::new(connection),
            publisher,
        })
    };
    match tokio::time::timeout(config.publish_timeout, connecting).await {
        Ok(linked) => linked,
        Err(_) => Err(QueueError::BrokerUnavailable(timed_out(
            "the broker node did not answer in time",
        ))),
    }
}

/// The error of a round trip the broker did not answer in time.
/// How many messages `queue` holds ready for delivery, asked on `channel` by a passive declare
/// (which needs no configure permission).
pub(crate) async fn ready_count(
    channel: &Channel,
    queue: ShortString,
) -> Result<u32, lapin::Error> {
    let answer = channel
        .queue_declare(
            queue,
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(answer.message_count())
}

pub(crate) fn timed_out(what: &'static str) -> lapin::Error {
    lapin::Error::from(lapin::ErrorKind::IOError(Arc::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        what,
    ))))
}

async fn open_publisher(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

/// The publish failed before anything was written to the socket.
fn never_sent(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::InvalidChannelState(..) | lapin::ErrorKind::InvalidConnectionState(_)
    )
}
