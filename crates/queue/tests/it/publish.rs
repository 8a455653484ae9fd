use std::time::Duration;

use countersign_core::{Event, EventName, RunId};
use countersign_queue::{parse_segment, MessageProperties};
use serde_json::json;

use crate::support::{arrives_within, broker, cleaning_up, next};

const NOTHING_WITHIN: Duration = Duration::from_millis(300);

#[tokio::test]
async fn a_published_segment_wake_up_is_consumed_and_acked_once() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let run = RunId::new();
        b.publish_segment(run).await.unwrap();
        let mut consumer = b.consume(&b.topology().segments(), 1).await.unwrap();
        let delivery = next(&mut consumer).await;
        assert_eq!(parse_segment(&delivery.body), Ok(run));
        assert!(!delivery.redelivered);
        delivery.ack().await.unwrap();
        drop(consumer);
        // The ack removed it: a new consumer (whose channel would get back anything
        // unacknowledged) sees nothing.
        let mut again = b.consume(&b.topology().segments(), 1).await.unwrap();
        assert!(arrives_within(&mut again, NOTHING_WITHIN).await.is_none());
    })
    .await;
}

#[tokio::test]
async fn an_event_is_routed_by_its_name_to_a_matching_binding_only() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let runs = b.declare_private_queue().await.unwrap();
        let decisions = b.declare_private_queue().await.unwrap();
        b.bind_events(&runs, "run.*").await.unwrap();
        b.bind_events(&decisions, "decision.*").await.unwrap();
        let run = RunId::new();
        let event = Event::new(
            EventName::RunCompleted,
            json!({"run_id": run, "termination_reason": "completed"}),
        );
        b.publish_event(&event, "2026-11-30T10:00:00Z")
            .await
            .unwrap();

        let mut on_runs = b.consume(&runs, 1).await.unwrap();
        let got = next(&mut on_runs).await;
        let body: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(body, event.to_json("2026-11-30T10:00:00Z"));
        got.ack().await.unwrap();
        let mut on_decisions = b.consume(&decisions, 1).await.unwrap();
        assert!(arrives_within(&mut on_decisions, NOTHING_WITHIN)
            .await
            .is_none());
    })
    .await;
}

#[tokio::test]
async fn a_prebuilt_event_body_is_published_as_stored_with_its_event_id_as_message_id() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let runs = b.declare_private_queue().await.unwrap();
        b.bind_events(&runs, "run.*").await.unwrap();
        let event_id = uuid::Uuid::now_v7().to_string();
        let body = json!({
            "type": "countersign.event", "version": 1, "event": "run.cancelled",
            "event_id": event_id, "run_id": RunId::new(), "termination_reason": "cancelled",
            "at": "2026-11-30T10:00:00.123456Z",
        });
        b.publish_event_body("run.cancelled", &event_id, &body)
            .await
            .unwrap();

        let mut on_runs = b.consume(&runs, 1).await.unwrap();
        let got = next(&mut on_runs).await;
        let received: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(received, body);
        assert_eq!(got.message_id.as_deref(), Some(event_id.as_str()));
        got.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_user_id_set_by_the_producer_arrives_in_the_delivery() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let user = b.user().expect("connected");
        let queue = b.topology().run_requests();
        b.publish_to_queue(&queue, br#"{"n":1}"#, Some(&user))
            .await
            .unwrap();
        b.publish_to_queue(&queue, br#"{"n":2}"#, None)
            .await
            .unwrap();
        let mut consumer = b.consume(&queue, 2).await.unwrap();
        let first = next(&mut consumer).await;
        assert_eq!(first.body, br#"{"n":1}"#);
        assert_eq!(first.user_id.as_deref(), Some(user.as_str()));
        let second = next(&mut consumer).await;
        assert_eq!(second.user_id, None);
        first.ack().await.unwrap();
        second.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_message_claiming_another_user_is_refused_and_the_next_publish_succeeds() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let queue = b.topology().decisions();
        let refused = b
            .publish_to_queue(
                &queue,
                br#"{"forged":true}"#,
                Some("not-the-connection-user"),
            )
            .await
            .expect_err("the broker validates user_id");
        assert_eq!(refused.code(), "publish_refused", "{refused:?}");

        // The broker closed the publishing channel; the next publish gets a new one.
        let user = b.user().unwrap();
        b.publish_to_queue(&queue, br#"{"honest":true}"#, Some(&user))
            .await
            .unwrap();
        b.publish_segment(RunId::new()).await.unwrap();
        assert!(b.is_healthy().await);

        let mut consumer = b.consume(&queue, 5).await.unwrap();
        let only = next(&mut consumer).await;
        assert_eq!(only.body, br#"{"honest":true}"#);
        only.ack().await.unwrap();
        assert!(arrives_within(&mut consumer, NOTHING_WITHIN)
            .await
            .is_none());
    })
    .await;
}

#[tokio::test]
async fn publishing_to_a_queue_that_does_not_exist_is_an_error_not_a_silent_drop() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let missing = format!("{}.no-such-queue", b.topology().prefix);
        let err = b
            .publish_to_queue(&missing, b"{}", None)
            .await
            .expect_err("unroutable");
        assert_eq!(err.code(), "unroutable");
        // Not a channel error: the same channel keeps publishing.
        b.publish_segment(RunId::new()).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_reply_reaches_reply_to_with_the_correlation_id() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let replies = b.declare_private_queue().await.unwrap();
        let queue = b.topology().decisions();
        let request = MessageProperties {
            user_id: b.user(),
            reply_to: Some(replies.clone()),
            correlation_id: Some("c-42".into()),
        };
        b.publish_message(&queue, br#"{"decision":1}"#, &request)
            .await
            .unwrap();

        // The coordinator's side: answer where the producer asked.
        let mut inbound = b.consume(&queue, 1).await.unwrap();
        let delivery = next(&mut inbound).await;
        assert_eq!(delivery.reply_to.as_deref(), Some(replies.as_str()));
        assert_eq!(delivery.correlation_id.as_deref(), Some("c-42"));
        let outcome = json!({"outcome": "stale_turn"});
        b.publish_reply(
            delivery.reply_to.as_deref().unwrap(),
            delivery.correlation_id.as_deref(),
            &outcome,
        )
        .await
        .unwrap();
        delivery.ack().await.unwrap();

        // The producer's side.
        let mut answers = b.consume(&replies, 1).await.unwrap();
        let reply = next(&mut answers).await;
        assert_eq!(reply.correlation_id.as_deref(), Some("c-42"));
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&reply.body).unwrap(),
            outcome
        );
        reply.ack().await.unwrap();
    })
    .await;
}
