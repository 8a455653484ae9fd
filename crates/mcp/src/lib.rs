//! Tools from MCP servers behind the countersign (`docs/mcp-tools.md`).
//!
//! Each configured server ([`config`]) is spoken to with the official client, `rmcp`, over
//! stdio — a process countersign starts — or over streamable HTTP ([`http`]), and its session
//! is supervised and renewed ([`server`]). Discovery is `tools/list`, once at start-up; each
//! listed tool becomes a [`Tool`] of the registry, in the server's own group, and the loop,
//! the comparator and the card treat it like any other:
//!
//! - its **effect** comes from its annotations: `readOnlyHint: true` is a read; otherwise it is
//!   a write, idempotent with `idempotentHint: true`, and non-idempotent without — a tool with
//!   no annotations is a non-idempotent write (fail closed). The server's entry may override
//!   the effect of a tool. Writers are disabled by default: an agent enables each by name.
//! - its **preview** is the read-only tool of the same server its `_meta` names under
//!   `countersign/preview`, called with the same arguments as the acting user; its text is the
//!   preview's lines. A writer without one is decided without a preview and binds to its
//!   arguments only.
//! - every **write** carries, in the call's `_meta`, the idempotency key `run:suspension:call`
//!   (`countersign/idempotency_key`), the lease epoch (`countersign/lease_epoch`), the run
//!   (`countersign/run_id`), the acting user (`countersign/acting_user`) and, when they can be
//!   compared line for line, the lines its approver was shown (`countersign/shown_preview`). A
//!   server that compares them and finds its preview moved answers with `isError` and
//!   `_meta: {"countersign/moved": true}`, and the turn re-suspends with the call marked.
//!
//! A tool's `isError` answer is its result. A protocol error or a lost session is never a
//! result: a request that certainly was not sent is retried by the segment; one whose answer
//! was lost is retried under its key when the tool is a read or an idempotent write, and is an
//! unknown outcome — never "failed" — when it is a non-idempotent write.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::{
    DataClass, Effect, ExecContext, Principal, Tool, ToolError, ToolOutput, ToolPreview,
    ToolRegistry, ToolSpec,
};
use countersign_remote::Trust;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use serde_json::{json, Value};

pub mod config;
pub mod http;
pub mod server;

pub use config::{parse_servers, read_servers_file, McpServerEntry, Transport};
pub use countersign_remote::Registered;
pub use server::{CallError, McpServer};

/// The `_meta` key of a writing tool naming its preview tool.
pub const PREVIEW_META: &str = "countersign/preview";
/// The `_meta` key of a result saying the shown preview moved and nothing was written.
pub const MOVED_META: &str = "countersign/moved";

const PREVIEW_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a result's text reaches the model.
const MAX_RESULT_CHARS: usize = 64 * 1024;

/// Why the MCP servers could not be set up. Each has a stable [`code`](Self::code).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    #[error("the MCP servers configuration is not usable: {0}")]
    BadConfiguration(String),
    #[error("the name of MCP server `{0}` is not [A-Za-z0-9_-]+")]
    InvalidServerName(String),
    #[error("the MCP servers file {path} cannot be read: {reason}")]
    ServersFile { path: String, reason: String },
    #[error("the secret of MCP server {server} is not set (variable {variable})")]
    SecretMissing { server: String, variable: String },
    #[error("discovery at MCP server {server} failed ({code})")]
    Discovery { server: String, code: &'static str },
    #[error("tool {0} is offered twice")]
    DuplicateTool(String),
}

impl McpError {
    pub fn code(&self) -> &'static str {
        match self {
            McpError::BadConfiguration(_) => "bad_configuration",
            McpError::InvalidServerName(_) => "invalid_server_name",
            McpError::ServersFile { .. } => "servers_file_unreadable",
            McpError::SecretMissing { .. } => "secret_missing",
            McpError::Discovery { code, .. } => code,
            McpError::DuplicateTool(_) => "duplicate_tool",
        }
    }
}

/// Opens a session with each of `servers`, lists its tools and registers them. A `command`
/// server's `pass_env` variables and a `url` server's secret are read with `variable`; a `url`
/// server's certificate (over `https://`) is verified against `trust`. A tool named like one
/// already registered is refused: an MCP tool never silently replaces another. Returns what
/// was registered, in order.
pub async fn register_servers(
    registry: &mut ToolRegistry,
    servers: Vec<McpServerEntry>,
    trust: &Trust,
    variable: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Registered>, McpError> {
    let mut registered = Vec::new();
    for entry in servers {
        let server = Arc::new(McpServer::new(entry, trust, &variable)?);
        for tool in discover(&server).await? {
            let name = tool.spec.name.clone();
            if registry.get(&name).is_some() {
                return Err(McpError::DuplicateTool(name));
            }
            tracing::info!(server = %server.name(), tool = %name, effect = tool.spec.effect.as_str(), previews = tool.preview.is_some(), "MCP tool registered");
            registry.register(Arc::new(tool));
            registered.push(Registered {
                tool: name,
                server: server.name().to_owned(),
            });
        }
    }
    Ok(registered)
}

/// The tools `server` lists, as tools that call it.
async fn discover(server: &Arc<McpServer>) -> Result<Vec<McpTool>, McpError> {
    let listed = server.list_tools().await.map_err(|e| McpError::Discovery {
        server: server.name().to_owned(),
        code: e.code(),
    })?;
    let entry = server.entry();
    let effects: Vec<(String, Effect)> = listed
        .iter()
        .map(|t| (t.name.to_string(), effect_of(t, entry)))
        .collect();
    let mut tools: Vec<McpTool> = Vec::new();
    for t in &listed {
        let name = t.name.to_string();
        if !valid_tool_name(&name) {
            tracing::warn!(server = %server.name(), tool = %name, "the tool's name is not ^[A-Za-z0-9_-]{{1,64}}$; it is not offered");
            continue;
        }
        if tools.iter().any(|known| known.spec.name == name) {
            return Err(McpError::DuplicateTool(name));
        }
        let effect = effect_of(t, entry);
        let preview = effect
            .is_write()
            .then(|| preview_tool(t, &effects))
            .flatten();
        if effect.is_write() && preview.is_none() {
            tracing::info!(server = %server.name(), tool = %name, "the writer names no read-only preview tool: it is decided without a preview");
        }
        tools.push(McpTool {
            spec: ToolSpec {
                name,
                description: t.description.as_deref().unwrap_or_default().to_owned(),
                parameters: Value::Object((*t.input_schema).clone()),
                group: entry.group(),
                data_class: entry.data_class(),
                effect,
                enabled_by_default: !effect.is_write(),
                requires_admin: entry.admin_only,
            },
            preview,
            server: Arc::clone(server),
        });
    }
    if entry.data_class() == DataClass::FAIL_CLOSED {
        tracing::info!(server = %server.name(), "the server's data class is secret_adjacent: its tools are offered only to providers that may receive it");
    }
    Ok(tools)
}

/// The tool's effect: the operator's override, else its annotations, failing closed.
fn effect_of(tool: &rmcp::model::Tool, entry: &McpServerEntry) -> Effect {
    if let Some(effect) = entry.effects.get(tool.name.as_ref()) {
        return *effect;
    }
    let Some(hints) = &tool.annotations else {
        return Effect::NonIdempotentWrite;
    };
    match (hints.read_only_hint, hints.idempotent_hint) {
        (Some(true), _) => Effect::ReadOnly,
        (_, Some(true)) => Effect::IdempotentWrite,
        _ => Effect::NonIdempotentWrite,
    }
}

/// The preview tool `tool` names, when the server lists it as a read.
fn preview_tool(tool: &rmcp::model::Tool, effects: &[(String, Effect)]) -> Option<String> {
    let named = tool.meta.as_ref()?.0.get(PREVIEW_META)?.as_str()?;
    match effects.iter().find(|(name, _)| name == named) {
        Some((_, Effect::ReadOnly)) => Some(named.to_owned()),
        _ => {
            tracing::warn!(tool = %tool.name, preview = named, "the preview tool is not a read-only tool of the server; the writer has no preview");
            None
        }
    }
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

    /// What a call's failure to get an answer leaves it as.
    fn failure(&self, e: &CallError) -> ToolError {
        match e {
            CallError::NotSent | CallError::Unauthorized => ToolError::unavailable(e.code(), e),
            CallError::Lost if self.spec.effect == Effect::NonIdempotentWrite => {
                ToolError::outcome_unknown(e.code(), e)
            }
            // A read, or an idempotent write sent again under its key.
            CallError::Lost => ToolError::unavailable(e.code(), e),
            CallError::Protocol(_) => ToolError::Broken {
                code: e.code(),
                detail: e.to_string(),
            },
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

/// The text of a result: its text blocks, one after the other; structured content when it has
/// no text; bounded.
fn result_text(result: &CallToolResult) -> String {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    let mut text = if texts.is_empty() {
        result
            .structured_content
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default()
    } else {
        texts.join("\n")
    };
    if let Some((cut, _)) = text.char_indices().nth(MAX_RESULT_CHARS) {
        text.truncate(cut);
        text.push_str(" […]");
    }
    text
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
        let timeout = if self.spec.effect.is_write() {
            WRITE_TIMEOUT
        } else {
            READ_TIMEOUT
        };
        let result = self
            .server
            .call(&self.spec.name, args, call_meta(ctx), timeout)
            .await
            .map_err(|e| {
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
}

#[async_trait]
impl ToolPreview for McpTool {
    /// Every failure is the tool's own (a failed preview line naming the code): a server that
    /// is down is shown as such on the card.
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
        let result = self
            .server
            .call(preview, args, meta, PREVIEW_TIMEOUT)
            .await
            .map_err(|e| {
                tracing::warn!(tool = %self.spec.name, server = %self.server.name(), code = e.code(), error = %e, "MCP preview failed");
                ToolError::failed(e.code(), e)
            })?;
        if result.is_error.unwrap_or(false) {
            return Err(ToolError::failed(
                "preview_refused",
                "the preview tool answered with an error",
            ));
        }
        Ok(result_text(&result).lines().map(str::to_owned).collect())
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

    fn entry(effects: &str) -> McpServerEntry {
        parse_servers(&format!(
            r#"{{"s": {{"command": ["x"], "effects": {effects}}}}}"#
        ))
        .unwrap()
        .remove(0)
    }

    fn hints(read_only: Option<bool>, idempotent: Option<bool>) -> Option<ToolAnnotations> {
        let mut a = ToolAnnotations::default();
        a.read_only_hint = read_only;
        a.idempotent_hint = idempotent;
        Some(a)
    }

    #[test]
    fn the_effect_follows_the_annotations_and_fails_closed_without_them() {
        let e = entry("{}");
        for (annotations, effect) in [
            (hints(Some(true), None), Effect::ReadOnly),
            (hints(Some(true), Some(false)), Effect::ReadOnly),
            (hints(Some(false), Some(true)), Effect::IdempotentWrite),
            (hints(None, Some(true)), Effect::IdempotentWrite),
            (hints(Some(false), Some(false)), Effect::NonIdempotentWrite),
            (hints(None, None), Effect::NonIdempotentWrite),
            (None, Effect::NonIdempotentWrite),
        ] {
            assert_eq!(
                effect_of(&listed("t", annotations.clone(), None), &e),
                effect,
                "{annotations:?}"
            );
        }
    }

    #[test]
    fn the_operators_override_wins_over_the_annotations() {
        let e = entry(r#"{"t": "non_idempotent_write"}"#);
        assert_eq!(
            effect_of(&listed("t", hints(Some(true), None), None), &e),
            Effect::NonIdempotentWrite
        );
    }

    #[test]
    fn a_preview_tool_must_be_a_read_of_the_same_server() {
        let effects = vec![
            ("p".to_owned(), Effect::ReadOnly),
            ("w".to_owned(), Effect::IdempotentWrite),
        ];
        let naming = |target: &str| listed("t", None, Some(json!({ PREVIEW_META: target })));
        assert_eq!(preview_tool(&naming("p"), &effects).as_deref(), Some("p"));
        assert_eq!(preview_tool(&naming("w"), &effects), None);
        assert_eq!(preview_tool(&naming("gone"), &effects), None);
        assert_eq!(preview_tool(&listed("t", None, None), &effects), None);
    }

    #[test]
    fn a_lost_answer_is_unknown_only_for_a_non_idempotent_write() {
        let server =
            Arc::new(McpServer::new(entry("{}"), &Trust::new(None).unwrap(), |_| None).unwrap());
        let tool = |effect| McpTool {
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
            server: Arc::clone(&server),
        };
        let lost = CallError::Lost;
        assert!(matches!(
            tool(Effect::NonIdempotentWrite).failure(&lost),
            ToolError::OutcomeUnknown { .. }
        ));
        for effect in [Effect::IdempotentWrite, Effect::ReadOnly] {
            assert!(matches!(
                tool(effect).failure(&lost),
                ToolError::Unavailable { .. }
            ));
        }
        for effect in [Effect::NonIdempotentWrite, Effect::ReadOnly] {
            for not_sent in [CallError::NotSent, CallError::Unauthorized] {
                assert!(matches!(
                    tool(effect).failure(&not_sent),
                    ToolError::Unavailable { .. }
                ));
            }
            assert!(matches!(
                tool(effect).failure(&CallError::Protocol("x".into())),
                ToolError::Broken { .. }
            ));
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
}
