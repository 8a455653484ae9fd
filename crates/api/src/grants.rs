//! `POST /v1/runs/{run_id}/grants`: a standing grant from a card — "approve the same tool on
//! the same subject by this agent for N hours" — given by the caller, who must be someone who
//! may approve the agent's runs ([`Coordinator::grant_from_card`]). Sent with (or after) the
//! caller's approval of that card; the inbox's "Approve, and approve the same for 8 hours"
//! sends both.
//!
//! [`Coordinator::grant_from_card`]: countersign_coordinator::Coordinator::grant_from_card

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use countersign_coordinator::grants::{GivenGrant, GrantError, DEFAULT_GRANT_HOURS};
use countersign_core::{RunId, SuspensionSeq};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::{Caller, CALLER_PROBLEMS};
use crate::limits::BODY_PROBLEMS;
use crate::problem::{route_problems, unavailable, Problem, ProblemCode, EVERY_REQUEST};
use crate::v1::{json_object, parse_run_id, JSON_OBJECT_PROBLEMS, RUN_PATH_PROBLEMS};
use crate::AppState;

/// A standing grant asked for: from which card, for how long.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantBody {
    /// The card's suspension number.
    #[schema(minimum = 1, example = 1)]
    pub suspension_seq: u32,
    /// How long the grant lasts, in hours (1 to 720).
    #[serde(default = "eight_hours")]
    #[schema(minimum = 1, maximum = 720, default = 8)]
    pub hours: i32,
}

fn eight_hours() -> i32 {
    DEFAULT_GRANT_HOURS
}

/// One grant given: a generated policy approving the agent's calls of one tool on the same
/// subjects until it expires or is revoked (`countersign policies revoke ID`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Grant {
    pub id: Uuid,
    /// The generated policy: its decisions are made by `policy:<policy>@1`.
    #[schema(example = "grant-01a24b6aebba")]
    pub policy: String,
    pub agent: String,
    pub tool: String,
    /// The subjects it covers, as the policies see them (`uid:12`).
    pub subjects: Vec<String>,
    pub hours: i32,
}

impl From<GivenGrant> for Grant {
    fn from(g: GivenGrant) -> Grant {
        Grant {
            id: g.id,
            policy: g.policy,
            agent: g.agent,
            tool: g.tool,
            subjects: g.subjects,
            hours: g.hours,
        }
    }
}

const GRANT_PROBLEMS: [ProblemCode; 3] = [
    ProblemCode::Malformed,
    ProblemCode::GrantRefused,
    ProblemCode::Unavailable,
];

route_problems!(
    /// The problems of `POST /v1/runs/{run_id}/grants`.
    GrantProblems = [
        EVERY_REQUEST,
        CALLER_PROBLEMS,
        RUN_PATH_PROBLEMS,
        JSON_OBJECT_PROBLEMS,
        BODY_PROBLEMS,
        GRANT_PROBLEMS
    ]
);

/// Gives the caller's standing grants from a card: one per write call, each approving the same
/// tool on the same subjects by the run's agent for `hours`. Refused `grant_refused` (its
/// `reason` says why: `grant_removes`, `grant_data_class`, `grant_no_subject`,
/// `grant_no_writes`, `grant_no_facts`) with nothing granted; `not_found` unless the caller may
/// approve the agent's runs.
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/grants",
    operation_id = "grant_from_card",
    tag = "inbox",
    params(("run_id" = Uuid, Path, description = "The run.")),
    request_body = GrantBody,
    responses(
        (status = 201, description = "The grants given.", body = Vec<Grant>),
        GrantProblems,
    ),
    security(("bearer" = []))
)]
pub async fn grant(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<Vec<Grant>>), Problem> {
    let run_id = parse_run_id(&run_id)?;
    let body = json_object(&state, &headers, body).await?;
    let body: GrantBody = serde_json::from_value(serde_json::Value::Object(body))
        .map_err(|_| Problem::malformed("invalid_body"))?;
    let seq = SuspensionSeq::new(body.suspension_seq)
        .map_err(|_| Problem::malformed("invalid_field:suspension_seq"))?;
    let given = give(&state, run_id, seq, &caller.user, body.hours).await?;
    Ok((
        StatusCode::CREATED,
        Json(given.into_iter().map(Grant::from).collect()),
    ))
}

/// [`Coordinator::grant_from_card`] with its refusals as problems. Shared by the API and the
/// inbox.
///
/// [`Coordinator::grant_from_card`]: countersign_coordinator::Coordinator::grant_from_card
pub(crate) async fn give(
    state: &AppState,
    run_id: RunId,
    seq: SuspensionSeq,
    approver: &str,
    hours: i32,
) -> Result<Vec<GivenGrant>, Problem> {
    match state
        .coordinator
        .grant_from_card(run_id, seq, approver, hours)
        .await
    {
        Ok(given) => Ok(given),
        Err(GrantError::NotFound) => Err(Problem::new(ProblemCode::NotFound)),
        Err(GrantError::Hours) => Err(Problem::malformed("invalid_field:hours")),
        Err(GrantError::Coordinator(e)) => Err(unavailable("grants", e.code(), &e)),
        Err(e) => Err(Problem {
            reason: Some(e.code().to_owned()),
            ..Problem::new(ProblemCode::GrantRefused)
        }),
    }
}
