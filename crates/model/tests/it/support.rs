//! What the provider tests share: the test kit's model stub answering one body, the
//! questions they ask, and the completions the stub answers with.

use countersign_core::{
    Message, Model, ModelError, ModelOptions, ModelRequest, ModelResponse, ToolSpec,
};
use countersign_testkit::{ModelStub, Reply};
use serde_json::Value;

/// A stub answering every request with 200 and `body`.
pub fn answering(body: &str) -> ModelStub {
    ModelStub::replying(vec![Reply::new(200, body)])
}

/// Sends `messages` with no tools and no options.
pub async fn ask(model: &dyn Model, messages: &[Message]) -> Result<ModelResponse, ModelError> {
    ask_with(model, messages, &[], &ModelOptions::new()).await
}

pub async fn ask_with(
    model: &dyn Model,
    messages: &[Message],
    tools: &[&ToolSpec],
    options: &ModelOptions,
) -> Result<ModelResponse, ModelError> {
    model
        .complete(ModelRequest {
            messages,
            tools,
            options,
        })
        .await
}

/// A chat completion whose message is `message`.
pub fn completion(message: Value) -> String {
    serde_json::json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    })
    .to_string()
}

/// A catalog whose variables are exactly `variables`: what a worker's environment would hold.
pub fn catalog_with(variables: &[(&str, &str)]) -> countersign_model::ModelCatalog {
    let variables: std::collections::HashMap<String, String> = variables
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    countersign_model::ModelCatalog::new(move |name| variables.get(name).cloned())
}
