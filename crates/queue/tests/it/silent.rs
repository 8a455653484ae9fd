//! A broker that stops answering without closing the connection — a node gone behind a
//! network partition — fails a publish with `publish_timeout` instead of holding it, and the
//! next publish goes out on a new connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use countersign_core::RunId;
use countersign_queue::{parse_segment, Broker};
use countersign_testkit::amqp_addr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{cleaning_up, next, test_config};

/// Forwards connections to the broker until `silent` is set; from then on it reads nothing
/// and writes nothing, and keeps every socket open.
async fn proxy(silent: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = broker_host();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pump(client_read, server_write, silent.clone()));
            tokio::spawn(pump(server_read, client_write, silent.clone()));
        }
    });
    port
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if silent.load(Ordering::SeqCst) {
            // Hold both sockets open, answering nothing.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        }
        let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(50), from.read(&mut buffer))
            .await
            .map(|r| r.map(|n| (n > 0).then_some(n)))
        else {
            continue;
        };
        let Some(n) = n else { return };
        if silent.load(Ordering::SeqCst) || to.write_all(&buffer[..n]).await.is_err() {
            continue;
        }
    }
}

/// `host:port` of `AMQP_ADDR`.
fn broker_host() -> String {
    let addr = amqp_addr();
    let rest = addr.split_once("://").map_or(addr.as_str(), |(_, r)| r);
    let authority = rest.split('/').next().unwrap();
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, h)| h)
        .to_owned()
}

#[tokio::test]
async fn a_publish_to_a_broker_gone_silent_fails_with_publish_timeout_and_the_next_reconnects() {
    // The topology is declared and cleaned up directly; the proxied broker is the one tested.
    let direct = Broker::connect(test_config()).await.unwrap();
    let silent = Arc::new(AtomicBool::new(false));
    let port = proxy(silent.clone()).await;
    let mut config = test_config();
    config.topology = direct.topology().clone();
    let real = broker_host();
    config.addr = amqp_addr().replace(&real, &format!("127.0.0.1:{port}"));
    // The proxy first, then the broker itself: where a cluster has another node.
    config.addr = format!("{},{}", config.addr, amqp_addr());
    config.publish_timeout = Duration::from_secs(2);
    let proxied = Broker::connect(config).await.unwrap();
    let d = direct.clone();
    cleaning_up(&direct, async move {
        let mut consumer = d.consume(&d.topology().segments(), 10).await.unwrap();
        let first = RunId::new();
        proxied.publish_segment(first).await.unwrap();
        assert_eq!(parse_segment(&next(&mut consumer).await.body), Ok(first));

        silent.store(true, Ordering::SeqCst);
        let held = tokio::time::timeout(
            Duration::from_secs(30),
            proxied.publish_segment(RunId::new()),
        )
        .await
        .expect("the publish is not held past its timeout");
        assert_eq!(held.expect_err("no confirm").code(), "publish_timeout");

        // The next publish reconnects: the proxy takes no new connection's bytes now, so it
        // goes to the next node of the list.
        let after = RunId::new();
        proxied.publish_segment(after).await.unwrap();
        let mut seen = Vec::new();
        while !seen.contains(&after) {
            seen.push(parse_segment(&next(&mut consumer).await.body).unwrap());
        }
    })
    .await;
}
