use std::time::Duration;

use countersign_core::RunId;
use countersign_queue::{parse_segment, ORIGINAL_USER_HEADER};

use crate::support::{arrives_within, broker, cleaning_up, next};

const NOTHING_WITHIN: Duration = Duration::from_millis(300);

/// Publishes a wake-up for each of `n` new runs, in order.
async fn publish_wake_ups(broker: &countersign_queue::Broker, n: usize) -> Vec<RunId> {
    let runs: Vec<RunId> = (0..n).map(|_| RunId::new()).collect();
    for run in &runs {
        broker.publish_segment(*run).await.unwrap();
    }
    runs
}

#[tokio::test]
async fn dead_letter_puts_the_body_and_the_reason_in_dead_letters_and_removes_the_original() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let queue = b.topology().decisions();
        let user = b.user().unwrap();
        let body = br#"{"type":"countersign.decision","version":1}"#;
        b.publish_to_queue(&queue, body, Some(&user)).await.unwrap();

        let mut inbound = b.consume(&queue, 1).await.unwrap();
        let poison = next(&mut inbound).await;
        poison
            .dead_letter(&b, "missing_field:decision_id")
            .await
            .unwrap();
        drop(inbound);

        let mut dead = b.consume(&b.topology().dead_letters(), 1).await.unwrap();
        let copy = next(&mut dead).await;
        assert_eq!(copy.body, body);
        assert_eq!(
            copy.dead_letter_reason().as_deref(),
            Some("missing_field:decision_id")
        );
        assert_eq!(copy.dead_letter_source().as_deref(), Some(queue.as_str()));
        assert_eq!(copy.header(ORIGINAL_USER_HEADER), Some(user));
        copy.ack().await.unwrap();

        // The original was acked after the copy was confirmed: nothing comes back.
        let mut again = b.consume(&queue, 1).await.unwrap();
        assert!(arrives_within(&mut again, NOTHING_WITHIN).await.is_none());
    })
    .await;
}

#[tokio::test]
async fn prefetch_limits_the_unacknowledged_deliveries() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let runs = publish_wake_ups(&b, 5).await;
        let mut consumer = b.consume(&b.topology().segments(), 2).await.unwrap();
        let first = next(&mut consumer).await;
        let second = next(&mut consumer).await;
        assert!(
            arrives_within(&mut consumer, NOTHING_WITHIN)
                .await
                .is_none(),
            "a third delivery arrived with two unacknowledged"
        );
        first.ack().await.unwrap();
        let third = next(&mut consumer).await;
        assert!(
            arrives_within(&mut consumer, NOTHING_WITHIN)
                .await
                .is_none(),
            "a fourth delivery arrived with two unacknowledged"
        );
        let seen: Vec<RunId> = [&second, &third]
            .iter()
            .map(|d| parse_segment(&d.body).unwrap())
            .collect();
        assert_eq!(seen, runs[1..3]);
        second.ack().await.unwrap();
        third.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_delivery_left_unsettled_comes_back_redelivered_to_the_next_consumer() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let run = RunId::new();
        b.publish_segment(run).await.unwrap();
        let mut consumer = b.consume(&b.topology().segments(), 1).await.unwrap();
        let abandoned = next(&mut consumer).await;
        assert!(!abandoned.redelivered);
        // A crash: neither the delivery nor its consumer settle anything.
        drop(abandoned);
        drop(consumer);
        let mut again = b.consume(&b.topology().segments(), 1).await.unwrap();
        let back = next(&mut again).await;
        assert_eq!(parse_segment(&back.body), Ok(run));
        assert!(back.redelivered);
        assert_eq!(back.delivery_count(), 1);
        back.ack().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_cancelled_consumer_hands_back_at_once_what_it_had_received_and_not_taken() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let runs = publish_wake_ups(&b, 5).await;
        let mut draining = b.consume(&b.topology().segments(), 5).await.unwrap();
        let taken = next(&mut draining).await;
        assert_eq!(parse_segment(&taken.body), Ok(runs[0]));
        // The broker has pushed the other four to it by now (its prefetch allows five).
        tokio::time::sleep(NOTHING_WITHIN).await;
        let mut other = b.consume(&b.topology().segments(), 5).await.unwrap();

        assert_eq!(
            draining.cancel().await.unwrap(),
            4,
            "four received, not taken"
        );
        // The other consumer gets them while the channel is still open for the one taken (a
        // draining worker's segments still run), not only once it closes.
        let mut handed: Vec<RunId> = Vec::new();
        for _ in 0..4 {
            let delivery = next(&mut other).await;
            assert!(delivery.redelivered);
            handed.push(parse_segment(&delivery.body).unwrap());
            delivery.ack().await.unwrap();
        }
        handed.sort_by_key(|r| r.as_uuid());
        let mut expected = runs[1..].to_vec();
        expected.sort_by_key(|r| r.as_uuid());
        assert_eq!(handed, expected);
        taken.ack().await.unwrap();
        assert!(arrives_within(&mut other, NOTHING_WITHIN).await.is_none());
    })
    .await;
}

/// Two wake-ups queued and a consumer watched over `idle` with one delivery of credit, which
/// it holds unsettled: deaf while the second waits ready, as a consumer the broker forgot.
async fn deafened(
    b: &countersign_queue::Broker,
    idle: Duration,
) -> (
    Vec<RunId>,
    countersign_queue::Consumer,
    countersign_queue::Delivery,
) {
    let runs = publish_wake_ups(b, 2).await;
    let mut deaf = b
        .consume(&b.topology().segments(), 1)
        .await
        .unwrap()
        .watch_ready(idle);
    let held = next(&mut deaf).await;
    (runs, deaf, held)
}

/// A consumer that gets nothing while its queue holds messages ready is lost: here it holds its
/// one delivery of credit unsettled, which deafens it as surely as a consumer the broker
/// forgot. Watched, it ends with `consume_failed` and then `None`, and consuming again gets
/// the message.
#[tokio::test]
async fn a_watched_consumer_that_gets_nothing_while_its_queue_holds_messages_ready_ends() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let (runs, mut deaf, held) = deafened(&b, Duration::from_millis(500)).await;
        let ended = tokio::time::timeout(crate::support::ARRIVES_WITHIN, deaf.next())
            .await
            .expect("the watch ends the consumer within the guard")
            .expect("an error first, saying why");
        assert_eq!(ended.unwrap_err().code(), "consume_failed");
        assert!(deaf.next().await.is_none(), "then the stream is over");

        let mut again = b.consume(&b.topology().segments(), 1).await.unwrap();
        let second = next(&mut again).await;
        assert_eq!(parse_segment(&second.body), Ok(runs[1]));
        second.ack().await.unwrap();
        held.ack().await.unwrap();
    })
    .await;
}

/// The watch asks the broker only when the consumer was idle, and an empty queue is no fault:
/// a watched consumer on an empty queue waits past many idle windows and takes the next message.
#[tokio::test]
async fn a_watched_consumer_on_an_empty_queue_waits_and_takes_the_next_message() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let idle = Duration::from_millis(100);
        let mut watched = b
            .consume(&b.topology().segments(), 1)
            .await
            .unwrap()
            .watch_ready(idle);
        assert!(arrives_within(&mut watched, idle * 10).await.is_none());
        let runs = publish_wake_ups(&b, 1).await;
        let woken = next(&mut watched).await;
        assert_eq!(parse_segment(&woken.body), Ok(runs[0]));
        woken.ack().await.unwrap();
    })
    .await;
}

/// A caller that waits on the consumer in a `select!` drops the `next` future whenever another
/// branch wins (a worker's poll tick): the watch counts the quiet from the first wait, so it
/// still ends a deaf consumer whose every wait is shorter than its window.
#[tokio::test]
async fn the_watch_counts_the_quiet_across_waits_a_select_dropped() {
    let broker = broker().await;
    let b = broker.clone();
    cleaning_up(&broker, async move {
        let idle = Duration::from_millis(600);
        let (_, mut deaf, held) = deafened(&b, idle).await;
        let deadline = tokio::time::Instant::now() + crate::support::ARRIVES_WITHIN;
        let ended = loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the watch ended nothing"
            );
            if let Ok(ended) = tokio::time::timeout(idle / 4, deaf.next()).await {
                break ended.expect("an error first, saying why");
            }
        };
        assert_eq!(ended.unwrap_err().code(), "consume_failed");
        held.ack().await.unwrap();
    })
    .await;
}
