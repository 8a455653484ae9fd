//! The countersign worker: runs one leased segment of a run at a time.
//!
//! A segment starts from a won claim — PostgreSQL decides who runs what, never a message —
//! loads what the run needs (the sealed prompt, or the sealed state and the accepted
//! decision), drives the domain's tool loop, and settles the outcome with statements guarded
//! by its lease. While it runs, a heartbeat renews the lease every third of its time to live;
//! a segment that loses its lease stops at the next step boundary and settles nothing.
//! Every transition it makes is announced in its own transaction through the store's outbox,
//! and the worker's relay ([`service::run`] starts it) publishes those events.
//!
//! The worker must never write outside the lease fence, never store an error message (only
//! codes), and never promise an approval it cannot resume: a run whose suspension cannot be
//! stored is failed `suspend_failed`.

mod batch;
mod claimer;
mod heartbeat;
mod hooks;
mod segment;
pub mod service;
mod settler;
mod wake_ups;

pub use heartbeat::Heartbeat;
pub use hooks::StoreHooks;
pub use segment::{Models, SegmentEnd, SegmentRunner};
pub use settler::Settler;
