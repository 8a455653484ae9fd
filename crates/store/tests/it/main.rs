//! The store against the real PostgreSQL at `DATABASE_URL`, one fresh database per test.
//!
//! Concurrency is made deterministic with barriers and the database clock: racers are released
//! together and the assertions are about outcomes that hold for every interleaving (exactly one
//! winner, no gaps), never about timing. A lease is expired by moving `lease_expires_at` into
//! the past, not by sleeping.

mod agents;
mod decisions;
mod directory;
mod events;
mod fence;
mod heartbeat;
mod journal;
mod outbox;
mod reaper;
mod sealing;
mod support;
mod tool_identities;
mod transitions;
mod webhooks;
