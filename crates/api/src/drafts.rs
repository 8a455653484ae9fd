//! The decision message the API and the inbox build from what a caller sent, written once:
//! the fields as sent (so gate 1 judges an HTTP caller's and a form's exactly as a queue
//! producer's), the run of the path, the caller as approver, and the version the decision's
//! kind needs — 1 for the whole turn, 2 call by call or for edits.

use countersign_core::messages::DECISION_VERSION_CALLS;
use countersign_core::{DecisionMessage, MessageError, RunId, MESSAGE_VERSION};
use serde_json::{json, Map, Value};

/// A decision on its way to gate 1, each field as the caller sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionDraft {
    fields: Map<String, Value>,
}

impl DecisionDraft {
    /// A decision of `approver` on `run_id`, with no field of its own yet.
    pub fn new(run_id: RunId, approver: &str) -> Self {
        let mut fields = Map::new();
        fields.insert("run_id".into(), json!(run_id));
        fields.insert("approver".into(), json!(approver));
        DecisionDraft { fields }
    }

    /// Sets `field` to `value` as sent; a JSON `null` leaves it out.
    pub fn field(mut self, field: &str, value: Value) -> Self {
        if value.is_null() {
            self.fields.remove(field);
        } else {
            self.fields.insert(field.to_owned(), value);
        }
        self
    }

    /// Sets `decision_id` unless the caller sent one.
    pub fn decision_id_or(mut self, id: impl Into<String>) -> Self {
        self.fields
            .entry("decision_id")
            .or_insert_with(|| Value::String(id.into()));
        self
    }

    /// The body of the message: version 2 when it carries `calls` or `edits`.
    pub fn body(self) -> Value {
        let version = if self.fields.contains_key("calls") || self.fields.contains_key("edits") {
            DECISION_VERSION_CALLS
        } else {
            MESSAGE_VERSION
        };
        let mut fields = self.fields;
        fields.insert("type".into(), json!(DecisionMessage::TYPE));
        fields.insert("version".into(), json!(version));
        Value::Object(fields)
    }

    /// The message, as gate 1 reads it.
    pub fn message(self) -> Result<DecisionMessage, MessageError> {
        DecisionMessage::from_json(self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunId {
        RunId::parse("0193c1f2-7a3b-7c4d-8e5f-0123456789ab").unwrap()
    }

    #[test]
    fn a_whole_turn_decision_is_version_1_and_calls_or_edits_version_2() {
        let card = |d: DecisionDraft| {
            d.field("suspension_seq", json!(1))
                .field("turn_digest", json!("a".repeat(64)))
                .decision_id_or("0193c1f3-1b2c-7d3e-9f40-abcdefabc001")
        };
        let whole = card(DecisionDraft::new(run(), "alice"))
            .field("approved", json!(true))
            .field("comment", Value::Null);
        assert_eq!(whole.clone().body()["version"], 1);
        assert!(
            whole.body().get("comment").is_none(),
            "null leaves a field out"
        );
        let by_call = card(DecisionDraft::new(run(), "alice"))
            .field("calls", json!([{"index": 0, "approved": true}]));
        assert_eq!(by_call.clone().body()["version"], 2);
        let message = by_call.message().expect("a decision call by call");
        assert!(message.approved && message.calls.len() == 1);
        let edit = card(DecisionDraft::new(run(), "alice"))
            .field("edits", json!([{"index": 0, "arguments": {"uid": 12}}]));
        assert!(edit.message().expect("an edit").edits_calls());
    }

    #[test]
    fn a_callers_decision_id_is_kept_and_a_field_as_sent_reaches_gate_one() {
        let d = DecisionDraft::new(run(), "alice")
            .field("decision_id", json!("mine"))
            .decision_id_or("generated")
            .field("suspension_seq", json!("one"));
        assert_eq!(d.clone().body()["decision_id"], "mine");
        assert!(matches!(d.message(), Err(MessageError::Invalid(_))));
    }
}
