//! The OpenAPI 3.1 document of `/v1`, generated from the handlers and the types they read and
//! write ([`crate::v1`]). The committed copy, `crates/api/openapi.json`, is checked against
//! this by a test: a change to the API that does not update it fails.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::problem::{route_problems, ProblemDetails, EVERY_REQUEST};
use crate::{grants, groups, slack, v1};

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "countersign",
        description = "Run LLM agents as background work; a human countersigns every write an agent proposes. \
            Every request goes through the same gates as a queue producer's message, as the producer its \
            credential authenticates.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
        version = "1"
    ),
    paths(
        v1::create_run,
        v1::get_run,
        v1::inbox,
        v1::card,
        v1::decide,
        grants::grant,
        slack::message,
        groups::list,
        groups::create,
        groups::add,
        groups::remove,
        openapi,
    ),
    components(schemas(
        ProblemDetails,
        v1::NewRun,
        v1::RunAccepted,
        v1::RunView,
        v1::RunEventView,
        v1::Status,
        v1::InboxPage,
        v1::WaitingFilter,
        v1::InboxRun,
        v1::Card,
        v1::CardCall,
        v1::Edited,
        v1::Preview,
        v1::DecisionBody,
        v1::CallDecision,
        v1::CallEdit,
        v1::DecisionAccepted,
        grants::GrantBody,
        grants::Grant,
        v1::Quorum,
        groups::Group,
    )),
    modifiers(&Bearer),
    tags(
        (name = "runs", description = "Run requests and runs"),
        (name = "inbox", description = "Waiting runs, their cards, and decisions on them"),
        (name = "directory", description = "Groups of approvers"),
        (name = "meta", description = "This document"),
    )
)]
pub struct ApiDoc;

#[derive(Debug)]
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from `countersign tokens create --for USER` (`cst_…`).",
                    ))
                    .build(),
            ),
        );
    }
}

route_problems!(
    /// The problems of `GET /v1/openapi.json`.
    OpenApiProblems = [EVERY_REQUEST]
);

/// The OpenAPI document of this API (OpenAPI 3.1), generated from the code.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "meta",
    responses(
        (status = 200, description = "This document.", content_type = "application/json"),
        OpenApiProblems,
    )
)]
pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document()).into_response()
}

/// The document as served and committed: pretty JSON with a final newline.
pub fn document() -> String {
    let mut json = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|_| "{}".to_owned());
    json.push('\n');
    json
}
