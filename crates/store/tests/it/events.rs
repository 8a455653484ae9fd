use std::sync::Arc;

use countersign_store::{NewEvent, StoreError};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::Barrier;

use crate::support::*;

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn twenty_concurrent_appenders_produce_unique_gap_free_sequences(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // One connection per appender, so all twenty are in the database at once.
    let pool = PgPoolOptions::new()
        .max_connections(21)
        .connect_with(connect)
        .await
        .unwrap();
    // Open the twenty connections up front, so the appenders race in the database rather than
    // in connection setup.
    let mut warm = Vec::new();
    for _ in 0..20 {
        warm.push(pool.acquire().await.unwrap());
    }
    drop(warm);
    let store = store(pool.clone());
    let run = queued(&store).await;

    let barrier = Arc::new(Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let event = NewEvent::new("model.turn", json!({ "appender": i }));
                store.append_event(run, &event).await.unwrap()
            })
        })
        .collect();
    let mut sequences = Vec::new();
    for task in tasks {
        sequences.push(task.await.unwrap());
    }
    sequences.sort_unstable();
    assert_eq!(sequences, (1..=20).collect::<Vec<i64>>());

    let stored: Vec<i64> = store
        .events(run)
        .await
        .unwrap()
        .iter()
        .map(|e| e.sequence)
        .collect();
    assert_eq!(stored, (1..=20).collect::<Vec<i64>>());
    let mut appenders: Vec<i64> = store
        .events(run)
        .await
        .unwrap()
        .iter()
        .map(|e| e.payload["appender"].as_i64().unwrap())
        .collect();
    appenders.sort_unstable();
    assert_eq!(
        appenders,
        (0..20).collect::<Vec<i64>>(),
        "every appender has its row"
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn event_content_is_sealed_for_its_run_and_the_payload_stays_in_clear(pool: sqlx::PgPool) {
    let store = store(pool.clone());
    let run = queued(&store).await;
    let other = queued(&store).await;
    let event = NewEvent {
        round: Some(2),
        duration_ms: Some(840),
        content: Some(b"the page body the model read"),
        ..NewEvent::new("tool_read", json!({"tool": "read_page", "call_index": 0}))
    };
    assert_eq!(store.append_event(run, &event).await.unwrap(), 1);
    assert_eq!(
        store.append_event(other, &event).await.unwrap(),
        1,
        "numbered per run"
    );

    let stored = store.events(run).await.unwrap().remove(0);
    assert_eq!(stored.kind, "tool_read");
    assert_eq!(stored.round, Some(2));
    assert_eq!(stored.duration_ms, Some(840));
    assert_eq!(
        stored.payload,
        json!({"tool": "read_page", "call_index": 0})
    );
    let sealed = stored.sealed.as_deref().unwrap();
    assert!(!sealed.windows(8).any(|w| w == b"the page"));
    assert_eq!(
        store.open_event_content(run, &stored).unwrap().unwrap(),
        b"the page body the model read"
    );
    let err = store.open_event_content(other, &stored).unwrap_err();
    assert_eq!(err.code(), "state_unreadable");
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_event_for_an_unknown_run_is_refused(pool: sqlx::PgPool) {
    let store = store(pool);
    let unknown = countersign_core::RunId::new();
    let err = store
        .append_event(unknown, &NewEvent::new("run.accepted", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::RunNotFound(id) if id == unknown));
}
