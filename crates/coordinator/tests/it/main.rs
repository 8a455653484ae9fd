//! The coordinator against the real PostgreSQL at `DATABASE_URL`, one fresh database per test.
//!
//! Suspended runs come from the real worker: the content store's writers, real envelopes and
//! the scripted model, the way the worker's own tests make them. "Untouched" is checked on the
//! whole run row, sealed state and `updated_at` included.

mod directory;
mod gates;
mod idempotency;
mod producers;
mod recording;
mod release;
mod requests;
mod service;
mod support;
