use countersign_core::{CallIndex, Effect, SuspensionSeq, ToolOutput};
use sqlx::PgPool;

use crate::support::*;

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_journaled_call_returns_its_result_and_recording_it_again_keeps_the_first(pool: PgPool) {
    let index = CallIndex::new(2);
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let seq = SuspensionSeq::FIRST;

    assert!(!store.any_journaled(run, seq).await.unwrap());
    assert_eq!(
        store.journaled(run, seq, CallIndex::new(2)).await.unwrap(),
        None
    );

    let first = ToolOutput::error("Error: the remote service refused the request.");
    assert!(store
        .record_effect(
            &lease,
            seq,
            index,
            "notify_webhook",
            Effect::NonIdempotentWrite,
            &first
        )
        .await
        .unwrap());
    assert!(!store
        .record_effect(
            &lease,
            seq,
            index,
            "notify_webhook",
            Effect::NonIdempotentWrite,
            &ToolOutput::ok("later")
        )
        .await
        .unwrap());

    assert!(store.any_journaled(run, seq).await.unwrap());
    assert!(!store.any_journaled(run, seq.next()).await.unwrap());
    assert_eq!(
        store.journaled(run, seq, CallIndex::new(2)).await.unwrap(),
        Some(first)
    );
    assert_eq!(
        store.journaled(run, seq, CallIndex::new(1)).await.unwrap(),
        None
    );
    assert_eq!(journal_count(&pool, run).await, 1);
    let (effect, epoch): (String, i64) =
        sqlx::query_as("SELECT effect, lease_epoch FROM run_journal WHERE run_id = $1")
            .bind(run.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((effect.as_str(), epoch), ("non_idempotent_write", 1));
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn recording_an_effect_clears_the_stamp_the_fence_left(pool: PgPool) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let seq = SuspensionSeq::FIRST;
    assert!(store
        .renew_stamping(&lease, TTL, Some(sent(Effect::NonIdempotentWrite)))
        .await
        .unwrap());
    assert_eq!(
        store.run(run).await.unwrap().unwrap().pending_effect,
        Some(Effect::NonIdempotentWrite)
    );
    store
        .record_effect(
            &lease,
            seq,
            CallIndex::new(0),
            "notify",
            Effect::NonIdempotentWrite,
            &ToolOutput::ok("sent"),
        )
        .await
        .unwrap();
    assert_eq!(store.run(run).await.unwrap().unwrap().pending_effect, None);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_zombie_cannot_record_an_effect_and_the_stamp_stays_for_the_reaper(pool: PgPool) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    assert!(store
        .renew_stamping(&lease, TTL, Some(sent(Effect::NonIdempotentWrite)))
        .await
        .unwrap());
    let zombie = countersign_store::Lease {
        owner: "someone-else".into(),
        ..lease
    };
    let recorded = store
        .record_effect(
            &zombie,
            SuspensionSeq::FIRST,
            CallIndex::new(0),
            "notify",
            Effect::NonIdempotentWrite,
            &ToolOutput::ok("sent"),
        )
        .await;
    assert!(matches!(
        recorded,
        Err(countersign_store::StoreError::FenceLost)
    ));
    assert_eq!(journal_count(&pool, run).await, 0);
    assert_eq!(
        store.run(run).await.unwrap().unwrap().pending_effect,
        Some(Effect::NonIdempotentWrite)
    );
}
