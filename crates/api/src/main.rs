//! `countersign-api`: the HTTP API (`/v1`) and the web inbox (`/inbox`) in front of the
//! coordinator's gates.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::HeaderName;
use clap::Parser;
use countersign_api::{ApiConfig, AppState};
use countersign_coordinator::Coordinator;
use countersign_queue::Broker;
use countersign_service::relay::{self, RelayConfig};
use countersign_service::{Connections, KeySettings, ToolSettings};
use countersign_store::Store;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[derive(Debug, Parser)]
#[command(
    name = "countersign-api",
    version,
    about = "The HTTP API and the web inbox, on the coordinator's gates."
)]
struct Args {
    #[command(flatten)]
    connections: Connections,
    #[command(flatten)]
    keys: KeySettings,
    #[command(flatten)]
    tools: ToolSettings,
    /// Where to serve /v1 and /inbox.
    #[arg(long, env = "COUNTERSIGN_API_ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The header an authenticating proxy sets to the signed-in user (e.g. X-Forwarded-User);
    /// believed only from --trusted-proxy addresses. Off when unset.
    #[arg(
        long,
        env = "COUNTERSIGN_API_TRUSTED_HEADER",
        requires = "trusted_proxy"
    )]
    trusted_header: Option<HeaderName>,
    /// An address of the authenticating proxy (repeat, or comma-separate, for several).
    #[arg(long, env = "COUNTERSIGN_API_TRUSTED_PROXIES", value_delimiter = ',')]
    trusted_proxy: Vec<IpAddr>,
    /// The producer name proxied requests are gated as.
    #[arg(
        long,
        env = "COUNTERSIGN_API_PROXY_PRODUCER",
        default_value = "http-proxy"
    )]
    proxy_producer: String,
    /// Requests per minute per credential, sustained.
    #[arg(long, env = "COUNTERSIGN_API_RATE_PER_MINUTE", default_value_t = 120)]
    rate_per_minute: u32,
    /// Requests a credential may make at once.
    #[arg(long, env = "COUNTERSIGN_API_RATE_BURST", default_value_t = 30)]
    rate_burst: u32,
    /// Longest a request may take, in seconds.
    #[arg(long, env = "COUNTERSIGN_API_TIMEOUT_SECS", default_value_t = 30)]
    timeout_secs: u64,
    /// Largest request body, in bytes.
    #[arg(long, env = "COUNTERSIGN_API_MAX_BODY_BYTES", default_value_t = 65536)]
    max_body_bytes: usize,
    /// How long an inbox session lasts, in hours.
    #[arg(long, env = "COUNTERSIGN_API_SESSION_HOURS", default_value_t = 12)]
    session_hours: u64,
    /// Do not mark the session cookie Secure: for a plain-HTTP development setup only.
    #[arg(long, env = "COUNTERSIGN_API_INSECURE_COOKIES")]
    insecure_cookies: bool,
    /// The Slack app's signing secret: turns on `POST /slack/interactions` (deciding from
    /// Slack's buttons). Off when unset.
    #[arg(long, env = "COUNTERSIGN_SLACK_SIGNING_SECRET", hide_env_values = true)]
    slack_signing_secret: Option<String>,
    /// The producer decisions from Slack are gated as.
    #[arg(long, env = "COUNTERSIGN_SLACK_PRODUCER", default_value = "slack")]
    slack_producer: String,
    /// The web inbox's address, for the Slack message's link to the card.
    #[arg(long, env = "COUNTERSIGN_INBOX_URL")]
    inbox_url: Option<String>,
    /// PostgreSQL connections at most, shared by the requests being served and the relay.
    #[arg(long, env = "COUNTERSIGN_API_POOL_SIZE", default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..))]
    pool_size: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Bound before the service starts, so that `/readyz` never answers before the API does.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let countersign_service::Service {
        store,
        broker,
        tools,
        shutdown,
        telemetry,
    } = countersign_service::start(
        "countersign-api",
        &args.connections,
        &args.keys,
        &args.tools,
        countersign_service::Pools::of(args.pool_size),
    )
    .await?;
    countersign_api::register_metrics();
    let countersign_service::tools::Tools {
        registry, users, ..
    } = tools;
    let coordinator = Coordinator::with_users(store.clone(), Arc::new(registry), users);
    let addr = args.listen;
    let state = app_state(args, coordinator);

    // The events this process's transactions write leave through its own relay.
    let (stop_relay, relay) = spawn_relay(store, broker);

    tracing::info!(addr = %addr, "serving /v1 and /inbox");
    countersign_api::serve(listener, state, shutdown)
        .await
        .context("serving the API")?;
    let _ = stop_relay.send(());
    let _ = relay.await;
    telemetry.shutdown().await;
    Ok(())
}

/// The API's state over `coordinator`, as `args` configure it: with the Slack interactions
/// when the Slack app's signing secret is set.
fn app_state(args: Args, coordinator: Coordinator) -> AppState {
    let state = AppState::new(
        coordinator,
        ApiConfig {
            trusted_header: args.trusted_header,
            trusted_proxies: args.trusted_proxy,
            proxy_producer: args.proxy_producer,
            rate_per_minute: args.rate_per_minute,
            rate_burst: args.rate_burst,
            request_timeout: Duration::from_secs(args.timeout_secs),
            max_body_bytes: args.max_body_bytes,
            session_ttl: Duration::from_secs(args.session_hours * 3600),
            secure_cookies: !args.insecure_cookies,
        },
    );
    match args.slack_signing_secret {
        Some(secret) => state.with_slack(countersign_api::slack::SlackConfig {
            signing_secret: secret.into(),
            producer: args.slack_producer,
            inbox_url: args.inbox_url,
        }),
        None => state,
    }
}

/// The outbox relay of this process, until the sender it returns is used or dropped.
fn spawn_relay(store: Store, broker: Broker) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop_relay, relay_stopped) = oneshot::channel::<()>();
    let relay = tokio::spawn(relay::run(
        store,
        broker,
        RelayConfig::default(),
        async move {
            let _ = relay_stopped.await;
        },
    ));
    (stop_relay, relay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Args::command().debug_assert();
    }
}
