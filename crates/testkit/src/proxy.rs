//! A TCP proxy a test puts between one service and PostgreSQL or RabbitMQ, to make the network
//! between them fail the ways networks fail: silent (packets dropped, nothing closed), reset,
//! or slow.
//!
//! It serves on a thread and runtime of its own, so it forwards whatever the test's own threads
//! are doing. Each connection a client opens gets one to the upstream; bytes go both ways in
//! chunks. [`Proxy::blackhole`] makes the link silent without closing anything: a chunk read is
//! held and nothing more is read, so each side's kernel buffers fill and its writes stall, as
//! when the network drops every packet; connections opened meanwhile are accepted and get no
//! answer. [`Proxy::pass`] heals it: what was held is delivered, as TCP retransmits it after a
//! partition, and traffic flows again. [`Proxy::reset`] closes every connection with a reset,
//! as a restarted load balancer or a dead host's neighbour router does. [`Proxy::delay`] holds
//! every chunk for a while before it goes on.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// What the link does with the bytes it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Forwards them as they come.
    Pass,
    /// Holds them, and reads no more, until it passes again.
    Blackhole,
    /// Forwards each chunk after this long.
    Delay(Duration),
}

/// A running proxy to one upstream address; stops (resetting every connection) when dropped.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    link: watch::Sender<Link>,
    resets: watch::Sender<u64>,
    _stop: oneshot::Sender<()>,
}

impl Proxy {
    /// A proxy on a free loopback port to `upstream` (`host:port`), passing.
    pub fn start(upstream: &str) -> Proxy {
        let upstream = upstream.to_owned();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.set_nonblocking(true).expect("a listener");
        let port = listener.local_addr().expect("a local address").port();
        let (link, links) = watch::channel(Link::Pass);
        let (resets, reset) = watch::channel(0u64);
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the proxy's runtime");
            // Once this returns the runtime goes, and every connection with it.
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("a listener");
                tokio::select! {
                    () = accept(listener, upstream, links, reset) => {}
                    _ = stopped => {}
                }
            });
        });
        Proxy {
            port,
            link,
            resets,
            _stop: stop,
        }
    }

    /// The proxy to the host and port of `url` (a `postgres://` or `amqp://` address).
    pub fn to(url: &str) -> Proxy {
        Proxy::start(&authority(url).1)
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `url` with its host and port replaced by the proxy's: the address a service connects to
    /// through it.
    pub fn address_for(&self, url: &str) -> String {
        let (span, _) = authority(url);
        format!(
            "{}127.0.0.1:{}{}",
            &url[..span.start],
            self.port,
            &url[span.end..]
        )
    }

    /// Traffic flows again; what was held goes first.
    pub fn pass(&self) {
        self.link.send_replace(Link::Pass);
    }

    /// The link goes silent, nothing closed.
    pub fn blackhole(&self) {
        self.link.send_replace(Link::Blackhole);
    }

    /// Every chunk is held `by` before it goes on.
    pub fn delay(&self, by: Duration) {
        self.link.send_replace(Link::Delay(by));
    }

    /// Every open connection is closed with a reset, both to the client and to the upstream;
    /// new ones are accepted as the link says.
    pub fn reset(&self) {
        self.resets.send_modify(|n| *n += 1);
    }
}

/// Where `url`'s host and port are: their byte range in it, and the address they name (the
/// scheme's default port added when it names none).
fn authority(url: &str) -> (std::ops::Range<usize>, String) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[after_scheme..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let at = rest[..end].rfind('@').map_or(0, |i| i + 1);
    let host_port = &rest[at..end];
    let addr = if host_port.contains(':') {
        host_port.to_owned()
    } else if url.starts_with("amqp") {
        format!("{host_port}:5672")
    } else {
        format!("{host_port}:5432")
    };
    (after_scheme + at..after_scheme + end, addr)
}

async fn accept(
    listener: TcpListener,
    upstream: String,
    links: watch::Receiver<Link>,
    resets: watch::Receiver<u64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve(
            client,
            upstream.clone(),
            links.clone(),
            resets.clone(),
        ));
    }
}

/// Waits until the link is not a blackhole; `false` when the proxy is gone.
async fn passable(links: &mut watch::Receiver<Link>) -> bool {
    links.wait_for(|l| *l != Link::Blackhole).await.is_ok()
}

/// One client's connection, until either side closes it or the proxy resets it.
async fn serve(
    mut client: TcpStream,
    upstream: String,
    mut links: watch::Receiver<Link>,
    mut resets: watch::Receiver<u64>,
) {
    resets.mark_unchanged();
    // A connection opened while the link is silent gets no answer, as a SYN dropped would.
    let mut upstream = tokio::select! {
        connected = async {
            if !passable(&mut links).await {
                return None;
            }
            TcpStream::connect(&upstream).await.ok()
        } => match connected {
            Some(upstream) => upstream,
            None => return,
        },
        _ = resets.changed() => {
            reset_on_drop(&client);
            return;
        }
    };
    let reset = {
        let (mut client_read, mut client_write) = client.split();
        let (mut upstream_read, mut upstream_write) = upstream.split();
        let both = async {
            tokio::join!(
                pump(&mut client_read, &mut upstream_write, links.clone()),
                pump(&mut upstream_read, &mut client_write, links.clone()),
            )
        };
        tokio::select! {
            _ = both => false,
            _ = resets.changed() => true,
        }
    };
    if reset {
        reset_on_drop(&client);
        reset_on_drop(&upstream);
    }
}

/// Makes dropping `stream` send a reset instead of a FIN. (A zero linger does not block on
/// drop, which is what tokio's deprecation warns of for a positive one.)
#[allow(deprecated)]
fn reset_on_drop(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Copies `from` to `to` chunk by chunk, each as the link says; closes `to`'s writing side when
/// `from` ends.
async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    mut links: watch::Receiver<Link>,
) {
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Held while the link is silent; nothing more is read meanwhile.
        if !passable(&mut links).await {
            return;
        }
        let link = *links.borrow();
        if let Link::Delay(by) = link {
            tokio::time::sleep(by).await;
        }
        if to.write_all(&chunk[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_pointed_at_the_proxy_keeping_everything_but_its_host_and_port() {
        assert_eq!(
            authority("postgres://postgres@127.0.0.1:5432/db").1,
            "127.0.0.1:5432"
        );
        assert_eq!(
            authority("amqp://guest:guest@localhost/%2f").1,
            "localhost:5672"
        );
        let proxy = Proxy::start("127.0.0.1:9");
        let port = proxy.port();
        assert_eq!(
            proxy.address_for("postgres://postgres@127.0.0.1:5432/db?sslmode=disable"),
            format!("postgres://postgres@127.0.0.1:{port}/db?sslmode=disable")
        );
        assert_eq!(
            proxy.address_for("amqp://guest:guest@localhost/%2f"),
            format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
        );
    }
}
