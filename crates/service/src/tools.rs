//! The tools a deployment offers, assembled in one place: the reference content store's (unless
//! `COUNTERSIGN_CONTENT_STORE=off`) and those of the remote tool servers
//! `COUNTERSIGN_TOOL_SERVERS` and `COUNTERSIGN_TOOL_SERVERS_FILE` name; and the users they act
//! for: the content store's, or, without it, the table directory `countersign users` keeps.
//!
//! The worker that runs a call, the coordinator that gates its approval (an unknown tool is a
//! non-idempotent write nobody may release), and the API and CLI that show its card must all
//! know the same tools, so every binary builds its registry here. They must also agree on who
//! a user is and who may approve, so every binary takes [`Tools::users`] from here too.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use countersign_core::{LocalWriters, ToolRegistry, UserDirectory};
use countersign_store::{FencedWrite, Store, TableUsers};

/// `COUNTERSIGN_CONTENT_STORE`: whether this deployment runs the reference content store.
pub const CONTENT_STORE_VAR: &str = "COUNTERSIGN_CONTENT_STORE";

/// Whether the reference content store is part of this deployment: its tools are offered and
/// its users are the directory. Off, the deployment's tools are its remote ones and its users
/// are the table directory's ([`TableUsers`]); the `content` schema need not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentStore {
    Enabled,
    Disabled,
}

impl ContentStore {
    /// From [`CONTENT_STORE_VAR`]: `on` (the default when unset) or `off`.
    pub fn from_env() -> anyhow::Result<ContentStore> {
        match std::env::var(CONTENT_STORE_VAR) {
            Err(std::env::VarError::NotPresent) => Ok(ContentStore::Enabled),
            Ok(v) => ContentStore::parse(&v),
            Err(e) => Err(e).context(CONTENT_STORE_VAR),
        }
    }

    fn parse(value: &str) -> anyhow::Result<ContentStore> {
        match value.trim().to_ascii_lowercase().as_str() {
            "on" | "true" | "1" | "yes" => Ok(ContentStore::Enabled),
            "off" | "false" | "0" | "no" => Ok(ContentStore::Disabled),
            other => anyhow::bail!("{CONTENT_STORE_VAR} is {other:?}: expected on or off"),
        }
    }
}

/// Where a registered tool comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Built into countersign (the reference content store's tools).
    BuiltIn,
    /// Discovered at the remote tool server of this name.
    Server(String),
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

/// This deployment's tools and users, the content store's writing to `store`, as
/// [`ContentStore::from_env`] and the tool server settings say. With the content store on, its
/// schema must be in `store`'s database: without it this fails at once, naming the fix, rather
/// than at the first call of one of its tools.
pub async fn tools(store: &Store) -> anyhow::Result<Tools> {
    let content_store = ContentStore::from_env()?;
    let mut registry = ToolRegistry::new();
    let mut local = LocalWriters::new();
    let users: Arc<dyn UserDirectory> = match content_store {
        ContentStore::Enabled => {
            let installed = countersign_content::is_installed(store.pool())
                .await
                .context("checking for the content store's schema")?;
            anyhow::ensure!(
                installed,
                "the content store is on but its schema is not in the database: run \
                 `countersign migrate --with-content`, or set {CONTENT_STORE_VAR}=off"
            );
            countersign_content::register(&mut registry, &mut local, store.clone());
            content_users(store)
        }
        ContentStore::Disabled => Arc::new(TableUsers::new(store.pool().clone())),
    };
    let servers = countersign_remote::register_from_env(&mut registry)
        .await
        .context("discovering the remote tool servers (COUNTERSIGN_TOOL_SERVERS, COUNTERSIGN_TOOL_SERVERS_FILE)")?
        .into_iter()
        .map(|r| (r.tool, r.server))
        .collect();
    Ok(Tools {
        registry,
        local,
        users,
        content_store,
        servers,
    })
}

/// The users of the reference content store, in `store`'s database.
pub fn content_users(store: &Store) -> Arc<dyn UserDirectory> {
    Arc::new(countersign_content::ContentUsers::new(store.pool().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_content_store_setting_reads_on_and_off_and_refuses_anything_else() {
        assert_eq!(ContentStore::parse("on").unwrap(), ContentStore::Enabled);
        assert_eq!(
            ContentStore::parse(" OFF ").unwrap(),
            ContentStore::Disabled
        );
        assert_eq!(
            ContentStore::parse("false").unwrap(),
            ContentStore::Disabled
        );
        let e = ContentStore::parse("maybe").unwrap_err().to_string();
        assert!(
            e.contains("COUNTERSIGN_CONTENT_STORE") && e.contains("maybe"),
            "{e}"
        );
    }
}
