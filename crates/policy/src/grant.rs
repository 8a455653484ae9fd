//! Standing grants: a person's "approve, and approve the same tool on the same subject by this
//! agent for N hours", as a generated policy of one rule.
//!
//! The grant is offered only for a call that removes nothing and whose data class is at most
//! `editor_content`; the generated rule repeats both conditions, so a later card that removes
//! something or touches another class is asked even under the grant.

use crate::facts::CallFacts;

/// Why a call cannot be granted. Recorded and shown as its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(prefix = "grant_", serialize_all = "snake_case")]
#[non_exhaustive]
pub enum GrantRefusal {
    #[error("the call removes something")]
    Removes,
    #[error("the call's data class is above editor_content")]
    DataClass,
    #[error("the call names no subject")]
    NoSubject,
    #[error("the card has no write call")]
    NoWrites,
}

impl GrantRefusal {
    pub fn code(self) -> &'static str {
        self.into()
    }
}

/// The data classes a grant may cover.
const GRANTABLE_CLASSES: [&str; 2] = ["public", "editor_content"];

/// Whether `call` may be granted.
pub fn grantable(call: &CallFacts) -> Result<(), GrantRefusal> {
    if call.preview.removes {
        return Err(GrantRefusal::Removes);
    }
    if !GRANTABLE_CLASSES.contains(&call.data_class.as_str()) {
        return Err(GrantRefusal::DataClass);
    }
    if call.subject_ids.is_empty() {
        return Err(GrantRefusal::NoSubject);
    }
    Ok(())
}

/// The generated policy of grant `id` (its name: `grant-<id>`) for `agent`'s calls of `call`'s
/// tool on `call`'s subjects.
pub fn grant_source(id: &str, agent: &str, call: &CallFacts) -> String {
    let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let subjects: Vec<String> = call.subject_ids.iter().map(|s| q(s)).collect();
    format!(
        "// policy: grant-{id}\n// version: 1\n\
         // A standing grant: the same tool on the same subject by this agent.\n\
         permit (\n  principal == Agent::{agent},\n  action == Action::\"approve\",\n  resource == Tool::{tool}\n) when {{\n  \
         context.call.subject_ids == [{subjects}] &&\n  \
         !context.call.preview.removes &&\n  \
         [\"public\", \"editor_content\"].contains(context.call.data_class)\n}};\n",
        agent = q(agent),
        tool = q(&call.tool),
        subjects = subjects.join(", "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grant_refusal_has_the_code_it_always_had() {
        let refusals = [
            (GrantRefusal::Removes, "grant_removes"),
            (GrantRefusal::DataClass, "grant_data_class"),
            (GrantRefusal::NoSubject, "grant_no_subject"),
            (GrantRefusal::NoWrites, "grant_no_writes"),
        ];
        for (refusal, code) in refusals {
            assert_eq!(refusal.code(), code, "{refusal:?}");
        }
    }
}
