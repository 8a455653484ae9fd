//! What a service that seals and opens starts from, set up in one order for every binary.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context;
use countersign_queue::Broker;
use countersign_store::Store;

use crate::tools::Tools;
use crate::{Connections, KeySettings, Ready, SessionLimits, Telemetry, ToolSettings};

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

/// The PostgreSQL connections a service holds at most.
#[derive(Debug, Clone, Copy)]
pub struct Pools {
    /// The pool's size.
    pub connections: u32,
    /// For a service that runs approved turns, how many of the connections their transactions
    /// hold at most at once (see [`Store::with_turn_limit`]).
    pub turns: Option<u32>,
    /// How long its sessions may wait ([`SessionLimits`]); chosen against the lease.
    pub limits: SessionLimits,
}

impl Pools {
    /// A pool of at most `connections`, with no turns to limit, under the limits chosen against
    /// the default lease.
    pub fn of(connections: u32) -> Pools {
        Pools {
            connections,
            turns: None,
            limits: SessionLimits::default(),
        }
    }
}

/// Starts the service `name`: the shutdown signal first (so a SIGTERM between `/readyz`
/// answering and the first wait stops it rather than kills it), then logs and traces, the
/// keyring (before anything is connected, so a missing one stops it at once), PostgreSQL over
/// the `pools` asked for, the broker with its topology declared or checked,
/// the tools, and last `/metrics`, `/healthz` and `/readyz` when `--http-addr` is given: a
/// service is not reported ready before it has everything it serves with.
pub async fn start(
    name: &'static str,
    connections: &Connections,
    keys: &KeySettings,
    tools: &ToolSettings,
    pools: Pools,
) -> anyhow::Result<Service> {
    let shutdown = Box::pin(crate::shutdown_signal());
    let telemetry = connections
        .init_telemetry(name)
        .context("setting up traces")?;
    let keyring = keys
        .keyring()
        .context("loading the keyring (--keys or --key-file)")?;
    let pool = connections
        .pool(name, pools.connections, &pools.limits)
        .await
        .context("connecting to PostgreSQL")?;
    let probe = connections
        .probe(name, &pools.limits)
        .context("the readiness probe's PostgreSQL address")?;
    let mut store = Store::new(pool, Arc::new(keyring)).with_deadline(pools.limits.call);
    if let Some(turns) = pools.turns {
        store = store
            .with_turn_limit(turns)
            .with_turn_begin(pools.limits.turn_begin());
    }
    let broker = connections
        .broker()
        .await
        .context("connecting to RabbitMQ")?;
    let tools = crate::tools::tools(&store, tools).await?;
    let ready = Arc::new(Ready {
        probe,
        broker: broker.clone(),
        vitals: store.vitals().clone(),
    });
    crate::spawn_surfaces(connections.http_addr, ready)
        .await
        .context("serving the HTTP surfaces")?;
    // The recorder is installed now: the tools withheld at start-up are counted from here on.
    tools.withholding.publish();
    Ok(Service {
        store,
        broker,
        tools,
        shutdown,
        telemetry,
    })
}
