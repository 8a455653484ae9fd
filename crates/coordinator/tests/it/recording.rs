//! Gate 10 when the store fails: a transient error (a lost connection, a serialization
//! failure, a deadlock, a restarting server) is no answer — the gates return an error and the
//! delivery is requeued and gated afresh — while an audit the database refuses to store is
//! `not_auditable`. Either way the run stays exactly as it was and nothing is recorded.
//!
//! The errors are injected with a trigger on `run_decisions`, which the release transaction
//! reaches after its guarded `UPDATE` of the run, so the whole transaction rolls back; and the
//! lost connection is a real one, its backend terminated while it waits on the run row.

use std::time::Duration;

use countersign_coordinator::producers::{self, ProducerKind, ANY};
use countersign_coordinator::{CoordinatorError, DecisionVerdict, SegmentKind};
use countersign_queue::{Broker, MessageProperties, QueueConfig, Topology};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{assert_refused, bytes, harness, Card, Harness, INBOX};

/// Makes every insert into `run_decisions` fail with the SQLSTATE held in `injected_error`
/// while it holds one.
async fn inject_errors_from_a_table(h: &Harness) {
    sqlx::raw_sql(
        r#"CREATE TABLE injected_error (code text NOT NULL);
           CREATE FUNCTION inject_error() RETURNS trigger LANGUAGE plpgsql AS $$
           DECLARE injected text;
           BEGIN
               SELECT code INTO injected FROM injected_error LIMIT 1;
               IF injected IS NOT NULL THEN
                   RAISE EXCEPTION USING ERRCODE = injected, MESSAGE = 'injected ' || injected;
               END IF;
               RETURN NEW;
           END $$;
           CREATE TRIGGER inject_error BEFORE INSERT ON run_decisions
               FOR EACH ROW EXECUTE FUNCTION inject_error();"#,
    )
    .execute(&h.pool)
    .await
    .unwrap();
}

async fn set_injected(h: &Harness, code: Option<&str>) {
    sqlx::query("DELETE FROM injected_error")
        .execute(&h.pool)
        .await
        .unwrap();
    if let Some(code) = code {
        sqlx::query("INSERT INTO injected_error (code) VALUES ($1)")
            .bind(code)
            .execute(&h.pool)
            .await
            .unwrap();
    }
}

/// Makes the first insert into `run_decisions` fail with a serialization failure, and every
/// later one go through. A sequence counts the attempts because it is not rolled back with
/// the transaction that failed.
async fn fail_the_first_record_with_a_serialization_failure(h: &Harness) {
    sqlx::raw_sql(
        r#"CREATE SEQUENCE record_attempts;
           CREATE FUNCTION fail_first_record() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               IF nextval('record_attempts') = 1 THEN
                   RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                       MESSAGE = 'injected serialization failure';
               END IF;
               RETURN NEW;
           END $$;
           CREATE TRIGGER fail_first_record BEFORE INSERT ON run_decisions
               FOR EACH ROW EXECUTE FUNCTION fail_first_record();"#,
    )
    .execute(&h.pool)
    .await
    .unwrap();
}

async fn record_attempts(h: &Harness) -> i64 {
    sqlx::query_scalar("SELECT last_value FROM record_attempts")
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

/// Asserts that the gates answered with a transient store error, not a verdict.
fn assert_transient(result: Result<DecisionVerdict, CoordinatorError>) {
    match result {
        Err(CoordinatorError::Store(e)) => {
            assert!(e.is_transient(), "{e:?}");
            assert!(
                matches!(e.code(), "database_conflict" | "database_unavailable"),
                "a transient class, named: {}",
                e.code()
            );
        }
        other => panic!("expected a transient store error, got {other:?}"),
    }
}

/// Asserts that nothing happened to the run: its row as `before`, no decision, no audit event.
async fn assert_untouched(h: &Harness, card: &Card, before: &Value) {
    assert_eq!(
        &h.row(card.run_id).await,
        before,
        "the run row is unchanged"
    );
    assert!(
        h.decisions(card.run_id).await.is_empty(),
        "nothing recorded"
    );
    assert!(
        h.decision_events(card.run_id).await.is_empty(),
        "nothing audited"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_serialization_failure_while_recording_an_approval_is_an_error_and_its_redelivery_is_accepted(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    fail_the_first_record_with_a_serialization_failure(&h).await;
    let before = h.row(card.run_id).await;
    let d = card.decision(true, "admin");

    assert_transient(h.coordinator.take_decision(&bytes(&d), Some(INBOX)).await);
    assert_eq!(record_attempts(&h).await, 1, "the record was attempted");
    assert_untouched(&h, &card, &before).await;

    // The requeued delivery is gated afresh: not a replay, and it releases the turn.
    let again = h.decide(&d, Some(INBOX)).await;
    assert!(again.is_accepted(), "{:?}", again.outcome);
    assert!(!again.replayed);
    assert_eq!(again.dispatch.map(|d| d.segment), Some(SegmentKind::Resume));
    assert_eq!(h.decisions(card.run_id).await.len(), 1);
    assert_eq!(h.row(card.run_id).await["status"], "queued");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn every_transient_sqlstate_is_an_error_and_any_other_refusal_to_store_is_not_auditable(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    inject_errors_from_a_table(&h).await;
    let before = h.row(card.run_id).await;

    // A connection exception, a serialization failure, a deadlock, a server shutting down,
    // crashing or starting up.
    for code in ["08006", "40001", "40P01", "57P01", "57P02", "57P03"] {
        set_injected(&h, Some(code)).await;
        let d = card.decision(true, "admin");
        assert_transient(h.coordinator.take_decision(&bytes(&d), Some(INBOX)).await);
        assert_untouched(&h, &card, &before).await;
    }

    // A trigger's own exception, a check constraint, a permission: storing the audit would fail
    // the same way again.
    let mut refused = Vec::new();
    for code in ["P0001", "23514", "42501"] {
        set_injected(&h, Some(code)).await;
        let d = card.decision(true, "admin");
        let v = h.decide(&d, Some(INBOX)).await;
        assert_refused(&v, &d, "not_auditable");
        assert!(!v.replayed);
        assert_untouched(&h, &card, &before).await;
        refused.push(d);
    }

    // `not_auditable` is not recorded, so the producer may send the same decision again; once
    // the audit can be stored it releases the turn.
    set_injected(&h, None).await;
    let again = h.decide(&refused[0], Some(INBOX)).await;
    assert!(again.is_accepted(), "{:?}", again.outcome);
    assert!(!again.replayed);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approval_whose_connection_is_terminated_while_it_records_is_an_error_and_the_run_stays_waiting(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;
    let d = card.decision(true, "admin");

    // The decision passes its gates and its release waits on the run row; then its backend is
    // terminated, as a failover or an operator's pg_terminate_backend would.
    let lock = h.lock_run(card.run_id).await;
    let decider = {
        let coordinator = h.coordinator.clone();
        let body = bytes(&d);
        tokio::spawn(async move { coordinator.take_decision(&body, Some(INBOX)).await })
    };
    h.wait_for_lock_waiters(1).await;
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'
           AND pid <> pg_backend_pid()",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(terminated, 1);
    assert_transient(decider.await.unwrap());
    lock.rollback().await.unwrap();
    assert_untouched(&h, &card, &before).await;

    let again = h.decide(&d, Some(INBOX)).await;
    assert!(again.is_accepted(), "{:?}", again.outcome);
    assert!(!again.replayed);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_service_holds_an_approval_that_met_a_transient_error_and_accepts_it_when_it_gates_it_again(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    fail_the_first_record_with_a_serialization_failure(&h).await;

    let amqp = std::env::var("AMQP_ADDR")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let mut config = QueueConfig::new(
        amqp,
        Topology::new(format!("coordinator-it-{}", Uuid::now_v7())),
    );
    config.auto_delete = true;
    let broker = Broker::connect(config).await.unwrap();
    let producer = broker.user().expect("the connection has a user");
    producers::allow(&h.pool, &producer, ProducerKind::Approver, ANY)
        .await
        .unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(countersign_coordinator::service::run(
        h.coordinator.clone(),
        broker.clone(),
        async {
            let _ = stopped.await;
        },
    ));

    let reply_to = broker.declare_private_queue().await.unwrap();
    let mut replies = broker.consume(&reply_to, 1).await.unwrap();
    let d = card.decision(true, "admin");
    broker
        .publish_message(
            &broker.topology().decisions(),
            &bytes(&d),
            &MessageProperties {
                user_id: Some(producer),
                reply_to: Some(reply_to),
                correlation_id: Some("c1".into()),
            },
        )
        .await
        .unwrap();

    // The first attempt met the serialization failure and answered nothing; the delivery was
    // held, not requeued, and the only reply is that of the second attempt.
    let delivery = tokio::time::timeout(Duration::from_secs(30), replies.next())
        .await
        .expect("a reply within 30 s")
        .unwrap()
        .unwrap();
    let reply: Value = serde_json::from_slice(&delivery.body).unwrap();
    delivery.ack().await.unwrap();
    assert_eq!(reply["event"], "decision.accepted", "{reply}");
    assert_eq!(reply["decision_id"], d["decision_id"]);
    assert_eq!(
        record_attempts(&h).await,
        2,
        "recorded on the second attempt"
    );
    assert_eq!(h.decisions(card.run_id).await.len(), 1);
    assert_eq!(h.row(card.run_id).await["status"], "queued");

    stop.send(()).unwrap();
    service.await.unwrap();
    broker.delete_topology().await.unwrap();
}
