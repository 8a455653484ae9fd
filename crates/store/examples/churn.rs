//! What the hottest tables' churn leaves behind, with autovacuum as the server has it: a program
//! that prints figures, not a test.
//!
//! `cargo run --release -p countersign-store --example churn [-- SECONDS [EVENTS_PER_SECOND]]`
//!
//! In a throwaway database next to the one `DATABASE_URL` names, `RUNNING` runs hold leases that
//! are renewed every half second (a worker's heartbeat, every lease in one statement), while
//! events are announced into the outbox and deleted once "published" (a relay: one `DELETE` of
//! what was confirmed), at `EVENTS_PER_SECOND` (default 200) for `SECONDS` (default 180). Every
//! ten seconds it prints, for `runs` and `event_outbox`: the heap's and the indexes' size, the
//! live and dead rows, the share of updates that were heap-only, and how often autovacuum ran.
//! The server's `autovacuum` and `autovacuum_naptime` are printed first: run it once on a server
//! with autovacuum off (the test machines) and once with it on (a deployment) to compare.

use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_core::{Event, EventName, RunId, TerminationReason};
use countersign_crypto::Keyring;
use countersign_store::{Lease, NewRun, Store, MIGRATOR};
use countersign_testkit::Database;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

/// Runs holding leases, renewed together.
const RUNNING: usize = 200;
const TTL: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(180);
    let per_second: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let name = format!("countersign_churn_{}", std::process::id());
    let db = Database::create_on(&countersign_testkit::database_url(), &name).await?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(db.options()?)
        .await?;
    let result = churn(&pool, Duration::from_secs(seconds), per_second).await;
    pool.close().await;
    db.remove().await?;
    result
}

async fn churn(pool: &PgPool, length: Duration, per_second: u64) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await?;
    let settings: (String, String, String) = sqlx::query_as(
        "SELECT current_setting('server_version'), current_setting('autovacuum'),
                current_setting('autovacuum_naptime')",
    )
    .fetch_one(pool)
    .await?;
    println!(
        "churn: PostgreSQL {}, autovacuum {} (naptime {}); {RUNNING} leases renewed every 0.5 s, {per_second} events/s announced and deleted, for {} s",
        settings.0,
        settings.1,
        settings.2,
        length.as_secs()
    );
    let store = Store::new(pool.clone(), Arc::new(Keyring::ephemeral()));
    let mut leases = Vec::with_capacity(RUNNING);
    for i in 0..RUNNING {
        let created = store
            .create_run(&NewRun {
                request_id: Uuid::now_v7(),
                agent: "churn".into(),
                acting_user: "editor".into(),
                prompt: format!("Run {i}."),
                inputs: None,
            })
            .await?;
        let claim = store
            .claim(created.run_id, "churn", TTL)
            .await?
            .ok_or_else(|| anyhow::anyhow!("claim lost"))?;
        leases.push(claim.lease);
    }
    let started = Instant::now();
    let mut next_report = Duration::ZERO;
    let mut beat = tokio::time::interval(Duration::from_millis(500));
    let per_beat = usize::try_from(per_second / 2).unwrap_or(100);
    while started.elapsed() < length {
        beat.tick().await;
        if started.elapsed() >= next_report {
            report(pool, started.elapsed()).await?;
            next_report += Duration::from_secs(10);
        }
        store.renew_all(&leases, TTL).await?;
        relay(&store, pool, &leases, per_beat).await?;
    }
    report(pool, started.elapsed()).await
}

/// Announces `n` events about the leases' runs, then deletes them, as a relay does once the
/// broker confirmed them.
async fn relay(store: &Store, pool: &PgPool, leases: &[Lease], n: usize) -> anyhow::Result<()> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let run: RunId = leases[i % leases.len()].run_id;
        let event = Event::new(
            EventName::RunCompleted,
            serde_json::json!({"run_id": run, "termination_reason": TerminationReason::Completed.as_str()}),
        );
        ids.push(store.announce(Some(run), &event).await?);
    }
    sqlx::query("DELETE FROM event_outbox WHERE id = ANY($1)")
        .bind(&ids)
        .execute(pool)
        .await?;
    Ok(())
}

/// Prints the sizes and the vacuum state of the two tables.
async fn report(pool: &PgPool, at: Duration) -> anyhow::Result<()> {
    let _ = sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await;
    for table in ["runs", "event_outbox"] {
        let (heap, indexes, live, dead, updated, hot, vacuums): (
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
        ) = sqlx::query_as(
            "SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid), s.n_live_tup,
                        s.n_dead_tup, s.n_tup_upd, s.n_tup_hot_upd,
                        s.autovacuum_count + s.vacuum_count
                 FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
                 WHERE c.oid = $1::regclass",
        )
        .bind(table)
        .fetch_one(pool)
        .await?;
        let hot_share = if updated > 0 {
            format!("{:.0} %", 100.0 * hot as f64 / updated as f64)
        } else {
            "-".to_owned()
        };
        println!(
            "churn: {:>4} s {table:<12} heap {:>8} KiB  indexes {:>8} KiB  live {live:>6}  dead {dead:>7}  heap-only updates {hot_share:>5}  vacuums {vacuums}",
            at.as_secs(),
            heap / 1024,
            indexes / 1024
        );
    }
    Ok(())
}
