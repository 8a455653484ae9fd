//! Which MCP servers a deployment uses: the JSON file `--mcp-servers-file`
//! (`COUNTERSIGN_MCP_SERVERS_FILE`) names, an object of servers by name.
//!
//! ```json
//! {
//!   "notes": {
//!     "command": ["python3", "/opt/notes/notes_server.py"],
//!     "env": { "NOTES_FILE": "/var/lib/notes/notes.json" },
//!     "pass_env": ["NOTES_TOKEN"],
//!     "data_class": "editor_content",
//!     "effects": { "append_line": "non_idempotent_write" }
//!   },
//!   "tickets": {
//!     "url": "https://tickets.internal/mcp",
//!     "data_class": "personal_data"
//!   }
//! }
//! ```
//!
//! An entry names exactly one transport: `command`, a process countersign starts and speaks
//! to over stdio, or `url`, a streamable HTTP endpoint someone else runs. Every binary reads
//! the same file, because the worker that runs a call and the coordinator that gates its
//! approval must know the same tools. A server's process gets only the variables its entry
//! names (`env`, and `pass_env` copied from countersign's own environment) besides `PATH`,
//! `HOME`, `LANG` and `TZ`: never the keyring or a database URL. A `url` server is sent a
//! bearer secret of its own, from `COUNTERSIGN_TOOL_SECRET_<NAME>` as a remote tool server is,
//! and never a process environment, so `env`, `pass_env` and `cwd` are refused beside `url`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use countersign_core::{DataClass, Effect};
use serde::Deserialize;

use crate::McpError;

/// One MCP server, as its entry in the servers file describes it. Built only by
/// [`read_servers_file`] and [`parse_servers`], so every entry is usable.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerEntry {
    #[serde(skip)]
    name: String,
    /// The program and its arguments, started with stdio as the transport; empty for a `url`
    /// server.
    #[serde(default)]
    pub command: Vec<String>,
    /// The streamable HTTP endpoint of a server countersign does not start.
    #[serde(default)]
    pub url: Option<String>,
    /// Variables set for the server's process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables of countersign's environment copied to the server's (its credentials).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// The working directory of the server's process.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The class of the data the server's tools read and write; unset is
    /// [`DataClass::FAIL_CLOSED`].
    #[serde(default)]
    pub data_class: Option<DataClass>,
    /// The tool group of the server's tools; unset is `mcp_<name>`.
    #[serde(default)]
    pub group: Option<String>,
    /// The operator's word on a tool's effect, over what its annotations say.
    #[serde(default)]
    pub effects: BTreeMap<String, Effect>,
    /// Whether the server's tools are offered to administrators only.
    #[serde(default)]
    pub admin_only: bool,
}

/// How countersign reaches a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport<'a> {
    /// A process started with this program and arguments, spoken to over stdio.
    Stdio(&'a [String]),
    /// A streamable HTTP endpoint.
    Http(&'a str),
}

impl McpServerEntry {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the server is reached: an entry read from a servers file names exactly one way.
    pub fn transport(&self) -> Transport<'_> {
        match &self.url {
            Some(url) => Transport::Http(url),
            None => Transport::Stdio(&self.command),
        }
    }

    /// The group its tools sit in.
    pub fn group(&self) -> String {
        self.group
            .clone()
            .unwrap_or_else(|| format!("mcp_{}", self.name.replace('-', "_")))
    }

    pub fn data_class(&self) -> DataClass {
        self.data_class.unwrap_or(DataClass::FAIL_CLOSED)
    }

    fn check(&self) -> Result<(), McpError> {
        let bad = |reason: &str| McpError::BadConfiguration(format!("{}: {reason}", self.name));
        let usable = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !usable {
            return Err(McpError::InvalidServerName(self.name.clone()));
        }
        match (&self.url, self.command.is_empty()) {
            (Some(_), false) => return Err(bad("both `command` and `url` are given")),
            (Some(url), true) => self.check_url(url)?,
            (None, _) if self.command.first().is_none_or(|c| c.trim().is_empty()) => {
                return Err(bad("`command` names no program (or give a `url`)"));
            }
            (None, _) => {}
        }
        if self.group.as_deref().is_some_and(str::is_empty) {
            return Err(bad("`group` is empty"));
        }
        if let Some(v) = self
            .env
            .keys()
            .chain(&self.pass_env)
            .find(|v| !valid_variable(v))
        {
            return Err(bad(&format!("`{v}` is not a variable name")));
        }
        Ok(())
    }

    /// A `url` is checked as a remote tool server's base URL is, and no process setting may
    /// come with it: there is no process to apply it to.
    fn check_url(&self, url: &str) -> Result<(), McpError> {
        let bad = |reason: &str| McpError::BadConfiguration(format!("{}: {reason}", self.name));
        countersign_remote::ServerEntry::new(&self.name, url)
            .map_err(|e| bad(&format!("`url`: {e}")))?;
        for (given, field) in [
            (!self.env.is_empty(), "env"),
            (!self.pass_env.is_empty(), "pass_env"),
            (self.cwd.is_some(), "cwd"),
        ] {
            if given {
                return Err(bad(&format!(
                    "`{field}` is for a `command` server; a `url` server runs elsewhere"
                )));
            }
        }
        Ok(())
    }
}

fn valid_variable(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses a servers file's text; an error names the server.
pub fn parse_servers(text: &str) -> Result<Vec<McpServerEntry>, McpError> {
    let servers: BTreeMap<String, McpServerEntry> = serde_json::from_str(text)
        .map_err(|e| McpError::BadConfiguration(format!("not an object of servers: {e}")))?;
    servers
        .into_iter()
        .map(|(name, mut entry)| {
            entry.name = name;
            entry.url = entry.url.map(|url| url.trim().to_owned());
            entry.check().map(|()| entry)
        })
        .collect()
}

/// The servers of the file at `path`.
pub fn read_servers_file(path: &Path) -> Result<Vec<McpServerEntry>, McpError> {
    let text = std::fs::read_to_string(path).map_err(|e| McpError::ServersFile {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse_servers(&text).map_err(|e| match e {
        McpError::BadConfiguration(reason) => {
            McpError::BadConfiguration(format!("{}: {reason}", path.display()))
        }
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_takes_its_name_group_and_fail_closed_class_from_the_file() {
        let servers = parse_servers(
            r#"{"notes": {"command": ["python3", "n.py"], "effects": {"a": "read_only"}}}"#,
        )
        .unwrap();
        assert_eq!(servers[0].name(), "notes");
        assert_eq!(servers[0].group(), "mcp_notes");
        assert_eq!(servers[0].data_class(), DataClass::SecretAdjacent);
        assert_eq!(servers[0].effects["a"], Effect::ReadOnly);
        assert_eq!(
            servers[0].transport(),
            Transport::Stdio(&["python3".to_owned(), "n.py".to_owned()])
        );
    }

    #[test]
    fn a_url_entry_is_a_streamable_http_server() {
        let servers = parse_servers(
            r#"{"tickets": {"url": " https://tickets.internal:8443/mcp ", "group": "t"}}"#,
        )
        .unwrap();
        assert_eq!(
            servers[0].transport(),
            Transport::Http("https://tickets.internal:8443/mcp")
        );
        assert_eq!(servers[0].group(), "t");
    }

    #[test]
    fn an_unusable_entry_is_refused_with_what_is_wrong() {
        for (text, code) in [
            (r#"{"notes": {"command": []}}"#, "bad_configuration"),
            (r#"{"no tes": {"command": ["x"]}}"#, "invalid_server_name"),
            (
                r#"{"notes": {"command": ["x"], "colour": 1}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"command": ["x"], "effects": {"a": "maybe"}}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"command": ["x"], "env": {"A B": "1"}}}"#,
                "bad_configuration",
            ),
            (r#"["notes"]"#, "bad_configuration"),
            (r#"{"notes": {}}"#, "bad_configuration"),
            (
                r#"{"notes": {"command": ["x"], "url": "http://h/mcp"}}"#,
                "bad_configuration",
            ),
            (r#"{"notes": {"url": "ftp://h/mcp"}}"#, "bad_configuration"),
            (r#"{"notes": {"url": "/mcp"}}"#, "bad_configuration"),
            (
                r#"{"notes": {"url": "https://u:p@h/mcp"}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"url": "https://h/mcp?a=1"}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"url": "https://h/mcp#a"}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"url": "https://h/mcp", "env": {"A": "1"}}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"url": "https://h/mcp", "pass_env": ["A"]}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"url": "https://h/mcp", "cwd": "/tmp"}}"#,
                "bad_configuration",
            ),
        ] {
            assert_eq!(parse_servers(text).unwrap_err().code(), code, "{text}");
        }
    }
}
