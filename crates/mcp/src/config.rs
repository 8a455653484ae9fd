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
//!   }
//! }
//! ```
//!
//! Every binary reads the same file, because the worker that runs a call and the coordinator
//! that gates its approval must know the same tools. A server's process gets only the
//! variables its entry names (`env`, and `pass_env` copied from countersign's own environment)
//! besides `PATH`, `HOME`, `LANG` and `TZ`: never the keyring or a database URL.

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
    /// The program and its arguments, started with stdio as the transport.
    pub command: Vec<String>,
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

impl McpServerEntry {
    pub fn name(&self) -> &str {
        &self.name
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
        if self.command.first().is_none_or(|c| c.trim().is_empty()) {
            return Err(bad("`command` names no program"));
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
        ] {
            assert_eq!(parse_servers(text).unwrap_err().code(), code, "{text}");
        }
    }
}
