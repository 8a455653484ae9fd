//! The contract of a writer whose writes land in the run store's own database, so that an
//! approved turn can compare and write them in one transaction.
//!
//! An approval binds to the lines its approver was shown. Comparing those lines in one
//! snapshot and writing in another is check-then-act: a colleague's edit landing in between
//! makes the approved write land against a state nobody was shown — and that colleague may be
//! a person editing the store in plain SQL, who takes none of countersign's locks. So a local
//! writer works inside the turn's transaction (`Tx`, the store's own type, opened by
//! [`crate::SegmentHooks::begin_turn`]), in three steps the approval pipeline
//! ([`crate::agent_loop`]) drives for every call of the turn before any call writes:
//!
//! 1. [`LocalWriter::subjects`]: the rows the call writes or plans against, locked `FOR UPDATE`
//!    in one global order across the whole turn ([`LockSubject`]'s `Ord`), so two turns
//!    touching the same rows cannot deadlock each other;
//! 2. [`LocalWriter::plan`]: under those locks, lock every other row the plan reads — so that
//!    nothing the preview shows or the write depends on can change before the commit,
//!    whoever the other writer is — and settle exactly what the call would write;
//! 3. [`PlannedWrite::apply`]: once every call of the turn compared equal, write the plan and
//!    read it back.
//!
//! The pipeline commits once, with the audit events and journal rows of every local call
//! ([`crate::SegmentHooks::commit_turn`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::ids::CallIndex;
use crate::tool::{Effect, Principal, ToolError, ToolOutput};

/// A row a call locks before it plans. Ordered by `(space, rank, id)`: the one global lock
/// order of every turn. A tool set names its own `space`; within it, `rank` orders the kinds of
/// row (for the content store: pages before elements), so a writer that locks a page and then
/// the elements of one of its columns never waits in the opposite order of another.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockSubject {
    pub space: &'static str,
    pub rank: u8,
    pub id: i64,
}

/// One result of an approved turn, as it is journaled with its audit event.
#[derive(Debug, Clone, Copy)]
pub struct JournalEntry<'a> {
    pub index: CallIndex,
    pub tool: &'a str,
    pub effect: Effect,
    pub output: &'a ToolOutput,
}

/// A writer whose writes land in the run store's own database, working in its transaction
/// `Tx`.
///
/// Contract: the write compares against the lines it was shown under the same locks it writes
/// with. Every row `plan` reads is locked by `subjects` or by `plan` itself before it is read,
/// and every row that could join what it reads (a new reference of an element, a new page below
/// a parent) is kept out by a lock the turn holds; each writer documents its read set. The
/// preview a plan gives must be the one [`crate::ToolPreview::preview`] gives for the same
/// state: the pipeline holds one against the other.
#[async_trait]
pub trait LocalWriter<Tx: Send>: Send + Sync {
    /// The rows the call will write or plan against. Read without locks: a subject that
    /// depends on a row (the page an element is on) is re-checked by `plan` under the locks.
    async fn subjects(&self, tx: &mut Tx, args: &Value) -> Result<Vec<LockSubject>, ToolError>;

    /// Locks `subjects` `FOR UPDATE`, in the order given: every subject any call of the turn
    /// named in this writer's `space`, in the global order.
    async fn lock(&self, tx: &mut Tx, subjects: &[LockSubject]) -> Result<(), ToolError>;

    /// Locks the rest of what the call reads, then settles exactly what it would write, as the
    /// acting user.
    async fn plan(
        &self,
        tx: &mut Tx,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Box<dyn PlannedWrite<Tx>>, ToolError>;
}

/// What one call of the turn would write, settled under the turn's locks.
#[async_trait]
pub trait PlannedWrite<Tx: Send>: Send + Sync {
    /// The preview lines of the plan, before bounding: what the approver would be shown now.
    fn preview(&self) -> Vec<crate::preview::PreviewLine>;

    /// Writes the plan and reads it back; a refusal is an `Ok` output with `is_error`.
    async fn apply(self: Box<Self>, tx: &mut Tx) -> Result<ToolOutput, ToolError>;
}

/// The local writers of a process, by tool name, in the store's transaction type: what a
/// worker's [`crate::SegmentHooks::local`] answers from. Built where the tool registry is, from
/// the same tools.
pub struct LocalWriters<Tx> {
    writers: BTreeMap<String, Arc<dyn LocalWriter<Tx>>>,
}

impl<Tx: Send> LocalWriters<Tx> {
    pub fn new() -> Self {
        LocalWriters {
            writers: BTreeMap::new(),
        }
    }

    /// Adds the writer of tool `name`; a later one of the same name replaces the earlier.
    pub fn register(&mut self, name: impl Into<String>, writer: Arc<dyn LocalWriter<Tx>>) {
        self.writers.insert(name.into(), writer);
    }

    pub fn get(&self, name: &str) -> Option<&dyn LocalWriter<Tx>> {
        self.writers.get(name).map(|w| w.as_ref())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.writers.keys().map(String::as_str)
    }
}

impl<Tx: Send> Default for LocalWriters<Tx> {
    fn default() -> Self {
        Self::new()
    }
}

impl<Tx> fmt::Debug for LocalWriters<Tx> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.writers.keys()).finish()
    }
}
