//! The gates' spans: one around each gating, whichever door the message came through — the
//! queue consumer's `run_request` / `decision` span or the HTTP API's request span is its
//! parent — named for the run it concerns (`run.id`) and the outcome.
//!
//! A run keeps the trace context of the span that created it (`run_request_gates`), and the
//! span that gates a decision on it (`decision_gates`) carries a link to that span: the
//! decision's trace usually starts somewhere else (an approver's browser, another producer),
//! and the link is what joins the approval to the request it releases. Ids only: neither span
//! carries a prompt, an argument or a comment. Without a tracer installed nothing is kept and
//! no statement is spent on the link.

use countersign_core::{DecisionMessage, MessageError, RunId, RunRequest};
use countersign_queue::trace_context;
use countersign_store::Store;
use opentelemetry::trace::TraceContextExt;
use tracing::field::{display, Empty};
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::{Coordinator, CoordinatorError, DecisionVerdict, RequestVerdict};

impl Coordinator {
    /// Gates a run request inside a `run_request_gates` span: the gates and their order are
    /// `Coordinator::gate_run_request`'s.
    pub async fn take_run_request(
        &self,
        body: &[u8],
        producer: Option<&str>,
    ) -> Result<RequestVerdict, CoordinatorError> {
        self.take_run_request_message(RunRequest::parse(body), producer)
            .await
    }

    /// [`Coordinator::take_run_request`] of a body already read: `message` is what gate 1 made
    /// of it.
    pub async fn take_run_request_message(
        &self,
        message: Result<RunRequest, MessageError>,
        producer: Option<&str>,
    ) -> Result<RequestVerdict, CoordinatorError> {
        let span = tracing::info_span!(
            "run_request_gates",
            run.id = Empty,
            request.id = Empty,
            outcome = Empty
        );
        let verdict = self
            .gate_run_request(message, producer)
            .instrument(span.clone())
            .await;
        if let Ok(v) = &verdict {
            span.record("outcome", v.outcome.code());
            record_ids(&span, v.run_id, v.request_id.map(|id| ("request.id", id)));
        }
        verdict
    }

    /// Gates a decision inside a `decision_gates` span linked to its run's request: the gates
    /// and their order are `Coordinator::gate_decision`'s.
    pub async fn take_decision(
        &self,
        body: &[u8],
        producer: Option<&str>,
    ) -> Result<DecisionVerdict, CoordinatorError> {
        self.take_decision_message(DecisionMessage::parse(body), producer)
            .await
    }

    /// [`Coordinator::take_decision`] of a body already read: `message` is what gate 1 made of
    /// it.
    pub async fn take_decision_message(
        &self,
        message: Result<DecisionMessage, MessageError>,
        producer: Option<&str>,
    ) -> Result<DecisionVerdict, CoordinatorError> {
        let span = tracing::info_span!(
            "decision_gates",
            run.id = Empty,
            decision.id = Empty,
            outcome = Empty
        );
        let verdict = self
            .gate_decision(message, producer)
            .instrument(span.clone())
            .await;
        if let Ok(v) = &verdict {
            span.record("outcome", v.outcome.code());
            record_ids(&span, v.run_id, v.decision_id.map(|id| ("decision.id", id)));
            // Only a producer that may assert the approver learns, through the trace, which
            // request the run came from.
            if !matches!(v.outcome, crate::DecisionCode::UnauthenticatedProducer) {
                if let Some(run_id) = v.run_id {
                    link_to_request(&self.store, &span, run_id).await;
                }
            }
        }
        verdict
    }
}

fn record_ids(span: &Span, run_id: Option<RunId>, id: Option<(&str, uuid::Uuid)>) {
    if let Some(run_id) = run_id {
        span.record("run.id", display(run_id));
    }
    if let Some((field, id)) = id {
        span.record(field, display(id));
    }
}

/// The current span's trace context, as the run it creates keeps it.
pub(crate) fn current_traceparent() -> Option<String> {
    trace_context::traceparent(&Span::current().context())
}

/// Links `span` to the span that created `run_id`, when both are traced.
async fn link_to_request(store: &Store, span: &Span, run_id: RunId) {
    if !span.context().span().span_context().is_valid() {
        return;
    }
    match store.request_traceparent(run_id).await {
        Ok(kept) => {
            if let Some(request) = kept.as_deref().and_then(trace_context::span_context) {
                span.add_link(request);
            }
        }
        Err(e) => {
            tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "the request's trace not linked")
        }
    }
}
