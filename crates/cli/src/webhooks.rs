//! `countersign webhooks add|list|remove|deliveries`: the endpoints that hear of cards.
//!
//! An endpoint receives the events it names, signed as the Standard Webhooks specification
//! says, from the coordinator (`countersign_service::webhooks`). Its secret is printed once,
//! when it is added, and stored sealed.

use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Subcommand;
use countersign_core::EventName;
use countersign_service::webhooks::{check_url, new_secret};
use countersign_service::KeySettings;
use countersign_store::Store;
use sqlx::PgPool;

#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// Adds the endpoint URL; prints its signing secret once.
    Add {
        /// Where deliveries are POSTed: http:// or https://, without credentials.
        url: String,
        /// The events it hears, comma-separated (e.g. run.suspended,run.preview_moved).
        #[arg(long, value_delimiter = ',', required = true)]
        events: Vec<String>,
        /// Only the runs of this agent.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Lists the endpoints (never a secret).
    List,
    /// Removes the endpoint URL and its deliveries.
    Remove { url: String },
    /// The latest deliveries to URL, newest first, with their attempts and outcome.
    Deliveries {
        url: String,
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
}

/// Runs `command` on the database of `pool`; only `add`, which seals a secret, needs the
/// keyring `keys` name.
pub async fn run(pool: PgPool, keys: &KeySettings, command: WebhooksCommand) -> anyhow::Result<()> {
    let store = &match command {
        WebhooksCommand::Add { .. } => {
            let keyring = keys.keyring().context("loading the keyring")?;
            Store::new(pool, Arc::new(keyring))
        }
        _ => crate::ops::store_without_keys(pool),
    };
    match command {
        WebhooksCommand::Add { url, events, agent } => {
            add(store, url.trim(), &events, agent.as_deref()).await
        }
        WebhooksCommand::List => {
            for e in store.webhooks().await? {
                say_columns!(
                    e.url,
                    e.events.join(","),
                    e.agent.as_deref().unwrap_or("every agent"),
                    e.created_at.to_rfc3339()
                );
            }
            Ok(())
        }
        WebhooksCommand::Remove { url } => {
            if !store.remove_webhook(url.trim()).await? {
                bail!("no webhook endpoint {url}");
            }
            say!("webhook endpoint {url} removed, with its deliveries");
            Ok(())
        }
        WebhooksCommand::Deliveries { url, limit } => deliveries(store, url.trim(), limit).await,
    }
}

async fn add(
    store: &Store,
    url: &str,
    events: &[String],
    agent: Option<&str>,
) -> anyhow::Result<()> {
    check_url(url).map_err(|e| anyhow::anyhow!("webhook not added (invalid_url): {e}"))?;
    let events: Vec<String> = events.iter().map(|e| e.trim().to_owned()).collect();
    for event in &events {
        if event.parse::<EventName>().is_err() {
            let known: Vec<&str> = <EventName as strum::VariantArray>::VARIANTS
                .iter()
                .map(|e| e.as_str())
                .collect();
            bail!(
                "webhook not added (unknown_event): {event:?} is none of {}",
                known.join(", ")
            );
        }
    }
    if store.webhooks().await?.iter().any(|e| e.url == url) {
        bail!("webhook not added (duplicate_endpoint): {url} is configured already");
    }
    let secret = new_secret();
    store
        .add_webhook(url, &events, agent, &secret)
        .await
        .context("adding the webhook endpoint")?;
    say!("{secret}");
    tell!(
        "webhook endpoint {url} added for {}{}; its signing secret is shown once — store it now",
        events.join(","),
        agent.map(|a| format!(" of agent {a}")).unwrap_or_default()
    );
    Ok(())
}

async fn deliveries(store: &Store, url: &str, limit: i64) -> anyhow::Result<()> {
    if !store.webhooks().await?.iter().any(|e| e.url == url) {
        bail!("no webhook endpoint {url}");
    }
    for d in store.webhook_deliveries(url, limit.max(1)).await? {
        let last = match (d.last_http_status, d.last_code.as_deref()) {
            (Some(status), _) => format!("HTTP {status}"),
            (None, Some(code)) => code.to_owned(),
            (None, None) => "not attempted yet".to_owned(),
        };
        say_columns!(
            d.created_at.to_rfc3339(),
            d.event_id,
            d.kind,
            d.run_id
                .map(|r| r.to_string())
                .unwrap_or_else(|| "-".into()),
            format!("attempts {}", d.attempts),
            format!("last {last}"),
            d.status
        );
    }
    Ok(())
}
