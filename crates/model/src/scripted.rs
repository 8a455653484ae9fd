//! The deterministic provider: turns read from a script.
//!
//! [`ScriptedModel`] derives its position from the transcript it is sent (the number of
//! assistant turns so far), so a run suspended in one worker and resumed in another continues
//! the script where it left off. It is what the demo and the end-to-end tests run.
//!
//! A script can vary per run through the run request's `inputs`: a string argument that is
//! exactly `{{inputs.NAME}}` becomes the input's JSON value (typed: a number stays a number),
//! and `{{inputs.NAME}}` inside a longer string is replaced by the input's text. The inputs
//! are read from the run's first message, where the loop puts them.

use std::path::Path;

use async_trait::async_trait;
use countersign_core::{
    told, Model, ModelError, ModelRequest, ModelResponse, Role, TokenUsage, ToolCall,
};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A script: the model's turns, in order.
///
/// ```json
/// { "turns": [
///     { "content": "Reading the page.",
///       "tool_calls": [ { "name": "read_page_metadata", "arguments": { "uid": 12 } } ] },
///     { "content": "Done." } ] }
/// ```
///
/// A call without an `id` gets `call_<turn>_<n>`, so ids are stable across processes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    pub turns: Vec<ScriptedTurn>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedTurn {
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    #[error("cannot read the script file: {0}")]
    Read(#[from] std::io::Error),
    #[error("the script is not valid: {0}")]
    Invalid(#[from] serde_json::Error),
}

/// The deterministic model: answers turn N of its script to a transcript holding N assistant
/// messages.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    script: Script,
}

impl ScriptedModel {
    pub fn new(script: Script) -> Self {
        ScriptedModel { script }
    }

    pub fn from_json(text: &str) -> Result<Self, ScriptError> {
        Ok(Self::new(serde_json::from_str(text)?))
    }

    pub fn from_path(path: &Path) -> Result<Self, ScriptError> {
        Self::from_json(&std::fs::read_to_string(path)?)
    }
}

#[async_trait]
impl Model for ScriptedModel {
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let position = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let turn = self.script.turns.get(position).ok_or_else(|| {
            ModelError::InvalidResponse(format!("the script has no turn {}", position + 1))
        })?;
        let inputs = told::inputs_of(request.messages).unwrap_or_default();
        let tool_calls = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(n, c)| {
                Ok(ToolCall {
                    id: c
                        .id
                        .clone()
                        .unwrap_or_else(|| format!("call_{}_{}", position + 1, n + 1)),
                    name: c.name.clone(),
                    arguments: substitute(&c.arguments, &inputs)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let prompt_chars: usize = request
            .messages
            .iter()
            .map(|m| m.content.chars().count())
            .sum();
        Ok(ModelResponse {
            content: turn.content.clone(),
            tool_calls,
            usage: TokenUsage {
                prompt: (prompt_chars / 4) as u64,
                completion: (turn.content.chars().count() / 4) as u64,
            },
        })
    }
}

/// `value` with every `{{inputs.NAME}}` replaced from `inputs`; a name the run has no input
/// for is an invalid response (the script and the request do not fit together).
fn substitute(value: &Value, inputs: &Map<String, Value>) -> Result<Value, ModelError> {
    const OPEN: &str = "{{inputs.";
    const CLOSE: &str = "}}";
    let missing = |name: &str| {
        ModelError::InvalidResponse(format!(
            "the script uses input {name:?}, which the run has not"
        ))
    };
    Ok(match value {
        Value::String(text) => {
            let whole = text
                .strip_prefix(OPEN)
                .and_then(|rest| rest.strip_suffix(CLOSE))
                .filter(|name| !name.contains(CLOSE));
            if let Some(name) = whole {
                return inputs.get(name).cloned().ok_or_else(|| missing(name));
            }
            let mut out = String::with_capacity(text.len());
            let mut rest = text.as_str();
            while let Some(start) = rest.find(OPEN) {
                let Some(len) = rest[start + OPEN.len()..].find(CLOSE) else {
                    break;
                };
                let name = &rest[start + OPEN.len()..start + OPEN.len() + len];
                let input = inputs.get(name).ok_or_else(|| missing(name))?;
                out.push_str(&rest[..start]);
                match input {
                    Value::String(s) => out.push_str(s),
                    other => out.push_str(&other.to_string()),
                }
                rest = &rest[start + OPEN.len() + len + CLOSE.len()..];
            }
            out.push_str(rest);
            Value::String(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| substitute(v, inputs))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), substitute(v, inputs)?)))
                .collect::<Result<_, ModelError>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_core::{Message, ModelOptions};

    const SCRIPT: &str = r#"{"turns": [
        {"content": "Looking.", "tool_calls": [{"name": "search_pages", "arguments": {"query": "home"}}]},
        {"content": "Done."}
    ]}"#;

    async fn answer(
        model: &ScriptedModel,
        transcript: &[Message],
    ) -> Result<ModelResponse, ModelError> {
        let options = ModelOptions::new();
        model
            .complete(ModelRequest {
                messages: transcript,
                tools: &[],
                options: &options,
            })
            .await
    }

    #[tokio::test]
    async fn the_position_in_the_script_comes_from_the_transcript() {
        let model = ScriptedModel::from_json(SCRIPT).unwrap();
        let first = answer(&model, &[Message::user("go")]).await.unwrap();
        assert_eq!(first.tool_calls[0].id, "call_1_1");
        assert_eq!(first.tool_calls[0].name, "search_pages");

        // A fresh instance — another process — continues from the transcript alone.
        let other = ScriptedModel::from_json(SCRIPT).unwrap();
        let transcript = vec![
            Message::user("go"),
            Message::assistant(first.content, first.tool_calls),
            Message::tool_result("call_1_1", "[]", false),
        ];
        let second = answer(&other, &transcript).await.unwrap();
        assert_eq!(second.content, "Done.");
        assert!(second.tool_calls.is_empty());
    }

    #[tokio::test]
    async fn an_exhausted_script_is_a_provider_error() {
        let model = ScriptedModel::from_json(r#"{"turns": []}"#).unwrap();
        let err = answer(&model, &[Message::user("go")]).await.unwrap_err();
        assert_eq!(err.code(), "provider_invalid_response");
    }

    #[tokio::test]
    async fn inputs_of_the_run_are_substituted_into_the_calls_typed() {
        let model = ScriptedModel::from_json(
            r#"{"turns": [{"tool_calls": [{"name": "update_page_metadata",
                "arguments": {"uid": "{{inputs.page}}", "title": "Page {{inputs.page}}: {{inputs.name}}"}}]}]}"#,
        )
        .unwrap();
        let inputs = serde_json::json!({"page": 12, "name": "Home"});
        let first = told::first_message("Retitle the page.", inputs.as_object());
        let turn = answer(&model, &[Message::user(first)]).await.unwrap();
        assert_eq!(
            turn.tool_calls[0].arguments,
            serde_json::json!({"uid": 12, "title": "Page 12: Home"})
        );
    }

    #[tokio::test]
    async fn a_script_naming_an_input_the_run_has_not_is_a_provider_error() {
        let model = ScriptedModel::from_json(
            r#"{"turns": [{"tool_calls": [{"name": "t", "arguments": {"uid": "{{inputs.page}}"}}]}]}"#,
        )
        .unwrap();
        let err = answer(&model, &[Message::user("go")]).await.unwrap_err();
        assert_eq!(err.code(), "provider_invalid_response");
    }

    #[test]
    fn a_script_with_an_unknown_field_is_rejected() {
        assert!(matches!(
            ScriptedModel::from_json(r#"{"turns": [], "extra": 1}"#),
            Err(ScriptError::Invalid(_))
        ));
    }
}
