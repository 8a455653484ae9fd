//! The errors of the store. Only [`StoreError::code`] may reach the database, an event or a
//! queue; the `Display` text is for the log.

use countersign_core::{DatabaseCode, Fault, RunId, TerminationReason};

use countersign_crypto::CryptoError;

#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
    #[strum(serialize = "state_missing")]
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
            StoreError::Unreadable { .. } => TerminationReason::StateUnreadable.as_str(),
            StoreError::Crypto(e) => e.code(),
            StoreError::Database(e) => classify(e).1,
            StoreError::TimedOut(_) => DatabaseCode::Timeout.as_str(),
            other => other.into(),
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
    let (fault, code) = match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => (Fault::Transient, DatabaseCode::Unavailable),
        sqlx::Error::Database(db) => classify_sqlstate(db.code().as_deref().unwrap_or("")),
        _ => (Fault::Persistent, DatabaseCode::Error),
    };
    (fault, code.as_str())
}

/// [`classify`] for a SQLSTATE.
fn classify_sqlstate(code: &str) -> (Fault, DatabaseCode) {
    use DatabaseCode as C;
    match code {
        // Class 08: connection exception; 57P01–57P03: the server shuts down or starts up.
        c if c.starts_with("08") => (Fault::Transient, C::Unavailable),
        "57P01" | "57P02" | "57P03" => (Fault::Transient, C::Unavailable),
        // serialization_failure, deadlock_detected, lock_not_available.
        "40001" | "40P01" | "55P03" => (Fault::Transient, C::Conflict),
        // query_canceled (statement_timeout, a cancel request);
        // idle_in_transaction_session_timeout; a statement inside a failed transaction block.
        "57014" | "25P03" | "25P02" => (Fault::Transient, C::Timeout),
        "42501" => (Fault::Persistent, C::PermissionDenied),
        c if c.starts_with("42") => (Fault::Persistent, C::SchemaMismatch),
        c if c.starts_with("22") => (Fault::Persistent, C::DataException),
        c if c.starts_with("23") => (Fault::Persistent, C::ConstraintViolation),
        "P0001" => (Fault::Persistent, C::Refused),
        _ => (Fault::Persistent, C::Error),
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
        let code = |sqlstate| classify_sqlstate(sqlstate).1.as_str();
        assert_eq!(code("42501"), "database_permission_denied");
        assert_eq!(code("42703"), "database_schema_mismatch");
        assert_eq!(code("22001"), "database_data_exception");
        assert_eq!(code("23514"), "database_constraint_violation");
        assert_eq!(code("P0001"), "database_refused");
        assert_eq!(code("XX000"), "database_error");
        assert_eq!(code("40P01"), "database_conflict");
        assert_eq!(code("57014"), "database_timeout");
        assert_eq!(code("08006"), "database_unavailable");
        assert_eq!(code("57P01"), "database_unavailable");
    }

    #[test]
    fn every_store_error_has_the_code_it_always_had() {
        let run = RunId::new();
        let errors = [
            (StoreError::FenceLost, "fence_lost"),
            (StoreError::RunNotFound(run), "run_not_found"),
            (StoreError::NoState(run), "state_missing"),
            (StoreError::AlreadyJournaled, "already_journaled"),
            (StoreError::IdempotencyConflict, "idempotency_conflict"),
            (StoreError::unreadable("runs.state"), "state_unreadable"),
            (
                StoreError::Crypto(CryptoError::Truncated),
                "state_unreadable",
            ),
            (StoreError::Crypto(CryptoError::TooLarge), "seal_too_large"),
            (
                StoreError::Database(sqlx::Error::PoolTimedOut),
                "database_unavailable",
            ),
            (
                StoreError::Database(sqlx::Error::RowNotFound),
                "database_error",
            ),
            (
                StoreError::TimedOut(std::time::Duration::from_secs(1)),
                "database_timeout",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }
}
