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
pub const PREVIEW_CONFLICT: DatabaseCode = DatabaseCode::Conflict;

/// The stable codes of a database's failures: what names one where its message may not go (a
/// preview line, a run row, an event, a log field). The store decides which a failure is; every
/// crate that reports a database failure spells its code from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(prefix = "database_", serialize_all = "snake_case")]
#[non_exhaustive]
pub enum DatabaseCode {
    /// The connection was lost or refused, the pool had none to give, the server is shutting
    /// down or starting up.
    Unavailable,
    /// A serialization failure, a deadlock, a lock that could not be had at once.
    Conflict,
    /// A statement ran past its time or was cancelled, or the database did not answer within
    /// the caller's deadline.
    Timeout,
    PermissionDenied,
    /// A column or table that is not there.
    SchemaMismatch,
    /// A value a column refuses.
    DataException,
    ConstraintViolation,
    /// A trigger's refusal.
    Refused,
    /// Any other failure.
    Error,
}

impl DatabaseCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_database_code_is_the_string_it_always_was() {
        let codes = [
            (DatabaseCode::Unavailable, "database_unavailable"),
            (DatabaseCode::Conflict, "database_conflict"),
            (DatabaseCode::Timeout, "database_timeout"),
            (DatabaseCode::PermissionDenied, "database_permission_denied"),
            (DatabaseCode::SchemaMismatch, "database_schema_mismatch"),
            (DatabaseCode::DataException, "database_data_exception"),
            (
                DatabaseCode::ConstraintViolation,
                "database_constraint_violation",
            ),
            (DatabaseCode::Refused, "database_refused"),
            (DatabaseCode::Error, "database_error"),
        ];
        assert_eq!(
            codes.len(),
            <DatabaseCode as strum::VariantArray>::VARIANTS.len()
        );
        for (code, string) in codes {
            assert_eq!(code.as_str(), string, "{code:?}");
        }
        assert_eq!(PREVIEW_CONFLICT.as_str(), "database_conflict");
    }
}
