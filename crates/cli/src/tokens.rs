//! `countersign tokens create|list|revoke`: the credentials of the HTTP API and the web inbox.
//!
//! A token signs in as one user and is gated as the producer `http:<user>`; creating it grants
//! that producer its own user as approver and acting user in the producer registry (see
//! `countersign producers list`). The secret is printed once and stored only as a hash.

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use countersign_api::tokens;
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Issues a token that signs in as USER; prints its secret once.
    Create {
        /// The user the token signs in as (the approver of its decisions, the acting user of
        /// its run requests unless a grant lets it name another).
        #[arg(long = "for", value_name = "USER")]
        user: String,
        /// A note for `tokens list`, e.g. "ci pipeline".
        #[arg(long)]
        label: Option<String>,
        /// Days until it stops working; never when unset.
        #[arg(long, value_name = "DAYS")]
        expires_in_days: Option<u64>,
    },
    /// Lists every token (never a secret).
    List,
    /// Revokes a token at once, and ends the inbox sessions signed in with it.
    Revoke { id: Uuid },
}

pub async fn run(pool: &PgPool, command: TokensCommand) -> anyhow::Result<()> {
    match command {
        TokensCommand::Create {
            user,
            label,
            expires_in_days,
        } => {
            let expires_in = expires_in_days.map(|d| Duration::from_secs(d.saturating_mul(86_400)));
            let issued = tokens::create(pool, &user, label.as_deref(), expires_in)
                .await
                .with_context(|| format!("issuing a token for {user}"))?;
            say!("{}", issued.secret());
            tell!(
                "token {} for {} (producer {}); shown once — store it now{}",
                issued.info.id,
                issued.info.user,
                issued.info.producer(),
                issued
                    .info
                    .expires_at
                    .map(|t| format!("; expires {}", t.to_rfc3339()))
                    .unwrap_or_default()
            );
            Ok(())
        }
        TokensCommand::List => {
            for t in tokens::list(pool).await? {
                let state = match (t.revoked_at, t.expires_at) {
                    (Some(at), _) => format!("revoked {}", at.to_rfc3339()),
                    (None, Some(at)) if at <= chrono::Utc::now() => {
                        format!("expired {}", at.to_rfc3339())
                    }
                    (None, Some(at)) => format!("expires {}", at.to_rfc3339()),
                    (None, None) => "active".to_owned(),
                };
                say_columns!(
                    t.id,
                    t.user,
                    state,
                    format!("created {}", t.created_at.to_rfc3339()),
                    format!(
                        "last used {}",
                        t.last_used_at
                            .map_or_else(|| "never".to_owned(), |at| at.to_rfc3339())
                    ),
                    t.label.unwrap_or_default()
                );
            }
            Ok(())
        }
        TokensCommand::Revoke { id } => {
            anyhow::ensure!(
                tokens::revoke(pool, id).await?,
                "no active token {id} (unknown, or revoked already)"
            );
            say!("token {id} revoked");
            Ok(())
        }
    }
}
