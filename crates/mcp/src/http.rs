//! The client side of MCP's streamable HTTP transport: rmcp's [`StreamableHttpClient`] over
//! the HTTP stack the rest of countersign already uses (hyper, hyper-util's pooled client,
//! rustls through hyper-rustls), so a server's certificate is verified against the same
//! [`Trust`] as a remote tool server's and the build gains no second HTTP stack.
//!
//! rmcp's transport runs the protocol (the session, its event streams, their reconnection);
//! this client does one exchange at a time and has two jobs beyond it. It bounds every answer
//! before it is parsed — a JSON body by [`StreamableHttpResponseLimits`], each event of an
//! event stream by the event size limit — because a server's answer is untrusted input. And
//! its errors say whether a request can have reached the server: [`HttpError::Connect`] (no
//! connection, a failed TLS handshake) only when it certainly did not, which `fate` turns
//! into what a call may do next.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use countersign_remote::Trust;
use futures_util::future::ready;
use futures_util::stream::{BoxStream, StreamExt};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body, Bytes, Incoming};
use hyper::header::{
    HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE,
};
use hyper::http::request::Builder;
use hyper::{Method, Request, Response, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, InsufficientScopeError, SseError, StreamableHttpClient, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};

/// How long opening a connection (TCP and TLS) may take; past it the request was not sent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

type Failure = StreamableHttpError<HttpError>;
type Events = BoxStream<'static, Result<Sse, SseError>>;

/// How one exchange failed, in the terms that decide what a call may do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// No connection could be opened (refused, unreachable, timed out, the TLS handshake
    /// failed): the request was not sent.
    #[error("no connection to the MCP server: {0}")]
    Connect(#[source] hyper_util::client::legacy::Error),
    /// The exchange broke after the request may have been sent.
    #[error("the exchange with the MCP server broke off: {0}")]
    Exchange(#[source] hyper_util::client::legacy::Error),
    /// The answer's body broke off.
    #[error("the MCP server's answer broke off: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// One event of an event stream exceeded the size limit.
    #[error("an event of the MCP server's stream exceeds {0} bytes")]
    EventTooLarge(usize),
    /// An HTTP status that carries no JSON-RPC message.
    #[error("the MCP server answered HTTP {0}")]
    Status(u16),
    /// The request could not be built or encoded: it was not sent.
    #[error("the request could not be built: {0}")]
    Request(String),
}

/// What the failure of one request of a streamable HTTP session says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It certainly did not reach the server.
    NotSent,
    /// The server does not know the session (it was restarted, or let the session expire):
    /// it did nothing with the request, and a new session is needed.
    SessionGone,
    /// The server refused the credentials.
    Unauthorized,
    /// The server refused the request itself (an HTTP 4xx without a JSON-RPC error).
    Refused(String),
    /// It may have reached the server, and no usable answer came back.
    Lost,
}

/// What `error` says about the request that failed with it.
pub(crate) fn fate(error: &Failure) -> Fate {
    match error {
        StreamableHttpError::Client(HttpError::Connect(_) | HttpError::Request(_)) => Fate::NotSent,
        // Too many requests: the server turned it away before doing anything with it.
        StreamableHttpError::Client(HttpError::Status(429)) => Fate::NotSent,
        StreamableHttpError::Client(HttpError::Status(status)) if *status < 500 => {
            Fate::Refused(format!("HTTP {status}"))
        }
        StreamableHttpError::ReservedHeaderConflict(_) => Fate::NotSent,
        StreamableHttpError::SessionExpired | StreamableHttpError::ReinitializationFailed(_) => {
            Fate::SessionGone
        }
        StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_) => {
            Fate::Unauthorized
        }
        // A broken exchange, a 5xx, an answer too large or unreadable, a closed worker: the
        // server may have acted on the request.
        _ => Fate::Lost,
    }
}

/// The HTTP client of one streamable HTTP MCP server: a connection pool and the server's
/// bearer secret.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `Bearer <secret>`, marked sensitive. The secret is the client's own, so the
    /// transport's `auth_header` (which its configuration would print) is never set.
    authorization: HeaderValue,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client sending `secret` as its bearer token, verifying certificates against `trust`;
    /// `None` when the secret cannot be sent in a header.
    pub fn new(secret: &str, trust: &Trust) -> Option<HttpClient> {
        Some(HttpClient {
            client: trust.https_client(Some(CONNECT_TIMEOUT), POOL_IDLE_TIMEOUT),
            authorization: countersign_remote::tls::bearer(secret)?,
        })
    }

    /// A request to `uri` with the secret, the session and the transport's headers.
    fn request(
        &self,
        method: Method,
        uri: &str,
        session_id: Option<&str>,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Builder {
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, self.authorization.clone());
        if let Some(id) = session_id {
            builder = builder.header(HEADER_SESSION_ID, id);
        }
        for (name, value) in headers {
            builder = builder.header(name, value);
        }
        builder
    }

    async fn send(
        &self,
        request: Result<Request<Full<Bytes>>, hyper::http::Error>,
    ) -> Result<Response<Incoming>, Failure> {
        let request =
            request.map_err(|e| StreamableHttpError::Client(HttpError::Request(e.to_string())))?;
        self.client.request(request).await.map_err(|e| {
            StreamableHttpError::Client(if e.is_connect() {
                HttpError::Connect(e)
            } else {
                HttpError::Exchange(e)
            })
        })
    }
}

/// The refusal of the credentials a 401 or 403 is, or the end of the session a 404 to a request
/// `in_session` is.
fn refusal(response: &Response<Incoming>, in_session: bool) -> Option<Failure> {
    let challenge = || {
        response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    match response.status() {
        StatusCode::UNAUTHORIZED => Some(StreamableHttpError::AuthRequired(
            AuthRequiredError::new(challenge()),
        )),
        StatusCode::FORBIDDEN => Some(StreamableHttpError::InsufficientScope(
            InsufficientScopeError::new(challenge(), None),
        )),
        StatusCode::NOT_FOUND if in_session => Some(StreamableHttpError::SessionExpired),
        _ => None,
    }
}

/// Whether the answer's media type (its parameters aside) is `expected`.
fn media_type_is(response: &Response<Incoming>, expected: &str) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(expected))
}

fn content_type(response: &Response<Incoming>) -> Option<String> {
    response
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// The whole body, refused once it exceeds `max_size` bytes: a declared length over it before
/// anything is read.
async fn read_bounded(body: Incoming, max_size: usize) -> Result<Bytes, Failure> {
    if body.size_hint().lower() > max_size as u64 {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size });
    }
    match Limited::new(body, max_size).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => {
            Err(StreamableHttpError::ResponseBodyTooLarge { max_size })
        }
        Err(e) => Err(StreamableHttpError::Client(HttpError::Body(e))),
    }
}

/// Counts the bytes of the event being received as the SSE parser keeps them: every field
/// line since the last blank line, and the line being read. Comment lines (`:` first) are
/// dropped by the parser once they end, so they count only while they are read.
#[derive(Debug)]
struct EventLimit {
    max: usize,
    event: usize,
    line: usize,
    comment: bool,
    after_cr: bool,
}

impl EventLimit {
    fn new(max: usize) -> EventLimit {
        EventLimit {
            max,
            event: 0,
            line: 0,
            comment: false,
            after_cr: false,
        }
    }

    /// Takes in the next chunk; false once the event exceeds the limit.
    fn admits(&mut self, chunk: &[u8]) -> bool {
        for &byte in chunk {
            // CRLF is one line end.
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                continue;
            }
            if byte == b'\r' || byte == b'\n' {
                self.after_cr = byte == b'\r';
                if self.line == 0 {
                    self.event = 0;
                } else if !self.comment {
                    // The parser joins data lines with a newline.
                    self.event = self.event.saturating_add(self.line + 1);
                }
                self.line = 0;
                self.comment = false;
            } else {
                if self.line == 0 {
                    self.comment = byte == b':';
                }
                self.line += 1;
            }
            if self.event.saturating_add(self.line) > self.max {
                return false;
            }
        }
        true
    }
}

/// The events of an event stream, ending with an error at the first event over
/// `max_event_size` bytes or the first failure of the body.
fn events(body: Incoming, max_event_size: usize) -> Events {
    let bytes = body.into_data_stream().scan(
        Some(EventLimit::new(max_event_size)),
        move |limit, chunk| {
            let Some(within) = limit else {
                return ready(None);
            };
            let item = match chunk {
                Ok(chunk) if within.admits(&chunk) => Ok(chunk),
                Ok(_) => Err(HttpError::EventTooLarge(max_event_size)),
                Err(e) => Err(HttpError::Body(Box::new(e))),
            };
            if item.is_err() {
                *limit = None;
            }
            ready(Some(item))
        },
    );
    SseStream::from_bytes_stream(bytes).boxed()
}

/// A non-2xx answer to a POST: the JSON-RPC error it carries, else its status.
async fn failed_post(
    response: Response<Incoming>,
    session_id: Option<String>,
    limits: StreamableHttpResponseLimits,
) -> Result<StreamableHttpPostResponse, Failure> {
    let status = response.status().as_u16();
    if media_type_is(&response, JSON_MIME_TYPE) {
        let body = read_bounded(response.into_body(), limits.max_json_response_size).await?;
        if let Ok(error @ ServerJsonRpcMessage::Error(_)) = serde_json::from_slice(&body) {
            return Ok(StreamableHttpPostResponse::Json(error, session_id));
        }
    }
    Err(StreamableHttpError::Client(HttpError::Status(status)))
}

/// A 2xx answer to a POST: one JSON message, an event stream, or nothing at all.
async fn answered_post(
    response: Response<Incoming>,
    awaits_no_response: bool,
    session_id: Option<String>,
    limits: StreamableHttpResponseLimits,
) -> Result<StreamableHttpPostResponse, Failure> {
    if media_type_is(&response, EVENT_STREAM_MIME_TYPE) {
        let stream = events(response.into_body(), limits.max_sse_event_size);
        return Ok(StreamableHttpPostResponse::Sse(stream, session_id));
    }
    if media_type_is(&response, JSON_MIME_TYPE) {
        let body = read_bounded(response.into_body(), limits.max_json_response_size).await?;
        return match serde_json::from_slice(&body) {
            Ok(message) => Ok(StreamableHttpPostResponse::Json(message, session_id)),
            // A notification or a response of ours needs nothing from the body.
            Err(_) if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
            Err(e) => Err(StreamableHttpError::Deserialize(e)),
        };
    }
    if awaits_no_response {
        // Some servers answer a notification with an empty 200 instead of a 202.
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    Err(StreamableHttpError::UnexpectedContentType(content_type(
        &response,
    )))
}

impl StreamableHttpClient for HttpClient {
    type Error = HttpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        let body = serde_json::to_vec(&message)
            .map_err(|e| StreamableHttpError::Client(HttpError::Request(e.to_string())))?;
        let request = self
            .request(Method::POST, &uri, session_id.as_deref(), custom_headers)
            .header(CONTENT_TYPE, JSON_MIME_TYPE)
            .header(
                ACCEPT,
                format!("{JSON_MIME_TYPE}, {EVENT_STREAM_MIME_TYPE}"),
            )
            .body(Full::new(Bytes::from(body)));
        let response = self.send(request).await?;
        if let Some(refused) = refusal(&response, session_id.is_some()) {
            return Err(refused);
        }
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        let new_session = response
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if !status.is_success() {
            return failed_post(response, new_session, limits).await;
        }
        let awaits_no_response = !matches!(message, ClientJsonRpcMessage::Request(_));
        answered_post(response, awaits_no_response, new_session, limits).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failure> {
        let request = self
            .request(Method::DELETE, &uri, Some(&session_id), custom_headers)
            .body(Full::default());
        let response = self.send(request).await?;
        match response.status() {
            // A server that keeps sessions until they expire says so.
            StatusCode::METHOD_NOT_ALLOWED => Ok(()),
            status if status.is_success() => Ok(()),
            status => Err(StreamableHttpError::Client(HttpError::Status(
                status.as_u16(),
            ))),
        }
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events, Failure> {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default().max_sse_event_size,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Events, Failure> {
        let mut request = self
            .request(Method::GET, &uri, session_id.as_deref(), custom_headers)
            .header(ACCEPT, EVENT_STREAM_MIME_TYPE);
        if let Some(id) = last_event_id {
            request = request.header(HEADER_LAST_EVENT_ID, id);
        }
        let response = self.send(request.body(Full::default())).await?;
        if let Some(refused) = refusal(&response, session_id.is_some()) {
            return Err(refused);
        }
        let status = response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if !status.is_success() {
            return Err(StreamableHttpError::Client(HttpError::Status(
                status.as_u16(),
            )));
        }
        if !media_type_is(&response, EVENT_STREAM_MIME_TYPE) {
            return Err(StreamableHttpError::UnexpectedContentType(content_type(
                &response,
            )));
        }
        Ok(events(response.into_body(), max_sse_event_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const SECRET: &str = "s3cret-token";

    /// Answers one connection on a port of its own with `response`; gives back the URL and,
    /// when it is done, the request it read.
    async fn canned(response: String) -> (Arc<str>, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let served = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut read = Vec::new();
            let mut buf = [0; 4096];
            while !whole_request(&read) {
                let n = stream.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                read.extend_from_slice(&buf[..n]);
            }
            stream.write_all(response.as_bytes()).await.unwrap();
            let _ = stream.shutdown().await;
            String::from_utf8_lossy(&read).into_owned()
        });
        (url.into(), served)
    }

    fn whole_request(read: &[u8]) -> bool {
        let text = String::from_utf8_lossy(read).to_ascii_lowercase();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            return false;
        };
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        body.len() >= length
    }

    fn answer(status: &str, headers: &[&str], body: &str) -> String {
        let mut text = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
        for header in headers {
            text.push_str(header);
            text.push_str("\r\n");
        }
        text + &format!("content-length: {}\r\n\r\n{body}", body.len())
    }

    fn client() -> HttpClient {
        HttpClient::new(SECRET, &Trust::new(None).unwrap()).unwrap()
    }

    fn ping() -> ClientJsonRpcMessage {
        serde_json::from_value(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).unwrap()
    }

    fn initialized() -> ClientJsonRpcMessage {
        serde_json::from_value(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .unwrap()
    }

    async fn post(
        response: String,
        message: ClientJsonRpcMessage,
        session: Option<&str>,
        limits: StreamableHttpResponseLimits,
    ) -> (Result<StreamableHttpPostResponse, Failure>, String) {
        let (url, served) = canned(response).await;
        let result = client()
            .post_message_with_response_limits(
                url,
                message,
                session.map(Arc::from),
                None,
                HashMap::new(),
                limits,
            )
            .await;
        (result, served.await.unwrap())
    }

    /// What a ping answered with `response` comes to, under the default limits.
    async fn pinged(
        response: String,
        session: Option<&str>,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        post(response, ping(), session, Default::default()).await.0
    }

    #[tokio::test]
    async fn a_json_answer_carries_its_session_and_the_request_its_secret_and_session() {
        let body = r#"{"jsonrpc": "2.0", "id": 1, "result": {}}"#;
        let response = answer(
            "200 OK",
            &["content-type: application/json", "mcp-session-id: s-1"],
            body,
        );
        let (result, request) = post(response, ping(), Some("s-0"), Default::default()).await;
        let request = request.to_ascii_lowercase();
        assert!(request.starts_with("post /mcp http/1.1"), "{request}");
        assert!(request.contains(&format!(
            "authorization: bearer {}",
            SECRET.to_ascii_lowercase()
        )));
        assert!(request.contains("mcp-session-id: s-0"), "{request}");
        assert!(request.contains("accept: application/json, text/event-stream"));
        match result {
            Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Response(_), session)) => {
                assert_eq!(session.as_deref(), Some("s-1"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_event_stream_answer_yields_its_events() {
        let response = answer(
            "200 OK",
            &["content-type: text/event-stream"],
            "event: message\ndata: {\"jsonrpc\": \"2.0\", \"id\": 1, \"result\": {}}\n\n",
        );
        let result = pinged(response, None).await;
        let Ok(StreamableHttpPostResponse::Sse(mut events, None)) = result else {
            panic!("{result:?}");
        };
        let event = events.next().await.unwrap().unwrap();
        assert_eq!(event.event.as_deref(), Some("message"));
        assert!(event.data.unwrap().contains(r#""result": {}"#));
        assert!(events.next().await.is_none());
    }

    #[tokio::test]
    async fn an_event_over_the_limit_ends_the_stream_with_an_error() {
        let response = answer(
            "200 OK",
            &["content-type: text/event-stream"],
            &format!("data: {}\n\n", "x".repeat(100)),
        );
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = 50;
        let (result, _) = post(response, ping(), None, limits).await;
        let Ok(StreamableHttpPostResponse::Sse(mut events, _)) = result else {
            panic!("{result:?}");
        };
        assert!(events.next().await.unwrap().is_err());
        assert!(events.next().await.is_none());
    }

    #[tokio::test]
    async fn the_statuses_of_the_transport_are_told_apart() {
        let json = "content-type: application/json";
        let (result, _) = post(
            answer("202 Accepted", &[], ""),
            initialized(),
            Some("s"),
            Default::default(),
        )
        .await;
        assert!(
            matches!(result, Ok(StreamableHttpPostResponse::Accepted)),
            "{result:?}"
        );
        let result = pinged(answer("404 Not Found", &[], ""), Some("s")).await;
        assert!(
            matches!(result, Err(StreamableHttpError::SessionExpired)),
            "{result:?}"
        );
        let result = pinged(
            answer("401 Unauthorized", &["www-authenticate: Bearer"], ""),
            None,
        )
        .await;
        assert_eq!(fate(&result.unwrap_err()), Fate::Unauthorized);
        let result = pinged(answer("500 Internal Server Error", &[], "oops"), None).await;
        assert_eq!(fate(&result.unwrap_err()), Fate::Lost);
        let error = r#"{"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}"#;
        let result = pinged(answer("400 Bad Request", &[json], error), None).await;
        assert!(
            matches!(
                result,
                Ok(StreamableHttpPostResponse::Json(
                    ServerJsonRpcMessage::Error(_),
                    _
                ))
            ),
            "{result:?}"
        );
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_json_response_size = 10;
        let (result, _) = post(
            answer(
                "200 OK",
                &[json],
                r#"{"jsonrpc": "2.0", "id": 1, "result": {}}"#,
            ),
            ping(),
            None,
            limits,
        )
        .await;
        assert!(
            matches!(
                result,
                Err(StreamableHttpError::ResponseBodyTooLarge { max_size: 10 })
            ),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn a_request_that_found_no_server_or_no_tls_was_not_sent() {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let error = client()
            .post_message(
                format!("http://{closed}/mcp").into(),
                ping(),
                None,
                None,
                HashMap::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(fate(&error), Fate::NotSent, "{error}");
        // A server that does not speak TLS fails the handshake before anything is sent.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let _ = stream.write_all(answer("200 OK", &[], "").as_bytes()).await;
        });
        let error = client()
            .post_message(url.into(), ping(), None, None, HashMap::new())
            .await
            .unwrap_err();
        assert_eq!(fate(&error), Fate::NotSent, "{error}");
    }

    fn admitted(max: usize, chunks: &[&str]) -> bool {
        let mut limit = EventLimit::new(max);
        chunks.iter().all(|c| limit.admits(c.as_bytes()))
    }

    #[test]
    fn an_event_is_bounded_and_a_blank_line_starts_the_next() {
        // "data: 12345\n" keeps 12 bytes.
        assert!(admitted(12, &["data: 12345\n\n", "data: 12345\n\n"]));
        assert!(!admitted(12, &["data: 12345\n", "data: 1\n\n"]));
        assert!(admitted(
            12,
            &["data: 123", "45\r\n\r\n", "data: 12345\r\n\r\n"]
        ));
        assert!(
            !admitted(12, &["data: 1234567"]),
            "a line being read counts"
        );
        // A comment is dropped when its line ends.
        assert!(admitted(
            12,
            &[": ping 1234\n", ": ping 1234\n", "data: 12345\n\n"]
        ));
    }

    #[test]
    fn only_a_request_that_cannot_have_arrived_is_not_sent() {
        for (error, expected) in [
            (HttpError::Request("x".into()), Fate::NotSent),
            (HttpError::Status(429), Fate::NotSent),
            (HttpError::Status(400), Fate::Refused("HTTP 400".into())),
            (HttpError::Status(502), Fate::Lost),
            (HttpError::EventTooLarge(1), Fate::Lost),
            (HttpError::Body("cut".into()), Fate::Lost),
        ] {
            assert_eq!(fate(&StreamableHttpError::Client(error)), expected);
        }
        assert_eq!(
            fate(&StreamableHttpError::SessionExpired),
            Fate::SessionGone
        );
        assert_eq!(
            fate(&StreamableHttpError::AuthRequired(AuthRequiredError::new(
                String::new()
            ))),
            Fate::Unauthorized
        );
        assert_eq!(
            fate(&StreamableHttpError::ResponseBodyTooLarge { max_size: 1 }),
            Fate::Lost
        );
        assert_eq!(
            fate(&StreamableHttpError::UnexpectedEndOfStream),
            Fate::Lost
        );
    }
}
