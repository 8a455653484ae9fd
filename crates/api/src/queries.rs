//! Who may see which run, and the page of the inbox a viewer is shown.
//!
//! Seeing follows deciding: a waiting run and its card are shown to whoever the coordinator's
//! access gate would let decide on it — a user its directory lets approve runs (an
//! administrator, or a holder of the approve grant for its agent), or the run's own acting user. A run's
//! status (codes only, no content) is also shown to a producer that may start runs as its
//! acting user, so a service that submitted a run can follow it. Anything else is answered as
//! if the run did not exist.
//!
//! The inbox query lives here rather than in the store because it pages by the viewer's
//! access, which is this surface's rule; it reads only columns without content.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use countersign_coordinator::producers::{self, ProducerKind};
use countersign_core::{Approver, Approves, RunId, SuspensionSeq, TurnDigest, UserDirectory};
use countersign_store::{RunRecord, StoreError};
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

/// Where a page of the inbox starts: after this run, in inbox order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    deadline: DateTime<Utc>,
    run_id: Uuid,
}

impl Cursor {
    /// The opaque form a client sends back.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!(
            "{}|{}",
            self.deadline.timestamp_micros(),
            self.run_id
        ))
    }

    pub fn decode(s: &str) -> Option<Cursor> {
        let bytes = URL_SAFE_NO_PAD.decode(s).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let (micros, id) = text.split_once('|')?;
        Some(Cursor {
            deadline: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
            run_id: Uuid::parse_str(id).ok()?,
        })
    }
}

/// A waiting run as the inbox lists it: no content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEntry {
    pub run_id: RunId,
    pub agent: String,
    pub acting_user: String,
    pub suspension_seq: SuspensionSeq,
    pub turn_digest: TurnDigest,
    pub pending_tools: Vec<String>,
    pub approval_deadline: DateTime<Utc>,
    /// When the run paused on this card.
    pub waiting_since: DateTime<Utc>,
}

/// One page of the runs waiting for a decision that `access` may see, soonest deadline first,
/// and the cursor of the next page when there is one.
pub async fn inbox_page(
    pool: &PgPool,
    access: &Access,
    limit: u32,
    after: Option<Cursor>,
) -> Result<(Vec<InboxEntry>, Option<Cursor>), Problem> {
    if !access.known {
        return Ok((Vec::new(), None));
    }
    let limit = i64::from(limit.clamp(1, 100));
    let (all_agents, agents): (bool, Vec<String>) = match &access.approves {
        Approves::Nothing => (false, Vec::new()),
        Approves::Every => (true, Vec::new()),
        Approves::Agents(names) => (false, names.iter().cloned().collect()),
    };
    let rows = sqlx::query!(
        r#"SELECT id, agent, acting_user, suspension_seq AS "suspension_seq!",
                  turn_digest AS "turn_digest!", pending_tools,
                  approval_deadline AS "approval_deadline!", updated_at
           FROM runs
           WHERE status = 'waiting_for_approval'
             AND ($1 OR agent = ANY($6) OR acting_user = $2)
             AND ($3::timestamptz IS NULL OR (approval_deadline, id) > ($3, $4))
           ORDER BY approval_deadline, id
           LIMIT $5"#,
        all_agents,
        access.user,
        after.map(|c| c.deadline),
        after.map(|c| c.run_id),
        limit + 1,
        &agents[..],
    )
    .fetch_all(pool)
    .await
    .map_err(|e| unavailable("inbox", "database_error", &e))?;
    let mut entries = Vec::with_capacity(rows.len());
    for r in rows {
        let unreadable = |what: &'static str| {
            let e = StoreError::Unreadable { what };
            unavailable("inbox", e.code(), &e)
        };
        entries.push(InboxEntry {
            run_id: RunId::from_uuid(r.id).map_err(|_| unreadable("runs.id"))?,
            agent: r.agent,
            acting_user: r.acting_user,
            suspension_seq: SuspensionSeq::from_i32(r.suspension_seq)
                .map_err(|_| unreadable("runs.suspension_seq"))?,
            turn_digest: TurnDigest::parse(&r.turn_digest)
                .map_err(|_| unreadable("runs.turn_digest"))?,
            pending_tools: r.pending_tools,
            approval_deadline: r.approval_deadline,
            waiting_since: r.updated_at,
        });
    }
    let next = if entries.len() > limit as usize {
        entries.truncate(limit as usize);
        entries.last().map(|e| Cursor {
            deadline: e.approval_deadline,
            run_id: e.run_id.as_uuid(),
        })
    } else {
        None
    };
    Ok((entries, next))
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
        let cursor = Cursor {
            deadline: DateTime::from_timestamp_micros(1_790_000_000_123_456).unwrap(),
            run_id: Uuid::now_v7(),
        };
        assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        for bad in ["", "x", "bm90IGEgY3Vyc29y", "MTIzfG5vdC1hLXV1aWQ"] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
