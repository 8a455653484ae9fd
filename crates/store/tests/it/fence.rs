use std::time::Duration;

use countersign_core::{CallIndex, Effect, SuspensionSeq, ToolOutput};
use countersign_store::StoreError;
use sqlx::{PgConnection, PgPool};

use crate::support::*;

/// A stand-in for a tool's resource in the same database.
async fn create_probe(pool: &PgPool) {
    sqlx::query("CREATE TABLE probe (run_id uuid NOT NULL, value text NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

async fn write_probe(conn: &mut PgConnection, run: countersign_core::RunId, value: &str) {
    sqlx::query("INSERT INTO probe (run_id, value) VALUES ($1, $2)")
        .bind(run.as_uuid())
        .bind(value)
        .execute(&mut *conn)
        .await
        .unwrap();
    // The read-back a writer performs before it reports success.
    let back: String = sqlx::query_scalar("SELECT value FROM probe WHERE run_id = $1")
        .bind(run.as_uuid())
        .fetch_one(conn)
        .await
        .unwrap();
    assert_eq!(back, value);
}

async fn probe_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM probe")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_committed_fenced_write_keeps_the_write_its_audit_event_and_its_journal_row(
    pool: PgPool,
) {
    create_probe(&pool).await;
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let token = lease.fence_token(SuspensionSeq::FIRST, CallIndex::new(1));

    let mut write = store.fenced_write(&token).await.unwrap();
    write_probe(write.conn(), run, "New words").await;
    let output = ToolOutput::ok("Updated the description of page 12 to \"New words\".");
    write
        .commit("update_page_metadata", Effect::IdempotentWrite, &output)
        .await
        .unwrap();

    assert_eq!(probe_rows(&pool).await, 1);
    let events = store.events(run).await.unwrap();
    assert_eq!(events.len(), 1);
    let event = &events[0];
    assert_eq!(event.kind, "tool_write");
    assert_eq!(
        event.payload,
        serde_json::json!({
            "tool": "update_page_metadata",
            "effect": "idempotent_write",
            "call_index": 1,
            "suspension_seq": 1,
            "lease_epoch": 1,
            "is_error": false,
        })
    );
    let sealed = event.sealed.as_deref().unwrap();
    assert!(!sealed.windows(9).any(|w| w == b"New words"));
    assert_eq!(
        store.open_event_content(run, event).unwrap().unwrap(),
        output.content.as_bytes()
    );
    assert_eq!(
        store
            .journaled(run, SuspensionSeq::FIRST, CallIndex::new(1))
            .await
            .unwrap(),
        Some(output)
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_fenced_write_that_is_not_committed_leaves_no_journal_row_and_no_event(pool: PgPool) {
    create_probe(&pool).await;
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let token = lease.fence_token(SuspensionSeq::FIRST, CallIndex::new(0));

    let mut dropped = store.fenced_write(&token).await.unwrap();
    write_probe(dropped.conn(), run, "dropped").await;
    drop(dropped);

    let mut abandoned = store.fenced_write(&token).await.unwrap();
    write_probe(abandoned.conn(), run, "abandoned").await;
    abandoned.rollback().await.unwrap();

    assert_eq!(probe_rows(&pool).await, 0);
    assert_eq!(event_count(&pool, run).await, 0);
    assert_eq!(journal_count(&pool, run).await, 0);
    assert!(!store
        .any_journaled(run, SuspensionSeq::FIRST)
        .await
        .unwrap());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_fenced_write_by_a_zombie_segment_changes_nothing(pool: PgPool) {
    create_probe(&pool).await;
    let store = store(pool.clone());
    let (run, zombie) = running(&store).await;
    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert!(store
        .reaper_requeue(&seen, 3, Duration::ZERO)
        .await
        .unwrap());
    let current = claim(&store, run, "worker-b").await.lease;
    let before = store.run(run).await.unwrap().unwrap();

    let token = zombie.fence_token(SuspensionSeq::FIRST, CallIndex::new(0));
    let err = store.fenced_write(&token).await.unwrap_err();
    assert!(matches!(err, StoreError::FenceLost));
    assert_eq!(err.code(), "fence_lost");

    assert_eq!(store.run(run).await.unwrap().unwrap(), before);
    assert_eq!(probe_rows(&pool).await, 0);
    assert_eq!(event_count(&pool, run).await, 0);
    assert_eq!(journal_count(&pool, run).await, 0);
    assert_eq!(current.epoch.get(), zombie.epoch.get() + 1);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn the_reaper_leaves_an_expired_lease_whose_fenced_write_is_open_and_requeues_it_once_the_write_committed(
    pool: PgPool,
) {
    create_probe(&pool).await;
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    // The lease has expired, but no reaper has acted: the holder may still write. The reaper
    // waits for nobody's row (the holder may be a paused process): it leaves the run to its
    // next pass.
    expire_lease(&pool, run).await;
    let token = lease.fence_token(SuspensionSeq::FIRST, CallIndex::new(0));
    let mut write = store.fenced_write(&token).await.unwrap();
    write_probe(write.conn(), run, "kept").await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    let skipped = tokio::time::timeout(
        Duration::from_secs(5),
        store.reaper_requeue(&seen, 3, Duration::ZERO),
    )
    .await
    .expect("the reaper does not wait for the row")
    .unwrap();
    assert!(!skipped, "the run is left while its write is open");
    write
        .commit(
            "update_page_metadata",
            Effect::IdempotentWrite,
            &ToolOutput::ok("ok"),
        )
        .await
        .unwrap();
    assert!(
        store
            .reaper_requeue(&seen, 3, Duration::ZERO)
            .await
            .unwrap(),
        "the expired lease is requeued by the next pass"
    );

    // The write and its journal row survived together, so a retry will skip the call.
    assert_eq!(probe_rows(&pool).await, 1);
    assert!(store
        .journaled(run, SuspensionSeq::FIRST, CallIndex::new(0))
        .await
        .unwrap()
        .is_some());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_fenced_write_of_a_journaled_call_is_rolled_back_whole(pool: PgPool) {
    create_probe(&pool).await;
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let token = lease.fence_token(SuspensionSeq::FIRST, CallIndex::new(0));
    let mut first = store.fenced_write(&token).await.unwrap();
    write_probe(first.conn(), run, "first").await;
    first
        .commit(
            "update_page_metadata",
            Effect::IdempotentWrite,
            &ToolOutput::ok("first"),
        )
        .await
        .unwrap();

    let mut again = store.fenced_write(&token).await.unwrap();
    sqlx::query("INSERT INTO probe (run_id, value) VALUES ($1, 'second')")
        .bind(run.as_uuid())
        .execute(again.conn())
        .await
        .unwrap();
    let err = again
        .commit(
            "update_page_metadata",
            Effect::IdempotentWrite,
            &ToolOutput::ok("second"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyJournaled));

    let values: Vec<String> = sqlx::query_scalar("SELECT value FROM probe")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        values,
        vec!["first".to_string()],
        "the second write was undone"
    );
    assert_eq!(event_count(&pool, run).await, 1);
    assert_eq!(
        store
            .journaled(run, SuspensionSeq::FIRST, CallIndex::new(0))
            .await
            .unwrap(),
        Some(ToolOutput::ok("first"))
    );
}

/// An approved turn whose write waits on a colleague's lock on the content holds its connection
/// for as long as the colleague holds the lock. With turns limited to one connection of a pool
/// of two, a second turn waits for the first to end instead of taking the other connection, and
/// the other statements go on: here, reading a run.
#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn turns_waiting_on_a_colleagues_lock_leave_the_rest_of_the_pool_to_every_other_statement(
    pool: PgPool,
) {
    create_probe(&pool).await;
    sqlx::query("INSERT INTO probe (run_id, value) VALUES (gen_random_uuid(), 'Old words')")
        .execute(&pool)
        .await
        .unwrap();
    let mut colleague = pool.begin().await.unwrap();
    sqlx::query("SELECT value FROM probe FOR UPDATE")
        .execute(&mut *colleague)
        .await
        .unwrap();

    let small = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(3))
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let store = store(small).with_turn_limit(1);
    let (first_run, first) = running(&store).await;
    let (_, second) = running(&store).await;
    let turn = |lease: countersign_store::Lease| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut turn = store.begin_turn(&lease, SuspensionSeq::FIRST).await?;
            sqlx::query("UPDATE probe SET value = 'New words'")
                .execute(turn.conn())
                .await?;
            Ok::<_, StoreError>(())
        })
    };
    let first_turn = turn(first);
    // The first turn holds its connection, waiting on the colleague's lock.
    tokio::time::timeout(Duration::from_secs(10), async {
        while lock_waiters(&pool, "%").await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the first turn waits on the colleague's lock");
    let second_turn = turn(second);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let read = store.run(first_run).await;
    assert!(read.is_ok(), "a run read while turns wait: {read:?}");
    assert!(!second_turn.is_finished());
    assert_eq!(
        lock_waiters(&pool, "%").await,
        1,
        "one turn waits on the lock"
    );

    colleague.commit().await.unwrap();
    for turn in [first_turn, second_turn] {
        tokio::time::timeout(Duration::from_secs(10), turn)
            .await
            .expect("each turn ends once the colleague committed")
            .unwrap()
            .unwrap();
    }
}

/// Statements of this database blocked on a lock whose text is `LIKE` `query`, by the
/// database's own view.
async fn lock_waiters(pool: &PgPool, query: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1",
    )
    .bind(query)
    .fetch_one(pool)
    .await
    .unwrap()
}
