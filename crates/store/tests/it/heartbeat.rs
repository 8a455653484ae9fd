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
