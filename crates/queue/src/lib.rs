//! The RabbitMQ transport of countersign: the topology, confirmed publishing,
//! manual-ack consumers and dead-lettering, for segment wake-ups, the public inbound
//! messages (run requests, decisions) and the outcome events.
//!
//! A delivery only ever says "look": PostgreSQL decides. A wake-up may be duplicated,
//! late or stale, and the code that receives it re-reads the row and acts on what the row
//! says. So this crate must never:
//!
//! - decide state from a message (it parses and carries; the coordinator and the worker
//!   decide against the database);
//! - ack a delivery before the outcome of the work it triggered is durable elsewhere
//!   ([`Delivery`] is settled by the caller, exactly once, after its commit);
//! - drop a message: publishes are persistent and wait for the broker's confirm (a nack,
//!   a refusal or an unroutable message is an error, never a silent success), and poison
//!   goes to the dead-letter queue with a reason ([`Delivery::dead_letter`] publishes the
//!   copy before it acks the original; the quorum queues' delivery limit catches the rest).
//!
//! The message formats foreign producers write against are JSON Schemas in [`schemas`],
//! checked against the parsers of `countersign_core::messages` by this crate's tests.

mod broker;
mod consumer;
mod error;
pub mod schemas;
mod segment;
mod topology;
pub mod trace_context;

pub use broker::{published_total, Broker, MessageProperties};
pub use consumer::{Consumer, Delivery, ORIGINAL_USER_HEADER, REASON_HEADER, SOURCE_QUEUE_HEADER};
pub use error::QueueError;
pub use segment::{parse_segment, segment_body, SEGMENT_TYPE};
pub use topology::{
    redact, Declare, QueueConfig, Topology, DEAD_LETTER_MAX_BYTES, DEAD_LETTER_MAX_LENGTH,
    DEAD_LETTER_OVERFLOW, DEFAULT_DELIVERY_LIMIT, DEFAULT_PREFIX, DEFAULT_RECONNECT_ATTEMPTS,
};
