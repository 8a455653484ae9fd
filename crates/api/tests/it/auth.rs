//! Credentials: tokens (hashed, listed, revoked), the trusted proxy header, the rate limit.

use std::net::IpAddr;

use axum::http::{HeaderName, Method};
use countersign_api::tokens;
use sqlx::PgPool;

use crate::support::{config, harness, harness_with};

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_request_without_a_valid_token_is_refused_unauthenticated(pool: PgPool) {
    let h = harness(pool).await;
    let none = h.send(Method::GET, "/v1/inbox", &[], None).await;
    none.problem(401, "unauthenticated");
    assert_eq!(
        none.header("www-authenticate"),
        Some("Bearer realm=\"countersign\"")
    );
    for bad in ["Bearer cst_nope", "Basic YWRtaW46YWRtaW4=", "Bearer "] {
        h.send(Method::GET, "/v1/inbox", &[("authorization", bad)], None)
            .await
            .problem(401, "unauthenticated");
    }
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_token_is_stored_only_as_a_hash_listed_without_its_secret_and_dead_once_revoked(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let issued = tokens::create(&h.pool, "admin", Some("laptop"), None)
        .await
        .unwrap();
    let secret = issued.secret().to_owned();
    assert!(secret.starts_with("cst_") && secret.len() > 40, "{secret}");
    assert!(
        !format!("{issued:?}").contains(&secret),
        "Debug hides the secret"
    );

    // Nothing stored holds the secret; the hash is its SHA-256.
    let dump: String = sqlx::query_scalar("SELECT to_jsonb(t)::text FROM api_tokens t")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert!(!dump.contains(&secret[4..]), "{dump}");
    let stored: Vec<u8> = sqlx::query_scalar("SELECT secret_hash FROM api_tokens")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    use sha2::Digest;
    assert_eq!(stored, sha2::Sha256::digest(secret.as_bytes()).to_vec());

    // Issuing it granted its producer exactly its own user, in the queues' registry.
    let grants: Vec<(String, String, String)> = countersign_coordinator::producers::list(&h.pool)
        .await
        .unwrap()
        .into_iter()
        .filter(|g| g.amqp_user == "http:admin")
        .map(|g| (g.amqp_user, g.kind.to_string(), g.name))
        .collect();
    assert_eq!(
        grants,
        [
            ("http:admin".into(), "acting_user".into(), "admin".into()),
            ("http:admin".into(), "approver".into(), "admin".into()),
        ]
    );

    assert_eq!(h.get(&secret, "/v1/inbox").await.status, 200);
    let listed = tokens::list(&h.pool).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].label.as_deref(), Some("laptop"));
    assert!(listed[0].last_used_at.is_some(), "its use is noted");

    assert!(tokens::revoke(&h.pool, issued.info.id).await.unwrap());
    assert!(
        !tokens::revoke(&h.pool, issued.info.id).await.unwrap(),
        "once"
    );
    h.get(&secret, "/v1/inbox")
        .await
        .problem(401, "unauthenticated");
    assert!(tokens::list(&h.pool).await.unwrap()[0].revoked_at.is_some());

    // An expired token is as dead.
    let brief = tokens::create(&h.pool, "admin", None, Some(std::time::Duration::ZERO))
        .await
        .unwrap();
    h.get(brief.secret(), "/v1/inbox")
        .await
        .problem(401, "unauthenticated");
    assert!(matches!(
        tokens::create(&h.pool, " admin", None, None).await,
        Err(tokens::TokenError::InvalidName("user"))
    ));
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_proxy_header_is_believed_only_from_a_trusted_proxy_address(pool: PgPool) {
    let header = HeaderName::from_static("x-forwarded-user");
    let trusted = harness_with(
        pool,
        countersign_api::ApiConfig {
            trusted_header: Some(header.clone()),
            trusted_proxies: vec!["127.0.0.1".parse::<IpAddr>().unwrap()],
            proxy_producer: "sso".into(),
            ..config()
        },
    )
    .await;
    // Without a grant for the proxy's producer, its users may look but not decide; looking
    // needs only the user.
    let reply = trusted
        .send(
            Method::GET,
            "/v1/inbox",
            &[("x-forwarded-user", "admin")],
            None,
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let too_long = "a".repeat(201);
    trusted
        .send(
            Method::GET,
            "/v1/inbox",
            &[("x-forwarded-user", &too_long)],
            None,
        )
        .await
        .problem(401, "unauthenticated");
    let pool = trusted.pool.clone();
    trusted.finish().await;

    // The same header from an address that is not the proxy's is ignored.
    let untrusted = harness_with(
        pool,
        countersign_api::ApiConfig {
            trusted_header: Some(header),
            trusted_proxies: vec!["10.9.8.7".parse::<IpAddr>().unwrap()],
            ..config()
        },
    )
    .await;
    untrusted
        .send(
            Method::GET,
            "/v1/inbox",
            &[("x-forwarded-user", "admin")],
            None,
        )
        .await
        .problem(401, "unauthenticated");
    untrusted.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_credential_past_its_rate_is_refused_rate_limited_with_retry_after(pool: PgPool) {
    let h = harness_with(
        pool,
        countersign_api::ApiConfig {
            rate_per_minute: 1,
            rate_burst: 2,
            ..config()
        },
    )
    .await;
    let admin = h.token("admin").await;
    let editor = h.token("editor").await;
    assert_eq!(h.get(&admin, "/v1/inbox").await.status, 200);
    assert_eq!(h.get(&admin, "/v1/inbox").await.status, 200);
    let limited = h.get(&admin, "/v1/inbox").await;
    let problem = limited.problem(429, "rate_limited");
    let wait: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert_eq!(problem["retry_after"], wait);
    assert_eq!(
        h.get(&editor, "/v1/inbox").await.status,
        200,
        "per credential"
    );
    h.finish().await;
}
