//! `/v1/groups`: the groups of approvers an agent's quorum names, managed as `countersign
//! groups` manages them — by administrators only, every change audited with the caller's name.
//! To anyone else the paths answer as paths with nothing they may see (`not_found`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::{Caller, CALLER_PROBLEMS};
use crate::problem::{route_problems, unavailable, Problem, ProblemCode, EVERY_REQUEST};
use crate::AppState;

/// A group of approvers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Group {
    #[schema(example = "legal")]
    pub name: String,
    /// Its members' names, sorted.
    pub members: Vec<String>,
}

const ADMIN_PROBLEMS: [ProblemCode; 3] = [
    ProblemCode::Malformed,
    ProblemCode::NotFound,
    ProblemCode::Unavailable,
];

route_problems!(
    /// The problems of `/v1/groups…`.
    GroupsProblems = [EVERY_REQUEST, CALLER_PROBLEMS, ADMIN_PROBLEMS]
);

/// `not_found` unless the caller is an administrator.
async fn admin(state: &AppState, caller: &Caller) -> Result<(), Problem> {
    let principal = state
        .coordinator
        .users
        .principal(&caller.user)
        .await
        .map_err(|e| unavailable("users", e.code(), &e))?;
    match principal {
        Some(p) if p.admin => Ok(()),
        _ => Err(Problem::new(ProblemCode::NotFound)),
    }
}

fn store_failed(e: countersign_store::StoreError) -> Problem {
    unavailable("groups", e.code(), &e)
}

/// Every group with its members.
#[utoipa::path(
    get,
    path = "/v1/groups",
    operation_id = "list_groups",
    tag = "directory",
    responses((status = 200, body = Vec<Group>), GroupsProblems),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<Group>>, Problem> {
    admin(&state, &caller).await?;
    let groups = state
        .coordinator
        .store
        .groups()
        .await
        .map_err(store_failed)?;
    Ok(Json(
        groups
            .into_iter()
            .map(|g| Group {
                name: g.name,
                members: g.members,
            })
            .collect(),
    ))
}

/// Creates the group (creating it again changes nothing). A name is a letter or digit, then up
/// to 127 letters, digits, `_`, `.` and `-`; any other is refused `malformed`
/// (`invalid_path:group`).
#[utoipa::path(
    put,
    path = "/v1/groups/{group}",
    operation_id = "create_group",
    tag = "directory",
    params(("group" = String, Path, description = "The group.")),
    responses((status = 204, description = "The group exists."), GroupsProblems),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Path(group): Path<String>,
) -> Result<StatusCode, Problem> {
    admin(&state, &caller).await?;
    if !countersign_store::is_group_name(&group) {
        return Err(Problem::malformed("invalid_path:group"));
    }
    state
        .coordinator
        .store
        .create_group(&caller.user, &group)
        .await
        .map_err(store_failed)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Adds the user to the group; `not_found` when there is no such group.
#[utoipa::path(
    put,
    path = "/v1/groups/{group}/members/{user}",
    operation_id = "add_group_member",
    tag = "directory",
    params(
        ("group" = String, Path, description = "The group."),
        ("user" = String, Path, description = "The user, by directory name."),
    ),
    responses((status = 204, description = "The user is in the group."), GroupsProblems),
    security(("bearer" = []))
)]
pub async fn add(
    State(state): State<AppState>,
    caller: Caller,
    Path((group, user)): Path<(String, String)>,
) -> Result<StatusCode, Problem> {
    admin(&state, &caller).await?;
    let changed = state
        .coordinator
        .store
        .add_member(&caller.user, &group, &user)
        .await
        .map_err(store_failed)?;
    membership_changed(changed)
}

/// Removes the user from the group; `not_found` when they were not in it.
#[utoipa::path(
    delete,
    path = "/v1/groups/{group}/members/{user}",
    operation_id = "remove_group_member",
    tag = "directory",
    params(
        ("group" = String, Path, description = "The group."),
        ("user" = String, Path, description = "The user, by directory name."),
    ),
    responses((status = 204, description = "The user is not in the group."), GroupsProblems),
    security(("bearer" = []))
)]
pub async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    Path((group, user)): Path<(String, String)>,
) -> Result<StatusCode, Problem> {
    admin(&state, &caller).await?;
    let changed = state
        .coordinator
        .store
        .remove_member(&caller.user, &group, &user)
        .await
        .map_err(store_failed)?;
    membership_changed(changed)
}

/// 204 when the membership changed, `not_found` when there was nothing to change.
fn membership_changed(changed: bool) -> Result<StatusCode, Problem> {
    if changed {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Problem::new(ProblemCode::NotFound))
    }
}
