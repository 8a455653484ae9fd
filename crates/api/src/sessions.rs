//! The web inbox's sign-in sessions.
//!
//! A browser signs in once — with a token, or by coming through a trusted proxy — and gets a
//! cookie holding a random session secret; the row stores only its SHA-256. The CSRF token of
//! the session's forms is derived from the same secret (a second, domain-separated hash), so it
//! is never stored and a page of another site, which can neither read the cookie nor this
//! inbox's pages, cannot produce it. A session signed in with a token dies with the token.

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::tokens::{hash, random_secret};

/// What a session cookie's secret starts with.
const SESSION_PREFIX: &str = "css_";
/// What the sign-in form's cookie secret starts with.
const SIGN_IN_PREFIX: &str = "csi_";

/// A live session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: String,
    pub producer: String,
    pub token_id: Option<Uuid>,
}

/// The CSRF token of the forms of the session whose secret is `secret`.
pub fn csrf_token(secret: &str) -> String {
    derived(b"countersign-inbox-csrf\0", secret)
}

/// A fresh secret for the sign-in form's cookie. The form carries [`sign_in_token`] of it,
/// so a sign-in is accepted only from a form this inbox rendered for this browser: a page of
/// another site can neither read the cookie nor make the browser send it (`SameSite=Strict`),
/// so it cannot sign the browser in to an account of the attacker's choosing.
pub fn sign_in_secret() -> String {
    random_secret(SIGN_IN_PREFIX)
}

/// The CSRF token of the sign-in form whose cookie holds `secret`; `None` for a cookie that
/// is not a sign-in secret.
pub fn sign_in_token(secret: &str) -> Option<String> {
    (secret.starts_with(SIGN_IN_PREFIX) && secret.len() <= 100)
        .then(|| derived(b"countersign-inbox-sign-in\0", secret))
}

fn derived(domain: &[u8], secret: &str) -> String {
    let mut h = Sha256::new();
    h.update(domain);
    h.update(secret.as_bytes());
    hex::encode(h.finalize())
}

/// Opens a session; returns its secret (the cookie's value). Drops expired sessions on the way.
pub async fn open(
    pool: &PgPool,
    user: &str,
    producer: &str,
    token_id: Option<Uuid>,
    ttl: Duration,
) -> Result<String, sqlx::Error> {
    sqlx::query!("DELETE FROM web_sessions WHERE expires_at < now()")
        .execute(pool)
        .await?;
    let secret = random_secret(SESSION_PREFIX);
    let ttl_secs = i64::try_from(ttl.as_secs()).unwrap_or(86_400);
    sqlx::query!(
        r#"INSERT INTO web_sessions (secret_hash, user_name, producer, token_id, expires_at)
           VALUES ($1, $2, $3, $4, now() + $5::int8 * interval '1 second')"#,
        hash(&secret),
        user,
        producer,
        token_id,
        ttl_secs,
    )
    .execute(pool)
    .await?;
    Ok(secret)
}

/// The live session of `secret`: not expired, and its token (if it has one) neither revoked
/// nor expired.
pub async fn find(pool: &PgPool, secret: &str) -> Result<Option<Session>, sqlx::Error> {
    if !secret.starts_with(SESSION_PREFIX) || secret.len() > 100 {
        return Ok(None);
    }
    let row = sqlx::query!(
        r#"SELECT s.user_name, s.producer, s.token_id
           FROM web_sessions s LEFT JOIN api_tokens t ON t.id = s.token_id
           WHERE s.secret_hash = $1 AND s.expires_at > now()
             AND (s.token_id IS NULL
                  OR (t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())))"#,
        hash(secret),
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Session {
        user: r.user_name,
        producer: r.producer,
        token_id: r.token_id,
    }))
}

/// Ends a session. Ending one that is gone already is not an error.
pub async fn close(pool: &PgPool, secret: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM web_sessions WHERE secret_hash = $1",
        hash(secret)
    )
    .execute(pool)
    .await?;
    Ok(())
}
