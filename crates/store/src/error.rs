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

    pub(crate) fn unreadable(what: &'static str) -> Self {
        StoreError::Unreadable { what }
    }
}
