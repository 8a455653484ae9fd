//! The contract that lets an approved turn be checked and written in one transaction.
//!
//! An approval binds to the lines its approver was shown. Comparing those lines in one
//! snapshot and writing in another is check-then-act: a colleague's edit landing in between
//! makes the approved write land against a state nobody was shown. So for writers whose writes
//! land in the run store's own database, the loop runs the whole approved turn inside one
//! [`TurnTransaction`] opened by the segment ([`crate::SegmentHooks::begin_turn`]), which has
//! already locked the run row and verified the lease:
//!
//! 1. every call names the subjects it writes ([`TransactionalTool::subjects`]); the loop locks
//!    them all in one global order ([`LockSubject`]'s `Ord`), so two turns touching the same
//!    rows cannot deadlock each other;
//! 2. every call is re-planned under those locks ([`TransactionalTool::plan`]) and its preview
//!    bounded exactly as at suspend, then compared with what the approver was shown;
//! 3. if any moved, the transaction rolls back and nothing is written; otherwise every plan is
//!    applied in call order, and the results are committed once with their audit events and
//!    journal rows ([`TurnTransaction::commit`]).
//!
//! The journal is then all-or-nothing per turn: a retried resume either finds every result of
//! the turn ([`TurnTransaction::journaled`]) or none, and compares again.

use std::any::Any;
use std::fmt;

use async_trait::async_trait;
use serde_json::Value;

use crate::agent_loop::HookError;
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

/// One result of an approved turn, as it is journaled.
#[derive(Debug, Clone, Copy)]
pub struct JournalEntry<'a> {
    pub index: CallIndex,
    pub tool: &'a str,
    pub effect: Effect,
    pub output: &'a ToolOutput,
}

/// An open transaction of the run store in which the segment's lease has been verified and the
/// run row is locked. Dropping it without [`commit`](Self::commit) rolls everything back.
#[async_trait]
pub trait TurnTransaction: Send + fmt::Debug {
    /// The concrete transaction, for the tools of the store it belongs to.
    fn as_any_mut(&mut self) -> &mut dyn Any;

    /// Every journaled result of the turn, in call order; empty when none was committed.
    async fn journaled(&mut self) -> Result<Vec<(CallIndex, ToolOutput)>, HookError>;

    /// Appends an audit event for every write and a journal row for every entry, then commits.
    async fn commit(self: Box<Self>, entries: &[JournalEntry<'_>]) -> Result<(), HookError>;

    /// Abandons everything written in the transaction.
    async fn rollback(self: Box<Self>);
}

/// A writer whose writes land in the run store's own database.
///
/// The preview a plan gives must be the one [`crate::ToolPreview::preview`] gives for the same
/// state: the comparator holds one against the other.
#[async_trait]
pub trait TransactionalTool: Send + Sync {
    /// The rows the call will write or plan against. Read without locks: a subject that
    /// depends on a row (the page an element is on) is re-checked by `plan` under the locks.
    async fn subjects(
        &self,
        tx: &mut dyn TurnTransaction,
        args: &Value,
    ) -> Result<Vec<LockSubject>, ToolError>;

    /// Locks one subject `FOR UPDATE`. Called in the global order, for every subject any call
    /// of the turn named in this tool's `space`.
    async fn lock(
        &self,
        tx: &mut dyn TurnTransaction,
        subject: &LockSubject,
    ) -> Result<(), ToolError>;

    /// Settles exactly what the call would write, as the acting user, under the locks.
    async fn plan(
        &self,
        tx: &mut dyn TurnTransaction,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Box<dyn PlannedWrite>, ToolError>;
}

/// What one call of the turn would write, settled under the turn's locks.
#[async_trait]
pub trait PlannedWrite: Send {
    /// The preview lines of the plan, before bounding: what the approver would be shown now.
    fn preview(&self) -> Vec<String>;

    /// Writes the plan and reads it back; a refusal is an `Ok` output with `is_error`.
    async fn apply(self: Box<Self>, tx: &mut dyn TurnTransaction) -> Result<ToolOutput, ToolError>;
}
