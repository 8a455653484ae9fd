#![doc = include_str!("../README.md")]

mod calls;
mod decisions;
pub mod grants;
pub mod policies;
pub mod producers;
mod requests;
pub mod service;
mod spans;
mod team;
mod verdict;

use std::sync::Arc;

use countersign_core::{DirectoryError, ToolRegistry, UserDirectory};
use countersign_store::{Store, StoreError};

pub use producers::{ProducerError, ProducerGrant, ProducerKind};
pub use verdict::{DecisionCode, DecisionVerdict, Dispatch, RequestOutcome, RequestVerdict};

/// Re-exported so that a caller can name the segment of a [`Dispatch`] and the gated outcomes.
pub use countersign_store::{DecisionOutcome, SegmentKind};

/// The gates, with what they read: runs, decisions and agent configurations from the store,
/// users from the directory, and the tools the approver's permissions are checked against.
#[derive(Debug, Clone)]
pub struct Coordinator {
    pub store: Store,
    /// Must describe the same tools as the workers' registry: a pending tool this registry does
    /// not know is treated as a non-idempotent write nobody is permitted to release.
    pub registry: Arc<ToolRegistry>,
    /// Who a run request's acting user and a decision's approver are, and whether the approver
    /// may approve runs. Must be the workers' directory, so a run is gated as the user it acts
    /// as.
    pub users: Arc<dyn UserDirectory>,
}

impl Coordinator {
    /// The gates over `store`, releasing only writes of `registry`'s tools, for the users
    /// `users` knows.
    pub fn with_users(
        store: Store,
        registry: Arc<ToolRegistry>,
        users: Arc<dyn UserDirectory>,
    ) -> Self {
        Coordinator {
            store,
            registry,
            users,
        }
    }

    /// [`Coordinator::with_users`] with the reference content store's users
    /// ([`countersign_service::tools::content_users`]) in the store's database.
    pub fn new(store: Store, registry: Arc<ToolRegistry>) -> Self {
        let users = countersign_service::tools::content_users(&store);
        Coordinator::with_users(store, registry, users)
    }
}

/// A failure to reach the facts a gate needs (PostgreSQL unreachable, a stored value
/// unreadable). Nothing was recorded or changed that the next delivery would not redo, so the
/// caller must not acknowledge the message: it requeues it and the gates run again.
///
/// Only [`CoordinatorError::code`] may reach an event, a reply or a dead-letter header; the
/// `Display` text is for the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinatorError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Users(#[from] DirectoryError),
    #[error(transparent)]
    Producers(#[from] ProducerError),
}

impl CoordinatorError {
    /// Whether the same message may well be gated when tried again: the store could not answer
    /// ([`StoreError::is_transient`]), the user directory's database failed, a producer grant
    /// could not be read for the same reasons. Anything else (a stored value that does not
    /// open, a name the registry refuses) would fail again the same way.
    pub fn is_transient(&self) -> bool {
        match self {
            CoordinatorError::Store(e) => e.is_transient(),
            CoordinatorError::Users(_) => true,
            CoordinatorError::Producers(ProducerError::Database(e)) => {
                countersign_store::classify(e).0 == countersign_core::Fault::Transient
            }
            CoordinatorError::Producers(_) => false,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            CoordinatorError::Store(e) => e.code(),
            CoordinatorError::Users(e) => e.code(),
            CoordinatorError::Producers(e) => e.code(),
        }
    }
}
