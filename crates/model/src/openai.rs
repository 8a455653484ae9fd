//! The OpenAI-compatible provider: one Chat Completions call per turn.
//!
//! The text of a [`ModelError`] may be shown next to a run and its code is stored, so the text
//! names only the class of failure (an HTTP status, a timeout, which part of the body was
//! unusable) — never the key, the prompt or what the provider answered. The details go to the
//! log, with the key redacted from anything the provider echoed.
//!
//! A provider's answer never crashes a run: every way a body can be wrong is a
//! [`ModelError::InvalidResponse`], and arguments that are not JSON are passed on as a JSON
//! string so that the loop refuses that turn the way it refuses any argument that is not an
//! object.
//!
//! A bad minute at the provider should not fail a run that a second try would finish: a call
//! answered HTTP 429 or a 5xx that may pass, or whose connection could not be made or broke
//! off, is tried again under the agent's [`RetryPolicy`] — after the `Retry-After` the provider
//! asked for, else after an exponential, jittered pause — and only a failure that outlasts the
//! policy's attempts or its time budget reaches the run as `provider_unavailable`. A call that
//! times out is not tried again: the timeout already was the patience for it. A chat completion
//! has no side effect to repeat, so trying one again is safe.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use countersign_core::{
    Message, Model, ModelError, ModelRequest, ModelResponse, Role, TokenUsage, ToolCall, ToolSpec,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// How long one call may take, connection and whole answer included, unless configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A larger answer is refused rather than held in memory.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Body fields the provider sets itself; a model option of the same name is ignored.
/// `stream` is here because a streamed answer is not a chat completion this provider reads.
const RESERVED_FIELDS: [&str; 4] = ["model", "messages", "tools", "stream"];

/// What the provider logs of a body it could not use.
const LOGGED_BODY_CHARS: usize = 500;

/// How often, and for how long, a call that failed in a way that may pass is tried again.
///
/// Retried: HTTP 429, any 5xx but 501 and 505 (which do not pass), a connection that could not
/// be made, and an answer cut off. Not retried: other statuses (400, 401, 404, …), a call that
/// timed out, and an answer that is not a usable chat completion. The pause before a retry is
/// the provider's `Retry-After` (seconds or an HTTP date) when it sent one, else
/// [`first_delay`](Self::first_delay) doubled after each failure (up to
/// [`max_delay`](Self::max_delay)) plus a random jitter of up to as much again. An attempt that
/// would start later than [`max_elapsed`](Self::max_elapsed) after the first one started is not
/// made — also when `Retry-After` asks for longer: the call fails at once rather than wait for
/// a retry it may not make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryPolicy {
    /// Calls in all, the first included: 1 never retries.
    pub max_attempts: u32,
    /// No attempt starts later than this after the first one started.
    pub max_elapsed: Duration,
    /// The pause before the first retry when the provider named none.
    pub first_delay: Duration,
    /// The longest pause when the provider named none.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// The most attempts agent settings may ask for.
    pub const MAX_ATTEMPTS: u32 = 10;
    /// The longest budget agent settings may ask for: a run holds its lease all along.
    pub const MAX_ELAPSED: Duration = Duration::from_secs(600);

    /// One attempt, no retry.
    pub fn never() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }
}

impl Default for RetryPolicy {
    /// Four attempts within a minute, pausing about 0.5, 1 and 2 s (jittered) between them.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            max_elapsed: Duration::from_secs(60),
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
        }
    }
}

#[cfg(feature = "tls")]
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
type Connector = HttpConnector;

/// Why an endpoint cannot be used. Never carries the key or the URL.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum EndpointError {
    #[error("the base URL is not an absolute http:// or https:// URL")]
    InvalidUrl,
    #[error("the base URL carries credentials; name the key's environment variable instead")]
    CredentialsInUrl,
    #[error("https:// endpoints need countersign-model built with its `tls` feature")]
    TlsNotBuilt,
    #[error("the model name is empty")]
    EmptyModel,
    #[error("the API key is empty or holds characters a header cannot carry")]
    UnusableKey,
}

impl EndpointError {
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// A [`Model`] over an OpenAI-compatible Chat Completions API:
/// `POST {base_url}/chat/completions` with a bearer token.
///
/// Holds a connection pool and nothing about any run: the transcript, the tools and the
/// options all come with each request.
#[derive(Clone)]
pub struct OpenAiCompatible {
    client: Client<Connector, Full<Bytes>>,
    endpoint: Uri,
    model: String,
    key: SecretString,
    authorization: HeaderValue,
    timeout: Duration,
    retry: RetryPolicy,
}

impl fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl OpenAiCompatible {
    /// A provider calling `{base_url}/chat/completions` (e.g. `https://api.openai.com/v1`) for
    /// `model`, with [`DEFAULT_TIMEOUT`] and the default [`RetryPolicy`]. Surrounding
    /// whitespace of the key is dropped.
    pub fn new(
        base_url: &str,
        model: impl Into<String>,
        api_key: SecretString,
    ) -> Result<Self, EndpointError> {
        let model = model.into();
        if model.trim().is_empty() {
            return Err(EndpointError::EmptyModel);
        }
        let endpoint = endpoint(base_url)?;
        let key = SecretString::from(api_key.expose_secret().trim());
        if key.expose_secret().is_empty() {
            return Err(EndpointError::UnusableKey);
        }
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", key.expose_secret()))
            .map_err(|_| EndpointError::UnusableKey)?;
        authorization.set_sensitive(true);
        Ok(OpenAiCompatible {
            client: client(),
            endpoint,
            model,
            key,
            authorization,
            timeout: DEFAULT_TIMEOUT,
            retry: RetryPolicy::default(),
        })
    }

    /// How a call that failed in a way that may pass is tried again.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// How long one call may take, from connecting to the last byte of the answer.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The URL every call is posted to.
    pub fn endpoint(&self) -> &Uri {
        &self.endpoint
    }

    /// Anything the provider sent back, fit for a log line: the key redacted, cut short.
    fn loggable(&self, body: &[u8]) -> String {
        let text = String::from_utf8_lossy(body);
        let excerpt: String = text.chars().take(LOGGED_BODY_CHARS).collect();
        excerpt.replace(self.key.expose_secret(), "[redacted]")
    }
}

/// The URL calls to `base_url` are posted to; refused as the provider would refuse it.
pub(crate) fn endpoint(base_url: &str) -> Result<Uri, EndpointError> {
    let url = format!("{}/chat/completions", base_url.trim().trim_end_matches('/'));
    let uri: Uri = url.parse().map_err(|_| EndpointError::InvalidUrl)?;
    let authority = uri.authority().ok_or(EndpointError::InvalidUrl)?;
    if authority.as_str().contains('@') {
        return Err(EndpointError::CredentialsInUrl);
    }
    match uri.scheme_str() {
        Some("http") => Ok(uri),
        Some("https") if cfg!(feature = "tls") => Ok(uri),
        Some("https") => Err(EndpointError::TlsNotBuilt),
        _ => Err(EndpointError::InvalidUrl),
    }
}

#[cfg(feature = "tls")]
fn connector() -> Connector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

#[cfg(not(feature = "tls"))]
fn connector() -> Connector {
    HttpConnector::new()
}

fn client() -> Client<Connector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector())
}

/// How an exchange failed before there was a status and a body to judge.
enum Failure {
    Send(hyper_util::client::legacy::Error),
    Body(Box<dyn std::error::Error + Send + Sync>),
}

/// One failed attempt: the error the run records if it is the last, and whether another
/// attempt may do better.
struct Failed {
    error: ModelError,
    retry: Retry,
}

enum Retry {
    /// Another attempt would fail the same way.
    No,
    /// It may pass; `after` is the pause the provider asked for.
    May { after: Option<Duration> },
}

impl Failed {
    fn fatal(error: ModelError) -> Self {
        Failed {
            error,
            retry: Retry::No,
        }
    }

    fn transient(reason: String, after: Option<Duration>) -> Self {
        Failed {
            error: ModelError::Unavailable(reason),
            retry: Retry::May { after },
        }
    }

    fn may_pass(&self) -> bool {
        matches!(self.retry, Retry::May { .. })
    }
}

#[async_trait]
impl Model for OpenAiCompatible {
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        // The turn number names calls that come without an id, the way the scripted model does.
        let turn = 1 + request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let body = Bytes::from(request_body(&self.model, &request).to_string());
        let started = Instant::now();
        let attempts = AtomicU32::new(0);
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.retry.first_delay)
            .with_max_delay(self.retry.max_delay)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(self.retry.max_attempts.saturating_sub(1) as usize);
        let outcome = (|| {
            attempts.fetch_add(1, Ordering::Relaxed);
            self.attempt(body.clone(), turn)
        })
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(Failed::may_pass)
        .adjust(|failed, next| self.pause(failed, next, started.elapsed()))
        .notify(|failed, pause| {
            tracing::warn!(
                endpoint = %self.endpoint,
                attempt = attempts.load(Ordering::Relaxed),
                max_attempts = self.retry.max_attempts,
                ?pause,
                error = %failed.error,
                "the model call failed in a way that may pass; trying again"
            );
        })
        .await;
        outcome.map_err(|failed| {
            let attempts = attempts.load(Ordering::Relaxed);
            match failed.error {
                ModelError::Unavailable(reason) if attempts > 1 => {
                    ModelError::Unavailable(format!("{reason} (gave up after {attempts} attempts)"))
                }
                error => error,
            }
        })
    }
}

impl OpenAiCompatible {
    /// The pause before the next attempt, or `None` when there is to be none: the attempts are
    /// spent (`next` is `None`), or the attempt would start past the time budget.
    fn pause(
        &self,
        failed: &Failed,
        next: Option<Duration>,
        elapsed: Duration,
    ) -> Option<Duration> {
        let Retry::May { after } = failed.retry else {
            return None;
        };
        // `next` is `None` once the attempts are spent, whatever the provider asked for.
        let pause = after.unwrap_or(next?);
        if elapsed.saturating_add(pause) > self.retry.max_elapsed {
            tracing::warn!(
                endpoint = %self.endpoint,
                ?pause,
                ?elapsed,
                budget = ?self.retry.max_elapsed,
                "the retry budget is spent: the model call is not tried again"
            );
            return None;
        }
        Some(pause)
    }

    /// One exchange with the provider, judged.
    async fn attempt(&self, body: Bytes, turn: usize) -> Result<ModelResponse, Failed> {
        let (status, retry_after, body) = self.exchange(body).await?;
        if !status.is_success() {
            tracing::warn!(
                endpoint = %self.endpoint,
                status = status.as_u16(),
                retry_after = ?retry_after,
                body = %self.loggable(&body),
                "the provider answered with an error"
            );
            let reason = status_text(status);
            return Err(if may_pass(status) {
                Failed::transient(reason, retry_after)
            } else {
                Failed::fatal(ModelError::Unavailable(reason))
            });
        }
        parse_response(&body, turn).map_err(|reason| {
            tracing::warn!(
                endpoint = %self.endpoint,
                reason = %reason,
                body = %self.loggable(&body),
                "the provider's answer is not a usable chat completion"
            );
            Failed::fatal(ModelError::InvalidResponse(reason))
        })
    }

    /// Sends `body` and reads the answer within the timeout: its status, the pause its
    /// `Retry-After` asks for, and its body (bounded); a request that could not be sent or an
    /// answer that could not be read is a failure of its own.
    async fn exchange(&self, body: Bytes) -> Result<(StatusCode, Option<Duration>, Bytes), Failed> {
        let http_request = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(Full::new(body))
            .map_err(|e| {
                tracing::error!(error = %e, "could not build the chat completion request");
                Failed::fatal(ModelError::Unavailable(
                    "the request could not be built".into(),
                ))
            })?;

        let exchange = async {
            let response = self
                .client
                .request(http_request)
                .await
                .map_err(Failure::Send)?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|value| retry_after(value, SystemTime::now()));
            let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(Failure::Body)?
                .to_bytes();
            Ok((status, retry_after, body))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => {
                tracing::warn!(endpoint = %self.endpoint, timeout = ?self.timeout, "the provider did not answer in time");
                Err(Failed::fatal(ModelError::Unavailable(format!(
                    "no answer within {} s",
                    self.timeout.as_secs_f64()
                ))))
            }
            Ok(Err(Failure::Send(e))) => {
                tracing::warn!(endpoint = %self.endpoint, error = %error_chain(&e), "the provider could not be reached");
                Err(Failed::transient(
                    "the provider could not be reached".into(),
                    None,
                ))
            }
            Ok(Err(Failure::Body(e))) => {
                tracing::warn!(endpoint = %self.endpoint, error = %error_chain(&*e), "the provider's answer could not be read");
                Err(Failed::transient(
                    "the answer could not be read".into(),
                    None,
                ))
            }
            Ok(Ok(answer)) => Ok(answer),
        }
    }
}

/// Statuses a later attempt may not meet again: rate limits and server trouble, but not a
/// method or a protocol version the server does not implement.
fn may_pass(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || (status.is_server_error()
            && status != StatusCode::NOT_IMPLEMENTED
            && status != StatusCode::HTTP_VERSION_NOT_SUPPORTED)
}

/// The pause a `Retry-After` value asks for at `now`: delay seconds, or an HTTP date (a date
/// past is no pause). `None` for a value that is neither, which leaves the pause to the
/// backoff. Absurdly many seconds are kept as they are, and so exceed any budget.
fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn status_text(status: StatusCode) -> String {
    match status {
        StatusCode::TOO_MANY_REQUESTS => "the provider answered HTTP 429 (rate limited)".into(),
        s => format!("the provider answered HTTP {}", s.as_u16()),
    }
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The request body: the model options first, then the fields this provider owns.
fn request_body(model: &str, request: &ModelRequest<'_>) -> Value {
    let mut body = Map::new();
    for (name, value) in request.options {
        if RESERVED_FIELDS.contains(&name.as_str()) {
            tracing::warn!(option = %name, "a model option naming a field the provider sets is ignored");
        } else {
            body.insert(name.clone(), value.clone());
        }
    }
    body.insert("model".into(), Value::String(model.to_owned()));
    body.insert(
        "messages".into(),
        request.messages.iter().map(wire_message).collect(),
    );
    // An empty `tools` array is refused by some servers; no tools means no field.
    if !request.tools.is_empty() {
        body.insert(
            "tools".into(),
            request.tools.iter().map(|tool| wire_tool(tool)).collect(),
        );
    }
    Value::Object(body)
}

fn wire_message(message: &Message) -> Value {
    match message.role {
        Role::System => json!({"role": "system", "content": message.content}),
        Role::User => json!({"role": "user", "content": message.content}),
        Role::Assistant if message.tool_calls.is_empty() => {
            json!({"role": "assistant", "content": message.content})
        }
        Role::Assistant => {
            let content = if message.content.is_empty() {
                Value::Null
            } else {
                Value::String(message.content.clone())
            };
            let calls: Vec<Value> = message
                .tool_calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        // Always valid JSON, even for arguments that arrived unparseable.
                        "function": {"name": call.name, "arguments": call.arguments.to_string()},
                    })
                })
                .collect();
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        }
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": message.tool_call_id.as_deref().unwrap_or_default(),
            "content": message.content,
        }),
    }
}

fn wire_tool(tool: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    })
}

#[derive(Deserialize)]
struct ChatCompletion {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
}

#[derive(Deserialize)]
struct AnswerMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<WireCall>>,
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    id: Option<String>,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

/// The error text names where the body went wrong, never what it held.
fn parse_response(body: &[u8], turn: usize) -> Result<ModelResponse, String> {
    let completion: ChatCompletion = serde_json::from_slice(body).map_err(|e| {
        format!(
            "the body is not a chat completion ({:?} error at line {}, column {})",
            e.classify(),
            e.line(),
            e.column()
        )
    })?;
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| "the answer has no choices".to_owned())?;
    let content = content_text(choice.message.content)?;
    let tool_calls = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(n, call)| ToolCall {
            id: call
                .id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| format!("call_{turn}_{}", n + 1)),
            name: call.function.name,
            arguments: arguments(call.function.arguments),
        })
        .collect();
    Ok(ModelResponse {
        content,
        tool_calls,
        usage: usage(completion.usage.as_ref()),
    })
}

/// A string, nothing, or (as some servers send) a list of text parts.
fn content_text(content: Option<Value>) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect()),
        Some(_) => Err("the message content is neither text nor a list of parts".into()),
    }
}

/// Arguments arrive as a JSON string. What does not parse is passed on as that string, which
/// the loop refuses as it refuses any arguments that are not an object.
fn arguments(raw: Option<Value>) -> Value {
    match raw {
        None | Some(Value::Null) => Value::Object(Map::new()),
        // A call to a tool without parameters often comes with no arguments at all.
        Some(Value::String(text)) if text.trim().is_empty() => Value::Object(Map::new()),
        Some(Value::String(text)) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        // Some servers send the object itself.
        Some(other) => other,
    }
}

/// Missing or odd counts are zero: usage is bookkeeping, not a reason to fail a turn.
fn usage(usage: Option<&Value>) -> TokenUsage {
    let count = |name: &str| {
        usage
            .and_then(|u| u.get(name))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    TokenUsage {
        prompt: count("prompt_tokens"),
        completion: count("completion_tokens"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_the_base_url_with_one_slash_before_the_path() {
        assert_eq!(
            endpoint("http://127.0.0.1:8080/v1/").unwrap().to_string(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
    }

    #[test]
    fn a_base_url_with_credentials_or_another_scheme_is_refused() {
        assert!(matches!(
            endpoint("http://user:secret@example.test/v1"),
            Err(EndpointError::CredentialsInUrl)
        ));
        assert!(matches!(
            endpoint("ftp://example.test/v1"),
            Err(EndpointError::InvalidUrl)
        ));
        assert!(matches!(
            endpoint("example.test/v1"),
            Err(EndpointError::InvalidUrl)
        ));
    }

    #[test]
    fn https_is_accepted_exactly_when_tls_is_built() {
        let https = endpoint("https://example.test/v1");
        if cfg!(feature = "tls") {
            assert!(https.is_ok());
        } else {
            assert!(matches!(https, Err(EndpointError::TlsNotBuilt)));
        }
    }

    #[test]
    fn empty_arguments_are_an_empty_object_and_an_object_passes_as_sent() {
        assert_eq!(arguments(Some(json!(""))), json!({}));
        assert_eq!(arguments(None), json!({}));
        assert_eq!(arguments(Some(json!({"uid": 1}))), json!({"uid": 1}));
        assert_eq!(arguments(Some(json!("{\"uid\": 1}"))), json!({"uid": 1}));
    }

    #[test]
    fn content_given_as_text_parts_is_joined() {
        let parts = json!([{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]);
        assert_eq!(content_text(Some(parts)).unwrap(), "Hello");
        assert!(content_text(Some(json!(5))).is_err());
    }

    #[test]
    fn a_parse_error_names_the_position_and_not_the_body() {
        let reason = parse_response(br#"{"choices": "the secret prompt"}"#, 1).unwrap_err();
        assert!(reason.contains("line 1"), "{reason}");
        assert!(!reason.contains("secret"), "{reason}");
    }

    #[test]
    fn retry_after_is_read_as_delay_seconds_or_as_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // 06 Nov 1994 08:49:37
        let after = |value: &str| retry_after(&HeaderValue::from_str(value).unwrap(), now);
        assert_eq!(after("120"), Some(Duration::from_secs(120)));
        assert_eq!(after(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            after("Sun, 06 Nov 1994 08:49:40 GMT"),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            after("Sunday, 06-Nov-94 08:49:47 GMT"),
            Some(Duration::from_secs(10)),
            "the obsolete RFC 850 form"
        );
        assert_eq!(
            after("Sun, 06 Nov 1994 08:00:00 GMT"),
            Some(Duration::ZERO),
            "a date past is no pause"
        );
        assert_eq!(
            after("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        for unusable in ["", "1.5", "-3", "soon", "Sun, 06 Nov 1994"] {
            assert_eq!(after(unusable), None, "{unusable:?}");
        }
    }

    #[test]
    fn rate_limits_and_server_trouble_may_pass_other_statuses_do_not() {
        for status in [429, 500, 502, 503, 504, 529] {
            assert!(may_pass(StatusCode::from_u16(status).unwrap()), "{status}");
        }
        for status in [400, 401, 403, 404, 408, 422, 501, 505] {
            assert!(!may_pass(StatusCode::from_u16(status).unwrap()), "{status}");
        }
    }

    #[test]
    fn odd_usage_counts_are_zero() {
        let usage = usage(Some(&json!({"prompt_tokens": -3, "completion_tokens": 7})));
        assert_eq!(
            usage,
            TokenUsage {
                prompt: 0,
                completion: 7
            }
        );
    }

    #[test]
    fn every_endpoint_error_has_the_code_it_always_had() {
        let errors = [
            (EndpointError::InvalidUrl, "invalid_url"),
            (EndpointError::CredentialsInUrl, "credentials_in_url"),
            (EndpointError::TlsNotBuilt, "tls_not_built"),
            (EndpointError::EmptyModel, "empty_model"),
            (EndpointError::UnusableKey, "unusable_key"),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }
}
