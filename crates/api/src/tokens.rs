//! API tokens: the credential of an HTTP caller, mapped onto the producer registry.
//!
//! A token is issued for a user and authenticates the producer `http:<user>` — the HTTP
//! counterpart of a broker-validated AMQP `user_id`. What that producer may assert is what the
//! registry ([`countersign_coordinator::producers`]) grants it, exactly as for a queue
//! producer: issuing a token grants `http:<user>` the right to assert `<user>` as approver and
//! as acting user, and nothing more; an operator widens it (`countersign producers allow
//! http:ci-bot acting-user '*'`) or narrows it (`producers revoke http:alice acting-user alice`)
//! with the same commands as for the queues.
//!
//! Only the SHA-256 of a secret is stored. The secret has 256 random bits, so a fast hash is
//! enough: there is nothing to guess from, and a stolen table opens nothing. A token is shown
//! once, when it is created; it is revoked, never deleted, so the list keeps who had one.

use std::fmt;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use countersign_coordinator::producers::{self, ProducerError, ProducerKind};
use countersign_core::DatabaseCode;
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

/// What every secret starts with, so that a leaked one is recognisable (e.g. by a scanner).
pub const SECRET_PREFIX: &str = "cst_";
/// Longest user name or label.
const MAX_NAME_CHARS: usize = 200;

/// The producer name an HTTP caller signed in as `user` is gated as.
pub fn producer_of(user: &str) -> String {
    format!("http:{user}")
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: Uuid,
    pub user: String,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

impl TokenInfo {
    /// The producer its requests are gated as.
    pub fn producer(&self) -> String {
        producer_of(&self.user)
    }
}

/// A token just created: the only time its secret exists outside the caller's hands.
#[derive(Clone)]
pub struct IssuedToken {
    pub info: TokenInfo,
    secret: String,
}

impl IssuedToken {
    /// The bearer secret, `cst_…`: print it once, store it nowhere.
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

#[cfg(test)]
impl IssuedToken {
    pub(crate) fn for_test(user: &str, secret: &str) -> IssuedToken {
        IssuedToken {
            info: TokenInfo {
                id: Uuid::now_v7(),
                user: user.to_owned(),
                label: None,
                created_at: Utc::now(),
                expires_at: None,
                revoked_at: None,
                last_used_at: None,
            },
            secret: secret.to_owned(),
        }
    }
}

impl fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedToken")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Why a token could not be issued, listed or revoked. Only [`TokenError::code`] may leave
/// the log.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum TokenError {
    #[error("{0} must be 1 to 200 characters, not padded with whitespace")]
    InvalidName(&'static str),
    #[error(transparent)]
    Producers(#[from] ProducerError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl TokenError {
    pub fn code(&self) -> &'static str {
        match self {
            TokenError::Producers(e) => e.code(),
            TokenError::Database(_) => DatabaseCode::Error.as_str(),
            other => other.into(),
        }
    }
}

fn checked<'a>(what: &'static str, s: &'a str) -> Result<&'a str, TokenError> {
    if s.is_empty() || s.trim() != s || s.chars().count() > MAX_NAME_CHARS {
        return Err(TokenError::InvalidName(what));
    }
    Ok(s)
}

/// The stored form of a secret.
pub(crate) fn hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// A fresh random secret with `prefix`: 256 bits from the operating system's generator.
pub(crate) fn random_secret(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// Issues a token for `user`, granting its producer `http:<user>` the right to assert `user`
/// as approver and as acting user (grants that exist already are kept as they are).
pub async fn create(
    pool: &PgPool,
    user: &str,
    label: Option<&str>,
    expires_in: Option<Duration>,
) -> Result<IssuedToken, TokenError> {
    let user = checked("user", user)?;
    let label = label.map(|l| checked("label", l)).transpose()?;
    let producer = producer_of(user);
    // The grants first: a grant without a token authenticates nobody, a token without its
    // grants would be refused by the gates.
    producers::allow(pool, &producer, ProducerKind::Approver, user).await?;
    producers::allow(pool, &producer, ProducerKind::ActingUser, user).await?;
    let secret = random_secret(SECRET_PREFIX);
    let expires_secs = expires_in.map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2));
    let id = Uuid::now_v7();
    let row = sqlx::query!(
        r#"INSERT INTO api_tokens (id, user_name, label, secret_hash, expires_at)
           VALUES ($1, $2, $3, $4, now() + $5::int8 * interval '1 second')
           RETURNING created_at, expires_at"#,
        id,
        user,
        label,
        hash(&secret),
        expires_secs,
    )
    .fetch_one(pool)
    .await?;
    Ok(IssuedToken {
        info: TokenInfo {
            id,
            user: user.to_owned(),
            label: label.map(str::to_owned),
            created_at: row.created_at,
            expires_at: row.expires_at,
            revoked_at: None,
            last_used_at: None,
        },
        secret,
    })
}

/// Every token, newest first.
pub async fn list(pool: &PgPool) -> Result<Vec<TokenInfo>, TokenError> {
    let rows = sqlx::query_as!(
        TokenInfo,
        r#"SELECT id, user_name AS "user", label, created_at, expires_at, revoked_at, last_used_at
           FROM api_tokens ORDER BY created_at DESC, id DESC"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows)
}

/// Revokes a token (and ends the inbox sessions signed in with it). `false` when there is no
/// such token or it was revoked already.
pub async fn revoke(pool: &PgPool, id: Uuid) -> Result<bool, TokenError> {
    let mut tx = pool.begin().await?;
    let done = sqlx::query!(
        "UPDATE api_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
        id
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!("DELETE FROM web_sessions WHERE token_id = $1", id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(done.rows_affected() == 1)
}

/// The live token whose secret is `secret`: not revoked, not expired. Notes its use, at most
/// once a minute.
pub async fn verify(pool: &PgPool, secret: &str) -> Result<Option<TokenInfo>, TokenError> {
    if !secret.starts_with(SECRET_PREFIX) || secret.len() > 100 {
        return Ok(None);
    }
    let found = sqlx::query_as!(
        TokenInfo,
        r#"SELECT id, user_name AS "user", label, created_at, expires_at, revoked_at, last_used_at
           FROM api_tokens
           WHERE secret_hash = $1 AND revoked_at IS NULL
             AND (expires_at IS NULL OR expires_at > now())"#,
        hash(secret),
    )
    .fetch_optional(pool)
    .await?;
    if let Some(token) = &found {
        sqlx::query!(
            r#"UPDATE api_tokens SET last_used_at = now()
               WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')"#,
            token.id
        )
        .execute(pool)
        .await?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_error_has_the_code_it_always_had() {
        let errors = [
            (TokenError::InvalidName("user"), "invalid_name"),
            (
                TokenError::Producers(ProducerError::InvalidName("name")),
                "invalid_name",
            ),
            (
                TokenError::Producers(ProducerError::Unreadable),
                "state_unreadable",
            ),
            (
                TokenError::Database(sqlx::Error::PoolTimedOut),
                "database_error",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }
}
