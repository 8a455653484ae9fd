//! Webhook deliveries, as the Standard Webhooks specification has them
//! (<https://www.standardwebhooks.com>): each event an endpoint subscribes to is POSTed as JSON
//! with `webhook-id` (the event id, which receivers deduplicate by), `webhook-timestamp` (Unix
//! seconds) and `webhook-signature` (`v1,` and the base64 HMAC-SHA256 of
//! `id.timestamp.body` under the endpoint's secret).
//!
//! The deliveries are rows the outbox's trigger writes with their events
//! (`countersign_store::webhooks`), so a delivery is at least once: [`run`] claims the due
//! ones, posts each, and records the attempt. A 2xx answer delivers; anything else (another
//! status, no answer within the timeout, a refused connection) is tried again with doubling
//! backoff and jitter until the delivery is older than [`DeliveryConfig::give_up_after`], then
//! failed and counted. The body is the event's public body — ids, codes, counts — with the
//! run's inbox link when the inbox address is configured: never a prompt, an argument or a
//! preview.
//!
//! An `https://` endpoint's certificate is verified against the Mozilla roots and the
//! certificate authorities of `--webhooks-ca-file` (a receiver on an internal network under an
//! internal CA), never switched off; a handshake that fails is recorded `tls_failed` and tried
//! again like any other failed attempt.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
pub use countersign_remote::Trust;
use countersign_store::{AttemptOutcome, DueDelivery, Store};
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use secrecy::ExposeSecret;
use serde_json::Value;
use sha2::Sha256;

/// The prefix of a Standard Webhooks secret.
const SECRET_PREFIX: &str = "whsec_";

/// A new endpoint secret: `whsec_` and 32 random bytes in base64.
pub fn new_secret() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// The `webhook-signature` of `body` sent as message `id` at `timestamp` under `secret` (a
/// `whsec_` secret, or its base64 without the prefix); none when the secret is not base64.
pub fn signature(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> Option<String> {
    let key = STANDARD
        .decode(secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret))
        .ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    Some(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// Checks an endpoint URL as a tool server's is checked: absolute `http://` or `https://`,
/// without credentials or fragment (a path and a query are allowed).
pub fn check_url(url: &str) -> Result<(), String> {
    let uri: hyper::Uri = url.trim().parse().map_err(|_| "not a URL".to_owned())?;
    let scheme = matches!(uri.scheme_str(), Some("http" | "https"));
    let authority = uri
        .authority()
        .is_some_and(|a| !a.as_str().contains('@') && !a.host().is_empty());
    if !scheme || !authority || url.contains('#') {
        return Err("an absolute http:// or https:// URL without credentials or fragment".into());
    }
    Ok(())
}

/// How deliveries are made.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// The inbox's address (e.g. `https://countersign.example/inbox`): a delivery about a run
    /// carries `inbox_url`, its card's page. None: no link.
    pub inbox_url: Option<String>,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// The pause after a first failed attempt, doubled after each further one (at most an hour).
    pub first_retry: Duration,
    /// A delivery still undelivered this long after its event is failed.
    pub give_up_after: Duration,
    /// How often due deliveries are looked for.
    pub poll_interval: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            inbox_url: None,
            timeout: Duration::from_secs(10),
            first_retry: Duration::from_secs(5),
            give_up_after: Duration::from_secs(24 * 3600),
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// Deliveries claimed per look, and how long a claim holds.
const BATCH: i64 = 32;
const CLAIM_FOR: Duration = Duration::from_secs(60);

type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// How long an endpoint's idle connection is kept for the next delivery.
const IDLE_CONNECTION: Duration = Duration::from_secs(60);

/// Delivers due webhooks every poll interval until `shutdown` resolves, verifying `https://`
/// endpoints against `trust`.
pub async fn run(
    store: Store,
    config: DeliveryConfig,
    trust: &Trust,
    shutdown: impl Future<Output = ()>,
) {
    for outcome in ["delivered", "retried", "failed"] {
        let _ = metrics::counter!("countersign_webhook_deliveries_total", "outcome" => outcome);
    }
    metrics::gauge!("countersign_webhook_backlog_age_seconds").set(0.0);
    let client: HttpClient = trust.https_client(Some(config.timeout), IDLE_CONNECTION);
    let mut tick = tokio::time::interval(config.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        // Each statement within the store's deadline: a silent database must not hold the loop.
        match store.within(store.webhook_backlog_age()).await {
            Ok(age) => {
                metrics::gauge!("countersign_webhook_backlog_age_seconds").set(age.as_secs_f64())
            }
            Err(e) => tracing::warn!(code = e.code(), error = %e, "webhook backlog unreadable"),
        }
        let due = match store
            .within(store.claim_webhook_deliveries(BATCH, CLAIM_FOR))
            .await
        {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(code = e.code(), error = %e, "claiming webhook deliveries failed");
                continue;
            }
        };
        let attempts = due
            .into_iter()
            .map(|delivery| attempt(&store, &client, &config, delivery));
        futures_util::future::join_all(attempts).await;
    }
}

/// Posts one delivery and records what came of it.
async fn attempt(store: &Store, client: &HttpClient, config: &DeliveryConfig, due: DueDelivery) {
    let (status, code) = post(client, config, &due).await;
    let outcome = judge(config, &due, status, code);
    let label = match outcome {
        AttemptOutcome::Delivered { .. } => "delivered",
        AttemptOutcome::Retry { .. } => "retried",
        AttemptOutcome::Failed { .. } => "failed",
    };
    metrics::counter!("countersign_webhook_deliveries_total", "outcome" => label).increment(1);
    if let Err(e) = store
        .within(store.record_webhook_attempt(due.endpoint_id, due.event_id, &outcome))
        .await
    {
        // The claim runs out and the delivery is attempted again: at least once.
        tracing::warn!(code = e.code(), error = %e, "a webhook attempt could not be recorded");
    }
}

/// What follows from an attempt that got `status` (none: no answer) or failed with `code`.
fn judge(
    config: &DeliveryConfig,
    due: &DueDelivery,
    status: Option<u16>,
    code: &'static str,
) -> AttemptOutcome {
    if let Some(http_status) = status.filter(|s| (200..300).contains(s)) {
        return AttemptOutcome::Delivered { http_status };
    }
    let age = (chrono::Utc::now() - due.created_at)
        .to_std()
        .unwrap_or_default();
    let after = backoff(config.first_retry, due.attempts);
    if age + after > config.give_up_after {
        return AttemptOutcome::Failed {
            http_status: status,
            code,
        };
    }
    AttemptOutcome::Retry {
        http_status: status,
        code,
        after,
    }
}

/// The pause before attempt `attempts + 2`: `first` doubled per earlier attempt, at most an
/// hour, with up to a fifth of jitter so that endpoints that failed together are not retried
/// together.
fn backoff(first: Duration, attempts: i32) -> Duration {
    let doubled = first.saturating_mul(1 << attempts.clamp(0, 16));
    let capped = doubled.min(Duration::from_secs(3600));
    let jitter = capped.mul_f64(rand::random::<f64>() * 0.2);
    capped + jitter
}

/// Sends one delivery: the HTTP status of the answer (none without one) and, for any answer
/// but a 2xx, the code the attempt is recorded with.
async fn post(
    client: &HttpClient,
    config: &DeliveryConfig,
    due: &DueDelivery,
) -> (Option<u16>, &'static str) {
    let body = payload(&due.body, due.run_id, config.inbox_url.as_deref());
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let id = due.event_id.to_string();
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let Some(signature) = signature(due.secret.expose_secret(), &id, timestamp, &body) else {
        return (None, "secret_unusable");
    };
    let request = Request::post(&due.url)
        .header("content-type", "application/json")
        .header(
            "user-agent",
            concat!("countersign/", env!("CARGO_PKG_VERSION")),
        )
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(Full::new(Bytes::from(body)));
    let Ok(request) = request else {
        return (None, "invalid_url");
    };
    let sent = tokio::time::timeout(config.timeout, async {
        let response = client.request(request).await?;
        let status = response.status().as_u16();
        // Read (and drop) the answer so the connection can be used again.
        let _ = response.into_body().collect().await;
        Ok::<_, hyper_util::client::legacy::Error>(status)
    })
    .await;
    match sent {
        Err(_) => (None, "timeout"),
        Ok(Err(e)) if countersign_remote::tls::is_tls_failure(&e) => {
            tracing::warn!(url = %due.url, error = %e, "a webhook endpoint's TLS handshake failed");
            (None, "tls_failed")
        }
        Ok(Err(e)) => {
            tracing::info!(url = %due.url, error = %e, "a webhook endpoint could not be reached");
            (None, "unreachable")
        }
        Ok(Ok(status)) if (200..300).contains(&status) => (Some(status), "delivered"),
        Ok(Ok(status)) => (Some(status), "http_error"),
    }
}

/// The body sent: the event's public body, with `inbox_url` when it is about a run and the
/// inbox's address is known.
fn payload(body: &Value, run_id: Option<uuid::Uuid>, inbox_url: Option<&str>) -> Value {
    let mut body = body.clone();
    if let (Some(run_id), Some(inbox), Some(fields)) = (run_id, inbox_url, body.as_object_mut()) {
        let link = format!("{}/runs/{run_id}", inbox.trim_end_matches('/'));
        fields.insert("inbox_url".to_owned(), Value::String(link));
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body).unwrap(),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(signature("whsec_not base64!", "id", 1, body).is_none());
    }

    #[test]
    fn secrets_are_fresh_and_usable() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        assert!(signature(&a, "id", 1, b"{}").is_some());
    }

    #[test]
    fn an_endpoint_url_is_absolute_http_without_credentials() {
        assert!(check_url("https://hooks.example/countersign?team=1").is_ok());
        assert!(check_url("http://127.0.0.1:9000/hook").is_ok());
        for bad in [
            "hooks.example/x",
            "ftp://hooks.example/x",
            "https://user:pw@hooks.example/x",
            "https://hooks.example/x#frag",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_backoff_doubles_with_jitter_and_stops_at_an_hour() {
        let first = Duration::from_secs(5);
        let b0 = backoff(first, 0);
        assert!(b0 >= first && b0 <= first.mul_f64(1.2), "{b0:?}");
        let b3 = backoff(first, 3);
        assert!(b3 >= first * 8 && b3 <= (first * 8).mul_f64(1.2), "{b3:?}");
        let late = backoff(first, 40);
        assert!(late >= Duration::from_secs(3600) && late <= Duration::from_secs(4320));
    }

    #[test]
    fn a_payload_about_a_run_links_its_card() {
        let run = uuid::Uuid::now_v7();
        let body = serde_json::json!({"event": "run.suspended", "run_id": run.to_string()});
        let sent = payload(&body, Some(run), Some("https://cs.example/inbox/"));
        assert_eq!(
            sent["inbox_url"],
            format!("https://cs.example/inbox/runs/{run}")
        );
        assert!(payload(&body, Some(run), None).get("inbox_url").is_none());
    }
}
