use std::future::Future;
use std::time::Duration;

use countersign_queue::{Broker, Consumer, Delivery, QueueConfig, Topology};

/// A guard for something that must happen; never an assertion about timing.
pub const ARRIVES_WITHIN: Duration = Duration::from_secs(10);

pub fn amqp_addr() -> String {
    std::env::var("AMQP_ADDR").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

pub fn test_config() -> QueueConfig {
    let mut config = QueueConfig::new(
        amqp_addr(),
        Topology::new(format!("test-{}", uuid::Uuid::now_v7())),
    );
    config.auto_delete = true;
    config.reconnect_attempts = 3;
    config
}

/// A broker on a fresh topology.
pub async fn broker() -> Broker {
    Broker::connect(test_config())
        .await
        .expect("RabbitMQ at AMQP_ADDR")
}

/// The next delivery, which must arrive.
pub async fn next(consumer: &mut Consumer) -> Delivery {
    tokio::time::timeout(ARRIVES_WITHIN, consumer.next())
        .await
        .expect("a delivery within the guard")
        .expect("the consumer is open")
        .expect("a delivery, not an error")
}

/// Whether a delivery arrives within `window` (for "must not arrive" checks).
pub async fn arrives_within(consumer: &mut Consumer, window: Duration) -> Option<Delivery> {
    match tokio::time::timeout(window, consumer.next()).await {
        Err(_elapsed) => None,
        Ok(d) => Some(d.expect("the consumer is open").expect("a delivery")),
    }
}

/// Runs `test` and then deletes the topology, also when the test failed.
pub async fn cleaning_up<Fut>(broker: &Broker, test: Fut)
where
    Fut: Future<Output = ()> + Send + 'static,
{
    let outcome = tokio::spawn(test).await;
    broker.delete_topology().await.expect("delete the topology");
    if let Err(failed) = outcome {
        std::panic::resume_unwind(failed.into_panic());
    }
}
