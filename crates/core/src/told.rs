//! What the model is told: the first message of a run with its inputs, and the text of each
//! result the loop gives in a tool's place — a denial, a refusal at the boundary, a call a
//! person edited.

use serde_json::{Map, Value};

use crate::model::{Message, Role};
use crate::state::EditRecord;

/// Text the model receives for each call of a denied turn.
pub fn denied_result(tool: &str, comment: Option<&str>) -> String {
    match comment.map(str::trim).filter(|c| !c.is_empty()) {
        Some(c) => format!("Error: tool \"{tool}\" was denied by the operator. Comment: {c}"),
        None => format!("Error: tool \"{tool}\" was denied by the operator."),
    }
}

/// Text the model receives for a call whose tool is no longer offered at resume.
pub fn no_longer_permitted_result(tool: &str) -> String {
    format!("Error: tool \"{tool}\" is no longer permitted and was not executed.")
}

/// Text the model receives for a call to a tool it was not offered.
pub fn not_available_result(tool: &str) -> String {
    format!("Error: tool \"{tool}\" is not available.")
}

/// Text the model receives for a call whose tool was not offered when the turn suspended: it
/// was never on a card as a call that could run, so it does not run now.
pub fn not_offered_at_suspend_result(tool: &str) -> String {
    format!("Error: tool \"{tool}\" was not available when this turn was proposed and was not executed.")
}

/// Text the model receives for every call of a turn with more calls than the agent allows.
pub fn too_many_calls_result(tool: &str, limit: u32) -> String {
    format!(
        "Error: this turn proposed more than {limit} tool calls, so no call of it was executed \
         (tool \"{tool}\"). Propose fewer calls per turn."
    )
}

/// Text the model receives for every call of a turn in which a call names no tool.
pub fn unnamed_call_result() -> String {
    "Error: a call of this turn names no tool, so no call of this turn was executed.".to_owned()
}

/// Text the model receives when a turn is refused for malformed arguments.
pub fn malformed_arguments_result(tool: &str) -> String {
    format!(
        "Error: the arguments of this call to tool \"{tool}\" are not a JSON object, so no call of this turn was executed."
    )
}

/// The line that introduces a run's inputs in its first user message.
pub const INPUTS_MARKER: &str = "Inputs (JSON):";

/// The first user message of a run: its prompt, then its inputs (when it has any) as one line
/// of JSON after [`INPUTS_MARKER`]. Kept in the transcript, so every later segment and every
/// provider sees the same inputs.
pub fn first_message(prompt: &str, inputs: Option<&Map<String, Value>>) -> String {
    match inputs.filter(|m| !m.is_empty()) {
        None => prompt.to_owned(),
        Some(inputs) => format!(
            "{prompt}\n\n{INPUTS_MARKER}\n{}",
            Value::Object(inputs.clone())
        ),
    }
}

/// The inputs of a run, read back from the first user message of its transcript.
pub fn inputs_of(transcript: &[Message]) -> Option<Map<String, Value>> {
    let first = transcript.iter().find(|m| m.role == Role::User)?;
    let (_, json) = first
        .content
        .rsplit_once(&format!("\n\n{INPUTS_MARKER}\n"))?;
    match serde_json::from_str(json).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

/// What the model reads before the result of a call whose arguments a person changed: the call
/// as it ran.
pub fn edited_note(edit: &EditRecord, ran_with: &Value) -> String {
    format!(
        "Note: {} changed the arguments of this call before it ran; it ran with {ran_with}.",
        edit.editor
    )
}
