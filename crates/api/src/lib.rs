#![doc = include_str!("../README.md")]

mod auth;
mod cards;
mod conn;
mod drafts;
mod effects;
mod grants;
mod groups;
mod history;
mod inbox;
mod limits;
pub mod observe;
pub mod openapi;
mod pages;
mod problem;
mod queries;
mod sessions;
pub mod slack;
pub mod tokens;
pub mod v1;

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::HeaderName;
use axum::routing::{get, post, put};
use axum::Router;
use countersign_coordinator::Coordinator;

pub use auth::{Caller, Via};
pub use limits::CONTENT_SECURITY_POLICY;
pub use observe::register_metrics;
pub use problem::{Problem, ProblemCode, ProblemDetails, PROBLEM_JSON};

/// How the surfaces behave: who is trusted to vouch for users, and the limits of a request.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The header an authenticating proxy puts the signed-in user's name in; off when `None`.
    pub trusted_header: Option<HeaderName>,
    /// The addresses the header is believed from. Empty: believed from nobody.
    pub trusted_proxies: Vec<IpAddr>,
    /// The producer a proxied request is gated as; the registry must allow it to assert the
    /// users it vouches for (`countersign producers allow <it> approver '*'`).
    pub proxy_producer: String,
    /// Requests per minute per credential, sustained.
    pub rate_per_minute: u32,
    /// Requests a credential may make at once.
    pub rate_burst: u32,
    /// Longest a request may take, body included.
    pub request_timeout: Duration,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// How long an inbox session lasts.
    pub session_ttl: Duration,
    /// Mark the session cookie `Secure` (and name it `__Host-…`). Off only for plain-HTTP
    /// development.
    pub secure_cookies: bool,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            trusted_header: None,
            trusted_proxies: Vec::new(),
            proxy_producer: "http-proxy".to_owned(),
            rate_per_minute: 120,
            rate_burst: 30,
            request_timeout: Duration::from_secs(30),
            max_body_bytes: 64 * 1024,
            session_ttl: Duration::from_secs(12 * 3600),
            secure_cookies: true,
        }
    }
}

/// What every handler reads: the gates (and their directory, which says who may see a run and
/// whom a card is built for) and the configuration. The events the gates commit, wake-ups
/// included, leave through the process's outbox relay, not through a handler.
#[derive(Debug, Clone)]
pub struct AppState {
    pub coordinator: Coordinator,
    pub config: Arc<ApiConfig>,
    /// The Slack app, when decisions from Slack are on.
    pub slack: Option<Arc<slack::SlackConfig>>,
    limiter: Arc<limits::RateLimiter>,
}

impl AppState {
    pub fn new(coordinator: Coordinator, config: ApiConfig) -> AppState {
        AppState {
            limiter: Arc::new(limits::RateLimiter::new(
                config.rate_per_minute,
                config.rate_burst,
            )),
            coordinator,
            config: Arc::new(config),
            slack: None,
        }
    }

    /// Turns deciding from Slack on.
    pub fn with_slack(self, slack: slack::SlackConfig) -> AppState {
        AppState {
            slack: Some(Arc::new(slack)),
            ..self
        }
    }
}

/// The router of `/v1` and `/inbox`. Serve it with [`serve`] (it needs the peer address).
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/runs", post(v1::create_run))
        .route("/runs/{run_id}", get(v1::get_run))
        .route("/runs/{run_id}/card", get(v1::card))
        .route("/runs/{run_id}/slack-message", get(slack::message))
        .route("/runs/{run_id}/decisions", post(v1::decide))
        .route("/runs/{run_id}/grants", post(grants::grant))
        .route("/inbox", get(v1::inbox))
        .route("/groups", get(groups::list))
        .route("/groups/{group}", put(groups::create))
        .route(
            "/groups/{group}/members/{user}",
            put(groups::add).delete(groups::remove),
        )
        .route("/openapi.json", get(openapi::openapi))
        .fallback(v1::not_found)
        .method_not_allowed_fallback(v1::method_not_allowed);
    let web = Router::new()
        .route("/", get(inbox::list))
        .route("/sign-in", get(inbox::sign_in_page).post(inbox::sign_in))
        .route("/sign-out", post(inbox::sign_out))
        .route("/runs/{run_id}", get(inbox::run))
        .route("/runs/{run_id}/decide", post(inbox::decide))
        .route("/static/inbox.css", get(inbox::stylesheet))
        .route("/static/inbox.js", get(inbox::script))
        .fallback(inbox::not_found);
    Router::new()
        .route("/", get(inbox::root))
        .route("/slack/interactions", post(slack::interactions))
        .nest("/v1", api)
        .nest("/inbox", web)
        .fallback(v1::not_found)
        .layer(axum::middleware::from_fn(limits::close_unread))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            limits::deadline,
        ))
        .layer(axum::middleware::from_fn(limits::security_headers))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        // Outermost: the span and the metrics see every answer, a timeout's too.
        .layer(axum::middleware::from_fn(observe::observe))
        .with_state(state)
}

/// Serves the router on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state).layer(axum::middleware::map_request(conn::peer_address));
    axum::serve(
        conn::Listener(listener),
        app.into_make_service_with_connect_info::<conn::Peer>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// What `make demo` prints at the end of its story, so that a person can open the inbox as the
/// demo's approver: the URL, and a token to sign in with (shown once).
pub fn inbox_hint(base_url: &str, token: &tokens::IssuedToken) -> String {
    let base = base_url.trim_end_matches('/');
    format!(
        "The web inbox: {base}/inbox — sign in as {user} with the token\n  {secret}\n\
         The API, with the same token: curl -H 'Authorization: Bearer {secret}' {base}/v1/inbox\n\
         (revoke it with: countersign tokens revoke {id})",
        user = token.info.user,
        secret = token.secret(),
        id = token.info.id,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_hint_names_the_inbox_url_the_approver_and_the_token() {
        let token = tokens::IssuedToken::for_test("admin", "cst_secret");
        let hint = inbox_hint("http://127.0.0.1:8080/", &token);
        assert!(hint.contains("http://127.0.0.1:8080/inbox "), "{hint}");
        assert!(hint.contains("sign in as admin"), "{hint}");
        assert!(hint.contains("\n  cst_secret\n"), "{hint}");
        assert!(
            hint.contains("Bearer cst_secret' http://127.0.0.1:8080/v1/inbox"),
            "{hint}"
        );
        assert!(hint.contains(&format!("countersign tokens revoke {}", token.info.id)));
    }
}
