//! The tools a deployment offers, assembled in one place: the reference content store's (unless
//! its [`ToolSettings`] turn it off), those of the remote tool servers and of the MCP servers
//! they name; and the users they act for: the content store's, or, without it, the table
//! directory `countersign users` keeps.
//!
//! The worker that runs a call, the coordinator that gates its approval (an unknown tool is a
//! non-idempotent write nobody may release), and the API and CLI that show its card must all
//! know the same tools, so every binary builds its registry here. They must also agree on who
//! a user is and who may approve, so every binary takes [`Tools::users`] from here too.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use countersign_core::{LocalWriters, ToolRegistry, UserDirectory};
use countersign_remote::Trust;
use countersign_store::{FencedWrite, Store, TableUsers};

pub use crate::settings::{environment, ContentStore, ToolSettings};

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
    origins: BTreeMap<String, Origin>,
}

impl Tools {
    /// Where the tool `name` comes from; a name not registered counts as built in.
    pub fn origin(&self, name: &str) -> Origin {
        self.origins.get(name).cloned().unwrap_or(Origin::BuiltIn)
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
    let users: Arc<dyn UserDirectory> = match content_store {
        ContentStore::On => {
            let installed = countersign_content::is_installed(store.pool())
                .await
                .context("checking for the content store's schema")?;
            anyhow::ensure!(
                installed,
                "the content store is on but its schema is not in the database: run \
                 `countersign migrate --with-content`, or set COUNTERSIGN_CONTENT_STORE=off"
            );
            countersign_content::register(&mut registry, &mut local, store.clone());
            content_users(store)
        }
        ContentStore::Off => Arc::new(TableUsers::new(store.pool().clone())),
    };
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
    let servers = if servers.is_empty() {
        Vec::new()
    } else {
        countersign_remote::register_servers(&mut registry, &servers, &trust, environment)
            .await
            .context("discovering the remote tool servers")?
    };
    let mcp = countersign_mcp::register_servers(&mut registry, mcp, &trust, environment)
        .await
        .context("discovering the MCP servers' tools")?;
    let origins = servers
        .into_iter()
        .map(|r| (r.tool, Origin::Server(r.server)))
        .chain(mcp.into_iter().map(|r| (r.tool, Origin::Mcp(r.server))))
        .collect();
    Ok(Tools {
        registry,
        local,
        users,
        content_store,
        origins,
    })
}

/// The users of the reference content store, in `store`'s database.
pub fn content_users(store: &Store) -> Arc<dyn UserDirectory> {
    Arc::new(countersign_content::ContentUsers::new(store.pool().clone()))
}
