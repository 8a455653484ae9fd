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
    /// Where the card stands when its agent wants approvers as a team:
    /// "1 of 2 approvals — alice; waiting for one of marketing".
    pub quorum: Option<String>,
}

/// Which of the viewer's waiting runs an inbox lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum Waiting {
    /// Every run the viewer may see.
    #[default]
    Any,
    /// The runs waiting on the viewer: a card of an agent with one approver, or a card of a team
    /// agent whose groups (the viewer's own, a delegator's now, or the backup group it was
    /// escalated to) include the viewer's and that the viewer has not voted on.
    #[strum(serialize = "me")]
    OnMe,
    /// The cards of team agents that wait on one of the viewer's groups, voted on or not.
    #[strum(serialize = "groups")]
    OnMyGroups,
}

impl Waiting {
    /// The word for it in the inbox's query (`waiting=me`) and the SQL that lists it.
    fn as_str(self) -> &'static str {
        self.into()
    }
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
        self.inbox_waiting(viewer, approves, agent, Waiting::Any, limit, after)
            .await
    }

    /// [`Store::inbox`], of the runs `waiting` names only, each with its quorum state.
    pub async fn inbox_waiting(
        &self,
        viewer: &str,
        approves: &Approves,
        agent: Option<&str>,
        waiting: Waiting,
        limit: u32,
        after: Option<InboxCursor>,
    ) -> Result<InboxPage, StoreError> {
        let limit = i64::from(limit.clamp(1, 100));
        let (all_agents, agents) = agent_filter(approves);
        let rows = sqlx::query!(
            r#"SELECT id, agent, acting_user, suspension_seq AS "suspension_seq!",
                      turn_digest AS "turn_digest!", pending_tools,
                      approval_deadline AS "approval_deadline!", updated_at,
                      (SELECT count(*) FROM run_events e
                       WHERE e.run_id = runs.id AND e.kind = 'run.preview_moved') AS "bounces!",
                      NOT w.single AS "team!"
               FROM runs, card_waits_on(runs.id, runs.suspension_seq, runs.agent, $2) w
               WHERE status = 'waiting_for_approval'
                 AND ($1 OR agent = ANY($6) OR acting_user = $2)
                 AND ($7::text IS NULL OR agent = $7)
                 AND CASE $8::text
                         WHEN 'me' THEN w.single OR (w.ours AND NOT w.voted)
                         WHEN 'groups' THEN NOT w.single AND w.ours
                         ELSE true END
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
            waiting.as_str(),
        )
        .fetch_all(&self.pool)
        .await?;
        let mut runs = Vec::with_capacity(rows.len());
        for r in rows {
            let run_id = run_id(r.id)?;
            let quorum = self.quorum_of(run_id, r.team).await?;
            runs.push(WaitingRun {
                run_id,
                agent: r.agent,
                acting_user: r.acting_user,
                suspension_seq: seq(r.suspension_seq)?,
                turn_digest: digest(&r.turn_digest)?,
                pending_tools: r.pending_tools,
                approval_deadline: r.approval_deadline,
                waiting_since: r.updated_at,
                bounces: r.bounces,
                quorum,
            });
        }
        Ok(InboxPage::of(runs, limit as usize))
    }
}

impl Store {
    /// Where the quorum of `run_id`'s card stands, in words, when a team decides it (`team`).
    async fn quorum_of(&self, run_id: RunId, team: bool) -> Result<Option<String>, StoreError> {
        if !team {
            return Ok(None);
        }
        Ok(self.card_standing(run_id).await?.map(|s| s.summary()))
    }
}

/// Whether `approves` covers every agent, and otherwise which.
fn agent_filter(approves: &Approves) -> (bool, Vec<String>) {
    match approves {
        Approves::Nothing => (false, Vec::new()),
        Approves::Every => (true, Vec::new()),
        Approves::Agents(names) => (false, names.iter().cloned().collect()),
    }
}

impl InboxPage {
    /// The page of the first `limit` of `runs` (read one beyond the page, to know whether
    /// another follows).
    fn of(mut runs: Vec<WaitingRun>, limit: usize) -> InboxPage {
        let next = if runs.len() > limit {
            runs.truncate(limit);
            runs.last().map(|r| InboxCursor {
                deadline: r.approval_deadline,
                run_id: r.run_id.as_uuid(),
            })
        } else {
            None
        };
        InboxPage { runs, next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_waiting_filter_has_the_word_it_always_had_and_is_parsed_from_it() {
        let words = [
            (Waiting::Any, "any"),
            (Waiting::OnMe, "me"),
            (Waiting::OnMyGroups, "groups"),
        ];
        for (waiting, word) in words {
            assert_eq!(waiting.as_str(), word, "{waiting:?}");
            assert_eq!(word.parse::<Waiting>(), Ok(waiting));
        }
        assert!("on_me".parse::<Waiting>().is_err());
    }
}
