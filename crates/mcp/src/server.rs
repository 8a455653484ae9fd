//! One MCP server: its session and the session's renewal. Over stdio the session is a
//! process countersign starts; over streamable HTTP it is a session with a server that runs
//! elsewhere, opened with the server's bearer secret.
//!
//! A session is opened at discovery and again, on the next call, whenever it has ended: the
//! process died, or the HTTP server no longer knows the session (it was restarted, or let the
//! session expire) — then the request is sent again at once in a new session, since a server
//! that does not know a session did nothing with its request. An opening that fails waits out
//! a backoff (doubling from half a second to half a minute) before the next is tried, and a
//! call meanwhile fails as [`CallError::NotSent`]. A call learns whether its request may have
//! reached the server: only a request that certainly did not is safe to send again whatever
//! the tool does.

use std::borrow::Cow;
use std::future::Future;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_remote::{secret_variable, Trust};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, RequestMetaObject};
use rmcp::service::{ClientInitializeError, Peer, RoleClient, RunningService, ServiceError};
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::ServiceExt;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::config::{McpServerEntry, Transport};
use crate::http::{fate, Fate, HttpClient, HttpError};
use crate::McpError;

/// The variables of countersign's environment every server's process gets.
const INHERITED: [&str; 4] = ["PATH", "HOME", "LANG", "TZ"];

/// How long opening a session (starting the process, the protocol's handshake) may take.
const START_TIMEOUT: Duration = Duration::from_secs(20);
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How one request to an MCP server failed. [`code`](Self::code) is what may reach a preview
/// line, an event or a log field.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No session could be opened (or an opening waits out its backoff), or the request
    /// otherwise certainly did not reach the server.
    #[error("the MCP server is not running")]
    NotSent,
    /// The server refused countersign's credentials: nothing was done.
    #[error("the MCP server refused the credentials")]
    Unauthorized,
    /// The session ended, or no answer came in time, after the request may have been sent.
    #[error("the MCP server's answer was lost")]
    Lost,
    /// The server answered with a JSON-RPC error (an unknown tool, invalid arguments, its own
    /// internal error), or refused the request over HTTP without one.
    #[error("the MCP server answered with a protocol error: {0}")]
    Protocol(String),
}

impl CallError {
    pub fn code(&self) -> &'static str {
        match self {
            CallError::NotSent => "mcp_unavailable",
            CallError::Unauthorized => "mcp_unauthorized",
            CallError::Lost => "mcp_answer_lost",
            CallError::Protocol(_) => "mcp_protocol_error",
        }
    }
}

/// What a failed request leaves to do.
enum Failure {
    Call(CallError),
    /// The server does not know the session: open a new one and send the request again.
    SessionGone,
}

type Session = RunningService<RoleClient, ()>;

/// The running session, and when an opening may next be tried.
#[derive(Default)]
struct Supervision {
    session: Option<Session>,
    /// Counts the sessions opened: a request that finds its session gone ends that one only.
    generation: u64,
    failed_starts: u32,
    next_start: Option<Instant>,
}

/// How countersign reaches the server.
enum Link {
    /// A process of this environment, spoken to over stdio.
    Stdio { environment: Vec<(String, String)> },
    /// A streamable HTTP endpoint.
    Http { client: HttpClient, url: Arc<str> },
}

/// A configured MCP server and its supervised session.
pub struct McpServer {
    entry: McpServerEntry,
    link: Link,
    supervision: Mutex<Supervision>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.entry.name())
            .field("transport", &self.entry.transport())
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// The server of `entry`. A `command` server's `pass_env` variables are read with
    /// `variable`; a `url` server's secret is the variable [`secret_variable`] names, and its
    /// certificate (over `https://`) is verified against `trust`. Nothing is started yet.
    pub fn new(
        entry: McpServerEntry,
        trust: &Trust,
        variable: impl Fn(&str) -> Option<String>,
    ) -> Result<McpServer, McpError> {
        let link = match entry.transport() {
            Transport::Stdio(_) => {
                let mut environment: Vec<(String, String)> = INHERITED
                    .iter()
                    .map(|v| (*v).to_owned())
                    .chain(entry.pass_env.iter().cloned())
                    .filter_map(|v| variable(&v).map(|value| (v, value)))
                    .collect();
                environment.extend(entry.env.iter().map(|(k, v)| (k.clone(), v.clone())));
                Link::Stdio { environment }
            }
            Transport::Http(url) => {
                let name = secret_variable(entry.name());
                let secret = variable(&name).filter(|s| !s.is_empty()).ok_or_else(|| {
                    McpError::SecretMissing {
                        server: entry.name().to_owned(),
                        variable: name.clone(),
                    }
                })?;
                let client = HttpClient::new(&secret, trust).ok_or_else(|| {
                    McpError::BadConfiguration(format!(
                        "{}: the secret in {name} cannot be sent in an HTTP header",
                        entry.name()
                    ))
                })?;
                Link::Http {
                    client,
                    url: Arc::from(url),
                }
            }
        };
        Ok(McpServer {
            entry,
            link,
            supervision: Mutex::new(Supervision::default()),
        })
    }

    pub fn entry(&self) -> &McpServerEntry {
        &self.entry
    }

    pub fn name(&self) -> &str {
        self.entry.name()
    }

    /// The session's peer and generation, opening a session when none is running.
    async fn peer(&self) -> Result<(Peer<RoleClient>, u64), CallError> {
        let mut supervision = self.supervision.lock().await;
        if let Some(session) = &supervision.session {
            if !session.is_closed() && !session.peer().is_transport_closed() {
                return Ok((session.peer().clone(), supervision.generation));
            }
            tracing::warn!(server = %self.name(), "the MCP server's session ended; opening a new one");
            supervision.session = None;
        }
        if supervision.next_start.is_some_and(|at| Instant::now() < at) {
            return Err(CallError::NotSent);
        }
        match self.open().await {
            Ok(session) => {
                let peer = session.peer().clone();
                *supervision = Supervision {
                    session: Some(session),
                    generation: supervision.generation + 1,
                    ..Supervision::default()
                };
                Ok((peer, supervision.generation))
            }
            Err((reason, error)) => {
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << supervision.failed_starts.min(6))
                    .min(MAX_BACKOFF);
                supervision.failed_starts += 1;
                supervision.next_start = Some(Instant::now() + backoff);
                tracing::warn!(server = %self.name(), %reason, code = error.code(), ?backoff, "no session with the MCP server could be opened");
                Err(error)
            }
        }
    }

    /// Ends session `generation`, unless another has replaced it already.
    async fn discard(&self, generation: u64) {
        let mut supervision = self.supervision.lock().await;
        if supervision.generation == generation {
            supervision.session = None;
        }
    }

    /// Opens a session: starts the process, or reaches the endpoint, and runs the protocol's
    /// handshake. A failure says why, and what it leaves the request as.
    async fn open(&self) -> Result<Session, (String, CallError)> {
        let handshake = match &self.link {
            Link::Stdio { environment } => {
                let transport = self
                    .spawn(environment)
                    .map_err(|reason| (reason, CallError::NotSent))?;
                tokio::time::timeout(START_TIMEOUT, ().serve(transport)).await
            }
            Link::Http { client, url } => {
                let transport =
                    StreamableHttpClientTransport::with_client(client.clone(), http_config(url));
                tokio::time::timeout(START_TIMEOUT, ().serve(transport)).await
            }
        };
        match handshake {
            Ok(Ok(session)) => {
                tracing::info!(server = %self.name(), "MCP session opened");
                Ok(session)
            }
            Ok(Err(e)) => Err((format!("the handshake failed: {e}"), opening_failure(&e))),
            Err(_) => Err((
                "the handshake did not finish in time".to_owned(),
                CallError::NotSent,
            )),
        }
    }

    /// Starts the server's process with `environment`.
    fn spawn(&self, environment: &[(String, String)]) -> Result<TokioChildProcess, String> {
        let (program, args) = self.entry.command.split_first().ok_or("no command")?;
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .env_clear()
            .envs(environment.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        if let Some(dir) = &self.entry.cwd {
            command.current_dir(dir);
        }
        let (transport, _) = TokioChildProcess::builder(command)
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawning {program}: {e}"))?;
        Ok(transport)
    }

    /// Sends one request with `send` in the current session, answered within `timeout`; a
    /// session the server no longer knows is replaced and the request sent once more.
    async fn request<T, F>(
        &self,
        what: &str,
        timeout: Duration,
        send: impl Fn(Peer<RoleClient>) -> F,
    ) -> Result<T, CallError>
    where
        F: Future<Output = Result<T, ServiceError>>,
    {
        let mut renewed = false;
        loop {
            let (peer, generation) = self.peer().await?;
            let error = match tokio::time::timeout(timeout, send(peer)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => e,
                Err(_) => {
                    tracing::warn!(server = %self.name(), what, ?timeout, "the MCP server did not answer in time");
                    return Err(CallError::Lost);
                }
            };
            match self.failure(error) {
                Failure::Call(e) => return Err(e),
                Failure::SessionGone => {
                    self.discard(generation).await;
                    if std::mem::replace(&mut renewed, true) {
                        return Err(CallError::NotSent);
                    }
                    tracing::warn!(server = %self.name(), what, "the MCP server does not know the session; sending again in a new one");
                }
            }
        }
    }

    /// Every tool the server lists.
    pub async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, CallError> {
        self.request("tools/list", START_TIMEOUT, |peer| async move {
            peer.list_all_tools().await
        })
        .await
    }

    /// One `tools/call` of `tool` with `arguments` and `meta`, answered within `timeout`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: &Value,
        meta: JsonObject,
        timeout: Duration,
    ) -> Result<CallToolResult, CallError> {
        let mut params = CallToolRequestParams::new(Cow::Owned(tool.to_owned()));
        params.arguments = arguments.as_object().cloned();
        params.meta = Some(RequestMetaObject(rmcp::model::MetaObject(meta)));
        self.request(tool, timeout, |peer| {
            let params = params.clone();
            async move { peer.call_tool(params).await }
        })
        .await
    }

    fn failure(&self, e: ServiceError) -> Failure {
        tracing::warn!(server = %self.name(), error = %e, "MCP request failed");
        Failure::Call(match e {
            ServiceError::McpError(e) => CallError::Protocol(e.message.into_owned()),
            ServiceError::TransportSend(e) => {
                match e.error.downcast_ref::<StreamableHttpError<HttpError>>() {
                    Some(e) => match fate(e) {
                        Fate::NotSent => CallError::NotSent,
                        Fate::SessionGone => return Failure::SessionGone,
                        Fate::Unauthorized => CallError::Unauthorized,
                        Fate::Refused(reason) => CallError::Protocol(reason),
                        Fate::Lost => CallError::Lost,
                    },
                    // Over stdio: the request could not be written, it never reached the
                    // server.
                    None => CallError::NotSent,
                }
            }
            _ => CallError::Lost,
        })
    }
}

/// The streamable HTTP transport of `url`: the session is renewed by [`McpServer`], not
/// behind its back, and the server's event stream is reconnected with the same backoff as
/// a session.
fn http_config(url: &Arc<str>) -> StreamableHttpClientTransportConfig {
    let mut backoff = ExponentialBackoff::default();
    backoff.base_duration = FIRST_BACKOFF;
    backoff.max_delay = Some(MAX_BACKOFF);
    let mut config = StreamableHttpClientTransportConfig::with_uri(Arc::clone(url))
        .reinit_on_expired_session(false);
    config.retry_config = Arc::new(backoff);
    config
}

/// What a failed opening leaves a request as: refused credentials are told apart from a
/// server that cannot be reached, since the operator fixes them differently.
fn opening_failure(error: &ClientInitializeError) -> CallError {
    let refused = match error {
        ClientInitializeError::TransportError { error, .. } => error
            .error
            .downcast_ref::<StreamableHttpError<HttpError>>()
            .is_some_and(|e| fate(e) == Fate::Unauthorized),
        _ => false,
    };
    if refused {
        CallError::Unauthorized
    } else {
        CallError::NotSent
    }
}
