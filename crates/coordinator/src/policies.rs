//! Policies at work: each card a run suspends with is evaluated by the loaded policies, and an
//! enforced approval or denial becomes a decision through the same gates as a person's.
//!
//! The coordinator evaluates because it already holds what a decision needs (the gates, the
//! tool registry, the user directory, the keyring that opens the card). It finds the cards by
//! polling the runs waiting for approval whose current card it has not seen: PostgreSQL
//! decides, and a card is evaluated once, by whichever coordinator claims it first. Each card's
//! facts are kept (sealed) whether or not a policy is loaded, so that a policy can be replayed
//! on the cards people decided before it is turned on. An
//! evaluation that cannot decide — no rule, an error, a timeout, a run bounced too often, an
//! unreadable card — leaves the card to a person; nothing here ever approves by default.
//!
//! A policy's decision is bound to the card it saw (its suspension number and turn digest):
//! if a preview moved before the write, the worker re-suspends the run, the new card is due
//! again, and the policy sees it. After [`BOUNCE_LIMIT`] accepted policy approvals of the same
//! turn a person decides.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::{DecisionMessage, SuspendedRunState};
use countersign_policy::{
    AskReason, CardFacts, Evaluation, Loaded, Mode, Outcome, OutcomeKind, Policy, PolicySource,
    RunFacts, SourceError,
};
use countersign_store::{DueCard, PolicyEvaluation, PolicyMark, RunRecord, RunStatus};
use strum::VariantArray;
use uuid::Uuid;

use crate::{Coordinator, CoordinatorError, DecisionCode};

/// Accepted policy approvals of one turn after which the policies ask a person.
pub const BOUNCE_LIMIT: i64 = 3;
/// Cards evaluated per pass at most.
const BATCH: i64 = 32;

/// Evaluates the cards due until `shutdown` resolves, every `every` (and at once after a pass
/// that found a full batch).
pub async fn run(
    coordinator: Coordinator,
    source: PolicySource,
    every: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    register_metrics(&source.current().0);
    loop {
        let full = match coordinator.policy_pass(&source).await {
            Ok(n) => n as i64 >= BATCH,
            Err(e) => {
                tracing::warn!(error.code = e.code(), error = %e, "policy pass failed");
                false
            }
        };
        if full {
            continue;
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

impl Coordinator {
    /// One pass: the cards due, each evaluated once. Returns how many were due.
    pub async fn policy_pass(&self, source: &PolicySource) -> Result<usize, CoordinatorError> {
        let (loaded, refusals) = source.current();
        for refusal in refusals {
            metrics::counter!("countersign_policy_load_refused_total", "code" => refusal.code())
                .increment(1);
            tracing::error!(
                error.code = refusal.code(),
                error = %refusal,
                "a policy file changed and no longer loads; its last good version stays in force"
            );
        }
        let due = self.store.policy_cards_due(BATCH).await?;
        for card in &due {
            self.evaluate_card(&loaded, *card).await?;
        }
        Ok(due.len())
    }

    /// Claims `card` with its facts (kept, sealed, for a replay even when no policy is
    /// loaded) and evaluates it with every loaded policy: records each verdict, and lets the
    /// first enforced policy that approves or denies decide.
    async fn evaluate_card(&self, loaded: &Loaded, card: DueCard) -> Result<(), CoordinatorError> {
        let Some((run, state)) = self.open_card(card).await? else {
            // Claimed without facts, so that it is not looked at again; a person decides.
            self.store.claim_policy_card(card, b"null").await?;
            return Ok(());
        };
        let writes = self.store.agent_writes_last_hour(&run.agent).await?;
        let facts = CardFacts::of(
            RunFacts {
                agent: &run.agent,
                acting_user: &run.acting_user,
                request_kind: "run_request",
                writes_by_agent_last_hour: writes,
            },
            &state,
            |tool| self.registry.get(tool).map(|t| t.spec()),
        );
        let json = serde_json::to_vec(&facts).unwrap_or_else(|_| b"null".to_vec());
        if !self.store.claim_policy_card(card, &json).await? {
            return Ok(());
        }
        for policy in loaded.shadowed() {
            let evaluation = policy.evaluate(&facts);
            self.note(policy, &evaluation, &card, &state, None).await?;
        }
        let bounces = self
            .store
            .policy_bounces(card.run_id, &state.turn_digest())
            .await?;
        for policy in &self.enforced(loaded, &run.agent).await? {
            let mut evaluation = policy.evaluate(&facts);
            if bounces >= BOUNCE_LIMIT && evaluation.outcome == Outcome::Approve {
                evaluation.outcome = Outcome::Ask {
                    reason: AskReason::LoopGuard,
                };
            }
            if matches!(evaluation.outcome, Outcome::Ask { .. }) {
                // An ask rule named who must approve: the card's quorum from now on.
                if !evaluation.route.is_empty() {
                    self.store
                        .route_card(
                            card.run_id,
                            card.suspension_seq.as_i32(),
                            &policy.principal(),
                            &evaluation.route,
                        )
                        .await?;
                }
                self.note(policy, &evaluation, &card, &state, None).await?;
                continue;
            }
            return self.decide(policy, &evaluation, card, &state).await;
        }
        Ok(())
    }

    /// The policies that decide a card of `agent`: the files' enforced policies, in order, then
    /// the generated policies of the agent's standing grants that are neither expired nor
    /// revoked.
    async fn enforced(
        &self,
        loaded: &Loaded,
        agent: &str,
    ) -> Result<Vec<Arc<Policy>>, CoordinatorError> {
        let mut policies: Vec<Arc<Policy>> = loaded.enforced().cloned().collect();
        for source in self.store.active_grants(agent).await? {
            match Policy::load(&source) {
                Ok(grant) => policies.push(Arc::new(grant)),
                Err(e) => tracing::error!(error.code = e.code(), error = %e,
                    "a standing grant's generated policy does not load; it decides nothing"),
            }
        }
        Ok(policies)
    }

    /// The run of `card` and its suspended state, when the run still waits on that card and
    /// the state opens; `None` otherwise (a person decides).
    async fn open_card(
        &self,
        card: DueCard,
    ) -> Result<Option<(RunRecord, SuspendedRunState)>, CoordinatorError> {
        let Some(run) = self.store.run(card.run_id).await? else {
            return Ok(None);
        };
        if run.status != RunStatus::WaitingForApproval
            || run.suspension_seq != Some(card.suspension_seq)
        {
            return Ok(None);
        }
        let opened = self.store.load_state(card.run_id).await;
        let state = match opened.map(|bytes| SuspendedRunState::from_bytes(&bytes)) {
            Ok(Ok(state)) if state.suspension_seq == card.suspension_seq => state,
            Ok(Ok(_)) => return Ok(None),
            Ok(Err(e)) => {
                tracing::warn!(run.id = %card.run_id, error.code = e.code(), error = %e,
                    "card unreadable for the policies; a person decides");
                return Ok(None);
            }
            Err(e) if e.is_transient() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(run.id = %card.run_id, error.code = e.code(), error = %e,
                    "card unreadable for the policies; a person decides");
                return Ok(None);
            }
        };
        Ok(Some((run, state)))
    }

    /// Makes `evaluation` (an approval or a denial) a decision on `card`, through the gates.
    async fn decide(
        &self,
        policy: &Arc<Policy>,
        evaluation: &Evaluation,
        card: DueCard,
        state: &SuspendedRunState,
    ) -> Result<(), CoordinatorError> {
        let (approved, comment) = match &evaluation.outcome {
            Outcome::Approve => (true, None),
            Outcome::Deny { message } => (false, Some(message.clone())),
            Outcome::Ask { .. } => return Ok(()),
        };
        let decision = DecisionMessage {
            run_id: card.run_id,
            suspension_seq: card.suspension_seq,
            turn_digest: state.turn_digest(),
            approved,
            comment,
            calls: Vec::new(),
            edits: Vec::new(),
            decision_id: Uuid::now_v7(),
            approver: policy.principal(),
        };
        let mark = PolicyMark {
            policy: policy.id.clone(),
            version: policy.version,
            rule: evaluation.rule,
            facts_digest: evaluation.facts_digest.clone(),
            mode: policy.mode.as_str(),
        };
        let verdict = self.gate_policy_decision(&decision, &mark).await?;
        let accepted =
            verdict.outcome == DecisionCode::Gated(countersign_store::DecisionOutcome::Accepted);
        tracing::info!(
            run.id = %card.run_id,
            policy = %policy.principal(),
            rule = evaluation.rule,
            outcome = evaluation.outcome.kind().as_str(),
            accepted,
            "policy decided a card"
        );
        let made = accepted.then_some(decision.decision_id);
        self.note(policy, evaluation, &card, state, made).await
    }

    /// Records and counts `evaluation`.
    async fn note(
        &self,
        policy: &Policy,
        evaluation: &Evaluation,
        card: &DueCard,
        state: &SuspendedRunState,
        decision_id: Option<Uuid>,
    ) -> Result<(), CoordinatorError> {
        let (outcome, mode) = (evaluation.outcome.kind().as_str(), policy.mode.as_str());
        metrics::counter!("countersign_policy_decisions_total",
            "policy" => policy.id.clone(), "outcome" => outcome, "mode" => mode)
        .increment(1);
        metrics::histogram!("countersign_policy_evaluation_seconds")
            .record(evaluation.elapsed.as_secs_f64());
        let reason = match &evaluation.outcome {
            Outcome::Ask { reason } => Some(reason.as_str().to_owned()),
            _ => None,
        };
        let row = PolicyEvaluation {
            run_id: card.run_id,
            suspension_seq: card.suspension_seq,
            policy_id: policy.id.clone(),
            policy_version: i32::try_from(policy.version).unwrap_or(i32::MAX),
            mode: mode.to_owned(),
            outcome: outcome.to_owned(),
            reason,
            rule: evaluation.rule.and_then(|r| i32::try_from(r).ok()),
            facts_digest: evaluation.facts_digest.clone(),
            turn_digest: state.turn_digest(),
            decision_id,
        };
        self.store.record_policy_evaluation(&row).await?;
        Ok(())
    }
}

/// Registers the policy families at zero for the policies loaded at start (for none: the series
/// of the `ask` every card gets, under `policy="none"`), so they are on `/metrics` before any
/// card is seen.
fn register_metrics(loaded: &Loaded) {
    let _ = metrics::histogram!("countersign_policy_evaluation_seconds");
    for code in SourceError::codes() {
        let _ = metrics::counter!("countersign_policy_load_refused_total", "code" => code);
    }
    if loaded.policies.is_empty() {
        let _ = metrics::counter!("countersign_policy_decisions_total",
            "policy" => "none", "outcome" => OutcomeKind::Ask.as_str(),
            "mode" => Mode::Enforce.as_str());
    }
    for policy in &loaded.policies {
        for outcome in OutcomeKind::VARIANTS {
            let _ = metrics::counter!("countersign_policy_decisions_total",
                "policy" => policy.id.clone(), "outcome" => outcome.as_str(),
                "mode" => policy.mode.as_str());
        }
    }
}
