//! The worker's one heartbeat for all its leases, against run rows other transactions hold.

use std::time::Duration;

use countersign_core::{
    CallIndex, Effect, JournalEntry, SuspensionSeq, ToolOutput, TurnTransaction,
};
use countersign_store::{ReapOutcome, Renewal, RunStatus};
use sqlx::PgPool;

use crate::support::*;

/// Other backends of this database waiting for a lock.
async fn waiting_on_locks(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

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
async fn a_turn_that_outlived_its_lease_waiting_renews_it_with_its_journal_and_the_reaper_waiting_on_it_leaves_the_run(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let ttl = Duration::from_millis(300);
    // What the others see of the lease while the turn holds the row: the version before it.
    expire_lease(&pool, run).await;
    let turn = store
        .begin_turn(&lease, SuspensionSeq::FIRST, ttl)
        .await
        .unwrap();
    // The turn waits (on a colleague's lock, say) past the lease it renewed when it began.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;

    // The reaper sees the expired lease and waits on the row the turn holds.
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    let reaper = {
        let store = store.clone();
        tokio::spawn(async move { store.reap_expired(&seen, 3, Duration::ZERO).await })
    };
    for _ in 0..100 {
        if waiting_on_locks(&pool).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        waiting_on_locks(&pool).await,
        1,
        "the reaper waits on the turn"
    );

    let output = ToolOutput::ok("written");
    let entry = JournalEntry {
        index: CallIndex::new(0),
        tool: "update_page_metadata",
        effect: Effect::IdempotentWrite,
        output: &output,
    };
    Box::new(turn).commit(&[entry]).await.unwrap();

    assert_eq!(reaper.await.unwrap().unwrap(), ReapOutcome::Lost);
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.lease_epoch),
        (RunStatus::Running, lease.epoch)
    );
    assert_eq!(row.requeue_count, 0);
    assert!(
        !lease_expired(&pool, run).await,
        "renewed with the journal row"
    );
}
