//! What a service that seals and opens starts from, set up in one order for every binary.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context;
use countersign_queue::Broker;
use countersign_store::Store;

use crate::tools::Tools;
use crate::{Connections, KeySettings, Ready, Telemetry, ToolSettings};

/// A started service: its store (over a pool of the size asked for), its broker, the
/// deployment's tools and users, the signal that stops it, and its telemetry (shut down last,
/// so the final spans are sent).
pub struct Service {
    pub store: Store,
    pub broker: Broker,
    pub tools: Tools,
    pub shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    pub telemetry: Telemetry,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("store", &self.store)
            .field("broker", &self.broker)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

/// Starts the service `name`: the shutdown signal first (so a SIGTERM between `/readyz`
/// answering and the first wait stops it rather than kills it), then logs and traces, the
/// keyring (before anything is connected, so a missing one stops it at once), PostgreSQL over a
/// pool of at most `pool_size` connections, the broker with its topology declared or checked,
/// the tools, and last `/metrics`, `/healthz` and `/readyz` when `--http-addr` is given: a
/// service is not reported ready before it has everything it serves with.
pub async fn start(
    name: &'static str,
    connections: &Connections,
    keys: &KeySettings,
    tools: &ToolSettings,
    pool_size: u32,
) -> anyhow::Result<Service> {
    let shutdown = Box::pin(crate::shutdown_signal());
    let telemetry = connections
        .init_telemetry(name)
        .context("setting up traces")?;
    let keyring = keys
        .keyring()
        .context("loading the keyring (--keys or --key-file)")?;
    let pool = connections
        .pool(pool_size)
        .await
        .context("connecting to PostgreSQL")?;
    let broker = connections
        .broker()
        .await
        .context("connecting to RabbitMQ")?;
    let store = Store::new(pool.clone(), Arc::new(keyring));
    let tools = crate::tools::tools(&store, tools).await?;
    let ready = Arc::new(Ready {
        pool,
        broker: broker.clone(),
    });
    crate::spawn_surfaces(connections.http_addr, ready)
        .await
        .context("serving the HTTP surfaces")?;
    Ok(Service {
        store,
        broker,
        tools,
        shutdown,
        telemetry,
    })
}
