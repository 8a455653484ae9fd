//! The names and shape of every queue and exchange, declared from one prefix.
//!
//! A process connecting to the broker does one of three things with the topology
//! ([`Declare`]): by default it creates what is missing and leaves what exists as it is, so
//! a broker that lost its definitions, or a fresh vhost, is repaired by the first process
//! that connects. Existence is checked first with a passive declare because RabbitMQ
//! refuses (`PRECONDITION_FAILED`, closing the channel) to declare an existing queue with
//! arguments other than its own, in either direction: a queue an operator created from the
//! definitions file (no dead-letter arguments, a policy gives them) or one an earlier
//! release declared with another delivery limit would otherwise stop every process from
//! starting. A queue's arguments are fixed at creation; policies are not, which is why the
//! definitions file (`deploy/rabbitmq/definitions.json`) sets dead-lettering and the
//! delivery limit as policies, and a process can create missing queues without those
//! arguments ([`Declare::WithoutArguments`]) or declare nothing at all
//! ([`Declare::Nothing`]: it only checks, which needs no configure permission, so a
//! service can run as a least-privilege user).
//!
//! The inbound queues are quorum queues because they hold work that must survive a node
//! loss, and because only quorum queues count deliveries: a message that keeps failing
//! (a consumer crashing on it, or requeueing it) is dead-lettered by the broker after
//! `delivery_limit` attempts instead of looping forever. Dead-lettering is
//! `at-least-once` (which RabbitMQ only offers with `x-overflow: reject-publish`), so a
//! poison message is not lost on its way to the dead-letter queue either.
//!
//! The dead-letter queue is bounded ([`DEAD_LETTER_MAX_LENGTH`] messages,
//! [`DEAD_LETTER_MAX_BYTES`] bytes) and drops its oldest message when a new one would pass
//! either bound ([`DEAD_LETTER_OVERFLOW`]). Nothing drains it but an operator, so unbounded it
//! grows for as long as a producer misbehaves, until the broker's memory alarm blocks every
//! publisher, the services included. Refusing the newest instead (`reject-publish`) would not
//! bound anything: at-least-once dead-lettering keeps a message the dead-letter queue refuses
//! in the work queue it came from and retries, so the backlog would only move there. What is
//! dropped is a copy for diagnosis, never the truth: a run's state is in PostgreSQL, a lost
//! wake-up is made good by the workers' poll, and a refused request or decision has already
//! been logged with its reason. The alert `CountersignDeadLettersNearlyFull` fires well before
//! the bound, while the oldest are still there to read.
//!
//! Each work queue has a fanout exchange of the same name bound to it. RabbitMQ checks a
//! publish against the exchange it names, and the default exchange (`amq.default`) reaches
//! every queue: a producer allowed to write only to the exchanges of the two public queues
//! can reach those two queues and nothing else, and a worker allowed to write only to the
//! segments exchange can hand its wake-ups back (when it stops) without the right to write
//! into every queue of the vhost that `amq.default` would be.

use std::collections::HashSet;
use std::fmt;

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ExchangeKind};

use countersign_core::EventName;

use crate::error::QueueError;

/// The prefix used in production.
pub const DEFAULT_PREFIX: &str = "countersign";
/// How many deliveries a quorum queue attempts before it dead-letters a message.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 5;
/// The most messages the dead-letter queue holds; past it the oldest is dropped.
pub const DEAD_LETTER_MAX_LENGTH: u32 = 10_000;
/// The most bytes of message bodies the dead-letter queue holds (64 MiB); past it the oldest
/// is dropped.
pub const DEAD_LETTER_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// What the dead-letter queue does when full: drops its oldest message (see the module doc).
pub const DEAD_LETTER_OVERFLOW: &str = "drop-head";
/// How many times a lost connection is retried before an operation gives up.
pub const DEFAULT_RECONNECT_ATTEMPTS: usize = 8;
/// The AMQP heartbeat asked for, in seconds (see [`QueueConfig::heartbeat`]).
pub const DEFAULT_HEARTBEAT_SECS: u16 = 10;
/// How long a publish waits for its confirm before it fails (see
/// [`QueueConfig::publish_timeout`]).
pub const DEFAULT_PUBLISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

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

    /// The name of `queue` without the prefix, as a metric label (`segments`, `decisions`, …);
    /// `None` for a queue that is not one of the topology's (a private reply or watch queue).
    pub fn queue_label(&self, queue: &str) -> Option<&'static str> {
        [
            (self.run_requests(), "run-requests"),
            (self.decisions(), "decisions"),
            (self.segments(), "segments"),
            (self.dead_letters(), "dead-letters"),
        ]
        .into_iter()
        .find_map(|(name, label)| (name == queue).then_some(label))
    }

    /// The three work queues, which share the dead-letter exchange and delivery limit.
    pub fn work_queues(&self) -> [String; 3] {
        [self.run_requests(), self.decisions(), self.segments()]
    }

    /// The two public queues, each also the name of the fanout exchange in front of it (see
    /// [`Broker::publish_public`](crate::Broker::publish_public)).
    pub fn public_queues(&self) -> [String; 2] {
        [self.run_requests(), self.decisions()]
    }

    /// The fanout exchange in front of the segments queue, of the same name: the way a worker
    /// hands a wake-up back, with write permission on this exchange only.
    pub fn segments_exchange(&self) -> String {
        self.segments()
    }
}

impl Default for Topology {
    fn default() -> Self {
        Topology::new(DEFAULT_PREFIX)
    }
}

/// What a process does with the topology when it connects (and reconnects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Declare {
    /// Create what is missing, the work queues with dead-lettering and the delivery limit
    /// as queue arguments; leave what exists as it is. For a broker nobody set up: the
    /// tests, a first start without the definitions file.
    #[default]
    WithArguments,
    /// Create what is missing, the work queues with their type only: the broker's policies
    /// (the definitions file's) give them dead-lettering and the delivery limit, and can
    /// change both without a queue being declared again.
    WithoutArguments,
    /// Create nothing; check that every queue and exchange exists and fail with
    /// `topology_missing` otherwise. A passive check needs no configure permission, so this
    /// is the mode of a least-privilege user on a broker the definitions set up.
    Nothing,
}

/// Where the broker is and how the topology is declared.
#[derive(Clone)]
pub struct QueueConfig {
    /// `amqp://user:password@host:port/vhost`, or several such addresses separated by commas:
    /// the nodes of one cluster, tried in turn. Never logged: it may carry a password.
    pub addr: String,
    pub topology: Topology,
    /// Deliveries a work queue attempts before dead-lettering a message (default 5), when
    /// this process creates it with [`Declare::WithArguments`].
    pub delivery_limit: u32,
    /// Whether to create missing queues and exchanges, and how (default
    /// [`Declare::WithArguments`]).
    pub declare: Declare,
    /// Tests only: declare the exchanges auto-delete, so they disappear with the last
    /// binding. Quorum queues cannot be auto-delete; a test removes them with
    /// [`Broker::delete_topology`](crate::Broker::delete_topology), which is why every
    /// test uses its own prefix.
    pub auto_delete: bool,
    /// Connection attempts, with exponential backoff from 100 ms to 5 s, before an
    /// operation gives up with `broker_unavailable` (default 8, about 16 s).
    pub reconnect_attempts: usize,
    /// How long a publish may wait for the broker to take it and confirm it before it fails
    /// with `publish_timeout` and the connection is replaced, how long starting a consumer or
    /// counting a queue's messages may wait for the broker's answers before it fails the same
    /// way (`consume_failed`, `topology_failed`), and how long connecting to one node may take
    /// before the next is tried (default [`DEFAULT_PUBLISH_TIMEOUT`]). A connection that stops
    /// answering without closing (a node going away, a network partition) would otherwise
    /// hold the publish or the consumer's start, and whatever awaits it, until the heartbeat
    /// notices — or forever, for a start whose answer the node took with it.
    pub publish_timeout: std::time::Duration,
    /// The AMQP heartbeat this process asks for, in seconds, unless an address names its own
    /// (`?heartbeat=`): the broker and the client each take a connection that sent nothing for
    /// two of them as dead. So a process cut off from the broker without a reset (a network
    /// partition, a paused process) notices within two heartbeats, and the broker gives the
    /// deliveries it held unacknowledged to the other consumers within two heartbeats too
    /// (default [`DEFAULT_HEARTBEAT_SECS`]). The lower of this and the broker's is used.
    pub heartbeat: u16,
}

impl QueueConfig {
    /// The addresses of [`addr`](Self::addr), in order; blank entries are skipped.
    pub fn addrs(&self) -> Vec<&str> {
        self.addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect()
    }

    /// A production configuration: durable everything, the default delivery limit.
    pub fn new(addr: impl Into<String>, topology: Topology) -> Self {
        QueueConfig {
            addr: addr.into(),
            topology,
            delivery_limit: DEFAULT_DELIVERY_LIMIT,
            declare: Declare::default(),
            auto_delete: false,
            reconnect_attempts: DEFAULT_RECONNECT_ATTEMPTS,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            heartbeat: DEFAULT_HEARTBEAT_SECS,
        }
    }

    /// `addr` asking for [`heartbeat`](Self::heartbeat) seconds, unless it names its own.
    pub fn with_heartbeat(&self, addr: &str) -> String {
        if self.heartbeat == 0 || addr.contains("heartbeat=") {
            return addr.to_owned();
        }
        let sep = if addr.contains('?') { '&' } else { '?' };
        format!("{addr}{sep}heartbeat={}", self.heartbeat)
    }
}

impl fmt::Debug for QueueConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueConfig")
            .field("addr", &redact(&self.addr))
            .field("topology", &self.topology)
            .field("delivery_limit", &self.delivery_limit)
            .field("declare", &self.declare)
            .field("auto_delete", &self.auto_delete)
            .field("reconnect_attempts", &self.reconnect_attempts)
            .field("heartbeat", &self.heartbeat)
            .finish()
    }
}

/// The address with any password replaced, for logs.
pub fn redact(addr: &str) -> String {
    addr.split(',')
        .map(redact_one)
        .collect::<Vec<_>>()
        .join(",")
}

fn redact_one(addr: &str) -> String {
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

/// The arguments of a queue this process creates: a work queue's dead-lettering and delivery
/// limit (given `dead_letter_exchange`), or the dead-letter queue's bounds; with
/// [`Declare::WithoutArguments`] the type only, the definitions' policies giving the rest.
fn queue_arguments(config: &QueueConfig, dead_letter_exchange: Option<&str>) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), long("quorum"));
    if config.declare != Declare::WithArguments {
        return args;
    }
    match dead_letter_exchange {
        Some(dlx) => {
            args.insert("x-dead-letter-exchange".into(), long(dlx));
            args.insert("x-dead-letter-strategy".into(), long("at-least-once"));
            args.insert("x-overflow".into(), long("reject-publish"));
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(i64::from(config.delivery_limit)),
            );
        }
        None => {
            args.insert(
                "x-max-length".into(),
                AMQPValue::LongLongInt(i64::from(DEAD_LETTER_MAX_LENGTH)),
            );
            args.insert(
                "x-max-length-bytes".into(),
                AMQPValue::LongLongInt(i64::try_from(DEAD_LETTER_MAX_BYTES).unwrap_or(i64::MAX)),
            );
            args.insert("x-overflow".into(), long(DEAD_LETTER_OVERFLOW));
        }
    }
    args
}

fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// Every exchange of the topology, with its kind.
fn exchanges(t: &Topology) -> Vec<(String, ExchangeKind)> {
    let mut all = vec![
        (t.dead_letter_exchange(), ExchangeKind::Fanout),
        (t.events_exchange(), ExchangeKind::Topic),
    ];
    all.extend(
        t.public_queues()
            .into_iter()
            .chain([t.segments_exchange()])
            .map(|q| (q, ExchangeKind::Fanout)),
    );
    all
}

/// Every queue of the topology, with the dead-letter exchange it uses, if any.
fn queues(t: &Topology) -> Vec<(String, Option<String>)> {
    let mut all = vec![(t.dead_letters(), None)];
    all.extend(
        t.work_queues()
            .into_iter()
            .map(|q| (q, Some(t.dead_letter_exchange()))),
    );
    all
}

/// A binding of the topology: a queue, the exchange it takes from, and the routing key
/// (empty for a fanout exchange).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Binding {
    queue: String,
    exchange: String,
    key: &'static str,
}

impl Binding {
    fn fanout(queue: String, exchange: String) -> Binding {
        Binding {
            queue,
            exchange,
            key: "",
        }
    }
}

/// Every binding of the topology: each fanout exchange to its queue, and the segments queue to
/// the events that wake a worker ([`wake_up_bindings`]).
fn bindings(t: &Topology) -> Vec<Binding> {
    let mut all = vec![Binding::fanout(t.dead_letters(), t.dead_letter_exchange())];
    all.extend(
        t.public_queues()
            .into_iter()
            .map(|q| Binding::fanout(q.clone(), q)),
    );
    all.push(Binding::fanout(t.segments(), t.segments_exchange()));
    all.extend(wake_up_bindings(t));
    all
}

/// The segments queue bound to the events exchange under each name of
/// [`EventName::WAKE_UPS`]: the event that hands a run to the workers is its wake-up.
fn wake_up_bindings(t: &Topology) -> impl Iterator<Item = Binding> + '_ {
    EventName::WAKE_UPS.into_iter().map(|name| Binding {
        queue: t.segments(),
        exchange: t.events_exchange(),
        key: name.as_str(),
    })
}

/// Makes the topology what `config.declare` asks for (see [`Declare`]): creates what is
/// missing, never redeclares what exists, or only checks.
pub(crate) async fn declare(
    connection: &Connection,
    config: &QueueConfig,
) -> Result<(), QueueError> {
    let t = &config.topology;
    let mut probe = Probe {
        connection,
        channel: None,
    };
    if config.declare == Declare::Nothing {
        return check_present(&mut probe, t).await;
    }

    let channel = connection
        .create_channel()
        .await
        .map_err(QueueError::Topology)?;
    let created = create_missing(&channel, &mut probe, config).await?;
    // A binding between two entities that both existed is left alone like them: binding
    // needs permissions (write on the queue, read on the exchange) a process that found
    // everything in place should not need.
    for binding in bindings(t) {
        if !created.contains(&binding.queue) && !created.contains(&binding.exchange) {
            continue;
        }
        bind(&channel, &binding).await?;
    }
    if !created.is_empty() {
        tracing::info!(prefix = %t.prefix, created = created.len(), declare = ?config.declare, "declared the missing parts of the topology");
    }
    rebind_wake_ups(connection, t).await;
    Ok(())
}

/// Checks that every exchange and queue of the topology exists, declaring nothing.
async fn check_present(probe: &mut Probe<'_>, t: &Topology) -> Result<(), QueueError> {
    for (name, _) in exchanges(t) {
        if !probe.exists(Entity::Exchange, &name).await? {
            return Err(QueueError::TopologyMissing(format!("exchange {name}")));
        }
    }
    for (name, _) in queues(t) {
        if !probe.exists(Entity::Queue, &name).await? {
            return Err(QueueError::TopologyMissing(format!("queue {name}")));
        }
    }
    Ok(())
}

/// Declares on `channel` every exchange and queue of the topology that does not exist yet;
/// the names of those it created.
async fn create_missing(
    channel: &Channel,
    probe: &mut Probe<'_>,
    config: &QueueConfig,
) -> Result<HashSet<String>, QueueError> {
    let t = &config.topology;
    let mut created = HashSet::new();
    let exchange = ExchangeDeclareOptions {
        durable: true,
        auto_delete: config.auto_delete,
        ..ExchangeDeclareOptions::default()
    };
    for (name, kind) in exchanges(t) {
        if probe.exists(Entity::Exchange, &name).await? {
            continue;
        }
        channel
            .exchange_declare(short(&name)?, kind, exchange, FieldTable::default())
            .await
            .map_err(QueueError::Topology)?;
        created.insert(name);
    }
    for (name, dlx) in queues(t) {
        if probe.exists(Entity::Queue, &name).await? {
            continue;
        }
        channel
            .queue_declare(
                short(&name)?,
                durable_queue(),
                queue_arguments(config, dlx.as_deref()),
            )
            .await
            .map_err(QueueError::Topology)?;
        created.insert(name);
    }
    Ok(created)
}

async fn bind(channel: &Channel, binding: &Binding) -> Result<(), QueueError> {
    channel
        .queue_bind(
            short(&binding.queue)?,
            short(&binding.exchange)?,
            binding.key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(QueueError::Topology)
}

/// Binds the segments queue to the wake-up events even where both already existed: a
/// topology an earlier release created has the queue and the exchange without these bindings,
/// and its runs would then wait for the workers' poll to start. Binding again is a no-op for
/// the broker. A refusal (a user without write on the queue or read on the exchange) is not
/// fatal: it is logged, and the poll finds the runs; the definitions file carries the bindings
/// for a broker set up by an operator.
async fn rebind_wake_ups(connection: &Connection, t: &Topology) {
    let bound = async {
        let channel = connection
            .create_channel()
            .await
            .map_err(QueueError::Topology)?;
        for binding in wake_up_bindings(t) {
            bind(&channel, &binding).await?;
        }
        let _ = channel.close(200, "bound".into()).await;
        Ok::<(), QueueError>(())
    };
    if let Err(e) = bound.await {
        tracing::warn!(prefix = %t.prefix, code = e.code(), error = %e, "could not bind the segments queue to the wake-up events; workers find new and released runs by their poll until the definitions bind it");
    }
}

#[derive(Debug, Clone, Copy)]
enum Entity {
    Queue,
    Exchange,
}

/// Passive declares on a channel of their own: a missing entity closes the channel
/// (`NOT_FOUND`), so the next check opens another.
struct Probe<'a> {
    connection: &'a Connection,
    channel: Option<Channel>,
}

impl Probe<'_> {
    async fn exists(&mut self, entity: Entity, name: &str) -> Result<bool, QueueError> {
        let channel = match self.channel.take().filter(|c| c.status().connected()) {
            Some(channel) => channel,
            None => self
                .connection
                .create_channel()
                .await
                .map_err(QueueError::Topology)?,
        };
        let answer = match entity {
            Entity::Queue => channel
                .queue_declare(
                    short(name)?,
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map(drop),
            Entity::Exchange => {
                channel
                    .exchange_declare(
                        short(name)?,
                        // A passive declare only checks the name; the kind is ignored.
                        ExchangeKind::Fanout,
                        ExchangeDeclareOptions {
                            passive: true,
                            ..ExchangeDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
            }
        };
        match answer {
            Ok(()) => {
                self.channel = Some(channel);
                Ok(true)
            }
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(QueueError::Topology(e)),
        }
    }
}

fn not_found(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(e)
            if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
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
    for (exchange, _) in exchanges(topology) {
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
    fn a_cluster_address_lists_its_nodes_and_redacts_every_password() {
        let config = QueueConfig::new(
            "amqp://u:p1@h1:5672/%2f, amqp://u:p2@h2:5673/%2f,",
            Topology::new("t"),
        );
        assert_eq!(
            config.addrs(),
            vec!["amqp://u:p1@h1:5672/%2f", "amqp://u:p2@h2:5673/%2f"]
        );
        let shown = redact(&config.addr);
        assert!(!shown.contains("p1") && !shown.contains("p2"), "{shown}");
        assert!(
            shown.contains("u:***@h1:5672") && shown.contains("u:***@h2:5673"),
            "{shown}"
        );
    }

    #[test]
    fn an_address_asks_for_the_heartbeat_unless_it_names_its_own() {
        let mut config = QueueConfig::new("amqp://h/%2f", Topology::new("t"));
        config.heartbeat = 4;
        assert_eq!(
            config.with_heartbeat("amqp://h/%2f"),
            "amqp://h/%2f?heartbeat=4"
        );
        assert_eq!(
            config.with_heartbeat("amqp://h/%2f?frame_max=8192"),
            "amqp://h/%2f?frame_max=8192&heartbeat=4"
        );
        assert_eq!(
            config.with_heartbeat("amqp://h/%2f?heartbeat=30"),
            "amqp://h/%2f?heartbeat=30"
        );
        config.heartbeat = 0;
        assert_eq!(config.with_heartbeat("amqp://h/%2f"), "amqp://h/%2f");
    }

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
        let args = queue_arguments(&c, Some("countersign.dlx"));
        let get = |k: &str| args.inner().get(k).cloned();
        assert_eq!(get("x-queue-type"), Some(long("quorum")));
        assert_eq!(get("x-dead-letter-exchange"), Some(long("countersign.dlx")));
        assert_eq!(get("x-delivery-limit"), Some(AMQPValue::LongLongInt(7)));
        let dead = queue_arguments(&c, None);
        assert!(dead.inner().get("x-dead-letter-exchange").is_none());
        assert!(dead.inner().get("x-delivery-limit").is_none());
    }

    #[test]
    fn the_dead_letter_queue_is_bounded_and_drops_its_oldest() {
        let c = QueueConfig::new("amqp://h", Topology::default());
        let args = queue_arguments(&c, None);
        let get = |k: &str| args.inner().get(k).cloned();
        assert_eq!(get("x-queue-type"), Some(long("quorum")));
        assert_eq!(get("x-max-length"), Some(AMQPValue::LongLongInt(10_000)));
        assert_eq!(
            get("x-max-length-bytes"),
            Some(AMQPValue::LongLongInt(64 * 1024 * 1024))
        );
        assert_eq!(get("x-overflow"), Some(long("drop-head")));
    }

    #[test]
    fn work_queues_left_to_policies_carry_only_their_type() {
        let mut c = QueueConfig::new("amqp://h", Topology::default());
        c.declare = Declare::WithoutArguments;
        for dlx in [Some("countersign.dlx"), None] {
            let args = queue_arguments(&c, dlx);
            let keys: Vec<_> = args.inner().keys().map(|k| k.as_str().to_owned()).collect();
            assert_eq!(keys, ["x-queue-type"], "{dlx:?}");
        }
    }

    #[test]
    fn each_work_queue_has_an_exchange_of_its_name_bound_to_it_and_the_segments_queue_the_wake_up_events(
    ) {
        let t = Topology::new("p");
        let names: Vec<_> = exchanges(&t).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "p.dlx",
                "p.events",
                "p.run-requests",
                "p.decisions",
                "p.segments"
            ]
        );
        let bound: Vec<_> = bindings(&t)
            .into_iter()
            .map(|b| (b.queue, b.exchange, b.key))
            .collect();
        assert_eq!(
            bound,
            [
                ("p.dead-letters".to_owned(), "p.dlx".to_owned(), ""),
                ("p.run-requests".to_owned(), "p.run-requests".to_owned(), ""),
                ("p.decisions".to_owned(), "p.decisions".to_owned(), ""),
                ("p.segments".to_owned(), "p.segments".to_owned(), ""),
                (
                    "p.segments".to_owned(),
                    "p.events".to_owned(),
                    "run.accepted"
                ),
                (
                    "p.segments".to_owned(),
                    "p.events".to_owned(),
                    "decision.accepted"
                ),
            ]
        );
    }
}
