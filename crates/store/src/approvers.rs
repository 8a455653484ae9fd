//! Approvers as a team (migration 0070): groups of approvers and delegations in the directory,
//! who must approve an agent's cards, the votes of a card and its reminders and escalation.
//!
//! Groups and delegations are managed like grants, and every change is audited in the same
//! statement that makes it (`directory_audit`, with its actor), so no change goes unrecorded.
//!
//! A vote is the coordinator's accepted decision on an agent that wants a quorum. It is
//! recorded under the run's row lock, with the card it names checked again, and tallied there
//! ([`countersign_core::quorum::tally`]): the turn is released in the same transaction only
//! when the votes fill every requirement — otherwise the decision is recorded
//! `approval_recorded` (or `denial_recorded`) and announced `card.approval_recorded`. Votes name
//! their card's suspension, so a new card starts with none: a bounce dismisses them.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::quorum::{self, Quorum, Requirement, Standing, Tally};
use countersign_core::{DataClass, DecisionMessage, EventName, RunId};
use serde_json::json;
use uuid::Uuid;

use crate::decisions::{DecisionOutcome, DecisionRecord, NewDecision};
use crate::{Store, StoreError};

/// A group of approvers with its members, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApproverGroup {
    pub name: String,
    pub members: Vec<String>,
}

/// "`delegator`'s cards go to `delegate` from `starts_at` until `ends_at`".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegation {
    pub id: Uuid,
    pub delegator: String,
    pub delegate: String,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
}

/// Who must approve an agent's cards, and when its cards are reminded and escalated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentApprovers {
    pub quorum: Quorum,
    pub remind_after: Option<Duration>,
    pub escalate_after: Option<Duration>,
    /// The group an unanswered card is escalated to; set with `escalate_after`.
    pub backup_group: Option<String>,
}

/// What the gates of a vote read beside the decision's facts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VoteFacts {
    /// `None`: the agent wants one approver's decision, as without groups.
    pub approvers: Option<AgentApprovers>,
    /// The groups of the voter.
    pub groups: BTreeSet<String>,
    /// Who delegated their cards to the voter, now (database clock), with their groups.
    pub delegators: Vec<(String, BTreeSet<String>)>,
    /// The backup group the card was escalated to, if it was.
    pub escalated_to: Option<String>,
}

/// A vote to record with its decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CastVote {
    /// The groups it counts for.
    pub groups: BTreeSet<String>,
    /// The delegators it is cast for (beside the voter's own groups).
    pub on_behalf_of: Vec<String>,
}

/// What became of [`Store::record_vote`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VoteRecord {
    /// Recorded; released or still waiting, as the outcome says.
    Recorded(DecisionRecord, Option<f64>),
    /// Refused without a change: record this outcome as a refusal.
    Refused(DecisionOutcome),
    /// The card is no longer the run's current one.
    TransitionLost,
}

fn requirements(value: serde_json::Value) -> Result<Vec<Requirement>, StoreError> {
    serde_json::from_value(value)
        .map_err(|_| StoreError::unreadable("agent_approvers.requirements"))
}

/// Whether `name` may name a group: a letter or digit, then up to 127 letters, digits, `_`,
/// `.` and `-` (the table's check says the same).
pub fn is_group_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn secs(s: Option<i64>) -> Option<Duration> {
    s.and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs)
}

impl Store {
    /// Creates group `name`; false when it existed. Audited with `actor`.
    pub async fn create_group(&self, actor: &str, name: &str) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"WITH g AS (INSERT INTO approver_groups (name) VALUES ($2)
                          ON CONFLICT DO NOTHING RETURNING name)
               INSERT INTO directory_audit (actor, action, subject)
               SELECT $1, 'group_created', jsonb_build_object('group', name) FROM g"#,
            actor,
            name,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Adds `member` to `group`; false when there is no such group. Adding twice is one
    /// membership (audited once).
    pub async fn add_member(
        &self,
        actor: &str,
        group: &str,
        member: &str,
    ) -> Result<bool, StoreError> {
        let r = sqlx::query!(
            r#"WITH m AS (INSERT INTO approver_group_members (group_name, member)
                          SELECT name, $3 FROM approver_groups WHERE name = $2
                          ON CONFLICT DO NOTHING RETURNING group_name, member),
                    a AS (INSERT INTO directory_audit (actor, action, subject)
                          SELECT $1, 'member_added',
                                 jsonb_build_object('group', group_name, 'member', member)
                          FROM m)
               SELECT EXISTS (SELECT 1 FROM approver_groups WHERE name = $2) AS "exists!""#,
            actor,
            group,
            member,
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(r.exists)
    }

    /// Removes `member` from `group`; false when they were not in it.
    pub async fn remove_member(
        &self,
        actor: &str,
        group: &str,
        member: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"WITH m AS (DELETE FROM approver_group_members WHERE group_name = $2 AND member = $3
                          RETURNING group_name, member)
               INSERT INTO directory_audit (actor, action, subject)
               SELECT $1, 'member_removed',
                      jsonb_build_object('group', group_name, 'member', member)
               FROM m"#,
            actor,
            group,
            member,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Every group with its members, by name.
    pub async fn groups(&self) -> Result<Vec<ApproverGroup>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT g.name,
                      coalesce(array_agg(m.member ORDER BY m.member)
                               FILTER (WHERE m.member IS NOT NULL), '{}') AS "members!"
               FROM approver_groups g
               LEFT JOIN approver_group_members m ON m.group_name = g.name
               GROUP BY g.name ORDER BY g.name"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| ApproverGroup {
                name: r.name,
                members: r.members,
            })
            .collect())
    }

    /// Records "`delegator`'s cards go to `delegate` from `starts_at` (`None`: now, by the
    /// database clock) until `ends_at`", audited with `actor` and both names.
    pub async fn delegate(
        &self,
        actor: &str,
        delegator: &str,
        delegate: &str,
        starts_at: Option<DateTime<Utc>>,
        ends_at: DateTime<Utc>,
    ) -> Result<Uuid, StoreError> {
        let id = Uuid::now_v7();
        sqlx::query!(
            r#"WITH d AS (INSERT INTO approver_delegations (id, delegator, delegate, starts_at, ends_at)
                          VALUES ($2, $3, $4, coalesce($5, now()), $6)
                          RETURNING *)
               INSERT INTO directory_audit (actor, action, subject)
               SELECT $1, 'delegation_created',
                      jsonb_build_object('id', id, 'delegator', delegator, 'delegate', delegate,
                                         'starts_at', starts_at, 'ends_at', ends_at)
               FROM d"#,
            actor,
            id,
            delegator,
            delegate,
            starts_at,
            ends_at,
        )
        .execute(&self.pool)
        .await?;
        Ok(id)
    }

    /// Takes a delegation back; false when there was none.
    pub async fn remove_delegation(&self, actor: &str, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"WITH d AS (DELETE FROM approver_delegations WHERE id = $2 RETURNING *)
               INSERT INTO directory_audit (actor, action, subject)
               SELECT $1, 'delegation_removed',
                      jsonb_build_object('id', id, 'delegator', delegator, 'delegate', delegate)
               FROM d"#,
            actor,
            id,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Every delegation, by start.
    pub async fn delegations(&self) -> Result<Vec<Delegation>, StoreError> {
        Ok(sqlx::query_as!(
            Delegation,
            "SELECT id, delegator, delegate, starts_at, ends_at FROM approver_delegations
             ORDER BY starts_at, id"
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Sets who must approve `agent`'s cards; `None` takes it back (one approver decides).
    pub async fn put_agent_approvers(
        &self,
        agent: &str,
        approvers: Option<&AgentApprovers>,
    ) -> Result<(), StoreError> {
        let Some(a) = approvers else {
            sqlx::query!("DELETE FROM agent_approvers WHERE agent = $1", agent)
                .execute(&self.pool)
                .await?;
            return Ok(());
        };
        let whole =
            |d: Option<Duration>| d.map(|d| i64::try_from(d.as_secs().max(1)).unwrap_or(i64::MAX));
        sqlx::query!(
            r#"INSERT INTO agent_approvers (agent, requirements, denials_to_end,
                                           remind_after_seconds, escalate_after_seconds,
                                           backup_group)
               VALUES ($1, $2, $3, $4, $5, $6)
               ON CONFLICT (agent) DO UPDATE SET
                   requirements = excluded.requirements,
                   denials_to_end = excluded.denials_to_end,
                   remind_after_seconds = excluded.remind_after_seconds,
                   escalate_after_seconds = excluded.escalate_after_seconds,
                   backup_group = excluded.backup_group, updated_at = now()"#,
            agent,
            json!(a.quorum.requirements),
            i32::try_from(a.quorum.denials_to_end.max(1)).unwrap_or(1),
            whole(a.remind_after),
            whole(a.escalate_after),
            a.backup_group,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Who must approve `agent`'s cards; `None` when one approver decides.
    pub async fn agent_approvers(&self, agent: &str) -> Result<Option<AgentApprovers>, StoreError> {
        let row = sqlx::query!(
            r#"SELECT requirements, denials_to_end, remind_after_seconds, escalate_after_seconds,
                      backup_group
               FROM agent_approvers WHERE agent = $1"#,
            agent
        )
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(AgentApprovers {
                quorum: Quorum {
                    requirements: requirements(r.requirements)?,
                    denials_to_end: u32::try_from(r.denials_to_end).unwrap_or(1),
                },
                remind_after: secs(r.remind_after_seconds),
                escalate_after: secs(r.escalate_after_seconds),
                backup_group: r.backup_group,
            })
        })
        .transpose()
    }

    /// Who must approve card `seq` of `run_id`: `agent`'s quorum refined by the routes
    /// policies gave the card ([`Quorum::refined`]); `None` when neither asks for more than one
    /// approver.
    pub async fn card_approvers(
        &self,
        agent: &str,
        run_id: RunId,
        seq: i32,
    ) -> Result<Option<AgentApprovers>, StoreError> {
        let approvers = self.agent_approvers(agent).await?;
        let routes = self.card_routes(run_id, seq).await?;
        if routes.is_empty() {
            return Ok(approvers);
        }
        let approvers = approvers.unwrap_or_default();
        Ok(Some(AgentApprovers {
            quorum: approvers.quorum.refined(&routes),
            ..approvers
        }))
    }

    /// Records that `policy` routed card `seq` of `run_id` to `requirements` (once per policy
    /// and card).
    pub async fn route_card(
        &self,
        run_id: RunId,
        seq: i32,
        policy: &str,
        requirements: &[Requirement],
    ) -> Result<(), StoreError> {
        let requirements = serde_json::to_value(requirements)
            .map_err(|_| StoreError::unreadable("card_routes.requirements"))?;
        sqlx::query!(
            "INSERT INTO card_routes (run_id, suspension_seq, policy, requirements)
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            run_id.as_uuid(),
            seq,
            policy,
            requirements,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The union of the routes policies gave card `seq` of `run_id`: each group at its largest
    /// count (empty: none routed it).
    pub async fn card_routes(
        &self,
        run_id: RunId,
        seq: i32,
    ) -> Result<Vec<Requirement>, StoreError> {
        let rows = sqlx::query_scalar!(
            "SELECT requirements FROM card_routes
             WHERE run_id = $1 AND suspension_seq = $2 ORDER BY policy",
            run_id.as_uuid(),
            seq,
        )
        .fetch_all(&self.pool)
        .await?;
        let mut merged = Quorum::default();
        for row in rows {
            let routed: Vec<Requirement> = serde_json::from_value(row)
                .map_err(|_| StoreError::unreadable("card_routes.requirements"))?;
            merged = merged.refined(&routed);
        }
        Ok(merged.requirements)
    }

    /// What the gates of `voter`'s decision on card `seq` of `run_id` (of `agent`) read
    /// beside the decision's facts.
    pub async fn vote_facts(
        &self,
        agent: &str,
        voter: &str,
        run_id: RunId,
        seq: i32,
    ) -> Result<VoteFacts, StoreError> {
        let approvers = self.card_approvers(agent, run_id, seq).await?;
        let r = sqlx::query!(
            r#"SELECT coalesce((SELECT array_agg(group_name) FROM approver_group_members
                                WHERE member = $1), '{}') AS "groups!",
                      (SELECT backup_group FROM card_alerts
                       WHERE run_id = $2 AND suspension_seq = $3 AND kind = 'escalated')
                          AS "escalated_to?""#,
            voter,
            run_id.as_uuid(),
            seq,
        )
        .fetch_one(&self.pool)
        .await?;
        let delegators = sqlx::query!(
            r#"SELECT d.delegator,
                      coalesce(array_agg(m.group_name) FILTER (WHERE m.group_name IS NOT NULL),
                               '{}') AS "groups!"
               FROM approver_delegations d
               LEFT JOIN approver_group_members m ON m.member = d.delegator
               WHERE d.delegate = $1 AND d.starts_at <= now() AND now() < d.ends_at
               GROUP BY d.delegator ORDER BY d.delegator"#,
            voter,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(VoteFacts {
            approvers,
            groups: r.groups.into_iter().collect(),
            delegators: delegators
                .into_iter()
                .map(|d| (d.delegator, d.groups.into_iter().collect()))
                .collect(),
            escalated_to: r.escalated_to,
        })
    }

    /// Records a vote and its decision under the run's row lock, and releases the turn when the
    /// votes meet `approvers`' quorum. See the module documentation.
    pub async fn record_vote(
        &self,
        d: &NewDecision,
        vote: &CastVote,
        approvers: &AgentApprovers,
    ) -> Result<VoteRecord, StoreError> {
        let m = &d.message;
        let mut tx = self.pool.begin().await?;
        let Some(card_editors) = card_editors_locked(&mut tx, m).await? else {
            return Ok(VoteRecord::TransitionLost);
        };
        let groups: Vec<String> = vote.groups.iter().cloned().collect();
        if !cast(&mut tx, m, &groups, &vote.on_behalf_of).await? {
            return Ok(VoteRecord::Refused(DecisionOutcome::AlreadyVoted));
        }
        let votes = card_votes(&mut tx, m.run_id, m.suspension_seq.as_i32()).await?;
        let escalated = escalated_to(&mut tx, m.run_id, m.suspension_seq.as_i32()).await?;
        let tally = quorum::tally(
            &approvers.quorum,
            &votes,
            &card_editors,
            escalated.as_deref(),
        );
        let outcome = match tally {
            Tally::Released | Tally::Denied => DecisionOutcome::Accepted,
            Tally::CallsDiffer => {
                return Ok(VoteRecord::Refused(DecisionOutcome::QuorumCallsDiffer))
            }
            Tally::Waiting(_) if m.approved => DecisionOutcome::ApprovalRecorded,
            Tally::Waiting(_) => DecisionOutcome::DenialRecorded,
        };
        let new = NewDecision {
            outcome,
            ..d.clone()
        };
        let (sealed, event, mut payload) = self.decision_parts(&new)?;
        payload["on_behalf_of"] = json!(vote.on_behalf_of);
        payload["vote_groups"] = json!(groups);
        let Some((row, waited)) = self
            .insert_decision(&mut *tx, &new, sealed, &event, payload)
            .await?
        else {
            return Ok(VoteRecord::TransitionLost);
        };
        tx.commit().await?;
        self.hand_off(vec![row.into()]);
        Ok(VoteRecord::Recorded(
            DecisionRecord::Recorded(outcome),
            waited,
        ))
    }

    /// Where the current card of `run_id` stands under its agent's quorum; `None` when the run
    /// is not waiting or its agent wants one approver.
    pub async fn card_standing(&self, run_id: RunId) -> Result<Option<Standing>, StoreError> {
        let run = sqlx::query!(
            "SELECT agent, suspension_seq, card_editors FROM runs
             WHERE id = $1 AND status = 'waiting_for_approval'",
            run_id.as_uuid()
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(run) = run else { return Ok(None) };
        let seq = run.suspension_seq.unwrap_or_default();
        let Some(approvers) = self.card_approvers(&run.agent, run_id, seq).await? else {
            return Ok(None);
        };
        let mut conn = self.pool.acquire().await?;
        let votes = card_votes(&mut conn, run_id, seq).await?;
        Ok(
            match quorum::tally(&approvers.quorum, &votes, &run.card_editors, None) {
                Tally::Waiting(standing) => Some(standing),
                _ => Some(Standing {
                    approvers: votes
                        .iter()
                        .filter(|v| v.approved)
                        .map(|v| v.voter.clone())
                        .collect(),
                    needed: approvers.quorum.requirements.iter().map(|r| r.count).sum(),
                    ..Standing::default()
                }),
            },
        )
    }

    /// The reaper's reminders and escalations, by the database clock: a card of an agent that
    /// reminds, waiting longer than its `remind_after`, is announced `card.reminded` once; one
    /// waiting longer than its `escalate_after` is escalated to the agent's backup group once,
    /// announced `card.escalated`. Both join the run's audit trail. Idempotent: each is written once per card, so
    /// two passes at once write it once. Returns how many were reminded and escalated.
    pub async fn remind_and_escalate(&self) -> Result<(u64, u64), StoreError> {
        let reminded = self.alert(EventName::CardReminded).await?;
        let escalated = self.alert(EventName::CardEscalated).await?;
        Ok((reminded, escalated))
    }

    async fn alert(&self, name: EventName) -> Result<u64, StoreError> {
        let escalate = name == EventName::CardEscalated;
        let rows = sqlx::query_as!(
            crate::outbox::Row,
            r#"WITH due AS (
                   SELECT r.id, r.suspension_seq, r.agent, a.backup_group
                   FROM runs r JOIN agent_approvers a ON a.agent = r.agent
                   WHERE r.status = 'waiting_for_approval'
                     AND r.updated_at + (CASE WHEN $1 THEN a.escalate_after_seconds
                                              ELSE a.remind_after_seconds END)
                                        * interval '1 second' <= now()
                     AND NOT EXISTS (SELECT 1 FROM card_alerts c
                                     WHERE c.run_id = r.id
                                       AND c.suspension_seq = r.suspension_seq
                                       AND c.kind = CASE WHEN $1 THEN 'escalated'
                                                         ELSE 'reminded' END)
                   ORDER BY r.updated_at LIMIT 500),
               alerted AS (
                   INSERT INTO card_alerts (run_id, suspension_seq, kind, backup_group)
                   SELECT id, suspension_seq, CASE WHEN $1 THEN 'escalated' ELSE 'reminded' END,
                          CASE WHEN $1 THEN backup_group END
                   FROM due
                   ON CONFLICT DO NOTHING
                   RETURNING run_id, suspension_seq, backup_group),
               body AS (
                   SELECT a.run_id,
                          jsonb_build_object('type', 'countersign.event', 'version', 1,
                                             'event', $2::text,
                                             'run_id', a.run_id,
                                             'suspension_seq', a.suspension_seq)
                          || CASE WHEN $1 THEN jsonb_build_object('backup_group', a.backup_group)
                                  ELSE '{}'::jsonb END AS fields
                   FROM alerted a),
               announced AS (
                   SELECT announce(run_id, gen_random_uuid(), $2, fields,
                                   fields - 'type' - 'version' - 'event' - 'run_id') AS e
                   FROM body)
               SELECT (e).id AS "id!", (e).run_id, (e).kind AS "kind!", (e).body AS "body!",
                      (e).created_at AS "created_at!"
               FROM announced"#,
            escalate,
            name.as_str(),
        )
        .fetch_all(&self.pool)
        .await?;
        let n = rows.len() as u64;
        self.hand_off(rows.into_iter().map(Into::into).collect());
        Ok(n)
    }
}

/// Locks the run `m` decides and returns the editors of its card, when the run still waits
/// on the card `m` names (its suspension and digest); `None` otherwise.
async fn card_editors_locked(
    tx: &mut sqlx::PgConnection,
    m: &DecisionMessage,
) -> Result<Option<Vec<String>>, StoreError> {
    let run = sqlx::query!(
        r#"SELECT status, suspension_seq, turn_digest, card_editors FROM runs
               WHERE id = $1 FOR UPDATE"#,
        m.run_id.as_uuid(),
    )
    .fetch_optional(tx)
    .await?;
    Ok(run
        .filter(|r| {
            r.status == "waiting_for_approval"
                && r.suspension_seq == Some(m.suspension_seq.as_i32())
                && r.turn_digest.as_deref() == Some(m.turn_digest.as_str())
        })
        .map(|r| r.card_editors))
}

/// The votes of card `seq` of `run_id`, oldest first.
async fn card_votes(
    conn: &mut sqlx::PgConnection,
    run_id: RunId,
    seq: i32,
) -> Result<Vec<quorum::Vote>, StoreError> {
    let rows = sqlx::query!(
        "SELECT voter, approved, approved_calls, groups FROM card_votes
         WHERE run_id = $1 AND suspension_seq = $2 ORDER BY created_at, voter",
        run_id.as_uuid(),
        seq,
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| quorum::Vote {
            voter: r.voter,
            approved: r.approved,
            groups: r.groups.into_iter().collect(),
            calls: r.approved_calls.map(|c| {
                c.into_iter()
                    .filter_map(|i| usize::try_from(i).ok())
                    .collect()
            }),
        })
        .collect())
}

impl Store {
    /// Maps Slack user `slack_user` of workspace `team` to directory user `user`, audited with
    /// `actor`. Mapping again replaces the user.
    pub async fn map_slack_user(
        &self,
        actor: &str,
        team: &str,
        slack_user: &str,
        user: &str,
    ) -> Result<(), StoreError> {
        sqlx::query!(
            r#"WITH m AS (INSERT INTO slack_users (team_id, slack_user_id, directory_user)
                          VALUES ($2, $3, $4)
                          ON CONFLICT (team_id, slack_user_id)
                              DO UPDATE SET directory_user = excluded.directory_user
                          RETURNING *)
               INSERT INTO directory_audit (actor, action, subject)
               SELECT $1, 'slack_user_mapped',
                      jsonb_build_object('team', team_id, 'slack_user', slack_user_id,
                                         'user', directory_user)
               FROM m"#,
            actor,
            team,
            slack_user,
            user,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Takes a Slack user's mapping back; false when there was none.
    pub async fn unmap_slack_user(
        &self,
        actor: &str,
        team: &str,
        slack_user: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"WITH m AS (DELETE FROM slack_users WHERE team_id = $2 AND slack_user_id = $3
                          RETURNING *)
               INSERT INTO directory_audit (actor, action, subject)
               SELECT $1, 'slack_user_unmapped',
                      jsonb_build_object('team', team_id, 'slack_user', slack_user_id,
                                         'user', directory_user)
               FROM m"#,
            actor,
            team,
            slack_user,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Clears Slack channel `channel` of workspace `team` for previews of `class` and below,
    /// audited with `actor`. Clearing again replaces the class.
    pub async fn clear_slack_channel(
        &self,
        actor: &str,
        team: &str,
        channel: &str,
        class: DataClass,
    ) -> Result<(), StoreError> {
        sqlx::query!(
            r#"WITH c AS (INSERT INTO slack_channels (team_id, channel_id, data_class, cleared_by)
                          VALUES ($2, $3, $4, $1)
                          ON CONFLICT (team_id, channel_id)
                              DO UPDATE SET data_class = excluded.data_class,
                                            cleared_by = excluded.cleared_by,
                                            cleared_at = now()
                          RETURNING *)
               INSERT INTO directory_audit (actor, action, subject)
               SELECT $1, 'slack_channel_cleared',
                      jsonb_build_object('team', team_id, 'channel', channel_id,
                                         'data_class', data_class)
               FROM c"#,
            actor,
            team,
            channel,
            class.as_str(),
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Takes a channel's clearance back; false when it had none.
    pub async fn unclear_slack_channel(
        &self,
        actor: &str,
        team: &str,
        channel: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"WITH c AS (DELETE FROM slack_channels WHERE team_id = $2 AND channel_id = $3
                          RETURNING *)
               INSERT INTO directory_audit (actor, action, subject)
               SELECT $1, 'slack_channel_uncleared',
                      jsonb_build_object('team', team_id, 'channel', channel_id,
                                         'data_class', data_class)
               FROM c"#,
            actor,
            team,
            channel,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The highest data class channel `channel` of workspace `team` is cleared for; `None`
    /// when it is not cleared.
    pub async fn slack_channel_class(
        &self,
        team: &str,
        channel: &str,
    ) -> Result<Option<DataClass>, StoreError> {
        let class = sqlx::query_scalar!(
            "SELECT data_class FROM slack_channels WHERE team_id = $1 AND channel_id = $2",
            team,
            channel,
        )
        .fetch_optional(&self.pool)
        .await?;
        class
            .map(|c| {
                c.parse::<DataClass>()
                    .map_err(|_| StoreError::unreadable("slack_channels.data_class"))
            })
            .transpose()
    }

    /// The directory user a Slack user is mapped to, if any.
    pub async fn slack_user(
        &self,
        team: &str,
        slack_user: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar!(
            "SELECT directory_user FROM slack_users WHERE team_id = $1 AND slack_user_id = $2",
            team,
            slack_user,
        )
        .fetch_optional(&self.pool)
        .await?)
    }
}

/// Inserts the vote `m` casts (for `groups`, and for `on_behalf_of`'s delegators): false when
/// the voter voted on this card already.
async fn cast(
    tx: &mut sqlx::PgConnection,
    m: &countersign_core::DecisionMessage,
    groups: &[String],
    on_behalf_of: &[String],
) -> Result<bool, StoreError> {
    let calls: Option<Vec<i32>> = (!m.calls.is_empty()).then(|| {
        m.calls
            .iter()
            .filter(|c| c.approved)
            .map(|c| c.index.as_i32())
            .collect()
    });
    let cast = sqlx::query!(
        r#"INSERT INTO card_votes (run_id, suspension_seq, turn_digest, voter, approved,
                                  approved_calls, groups, on_behalf_of, decision_id)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING"#,
        m.run_id.as_uuid(),
        m.suspension_seq.as_i32(),
        m.turn_digest.as_str(),
        m.approver,
        m.approved,
        calls.as_deref(),
        groups,
        on_behalf_of,
        m.decision_id,
    )
    .execute(&mut *tx)
    .await?;
    Ok(cast.rows_affected() == 1)
}

/// The backup group card `seq` of `run_id` was escalated to, if it was.
async fn escalated_to(
    tx: &mut sqlx::PgConnection,
    run_id: RunId,
    seq: i32,
) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar!(
        "SELECT backup_group FROM card_alerts
         WHERE run_id = $1 AND suspension_seq = $2 AND kind = 'escalated'",
        run_id.as_uuid(),
        seq,
    )
    .fetch_optional(&mut *tx)
    .await?
    .flatten())
}
