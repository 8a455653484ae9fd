//! The model contract: what the loop sends a model and what it gets back.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tool::ToolSpec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// A call the model asked for. `arguments` is whatever the model sent; tools validate it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// One entry of the transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    #[serde(default)]
    pub content: String,
    /// On assistant messages: the calls of that turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On tool messages: the call this is the result of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On tool messages: whether the result is an error or refusal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self::plain(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::plain(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Message {
            tool_calls,
            ..Self::plain(Role::Assistant, content)
        }
    }

    pub fn tool_result(call_id: &str, content: impl Into<String>, is_error: bool) -> Self {
        Message {
            tool_call_id: Some(call_id.to_owned()),
            is_error,
            ..Self::plain(Role::Tool, content)
        }
    }

    fn plain(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: vec![],
            tool_call_id: None,
            is_error: false,
        }
    }
}

/// Provider options carried with the run (model name, temperature, …), opaque to the loop.
pub type ModelOptions = serde_json::Map<String, Value>;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    #[serde(default)]
    pub prompt: u64,
    #[serde(default)]
    pub completion: u64,
}

impl TokenUsage {
    pub fn add(&mut self, other: TokenUsage) {
        self.prompt = self.prompt.saturating_add(other.prompt);
        self.completion = self.completion.saturating_add(other.completion);
    }
}

#[derive(Debug, Clone)]
pub struct ModelRequest<'a> {
    pub messages: &'a [Message],
    /// Borrowed from the registry: a turn sends them, it does not copy their schemas.
    pub tools: &'a [&'a ToolSpec],
    pub options: &'a ModelOptions,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: TokenUsage,
}

/// Its codes are the `outcome` label values of a model call's metric besides `ok`
/// ([`strum::VariantNames::VARIANTS`]).
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
#[strum(prefix = "provider_", serialize_all = "snake_case")]
#[non_exhaustive]
pub enum ModelError {
    /// The provider could not be reached or answered with an error.
    #[error("provider unavailable: {0}")]
    Unavailable(String),
    /// The provider answered something that is not a usable response.
    #[error("invalid provider response: {0}")]
    InvalidResponse(String),
}

impl ModelError {
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// A model provider. Stateless across calls: everything it needs is in the request, so a run
/// resumed by another process continues correctly.
#[async_trait]
pub trait Model: Send + Sync + std::fmt::Debug {
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError>;
}
