//! An OpenAI-compatible chat-completions endpoint on the loopback interface that answers what
//! it is told: canned replies in turn, or whatever a function makes of each request. A reply
//! may come after a delay, carry any status and headers (a 429 with `Retry-After`), or be
//! held until the test releases it (a provider that hangs).
//!
//! It serves on a thread and runtime of its own, so it answers whatever the caller does
//! meanwhile — a test blocked on a command line included — and stops, dropping every
//! connection, when it is dropped. `GET /in-flight` says how many requests it is answering,
//! for a stub in a process of its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};
use tokio::sync::{oneshot, watch};

/// One request as the stub received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub authorization: Option<String>,
    pub body: Value,
    pub at: Instant,
}

/// One answer: a status, its extra headers and body, after a delay, perhaps held.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
    /// Sent only once [`ModelStub::release`] is called; never, if it is not.
    pub held: bool,
}

impl Reply {
    pub fn new(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: vec![],
            body: body.to_owned(),
            delay: Duration::ZERO,
            held: false,
        }
    }

    /// A chat completion whose one choice says `content` and calls `calls` (name, arguments).
    pub fn chat(content: &str, calls: &[(&str, Value)]) -> Reply {
        Reply::new(200, &chat_answer(content, calls).to_string())
    }

    /// HTTP 429, asking the caller to come back in `seconds`.
    pub fn too_many_requests(seconds: u64) -> Reply {
        let body = json!({"error": {"message": "rate limited, try again in a second"}});
        Reply::new(429, &body.to_string()).with_header("retry-after", &seconds.to_string())
    }

    pub fn with_header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_owned()));
        self
    }

    /// The same reply, sent `delay` after the request arrived.
    pub fn after(self, delay: Duration) -> Reply {
        Reply { delay, ..self }
    }

    /// The same reply, withheld until the test releases it.
    pub fn held(self) -> Reply {
        Reply { held: true, ..self }
    }
}

/// A chat completion body: one choice saying `content` and calling `calls`.
pub fn chat_answer(content: &str, calls: &[(&str, Value)]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(n, (name, arguments))| {
            json!({
                "id": format!("call_{}", n + 1), "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()},
            })
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    json!({
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    })
}

/// The messages of a chat-completion request with `role`, their `content` as text.
pub fn messages_with_role(request: &Value, role: &str) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == role)
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Decides the reply to a request, given every request so far (this one last).
type Answer = dyn Fn(&[Recorded]) -> Reply + Send + Sync;

struct Shared {
    answer: Box<Answer>,
    requests: Mutex<Vec<Recorded>>,
    in_flight: AtomicU64,
    released: watch::Sender<bool>,
}

/// The stub; see the module documentation.
pub struct ModelStub {
    /// `http://127.0.0.1:PORT/v1`, as a provider's settings name it.
    pub base_url: String,
    port: u16,
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

impl std::fmt::Debug for ModelStub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelStub")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl ModelStub {
    /// Answers the first request with the first reply, the second with the second, …, and
    /// every request after the last with the last.
    pub fn replying(replies: Vec<Reply>) -> ModelStub {
        assert!(!replies.is_empty(), "a stub answers something");
        ModelStub::serve(move |seen| replies[(seen.len() - 1).min(replies.len() - 1)].clone())
    }

    /// Answers each request with the chat completion `answer` makes of its body; `None` holds
    /// it unanswered (a hanging provider).
    pub fn responding(answer: impl Fn(&Value) -> Option<Value> + Send + Sync + 'static) -> Self {
        ModelStub::serve(move |seen| {
            let request = &seen[seen.len() - 1].body;
            match answer(request) {
                Some(body) => Reply::new(200, &body.to_string()),
                None => Reply::new(200, "{}").held(),
            }
        })
    }

    /// A stub that takes every request and answers none.
    pub fn silent() -> ModelStub {
        ModelStub::responding(|_| None)
    }

    /// Answers each request with what `answer` makes of every request so far (this one last).
    pub fn serve(answer: impl Fn(&[Recorded]) -> Reply + Send + Sync + 'static) -> ModelStub {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.set_nonblocking(true).expect("a listener");
        let port = listener.local_addr().expect("a local address").port();
        let shared = Arc::new(Shared {
            answer: Box::new(answer),
            requests: Mutex::new(Vec::new()),
            in_flight: AtomicU64::new(0),
            released: watch::Sender::new(false),
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/in-flight", get(in_flight))
            .with_state(shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the stub's runtime");
            // Once this returns the runtime goes, and every connection with it.
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = stopped => {}
                }
            });
        });
        ModelStub {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            port,
            shared,
            _stop: stop,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The body of every request received so far, in arrival order.
    pub fn bodies(&self) -> Vec<Value> {
        self.requests().into_iter().map(|r| r.body).collect()
    }

    /// The requests received and not answered yet (held ones included).
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Sends every held reply, and those of later held requests at once.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }
}

/// Counts a request in flight until it is answered or its connection goes.
struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn complete(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.in_flight.fetch_add(1, Ordering::SeqCst);
    let _counted = InFlight(&shared.in_flight);
    let recorded = Recorded {
        authorization: headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: Instant::now(),
    };
    let reply = {
        let mut requests = shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        requests.push(recorded);
        (shared.answer)(&requests)
    };
    if reply.held {
        let _ = shared
            .released
            .subscribe()
            .wait_for(|released| *released)
            .await;
    }
    tokio::time::sleep(reply.delay).await;
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, [(CONTENT_TYPE, "application/json")], reply.body).into_response();
    for (name, value) in reply.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

async fn in_flight(State(shared): State<Arc<Shared>>) -> String {
    shared.in_flight.load(Ordering::SeqCst).to_string()
}
