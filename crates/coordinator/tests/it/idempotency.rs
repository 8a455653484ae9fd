//! Idempotency that tells the truth: a decision id is bound to the run, card and body it was
//! first recorded with, a request id to its producer and its request; anything else naming
//! them is refused `idempotency_conflict` and changes nothing. And a run the approver may not
//! see is answered as one that does not exist.

use std::time::Duration;

use countersign_coordinator::producers::{self, ANY};
use countersign_coordinator::{service, ProducerKind, RequestOutcome};
use countersign_core::RunId;
use countersign_queue::{Broker, Consumer, Delivery, MessageProperties, QueueConfig, Topology};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    assert_refused, bytes, harness, request, Harness, AGENT, DESK, INBOX, PORTAL,
};

/// Asserts an `idempotency_conflict`: published as a refusal (by the caller, since nothing
/// recorded it), dispatching nothing, no replay.
fn assert_conflict(v: &countersign_coordinator::DecisionVerdict, d: &Value) {
    assert_refused(v, d, "idempotency_conflict");
    assert!(!v.replayed);
    assert_eq!(
        v.unannounced().map(|e| e.name.as_str()),
        Some("decision.refused"),
        "nothing recorded it, so the caller announces it"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_id_sent_again_for_another_run_is_an_idempotency_conflict_and_leaves_that_run_waiting(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let a = h.suspended_run("editor").await;
    let b = h.suspended_run("editor").await;
    let denial = a.decision(false, "admin");
    assert!(h.decide(&denial, Some(INBOX)).await.is_accepted());
    let before = h.row(b.run_id).await;

    // The same decision id, on run B's own card.
    let mut on_b = b.decision(false, "admin");
    on_b["decision_id"] = denial["decision_id"].clone();
    let v = h.decide(&on_b, Some(INBOX)).await;
    assert_conflict(&v, &on_b);
    assert_eq!(h.row(b.run_id).await, before, "run B is exactly as it was");
    assert!(h.decisions(b.run_id).await.is_empty(), "nothing recorded");
    assert!(h.decision_events(b.run_id).await.is_empty(), "nor audited");

    // Run A's record is untouched, and its own replay still answers what it answered.
    let replay = h.decide(&denial, Some(INBOX)).await;
    assert!(replay.is_accepted() && replay.replayed);
    assert_eq!(h.decisions(a.run_id).await.len(), 1);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_id_sent_again_on_another_card_or_with_another_body_is_an_idempotency_conflict(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let mut first = card.decision(false, "restricted");
    first["comment"] = json!("Not this image.");
    // `restricted` may not decide on the run, but the desk follows it: a recorded refusal.
    assert_refused(&h.decide(&first, Some(DESK)).await, &first, "access_denied");
    let before = h.row(card.run_id).await;

    let changes: [(&str, Value); 6] = [
        ("approved", json!(true)),
        ("comment", json!("Another comment.")),
        ("comment", Value::Null),
        ("approver", json!("admin")),
        ("suspension_seq", json!(2)),
        ("turn_digest", json!("f".repeat(64))),
    ];
    for (field, value) in changes {
        let mut other = first.clone();
        other[field] = value;
        let v = h.decide(&other, Some(DESK)).await;
        assert_conflict(&v, &other);
    }
    assert_eq!(h.row(card.run_id).await, before, "the run is as it was");
    assert_eq!(
        h.decisions(card.run_id).await.len(),
        1,
        "one record, the first"
    );
    assert_eq!(h.decision_events(card.run_id).await.len(), 1);

    // The same run, card and body: the recorded outcome.
    let replay = h.decide(&first, Some(DESK)).await;
    assert_refused(&replay, &first, "access_denied");
    assert!(replay.replayed);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_on_a_run_the_approver_may_not_see_is_answered_as_for_a_missing_run_and_joins_no_trail(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;

    // `restricted` may not decide on editor's run, and the inbox may not follow it: the right
    // card and a wrong one are answered alike, and alike with a run that does not exist.
    let right = card.decision(true, "restricted");
    let mut wrong = card.decision(true, "restricted");
    wrong["turn_digest"] = json!("f".repeat(64));
    let mut missing = card.decision(true, "restricted");
    missing["run_id"] = json!(RunId::new());
    for d in [&right, &wrong, &missing] {
        assert_refused(&h.decide(d, Some(INBOX)).await, d, "not_awaiting_approval");
    }
    assert_eq!(h.row(card.run_id).await, before);
    assert!(
        h.decision_events(card.run_id).await.is_empty(),
        "the run's history shows nothing of them"
    );
    // Recorded all the same, so a replay answers the same.
    let again = h.decide(&right, Some(INBOX)).await;
    assert!(again.replayed);
    assert_refused(&again, &right, "not_awaiting_approval");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_request_id_is_the_producers_own_and_another_request_under_it_is_a_conflict(
    pool: PgPool,
) {
    let h = harness(pool).await;
    producers::allow(&h.pool, "scheduler", ProducerKind::ActingUser, "editor")
        .await
        .unwrap();
    let take = |body: Value, producer: &'static str| {
        let c = h.coordinator.clone();
        async move {
            c.take_run_request(&bytes(&body), Some(producer))
                .await
                .unwrap()
        }
    };
    let portal = request("editor", AGENT);
    let first = take(portal.clone(), PORTAL).await;
    assert!(first.created);

    // Another producer's same id is another request: a run of its own, not the portal's.
    let scheduled = take(portal.clone(), "scheduler").await;
    assert!(scheduled.created);
    assert_ne!(scheduled.run_id, first.run_id);

    // The portal's own retry is the duplicate it always was.
    let retry = take(portal.clone(), PORTAL).await;
    assert_eq!((retry.run_id, retry.created), (first.run_id, false));

    // The same id with another prompt is refused and creates nothing.
    let runs = h.runs().await;
    let mut other = portal.clone();
    other["prompt"] = json!("Delete page 12.");
    let refused = take(other, PORTAL).await;
    assert_eq!(refused.outcome, RequestOutcome::IdempotencyConflict);
    assert_eq!(refused.run_id, None, "the first request's run is not told");
    let event = refused.event.expect("announced");
    assert_eq!(event.name, "run.refused");
    assert_eq!(event.fields["outcome"], "idempotency_conflict");
    assert_eq!(h.runs().await, runs);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_request_id_recorded_before_producers_were_is_matched_by_its_request(pool: PgPool) {
    let h = harness(pool).await;
    let portal = request("editor", AGENT);
    let first = h
        .coordinator
        .take_run_request(&bytes(&portal), Some(PORTAL))
        .await
        .unwrap();
    // As a run created before migration 0018 is stored.
    sqlx::query("UPDATE runs SET producer = NULL WHERE id = $1")
        .bind(first.run_id.unwrap().as_uuid())
        .execute(&h.pool)
        .await
        .unwrap();
    producers::allow(&h.pool, "scheduler", ProducerKind::ActingUser, "editor")
        .await
        .unwrap();

    for producer in [PORTAL, "scheduler"] {
        let again = h
            .coordinator
            .take_run_request(&bytes(&portal), Some(producer))
            .await
            .unwrap();
        assert_eq!((again.run_id, again.created), (first.run_id, false));
    }
    let mut other = portal.clone();
    other["acting_user"] = json!("admin");
    let refused = h
        .coordinator
        .take_run_request(&bytes(&other), Some(PORTAL))
        .await
        .unwrap();
    assert_eq!(refused.outcome, RequestOutcome::IdempotencyConflict);
    assert_eq!(h.runs().await, 1);
}

// Through the queues.

const ARRIVES_WITHIN: Duration = Duration::from_secs(10);

async fn broker() -> Broker {
    let addr = std::env::var("AMQP_ADDR")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let mut config = QueueConfig::new(
        addr,
        Topology::new(format!("test-idempotency-{}", Uuid::now_v7())),
    );
    config.auto_delete = true;
    Broker::connect(config)
        .await
        .expect("RabbitMQ at AMQP_ADDR")
}

async fn next(consumer: &mut Consumer) -> Value {
    let delivery: Delivery = tokio::time::timeout(ARRIVES_WITHIN, consumer.next())
        .await
        .expect("a delivery within the guard")
        .expect("the consumer is open")
        .expect("a delivery");
    let body = serde_json::from_slice(&delivery.body).expect("a JSON body");
    delivery.ack().await.unwrap();
    body
}

/// The refusals a producer is told over the queues, on `reply_to` and on the events exchange.
struct Producer {
    broker: Broker,
    user: String,
    replies: String,
    answers: Consumer,
    events: Consumer,
}

impl Producer {
    async fn new(h: &Harness) -> Producer {
        let broker = broker().await;
        let user = broker.user().expect("connected");
        for kind in [ProducerKind::Approver, ProducerKind::ActingUser] {
            producers::allow(&h.pool, &user, kind, ANY).await.unwrap();
        }
        let watch = broker.declare_private_queue().await.unwrap();
        broker.bind_events(&watch, "*.refused").await.unwrap();
        let events = broker.consume(&watch, 10).await.unwrap();
        let replies = broker.declare_private_queue().await.unwrap();
        let answers = broker.consume(&replies, 10).await.unwrap();
        Producer {
            broker,
            user,
            replies,
            answers,
            events,
        }
    }

    /// Publishes `body` to `queue` and returns its reply.
    async fn send(&mut self, queue: &str, body: &Value) -> Value {
        let properties = MessageProperties {
            user_id: Some(self.user.clone()),
            reply_to: Some(self.replies.clone()),
            correlation_id: Some("c".into()),
        };
        self.broker
            .publish_message(queue, &bytes(body), &properties)
            .await
            .unwrap();
        next(&mut self.answers).await
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn over_the_queues_an_idempotency_conflict_is_published_as_a_refusal_and_changes_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let mut producer = Producer::new(&h).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(service::run(
        h.coordinator.clone(),
        producer.broker.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let topology = producer.broker.topology().clone();
    let a = h.suspended_run("editor").await;
    let b = h.suspended_run("editor").await;
    let before = h.row(b.run_id).await;

    // Deny run A, then send its decision id for run B.
    let denial = a.decision(false, "admin");
    let reply = producer.send(&topology.decisions(), &denial).await;
    assert_eq!(reply["event"], "decision.accepted");
    let mut on_b = b.decision(false, "admin");
    on_b["decision_id"] = denial["decision_id"].clone();
    let reply = producer.send(&topology.decisions(), &on_b).await;
    assert_eq!(reply["event"], "decision.refused", "{reply}");
    assert_eq!(reply["outcome"], "idempotency_conflict");
    assert_eq!(reply["run_id"], json!(b.run_id));
    let event = next(&mut producer.events).await;
    assert_eq!(event["outcome"], "idempotency_conflict");
    assert_eq!(event["decision_id"], denial["decision_id"]);
    assert_eq!(h.row(b.run_id).await, before, "run B still waits as it was");

    // Its decision id again on run A, with another body: approved, not denied.
    let mut approval = denial.clone();
    approval["approved"] = json!(true);
    let reply = producer.send(&topology.decisions(), &approval).await;
    assert_eq!(reply["outcome"], "idempotency_conflict", "{reply}");
    let event = next(&mut producer.events).await;
    assert_eq!(event["run_id"], json!(a.run_id));
    assert_eq!(h.decisions(a.run_id).await.len(), 1, "the denial alone");

    // A request id sent again with another prompt.
    let asked = request("editor", AGENT);
    let reply = producer.send(&topology.run_requests(), &asked).await;
    assert_eq!(reply["event"], "run.accepted");
    let runs = h.runs().await;
    let mut other = asked.clone();
    other["prompt"] = json!("Delete page 12.");
    let reply = producer.send(&topology.run_requests(), &other).await;
    assert_eq!(reply["event"], "run.refused", "{reply}");
    assert_eq!(reply["outcome"], "idempotency_conflict");
    assert!(reply.get("run_id").is_none(), "{reply}");
    let event = next(&mut producer.events).await;
    assert_eq!(event["request_id"], asked["request_id"]);
    assert_eq!(h.runs().await, runs, "nothing was created");

    stop.send(()).unwrap();
    running.await.unwrap();
    producer.broker.delete_topology().await.unwrap();
}
