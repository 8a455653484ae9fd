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
