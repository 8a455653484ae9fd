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
use countersign_core::preview::{
    bound_lines, collapse_whitespace, failed_at_suspend_line, EMPTY_PREVIEW_LINE, MAX_LINES,
    MAX_LINE_CHARS,
};
use countersign_core::{Principal, Tool, ToolError, UserDirectory};
use countersign_remote::{DecidedBy, RemoteError, ServerEntry};
use countersign_service::tools::{Origin, Tools};
use countersign_service::ToolSettings;
use countersign_store::ToolIdentity;
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
    let acting_user = ContentUsers::new(first_pool.clone())
        .principal(user)
        .await
        .with_context(|| format!("looking up user {user}"))?
        .with_context(|| format!("no user {user} in the content store (unknown or disabled)"))?;

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

    let previews = [
        attempt(Arc::clone(&tool), &acting_user, &args).await,
        attempt(again, &acting_user, &args).await,
    ];
    let may_view = match tool.previewer() {
        Some(previewer) => previewer.may_viewer_read_preview(&args, &acting_user).await,
        None => false,
    };
    let report = report(&previews, &acting_user.name, may_view);
    for line in &report.lines {
        say!("{line}");
    }
    first_pool.close().await;
    second_pool.close().await;
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

/// What one preview of a check gave.
#[derive(Debug)]
enum Attempt {
    Lines(Vec<String>),
    Failed(ToolError),
    Panicked,
}

/// Previews in a task of its own, so a panic is reported as the suspension reports it.
async fn attempt(tool: Arc<dyn Tool>, user: &Principal, args: &Value) -> Attempt {
    let (user, args) = (user.clone(), args.clone());
    let task = tokio::spawn(async move {
        match tool.previewer() {
            Some(previewer) => previewer.preview(&user, &args).await,
            None => Err(ToolError::failed(
                "no_preview",
                "the tool offers no preview",
            )),
        }
    });
    match task.await {
        Ok(Ok(lines)) => Attempt::Lines(lines),
        Ok(Err(e)) => Attempt::Failed(e),
        Err(_) => Attempt::Panicked,
    }
}

/// The printed report of a check, and what makes it fail.
#[derive(Debug, Default)]
struct Report {
    lines: Vec<String>,
    problems: Vec<String>,
    /// The bounds change what the card shows of a preview.
    reshaped: bool,
}

fn report(previews: &[Attempt; 2], user: &str, may_view: bool) -> Report {
    let mut report = Report::default();
    for (n, attempt) in previews.iter().enumerate().map(|(i, a)| (i + 1, a)) {
        match attempt {
            Attempt::Lines(lines)
                if n == 2 && matches!(&previews[0], Attempt::Lines(l) if l == lines) =>
            {
                report
                    .lines
                    .push("preview 2: the same, line for line".to_owned());
            }
            Attempt::Lines(lines) => {
                report
                    .lines
                    .push(format!("preview {n}: {} line(s)", lines.len()));
                report.lines.extend(numbered(lines));
            }
            Attempt::Failed(e) if e.interrupts() => {
                report.lines.push(format!(
                    "preview {n}: interrupted ({}): the infrastructure under the tool failed; a segment would stop and be retried, with no card",
                    e.code()
                ));
                report
                    .problems
                    .push(format!("preview {n} was interrupted ({})", e.code()));
            }
            Attempt::Failed(e) => {
                report.lines.push(format!(
                    "preview {n}: failed ({}); the card would show: {}",
                    e.code(),
                    failed_at_suspend_line(e.code())
                ));
                report
                    .problems
                    .push(format!("preview {n} failed ({})", e.code()));
            }
            Attempt::Panicked => {
                report.lines.push(format!(
                    "preview {n}: panicked; the card would show: {}",
                    failed_at_suspend_line("panic")
                ));
                report.problems.push(format!("preview {n} panicked"));
            }
        }
    }
    match previews {
        [Attempt::Lines(a), Attempt::Lines(b)] if a != b => {
            report
                .lines
                .push("the previews differ, line by line (- preview 1, + preview 2):".to_owned());
            report.lines.extend(differences(a, b));
            report.problems.push(
                "the two previews differ: every approval of this call would bounce".to_owned(),
            );
        }
        [Attempt::Failed(a), Attempt::Failed(b)] if a.code() != b.code() => {
            report
                .problems
                .push("the two previews failed differently".to_owned());
        }
        _ => {}
    }
    let mut checked: Vec<&Vec<String>> = Vec::new();
    for (n, attempt) in previews.iter().enumerate().map(|(i, a)| (i + 1, a)) {
        if let Attempt::Lines(lines) = attempt {
            if checked.contains(&lines) {
                continue;
            }
            checked.push(lines);
            bounds(&mut report, n, lines);
        }
    }
    report.lines.push(if may_view {
        format!("may-view for {user}: allowed — a card shows {user} this preview")
    } else {
        format!("may-view for {user}: withheld — a card would not show {user} this preview")
    });
    report
}

/// `  N  line` for each line.
fn numbered(lines: &[String]) -> impl Iterator<Item = String> + '_ {
    lines
        .iter()
        .enumerate()
        .map(|(i, line)| format!("  {:>2}  {line}", i + 1))
}

/// The lines at which `a` and `b` differ: each as it reads in `a` (`-`) and in `b` (`+`).
fn differences(a: &[String], b: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..a.len().max(b.len()) {
        let (left, right) = (a.get(i), b.get(i));
        if left == right {
            continue;
        }
        let shown = |line: Option<&String>| line.map_or("(no line)".to_owned(), Clone::clone);
        out.push(format!("  - {:>2}  {}", i + 1, shown(left)));
        out.push(format!("  + {:>2}  {}", i + 1, shown(right)));
    }
    out
}

/// Holds preview `n`'s lines to the bounds the suspension applies ([`bound_lines`]): more lines
/// than [`MAX_LINES`], a line longer than [`MAX_LINE_CHARS`] or nothing left are problems;
/// whitespace the card collapses and blank lines it drops are noted.
fn bounds(report: &mut Report, n: usize, lines: &[String]) {
    let bounded = bound_lines(lines);
    let mut notes = Vec::new();
    let mut over = Vec::new();
    for (i, line) in lines.iter().enumerate().map(|(i, l)| (i + 1, l)) {
        let collapsed = collapse_whitespace(line);
        let chars = collapsed.chars().count();
        if collapsed.is_empty() {
            notes.push(format!("line {i} is blank: the card drops it"));
        } else if collapsed != *line {
            notes.push(format!(
                "line {i} has whitespace the card collapses to single spaces"
            ));
        }
        if chars > MAX_LINE_CHARS {
            over.push(format!(
                "line {i} has {chars} characters, over {MAX_LINE_CHARS}: the card cuts it"
            ));
        }
    }
    let kept = lines
        .iter()
        .filter(|l| !collapse_whitespace(l).is_empty())
        .count();
    if kept > MAX_LINES {
        over.push(format!(
            "{kept} lines, over {MAX_LINES}: the card shows the first {MAX_LINES} and says how many more"
        ));
    }
    if bounded.is_empty() {
        over.push(format!(
            "no line is left: the card would show \"{EMPTY_PREVIEW_LINE}\" and count the preview failed"
        ));
    }
    if over.is_empty() && notes.is_empty() {
        report.lines.push(format!(
            "bounds of preview {n}: every line fits (at most {MAX_LINES} lines of at most {MAX_LINE_CHARS} characters)"
        ));
        return;
    }
    for line in notes.iter().chain(&over) {
        report.lines.push(format!("bounds of preview {n}: {line}"));
    }
    if !bounded.is_empty() && bounded != lines {
        report.reshaped = true;
        report
            .lines
            .push(format!("preview {n} as the card shows it:"));
        report.lines.extend(numbered(&bounded));
    }
    report.problems.extend(
        over.into_iter()
            .map(|o| format!("preview {n} exceeds the bounds ({o})")),
    );
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

    fn lines(lines: &[&str]) -> Attempt {
        Attempt::Lines(lines.iter().map(|l| (*l).to_owned()).collect())
    }

    #[test]
    fn two_equal_previews_within_the_bounds_pass() {
        let r = report(
            &[
                lines(&["page \"home\"", "a → b"]),
                lines(&["page \"home\"", "a → b"]),
            ],
            "editor",
            true,
        );
        assert!(r.problems.is_empty() && !r.reshaped, "{r:?}");
        assert!(r
            .lines
            .contains(&"preview 2: the same, line for line".to_owned()));
        assert!(r
            .lines
            .iter()
            .any(|l| l.starts_with("may-view for editor: allowed")));
    }

    #[test]
    fn previews_that_differ_are_reported_line_by_line_and_fail() {
        let r = report(
            &[
                lines(&["page \"home\"", "at 10:00:01"]),
                lines(&["page \"home\"", "at 10:00:02", "extra"]),
            ],
            "editor",
            false,
        );
        assert_eq!(r.problems.len(), 1, "{r:?}");
        let diff: Vec<&str> = r
            .lines
            .iter()
            .skip_while(|l| !l.starts_with("the previews differ"))
            .skip(1)
            .take(4)
            .map(String::as_str)
            .collect();
        assert_eq!(
            diff,
            vec![
                "  -  2  at 10:00:01",
                "  +  2  at 10:00:02",
                "  -  3  (no line)",
                "  +  3  extra"
            ]
        );
    }

    #[test]
    fn lines_over_the_bounds_fail_and_whitespace_the_card_collapses_is_only_noted() {
        let long = "x".repeat(MAX_LINE_CHARS + 1);
        let r = report(&[lines(&[&long]), lines(&[&long])], "editor", true);
        assert_eq!(r.problems.len(), 1, "{r:?}");
        assert!(r.problems[0].contains("501 characters"), "{r:?}");

        let many: Vec<String> = (0..=MAX_LINES).map(|i| format!("line {i}")).collect();
        let r = report(
            &[Attempt::Lines(many.clone()), Attempt::Lines(many)],
            "editor",
            true,
        );
        assert!(r.problems[0].contains("21 lines, over 20"), "{r:?}");

        let r = report(
            &[lines(&["a  b", " "]), lines(&["a  b", " "])],
            "editor",
            true,
        );
        assert!(r.problems.is_empty() && r.reshaped, "{r:?}");
        assert!(r.lines.iter().any(|l| l.contains("collapses")), "{r:?}");
        assert!(
            r.lines.iter().any(|l| l.contains("line 2 is blank")),
            "{r:?}"
        );
        assert!(
            r.lines.iter().any(|l| l == "   1  a b"),
            "shown as the card shows it: {r:?}"
        );

        let r = report(&[lines(&[]), lines(&[])], "editor", true);
        assert!(r.problems[0].contains("no line is left"), "{r:?}");
    }

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

    #[test]
    fn a_failed_or_panicked_preview_fails_the_check_with_its_code() {
        let r = report(
            &[
                Attempt::Failed(ToolError::failed("remote_timeout", "slow")),
                Attempt::Panicked,
            ],
            "editor",
            false,
        );
        assert_eq!(
            r.problems,
            vec!["preview 1 failed (remote_timeout)", "preview 2 panicked"]
        );
        assert!(r.lines[0].contains(&failed_at_suspend_line("remote_timeout")));
        let r = report(
            &[
                Attempt::Failed(ToolError::unavailable("database_error", "gone")),
                lines(&["x"]),
            ],
            "editor",
            true,
        );
        assert_eq!(
            r.problems,
            vec!["preview 1 was interrupted (database_error)"]
        );
    }
}
