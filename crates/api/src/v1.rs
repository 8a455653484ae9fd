//! `/v1`: run requests, runs, the inbox, cards and decisions, over JSON.
//!
//! Each write goes through the coordinator's own gates with the caller's producer identity:
//! the handler assembles the public message a queue producer would send (version 1, the
//! caller as approver, the run of the path) and hands its bytes to
//! [`Coordinator::take_run_request`] / [`Coordinator::take_decision`]. Schema validation is
//! therefore gate 1 itself, with its reasons (`missing_field:turn_digest`), and no rule can
//! hold for the queues but not here. The types below are the OpenAPI document's schemas
//! ([`crate::openapi`], which also serves it); the document is generated from them.
//!
//! [`Coordinator::take_run_request`]: countersign_coordinator::Coordinator::take_run_request
//! [`Coordinator::take_decision`]: countersign_coordinator::Coordinator::take_decision

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use countersign_coordinator::{DecisionCode, RequestOutcome};
use countersign_core::card::{ApprovalCard, CardPreview};
use countersign_core::{DecisionMessage, MessageError, RunId, RunRequest, MESSAGE_VERSION};
use countersign_store::{RunRecord, RunStatus, WaitingRun};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::auth::{Caller, CALLER_PROBLEMS};
use crate::cards::{card_for, CARD_PROBLEMS};
use crate::drafts::DecisionDraft;
use crate::limits::{read_body, BODY_PROBLEMS};
use crate::problem::{route_problems, unavailable, Problem, ProblemCode, EVERY_REQUEST};
use crate::queries::{
    decode_cursor, encode_cursor, inbox_page, visible_run, Access, VISIBLE_RUN_PROBLEMS,
};
use crate::{effects, AppState};

/// The header a client may send instead of an id in the body.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

// ---------------------------------------------------------------------------------------------
// Schemas
// ---------------------------------------------------------------------------------------------

/// A run request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct NewRun {
    /// Chosen by the caller, and the caller's own: a duplicate with the same body creates
    /// nothing and answers with the run created for it; the same id with another body is
    /// `idempotency_conflict`. Instead of it, an `Idempotency-Key` header may be sent (not
    /// both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<Uuid>,
    /// An agent configuration name: 1 to 200 characters, no control characters, no leading or
    /// trailing whitespace (gate 1's rule for a name, as the queues' JSON Schemas write it).
    #[schema(
        example = "seo-assistant",
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\s\u0000-\u001F\u007F-\u009F](?:[^\u0000-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F])?$"
    )]
    pub agent: String,
    /// The user the run acts as; the caller's own user when left out. Asserting another user
    /// takes a producer grant (`countersign producers allow http:<caller> acting-user <user>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        example = "editor",
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\s\u0000-\u001F\u007F-\u009F](?:[^\u0000-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F])?$"
    )]
    pub acting_user: Option<String>,
    /// At most 32 KiB of text, not blank; sealed at rest, never published.
    #[schema(
        example = "Tighten the description of page 12.",
        min_length = 1,
        max_length = 32768,
        pattern = r"\S"
    )]
    pub prompt: String,
    /// Optional structured inputs (a JSON object of at most 64 KiB), sealed at rest like the
    /// prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub inputs: Option<Map<String, Value>>,
}

/// The run a request created (202) or had created before (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RunAccepted {
    pub run_id: Uuid,
    pub request_id: Uuid,
    /// `false` when the request was a duplicate: nothing was created now.
    pub created: bool,
}

/// A run's status, as the lifecycle names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Queued,
    Running,
    WaitingForApproval,
    Completed,
    Failed,
    Cancelled,
}

impl From<RunStatus> for Status {
    fn from(s: RunStatus) -> Status {
        match s {
            RunStatus::Queued => Status::Queued,
            RunStatus::Running => Status::Running,
            RunStatus::WaitingForApproval => Status::WaitingForApproval,
            RunStatus::Completed => Status::Completed,
            RunStatus::Failed => Status::Failed,
            RunStatus::Cancelled => Status::Cancelled,
        }
    }
}

/// A run: its row without content, and its audit trail (codes only).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RunView {
    pub run_id: Uuid,
    pub request_id: Uuid,
    pub agent: String,
    pub acting_user: String,
    pub status: Status,
    /// `start` or `resume`.
    pub segment: &'static str,
    /// Set once the run ended, e.g. `completed`, `approval_expired`.
    pub termination_reason: Option<&'static str>,
    /// A stable error code, never a message.
    pub error_code: Option<String>,
    /// A write the run sent outside the store whose result is not journaled: in flight while the
    /// run runs, in doubt for good when it ended `outcome_unknown` — it may have landed.
    pub call_in_doubt: Option<CallInDoubt>,
    /// The current card's suspension number, once the run suspended.
    pub suspension_seq: Option<u32>,
    /// The current card's turn digest (64 lowercase hex).
    pub turn_digest: Option<String>,
    /// The tools of the pending calls.
    pub pending_tools: Vec<String>,
    pub approval_deadline: Option<DateTime<Utc>>,
    pub iterations: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub events: Vec<RunEventView>,
}

/// A call of a turn that was sent outside the store and never journaled.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CallInDoubt {
    /// The card the call was approved on.
    pub suspension_seq: u32,
    /// Its index among the card's calls, from 0.
    pub call_index: u32,
    /// Its tool, when the card is still the run's current one.
    pub tool: Option<String>,
}

/// One event of a run's audit trail. Its payload carries ids, codes and counts, never content.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RunEventView {
    pub sequence: i64,
    #[schema(example = "run.suspended")]
    pub kind: String,
    pub at: DateTime<Utc>,
    #[schema(value_type = Object)]
    pub payload: Value,
}

/// Query of `GET /v1/inbox`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InboxQuery {
    /// Runs per page, 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// `me`: the cards waiting on the caller — one approver's cards, and the cards of a quorum
    /// of one of the caller's groups (their own, a delegator's now, or a backup group the card
    /// was escalated to) that the caller has not voted on; `groups`: the quorum cards waiting on
    /// one of the caller's groups, voted on or not; `any` (the default): every card the caller
    /// may decide on.
    pub waiting: Option<WaitingFilter>,
}

/// Which waiting cards `GET /v1/inbox` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitingFilter {
    Any,
    Me,
    Groups,
}

impl From<WaitingFilter> for countersign_store::Waiting {
    fn from(w: WaitingFilter) -> Self {
        match w {
            WaitingFilter::Any => countersign_store::Waiting::Any,
            WaitingFilter::Me => countersign_store::Waiting::OnMe,
            WaitingFilter::Groups => countersign_store::Waiting::OnMyGroups,
        }
    }
}

/// One page of the runs waiting for a decision that the caller may see, soonest deadline
/// first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct InboxPage {
    pub runs: Vec<InboxRun>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A waiting run, without content: its card is at `card`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct InboxRun {
    pub run_id: Uuid,
    pub agent: String,
    pub acting_user: String,
    pub suspension_seq: u32,
    pub turn_digest: String,
    pub pending_tools: Vec<String>,
    pub approval_deadline: DateTime<Utc>,
    /// When the run paused on its current card.
    pub waiting_since: DateTime<Utc>,
    /// The path of its card.
    #[schema(example = "/v1/runs/0193c1f2-0000-7000-8000-000000000000/card")]
    pub card: String,
}

impl From<WaitingRun> for InboxRun {
    fn from(e: WaitingRun) -> InboxRun {
        InboxRun {
            card: format!("/v1/runs/{}/card", e.run_id),
            run_id: e.run_id.as_uuid(),
            agent: e.agent,
            acting_user: e.acting_user,
            suspension_seq: e.suspension_seq.get(),
            turn_digest: e.turn_digest.as_str().to_owned(),
            pending_tools: e.pending_tools,
            approval_deadline: e.approval_deadline,
            waiting_since: e.waiting_since,
        }
    }
}

/// The approval card of a waiting run as the caller may see it. A decision on it names its
/// `suspension_seq` and `turn_digest`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Card {
    pub run_id: Uuid,
    pub agent: String,
    pub acting_user: String,
    /// The user the card was built for: previews this user may not read are withheld.
    pub viewer: String,
    pub suspension_seq: u32,
    /// All 64 hex characters.
    pub turn_digest: String,
    /// When the run paused (the previews are a snapshot of that moment).
    pub captured_at: String,
    #[schema(example = "Captured when the run paused — the target may have changed since.")]
    pub caption: &'static str,
    /// Present when the previous card's approval found a preview moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_notice: Option<&'static str>,
    pub calls: Vec<CardCall>,
    pub approval_deadline: Option<DateTime<Utc>>,
    /// Where the card stands when its agent wants approvers as a team.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quorum: Option<Quorum>,
}

/// The votes a card has and still needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Quorum {
    #[schema(example = "1 of 2 approvals — alice; waiting for one of marketing")]
    pub summary: String,
    /// Who approved this card, in the order of their votes.
    pub approvers: Vec<String>,
    /// How many approvals the card needs in all.
    pub needed: u32,
}

impl Quorum {
    pub fn of(standing: countersign_core::quorum::Standing) -> Quorum {
        Quorum {
            summary: standing.summary(),
            needed: standing.needed,
            approvers: standing.approvers,
        }
    }
}

/// One pending call of the turn.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CardCall {
    pub index: u32,
    pub tool: String,
    #[schema(value_type = Object)]
    pub arguments: Value,
    /// This call's preview changed since the previous card.
    pub moved: bool,
    /// This call was carried out under an earlier card of the same turn: deciding this card
    /// does not run it again, and a denial does not undo it.
    pub landed: bool,
    /// Its preview was computed as if it ran alone: it comes after other calls of the turn on
    /// the same tool server, which cannot preview a call after the ones before it.
    pub alone: bool,
    /// The last card's decision denied this call on its own: the other calls were previewed
    /// without it.
    pub excluded: bool,
    /// A person changed this call's arguments; the card was issued anew with them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited: Option<Edited>,
    pub preview: Preview,
}

/// Who changed a call's arguments, and what they were before.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Edited {
    pub editor: String,
    #[schema(value_type = Object)]
    pub arguments_before: Value,
}

/// What the card shows of a call's preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Preview {
    /// What the call would do and what it would replace: the bounded lines a card shows, and
    /// the whole preview when the bounds cut them (what the approval binds to).
    Shown {
        lines: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        full_lines: Vec<String>,
    },
    /// The preview failed: the approver decides without one. `lines` names only the error's
    /// class.
    Failed {
        notice: &'static str,
        lines: Vec<String>,
    },
    /// The viewer may not read the record this call would change.
    Withheld { notice: &'static str },
    /// The tool has no preview; the arguments are all there is.
    None,
}

impl Card {
    fn of(run: &RunRecord, viewer: &str, card: ApprovalCard) -> Card {
        Card {
            run_id: run.id.as_uuid(),
            agent: run.agent.clone(),
            acting_user: run.acting_user.clone(),
            viewer: viewer.to_owned(),
            suspension_seq: card.suspension_seq.get(),
            turn_digest: card.turn_digest.as_str().to_owned(),
            captured_at: card.captured_at,
            caption: card.caption,
            moved_notice: card.moved_notice,
            approval_deadline: run.approval_deadline,
            quorum: None,
            calls: card
                .calls
                .into_iter()
                .map(|c| CardCall {
                    index: u32::try_from(c.index.get()).unwrap_or(u32::MAX),
                    tool: c.tool,
                    arguments: c.arguments,
                    moved: c.moved,
                    landed: c.landed,
                    alone: c.alone,
                    excluded: c.excluded,
                    edited: c.edit.map(|e| Edited {
                        editor: e.editor,
                        arguments_before: e.before,
                    }),
                    preview: match c.preview {
                        CardPreview::Shown { lines, full, .. } => Preview::Shown {
                            lines,
                            full_lines: full,
                        },
                        CardPreview::Failed { notice, lines } => Preview::Failed { notice, lines },
                        CardPreview::Withheld { notice } => Preview::Withheld { notice },
                        CardPreview::None => Preview::None,
                    },
                })
                .collect(),
        }
    }
}

/// A decision on the card the caller was shown. The approver is the caller.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(as = NewDecision)]
pub struct DecisionBody {
    /// Chosen by the caller and bound to the run, card and body it first comes with: the same
    /// decision again returns the recorded outcome; the id with another run, card or body is
    /// `idempotency_conflict`. Instead of it, an `Idempotency-Key` header may be sent (not
    /// both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_id: Option<Uuid>,
    /// The `suspension_seq` of the card decided on.
    #[schema(minimum = 1, maximum = 4294967295_u64, example = 1)]
    pub suspension_seq: u32,
    /// The `turn_digest` of the card decided on: 64 lowercase hex characters.
    #[schema(
        example = "9f2c0e5a7b1d3c4e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6",
        pattern = "^[0-9a-f]{64}$"
    )]
    pub turn_digest: String,
    /// `true` approves the turn, `false` denies it. May be left out with `calls` (it is then
    /// whether some call is approved) or `edits` (an edit approves nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
    /// Optional, at most 4096 characters; shown to the model on a denial, sealed at rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096)]
    pub comment: Option<String>,
    /// The turn decided call by call: every call of the card, each once. The approved calls
    /// run as a sequence of their own, previewed without the denied ones; if any then reads
    /// otherwise than on the card, nothing is written and the card comes back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 256)]
    pub calls: Vec<CallDecision>,
    /// New arguments for calls of the card. Nothing runs: the card is issued anew with them,
    /// marked as the caller's edit, and decided like any card.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 256)]
    pub edits: Vec<CallEdit>,
}

/// The verdict on one call of the card.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct CallDecision {
    /// The call's `index` on the card.
    pub index: u32,
    pub approved: bool,
    /// With a denial: what the model is told of it. At most 4096 characters, sealed at rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096)]
    pub message: Option<String>,
}

/// New arguments for one call of the card.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct CallEdit {
    /// The call's `index` on the card.
    pub index: u32,
    /// The call's tool, if the caller names it: an edit that names another tool is refused
    /// `edit_changes_tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The new arguments: checked against the tool's schema (`edit_invalid_arguments`), run
    /// with the run's acting user's rights.
    #[schema(value_type = Object)]
    pub arguments: Map<String, Value>,
}

/// A decision that released its turn (an approval or a denial), or, for an agent whose cards
/// need several approvers, one recorded as a vote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct DecisionAccepted {
    /// `accepted` (the turn is released), or `approval_recorded` / `denial_recorded` (a vote:
    /// the card waits for the rest of its approvers).
    #[schema(example = "accepted")]
    pub outcome: &'static str,
    pub decision_id: Uuid,
    pub run_id: Uuid,
    /// `true` when this decision id was accepted before: nothing happened now.
    pub replayed: bool,
}

// ---------------------------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------------------------

/// A JSON object body sent as `application/json`, read up to the configured size.
pub(crate) async fn json_object(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Map<String, Value>, Problem> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .is_some_and(|v| v == "application/json" || v.ends_with("+json"));
    if !json {
        return Err(Problem::new(ProblemCode::UnsupportedMediaType));
    }
    let bytes = read_body(body, state.config.max_body_bytes).await?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Problem::new(ProblemCode::NotAJsonObject)),
    }
}

/// The id a request is deduplicated by: the body's, the `Idempotency-Key`'s, or a fresh one.
///
/// A key is scoped to the producer and the kind of request: the same key from two producers,
/// or for a run and a decision, names two different things. It becomes a UUID (version 8) from
/// the SHA-256 of the three, so a retry with the same key lands on the same recorded request.
fn request_key(
    headers: &HeaderMap,
    in_body: Option<Uuid>,
    producer: &str,
    kind: &str,
) -> Result<Uuid, Problem> {
    let Some(key) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(in_body.unwrap_or_else(Uuid::now_v7));
    };
    if in_body.is_some() {
        return Err(Problem::new(ProblemCode::ConflictingIdempotency));
    }
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| Problem::malformed("invalid_header:idempotency-key"))?;
    let mut h = Sha256::new();
    for part in ["countersign-idempotency", producer, kind, key] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Ok(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

/// The refusal of gate 1 for a body that did not fit the typed schema: the same reason a queue
/// producer's message would be dead-lettered with.
fn gate_one_reason<M>(parsed: Result<M, MessageError>) -> Problem {
    Problem::malformed(
        parsed
            .err()
            .map_or_else(|| "invalid_body".to_owned(), |e| e.reason()),
    )
}

/// The body's known `fields`, for gate 1 to judge.
fn copied(body: &Value, fields: &[&str]) -> Map<String, Value> {
    fields
        .iter()
        .filter_map(|f| Some(((*f).to_owned(), body.get(*f)?.clone())))
        .collect()
}

/// `fields` as a message of type `kind`, in `version`.
fn typed_message(mut fields: Map<String, Value>, kind: &str, version: u64) -> Value {
    fields.insert("type".into(), json!(kind));
    fields.insert("version".into(), json!(version));
    Value::Object(fields)
}

// ---------------------------------------------------------------------------------------------
// What each route can answer besides its success
// ---------------------------------------------------------------------------------------------

/// [`json_object`]'s problems, besides [`BODY_PROBLEMS`].
pub(crate) const JSON_OBJECT_PROBLEMS: [ProblemCode; 2] = [
    ProblemCode::UnsupportedMediaType,
    ProblemCode::NotAJsonObject,
];
/// [`request_key`]'s problems.
const REQUEST_KEY_PROBLEMS: [ProblemCode; 2] =
    [ProblemCode::ConflictingIdempotency, ProblemCode::Malformed];
/// [`parse_run_id`]'s problem: a path naming no run names nothing.
pub(crate) const RUN_PATH_PROBLEMS: [ProblemCode; 1] = [ProblemCode::NotFound];
/// The inbox query's problem, besides those of the page it reads.
const INBOX_QUERY_PROBLEMS: [ProblemCode; 2] =
    [ProblemCode::InvalidQuery, ProblemCode::Unavailable];
/// A store read of a handler of its own (a run's events).
const STORE_PROBLEMS: [ProblemCode; 1] = [ProblemCode::Unavailable];

route_problems!(
    /// The problems of `POST /v1/runs`.
    CreateRunProblems = [
        EVERY_REQUEST,
        CALLER_PROBLEMS,
        JSON_OBJECT_PROBLEMS,
        BODY_PROBLEMS,
        REQUEST_KEY_PROBLEMS,
        ProblemCode::of_request_gates(),
        STORE_PROBLEMS,
    ]
);
route_problems!(
    /// The problems of `GET /v1/runs/{run_id}`.
    GetRunProblems = [
        EVERY_REQUEST,
        CALLER_PROBLEMS,
        RUN_PATH_PROBLEMS,
        VISIBLE_RUN_PROBLEMS,
        STORE_PROBLEMS,
    ]
);
route_problems!(
    /// The problems of `GET /v1/inbox`.
    InboxProblems = [EVERY_REQUEST, CALLER_PROBLEMS, INBOX_QUERY_PROBLEMS]
);
route_problems!(
    /// The problems of `GET /v1/runs/{run_id}/card`.
    CardProblems = [
        EVERY_REQUEST,
        CALLER_PROBLEMS,
        RUN_PATH_PROBLEMS,
        VISIBLE_RUN_PROBLEMS,
        CARD_PROBLEMS,
    ]
);
route_problems!(
    /// The problems of `POST /v1/runs/{run_id}/decisions`.
    DecideProblems = [
        EVERY_REQUEST,
        CALLER_PROBLEMS,
        RUN_PATH_PROBLEMS,
        JSON_OBJECT_PROBLEMS,
        BODY_PROBLEMS,
        REQUEST_KEY_PROBLEMS,
        ProblemCode::of_decision_gates(),
        STORE_PROBLEMS,
    ]
);

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

/// Requests a run, through the run-request gates with the caller's producer identity.
#[utoipa::path(
    post,
    path = "/v1/runs",
    tag = "runs",
    request_body = NewRun,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Instead of `request_id`: a retry with the same key and body creates nothing; with another body it is `idempotency_conflict`.")),
    responses(
        (status = 202, description = "The run was created and dispatched.", body = RunAccepted),
        (status = 200, description = "A duplicate: the run created for this request before.", body = RunAccepted),
        CreateRunProblems,
    ),
    security(("bearer" = []))
)]
pub async fn create_run(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let body = json_object(&state, &headers, body).await?;
    let typed = serde_json::from_value::<NewRun>(Value::Object(body.clone()));
    let request_id = request_key(
        &headers,
        typed.as_ref().ok().and_then(|r| r.request_id),
        &caller.producer,
        "run",
    )?;
    // The run request a queue producer would send: the body's fields, the caller's own user
    // when it names none, the id the request is deduplicated by.
    let message = match typed {
        Ok(new) => RunRequest::from_json(
            RunRequest {
                request_id,
                agent: new.agent,
                acting_user: new.acting_user.unwrap_or_else(|| caller.user.clone()),
                prompt: new.prompt,
                inputs: new.inputs,
            }
            .to_json(),
        ),
        Err(_) => return Err(untyped_run_request(body, request_id, &caller.user)),
    };
    let verdict = state
        .coordinator
        .take_run_request_message(message, Some(&caller.producer))
        .await
        .map_err(|e| unavailable("run request gates", e.code(), &e))?;
    effects::after_run_request(&verdict);
    match (&verdict.outcome, verdict.run_id) {
        (RequestOutcome::Accepted, Some(run_id)) => {
            Ok(run_accepted(run_id, request_id, verdict.created))
        }
        (RequestOutcome::Malformed, _) => Err(Problem::malformed(
            verdict.dead_letter_reason().unwrap_or_default(),
        )),
        (outcome, _) => Err(Problem::new(
            ProblemCode::of_request(outcome).unwrap_or(ProblemCode::Unavailable),
        )),
    }
}

/// Gate 1's refusal of a body that is not a [`NewRun`]: the run request its known fields make,
/// with the id it is deduplicated by and the caller's own user when it names none.
fn untyped_run_request(body: Map<String, Value>, request_id: Uuid, user: &str) -> Problem {
    let known = ["request_id", "agent", "acting_user", "prompt", "inputs"];
    let mut fields = copied(&Value::Object(body), &known);
    fields.entry("request_id").or_insert(json!(request_id));
    fields.entry("acting_user").or_insert(json!(user));
    let message = RunRequest::from_json(typed_message(fields, RunRequest::TYPE, MESSAGE_VERSION));
    gate_one_reason(message)
}

/// The answer to an accepted run request: `202` for a run it created, `200` for the one a
/// duplicate created before, with the run's `Location`.
fn run_accepted(run_id: RunId, request_id: Uuid, created: bool) -> Response {
    let status = if created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let mut response = (
        status,
        Json(RunAccepted {
            run_id: run_id.as_uuid(),
            request_id,
            created,
        }),
    )
        .into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/runs/{run_id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// A run's status and audit trail: codes only, never content.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}",
    tag = "runs",
    params(("run_id" = Uuid, Path, description = "The run.")),
    responses(
        (status = 200, body = RunView),
        GetRunProblems,
    ),
    security(("bearer" = []))
)]
pub async fn get_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<RunView>, Problem> {
    let run_id = parse_run_id(&run_id)?;
    let (run, _) = visible_run(&state, &caller, run_id).await?;
    let events = state
        .coordinator
        .store
        .events(run_id)
        .await
        .map_err(|e| unavailable("events", e.code(), &e))?;
    Ok(Json(RunView {
        run_id: run.id.as_uuid(),
        request_id: run.request_id,
        agent: run.agent,
        acting_user: run.acting_user,
        status: run.status.into(),
        segment: run.segment.as_str(),
        termination_reason: run.termination_reason.map(|t| t.as_str()),
        error_code: run.error_code,
        call_in_doubt: run.sent_call.map(|sent| CallInDoubt {
            suspension_seq: sent.suspension_seq.get(),
            call_index: u32::try_from(sent.index.get()).unwrap_or(u32::MAX),
            tool: (run.suspension_seq == Some(sent.suspension_seq))
                .then(|| run.pending_tools.get(sent.index.get()).cloned())
                .flatten(),
        }),
        suspension_seq: run.suspension_seq.map(|s| s.get()),
        turn_digest: run.turn_digest.map(|d| d.as_str().to_owned()),
        pending_tools: run.pending_tools,
        approval_deadline: run.approval_deadline,
        iterations: run.counters.iterations,
        created_at: run.created_at,
        updated_at: run.updated_at,
        events: events
            .into_iter()
            .map(|e| RunEventView {
                sequence: e.sequence,
                kind: e.kind,
                at: e.created_at,
                payload: e.payload,
            })
            .collect(),
    }))
}

/// The runs waiting for a decision that the caller may decide on, paged.
#[utoipa::path(
    get,
    path = "/v1/inbox",
    tag = "inbox",
    params(InboxQuery),
    responses(
        (status = 200, body = InboxPage),
        InboxProblems,
    ),
    security(("bearer" = []))
)]
pub async fn inbox(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<InboxQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<InboxPage>, Problem> {
    let Query(query) = query.map_err(|_| Problem::new(ProblemCode::InvalidQuery))?;
    let cursor = match query.cursor.as_deref() {
        None => None,
        Some(c) => Some(decode_cursor(c).ok_or(Problem::new(ProblemCode::InvalidQuery))?),
    };
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(Problem::new(ProblemCode::InvalidQuery));
    }
    let access = Access::of(state.coordinator.users.as_ref(), &caller).await?;
    let waiting = query.waiting.unwrap_or(WaitingFilter::Any).into();
    let page = inbox_page(
        &state.coordinator.store,
        &access,
        None,
        waiting,
        limit,
        cursor,
    )
    .await?;
    Ok(Json(InboxPage {
        runs: page.runs.into_iter().map(InboxRun::from).collect(),
        next_cursor: page.next.as_ref().map(encode_cursor),
    }))
}

/// The approval card of a waiting run, as the caller may see it.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}/card",
    tag = "inbox",
    params(("run_id" = Uuid, Path, description = "The run.")),
    responses(
        (status = 200, body = Card),
        CardProblems,
    ),
    security(("bearer" = []))
)]
pub async fn card(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<Card>, Problem> {
    let run_id = parse_run_id(&run_id)?;
    let (run, access) = visible_run(&state, &caller, run_id).await?;
    let card = card_for(&state, &run, &access).await?;
    let standing = state
        .coordinator
        .store
        .card_standing(run_id)
        .await
        .map_err(|e| unavailable("quorum", e.code(), &e))?;
    Ok(Json(Card {
        quorum: standing.map(Quorum::of),
        ..Card::of(&run, &caller.user, card)
    }))
}

/// Approves or denies the turn of the card the caller was shown, through the decision gates
/// with the caller's producer identity and the caller as approver.
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/decisions",
    tag = "inbox",
    params(
        ("run_id" = Uuid, Path, description = "The run."),
        ("Idempotency-Key" = Option<String>, Header,
            description = "Instead of `decision_id`: a retry with the same key, run, card and body replays the recorded outcome; with another one it is `idempotency_conflict`."),
    ),
    request_body = DecisionBody,
    responses(
        (status = 202, description = "`accepted`: the turn is released (an approval or a denial).", body = DecisionAccepted),
        DecideProblems,
    ),
    security(("bearer" = []))
)]
pub async fn decide(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let run_id = parse_run_id(&run_id)?;
    let body = json_object(&state, &headers, body).await?;
    let typed = serde_json::from_value::<DecisionBody>(Value::Object(body.clone()));
    let decision_id = request_key(
        &headers,
        typed.as_ref().ok().and_then(|d| d.decision_id),
        &caller.producer,
        "decision",
    )?;
    // The decision a queue producer would send: the card the caller decided on, the run of the
    // path, the caller as approver.
    let known = [
        "decision_id",
        "suspension_seq",
        "turn_digest",
        "approved",
        "comment",
        "calls",
        "edits",
    ];
    let sent = match &typed {
        Ok(d) => json!({
            "decision_id": decision_id,
            "suspension_seq": d.suspension_seq,
            "turn_digest": d.turn_digest,
            "approved": d.approved,
            "comment": d.comment,
            "calls": (!d.calls.is_empty()).then_some(&d.calls),
            "edits": (!d.edits.is_empty()).then_some(&d.edits),
        }),
        Err(_) => Value::Object(body),
    };
    let message = known
        .iter()
        .fold(DecisionDraft::new(run_id, &caller.user), |draft, f| {
            draft.field(f, sent.get(*f).cloned().unwrap_or(Value::Null))
        })
        .decision_id_or(decision_id.to_string())
        .message();
    if typed.is_err() {
        return Err(gate_one_reason(message).with_run(run_id.as_uuid()));
    }
    let outcome = take_decision(&state, &caller, message).await?;
    Ok(match outcome {
        Ok(accepted) => (StatusCode::ACCEPTED, Json(accepted)).into_response(),
        Err(problem) => problem.into_response(),
    })
}

/// Runs a decision message through the gates and carries out the verdict: `Ok(Ok)` when the
/// turn was released, `Ok(Err(problem))` for a refusal. Shared by the API and the inbox.
pub(crate) async fn take_decision(
    state: &AppState,
    caller: &Caller,
    message: Result<DecisionMessage, MessageError>,
) -> Result<Result<DecisionAccepted, Problem>, Problem> {
    let verdict = state
        .coordinator
        .take_decision_message(message, Some(&caller.producer))
        .await
        .map_err(|e| unavailable("decision gates", e.code(), &e))?;
    effects::after_decision(state, &verdict).await;
    let (Some(decision_id), Some(run_id)) = (verdict.decision_id, verdict.run_id) else {
        return Ok(Err(match (verdict.outcome, verdict.dead_letter_reason()) {
            (DecisionCode::Malformed, Some(reason)) => Problem::malformed(reason),
            _ => Problem::new(ProblemCode::Unavailable),
        }));
    };
    Ok(match ProblemCode::of_decision(&verdict.outcome) {
        None => Ok(DecisionAccepted {
            outcome: verdict.outcome.code(),
            decision_id,
            run_id: run_id.as_uuid(),
            replayed: verdict.replayed,
        }),
        Some(code) => {
            let mut problem = match verdict.dead_letter_reason() {
                Some(reason) => Problem::malformed(reason),
                None => Problem::new(code),
            };
            problem.run_id = Some(run_id.as_uuid());
            problem.decision_id = Some(decision_id);
            problem.replayed = verdict.replayed;
            Err(problem)
        }
    })
}

/// The run a path names: any string that is not a run id (a version-7 UUID) names no run, so
/// it is `not_found` as an unknown run is.
pub(crate) fn parse_run_id(s: &str) -> Result<RunId, Problem> {
    RunId::parse(s).map_err(|_| Problem::new(ProblemCode::NotFound))
}

/// An unknown path under `/v1`.
pub async fn not_found() -> Problem {
    Problem::new(ProblemCode::NotFound)
}

/// A method a `/v1` path does not take.
pub async fn method_not_allowed() -> Problem {
    Problem::new(ProblemCode::MethodNotAllowed)
}
