#![doc = include_str!("../README.md")]

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
    DEAD_LETTER_OVERFLOW, DEFAULT_DELIVERY_LIMIT, DEFAULT_HEARTBEAT_SECS, DEFAULT_PREFIX,
    DEFAULT_PUBLISH_TIMEOUT, DEFAULT_RECONNECT_ATTEMPTS,
};
