//! The inbox: the runs waiting for a decision that a viewer may decide on, without content,
//! one page at a time.
//!
//! Seeing follows deciding: a viewer is shown the runs of the agents its directory lets it
//! approve, and its own (the runs acting as it). Every surface lists the inbox through this one
//! query, and says only who the viewer is.

use chrono::{DateTime, Utc};
use countersign_core::{Approves, RunId, SuspensionSeq, TurnDigest};
use uuid::Uuid;

use crate::runs::{digest, run_id, seq};
use crate::{Store, StoreError};

/// A run waiting for a decision, as the inbox lists it (no content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingRun {
    pub run_id: RunId,
    pub agent: String,
    pub acting_user: String,
    pub suspension_seq: SuspensionSeq,
    pub turn_digest: TurnDigest,
    pub pending_tools: Vec<String>,
    pub approval_deadline: DateTime<Utc>,
    /// When the run paused on this card.
    pub waiting_since: DateTime<Utc>,
    /// How often an approval of the run found a preview moved and brought it back.
    pub bounces: i64,
}

/// Where a page of the inbox starts: after this run, in inbox order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxCursor {
    pub deadline: DateTime<Utc>,
    pub run_id: Uuid,
}

/// One page of the inbox ([`Store::inbox`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxPage {
    pub runs: Vec<WaitingRun>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<InboxCursor>,
}

impl Store {
    /// One page of at most `limit` (1 to 100) runs waiting for a decision that `viewer` may
    /// see — those of the agents `approves` covers, and those acting as `viewer`; of `agent`
    /// only, when given — soonest deadline first, starting after `after`.
    pub async fn inbox(
        &self,
        viewer: &str,
        approves: &Approves,
        agent: Option<&str>,
        limit: u32,
        after: Option<InboxCursor>,
    ) -> Result<InboxPage, StoreError> {
        let limit = i64::from(limit.clamp(1, 100));
        let (all_agents, agents): (bool, Vec<String>) = match approves {
            Approves::Nothing => (false, Vec::new()),
            Approves::Every => (true, Vec::new()),
            Approves::Agents(names) => (false, names.iter().cloned().collect()),
        };
        let rows = sqlx::query!(
            r#"SELECT id, agent, acting_user, suspension_seq AS "suspension_seq!",
                      turn_digest AS "turn_digest!", pending_tools,
                      approval_deadline AS "approval_deadline!", updated_at,
                      (SELECT count(*) FROM run_events e
                       WHERE e.run_id = runs.id AND e.kind = 'run.preview_moved') AS "bounces!"
               FROM runs
               WHERE status = 'waiting_for_approval'
                 AND ($1 OR agent = ANY($6) OR acting_user = $2)
                 AND ($7::text IS NULL OR agent = $7)
                 AND ($3::timestamptz IS NULL OR (approval_deadline, id) > ($3, $4))
               ORDER BY approval_deadline, id
               LIMIT $5"#,
            all_agents,
            viewer,
            after.map(|c| c.deadline),
            after.map(|c| c.run_id),
            limit + 1,
            &agents[..],
            agent,
        )
        .fetch_all(&self.pool)
        .await?;
        let mut runs = rows
            .into_iter()
            .map(|r| {
                Ok(WaitingRun {
                    run_id: run_id(r.id)?,
                    agent: r.agent,
                    acting_user: r.acting_user,
                    suspension_seq: seq(r.suspension_seq)?,
                    turn_digest: digest(&r.turn_digest)?,
                    pending_tools: r.pending_tools,
                    approval_deadline: r.approval_deadline,
                    waiting_since: r.updated_at,
                    bounces: r.bounces,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let next = if runs.len() > limit as usize {
            runs.truncate(limit as usize);
            runs.last().map(|r| InboxCursor {
                deadline: r.approval_deadline,
                run_id: r.run_id.as_uuid(),
            })
        } else {
            None
        };
        Ok(InboxPage { runs, next })
    }
}
