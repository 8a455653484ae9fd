//! The kit against the real thing: PostgreSQL at `DATABASE_URL`, and the stub over HTTP.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use countersign_testkit::{database_url, Database, ModelStub, Reply};
use serde_json::json;
use sqlx::{Connection, PgConnection};

/// Posts a chat request to the stub on `port`: (status line, the rest of the answer).
fn post(port: u16) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Hello."}]}).to_string();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: stub\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (status, rest) = answer.split_once("\r\n").unwrap();
    (status.to_owned(), rest.to_ascii_lowercase())
}

#[test]
fn the_stub_answers_in_turn_and_holds_a_reply_until_the_test_releases_it() {
    let stub = ModelStub::replying(vec![
        Reply::too_many_requests(1),
        Reply::chat("Held.", &[]).held(),
        Reply::chat("Done.", &[("read_page", json!({"uid": 12}))]),
    ]);
    let (status, rest) = post(stub.port());
    assert!(status.ends_with("429 Too Many Requests"), "{status}");
    assert!(rest.contains("retry-after: 1"), "{rest}");

    let port = stub.port();
    let held = std::thread::spawn(move || post(port));
    let asked = Instant::now();
    while stub.in_flight() == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "the request arrives"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!held.is_finished(), "the reply is held");
    stub.release();
    let (status, rest) = held.join().unwrap();
    assert!(
        status.ends_with("200 OK") && rest.contains("held."),
        "{status} {rest}"
    );

    let (_, rest) = post(stub.port());
    assert!(rest.contains("read_page"), "{rest}");
    assert_eq!(stub.bodies()[0]["messages"][0]["content"], "Hello.");
    assert_eq!((stub.requests().len(), stub.in_flight()), (3, 0));
}

async fn exists(name: &str) -> bool {
    let mut conn = PgConnection::connect(&database_url()).await.unwrap();
    sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_throwaway_database_goes_when_dropped_unless_kept() {
    let db = Database::create("testkit_kit").await;
    let name = db.name().to_owned();
    let mut conn = db.connect().await;
    sqlx::query("CREATE TABLE t (n int)")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(db);
    assert!(!exists(&name).await, "dropped, the connection still open");

    let kept = Database::create("testkit_kept").await.keep();
    assert!(exists(&kept).await, "kept");
    Database::create_on(&database_url(), &kept)
        .await
        .unwrap()
        .remove()
        .await
        .unwrap();
    assert!(!exists(&kept).await, "replaced, then removed");
}

/// An echo server on a loopback port: each connection gets back what it sends.
fn echo_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Sends `text` and reads as many bytes back, within `within`.
fn round_trip(
    stream: &mut std::net::TcpStream,
    text: &str,
    within: Duration,
) -> std::io::Result<String> {
    stream.set_read_timeout(Some(within))?;
    stream.write_all(text.as_bytes())?;
    let mut back = vec![0u8; text.len()];
    stream.read_exact(&mut back)?;
    Ok(String::from_utf8_lossy(&back).into_owned())
}

#[test]
fn the_proxy_passes_holds_while_blackholed_delivers_what_it_held_once_healed_and_resets() {
    let proxy = countersign_testkit::Proxy::start(&format!("127.0.0.1:{}", echo_server()));
    let mut client = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    assert_eq!(
        round_trip(&mut client, "pass", Duration::from_secs(5)).unwrap(),
        "pass"
    );

    // Silent: nothing comes back, nothing is closed.
    proxy.blackhole();
    let silent = round_trip(&mut client, "held", Duration::from_millis(500));
    let kind = silent.expect_err("nothing passes a blackhole").kind();
    assert!(
        matches!(
            kind,
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{kind:?}"
    );
    // A connection opened meanwhile is accepted and answered nothing either.
    let mut late = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    late.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    late.write_all(b"late").unwrap();
    assert!(
        late.read(&mut [0u8; 4]).is_err(),
        "the late connection is answered nothing"
    );

    // Healed: what was held arrives, and both connections work.
    proxy.pass();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut held = [0u8; 4];
    client.read_exact(&mut held).unwrap();
    assert_eq!(&held, b"held");
    late.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut late_back = [0u8; 4];
    late.read_exact(&mut late_back).unwrap();
    assert_eq!(&late_back, b"late");

    // Slow, then reset.
    proxy.delay(Duration::from_millis(50));
    assert_eq!(
        round_trip(&mut client, "slow", Duration::from_secs(5)).unwrap(),
        "slow"
    );
    proxy.pass();
    proxy.reset();
    let mut after = [0u8; 1];
    let closed = client.read(&mut after);
    assert!(
        matches!(&closed, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
            || matches!(closed, Ok(0)),
        "the connection was closed by a reset: {closed:?}"
    );
    // New connections go through again.
    let mut again = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    assert_eq!(
        round_trip(&mut again, "again", Duration::from_secs(5)).unwrap(),
        "again"
    );
}
