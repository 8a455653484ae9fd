//! A test kit for people who write countersign tools: hold a tool to the contracts countersign
//! holds it to, in the tool's own tests.
//!
//! - [`check_preview`]: the preview contract `countersign tools check` checks — two previews of
//!   one call read the same, line for line, neither fails, and they fit the bounds a card
//!   applies ([`PreviewCheck::assert_fit`]).
//! - [`plan_and_apply`]: a local writer's call run as an approved turn runs it, in a
//!   transaction the test gives — read set named and locked, named again under the locks, the
//!   plan's preview held against the tool's own, the write applied and read back
//!   ([`WriterRun::assert_kept`]).
//!
//! `docs/writing-tools.md` shows both on a writer of the reference content store.

mod preview_check;
mod writer;

pub use preview_check::{attempt, check_preview, judge, numbered, Attempt, PreviewCheck};
pub use writer::{plan_and_apply, WriterRun};
