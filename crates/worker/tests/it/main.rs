//! Segments run against the real PostgreSQL, with the content store's real writers, real
//! envelopes and the scripted model.

mod concurrency;
mod lock_coverage;
mod segments;
mod support;
