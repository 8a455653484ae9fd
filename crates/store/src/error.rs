//! The errors of the store. Only [`StoreError::code`] may reach the database, an event or a
//! queue; the `Display` text is for the log.

use countersign_core::RunId;
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
    /// A stored value opened but does not parse, or a column holds a value this code does
    /// not know. `what` names the column, never its content.
    #[error("stored {what} is unreadable")]
    Unreadable { what: &'static str },
    /// Sealing or opening an envelope failed (`state_unreadable` for any failure to open).
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl StoreError {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::FenceLost => "fence_lost",
            StoreError::RunNotFound(_) => "run_not_found",
            StoreError::NoState(_) => "state_missing",
            StoreError::AlreadyJournaled => "already_journaled",
            StoreError::Unreadable { .. } => "state_unreadable",
            StoreError::Crypto(e) => e.code(),
            StoreError::Database(_) => "database_error",
        }
    }

    /// Whether the error says nothing about the request, only that the database could not
    /// answer it this time: the connection was lost or refused, the pool had none to give, the
    /// transaction lost a serialization conflict or a deadlock, or the server is shutting down
    /// or starting up. The same statement may well succeed when tried again, so a caller must
    /// not turn such an error into a final answer. Every other error (a constraint, a trigger's
    /// refusal, an unreadable value, a key that does not open) would fail again the same way.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Database(e) => is_transient_sqlx(e),
            _ => false,
        }
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

fn is_transient_sqlx(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| is_transient_sqlstate(&code)),
        _ => false,
    }
}

/// SQLSTATEs that say "try again": class 08 (connection exception), 40001
/// (serialization_failure), 40P01 (deadlock_detected), 57P01 (admin_shutdown), 57P02
/// (crash_shutdown) and 57P03 (cannot_connect_now).
fn is_transient_sqlstate(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "40001" | "40P01" | "57P01" | "57P02" | "57P03")
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
            StoreError::AlreadyJournaled,
            StoreError::unreadable("runs.state"),
        ] {
            assert!(!e.is_transient(), "{e:?}");
        }
    }

    #[test]
    fn the_transient_sqlstates_are_the_connection_conflict_and_shutdown_ones() {
        for code in [
            "08000", "08003", "08006", "08001", "08004", "40001", "40P01", "57P01", "57P02",
            "57P03",
        ] {
            assert!(is_transient_sqlstate(code), "{code}");
        }
        // A trigger's exception, a unique violation, a permission, a rollback of another kind,
        // a cancelled query, and a disk full: the same statement fails again.
        for code in ["P0001", "23505", "42501", "40002", "57014", "53100"] {
            assert!(!is_transient_sqlstate(code), "{code}");
        }
    }
}
