//! What the connection answers: problems for what no route answers, `Connection: close` after
//! a body left unread, and unknown tokens counted against their address.

use serde_json::Value;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{config, harness, harness_with, Harness};

/// Writes `request` on a new connection and reads until the server closes it.
async fn exchange(h: &Harness, request: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

/// The status, the lower-cased head and the JSON body of the first response in `response`.
fn parsed(response: &str) -> (u16, String, Value) {
    let (head, rest) = response.split_once("\r\n\r\n").expect("a response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let head = head.to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    let body = serde_json::from_str(&rest[..length.min(rest.len())]).unwrap_or(Value::Null);
    (status, head, body)
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_uri_too_long_and_an_unknown_path_are_answered_as_problems(pool: PgPool) {
    let h = harness(pool).await;
    let long = format!(
        "GET /v1/runs/{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let (status, head, body) = parsed(&exchange(&h, long.as_bytes()).await);
    assert_eq!(status, 414, "{head}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    assert!(head.contains("connection: close"), "{head}");
    assert!(head.contains("content-security-policy:"), "{head}");
    assert_eq!(body["code"], "uri_too_long");

    let (status, head, body) = parsed(&exchange(&h, b"GET\x01 / HTTP/1.1\r\n\r\n").await);
    assert_eq!(status, 400, "{head}");
    assert_eq!(body["code"], "malformed_request");

    for path in ["/nothing", "/v2/runs", "/favicon.ico"] {
        h.send(axum::http::Method::GET, path, &[], None)
            .await
            .problem(404, "not_found");
    }
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_post_refused_before_its_body_is_read_closes_the_connection(pool: PgPool) {
    let h = harness(pool).await;
    let body = r#"{"agent": "seo", "prompt": "Improve page 12."}"#;
    let refused = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n",
        body.len()
    );
    let response = exchange(&h, refused.as_bytes()).await;
    let (status, head, problem) = parsed(&response);
    assert_eq!(status, 401, "{head}");
    assert_eq!(problem["code"], "unauthenticated");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(
        response.matches("HTTP/1.1 ").count(),
        1,
        "the connection closed after the refusal: {response}"
    );

    // A body read whole keeps the connection: both requests are answered on it.
    let token = h.token("admin").await;
    let read = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}\
         GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let response = exchange(&h, read.as_bytes()).await;
    let (status, head, _) = parsed(&response);
    assert_eq!(status, 202, "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    assert_eq!(response.matches("HTTP/1.1 ").count(), 2, "{response}");
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn unknown_tokens_count_against_their_address(pool: PgPool) {
    let h = harness_with(
        pool,
        countersign_api::ApiConfig {
            rate_per_minute: 1,
            rate_burst: 3,
            ..config()
        },
    )
    .await;
    let admin = h.token("admin").await;
    for _ in 0..3 {
        h.get("cst_guessed", "/v1/inbox")
            .await
            .problem(401, "unauthenticated");
    }
    // The address has spent its guesses: a fourth is refused before it costs a lookup, and so
    // is a real token from the same address until the bucket refills.
    let limited = h.get("cst_guessed", "/v1/inbox").await;
    limited.problem(429, "rate_limited");
    assert!(limited.header("retry-after").is_some());
    h.get(&admin, "/v1/inbox")
        .await
        .problem(429, "rate_limited");
    h.finish().await;
}
