//! The names and shape of every queue and exchange, declared from one prefix.
//!
//! Declaring is idempotent, so every process declares the whole topology on every
//! (re)connect instead of trusting that someone else did: a broker that lost its
//! definitions, or a fresh vhost, is repaired by the first process that connects.
//!
//! The inbound queues are quorum queues because they hold work that must survive a node
//! loss, and because only quorum queues count deliveries: a message that keeps failing
//! (a consumer crashing on it, or requeueing it) is dead-lettered by the broker after
//! `delivery_limit` attempts instead of looping forever. Dead-lettering is
//! `at-least-once` (which RabbitMQ only offers with `x-overflow: reject-publish`), so a
//! poison message is not lost on its way to the dead-letter queue either.

use std::fmt;

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};

use crate::error::QueueError;

/// The prefix used in production.
pub const DEFAULT_PREFIX: &str = "countersign";
/// How many deliveries a quorum queue attempts before it dead-letters a message.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 5;
/// How many times a lost connection is retried before an operation gives up.
pub const DEFAULT_RECONNECT_ATTEMPTS: usize = 8;

/// Names of every queue and exchange, from one prefix (`countersign` in production;
/// tests use a unique prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub prefix: String,
}

impl Topology {
    pub fn new(prefix: impl Into<String>) -> Self {
        Topology {
            prefix: prefix.into(),
        }
    }

    /// Public: run requests from any producer.
    pub fn run_requests(&self) -> String {
        format!("{}.run-requests", self.prefix)
    }

    /// Public: approval decisions from any producer.
    pub fn decisions(&self) -> String {
        format!("{}.decisions", self.prefix)
    }

    /// Internal: segment wake-ups for the workers.
    pub fn segments(&self) -> String {
        format!("{}.segments", self.prefix)
    }

    /// Poison messages, each with the reason it was dead-lettered.
    pub fn dead_letters(&self) -> String {
        format!("{}.dead-letters", self.prefix)
    }

    /// The topic exchange for outcomes; the routing key is the event name.
    pub fn events_exchange(&self) -> String {
        format!("{}.events", self.prefix)
    }

    /// The fanout exchange in front of the dead-letter queue.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.prefix)
    }

    /// The three work queues, which share the dead-letter exchange and delivery limit.
    pub fn work_queues(&self) -> [String; 3] {
        [self.run_requests(), self.decisions(), self.segments()]
    }
}

impl Default for Topology {
    fn default() -> Self {
        Topology::new(DEFAULT_PREFIX)
    }
}

/// Where the broker is and how the topology is declared.
#[derive(Clone)]
pub struct QueueConfig {
    /// `amqp://user:password@host:port/vhost`. Never logged: it may carry a password.
    pub addr: String,
    pub topology: Topology,
    /// Deliveries a work queue attempts before dead-lettering a message (default 5).
    pub delivery_limit: u32,
    /// Tests only: declare the exchanges auto-delete, so they disappear with the last
    /// binding. Quorum queues cannot be auto-delete; a test removes them with
    /// [`Broker::delete_topology`](crate::Broker::delete_topology), which is why every
    /// test uses its own prefix.
    pub auto_delete: bool,
    /// Connection attempts, with exponential backoff from 100 ms to 5 s, before an
    /// operation gives up with `broker_unavailable` (default 8, about 16 s).
    pub reconnect_attempts: usize,
}

impl QueueConfig {
    /// A production configuration: durable everything, the default delivery limit.
    pub fn new(addr: impl Into<String>, topology: Topology) -> Self {
        QueueConfig {
            addr: addr.into(),
            topology,
            delivery_limit: DEFAULT_DELIVERY_LIMIT,
            auto_delete: false,
            reconnect_attempts: DEFAULT_RECONNECT_ATTEMPTS,
        }
    }
}

impl fmt::Debug for QueueConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueConfig")
            .field("addr", &redact(&self.addr))
            .field("topology", &self.topology)
            .field("delivery_limit", &self.delivery_limit)
            .field("auto_delete", &self.auto_delete)
            .field("reconnect_attempts", &self.reconnect_attempts)
            .finish()
    }
}

/// The address with any password replaced, for logs.
pub fn redact(addr: &str) -> String {
    let Some((scheme, rest)) = addr.split_once("://") else {
        return addr.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => addr.to_owned(),
    }
}

pub(crate) fn short(s: &str) -> Result<ShortString, QueueError> {
    ShortString::try_new(s).map_err(|_| QueueError::NameTooLong)
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn quorum_arguments(config: &QueueConfig, dead_letter_exchange: Option<&str>) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), long("quorum"));
    if let Some(dlx) = dead_letter_exchange {
        args.insert("x-dead-letter-exchange".into(), long(dlx));
        args.insert("x-dead-letter-strategy".into(), long("at-least-once"));
        args.insert("x-overflow".into(), long("reject-publish"));
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(i64::from(config.delivery_limit)),
        );
    }
    args
}

fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// Declares every exchange, queue and binding. Idempotent; fails if an existing entity
/// was declared with other arguments.
pub(crate) async fn declare(channel: &Channel, config: &QueueConfig) -> Result<(), QueueError> {
    let t = &config.topology;
    let exchange = ExchangeDeclareOptions {
        durable: true,
        auto_delete: config.auto_delete,
        ..ExchangeDeclareOptions::default()
    };
    let dlx = t.dead_letter_exchange();
    channel
        .exchange_declare(
            short(&dlx)?,
            ExchangeKind::Fanout,
            exchange,
            FieldTable::default(),
        )
        .await
        .map_err(QueueError::Topology)?;
    channel
        .exchange_declare(
            short(&t.events_exchange())?,
            ExchangeKind::Topic,
            exchange,
            FieldTable::default(),
        )
        .await
        .map_err(QueueError::Topology)?;
    let dead_letters = t.dead_letters();
    channel
        .queue_declare(
            short(&dead_letters)?,
            durable_queue(),
            quorum_arguments(config, None),
        )
        .await
        .map_err(QueueError::Topology)?;
    channel
        .queue_bind(
            short(&dead_letters)?,
            short(&dlx)?,
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(QueueError::Topology)?;
    for queue in t.work_queues() {
        channel
            .queue_declare(
                short(&queue)?,
                durable_queue(),
                quorum_arguments(config, Some(&dlx)),
            )
            .await
            .map_err(QueueError::Topology)?;
    }
    Ok(())
}

/// Deletes every queue and exchange of the topology, with their messages. Deleting what
/// does not exist succeeds.
pub(crate) async fn delete(channel: &Channel, topology: &Topology) -> Result<(), QueueError> {
    for queue in topology
        .work_queues()
        .into_iter()
        .chain([topology.dead_letters()])
    {
        channel
            .queue_delete(short(&queue)?, QueueDeleteOptions::default())
            .await
            .map_err(QueueError::Topology)?;
    }
    for exchange in [topology.events_exchange(), topology.dead_letter_exchange()] {
        channel
            .exchange_delete(short(&exchange)?, ExchangeDeleteOptions::default())
            .await
            .map_err(QueueError::Topology)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_derives_from_the_prefix() {
        let t = Topology::new("p");
        assert_eq!(t.run_requests(), "p.run-requests");
        assert_eq!(t.decisions(), "p.decisions");
        assert_eq!(t.segments(), "p.segments");
        assert_eq!(t.dead_letters(), "p.dead-letters");
        assert_eq!(t.events_exchange(), "p.events");
        assert_eq!(t.dead_letter_exchange(), "p.dlx");
        assert_eq!(Topology::default().segments(), "countersign.segments");
    }

    #[test]
    fn the_debug_form_of_a_config_hides_the_password() {
        let c = QueueConfig::new(
            "amqp://guest:s3cret@127.0.0.1:5672/%2f",
            Topology::default(),
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("amqp://guest:***@127.0.0.1:5672/%2f"),
            "{shown}"
        );
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
    }

    #[test]
    fn work_queues_are_quorum_with_dead_lettering_and_a_delivery_limit() {
        let mut c = QueueConfig::new("amqp://h", Topology::default());
        c.delivery_limit = 7;
        let args = quorum_arguments(&c, Some("countersign.dlx"));
        let get = |k: &str| args.inner().get(k).cloned();
        assert_eq!(get("x-queue-type"), Some(long("quorum")));
        assert_eq!(get("x-dead-letter-exchange"), Some(long("countersign.dlx")));
        assert_eq!(get("x-delivery-limit"), Some(AMQPValue::LongLongInt(7)));
        let dead = quorum_arguments(&c, None);
        assert!(dead.inner().get("x-dead-letter-exchange").is_none());
        assert!(dead.inner().get("x-delivery-limit").is_none());
    }
}
