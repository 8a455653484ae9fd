//! The inbox: the runs waiting for a decision, without content.

use chrono::{DateTime, Utc};
use countersign_core::{RunId, SuspensionSeq, TurnDigest};

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
    pub updated_at: DateTime<Utc>,
}

impl Store {
    /// Runs waiting for a decision, soonest deadline first.
    pub async fn inbox(&self, limit: i64) -> Result<Vec<WaitingRun>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT id, agent, acting_user, suspension_seq AS "suspension_seq!",
                      turn_digest AS "turn_digest!", pending_tools,
                      approval_deadline AS "approval_deadline!", updated_at
               FROM runs WHERE status = 'waiting_for_approval'
               ORDER BY approval_deadline, id LIMIT $1"#,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(WaitingRun {
                    run_id: run_id(r.id)?,
                    agent: r.agent,
                    acting_user: r.acting_user,
                    suspension_seq: seq(r.suspension_seq)?,
                    turn_digest: digest(&r.turn_digest)?,
                    pending_tools: r.pending_tools,
                    approval_deadline: r.approval_deadline,
                    updated_at: r.updated_at,
                })
            })
            .collect()
    }
}
