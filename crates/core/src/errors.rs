//! The failures that stop a segment rather than become a tool result: the lease lost, a
//! transient fault to retry, a persistent one, a sealed value that does not open, a write whose
//! outcome nobody can tell.

use crate::ids::CallIndex;
use crate::tool::ToolError;

/// A failure that stops the segment: of its own infrastructure (the fence, the journal), or of
/// a tool's that no retry or result can answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    /// The segment no longer holds its lease.
    #[error("lease lost")]
    LeaseLost,
    /// A transient failure ([`crate::Fault::Transient`]): the segment is interrupted and
    /// retried. The detail is for the log only.
    #[error("{code}: {detail}")]
    Unavailable { code: &'static str, detail: String },
    /// A persistent failure stopped a write ([`crate::Fault::Persistent`]): retrying cannot
    /// help, the run fails `not_retryable` with the code.
    #[error("{code} (persistent): {detail}")]
    Broken { code: &'static str, detail: String },
    /// A sealed value of the run (a journal entry, a comment) does not open: retrying cannot
    /// help, the run fails `state_unreadable`.
    #[error("sealed value unreadable: {what}")]
    Unreadable { what: &'static str },
    /// A write sent outside the store may have landed and nobody can say: the run fails
    /// `outcome_unknown`, and the call stays marked as sent for an operator to look at.
    #[error("the outcome of call {index} is unknown ({code})")]
    OutcomeUnknown {
        index: CallIndex,
        code: &'static str,
    },
}

impl HookError {
    /// What a tool's failure that stops the segment stands for.
    pub fn from_tool(e: &ToolError) -> Self {
        match e {
            ToolError::FenceLost => HookError::LeaseLost,
            ToolError::Unavailable { code, detail } => HookError::Unavailable {
                code,
                detail: detail.clone(),
            },
            other => HookError::Broken {
                code: other.code(),
                detail: other.to_string(),
            },
        }
    }
}

/// The code of a transient failure that says a row was locked by someone else: at suspension,
/// the local writes are then previewed each on its own ([`crate::SegmentHooks::begin_preview`]).
pub const PREVIEW_CONFLICT: &str = "database_conflict";
