use countersign_core::{CallIndex, Effect, SuspensionSeq, ToolOutput};
use sqlx::PgPool;

use crate::support::*;

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_journaled_call_returns_its_result_and_recording_it_again_keeps_the_first(pool: PgPool) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let seq = SuspensionSeq::FIRST;
    let token = lease.fence_token(seq, CallIndex::new(2));

    assert!(!store.any_journaled(run, seq).await.unwrap());
    assert_eq!(
        store.journaled(run, seq, CallIndex::new(2)).await.unwrap(),
        None
    );

    let first = ToolOutput::error("Error: the remote service refused the request.");
    assert!(store
        .record_journal(&token, "notify_webhook", Effect::NonIdempotentWrite, &first)
        .await
        .unwrap());
    assert!(!store
        .record_journal(
            &token,
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
