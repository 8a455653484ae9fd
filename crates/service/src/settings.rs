//! The settings more than one binary reads, each as a flag with its environment fallback: the
//! master keys and the tools of the deployment. A binary's `Args` flattens the groups it needs
//! next to [`Connections`](crate::Connections), so its `--help` lists everything it reads;
//! the libraries below take the values, never a variable name.
//!
//! Two kinds of value cannot be flags, because their names are data: the secret of a remote
//! tool server (`COUNTERSIGN_TOOL_SECRET_<NAME>`, for each server the settings name) and the API
//! key an agent's model settings name in `api_key_env`. Both are read from the process
//! environment through [`environment`], which the binaries hand to the libraries that need
//! them (the tool registry, the model catalog) at the moment they are needed.

use std::fmt;
use std::path::{Path, PathBuf};

use countersign_crypto::{Keyring, KeyringError};
use countersign_mcp::{McpError, McpServerEntry};
use countersign_remote::{RemoteError, ServerEntry, Trust};

/// The master keys: `--keys` (or `COUNTERSIGN_KEYS`), else the file `--key-file` (or
/// `COUNTERSIGN_KEY_FILE`) names. The first key seals; all open.
#[derive(Clone, Default, clap::Args)]
pub struct KeySettings {
    /// The keyring: `id:BASE64,id2:BASE64`; the first key seals, all open. Prefer the
    /// variable (or --key-file) to the flag, which other users of the host can read.
    #[arg(long, env = "COUNTERSIGN_KEYS", hide_env_values = true, global = true)]
    pub keys: Option<String>,
    /// A file of keyring entries, one per line (`#` comments), read when --keys is not given.
    #[arg(long, env = "COUNTERSIGN_KEY_FILE", global = true)]
    pub key_file: Option<PathBuf>,
}

impl KeySettings {
    /// The keyring these settings name ([`Keyring::load`]).
    pub fn keyring(&self) -> Result<Keyring, KeyringError> {
        Keyring::load(self.keys.as_deref(), self.key_file.as_deref())
    }
}

/// Never shows a key.
impl fmt::Debug for KeySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeySettings")
            .field("keys", &self.keys.as_ref().map(|_| "…"))
            .field("key_file", &self.key_file)
            .finish()
    }
}

/// What the deployment's tools are: the reference content store's, and those of the remote tool
/// servers named in `--tool-servers` and in the file `--tool-servers-file`.
#[derive(Debug, Clone, clap::Args)]
pub struct ToolSettings {
    /// `on`: the reference content store's tools are offered and its users are the directory
    /// (its schema must be installed: `countersign migrate --with-content`); `off`: remote tools
    /// only, users from `countersign users`.
    #[arg(
        long,
        env = "COUNTERSIGN_CONTENT_STORE",
        value_enum,
        ignore_case = true,
        default_value_t = ContentStore::On,
        global = true
    )]
    pub content_store: ContentStore,
    /// Remote tool servers, `name=http(s)://host:port[ option…][,…]`, the options the
    /// operator's word on their tools (as in the servers file); their tools join the registry.
    #[arg(
        long,
        env = "COUNTERSIGN_TOOL_SERVERS",
        default_value = "",
        global = true
    )]
    pub tool_servers: String,
    /// A file of `name url [option…]` lines (`#` comments) naming more tool servers and the
    /// operator's word on their tools; `countersign tools add` appends to it.
    #[arg(long, env = "COUNTERSIGN_TOOL_SERVERS_FILE", global = true)]
    pub tool_servers_file: Option<PathBuf>,
    /// PEM certificates trusted for `https://` tool servers besides the public roots.
    #[arg(long, env = "COUNTERSIGN_TOOL_SERVERS_CA_FILE", global = true)]
    pub tool_servers_ca_file: Option<PathBuf>,
    /// A JSON file of MCP servers by name (`docs/mcp-tools.md`): each a command started over
    /// stdio or a streamable HTTP `url`, with the operator's word on its tools, which join the
    /// registry.
    #[arg(long, env = "COUNTERSIGN_MCP_SERVERS_FILE", global = true)]
    pub mcp_servers_file: Option<PathBuf>,
}

impl Default for ToolSettings {
    fn default() -> Self {
        ToolSettings {
            content_store: ContentStore::On,
            tool_servers: String::new(),
            tool_servers_file: None,
            tool_servers_ca_file: None,
            mcp_servers_file: None,
        }
    }
}

impl ToolSettings {
    /// The tool servers file, when one is named (an empty name is none).
    pub fn servers_file(&self) -> Option<&Path> {
        self.tool_servers_file
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
    }

    /// The servers of `--tool-servers`, then of the file; a name used twice is refused.
    pub fn servers(&self) -> Result<Vec<ServerEntry>, RemoteError> {
        countersign_remote::servers_from(&self.tool_servers, self.servers_file())
    }

    /// The MCP servers of `--mcp-servers-file`; none without one.
    pub fn mcp_servers(&self) -> Result<Vec<McpServerEntry>, McpError> {
        match self
            .mcp_servers_file
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            Some(path) => countersign_mcp::read_servers_file(path),
            None => Ok(Vec::new()),
        }
    }

    /// The roots a tool server's certificate is verified against.
    pub fn trust(&self) -> Result<Trust, RemoteError> {
        Trust::new(
            self.tool_servers_ca_file
                .as_deref()
                .filter(|p| !p.as_os_str().is_empty()),
        )
    }
}

/// Whether the reference content store is part of this deployment: its tools are offered and
/// its users are the directory. Off, the deployment's tools are its remote ones and its users
/// are the table directory's (`countersign users`); the `content` schema need not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ContentStore {
    #[value(alias = "true", alias = "1", alias = "yes")]
    On,
    #[value(alias = "false", alias = "0", alias = "no")]
    Off,
}

/// A variable of the process environment, for the values whose names are data (see the module
/// documentation); unset, empty or not Unicode is none.
pub fn environment(variable: &str) -> Option<String> {
    std::env::var(variable).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Args {
        #[command(flatten)]
        keys: KeySettings,
        #[command(flatten)]
        tools: ToolSettings,
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("service").chain(args.iter().copied()))
    }

    #[test]
    fn the_content_store_reads_on_and_off_and_refuses_anything_else() {
        let store = |v: &str| parse(&["--content-store", v]).map(|a| a.tools.content_store);
        assert_eq!(store("on").unwrap(), ContentStore::On);
        assert_eq!(store("off").unwrap(), ContentStore::Off);
        assert_eq!(store("false").unwrap(), ContentStore::Off);
        let e = store("maybe").unwrap_err().to_string();
        assert!(e.contains("--content-store") && e.contains("maybe"), "{e}");
    }

    #[test]
    fn keys_are_never_shown() {
        let args = parse(&["--keys", "k1:c2VjcmV0"]).unwrap();
        let shown = format!("{args:?}");
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        assert!(args.keys.keyring().is_err(), "a 6-byte key is refused");
    }

    #[test]
    fn no_servers_named_is_no_server() {
        let args = parse(&[]).unwrap();
        assert!(args.tools.servers().unwrap().is_empty());
        assert_eq!(args.tools.content_store, ContentStore::On);
    }
}
