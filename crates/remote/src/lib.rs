//! Remote tools: the countersign side of the remote tool protocol (`docs/remote-tools.md`).
//!
//! A tool server is discovered once at start-up, and each of its tools becomes a [`Tool`] (and,
//! when it previews, a [`ToolPreview`]) whose calls go over HTTP: the loop, the comparator and
//! the card treat them exactly like built-in tools. A remote writer is an [`ExternalWrite`]: an
//! approved turn compares it by a fresh preview with the rest of the turn before anything
//! writes, then sends it fenced by a lease renewal that stamps it as sent, with the lease epoch,
//! the idempotency key `run:suspension:call` and the lines its approver was shown, and journals
//! its answer with its audit event. A server that speaks version 2 takes writes in two phases
//! (prepare, then commit or abort), so a turn of its writes lands all or nothing ([`mod@write`]).
//!
//! Which servers a deployment uses is read by [`config`]; how their certificates are verified
//! over `https://`, by [`tls`].
//!
//! This crate must never turn a write whose answer was lost into a result, or into a blind
//! retry of a non-idempotent write: it asks the server about the call's key, and when the server
//! cannot say, the call is [`ToolError::OutcomeUnknown`] (non-idempotent) or
//! [`ToolError::Unavailable`] (idempotent: the segment retries it under its key). It must never
//! accept a server certificate it cannot verify. Nothing here logs the bearer secret or a
//! response body.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::{
    DataClass, EarlierCall, Effect, ExecContext, ExternalWrite, PreviewLine, Principal, Sequence,
    Tool, ToolError, ToolOutput, ToolPreview, ToolRegistry, ToolSpec,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{json, Value};

pub mod config;
pub mod tls;
pub mod write;

pub use config::{
    add_to_servers_file, decide, parse_servers, parse_servers_file, read_servers_file,
    secret_variable, servers_from, Decided, DecidedBy, Declared, OperatorWord, ServerEntry,
    ToolWord,
};
pub use tls::Trust;

/// The newest protocol version this client speaks; it speaks every version from 1.
pub const PROTOCOL_VERSION: u64 = 2;

/// How long each kind of request may take, connection and whole answer included, and how
/// much of an answer is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub discovery_timeout: Duration,
    pub preview_timeout: Duration,
    pub execute_timeout: Duration,
    pub max_discovery_bytes: usize,
    pub max_response_bytes: usize,
    /// How long asking a server about a call whose answer was lost may go on
    /// ([`mod@write`]).
    pub resolve_budget: Duration,
    /// How long a two-phase server is asked to hold a prepared change (`hold_secs`): longer
    /// than anything a turn does between its prepares and its commits, a worker's death and
    /// the next attempt's claim included (`docs/remote-tools.md`).
    pub hold: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            discovery_timeout: Duration::from_secs(10),
            preview_timeout: Duration::from_secs(10),
            execute_timeout: Duration::from_secs(30),
            max_discovery_bytes: 4 * 1024 * 1024,
            max_response_bytes: 1024 * 1024,
            resolve_budget: Duration::from_secs(30),
            hold: Duration::from_secs(600),
        }
    }
}

/// Why a tool server could not be set up or discovered. Each has a stable [`code`](Self::code).
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum RemoteError {
    #[error("the tool server configuration is not usable: {0}")]
    BadConfiguration(String),
    #[error("the name of tool server `{0}` is not [A-Za-z0-9_-]+")]
    InvalidServerName(String),
    #[error("the base URL of tool server {0} is not an absolute http:// or https:// URL without credentials, query or fragment")]
    InvalidUrl(String),
    #[error("tool server `{0}` is configured already")]
    DuplicateServer(String),
    #[error("the tool servers file {path} cannot be read or written: {reason}")]
    #[strum(serialize = "servers_file_unreadable")]
    ServersFile { path: String, reason: String },
    #[error("the certificate authorities file {path} is not usable: {reason}")]
    #[strum(serialize = "ca_file_unusable")]
    CaFile { path: String, reason: String },
    #[error("the secret of tool server {server} is not set (variable {variable})")]
    SecretMissing { server: String, variable: String },
    #[error("discovery at tool server {server} failed ({code})")]
    Discovery { server: String, code: &'static str },
    #[error("tool {tool} of server {server} is not a usable tool description: {reason}")]
    InvalidTool {
        server: String,
        tool: String,
        reason: String,
    },
    #[error("tool {0} is offered twice")]
    DuplicateTool(String),
}

impl RemoteError {
    /// The code a failed discovery carries, or else its own.
    pub fn code(&self) -> &'static str {
        match self {
            RemoteError::Discovery { code, .. } => code,
            other => other.into(),
        }
    }
}

/// How one HTTP exchange with a tool server failed. [`code`](Self::code) is what reaches a
/// preview line or a tool result.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum CallError {
    /// No connection: the request was not sent.
    #[error("the tool server could not be reached")]
    #[strum(serialize = "remote_unreachable")]
    Unreachable,
    /// The TLS handshake failed (an untrusted certificate, one for another host, a server that
    /// does not speak TLS): the request was not sent.
    #[error("the TLS handshake with the tool server failed")]
    #[strum(serialize = "remote_tls")]
    Tls,
    /// The connection broke after the request may have been sent.
    #[error("the exchange with the tool server broke off")]
    #[strum(serialize = "remote_unreachable")]
    BrokenOff,
    #[error("the tool server did not answer in time")]
    #[strum(serialize = "remote_timeout")]
    Timeout,
    #[error("the tool server refused the credentials (HTTP {0})")]
    #[strum(serialize = "remote_unauthorized")]
    Unauthorized(u16),
    #[error("the tool server does not know the tool")]
    #[strum(serialize = "remote_not_found")]
    NotFound,
    #[error("the tool server refused a fenced-out epoch")]
    #[strum(serialize = "remote_fenced")]
    Fenced,
    #[error("the tool server answered HTTP {0}")]
    #[strum(serialize = "remote_status")]
    Status(u16),
    #[error("the answer exceeds the size limit")]
    #[strum(serialize = "response_too_large")]
    TooLarge,
    #[error("the answer is not the protocol's message: {0}")]
    #[strum(serialize = "malformed_response")]
    Malformed(String),
}

impl CallError {
    pub fn code(&self) -> &'static str {
        self.into()
    }

    /// Whether the server may have received the request.
    fn may_have_arrived(&self) -> bool {
        !matches!(self, CallError::Unreachable | CallError::Tls)
    }

    /// Whether a write may have landed although this is what came back: no answer, an answer
    /// cut off or unreadable, or a server error. A 4xx answer is the server's refusal.
    fn may_have_landed(&self) -> bool {
        match self {
            CallError::BrokenOff
            | CallError::Timeout
            | CallError::TooLarge
            | CallError::Malformed(_) => true,
            CallError::Status(s) => *s >= 500,
            _ => false,
        }
    }

    /// Whether a later attempt may meet a server that does better.
    fn is_transient(&self) -> bool {
        match self {
            CallError::Unreachable | CallError::Tls | CallError::BrokenOff | CallError::Timeout => {
                true
            }
            CallError::Status(s) => *s >= 500,
            _ => false,
        }
    }
}

/// One configured tool server: where it is, how countersign proves itself to it, and what the
/// operator says of its tools.
pub struct RemoteToolServer {
    name: String,
    base: String,
    authorization: HeaderValue,
    limits: Limits,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// The server takes writes in two phases (protocol version 2, `two_phase` in discovery).
    two_phase: bool,
    /// The server previews, prepares and executes a call after the calls of its turn before it
    /// (protocol version 2, `turn_sequence` in discovery).
    sequences: bool,
    word: OperatorWord,
}

impl fmt::Debug for RemoteToolServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteToolServer")
            .field("name", &self.name)
            .field("base", &self.base)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A tool of the registry that [`register_servers`] added: the server it lives on, what the
/// server declared about it (a suggestion, taken only where the operator trusts the server) and
/// who decided its effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub tool: String,
    pub server: String,
    pub declared: Declared,
    pub effect_by: DecidedBy,
    /// Withheld from every run: the server lists it otherwise than it was accepted.
    pub withheld: bool,
}

/// Where a process pins what its servers list, so that every process holds them to the same
/// accepted facts (the services: the `tool_identities` table), and hears which tools it
/// withholds (its log line and metric).
#[async_trait]
pub trait Pins: Send + Sync + fmt::Debug {
    /// Pins the listing of `tool` at `server` (`remote:<name>`, `mcp:<name>`) whose identity
    /// facts are `facts` ([`Tool::identity_facts`]): `true` when it is what was accepted (a
    /// tool never listed before is accepted as listed), `false` when it differs and is
    /// withheld. An error is a reason to log: nothing was decided.
    async fn pin(&self, server: &str, tool: &str, facts: &Value) -> Result<bool, String>;

    /// This process withholds `tool` of `server` from every run (`true`), or no longer does.
    fn withholding(&self, server: &str, tool: &str, withheld: bool);
}

/// Pins nothing: every listing is accepted. For a process without a database of its own (a
/// test, a one-off check).
#[derive(Debug, Clone, Copy, Default)]
pub struct AcceptAll;

#[async_trait]
impl Pins for AcceptAll {
    async fn pin(&self, _server: &str, _tool: &str, _facts: &Value) -> Result<bool, String> {
        Ok(true)
    }

    fn withholding(&self, _server: &str, _tool: &str, _withheld: bool) {}
}

/// Discovers each of `servers` and registers its tools, each as the operator's word on the
/// server decides ([`decide`]) and pinned with `pins`: a tool whose listing differs from what
/// was accepted is registered withheld. A server's secret is what `secret_of` gives for its
/// [`secret_variable`], its certificate (over `https://`) is verified against `trust`. A tool
/// named like one already registered is refused: a remote tool never silently replaces another.
/// Returns what was registered, in order.
pub async fn register_servers(
    registry: &mut ToolRegistry,
    servers: &[ServerEntry],
    trust: &Trust,
    secret_of: impl Fn(&str) -> Option<String>,
    pins: &dyn Pins,
) -> Result<Vec<Registered>, RemoteError> {
    let mut registered = Vec::new();
    for entry in servers {
        let name = entry.name();
        let variable = secret_variable(name);
        let secret = secret_of(&variable)
            .filter(|s| !s.is_empty())
            .map(SecretString::from)
            .ok_or_else(|| RemoteError::SecretMissing {
                server: name.to_owned(),
                variable,
            })?;
        let server =
            RemoteToolServer::with_trust(name, entry.url(), &secret, Limits::default(), trust)?
                .with_word(entry.word().clone());
        for found in server.discover().await? {
            let tool_name = found.tool.spec.name.clone();
            if registry.get(&tool_name).is_some() {
                return Err(RemoteError::DuplicateTool(tool_name));
            }
            let withheld = !pin(pins, &found.tool).await?;
            tracing::info!(server = %name, tool = %tool_name, effect = found.tool.spec.effect.as_str(), decided_by = found.effect_by.as_str(), withheld, "remote tool registered");
            registry.register(found.tool);
            registered.push(Registered {
                tool: tool_name,
                server: name.to_owned(),
                declared: found.declared,
                effect_by: found.effect_by,
                withheld,
            });
        }
    }
    Ok(registered)
}

/// Pins `tool`'s listing; a listing that differs from what was accepted leaves it withheld.
async fn pin(pins: &dyn Pins, tool: &RemoteTool) -> Result<bool, RemoteError> {
    let server = tool.source();
    let accepted = pins
        .pin(&server, &tool.spec.name, &tool.identity_facts())
        .await
        .map_err(|reason| {
            tracing::error!(server = %server, tool = %tool.spec.name, %reason, "the tool's listing could not be pinned");
            RemoteError::Discovery {
                server: tool.server.name.clone(),
                code: "pin_failed",
            }
        })?;
    if !accepted {
        tool.available
            .store(false, std::sync::atomic::Ordering::Release);
        pins.withholding(&server, &tool.spec.name, true);
    }
    Ok(accepted)
}

/// A tool discovery found: the tool, what its server declared, and who decided its effect.
#[derive(Debug)]
pub struct Discovered {
    pub tool: Arc<RemoteTool>,
    pub declared: Declared,
    pub effect_by: DecidedBy,
}

impl RemoteToolServer {
    /// A server called `name` at `url` with its secret and limits, its certificate (over
    /// `https://`) verified against the public roots only.
    pub fn with_secret(
        name: &str,
        url: &str,
        secret: &SecretString,
        limits: Limits,
    ) -> Result<Self, RemoteError> {
        Self::with_trust(name, url, secret, limits, &Trust::new(None)?)
    }

    /// As [`with_secret`](Self::with_secret), verifying certificates against `trust`.
    pub fn with_trust(
        name: &str,
        url: &str,
        secret: &SecretString,
        limits: Limits,
        trust: &Trust,
    ) -> Result<Self, RemoteError> {
        let base = config::base_url(name, url)?;
        let authorization = tls::bearer(secret.expose_secret())
            .ok_or_else(|| RemoteError::BadConfiguration(format!("secret of {name}")))?;
        let client = trust.https_client(None, Duration::from_secs(30));
        Ok(RemoteToolServer {
            name: name.to_owned(),
            base,
            authorization,
            limits,
            client,
            two_phase: false,
            sequences: false,
            word: OperatorWord::default(),
        })
    }

    /// This server with the operator's `word` on its tools (none by default: every tool is a
    /// disabled non-idempotent write of the server's own group, classed `secret_adjacent`).
    #[must_use]
    pub fn with_word(mut self, word: OperatorWord) -> Self {
        self.word = word;
        self
    }

    /// `GET /tools`: every tool the server offers, as tools that call it, each as the operator's
    /// word decides ([`discover`](Self::discover)).
    pub async fn discover_tools(self) -> Result<Vec<Arc<dyn Tool>>, RemoteError> {
        Ok(self
            .discover()
            .await?
            .into_iter()
            .map(|found| found.tool as Arc<dyn Tool>)
            .collect())
    }

    /// `GET /tools`: every tool the server offers, decided by the operator's word ([`decide`])
    /// over what the server declares, which is kept beside it.
    pub async fn discover(mut self) -> Result<Vec<Discovered>, RemoteError> {
        let body = self
            .exchange(
                Method::GET,
                "/tools",
                None,
                self.limits.discovery_timeout,
                self.limits.max_discovery_bytes,
            )
            .await
            .map_err(|e| {
                tracing::warn!(server = %self.name, error = %e, "tool discovery failed");
                RemoteError::Discovery {
                    server: self.name.clone(),
                    code: e.code(),
                }
            })?;
        let discovery: Discovery =
            serde_json::from_slice(&body).map_err(|e| {
                tracing::warn!(server = %self.name, error = %e, "the discovery answer is not the protocol's");
                RemoteError::Discovery {
                    server: self.name.clone(),
                    code: CallError::Malformed(String::new()).code(),
                }
            })?;
        if !(1..=PROTOCOL_VERSION).contains(&discovery.protocol) {
            return Err(RemoteError::Discovery {
                server: self.name.clone(),
                code: "unsupported_protocol",
            });
        }
        // Two phases are a version 2 promise; a version 1 server that says so is taken at its
        // version.
        self.two_phase = discovery.protocol >= 2 && discovery.two_phase;
        self.sequences = discovery.protocol >= 2 && discovery.turn_sequence;
        let server = Arc::new(self);
        let mut tools: Vec<Discovered> = Vec::new();
        for d in discovery.tools {
            if tools.iter().any(|t| t.tool.spec.name == d.name) {
                return Err(RemoteError::DuplicateTool(d.name));
            }
            tools.push(discovered(&server, d, &discovery.data_classes)?);
        }
        warn_of_unknown_tools(&server.name, &server.word, &tools);
        Ok(tools)
    }

    /// One request and its whole answer, within `timeout` and `limit` bytes; a 200 gives the
    /// body, anything else its [`CallError`].
    pub(crate) async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
        limit: usize,
    ) -> Result<Bytes, CallError> {
        let request = self.request(method, path, body)?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                tracing::warn!(server = %self.name, path, error = %e, "tool server request failed");
                if tls::is_tls_failure(&e) {
                    CallError::Tls
                } else if e.is_connect() {
                    CallError::Unreachable
                } else {
                    CallError::BrokenOff
                }
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        CallError::TooLarge
                    } else {
                        CallError::BrokenOff
                    }
                })?
                .to_bytes();
            Ok((status, body))
        };
        let (status, body) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| CallError::Timeout)??;
        answer(status, body)
    }

    /// The request of an exchange: `method` on `path` of the server, with `body` as JSON.
    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Request<Full<Bytes>>, CallError> {
        let uri: Uri = format!("{}{path}", self.base)
            .parse()
            .map_err(|_| CallError::Unreachable)?;
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, self.authorization.clone())
            .header(ACCEPT, "application/json");
        let payload = match body {
            Some(v) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                Bytes::from(v.to_string())
            }
            None => Bytes::new(),
        };
        builder
            .body(Full::new(payload))
            .map_err(|_| CallError::Unreachable)
    }

    pub(crate) async fn post<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let bytes = self
            .exchange(
                Method::POST,
                path,
                Some(body),
                timeout,
                self.limits.max_response_bytes,
            )
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| CallError::Malformed(e.to_string()))
    }
}

/// What an exchange gives for the `status` of a whole answer: a 200 its `body`, anything else
/// its [`CallError`].
fn answer(status: StatusCode, body: Bytes) -> Result<Bytes, CallError> {
    match status {
        StatusCode::OK => Ok(body),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            Err(CallError::Unauthorized(status.as_u16()))
        }
        StatusCode::NOT_FOUND => Err(CallError::NotFound),
        StatusCode::CONFLICT => Err(CallError::Fenced),
        other => Err(CallError::Status(other.as_u16())),
    }
}

/// The tool `d` of `server` as the operator's word makes it, what the server declared about it
/// (its group's class from `classes`) kept beside it; refused when it is no usable tool.
fn discovered(
    server: &Arc<RemoteToolServer>,
    d: DiscoveredTool,
    classes: &std::collections::BTreeMap<String, String>,
) -> Result<Discovered, RemoteError> {
    let invalid = |reason: &str| RemoteError::InvalidTool {
        server: server.name.clone(),
        tool: d.name.clone(),
        reason: reason.to_owned(),
    };
    if !valid_tool_name(&d.name) {
        return Err(invalid("the name is not ^[a-z][a-z0-9_]{0,63}$"));
    }
    let effect: Effect = d.effect.parse().map_err(|_| invalid("unknown effect"))?;
    if !d.parameters.is_object() {
        return Err(invalid("parameters is not a JSON Schema object"));
    }
    let usable_group = !d.group.is_empty()
        && d.group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !usable_group {
        return Err(invalid("the group is not [A-Za-z0-9_-]+"));
    }
    let declared = Declared {
        effect: Some(effect),
        enabled_by_default: Some(d.enabled_by_default),
        data_class: Some(data_class_of(classes, &d.group)),
        group: Some(d.group),
    };
    let default_group = format!("remote_{}", server.name.replace('-', "_"));
    let decided = decide(&server.word, &d.name, &declared, default_group);
    if decided.data_class == DataClass::FAIL_CLOSED {
        tracing::info!(server = %server.name, tool = %d.name, group = %decided.group, "the tool's data class is secret_adjacent: it is offered only to providers that may receive it");
    }
    Ok(Discovered {
        tool: Arc::new(RemoteTool {
            spec: ToolSpec {
                name: d.name.clone(),
                description: d.description,
                parameters: d.parameters,
                group: decided.group,
                data_class: decided.data_class,
                effect: decided.effect,
                enabled_by_default: decided.enabled_by_default,
                requires_admin: d.requires_admin,
            },
            previews: d.previews,
            path: format!("/tools/{}", d.name),
            server: Arc::clone(server),
            available: std::sync::atomic::AtomicBool::new(true),
        }),
        declared,
        effect_by: decided.effect_by,
    })
}

/// The operator's word on a tool the server does not list is said of nothing: a warning.
fn warn_of_unknown_tools(server: &str, word: &OperatorWord, found: &[Discovered]) {
    for tool in word.tools.keys() {
        if !found.iter().any(|f| &f.tool.spec.name == tool) {
            tracing::warn!(server, tool = %tool, "the configuration names a tool the server does not list");
        }
    }
}

fn valid_tool_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[derive(Debug, Deserialize)]
struct Discovery {
    protocol: u64,
    /// Version 2: the server's writers take `prepare`, then `commit` or `abort`.
    #[serde(default)]
    two_phase: bool,
    /// Version 2: previews, prepares and executes take `before`, the calls of the turn that come
    /// first on the server.
    #[serde(default)]
    turn_sequence: bool,
    /// The data class of each of the server's tool groups.
    #[serde(default)]
    data_classes: std::collections::BTreeMap<String, String>,
    tools: Vec<DiscoveredTool>,
}

/// The class a server declares for `group`; a group it does not classify, or a class this
/// client does not know, is [`DataClass::FAIL_CLOSED`].
fn data_class_of(classes: &std::collections::BTreeMap<String, String>, group: &str) -> DataClass {
    classes
        .get(group)
        .and_then(|c| c.parse().ok())
        .unwrap_or(DataClass::FAIL_CLOSED)
}

#[derive(Debug, Deserialize)]
struct DiscoveredTool {
    name: String,
    #[serde(default)]
    description: String,
    parameters: Value,
    group: String,
    effect: String,
    enabled_by_default: bool,
    requires_admin: bool,
    #[serde(default)]
    previews: bool,
}

#[derive(Debug, Deserialize)]
struct PreviewAnswer {
    lines: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct MayViewAnswer {
    allowed: bool,
}

/// One tool of a tool server.
#[derive(Debug)]
pub struct RemoteTool {
    spec: ToolSpec,
    previews: bool,
    path: String,
    server: Arc<RemoteToolServer>,
    /// Cleared while its server lists it otherwise than it was accepted.
    available: std::sync::atomic::AtomicBool,
}

impl RemoteTool {
    /// The name of the server this tool lives on.
    pub fn server_name(&self) -> &str {
        &self.server.name
    }

    /// Where the tool comes from, as its identity names it: `remote:<server>`.
    pub fn source(&self) -> String {
        format!("remote:{}", self.server.name)
    }
}

pub(crate) fn principal_json(p: &Principal) -> Value {
    json!({"name": p.name, "admin": p.admin})
}

#[async_trait]
impl Tool for RemoteTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError> {
        self.execute_call(ctx, args).await
    }

    fn external(&self) -> Option<&dyn ExternalWrite> {
        self.spec
            .effect
            .is_write()
            .then_some(self as &dyn ExternalWrite)
    }

    fn previewer(&self) -> Option<&dyn ToolPreview> {
        self.previews.then_some(self as &dyn ToolPreview)
    }

    fn identity_facts(&self) -> Value {
        json!({
            "server": self.source(),
            "name": self.spec.name,
            "effect": self.spec.effect,
            "parameters": self.spec.parameters,
            "preview": self.previews,
        })
    }

    fn available(&self) -> bool {
        self.available.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The tools of one server share its state: calls of a turn on it are a sequence.
    fn sequence(&self) -> Option<Sequence> {
        Some(Sequence {
            resource: format!("remote:{}", self.server.name),
            composes: self.server.sequences,
        })
    }
}

impl RemoteTool {
    /// `POST /tools/{name}/preview` with `body`.
    async fn preview_request(&self, body: &Value) -> Result<Vec<String>, ToolError> {
        let answer: PreviewAnswer = self
            .server
            .post(
                &format!("{}/preview", self.path),
                body,
                self.server.limits.preview_timeout,
            )
            .await
            .map_err(|e| {
                tracing::warn!(tool = %self.spec.name, server = %self.server.name, code = e.code(), error = %e, "remote preview failed");
                ToolError::failed(e.code(), e)
            })?;
        Ok(answer.lines)
    }
}

#[async_trait]
impl ToolPreview for RemoteTool {
    /// Every failure is the tool's own (a failed preview line naming the code), never an
    /// infrastructure error: a tool server that is down is shown as such on the card.
    async fn preview(
        &self,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<String>, ToolError> {
        let body = json!({"acting_user": principal_json(acting_user), "arguments": args});
        self.preview_request(&body).await
    }

    /// The preview after `before` (version 2, `turn_sequence`), as the same request with the
    /// calls of the turn before it.
    async fn preview_after(
        &self,
        acting_user: &Principal,
        args: &Value,
        before: &[EarlierCall],
    ) -> Result<Vec<PreviewLine>, ToolError> {
        let body = json!({
            "acting_user": principal_json(acting_user),
            "arguments": args,
            "before": before,
        });
        let lines = self.preview_request(&body).await?;
        Ok(lines.into_iter().map(PreviewLine::from).collect())
    }

    /// Fails closed: any failure is `false`.
    async fn may_viewer_read_preview(&self, args: &Value, viewer: &Principal) -> bool {
        let body = json!({"viewer": principal_json(viewer), "arguments": args});
        match self
            .server
            .post::<MayViewAnswer>(
                &format!("{}/may-view", self.path),
                &body,
                self.server.limits.preview_timeout,
            )
            .await
        {
            Ok(answer) => answer.allowed,
            Err(e) => {
                tracing::warn!(tool = %self.spec.name, server = %self.server.name, code = e.code(), error = %e, "remote may-view failed; the preview is withheld");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_remote_error_has_the_code_it_always_had() {
        let file = || (String::from("servers"), String::from("gone"));
        let errors = [
            (
                RemoteError::BadConfiguration(String::new()),
                "bad_configuration",
            ),
            (
                RemoteError::InvalidServerName("wi/ki".into()),
                "invalid_server_name",
            ),
            (RemoteError::InvalidUrl("wiki".into()), "invalid_url"),
            (
                RemoteError::DuplicateServer("wiki".into()),
                "duplicate_server",
            ),
            (
                RemoteError::ServersFile {
                    path: file().0,
                    reason: file().1,
                },
                "servers_file_unreadable",
            ),
            (
                RemoteError::CaFile {
                    path: file().0,
                    reason: file().1,
                },
                "ca_file_unusable",
            ),
            (
                RemoteError::SecretMissing {
                    server: "wiki".into(),
                    variable: "WIKI_SECRET".into(),
                },
                "secret_missing",
            ),
            (
                RemoteError::Discovery {
                    server: "wiki".into(),
                    code: "unsupported_protocol",
                },
                "unsupported_protocol",
            ),
            (
                RemoteError::InvalidTool {
                    server: "wiki".into(),
                    tool: "t".into(),
                    reason: String::new(),
                },
                "invalid_tool",
            ),
            (RemoteError::DuplicateTool("t".into()), "duplicate_tool"),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }

    #[test]
    fn every_call_error_has_the_code_it_always_had() {
        let errors = [
            (CallError::Unreachable, "remote_unreachable"),
            (CallError::Tls, "remote_tls"),
            (CallError::BrokenOff, "remote_unreachable"),
            (CallError::Timeout, "remote_timeout"),
            (CallError::Unauthorized(401), "remote_unauthorized"),
            (CallError::NotFound, "remote_not_found"),
            (CallError::Fenced, "remote_fenced"),
            (CallError::Status(502), "remote_status"),
            (CallError::TooLarge, "response_too_large"),
            (
                CallError::Malformed("not JSON".into()),
                "malformed_response",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }

    #[test]
    fn a_url_with_credentials_or_another_scheme_is_refused() {
        let secret = SecretString::from("s");
        for url in ["http://u:p@h:1", "https://u:p@h:1", "ftp://h:1", "h:1"] {
            let e =
                RemoteToolServer::with_secret("x", url, &secret, Limits::default()).unwrap_err();
            assert_eq!(e.code(), "invalid_url", "{url}");
        }
        for url in ["http://h:1", "https://h:1"] {
            assert!(
                RemoteToolServer::with_secret("x", url, &secret, Limits::default()).is_ok(),
                "{url}"
            );
        }
    }

    fn tool(effect: Effect) -> RemoteTool {
        let server = RemoteToolServer::with_secret(
            "x",
            "http://127.0.0.1:1",
            &SecretString::from("s"),
            Limits::default(),
        )
        .unwrap();
        RemoteTool {
            spec: ToolSpec {
                name: "t".into(),
                description: String::new(),
                parameters: json!({"type": "object"}),
                group: "editing".into(),
                data_class: DataClass::EditorContent,
                effect,
                enabled_by_default: false,
                requires_admin: false,
            },
            previews: true,
            path: "/tools/t".into(),
            server: Arc::new(server),
            available: std::sync::atomic::AtomicBool::new(true),
        }
    }

    #[test]
    fn a_write_that_was_certainly_not_sent_is_retried_whatever_its_effect() {
        for effect in [Effect::NonIdempotentWrite, Effect::IdempotentWrite] {
            for e in [CallError::Unreachable, CallError::Tls] {
                assert!(matches!(tool(effect).failure(e), write::Failure::Retry(_)));
            }
        }
    }

    #[test]
    fn a_write_whose_answer_was_lost_is_resolved_by_its_key_never_reported_failed() {
        for effect in [Effect::NonIdempotentWrite, Effect::IdempotentWrite] {
            for e in [
                CallError::BrokenOff,
                CallError::Timeout,
                CallError::Status(502),
                CallError::Malformed("x".into()),
                CallError::TooLarge,
            ] {
                let name = format!("{e:?}");
                assert!(
                    matches!(tool(effect).failure(e), write::Failure::InDoubt(_)),
                    "{effect:?} {name}"
                );
            }
        }
    }

    #[test]
    fn a_refusal_of_a_write_is_its_result_and_a_fenced_epoch_stops_the_segment() {
        let t = tool(Effect::NonIdempotentWrite);
        for e in [
            CallError::Status(400),
            CallError::Unauthorized(401),
            CallError::NotFound,
        ] {
            assert!(matches!(
                t.failure(e),
                write::Failure::Final(ToolError::Failed { .. })
            ));
        }
        assert!(matches!(
            t.failure(CallError::Fenced),
            write::Failure::Final(ToolError::FenceLost)
        ));
    }

    #[test]
    fn a_read_whose_transport_broke_is_retried_and_a_malformed_answer_is_its_failure() {
        let t = tool(Effect::ReadOnly);
        assert!(matches!(
            t.failure(CallError::BrokenOff),
            write::Failure::Retry(_)
        ));
        assert!(matches!(
            t.failure(CallError::Malformed("x".into())),
            write::Failure::Final(_)
        ));
    }

    #[test]
    fn only_a_call_that_was_certainly_not_sent_is_not_known_to_have_arrived() {
        assert!(!CallError::Unreachable.may_have_arrived());
        assert!(!CallError::Tls.may_have_arrived());
        assert!(CallError::BrokenOff.may_have_arrived());
        assert!(CallError::Timeout.may_have_arrived());
    }
}
