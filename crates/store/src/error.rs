//! The errors of the store. Only [`StoreError::code`] may reach the database, an event or a
//! queue; the `Display` text is for the log.

use countersign_core::{Fault, RunId, TerminationReason};

use crate::DecisionOutcome;
use countersign_crypto::CryptoError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The segment no longer holds the lease (another owner or epoch, or the run left
    /// `running`): nothing was written and the segment must stop.
    #[error("the lease is no longer held")]
    FenceLost,
    #[error("run {0} does not exist")]
    RunNotFound(RunId),
    /// The run has no sealed state to resume from.
    #[error("run {0} has no suspended state")]
    NoState(RunId),
    /// The call was journaled already: executing it again would repeat a write.
    #[error("call already journaled")]
    AlreadyJournaled,
    /// The id of a request was recorded before for another request (another run, card or
    /// body): nothing was created or changed, and the first request's outcome is not told.
    #[error("the id was recorded for another request")]
    IdempotencyConflict,
    /// A stored value opened but does not parse, or a column holds a value this code does
    /// not know. `what` names the column, never its content.
    #[error("stored {what} is unreadable")]
    Unreadable { what: &'static str },
    /// Sealing or opening an envelope failed (`state_unreadable` for any failure to open).
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The database did not answer within the caller's deadline ([`Store::within`]): nothing is
    /// known of what became of the statement, as for a lost connection.
    ///
    /// [`Store::within`]: crate::Store::within
    #[error("the database did not answer within {0:?}")]
    TimedOut(std::time::Duration),
}

impl StoreError {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::FenceLost => "fence_lost",
            StoreError::RunNotFound(_) => "run_not_found",
            StoreError::NoState(_) => "state_missing",
            StoreError::AlreadyJournaled => "already_journaled",
            StoreError::IdempotencyConflict => DecisionOutcome::IdempotencyConflict.as_str(),
            StoreError::Unreadable { .. } => TerminationReason::StateUnreadable.as_str(),
            StoreError::Crypto(e) => e.code(),
            StoreError::Database(e) => classify(e).1,
            StoreError::TimedOut(_) => "database_timeout",
        }
    }

    /// Whether a retry can cure this error: [`classify`] for the database's errors; a call
    /// journaled already is answered by the journal when the segment runs again; the store's
    /// other refusals are persistent.
    pub fn fault(&self) -> Fault {
        match self {
            StoreError::Database(e) => classify(e).0,
            StoreError::AlreadyJournaled | StoreError::TimedOut(_) => Fault::Transient,
            _ => Fault::Persistent,
        }
    }

    /// Whether the error says nothing about the request, only that the database could not
    /// answer it this time: the connection was lost or refused, the pool had none to give, the
    /// transaction lost a serialization conflict or a deadlock, or the server is shutting down
    /// or starting up. The same statement may well succeed when tried again, so a caller must
    /// not turn such an error into a final answer. Every other error (a constraint, a trigger's
    /// refusal, an unreadable value, a key that does not open) would fail again the same way.
    pub fn is_transient(&self) -> bool {
        self.fault() == Fault::Transient
    }

    /// Whether a sealed or stored value of the run does not open or parse: retrying cannot
    /// help, the run fails `state_unreadable`.
    pub fn is_unreadable(&self) -> bool {
        matches!(self, StoreError::Unreadable { .. } | StoreError::Crypto(_))
    }

    pub fn unreadable(what: &'static str) -> Self {
        StoreError::Unreadable { what }
    }
}

/// What a database error is: whether a retry can cure it, and the stable code that names it
/// where its message may not go (a preview line, a run row, an event). The one place that
/// decides it, for the store, the content tools and everything else that talks to PostgreSQL.
///
/// Transient: the connection was lost or refused, the pool had none to give, the transaction
/// lost a serialization conflict or a deadlock, a lock could not be had in time, a statement
/// ran past the session's `statement_timeout` (or was cancelled), the session was ended for
/// idling inside its transaction, or the server is shutting down or starting up. Persistent:
/// everything else — a permission, a column or table that is not there, a value a column
/// refuses, a constraint, a trigger's refusal.
pub fn classify(e: &sqlx::Error) -> (Fault, &'static str) {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => (Fault::Transient, "database_unavailable"),
        sqlx::Error::Database(db) => classify_sqlstate(db.code().as_deref().unwrap_or("")),
        _ => (Fault::Persistent, "database_error"),
    }
}

/// [`classify`] for a SQLSTATE.
fn classify_sqlstate(code: &str) -> (Fault, &'static str) {
    match code {
        // Class 08: connection exception; 57P01–57P03: the server shuts down or starts up.
        c if c.starts_with("08") => (Fault::Transient, "database_unavailable"),
        "57P01" | "57P02" | "57P03" => (Fault::Transient, "database_unavailable"),
        // serialization_failure, deadlock_detected, lock_not_available.
        "40001" | "40P01" | "55P03" => (Fault::Transient, "database_conflict"),
        // query_canceled (statement_timeout, a cancel request);
        // idle_in_transaction_session_timeout; a statement inside a failed transaction block.
        "57014" | "25P03" | "25P02" => (Fault::Transient, "database_timeout"),
        "42501" => (Fault::Persistent, "database_permission_denied"),
        c if c.starts_with("42") => (Fault::Persistent, "database_schema_mismatch"),
        c if c.starts_with("22") => (Fault::Persistent, "database_data_exception"),
        c if c.starts_with("23") => (Fault::Persistent, "database_constraint_violation"),
        "P0001" => (Fault::Persistent, "database_refused"),
        _ => (Fault::Persistent, "database_error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_connections_and_an_exhausted_pool_are_transient() {
        for e in [
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
        ] {
            assert!(StoreError::Database(e).is_transient());
        }
    }

    #[test]
    fn errors_that_would_recur_are_not_transient() {
        for e in [
            StoreError::Database(sqlx::Error::RowNotFound),
            StoreError::Database(sqlx::Error::Protocol("unexpected message".into())),
            StoreError::FenceLost,
            StoreError::unreadable("runs.state"),
        ] {
            assert!(!e.is_transient(), "{e:?}");
        }
    }

    #[test]
    fn a_call_journaled_already_is_answered_by_the_journal_on_the_next_attempt() {
        assert!(StoreError::AlreadyJournaled.is_transient());
    }

    #[test]
    fn the_transient_sqlstates_are_the_connection_conflict_and_shutdown_ones() {
        for code in [
            "08000", "08003", "08006", "08001", "08004", "40001", "40P01", "55P03", "57P01",
            "57P02", "57P03", "57014", "25P03", "25P02",
        ] {
            assert_eq!(classify_sqlstate(code).0, Fault::Transient, "{code}");
        }
        // A trigger's exception, a unique violation, a permission, a rollback of another kind,
        // and a disk full: the same statement fails again.
        for code in ["P0001", "23505", "42501", "40002", "53100"] {
            assert_eq!(classify_sqlstate(code).0, Fault::Persistent, "{code}");
        }
    }

    #[test]
    fn a_persistent_error_is_named_by_its_class_and_never_by_its_message() {
        assert_eq!(classify_sqlstate("42501").1, "database_permission_denied");
        assert_eq!(classify_sqlstate("42703").1, "database_schema_mismatch");
        assert_eq!(classify_sqlstate("22001").1, "database_data_exception");
        assert_eq!(
            classify_sqlstate("23514").1,
            "database_constraint_violation"
        );
        assert_eq!(classify_sqlstate("P0001").1, "database_refused");
        assert_eq!(classify_sqlstate("XX000").1, "database_error");
        assert_eq!(classify_sqlstate("40P01").1, "database_conflict");
        assert_eq!(classify_sqlstate("57014").1, "database_timeout");
    }
}
