//! The coordinator's RabbitMQ service, against the real broker: who is answered, and what the
//! outbox relay publishes.

use std::time::Duration;

use countersign_coordinator::producers::{self, ANY};
use countersign_coordinator::{service, Coordinator, ProducerKind};
use countersign_queue::{
    Broker, Consumer, Delivery, MessageProperties, QueueConfig, Topology, REASON_HEADER,
};
use countersign_store::RunStatus;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{bytes, harness, Harness};

/// A guard for what must arrive; never an assertion about timing.
const ARRIVES_WITHIN: Duration = Duration::from_secs(10);

async fn broker() -> Broker {
    let addr = std::env::var("AMQP_ADDR")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let mut config = QueueConfig::new(
        addr,
        Topology::new(format!("test-coordinator-{}", Uuid::now_v7())),
    );
    config.auto_delete = true;
    Broker::connect(config)
        .await
        .expect("RabbitMQ at AMQP_ADDR")
}

async fn next(consumer: &mut Consumer) -> Delivery {
    tokio::time::timeout(ARRIVES_WITHIN, consumer.next())
        .await
        .expect("a delivery within the guard")
        .expect("the consumer is open")
        .expect("a delivery")
}

fn json(delivery: &Delivery) -> Value {
    serde_json::from_slice(&delivery.body).expect("a JSON body")
}

/// The harness and a broker whose user may send decisions for any approver; that user.
async fn with_approver_producer(pool: PgPool) -> (Harness, Broker, String) {
    let h = harness(pool).await;
    let broker = broker().await;
    let user = broker.user().expect("connected");
    producers::allow(&h.pool, &user, ProducerKind::Approver, ANY)
        .await
        .unwrap();
    (h, broker, user)
}

/// The coordinator's service over `broker`, until the sender is used; its task.
fn serve(
    coordinator: &Coordinator,
    broker: &Broker,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(service::run(
        coordinator.clone(),
        broker.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    (stop, running)
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn only_an_authenticated_producer_is_answered_and_the_relay_announces_its_outcome(
    pool: PgPool,
) {
    let (h, broker, user) = with_approver_producer(pool).await;
    let card = h.suspended_run("editor").await;

    let watch = broker.declare_private_queue().await.unwrap();
    broker.bind_events(&watch, "decision.*").await.unwrap();
    let mut events = broker.consume(&watch, 10).await.unwrap();
    let replies = broker.declare_private_queue().await.unwrap();
    let mut answers = broker.consume(&replies, 10).await.unwrap();
    let (stop, running) = serve(&h.coordinator, &broker);

    // The same decision, first without a broker-validated user, then as the allowed user.
    let decision = card.decision(true, "approver");
    let ask = |user_id: Option<String>| MessageProperties {
        user_id,
        reply_to: Some(replies.clone()),
        correlation_id: Some("c-1".into()),
    };
    let queue = broker.topology().decisions();
    broker
        .publish_message(&queue, &bytes(&decision), &ask(None))
        .await
        .unwrap();
    broker
        .publish_message(&queue, &bytes(&decision), &ask(Some(user.clone())))
        .await
        .unwrap();

    // One consumer takes them in order, so the first reply to arrive is the only one: the
    // unauthenticated copy was dead-lettered without an answer.
    let reply = next(&mut answers).await;
    assert_eq!(reply.correlation_id.as_deref(), Some("c-1"));
    let body = json(&reply);
    assert_eq!(body["event"], "decision.accepted");
    assert_eq!(body["decision_id"], decision["decision_id"]);
    reply.ack().await.unwrap();
    let mut dead = broker
        .consume(&broker.topology().dead_letters(), 10)
        .await
        .unwrap();
    let refused = next(&mut dead).await;
    assert_eq!(
        refused.header(REASON_HEADER).as_deref(),
        Some("unauthenticated_producer")
    );
    refused.ack().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), answers.next())
            .await
            .is_err(),
        "no second reply"
    );

    // The relay published the event the decision's transaction wrote, with its id.
    let announced = next(&mut events).await;
    let event = json(&announced);
    assert_eq!(event["event"], "decision.accepted");
    assert_eq!(event["decision_id"], decision["decision_id"]);
    let trail = h.store.events(card.run_id).await.unwrap();
    let recorded = trail
        .iter()
        .find(|e| e.kind == "decision.accepted")
        .expect("in the audit trail");
    assert_eq!(event["decision_id"], recorded.payload["decision_id"]);
    assert_eq!(
        announced.message_id.as_deref(),
        event["event_id"].as_str(),
        "the event id as message id"
    );
    announced.ack().await.unwrap();

    stop.send(()).unwrap();
    running.await.unwrap();
    let left = h.store.outbox(card.run_id).await.unwrap();
    assert!(
        left.is_empty(),
        "everything the run announced went out and left the outbox: {left:?}"
    );
    broker.delete_topology().await.unwrap();
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_waiting_on_its_run_does_not_hold_up_another_runs_decision(pool: PgPool) {
    let (h, broker, user) = with_approver_producer(pool).await;
    let held = h.suspended_run("editor").await;
    let free = h.suspended_run("editor").await;
    let replies = broker.declare_private_queue().await.unwrap();
    let mut answers = broker.consume(&replies, 10).await.unwrap();
    let (stop, running) = serve(&h.coordinator, &broker);

    // A colleague holds the first run's row: its release waits at its guarded UPDATE.
    let mut colleague = h.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM runs WHERE id = $1 FOR UPDATE")
        .bind(held.run_id.as_uuid())
        .execute(&mut *colleague)
        .await
        .unwrap();
    let ask = |correlation: &str| MessageProperties {
        user_id: Some(user.clone()),
        reply_to: Some(replies.clone()),
        correlation_id: Some(correlation.into()),
    };
    let queue = broker.topology().decisions();
    for (card, correlation) in [(&held, "held"), (&free, "free")] {
        let decision = bytes(&card.decision(true, "approver"));
        broker
            .publish_message(&queue, &decision, &ask(correlation))
            .await
            .unwrap();
    }

    // The second run's decision is answered while the first still waits.
    let first = next(&mut answers).await;
    assert_eq!(first.correlation_id.as_deref(), Some("free"));
    assert_eq!(json(&first)["event"], "decision.accepted");
    first.ack().await.unwrap();
    let waiting = h.store.run(held.run_id).await.unwrap().unwrap();
    assert_eq!(waiting.status, RunStatus::WaitingForApproval);

    // Once the colleague commits, the first is released too.
    colleague.commit().await.unwrap();
    let second = next(&mut answers).await;
    assert_eq!(second.correlation_id.as_deref(), Some("held"));
    assert_eq!(json(&second)["event"], "decision.accepted");
    second.ack().await.unwrap();

    stop.send(()).unwrap();
    running.await.unwrap();
    broker.delete_topology().await.unwrap();
}
