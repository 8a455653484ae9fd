//! Decisions: the gates between an approver's message and the release of a suspended turn.
//!
//! The order is part of the contract, because each gate decides what the next may learn or
//! burn. A malformed message is refused before its claims are read; an unauthenticated one
//! before it can learn a recorded outcome or claim a decision id; a replay before any current
//! fact is consulted, so it answers exactly what it answered the first time — but only a replay
//! of the same decision: a decision id is bound to the run, card and body it was first recorded
//! with, and anything else naming it is refused `idempotency_conflict` and changes nothing. A
//! run the approver may not see (and its producer may not follow) is answered as a run that
//! does not exist, before any fact of it shows, so the gates are no oracle of other people's
//! runs; then the cheap, run-level facts (waiting, same card) before the approver's authority,
//! so that a stale tab of someone who may see the run is told it is stale.
//!
//! The gates read the run and decide; the release itself is the store's one guarded
//! transaction (status, suspension number and digest repeated in its `UPDATE`), so a run that
//! moved between the read and the write is never released twice — the loser is told
//! `not_awaiting_approval`. Refusals are recorded too (a row and an audit event, never a change
//! to the run), so a replay returns the same refusal.

use countersign_core::Principal;
use countersign_core::{Approver, DecisionMessage, MessageError, ToolSpec};
use countersign_store::{
    DecidedRun, DecisionOutcome, DecisionRecord, NewDecision, PolicyMark, Replay, RunStatus,
    StoredAgent, VoteFacts,
};

use crate::calls::{self, CardCalls};
use crate::producers::ProducerKind;
use crate::team;
use crate::{Coordinator, CoordinatorError, DecisionVerdict};

impl Coordinator {
    /// Gates a decision, records it and, when accepted, releases its turn. The gates, in
    /// order, each with its outcome:
    ///
    /// | # | gate | outcome |
    /// |---|---|---|
    /// | 1 | the body is a version-1 or version-2 decision | `malformed` (dead-letter; nothing recorded) |
    /// | 2 | `producer` is present and may assert the approver | `unauthenticated_producer` (nothing recorded) |
    /// | 3 | the decision id was recorded before | for the same run, card and body: the recorded outcome again, nothing else happens; otherwise `idempotency_conflict` (not recorded) |
    /// | 4 | the run exists, and the approver may decide on it or the producer may follow it (start runs as its acting user) | `not_awaiting_approval`, as for a run that does not exist: recorded, but not in the run's trail |
    /// | 5 | the run is `waiting_for_approval` | `not_awaiting_approval` |
    /// | 6 | digest and suspension number are the run's current ones | `stale_turn` (denials too) |
    /// | 7 | the directory lets the approver approve runs (admin, or its approve grant), or they are the run's acting user | `access_denied` |
    /// | 8 | the agent configuration exists and is active | `configuration_gone` |
    /// | 9 | an approval is not by the acting user under four-eyes (admins too) | `self_approval_denied` |
    /// | 10 | a decision call by call names each call of the card once; an edit names a call still to run, keeps its tool and fits the tool's schema; the tool policy permits the approver every write the decision lets run or edits; under four-eyes an approval is not by a person who edited the card | `calls_not_of_the_card`, `edit_not_of_the_card`, `edit_changes_tool`, `edit_invalid_arguments`, `approver_not_permitted`, `editor_approval_denied` |
    /// | 11 | decision row, audit event and transition to `queued`/`resume` commit together | `not_auditable` (run stays waiting) |
    ///
    /// An agent whose cards need approvers as a team (see [`crate::team`]) turns an approval or
    /// a denial that passes gate 10 into a vote: the approver must be in one of its groups
    /// (their own, a delegator's now, or the backup group once the card is escalated) —
    /// `not_in_approver_groups`; a person votes once per card — `already_voted`; approvals count
    /// together only when they let the same calls run — `quorum_calls_differ`. A vote that does
    /// not complete the quorum (or the denials that end the card) is recorded
    /// `approval_recorded` / `denial_recorded`; the one that does is `accepted` and releases
    /// the turn in the same transaction. At gate 7 a delegate may act for whoever delegated
    /// their cards to them, for now; four-eyes stays judged against the run's acting user.
    ///
    /// Outcomes of gates 4–10 are recorded as refusals; `not_auditable` is not (the database
    /// refused to store the audit), so a producer may send the same decision again and it is
    /// gated afresh; nor is `idempotency_conflict`, whose id belongs to the first decision. A
    /// transient store error at gate 11 (see [`StoreError::is_transient`]) is
    /// no outcome at all: it is returned as an error, like a failure to read a gate's facts,
    /// and the caller requeues the delivery. A denial that passes every gate is accepted: it
    /// releases the turn so that the model is told.
    ///
    /// [`StoreError::is_transient`]: countersign_store::StoreError::is_transient
    pub(crate) async fn gate_decision(
        &self,
        message: Result<DecisionMessage, MessageError>,
        producer: Option<&str>,
    ) -> Result<DecisionVerdict, CoordinatorError> {
        // 1. Schema.
        let decision = match message {
            Ok(decision) => decision,
            Err(e) => {
                tracing::warn!(reason = %e.reason(), "malformed decision");
                return Ok(DecisionVerdict::malformed(e.reason()));
            }
        };

        // 2–6 and 8 read their facts with one statement; each is consulted in its turn.
        let producer = producer.filter(|p| !p.is_empty());
        let facts = self
            .store
            .decision_facts(
                &decision,
                producer.unwrap_or_default(),
                ProducerKind::Approver.as_str(),
                ProducerKind::ActingUser.as_str(),
            )
            .await?;

        // 2. Producer.
        if producer.is_none() || !facts.producer_granted {
            return Ok(unauthenticated(&decision));
        }

        // 3. Replay, of this very decision only.
        match facts.recorded {
            Some(Replay::Same(recorded)) => return Ok(self.verdict(&decision, recorded, true)),
            Some(Replay::Conflict) => return Ok(self.conflict(&decision)),
            None => {}
        }

        let votes = self.vote_facts(&decision, facts.run.as_ref()).await?;

        // 4. A run the approver may not see is one that does not exist.
        let Some(seen) = self.seen(&decision, facts.run, &votes).await? else {
            return self
                .record(&decision, DecisionOutcome::NotAwaitingApproval, false, None)
                .await;
        };

        // 5–10.
        let outcome = self.gate(&decision, seen, facts.agent, &votes);
        self.record_gated(&decision, outcome, &votes).await
    }

    /// Who must approve the agent of `run`, and what the approver of `d` may vote for; nothing
    /// for a run that does not exist.
    async fn vote_facts(
        &self,
        d: &DecisionMessage,
        run: Option<&DecidedRun>,
    ) -> Result<VoteFacts, CoordinatorError> {
        Ok(match run {
            Some(run) => {
                let seq = d.suspension_seq.as_i32();
                self.store
                    .vote_facts(&run.agent, &d.approver, d.run_id, seq)
                    .await?
            }
            None => VoteFacts::default(),
        })
    }

    /// Records the `outcome` gates 5–10 gave `d`: a vote when a quorum decides the card, gate
    /// 11 otherwise.
    async fn record_gated(
        &self,
        d: &DecisionMessage,
        outcome: DecisionOutcome,
        votes: &VoteFacts,
    ) -> Result<DecisionVerdict, CoordinatorError> {
        // Under a quorum an approval or a denial is a vote: recorded, and released only with
        // the quorum. An edit issues the card anew, which dismisses the votes.
        if let (DecisionOutcome::Accepted, Some(approvers)) = (outcome, &votes.approvers) {
            if approvers.quorum.is_team() && !d.edits_calls() {
                return match team::cast(votes, approvers) {
                    Ok(vote) => self.record_vote(d, &vote, approvers).await,
                    Err(refused) => self.record(d, refused, true, None).await,
                };
            }
        }

        // 11, and the record of a refusal.
        self.record(d, outcome, true, None).await
    }

    /// Gates a decision a policy made, records it and, when accepted, releases its turn — the
    /// gates of [`Coordinator::gate_decision`] from the replay on, with the policy in the
    /// approver's place: it is trusted to decide (the operator loaded it), but it releases
    /// only what the run's **acting user** may write (gate 10 asks the tool policy about the
    /// acting user, not about a person), and it is never the second pair of eyes a four-eyes
    /// configuration asks for (`self_approval_denied`). Its audit event names the policy, the
    /// rule and the facts' digest (`mark`).
    pub(crate) async fn gate_policy_decision(
        &self,
        decision: &DecisionMessage,
        mark: &PolicyMark,
    ) -> Result<DecisionVerdict, CoordinatorError> {
        let facts = self
            .store
            .decision_facts(
                decision,
                "",
                ProducerKind::Approver.as_str(),
                ProducerKind::ActingUser.as_str(),
            )
            .await?;
        match facts.recorded {
            Some(Replay::Same(recorded)) => return Ok(self.verdict(decision, recorded, true)),
            Some(Replay::Conflict) => return Ok(self.conflict(decision)),
            None => {}
        }
        let outcome = match facts.run {
            None => DecisionOutcome::NotAwaitingApproval,
            // Under a quorum the card is the approver groups' to decide, and a policy is a
            // member of none: it leaves the card to them.
            Some(run) if self.team_decides(&run.agent, decision).await? => {
                DecisionOutcome::NotInApproverGroups
            }
            Some(run) => {
                let acting = self.users.approver(&run.acting_user).await?;
                let acting = acting.map(|a| a.principal().clone());
                self.gate_for_policy(decision, run, acting, facts.agent)
            }
        };
        self.record(decision, outcome, true, Some(mark)).await
    }

    /// Whether the card `decision` names is decided by a quorum of approver groups: the
    /// agent's, or one a policy routed the card to.
    async fn team_decides(
        &self,
        agent: &str,
        decision: &DecisionMessage,
    ) -> Result<bool, CoordinatorError> {
        let seq = decision.suspension_seq.as_i32();
        let approvers = self
            .store
            .card_approvers(agent, decision.run_id, seq)
            .await?;
        Ok(approvers.is_some_and(|a| a.quorum.is_team()))
    }

    /// Gates 5–10 for a policy's decision, `acting` being the run's acting user as the
    /// directory knows them.
    fn gate_for_policy(
        &self,
        d: &DecisionMessage,
        run: DecidedRun,
        acting: Option<Principal>,
        agent: Option<StoredAgent>,
    ) -> DecisionOutcome {
        if run.status != RunStatus::WaitingForApproval {
            return DecisionOutcome::NotAwaitingApproval;
        }
        if run.turn_digest.as_ref() != Some(&d.turn_digest)
            || run.suspension_seq != Some(d.suspension_seq)
        {
            return DecisionOutcome::StaleTurn;
        }
        let Some(acting) = acting else {
            return DecisionOutcome::AccessDenied;
        };
        let agent: StoredAgent = match agent {
            Some(agent) if agent.config.active => agent,
            _ => return DecisionOutcome::ConfigurationGone,
        };
        if d.approved && agent.config.four_eyes {
            return DecisionOutcome::SelfApprovalDenied;
        }
        let card = CardCalls {
            tools: &run.pending_tools,
            landed: &run.card_landed,
            editors: &run.card_editors,
        };
        let permits = |spec: &ToolSpec| agent.config.policy.permits(spec, &acting);
        calls::refusal(d, card, &self.registry, permits, agent.config.four_eyes)
            .unwrap_or(DecisionOutcome::Accepted)
    }

    /// Gate 4: the run, with the approver as the directory knows them (`None` for a user it
    /// does not know or has disabled), when the approver may decide on it or the producer may
    /// follow it; `None` when the run does not exist or neither may. The approver may decide
    /// on it when the directory lets them, or lets someone who delegated their cards to them
    /// for now.
    async fn seen(
        &self,
        d: &DecisionMessage,
        run: Option<DecidedRun>,
        votes: &VoteFacts,
    ) -> Result<Option<Seen>, CoordinatorError> {
        let Some(run) = run else { return Ok(None) };
        let approver = self.users.approver(&d.approver).await?;
        let mut decides = approver.as_ref().is_some_and(|a| may_decide(a, d, &run));
        if approver.is_some() && !decides {
            for (delegator, _) in &votes.delegators {
                let theirs = self.users.approver(delegator).await?;
                if theirs.is_some_and(|a| a.may_approve_runs_of(&run.agent)) {
                    decides = true;
                    break;
                }
            }
        }
        Ok((decides || run.producer_follows).then_some(Seen {
            run,
            approver: approver.filter(|_| decides),
        }))
    }

    /// Gates 5–10: `Accepted` when every gate passes.
    fn gate(
        &self,
        d: &DecisionMessage,
        seen: Seen,
        agent: Option<StoredAgent>,
        votes: &VoteFacts,
    ) -> DecisionOutcome {
        let Seen { run, approver } = seen;
        // 5. The run is waiting.
        if run.status != RunStatus::WaitingForApproval {
            return DecisionOutcome::NotAwaitingApproval;
        }

        // 6. The calls and the card reviewed are the current ones.
        if run.turn_digest.as_ref() != Some(&d.turn_digest)
            || run.suspension_seq != Some(d.suspension_seq)
        {
            return DecisionOutcome::StaleTurn;
        }

        // 7. The approver may act on the run: the directory lets them approve runs of its
        //    agent, or it is their own. An unknown or disabled user may not, whatever name it
        //    shares with the run's acting user.
        let owner = d.approver == run.acting_user;
        let Some(approver) = approver else {
            return DecisionOutcome::AccessDenied;
        };

        // 8. The configuration is still there and active.
        let agent: StoredAgent = match agent {
            Some(agent) if agent.config.active => agent,
            _ => return DecisionOutcome::ConfigurationGone,
        };

        // 9. Four-eyes: the initiator does not release their own run's writes.
        if d.approved && !d.edits_calls() && agent.config.four_eyes && owner {
            return DecisionOutcome::SelfApprovalDenied;
        }

        // 10. What the decision names is the card's, an edit keeps its tool and fits its
        //     schema, the approver may release every write it lets run (or craft every write
        //     it edits), and under four-eyes an editor does not approve alone.
        let principal = approver.principal();
        let card = CardCalls {
            tools: &run.pending_tools,
            landed: &run.card_landed,
            editors: &run.card_editors,
        };
        let permits = |spec: &ToolSpec| agent.config.policy.permits(spec, principal);
        // Under a quorum an editor may be one of the approvers, never the only one: the tally
        // sees to that.
        let team = votes.approvers.as_ref().is_some_and(|a| a.quorum.is_team());
        let editor_alone = agent.config.four_eyes && !team;
        if let Some(refused) = calls::refusal(d, card, &self.registry, permits, editor_alone) {
            return refused;
        }

        DecisionOutcome::Accepted
    }

    /// Records the gated outcome; for `Accepted`, in the transaction that releases the turn.
    /// `in_trail`: whether the run's audit trail shows it (not for a run the approver may not
    /// see).
    pub(crate) async fn record(
        &self,
        d: &DecisionMessage,
        outcome: DecisionOutcome,
        in_trail: bool,
        policy: Option<&PolicyMark>,
    ) -> Result<DecisionVerdict, CoordinatorError> {
        let new = NewDecision {
            message: d.clone(),
            outcome,
            in_trail,
        };
        let mut approval_wait = None;
        let record = match self.store_decision(&new, policy).await {
            Ok((record, waited)) => {
                approval_wait = waited;
                record
            }
            Err(e) if outcome == DecisionOutcome::Accepted => {
                // The commit itself may have failed after the database applied it: ask before
                // saying nothing happened. If even the question cannot be answered, nobody
                // knows; the redelivery's replay gate will.
                match self.store.recorded_decision(d).await? {
                    Some(Replay::Same(recorded)) => DecisionRecord::Recorded(recorded),
                    Some(Replay::Conflict) => DecisionRecord::Conflict,
                    // A lost connection, a serialization failure, a deadlock or a restarting
                    // server says nothing about the decision: it is an error, so the delivery
                    // is requeued and gated afresh, rather than an answer that leaves an
                    // approved run waiting until its deadline.
                    None if e.is_transient() => {
                        tracing::warn!(
                            run.id = %d.run_id,
                            decision.id = %d.decision_id,
                            error.code = e.code(),
                            error = %e,
                            "decision not recorded this time; it will be gated again"
                        );
                        return Err(e.into());
                    }
                    None => {
                        tracing::error!(
                            run.id = %d.run_id,
                            decision.id = %d.decision_id,
                            error.code = e.code(),
                            error = %e,
                            "decision not auditable; the run stays waiting"
                        );
                        return Ok(self.verdict(d, DecisionOutcome::NotAuditable, false));
                    }
                }
            }
            Err(e) => return Err(e.into()),
        };
        let verdict = self.verdict_of(d, new, record).await?;
        Ok(DecisionVerdict {
            approval_wait,
            ..verdict
        })
    }

    /// The verdict of `d` stored as `record` for `new`; a release that lost its transition is
    /// first recorded as the refusal it now is.
    async fn verdict_of(
        &self,
        d: &DecisionMessage,
        new: NewDecision,
        record: DecisionRecord,
    ) -> Result<DecisionVerdict, CoordinatorError> {
        let record = match record {
            DecisionRecord::TransitionLost => {
                // Another decision, a cancel or the reaper moved the run between the gates'
                // read and the release. Recorded as the refusal it now is, so a replay agrees.
                let refused = NewDecision {
                    outcome: DecisionOutcome::NotAwaitingApproval,
                    ..new
                };
                self.store.record_decision(&refused).await?
            }
            record => record,
        };
        Ok(match record {
            DecisionRecord::Recorded(recorded) => self.verdict(d, recorded, false),
            DecisionRecord::Replayed(recorded) => self.verdict(d, recorded, true),
            DecisionRecord::Conflict => self.conflict(d),
            // Only an accepted decision can lose its transition; a refusal has none.
            DecisionRecord::TransitionLost => {
                self.verdict(d, DecisionOutcome::NotAwaitingApproval, false)
            }
        })
    }

    /// Records `new`, naming the policy that made it if one did.
    async fn store_decision(
        &self,
        new: &NewDecision,
        policy: Option<&PolicyMark>,
    ) -> Result<(DecisionRecord, Option<f64>), countersign_store::StoreError> {
        match policy {
            Some(policy) => self.store.record_policy_decision(new, policy).await,
            None => self.store.record_decision_timed(new).await,
        }
    }

    /// `idempotency_conflict`: the decision id is the one of another decision. Nothing is
    /// recorded (the id is that decision's), so the caller announces it
    /// ([`DecisionVerdict::unannounced`]).
    fn conflict(&self, d: &DecisionMessage) -> DecisionVerdict {
        tracing::warn!(
            run.id = %d.run_id,
            decision.id = %d.decision_id,
            "decision id recorded before for another run, card or body"
        );
        DecisionVerdict::gated(
            d.decision_id,
            d.run_id,
            DecisionOutcome::IdempotencyConflict,
            false,
        )
    }

    pub(crate) fn verdict(
        &self,
        d: &DecisionMessage,
        outcome: DecisionOutcome,
        replayed: bool,
    ) -> DecisionVerdict {
        tracing::info!(
            run.id = %d.run_id,
            decision.id = %d.decision_id,
            outcome = outcome.as_str(),
            approved = d.approved,
            replayed,
            "decision gated"
        );
        DecisionVerdict::gated(d.decision_id, d.run_id, outcome, replayed)
    }
}

/// Gate 2's refusal: the decision's producer is missing or may not assert its approver.
fn unauthenticated(d: &DecisionMessage) -> DecisionVerdict {
    tracing::warn!(
        run.id = %d.run_id,
        decision.id = %d.decision_id,
        "decision from an unauthenticated producer"
    );
    DecisionVerdict::unauthenticated(d.decision_id, d.run_id)
}

/// What gate 4 lets through: the run, and the approver when they may decide on it (by the
/// directory, their own run, or a delegation); `None` when only the producer may follow it.
struct Seen {
    run: DecidedRun,
    approver: Option<Approver>,
}

/// Whether the directory lets `approver` decide on `run`: approve runs of its agent, or it is
/// their own.
fn may_decide(approver: &Approver, d: &DecisionMessage, run: &DecidedRun) -> bool {
    approver.may_approve_runs_of(&run.agent) || d.approver == run.acting_user
}
