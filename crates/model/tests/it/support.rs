//! A local OpenAI-compatible endpoint that answers canned responses and records what it was
//! sent, and when.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use countersign_core::{
    Message, Model, ModelError, ModelOptions, ModelRequest, ModelResponse, ToolSpec,
};
use serde_json::Value;

/// One request as the endpoint received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub authorization: Option<String>,
    pub body: Value,
    pub at: Instant,
}

/// One canned answer: a status, its extra headers, a body, after a delay.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Reply {
    pub fn new(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: vec![],
            body: body.to_owned(),
            delay: Duration::ZERO,
        }
    }

    pub fn with_header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_owned()));
        self
    }
}

struct Canned {
    /// Answered in turn; the last one to every request after it.
    replies: Vec<Reply>,
    requests: Mutex<Vec<Recorded>>,
}

pub struct Endpoint {
    pub base_url: String,
    canned: Arc<Canned>,
}

impl Endpoint {
    /// An endpoint answering every request with `status` and `body`, after `delay`.
    pub async fn start(status: u16, body: &str, delay: Duration) -> Endpoint {
        Self::replying(vec![Reply {
            delay,
            ..Reply::new(status, body)
        }])
        .await
    }

    /// An endpoint answering the first request with the first reply, the second with the
    /// second, …, and every request after the last with the last.
    pub async fn replying(replies: Vec<Reply>) -> Endpoint {
        assert!(!replies.is_empty(), "an endpoint answers something");
        let canned = Arc::new(Canned {
            replies,
            requests: Mutex::new(vec![]),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(Arc::clone(&canned));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Endpoint {
            base_url: format!("http://{address}/v1"),
            canned,
        }
    }

    pub async fn answering(body: &str) -> Endpoint {
        Self::start(200, body, Duration::ZERO).await
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.canned.requests.lock().unwrap().clone()
    }
}

async fn answer(State(canned): State<Arc<Canned>>, headers: HeaderMap, body: Bytes) -> Response {
    let recorded = Recorded {
        authorization: headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: Instant::now(),
    };
    let reply = {
        let mut requests = canned.requests.lock().unwrap();
        requests.push(recorded);
        canned.replies[(requests.len() - 1).min(canned.replies.len() - 1)].clone()
    };
    tokio::time::sleep(reply.delay).await;
    let mut response = (
        StatusCode::from_u16(reply.status).unwrap(),
        [(CONTENT_TYPE, "application/json")],
        reply.body,
    )
        .into_response();
    for (name, value) in reply.headers {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_str(&value).unwrap());
    }
    response
}

/// Sends `messages` with no tools and no options.
pub async fn ask(model: &dyn Model, messages: &[Message]) -> Result<ModelResponse, ModelError> {
    ask_with(model, messages, &[], &ModelOptions::new()).await
}

pub async fn ask_with(
    model: &dyn Model,
    messages: &[Message],
    tools: &[&ToolSpec],
    options: &ModelOptions,
) -> Result<ModelResponse, ModelError> {
    model
        .complete(ModelRequest {
            messages,
            tools,
            options,
        })
        .await
}

/// A chat completion whose message is `message`.
pub fn completion(message: Value) -> String {
    serde_json::json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    })
    .to_string()
}
