//! What this surface does after the gates, as the queue consumer does: count the outcome (and
//! time the approval wait it ended), publish the segment wake-up a verdict names and record
//! that it was confirmed, and announce the one outcome no transaction announced
//! (`not_auditable`).
//!
//! A wake-up that cannot be published is not an error for the caller: the decision or the run
//! is committed, and the reaper's lost-dispatch scan publishes what was never confirmed.

use countersign_coordinator::{DecisionVerdict, Dispatch, RequestVerdict};

use crate::AppState;

/// After a run request's gates.
pub(crate) async fn after_run_request(state: &AppState, verdict: &RequestVerdict) {
    metrics::counter!("countersign_run_requests_total", "outcome" => verdict.outcome.code())
        .increment(1);
    if let Some(dispatch) = verdict.dispatch {
        dispatch_now(state, dispatch).await;
    }
}

/// After a decision's gates.
pub(crate) async fn after_decision(state: &AppState, verdict: &DecisionVerdict) {
    metrics::counter!("countersign_decisions_total", "outcome" => verdict.outcome.code())
        .increment(1);
    if let Some(waited) = verdict.approval_wait {
        metrics::histogram!("countersign_approval_wait_seconds").record(waited.max(0.0));
    }
    if let Some(dispatch) = verdict.dispatch {
        dispatch_now(state, dispatch).await;
    }
    if let (Some(event), Some(run_id)) = (verdict.unannounced(), verdict.run_id) {
        if let Err(e) = state.coordinator.store.announce(Some(run_id), event).await {
            tracing::warn!(run.id = %run_id, event = event.name.as_str(), code = e.code(), error = %e, "event not announced");
        }
    }
}

async fn dispatch_now(state: &AppState, dispatch: Dispatch) {
    match state.broker.publish_segment(dispatch.run_id).await {
        Ok(()) => {
            if let Err(e) = state.coordinator.confirm_dispatch(&dispatch).await {
                tracing::warn!(run.id = %dispatch.run_id, code = e.code(), error = %e, "dispatch not recorded; the reaper will publish again");
            }
        }
        Err(e) => {
            tracing::warn!(run.id = %dispatch.run_id, code = e.code(), error = %e, "wake-up not published; the reaper will publish it");
        }
    }
}
