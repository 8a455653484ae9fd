#![doc = include_str!("../README.md")]

mod agents;
mod approvers;
mod decisions;
mod directory;
mod error;
mod events;
mod fence;
mod inbox;
mod journal;
mod leases;
mod observe;
pub mod outbox;
mod policies;
mod reaper;
mod rotation;
mod runs;
mod settlements;
mod tool_identities;
mod webhooks;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use countersign_crypto::Keyring;
use sqlx::PgPool;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

pub use agents::{AgentConfig, StoredAgent};
pub use approvers::{
    is_group_name, AgentApprovers, ApproverGroup, CastVote, Delegation, VoteFacts, VoteRecord,
};
pub use decisions::decision_event;
pub use decisions::{
    DecidedRun, DecisionFacts, DecisionOutcome, DecisionRecord, NewDecision, PolicyMark, Replay,
};
pub use directory::{DirectoryUser, TableUsers};
pub use error::{classify, StoreError};
pub use events::{NewEvent, RunEvent};
pub use fence::{hook_error, FencedWrite, PREVIEW_LOCK_TIMEOUT};
pub use inbox::{InboxCursor, InboxPage, Waiting, WaitingRun};
pub use leases::{Claim, ClaimedInputs, Renewal, SealedDecision, SentCall};
pub use observe::Backlog;
pub use outbox::{EventPublisher, HandedOff, OutboxEvent, RelayReport};
pub use policies::{
    DecidedCard, DueCard, NewGrant, PolicyEvaluation, PolicyGrant, RecordedEvaluation,
};
pub use reaper::{ExpiredLease, ReapOutcome, WaitingDeadline};
pub use rotation::{ColumnRotation, RotationReport};
pub use runs::run_accepted;
pub use runs::{
    CreatedRun, Lease, NewRun, RunCounters, RunRecord, RunStatus, SegmentKind, SentCallRef,
    StoredRequest, TerminationReason, LOCAL_PRODUCER,
};
pub use settlements::Settlement;
pub use tool_identities::{Listing, PendingChange, Pinned, ToolIdentity};
pub use webhooks::{AttemptOutcome, DeliveryRecord, DueDelivery, WebhookEndpoint};

/// The migrations of the engine's schema (`migrations/`), embedded at build time.
///
/// Other schemas keep migrations of their own in the same `_sqlx_migrations` table (the
/// reference content store's, `countersign_content::MIGRATOR`), so this migrator ignores the
/// versions it does not know instead of refusing a database that has them. Versions are
/// unique across the migrators: the engine numbers from 1 (0002 is the content store's,
/// which once shipped here), the content store from 10001.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate::Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("../../migrations")
};

/// The handle every service uses: a connection pool and the keyring that seals what is stored.
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    /// When set, how many of the pool's connections approved turns' transactions
    /// ([`Store::begin_turn`], [`Store::fenced_write`]) hold at most at once: such a
    /// transaction can wait on a colleague's lock on the content for as long as the colleague
    /// holds it, and must never hold every connection the other statements need.
    turns: Option<Arc<Semaphore>>,
    keyring: Arc<Keyring>,
    /// Woken after a commit that wrote outbox rows; shared by every clone, so the relay of
    /// this process hears every transition made through it.
    relay_kick: Arc<Notify>,
    /// Rows committed through this handle for the relay, and its marks not yet written.
    handoff: Arc<std::sync::Mutex<outbox::Handoff>>,
    /// Whether the statements of this process keep failing; shared by every clone.
    vitals: Vitals,
    /// The statement that opens an approved turn's transaction (`BEGIN` with the turn's own
    /// limits, see [`Store::with_turn_begin`]); a plain `BEGIN` when unset.
    turn_begin: Option<Arc<str>>,
    /// How long one call of a service's loop may wait for the database ([`Store::within`]).
    deadline: Duration,
}

impl Store {
    pub fn new(pool: PgPool, keyring: Arc<Keyring>) -> Store {
        Store {
            pool,
            turns: None,
            keyring,
            relay_kick: Arc::new(Notify::new()),
            handoff: Arc::default(),
            vitals: Vitals::default(),
            turn_begin: None,
            deadline: DEFAULT_DEADLINE,
        }
    }

    /// This store with its loops' calls bounded by `deadline` ([`Store::within`]).
    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Store {
        self.deadline = deadline;
        self
    }

    /// The deadline of one call of a loop ([`Store::with_deadline`]).
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// `call` (a heartbeat's renewal, a claim, a relay step), failed [`StoreError::TimedOut`] when
    /// the database has not answered it within the store's deadline; what it came to is recorded
    /// in the [`Vitals`]. The statement in flight is abandoned with the future: its connection
    /// goes back to the pool, which closes it unless it answers its check at once.
    pub async fn within<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let outcome = tokio::time::timeout(self.deadline, call)
            .await
            .unwrap_or(Err(StoreError::TimedOut(self.deadline)));
        self.vitals.record(&outcome);
        outcome
    }

    /// Whether this process's own statements keep failing: what its loops (heartbeats, claims,
    /// the relay, the gates, the reaper's scans) observed last.
    pub fn vitals(&self) -> &Vitals {
        &self.vitals
    }

    /// This store with approved turns' transactions opened by `begin` (`BEGIN` and the turn's
    /// own `SET LOCAL` limits in one simple query): a turn may wait on a colleague's lock on the
    /// content longer than the session lets any other statement wait.
    #[must_use]
    pub fn with_turn_begin(mut self, begin: String) -> Store {
        self.turn_begin = Some(begin.into());
        self
    }

    /// Opens an approved turn's transaction ([`Store::with_turn_begin`]).
    async fn begin_turn_transaction(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        match &self.turn_begin {
            Some(begin) => self.pool.begin_with(begin.to_string()).await,
            None => self.pool.begin().await,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// This store with approved turns' transactions holding at most `connections` of the
    /// pool's at once (at least one); the others wait for one of them to end.
    #[must_use]
    pub fn with_turn_limit(mut self, connections: u32) -> Store {
        let permits = usize::try_from(connections.max(1)).unwrap_or(usize::MAX);
        self.turns = Some(Arc::new(Semaphore::new(permits)));
        self
    }

    /// A turn's right to a connection, when turns are limited: held for the transaction's life.
    async fn turn_permit(&self) -> Option<OwnedSemaphorePermit> {
        let turns = self.turns.clone()?;
        // The semaphore is never closed.
        turns.acquire_owned().await.ok()
    }

    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The keyring is left out on purpose: it holds key material.
        f.debug_struct("Store")
            .field("pool_size", &self.pool.size())
            .field(
                "turn_permits_free",
                &self.turns.as_ref().map(|t| t.available_permits()),
            )
            .finish_non_exhaustive()
    }
}

/// Whether the statements of this process keep failing, as its loops observe them: a statement
/// the database could not answer (a lost or silent connection, a timeout, a conflict; see
/// [`StoreError::is_transient`]) counts as failed, any answer — a refusal too — as answered.
/// [`Vitals::FAILING_AFTER`] failures in a row, and the process's `/readyz` says it is not ready
/// until one is answered again. Cheap to clone; every clone shares the count.
#[derive(Debug, Clone, Default)]
pub struct Vitals(Arc<std::sync::atomic::AtomicU32>);

impl Vitals {
    /// Failures in a row that make a process unready.
    pub const FAILING_AFTER: u32 = 3;

    /// Records what one statement (or one call of several) came to.
    pub fn record<T>(&self, outcome: &Result<T, StoreError>) {
        match outcome {
            Err(e) if e.is_transient() => self.failed(),
            _ => self.answered(),
        }
    }

    /// A call the database did not answer (within its deadline, or at all).
    pub fn failed(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A call the database answered.
    pub fn answered(&self) {
        self.0.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the last [`Vitals::FAILING_AFTER`] calls or more all failed.
    pub fn failing(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed) >= Self::FAILING_AFTER
    }
}

/// The deadline of a loop's call when none is set: the session's `statement_timeout` is longer.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// A duration as whole milliseconds for `now() + $n * interval '1 millisecond'`, capped at
/// ten years so an absurd configuration cannot overflow the database's timestamp arithmetic.
fn millis(d: Duration) -> i64 {
    const TEN_YEARS_MS: u128 = 10 * 366 * 24 * 3600 * 1000;
    i64::try_from(d.as_millis().min(TEN_YEARS_MS)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_transient_failures_in_a_row_are_failing_and_any_answer_ends_it() {
        let vitals = Vitals::default();
        let unavailable =
            || -> Result<(), StoreError> { Err(StoreError::Database(sqlx::Error::PoolTimedOut)) };
        vitals.record(&unavailable());
        vitals.failed();
        assert!(!vitals.failing(), "two failures");
        vitals.record(&unavailable());
        assert!(vitals.failing(), "three in a row");
        // A refusal is an answer: the database is there.
        vitals.record(&Err::<(), _>(StoreError::FenceLost));
        assert!(!vitals.failing());
        vitals.record(&unavailable());
        vitals.record(&Err::<(), _>(StoreError::TimedOut(Duration::from_secs(1))));
        vitals.record(&Ok(()));
        vitals.record(&unavailable());
        assert!(!vitals.failing(), "not in a row");
    }
}
