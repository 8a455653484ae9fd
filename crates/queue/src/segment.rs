//! The internal segment wake-up: "there may be work for this run".
//!
//! It carries nothing a worker believes but the run id, because the run row in PostgreSQL is
//! the truth: a worker that receives it claims the run with a guarded UPDATE and simply acks
//! when the claim loses. Duplicates and stale wake-ups are therefore harmless, and a lost one
//! is re-published by the reaper.
//!
//! A wake-up is one of two bodies. Most are events: the segments queue is bound to the events
//! exchange under the names of [`EventName::WAKE_UPS`] (`run.accepted`, `decision.accepted`),
//! so the outbox relay's publish of the event that hands a run to the workers is its wake-up
//! too, and the transition costs one message rather than two. The other is the bare segment
//! body ([`segment_body`]), which the reaper publishes for a run whose wake-up went missing and
//! a stopping worker hands back for one it will not take.

use countersign_core::messages::MESSAGE_VERSION;
use countersign_core::{Event, EventName, MessageError, RunId};
use serde_json::{json, Value};

/// The `type` of a segment wake-up.
pub const SEGMENT_TYPE: &str = "countersign.segment";

/// `{"type":"countersign.segment","version":1,"run_id":"…"}`.
pub fn segment_body(run_id: RunId) -> Value {
    json!({ "type": SEGMENT_TYPE, "version": MESSAGE_VERSION, "run_id": run_id })
}

/// The run a wake-up names: a segment body's, or a wake-up event's (see the module doc).
/// Errors are the same [`MessageError`]s (and dead-letter reasons) as the public messages'; an
/// event of another name is of the wrong type.
pub fn parse_segment(body: &[u8]) -> Result<RunId, MessageError> {
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(body) else {
        return Err(MessageError::NotAnObject);
    };
    let wrong_type = MessageError::WrongType {
        expected: SEGMENT_TYPE,
    };
    match doc.get("type").map(Value::as_str) {
        None => return Err(MessageError::Missing("type")),
        Some(Some(SEGMENT_TYPE)) => {}
        Some(Some(Event::TYPE)) => {
            let wakes = doc.get("event").and_then(Value::as_str);
            if !wakes.is_some_and(EventName::wakes_a_worker) {
                return Err(wrong_type);
            }
        }
        Some(_) => return Err(wrong_type),
    }
    match doc.get("version") {
        None => return Err(MessageError::Missing("version")),
        Some(v) if v.as_u64() == Some(MESSAGE_VERSION) => {}
        Some(_) => return Err(MessageError::UnsupportedVersion),
    }
    doc.get("run_id")
        .ok_or(MessageError::Missing("run_id"))?
        .as_str()
        .and_then(|s| RunId::parse(s).ok())
        .ok_or(MessageError::Invalid("run_id"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_body_round_trips() {
        let run = RunId::new();
        let body = segment_body(run);
        assert_eq!(body["type"], "countersign.segment");
        assert_eq!(body["version"], 1);
        assert_eq!(parse_segment(body.to_string().as_bytes()), Ok(run));
    }

    #[test]
    fn the_events_that_hand_a_run_to_the_workers_wake_them_and_no_other_does() {
        let run = RunId::new();
        for name in EventName::WAKE_UPS {
            let event = Event::new(name, json!({"run_id": run, "outcome": "accepted"}));
            let body = event.to_json("2026-12-05T00:00:00Z").to_string();
            assert_eq!(parse_segment(body.as_bytes()), Ok(run), "{body}");
        }
        for name in [
            EventName::RunSuspended,
            EventName::DecisionRefused,
            EventName::RunCompleted,
        ] {
            let body = Event::new(name, json!({"run_id": run}))
                .to_json("2026-12-05T00:00:00Z")
                .to_string();
            assert_eq!(
                parse_segment(body.as_bytes()),
                Err(MessageError::WrongType {
                    expected: SEGMENT_TYPE
                }),
                "{body}"
            );
        }
        let unnamed = json!({"type": Event::TYPE, "version": 1, "run_id": run}).to_string();
        assert!(parse_segment(unnamed.as_bytes()).is_err());
    }

    #[test]
    fn a_malformed_segment_body_is_refused_with_a_reason() {
        let run = RunId::new().to_string();
        let cases = [
            (json!([1]), MessageError::NotAnObject),
            (
                json!({"version": 1, "run_id": run}),
                MessageError::Missing("type"),
            ),
            (
                json!({"type": "countersign.decision", "version": 1, "run_id": run}),
                MessageError::WrongType {
                    expected: SEGMENT_TYPE,
                },
            ),
            (
                json!({"type": SEGMENT_TYPE, "version": 2, "run_id": run}),
                MessageError::UnsupportedVersion,
            ),
            (
                json!({"type": SEGMENT_TYPE, "version": 1}),
                MessageError::Missing("run_id"),
            ),
            (
                json!({"type": SEGMENT_TYPE, "version": 1, "run_id": "67e55044-10b1-426f-9247-bb680e5fe0c8"}),
                MessageError::Invalid("run_id"),
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(
                parse_segment(body.to_string().as_bytes()),
                Err(expected),
                "{body}"
            );
        }
        assert_eq!(parse_segment(b"\xff"), Err(MessageError::NotAnObject));
    }
}
