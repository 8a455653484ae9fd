//! The producer registry: which broker (AMQP) users may assert which identities.
//!
//! The broker validates a message's `user_id` property against the user of the connection that
//! published it, so that name is authenticated. The identities named inside a body — a
//! decision's `approver`, a run request's `acting_user` — are only claims, and a claim is
//! believed only when a grant here covers it. Without the registry, anyone able to publish on
//! `countersign.decisions` could approve as an administrator, and anyone able to publish on
//! `countersign.run-requests` could run agents as one.
//!
//! A grant names one user, or [`ANY`] for every user of that kind. Grants are read on every
//! message, so revoking one takes effect with the next message.

use std::fmt;

use chrono::{DateTime, Utc};
use countersign_core::{DatabaseCode, TerminationReason};
use sqlx::PgPool;

/// The grant name that covers every user of its kind.
pub const ANY: &str = "*";

/// Which identity in a message a grant covers. Stored as its code (`approver`, `acting_user`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum ProducerKind {
    /// The `approver` of a decision.
    Approver,
    /// The `acting_user` of a run request.
    ActingUser,
}

impl ProducerKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }
}

impl fmt::Display for ProducerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stored grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerGrant {
    pub amqp_user: String,
    pub kind: ProducerKind,
    /// A user name, or [`ANY`].
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// Why the registry could not answer. Only [`ProducerError::code`] may leave the log.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum ProducerError {
    /// An AMQP user or a name that is empty or padded with whitespace.
    #[error("{0} must be non-empty and not padded with whitespace")]
    InvalidName(&'static str),
    /// A stored kind this code does not know.
    #[error("stored producer grant kind is unreadable")]
    Unreadable,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl ProducerError {
    pub fn code(&self) -> &'static str {
        match self {
            ProducerError::Unreadable => TerminationReason::StateUnreadable.as_str(),
            ProducerError::Database(_) => DatabaseCode::Error.as_str(),
            other => other.into(),
        }
    }
}

fn checked<'a>(what: &'static str, s: &'a str) -> Result<&'a str, ProducerError> {
    if s.is_empty() || s.trim() != s {
        return Err(ProducerError::InvalidName(what));
    }
    Ok(s)
}

/// Lets `amqp_user` assert `name` (or [`ANY`]) as `kind`. `true` when the grant is new.
pub async fn allow(
    pool: &PgPool,
    amqp_user: &str,
    kind: ProducerKind,
    name: &str,
) -> Result<bool, ProducerError> {
    let done = sqlx::query!(
        r#"INSERT INTO producer_grants (amqp_user, kind, name) VALUES ($1, $2, $3)
           ON CONFLICT DO NOTHING"#,
        checked("amqp_user", amqp_user)?,
        kind.as_str(),
        checked("name", name)?,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Removes exactly this grant (revoking `name` leaves an [`ANY`] grant in place, and the
/// other way round). `true` when it existed.
pub async fn revoke(
    pool: &PgPool,
    amqp_user: &str,
    kind: ProducerKind,
    name: &str,
) -> Result<bool, ProducerError> {
    let done = sqlx::query!(
        "DELETE FROM producer_grants WHERE amqp_user = $1 AND kind = $2 AND name = $3",
        amqp_user,
        kind.as_str(),
        name,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Whether `amqp_user` may assert `name` as `kind`: a grant for that name or for [`ANY`].
pub async fn may_assert(
    pool: &PgPool,
    amqp_user: &str,
    kind: ProducerKind,
    name: &str,
) -> Result<bool, ProducerError> {
    let granted = sqlx::query_scalar!(
        r#"SELECT producer_may_assert($1, $2, $3) AS "granted!""#,
        amqp_user,
        kind.as_str(),
        name,
    )
    .fetch_one(pool)
    .await?;
    Ok(granted)
}

/// Every grant, by AMQP user, kind and name.
pub async fn list(pool: &PgPool) -> Result<Vec<ProducerGrant>, ProducerError> {
    let rows = sqlx::query!(
        r#"SELECT amqp_user, kind, name, created_at FROM producer_grants
           ORDER BY amqp_user, kind, name"#
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(ProducerGrant {
                kind: ProducerKind::parse(&r.kind).ok_or(ProducerError::Unreadable)?,
                amqp_user: r.amqp_user,
                name: r.name,
                created_at: r.created_at,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_producer_error_has_the_code_it_always_had() {
        let errors = [
            (ProducerError::InvalidName("amqp_user"), "invalid_name"),
            (ProducerError::Unreadable, "state_unreadable"),
            (
                ProducerError::Database(sqlx::Error::PoolTimedOut),
                "database_error",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }

    #[test]
    fn every_producer_kind_is_stored_as_the_word_it_always_was_and_read_back_from_it() {
        let kinds = [
            (ProducerKind::Approver, "approver"),
            (ProducerKind::ActingUser, "acting_user"),
        ];
        for (kind, word) in kinds {
            assert_eq!(kind.as_str(), word);
            assert_eq!(kind.to_string(), word);
            assert_eq!(ProducerKind::parse(word), Some(kind));
        }
        assert_eq!(ProducerKind::parse("Approver"), None);
        assert_eq!(ProducerKind::parse("acting-user"), None);
    }
}
