//! Who may see which run, and the page of the inbox a viewer is shown.
//!
//! Seeing follows deciding: a waiting run and its card are shown to whoever the coordinator's
//! access gate would let decide on it — a user its directory lets approve runs (an
//! administrator, or a holder of the approve grant for its agent), or the run's own acting user. A run's
//! status (codes only, no content) is also shown to a producer that may start runs as its
//! acting user, so a service that submitted a run can follow it. Anything else is answered as
//! if the run did not exist.
//!
//! The inbox page itself is the store's ([`countersign_store::Store::inbox`]); this surface
//! says whose, and writes its cursor.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::DateTime;
use countersign_coordinator::producers::{self, ProducerKind};
use countersign_core::{Approver, Approves, RunId, UserDirectory};
use countersign_store::{InboxCursor, InboxPage, RunRecord, Store, Waiting};
use sqlx::PgPool;
use uuid::Uuid;

use crate::auth::Caller;
use crate::problem::{unavailable, Problem, ProblemCode};

/// What a caller may see of runs, resolved once per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub user: String,
    /// Whose waiting runs the directory lets the caller approve (besides their own).
    pub approves: Approves,
    /// The caller is a user the directory knows (and has not disabled).
    pub known: bool,
}

impl Access {
    /// What `caller` may see, as the coordinator's directory `users` answers.
    pub async fn of(users: &dyn UserDirectory, caller: &Caller) -> Result<Access, Problem> {
        let approver = users
            .approver(&caller.user)
            .await
            .map_err(|e| unavailable("users", e.code(), &e))?;
        Ok(Access {
            user: caller.user.clone(),
            approves: approver
                .as_ref()
                .map_or(Approves::Nothing, Approver::approves),
            known: approver.is_some(),
        })
    }

    /// Whether the caller may look at `run`'s card and decide on it (the access gate's rule).
    pub fn may_decide(&self, run: &RunRecord) -> bool {
        self.known && (self.approves.covers(&run.agent) || run.acting_user == self.user)
    }
}

/// Whether `caller` may see `run`'s status: it may decide on it, or its producer may start
/// runs as the run's acting user.
pub async fn may_follow(
    pool: &PgPool,
    caller: &Caller,
    access: &Access,
    run: &RunRecord,
) -> Result<bool, Problem> {
    if access.may_decide(run) {
        return Ok(true);
    }
    producers::may_assert(
        pool,
        &caller.producer,
        ProducerKind::ActingUser,
        &run.acting_user,
    )
    .await
    .map_err(|e| unavailable("producers", e.code(), &e))
}

/// The opaque form of a cursor a client sends back.
pub fn encode_cursor(c: &InboxCursor) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}|{}", c.deadline.timestamp_micros(), c.run_id))
}

/// The cursor a client sent back; `None` for anything [`encode_cursor`] did not write.
pub fn decode_cursor(s: &str) -> Option<InboxCursor> {
    let bytes = URL_SAFE_NO_PAD.decode(s).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (micros, id) = text.split_once('|')?;
    Some(InboxCursor {
        deadline: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
        run_id: Uuid::parse_str(id).ok()?,
    })
}

/// One page of the runs waiting for a decision that `access` may see (of `agent` only, when
/// given), soonest deadline first,
/// and the cursor of the next page when there is one.
pub async fn inbox_page(
    store: &Store,
    access: &Access,
    agent: Option<&str>,
    waiting: Waiting,
    limit: u32,
    after: Option<InboxCursor>,
) -> Result<InboxPage, Problem> {
    if !access.known {
        return Ok(InboxPage {
            runs: Vec::new(),
            next: None,
        });
    }
    store
        .inbox_waiting(&access.user, &access.approves, agent, waiting, limit, after)
        .await
        .map_err(|e| unavailable("inbox", e.code(), &e))
}

/// What [`visible_run`] can answer.
pub const VISIBLE_RUN_PROBLEMS: [ProblemCode; 2] =
    [ProblemCode::NotFound, ProblemCode::Unavailable];

/// A run the caller may follow, or `not_found` (also for one that exists but is not theirs).
pub async fn visible_run(
    state: &crate::AppState,
    caller: &Caller,
    run_id: RunId,
) -> Result<(RunRecord, Access), Problem> {
    let pool = state.coordinator.store.pool();
    let access = Access::of(state.coordinator.users.as_ref(), caller).await?;
    let run = state
        .coordinator
        .store
        .run(run_id)
        .await
        .map_err(|e| unavailable("run", e.code(), &e))?;
    match run {
        Some(run) if may_follow(pool, caller, &access, &run).await? => Ok((run, access)),
        _ => Err(Problem::new(ProblemCode::NotFound).with_run(run_id.as_uuid())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_it_was_written_and_garbage_reads_as_none() {
        let cursor = InboxCursor {
            deadline: DateTime::from_timestamp_micros(1_790_000_000_123_456).unwrap(),
            run_id: Uuid::now_v7(),
        };
        assert_eq!(decode_cursor(&encode_cursor(&cursor)), Some(cursor));
        for bad in ["", "x", "bm90IGEgY3Vyc29y", "MTIzfG5vdC1hLXV1aWQ"] {
            assert_eq!(decode_cursor(bad), None, "{bad}");
        }
    }
}
