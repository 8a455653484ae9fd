//! The public messages: what any queue producer may send countersign, and the events it
//! publishes back. Version 1.
//!
//! Bodies are UTF-8 JSON objects. Unknown fields are ignored; a missing or mistyped required
//! field, a wrong `type` or an unsupported `version` is a [`MessageError`] whose
//! [`MessageError::reason`] is the code a dead-lettered message carries. Events carry ids
//! and outcome codes, never prompts, arguments or previews.

use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::ids::{RunId, SuspensionSeq, TurnDigest};

/// The message version this code reads and writes.
pub const MESSAGE_VERSION: u64 = 1;
/// Longest accepted prompt, in characters.
pub const MAX_PROMPT_CHARS: usize = 32 * 1024;
/// Longest accepted name (agent, user), in characters.
pub const MAX_NAME_CHARS: usize = 200;
/// Longest accepted decision comment, in characters.
pub const MAX_COMMENT_CHARS: usize = 4 * 1024;

/// Why a message was refused before anything else looked at it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    #[error("the body is not a UTF-8 JSON object")]
    NotAnObject,
    #[error("the message type is not {expected}")]
    WrongType { expected: &'static str },
    #[error("unsupported message version")]
    UnsupportedVersion,
    #[error("required field {0} is missing")]
    Missing(&'static str),
    #[error("field {0} is malformed")]
    Invalid(&'static str),
}

impl MessageError {
    /// The reason a dead-lettered message carries, e.g. `invalid_field:turn_digest`.
    pub fn reason(&self) -> String {
        match self {
            MessageError::NotAnObject => "not_a_json_object".into(),
            MessageError::WrongType { .. } => "wrong_message_type".into(),
            MessageError::UnsupportedVersion => "unsupported_version".into(),
            MessageError::Missing(f) => format!("missing_field:{f}"),
            MessageError::Invalid(f) => format!("invalid_field:{f}"),
        }
    }
}

/// A request to run an agent, queue `countersign.run-requests`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// Chosen by the producer; a duplicate creates nothing.
    pub request_id: Uuid,
    pub agent: String,
    pub acting_user: String,
    pub prompt: String,
    /// Optional structured inputs (a JSON object), sealed at rest like the prompt. The model
    /// receives them with its first message; a scripted model substitutes them into its calls.
    pub inputs: Option<Map<String, Value>>,
}

/// The largest `inputs` object a run request may carry, in bytes of its JSON.
pub const MAX_INPUTS_BYTES: usize = 64 * 1024;

impl RunRequest {
    pub const TYPE: &'static str = "countersign.run_request";

    pub fn parse(body: &[u8]) -> Result<Self, MessageError> {
        let doc = envelope(body, Self::TYPE)?;
        Ok(RunRequest {
            request_id: uuid_field(&doc, "request_id")?,
            agent: name_field(&doc, "agent")?,
            acting_user: name_field(&doc, "acting_user")?,
            prompt: text_field(&doc, "prompt", MAX_PROMPT_CHARS)?,
            inputs: inputs_field(&doc)?,
        })
    }

    pub fn to_json(&self) -> Value {
        json!({
            "type": Self::TYPE,
            "version": MESSAGE_VERSION,
            "request_id": self.request_id,
            "agent": self.agent,
            "acting_user": self.acting_user,
            "prompt": self.prompt,
            "inputs": self.inputs,
        })
    }
}

/// `inputs`: absent or null → none; otherwise a JSON object of at most [`MAX_INPUTS_BYTES`].
fn inputs_field(doc: &Map<String, Value>) -> Result<Option<Map<String, Value>>, MessageError> {
    match doc.get("inputs") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => {
            let size = serde_json::to_vec(map).map_or(usize::MAX, |b| b.len());
            if size > MAX_INPUTS_BYTES {
                return Err(MessageError::Invalid("inputs"));
            }
            Ok(Some(map.clone()))
        }
        Some(_) => Err(MessageError::Invalid("inputs")),
    }
}

/// An approver's decision on a suspended turn, queue `countersign.decisions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionMessage {
    /// Chosen by the producer; a replay returns the recorded outcome.
    pub decision_id: Uuid,
    pub run_id: RunId,
    /// The card reviewed.
    pub suspension_seq: SuspensionSeq,
    /// The calls reviewed.
    pub turn_digest: TurnDigest,
    pub approved: bool,
    pub approver: String,
    pub comment: Option<String>,
}

impl DecisionMessage {
    pub const TYPE: &'static str = "countersign.decision";

    pub fn parse(body: &[u8]) -> Result<Self, MessageError> {
        let doc = envelope(body, Self::TYPE)?;
        let run_id = doc
            .get("run_id")
            .ok_or(MessageError::Missing("run_id"))?
            .as_str()
            .and_then(|s| RunId::parse(s).ok())
            .ok_or(MessageError::Invalid("run_id"))?;
        let suspension_seq = doc
            .get("suspension_seq")
            .ok_or(MessageError::Missing("suspension_seq"))?
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .and_then(|n| SuspensionSeq::new(n).ok())
            .ok_or(MessageError::Invalid("suspension_seq"))?;
        let turn_digest = doc
            .get("turn_digest")
            .ok_or(MessageError::Missing("turn_digest"))?
            .as_str()
            .and_then(|s| TurnDigest::parse(s).ok())
            .ok_or(MessageError::Invalid("turn_digest"))?;
        let approved = doc
            .get("approved")
            .ok_or(MessageError::Missing("approved"))?
            .as_bool()
            .ok_or(MessageError::Invalid("approved"))?;
        let comment = match doc.get("comment") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) if c.chars().count() <= MAX_COMMENT_CHARS => {
                Some(c.clone()).filter(|c| !c.trim().is_empty())
            }
            Some(_) => return Err(MessageError::Invalid("comment")),
        };
        Ok(DecisionMessage {
            decision_id: uuid_field(&doc, "decision_id")?,
            run_id,
            suspension_seq,
            turn_digest,
            approved,
            approver: name_field(&doc, "approver")?,
            comment,
        })
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "type": Self::TYPE,
            "version": MESSAGE_VERSION,
            "decision_id": self.decision_id,
            "run_id": self.run_id,
            "suspension_seq": self.suspension_seq,
            "turn_digest": self.turn_digest,
            "approved": self.approved,
            "approver": self.approver,
        });
        if let Some(c) = &self.comment {
            v["comment"] = json!(c);
        }
        v
    }
}

/// An event on the topic exchange `countersign.events`; the routing key is its name.
///
/// The services never publish an `Event` directly: the store writes it to its transactional
/// outbox in the transaction of the change it announces, with `at` from the database clock and
/// an `event_id` (a UUID, also the AMQP `message_id`) added to [`Event::to_json`]'s body, and a
/// relay publishes that stored body with confirms. Delivery is at least once; consumers
/// deduplicate by `event_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: EventName,
    /// Ids, codes and counts only.
    pub fields: Map<String, Value>,
}

/// The name of an event: its routing key on `countersign.events`, and the `kind` of its outbox
/// and audit rows.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
    strum::VariantArray,
)]
pub enum EventName {
    /// A run exists for a request. Carries `request_id` and `run_id`.
    #[strum(serialize = "run.accepted")]
    RunAccepted,
    /// A run request was refused; nothing was created. Carries `request_id` and `outcome`.
    #[strum(serialize = "run.refused")]
    RunRefused,
    #[strum(serialize = "run.suspended")]
    RunSuspended,
    #[strum(serialize = "run.preview_moved")]
    RunPreviewMoved,
    #[strum(serialize = "run.completed")]
    RunCompleted,
    #[strum(serialize = "run.failed")]
    RunFailed,
    #[strum(serialize = "run.cancelled")]
    RunCancelled,
    /// A decision released its turn (an approval or a denial). Carries `decision_id`, `run_id`
    /// and `outcome`.
    #[strum(serialize = "decision.accepted")]
    DecisionAccepted,
    /// A decision was refused; the run is unchanged. Carries `decision_id`, `run_id`, `outcome`.
    #[strum(serialize = "decision.refused")]
    DecisionRefused,
}

impl EventName {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl PartialEq<&str> for EventName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Event {
    pub const TYPE: &'static str = "countersign.event";

    /// An event with its fields; `fields` must be a JSON object of ids and codes.
    pub fn new(name: EventName, fields: Value) -> Self {
        let fields = match fields {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        Event { name, fields }
    }

    /// The body, stamped with `at` (RFC 3339). The outbox sets `at` to the database's time and
    /// adds `event_id`; a reply to `reply_to` (not an event) uses this body as it is.
    pub fn to_json(&self, at: &str) -> Value {
        let mut body = Map::new();
        body.insert("type".into(), json!(Self::TYPE));
        body.insert("version".into(), json!(MESSAGE_VERSION));
        body.insert("event".into(), json!(self.name.as_str()));
        for (k, v) in &self.fields {
            body.insert(k.clone(), v.clone());
        }
        body.insert("at".into(), json!(at));
        Value::Object(body)
    }
}

fn envelope(body: &[u8], expected: &'static str) -> Result<Map<String, Value>, MessageError> {
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(body) else {
        return Err(MessageError::NotAnObject);
    };
    match doc.get("type") {
        None => return Err(MessageError::Missing("type")),
        Some(t) if t.as_str() == Some(expected) => {}
        Some(_) => return Err(MessageError::WrongType { expected }),
    }
    match doc.get("version") {
        None => return Err(MessageError::Missing("version")),
        Some(v) if v.as_u64() == Some(MESSAGE_VERSION) => {}
        Some(_) => return Err(MessageError::UnsupportedVersion),
    }
    Ok(doc)
}

fn uuid_field(doc: &Map<String, Value>, field: &'static str) -> Result<Uuid, MessageError> {
    doc.get(field)
        .ok_or(MessageError::Missing(field))?
        .as_str()
        .and_then(|s| Uuid::parse_str(s).ok())
        .filter(|u| !u.is_nil())
        .ok_or(MessageError::Invalid(field))
}

fn name_field(doc: &Map<String, Value>, field: &'static str) -> Result<String, MessageError> {
    let s = doc.get(field).ok_or(MessageError::Missing(field))?.as_str();
    s.filter(|s| {
        !s.is_empty()
            && s.chars().count() <= MAX_NAME_CHARS
            && s.trim() == *s
            && !s.chars().any(char::is_control)
    })
    .map(str::to_owned)
    .ok_or(MessageError::Invalid(field))
}

fn text_field(
    doc: &Map<String, Value>,
    field: &'static str,
    max: usize,
) -> Result<String, MessageError> {
    let s = doc.get(field).ok_or(MessageError::Missing(field))?.as_str();
    s.filter(|s| !s.trim().is_empty() && s.chars().count() <= max)
        .map(str::to_owned)
        .ok_or(MessageError::Invalid(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision() -> Value {
        json!({
            "type": "countersign.decision", "version": 1,
            "decision_id": "0193c1f3-0000-7000-8000-000000000001",
            "run_id": RunId::new().to_string(),
            "suspension_seq": 1,
            "turn_digest": "a".repeat(64),
            "approved": true,
            "approver": "alice",
            "comment": "fine",
            "unknown_field": {"ignored": true}
        })
    }

    fn parse(v: &Value) -> Result<DecisionMessage, MessageError> {
        DecisionMessage::parse(v.to_string().as_bytes())
    }

    #[test]
    fn a_decision_parses_and_ignores_unknown_fields() {
        let d = parse(&decision()).unwrap();
        assert!(d.approved);
        assert_eq!(d.comment.as_deref(), Some("fine"));
        assert_eq!(
            DecisionMessage::parse(d.to_json().to_string().as_bytes()).unwrap(),
            d
        );
    }

    #[test]
    fn each_required_decision_field_missing_or_mistyped_is_named() {
        for field in [
            "decision_id",
            "run_id",
            "suspension_seq",
            "turn_digest",
            "approved",
            "approver",
        ] {
            let mut v = decision();
            v.as_object_mut().unwrap().remove(field);
            assert_eq!(parse(&v), Err(MessageError::Missing(field)));
            let mut v = decision();
            v[field] = json!([]);
            assert_eq!(parse(&v), Err(MessageError::Invalid(field)));
        }
    }

    #[test]
    fn a_decision_with_a_non_v7_run_id_or_an_uppercase_digest_is_malformed() {
        let mut v = decision();
        v["run_id"] = json!("67e55044-10b1-426f-9247-bb680e5fe0c8");
        assert_eq!(parse(&v), Err(MessageError::Invalid("run_id")));
        let mut v = decision();
        v["turn_digest"] = json!("A".repeat(64));
        assert_eq!(parse(&v), Err(MessageError::Invalid("turn_digest")));
        let mut v = decision();
        v["suspension_seq"] = json!(0);
        assert_eq!(parse(&v), Err(MessageError::Invalid("suspension_seq")));
    }

    #[test]
    fn the_envelope_is_checked_first() {
        assert_eq!(
            DecisionMessage::parse(b"not json"),
            Err(MessageError::NotAnObject)
        );
        assert_eq!(
            DecisionMessage::parse(b"[1]"),
            Err(MessageError::NotAnObject)
        );
        let mut v = decision();
        v["type"] = json!("countersign.run_request");
        assert_eq!(
            parse(&v),
            Err(MessageError::WrongType {
                expected: "countersign.decision"
            })
        );
        let mut v = decision();
        v["version"] = json!(2);
        assert_eq!(parse(&v), Err(MessageError::UnsupportedVersion));
        assert_eq!(
            MessageError::Invalid("turn_digest").reason(),
            "invalid_field:turn_digest"
        );
    }

    #[test]
    fn a_run_request_carries_an_inputs_object_and_refuses_anything_else() {
        let r = RunRequest {
            request_id: Uuid::now_v7(),
            agent: "seo-assistant".into(),
            acting_user: "editor".into(),
            prompt: "Tighten the page.".into(),
            inputs: json!({"page": 12}).as_object().cloned(),
        };
        assert_eq!(
            RunRequest::parse(r.to_json().to_string().as_bytes()).unwrap(),
            r
        );
        for bad in [json!([12]), json!("12"), json!(12)] {
            let mut v = r.to_json();
            v["inputs"] = bad;
            assert_eq!(
                RunRequest::parse(v.to_string().as_bytes()),
                Err(MessageError::Invalid("inputs"))
            );
        }
        let mut v = r.to_json();
        v["inputs"] = json!({"blob": "x".repeat(MAX_INPUTS_BYTES)});
        assert_eq!(
            RunRequest::parse(v.to_string().as_bytes()),
            Err(MessageError::Invalid("inputs"))
        );
    }

    #[test]
    fn a_run_request_round_trips_and_refuses_an_empty_prompt() {
        let r = RunRequest {
            request_id: Uuid::now_v7(),
            agent: "seo-assistant".into(),
            acting_user: "editor".into(),
            prompt: "Tighten page 12.".into(),
            inputs: None,
        };
        assert_eq!(
            RunRequest::parse(r.to_json().to_string().as_bytes()).unwrap(),
            r
        );
        let mut v = r.to_json();
        v["prompt"] = json!("   ");
        assert_eq!(
            RunRequest::parse(v.to_string().as_bytes()),
            Err(MessageError::Invalid("prompt"))
        );
        let mut v = r.to_json();
        v["agent"] = json!(" padded");
        assert_eq!(
            RunRequest::parse(v.to_string().as_bytes()),
            Err(MessageError::Invalid("agent"))
        );
    }

    #[test]
    fn an_event_carries_its_name_fields_and_time() {
        let e = Event::new(
            EventName::DecisionRefused,
            json!({"decision_id": "d", "outcome": "stale_turn"}),
        );
        let body = e.to_json("2026-11-30T10:00:00Z");
        assert_eq!(body["type"], "countersign.event");
        assert_eq!(body["event"], "decision.refused");
        assert_eq!(body["outcome"], "stale_turn");
        assert_eq!(body["at"], "2026-11-30T10:00:00Z");
    }
}
