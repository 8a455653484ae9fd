//! What this surface does after the gates, as the queue consumer does: count the outcome (and
//! time the approval wait it ended), and announce the one outcome no transaction announced
//! (`not_auditable`). A run the verdict hands to the workers needs nothing more: the event its
//! transaction committed is its wake-up, which this process's outbox relay publishes.

use countersign_coordinator::{DecisionVerdict, RequestVerdict};

use crate::AppState;

/// After a run request's gates.
pub(crate) fn after_run_request(verdict: &RequestVerdict) {
    metrics::counter!("countersign_run_requests_total", "outcome" => verdict.outcome.code())
        .increment(1);
}

/// After a decision's gates.
pub(crate) async fn after_decision(state: &AppState, verdict: &DecisionVerdict) {
    metrics::counter!("countersign_decisions_total", "outcome" => verdict.outcome.code())
        .increment(1);
    if let Some(waited) = verdict.approval_wait {
        metrics::histogram!("countersign_approval_wait_seconds").record(waited.max(0.0));
    }
    if let (Some(event), Some(run_id)) = (verdict.unannounced(), verdict.run_id) {
        if let Err(e) = state.coordinator.store.announce(Some(run_id), event).await {
            tracing::warn!(run.id = %run_id, event = event.name.as_str(), code = e.code(), error = %e, "event not announced");
        }
    }
}
