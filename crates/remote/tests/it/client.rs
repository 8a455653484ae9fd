//! The client against a canned server: how each way a tool server can fail reaches the loop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use countersign_core::{
    CallIndex, ExecContext, FenceToken, LeaseEpoch, Principal, RunId, SuspensionSeq, Tool,
    ToolError,
};
use countersign_remote::{Limits, RemoteToolServer};
use secrecy::SecretString;
use serde_json::{json, Value};

/// Answers `GET /tools` with one tool of each write effect, `GET /calls/{key}` with `calls`
/// (404 when there is none), and every other request with `status` and `body` after `delay`.
pub(crate) struct Canned {
    status: u16,
    body: String,
    delay: Duration,
    calls: Mutex<Vec<(u16, String)>>,
    pub(crate) posts: AtomicUsize,
    /// Each POST's path and body, as sent.
    pub(crate) bodies: Mutex<Vec<(String, Value)>>,
    /// How often `GET /calls/{key}` was asked.
    pub(crate) asked: AtomicUsize,
}

impl Canned {
    /// Answers to `GET /calls/{key}`, one a request, the last one again and again.
    pub(crate) fn answer_calls(&self, answers: &[(u16, &str)]) {
        *self.calls.lock().unwrap() = answers.iter().map(|(s, b)| (*s, b.to_string())).collect();
    }

    /// How many requests were sent to `path`.
    pub(crate) fn sent_to(&self, suffix: &str) -> usize {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p.ends_with(suffix))
            .count()
    }
}

async fn answer(State(canned): State<Arc<Canned>>, uri: Uri, body: Bytes) -> Response {
    if uri.path().starts_with("/calls/") {
        canned.asked.fetch_add(1, Ordering::SeqCst);
        let mut calls = canned.calls.lock().unwrap();
        let (status, body) = match calls.len() {
            0 => (404, r#"{"error":"not_found"}"#.to_owned()),
            1 => calls[0].clone(),
            _ => calls.remove(0),
        };
        return (StatusCode::from_u16(status).unwrap(), body).into_response();
    }
    if uri.path() == "/tools" {
        let tool = |name: &str, effect: &str| {
            json!({"name": name, "description": "", "parameters": {"type": "object"},
                   "group": "editing", "effect": effect, "enabled_by_default": false,
                   "requires_admin": false, "previews": true})
        };
        let tools = json!({"protocol": 2, "two_phase": true, "tools": [
            tool("absolute", "idempotent_write"), tool("relative", "non_idempotent_write")]});
        return (StatusCode::OK, tools.to_string()).into_response();
    }
    canned.posts.fetch_add(1, Ordering::SeqCst);
    canned.bodies.lock().unwrap().push((
        uri.path().to_owned(),
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    ));
    tokio::time::sleep(canned.delay).await;
    (
        StatusCode::from_u16(canned.status).unwrap(),
        canned.body.clone(),
    )
        .into_response()
}

/// The canned server's router, and what it records.
pub(crate) fn canned(status: u16, body: &str, delay: Duration) -> (Router, Arc<Canned>) {
    let canned = Arc::new(Canned {
        status,
        body: body.to_owned(),
        delay,
        calls: Mutex::new(Vec::new()),
        posts: AtomicUsize::new(0),
        bodies: Mutex::new(Vec::new()),
        asked: AtomicUsize::new(0),
    });
    let app = Router::new()
        .fallback(answer)
        .with_state(Arc::clone(&canned));
    (app, canned)
}

pub(crate) async fn serve(status: u16, body: &str, delay: Duration) -> (String, Arc<Canned>) {
    let (app, canned) = canned(status, body, delay);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), canned)
}

pub(crate) fn tight() -> Limits {
    Limits {
        preview_timeout: Duration::from_millis(200),
        execute_timeout: Duration::from_millis(200),
        max_response_bytes: 1024,
        resolve_budget: Duration::from_millis(600),
        ..Limits::default()
    }
}

pub(crate) async fn tools(url: &str) -> Vec<Arc<dyn Tool>> {
    RemoteToolServer::with_secret("canned", url, &SecretString::from("s"), tight())
        .unwrap()
        // The canned server's declared effects are what these tests exercise.
        .with_word(trusting())
        .discover_tools()
        .await
        .unwrap()
}

/// The operator's word that takes a server's declarations as its own.
pub(crate) fn trusting() -> countersign_remote::OperatorWord {
    countersign_remote::OperatorWord {
        trust_declarations: true,
        ..Default::default()
    }
}

pub(crate) fn tool<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> &'a dyn Tool {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .unwrap()
        .as_ref()
}

pub(crate) fn fenced() -> ExecContext {
    ExecContext {
        acting_user: Principal::new("editor", false),
        fence: Some(FenceToken {
            run_id: RunId::new(),
            lease_owner: "w".into(),
            lease_epoch: LeaseEpoch::new(1).unwrap(),
            suspension_seq: SuspensionSeq::new(1).unwrap(),
            call_index: CallIndex::new(0),
        }),
        shown_preview: None,
        before: Vec::new(),
    }
}

fn args() -> Value {
    json!({"page": "home"})
}

#[tokio::test]
async fn a_preview_that_does_not_answer_in_time_fails_as_remote_timeout() {
    let (url, _) = serve(200, r#"{"lines":["x"]}"#, Duration::from_secs(5)).await;
    let tools = tools(&url).await;
    let previewer = tool(&tools, "absolute").previewer().unwrap();
    let e = previewer
        .preview(&Principal::new("editor", false), &args())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "remote_timeout");
    assert!(!e.interrupts(), "a preview failure is a failed line");
}

#[tokio::test]
async fn an_answer_over_the_size_limit_fails_as_response_too_large() {
    let big = format!(r#"{{"lines":["{}"]}}"#, "x".repeat(4096));
    let (url, _) = serve(200, &big, Duration::ZERO).await;
    let tools = tools(&url).await;
    let e = tool(&tools, "absolute")
        .previewer()
        .unwrap()
        .preview(&Principal::new("editor", false), &args())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "response_too_large");
}

#[tokio::test]
async fn a_preview_answer_that_is_not_lines_fails_as_malformed_response() {
    let (url, _) = serve(200, r#"{"lines":"not a list"}"#, Duration::ZERO).await;
    let tools = tools(&url).await;
    let e = tool(&tools, "absolute")
        .previewer()
        .unwrap()
        .preview(&Principal::new("editor", false), &args())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "malformed_response");
}

#[tokio::test]
async fn may_view_fails_closed_on_an_error_status_and_on_a_malformed_answer() {
    for (status, body) in [(500, r#"{"allowed":true}"#), (200, r#"{"allowed":"yes"}"#)] {
        let (url, _) = serve(status, body, Duration::ZERO).await;
        let tools = tools(&url).await;
        let allowed = tool(&tools, "absolute")
            .previewer()
            .unwrap()
            .may_viewer_read_preview(&args(), &Principal::new("alice", true))
            .await;
        assert!(!allowed, "{status} {body}");
    }
}

#[tokio::test]
async fn an_idempotent_execute_whose_answer_is_lost_and_unresolved_interrupts_the_segment_for_a_retry(
) {
    let (url, canned) = serve(200, "{}", Duration::from_secs(5)).await;
    let tools = tools(&url).await;
    let e = tool(&tools, "absolute")
        .execute(&fenced(), &args())
        .await
        .unwrap_err();
    assert!(e.interrupts(), "{e:?}");
    assert_eq!(e.code(), "remote_timeout");
    assert_eq!(
        canned.asked.load(Ordering::SeqCst),
        1,
        "the server was asked about the key"
    );
}

#[tokio::test]
async fn a_non_idempotent_execute_whose_answer_is_lost_and_unresolved_has_an_unknown_outcome_never_a_failure(
) {
    let (url, canned) = serve(200, "{}", Duration::from_secs(5)).await;
    let tools = tools(&url).await;
    let e = tool(&tools, "relative")
        .execute(&fenced(), &args())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ToolError::OutcomeUnknown {
                code: "remote_timeout",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(canned.sent_to("/execute"), 1, "never sent blindly again");
}

#[tokio::test]
async fn a_server_error_after_a_write_was_sent_is_resolved_by_its_key_before_anything_else() {
    let (url, canned) = serve(503, "{}", Duration::ZERO).await;
    let tools = tools(&url).await;
    let relative = tool(&tools, "relative").execute(&fenced(), &args()).await;
    assert!(
        matches!(
            relative,
            Err(ToolError::OutcomeUnknown {
                code: "remote_status",
                ..
            })
        ),
        "{relative:?}"
    );
    let absolute = tool(&tools, "absolute").execute(&fenced(), &args()).await;
    assert!(matches!(
        absolute,
        Err(ToolError::Unavailable {
            code: "remote_status",
            ..
        })
    ));
    assert_eq!(canned.asked.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_write_whose_answer_was_lost_takes_the_answer_the_server_recorded_under_its_key() {
    let (url, canned) = serve(200, "{}", Duration::from_secs(5)).await;
    // Still working on it once, then the answer it recorded.
    canned.answer_calls(&[
        (503, "{}"),
        (
            200,
            r#"{"status":"answered","content":"Appended line 3.","is_error":false}"#,
        ),
    ]);
    let tools = tools(&url).await;
    let out = tool(&tools, "relative")
        .execute(&fenced(), &args())
        .await
        .expect("resolved by its key");
    assert_eq!(out.content, "Appended line 3.");
    assert!(!out.is_error);
    assert_eq!(canned.sent_to("/execute"), 1);
    assert_eq!(canned.asked.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_write_whose_key_the_server_never_saw_is_sent_again_under_the_same_key() {
    let (url, canned) = serve(502, "{}", Duration::ZERO).await;
    canned.answer_calls(&[(200, r#"{"status":"unseen"}"#)]);
    let tools = tools(&url).await;
    let e = tool(&tools, "relative")
        .execute(&fenced(), &args())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "remote_status");
    let sent: Vec<Value> = canned
        .bodies
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _)| p.ends_with("/execute"))
        .map(|(_, b)| b["idempotency_key"].clone())
        .collect();
    assert_eq!(
        sent.len(),
        3,
        "sent while the server says it never saw it, at most three times"
    );
    assert!(
        sent.windows(2).all(|w| w[0] == w[1]),
        "always under one key: {sent:?}"
    );
}

#[tokio::test]
async fn a_write_its_server_found_moved_under_its_key_is_told_as_moved() {
    let (url, canned) = serve(200, "{}", Duration::from_secs(5)).await;
    canned.answer_calls(&[(200, r#"{"status":"moved"}"#)]);
    let tools = tools(&url).await;
    let e = tool(&tools, "relative")
        .execute(&fenced(), &args())
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::Moved), "{e:?}");
}

#[tokio::test]
async fn a_server_nobody_listens_on_fails_discovery_as_remote_unreachable() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let server = RemoteToolServer::with_secret(
        "gone",
        &format!("http://127.0.0.1:{port}"),
        &SecretString::from("s"),
        tight(),
    )
    .unwrap();
    let e = server.discover_tools().await.unwrap_err();
    assert_eq!(e.code(), "remote_unreachable");
}

#[tokio::test]
async fn an_execute_the_server_fenced_out_is_a_lost_lease() {
    let (url, _) = serve(409, r#"{"error":"fenced"}"#, Duration::ZERO).await;
    let tools = tools(&url).await;
    let e = tool(&tools, "relative")
        .execute(&fenced(), &args())
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::FenceLost));
}

#[tokio::test]
async fn a_remote_write_without_a_fence_is_refused_without_a_request() {
    let (url, canned) = serve(200, r#"{"content":"","is_error":false}"#, Duration::ZERO).await;
    let tools = tools(&url).await;
    let ctx = ExecContext {
        acting_user: Principal::new("editor", false),
        fence: None,
        shown_preview: None,
        before: Vec::new(),
    };
    let e = tool(&tools, "absolute")
        .execute(&ctx, &args())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "unfenced_write");
    assert_eq!(canned.posts.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_tool_whose_server_does_not_classify_its_group_counts_as_secret_adjacent() {
    let (url, _) = serve(200, "{}", Duration::ZERO).await;
    let tools = tools(&url).await;
    for name in ["absolute", "relative"] {
        assert_eq!(
            tool(&tools, name).spec().data_class,
            countersign_core::DataClass::SecretAdjacent,
            "{name}"
        );
    }
}
