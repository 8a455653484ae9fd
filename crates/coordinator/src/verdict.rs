//! What the coordinator tells its caller to do with a message.
//!
//! A verdict is the whole contract between the gates and the transport: the caller
//! dead-letters when [`RequestVerdict::dead_letter_reason`] / [`DecisionVerdict::dead_letter_reason`]
//! says so (and acknowledges otherwise), publishes the [`Dispatch`] wake-up, publishes the
//! event on `countersign.events` under its name, and sends the reply to `reply_to` when the
//! message carried one. Events and replies carry ids and outcome codes, never a prompt or a
//! comment.
//!
//! Events are at least once: a replayed decision or a duplicate run request publishes its
//! event again, because the first delivery may have been recorded and then lost before its
//! event was published. Consumers deduplicate by `decision_id` / `request_id`. Dispatches are
//! not repeated: the reaper re-publishes a queued run whose wake-up was never confirmed.
//!
//! Only outcomes of an authenticated producer reach the events exchange. A malformed or
//! unauthenticated message gets a reply (which goes back to its sender) and nothing else: an
//! unauthenticated producer must not be able to put a refusal for someone else's decision id
//! on the bus.

use countersign_core::{Event, RunId};
use countersign_store::{DecisionOutcome, Segment};
use serde_json::json;
use uuid::Uuid;

/// A run was created for a request (or the request was a duplicate of one that was).
pub const RUN_ACCEPTED: &str = "run.accepted";
/// A run request was refused; nothing was created. Carries `request_id` and `outcome`.
pub const RUN_REFUSED: &str = "run.refused";
/// A decision released its turn (an approval or a denial).
pub const DECISION_ACCEPTED: &str = "decision.accepted";
/// A decision was refused; the run is unchanged.
pub const DECISION_REFUSED: &str = "decision.refused";

/// A segment wake-up to publish on `countersign.segments`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch {
    pub run_id: RunId,
    pub segment: Segment,
}

/// What became of a run request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestOutcome {
    /// A run exists for the request (created now, or by an earlier copy of it).
    Accepted,
    /// The body is not a version-1 run request; `reason` is the dead-letter reason.
    Malformed { reason: String },
    /// No authenticated producer, or one not allowed to assert this acting user.
    UnauthenticatedProducer,
    /// The acting user does not exist in the content store (or is disabled).
    UnknownActingUser,
    /// The agent configuration does not exist or is not active.
    ConfigurationGone,
}

impl RequestOutcome {
    pub fn code(&self) -> &'static str {
        match self {
            RequestOutcome::Accepted => "accepted",
            RequestOutcome::Malformed { .. } => "malformed",
            RequestOutcome::UnauthenticatedProducer => "unauthenticated_producer",
            RequestOutcome::UnknownActingUser => "unknown_acting_user",
            RequestOutcome::ConfigurationGone => "configuration_gone",
        }
    }
}

/// The verdict on a run request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestVerdict {
    pub outcome: RequestOutcome,
    /// `None` only when the body was malformed.
    pub request_id: Option<Uuid>,
    /// The run created for the request, now or before.
    pub run_id: Option<RunId>,
    /// `true` when this message created the run; `false` for a duplicate and every refusal.
    pub created: bool,
    /// The start segment, only when the run was created now.
    pub dispatch: Option<Dispatch>,
    /// `run.accepted` / `run.refused` for `countersign.events`; `None` for a malformed or
    /// unauthenticated message.
    pub event: Option<Event>,
    /// The outcome for the producer's `reply_to`, as an event body.
    pub reply: Event,
}

impl RequestVerdict {
    /// The reason to dead-letter the message with, when it must be dead-lettered.
    pub fn dead_letter_reason(&self) -> Option<&str> {
        match &self.outcome {
            RequestOutcome::Malformed { reason } => Some(reason),
            _ => None,
        }
    }

    /// The reply as a UTF-8 JSON body, stamped with `at` (RFC 3339).
    pub fn reply_body(&self, at: &str) -> Vec<u8> {
        body(&self.reply, at)
    }

    pub(crate) fn malformed(reason: String) -> Self {
        RequestVerdict {
            reply: Event::new(
                RUN_REFUSED,
                json!({"outcome": "malformed", "reason": reason}),
            ),
            outcome: RequestOutcome::Malformed { reason },
            request_id: None,
            run_id: None,
            created: false,
            dispatch: None,
            event: None,
        }
    }

    pub(crate) fn refused(request_id: Uuid, outcome: RequestOutcome) -> Self {
        let event = Event::new(
            RUN_REFUSED,
            json!({"request_id": request_id, "outcome": outcome.code()}),
        );
        let published = !matches!(outcome, RequestOutcome::UnauthenticatedProducer);
        RequestVerdict {
            outcome,
            request_id: Some(request_id),
            run_id: None,
            created: false,
            dispatch: None,
            event: published.then(|| event.clone()),
            reply: event,
        }
    }

    pub(crate) fn accepted(request_id: Uuid, run_id: RunId, created: bool) -> Self {
        let event = Event::new(
            RUN_ACCEPTED,
            json!({"request_id": request_id, "run_id": run_id}),
        );
        RequestVerdict {
            outcome: RequestOutcome::Accepted,
            request_id: Some(request_id),
            run_id: Some(run_id),
            created,
            dispatch: created.then_some(Dispatch {
                run_id,
                segment: Segment::Start,
            }),
            event: Some(event.clone()),
            reply: event,
        }
    }
}

/// What became of a decision: the two outcomes decided before anything is recorded, or the
/// outcome the gates decided (recorded, except `not_auditable`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecisionCode {
    /// Gate 1: not a version-1 decision; `reason` is the dead-letter reason. Not recorded.
    Malformed { reason: String },
    /// Gate 2: no authenticated producer, or one not allowed to assert this approver. Not
    /// recorded, or an unauthenticated producer could burn a decision id.
    UnauthenticatedProducer,
    /// Gates 3–10.
    Gated(DecisionOutcome),
}

impl DecisionCode {
    pub fn code(&self) -> &'static str {
        match self {
            DecisionCode::Malformed { .. } => "malformed",
            DecisionCode::UnauthenticatedProducer => "unauthenticated_producer",
            DecisionCode::Gated(outcome) => outcome.as_str(),
        }
    }
}

/// The verdict on a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionVerdict {
    pub outcome: DecisionCode,
    /// `None` only when the body was malformed.
    pub decision_id: Option<Uuid>,
    /// The run the decision names; `None` only when the body was malformed.
    pub run_id: Option<RunId>,
    /// The decision id was recorded before: this is its recorded outcome, and nothing else
    /// happened.
    pub replayed: bool,
    /// The resume segment: only for a decision accepted now (never on a replay).
    pub dispatch: Option<Dispatch>,
    /// `decision.accepted` / `decision.refused` for `countersign.events`, with `decision_id`,
    /// `run_id` and `outcome`; `None` for a malformed or unauthenticated message.
    pub event: Option<Event>,
    /// The outcome for the producer's `reply_to`, as an event body.
    pub reply: Event,
}

impl DecisionVerdict {
    /// The reason to dead-letter the message with, when it must be dead-lettered.
    pub fn dead_letter_reason(&self) -> Option<&str> {
        match &self.outcome {
            DecisionCode::Malformed { reason } => Some(reason),
            _ => None,
        }
    }

    /// Whether the decision released its turn (now or, on a replay, before).
    pub fn is_accepted(&self) -> bool {
        self.outcome == DecisionCode::Gated(DecisionOutcome::Accepted)
    }

    /// The reply as a UTF-8 JSON body, stamped with `at` (RFC 3339).
    pub fn reply_body(&self, at: &str) -> Vec<u8> {
        body(&self.reply, at)
    }

    pub(crate) fn malformed(reason: String) -> Self {
        DecisionVerdict {
            reply: Event::new(
                DECISION_REFUSED,
                json!({"outcome": "malformed", "reason": reason}),
            ),
            outcome: DecisionCode::Malformed { reason },
            decision_id: None,
            run_id: None,
            replayed: false,
            dispatch: None,
            event: None,
        }
    }

    pub(crate) fn unauthenticated(decision_id: Uuid, run_id: RunId) -> Self {
        DecisionVerdict {
            reply: decision_event(
                DECISION_REFUSED,
                decision_id,
                run_id,
                "unauthenticated_producer",
            ),
            outcome: DecisionCode::UnauthenticatedProducer,
            decision_id: Some(decision_id),
            run_id: Some(run_id),
            replayed: false,
            dispatch: None,
            event: None,
        }
    }

    pub(crate) fn gated(
        decision_id: Uuid,
        run_id: RunId,
        outcome: DecisionOutcome,
        replayed: bool,
    ) -> Self {
        let accepted = outcome == DecisionOutcome::Accepted;
        let name = if accepted {
            DECISION_ACCEPTED
        } else {
            DECISION_REFUSED
        };
        let event = decision_event(name, decision_id, run_id, outcome.as_str());
        DecisionVerdict {
            outcome: DecisionCode::Gated(outcome),
            decision_id: Some(decision_id),
            run_id: Some(run_id),
            replayed,
            dispatch: (accepted && !replayed).then_some(Dispatch {
                run_id,
                segment: Segment::Resume,
            }),
            event: Some(event.clone()),
            reply: event,
        }
    }
}

fn decision_event(name: &'static str, decision_id: Uuid, run_id: RunId, outcome: &str) -> Event {
    Event::new(
        name,
        json!({"decision_id": decision_id, "run_id": run_id, "outcome": outcome}),
    )
}

fn body(event: &Event, at: &str) -> Vec<u8> {
    // Serialising a `Value` cannot fail.
    serde_json::to_vec(&event.to_json(at)).unwrap_or_default()
}
