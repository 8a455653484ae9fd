//! The API served on a real socket, over a migrated database of its own (`#[sqlx::test]`), a
//! RabbitMQ topology of its own, the demo site, an agent, and a real worker's segment runner to
//! suspend and resume runs.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Request};
use countersign_api::{tokens, ApiConfig, AppState};
use countersign_content::ContentUsers;
use countersign_coordinator::Coordinator;
use countersign_core::{RunId, UserDirectory};
use countersign_queue::{Broker, QueueConfig, Topology};
use countersign_store::AgentConfig;
use countersign_testkit::amqp_addr;
use countersign_testkit::site::Site;
use countersign_worker::SegmentEnd;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

pub const AGENT: &str = "seo";
pub const WRITERS: [&str; 2] = ["update_page_metadata", "attach_file_to_content_element"];
/// What the model proposes for page 12's description: markup a page must show as text.
pub const DESCRIPTION: &str = r#"Bicycles <b>for</b> every road <script>alert("pwned")</script>"#;

fn script() -> String {
    json!({"turns": [
        {"tool_calls": [
            {"name": "update_page_metadata", "arguments": {"uid": 12, "description": DESCRIPTION}},
            {"name": "attach_file_to_content_element",
             "arguments": {"content_element": 5, "file": 13, "field": "image"}}
        ]},
        {"content": "Done."}
    ]})
    .to_string()
}

/// The API on a real socket over the demo site, the agent and the worker's segment runner.
pub struct Harness {
    pub site: Site,
    pub broker: Broker,
    pub addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl std::ops::Deref for Harness {
    type Target = Site;

    fn deref(&self) -> &Site {
        &self.site
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The agent as the harness configures it.
pub fn agent(four_eyes: bool) -> AgentConfig {
    countersign_testkit::site::agent(AGENT, &WRITERS, four_eyes)
}

/// A plain-HTTP configuration (cookies not `Secure`, since the test talks plain HTTP).
pub fn config() -> ApiConfig {
    ApiConfig {
        secure_cookies: false,
        ..ApiConfig::default()
    }
}

pub async fn harness(pool: PgPool) -> Harness {
    harness_with(pool, config()).await
}

pub async fn harness_with(pool: PgPool, config: ApiConfig) -> Harness {
    let users: Arc<dyn UserDirectory> = Arc::new(ContentUsers::new(pool.clone()));
    harness_with_users(pool, config, users).await
}

/// A harness whose API asks `api_users` who callers are and whose runs they may approve (the
/// worker's segments keep the content store's users, which its tools need).
pub async fn harness_with_users(
    pool: PgPool,
    config: ApiConfig,
    api_users: Arc<dyn UserDirectory>,
) -> Harness {
    let site = Site::new(pool, &agent(true), &script()).await;
    let prefix = format!("api-it-{}", Uuid::now_v7());
    let broker = Broker::connect(QueueConfig::new(amqp_addr(), Topology::new(prefix)))
        .await
        .expect("RabbitMQ answers");
    let registry = site.runner.registry.clone();
    let coordinator = Coordinator::with_users(site.store.clone(), registry, api_users);
    let state = AppState::new(coordinator, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        countersign_api::serve(listener, state, std::future::pending())
            .await
            .unwrap();
    });
    Harness {
        site,
        broker,
        addr,
        server,
    }
}

/// A response, read whole, with the request it answers.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    method: Method,
    path: String,
}

/// The codes the OpenAPI document lists for `status` of the operation that `method path` is
/// a request of; `None` when no operation of the document matches the path.
pub fn documented_codes(method: &Method, path: &str, status: u16) -> Option<Vec<String>> {
    let doc: Value = serde_json::from_str(&countersign_api::openapi::document()).unwrap();
    let path = path.split('?').next().unwrap_or_default();
    let asked: Vec<&str> = path.split('/').collect();
    let (_, operations) = doc["paths"].as_object()?.iter().find(|(template, _)| {
        let parts: Vec<&str> = template.split('/').collect();
        parts.len() == asked.len()
            && parts
                .iter()
                .zip(&asked)
                .all(|(t, a)| t == a || t.starts_with('{'))
    })?;
    let operation = operations.get(method.as_str().to_ascii_lowercase())?;
    let schema = &operation["responses"][status.to_string()]["content"]["application/problem+json"]
        ["schema"];
    let codes = schema["allOf"][1]["properties"]["code"]["enum"]
        .as_array()
        .map(|codes| {
            codes
                .iter()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Some(codes)
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON ({}): {}", self.status, self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts a problem+json body with this status and code, and returns it.
    pub fn problem(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.text()
        );
        let body = self.json();
        assert_eq!(body["code"], code, "{body}");
        assert_eq!(body["status"], status, "{body}");
        assert_eq!(
            body["type"],
            format!("urn:countersign:problem:{code}"),
            "{body}"
        );
        // The document says so: every problem a test meets on an operation is listed for it.
        if let Some(codes) = documented_codes(&self.method, &self.path, status) {
            assert!(
                codes.iter().any(|c| c == code),
                "{} {} answered {status} {code}, which the OpenAPI document does not list ({codes:?})",
                self.method,
                self.path
            );
        }
        body
    }
}

impl Harness {
    /// Issues a token for `user`.
    pub async fn token(&self, user: &str) -> String {
        tokens::create(&self.pool, user, Some("test"), None)
            .await
            .unwrap()
            .secret()
            .to_owned()
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Reply {
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let mut request = Request::builder()
            .method(method.clone())
            .uri(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .unwrap();
        let response = client.request(request).await.expect("the API answers");
        let (parts, body) = response.into_parts();
        Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes().to_vec(),
            method,
            path: path.to_owned(),
        }
    }

    /// `GET path` with a bearer token.
    pub async fn get(&self, token: &str, path: &str) -> Reply {
        let auth = format!("Bearer {token}");
        self.send(Method::GET, path, &[("authorization", &auth)], None)
            .await
    }

    /// `POST path` with a bearer token and a JSON body, plus `headers`.
    pub async fn post(
        &self,
        token: &str,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Reply {
        let auth = format!("Bearer {token}");
        let mut all = vec![
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ];
        all.extend_from_slice(headers);
        self.send(
            Method::POST,
            path,
            &all,
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    /// A run requested through the API with `token` (for its own user), left queued.
    pub async fn requested_run(&self, token: &str) -> RunId {
        let reply = self
            .post(
                token,
                "/v1/runs",
                &json!({"agent": AGENT, "prompt": "Improve page 12."}),
                &[],
            )
            .await;
        assert_eq!(reply.status, 202, "{}", reply.text());
        RunId::parse(reply.json()["run_id"].as_str().unwrap()).unwrap()
    }

    /// A run acting as `editor`, requested through the API and suspended on its write turn by
    /// the worker's segment runner.
    pub async fn suspended_run(&self) -> RunId {
        let editor = self.token("editor").await;
        let run_id = self.requested_run(&editor).await;
        assert_eq!(
            self.claim_and_run(run_id).await,
            SegmentEnd::Suspended {
                suspension_seq: 1,
                moved: 0
            }
        );
        run_id
    }

    pub async fn claim_and_run(&self, run_id: RunId) -> SegmentEnd {
        self.site.claim_and_run(run_id, "w1").await
    }

    /// A colleague attaches another image to the teaser: the attach call's preview moves.
    pub async fn colleague_attaches_an_image(&self) {
        sqlx::query(
            "INSERT INTO content.file_references (element, field, file, sorting)
             SELECT 5, 'image', 10, coalesce(max(sorting), 0) + 1
             FROM content.file_references WHERE element = 5 AND field = 'image'",
        )
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// Publishes what the API's transactions committed, as the process's outbox relay does,
    /// and returns the runs the segments queue now holds wake-ups for, in order.
    pub async fn relay_wake_ups(&self) -> Vec<RunId> {
        countersign_service::relay::relay_now(&self.store, &self.broker).await;
        let queue = self.broker.topology().segments();
        let waiting = self.broker.message_count(&queue).await.unwrap();
        let mut consumer = self.broker.consume(&queue, 16).await.unwrap();
        let mut runs = Vec::new();
        for _ in 0..waiting {
            let delivery = consumer.next().await.unwrap().unwrap();
            runs.push(countersign_queue::parse_segment(&delivery.body).unwrap());
            delivery.ack().await.unwrap();
        }
        runs
    }

    /// Deletes this harness's queues and exchanges.
    pub async fn finish(self) {
        self.broker.delete_topology().await.unwrap();
    }
}

/// A decision body on the card `card` (a `GET …/card` answer).
pub fn decision_on(card: &Value, approved: bool) -> Value {
    json!({
        "suspension_seq": card["suspension_seq"],
        "turn_digest": card["turn_digest"],
        "approved": approved,
    })
}
