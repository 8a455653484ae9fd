//! `countersign tools list|check|pending|accept|add`: the tools this deployment registers and
//! who decided what each is, whether a tool's preview is fit to be countersigned, the changes
//! of servers' tools waiting for an operator, and the file of tool servers.
//!
//! A preview that changes by itself bounces every approval of its tool, because the comparator
//! holds the lines an approver was shown against a fresh preview just before the call runs; a
//! preview longer than the bounds is cut before it is stored, so the approver sees less than
//! the tool said. `check` finds both before any run depends on the tool: it previews the call
//! twice, each time through a registry of its own built by `countersign_service::tools` (for the
//! content store's tools each on its own database connection, for a remote tool each through a
//! discovery and an HTTP client of its own, for an MCP tool each through a server process of its
//! own), compares the two line for line, and holds the lines
//! to the bounds the suspension applies. The acting user is resolved through the content store's
//! user directory, as the worker resolves a run's acting user. Every line printed that comes from
//! a tool is made inert first ([`crate::render::inert`]).
//!
//! A server's tool listed otherwise than an operator accepted it is withheld from every run;
//! `pending` shows each such change beside what was accepted, and `accept` accepts the one
//! named by its identity, so an operator accepts exactly the change they read.

use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Subcommand;
use countersign_content::ContentUsers;
use countersign_core::UserDirectory;
use countersign_remote::{DecidedBy, RemoteError, ServerEntry};
use countersign_service::tools::{Origin, Tools};
use countersign_service::ToolSettings;
use countersign_store::ToolIdentity;
use countersign_tooltest::PreviewCheck;
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::ops;

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// Lists every tool this deployment registers: name, origin (built-in, or the server it
    /// comes from), effect, group, data class, whether it is enabled by default, whether it
    /// previews, who decided its effect (and what an untrusted server suggests), and whether it
    /// is withheld.
    List,
    /// Lists the tools whose server lists them otherwise than an operator accepted them: each is
    /// withheld from every run until accepted. Shows what was accepted and what is listed now.
    Pending,
    /// Accepts the pending change of tool NAME whose identity is HEX (as `tools pending` shows
    /// it): the tool is offered again, as listed now, by every process started from now on.
    Accept {
        name: String,
        /// The identity of the change accepted: all 64 hex characters `tools pending` shows.
        #[arg(long, value_name = "HEX")]
        identity: String,
        /// Who accepts it, recorded with it.
        #[arg(long = "as", value_name = "OPERATOR")]
        operator: String,
    },
    /// Previews the call of NAME with ARGS twice as USER, on separate connections, and
    /// reports any difference line by line, whether the lines fit the preview bounds, and
    /// whether USER may view the preview. Exits non-zero when the two previews differ, a
    /// preview fails, or the lines exceed the bounds.
    Check {
        /// The tool, as `tools list` names it.
        name: String,
        /// The call's arguments, a JSON object, e.g. '{"uid": 12, "description": "New"}'.
        #[arg(long, value_name = "JSON")]
        args: String,
        /// The user the call acts as (a user of the content store, as for a run).
        #[arg(long = "as", value_name = "USER")]
        acting_user: String,
    },
    /// Appends the tool server NAME at URL, with the operator's word on its tools, to the tool
    /// servers file, after checking all of it; a name configured already is refused.
    Add {
        /// The server's name: letters, digits, `-` and `_`; its secret is read from
        /// COUNTERSIGN_TOOL_SECRET_<NAME>.
        name: String,
        /// Its base URL: http:// or https://, without credentials. The file it is added to is
        /// --tool-servers-file (created when missing).
        url: String,
        /// The operator's word on its tools: `trust_declarations`, `group=G`, `data_class=C`,
        /// `TOOL.effect=E`, `TOOL.enabled=true|false`, `TOOL.group=G`, `TOOL.data_class=C`.
        /// Without any, each of its tools is a disabled non-idempotent write of the group
        /// remote_<NAME>, classed secret_adjacent.
        options: Vec<String>,
    },
}

pub async fn run(
    database_url: &str,
    settings: &ToolSettings,
    command: ToolsCommand,
) -> anyhow::Result<()> {
    match command {
        ToolsCommand::List => list(database_url, settings).await,
        ToolsCommand::Check {
            name,
            args,
            acting_user,
        } => check(database_url, settings, &name, &args, &acting_user).await,
        ToolsCommand::Pending => pending(database_url).await,
        ToolsCommand::Accept {
            name,
            identity,
            operator,
        } => accept(database_url, &name, &identity, &operator).await,
        ToolsCommand::Add { name, url, options } => add(&name, &url, &options, settings),
    }
}

/// Every registered tool, one a line.
async fn list(database_url: &str, settings: &ToolSettings) -> anyhow::Result<()> {
    let pool = single_connection(database_url).await?;
    let tools = assemble(&pool, settings).await?;
    for tool in tools.registry.iter() {
        let spec = tool.spec();
        let mut columns = vec![
            spec.name.clone(),
            origin(&tools, &spec.name),
            spec.effect.as_str().to_owned(),
            spec.group.clone(),
            spec.data_class.to_string(),
            if spec.enabled_by_default {
                "enabled"
            } else {
                "disabled"
            }
            .to_owned(),
            if tool.previewer().is_some() {
                "previews"
            } else {
                "no preview"
            }
            .to_owned(),
            decided(&tools, &spec.name),
        ];
        if !tool.available() {
            columns.push(
                "WITHHELD: its server lists it otherwise than it was accepted (countersign tools pending)"
                    .to_owned(),
            );
        }
        println!("{}", crate::render::columns(&columns));
    }
    pool.close().await;
    Ok(())
}

/// Who decided what the tool `name` is, and what its server suggests where nobody did.
fn decided(tools: &Tools, name: &str) -> String {
    let Some(registered) = tools.registration(name) else {
        return "built in".to_owned();
    };
    let by = format!("effect decided by {}", registered.effect_by.as_str());
    if registered.effect_by != DecidedBy::Default {
        return by;
    }
    let d = &registered.declared;
    let mut says: Vec<String> = Vec::new();
    if let Some(effect) = d.effect {
        says.push(effect.as_str().to_owned());
    }
    if let Some(enabled) = d.enabled_by_default {
        says.push(if enabled { "enabled" } else { "disabled" }.to_owned());
    }
    if let Some(group) = &d.group {
        says.push(format!("group {group}"));
    }
    if let Some(class) = d.data_class {
        says.push(class.as_str().to_owned());
    }
    if says.is_empty() {
        by
    } else {
        format!("{by}; the server suggests (untrusted): {}", says.join(", "))
    }
}

/// Every pending change, beside what was accepted.
async fn pending(database_url: &str) -> anyhow::Result<()> {
    let store = ops::store_without_keys(single_connection(database_url).await?);
    let identities = store.tool_identities().await?;
    let changes: Vec<&ToolIdentity> = identities.iter().filter(|t| t.pending.is_some()).collect();
    if changes.is_empty() {
        say!("no tool is withheld: every server lists its tools as they were accepted");
    }
    for tool in changes {
        for line in pending_lines(tool) {
            say!("{line}");
        }
    }
    Ok(())
}

/// How `tool`'s pending change reads: what was accepted, what is listed now, what differs, and
/// the command that accepts it.
fn pending_lines(tool: &ToolIdentity) -> Vec<String> {
    let Some(change) = &tool.pending else {
        return Vec::new();
    };
    let accepted_by = tool.accepted_by.as_deref().unwrap_or("its first listing");
    let mut lines = vec![
        format!(
            "tool {} · withheld since {} · accepted {} by {accepted_by}",
            tool.tool,
            change.since.to_rfc3339(),
            tool.accepted_at.to_rfc3339()
        ),
        format!("  accepted:   {}", facts_line(&tool.facts, &tool.identity)),
        format!(
            "  listed now: {}",
            facts_line(&change.facts, &change.identity)
        ),
    ];
    let fields = ["server", "name", "effect", "preview", "parameters"];
    let differ: Vec<&str> = fields
        .into_iter()
        .filter(|f| tool.facts.get(f) != change.facts.get(f))
        .collect();
    lines.push(format!("  changed: {}", differ.join(", ")));
    if differ.contains(&"parameters") {
        lines.push(format!(
            "  accepted parameters:   {}",
            tool.facts["parameters"]
        ));
        lines.push(format!(
            "  parameters listed now: {}",
            change.facts["parameters"]
        ));
    }
    lines.push(format!(
        "  accept it: countersign tools accept {} --identity {} --as OPERATOR",
        tool.tool, change.identity
    ));
    lines
}

fn facts_line(facts: &Value, identity: &str) -> String {
    let text = |key: &str| match &facts[key] {
        Value::String(s) => s.clone(),
        Value::Null => "none".to_owned(),
        other => other.to_string(),
    };
    format!(
        "{} · {} · preview {} · identity {identity}",
        text("server"),
        text("effect"),
        text("preview")
    )
}

/// Accepts the pending change of `name` whose identity is `identity`.
async fn accept(
    database_url: &str,
    name: &str,
    identity: &str,
    operator: &str,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        identity.len() == 64
            && identity
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "--identity is the 64 lowercase hex characters `countersign tools pending` shows"
    );
    let store = ops::store_without_keys(single_connection(database_url).await?);
    if !store.accept_tool(name, identity, operator).await? {
        bail!(
            "nothing accepted: tool {name} has no pending change {identity} (none, or another \
             since); `countersign tools pending` shows what is pending now"
        );
    }
    say!("tool {name} accepted as {identity} by {operator}");
    say!("every countersign process started from now on offers it as its server lists it now; restart the running services to offer it there");
    Ok(())
}

fn origin(tools: &Tools, name: &str) -> String {
    match tools.origin(name) {
        Origin::BuiltIn => "built-in".to_owned(),
        Origin::Server(server) => format!("server {server}"),
        Origin::Mcp(server) => format!("MCP server {server}"),
    }
}

/// The registry every binary builds, its content store's tools on `pool`.
async fn assemble(pool: &PgPool, settings: &ToolSettings) -> anyhow::Result<Tools> {
    let store = ops::store_without_keys(pool.clone());
    countersign_service::tools::tools(&store, settings).await
}

/// A pool of one connection: each preview of a check reads through a connection of its own.
async fn single_connection(database_url: &str) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL (DATABASE_URL)")
}

async fn check(
    database_url: &str,
    settings: &ToolSettings,
    name: &str,
    args: &str,
    user: &str,
) -> anyhow::Result<()> {
    let args: Value = serde_json::from_str(args).context("--args is not JSON")?;
    anyhow::ensure!(
        args.is_object(),
        "--args must be a JSON object, as the arguments of every call are"
    );
    let (first_pool, second_pool) = (
        single_connection(database_url).await?,
        single_connection(database_url).await?,
    );
    let first = assemble(&first_pool, settings).await?;
    let Some(tool) = first.registry.get(name).cloned() else {
        bail!("no tool {name} is registered; `countersign tools list` lists them");
    };
    let acting_user = content_user(&first_pool, user).await?;

    let spec = tool.spec();
    describe(&first, name, spec, &acting_user, &args);
    if tool.previewer().is_none() {
        bail!(
            "{name} offers no preview: {}",
            if spec.effect.is_write() {
                "an approver would countersign its calls blind"
            } else {
                "it is read-only, and its calls run without approval"
            }
        );
    }
    let second = assemble(&second_pool, settings).await?;
    let Some(again) = second.registry.get(name).cloned() else {
        bail!("{name} was not registered again by the second registry: its server no longer offers it");
    };

    let report =
        countersign_tooltest::check_preview(Arc::clone(&tool), again, &acting_user, &args).await;
    let may_view = match tool.previewer() {
        Some(previewer) => previewer.may_viewer_read_preview(&args, &acting_user).await,
        None => false,
    };
    for line in &report.lines {
        say!("{line}");
    }
    let user = &acting_user.name;
    if may_view {
        say!("may-view for {user}: allowed — a card shows {user} this preview");
    } else {
        say!("may-view for {user}: withheld — a card would not show {user} this preview");
    }
    first_pool.close().await;
    second_pool.close().await;
    verdict(name, &report)
}

/// The content store's user `user`, whom a check's call acts as.
async fn content_user(pool: &PgPool, user: &str) -> anyhow::Result<countersign_core::Principal> {
    ContentUsers::new(pool.clone())
        .principal(user)
        .await
        .with_context(|| format!("looking up user {user}"))?
        .with_context(|| format!("no user {user} in the content store (unknown or disabled)"))
}

/// The check's last line: the preview passed, or the error naming its problems.
fn verdict(name: &str, report: &PreviewCheck) -> anyhow::Result<()> {
    if report.problems.is_empty() {
        say!(
            "ok: the preview is deterministic and within the bounds{}",
            if report.reshaped {
                ", and the card shows it as above"
            } else {
                ", and the card shows it as the tool gave it"
            }
        );
        Ok(())
    } else {
        bail!("tools check {name}: {}", report.problems.join("; "))
    }
}

/// The check's first lines: the tool, where it comes from, its effect and group, and who the
/// call acts as.
fn describe(
    tools: &Tools,
    name: &str,
    spec: &countersign_core::ToolSpec,
    acting_user: &countersign_core::Principal,
    args: &Value,
) {
    let user = &acting_user.name;
    say!(
        "tool {name} · {} · {} · group {} · {}",
        origin(tools, name),
        spec.effect.as_str(),
        spec.group,
        decided(tools, name)
    );
    if tools.registry.get(name).is_some_and(|t| !t.available()) {
        say!("note: {name} is withheld from every run: its server lists it otherwise than it was accepted (countersign tools pending)");
    }
    say!(
        "acting as {} ({}) · arguments {args}",
        acting_user.name,
        if acting_user.admin {
            "an administrator"
        } else {
            "not an administrator"
        }
    );
    if spec.requires_admin && !acting_user.admin {
        say!("note: {name} requires an administrator: runs acting as {user} are not offered it");
    }
}

/// Appends a checked server entry to the servers file.
fn add(name: &str, url: &str, options: &[String], settings: &ToolSettings) -> anyhow::Result<()> {
    let Some(path) = settings.servers_file() else {
        bail!("name the tool servers file: --tool-servers-file PATH, or COUNTERSIGN_TOOL_SERVERS_FILE");
    };
    let refused = |e: RemoteError| anyhow::anyhow!("tool server not added ({}): {e}", e.code());
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let entry = ServerEntry::with_options(name, url, &options).map_err(refused)?;
    let listed = countersign_remote::parse_servers(&settings.tool_servers).unwrap_or_default();
    if listed.iter().any(|s| s.name() == entry.name()) {
        return Err(refused(RemoteError::DuplicateServer(
            entry.name().to_owned(),
        )));
    }
    countersign_remote::add_to_servers_file(path, &entry).map_err(refused)?;
    say!(
        "tool server {} ({}) added to {}",
        entry.name(),
        entry.url(),
        path.display()
    );
    say!(
        "its secret is read from {}; every countersign process started with COUNTERSIGN_TOOL_SERVERS_FILE={} discovers its tools",
        countersign_remote::secret_variable(entry.name()),
        path.display()
    );
    if entry.options().is_empty() {
        say!(
            "without the operator's word each of its tools is a disabled non-idempotent write of the group {}, classed secret_adjacent; `countersign tools list` shows what it suggests",
            entry.default_group()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_change_is_shown_beside_what_was_accepted_with_the_command_that_accepts_it() {
        let at = chrono::DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let facts = |effect: &str, required: &[&str]| {
            serde_json::json!({"server": "mcp:lying", "name": "lookup", "effect": effect,
                               "parameters": {"required": required}, "preview": null})
        };
        let identity = "b".repeat(64);
        let tool = ToolIdentity {
            tool: "lookup".into(),
            server: "mcp:lying".into(),
            identity: "a".repeat(64),
            facts: facts("read_only", &["ticket"]),
            accepted_at: at,
            accepted_by: None,
            pending: Some(countersign_store::PendingChange {
                server: "mcp:lying".into(),
                identity: identity.clone(),
                facts: facts("non_idempotent_write", &["ticket", "purge"]),
                since: at,
            }),
        };
        let lines = pending_lines(&tool);
        assert_eq!(
            lines[..4],
            [
                "tool lookup · withheld since 2026-11-30T10:00:00+00:00 · accepted 2026-11-30T10:00:00+00:00 by its first listing".to_owned(),
                format!("  accepted:   mcp:lying · read_only · preview none · identity {}", "a".repeat(64)),
                format!("  listed now: mcp:lying · non_idempotent_write · preview none · identity {identity}"),
                "  changed: effect, parameters".to_owned(),
            ]
        );
        assert_eq!(
            lines.last().unwrap(),
            &format!(
                "  accept it: countersign tools accept lookup --identity {identity} --as OPERATOR"
            )
        );
    }
}
