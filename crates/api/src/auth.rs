//! Who is calling: a bearer token, a trusted proxy's header, or an inbox session.
//!
//! Every caller resolves to a [`Caller`]: the user it acts as (the approver of its decisions,
//! the default acting user of its run requests, the viewer of its cards) and the producer the
//! coordinator's gates authenticate it as. For a token that is `http:<user>`
//! ([`crate::tokens::producer_of`]); for a trusted proxy it is the proxy's own producer name
//! (`--proxy-producer`), which the registry must allow to assert the users it vouches for —
//! as the broker user `guest` is allowed to assert `*` in a development setup.
//!
//! The proxy header is believed only from a configured proxy address; from anywhere else it is
//! ignored (and logged), so a client that reaches the service directly cannot name itself.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use countersign_core::DatabaseCode;
use uuid::Uuid;

use crate::problem::{unavailable, Problem, ProblemCode};
use crate::sessions;
use crate::tokens::{self, producer_of};
use crate::{ApiConfig, AppState};

/// What resolving the API's caller can answer: no valid credential, too many requests (for the
/// credential, or for the address unknown tokens come from), the token table unreachable.
pub const CALLER_PROBLEMS: [ProblemCode; 3] = [
    ProblemCode::Unauthenticated,
    ProblemCode::RateLimited,
    ProblemCode::Unavailable,
];

/// Longest user name a proxy header may carry.
const MAX_USER_CHARS: usize = 200;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user it acts as.
    pub user: String,
    /// The producer the gates see.
    pub producer: String,
    pub via: Via,
}

/// How the caller was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Token(Uuid),
    Proxy,
}

impl Caller {
    /// The rate limiter's bucket: one per token, one per proxied user.
    pub fn rate_key(&self) -> String {
        match self.via {
            Via::Token(id) => format!("token:{id}"),
            Via::Proxy => format!("proxy:{}", self.user),
        }
    }

    fn of_token(token: &tokens::TokenInfo) -> Caller {
        Caller {
            user: token.user.clone(),
            producer: producer_of(&token.user),
            via: Via::Token(token.id),
        }
    }
}

/// The peer address of the connection, when the server recorded it.
pub fn peer(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// The user a trusted proxy vouches for: `Ok(None)` when no proxy header is configured, the
/// request did not come from a trusted proxy, or it carries no such header.
pub fn proxy_user(
    headers: &HeaderMap,
    peer: Option<IpAddr>,
    config: &ApiConfig,
) -> Result<Option<String>, Problem> {
    let Some(name) = &config.trusted_header else {
        return Ok(None);
    };
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let trusted = peer.is_some_and(|p| config.trusted_proxies.contains(&p));
    if !trusted {
        tracing::warn!(header = %name, peer = ?peer, "proxy header from an untrusted address ignored");
        return Ok(None);
    }
    let user = value
        .to_str()
        .ok()
        .filter(|u| !u.is_empty() && u.trim() == *u && u.chars().count() <= MAX_USER_CHARS)
        .ok_or_else(|| Problem::new(ProblemCode::Unauthenticated))?;
    Ok(Some(user.to_owned()))
}

/// The secret of an `Authorization: Bearer …` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, secret) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| secret.trim())
}

fn limited(state: &AppState, caller: &Caller) -> Result<(), Problem> {
    state
        .limiter
        .take(&caller.rate_key())
        .map_err(|wait| Problem::new(ProblemCode::RateLimited).with_retry_after(wait))
}

/// The bucket of an address that offers credentials nobody issued: sign-in attempts and
/// unknown bearer tokens.
fn address_key(peer: IpAddr) -> String {
    format!("address:{peer}")
}

/// Takes one attempt from `peer`'s bucket of unknown credentials: `rate_limited` when it has
/// none left.
pub fn limited_address(state: &AppState, peer: IpAddr) -> Result<(), Problem> {
    state
        .limiter
        .take(&address_key(peer))
        .map_err(|wait| Problem::new(ProblemCode::RateLimited).with_retry_after(wait))
}

/// Refuses a bearer token from an address whose bucket of unknown credentials is empty,
/// before the token costs a lookup; a token nobody issued takes one from that bucket.
async fn token_caller(state: &AppState, parts: &Parts) -> Result<Caller, Problem> {
    let secret = bearer(&parts.headers).ok_or(Problem::new(ProblemCode::Unauthenticated))?;
    let peer = peer(parts);
    if let Some(peer) = peer {
        state
            .limiter
            .check(&address_key(peer))
            .map_err(|wait| Problem::new(ProblemCode::RateLimited).with_retry_after(wait))?;
    }
    let token = tokens::verify(state.coordinator.store.pool(), secret)
        .await
        .map_err(|e| unavailable("tokens", e.code(), &e))?;
    match token {
        Some(token) => Ok(Caller::of_token(&token)),
        None => {
            if let Some(peer) = peer {
                limited_address(state, peer)?;
            }
            Err(Problem::new(ProblemCode::Unauthenticated))
        }
    }
}

/// The API's caller: the trusted proxy's header, else a bearer token; rate-limited.
impl FromRequestParts<AppState> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, Problem> {
        let caller = if let Some(user) = proxy_user(&parts.headers, peer(parts), &state.config)? {
            Caller {
                user,
                producer: state.config.proxy_producer.clone(),
                via: Via::Proxy,
            }
        } else {
            token_caller(state, parts).await?
        };
        limited(state, &caller)?;
        Ok(caller)
    }
}

/// A signed-in browser of the inbox.
#[derive(Debug, Clone)]
pub struct WebCaller {
    pub caller: Caller,
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// A session opened by this request (a proxied user's first visit): the cookie to set.
    pub set_cookie: Option<HeaderValue>,
}

/// The name of the session cookie: `__Host-` when it is `Secure`, so that no other host can set
/// it.
pub fn cookie_name(config: &ApiConfig) -> &'static str {
    if config.secure_cookies {
        "__Host-countersign-session"
    } else {
        "countersign-session"
    }
}

/// The name of the sign-in form's cookie (see [`crate::sessions::sign_in_secret`]).
pub fn sign_in_cookie_name(config: &ApiConfig) -> &'static str {
    if config.secure_cookies {
        "__Host-countersign-sign-in"
    } else {
        "countersign-sign-in"
    }
}

/// How long a sign-in form may be left open before it is submitted.
const SIGN_IN_FORM_SECS: u64 = 3600;

/// The `Set-Cookie` value that stores `secret` (or, with `None`, clears the cookie).
pub fn session_cookie(config: &ApiConfig, secret: Option<&str>) -> HeaderValue {
    let max_age = secret.map_or(0, |_| config.session_ttl.as_secs());
    cookie(config, cookie_name(config), secret, max_age)
}

/// The `Set-Cookie` value of the sign-in form's cookie (or, with `None`, one that clears it).
pub fn sign_in_cookie(config: &ApiConfig, secret: Option<&str>) -> HeaderValue {
    let max_age = secret.map_or(0, |_| SIGN_IN_FORM_SECS);
    cookie(config, sign_in_cookie_name(config), secret, max_age)
}

fn cookie(config: &ApiConfig, name: &str, secret: Option<&str>, max_age: u64) -> HeaderValue {
    let secure = if config.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    let value = format!(
        "{name}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}",
        secret.unwrap_or("")
    );
    // Built from a fixed name and a base64url secret: always a valid header value.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The session secret the request's cookie carries.
pub fn session_secret<'h>(headers: &'h HeaderMap, config: &ApiConfig) -> Option<&'h str> {
    cookie_value(headers, cookie_name(config))
}

/// The sign-in form's secret the request's cookie carries.
pub fn sign_in_secret<'h>(headers: &'h HeaderMap, config: &ApiConfig) -> Option<&'h str> {
    cookie_value(headers, sign_in_cookie_name(config))
}

fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The inbox's caller: a proxied user (whose session is opened on the first visit), or a
/// session signed in with a token. `Ok(None)`: not signed in.
pub async fn web_caller(
    state: &AppState,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<Option<WebCaller>, Problem> {
    let pool = state.coordinator.store.pool();
    let config = &state.config;
    let secret = session_secret(headers, config);
    let session = match secret {
        Some(secret) => sessions::find(pool, secret)
            .await
            .map_err(|e| unavailable("sessions", DatabaseCode::Error.as_str(), &e))?
            .map(|s| (secret.to_owned(), s)),
        None => None,
    };
    let proxied = proxy_user(headers, peer, config)?;
    let web = match (proxied, session) {
        (Some(user), Some((secret, s))) if s.token_id.is_none() && s.user == user => WebCaller {
            caller: Caller {
                user,
                producer: s.producer,
                via: Via::Proxy,
            },
            csrf: sessions::csrf_token(&secret),
            set_cookie: None,
        },
        (Some(user), _) => {
            let producer = config.proxy_producer.clone();
            let secret = sessions::open(pool, &user, &producer, None, config.session_ttl)
                .await
                .map_err(|e| unavailable("sessions", DatabaseCode::Error.as_str(), &e))?;
            WebCaller {
                caller: Caller {
                    user,
                    producer,
                    via: Via::Proxy,
                },
                csrf: sessions::csrf_token(&secret),
                set_cookie: Some(session_cookie(config, Some(&secret))),
            }
        }
        // A session a proxy opened is good only while the proxy still vouches for its user.
        (None, Some((secret, s))) => match s.token_id {
            Some(token_id) => WebCaller {
                caller: Caller {
                    user: s.user,
                    producer: s.producer,
                    via: Via::Token(token_id),
                },
                csrf: sessions::csrf_token(&secret),
                set_cookie: None,
            },
            None => return Ok(None),
        },
        (None, None) => return Ok(None),
    };
    limited(state, &web.caller)?;
    Ok(Some(web))
}
