//! What the coordinator tells its caller to do with a message.
//!
//! A verdict is the whole contract between the gates and the transport: the caller
//! dead-letters when [`RequestVerdict::dead_letter_reason`] / [`DecisionVerdict::dead_letter_reason`]
//! says so (and acknowledges otherwise) and sends the reply to `reply_to` when the message
//! carried one and the verdict has one. Events and replies carry
//! ids and outcome codes, never a prompt or a comment.
//!
//! The event of a verdict is already announced when the verdict is returned: written to the
//! store's outbox in the transaction that recorded the outcome (a created run, a recorded
//! decision) or, for a refused run request, which records nothing, by the gates themselves.
//! The outbox relay publishes it, at least once; consumers deduplicate by `event_id`. A replayed
//! decision or a duplicate run request announces nothing new — its first copy's event is in the
//! outbox already — and the verdict's `event` is that first one. The exceptions are
//! `not_auditable` and `idempotency_conflict`, which nothing recorded: the caller announces
//! them ([`DecisionVerdict::unannounced`]). The event of a run handed to the workers
//! ([`Dispatch`]) is its wake-up too; nothing else is published for it, and the reaper
//! re-publishes a wake-up for a queued run whose event was never confirmed.
//!
//! Only outcomes of an authenticated producer are announced or answered. A malformed or
//! unauthenticated message gets neither an event nor a reply — it is dead-lettered — so an
//! unauthenticated producer can neither put a refusal for someone else's decision id on the bus
//! nor make the coordinator publish to a queue of its choosing through `reply_to`.

use countersign_core::{Event, EventName, RunId};
use countersign_store::{decision_event, run_accepted};
use countersign_store::{DecisionOutcome, SegmentKind};
use serde_json::json;
use strum::VariantArray;
use uuid::Uuid;

/// A run the verdict hands to the workers, and the segment it starts. Nothing more is published
/// for it: the event its transition committed (`run.accepted`, `decision.accepted`) is its
/// wake-up, which the outbox relay publishes and the segments queue is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch {
    pub run_id: RunId,
    pub segment: SegmentKind,
}

/// What became of a run request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum RequestOutcome {
    /// A run exists for the request (created now, or by an earlier copy of it).
    Accepted,
    /// The body is not a version-1 run request; the verdict's `reason` is the dead-letter
    /// reason.
    Malformed,
    /// No authenticated producer, or one not allowed to assert this acting user.
    UnauthenticatedProducer,
    /// The acting user does not exist in the content store (or is disabled).
    UnknownActingUser,
    /// The agent configuration does not exist or is not active.
    ConfigurationGone,
    /// The producer's request id was used before for another request (agent, acting user,
    /// prompt or inputs): nothing was created, and the first request's run is not told.
    IdempotencyConflict,
}

impl RequestOutcome {
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// The verdict on a run request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestVerdict {
    pub outcome: RequestOutcome,
    /// Why the body is `malformed`: the reason it is dead-lettered with.
    pub reason: Option<String>,
    /// `None` only when the body was malformed.
    pub request_id: Option<Uuid>,
    /// The run created for the request, now or before.
    pub run_id: Option<RunId>,
    /// `true` when this message created the run; `false` for a duplicate and every refusal.
    pub created: bool,
    /// The start segment, only when the run was created now.
    pub dispatch: Option<Dispatch>,
    /// `run.accepted` / `run.refused` as announced on `countersign.events` (through the
    /// outbox, before the verdict was returned; for a duplicate, the first copy's); `None`
    /// for a malformed or unauthenticated message.
    pub event: Option<Event>,
    /// The outcome for the producer's `reply_to`, as an event body; `None` for a malformed or
    /// unauthenticated message, which gets no reply.
    pub reply: Option<Event>,
}

impl RequestVerdict {
    /// The reason to dead-letter the message with, when it must be dead-lettered.
    pub fn dead_letter_reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// The reply as a UTF-8 JSON body, stamped with `at` (RFC 3339), if there is one.
    pub fn reply_body(&self, at: &str) -> Option<Vec<u8>> {
        self.reply.as_ref().map(|reply| body(reply, at))
    }

    pub(crate) fn malformed(reason: String) -> Self {
        RequestVerdict {
            reply: None,
            outcome: RequestOutcome::Malformed,
            reason: Some(reason),
            request_id: None,
            run_id: None,
            created: false,
            dispatch: None,
            event: None,
        }
    }

    pub(crate) fn refused(request_id: Uuid, outcome: RequestOutcome) -> Self {
        let event = Event::new(
            EventName::RunRefused,
            json!({"request_id": request_id, "outcome": outcome.code()}),
        );
        let authenticated = !matches!(outcome, RequestOutcome::UnauthenticatedProducer);
        let event = authenticated.then_some(event);
        RequestVerdict {
            outcome,
            reason: None,
            request_id: Some(request_id),
            run_id: None,
            created: false,
            dispatch: None,
            reply: event.clone(),
            event,
        }
    }

    pub(crate) fn accepted(request_id: Uuid, run_id: RunId, created: bool) -> Self {
        let event = run_accepted(request_id, run_id);
        RequestVerdict {
            outcome: RequestOutcome::Accepted,
            reason: None,
            request_id: Some(request_id),
            run_id: Some(run_id),
            created,
            dispatch: created.then_some(Dispatch {
                run_id,
                segment: SegmentKind::Start,
            }),
            event: Some(event.clone()),
            reply: Some(event),
        }
    }
}

/// What became of a decision: the two outcomes decided before anything is recorded, or the
/// outcome the gates decided (recorded, except `not_auditable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum DecisionCode {
    /// Gate 1: not a version-1 decision; the verdict's `reason` is the dead-letter reason.
    /// Not recorded.
    Malformed,
    /// Gate 2: no authenticated producer, or one not allowed to assert this approver. Not
    /// recorded, or an unauthenticated producer could burn a decision id.
    UnauthenticatedProducer,
    /// Gates 3–10.
    #[strum(transparent)]
    Gated(DecisionOutcome),
}

impl DecisionCode {
    /// Every outcome: the two decided before anything is recorded, then the gated ones.
    pub fn all() -> impl Iterator<Item = DecisionCode> {
        [
            DecisionCode::Malformed,
            DecisionCode::UnauthenticatedProducer,
        ]
        .into_iter()
        .chain(
            DecisionOutcome::VARIANTS
                .iter()
                .copied()
                .map(DecisionCode::Gated),
        )
    }

    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// The verdict on a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionVerdict {
    pub outcome: DecisionCode,
    /// Why the body is `malformed`: the reason it is dead-lettered with.
    pub reason: Option<String>,
    /// `None` only when the body was malformed.
    pub decision_id: Option<Uuid>,
    /// The run the decision names; `None` only when the body was malformed.
    pub run_id: Option<RunId>,
    /// The decision id was recorded before: this is its recorded outcome, and nothing else
    /// happened.
    pub replayed: bool,
    /// The resume segment: only for a decision accepted now (never on a replay).
    pub dispatch: Option<Dispatch>,
    /// `decision.accepted` / `decision.refused` with `decision_id`, `run_id` and `outcome`, as
    /// announced on `countersign.events` (through the outbox, in the transaction that recorded
    /// the decision; for a replay, the recorded one's; for `not_auditable`, see
    /// [`DecisionVerdict::unannounced`]); `None` for a malformed or unauthenticated message.
    pub event: Option<Event>,
    /// The outcome for the producer's `reply_to`, as an event body; `None` for a malformed or
    /// unauthenticated message, which gets no reply.
    pub reply: Option<Event>,
    /// How long the run waited for the approval that released it now, in seconds.
    pub approval_wait: Option<f64>,
}

impl DecisionVerdict {
    /// The reason to dead-letter the message with, when it must be dead-lettered.
    pub fn dead_letter_reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Whether the decision released its turn (now or, on a replay, before).
    pub fn is_accepted(&self) -> bool {
        self.outcome == DecisionCode::Gated(DecisionOutcome::Accepted)
    }

    /// The event the caller must announce itself: only that of a `not_auditable` or an
    /// `idempotency_conflict` outcome, which no transaction recorded. Every other event of a
    /// verdict is in the outbox already.
    pub fn unannounced(&self) -> Option<&Event> {
        match self.outcome {
            DecisionCode::Gated(
                DecisionOutcome::NotAuditable | DecisionOutcome::IdempotencyConflict,
            ) => self.event.as_ref(),
            _ => None,
        }
    }

    /// The reply as a UTF-8 JSON body, stamped with `at` (RFC 3339), if there is one.
    pub fn reply_body(&self, at: &str) -> Option<Vec<u8>> {
        self.reply.as_ref().map(|reply| body(reply, at))
    }

    pub(crate) fn malformed(reason: String) -> Self {
        DecisionVerdict {
            reply: None,
            outcome: DecisionCode::Malformed,
            reason: Some(reason),
            decision_id: None,
            run_id: None,
            replayed: false,
            dispatch: None,
            event: None,
            approval_wait: None,
        }
    }

    pub(crate) fn unauthenticated(decision_id: Uuid, run_id: RunId) -> Self {
        DecisionVerdict {
            reply: None,
            outcome: DecisionCode::UnauthenticatedProducer,
            reason: None,
            decision_id: Some(decision_id),
            run_id: Some(run_id),
            replayed: false,
            dispatch: None,
            event: None,
            approval_wait: None,
        }
    }

    pub(crate) fn gated(
        decision_id: Uuid,
        run_id: RunId,
        outcome: DecisionOutcome,
        replayed: bool,
    ) -> Self {
        let accepted = outcome == DecisionOutcome::Accepted;
        let event = decision_event(decision_id, run_id, outcome);
        DecisionVerdict {
            outcome: DecisionCode::Gated(outcome),
            reason: None,
            decision_id: Some(decision_id),
            run_id: Some(run_id),
            replayed,
            dispatch: (accepted && !replayed).then_some(Dispatch {
                run_id,
                segment: SegmentKind::Resume,
            }),
            event: Some(event.clone()),
            reply: Some(event),
            approval_wait: None,
        }
    }
}

fn body(event: &Event, at: &str) -> Vec<u8> {
    // Serialising a `Value` cannot fail.
    serde_json::to_vec(&event.to_json(at)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_code_is_listed_once() {
        let codes: Vec<_> = RequestOutcome::VARIANTS
            .iter()
            .map(RequestOutcome::code)
            .collect();
        let unique: std::collections::BTreeSet<_> = codes.iter().collect();
        assert_eq!(unique.len(), codes.len(), "{codes:?}");
        assert!(codes.contains(&"idempotency_conflict"), "{codes:?}");

        let decisions: Vec<_> = DecisionCode::all().map(|c| c.code()).collect();
        let unique: std::collections::BTreeSet<_> = decisions.iter().collect();
        assert_eq!(unique.len(), decisions.len(), "{decisions:?}");
        for &outcome in DecisionOutcome::VARIANTS {
            assert_eq!(outcome.as_str().parse(), Ok(outcome));
            assert!(decisions.contains(&DecisionCode::Gated(outcome).code()));
        }
    }
}
