//! The gates of a decision on an agent that wants approvers as a team: who may vote, what the
//! vote counts for, and its record.
//!
//! A person may vote on a card when they are in one of the groups its agent names, when someone
//! in such a group delegated their cards to them for now (the database clock decides "now"), or
//! when they are in the backup group the card was escalated to. Their vote counts for those
//! groups, as they were when it was cast, and names the delegators it was cast for — both names
//! go into the audit. Four-eyes stays judged against the run's own acting user, whoever the vote
//! is cast for.
//!
//! The tally and the release are the store's ([`Store::record_vote`]), under the run's row
//! lock, so two votes arriving together are counted one after the other.
//!
//! [`Store::record_vote`]: countersign_store::Store::record_vote

use std::collections::BTreeSet;

use countersign_core::DecisionMessage;
use countersign_store::{
    AgentApprovers, CastVote, DecisionOutcome, DecisionRecord, NewDecision, VoteFacts, VoteRecord,
};

use crate::{Coordinator, CoordinatorError, DecisionVerdict};

/// The vote `facts` let the decision's approver cast under `approvers`, or
/// `not_in_approver_groups`.
pub(crate) fn cast(
    facts: &VoteFacts,
    approvers: &AgentApprovers,
) -> Result<CastVote, DecisionOutcome> {
    let mut eligible: BTreeSet<&str> = approvers.quorum.groups();
    if let Some(backup) = &facts.escalated_to {
        eligible.insert(backup);
    }
    let of = |groups: &BTreeSet<String>| -> BTreeSet<String> {
        groups
            .iter()
            .filter(|g| eligible.contains(g.as_str()))
            .cloned()
            .collect()
    };
    let mut groups = of(&facts.groups);
    let mut on_behalf_of = Vec::new();
    for (delegator, theirs) in &facts.delegators {
        let counted = of(theirs);
        if !counted.is_empty() {
            groups.extend(counted);
            on_behalf_of.push(delegator.clone());
        }
    }
    if groups.is_empty() {
        return Err(DecisionOutcome::NotInApproverGroups);
    }
    Ok(CastVote {
        groups,
        on_behalf_of,
    })
}

impl Coordinator {
    /// Records `d` as a vote: released when it completes the quorum (or the denials that end
    /// the card), `approval_recorded` / `denial_recorded` otherwise, and a refusal when the
    /// store refuses it (`already_voted`, `quorum_calls_differ`) or the card moved since the
    /// gates read it (`not_awaiting_approval`).
    pub(crate) async fn record_vote(
        &self,
        d: &DecisionMessage,
        vote: &CastVote,
        approvers: &AgentApprovers,
    ) -> Result<DecisionVerdict, CoordinatorError> {
        let new = NewDecision {
            message: d.clone(),
            outcome: DecisionOutcome::Accepted,
            in_trail: true,
        };
        let recorded = match self.store.record_vote(&new, vote, approvers).await {
            Ok(recorded) => recorded,
            Err(e) if e.is_transient() => return Err(e.into()),
            Err(e) => {
                tracing::error!(
                    run.id = %d.run_id,
                    decision.id = %d.decision_id,
                    error.code = e.code(),
                    error = %e,
                    "vote not auditable; the run stays waiting"
                );
                return Ok(self.verdict(d, DecisionOutcome::NotAuditable, false));
            }
        };
        match recorded {
            VoteRecord::Recorded(DecisionRecord::Recorded(outcome), waited) => {
                if !vote.on_behalf_of.is_empty() {
                    tracing::info!(
                        run.id = %d.run_id,
                        decision.id = %d.decision_id,
                        delegate = %d.approver,
                        on_behalf_of = ?vote.on_behalf_of,
                        "vote cast by a delegate"
                    );
                }
                Ok(DecisionVerdict {
                    approval_wait: waited,
                    ..self.verdict(d, outcome, false)
                })
            }
            VoteRecord::Recorded(_, _) | VoteRecord::TransitionLost => {
                self.record(d, DecisionOutcome::NotAwaitingApproval, true, None)
                    .await
            }
            VoteRecord::Refused(outcome) => self.record(d, outcome, true, None).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use countersign_core::quorum::{Quorum, Requirement};

    use super::*;

    fn approvers() -> AgentApprovers {
        AgentApprovers {
            quorum: Quorum {
                requirements: vec![Requirement {
                    group: "legal".into(),
                    count: 2,
                }],
                denials_to_end: 1,
            },
            backup_group: Some("backup".into()),
            ..AgentApprovers::default()
        }
    }

    fn set(g: &[&str]) -> BTreeSet<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_person_in_none_of_the_groups_may_not_vote() {
        let facts = VoteFacts {
            groups: set(&["marketing"]),
            ..VoteFacts::default()
        };
        assert_eq!(
            cast(&facts, &approvers()),
            Err(DecisionOutcome::NotInApproverGroups)
        );
    }

    #[test]
    fn a_delegate_votes_for_the_groups_of_whoever_delegated_to_them_now() {
        let facts = VoteFacts {
            delegators: vec![("alice".into(), set(&["legal"]))],
            ..VoteFacts::default()
        };
        let vote = cast(&facts, &approvers()).unwrap();
        assert_eq!(vote.groups, set(&["legal"]));
        assert_eq!(vote.on_behalf_of, ["alice"]);
    }

    #[test]
    fn the_backup_group_may_vote_only_once_the_card_is_escalated() {
        let mut facts = VoteFacts {
            groups: set(&["backup"]),
            ..VoteFacts::default()
        };
        assert!(cast(&facts, &approvers()).is_err());
        facts.escalated_to = Some("backup".into());
        assert_eq!(cast(&facts, &approvers()).unwrap().groups, set(&["backup"]));
    }
}
