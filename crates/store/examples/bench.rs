//! What the store costs on this machine: a program that prints figures, not a test.
//!
//! `cargo run --release -p countersign-store --example bench`
//!
//! It creates a throwaway database next to the one `DATABASE_URL` names (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), migrates it, measures for a bounded time
//! and drops it again. Figures:
//!
//! - claims/s: `queued` → `running` on distinct runs, 1 and 4 claimers;
//! - lifecycle sequences/s: claim → suspend → decide → claim → settle, with 1, 4 and 16
//!   concurrent connections;
//! - the same machine's baseline: single-row `UPDATE … WHERE id` commits/s at the same
//!   concurrency, and how many of those one sequence costs;
//! - seal and open throughput for a 64 KiB state.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use countersign_core::{
    CallIndex, CallPreview, DecisionMessage, Message, PendingCall, RunId, SuspendedRunState,
    SuspensionSeq, TokenUsage,
};
use countersign_crypto::{Keyring, Purpose};
use countersign_store::{
    DecisionOutcome, DecisionRecord, NewDecision, RunCounters, Settlement, Store,
    TerminationReason, MIGRATOR,
};
use countersign_testkit::Database;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

/// How long each figure is measured for.
const WINDOW: Duration = Duration::from_secs(4);
const TTL: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let name = format!("countersign_bench_{}", std::process::id());
    let db = Database::create_on(&countersign_testkit::database_url(), &name).await?;
    let mut conn = db.connect().await;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    println!(
        "countersign-store bench: PostgreSQL {version}, {} cores, window {}s per figure",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        WINDOW.as_secs()
    );
    let result = run(db.options()?).await;
    db.remove().await?;
    result
}

async fn run(options: PgConnectOptions) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await?;
    MIGRATOR.run(&pool).await?;
    let keyring = Keyring::ephemeral();
    let store = Store::new(pool.clone(), Arc::new(keyring));

    for claimers in [1, 4] {
        let runs = create_runs(&store, 20_000).await?;
        let rate = measure(
            claimers,
            runs,
            |store, run| async move {
                store
                    .claim(run, "bench", TTL)
                    .await?
                    .context("claim lost")?;
                Ok(())
            },
            &store,
        )
        .await?;
        println!("claims/s, {claimers:>2} claimer(s):                    {rate:>9.0}");
    }

    println!(
        "lifecycle state: {} bytes of JSON, sealed at every suspend",
        suspended_state().to_bytes().len()
    );
    for connections in [1, 4, 16] {
        let runs = create_runs(&store, 6_000).await?;
        let sequences = measure(connections, runs, lifecycle, &store).await?;
        let baseline = baseline(&pool, connections).await?;
        println!(
            "claim→suspend→decide→claim→settle/s, {connections:>2} conn: {sequences:>9.0}   \
             baseline UPDATE commits/s: {baseline:>7.0}   ratio: {:.1} commits per sequence",
            baseline / sequences
        );
    }

    seal_open(store.keyring());
    Ok(())
}

/// Queued runs inserted in bulk, each with its prompt sealed as `create_run` would.
async fn create_runs(store: &Store, n: usize) -> anyhow::Result<Vec<RunId>> {
    let ids: Vec<RunId> = (0..n).map(|_| RunId::new()).collect();
    let requests = ids
        .iter()
        .map(|id| {
            store.keyring().seal(
                Purpose::Request,
                *id,
                b"Tighten the description of page 12.",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let uuids: Vec<Uuid> = ids.iter().map(RunId::as_uuid).collect();
    let request_ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
    sqlx::query(
        "INSERT INTO runs (id, request_id, agent, acting_user, status, segment, request)
         SELECT id, request_id, 'bench', 'editor', 'queued', 'start', request
         FROM unnest($1::uuid[], $2::uuid[], $3::bytea[]) AS t(id, request_id, request)",
    )
    .bind(&uuids)
    .bind(&request_ids)
    .bind(&requests)
    .execute(store.pool())
    .await?;
    Ok(ids)
}

/// Runs `op` on distinct runs from `concurrency` tasks for [`WINDOW`] (or until the runs are
/// used up) and returns operations per second.
async fn measure<F, Fut>(
    concurrency: usize,
    runs: Vec<RunId>,
    op: F,
    store: &Store,
) -> anyhow::Result<f64>
where
    F: Fn(Store, RunId) -> Fut + Send + Sync + Copy + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let runs = Arc::new(runs);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + WINDOW;
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (runs, next, store) = (runs.clone(), next.clone(), store.clone());
            tokio::spawn(async move {
                let mut done = 0_u64;
                while Instant::now() < deadline {
                    let Some(run) = runs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        break;
                    };
                    op(store.clone(), *run).await?;
                    done += 1;
                }
                anyhow::Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// One run through the whole lifecycle a written turn takes.
async fn lifecycle(store: Store, run: RunId) -> anyhow::Result<()> {
    let lease = store
        .claim(run, "bench", TTL)
        .await?
        .context("claim lost")?
        .lease;
    let state = suspended_state();
    anyhow::ensure!(store.suspend(&lease, &state, &[]).await?, "suspend lost");
    let decision = NewDecision {
        message: DecisionMessage {
            decision_id: Uuid::now_v7(),
            run_id: run,
            suspension_seq: state.suspension_seq,
            turn_digest: state.turn_digest(),
            approved: true,
            calls: vec![],
            edits: vec![],
            approver: "alice".into(),
            comment: None,
        },
        outcome: DecisionOutcome::Accepted,
        in_trail: true,
    };
    anyhow::ensure!(
        store.record_decision(&decision).await?
            == DecisionRecord::Recorded(DecisionOutcome::Accepted),
        "decision lost"
    );
    let lease = store
        .claim(run, "bench", TTL)
        .await?
        .context("resume claim lost")?
        .lease;
    let done = Settlement::completed(TerminationReason::Completed, RunCounters::default());
    anyhow::ensure!(store.settle(&lease, &done).await?, "settle lost");
    Ok(())
}

fn suspended_state() -> SuspendedRunState {
    SuspendedRunState {
        transcript: vec![
            Message::user("Tighten the description of page 12."),
            Message::assistant("", vec![]),
        ],
        pending_calls: vec![PendingCall {
            id: "c1".into(),
            tool: "update_page_metadata".into(),
            arguments: serde_json::json!({"uid": 12, "description": "A tighter description."}),
        }],
        iterations: 1,
        tokens: TokenUsage {
            prompt: 900,
            completion: 60,
        },
        offered_tools: vec!["read_page".into(), "update_page_metadata".into()],
        model_options: Default::default(),
        call_previews: vec![CallPreview {
            index: CallIndex::new(0),
            tool: "update_page_metadata".into(),
            lines: vec!["field description: \"Old\" → \"A tighter description.\"".into()],
            failed: false,
            forms: vec![],
            alone: false,
            full: vec![],
        }],
        stale_call_indexes: vec![],
        landed_calls: vec![],
        tool_identities: vec![],
        excluded_calls: vec![],
        edits: vec![],
        suspension_seq: SuspensionSeq::FIRST,
        captured_at: "2026-11-30T10:00:00Z".into(),
    }
}

/// Single-row `UPDATE … WHERE id` commits/s, each connection on its own row: what one
/// round trip and one commit cost here, without contention.
async fn baseline(pool: &PgPool, connections: usize) -> anyhow::Result<f64> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_baseline (id int PRIMARY KEY, n bigint NOT NULL)",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO bench_baseline SELECT g, 0 FROM generate_series(1, 16) g ON CONFLICT DO NOTHING",
    )
    .execute(pool)
    .await?;
    let started = Instant::now();
    let deadline = started + WINDOW;
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut conn: sqlx::pool::PoolConnection<sqlx::Postgres> = pool.acquire().await?;
                let conn: &mut PgConnection = &mut conn;
                let mut done = 0_u64;
                while Instant::now() < deadline {
                    sqlx::query("UPDATE bench_baseline SET n = n + 1 WHERE id = $1")
                        .bind(i as i32 + 1)
                        .execute(&mut *conn)
                        .await?;
                    done += 1;
                }
                anyhow::Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Seal and open of a 64 KiB state, on one core.
fn seal_open(keyring: &Keyring) {
    const SIZE: usize = 64 * 1024;
    let run = RunId::new();
    let plain: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let window = WINDOW / 2;

    let started = Instant::now();
    let mut sealed = Vec::new();
    let mut n = 0_u64;
    while started.elapsed() < window {
        sealed = keyring
            .seal(Purpose::State, run, &plain)
            .expect("seal 64 KiB");
        n += 1;
    }
    let seals = n as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut n = 0_u64;
    while started.elapsed() < window {
        let opened = keyring
            .open(Purpose::State, run, &sealed)
            .expect("open 64 KiB");
        assert_eq!(opened.len(), SIZE);
        n += 1;
    }
    let opens = n as f64 / started.elapsed().as_secs_f64();
    let mib = |per_s: f64| per_s * SIZE as f64 / (1024.0 * 1024.0);
    println!(
        "seal 64 KiB state:  {seals:>8.0}/s ({:.0} MiB/s)   open: {opens:>8.0}/s ({:.0} MiB/s)",
        mib(seals),
        mib(opens)
    );
}
