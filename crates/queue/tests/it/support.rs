use std::future::Future;
use std::time::Duration;

use countersign_queue::{Broker, Consumer, Delivery, QueueConfig, Topology};
use countersign_testkit::amqp_addr;

/// A guard for something that must happen; never an assertion about timing.
pub const ARRIVES_WITHIN: Duration = Duration::from_secs(10);

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

/// A TCP proxy in front of RabbitMQ whose connections a test can cut, to lose a
/// connection the way a network does, without touching the broker.
pub struct Proxy {
    addr: std::net::SocketAddr,
    links: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start() -> Proxy {
        let upstream = upstream_authority(&amqp_addr());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let links = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let registry = links.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let link = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                registry.lock().unwrap().push(link.abort_handle());
            }
        });
        Proxy {
            addr,
            links,
            accept,
        }
    }

    /// `AMQP_ADDR` with the host and port of the proxy.
    pub fn amqp_addr(&self) -> String {
        let original = amqp_addr();
        original.replacen(&upstream_authority(&original), &self.addr.to_string(), 1)
    }

    /// Closes every proxied connection, both ways.
    pub fn cut(&self) {
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// `host:port` of an `amqp://user:password@host:port/vhost` address.
fn upstream_authority(addr: &str) -> String {
    let rest = addr.split_once("://").map_or(addr, |(_, r)| r);
    let authority = rest.split('/').next().unwrap();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5672")
    }
}
