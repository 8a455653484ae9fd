//! The worker's one heartbeat for all its leases, against run rows other transactions hold.

use std::time::Duration;

use countersign_core::{CallIndex, Effect, JournalEntry, SuspensionSeq, ToolOutput};
use countersign_store::{ReapOutcome, Renewal, RunStatus, StoreError};
use sqlx::PgPool;

use crate::support::*;

async fn lease_expired(pool: &PgPool, run: countersign_core::RunId) -> bool {
    sqlx::query_scalar("SELECT lease_expires_at < now() FROM runs WHERE id = $1")
        .bind(run.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn one_beat_renews_the_free_leases_answers_a_locked_row_busy_without_waiting_and_leaves_a_lost_lease_out(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let (free, free_lease) = running(&store).await;
    let (locked, locked_lease) = running(&store).await;
    let (lost, lost_lease) = running(&store).await;
    for run in [free, locked, lost] {
        expire_lease(&pool, run).await;
    }
    // The reaper took one lease away; another transaction holds the row of another.
    let seen = store.expired_leases(10).await.unwrap();
    let lost_seen = seen.iter().find(|l| l.run_id == lost).unwrap();
    assert_eq!(
        store
            .reap_expired(lost_seen, 3, Duration::ZERO)
            .await
            .unwrap(),
        ReapOutcome::Requeued
    );
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM runs WHERE id = $1 FOR UPDATE")
        .bind(locked.as_uuid())
        .fetch_one(&mut *holder)
        .await
        .unwrap();

    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        store.renew_all(&[free_lease, locked_lease.clone(), lost_lease], TTL),
    )
    .await
    .expect("the beat waits for no row lock")
    .unwrap();

    let mut answered = answered;
    answered.sort_by_key(|(run, _)| *run != free);
    assert_eq!(
        answered,
        vec![(free, Renewal::Renewed), (locked, Renewal::Busy)],
        "the lost lease is left out"
    );
    assert!(!lease_expired(&pool, free).await, "renewed");
    holder.rollback().await.unwrap();
    assert!(
        lease_expired(&pool, locked).await,
        "not renewed while locked"
    );
    let row = store.run(locked).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.lease_epoch),
        (RunStatus::Running, locked_lease.epoch)
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_open_turn_holds_no_run_row_so_its_lease_is_renewed_and_a_lease_lost_meanwhile_keeps_nothing_of_it(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let turn = store
        .begin_turn(&lease, SuspensionSeq::FIRST)
        .await
        .unwrap();

    // The heartbeat renews the lease of a turn that waits (on a colleague's lock, say).
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        store.renew_all(std::slice::from_ref(&lease), TTL),
    )
    .await
    .expect("the beat waits for no row lock")
    .unwrap();
    assert_eq!(answered, vec![(run, Renewal::Renewed)]);

    // The lease runs out all the same, and the reaper hands the run back.
    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert_eq!(
        store.reap_expired(&seen, 3, Duration::ZERO).await.unwrap(),
        ReapOutcome::Requeued
    );

    let output = ToolOutput::ok("written");
    let entry = JournalEntry {
        index: CallIndex::new(0),
        tool: "update_page_metadata",
        effect: Effect::IdempotentWrite,
        output: &output,
    };
    let e = turn.commit_turn(TTL, &[entry], &[]).await.unwrap_err();
    assert!(matches!(e, StoreError::FenceLost), "{e:?}");
    assert!(store
        .journaled(run, SuspensionSeq::FIRST, CallIndex::new(0))
        .await
        .unwrap()
        .is_none());
    assert!(store
        .events(run)
        .await
        .unwrap()
        .iter()
        .all(|e| e.kind != "tool_write"));
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Queued);
}

/// Updates of `runs` so far, and how many of them were heap-only (rewrote no index entry), as
/// this session's statistics have them once flushed.
async fn updates(pool: &PgPool) -> (i64, i64) {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    // A statement of its own: the flush happens when the previous one's transaction ends.
    sqlx::query("SELECT 1").execute(&mut *conn).await.unwrap();
    sqlx::query_as(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn no_index_of_runs_reads_the_lease_expiry_so_a_renewal_can_be_heap_only(pool: PgPool) {
    // Columns of `runs` that an index's key, expressions or predicate use: an UPDATE that
    // changes one of them can never be heap-only.
    let indexed: Vec<(String, String)> = sqlx::query_as(
        "SELECT i.indexrelid::regclass::text, a.attname::text
         FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum > 0
         WHERE i.indrelid = 'runs'::regclass
           AND (a.attnum = ANY(i.indkey)
                OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M')
                OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M'))
         ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        indexed.iter().any(|(_, column)| column == "status"),
        "the query sees predicates: {indexed:?}"
    );
    let renewed_columns = [
        "lease_expires_at",
        "pending_effect",
        "sent_seq",
        "sent_call",
    ];
    let blocking: Vec<_> = indexed
        .iter()
        .filter(|(_, column)| renewed_columns.contains(&column.as_str()))
        .collect();
    assert!(
        blocking.is_empty(),
        "indexes on renewed columns: {blocking:?}"
    );

    // And so a renewal whose row has room on its page rewrites no index. Ten versions of the
    // row fit its page without pruning, which a busy server may defer (an older snapshot of a
    // concurrent analyze holds the dead versions): past that, a renewal is heap-only only if
    // the page could be pruned, which is no fact about the indexes.
    let store = store(pool.clone());
    let (_, lease) = running(&store).await;
    let one = store_on_one_connection(&pool).await;
    let (updated, hot) = updates(one.pool()).await;
    for _ in 0..5 {
        assert_eq!(
            one.renew_all(std::slice::from_ref(&lease), TTL)
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(one.renew_stamping(&lease, TTL, None).await.unwrap());
    }
    let (updated_after, hot_after) = updates(one.pool()).await;
    assert_eq!(
        (updated_after - updated, hot_after - hot),
        (10, 10),
        "every renewal was heap-only"
    );
}

/// A store over a pool of one connection, so that the statistics it flushes are its own.
async fn store_on_one_connection(pool: &PgPool) -> countersign_store::Store {
    store(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with((*pool.connect_options()).clone())
            .await
            .unwrap(),
    )
}
