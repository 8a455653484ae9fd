//! One MCP server over stdio: the process countersign starts, its session, and its restart.
//!
//! The process is started at discovery and again, on the next call, whenever it has died; a
//! start that fails waits out a backoff (doubling from half a second to half a minute) before
//! the next is tried, and a call meanwhile fails as [`CallError::NotSent`]. A call learns
//! whether its request may have reached the server: only a request that certainly did not is
//! safe to send again whatever the tool does.

use std::borrow::Cow;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, RequestMetaObject};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::config::McpServerEntry;

/// The variables of countersign's environment every server's process gets.
const INHERITED: [&str; 4] = ["PATH", "HOME", "LANG", "TZ"];

/// How long starting the process and the protocol's handshake may take.
const START_TIMEOUT: Duration = Duration::from_secs(20);
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How one request to an MCP server failed. [`code`](Self::code) is what may reach a preview
/// line, an event or a log field.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The server is not running and could not be started (or waits out its backoff): the
    /// request was not sent.
    #[error("the MCP server is not running")]
    NotSent,
    /// The session ended, or no answer came in time, after the request may have been sent.
    #[error("the MCP server's answer was lost")]
    Lost,
    /// The server answered with a JSON-RPC error (an unknown tool, invalid arguments, its own
    /// internal error).
    #[error("the MCP server answered with a protocol error: {0}")]
    Protocol(String),
}

impl CallError {
    pub fn code(&self) -> &'static str {
        match self {
            CallError::NotSent => "mcp_unavailable",
            CallError::Lost => "mcp_answer_lost",
            CallError::Protocol(_) => "mcp_protocol_error",
        }
    }
}

type Session = RunningService<RoleClient, ()>;

/// The running session, and when a start may next be tried.
#[derive(Default)]
struct Supervision {
    session: Option<Session>,
    failed_starts: u32,
    next_start: Option<Instant>,
}

/// A configured MCP server and its supervised process.
pub struct McpServer {
    entry: McpServerEntry,
    environment: Vec<(String, String)>,
    supervision: Mutex<Supervision>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.entry.name())
            .field("command", &self.entry.command)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// The server of `entry`, its `pass_env` variables read with `variable`. Nothing is started
    /// yet.
    pub fn new(entry: McpServerEntry, variable: impl Fn(&str) -> Option<String>) -> McpServer {
        let mut environment: Vec<(String, String)> = INHERITED
            .iter()
            .map(|v| (*v).to_owned())
            .chain(entry.pass_env.iter().cloned())
            .filter_map(|v| variable(&v).map(|value| (v, value)))
            .collect();
        environment.extend(entry.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        McpServer {
            entry,
            environment,
            supervision: Mutex::new(Supervision::default()),
        }
    }

    pub fn entry(&self) -> &McpServerEntry {
        &self.entry
    }

    pub fn name(&self) -> &str {
        self.entry.name()
    }

    /// The session's peer, starting the process when it is not running.
    async fn peer(&self) -> Result<rmcp::service::Peer<RoleClient>, CallError> {
        let mut supervision = self.supervision.lock().await;
        if let Some(session) = &supervision.session {
            if !session.is_closed() && !session.peer().is_transport_closed() {
                return Ok(session.peer().clone());
            }
            tracing::warn!(server = %self.name(), "the MCP server's session ended; starting it again");
            supervision.session = None;
        }
        if supervision.next_start.is_some_and(|at| Instant::now() < at) {
            return Err(CallError::NotSent);
        }
        match self.start().await {
            Ok(session) => {
                let peer = session.peer().clone();
                *supervision = Supervision {
                    session: Some(session),
                    ..Supervision::default()
                };
                Ok(peer)
            }
            Err(reason) => {
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << supervision.failed_starts.min(6))
                    .min(MAX_BACKOFF);
                supervision.failed_starts += 1;
                supervision.next_start = Some(Instant::now() + backoff);
                tracing::warn!(server = %self.name(), %reason, ?backoff, "the MCP server could not be started");
                Err(CallError::NotSent)
            }
        }
    }

    /// Starts the process and runs the protocol's handshake with it.
    async fn start(&self) -> Result<Session, String> {
        let (program, args) = self.entry.command.split_first().ok_or("no command")?;
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .env_clear()
            .envs(self.environment.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        if let Some(dir) = &self.entry.cwd {
            command.current_dir(dir);
        }
        let (transport, _) = TokioChildProcess::builder(command)
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawning {program}: {e}"))?;
        match tokio::time::timeout(START_TIMEOUT, ().serve(transport)).await {
            Ok(Ok(session)) => {
                tracing::info!(server = %self.name(), "MCP server started");
                Ok(session)
            }
            Ok(Err(e)) => Err(format!("the handshake failed: {e}")),
            Err(_) => Err("the handshake did not finish in time".to_owned()),
        }
    }

    /// Every tool the server lists.
    pub async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, CallError> {
        let peer = self.peer().await?;
        match tokio::time::timeout(START_TIMEOUT, peer.list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => Err(self.failure(e)),
            Err(_) => Err(CallError::Lost),
        }
    }

    /// One `tools/call` of `tool` with `arguments` and `meta`, answered within `timeout`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: &Value,
        meta: JsonObject,
        timeout: Duration,
    ) -> Result<CallToolResult, CallError> {
        let peer = self.peer().await?;
        let mut params = CallToolRequestParams::new(Cow::Owned(tool.to_owned()));
        params.arguments = arguments.as_object().cloned();
        params.meta = Some(RequestMetaObject(rmcp::model::MetaObject(meta)));
        match tokio::time::timeout(timeout, peer.call_tool(params)).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(e)) => Err(self.failure(e)),
            Err(_) => {
                tracing::warn!(server = %self.name(), tool, ?timeout, "the MCP server did not answer in time");
                Err(CallError::Lost)
            }
        }
    }

    fn failure(&self, e: ServiceError) -> CallError {
        tracing::warn!(server = %self.name(), error = %e, "MCP request failed");
        match e {
            ServiceError::McpError(e) => CallError::Protocol(e.message.into_owned()),
            // The request could not be written: it never reached the server.
            ServiceError::TransportSend(_) => CallError::NotSent,
            _ => CallError::Lost,
        }
    }
}
