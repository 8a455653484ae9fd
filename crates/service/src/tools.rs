//! The tools a deployment offers, assembled in one place: the reference content store's and
//! those of the remote tool servers `COUNTERSIGN_TOOL_SERVERS` names.
//!
//! The worker that runs a call, the coordinator that gates its approval (an unknown tool is a
//! non-idempotent write nobody may release), and the API and CLI that show its card must all
//! know the same tools, so every binary builds its registry here.

use countersign_core::ToolRegistry;
use countersign_remote::RemoteError;
use countersign_store::Store;

/// Every tool of this deployment, the content store's writing to `store`.
pub async fn registry(store: &Store) -> Result<ToolRegistry, RemoteError> {
    let mut registry = ToolRegistry::new();
    countersign_content::register(&mut registry, store.clone());
    countersign_remote::register_from_env(&mut registry).await?;
    Ok(registry)
}
