//! The web inbox: server-rendered pages for approvers, on the same gates as the API.
//!
//! Sign-in is a token (which opens a session cookie: `HttpOnly`, `SameSite=Strict`, `Secure`
//! unless turned off for plain-HTTP development) or a trusted proxy's header. Every form
//! carries a CSRF token and is refused without it — the session's, or for the sign-in form,
//! the token of a cookie the sign-in page set — and a browser's `Sec-Fetch-Site: cross-site`
//! is refused outright. The decision form carries the card's
//! `suspension_seq` and `turn_digest` — the card the page showed, never the run's current
//! one — and a `decision_id` chosen when the page was rendered, so submitting twice replays the
//! first outcome instead of deciding twice, and a stale tab is refused `stale_turn`.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use chrono::Utc;
use countersign_coordinator::grants::{GivenGrant, DEFAULT_GRANT_HOURS};
use countersign_core::card::ApprovalCard;
use countersign_core::{DatabaseCode, RunId, SuspensionSeq};
use countersign_store::{DecisionOutcome, RunRecord, RunStatus};
use maud::Markup;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use countersign_store::Waiting;

use crate::auth::{self, web_caller, Via, WebCaller};
use crate::cards::{card_for, glimpses};
use crate::drafts::DecisionDraft;
use crate::limits::read_body;
use crate::pages::{self, Viewer};
use crate::problem::{unavailable, Problem, ProblemCode};
use crate::queries::{decode_cursor, encode_cursor, inbox_page, visible_run, Access};
use crate::sessions;
use crate::tokens;
use crate::v1::{take_decision, DecisionAccepted};
use crate::AppState;

/// Runs per inbox page.
const PAGE: u32 = 50;

fn viewer(web: &WebCaller) -> Viewer<'_> {
    Viewer {
        user: &web.caller.user,
        csrf: &web.csrf,
        proxied: web.caller.via == Via::Proxy,
    }
}

/// A page, with the session cookie a proxied first visit opened.
fn page(status: StatusCode, web: Option<&WebCaller>, markup: Markup) -> Response {
    let mut response = (status, Html(markup.into_string())).into_response();
    if let Some(cookie) = web.and_then(|w| w.set_cookie.clone()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

fn problem_page(web: Option<&WebCaller>, problem: &Problem) -> Response {
    page(
        problem.status(),
        web,
        pages::problem(web.map(viewer), problem),
    )
}

fn to_sign_in() -> Response {
    Redirect::to("/inbox/sign-in").into_response()
}

/// The signed-in caller, or the response that sends the browser to sign in.
async fn signed_in(
    state: &AppState,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<WebCaller, Response> {
    match web_caller(state, headers, Some(peer.ip())).await {
        Ok(Some(web)) => Ok(web),
        Ok(None) => Err(to_sign_in()),
        Err(problem) => Err(problem_page(None, &problem)),
    }
}

/// Refuses a form another site made the browser send.
fn same_site(headers: &HeaderMap) -> Result<(), Problem> {
    let cross = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"));
    if cross {
        return Err(Problem::new(ProblemCode::CsrfRejected));
    }
    Ok(())
}

/// Compares without stopping at the first difference.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A form body's fields.
async fn form(state: &AppState, body: Body) -> Result<Vec<(String, String)>, Problem> {
    let bytes = read_body(body, state.config.max_body_bytes).await?;
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(&bytes)
        .map_err(|_| Problem::malformed("invalid_form"))
}

fn field<'f>(fields: &'f [(String, String)], name: &str) -> Option<&'f str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A form of a signed-in session: the CSRF token must be the session's.
fn checked_form(
    web: &WebCaller,
    headers: &HeaderMap,
    fields: &[(String, String)],
) -> Result<(), Problem> {
    same_site(headers)?;
    match field(fields, "csrf") {
        Some(csrf) if same_secret(csrf, &web.csrf) => Ok(()),
        _ => Err(Problem::new(ProblemCode::CsrfRejected)),
    }
}

pub async fn root() -> Redirect {
    Redirect::to("/inbox")
}

pub async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        pages::STYLESHEET,
    )
        .into_response()
}

pub async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        pages::SCRIPT,
    )
        .into_response()
}

/// The sign-in page, with the form's token of the browser's sign-in cookie (set now when the
/// browser has none).
fn sign_in_form(
    state: &AppState,
    headers: &HeaderMap,
    status: StatusCode,
    failed: bool,
) -> Response {
    let existing = auth::sign_in_secret(headers, &state.config)
        .and_then(|secret| Some((secret.to_owned(), sessions::sign_in_token(secret)?)));
    let (secret, csrf, fresh) = match existing {
        Some((secret, csrf)) => (secret, csrf, false),
        None => {
            let secret = sessions::sign_in_secret();
            let csrf = sessions::sign_in_token(&secret).unwrap_or_default();
            (secret, csrf, true)
        }
    };
    let header = state.config.trusted_header.as_ref().map(|h| h.as_str());
    let mut response = page(status, None, pages::sign_in(failed, header, &csrf));
    if fresh {
        response.headers_mut().insert(
            header::SET_COOKIE,
            auth::sign_in_cookie(&state.config, Some(&secret)),
        );
    }
    response
}

/// Refuses a sign-in whose form this inbox did not render for this browser.
fn sign_in_checked(
    state: &AppState,
    headers: &HeaderMap,
    fields: &[(String, String)],
) -> Result<(), Problem> {
    let expected = auth::sign_in_secret(headers, &state.config).and_then(sessions::sign_in_token);
    match (expected, field(fields, "csrf")) {
        (Some(expected), Some(csrf)) if same_secret(csrf, &expected) => Ok(()),
        _ => Err(Problem::new(ProblemCode::CsrfRejected)),
    }
}

pub async fn sign_in_page(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    // A proxied user is signed in already.
    if let Ok(Some(web)) = web_caller(&state, &headers, Some(peer.ip())).await {
        if web.caller.via == Via::Proxy {
            let mut response = Redirect::to("/inbox").into_response();
            if let Some(cookie) = web.set_cookie {
                response.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            return response;
        }
    }
    sign_in_form(&state, &headers, StatusCode::OK, false)
}

pub async fn sign_in(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        same_site(&headers)?;
        // Token guesses are limited per address; a token has 256 bits, but a flood still costs.
        auth::limited_address(&state, peer.ip())?;
        let fields = form(&state, body).await?;
        sign_in_checked(&state, &headers, &fields)?;
        let secret = field(&fields, "token").unwrap_or("").trim().to_owned();
        let pool = state.coordinator.store.pool();
        let token = tokens::verify(pool, &secret)
            .await
            .map_err(|e| unavailable("tokens", e.code(), &e))?;
        let Some(token) = token else {
            return Ok(None);
        };
        let session = sessions::open(
            pool,
            &token.user,
            &token.producer(),
            Some(token.id),
            state.config.session_ttl,
        )
        .await
        .map_err(|e| unavailable("sessions", DatabaseCode::Error.as_str(), &e))?;
        Ok::<_, Problem>(Some(session))
    }
    .await;
    match result {
        Ok(Some(session)) => {
            let mut response = Redirect::to("/inbox").into_response();
            let headers = response.headers_mut();
            headers.append(
                header::SET_COOKIE,
                auth::session_cookie(&state.config, Some(&session)),
            );
            headers.append(
                header::SET_COOKIE,
                auth::sign_in_cookie(&state.config, None),
            );
            response
        }
        Ok(None) => sign_in_form(&state, &headers, StatusCode::UNAUTHORIZED, true),
        Err(problem) => problem_page(None, &problem),
    }
}

pub async fn sign_out(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let web = match signed_in(&state, &headers, peer).await {
        Ok(web) => web,
        Err(response) => return response,
    };
    let fields = match form(&state, body).await {
        Ok(fields) => fields,
        Err(problem) => return problem_page(Some(&web), &problem),
    };
    if let Err(problem) = checked_form(&web, &headers, &fields) {
        return problem_page(Some(&web), &problem);
    }
    if let Some(secret) = auth::session_secret(&headers, &state.config) {
        if let Err(e) = sessions::close(state.coordinator.store.pool(), secret).await {
            return problem_page(
                Some(&web),
                &unavailable("sessions", DatabaseCode::Error.as_str(), &e),
            );
        }
    }
    let mut response = Redirect::to("/inbox/sign-in").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        auth::session_cookie(&state.config, None),
    );
    response
}

#[derive(Debug, Deserialize)]
pub struct InboxParams {
    cursor: Option<String>,
    /// Only this agent's runs; empty is every agent.
    agent: Option<String>,
    /// `me`: the runs waiting on the viewer; `groups`: those waiting on the viewer's groups.
    waiting: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(params): Query<InboxParams>,
) -> Response {
    let web = match signed_in(&state, &headers, peer).await {
        Ok(web) => web,
        Err(response) => return response,
    };
    let agent = params
        .agent
        .as_deref()
        .map(str::trim)
        .filter(|a| !a.is_empty());
    let waiting: Waiting = params
        .waiting
        .as_deref()
        .and_then(|w| w.parse().ok())
        .unwrap_or_default();
    let result = async {
        let cursor = match params.cursor.as_deref() {
            None => None,
            Some(c) => Some(decode_cursor(c).ok_or(Problem::new(ProblemCode::InvalidQuery))?),
        };
        let access = Access::of(state.coordinator.users.as_ref(), &web.caller).await?;
        let inbox = inbox_page(
            &state.coordinator.store,
            &access,
            agent,
            waiting,
            PAGE,
            cursor,
        )
        .await?;
        let glimpses = glimpses(&state, &inbox.runs, &access.user).await;
        Ok::<_, Problem>((inbox, glimpses))
    }
    .await;
    match result {
        Ok((inbox, glimpses)) => {
            let next = inbox.next.as_ref().map(encode_cursor);
            let markup = pages::inbox(
                viewer(&web),
                &inbox.runs,
                &glimpses,
                pages::Listed { agent, waiting },
                next.as_deref(),
                Utc::now(),
            );
            page(StatusCode::OK, Some(&web), markup)
        }
        Err(problem) => problem_page(Some(&web), &problem),
    }
}

pub async fn run(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
) -> Response {
    let web = match signed_in(&state, &headers, peer).await {
        Ok(web) => web,
        Err(response) => return response,
    };
    let result = async {
        let run_id = RunId::parse(&run_id).map_err(|_| Problem::new(ProblemCode::NotFound))?;
        let (run, access) = visible_run(&state, &web.caller, run_id).await?;
        let card = shown_card(&state, &run, &access).await?;
        let events = state
            .coordinator
            .store
            .events(run_id)
            .await
            .map_err(|e| unavailable("events", e.code(), &e))?;
        let queue = neighbours(&state, &access, run_id).await?;
        let offer_grant = match &card {
            Some(card) => state
                .coordinator
                .grant_offered(run_id, card.suspension_seq, &web.caller.user)
                .await
                .map_err(|e| unavailable("grants", e.code(), &e))?,
            None => false,
        };
        Ok((run, card, events, queue, offer_grant))
    }
    .await;
    match result {
        Ok((run, card, events, queue, offer_grant)) => {
            let decision_id = Uuid::now_v7().to_string();
            let markup = pages::run_page(
                viewer(&web),
                &run,
                card.as_ref(),
                &decision_id,
                &events,
                queue,
                offer_grant,
            );
            page(StatusCode::OK, Some(&web), markup)
        }
        Err(problem) => problem_page(Some(&web), &problem),
    }
}

/// The card of `run` its page shows: when it waits for approval and the viewer may decide on
/// it, and it is still there to be read.
async fn shown_card(
    state: &AppState,
    run: &RunRecord,
    access: &Access,
) -> Result<Option<ApprovalCard>, Problem> {
    if run.status != RunStatus::WaitingForApproval || !access.may_decide(run) {
        return Ok(None);
    }
    match card_for(state, run, access).await {
        Ok(card) => Ok(Some(card)),
        // Moved on between the read of the row and the state: show what it is now.
        Err(p) if p.code == ProblemCode::Decision(DecisionOutcome::NotAwaitingApproval) => Ok(None),
        Err(p) if p.code == ProblemCode::StateUnreadable => Ok(None),
        Err(p) => Err(p),
    }
}

pub async fn decide(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
    body: Body,
) -> Response {
    let web = match signed_in(&state, &headers, peer).await {
        Ok(web) => web,
        Err(response) => return response,
    };
    let result = async {
        let fields = form(&state, body).await?;
        checked_form(&web, &headers, &fields)?;
        let run_id =
            RunId::parse(&run_id).map_err(|_| Problem::malformed("invalid_path:run_id"))?;
        let decided = decided_as(&fields)?;
        let draft = decision_draft(run_id, &web.caller.user, &fields, decided);
        let outcome = take_decision(&state, &web.caller, draft.message()).await?;
        let seq = field(&fields, "suspension_seq").unwrap_or("");
        // The grant only with an accepted approval of the card it names.
        let granted = match (
            decided,
            &outcome,
            seq.parse::<u32>().map(SuspensionSeq::new),
        ) {
            (pages::DecidedAs::ApprovedWithGrant, Ok(_), Ok(Ok(seq))) => Some(
                crate::grants::give(&state, run_id, seq, &web.caller.user, DEFAULT_GRANT_HOURS)
                    .await,
            ),
            _ => None,
        };
        let access = Access::of(state.coordinator.users.as_ref(), &web.caller).await?;
        let queue = neighbours(&state, &access, run_id).await?;
        Ok((run_id, outcome, decided, queue, granted))
    }
    .await;
    match result {
        Ok((run_id, outcome, decided, queue, granted)) => outcome_page(
            &web,
            run_id,
            &outcome,
            decided,
            queue.next,
            granted.as_ref(),
        ),
        Err(problem) => problem_page(Some(&web), &problem),
    }
}

/// The decision the card's form `fields` make, `decided` as they say, on `run_id` by
/// `approver`, as a queue producer would send it. Numbers and ids travel as form text: they
/// are put back as JSON types, so that gate 1 judges them as it judges a queue producer's (a
/// non-number stays a string, and is refused `invalid_field:suspension_seq`).
fn decision_draft(
    run_id: RunId,
    approver: &str,
    fields: &[(String, String)],
    decided: pages::DecidedAs,
) -> DecisionDraft {
    let seq = field(fields, "suspension_seq").unwrap_or("");
    let draft = DecisionDraft::new(run_id, approver)
        .field("decision_id", json!(field(fields, "decision_id")))
        .field("suspension_seq", number(seq))
        .field("turn_digest", json!(field(fields, "turn_digest")));
    match decided {
        pages::DecidedAs::Edit => {
            // The arguments as written: JSON when they read as JSON, else the text, which
            // gate 1 refuses `invalid_field:edits`.
            let text = field(fields, "arguments").unwrap_or("");
            let arguments = serde_json::from_str::<Value>(text).unwrap_or_else(|_| json!(text));
            draft.field(
                "edits",
                json!([{
                    "index": number(field(fields, "edit_index").unwrap_or("")),
                    "tool": field(fields, "edit_tool"),
                    "arguments": arguments,
                }]),
            )
        }
        pages::DecidedAs::ByCall => draft.field("calls", Value::Array(verdicts(fields))),
        pages::DecidedAs::Turn { approved } => draft.field("approved", json!(approved)).field(
            "comment",
            json!(field(fields, "comment").filter(|c| !c.trim().is_empty())),
        ),
        pages::DecidedAs::ApprovedWithGrant => draft.field("approved", json!(true)),
    }
}

/// The page that answers a decision on `run_id`: its `outcome` (with `Retry-After` when a
/// refusal says when to try again), the `next` card waiting, and the grant it `granted`.
fn outcome_page(
    web: &WebCaller,
    run_id: RunId,
    outcome: &Result<DecisionAccepted, Problem>,
    decided: pages::DecidedAs,
    next: Option<RunId>,
    granted: Option<&Result<Vec<GivenGrant>, Problem>>,
) -> Response {
    let status = match outcome {
        Ok(_) => StatusCode::OK,
        Err(problem) => problem.status(),
    };
    let markup = pages::outcome(
        viewer(web),
        &run_id.to_string(),
        outcome,
        decided,
        next,
        granted,
    );
    let mut response = page(status, Some(web), markup);
    if let Err(problem) = outcome {
        if let Some(secs) = problem.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
    }
    response
}

/// Which of the card's forms was sent: the whole turn (its button says approve or deny), the
/// decision call by call, or an edit of one call.
fn decided_as(fields: &[(String, String)]) -> Result<pages::DecidedAs, Problem> {
    if field(fields, "edit_index").is_some() {
        return Ok(pages::DecidedAs::Edit);
    }
    if field(fields, "by_call") == Some("true") {
        return Ok(pages::DecidedAs::ByCall);
    }
    match field(fields, "approved") {
        Some("true") => Ok(pages::DecidedAs::Turn { approved: true }),
        Some("false") => Ok(pages::DecidedAs::Turn { approved: false }),
        Some("grant") => Ok(pages::DecidedAs::ApprovedWithGrant),
        _ => Err(Problem::malformed("invalid_field:approved")),
    }
}

/// The verdicts of the form call by call: `call-N` is `approve` or `deny`, `message-N` what the
/// agent is told of a denial. Whatever else a `call-N` holds goes to gate 1 as it is.
fn verdicts(fields: &[(String, String)]) -> Vec<Value> {
    fields
        .iter()
        .filter_map(|(name, verdict)| {
            let index = name.strip_prefix("call-")?;
            let approved = match verdict.as_str() {
                "approve" => json!(true),
                "deny" => json!(false),
                other => json!(other),
            };
            let message =
                field(fields, &format!("message-{index}")).filter(|m| !m.trim().is_empty());
            Some(json!({"index": number(index), "approved": approved, "message": message}))
        })
        .collect()
}

/// A number sent as form text, as JSON: a number when it reads as one, else the text.
fn number(text: &str) -> Value {
    text.parse::<u64>()
        .map_or_else(|_| json!(text), |n| json!(n))
}

/// The waiting cards just before and after `run_id` in the viewer's inbox (its first page),
/// for the keys that move through the queue; when `run_id` is not waiting there, the next is
/// the first waiting card.
async fn neighbours(
    state: &AppState,
    access: &Access,
    run_id: RunId,
) -> Result<pages::Queue, Problem> {
    let any = countersign_store::Waiting::Any;
    let waiting = inbox_page(&state.coordinator.store, access, None, any, PAGE, None).await?;
    let ids: Vec<RunId> = waiting.runs.iter().map(|r| r.run_id).collect();
    Ok(match ids.iter().position(|id| *id == run_id) {
        Some(at) => pages::Queue {
            prev: at.checked_sub(1).map(|i| ids[i]),
            next: ids.get(at + 1).copied(),
        },
        None => pages::Queue {
            prev: None,
            next: ids.first().copied(),
        },
    })
}

/// An unknown path under `/inbox`.
pub async fn not_found() -> Response {
    problem_page(None, &Problem::new(ProblemCode::NotFound))
}
