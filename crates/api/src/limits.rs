//! What bounds a request: a rate per credential, a deadline, a body size, and the headers that
//! keep a browser from doing more with a page than showing it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};

use crate::problem::{Problem, ProblemCode};
use crate::AppState;

/// The Content-Security-Policy of every response: nothing but this origin's stylesheet and its
/// one script file (the keyboard shortcuts, served from the binary), no inline script, forms
/// only to this origin, no framing. A preview that smuggled markup past the escaping still
/// could not run or load anything.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; \
     base-uri 'none'";

/// A token bucket per credential: `burst` requests at once, refilled at `per_minute`.
#[derive(Debug)]
pub struct RateLimiter {
    per_minute: u32,
    burst: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Buckets kept before the full ones are forgotten.
const MAX_BUCKETS: usize = 10_000;

impl RateLimiter {
    pub fn new(per_minute: u32, burst: u32) -> RateLimiter {
        RateLimiter {
            per_minute: per_minute.max(1),
            burst: burst.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `key`'s bucket has a request left, without taking it: `Ok` when it has, else
    /// the seconds until it will.
    pub fn check(&self, key: &str) -> Result<(), u64> {
        let rate = f64::from(self.per_minute) / 60.0;
        let buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(bucket) = buckets.get(key) else {
            return Ok(());
        };
        let refilled =
            (bucket.tokens + bucket.at.elapsed().as_secs_f64() * rate).min(f64::from(self.burst));
        if refilled >= 1.0 {
            Ok(())
        } else {
            Err(wait_secs(refilled, rate))
        }
    }

    /// Takes one request from `key`'s bucket: `Ok` when there was one, else the seconds until
    /// there will be.
    pub fn take(&self, key: &str) -> Result<(), u64> {
        let rate = f64::from(self.per_minute) / 60.0;
        let burst = f64::from(self.burst);
        let now = Instant::now();
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= MAX_BUCKETS {
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refilled =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(burst);
        if refilled >= 1.0 {
            *bucket = Bucket {
                tokens: refilled - 1.0,
                at: now,
            };
            Ok(())
        } else {
            *bucket = Bucket {
                tokens: refilled,
                at: now,
            };
            Err(wait_secs(refilled, rate))
        }
    }
}

/// Whole seconds until one request's worth has refilled a bucket holding `refilled`, at
/// least one.
fn wait_secs(refilled: f64, rate: f64) -> u64 {
    let wait = ((1.0 - refilled) / rate).ceil();
    if wait.is_finite() && wait >= 1.0 {
        wait as u64
    } else {
        1
    }
}

/// Refuses a request that outlives the configured deadline with `timeout`. The gates are not
/// hurt by being abandoned: an unfinished transaction rolls back, a committed decision whose
/// wake-up was not published is published again by the reaper, and a retry with the same id
/// replays the recorded outcome.
pub async fn deadline(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(state.config.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => Problem::new(ProblemCode::Timeout).into_response(),
    }
}

/// Closes the connection after answering a request whose body was not read to its end (a
/// request refused before its body was looked at, or one too large to read): the rest of that
/// body is still on the connection, where the next request would be looked for, so the answer
/// says `Connection: close` and the client opens a new connection for its next request instead
/// of having it reset.
pub async fn close_unread(request: Request, next: Next) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let read = Arc::new(AtomicBool::new(false));
    let request = request.map(|inner| {
        Body::new(Watched {
            inner,
            read: read.clone(),
        })
    });
    let mut response = next.run(request).await;
    if !read.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that notes when it was read to its end.
struct Watched {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The headers every response carries.
pub async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// What [`read_body`] can answer.
pub const BODY_PROBLEMS: [ProblemCode; 2] = [ProblemCode::BodyTooLarge, ProblemCode::Malformed];

/// A body read whole, up to `limit` bytes: `body_too_large` beyond, `malformed` when the
/// client broke off.
pub async fn read_body(body: axum::body::Body, limit: usize) -> Result<axum::body::Bytes, Problem> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            Problem::new(ProblemCode::BodyTooLarge)
        } else {
            Problem::malformed("body_unreadable")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_refuses_with_the_wait() {
        let limiter = RateLimiter::new(60, 3);
        for _ in 0..3 {
            assert_eq!(limiter.take("a"), Ok(()));
        }
        assert_eq!(limiter.check("a"), Err(1), "checking takes nothing");
        assert_eq!(limiter.take("a"), Err(1));
        assert_eq!(limiter.check("b"), Ok(()));
        assert_eq!(limiter.take("b"), Ok(()), "buckets are per credential");
    }
}
