use countersign_core::RunId;
use countersign_queue::parse_segment;

use crate::support::{arrives_within, broker, cleaning_up, next};

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
        // A second consumer sees nothing: the ack removed the message.
        let mut again = b.consume(&b.topology().segments(), 1).await.unwrap();
        assert!(
            arrives_within(&mut again, std::time::Duration::from_millis(300))
                .await
                .is_none()
        );
    })
    .await;
}
