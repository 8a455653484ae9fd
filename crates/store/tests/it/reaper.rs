use std::time::Duration;

use countersign_core::{Approves, Effect, SuspensionSeq};
use countersign_store::{ReapOutcome, RunStatus, SegmentKind, TerminationReason};
use sqlx::PgPool;

use crate::support::*;

const BACKOFF: Duration = Duration::from_secs(90);

/// Ends the run's backoff now, by the database clock.
async fn make_available(pool: &PgPool, run: countersign_core::RunId) {
    sqlx::query("UPDATE runs SET available_at = now() WHERE id = $1")
        .bind(run.as_uuid())
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_heartbeat_after_the_reaper_requeued_loses(pool: PgPool) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert_eq!(
        store.reap_expired(&seen, 3, BACKOFF).await.unwrap(),
        ReapOutcome::Requeued
    );

    assert!(!store.renew(&lease, TTL).await.unwrap());
    assert!(!store
        .renew_stamping(&lease, TTL, Some(sent(Effect::NonIdempotentWrite)))
        .await
        .unwrap());
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Queued);
    assert_eq!(row.lease_owner, None);
    assert_eq!(row.pending_effect, None);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_heartbeat_landing_between_scan_and_update_beats_the_reaper(pool: PgPool) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert!(store.renew(&lease, TTL).await.unwrap());

    assert_eq!(
        store.reap_expired(&seen, 3, BACKOFF).await.unwrap(),
        ReapOutcome::Lost
    );
    assert!(!store.reaper_fail_exhausted(&seen, 0).await.unwrap());
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Running);
    assert_eq!(row.lease_epoch, lease.epoch);
    assert!(store.expired_leases(10).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_expired_lease_is_requeued_with_backoff_until_retries_are_exhausted(pool: PgPool) {
    let store = store(pool.clone());
    let (run, _) = running(&store).await;
    let max = 2;
    for attempt in 1..=max {
        expire_lease(&pool, run).await;
        let seen = store.expired_leases(10).await.unwrap().remove(0);
        assert_eq!(seen.requeue_count, attempt - 1);
        assert_eq!(
            store.reap_expired(&seen, max, BACKOFF).await.unwrap(),
            ReapOutcome::Requeued
        );
        let row = store.run(run).await.unwrap().unwrap();
        assert_eq!(
            (row.status, row.segment),
            (RunStatus::Queued, SegmentKind::Start)
        );
        assert_eq!(row.requeue_count, attempt);
        let backoff_s: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM available_at - updated_at)::float8 FROM runs WHERE id = $1",
        )
        .bind(run.as_uuid())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(backoff_s, BACKOFF.as_secs_f64());
        assert!(
            store.claim(run, "worker-a", TTL).await.unwrap().is_none(),
            "not claimable during the backoff"
        );
        make_available(&pool, run).await;
        claim(&store, run, "worker-a").await;
    }

    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert!(!store.reaper_requeue(&seen, max, BACKOFF).await.unwrap());
    assert_eq!(
        store.reap_expired(&seen, max, BACKOFF).await.unwrap(),
        ReapOutcome::RetriesExhausted
    );
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Failed);
    assert_eq!(
        row.termination_reason,
        Some(TerminationReason::RetriesExhausted)
    );
    assert_eq!(row.lease_owner, None);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_run_with_a_write_in_doubt_is_requeued_keeping_its_stamp_until_its_retries_are_spent(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    assert!(store
        .renew_stamping(&lease, TTL, Some(sent(Effect::NonIdempotentWrite)))
        .await
        .unwrap());
    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert_eq!(seen.pending_effect, Some(Effect::NonIdempotentWrite));
    assert!(seen.sent_call);

    assert_eq!(
        store.reap_expired(&seen, 3, BACKOFF).await.unwrap(),
        ReapOutcome::Requeued,
        "the next segment resolves the call by its key"
    );
    sqlx::query("UPDATE runs SET available_at = now() WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    store
        .claim(run, "w2", TTL)
        .await
        .unwrap()
        .expect("claimable once its backoff is over");

    // Its retries spent with the call still in doubt: failed, the call named.
    sqlx::query("UPDATE runs SET requeue_count = 3 WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert_eq!(
        store.reap_expired(&seen, 3, BACKOFF).await.unwrap(),
        ReapOutcome::OutcomeUnknown
    );
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Failed);
    assert_eq!(
        row.termination_reason,
        Some(TerminationReason::OutcomeUnknown)
    );

    // A stamp cleared with the call's journal row leaves retries spent as they are.
    let (run, lease) = running(&store).await;
    assert!(store
        .renew_stamping(&lease, TTL, Some(sent(Effect::NonIdempotentWrite)))
        .await
        .unwrap());
    assert!(store.renew_stamping(&lease, TTL, None).await.unwrap());
    sqlx::query("UPDATE runs SET requeue_count = 3 WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    expire_lease(&pool, run).await;
    let seen = store
        .expired_leases(10)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.run_id == run)
        .unwrap();
    assert_eq!(
        store.reap_expired(&seen, 3, BACKOFF).await.unwrap(),
        ReapOutcome::RetriesExhausted
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_lost_dispatch_is_found_until_the_run_is_marked_dispatched(pool: PgPool) {
    let store = store(pool.clone());
    let run = queued(&store).await;
    assert_eq!(
        store.lost_dispatches(Duration::ZERO, 10).await.unwrap(),
        vec![run]
    );
    assert!(
        store
            .lost_dispatches(Duration::from_secs(3600), 10)
            .await
            .unwrap()
            .is_empty(),
        "a run just created is given time for its first publish"
    );
    assert!(store.mark_dispatched(run).await.unwrap());
    assert!(store
        .lost_dispatches(Duration::ZERO, 10)
        .await
        .unwrap()
        .is_empty());

    // Requeued by the reaper: not before its backoff ends, and found again after it.
    claim(&store, run, "worker-a").await;
    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert!(store.reaper_requeue(&seen, 3, BACKOFF).await.unwrap());
    assert!(store
        .lost_dispatches(Duration::ZERO, 10)
        .await
        .unwrap()
        .is_empty());
    make_available(&pool, run).await;
    assert_eq!(
        store.lost_dispatches(Duration::ZERO, 10).await.unwrap(),
        vec![run]
    );

    assert!(!store
        .mark_dispatched(countersign_core::RunId::new())
        .await
        .unwrap());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_approval_past_its_deadline_is_cancelled_approval_expired(pool: PgPool) {
    let store = store(pool.clone());
    let (run, _) = waiting(&store).await;
    assert!(store.expired_approvals(10).await.unwrap().is_empty());
    assert!(!store
        .expire_approval(run, SuspensionSeq::FIRST)
        .await
        .unwrap());

    sqlx::query("UPDATE runs SET approval_deadline = now() - interval '1 second' WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    let expired = store.expired_approvals(10).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].run_id, run);
    assert_eq!(expired[0].suspension_seq, SuspensionSeq::FIRST);

    assert!(
        !store
            .expire_approval(run, SuspensionSeq::FIRST.next())
            .await
            .unwrap(),
        "another card's deadline does not expire this one"
    );
    assert!(store
        .expire_approval(run, SuspensionSeq::FIRST)
        .await
        .unwrap());
    assert!(!store
        .expire_approval(run, SuspensionSeq::FIRST)
        .await
        .unwrap());
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Cancelled);
    assert_eq!(
        row.termination_reason,
        Some(TerminationReason::ApprovalExpired)
    );
    assert!(store
        .inbox("", &Approves::Every, None, 10, None)
        .await
        .unwrap()
        .runs
        .is_empty());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_expired_lease_whose_row_another_transaction_holds_is_left_without_waiting_and_reaped_once_it_is_free(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let (held, _) = running(&store).await;
    let (free, _) = running(&store).await;
    let (exhausted, _) = running(&store).await;
    for run in [held, free, exhausted] {
        expire_lease(&pool, run).await;
    }
    // A paused process's transaction holds two of the rows, as a turn frozen at its fence does.
    let mut frozen = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM runs WHERE id = ANY($1) FOR UPDATE")
        .bind(vec![held.as_uuid(), exhausted.as_uuid()])
        .execute(&mut *frozen)
        .await
        .unwrap();

    let seen = store.expired_leases(10).await.unwrap();
    let lease = |run| seen.iter().find(|l| l.run_id == run).unwrap().clone();
    let outcomes = tokio::time::timeout(Duration::from_secs(5), async {
        (
            store.reap_expired(&lease(held), 3, BACKOFF).await.unwrap(),
            store.reap_expired(&lease(free), 3, BACKOFF).await.unwrap(),
            store
                .reap_expired(&lease(exhausted), 0, BACKOFF)
                .await
                .unwrap(),
        )
    })
    .await
    .expect("the reaper waits on no held row");
    assert_eq!(
        outcomes,
        (ReapOutcome::Lost, ReapOutcome::Requeued, ReapOutcome::Lost)
    );
    assert!(store
        .expire_approval(held, SuspensionSeq::FIRST)
        .await
        .is_ok());

    // The session ends (its idle limit, or its process back); the next pass reaps both.
    frozen.rollback().await.unwrap();
    let seen = store.expired_leases(10).await.unwrap();
    let lease = |run| seen.iter().find(|l| l.run_id == run).unwrap().clone();
    assert_eq!(
        store.reap_expired(&lease(held), 3, BACKOFF).await.unwrap(),
        ReapOutcome::Requeued
    );
    assert_eq!(
        store
            .reap_expired(&lease(exhausted), 0, BACKOFF)
            .await
            .unwrap(),
        ReapOutcome::RetriesExhausted
    );
}
