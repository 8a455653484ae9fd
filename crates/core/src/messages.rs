//! The public messages: what any queue producer may send countersign, and the events it
//! publishes back. Version 1.
//!
//! Bodies are UTF-8 JSON objects. Unknown fields are ignored; a missing or mistyped required
//! field, a wrong `type` or an unsupported `version` is a [`MessageError`] whose
//! [`MessageError::reason`] is the code a dead-lettered message carries. Events carry ids
//! and outcome codes, never prompts, arguments or previews.
//!
//! Each message is one serde struct, its parser: a field's type refuses a bad value (a run id
//! that is not a version-7 UUID, a digest that is not 64 lowercase hex characters, a padded
//! name), and the refusal names the field.

use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use strum::{EnumString, IntoStaticStr, VariantArray};
use uuid::Uuid;

use crate::fields::field_names;
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// Chosen by the producer; a duplicate creates nothing.
    #[serde(deserialize_with = "id")]
    pub request_id: Uuid,
    #[serde(deserialize_with = "name")]
    pub agent: String,
    #[serde(deserialize_with = "name")]
    pub acting_user: String,
    #[serde(deserialize_with = "prompt")]
    pub prompt: String,
    /// Optional structured inputs (a JSON object), sealed at rest like the prompt. The model
    /// receives them with its first message; a scripted model substitutes them into its calls.
    #[serde(default, deserialize_with = "inputs")]
    pub inputs: Option<Map<String, Value>>,
}

/// A message's type, and its parser and writer: the envelope, then the struct's fields.
macro_rules! message {
    ($message:ident, $type:literal) => {
        impl $message {
            pub const TYPE: &'static str = $type;

            pub fn parse(body: &[u8]) -> Result<Self, MessageError> {
                Self::from_json(serde_json::from_slice(body).unwrap_or(Value::Null))
            }

            /// The message a JSON document is, as [`Self::parse`] reads its body.
            pub fn from_json(doc: Value) -> Result<Self, MessageError> {
                parse(doc, Self::TYPE)
            }

            pub fn to_json(&self) -> Value {
                message_json(self, Self::TYPE)
            }
        }
    };
}

/// The largest `inputs` object a run request may carry, in bytes of its JSON.
pub const MAX_INPUTS_BYTES: usize = 64 * 1024;

message!(RunRequest, "countersign.run_request");

/// An approver's decision on a suspended turn, queue `countersign.decisions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionMessage {
    // The fields are in the order a refusal names them: the first one refused is the reason.
    pub run_id: RunId,
    /// The card reviewed.
    pub suspension_seq: SuspensionSeq,
    /// The calls reviewed.
    pub turn_digest: TurnDigest,
    pub approved: bool,
    /// At most [`MAX_COMMENT_CHARS`]; a blank one is none.
    #[serde(
        default,
        deserialize_with = "comment",
        skip_serializing_if = "Option::is_none"
    )]
    pub comment: Option<String>,
    /// Chosen by the producer; a replay returns the recorded outcome.
    #[serde(deserialize_with = "id")]
    pub decision_id: Uuid,
    #[serde(deserialize_with = "name")]
    pub approver: String,
}

message!(DecisionMessage, "countersign.decision");

/// A message of type `expected` from its body: the envelope first, then its fields, each in the
/// order the struct declares them. The first field refused, missing or malformed, is the
/// reason.
fn parse<M: DeserializeOwned>(doc: Value, expected: &'static str) -> Result<M, MessageError> {
    let doc = envelope(doc, expected)?;
    let fields = field_names::<M>();
    let position = |field: &str| fields.iter().position(|f| *f == field);
    match fields_of::<M>(&doc, fields) {
        Err(MessageError::Invalid(field)) => {
            // A required field declared before the malformed one, and missing, comes first:
            // serde names a missing field only once it has read every present one.
            let mut without = doc;
            without.remove(field);
            match fields_of::<M>(&without, fields) {
                Err(MessageError::Missing(first)) if position(first) < position(field) => {
                    Err(MessageError::Missing(first))
                }
                _ => Err(MessageError::Invalid(field)),
            }
        }
        parsed => parsed,
    }
}

/// `doc` as `M`, its fields read in declaration order: the first refused names the error.
fn fields_of<M: DeserializeOwned>(
    doc: &Map<String, Value>,
    fields: &'static [&'static str],
) -> Result<M, MessageError> {
    let named = |key: &str| fields.iter().copied().find(|f| *f == key);
    let declared = fields
        .iter()
        .filter_map(|f| Some((*f, doc.get(*f)?.clone())));
    let rest = doc.iter().filter(|(k, _)| named(k).is_none());
    let ordered = declared
        .map(|(k, v)| (k.to_owned(), v))
        .chain(rest.map(|(k, v)| (k.clone(), v.clone())));
    let entries = serde::de::value::MapDeserializer::<_, serde_json::Error>::new(ordered);
    serde_path_to_error::deserialize(entries).map_err(|e| {
        if let Some(serde_path_to_error::Segment::Map { key }) = e.path().iter().next() {
            if let Some(field) = named(key) {
                return MessageError::Invalid(field);
            }
        }
        // serde's own words for a field that is not there: "missing field `name`".
        let message = e.inner().to_string();
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
            .and_then(named);
        missing.map_or(MessageError::NotAnObject, MessageError::Missing)
    })
}

/// The body of `message`, with its `type` and `version`.
fn message_json<M: Serialize>(message: &M, kind: &'static str) -> Value {
    let mut body = serde_json::to_value(message).unwrap_or_else(|_| json!({}));
    body["type"] = json!(kind);
    body["version"] = json!(MESSAGE_VERSION);
    body
}

/// A producer's id: a UUID, not the nil one.
fn id<'de, D: Deserializer<'de>>(d: D) -> Result<Uuid, D::Error> {
    let s = String::deserialize(d)?;
    Uuid::parse_str(&s)
        .ok()
        .filter(|u| !u.is_nil())
        .ok_or_else(|| D::Error::custom("not a UUID"))
}

/// A name (agent, user): 1 to [`MAX_NAME_CHARS`], unpadded, no control characters.
fn name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    let valid = !s.is_empty()
        && s.chars().count() <= MAX_NAME_CHARS
        && s.trim() == s
        && !s.chars().any(char::is_control);
    valid
        .then_some(s)
        .ok_or_else(|| D::Error::custom("not a name"))
}

/// A prompt: not blank, at most [`MAX_PROMPT_CHARS`].
fn prompt<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    let valid = !s.trim().is_empty() && s.chars().count() <= MAX_PROMPT_CHARS;
    valid
        .then_some(s)
        .ok_or_else(|| D::Error::custom("not a prompt"))
}

/// `inputs`: absent or null → none; otherwise a JSON object of at most [`MAX_INPUTS_BYTES`].
fn inputs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Map<String, Value>>, D::Error> {
    let map = Option::<Map<String, Value>>::deserialize(d)?;
    if let Some(map) = &map {
        let size = serde_json::to_vec(map).map_or(usize::MAX, |b| b.len());
        if size > MAX_INPUTS_BYTES {
            return Err(D::Error::custom("inputs too large"));
        }
    }
    Ok(map)
}

/// A comment: absent or null → none; at most [`MAX_COMMENT_CHARS`]; a blank one is none.
fn comment<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(c) if c.chars().count() > MAX_COMMENT_CHARS => {
            Err(D::Error::custom("comment too long"))
        }
        c => Ok(c.filter(|c| !c.trim().is_empty())),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, VariantArray)]
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
    /// A tool of a tool server or an MCP server is withheld from every run: the server lists it
    /// otherwise than an operator accepted it. Carries `tool`, `server`, `identity` (what it is
    /// listed as now) and `accepted_identity`; names no run. Announced once per change.
    #[strum(serialize = "tool.withheld")]
    ToolWithheld,
}

impl EventName {
    /// The events that hand a run to the workers: a new run, a turn released by its decision.
    /// Each is also the run's wake-up: the segments queue is bound to the events exchange under
    /// these names, so the one message that announces the change wakes a worker for it.
    pub const WAKE_UPS: [EventName; 2] = [EventName::RunAccepted, EventName::DecisionAccepted];

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether `name` (a routing key, an outbox row's `kind`) is one of
    /// [`EventName::WAKE_UPS`].
    pub fn wakes_a_worker(name: &str) -> bool {
        EventName::WAKE_UPS.iter().any(|wake_up| *wake_up == name)
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

fn envelope(doc: Value, expected: &'static str) -> Result<Map<String, Value>, MessageError> {
    let Value::Object(doc) = doc else {
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
    fn the_first_field_refused_in_the_order_of_the_fields_is_the_reason() {
        let envelope = json!({"type": "countersign.decision", "version": 1});
        assert_eq!(parse(&envelope), Err(MessageError::Missing("run_id")));
        let mut v = decision();
        v.as_object_mut().unwrap().remove("run_id");
        v["approved"] = json!("yes");
        assert_eq!(parse(&v), Err(MessageError::Missing("run_id")));
        let mut v = decision();
        v["run_id"] = json!(1);
        v.as_object_mut().unwrap().remove("approver");
        assert_eq!(parse(&v), Err(MessageError::Invalid("run_id")));
        let mut v = decision();
        v["approved"] = json!("yes");
        v["suspension_seq"] = json!("one");
        assert_eq!(parse(&v), Err(MessageError::Invalid("suspension_seq")));
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
