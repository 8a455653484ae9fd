use std::time::Duration;

use countersign_core::{Event, EventName, RunId};
use countersign_queue::{parse_segment, Broker, Declare, MessageProperties};

use crate::support::{arrives_within, cleaning_up, next, test_config, Proxy, ARRIVES_WITHIN};

#[tokio::test]
async fn declaring_the_topology_twice_with_the_same_prefix_succeeds() {
    let config = test_config();
    let first = Broker::connect(config.clone()).await.unwrap();
    let second = Broker::connect(config).await.unwrap();
    let (a, b) = (first.clone(), second.clone());
    cleaning_up(&first, async move {
        // They share the queues: what one publishes, the other consumes.
        let run = RunId::new();
        a.publish_segment(run).await.unwrap();
        let mut consumer = b.consume(&b.topology().segments(), 1).await.unwrap();
        let d = next(&mut consumer).await;
        assert_eq!(parse_segment(&d.body), Ok(run));
        d.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_message_requeued_past_the_delivery_limit_is_dead_lettered_by_the_quorum_queue() {
    let mut config = test_config();
    config.delivery_limit = 2;
    let broker = Broker::connect(config).await.unwrap();
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let run = RunId::new();
        b.publish_segment(run).await.unwrap();
        let segments = b.topology().segments();
        let mut consumer = b.consume(&segments, 1).await.unwrap();
        // The first delivery and `delivery_limit` more; each is requeued.
        for attempt in 0..=2 {
            let d = next(&mut consumer).await;
            assert_eq!(d.delivery_count(), attempt, "counted by the quorum queue");
            d.requeue().await.unwrap();
        }
        assert!(
            arrives_within(&mut consumer, Duration::from_millis(300))
                .await
                .is_none(),
            "delivered beyond the limit"
        );

        let mut dead = b.consume(&b.topology().dead_letters(), 1).await.unwrap();
        let d = next(&mut dead).await;
        assert_eq!(parse_segment(&d.body), Ok(run));
        assert_eq!(d.dead_letter_reason().as_deref(), Some("delivery_limit"));
        assert_eq!(d.dead_letter_source().as_deref(), Some(segments.as_str()));
        d.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_lost_connection_is_re_established_and_the_topology_declared_again() {
    let proxy = Proxy::start().await;
    let direct_config = test_config();
    let mut proxied_config = direct_config.clone();
    proxied_config.addr = proxy.amqp_addr();
    let proxied = Broker::connect(proxied_config).await.unwrap();
    let direct = Broker::connect(direct_config).await.unwrap();
    let d = direct.clone();
    cleaning_up(&direct, async move {
        let segments = proxied.topology().segments();
        let mut consumer = proxied.consume(&segments, 1).await.unwrap();
        assert!(proxied.is_healthy().await);

        proxy.cut();
        // The consumer ends (after an error saying why): its caller consumes again.
        tokio::time::timeout(ARRIVES_WITHIN, async {
            while let Some(item) = consumer.next().await {
                assert!(item.is_err(), "nothing was published");
            }
        })
        .await
        .expect("the consumer ends when its connection is lost");
        assert!(!proxied.is_healthy().await);

        // Meanwhile the broker lost the definitions.
        d.delete_topology().await.unwrap();

        let run = RunId::new();
        proxied.publish_segment(run).await.unwrap();
        assert!(proxied.is_healthy().await);
        let mut again = d.consume(&segments, 1).await.unwrap();
        let delivery = next(&mut again).await;
        assert_eq!(parse_segment(&delivery.body), Ok(run));
        delivery.ack().await.unwrap();
        drop(again);
        // And the proxied broker consumes again over its new connection.
        let mut resumed = proxied.consume(&segments, 1).await.unwrap();
        proxied.publish_segment(run).await.unwrap();
        next(&mut resumed).await.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_queue_that_exists_with_other_arguments_is_left_as_it_is() {
    let mut first = test_config();
    first.delivery_limit = 2;
    let mut second = first.clone();
    second.delivery_limit = 7;
    let broker = Broker::connect(first).await.unwrap();
    let b = broker.clone();
    cleaning_up(&broker, async move {
        // RabbitMQ refuses to declare an existing queue with other arguments; the second
        // process finds the queues and does not declare them again.
        let other = Broker::connect(second)
            .await
            .expect("connects to queues declared with another delivery limit");
        let run = RunId::new();
        other.publish_segment(run).await.unwrap();
        let mut consumer = b.consume(&b.topology().segments(), 1).await.unwrap();
        let d = next(&mut consumer).await;
        assert_eq!(parse_segment(&d.body), Ok(run));
        d.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_process_that_declares_nothing_refuses_to_start_on_a_missing_topology() {
    let mut config = test_config();
    config.declare = Declare::Nothing;
    let refused = Broker::connect(config.clone())
        .await
        .expect_err("nothing was declared under this prefix");
    assert_eq!(refused.code(), "topology_missing");
    assert!(
        refused
            .to_string()
            .contains(&config.topology.dead_letter_exchange()),
        "{refused}"
    );
    // It created nothing either: a second look finds the topology just as missing.
    let again = Broker::connect(config).await.expect_err("still missing");
    assert_eq!(again.code(), "topology_missing");
}

#[tokio::test]
async fn a_process_that_declares_nothing_works_on_the_topology_another_declared() {
    let declaring = test_config();
    let mut checking = declaring.clone();
    checking.declare = Declare::Nothing;
    let broker = Broker::connect(declaring).await.unwrap();
    cleaning_up(&broker, async move {
        let quiet = Broker::connect(checking).await.unwrap();
        let run = RunId::new();
        quiet.publish_segment(run).await.unwrap();
        let mut consumer = quiet
            .consume(&quiet.topology().segments(), 1)
            .await
            .unwrap();
        let d = next(&mut consumer).await;
        assert_eq!(parse_segment(&d.body), Ok(run));
        d.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_message_published_to_the_exchange_of_a_public_queue_reaches_that_queue() {
    let broker = Broker::connect(test_config()).await.unwrap();
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let properties = MessageProperties {
            user_id: b.user(),
            ..MessageProperties::default()
        };
        for queue in b.topology().public_queues() {
            let body = format!("{{\"to\":\"{queue}\"}}");
            b.publish_public(&queue, body.as_bytes(), &properties)
                .await
                .unwrap();
            let mut consumer = b.consume(&queue, 1).await.unwrap();
            let d = next(&mut consumer).await;
            assert_eq!(d.body, body.as_bytes());
            assert_eq!(d.user_id, b.user());
            d.ack().await.unwrap();
        }
    })
    .await;
}

/// Publishes `name` about `run` on the events exchange, as the outbox relay does.
async fn publish_event(broker: &Broker, name: EventName, run: RunId) {
    let body =
        Event::new(name, serde_json::json!({ "run_id": run })).to_json("2026-12-05T00:00:00Z");
    broker
        .publish_event_body(name.as_str(), &uuid::Uuid::now_v7().to_string(), &body)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_events_that_hand_a_run_to_the_workers_reach_the_segments_queue_and_no_other_does() {
    let broker = crate::support::broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let run = RunId::new();
        for name in [
            EventName::RunSuspended,
            EventName::RunAccepted,
            EventName::DecisionRefused,
            EventName::DecisionAccepted,
            EventName::RunCompleted,
        ] {
            publish_event(&b, name, run).await;
        }
        let mut consumer = b.consume(&b.topology().segments(), 8).await.unwrap();
        for expected in ["run.accepted", "decision.accepted"] {
            let d = next(&mut consumer).await;
            let body: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
            assert_eq!(body["event"], expected);
            assert_eq!(parse_segment(&d.body), Ok(run), "a wake-up for the run");
            d.ack().await.unwrap();
        }
        assert!(
            arrives_within(&mut consumer, Duration::from_millis(300))
                .await
                .is_none(),
            "only the two wake-up events reach the workers"
        );
    })
    .await;
}

#[tokio::test]
async fn a_topology_an_earlier_release_created_gets_the_wake_up_bindings_from_the_next_process() {
    // Durable exchanges, as in production: an auto-delete one would go with its last binding.
    let mut config = test_config();
    config.auto_delete = false;
    let first = Broker::connect(config.clone()).await.unwrap();
    let (b, topology) = (first.clone(), first.topology().clone());
    cleaning_up(&first, async move {
        // An earlier release's topology: the queue and the exchange, without the bindings.
        let connection =
            lapin::Connection::connect(&config.addr, lapin::ConnectionProperties::default())
                .await
                .unwrap();
        let channel = connection.create_channel().await.unwrap();
        for key in ["run.accepted", "decision.accepted"] {
            channel
                .queue_unbind(
                    topology.segments().as_str().into(),
                    topology.events_exchange().as_str().into(),
                    key.into(),
                    lapin::types::FieldTable::default(),
                )
                .await
                .unwrap();
        }
        let run = RunId::new();
        publish_event(&b, EventName::RunAccepted, run).await;
        let segments = topology.segments();
        assert_eq!(
            b.message_count(&segments).await.unwrap(),
            0,
            "unbound, the event reaches no worker"
        );

        // The next process to connect finds every entity in place and binds them again.
        let next_process = Broker::connect(config).await.unwrap();
        publish_event(&next_process, EventName::RunAccepted, run).await;
        let mut consumer = next_process.consume(&segments, 1).await.unwrap();
        let d = next(&mut consumer).await;
        assert_eq!(parse_segment(&d.body), Ok(run));
        d.ack().await.unwrap();
        let _ = connection.close(200, "done".into()).await;
    })
    .await;
}
