//! Webhook endpoints and their deliveries (migration `0020_webhooks`).
//!
//! An endpoint names a URL, the events it hears and optionally one agent; its signing secret
//! is sealed under its id. A delivery is written by the outbox's trigger in the transaction of
//! the event it carries, so it exists exactly when the event does. A deliverer claims due
//! deliveries with a short claim ([`Store::claim_webhook_deliveries`]), posts each, and records
//! the attempt ([`Store::record_webhook_attempt`]): delivered, retried at a later time, or
//! failed once its time ran out.

use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::RunId;
use countersign_crypto::Purpose;
use secrecy::SecretString;
use serde_json::Value;
use uuid::Uuid;

use crate::{millis, Store, StoreError};

/// A configured endpoint, as `countersign webhooks list` shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    pub id: Uuid,
    pub url: String,
    pub events: Vec<String>,
    pub agent: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A delivery claimed for an attempt: where it goes, the secret it is signed with, and what it
/// carries.
#[derive(Debug)]
pub struct DueDelivery {
    pub endpoint_id: Uuid,
    pub event_id: Uuid,
    pub run_id: Option<Uuid>,
    pub url: String,
    pub secret: SecretString,
    pub body: Value,
    /// Attempts made before this one.
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

/// What became of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The endpoint answered 2xx.
    Delivered { http_status: u16 },
    /// Another attempt at the time given; `http_status` when the endpoint answered at all.
    Retry {
        http_status: Option<u16>,
        code: &'static str,
        after: Duration,
    },
    /// No more attempts: the delivery's time ran out.
    Failed {
        http_status: Option<u16>,
        code: &'static str,
    },
}

/// One delivery with its latest attempt, as `countersign webhooks deliveries` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    pub event_id: Uuid,
    pub kind: String,
    pub run_id: Option<Uuid>,
    pub status: String,
    pub attempts: i32,
    pub last_http_status: Option<i32>,
    pub last_code: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// What an endpoint's secret is sealed under: its id (a UUIDv7, as a run id is).
fn sealed_under(endpoint_id: Uuid) -> Result<RunId, StoreError> {
    RunId::from_uuid(endpoint_id).map_err(|_| StoreError::Unreadable {
        what: "webhook_endpoints.id",
    })
}

impl Store {
    /// Adds the endpoint `url` hearing `events` (of `agent`'s runs only, when given), its
    /// `secret` sealed under its new id; returns the id. A URL already configured is refused
    /// with the database's unique violation.
    pub async fn add_webhook(
        &self,
        url: &str,
        events: &[String],
        agent: Option<&str>,
        secret: &str,
    ) -> Result<Uuid, StoreError> {
        let id = Uuid::now_v7();
        let sealed =
            self.keyring
                .seal(Purpose::WebhookSecret, sealed_under(id)?, secret.as_bytes())?;
        sqlx::query!(
            r#"INSERT INTO webhook_endpoints (id, url, events, agent, secret)
               VALUES ($1, $2, $3, $4, $5)"#,
            id,
            url,
            events,
            agent,
            sealed,
        )
        .execute(&self.pool)
        .await?;
        Ok(id)
    }

    /// Every endpoint, oldest first.
    pub async fn webhooks(&self) -> Result<Vec<WebhookEndpoint>, StoreError> {
        let rows = sqlx::query_as!(
            WebhookEndpoint,
            r#"SELECT id, url, events, agent, created_at FROM webhook_endpoints
               ORDER BY created_at, id"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Removes the endpoint `url` and its deliveries; whether there was one.
    pub async fn remove_webhook(&self, url: &str) -> Result<bool, StoreError> {
        let done = sqlx::query!("DELETE FROM webhook_endpoints WHERE url = $1", url)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The signing secret of endpoint `endpoint_id`, opened.
    fn open_secret(&self, endpoint_id: Uuid, sealed: &[u8]) -> Result<String, StoreError> {
        let under = sealed_under(endpoint_id)?;
        let bytes = self.keyring.open(Purpose::WebhookSecret, under, sealed)?;
        String::from_utf8(bytes).map_err(|_| StoreError::Unreadable {
            what: "webhook_endpoints.secret",
        })
    }

    /// Claims up to `limit` pending deliveries that are due, oldest first, for `claim_for`:
    /// until then no other deliverer takes them. A delivery whose secret does not open is
    /// failed at once (`state_unreadable`): no attempt could ever sign it.
    pub async fn claim_webhook_deliveries(
        &self,
        limit: i64,
        claim_for: Duration,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        let rows = sqlx::query!(
            r#"UPDATE webhook_deliveries d
               SET claimed_until = now() + $2 * interval '1 millisecond'
               FROM webhook_endpoints e
               WHERE e.id = d.endpoint_id
                 AND (d.endpoint_id, d.event_id) IN (
                   SELECT endpoint_id, event_id FROM webhook_deliveries
                   WHERE status = 'pending' AND next_attempt_at <= now()
                     AND (claimed_until IS NULL OR claimed_until < now())
                   ORDER BY next_attempt_at
                   LIMIT $1
                   FOR UPDATE SKIP LOCKED)
               RETURNING d.endpoint_id, d.event_id, d.run_id, d.body, d.attempts, d.created_at,
                         e.url, e.secret"#,
            limit,
            millis(claim_for) as f64,
        )
        .fetch_all(&self.pool)
        .await?;
        let mut due = Vec::with_capacity(rows.len());
        for r in rows {
            let opened = self.open_secret(r.endpoint_id, &r.secret);
            match opened {
                Ok(secret) => due.push(DueDelivery {
                    endpoint_id: r.endpoint_id,
                    event_id: r.event_id,
                    run_id: r.run_id,
                    url: r.url,
                    secret: SecretString::from(secret),
                    body: r.body,
                    attempts: r.attempts,
                    created_at: r.created_at,
                }),
                Err(e) => {
                    tracing::warn!(endpoint = %r.endpoint_id, code = e.code(), "a webhook secret does not open; its delivery fails");
                    let outcome = AttemptOutcome::Failed {
                        http_status: None,
                        code: e.code(),
                    };
                    self.record_webhook_attempt(r.endpoint_id, r.event_id, &outcome)
                        .await?;
                }
            }
        }
        Ok(due)
    }

    /// Records an attempt at the delivery of `event_id` to `endpoint_id`, and what follows from
    /// it, in one transaction; the claim is released.
    pub async fn record_webhook_attempt(
        &self,
        endpoint_id: Uuid,
        event_id: Uuid,
        outcome: &AttemptOutcome,
    ) -> Result<(), StoreError> {
        let (status, http_status, code, after) = match outcome {
            AttemptOutcome::Delivered { http_status } => {
                ("delivered", Some(*http_status), None, Duration::ZERO)
            }
            AttemptOutcome::Retry {
                http_status,
                code,
                after,
            } => ("pending", *http_status, Some(*code), *after),
            AttemptOutcome::Failed { http_status, code } => {
                ("failed", *http_status, Some(*code), Duration::ZERO)
            }
        };
        sqlx::query!(
            r#"WITH attempt AS (
                   UPDATE webhook_deliveries
                   SET attempts = attempts + 1, status = $3, claimed_until = NULL,
                       next_attempt_at = now() + $6 * interval '1 millisecond',
                       finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
                   WHERE endpoint_id = $1 AND event_id = $2
                   RETURNING attempts)
               INSERT INTO webhook_attempts (endpoint_id, event_id, attempt, http_status, code)
               SELECT $1, $2, attempts, $4, $5 FROM attempt"#,
            endpoint_id,
            event_id,
            status,
            http_status.map(i32::from),
            code,
            millis(after) as f64,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The most recent `limit` deliveries to `url`, newest first, each with its latest attempt.
    pub async fn webhook_deliveries(
        &self,
        url: &str,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let rows = sqlx::query_as!(
            DeliveryRecord,
            r#"SELECT d.event_id, d.kind, d.run_id, d.status, d.attempts, d.created_at,
                      d.finished_at, a.http_status AS last_http_status, a.code AS last_code
               FROM webhook_deliveries d
               JOIN webhook_endpoints e ON e.id = d.endpoint_id
               LEFT JOIN webhook_attempts a ON a.endpoint_id = d.endpoint_id
                    AND a.event_id = d.event_id AND a.attempt = d.attempts
               WHERE e.url = $1
               ORDER BY d.created_at DESC, d.event_id DESC
               LIMIT $2"#,
            url,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// The age of the oldest pending delivery: how far behind the deliverers are.
    pub async fn webhook_backlog_age(&self) -> Result<Duration, StoreError> {
        let secs = sqlx::query_scalar!(
            r#"SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 AS "secs!"
               FROM webhook_deliveries WHERE status = 'pending'"#
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Duration::from_secs_f64(secs.max(0.0)))
    }

    /// Deletes up to `limit` deliveries that finished more than `retention` ago (their attempts
    /// with them); returns how many.
    pub async fn prune_webhook_deliveries(
        &self,
        retention: Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            r#"DELETE FROM webhook_deliveries
               WHERE (endpoint_id, event_id) IN (
                   SELECT endpoint_id, event_id FROM webhook_deliveries
                   WHERE status <> 'pending'
                     AND finished_at < now() - $1 * interval '1 millisecond'
                   LIMIT $2
                   FOR UPDATE SKIP LOCKED)"#,
            millis(retention) as f64,
            limit,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
