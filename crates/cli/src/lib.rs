//! The `countersign` command line: database migrations, key management, and the demo.
//!
//! It is a thin layer over the library crates: every rule it exercises lives in them. It must
//! never print key material other than a key it was asked to generate, nor a sealed value's
//! plaintext other than what the demo narrates from its own throwaway database.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use countersign_crypto::{KeyId, Keyring};
use countersign_store::Store;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

mod demo;
mod render;

#[derive(Debug, Parser)]
#[command(
    name = "countersign",
    version,
    about = "Agents that propose, humans who countersign."
)]
pub struct Cli {
    /// PostgreSQL, the source of truth.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        global = true
    )]
    pub database_url: String,
    /// Log at debug level.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Applies the database migrations.
    Migrate,
    /// Manages the master keys that seal state at rest.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Runs a scripted agent end to end in a throwaway database, narrating each step.
    Demo {
        /// The database the demo creates (and drops first if it exists).
        #[arg(long, default_value = "countersign_demo")]
        database: String,
        /// Keep the demo database afterwards, to look around with psql.
        #[arg(long)]
        keep: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Prints a new key entry `ID:BASE64` for COUNTERSIGN_KEYS or a key file.
    Generate {
        /// The key id.
        #[arg(long, default_value = "k1")]
        id: String,
    },
    /// Re-seals every stored data key under the active (first) key, in batches.
    Rotate {
        /// Envelopes re-sealed per transaction.
        #[arg(long, default_value_t = 500)]
        batch: i64,
        /// The keyring (else COUNTERSIGN_KEY_FILE / COUNTERSIGN_KEYS).
        #[arg(long, env = "COUNTERSIGN_KEY_FILE")]
        key_file: Option<PathBuf>,
    },
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate => {
            let pool = connect(&cli.database_url).await?;
            countersign_store::MIGRATOR
                .run(&pool)
                .await
                .context("applying migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Command::Keys {
            command: KeysCommand::Generate { id },
        } => {
            let id = KeyId::parse(&id).context("invalid key id")?;
            println!("{}", Keyring::generate_entry(&id));
            Ok(())
        }
        Command::Keys {
            command: KeysCommand::Rotate { batch, key_file },
        } => {
            let keyring = match key_file {
                Some(path) => Keyring::from_file(&path),
                None => Keyring::from_env(),
            }
            .context("loading the keyring")?;
            let store = Store::new(connect(&cli.database_url).await?, Arc::new(keyring));
            let report = store.rotate_keys(batch).await.context("rotating keys")?;
            println!(
                "re-sealed {} data key(s) under key {} in {} batch(es)",
                report.resealed(),
                store.keyring().active_key_id(),
                report.batches
            );
            anyhow::ensure!(
                report.unreadable() == 0,
                "{} envelope(s) could not be opened with this keyring and were left as they are",
                report.unreadable()
            );
            Ok(())
        }
        Command::Demo { database, keep } => demo::run(&cli.database_url, &database, keep).await,
    }
}

pub(crate) async fn connect(url: &str) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await
        .context("connecting to PostgreSQL (DATABASE_URL)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }
}
