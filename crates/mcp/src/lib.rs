//! Tools from MCP servers behind the countersign (`docs/mcp-tools.md`).
//!
//! Each configured server ([`config`]) is spoken to with the official client, `rmcp`, over
//! stdio — a process countersign starts — or over streamable HTTP ([`http`]), and its session
//! is supervised and renewed ([`server`]). Discovery is `tools/list`, at start-up and again
//! whenever the server says its tools changed or a new session is opened; each listed tool
//! becomes a [`Tool`] of the registry, and the loop, the comparator and the card treat it like
//! any other:
//!
//! - **what it is** — its effect, whether it is enabled by default, its group and data class —
//!   is the operator's word ([`countersign_remote::decide`]): the entry's `tools`, `group` and
//!   `data_class`. A server's annotations are suggestions, taken only from a server whose entry
//!   says `trust_annotations: true` (`readOnlyHint: true` a read; `idempotentHint: true` an
//!   idempotent write; otherwise a non-idempotent write). Without a word, a tool is a
//!   non-idempotent write, disabled by default, in the group `mcp_<name>`, classed
//!   `secret_adjacent`.
//! - **its identity** — name, effect, input schema, preview tool, server — is pinned
//!   ([`countersign_remote::Pins`]): a tool the server lists otherwise than it was accepted is
//!   withheld from every run until an operator accepts the change.
//! - its **preview** is the read-only tool of the same server the operator names for it, or
//!   else its `_meta` names under `countersign/preview`, called with the same arguments as the
//!   acting user; its text is the preview's lines, read whole up to [`MAX_PREVIEW_BYTES`]. A
//!   writer without one is decided without a preview and binds to its arguments only.
//! - every **write** carries, in the call's `_meta`, the idempotency key `run:suspension:call`
//!   (`countersign/idempotency_key`), the lease epoch (`countersign/lease_epoch`), the run
//!   (`countersign/run_id`), the acting user (`countersign/acting_user`) and, when they can be
//!   compared line for line, the lines its approver was shown (`countersign/shown_preview`). A
//!   server that compares them and finds its preview moved answers with `isError` and
//!   `_meta: {"countersign/moved": true}`, and the turn re-suspends with the call marked.
//!
//! A tool's `isError` answer is its result. Anything else is named for what it says of the
//! call (`docs/mcp-tools.md`, "Failures"): a request that certainly was not carried out is
//! retried by the segment, or is the call's failure when the server refused it; a write whose
//! answer did not come — an error that does not say nothing was done, a lost session, no answer
//! in the call's time — is an unknown outcome, never "failed", unless the operator trusts it to
//! be idempotent and its session was lost, when the segment sends it again under its key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use countersign_core::{
    DataClass, Effect, ExecContext, Principal, Sequence, Tool, ToolError, ToolOutput, ToolPreview,
    ToolRegistry, ToolSpec,
};
use countersign_remote::{decide, DecidedBy, Declared, Trust};
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use serde_json::{json, Value};

pub mod config;
pub mod http;
pub mod server;

pub use config::{parse_servers, read_servers_file, McpServerEntry, McpToolWord, Transport};
pub use countersign_remote::{AcceptAll, Pins, Registered};
pub use server::{CallError, McpServer};

/// The `_meta` key of a writing tool naming its preview tool.
pub const PREVIEW_META: &str = "countersign/preview";
/// The `_meta` key of a result saying the shown preview moved and nothing was written.
pub const MOVED_META: &str = "countersign/moved";

/// How much of a result's text reaches the model; a longer one is cut, and the cut is marked.
const MAX_RESULT_CHARS: usize = 64 * 1024;
/// How much text a preview may have: a longer one fails (`preview_too_large`), never cut.
pub const MAX_PREVIEW_BYTES: usize = 1024 * 1024;
/// The first pause before a preview whose request was not carried out is sent again.
const PREVIEW_RETRY: Duration = Duration::from_millis(250);

/// Why the MCP servers could not be set up. Each has a stable [`code`](Self::code).
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum McpError {
    #[error("the MCP servers configuration is not usable: {0}")]
    BadConfiguration(String),
    #[error("the name of MCP server `{0}` is not [A-Za-z0-9_-]+")]
    InvalidServerName(String),
    #[error("the MCP servers file {path} cannot be read: {reason}")]
    #[strum(serialize = "servers_file_unreadable")]
    ServersFile { path: String, reason: String },
    #[error("the secret of MCP server {server} is not set (variable {variable})")]
    SecretMissing { server: String, variable: String },
    #[error("discovery at MCP server {server} failed ({code})")]
    Discovery { server: String, code: &'static str },
    #[error("tool {0} is offered twice")]
    DuplicateTool(String),
}

impl McpError {
    /// The code a failed discovery carries, or else its own.
    pub fn code(&self) -> &'static str {
        match self {
            McpError::Discovery { code, .. } => code,
            other => other.into(),
        }
    }
}

/// Opens a session with each of `servers`, lists its tools and registers them, each as the
/// operator's word decides and pinned with `pins` (a tool listed otherwise than it was accepted
/// is registered withheld). A `command` server's `pass_env` variables and a `url` server's
/// secret are read with `variable`; a `url` server's certificate (over `https://`) is verified
/// against `trust`. A tool named like one already registered is refused: an MCP tool never
/// silently replaces another. Returns what was registered, in order.
pub async fn register_servers(
    registry: &mut ToolRegistry,
    servers: Vec<McpServerEntry>,
    trust: &Trust,
    variable: impl Fn(&str) -> Option<String>,
    pins: Arc<dyn Pins>,
) -> Result<Vec<Registered>, McpError> {
    let mut registered = Vec::new();
    for entry in servers {
        let server = Arc::new(McpServer::new(entry, trust, &variable, Arc::clone(&pins))?);
        for (tool, declared, effect_by) in discover(&server).await? {
            let name = tool.spec.name.clone();
            if registry.get(&name).is_some() {
                return Err(McpError::DuplicateTool(name));
            }
            let withheld = !pin(&server, &tool).await?;
            tracing::info!(server = %server.name(), tool = %name, effect = tool.spec.effect.as_str(), decided_by = effect_by.as_str(), previews = tool.preview.is_some(), withheld, "MCP tool registered");
            server.registered(&name, tool.identity(), withheld);
            registry.register(Arc::new(tool));
            registered.push(Registered {
                tool: name,
                server: server.name().to_owned(),
                declared,
                effect_by,
                withheld,
            });
        }
        server.watch();
    }
    Ok(registered)
}

/// Pins `tool`'s listing: `false` when it differs from what was accepted, and it is withheld.
async fn pin(server: &McpServer, tool: &McpTool) -> Result<bool, McpError> {
    let accepted = server
        .pin_listing(&tool.spec.name, &tool.identity_facts())
        .await
        .map_err(|reason| {
            tracing::error!(server = %server.name(), tool = %tool.spec.name, %reason, "the tool's listing could not be pinned");
            McpError::Discovery {
                server: server.name().to_owned(),
                code: "pin_failed",
            }
        })?;
    Ok(accepted)
}

/// The tools `server` lists, as the operator's word makes them, each with what the server
/// declared and who decided its effect.
async fn discover(
    server: &Arc<McpServer>,
) -> Result<Vec<(McpTool, Declared, DecidedBy)>, McpError> {
    let listed = server.list_tools().await.map_err(|e| McpError::Discovery {
        server: server.name().to_owned(),
        code: e.code(),
    })?;
    let entry = server.entry();
    let mut tools: Vec<(McpTool, Declared, DecidedBy)> = Vec::new();
    for t in &listed {
        let name = t.name.to_string();
        if !valid_tool_name(&name) {
            tracing::warn!(server = %server.name(), tool = ?name, "the tool's name is not ^[A-Za-z0-9_-]{{1,64}}$; it is not offered");
            continue;
        }
        if tools.iter().any(|(known, ..)| known.spec.name == name) {
            return Err(McpError::DuplicateTool(name));
        }
        let decided = listed_tool(t, &listed, entry);
        if decided.spec.effect.is_write() && decided.preview.is_none() {
            tracing::info!(server = %server.name(), tool = %name, "the writer has no read-only preview tool: it is decided without a preview");
        }
        tools.push((
            McpTool {
                spec: decided.spec,
                preview: decided.preview,
                server: Arc::clone(server),
            },
            decided.declared,
            decided.effect_by,
        ));
    }
    for named in entry.tools.keys() {
        if !listed.iter().any(|t| t.name == named.as_str()) {
            tracing::warn!(server = %server.name(), tool = %named, "the configuration names a tool the server does not list");
        }
    }
    if entry.data_class() == DataClass::FAIL_CLOSED {
        tracing::info!(server = %server.name(), "the server's data class is secret_adjacent: its tools are offered only to providers that may receive it");
    }
    Ok(tools)
}

/// One listed tool, as the operator's word makes it.
#[derive(Debug, Clone)]
pub(crate) struct ListedTool {
    spec: ToolSpec,
    preview: Option<String>,
    declared: Declared,
    effect_by: DecidedBy,
}

impl ListedTool {
    /// Its identity facts, `source` naming its server.
    pub(crate) fn facts(&self, source: &str) -> Value {
        identity_facts(source, &self.spec, self.preview.as_deref())
    }
}

/// What `tool`, one of the server's `listed` tools, is by the operator's word in `entry`.
pub(crate) fn listed_tool(
    tool: &rmcp::model::Tool,
    listed: &[rmcp::model::Tool],
    entry: &McpServerEntry,
) -> ListedTool {
    let word = entry.word();
    let decide_one = |t: &rmcp::model::Tool| {
        let declared = Declared {
            effect: annotated_effect(t),
            ..Declared::default()
        };
        let decided = decide(&word, &t.name, &declared, entry.group());
        (declared, decided)
    };
    let (declared, decided) = decide_one(tool);
    let preview = decided
        .effect
        .is_write()
        .then(|| {
            preview_tool(tool, entry, |named| {
                listed
                    .iter()
                    .find(|t| t.name == named)
                    .map(|t| decide_one(t).1.effect)
            })
        })
        .flatten();
    ListedTool {
        spec: ToolSpec {
            name: tool.name.to_string(),
            description: tool.description.as_deref().unwrap_or_default().to_owned(),
            parameters: Value::Object((*tool.input_schema).clone()),
            group: decided.group,
            data_class: decided.data_class,
            effect: decided.effect,
            enabled_by_default: decided.enabled_by_default,
            requires_admin: entry.admin_only,
        },
        preview,
        declared,
        effect_by: decided.effect_by,
    }
}

/// The effect the tool's annotations declare: `readOnlyHint: true` a read, else
/// `idempotentHint: true` an idempotent write, else a non-idempotent write; nothing without
/// annotations.
fn annotated_effect(tool: &rmcp::model::Tool) -> Option<Effect> {
    let hints = tool.annotations.as_ref()?;
    Some(match (hints.read_only_hint, hints.idempotent_hint) {
        (Some(true), _) => Effect::ReadOnly,
        (_, Some(true)) => Effect::IdempotentWrite,
        _ => Effect::NonIdempotentWrite,
    })
}

/// The preview tool of `tool`: the one the operator names, else the one its `_meta` names —
/// when `effect_of` it is a read of the same server.
fn preview_tool(
    tool: &rmcp::model::Tool,
    entry: &McpServerEntry,
    effect_of: impl Fn(&str) -> Option<Effect>,
) -> Option<String> {
    let named = match entry
        .tools
        .get(tool.name.as_ref())
        .and_then(|w| w.preview.as_deref())
    {
        Some(named) => named,
        None => tool.meta.as_ref()?.0.get(PREVIEW_META)?.as_str()?,
    };
    match effect_of(named) {
        Some(Effect::ReadOnly) => Some(named.to_owned()),
        _ => {
            tracing::info!(tool = %tool.name, preview = ?named, "the preview tool is not a read-only tool of the server by the operator's word; the writer has no preview");
            None
        }
    }
}

/// The facts an MCP tool's identity is the digest of.
fn identity_facts(source: &str, spec: &ToolSpec, preview: Option<&str>) -> Value {
    json!({
        "server": source,
        "name": spec.name,
        "effect": spec.effect,
        "parameters": spec.parameters,
        "preview": preview,
    })
}

fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// One tool of an MCP server.
#[derive(Debug)]
pub struct McpTool {
    spec: ToolSpec,
    /// The read-only tool of the same server that previews it.
    preview: Option<String>,
    server: Arc<McpServer>,
}

impl McpTool {
    /// The name of the server this tool lives on.
    pub fn server_name(&self) -> &str {
        self.server.name()
    }

    /// What a call that got no usable answer comes to ([`CallError`]): the server's refusal is
    /// the call's failure, and a request that was certainly not carried out interrupts the
    /// segment, to be retried. Otherwise it may have been carried out: a read's is its failure
    /// (the model reads it); a write's is an unknown outcome — unless the operator trusts it to
    /// be idempotent and its session was lost, when the segment sends it again under its key.
    fn failure(&self, e: &CallError) -> ToolError {
        let write = self.spec.effect.is_write();
        match e {
            CallError::NotSent | CallError::Unauthorized => ToolError::unavailable(e.code(), e),
            CallError::Refused(_) | CallError::Withheld => ToolError::failed(e.code(), e),
            CallError::Lost if self.spec.effect == Effect::IdempotentWrite => {
                ToolError::unavailable(e.code(), e)
            }
            CallError::Lost | CallError::TimedOut | CallError::Protocol(_) if write => {
                ToolError::outcome_unknown(e.code(), e)
            }
            CallError::Lost | CallError::TimedOut | CallError::Protocol(_) => ToolError::Broken {
                code: e.code(),
                detail: e.to_string(),
            },
        }
    }

    /// A read, sent again in a new session while its session is lost and the call's time
    /// lasts: the operator says it is a read, so sending it twice is harmless.
    async fn read(&self, args: &Value, meta: JsonObject) -> Result<CallToolResult, CallError> {
        let deadline = Instant::now() + self.server.entry().call_timeout();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CallError::TimedOut);
            }
            match self
                .server
                .call(&self.spec.name, args, meta.clone(), left)
                .await
            {
                Err(CallError::Lost) => {
                    tracing::warn!(tool = %self.spec.name, server = %self.server.name(), "the read's answer was lost with its session; sending it again");
                }
                other => return other,
            }
        }
    }
}

fn principal_json(p: &Principal) -> Value {
    json!({"name": p.name, "admin": p.admin})
}

/// The `_meta` of a call as `ctx` says.
fn call_meta(ctx: &ExecContext) -> JsonObject {
    let mut meta = JsonObject::new();
    meta.insert(
        "countersign/acting_user".into(),
        principal_json(&ctx.acting_user),
    );
    if let Some(fence) = &ctx.fence {
        meta.insert("countersign/run_id".into(), json!(fence.run_id.to_string()));
        meta.insert(
            "countersign/idempotency_key".into(),
            json!(fence.idempotency_key()),
        );
        meta.insert(
            "countersign/lease_epoch".into(),
            json!(fence.lease_epoch.get()),
        );
    }
    if let Some(lines) = &ctx.shown_preview {
        meta.insert("countersign/shown_preview".into(), json!(lines));
    }
    meta
}

/// The whole text of a result: its text blocks, one after the other; structured content when
/// it has no text.
fn whole_text(result: &CallToolResult) -> String {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    if texts.is_empty() {
        result
            .structured_content
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default()
    } else {
        texts.join("\n")
    }
}

/// The text of a result as the model reads it: cut at [`MAX_RESULT_CHARS`], the cut marked.
fn result_text(result: &CallToolResult) -> String {
    let mut text = whole_text(result);
    if let Some((cut, _)) = text.char_indices().nth(MAX_RESULT_CHARS) {
        text.truncate(cut);
        text.push_str(" […]");
    }
    text
}

/// A preview's lines: the whole text, split into lines; a text over [`MAX_PREVIEW_BYTES`] is
/// refused, never cut.
fn preview_lines(result: &CallToolResult) -> Result<Vec<String>, ToolError> {
    let text = whole_text(result);
    if text.len() > MAX_PREVIEW_BYTES {
        return Err(ToolError::failed(
            "preview_too_large",
            format!(
                "the preview has {} bytes, over {MAX_PREVIEW_BYTES}",
                text.len()
            ),
        ));
    }
    Ok(text.lines().map(str::to_owned).collect())
}

fn moved(result: &CallToolResult) -> bool {
    result
        .meta
        .as_ref()
        .and_then(|m| m.0.get(MOVED_META))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError> {
        if self.spec.effect.is_write() && ctx.fence.is_none() {
            return Err(ToolError::failed(
                "unfenced_write",
                "an MCP write was called without a fence",
            ));
        }
        let meta = call_meta(ctx);
        let answer = if self.spec.effect.is_write() {
            let timeout = self.server.entry().call_timeout();
            self.server.call(&self.spec.name, args, meta, timeout).await
        } else {
            self.read(args, meta).await
        };
        let result = answer.map_err(|e| {
            tracing::warn!(tool = %self.spec.name, server = %self.server.name(), code = e.code(), error = %e, "MCP call failed");
            self.failure(&e)
        })?;
        if self.spec.effect.is_write() && moved(&result) {
            return Err(ToolError::Moved);
        }
        let text = result_text(&result);
        Ok(if result.is_error.unwrap_or(false) {
            ToolOutput::error(text)
        } else {
            ToolOutput::ok(text)
        })
    }

    fn previewer(&self) -> Option<&dyn ToolPreview> {
        self.preview.as_ref().map(|_| self as &dyn ToolPreview)
    }

    fn identity_facts(&self) -> Value {
        identity_facts(&self.server.source(), &self.spec, self.preview.as_deref())
    }

    fn available(&self) -> bool {
        !self.server.is_withheld(&self.spec.name)
    }

    /// The tools of one server share its state; an MCP server cannot be told the calls of a turn
    /// before a call, so one that comes after another on the same server is previewed alone.
    fn sequence(&self) -> Option<Sequence> {
        Some(Sequence {
            resource: self.server.source(),
            composes: false,
        })
    }
}

#[async_trait]
impl ToolPreview for McpTool {
    /// A request that was not carried out, or whose session was lost, is sent again while the
    /// preview's time lasts, and then interrupts the segment (transient: the segment is retried
    /// within its budget). Every other failure is the tool's own, a failed preview line naming
    /// the code: a server that refuses, answers with an error or is withheld is shown as such
    /// on the card.
    async fn preview(
        &self,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<String>, ToolError> {
        let Some(preview) = &self.preview else {
            return Err(ToolError::failed("no_preview", "the tool has no preview"));
        };
        let mut meta = JsonObject::new();
        meta.insert(
            "countersign/acting_user".into(),
            principal_json(acting_user),
        );
        let deadline = Instant::now() + self.server.entry().preview_timeout();
        let mut pause = PREVIEW_RETRY;
        let result = loop {
            if self.server.is_withheld(&self.spec.name) {
                return Err(ToolError::failed(
                    CallError::Withheld.code(),
                    CallError::Withheld,
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let e = match self.server.call(preview, args, meta.clone(), left).await {
                Ok(result) => break result,
                Err(e) => e,
            };
            tracing::warn!(tool = %self.spec.name, server = %self.server.name(), code = e.code(), error = %e, "MCP preview failed");
            match e {
                CallError::NotSent | CallError::Lost | CallError::TimedOut => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left <= pause {
                        return Err(ToolError::unavailable(e.code(), e));
                    }
                    tokio::time::sleep(pause).await;
                    pause = pause.saturating_mul(2);
                }
                e => return Err(ToolError::failed(e.code(), e)),
            }
        };
        if result.is_error.unwrap_or(false) {
            return Err(ToolError::failed(
                "preview_refused",
                "the preview tool answered with an error",
            ));
        }
        preview_lines(&result)
    }

    /// The preview tool, called as `viewer`, answers without an error. Fails closed.
    async fn may_viewer_read_preview(&self, args: &Value, viewer: &Principal) -> bool {
        self.preview(viewer, args).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ToolAnnotations;

    #[test]
    fn every_mcp_error_has_the_code_it_always_had() {
        let errors = [
            (
                McpError::BadConfiguration(String::new()),
                "bad_configuration",
            ),
            (
                McpError::InvalidServerName("no tes".into()),
                "invalid_server_name",
            ),
            (
                McpError::ServersFile {
                    path: "mcp.json".into(),
                    reason: "gone".into(),
                },
                "servers_file_unreadable",
            ),
            (
                McpError::SecretMissing {
                    server: "notes".into(),
                    variable: "NOTES_SECRET".into(),
                },
                "secret_missing",
            ),
            (
                McpError::Discovery {
                    server: "notes".into(),
                    code: "mcp_timeout",
                },
                "mcp_timeout",
            ),
            (McpError::DuplicateTool("t".into()), "duplicate_tool"),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }

    fn listed(
        name: &str,
        annotations: Option<ToolAnnotations>,
        meta: Option<Value>,
    ) -> rmcp::model::Tool {
        let mut tool = rmcp::model::Tool::new(name.to_owned(), "", Arc::new(JsonObject::new()));
        tool.annotations = annotations;
        tool.meta = meta.map(|m| rmcp::model::MetaObject(m.as_object().unwrap().clone()));
        tool
    }

    fn entry(fields: &str) -> McpServerEntry {
        parse_servers(&format!(r#"{{"s": {{"command": ["x"]{fields}}}}}"#))
            .unwrap()
            .remove(0)
    }

    fn hints(read_only: Option<bool>, idempotent: Option<bool>) -> Option<ToolAnnotations> {
        let mut a = ToolAnnotations::default();
        a.read_only_hint = read_only;
        a.idempotent_hint = idempotent;
        Some(a)
    }

    fn effect(tool: &rmcp::model::Tool, entry: &McpServerEntry) -> Effect {
        listed_tool(tool, std::slice::from_ref(tool), entry)
            .spec
            .effect
    }

    #[test]
    fn without_the_operators_word_every_tool_is_a_disabled_non_idempotent_write_of_its_server() {
        let e = entry("");
        for annotations in [hints(Some(true), None), hints(None, Some(true)), None] {
            let tool = listed("t", annotations.clone(), None);
            let l = listed_tool(&tool, std::slice::from_ref(&tool), &e);
            assert_eq!(l.spec.effect, Effect::NonIdempotentWrite, "{annotations:?}");
            assert!(!l.spec.enabled_by_default);
            assert_eq!(l.spec.group, "mcp_s");
            assert_eq!(l.spec.data_class, DataClass::SecretAdjacent);
            assert_eq!(l.effect_by, DecidedBy::Default);
            assert_eq!(
                l.declared.effect,
                annotated_effect(&tool),
                "kept as a suggestion"
            );
        }
    }

    #[test]
    fn a_trusted_servers_annotations_decide_the_effect_and_fail_closed_without_them() {
        let e = entry(r#", "trust_annotations": true"#);
        for (annotations, expected) in [
            (hints(Some(true), None), Effect::ReadOnly),
            (hints(Some(true), Some(false)), Effect::ReadOnly),
            (hints(Some(false), Some(true)), Effect::IdempotentWrite),
            (hints(None, Some(true)), Effect::IdempotentWrite),
            (hints(Some(false), Some(false)), Effect::NonIdempotentWrite),
            (hints(None, None), Effect::NonIdempotentWrite),
            (None, Effect::NonIdempotentWrite),
        ] {
            let tool = listed("t", annotations.clone(), None);
            assert_eq!(effect(&tool, &e), expected, "{annotations:?}");
            let l = listed_tool(&tool, std::slice::from_ref(&tool), &e);
            assert_eq!(l.spec.enabled_by_default, !expected.is_write());
        }
    }

    #[test]
    fn the_operators_word_on_a_tool_wins_over_the_annotations() {
        let e = entry(
            r#", "trust_annotations": true,
                "tools": {"t": {"effect": "non_idempotent_write", "enabled": true,
                                "group": "tickets", "data_class": "personal_data"}}"#,
        );
        let tool = listed("t", hints(Some(true), None), None);
        let l = listed_tool(&tool, std::slice::from_ref(&tool), &e);
        assert_eq!(
            (
                l.spec.effect,
                l.spec.enabled_by_default,
                l.spec.group.as_str(),
                l.spec.data_class,
                l.effect_by
            ),
            (
                Effect::NonIdempotentWrite,
                true,
                "tickets",
                DataClass::PersonalData,
                DecidedBy::Operator
            )
        );
    }

    #[test]
    fn a_preview_tool_must_be_a_read_of_the_same_server_by_the_operators_word() {
        let naming = |target: &str| listed("w", None, Some(json!({ PREVIEW_META: target })));
        let read = listed("p", hints(Some(true), None), None);
        let write = listed("q", hints(Some(false), Some(true)), None);
        let preview = |tool: &rmcp::model::Tool, e: &McpServerEntry| {
            let all = [tool.clone(), read.clone(), write.clone()];
            listed_tool(tool, &all, e).preview
        };
        let trusting = entry(r#", "trust_annotations": true"#);
        assert_eq!(preview(&naming("p"), &trusting).as_deref(), Some("p"));
        assert_eq!(preview(&naming("q"), &trusting), None);
        assert_eq!(preview(&naming("gone"), &trusting), None);
        assert_eq!(preview(&listed("w", None, None), &trusting), None);
        assert_eq!(
            preview(&naming("p"), &entry("")),
            None,
            "an untrusted server's read-only claim does not make a preview tool"
        );
        let operator = entry(r#", "tools": {"p": {"effect": "read_only"}, "w": {"preview": "p"}}"#);
        assert_eq!(
            preview(&listed("w", None, None), &operator).as_deref(),
            Some("p")
        );
    }

    #[test]
    fn an_mcp_tools_identity_names_its_server_and_preview_and_ignores_the_operators_placement() {
        let tool = listed("w", hints(Some(false), Some(true)), None);
        let one = entry(r#", "trust_annotations": true"#);
        let other = entry(r#", "trust_annotations": true, "group": "g", "data_class": "public""#);
        let facts =
            |e: &McpServerEntry| listed_tool(&tool, std::slice::from_ref(&tool), e).facts("mcp:s");
        assert_eq!(facts(&one), facts(&other));
        assert_eq!(facts(&one)["server"], "mcp:s");
        assert_eq!(facts(&one)["effect"], "idempotent_write");
        assert_ne!(
            countersign_core::tool::identity_of(&facts(&one)),
            countersign_core::tool::identity_of(&facts(&entry("")))
        );
    }

    fn tool(effect: Effect) -> McpTool {
        let server = Arc::new(
            McpServer::new(
                entry(""),
                &Trust::new(None).unwrap(),
                |_| None,
                Arc::new(AcceptAll),
            )
            .unwrap(),
        );
        McpTool {
            spec: ToolSpec {
                name: "t".into(),
                description: String::new(),
                parameters: json!({}),
                group: "g".into(),
                data_class: DataClass::Public,
                effect,
                enabled_by_default: false,
                requires_admin: false,
            },
            preview: None,
            server,
        }
    }

    #[test]
    fn a_writes_answer_that_did_not_come_is_an_unknown_outcome_unless_trusted_idempotent_and_lost()
    {
        for e in [
            CallError::Lost,
            CallError::TimedOut,
            CallError::Protocol("internal".into()),
        ] {
            assert!(
                matches!(
                    tool(Effect::NonIdempotentWrite).failure(&e),
                    ToolError::OutcomeUnknown { .. }
                ),
                "{e:?}"
            );
        }
        assert!(matches!(
            tool(Effect::IdempotentWrite).failure(&CallError::Lost),
            ToolError::Unavailable { .. }
        ));
        for e in [CallError::TimedOut, CallError::Protocol("internal".into())] {
            assert!(
                matches!(
                    tool(Effect::IdempotentWrite).failure(&e),
                    ToolError::OutcomeUnknown { .. }
                ),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_request_not_carried_out_is_retried_or_refused_and_a_reads_other_failure_is_its_result() {
        for effect in [
            Effect::NonIdempotentWrite,
            Effect::IdempotentWrite,
            Effect::ReadOnly,
        ] {
            for not_sent in [CallError::NotSent, CallError::Unauthorized] {
                assert!(matches!(
                    tool(effect).failure(&not_sent),
                    ToolError::Unavailable { .. }
                ));
            }
            for refused in [CallError::Refused("HTTP 400".into()), CallError::Withheld] {
                assert!(matches!(
                    tool(effect).failure(&refused),
                    ToolError::Failed { .. }
                ));
            }
        }
        for e in [
            CallError::Lost,
            CallError::TimedOut,
            CallError::Protocol("x".into()),
        ] {
            let failure = tool(Effect::ReadOnly).failure(&e);
            assert!(
                matches!(failure, ToolError::Broken { .. }) && !failure.interrupts(),
                "{e:?}: a read that gave up is the model's to read, never retried for ever"
            );
        }
    }

    #[test]
    fn a_results_text_is_its_text_blocks_and_a_moved_answer_is_seen() {
        let mut result =
            CallToolResult::error(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        assert_eq!(result_text(&result), "a\nb");
        assert!(!moved(&result));
        result.meta = Some(rmcp::model::MetaObject(
            json!({ MOVED_META: true }).as_object().unwrap().clone(),
        ));
        assert!(moved(&result));
    }

    #[test]
    fn a_preview_is_read_whole_and_one_over_the_limit_fails_never_cut() {
        let long: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        let result = CallToolResult::success(vec![ContentBlock::text(long)]);
        let lines = preview_lines(&result).unwrap();
        assert_eq!(lines.len(), 3000);
        assert_eq!(lines.last().map(String::as_str), Some("line 2999"));
        let over =
            CallToolResult::success(vec![ContentBlock::text("x".repeat(MAX_PREVIEW_BYTES + 1))]);
        assert_eq!(
            preview_lines(&over).unwrap_err().code(),
            "preview_too_large"
        );
        let cut =
            CallToolResult::success(vec![ContentBlock::text("y".repeat(MAX_RESULT_CHARS + 5))]);
        assert!(
            result_text(&cut).ends_with(" […]"),
            "a result's cut is marked"
        );
    }
}
