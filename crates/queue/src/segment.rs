//! The internal segment wake-up: "there may be work for this run".
//!
//! It carries nothing but the run id, because the run row in PostgreSQL is the truth: a
//! worker that receives it claims the run with a guarded UPDATE and simply acks when the
//! claim loses. Duplicates and stale wake-ups are therefore harmless, and a lost one is
//! re-published by the reaper.

use countersign_core::messages::MESSAGE_VERSION;
use countersign_core::{MessageError, RunId};
use serde_json::{json, Value};

/// The `type` of a segment wake-up.
pub const SEGMENT_TYPE: &str = "countersign.segment";

/// `{"type":"countersign.segment","version":1,"run_id":"…"}`.
pub fn segment_body(run_id: RunId) -> Value {
    json!({ "type": SEGMENT_TYPE, "version": MESSAGE_VERSION, "run_id": run_id })
}

/// The run a segment wake-up names. Errors are the same [`MessageError`]s (and dead-letter
/// reasons) as the public messages'.
pub fn parse_segment(body: &[u8]) -> Result<RunId, MessageError> {
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(body) else {
        return Err(MessageError::NotAnObject);
    };
    match doc.get("type") {
        None => return Err(MessageError::Missing("type")),
        Some(t) if t.as_str() == Some(SEGMENT_TYPE) => {}
        Some(_) => {
            return Err(MessageError::WrongType {
                expected: SEGMENT_TYPE,
            })
        }
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
