//! Calls that meet a bad minute at the provider: tried again under the agent's retry policy,
//! as the provider's `Retry-After` asks, until the attempts or the time budget are spent.

use std::time::{Duration, Instant, SystemTime};

use countersign_core::Message;
use countersign_model::{OpenAiCompatible, RetryPolicy};
use countersign_testkit::{ModelStub, Reply};
use secrecy::SecretString;
use serde_json::json;

use crate::openai::quick_retries;
use crate::support::{ask, catalog_with, completion};

const BUSY: &str = r#"{"error": {"message": "overloaded"}}"#;

fn provider(endpoint: &ModelStub, retry: RetryPolicy) -> OpenAiCompatible {
    OpenAiCompatible::new(
        &endpoint.base_url,
        "small-model",
        SecretString::from("sk-retry"),
    )
    .unwrap()
    .with_retry(retry)
}

fn done() -> Reply {
    Reply::new(200, &completion(json!({"content": "Done."})))
}

/// The pause between the arrivals of request `n - 1` and request `n`.
fn gap(endpoint: &ModelStub, n: usize) -> Duration {
    let requests = endpoint.requests();
    requests[n].at - requests[n - 1].at
}

#[tokio::test]
async fn a_rate_limited_call_waits_the_seconds_retry_after_names_and_then_succeeds() {
    let endpoint = ModelStub::replying(vec![
        Reply::new(429, BUSY).with_header("retry-after", "1"),
        done(),
    ]);

    let answer = ask(
        &provider(&endpoint, RetryPolicy::default()),
        &[Message::user("go")],
    )
    .await
    .unwrap();

    assert_eq!(answer.content, "Done.");
    assert_eq!(endpoint.requests().len(), 2);
    let waited = gap(&endpoint, 1);
    assert!(
        waited >= Duration::from_millis(990) && waited < Duration::from_secs(3),
        "waited {waited:?} where the provider asked for 1 s"
    );
}

#[tokio::test]
async fn a_retry_after_given_as_an_http_date_is_waited_for() {
    // HTTP dates name whole seconds: two seconds from now is one to two seconds away.
    let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
    let endpoint = ModelStub::replying(vec![
        Reply::new(503, BUSY).with_header("retry-after", &at),
        done(),
    ]);

    let answer = ask(
        &provider(&endpoint, quick_retries()),
        &[Message::user("go")],
    )
    .await
    .unwrap();

    assert_eq!(answer.content, "Done.");
    let waited = gap(&endpoint, 1);
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(4),
        "waited {waited:?} for {at}"
    );
}

#[tokio::test]
async fn a_provider_that_keeps_answering_503_fails_the_call_once_the_attempts_are_spent() {
    let endpoint = ModelStub::replying(vec![Reply::new(503, BUSY)]);
    let retry = RetryPolicy {
        max_attempts: 3,
        ..quick_retries()
    };

    let err = ask(&provider(&endpoint, retry), &[Message::user("go")])
        .await
        .unwrap_err();

    assert_eq!(err.code(), "provider_unavailable");
    assert_eq!(endpoint.requests().len(), 3);
    let text = err.to_string();
    assert!(
        text.contains("503") && text.contains("gave up after 3 attempts"),
        "{text}"
    );
}

#[tokio::test]
async fn a_provider_that_keeps_answering_503_fails_the_call_once_the_time_budget_is_spent() {
    let endpoint = ModelStub::replying(vec![Reply::new(503, BUSY).with_header("retry-after", "1")]);
    let retry = RetryPolicy {
        max_attempts: 10,
        max_elapsed: Duration::from_secs(2),
        ..quick_retries()
    };

    let started = Instant::now();
    let err = ask(&provider(&endpoint, retry), &[Message::user("go")])
        .await
        .unwrap_err();

    // At 0 s and at 1 s; a third attempt would start past the 2 s budget.
    assert_eq!(err.code(), "provider_unavailable");
    assert_eq!(endpoint.requests().len(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_budget_fails_the_call_at_once_rather_than_wait() {
    let endpoint = ModelStub::replying(vec![
        Reply::new(429, BUSY).with_header("retry-after", "120"),
        done(),
    ]);

    let started = Instant::now();
    let err = ask(
        &provider(&endpoint, RetryPolicy::default()),
        &[Message::user("go")],
    )
    .await
    .unwrap_err();

    assert_eq!(err.code(), "provider_unavailable");
    assert!(err.to_string().contains("429"), "{err}");
    assert_eq!(endpoint.requests().len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_refusal_that_will_not_pass_is_not_tried_again() {
    for status in [400, 401, 404, 501] {
        let endpoint = ModelStub::replying(vec![Reply::new(status, BUSY), done()]);
        let err = ask(
            &provider(&endpoint, quick_retries()),
            &[Message::user("go")],
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "provider_unavailable", "{status}");
        assert_eq!(endpoint.requests().len(), 1, "{status} is not tried again");
    }
    let endpoint = ModelStub::replying(vec![Reply::new(200, "<html>"), done()]);
    let err = ask(
        &provider(&endpoint, quick_retries()),
        &[Message::user("go")],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "provider_invalid_response");
    assert_eq!(
        endpoint.requests().len(),
        1,
        "an unusable answer is not retried"
    );
}

#[tokio::test]
async fn the_retry_settings_of_an_agent_bound_its_calls() {
    let endpoint = ModelStub::replying(vec![Reply::new(502, BUSY)]);
    let model = catalog_with(&[("COUNTERSIGN_MODEL_IT_KEY_RETRY", "sk-retry")])
        .model_for(&json!({
            "provider": "openai",
            "base_url": endpoint.base_url,
            "model": "small-model",
            "api_key_env": "COUNTERSIGN_MODEL_IT_KEY_RETRY",
            "retry": {"max_attempts": 2, "max_elapsed_secs": 30},
        }))
        .unwrap();

    let err = ask(&*model, &[Message::user("go")]).await.unwrap_err();

    assert_eq!(err.code(), "provider_unavailable");
    assert_eq!(endpoint.requests().len(), 2);
}
