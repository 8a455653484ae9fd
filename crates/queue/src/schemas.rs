//! The JSON Schemas (draft 2020-12) of the public messages, version 1, as foreign
//! producers and consumers read them (also served as files under `crates/queue/schemas/`).
//!
//! The parsers in `countersign_core::messages` are the truth; these schemas describe
//! them. The tests below keep the two from drifting: every example in a schema must
//! satisfy the schema and parse with the core parser, and every `required`, length,
//! bound and pattern in a schema must be one the parser enforces.

/// `countersign.run_request`, queue `<prefix>.run-requests`.
pub const RUN_REQUEST_V1: &str = include_str!("../schemas/run_request.v1.json");
/// `countersign.decision`, queue `<prefix>.decisions`.
pub const DECISION_V1: &str = include_str!("../schemas/decision.v1.json");
/// `countersign.event`, topic exchange `<prefix>.events`.
pub const EVENT_V1: &str = include_str!("../schemas/event.v1.json");
