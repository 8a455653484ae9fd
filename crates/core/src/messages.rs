//! The public messages: what any queue producer may send countersign, and the events it
//! publishes back. Version 1; a decision call by call, or one that edits calls, is version 2
//! (a version-1 decision, on the whole turn, stays valid).
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
use crate::ids::{CallIndex, RunId, SuspensionSeq, TurnDigest};

/// The message version this code reads and writes.
pub const MESSAGE_VERSION: u64 = 1;
/// The decision version that decides call by call or edits calls.
pub const DECISION_VERSION_CALLS: u64 = 2;
/// Most calls a decision may name, in `calls` or in `edits`.
pub const MAX_DECISION_CALLS: usize = 256;
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
                let (doc, _) = envelope(doc, Self::TYPE, &[MESSAGE_VERSION])?;
                parse(doc)
            }

            pub fn to_json(&self) -> Value {
                message_json(self, Self::TYPE, MESSAGE_VERSION)
            }
        }
    };
}

/// The largest `inputs` object a run request may carry, in bytes of its JSON.
pub const MAX_INPUTS_BYTES: usize = 64 * 1024;

message!(RunRequest, "countersign.run_request");

/// An approver's decision on a suspended turn, queue `countersign.decisions`.
///
/// Version 1 decides the whole turn: `approved`, and a `comment` the model reads with a denial.
/// Version 2 may instead decide it call by call (`calls`: every call of the turn, each approved
/// or denied with a `message`), or change calls' arguments (`edits`), which approves nothing:
/// the card is issued anew with them. `approved` may then be left out; given, it must agree
/// (true when some call is approved; false with edits).
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
    /// Version 2: the verdict on each call of the turn, by index; empty for a decision on the
    /// whole turn.
    #[serde(
        default,
        deserialize_with = "verdicts",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub calls: Vec<CallVerdict>,
    /// Version 2: new arguments for calls of the turn, by index.
    #[serde(
        default,
        deserialize_with = "edits",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub edits: Vec<ArgumentsEdit>,
    /// Chosen by the producer; a replay returns the recorded outcome.
    #[serde(deserialize_with = "id")]
    pub decision_id: Uuid,
    #[serde(deserialize_with = "name")]
    pub approver: String,
}

/// The approver's verdict on one call of the turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallVerdict {
    pub index: CallIndex,
    pub approved: bool,
    /// With a denial: what the model is told of it. At most [`MAX_COMMENT_CHARS`]; a blank one
    /// is none.
    #[serde(
        default,
        deserialize_with = "comment",
        skip_serializing_if = "Option::is_none"
    )]
    pub message: Option<String>,
}

/// New arguments for one call of the turn, as an approver wrote them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgumentsEdit {
    pub index: CallIndex,
    /// The call's tool, when the producer names it: an edit is refused unless it is the tool
    /// the call already has (an edit never changes which tool runs).
    #[serde(
        default,
        deserialize_with = "optional_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool: Option<String>,
    /// A JSON object of at most [`MAX_INPUTS_BYTES`].
    #[serde(deserialize_with = "arguments")]
    pub arguments: Map<String, Value>,
}

impl DecisionMessage {
    pub const TYPE: &'static str = "countersign.decision";

    pub fn parse(body: &[u8]) -> Result<Self, MessageError> {
        Self::from_json(serde_json::from_slice(body).unwrap_or(Value::Null))
    }

    /// The decision a JSON document is, as [`Self::parse`] reads its body: version 1 or 2.
    pub fn from_json(doc: Value) -> Result<Self, MessageError> {
        let (mut doc, version) =
            envelope(doc, Self::TYPE, &[MESSAGE_VERSION, DECISION_VERSION_CALLS])?;
        let given =
            |doc: &Map<String, Value>, field: &str| doc.get(field).is_some_and(|v| !v.is_null());
        if version == MESSAGE_VERSION {
            // A version-1 producer decides the whole turn; a denial of one call must not pass
            // for an approval of all of them.
            for field in ["calls", "edits"] {
                if given(&doc, field) {
                    return Err(MessageError::Invalid(field));
                }
            }
            return parse(doc);
        }
        let approved_given = given(&doc, "approved");
        if !approved_given && (given(&doc, "calls") || given(&doc, "edits")) {
            // Filled below from the calls; a placeholder keeps the field order's refusals.
            doc.insert("approved".into(), Value::Bool(false));
        }
        let mut m: DecisionMessage = parse(doc)?;
        if !m.calls.is_empty() && !m.edits.is_empty() {
            return Err(MessageError::Invalid("edits"));
        }
        let implied = m.calls.iter().any(|c| c.approved);
        if !approved_given {
            m.approved = implied;
        } else if (!m.calls.is_empty() && m.approved != implied)
            || (!m.edits.is_empty() && m.approved)
        {
            return Err(MessageError::Invalid("approved"));
        }
        Ok(m)
    }

    /// The body of this decision: version 2 when it decides call by call or edits calls.
    pub fn to_json(&self) -> Value {
        message_json(self, Self::TYPE, self.version())
    }

    /// The version this decision is written in.
    pub fn version(&self) -> u64 {
        if self.calls.is_empty() && self.edits.is_empty() {
            MESSAGE_VERSION
        } else {
            DECISION_VERSION_CALLS
        }
    }

    /// Whether this decision changes calls rather than deciding the card.
    pub fn edits_calls(&self) -> bool {
        !self.edits.is_empty()
    }
}

/// `calls`: one to [`MAX_DECISION_CALLS`] verdicts, each index once.
fn verdicts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<CallVerdict>, D::Error> {
    let calls = Option::<Vec<CallVerdict>>::deserialize(d)?;
    if calls.as_ref().is_some_and(Vec::is_empty) {
        // An empty list would pass for a denial of the whole turn.
        return Err(D::Error::custom("no verdict"));
    }
    let calls = calls.unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    if calls.len() > MAX_DECISION_CALLS || !calls.iter().all(|c| seen.insert(c.index)) {
        return Err(D::Error::custom("not a verdict per call"));
    }
    Ok(calls)
}

/// `edits`: one to [`MAX_DECISION_CALLS`], each index once.
fn edits<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ArgumentsEdit>, D::Error> {
    let edits = Option::<Vec<ArgumentsEdit>>::deserialize(d)?;
    if edits.as_ref().is_some_and(Vec::is_empty) {
        return Err(D::Error::custom("no edit"));
    }
    let edits = edits.unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    if edits.len() > MAX_DECISION_CALLS || !edits.iter().all(|e| seen.insert(e.index)) {
        return Err(D::Error::custom("not an edit per call"));
    }
    Ok(edits)
}

/// An edit's `arguments`: a JSON object of at most [`MAX_INPUTS_BYTES`].
fn arguments<'de, D: Deserializer<'de>>(d: D) -> Result<Map<String, Value>, D::Error> {
    let map = Map::<String, Value>::deserialize(d)?;
    let size = serde_json::to_vec(&map).map_or(usize::MAX, |b| b.len());
    if size > MAX_INPUTS_BYTES {
        return Err(D::Error::custom("arguments too large"));
    }
    Ok(map)
}

/// A message from its body, past its envelope: its fields, each in the order the struct
/// declares them. The first field refused, missing or malformed, is the reason.
fn parse<M: DeserializeOwned>(doc: Map<String, Value>) -> Result<M, MessageError> {
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
fn message_json<M: Serialize>(message: &M, kind: &'static str, version: u64) -> Value {
    let mut body = serde_json::to_value(message).unwrap_or_else(|_| json!({}));
    body["type"] = json!(kind);
    body["version"] = json!(version);
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

/// An optional name: absent or null → none; otherwise as [`name`].
fn optional_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) => name(serde::de::value::StringDeserializer::<D::Error>::new(s)).map(Some),
    }
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
    /// An approval was recorded as a vote on a card whose agent wants more than one approver;
    /// the card waits for the rest. Carries `decision_id`, `run_id` and `outcome`.
    #[strum(serialize = "card.approval_recorded")]
    CardApprovalRecorded,
    /// A denial was recorded as a vote; the card waits until enough deny it. Carries
    /// `decision_id`, `run_id` and `outcome`.
    #[strum(serialize = "card.denial_recorded")]
    CardDenialRecorded,
    /// A card waited longer than its agent's reminder time. Carries `run_id` and
    /// `suspension_seq`.
    #[strum(serialize = "card.reminded")]
    CardReminded,
    /// A card waited longer than its agent's escalation time: its agent's backup group may now
    /// decide it. Carries `run_id`, `suspension_seq` and `backup_group`.
    #[strum(serialize = "card.escalated")]
    CardEscalated,
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

/// The body's fields, and the version it is written in: one of `versions`, of type `expected`.
fn envelope(
    doc: Value,
    expected: &'static str,
    versions: &[u64],
) -> Result<(Map<String, Value>, u64), MessageError> {
    let Value::Object(doc) = doc else {
        return Err(MessageError::NotAnObject);
    };
    match doc.get("type") {
        None => return Err(MessageError::Missing("type")),
        Some(t) if t.as_str() == Some(expected) => {}
        Some(_) => return Err(MessageError::WrongType { expected }),
    }
    let version = match doc.get("version") {
        None => return Err(MessageError::Missing("version")),
        Some(v) => v
            .as_u64()
            .filter(|v| versions.contains(v))
            .ok_or(MessageError::UnsupportedVersion)?,
    };
    Ok((doc, version))
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
        v["version"] = json!(3);
        assert_eq!(parse(&v), Err(MessageError::UnsupportedVersion));
        assert_eq!(
            MessageError::Invalid("turn_digest").reason(),
            "invalid_field:turn_digest"
        );
    }

    fn by_call() -> Value {
        let mut v = decision();
        v["version"] = json!(2);
        v.as_object_mut().unwrap().remove("approved");
        v["calls"] = json!([
            {"index": 0, "approved": true},
            {"index": 1, "approved": false, "message": "Keep the old title."},
            {"index": 2, "approved": true, "message": "  "}
        ]);
        v
    }

    #[test]
    fn a_version_2_decision_decides_call_by_call_and_round_trips() {
        let d = parse(&by_call()).unwrap();
        assert!(
            d.approved,
            "some call is approved, so the decision approves"
        );
        assert_eq!(d.calls.len(), 3);
        assert_eq!(d.calls[1].message.as_deref(), Some("Keep the old title."));
        assert_eq!(d.calls[2].message, None, "a blank message is none");
        assert_eq!(d.version(), 2);
        assert_eq!(d.to_json()["version"], 2);
        assert_eq!(parse(&d.to_json()).unwrap(), d);
        let mut all_denied = by_call();
        all_denied["calls"] = json!([{"index": 0, "approved": false}]);
        assert!(!parse(&all_denied).unwrap().approved);
        // A whole-turn decision is still written, and read, as version 1.
        let one = decision();
        let whole = parse(&one).unwrap();
        assert_eq!(whole.to_json()["version"], 1);
        let mut v2_whole = one;
        v2_whole["version"] = json!(2);
        assert_eq!(parse(&v2_whole).unwrap(), whole);
    }

    #[test]
    fn a_version_2_decision_that_contradicts_itself_is_refused_by_field() {
        let mut twice = by_call();
        twice["calls"] = json!([{"index": 0, "approved": true}, {"index": 0, "approved": false}]);
        assert_eq!(parse(&twice), Err(MessageError::Invalid("calls")));
        let mut disagrees = by_call();
        disagrees["approved"] = json!(false);
        assert_eq!(parse(&disagrees), Err(MessageError::Invalid("approved")));
        let mut both = by_call();
        both["edits"] = json!([{"index": 1, "arguments": {"title": "x"}}]);
        assert_eq!(parse(&both), Err(MessageError::Invalid("edits")));
        let mut bad_index = by_call();
        bad_index["calls"] = json!([{"index": -1, "approved": true}]);
        assert_eq!(parse(&bad_index), Err(MessageError::Invalid("calls")));
        let mut neither = by_call();
        neither.as_object_mut().unwrap().remove("calls");
        assert_eq!(parse(&neither), Err(MessageError::Missing("approved")));
    }

    #[test]
    fn an_edit_is_version_2_approves_nothing_and_carries_an_object_of_bounded_size() {
        let mut v = by_call();
        v.as_object_mut().unwrap().remove("calls");
        v["edits"] = json!([{"index": 1, "arguments": {"title": "Spring sale"}}]);
        let d = parse(&v).unwrap();
        assert!(!d.approved && d.edits_calls());
        assert_eq!(d.edits[0].arguments["title"], "Spring sale");
        assert_eq!(parse(&d.to_json()).unwrap(), d);
        let mut approving = v.clone();
        approving["approved"] = json!(true);
        assert_eq!(parse(&approving), Err(MessageError::Invalid("approved")));
        for bad in [
            json!("title"),
            json!([1]),
            json!({"t": "x".repeat(MAX_INPUTS_BYTES)}),
        ] {
            let mut v = v.clone();
            v["edits"][0]["arguments"] = bad;
            assert_eq!(parse(&v), Err(MessageError::Invalid("edits")));
        }
    }

    #[test]
    fn a_version_1_decision_naming_calls_or_edits_is_refused_not_read_as_the_whole_turn() {
        for field in ["calls", "edits"] {
            let mut v = decision();
            v[field] = json!([{"index": 1, "approved": false}]);
            assert_eq!(parse(&v), Err(MessageError::Invalid(field)));
        }
        let mut run = RunRequest {
            request_id: Uuid::now_v7(),
            agent: "a".into(),
            acting_user: "u".into(),
            prompt: "p".into(),
            inputs: None,
        }
        .to_json();
        run["version"] = json!(2);
        assert_eq!(
            RunRequest::parse(run.to_string().as_bytes()),
            Err(MessageError::UnsupportedVersion)
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
