//! Webhook deliveries: written with their events for the endpoints that hear them, claimed
//! when due, and recorded attempt by attempt.

use std::time::Duration;

use countersign_store::AttemptOutcome;
use sqlx::PgPool;

use crate::support::{store, waiting};

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_event_becomes_a_delivery_for_each_endpoint_that_hears_it_and_its_attempts_are_recorded(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let secret = "whsec_c2VjcmV0";
    let suspended = ["run.suspended".to_owned()];
    store
        .add_webhook(
            "https://a.example/hook",
            &suspended,
            Some("seo-assistant"),
            secret,
        )
        .await
        .unwrap();
    store
        .add_webhook(
            "https://b.example/hook",
            &suspended,
            Some("another-agent"),
            secret,
        )
        .await
        .unwrap();
    store
        .add_webhook(
            "https://c.example/hook",
            &["run.completed".to_owned()],
            None,
            secret,
        )
        .await
        .unwrap();
    let duplicate = store
        .add_webhook("https://a.example/hook", &suspended, None, secret)
        .await;
    assert!(duplicate.is_err(), "one endpoint per URL");

    let (run, _) = waiting(&store).await;
    let due = store
        .claim_webhook_deliveries(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        due.len(),
        1,
        "only the endpoint of the run's agent hears it: {due:?}"
    );
    let delivery = &due[0];
    assert_eq!(delivery.url, "https://a.example/hook");
    assert_eq!(delivery.run_id, Some(run.as_uuid()));
    assert_eq!(delivery.body["event"], "run.suspended");
    assert_eq!(delivery.body["event_id"], delivery.event_id.to_string());
    assert!(
        store
            .claim_webhook_deliveries(10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty(),
        "a claimed delivery is not claimed again"
    );

    let retry = AttemptOutcome::Retry {
        http_status: Some(500),
        code: "http_error",
        after: Duration::from_secs(3600),
    };
    store
        .record_webhook_attempt(delivery.endpoint_id, delivery.event_id, &retry)
        .await
        .unwrap();
    assert!(
        store
            .claim_webhook_deliveries(10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty(),
        "not due before its retry time"
    );
    sqlx::query("UPDATE webhook_deliveries SET next_attempt_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    let again = store
        .claim_webhook_deliveries(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 1);
    let failed = AttemptOutcome::Failed {
        http_status: None,
        code: "timeout",
    };
    store
        .record_webhook_attempt(delivery.endpoint_id, delivery.event_id, &failed)
        .await
        .unwrap();

    let shown = store
        .webhook_deliveries("https://a.example/hook", 10)
        .await
        .unwrap();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].status, "failed");
    assert_eq!(shown[0].attempts, 2);
    assert_eq!(shown[0].last_http_status, None);
    assert_eq!(shown[0].last_code.as_deref(), Some("timeout"));
    assert!(shown[0].finished_at.is_some());
    assert_eq!(
        store.webhook_backlog_age().await.unwrap(),
        Duration::ZERO,
        "nothing pending"
    );

    // Finished deliveries go with the retention; the endpoint's removal takes the rest.
    assert_eq!(
        store
            .prune_webhook_deliveries(Duration::ZERO, 100)
            .await
            .unwrap(),
        1
    );
    assert!(store
        .remove_webhook("https://a.example/hook")
        .await
        .unwrap());
    assert!(!store
        .remove_webhook("https://a.example/hook")
        .await
        .unwrap());
    let left: Vec<String> = store
        .webhooks()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.url)
        .collect();
    assert_eq!(left, ["https://b.example/hook", "https://c.example/hook"]);
}
