//! A database of its own for one test, demo or bench run, on the server a URL names.
//!
//! It is created empty (an end-to-end test migrates it through `countersign migrate`, as an
//! operator would) or migrated here with the migrator the caller names. It is dropped when it
//! goes out of scope, except when a test is panicking: then it is left, and named, for whoever
//! looks into the failure; [`Database::keep`] leaves it on purpose. One of the same name left
//! by an earlier run is replaced.

use anyhow::Context;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};

/// A throwaway database; see the module documentation.
#[derive(Debug)]
pub struct Database {
    name: String,
    /// The URL it was made from, naming another database of the same server.
    server_url: String,
    kept: bool,
}

impl Database {
    /// `countersign_TAG_PID` on the server of [`crate::database_url`]; panics when PostgreSQL
    /// does not answer, as a test should.
    pub async fn create(tag: &str) -> Database {
        let name = format!("countersign_{tag}_{}", std::process::id());
        Database::create_on(&crate::database_url(), &name)
            .await
            .unwrap_or_else(|e| panic!("creating the test database {name}: {e:#}"))
    }

    /// The database `name` (letters, digits and underscores) on the server `server_url` names,
    /// created afresh: one of that name is dropped first.
    pub async fn create_on(server_url: &str, name: &str) -> anyhow::Result<Database> {
        anyhow::ensure!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "a database name may hold only letters, digits and underscores: {name:?}"
        );
        let mut conn = PgConnection::connect(server_url)
            .await
            .context("connecting to PostgreSQL")?;
        for sql in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            sqlx::query(&sql).execute(&mut conn).await.context(sql)?;
        }
        Ok(Database {
            name: name.to_owned(),
            server_url: server_url.to_owned(),
            kept: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server URL naming this database instead, its query kept.
    pub fn url(&self) -> String {
        with_database(&self.server_url, &self.name)
    }

    pub fn options(&self) -> anyhow::Result<PgConnectOptions> {
        self.url().parse().context("parsing the database URL")
    }

    /// A connection of the test's own; panics when the database does not answer.
    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url())
            .await
            .expect("the test database answers")
    }

    /// A pool of `connections` on it, with `migrator`'s migrations applied (the engine's and
    /// the content store's together are `countersign_content::WITH_ENGINE`).
    pub async fn migrated(&self, migrator: &Migrator, connections: u32) -> anyhow::Result<PgPool> {
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .connect_with(self.options()?)
            .await
            .context("connecting to the new database")?;
        migrator
            .run(&pool)
            .await
            .context("migrating the new database")?;
        Ok(pool)
    }

    /// Leaves the database in place when this value goes; its name.
    pub fn keep(mut self) -> String {
        self.kept = true;
        self.name.clone()
    }

    /// Drops the database now, closing whatever is still connected to it.
    pub async fn remove(mut self) -> anyhow::Result<()> {
        self.kept = true;
        drop_database(&self.server_url, &self.name).await
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if std::thread::panicking() {
            eprintln!("left the database {} to look into the failure", self.name);
            return;
        }
        // Drop cannot wait for a future: a thread of its own, with a runtime of its own, whatever
        // runtime (if any) this one runs in.
        let (url, name) = (self.server_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(drop_database(&url, &name))
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("the database {} could not be dropped", self.name);
        }
    }
}

async fn drop_database(server_url: &str, name: &str) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect(server_url)
        .await
        .context("connecting to PostgreSQL")?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await
        .with_context(|| format!("dropping the database {name}"))?;
    Ok(())
}

/// `url` naming `database` instead of the database it names (its query kept).
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority = base.find("://").map_or(0, |at| at + 3);
    let server = match base[authority..].find('/') {
        Some(slash) => &base[..authority + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_new_database_and_keeps_the_rest() {
        for (url, expected) in [
            (
                "postgres://postgres@127.0.0.1:5432/postgres",
                "postgres://postgres@127.0.0.1:5432/countersign_demo",
            ),
            (
                "postgres://u:p@db:5432/app?sslmode=disable",
                "postgres://u:p@db:5432/countersign_demo?sslmode=disable",
            ),
            (
                "postgres://127.0.0.1",
                "postgres://127.0.0.1/countersign_demo",
            ),
        ] {
            assert_eq!(with_database(url, "countersign_demo"), expected);
        }
    }
}
