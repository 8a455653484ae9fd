//! What policies made of cards: which cards wait for one, who evaluates each, and the record
//! of every evaluation (enforced or shadowed) with the decision it made, if any.
//!
//! The facts a policy saw are not stored — they carry content — only their digest; the
//! decision an enforced policy made is an ordinary decision row, gated and audited as a
//! person's (see [`Store::record_policy_decision`]).

use chrono::{DateTime, Utc};
use countersign_core::{RunId, SuspensionSeq, TurnDigest};
use countersign_crypto::Purpose;
use uuid::Uuid;

use crate::{Store, StoreError};

/// A card no policy has evaluated yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueCard {
    pub run_id: RunId,
    pub suspension_seq: SuspensionSeq,
}

/// A standing grant, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyGrant {
    pub id: Uuid,
    pub run_id: Uuid,
    pub agent: String,
    pub tool: String,
    /// The generated policy.
    pub source: String,
    pub granted_by: String,
    pub granted_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_by: Option<String>,
    /// Neither expired nor revoked, by the database clock.
    pub active: bool,
}

/// A grant to record: from card `suspension_seq` of run `run_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewGrant {
    pub id: Uuid,
    pub run_id: RunId,
    pub suspension_seq: SuspensionSeq,
    pub agent: String,
    pub tool: String,
    pub source: String,
    pub granted_by: String,
    pub hours: i32,
}

/// A card a person decided, for a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedCard {
    pub run_id: RunId,
    pub suspension_seq: i32,
    /// The facts a policy would have seen, as JSON.
    pub facts: Vec<u8>,
    pub approved: bool,
    /// `turn`, `calls` or `edit`.
    pub kind: String,
    pub approver: String,
}

/// One policy's verdict on one card, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyEvaluation {
    pub run_id: RunId,
    pub suspension_seq: SuspensionSeq,
    pub policy_id: String,
    pub policy_version: i32,
    /// `enforce` or `shadow`.
    pub mode: String,
    /// `approve`, `deny` or `ask`.
    pub outcome: String,
    /// Why it asked, as a code.
    pub reason: Option<String>,
    pub rule: Option<i32>,
    pub facts_digest: String,
    pub turn_digest: TurnDigest,
    /// The decision it made, when enforced and it approved or denied.
    pub decision_id: Option<Uuid>,
}

/// A recorded evaluation beside what people decided on the same card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvaluation {
    pub evaluation: PolicyEvaluation,
    pub evaluated_at: DateTime<Utc>,
}

impl Store {
    /// Cards waiting for approval that no policy has evaluated yet, oldest first.
    pub async fn policy_cards_due(&self, limit: i64) -> Result<Vec<DueCard>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT r.id, r.suspension_seq AS "suspension_seq!"
               FROM runs r
               WHERE r.status = 'waiting_for_approval' AND r.suspension_seq IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM policy_cards c
                                 WHERE c.run_id = r.id AND c.suspension_seq = r.suspension_seq)
               ORDER BY r.updated_at
               LIMIT $1"#,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(DueCard {
                    run_id: RunId::from_uuid(r.id)
                        .map_err(|_| StoreError::unreadable("runs.id"))?,
                    suspension_seq: SuspensionSeq::from_i32(r.suspension_seq)
                        .map_err(|_| StoreError::unreadable("runs.suspension_seq"))?,
                })
            })
            .collect()
    }

    /// Claims `card` for evaluation, keeping `facts` (its facts as JSON, sealed here): `true`
    /// for the one caller that records it first.
    pub async fn claim_policy_card(&self, card: DueCard, facts: &[u8]) -> Result<bool, StoreError> {
        let sealed = self.keyring.seal(Purpose::Event, card.run_id, facts)?;
        let done = sqlx::query!(
            "INSERT INTO policy_cards (run_id, suspension_seq, facts) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
            card.run_id.as_uuid(),
            card.suspension_seq.as_i32(),
            sealed,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The cards recorded since `since` that a person decided, with their facts (opened; a
    /// card whose facts do not open is left out) and what the person decided, oldest first.
    pub async fn decided_cards(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<DecidedCard>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT c.run_id, c.suspension_seq, c.facts, d.approved, d.kind, d.approver
               FROM policy_cards c
               JOIN run_decisions d ON d.run_id = c.run_id AND d.suspension_seq = c.suspension_seq
               WHERE c.evaluated_at >= $1 AND d.outcome = 'accepted'
                 AND d.approver NOT LIKE 'policy:%'
               ORDER BY c.evaluated_at, c.run_id"#,
            since
        )
        .fetch_all(&self.pool)
        .await?;
        let mut cards = Vec::with_capacity(rows.len());
        for r in rows {
            let Ok(run_id) = RunId::from_uuid(r.run_id) else {
                continue;
            };
            let Ok(facts) = self.keyring.open(Purpose::Event, run_id, &r.facts) else {
                tracing::warn!(run.id = %run_id, "a card's facts do not open; left out");
                continue;
            };
            cards.push(DecidedCard {
                run_id,
                suspension_seq: r.suspension_seq,
                facts,
                approved: r.approved,
                kind: r.kind,
                approver: r.approver,
            });
        }
        Ok(cards)
    }

    /// Writes journaled in the last hour for runs of `agent`.
    pub async fn agent_writes_last_hour(&self, agent: &str) -> Result<i64, StoreError> {
        let n = sqlx::query_scalar!(
            r#"SELECT count(*) AS "n!" FROM run_journal j JOIN runs r ON r.id = j.run_id
               WHERE r.agent = $1 AND j.effect <> 'read_only'
                 AND j.created_at > now() - interval '1 hour'"#,
            agent
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }

    /// How many policy approvals of the turn `digest` of run `run_id` were accepted: each one
    /// that did not end the turn bounced (a preview moved, and the run suspended again).
    pub async fn policy_bounces(
        &self,
        run_id: RunId,
        digest: &TurnDigest,
    ) -> Result<i64, StoreError> {
        let n = sqlx::query_scalar!(
            r#"SELECT count(*) AS "n!" FROM run_decisions
               WHERE run_id = $1 AND turn_digest = $2 AND approved
                 AND outcome = 'accepted' AND approver LIKE 'policy:%'"#,
            run_id.as_uuid(),
            digest.as_str()
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }

    /// Records `e`, and its audit event (`policy_evaluated`: the policy, its mode, outcome,
    /// rule, reason and the facts' digest) in the run's trail, in one statement.
    pub async fn record_policy_evaluation(&self, e: &PolicyEvaluation) -> Result<(), StoreError> {
        let payload = serde_json::json!({
            "suspension_seq": e.suspension_seq.get(),
            "policy": e.policy_id,
            "version": e.policy_version,
            "mode": e.mode,
            "outcome": e.outcome,
            "reason": e.reason,
            "rule": e.rule,
            "facts_digest": e.facts_digest,
            "decision_id": e.decision_id,
        });
        sqlx::query!(
            r#"WITH evaluated AS (
                   INSERT INTO policy_evaluations
                       (run_id, suspension_seq, policy_id, policy_version, mode, outcome, reason,
                        rule, facts_digest, turn_digest, decision_id)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                   ON CONFLICT DO NOTHING
                   RETURNING run_id)
               SELECT trail_append(run_id, 'policy_evaluated', $12::jsonb) FROM evaluated"#,
            e.run_id.as_uuid(),
            e.suspension_seq.as_i32(),
            e.policy_id,
            e.policy_version,
            e.mode,
            e.outcome,
            e.reason,
            e.rule,
            e.facts_digest,
            e.turn_digest.as_str(),
            e.decision_id,
            payload,
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(())
    }

    /// The evaluations of run `run_id`'s cards, in the order they were made.
    pub async fn policy_evaluations(
        &self,
        run_id: RunId,
    ) -> Result<Vec<RecordedEvaluation>, StoreError> {
        let rows = sqlx::query!(
            "SELECT run_id, suspension_seq, policy_id, policy_version, mode, outcome, reason, rule,
                    facts_digest, turn_digest, decision_id, evaluated_at
             FROM policy_evaluations WHERE run_id = $1
             ORDER BY evaluated_at, policy_id",
            run_id.as_uuid()
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(RecordedEvaluation {
                    evaluation: PolicyEvaluation {
                        run_id: RunId::from_uuid(r.run_id)
                            .map_err(|_| StoreError::unreadable("policy_evaluations.run_id"))?,
                        suspension_seq: SuspensionSeq::from_i32(r.suspension_seq).map_err(
                            |_| StoreError::unreadable("policy_evaluations.suspension_seq"),
                        )?,
                        policy_id: r.policy_id,
                        policy_version: r.policy_version,
                        mode: r.mode,
                        outcome: r.outcome,
                        reason: r.reason,
                        rule: r.rule,
                        facts_digest: r.facts_digest,
                        turn_digest: TurnDigest::parse(&r.turn_digest).map_err(|_| {
                            StoreError::unreadable("policy_evaluations.turn_digest")
                        })?,
                        decision_id: r.decision_id,
                    },
                    evaluated_at: r.evaluated_at,
                })
            })
            .collect()
    }

    /// The facts kept of card `seq` of run `run_id`, opened; `None` when none were kept.
    pub async fn card_facts(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let sealed = sqlx::query_scalar!(
            "SELECT facts FROM policy_cards WHERE run_id = $1 AND suspension_seq = $2",
            run_id.as_uuid(),
            seq.as_i32()
        )
        .fetch_optional(&self.pool)
        .await?;
        sealed
            .map(|sealed| Ok(self.keyring.open(Purpose::Event, run_id, &sealed)?))
            .transpose()
    }

    /// Records grant `g`, expiring `g.hours` from now (database clock), with its audit event
    /// (`policy_grant_created`: who, which tool, until when) in the run's trail.
    pub async fn record_grant(&self, g: &NewGrant) -> Result<(), StoreError> {
        sqlx::query!(
            r#"WITH granted AS (
                   INSERT INTO policy_grants
                       (id, run_id, agent, tool, source, granted_by, expires_at)
                   VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(hours => $7))
                   RETURNING id, expires_at)
               SELECT trail_append($2, 'policy_grant_created',
                                   jsonb_build_object('grant_id', g.id, 'granted_by', $6::text,
                                                      'tool', $4::text, 'suspension_seq', $8::int,
                                                      'expires_at', g.expires_at))
               FROM granted g"#,
            g.id,
            g.run_id.as_uuid(),
            g.agent,
            g.tool,
            g.source,
            g.granted_by,
            g.hours,
            g.suspension_seq.as_i32(),
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(())
    }

    /// Revokes grant `id` on behalf of `by`, with its audit event (`policy_grant_revoked`) in
    /// the trail of the run it was given from: `true` when it was active until now.
    pub async fn revoke_grant(&self, id: Uuid, by: &str) -> Result<bool, StoreError> {
        let audited = sqlx::query_scalar!(
            r#"WITH revoked AS (
                   UPDATE policy_grants SET revoked_at = now(), revoked_by = $2
                   WHERE id = $1 AND revoked_at IS NULL
                   RETURNING run_id)
               SELECT trail_append(run_id, 'policy_grant_revoked',
                                   jsonb_build_object('grant_id', $1::uuid, 'revoked_by', $2::text))
               FROM revoked"#,
            id,
            by
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(audited.is_some())
    }

    /// The generated policies of `agent`'s grants that are neither expired nor revoked.
    pub async fn active_grants(&self, agent: &str) -> Result<Vec<String>, StoreError> {
        let sources = sqlx::query_scalar!(
            "SELECT source FROM policy_grants
             WHERE agent = $1 AND revoked_at IS NULL AND expires_at > now()
             ORDER BY granted_at",
            agent
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(sources)
    }

    /// Every grant, newest first.
    pub async fn grants(&self) -> Result<Vec<PolicyGrant>, StoreError> {
        let grants = sqlx::query_as!(
            PolicyGrant,
            r#"SELECT id, run_id, agent, tool, source, granted_by, granted_at, expires_at,
                      revoked_by, (revoked_at IS NULL AND expires_at > now()) AS "active!"
               FROM policy_grants ORDER BY granted_at DESC"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(grants)
    }
}
