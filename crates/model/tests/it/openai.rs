use std::time::{Duration, Instant};

use countersign_core::{Effect, Message, ModelOptions, TokenUsage, ToolCall, ToolSpec};
use countersign_model::{OpenAiCompatible, RetryPolicy};
use countersign_testkit::{ModelStub, Reply};
use secrecy::SecretString;
use serde_json::{json, Value};

use crate::support::{answering, ask, ask_with, completion};

const KEY: &str = "sk-test-4f1c9a0e7b2d";
const PROMPT: &str = "Tighten the description of page 12.";

/// Retries as by default, with pauses short enough for a test.
pub fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        first_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
        ..RetryPolicy::default()
    }
}

fn provider(endpoint: &ModelStub) -> OpenAiCompatible {
    OpenAiCompatible::new(&endpoint.base_url, "small-model", SecretString::from(KEY))
        .unwrap()
        .with_retry(quick_retries())
}

fn read_page() -> ToolSpec {
    ToolSpec {
        name: "read_page_metadata".into(),
        description: "Reads the descriptive fields of a page.".into(),
        parameters: json!({"type": "object", "properties": {"uid": {"type": "integer"}}}),
        group: "content".into(),
        data_class: countersign_core::DataClass::EditorContent,
        effect: Effect::ReadOnly,
        enabled_by_default: true,
        requires_admin: false,
    }
}

fn transcript() -> Vec<Message> {
    vec![
        Message::system("You edit pages."),
        Message::user(PROMPT),
        Message::assistant(
            "",
            vec![ToolCall {
                id: "call_abc".into(),
                name: "read_page_metadata".into(),
                arguments: json!({"uid": 12}),
            }],
        ),
        Message::tool_result("call_abc", r#"{"title": "Home"}"#, false),
    ]
}

#[tokio::test]
async fn the_request_carries_the_model_key_messages_tools_and_options() {
    let endpoint = answering(&completion(
        json!({"role": "assistant", "content": "Done."}),
    ));
    let mut options = ModelOptions::new();
    options.insert("temperature".into(), json!(0.2));
    options.insert("max_tokens".into(), json!(256));

    ask_with(
        &provider(&endpoint),
        &transcript(),
        &[&read_page()],
        &options,
    )
    .await
    .unwrap();

    let requests = endpoint.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(
        sent.authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(sent.body["model"], "small-model");
    assert_eq!(sent.body["temperature"], 0.2);
    assert_eq!(sent.body["max_tokens"], 256);
    assert_eq!(
        sent.body["messages"],
        json!([
            {"role": "system", "content": "You edit pages."},
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_abc",
                "type": "function",
                "function": {"name": "read_page_metadata", "arguments": "{\"uid\":12}"},
            }]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "{\"title\": \"Home\"}"},
        ])
    );
    assert_eq!(
        sent.body["tools"],
        json!([{
            "type": "function",
            "function": {
                "name": "read_page_metadata",
                "description": "Reads the descriptive fields of a page.",
                "parameters": {"type": "object", "properties": {"uid": {"type": "integer"}}},
            },
        }])
    );
}

#[tokio::test]
async fn an_option_cannot_replace_the_model_the_messages_or_turn_on_streaming() {
    let endpoint = answering(&completion(json!({"content": "Done."})));
    let mut options = ModelOptions::new();
    options.insert("model".into(), json!("other-model"));
    options.insert("messages".into(), json!([]));
    options.insert("stream".into(), json!(true));
    options.insert("top_p".into(), json!(0.9));

    ask_with(
        &provider(&endpoint),
        &[Message::user(PROMPT)],
        &[],
        &options,
    )
    .await
    .unwrap();

    let body = &endpoint.requests()[0].body;
    assert_eq!(body["model"], "small-model");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": PROMPT}])
    );
    assert_eq!(body.get("stream"), None);
    assert_eq!(body["top_p"], 0.9);
    assert_eq!(body.get("tools"), None, "no tools means no tools field");
}

#[tokio::test]
async fn tool_calls_in_the_answer_become_calls_with_parsed_arguments_and_ids() {
    let endpoint = answering(&completion(json!({
        "role": "assistant",
        "content": "Reading.",
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "read_page_metadata", "arguments": "{\"uid\": 12}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "search_pages", "arguments": "{\"query\": \"home\"}"}},
        ],
    })));

    let answer = ask(&provider(&endpoint), &[Message::user(PROMPT)])
        .await
        .unwrap();

    assert_eq!(answer.content, "Reading.");
    assert_eq!(
        answer.tool_calls,
        vec![
            ToolCall {
                id: "call_1".into(),
                name: "read_page_metadata".into(),
                arguments: json!({"uid": 12}),
            },
            ToolCall {
                id: "call_2".into(),
                name: "search_pages".into(),
                arguments: json!({"query": "home"}),
            },
        ]
    );
}

#[tokio::test]
async fn usage_becomes_token_usage() {
    let endpoint = answering(&completion(json!({"content": "Done."})));
    let answer = ask(&provider(&endpoint), &[Message::user(PROMPT)])
        .await
        .unwrap();
    assert_eq!(
        answer.usage,
        TokenUsage {
            prompt: 11,
            completion: 7
        }
    );
    assert!(answer.tool_calls.is_empty());
}

#[tokio::test]
async fn unparseable_arguments_arrive_as_a_json_string_value() {
    let endpoint = answering(&completion(json!({
        "content": null,
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "update_page", "arguments": "{\"uid\": 12,"}}],
    })));

    let answer = ask(&provider(&endpoint), &[Message::user(PROMPT)])
        .await
        .unwrap();

    assert_eq!(answer.content, "");
    assert_eq!(
        answer.tool_calls[0].arguments,
        Value::String("{\"uid\": 12,".into())
    );
}

#[tokio::test]
async fn a_call_without_an_id_is_named_after_its_turn_and_position() {
    let endpoint = answering(&completion(json!({
        "tool_calls": [{"type": "function", "function": {"name": "search_pages", "arguments": "{}"}}],
    })));
    let answer = ask(&provider(&endpoint), &transcript()).await.unwrap();
    // The transcript already holds one assistant turn: this is turn 2.
    assert_eq!(answer.tool_calls[0].id, "call_2_1");
}

async fn error_for(status: u16, body: &str) -> countersign_core::ModelError {
    let endpoint = ModelStub::replying(vec![Reply::new(status, body)]);
    ask(&provider(&endpoint), &[Message::user(PROMPT)])
        .await
        .unwrap_err()
}

#[tokio::test]
async fn a_server_error_is_provider_unavailable() {
    let err = error_for(500, r#"{"error": {"message": "boom"}}"#).await;
    assert_eq!(err.code(), "provider_unavailable");
    assert!(err.to_string().contains("500"), "{err}");
}

#[tokio::test]
async fn a_rate_limit_is_provider_unavailable() {
    let err = error_for(429, r#"{"error": {"message": "slow down"}}"#).await;
    assert_eq!(err.code(), "provider_unavailable");
    assert!(err.to_string().contains("429"), "{err}");
}

#[tokio::test]
async fn an_unanswered_call_times_out_as_provider_unavailable() {
    let endpoint = ModelStub::replying(vec![Reply::new(
        200,
        &completion(json!({"content": "late"})),
    )
    .after(Duration::from_secs(5))]);
    let model = provider(&endpoint).with_timeout(Duration::from_millis(200));

    let started = Instant::now();
    let err = ask(&model, &[Message::user(PROMPT)]).await.unwrap_err();

    assert_eq!(err.code(), "provider_unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_is_provider_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let model = OpenAiCompatible::new(
        &format!("http://{address}/v1"),
        "m",
        SecretString::from(KEY),
    )
    .unwrap()
    .with_retry(quick_retries());

    let err = ask(&model, &[Message::user(PROMPT)]).await.unwrap_err();

    assert_eq!(err.code(), "provider_unavailable");
    assert!(
        err.to_string().contains("gave up after 4 attempts"),
        "a refused connection is tried again: {err}"
    );
}

#[tokio::test]
async fn a_body_without_choices_is_an_invalid_response() {
    let err = error_for(
        200,
        r#"{"id": "chatcmpl-1", "usage": {"prompt_tokens": 1}}"#,
    )
    .await;
    assert_eq!(err.code(), "provider_invalid_response");
}

#[tokio::test]
async fn a_body_that_is_not_json_is_an_invalid_response() {
    let err = error_for(200, "<html>gateway</html>").await;
    assert_eq!(err.code(), "provider_invalid_response");
}

#[tokio::test]
async fn no_error_text_carries_the_key_or_the_prompt() {
    // Servers that echo what they were sent, in every way a call can fail.
    let echo = format!(r#"{{"error": "bad key {KEY} for prompt {PROMPT}"}}"#);
    let mut errors = vec![
        error_for(401, &echo).await,
        error_for(500, &echo).await,
        error_for(429, &echo).await,
        error_for(200, &echo).await,
        error_for(200, &format!(r#"{{"choices": "{KEY} {PROMPT}"}}"#)).await,
    ];
    let slow = ModelStub::replying(vec![Reply::new(200, &echo).after(Duration::from_secs(5))]);
    errors.push(
        ask(
            &provider(&slow).with_timeout(Duration::from_millis(100)),
            &[Message::user(PROMPT)],
        )
        .await
        .unwrap_err(),
    );

    for err in errors {
        let text = format!("{err} {err:?}");
        assert!(!text.contains(KEY), "{text}");
        assert!(!text.contains("page 12"), "{text}");
    }
}

#[tokio::test]
async fn the_provider_debug_output_does_not_show_the_key() {
    let endpoint = answering("{}");
    let debug = format!("{:?}", provider(&endpoint));
    assert!(!debug.contains(KEY), "{debug}");
    assert!(debug.contains("small-model"), "{debug}");
}
