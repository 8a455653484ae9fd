//! Which tool servers a deployment uses: `COUNTERSIGN_TOOL_SERVERS` (`name=url,…`), the file
//! `COUNTERSIGN_TOOL_SERVERS_FILE` names (`name url` a line), or both.
//!
//! Every binary reads the same two places, because the worker that runs a call and the
//! coordinator that gates its approval must know the same tools. The file exists so that an
//! operator can add a server with a command (`countersign tools add`) instead of editing the
//! environment of every service; entries are checked when they are added and again when they
//! are read, with the same rules, so a file a command wrote is never one a service refuses.
//! Secrets never go in either place: each server's comes from its own variable.

use std::io::{Read, Write};
use std::path::Path;

use hyper::Uri;

use crate::RemoteError;

/// One configured tool server: a name (`[A-Za-z0-9_-]+`, which also names its secret's
/// variable) and an absolute `http://` or `https://` base URL without credentials, query or
/// fragment. Built only by [`ServerEntry::new`], so every entry is usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    name: String,
    url: String,
}

impl ServerEntry {
    /// Checks `name` and `url`; surrounding whitespace is dropped.
    pub fn new(name: &str, url: &str) -> Result<ServerEntry, RemoteError> {
        let (name, url) = (name.trim(), url.trim());
        let usable = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !usable {
            return Err(RemoteError::InvalidServerName(name.to_owned()));
        }
        base_url(name, url)?;
        Ok(ServerEntry {
            name: name.to_owned(),
            url: url.to_owned(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn url(&self) -> &str {
        &self.url
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

/// Parses `name=url[,name=url…]`; an empty value is no server.
pub fn parse_servers(value: &str) -> Result<Vec<ServerEntry>, RemoteError> {
    let mut servers: Vec<ServerEntry> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, url) = entry
            .split_once('=')
            .ok_or_else(|| RemoteError::BadConfiguration(format!("`{entry}` has no `=`")))?;
        if url.trim().is_empty() {
            return Err(RemoteError::BadConfiguration(format!(
                "`{entry}` is not name=url"
            )));
        }
        push_unique(&mut servers, ServerEntry::new(name, url)?)?;
    }
    Ok(servers)
}

/// Parses a servers file: one `name url` a line, separated by whitespace; blank lines and lines
/// starting with `#` are skipped. An error names the line.
pub fn parse_servers_file(text: &str) -> Result<Vec<ServerEntry>, RemoteError> {
    let mut servers: Vec<ServerEntry> = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, url] = fields[..] else {
            return Err(RemoteError::BadConfiguration(format!(
                "line {number} is not `name url`"
            )));
        };
        let entry = ServerEntry::new(name, url).map_err(|e| match e {
            RemoteError::InvalidUrl(n) => RemoteError::InvalidUrl(format!("{n} (line {number})")),
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
    line.push_str(&format!("{} {}\n", entry.name, entry.url));
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
        add_to_servers_file(&path, &ServerEntry::new("crm", "http://crm:8091").unwrap()).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "# ours\nwiki https://wiki.internal:8443\ncrm http://crm:8091\n"
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
