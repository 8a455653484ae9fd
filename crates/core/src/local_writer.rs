//! The contract of a writer whose writes land in the run store's own database, so that an
//! approved turn can compare and write them in one transaction.
//!
//! An approval binds to the lines its approver was shown. Comparing those lines in one
//! snapshot and writing in another is check-then-act: a colleague's edit landing in between
//! makes the approved write land against a state nobody was shown — and that colleague may be
//! a person editing the store in plain SQL, who takes none of countersign's locks. So a local
//! writer works inside the turn's transaction (`Tx`, the store's own type, opened by
//! [`crate::SegmentHooks::begin_turn`]), in three steps the approval pipeline
//! ([`crate::approval`]) drives for every call of the turn before any call writes:
//!
//! 1. [`LocalWriter::subjects`]: every row the call reads or writes, each with how it must be
//!    locked, read without locks; the turn locks the rows of all its calls at once, in one
//!    global order ([`LockSubject`]'s `Ord`), so two turns touching the same rows cannot deadlock
//!    each other — then asks again, under the locks, and retries should a set have grown;
//! 2. [`LocalWriter::plan`]: under those locks, settle exactly what the call would write;
//! 3. [`PlannedWrite::apply`]: write the plan and read it back, in the turn's transaction, before
//!    the next call is planned — a turn is a sequence ([`crate::sequence`]).
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

/// A row a call of the turn reads or writes, locked before anything is planned. Ordered by
/// `(space, rank, id)`: the one global lock order of every turn. A tool set names its own
/// `space`; within it, `rank` orders the kinds of row (for the content store: pages before
/// elements before files, …, parents before children). Every lock a turn needs is taken in this
/// order before its first plan, at the strongest `mode` any call needs, so two turns never wait
/// for each other in opposite orders.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockSubject {
    pub space: &'static str,
    pub rank: u8,
    pub id: i64,
    pub mode: LockMode,
}

/// How a row of a turn is locked, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LockMode {
    /// Read for the structure only (where it sits, whether it exists): a change of the row's
    /// other columns need not wait.
    KeyShare,
    /// Read: any change of the row waits.
    Share,
    /// Written by the turn.
    Update,
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
/// with. Every row `plan` reads and `apply` writes is named by `subjects` at the mode it needs,
/// and every row that could join what it reads (a new reference of an element, a new page below
/// a parent) is kept out by a lock the turn holds; each writer documents its read set. Nothing a
/// plan or a write does takes a lock `subjects` did not name. The preview a plan gives must be the
/// one [`crate::ToolPreview::preview`] gives for the same state: the pipeline holds one against
/// the other.
#[async_trait]
pub trait LocalWriter<Tx: Send>: Send + Sync {
    /// The rows the call reads and writes as `acting_user`, each with its mode: its read set.
    /// Read without locks; the turn asks again once they are locked.
    async fn subjects(
        &self,
        tx: &mut Tx,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<LockSubject>, ToolError>;

    /// Locks `subjects` in the order given, each in its mode: every row any call of the turn
    /// named in this writer's `space`, in the global order.
    async fn lock(&self, tx: &mut Tx, subjects: &[LockSubject]) -> Result<(), ToolError>;

    /// Marks the point the turn goes back to should this call fail in the store, so that the
    /// calls after it are planned against the state without it.
    async fn savepoint(&self, tx: &mut Tx) -> Result<(), ToolError>;

    /// Goes back to the last [`savepoint`](Self::savepoint): everything since is undone, and the
    /// transaction can go on.
    async fn rollback_to_savepoint(&self, tx: &mut Tx) -> Result<(), ToolError>;

    /// Settles exactly what the call would write, as the acting user, under the turn's locks.
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
