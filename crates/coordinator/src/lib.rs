//! The countersign coordinator: where run requests and approval decisions from any producer
//! are gated, recorded, and turned into what to dispatch and what to publish.
//!
//! It is transport-agnostic. A caller (the RabbitMQ consumer, later an HTTP API) hands it a raw
//! message body and the producer identity its transport has authenticated — for RabbitMQ the
//! `user_id` property, which the broker validates against the connection's user — and gets back
//! a verdict: the outcome code, whether to dead-letter, which segment to dispatch, the event
//! that announced the outcome (already in the store's outbox, written with the record it
//! announces), and the reply for `reply_to` (for an authenticated producer only). The caller
//! does the I/O the verdict names; the gates, the records, the run transitions and their
//! events happen here, against PostgreSQL through [`countersign_store::Store`], and who a user
//! is and whether they may approve is asked of a [`UserDirectory`] (in a deployment, the
//! content store's or the table directory: [`countersign_service::tools::tools`]).
//!
//! The gates of a decision, in order (see `Coordinator::gate_decision`): schema, producer,
//! replay (of the same run, card and body only; anything else naming the decision id is
//! `idempotency_conflict`), a run the approver may see, run waiting, same turn and card,
//! approver's access, configuration, four-eyes, the approver's tool permissions, and the one
//! transaction that records and releases. A run
//! request passes schema, producer, acting user and configuration before a run is created
//! (see `Coordinator::gate_run_request`).
//!
//! It must never:
//! - trust an identity a producer claims in a body (an `approver`, an `acting_user`) without
//!   the transport-authenticated producer and a [`producers`] grant that lets it assert that
//!   identity;
//! - change a run on a refused decision: a refusal is recorded (so a replay returns it) and
//!   audited, and the run row stays exactly as it was;
//! - execute anything: no tool runs here. Tools run in the worker, as the run's acting user,
//!   never as the approver — the approver's identity only decides whether the turn is released.

mod decisions;
pub mod producers;
mod requests;
pub mod service;
mod spans;
mod verdict;

use std::sync::Arc;

use countersign_core::{DirectoryError, ToolRegistry, UserDirectory};
use countersign_store::{Store, StoreError};

pub use producers::{ProducerError, ProducerGrant, ProducerKind};
pub use verdict::{DecisionCode, DecisionVerdict, Dispatch, RequestOutcome, RequestVerdict};

/// Re-exported so that a caller can name the segment of a [`Dispatch`] and the gated outcomes.
pub use countersign_store::{DecisionOutcome, Segment};

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

    /// Records that the wake-up of `dispatch` was published (after the broker confirmed it), so
    /// the reaper's lost-dispatch scan leaves the run alone. `false` when the run is no longer
    /// queued — a worker already claimed it, which is fine.
    pub async fn confirm_dispatch(&self, dispatch: &Dispatch) -> Result<bool, CoordinatorError> {
        Ok(self.store.mark_dispatched(dispatch.run_id).await?)
    }

    /// [`Coordinator::confirm_dispatch`] without a statement of its own: the process's relay
    /// records it with the other dispatches and event marks of the moment, in one statement.
    /// Until then, and if the process dies first, the run merely looks undispatched, and the
    /// reaper wakes it again.
    pub fn note_dispatch(&self, dispatch: &Dispatch) {
        self.store.note_dispatched(dispatch.run_id);
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
    pub fn code(&self) -> &'static str {
        match self {
            CoordinatorError::Store(e) => e.code(),
            CoordinatorError::Users(e) => e.code(),
            CoordinatorError::Producers(e) => e.code(),
        }
    }
}
