//! The tools a deployment offers, assembled in one place: the reference content store's and
//! those of the remote tool servers `COUNTERSIGN_TOOL_SERVERS` and
//! `COUNTERSIGN_TOOL_SERVERS_FILE` name; and the users they act for.
//!
//! The worker that runs a call, the coordinator that gates its approval (an unknown tool is a
//! non-idempotent write nobody may release), and the API and CLI that show its card must all
//! know the same tools, so every binary builds its registry here. They must also agree on who
//! a user is and who may approve, so every binary takes its [`users`] from here too.

use std::collections::BTreeMap;
use std::sync::Arc;

use countersign_core::{ToolRegistry, UserDirectory};
use countersign_remote::RemoteError;
use countersign_store::Store;

/// Where a registered tool comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Built into countersign (the reference content store's tools).
    BuiltIn,
    /// Discovered at the remote tool server of this name.
    Server(String),
}

/// Every tool of this deployment, with where each comes from.
#[derive(Debug)]
pub struct Tools {
    pub registry: ToolRegistry,
    servers: BTreeMap<String, String>,
}

impl Tools {
    /// Where the tool `name` comes from; a name not registered counts as built in.
    pub fn origin(&self, name: &str) -> Origin {
        self.servers
            .get(name)
            .map_or(Origin::BuiltIn, |server| Origin::Server(server.clone()))
    }
}

/// Every tool of this deployment, the content store's writing to `store`.
pub async fn registry(store: &Store) -> Result<ToolRegistry, RemoteError> {
    Ok(tools(store).await?.registry)
}

/// [`registry`], with where each tool comes from (for `countersign tools`).
pub async fn tools(store: &Store) -> Result<Tools, RemoteError> {
    let mut registry = ToolRegistry::new();
    countersign_content::register(&mut registry, store.clone());
    let servers = countersign_remote::register_from_env(&mut registry)
        .await?
        .into_iter()
        .map(|r| (r.tool, r.server))
        .collect();
    Ok(Tools { registry, servers })
}

/// The users of this deployment — who a user is, who may be a run's acting user, who may
/// approve — as the content store whose tools [`registry`] offers keeps them, in `store`'s
/// database.
pub fn users(store: &Store) -> Arc<dyn UserDirectory> {
    Arc::new(countersign_content::ContentUsers::new(store.pool().clone()))
}
