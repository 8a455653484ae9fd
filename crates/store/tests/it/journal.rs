use std::time::Duration;

use countersign_core::{CallIndex, Effect, JournalEntry, SuspensionSeq, ToolOutput};
use countersign_store::{ReapOutcome, SentCall, StoreError};
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

/// A run resumed after its approval, claimed by `worker-a`.
async fn resumed(
    store: &countersign_store::Store,
) -> (countersign_core::RunId, countersign_store::Claim) {
    let (run, st) = waiting(store).await;
    store.record_decision(&accept(run, &st)).await.unwrap();
    (run, claim(store, run, "worker-a").await)
}

/// Requeues the run by expiring its lease and reaping it without backoff.
async fn requeue(store: &countersign_store::Store, pool: &PgPool, run: countersign_core::RunId) {
    expire_lease(pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert_eq!(
        store.reap_expired(&seen, 3, Duration::ZERO).await.unwrap(),
        ReapOutcome::Requeued
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_sent_call_survives_the_requeue_reaches_the_retrying_claim_and_clears_with_its_journal_row(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let (run, first) = resumed(&store).await;
    assert_eq!(first.sent_call, None);
    let sent = SentCall {
        seq: SuspensionSeq::FIRST,
        index: CallIndex::new(1),
        effect: Effect::IdempotentWrite,
    };
    assert!(store
        .renew_stamping(&first.lease, TTL, Some(sent))
        .await
        .unwrap());

    requeue(&store, &pool, run).await;
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(
        row.pending_effect, None,
        "the reaper clears the effect stamp"
    );
    let retry = claim(&store, run, "worker-b").await;
    assert_eq!(
        retry.sent_call,
        Some(CallIndex::new(1)),
        "but not the sent call"
    );

    store
        .record_effect(
            &retry.lease,
            SuspensionSeq::FIRST,
            CallIndex::new(1),
            "set_page",
            Effect::IdempotentWrite,
            &ToolOutput::ok("written"),
        )
        .await
        .unwrap();
    let sent: (Option<i32>, Option<i32>) =
        sqlx::query_as("SELECT sent_seq, sent_call FROM runs WHERE id = $1")
            .bind(run.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(sent, (None, None));
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_call_sent_for_another_suspension_is_not_the_retrying_claims_sent_call(pool: PgPool) {
    let store = store(pool.clone());
    let (run, first) = resumed(&store).await;
    let other_turn = SentCall {
        seq: SuspensionSeq::FIRST.next(),
        index: CallIndex::new(0),
        effect: Effect::IdempotentWrite,
    };
    assert!(store
        .renew_stamping(&first.lease, TTL, Some(other_turn))
        .await
        .unwrap());
    requeue(&store, &pool, run).await;
    assert_eq!(claim(&store, run, "worker-b").await.sent_call, None);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_turn_of_three_calls_commits_every_journal_row_and_an_audit_event_per_write_numbered_in_order(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let seq = SuspensionSeq::FIRST;
    let before = store.events(run).await.unwrap();
    let last = before.last().map_or(0, |e| e.sequence);
    // The lease runs nearly out before the commit, which renews it.
    sqlx::query("UPDATE runs SET lease_expires_at = now() + interval '1 second' WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .unwrap();

    let outputs = [
        ToolOutput::ok("first written"),
        ToolOutput::ok("read"),
        ToolOutput::error("third refused"),
    ];
    let effects = [
        Effect::IdempotentWrite,
        Effect::ReadOnly,
        Effect::NonIdempotentWrite,
    ];
    let tools = [
        "update_page_metadata",
        "read_page_metadata",
        "move_content_element",
    ];
    let entries: Vec<JournalEntry<'_>> = (0..3)
        .map(|i| JournalEntry {
            index: CallIndex::new(i),
            tool: tools[i],
            effect: effects[i],
            output: &outputs[i],
        })
        .collect();
    let turn = store.begin_turn(&lease, seq).await.unwrap();
    turn.commit_turn(TTL, &entries, &[]).await.unwrap();

    for (i, output) in outputs.iter().enumerate() {
        assert_eq!(
            store.journaled(run, seq, CallIndex::new(i)).await.unwrap(),
            Some(output.clone()),
            "call {i}"
        );
    }
    let writes: Vec<_> = store
        .events(run)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "tool_write")
        .collect();
    let numbered: Vec<(i64, &str, i64)> = writes
        .iter()
        .map(|e| {
            (
                e.sequence,
                e.payload["tool"].as_str().unwrap(),
                e.payload["call_index"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        numbered,
        vec![
            (last + 1, "update_page_metadata", 0),
            (last + 2, "move_content_element", 2)
        ]
    );
    assert_eq!(writes[1].payload["is_error"], true);
    let left: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM runs WHERE id = $1",
    )
    .bind(run.as_uuid())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(left > 20.0, "the commit renewed the lease: {left} s left");

    // The same turn committed again keeps nothing of the second commit.
    let again = store.begin_turn(&lease, seq).await.unwrap();
    let e = again
        .commit_turn(TTL, &entries[2..], &[])
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::AlreadyJournaled), "{e:?}");
    assert_eq!(journal_count(&pool, run).await, 3);
    assert_eq!(
        store
            .events(run)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.kind == "tool_write")
            .count(),
        2
    );
}
