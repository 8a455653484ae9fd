//! The tools a deployment offers, assembled in one place: the reference content store's (unless
//! its [`ToolSettings`] turn it off), those of the remote tool servers and of the MCP servers
//! they name; and the users they act for: the content store's, or, without it, the table
//! directory `countersign users` keeps.
//!
//! The worker that runs a call, the coordinator that gates its approval (an unknown tool is a
//! non-idempotent write nobody may release), and the API and CLI that show its card must all
//! know the same tools, so every binary builds its registry here. They must also agree on who
//! a user is and who may approve, so every binary takes [`Tools::users`] from here too.
//!
//! What a tool from outside is, is the operator's word on its server (`countersign_remote::decide`)
//! and its listing is pinned in the database ([`StorePins`]): every process holds a server's
//! tools to the facts an operator accepted, and withholds a tool listed otherwise — with a log
//! line, the gauge `countersign_tools_withheld` and, once per change, the event `tool.withheld`
//! — until `countersign tools accept`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use async_trait::async_trait;
use countersign_core::{LocalWriters, ToolRegistry, UserDirectory};
use countersign_remote::{Pins, Registered, Trust};
use countersign_store::{FencedWrite, Listing, Pinned, Store, TableUsers};
use serde_json::Value;

pub use crate::settings::{environment, ContentStore, ToolSettings};

/// The gauge of the tools this process withholds.
pub const WITHHELD_GAUGE: &str = "countersign_tools_withheld";

/// Where a registered tool comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Built into countersign (the reference content store's tools).
    BuiltIn,
    /// Discovered at the remote tool server of this name.
    Server(String),
    /// Listed by the MCP server of this name.
    Mcp(String),
}

/// Every tool of this deployment, with where each comes from, and the users they act for.
#[derive(Debug)]
pub struct Tools {
    pub registry: ToolRegistry,
    /// The registry's writers whose writes land in the store's own database (the content
    /// store's): an approved turn plans and writes them in the store's transaction.
    pub local: LocalWriters<FencedWrite>,
    /// Who a user is and who may approve, as every binary of the deployment must agree.
    pub users: Arc<dyn UserDirectory>,
    pub content_store: ContentStore,
    /// The tools this process withholds from every run.
    pub withholding: Withholding,
    origins: BTreeMap<String, Origin>,
    registered: BTreeMap<String, Registered>,
}

impl Tools {
    /// Where the tool `name` comes from; a name not registered counts as built in.
    pub fn origin(&self, name: &str) -> Origin {
        self.origins.get(name).cloned().unwrap_or(Origin::BuiltIn)
    }

    /// How the tool `name` of a server was registered: what its server declared, who decided
    /// its effect, and whether it was withheld at registration. `None` for a built-in tool.
    pub fn registration(&self, name: &str) -> Option<&Registered> {
        self.registered.get(name)
    }
}

/// The tools a process withholds from every run because their server lists them otherwise
/// than an operator accepted them: each change is logged, and their number is the gauge
/// [`WITHHELD_GAUGE`].
#[derive(Debug, Clone, Default)]
pub struct Withholding(Arc<Mutex<BTreeSet<String>>>);

impl Withholding {
    fn tools(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Withholds `tool` of `server`, or no longer does.
    pub fn set(&self, server: &str, tool: &str, withheld: bool) {
        let changed = if withheld {
            self.tools().insert(tool.to_owned())
        } else {
            self.tools().remove(tool)
        };
        if changed && withheld {
            tracing::warn!(server, tool, "tool withheld from every run: its server lists it otherwise than it was accepted; `countersign tools pending` shows the change, `countersign tools accept` accepts it");
        } else if changed {
            tracing::info!(server, tool, "tool offered again");
        }
        self.publish();
    }

    /// Sets the gauge to the number withheld; call once the metrics recorder is installed.
    pub fn publish(&self) {
        let count = self.tools().len();
        metrics::gauge!(WITHHELD_GAUGE).set(count as f64);
    }

    /// The tools withheld, by name.
    pub fn withheld(&self) -> Vec<String> {
        self.tools().iter().cloned().collect()
    }
}

/// Pins the listings of this process's servers in the store (`tool_identities`), and withholds
/// what differs from what was accepted.
#[derive(Debug, Clone)]
pub struct StorePins {
    store: Store,
    withholding: Withholding,
}

#[async_trait]
impl Pins for StorePins {
    async fn pin(&self, server: &str, tool: &str, facts: &Value) -> Result<bool, String> {
        let identity = countersign_core::tool::identity_of(facts);
        let listing = Listing {
            tool,
            server,
            identity: &identity,
            facts,
        };
        match self.store.pin_tool(listing).await {
            Ok(Pinned::Accepted) => Ok(true),
            Ok(Pinned::Withheld {
                accepted_identity,
                announced,
            }) => {
                if announced {
                    tracing::info!(server, tool, identity = %identity, %accepted_identity, "a changed listing is recorded as the tool's pending change and announced (tool.withheld)");
                }
                Ok(false)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn withholding(&self, server: &str, tool: &str, withheld: bool) {
        self.withholding.set(server, tool, withheld);
    }
}

/// This deployment's tools and users, the content store's writing to `store`, as `settings`
/// say; the secret of each remote server and MCP `url` server from the process
/// [`environment`], and one [`Trust`] for every certificate. With the content store on, its
/// schema must be in `store`'s database: without it this fails at once, naming the fix, rather
/// than at the first call of one of its tools.
pub async fn tools(store: &Store, settings: &ToolSettings) -> anyhow::Result<Tools> {
    let content_store = settings.content_store;
    let mut registry = ToolRegistry::new();
    let mut local = LocalWriters::new();
    let users = users_and_content_tools(store, content_store, &mut registry, &mut local).await?;
    let servers = settings
        .servers()
        .context("reading the tool server settings")?;
    let mcp = settings
        .mcp_servers()
        .context("reading the MCP servers file")?;
    // One set of roots for every server reached over https://, remote or MCP. A deployment
    // with neither never reads the CA file, so a stale setting of it breaks nothing there.
    let reaches_servers = !servers.is_empty() || mcp.iter().any(|m| m.url.is_some());
    let trust = if reaches_servers {
        settings
            .trust()
            .context("loading the tool servers' CA file")?
    } else {
        Trust::new(None)?
    };
    let withholding = Withholding::default();
    let pins = Arc::new(StorePins {
        store: store.clone(),
        withholding: withholding.clone(),
    });
    let servers = if servers.is_empty() {
        Vec::new()
    } else {
        countersign_remote::register_servers(
            &mut registry,
            &servers,
            &trust,
            environment,
            pins.as_ref(),
        )
        .await
        .context("discovering the remote tool servers")?
    };
    let mcp = countersign_mcp::register_servers(&mut registry, mcp, &trust, environment, pins)
        .await
        .context("discovering the MCP servers' tools")?;
    let (origins, registered) = provenance(servers, mcp);
    Ok(Tools {
        registry,
        local,
        users,
        content_store,
        withholding,
        origins,
        registered,
    })
}

/// The users the tools act for: with the content store on, its users, once its schema is
/// found in `store`'s database and its tools and local writers are registered; otherwise the
/// table directory.
async fn users_and_content_tools(
    store: &Store,
    content_store: ContentStore,
    registry: &mut ToolRegistry,
    local: &mut LocalWriters<FencedWrite>,
) -> anyhow::Result<Arc<dyn UserDirectory>> {
    Ok(match content_store {
        ContentStore::On => {
            let installed = countersign_content::is_installed(store.pool())
                .await
                .context("checking for the content store's schema")?;
            anyhow::ensure!(
                installed,
                "the content store is on but its schema is not in the database: run \
                 `countersign migrate --with-content`, or set COUNTERSIGN_CONTENT_STORE=off"
            );
            countersign_content::register(registry, local, store.clone());
            content_users(store)
        }
        ContentStore::Off => Arc::new(TableUsers::new(store.pool().clone())),
    })
}

/// Where each discovered tool comes from and how it was registered, by name: `servers` from
/// the remote tool servers, `mcp` from the MCP servers.
fn provenance(
    servers: Vec<Registered>,
    mcp: Vec<Registered>,
) -> (BTreeMap<String, Origin>, BTreeMap<String, Registered>) {
    let origins = servers
        .iter()
        .map(|r| (r.tool.clone(), Origin::Server(r.server.clone())))
        .chain(
            mcp.iter()
                .map(|r| (r.tool.clone(), Origin::Mcp(r.server.clone()))),
        )
        .collect();
    let registered = servers
        .into_iter()
        .chain(mcp)
        .map(|r| (r.tool.clone(), r))
        .collect();
    (origins, registered)
}

/// The users of the reference content store, in `store`'s database.
pub fn content_users(store: &Store) -> Arc<dyn UserDirectory> {
    Arc::new(countersign_content::ContentUsers::new(store.pool().clone()))
}
