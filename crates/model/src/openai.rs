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

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::{
    Message, Model, ModelError, ModelRequest, ModelResponse, Role, TokenUsage, ToolCall, ToolSpec,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
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

#[cfg(feature = "tls")]
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
type Connector = HttpConnector;

/// Why an endpoint cannot be used. Never carries the key or the URL.
#[derive(Debug, thiserror::Error)]
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
        match self {
            EndpointError::InvalidUrl => "invalid_url",
            EndpointError::CredentialsInUrl => "credentials_in_url",
            EndpointError::TlsNotBuilt => "tls_not_built",
            EndpointError::EmptyModel => "empty_model",
            EndpointError::UnusableKey => "unusable_key",
        }
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
}

impl fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OpenAiCompatible {
    /// A provider calling `{base_url}/chat/completions` (e.g. `https://api.openai.com/v1`) for
    /// `model`, with [`DEFAULT_TIMEOUT`]. Surrounding whitespace of the key is dropped.
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
        })
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

fn endpoint(base_url: &str) -> Result<Uri, EndpointError> {
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

#[async_trait]
impl Model for OpenAiCompatible {
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        // The turn number names calls that come without an id, the way the scripted model does.
        let turn = 1 + request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let body = request_body(&self.model, &request);
        let http_request = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| {
                tracing::error!(error = %e, "could not build the chat completion request");
                ModelError::Unavailable("the request could not be built".into())
            })?;

        let exchange = async {
            let response = self
                .client
                .request(http_request)
                .await
                .map_err(Failure::Send)?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(Failure::Body)?
                .to_bytes();
            Ok((status, body))
        };
        let (status, body) = match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => {
                tracing::warn!(endpoint = %self.endpoint, timeout = ?self.timeout, "the provider did not answer in time");
                return Err(ModelError::Unavailable(format!(
                    "no answer within {} s",
                    self.timeout.as_secs_f64()
                )));
            }
            Ok(Err(Failure::Send(e))) => {
                tracing::warn!(endpoint = %self.endpoint, error = %error_chain(&e), "the provider could not be reached");
                return Err(ModelError::Unavailable(
                    "the provider could not be reached".into(),
                ));
            }
            Ok(Err(Failure::Body(e))) => {
                tracing::warn!(endpoint = %self.endpoint, error = %error_chain(&*e), "the provider's answer could not be read");
                return Err(ModelError::Unavailable(
                    "the answer could not be read".into(),
                ));
            }
            Ok(Ok(answer)) => answer,
        };

        if !status.is_success() {
            tracing::warn!(
                endpoint = %self.endpoint,
                status = status.as_u16(),
                body = %self.loggable(&body),
                "the provider answered with an error"
            );
            return Err(ModelError::Unavailable(status_text(status)));
        }
        parse_response(&body, turn).map_err(|reason| {
            tracing::warn!(
                endpoint = %self.endpoint,
                reason = %reason,
                body = %self.loggable(&body),
                "the provider's answer is not a usable chat completion"
            );
            ModelError::InvalidResponse(reason)
        })
    }
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
            request.tools.iter().map(wire_tool).collect(),
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
}
