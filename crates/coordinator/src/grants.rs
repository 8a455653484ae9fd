//! Standing grants from a card: a person who may approve an agent's runs says "approve, and
//! approve the same tool on the same subject by this agent for N hours". Each write call of the
//! card becomes a generated policy of one rule ([`countersign_policy::grant_source`]), kept in
//! `policy_grants` with who gave it and until when; the policy loop reads the active ones with
//! the files' policies. `countersign policies grant`, `POST /v1/runs/{run_id}/grants` and the
//! inbox's "Approve, and approve the same for 8 hours" all give grants here.
//!
//! A grant is refused, and none of the card's is given, when any call removes something, is of
//! a data class above `editor_content`, or names no subject; or when the coordinator kept no
//! facts of the card (it never saw it).

use countersign_core::{RunId, SuspensionSeq};
use countersign_policy::{grant_source, grantable, CardFacts, GrantRefusal};
use countersign_store::NewGrant;
use uuid::Uuid;

use crate::{Coordinator, CoordinatorError};

/// How long a grant lasts unless its giver says otherwise, in hours.
pub const DEFAULT_GRANT_HOURS: i32 = 8;
/// The longest grant, in hours (30 days).
pub const MAX_GRANT_HOURS: i32 = 720;

/// One grant given: a generated policy for one tool on its subjects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenGrant {
    pub id: Uuid,
    /// The generated policy's id (`grant-…`): its decisions are made by `policy:<id>@1`.
    pub policy: String,
    pub agent: String,
    pub tool: String,
    pub subjects: Vec<String>,
    pub hours: i32,
}

/// Why no grant was given.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum GrantError {
    /// No such run, or the person may not approve its agent's runs: nothing to tell apart.
    #[error("no run whose runs the approver may approve")]
    NotFound,
    /// The hours are outside 1 to [`MAX_GRANT_HOURS`].
    #[error("a grant lasts 1 to {MAX_GRANT_HOURS} hours")]
    #[strum(serialize = "grant_hours")]
    Hours,
    /// The coordinator kept no facts of this card: no policy ever saw it.
    #[error("no facts were kept of this card")]
    #[strum(serialize = "grant_no_facts")]
    NoFacts,
    #[error("call {index} may not be granted: {refusal}")]
    Refused { index: i64, refusal: GrantRefusal },
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
}

impl GrantError {
    pub fn code(&self) -> &'static str {
        match self {
            GrantError::Refused { refusal, .. } => refusal.code(),
            GrantError::Coordinator(e) => e.code(),
            other => other.into(),
        }
    }
}

impl Coordinator {
    /// Whether a grant from card `seq` of `run_id` is offered to `approver`: every check of
    /// [`Coordinator::grant_from_card`] but the hours passes.
    pub async fn grant_offered(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
        approver: &str,
    ) -> Result<bool, CoordinatorError> {
        match self.grantable(run_id, seq, approver).await {
            Ok(_) => Ok(true),
            Err(GrantError::Coordinator(e)) => Err(e),
            Err(_) => Ok(false),
        }
    }

    /// The facts of card `seq` of `run_id` when `approver` may grant every call of it.
    async fn grantable(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
        approver: &str,
    ) -> Result<CardFacts, GrantError> {
        let run = self
            .store
            .run(run_id)
            .await
            .map_err(CoordinatorError::from)?
            .ok_or(GrantError::NotFound)?;
        let who = self
            .users
            .approver(approver)
            .await
            .map_err(CoordinatorError::from)?;
        if !who.is_some_and(|a| a.may_approve_runs_of(&run.agent)) {
            return Err(GrantError::NotFound);
        }
        let facts = self
            .store
            .card_facts(run_id, seq)
            .await
            .map_err(CoordinatorError::from)?
            .and_then(|bytes| serde_json::from_slice::<CardFacts>(&bytes).ok())
            .ok_or(GrantError::NoFacts)?;
        if facts.calls.is_empty() {
            let refusal = GrantRefusal::NoWrites;
            return Err(GrantError::Refused { index: 0, refusal });
        }
        for call in &facts.calls {
            grantable(call).map_err(|refusal| GrantError::Refused {
                index: call.index,
                refusal,
            })?;
        }
        Ok(facts)
    }

    /// Gives `approver`'s standing grants from card `seq` of `run_id` for `hours`: one per
    /// write call, every call checked before any grant is given.
    pub async fn grant_from_card(
        &self,
        run_id: RunId,
        seq: SuspensionSeq,
        approver: &str,
        hours: i32,
    ) -> Result<Vec<GivenGrant>, GrantError> {
        if !(1..=MAX_GRANT_HOURS).contains(&hours) {
            return Err(GrantError::Hours);
        }
        let facts = self.grantable(run_id, seq, approver).await?;
        let mut given = Vec::with_capacity(facts.calls.len());
        for call in &facts.calls {
            let id = Uuid::now_v7();
            let short = id.simple().to_string()[..12].to_owned();
            let grant = NewGrant {
                id,
                run_id,
                suspension_seq: seq,
                agent: facts.agent.clone(),
                tool: call.tool.clone(),
                source: grant_source(&short, &facts.agent, call),
                granted_by: approver.to_owned(),
                hours,
            };
            self.store
                .record_grant(&grant)
                .await
                .map_err(CoordinatorError::from)?;
            given.push(GivenGrant {
                id,
                policy: format!("grant-{short}"),
                agent: facts.agent.clone(),
                tool: call.tool.clone(),
                subjects: call.subject_ids.clone(),
                hours,
            });
        }
        Ok(given)
    }
}

#[cfg(test)]
mod tests {
    use countersign_core::DirectoryError;
    use countersign_store::StoreError;

    use super::*;
    use crate::ProducerError;

    #[test]
    fn every_grant_error_has_the_code_it_always_had() {
        let refused = |refusal| GrantError::Refused { index: 1, refusal };
        let errors = [
            (GrantError::NotFound, "not_found"),
            (GrantError::Hours, "grant_hours"),
            (GrantError::NoFacts, "grant_no_facts"),
            (refused(GrantRefusal::Removes), "grant_removes"),
            (refused(GrantRefusal::NoWrites), "grant_no_writes"),
            (
                GrantError::Coordinator(CoordinatorError::Store(StoreError::FenceLost)),
                "fence_lost",
            ),
            (
                GrantError::Coordinator(CoordinatorError::Users(DirectoryError::database(
                    std::io::Error::other("reset"),
                ))),
                "database_error",
            ),
            (
                GrantError::Coordinator(CoordinatorError::Producers(ProducerError::Unreadable)),
                "state_unreadable",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }
}
