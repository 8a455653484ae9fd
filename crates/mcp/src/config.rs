//! Which MCP servers a deployment uses, and the operator's word on their tools: the JSON file
//! `--mcp-servers-file` (`COUNTERSIGN_MCP_SERVERS_FILE`) names, an object of servers by name.
//!
//! ```json
//! {
//!   "notes": {
//!     "command": ["python3", "/opt/notes/notes_server.py"],
//!     "env": { "NOTES_FILE": "/var/lib/notes/notes.json" },
//!     "pass_env": ["NOTES_TOKEN"],
//!     "data_class": "editor_content",
//!     "tools": {
//!       "read_note": { "effect": "read_only" },
//!       "preview_set_note": { "effect": "read_only" },
//!       "set_note": { "effect": "idempotent_write", "preview": "preview_set_note" }
//!     }
//!   },
//!   "tickets": {
//!     "url": "https://tickets.internal/mcp",
//!     "data_class": "personal_data",
//!     "trust_annotations": true
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
//!
//! What a tool is — its effect, whether it is enabled by default, its group and data class, its
//! preview — is the operator's word (`tools`, and `group` and `data_class` for the whole
//! server). A server's annotations are suggestions, taken as the operator's word only with
//! `trust_annotations: true`; without a word, a tool is a non-idempotent write, disabled by
//! default, in the group `mcp_<name>`, classed `secret_adjacent`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::time::Duration;

use countersign_core::{DataClass, Effect};
use countersign_remote::{OperatorWord, ToolWord};
use serde::Deserialize;
use serde_json::Value;

use crate::McpError;

/// How long a call may take, all of it, unless the entry says otherwise.
const CALL_TIMEOUT_SECS: u64 = 30;
/// How long a preview may take, all of it, unless the entry says otherwise.
const PREVIEW_TIMEOUT_SECS: u64 = 10;
/// The longest an entry may give a call or a preview.
const MAX_TIMEOUT_SECS: u64 = 3600;

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
    /// The server's annotations (`readOnlyHint`, `idempotentHint`) are taken as the operator's
    /// word where `tools` says nothing else.
    #[serde(default)]
    pub trust_annotations: bool,
    /// The operator's word on single tools, by name.
    #[serde(default)]
    pub tools: BTreeMap<String, McpToolWord>,
    /// Replaced by `tools`: refused, with what to write instead.
    #[serde(default)]
    effects: Option<Value>,
    /// Whether the server's tools are offered to administrators only.
    #[serde(default)]
    pub admin_only: bool,
    /// How long one call may take, all of it (seconds); unset is 30.
    #[serde(default)]
    pub call_timeout_secs: Option<u64>,
    /// How long one preview may take, all of it, retries included (seconds); unset is 10.
    #[serde(default)]
    pub preview_timeout_secs: Option<u64>,
}

/// The operator's word on one MCP tool; each part left out is decided as for the server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolWord {
    pub effect: Option<Effect>,
    /// Offered without the agent enabling it by name.
    pub enabled: Option<bool>,
    pub group: Option<String>,
    pub data_class: Option<DataClass>,
    /// The read-only tool of the same server that previews this one, over the one its `_meta`
    /// names.
    pub preview: Option<String>,
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

    /// The operator's word on the server's tools, as a remote server's is read.
    pub fn word(&self) -> OperatorWord {
        OperatorWord {
            trust_declarations: self.trust_annotations,
            group: self.group.clone(),
            data_class: self.data_class,
            tools: self
                .tools
                .iter()
                .map(|(name, w)| {
                    let word = ToolWord {
                        effect: w.effect,
                        enabled: w.enabled,
                        group: w.group.clone(),
                        data_class: w.data_class,
                    };
                    (name.clone(), word)
                })
                .collect(),
        }
    }

    /// How long one call may take, all of it.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_secs(self.call_timeout_secs.unwrap_or(CALL_TIMEOUT_SECS))
    }

    /// How long one preview may take, all of it.
    pub fn preview_timeout(&self) -> Duration {
        Duration::from_secs(self.preview_timeout_secs.unwrap_or(PREVIEW_TIMEOUT_SECS))
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
        if self.effects.is_some() {
            return Err(bad(
                "`effects` is now `tools`: {\"TOOL\": {\"effect\": \"…\"}} (docs/mcp-tools.md)",
            ));
        }
        self.word().check().map_err(|e| bad(&e))?;
        if let Some(t) = self
            .tools
            .iter()
            .find_map(|(t, w)| w.preview.as_ref().filter(|p| p.is_empty()).map(|_| t))
        {
            return Err(bad(&format!("the `preview` of `{t}` is empty")));
        }
        for (field, secs) in [
            ("call_timeout_secs", self.call_timeout_secs),
            ("preview_timeout_secs", self.preview_timeout_secs),
        ] {
            if secs.is_some_and(|s| s == 0 || s > MAX_TIMEOUT_SECS) {
                return Err(bad(&format!(
                    "`{field}` is not a number of seconds from 1 to {MAX_TIMEOUT_SECS}"
                )));
            }
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
            r#"{"notes": {"command": ["python3", "n.py"],
                          "tools": {"a": {"effect": "read_only", "preview": "p"}}}}"#,
        )
        .unwrap();
        assert_eq!(servers[0].name(), "notes");
        assert_eq!(servers[0].group(), "mcp_notes");
        assert_eq!(servers[0].data_class(), DataClass::SecretAdjacent);
        assert_eq!(servers[0].tools["a"].effect, Some(Effect::ReadOnly));
        assert_eq!(servers[0].tools["a"].preview.as_deref(), Some("p"));
        let word = servers[0].word();
        assert!(
            !word.trust_declarations,
            "annotations are not trusted by default"
        );
        assert_eq!(word.tools["a"].effect, Some(Effect::ReadOnly));
        assert_eq!(servers[0].call_timeout(), Duration::from_secs(30));
        assert_eq!(servers[0].preview_timeout(), Duration::from_secs(10));
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
                r#"{"notes": {"command": ["x"], "tools": {"a": {"effect": "maybe"}}}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"command": ["x"], "effects": {"a": "read_only"}}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"command": ["x"], "tools": {"a": {"colour": "red"}}}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"command": ["x"], "tools": {"a": {"group": "a b"}}}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"command": ["x"], "call_timeout_secs": 0}}"#,
                "bad_configuration",
            ),
            (
                r#"{"notes": {"command": ["x"], "trust_annotations": "yes"}}"#,
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
