//! One MCP server: its session and the session's renewal, and its listing held to what an
//! operator accepted. Over stdio the session is a process countersign starts; over streamable
//! HTTP it is a session with a server that runs elsewhere, opened with the server's bearer
//! secret.
//!
//! The server is listed again whenever a session other than the first is opened (a restarted
//! process may be another program) and whenever it says `notifications/tools/list_changed`: a
//! tool it lists otherwise than it was registered, or than an operator accepted, is withheld
//! from every run ([`McpServer::relist`]), and no call of it is sent.
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
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_remote::{secret_variable, Pins, Trust};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ErrorCode, JsonObject, RequestMetaObject,
};
use rmcp::service::{
    ClientInitializeError, NotificationContext, Peer, RoleClient, RunningService, ServiceError,
};
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::ClientHandler;
use rmcp::ServiceExt;
use serde_json::Value;
use tokio::sync::{Mutex, Notify};

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
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CallError {
    /// No session could be opened (or an opening waits out its backoff), or the request
    /// otherwise certainly did not reach the server.
    #[error("the MCP server is not running")]
    #[strum(serialize = "mcp_unavailable")]
    NotSent,
    /// The server refused countersign's credentials: nothing was done.
    #[error("the MCP server refused the credentials")]
    #[strum(serialize = "mcp_unauthorized")]
    Unauthorized,
    /// The session ended after the request may have been sent.
    #[error("the MCP server's answer was lost")]
    #[strum(serialize = "mcp_answer_lost")]
    Lost,
    /// No answer came in the time the call was given, after the request may have been sent.
    #[error("the MCP server did not answer in time")]
    #[strum(serialize = "mcp_timeout")]
    TimedOut,
    /// The server refused the request without carrying it out: a JSON-RPC error that says so
    /// (a request it could not parse, an unknown method, invalid parameters, a protocol version
    /// or header it does not take), or an HTTP 4xx refusal.
    #[error("the MCP server refused the request: {0}")]
    #[strum(serialize = "mcp_request_refused")]
    Refused(String),
    /// The server answered with any other JSON-RPC error (its internal error, one of its own):
    /// nothing says whether the request was carried out.
    #[error("the MCP server answered with a protocol error: {0}")]
    #[strum(serialize = "mcp_protocol_error")]
    Protocol(String),
    /// The tool is withheld: the server lists it otherwise than it was accepted. Not sent.
    #[error("the tool is withheld: its server lists it otherwise than it was accepted")]
    #[strum(serialize = "tool_withheld")]
    Withheld,
}

impl CallError {
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// The JSON-RPC errors that say the request was not carried out.
const NOT_CARRIED_OUT: [ErrorCode; 7] = [
    ErrorCode::PARSE_ERROR,
    ErrorCode::INVALID_REQUEST,
    ErrorCode::METHOD_NOT_FOUND,
    ErrorCode::INVALID_PARAMS,
    ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
    ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
    ErrorCode::HEADER_MISMATCH,
];

/// What a failed request leaves to do.
enum Failure {
    Call(CallError),
    /// The server does not know the session: open a new one and send the request again.
    SessionGone,
}

type Session = RunningService<RoleClient, Listener>;

/// Hears the server's `notifications/tools/list_changed`: its listing is stale until listed
/// again.
#[derive(Debug, Clone)]
struct Listener {
    stale: Arc<AtomicBool>,
    changed: Arc<Notify>,
}

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::info!("the MCP server says its tools changed; listing them again");
        self.stale.store(true, Ordering::Release);
        self.changed.notify_one();
    }
}

/// The tools registered from the server, by name, with the identity each was registered with,
/// and those this process withholds.
#[derive(Debug, Default)]
struct Catalogue {
    registered: BTreeMap<String, String>,
    withheld: BTreeSet<String>,
}

/// What one tool of a listing is, measured against its registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// As registered, and as accepted.
    Current,
    /// Listed otherwise than registered or accepted.
    Changed,
    /// No longer listed.
    Gone,
    /// The listing could not be pinned: withheld until a listing can be.
    Unpinned,
}

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

/// A configured MCP server, its supervised session, and its tools as this process holds them.
pub struct McpServer {
    entry: McpServerEntry,
    link: Link,
    supervision: Mutex<Supervision>,
    pins: Arc<dyn Pins>,
    catalogue: std::sync::Mutex<Catalogue>,
    /// The listing may no longer be what the server offers: list it again before a call.
    stale: Arc<AtomicBool>,
    /// Woken by a `list_changed`.
    changed: Arc<Notify>,
    /// One listing again at a time.
    relisting: Mutex<()>,
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
    /// The server of `entry`, its listings pinned with `pins`. A `command` server's `pass_env`
    /// variables are read with `variable`; a `url` server's secret is the variable
    /// [`secret_variable`] names, and its certificate (over `https://`) is verified against
    /// `trust`. Nothing is started yet.
    pub fn new(
        entry: McpServerEntry,
        trust: &Trust,
        variable: impl Fn(&str) -> Option<String>,
        pins: Arc<dyn Pins>,
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
            pins,
            catalogue: std::sync::Mutex::default(),
            stale: Arc::new(AtomicBool::new(false)),
            changed: Arc::new(Notify::new()),
            relisting: Mutex::new(()),
        })
    }

    /// Where its tools come from, as their identity names it: `mcp:<name>`.
    pub fn source(&self) -> String {
        format!("mcp:{}", self.name())
    }

    fn catalogue(&self) -> std::sync::MutexGuard<'_, Catalogue> {
        self.catalogue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `tool` as registered with `identity`, withheld or not.
    pub(crate) fn registered(&self, tool: &str, identity: String, withheld: bool) {
        {
            let mut catalogue = self.catalogue();
            catalogue.registered.insert(tool.to_owned(), identity);
            if withheld {
                catalogue.withheld.insert(tool.to_owned());
            }
        }
        if withheld {
            self.pins.withholding(&self.source(), tool, true);
        }
    }

    /// Pins a listing of `tool` with `facts`: whether it is what was accepted.
    pub(crate) async fn pin_listing(&self, tool: &str, facts: &Value) -> Result<bool, String> {
        self.pins.pin(&self.source(), tool, facts).await
    }

    /// Whether this process withholds `tool` from every run.
    pub fn is_withheld(&self, tool: &str) -> bool {
        self.catalogue().withheld.contains(tool)
    }

    /// Withholds `tool`, or no longer does, saying so once per change.
    fn stand(&self, tool: &str, standing: Standing) {
        let withhold = standing != Standing::Current;
        let changed = {
            let mut catalogue = self.catalogue();
            if withhold {
                catalogue.withheld.insert(tool.to_owned())
            } else {
                catalogue.withheld.remove(tool)
            }
        };
        if changed {
            tracing::info!(server = %self.name(), tool, ?standing, "the MCP server's listing of the tool, measured against what was registered and accepted");
            self.pins.withholding(&self.source(), tool, withhold);
        }
    }

    /// Lists the server again when it said its tools changed or a new session was opened since
    /// it was last listed, and holds each registered tool to what it was registered and
    /// accepted as: one listed otherwise, or no longer listed, is withheld. A tool accepted as
    /// changed is offered again only by a process started since (this one keeps the tool it
    /// registered). A listing that fails leaves the server to be listed again at the next call.
    pub async fn relist(&self) -> Result<(), CallError> {
        let _one = self.relisting.lock().await;
        if !self.stale.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let listed = match self.list_tools().await {
            Ok(listed) => listed,
            Err(e) => {
                self.stale.store(true, Ordering::Release);
                return Err(e);
            }
        };
        let registered = self.catalogue().registered.clone();
        for (tool, identity) in registered {
            let standing = match listed.iter().find(|t| t.name == tool.as_str()) {
                None => Standing::Gone,
                Some(t) => self.standing(t, &listed, &identity).await,
            };
            self.stand(&tool, standing);
        }
        Ok(())
    }

    /// How `listed`, one tool of `all`, stands against the `identity` it was registered with.
    async fn standing(
        &self,
        listed: &rmcp::model::Tool,
        all: &[rmcp::model::Tool],
        identity: &str,
    ) -> Standing {
        let facts = crate::listed_tool(listed, all, &self.entry).facts(&self.source());
        let now = countersign_core::tool::identity_of(&facts);
        match self.pins.pin(&self.source(), &listed.name, &facts).await {
            Ok(true) if now == identity => Standing::Current,
            Ok(_) => Standing::Changed,
            Err(reason) => {
                tracing::error!(server = %self.name(), tool = %listed.name, %reason, "the tool's listing could not be pinned; it is withheld until it can be");
                self.stale.store(true, Ordering::Release);
                Standing::Unpinned
            }
        }
    }

    /// Lists the server again whenever it says its tools changed, for as long as the server is
    /// in use.
    pub(crate) fn watch(self: &Arc<Self>) {
        let server = Arc::downgrade(self);
        let changed = Arc::clone(&self.changed);
        tokio::spawn(async move {
            loop {
                changed.notified().await;
                let Some(server) = server.upgrade() else {
                    return;
                };
                if let Err(e) = server.relist().await {
                    tracing::warn!(server = %server.name(), code = e.code(), "the MCP server could not be listed again; it will be at its next call");
                }
            }
        });
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
                if supervision.generation > 0 {
                    // Another session may be another program: list it before the next call.
                    self.stale.store(true, Ordering::Release);
                }
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
        let listener = Listener {
            stale: Arc::clone(&self.stale),
            changed: Arc::clone(&self.changed),
        };
        let handshake = match &self.link {
            Link::Stdio { environment } => {
                let transport = self
                    .spawn(environment)
                    .map_err(|reason| (reason, CallError::NotSent))?;
                tokio::time::timeout(START_TIMEOUT, listener.serve(transport)).await
            }
            Link::Http { client, url } => {
                let transport =
                    StreamableHttpClientTransport::with_client(client.clone(), http_config(url));
                tokio::time::timeout(START_TIMEOUT, listener.serve(transport)).await
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
    /// session the server no longer knows is replaced and the request sent once more. A call of
    /// `tool` is sent only once the server's listing is current (listed again after a
    /// `list_changed` or a new session), and never for a tool this process withholds.
    async fn request<T, F>(
        &self,
        what: &str,
        tool: Option<&str>,
        timeout: Duration,
        send: impl Fn(Peer<RoleClient>) -> F,
    ) -> Result<T, CallError>
    where
        F: Future<Output = Result<T, ServiceError>>,
    {
        let mut renewed = false;
        // Listed again at most once for one request: a listing that cannot be pinned leaves
        // the server stale for the next, and its tools withheld meanwhile.
        let mut relisted = false;
        loop {
            let (peer, generation) = self.peer().await?;
            if let Some(tool) = tool {
                if !relisted && self.stale.load(Ordering::Acquire) {
                    relisted = true;
                    // However the listing failed, this request was not sent.
                    Box::pin(self.relist()).await.map_err(|e| {
                        tracing::warn!(server = %self.name(), what, code = e.code(), "the MCP server could not be listed again before the request; it was not sent");
                        CallError::NotSent
                    })?;
                    continue;
                }
                if self.is_withheld(tool) {
                    return Err(CallError::Withheld);
                }
            }
            let error = match tokio::time::timeout(timeout, send(peer)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => e,
                Err(_) => {
                    tracing::warn!(server = %self.name(), what, ?timeout, "the MCP server did not answer in time");
                    return Err(CallError::TimedOut);
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
        self.request("tools/list", None, START_TIMEOUT, |peer| async move {
            peer.list_all_tools().await
        })
        .await
    }

    /// One `tools/call` of `tool` with `arguments` and `meta`, answered within `timeout`; never
    /// sent for a tool this process withholds ([`CallError::Withheld`]).
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
        self.request(tool, Some(tool), timeout, |peer| {
            let params = params.clone();
            async move { peer.call_tool(params).await }
        })
        .await
    }

    fn failure(&self, e: ServiceError) -> Failure {
        tracing::warn!(server = %self.name(), error = %e, "MCP request failed");
        Failure::Call(match e {
            ServiceError::McpError(e) if NOT_CARRIED_OUT.contains(&e.code) => {
                CallError::Refused(e.message.into_owned())
            }
            ServiceError::McpError(e) => CallError::Protocol(e.message.into_owned()),
            ServiceError::TransportSend(e) => {
                match e.error.downcast_ref::<StreamableHttpError<HttpError>>() {
                    Some(e) => match fate(e) {
                        Fate::NotSent => CallError::NotSent,
                        Fate::SessionGone => return Failure::SessionGone,
                        Fate::Unauthorized => CallError::Unauthorized,
                        Fate::Refused(reason) => CallError::Refused(reason),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_error_has_the_code_it_always_had() {
        let errors = [
            (CallError::NotSent, "mcp_unavailable"),
            (CallError::Unauthorized, "mcp_unauthorized"),
            (CallError::Lost, "mcp_answer_lost"),
            (CallError::TimedOut, "mcp_timeout"),
            (CallError::Refused("-32602".into()), "mcp_request_refused"),
            (CallError::Protocol("-32603".into()), "mcp_protocol_error"),
            (CallError::Withheld, "tool_withheld"),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }
}
