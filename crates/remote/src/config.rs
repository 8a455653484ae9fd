//! Which tool servers a deployment uses, and the operator's word on their tools:
//! `COUNTERSIGN_TOOL_SERVERS` (`name=url[ option…],…`), the file `COUNTERSIGN_TOOL_SERVERS_FILE`
//! names (`name url [option…]` a line), or both.
//!
//! Every binary reads the same two places, because the worker that runs a call and the
//! coordinator that gates its approval must know the same tools. The file exists so that an
//! operator can add a server with a command (`countersign tools add`) instead of editing the
//! environment of every service; entries are checked when they are added and again when they
//! are read, with the same rules, so a file a command wrote is never one a service refuses.
//! Secrets never go in either place: each server's comes from its own variable.
//!
//! What a server's tools are — their effect, whether they are enabled by default, their group
//! and data class — is the operator's to say ([`OperatorWord`]), never the server's: what a
//! server declares is a suggestion, taken only from a server its entry trusts
//! (`trust_declarations`). Without a word, each of its tools is a non-idempotent write, disabled
//! by default, in the group `remote_<name>`, classed `secret_adjacent` ([`decide`]).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use countersign_core::{DataClass, Effect};
use hyper::Uri;
use serde::Deserialize;

use crate::RemoteError;

/// One configured tool server: a name (`[A-Za-z0-9_-]+`, which also names its secret's
/// variable), an absolute `http://` or `https://` base URL without credentials, query or
/// fragment, and the operator's word on its tools. Built only by [`ServerEntry::new`] and
/// [`ServerEntry::with_options`], so every entry is usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    name: String,
    url: String,
    /// The options as written, each checked: what `tools add` writes back.
    options: Vec<String>,
    word: OperatorWord,
}

impl ServerEntry {
    /// Checks `name` and `url`; surrounding whitespace is dropped. The operator has said nothing
    /// about its tools.
    pub fn new(name: &str, url: &str) -> Result<ServerEntry, RemoteError> {
        Self::with_options(name, url, &[])
    }

    /// As [`new`](Self::new), with the operator's word on the server's tools in `options`
    /// ([`OperatorWord::parse`]).
    pub fn with_options(
        name: &str,
        url: &str,
        options: &[&str],
    ) -> Result<ServerEntry, RemoteError> {
        let (name, url) = (name.trim(), url.trim());
        if !valid_name(name) {
            return Err(RemoteError::InvalidServerName(name.to_owned()));
        }
        let word = OperatorWord::parse(options)
            .map_err(|e| RemoteError::BadConfiguration(format!("server {name}: {e}")))?;
        base_url(name, url)?;
        Ok(ServerEntry {
            name: name.to_owned(),
            url: url.to_owned(),
            options: options.iter().map(|o| o.trim().to_owned()).collect(),
            word,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the operator says of the server's tools.
    pub fn word(&self) -> &OperatorWord {
        &self.word
    }

    /// The options as written.
    pub fn options(&self) -> &[String] {
        &self.options
    }

    /// The group of a tool nobody put elsewhere: `remote_<name>`.
    pub fn default_group(&self) -> String {
        format!("remote_{}", self.name.replace('-', "_"))
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The operator's word on a server's tools: the servers that may declare what their tools are,
/// and what the operator says of some or all of them. What it leaves unsaid fails closed
/// ([`decide`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorWord {
    /// The server's own declarations (a remote server's `effect`, `enabled_by_default`, group
    /// and data classes; an MCP server's annotations) are taken as the operator's word where
    /// the operator says nothing else.
    pub trust_declarations: bool,
    /// The group of every tool of the server the operator does not place one by one.
    pub group: Option<String>,
    /// The data class of every tool of the server the operator does not class one by one.
    pub data_class: Option<DataClass>,
    /// The operator's word on single tools, by name.
    pub tools: BTreeMap<String, ToolWord>,
}

/// The operator's word on one tool; each part left out is decided as for the server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolWord {
    pub effect: Option<Effect>,
    /// Offered without the agent enabling it by name.
    pub enabled: Option<bool>,
    pub group: Option<String>,
    pub data_class: Option<DataClass>,
}

impl OperatorWord {
    /// Reads `options`, each one of: `trust_declarations`, `group=G`, `data_class=C`, and for a
    /// tool T `T.effect=E`, `T.enabled=true|false`, `T.group=G`, `T.data_class=C`. An error
    /// names the option.
    pub fn parse(options: &[&str]) -> Result<OperatorWord, String> {
        let mut word = OperatorWord::default();
        for option in options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
            word.set(option)
                .map_err(|why| format!("option `{option}`: {why}"))?;
        }
        word.check()?;
        Ok(word)
    }

    fn set(&mut self, option: &str) -> Result<(), &'static str> {
        if option == "trust_declarations" {
            self.trust_declarations = true;
            return Ok(());
        }
        let (key, value) = option
            .split_once('=')
            .ok_or("not `trust_declarations` nor `key=value`")?;
        let group = || {
            valid_name(value)
                .then(|| value.to_owned())
                .ok_or("a group is [A-Za-z0-9_-]+")
        };
        match key.split_once('.') {
            None => match key {
                "group" => self.group = Some(group()?),
                "data_class" => self.data_class = Some(class(value)?),
                _ => return Err("the key is none of group, data_class, TOOL.…"),
            },
            Some((tool, _)) if !valid_name(tool) => return Err("not a tool name before `.`"),
            Some((tool, part)) => {
                let word = self.tools.entry(tool.to_owned()).or_default();
                match part {
                    "effect" => {
                        word.effect = Some(value.parse().map_err(|_| {
                            "not read_only, idempotent_write nor non_idempotent_write"
                        })?);
                    }
                    "enabled" => {
                        word.enabled = Some(value.parse().map_err(|_| "not true nor false")?);
                    }
                    "group" => word.group = Some(group()?),
                    "data_class" => word.data_class = Some(class(value)?),
                    _ => return Err("a tool's key is one of effect, enabled, group, data_class"),
                }
            }
        }
        Ok(())
    }

    /// Every group named is usable and every tool named is a possible tool name.
    pub fn check(&self) -> Result<(), String> {
        let groups = self
            .tools
            .values()
            .filter_map(|w| w.group.as_deref())
            .chain(self.group.as_deref());
        if let Some(bad) = groups.into_iter().find(|g| !valid_name(g)) {
            return Err(format!("the group `{bad}` is not [A-Za-z0-9_-]+"));
        }
        if let Some(bad) = self.tools.keys().find(|t| !valid_name(t)) {
            return Err(format!("`{bad}` is not a tool name"));
        }
        Ok(())
    }
}

fn class(value: &str) -> Result<DataClass, &'static str> {
    value
        .parse()
        .map_err(|_| "not public, editor_content, personal_data nor secret_adjacent")
}

/// What a server declares about a tool; `None` where it declares nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    pub effect: Option<Effect>,
    pub enabled_by_default: Option<bool>,
    pub group: Option<String>,
    pub data_class: Option<DataClass>,
}

/// Who decided a tool's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The operator, for this tool.
    Operator,
    /// The server, whose declarations the operator trusts.
    TrustedServer,
    /// Nobody: the fail-closed default, a non-idempotent write.
    Default,
}

impl DecidedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Operator => "the operator",
            DecidedBy::TrustedServer => "the server (trusted)",
            DecidedBy::Default => "nobody (fail closed)",
        }
    }
}

/// A tool's effect, default enablement, group and data class, as decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub effect: Effect,
    pub enabled_by_default: bool,
    pub group: String,
    pub data_class: DataClass,
    pub effect_by: DecidedBy,
}

/// What `tool` of a server is, from the operator's `word` and what the server `declared`. Each
/// fact comes from the operator's word on the tool, else the operator's word on the server
/// (group, class), else — only from a server whose declarations the operator trusts — the
/// declaration, else the fail-closed default: a non-idempotent write, in `default_group`,
/// classed [`DataClass::FAIL_CLOSED`]. A write is enabled by default only when the operator says
/// so for the tool; a read is, unless a word or a trusted declaration says otherwise.
pub fn decide(
    word: &OperatorWord,
    tool: &str,
    declared: &Declared,
    default_group: String,
) -> Decided {
    let own = word.tools.get(tool);
    let trusted = word.trust_declarations.then_some(declared);
    let (effect, effect_by) = match (own.and_then(|w| w.effect), trusted.and_then(|d| d.effect)) {
        (Some(effect), _) => (effect, DecidedBy::Operator),
        (None, Some(effect)) => (effect, DecidedBy::TrustedServer),
        (None, None) => (Effect::NonIdempotentWrite, DecidedBy::Default),
    };
    let declared_enabled = trusted.and_then(|d| d.enabled_by_default).unwrap_or(true);
    let enabled_by_default = own
        .and_then(|w| w.enabled)
        .unwrap_or(!effect.is_write() && declared_enabled);
    let group = own
        .and_then(|w| w.group.clone())
        .or_else(|| word.group.clone())
        .or_else(|| trusted.and_then(|d| d.group.clone()))
        .unwrap_or(default_group);
    let data_class = own
        .and_then(|w| w.data_class)
        .or(word.data_class)
        .or_else(|| trusted.and_then(|d| d.data_class))
        .unwrap_or(DataClass::FAIL_CLOSED);
    Decided {
        effect,
        enabled_by_default,
        group,
        data_class,
        effect_by,
    }
}

/// The base URL requests to server `name` are made under: `url` without trailing slashes,
/// refused unless it is an absolute `http://` or `https://` URL without credentials, query or
/// fragment.
pub(crate) fn base_url(name: &str, url: &str) -> Result<String, RemoteError> {
    let base = url.trim().trim_end_matches('/');
    let invalid = || RemoteError::InvalidUrl(name.to_owned());
    if base.contains('#') {
        return Err(invalid());
    }
    let uri: Uri = base.parse().map_err(|_| invalid())?;
    let scheme = matches!(uri.scheme_str(), Some("http" | "https"));
    let authority = uri
        .authority()
        .is_some_and(|a| !a.as_str().contains('@') && !a.host().is_empty());
    if !scheme || !authority || uri.query().is_some() {
        return Err(invalid());
    }
    Ok(base.to_owned())
}

/// The variable holding the secret of the server called `name`: `COUNTERSIGN_TOOL_SECRET_<NAME>`.
pub fn secret_variable(name: &str) -> String {
    format!(
        "COUNTERSIGN_TOOL_SECRET_{}",
        name.to_ascii_uppercase().replace('-', "_")
    )
}

/// Parses `name=url[ option…][,name=url[ option…]…]` (the options as in a servers file); an
/// empty value is no server.
pub fn parse_servers(value: &str) -> Result<Vec<ServerEntry>, RemoteError> {
    let mut servers: Vec<ServerEntry> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, rest) = entry
            .split_once('=')
            .ok_or_else(|| RemoteError::BadConfiguration(format!("`{entry}` has no `=`")))?;
        let mut fields = rest.split_whitespace();
        let Some(url) = fields.next() else {
            return Err(RemoteError::BadConfiguration(format!(
                "`{entry}` is not name=url"
            )));
        };
        let options: Vec<&str> = fields.collect();
        push_unique(
            &mut servers,
            ServerEntry::with_options(name, url, &options)?,
        )?;
    }
    Ok(servers)
}

/// Parses a servers file: one `name url [option…]` a line, separated by whitespace; blank lines
/// and lines starting with `#` are skipped. An error names the line.
pub fn parse_servers_file(text: &str) -> Result<Vec<ServerEntry>, RemoteError> {
    let mut servers: Vec<ServerEntry> = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, url, ref options @ ..] = fields[..] else {
            return Err(RemoteError::BadConfiguration(format!(
                "line {number} is not `name url [option…]`"
            )));
        };
        let entry = ServerEntry::with_options(name, url, options).map_err(|e| match e {
            RemoteError::InvalidUrl(n) => RemoteError::InvalidUrl(format!("{n} (line {number})")),
            RemoteError::BadConfiguration(why) => {
                RemoteError::BadConfiguration(format!("line {number}: {why}"))
            }
            other => other,
        })?;
        push_unique(&mut servers, entry)?;
    }
    Ok(servers)
}

fn push_unique(servers: &mut Vec<ServerEntry>, entry: ServerEntry) -> Result<(), RemoteError> {
    if servers.iter().any(|s| s.name == entry.name) {
        return Err(RemoteError::DuplicateServer(entry.name));
    }
    servers.push(entry);
    Ok(())
}

/// The servers of the file at `path`.
pub fn read_servers_file(path: &Path) -> Result<Vec<ServerEntry>, RemoteError> {
    let text = std::fs::read_to_string(path).map_err(|e| file_error(path, &e))?;
    parse_servers_file(&text).map_err(|e| in_file(path, e))
}

/// The servers of the list `list` (`name=url[,name=url…]`) and then of the file `file`; a name
/// used in both is refused.
pub fn servers_from(list: &str, file: Option<&Path>) -> Result<Vec<ServerEntry>, RemoteError> {
    let mut servers = parse_servers(list)?;
    if let Some(path) = file {
        for entry in read_servers_file(path)? {
            push_unique(&mut servers, entry)?;
        }
    }
    Ok(servers)
}

/// Appends `entry` to the servers file at `path`, creating the file when it does not exist.
/// Refused, and the file left as it was, when the file is not a servers file or already names
/// a server called so ([`RemoteError::DuplicateServer`]). Holds an exclusive lock on the file
/// while it reads and appends, so two commands adding at once do not add the same name twice.
pub fn add_to_servers_file(path: &Path, entry: &ServerEntry) -> Result<(), RemoteError> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| file_error(path, &e))?;
    file.lock().map_err(|e| file_error(path, &e))?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| file_error(path, &e))?;
    let mut servers = parse_servers_file(&text).map_err(|e| in_file(path, e))?;
    push_unique(&mut servers, entry.clone())?;
    let mut line = String::new();
    if !text.is_empty() && !text.ends_with('\n') {
        line.push('\n');
    }
    line.push_str(&entry.name);
    for field in std::iter::once(&entry.url).chain(&entry.options) {
        line.push(' ');
        line.push_str(field);
    }
    line.push('\n');
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| file_error(path, &e))
}

fn file_error(path: &Path, e: &std::io::Error) -> RemoteError {
    RemoteError::ServersFile {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// A format error of the file at `path`, saying which file.
fn in_file(path: &Path, e: RemoteError) -> RemoteError {
    match e {
        RemoteError::BadConfiguration(reason) => {
            RemoteError::BadConfiguration(format!("{}: {reason}", path.display()))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(servers: &[ServerEntry]) -> Vec<(&str, &str)> {
        servers.iter().map(|s| (s.name(), s.url())).collect()
    }

    #[test]
    fn a_server_list_is_parsed_into_names_and_urls() {
        let servers = parse_servers(" wiki=http://127.0.0.1:1/ , crm=https://h:2").unwrap();
        assert_eq!(
            pairs(&servers),
            vec![("wiki", "http://127.0.0.1:1/"), ("crm", "https://h:2")]
        );
        assert!(parse_servers("").unwrap().is_empty());
    }

    #[test]
    fn a_server_list_entry_without_a_name_or_named_twice_is_refused() {
        assert_eq!(
            parse_servers("http://h:1").unwrap_err().code(),
            "bad_configuration"
        );
        assert_eq!(
            parse_servers("=http://h:1").unwrap_err().code(),
            "invalid_server_name"
        );
        assert_eq!(
            parse_servers("a=http://h:1,a=http://h:2")
                .unwrap_err()
                .code(),
            "duplicate_server"
        );
        assert_eq!(
            parse_servers("a=ftp://h:1").unwrap_err().code(),
            "invalid_url"
        );
    }

    #[test]
    fn the_secret_variable_is_named_after_the_server() {
        assert_eq!(
            secret_variable("my-wiki"),
            "COUNTERSIGN_TOOL_SECRET_MY_WIKI"
        );
    }

    #[test]
    fn a_base_url_is_http_or_https_without_credentials_query_or_fragment() {
        for url in ["http://h:1", "https://h:1/", "https://wiki.internal/api/"] {
            assert!(base_url("x", url).is_ok(), "{url}");
        }
        assert_eq!(base_url("x", "https://h:1//").unwrap(), "https://h:1");
        for url in [
            "http://u:p@h:1",
            "https://u@h:1",
            "ftp://h:1",
            "h:1",
            "/tools",
            "https://h:1/?a=b",
            "https://h:1/#x",
            "",
        ] {
            assert!(base_url("x", url).is_err(), "{url}");
        }
    }

    #[test]
    fn a_servers_file_has_one_name_and_url_a_line_with_comments_and_blank_lines() {
        let text = "# the wiki\nwiki   https://wiki.internal:8443\n\n  crm\thttp://crm:8091/  \n";
        assert_eq!(
            pairs(&parse_servers_file(text).unwrap()),
            vec![
                ("wiki", "https://wiki.internal:8443"),
                ("crm", "http://crm:8091/")
            ]
        );
        for (text, code, says) in [
            ("wiki\n", "bad_configuration", "line 1"),
            (
                "# c\nwiki http://h:1 extra\n",
                "bad_configuration",
                "line 2",
            ),
            (
                "wiki http://h:1\nwiki http://h:2\n",
                "duplicate_server",
                "wiki",
            ),
            ("wiki http://u:p@h:1\n", "invalid_url", "line 1"),
            ("wi/ki http://h:1\n", "invalid_server_name", "wi/ki"),
        ] {
            let e = parse_servers_file(text).unwrap_err();
            assert_eq!(e.code(), code, "{text:?}");
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn an_entry_carries_the_operators_word_on_its_server_and_its_tools() {
        let servers = parse_servers_file(
            "wiki http://h:1 trust_declarations data_class=editor_content \
             set_page.effect=idempotent_write set_page.enabled=true lookup.group=pages\n",
        )
        .unwrap();
        let word = servers[0].word();
        assert!(word.trust_declarations);
        assert_eq!(word.data_class, Some(DataClass::EditorContent));
        assert_eq!(word.group, None);
        assert_eq!(
            word.tools["set_page"],
            ToolWord {
                effect: Some(Effect::IdempotentWrite),
                enabled: Some(true),
                ..ToolWord::default()
            }
        );
        assert_eq!(word.tools["lookup"].group.as_deref(), Some("pages"));
        let listed = parse_servers("wiki=http://h:1 group=wiki lookup.effect=read_only").unwrap();
        assert_eq!(listed[0].word().group.as_deref(), Some("wiki"));
        assert_eq!(
            listed[0].word().tools["lookup"].effect,
            Some(Effect::ReadOnly)
        );
        assert_eq!(listed[0].default_group(), "remote_wiki");
    }

    #[test]
    fn an_option_that_is_not_the_operators_word_is_refused_by_name() {
        for option in [
            "trust",
            "colour=red",
            "data_class=secret",
            "t.effect=maybe",
            "t.enabled=yes",
            "t.size=1",
            "group=a/b",
            "group=",
        ] {
            let e = ServerEntry::with_options("wiki", "http://h:1", &[option]).unwrap_err();
            assert_eq!(e.code(), "bad_configuration", "{option}");
            assert!(e.to_string().contains(option), "{option}: {e}");
        }
    }

    fn declared() -> Declared {
        Declared {
            effect: Some(Effect::ReadOnly),
            enabled_by_default: Some(true),
            group: Some("content".into()),
            data_class: Some(DataClass::Public),
        }
    }

    #[test]
    fn without_the_operators_word_a_tool_is_a_disabled_non_idempotent_write_of_its_own_group_and_secret(
    ) {
        let d = decide(
            &OperatorWord::default(),
            "t",
            &declared(),
            "remote_x".into(),
        );
        assert_eq!(
            d,
            Decided {
                effect: Effect::NonIdempotentWrite,
                enabled_by_default: false,
                group: "remote_x".into(),
                data_class: DataClass::SecretAdjacent,
                effect_by: DecidedBy::Default,
            }
        );
    }

    #[test]
    fn a_trusted_servers_declarations_are_taken_but_never_enable_a_write() {
        let trusting = OperatorWord {
            trust_declarations: true,
            ..OperatorWord::default()
        };
        let d = decide(&trusting, "t", &declared(), "remote_x".into());
        assert_eq!(
            (
                d.effect,
                d.enabled_by_default,
                d.group.as_str(),
                d.data_class,
                d.effect_by
            ),
            (
                Effect::ReadOnly,
                true,
                "content",
                DataClass::Public,
                DecidedBy::TrustedServer
            )
        );
        let mut writer = declared();
        writer.effect = Some(Effect::NonIdempotentWrite);
        assert!(!decide(&trusting, "t", &writer, "g".into()).enabled_by_default);
    }

    #[test]
    fn the_operators_word_on_a_tool_wins_over_the_server_and_its_declarations() {
        let word = OperatorWord::parse(&[
            "trust_declarations",
            "group=wiki",
            "data_class=personal_data",
            "t.effect=idempotent_write",
            "t.enabled=true",
            "t.data_class=editor_content",
        ])
        .unwrap();
        let d = decide(&word, "t", &declared(), "remote_x".into());
        assert_eq!(
            (
                d.effect,
                d.enabled_by_default,
                d.group.as_str(),
                d.data_class,
                d.effect_by
            ),
            (
                Effect::IdempotentWrite,
                true,
                "wiki",
                DataClass::EditorContent,
                DecidedBy::Operator
            )
        );
        let untrusted = OperatorWord::parse(&["t.effect=read_only"]).unwrap();
        let d = decide(&untrusted, "t", &declared(), "remote_x".into());
        assert_eq!(
            (
                d.effect,
                d.enabled_by_default,
                d.group.as_str(),
                d.data_class
            ),
            (
                Effect::ReadOnly,
                true,
                "remote_x",
                DataClass::SecretAdjacent
            ),
            "a read by the operator's word is enabled; the rest stays closed"
        );
    }

    fn temp_file(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "countersign-servers-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ))
    }

    #[test]
    fn an_added_server_is_appended_and_read_back_and_a_second_of_the_same_name_is_refused() {
        let path = temp_file("add");
        let wiki = ServerEntry::new("wiki", "https://wiki.internal:8443").unwrap();
        add_to_servers_file(&path, &wiki).unwrap();
        // A line a person wrote without a final newline stays a line of its own.
        std::fs::write(&path, "# ours\nwiki https://wiki.internal:8443").unwrap();
        let crm = ServerEntry::with_options(
            "crm",
            "http://crm:8091",
            &["trust_declarations", "t.enabled=false"],
        )
        .unwrap();
        add_to_servers_file(&path, &crm).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "# ours\nwiki https://wiki.internal:8443\ncrm http://crm:8091 trust_declarations t.enabled=false\n"
        );
        let again = add_to_servers_file(&path, &ServerEntry::new("wiki", "http://h:1").unwrap());
        assert_eq!(again.unwrap_err().code(), "duplicate_server");
        assert_eq!(
            pairs(&read_servers_file(&path).unwrap()),
            vec![
                ("wiki", "https://wiki.internal:8443"),
                ("crm", "http://crm:8091")
            ]
        );
        assert_eq!(
            read_servers_file(&path).unwrap()[1],
            crm,
            "read back with its word"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn nothing_is_appended_to_a_file_that_is_not_a_servers_file() {
        let path = temp_file("bad");
        std::fs::write(&path, "this is not a servers file\n").unwrap();
        let e = add_to_servers_file(&path, &ServerEntry::new("wiki", "http://h:1").unwrap())
            .unwrap_err();
        assert_eq!(e.code(), "bad_configuration");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "this is not a servers file\n"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_list_and_the_file_are_read_together_and_a_name_in_both_is_refused() {
        let path = temp_file("both");
        std::fs::write(&path, "crm http://crm:8091\n").unwrap();
        let servers = servers_from("wiki=http://wiki:8090", Some(&path)).unwrap();
        assert_eq!(
            pairs(&servers),
            vec![("wiki", "http://wiki:8090"), ("crm", "http://crm:8091")]
        );
        let e = servers_from("crm=http://other:1", Some(&path)).unwrap_err();
        assert_eq!(e.code(), "duplicate_server");
        std::fs::remove_file(&path).unwrap();
        let e = servers_from("", Some(&path)).unwrap_err();
        assert_eq!(
            e.code(),
            "servers_file_unreadable",
            "a file named must exist"
        );
    }
}
