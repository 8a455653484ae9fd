//! The card of a waiting run, as its viewer may see it — built as the CLI builds it, from the
//! run's sealed state, so the suspension number and digest it carries are those of the
//! previews on it, never the row's of a moment later.

use countersign_core::card::{build_card, ApprovalCard};
use countersign_core::{RunId, SuspendedRunState};
use countersign_store::{DecisionOutcome, RunRecord, RunStatus};

use crate::problem::{unavailable, Problem, ProblemCode};
use crate::queries::Access;
use crate::AppState;

/// What [`card_for`] can answer.
pub const CARD_PROBLEMS: [ProblemCode; 4] = [
    ProblemCode::NotFound,
    ProblemCode::Decision(DecisionOutcome::NotAwaitingApproval),
    ProblemCode::StateUnreadable,
    ProblemCode::Unavailable,
];

/// The card of `run` for the viewer `access` describes: `not_found` when that viewer may not
/// decide on it, `not_awaiting_approval` when it waits for nothing, `state_unreadable` when its
/// state does not open.
pub async fn card_for(
    state: &AppState,
    run: &RunRecord,
    access: &Access,
) -> Result<ApprovalCard, Problem> {
    if !access.may_decide(run) {
        return Err(Problem::new(ProblemCode::NotFound).with_run(run.id.as_uuid()));
    }
    if run.status != RunStatus::WaitingForApproval {
        return Err(
            Problem::new(ProblemCode::Decision(DecisionOutcome::NotAwaitingApproval))
                .with_run(run.id.as_uuid()),
        );
    }
    let viewer = state
        .coordinator
        .users
        .principal(&access.user)
        .await
        .map_err(|e| unavailable("users", e.code(), &e))?;
    let bytes = match state.coordinator.store.load_state(run.id).await {
        Ok(bytes) => bytes,
        Err(e) if e.is_unreadable() => return Err(unreadable(run.id, e.code(), &e)),
        Err(e) => return Err(unavailable("state", e.code(), &e)),
    };
    let parsed =
        SuspendedRunState::from_bytes(&bytes).map_err(|e| unreadable(run.id, e.code(), &e))?;
    Ok(build_card(&parsed, &state.coordinator.registry, viewer.as_ref()).await)
}

fn unreadable(run_id: RunId, code: &'static str, e: &dyn std::fmt::Display) -> Problem {
    tracing::warn!(run.id = %run_id, error.code = code, error = %e, "card not built");
    Problem::new(ProblemCode::StateUnreadable).with_run(run_id.as_uuid())
}
