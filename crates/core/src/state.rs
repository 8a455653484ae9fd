//! The suspended state of a run: one versioned JSON document, sealed at rest by the caller.
//!
//! Writing is strict: [`SuspendedRunState::to_json`] always writes every field of version 1.
//! Reading is tolerant, because a running installation has suspended runs written by older
//! code, and every one of them must still resume:
//!
//! - a missing or malformed optional field degrades (`call_previews` → no previews,
//!   `stale_call_indexes` → none, counters → 0) instead of failing;
//! - pending-call entries that are not usable (not an object, no tool name, no string id,
//!   arguments not an object) are dropped, which renumbers the survivors; every stored index
//!   is translated onto the surviving list, and one whose call did not survive is dropped,
//!   never clamped — otherwise a corrupt blob would move a preview one call along;
//! - a preview whose tool differs from the call now at its index is dropped;
//! - except where safety depends on it: `landed_calls` (writes that happened and must never run
//!   again) is read strictly — an entry that cannot be read, names a call that is not there or
//!   of another tool, or repeats one, fails the state `state_unreadable`;
//! - a document newer than this code understands, or without the required fields, fails with
//!   `state_unreadable`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::digest::{turn_digest, DigestedCall};
use crate::ids::{CallIndex, SuspensionSeq, TurnDigest};
use crate::model::{Message, ModelOptions, TokenUsage};
use crate::preview::{CallPreview, LineForm};
use crate::tool::ToolOutput;

/// The largest suspended state, in bytes of its JSON, that a run may store: a turn whose state
/// is larger fails `suspend_failed` (`state_too_large`) instead of filling the database.
pub const MAX_STATE_BYTES: usize = 4 * 1024 * 1024;

/// The version this code writes and the newest it reads.
pub const STATE_VERSION: u64 = 1;

/// One call of the suspended turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    pub id: String,
    pub tool: String,
    pub arguments: Value,
}

/// A call of the suspended turn that was carried out already: an earlier card of the same turn
/// was approved, and the turn stopped after this call had landed (a later call's preview moved
/// at its resource). It is shown on the card as done and never runs again; its result is what
/// the model is told, whatever the next decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandedCall {
    pub index: CallIndex,
    pub tool: String,
    pub output: ToolOutput,
}

/// The identity of the tool of one pending call when its card was made ([`crate::Tool::identity`]):
/// a call whose tool is no longer what the approver's card was made with bounces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolIdentity {
    pub index: CallIndex,
    pub tool: String,
    pub identity: String,
}

/// New arguments a person gave a call of the turn: the card was issued anew with them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditRecord {
    pub index: CallIndex,
    pub tool: String,
    /// Who changed them.
    pub editor: String,
    /// The arguments before, as the model proposed them (or as an earlier edit left them).
    pub before: Value,
    /// The arguments the call now has.
    pub after: Value,
}

/// Everything needed to resume a suspended run in any process.
#[derive(Debug, Clone, PartialEq)]
pub struct SuspendedRunState {
    pub transcript: Vec<Message>,
    pub pending_calls: Vec<PendingCall>,
    pub iterations: u32,
    pub tokens: TokenUsage,
    pub offered_tools: Vec<String>,
    pub model_options: ModelOptions,
    pub call_previews: Vec<CallPreview>,
    /// The calls whose preview moved since the previous card. A field, never a preview line:
    /// a line would join the next comparison and bounce the approval forever.
    pub stale_call_indexes: Vec<CallIndex>,
    /// The calls of the turn that landed under an earlier card of it, in call order.
    pub landed_calls: Vec<LandedCall>,
    /// The identity of each offered call's tool when the card was made, in call order.
    pub tool_identities: Vec<ToolIdentity>,
    /// The calls the previous card's decision denied, one by one: this card's previews were
    /// taken without them (the turn was a sequence of the other calls).
    pub excluded_calls: Vec<CallIndex>,
    /// The calls whose arguments a person changed, in call order.
    pub edits: Vec<EditRecord>,
    pub suspension_seq: SuspensionSeq,
    /// When the previews were captured; shown on the card, never compared.
    pub captured_at: String,
}

/// Why a stored state cannot be read. Every variant is `state_unreadable` for the run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    #[error("state is not JSON")]
    NotJson,
    #[error("state is not a JSON object")]
    NotAnObject,
    #[error("state has no usable version")]
    NoVersion,
    #[error("state version {0} is newer than this code understands")]
    NewerVersion(u64),
    #[error("state field {0} is missing or malformed")]
    Malformed(&'static str),
}

impl StateError {
    pub fn code(&self) -> &'static str {
        crate::TerminationReason::StateUnreadable.as_str()
    }
}

impl SuspendedRunState {
    /// The digest of the pending calls, which a decision must name.
    pub fn turn_digest(&self) -> TurnDigest {
        turn_digest(self.pending_calls.iter().map(|c| DigestedCall {
            id: &c.id,
            tool: &c.tool,
            arguments: &c.arguments,
        }))
    }

    /// The stored preview of the call at `index`, if any.
    pub fn preview_of(&self, index: CallIndex) -> Option<&CallPreview> {
        self.call_previews.iter().find(|p| p.index == index)
    }

    /// The identity of the tool of call `index` when the card was made, if it was recorded.
    pub fn identity_of(&self, index: CallIndex) -> Option<&str> {
        self.tool_identities
            .iter()
            .find(|t| t.index == index)
            .map(|t| t.identity.as_str())
    }

    /// The edit of call `index`, if a person changed its arguments.
    pub fn edit_of(&self, index: CallIndex) -> Option<&EditRecord> {
        self.edits.iter().find(|e| e.index == index)
    }

    /// The call at `index` if it landed under an earlier card of the turn.
    pub fn landed(&self, index: CallIndex) -> Option<&LandedCall> {
        self.landed_calls.iter().find(|c| c.index == index)
    }

    /// The strict, complete version-1 document.
    pub fn to_json(&self) -> Value {
        json!({
            "v": STATE_VERSION,
            "transcript": self.transcript,
            "pending_calls": self.pending_calls,
            "iterations": self.iterations,
            "tokens": self.tokens,
            "offered_tools": self.offered_tools,
            "model_options": self.model_options,
            "call_previews": self.call_previews,
            "stale_call_indexes": self.stale_call_indexes,
            "landed_calls": self.landed_calls,
            "tool_identities": self.tool_identities,
            "excluded_calls": self.excluded_calls,
            "edits": self.edits,
            "suspension_seq": self.suspension_seq,
            "captured_at": self.captured_at,
        })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // Serialising a `Value` cannot fail.
        serde_json::to_vec(&self.to_json()).unwrap_or_default()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StateError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|_| StateError::NotJson)?;
        Self::from_json(&value)
    }

    /// Tolerant read; see the module documentation for the rules.
    pub fn from_json(value: &Value) -> Result<Self, StateError> {
        let doc = value.as_object().ok_or(StateError::NotAnObject)?;
        check_version(doc)?;

        let transcript: Vec<Message> = doc
            .get("transcript")
            .cloned()
            .and_then(|t| serde_json::from_value(t).ok())
            .ok_or(StateError::Malformed("transcript"))?;
        let suspension_seq = stored_seq(doc).ok_or(StateError::Malformed("suspension_seq"))?;
        let raw_calls = doc
            .get("pending_calls")
            .and_then(Value::as_array)
            .ok_or(StateError::Malformed("pending_calls"))?;

        let survivors = Survivors::of(raw_calls);
        let call_previews = call_previews(doc, &survivors);
        let stale_call_indexes = call_indexes(doc, "stale_call_indexes", &survivors);
        let landed_calls = landed_calls(doc, &survivors)?;
        let tool_identities = tool_identities(doc, &survivors);
        let excluded_calls = call_indexes(doc, "excluded_calls", &survivors);
        let edits = edits(doc, &survivors);

        Ok(SuspendedRunState {
            transcript,
            pending_calls: survivors.calls,
            iterations: stored_iterations(doc),
            tokens: doc
                .get("tokens")
                .cloned()
                .and_then(|t| serde_json::from_value(t).ok())
                .unwrap_or_default(),
            offered_tools: array(doc, "offered_tools")
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            model_options: doc
                .get("model_options")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_else(Map::new),
            call_previews,
            stale_call_indexes,
            landed_calls,
            tool_identities,
            excluded_calls,
            edits,
            suspension_seq,
            captured_at: doc
                .get("captured_at")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    }
}

/// The stored previews that still match a surviving call, renumbered onto the survivors.
fn call_previews(doc: &Map<String, Value>, survivors: &Survivors) -> Vec<CallPreview> {
    let mut seen = BTreeSet::new();
    array(doc, "call_previews")
        .iter()
        .filter_map(|raw| {
            let p = stored_preview(raw)?;
            let index = survivors.renumber(p.index, &p.tool, &mut seen)?;
            Some(CallPreview { index, ..p })
        })
        .collect()
}

/// The stored tool identities that still match a surviving call, renumbered onto the survivors.
fn tool_identities(doc: &Map<String, Value>, survivors: &Survivors) -> Vec<ToolIdentity> {
    renumbered(doc, "tool_identities", survivors, |t: &ToolIdentity| {
        (t.index, t.tool.as_str())
    })
    .map(|(index, t)| ToolIdentity { index, ..t })
    .collect()
}

/// The stored edits that still match a surviving call, renumbered onto the survivors.
fn edits(doc: &Map<String, Value>, survivors: &Survivors) -> Vec<EditRecord> {
    renumbered(doc, "edits", survivors, |e: &EditRecord| {
        (e.index, e.tool.as_str())
    })
    .map(|(index, e)| EditRecord { index, ..e })
    .collect()
}

/// The model iterations stored; 0 when absent or not a count.
fn stored_iterations(doc: &Map<String, Value>) -> u32 {
    doc.get("iterations")
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

/// A state this build reads: version [`STATE_VERSION`], not a newer one nor none.
fn check_version(doc: &Map<String, Value>) -> Result<(), StateError> {
    match doc.get("v").and_then(Value::as_u64) {
        Some(STATE_VERSION) => Ok(()),
        Some(v) if v > STATE_VERSION => Err(StateError::NewerVersion(v)),
        _ => Err(StateError::NoVersion),
    }
}

/// The suspension number stored; none when absent or not one.
fn stored_seq(doc: &Map<String, Value>) -> Option<SuspensionSeq> {
    let n = doc.get("suspension_seq").and_then(Value::as_u64)?;
    SuspensionSeq::new(u32::try_from(n).ok()?).ok()
}

/// The array stored under `key`; none when absent or not an array.
fn array<'a>(doc: &'a Map<String, Value>, key: &str) -> &'a [Value] {
    doc.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The stored calls a read keeps, and where each stored position went.
struct Survivors {
    calls: Vec<PendingCall>,
    /// Position in the stored list → position in the surviving list.
    new_index: Vec<Option<usize>>,
}

impl Survivors {
    fn of(raw_calls: &[Value]) -> Survivors {
        let mut survivors = Survivors {
            calls: Vec::new(),
            new_index: Vec::with_capacity(raw_calls.len()),
        };
        for raw in raw_calls {
            match usable_call(raw) {
                Some(call) => {
                    survivors.new_index.push(Some(survivors.calls.len()));
                    survivors.calls.push(call);
                }
                None => survivors.new_index.push(None),
            }
        }
        survivors
    }

    /// Where the stored call at `old` is now; none when it did not survive.
    fn translate(&self, old: CallIndex) -> Option<CallIndex> {
        self.new_index
            .get(old.get())
            .copied()
            .flatten()
            .map(CallIndex::new)
    }

    /// Where an entry about the stored call at `old`, of `tool`, now points: none when that
    /// call did not survive, is of another tool, or an earlier entry took it (`seen`).
    fn renumber(
        &self,
        old: CallIndex,
        tool: &str,
        seen: &mut BTreeSet<CallIndex>,
    ) -> Option<CallIndex> {
        let index = self.translate(old)?;
        (self.calls[index.get()].tool == tool && seen.insert(index)).then_some(index)
    }
}

fn usable_call(raw: &Value) -> Option<PendingCall> {
    let obj = raw.as_object()?;
    let id = obj.get("id")?.as_str()?;
    let tool = obj.get("tool")?.as_str().filter(|t| !t.is_empty())?;
    let arguments = obj.get("arguments").filter(|a| a.is_object())?;
    Some(PendingCall {
        id: id.to_owned(),
        tool: tool.to_owned(),
        arguments: arguments.clone(),
    })
}

/// The calls that landed under an earlier card, read strictly: a landed call is never run
/// again, so an entry that cannot be read, or that names a call not there, would make a write
/// that happened look undone — and send it again under a key no resource could deduplicate.
/// Any such entry makes the whole state unreadable.
fn landed_calls(
    doc: &Map<String, Value>,
    survivors: &Survivors,
) -> Result<Vec<LandedCall>, StateError> {
    let malformed = StateError::Malformed("landed_calls");
    let raw = match doc.get("landed_calls") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(raw)) => raw,
        Some(_) => return Err(malformed),
    };
    let mut seen = BTreeSet::new();
    let mut landed = raw
        .iter()
        .map(|raw| {
            let c = stored_landed(raw).ok_or(malformed.clone())?;
            let index = survivors
                .renumber(c.index, &c.tool, &mut seen)
                .ok_or(malformed.clone())?;
            Ok(LandedCall { index, ..c })
        })
        .collect::<Result<Vec<_>, StateError>>()?;
    landed.sort_by_key(|c| c.index);
    Ok(landed)
}

/// A stored landed call, with its index still in stored numbering.
fn stored_landed(raw: &Value) -> Option<LandedCall> {
    let obj = raw.as_object()?;
    Some(LandedCall {
        index: CallIndex::from_json(obj.get("index")?).ok()?,
        tool: obj.get("tool")?.as_str()?.to_owned(),
        output: serde_json::from_value(obj.get("output")?.clone()).ok()?,
    })
}

/// A stored preview entry, with its index still in stored numbering.
fn stored_preview(raw: &Value) -> Option<CallPreview> {
    let obj = raw.as_object()?;
    let index = CallIndex::from_json(obj.get("index")?).ok()?;
    let tool = obj.get("tool")?.as_str()?;
    let lines = obj
        .get("lines")?
        .as_array()?
        .iter()
        .map(|l| l.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()?;
    let failed = match obj.get("failed") {
        None => false,
        Some(v) => v.as_bool()?,
    };
    // Forms only show lines: malformed ones, or ones that do not match the lines, degrade to
    // none rather than lose the preview.
    let forms = obj
        .get("forms")
        .and_then(|f| serde_json::from_value::<Vec<Option<LineForm>>>(f.clone()).ok())
        .filter(|f| f.len() == lines.len())
        .unwrap_or_default();
    let alone = obj.get("alone").and_then(Value::as_bool).unwrap_or(false);
    // The whole preview binds like its lines: an unreadable one makes the entry unusable.
    let full = match obj.get("full") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => v
            .as_array()?
            .iter()
            .map(|l| l.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()?,
    };
    Some(CallPreview {
        index,
        tool: tool.to_owned(),
        lines,
        failed,
        forms,
        alone,
        full,
    })
}

/// The call indexes listed under `field`, translated to the surviving calls, each once, in
/// order; indexes of calls that did not survive are dropped.
fn call_indexes(doc: &Map<String, Value>, field: &str, survivors: &Survivors) -> Vec<CallIndex> {
    array(doc, field)
        .iter()
        .filter_map(|v| CallIndex::from_json(v).ok())
        .filter_map(|old| survivors.translate(old))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The records listed under `field` that read as `T` and name a surviving call by its index
/// and tool (`key`), each call once: with the call's new index.
fn renumbered<'a, T: serde::de::DeserializeOwned + 'a>(
    doc: &'a Map<String, Value>,
    field: &str,
    survivors: &'a Survivors,
    key: impl Fn(&T) -> (CallIndex, &str) + 'a,
) -> impl Iterator<Item = (CallIndex, T)> + 'a {
    let mut seen = BTreeSet::new();
    array(doc, field).iter().filter_map(move |raw| {
        let record: T = serde_json::from_value(raw.clone()).ok()?;
        let (old, tool) = key(&record);
        let index = survivors.renumber(old, tool, &mut seen)?;
        Some((index, record))
    })
}
