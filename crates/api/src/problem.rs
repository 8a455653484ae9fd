//! Errors as RFC 9457 problem details (`application/problem+json`).
//!
//! Every refusal of the API has a stable code — the gate's outcome (`stale_turn`,
//! `access_denied`, …) or a code of this surface (`unauthenticated`, `body_too_large`, …) — and
//! the body says only that code, a fixed title, and the ids the caller sent. Never an error's
//! message: a message can carry a credential, a query or content.

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use countersign_coordinator::{DecisionCode, RequestOutcome};
use countersign_store::DecisionOutcome;
use serde::Serialize;
use strum::VariantArray;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::ToSchema;
use uuid::Uuid;

/// The media type of a problem body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Every code a problem of this surface can carry, with its HTTP status and title. The gates'
/// refusals are their own outcomes, wrapped: their codes are the gates'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum ProblemCode {
    // The caller.
    Unauthenticated,
    RateLimited,
    CsrfRejected,
    // The request.
    NotAJsonObject,
    UnsupportedMediaType,
    BodyTooLarge,
    Malformed,
    InvalidQuery,
    ConflictingIdempotency,
    /// A standing grant cannot be given from the card; `reason` says why.
    GrantRefused,
    NotFound,
    MethodNotAllowed,
    Timeout,
    // The connection, before any route (see `crate::conn`).
    MalformedRequest,
    UriTooLong,
    HeadersTooLarge,
    // Both gates: the producer may not assert the user.
    UnauthenticatedProducer,
    /// A refusal of the run-request gates past the producer's: never `accepted`, `malformed`
    /// or `unauthenticated_producer`, which are their own.
    #[strum(transparent)]
    Request(RequestOutcome),
    /// A refusal of the decision gates: never `accepted`.
    #[strum(transparent)]
    Decision(DecisionOutcome),
    // The service.
    StateUnreadable,
    Unavailable,
}

impl ProblemCode {
    pub fn code(self) -> &'static str {
        self.into()
    }

    pub fn status(self) -> StatusCode {
        use DecisionOutcome as D;
        use RequestOutcome as R;
        match self {
            ProblemCode::Unauthenticated => StatusCode::UNAUTHORIZED,
            ProblemCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ProblemCode::CsrfRejected => StatusCode::FORBIDDEN,
            ProblemCode::NotAJsonObject | ProblemCode::InvalidQuery => StatusCode::BAD_REQUEST,
            ProblemCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ProblemCode::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemCode::Malformed
            | ProblemCode::ConflictingIdempotency
            | ProblemCode::GrantRefused => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemCode::NotFound => StatusCode::NOT_FOUND,
            ProblemCode::MalformedRequest => StatusCode::BAD_REQUEST,
            ProblemCode::UriTooLong => StatusCode::URI_TOO_LONG,
            ProblemCode::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProblemCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ProblemCode::Timeout
            | ProblemCode::Unavailable
            | ProblemCode::Decision(D::NotAuditable) => StatusCode::SERVICE_UNAVAILABLE,
            ProblemCode::UnauthenticatedProducer
            | ProblemCode::Decision(
                D::AccessDenied
                | D::SelfApprovalDenied
                | D::ApproverNotPermitted
                | D::EditorApprovalDenied
                | D::NotInApproverGroups,
            ) => StatusCode::FORBIDDEN,
            ProblemCode::Decision(
                D::CallsNotOfTheCard
                | D::EditNotOfTheCard
                | D::EditChangesTool
                | D::EditInvalidArguments,
            ) => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemCode::Request(R::UnknownActingUser) => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemCode::Request(_) | ProblemCode::Decision(_) => StatusCode::CONFLICT,
            ProblemCode::StateUnreadable => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A fixed sentence: what happened and what the caller may do about it.
    pub fn title(self) -> &'static str {
        use DecisionOutcome as D;
        use RequestOutcome as R;
        match self {
            ProblemCode::Unauthenticated => {
                "No valid credential: send `Authorization: Bearer <token>` with a token from `countersign tokens create`."
            }
            ProblemCode::RateLimited => "Too many requests for this credential; retry later.",
            ProblemCode::CsrfRejected => {
                "The form did not come from this inbox's own page; reload the page and try again."
            }
            ProblemCode::NotAJsonObject => "The body is not a UTF-8 JSON object.",
            ProblemCode::UnsupportedMediaType => "The body must be sent as application/json.",
            ProblemCode::BodyTooLarge => "The body is larger than this service accepts.",
            ProblemCode::Malformed => {
                "A field is missing or malformed; `reason` names it. Nothing was recorded."
            }
            ProblemCode::InvalidQuery => "A query parameter is malformed.",
            ProblemCode::ConflictingIdempotency => {
                "Send either an Idempotency-Key header or an id in the body, not both."
            }
            ProblemCode::GrantRefused => {
                "No standing grant can be given from this card; `reason` says why (`grant_removes`, `grant_data_class`, `grant_no_subject`, `grant_no_writes`, `grant_no_facts`). Nothing was granted."
            }
            ProblemCode::NotFound => {
                "Nothing at this path that this caller may see: no such run, or not one of theirs."
            }
            ProblemCode::MethodNotAllowed => "This path does not take that method.",
            ProblemCode::MalformedRequest => "The request is not an HTTP request this service can read.",
            ProblemCode::UriTooLong => "The URI is longer than this service reads.",
            ProblemCode::HeadersTooLarge => "The request's headers are larger than this service reads.",
            ProblemCode::Timeout => "The request took too long and was abandoned; it may be retried with the same id.",
            ProblemCode::UnauthenticatedProducer => {
                "This credential may not assert that user (no producer grant covers it). Nothing was recorded."
            }
            ProblemCode::Request(R::UnknownActingUser) => "The acting user does not exist. Nothing was created.",
            ProblemCode::Request(R::ConfigurationGone) => decision_title(D::ConfigurationGone),
            ProblemCode::Request(R::IdempotencyConflict) => decision_title(D::IdempotencyConflict),
            ProblemCode::StateUnreadable => "The run's suspended state cannot be opened.",
            ProblemCode::Unavailable => "A dependency of this service is unavailable; retry later.",
            ProblemCode::Decision(d) => decision_title(d),
            // Never wrapped: `accepted` is no problem, and the others have their own.
            ProblemCode::Request(_) => ProblemCode::Unavailable.title(),
        }
    }

    /// The problem of a gated decision outcome; `None` for `accepted`.
    pub fn of_decision(outcome: &DecisionCode) -> Option<ProblemCode> {
        Some(match *outcome {
            DecisionCode::Malformed => ProblemCode::Malformed,
            DecisionCode::UnauthenticatedProducer => ProblemCode::UnauthenticatedProducer,
            DecisionCode::Gated(
                DecisionOutcome::Accepted
                | DecisionOutcome::ApprovalRecorded
                | DecisionOutcome::DenialRecorded,
            ) => return None,
            DecisionCode::Gated(outcome) => ProblemCode::Decision(outcome),
            // A code this surface does not know yet is a refusal all the same.
            #[allow(unreachable_patterns)]
            _ => ProblemCode::Unavailable,
        })
    }

    /// Every problem the decision gates can answer: each outcome of [`DecisionCode`].
    pub fn of_decision_gates() -> Vec<ProblemCode> {
        DecisionCode::all()
            .filter_map(|c| ProblemCode::of_decision(&c))
            .collect()
    }

    /// Every problem the run-request gates can answer: each outcome of [`RequestOutcome`].
    pub fn of_request_gates() -> Vec<ProblemCode> {
        RequestOutcome::VARIANTS
            .iter()
            .filter_map(ProblemCode::of_request)
            .collect()
    }

    /// The problem of a gated run request; `None` for `accepted`.
    pub fn of_request(outcome: &RequestOutcome) -> Option<ProblemCode> {
        Some(match *outcome {
            RequestOutcome::Accepted => return None,
            RequestOutcome::Malformed => ProblemCode::Malformed,
            RequestOutcome::UnauthenticatedProducer => ProblemCode::UnauthenticatedProducer,
            outcome => ProblemCode::Request(outcome),
        })
    }
}

/// A refusal, as the handlers pass it around; answered as [`ProblemDetails`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub code: ProblemCode,
    /// For `malformed`: which field, e.g. `invalid_field:turn_digest`.
    pub reason: Option<String>,
    pub run_id: Option<Uuid>,
    pub decision_id: Option<Uuid>,
    pub replayed: bool,
    pub retry_after: Option<u64>,
}

/// A problem details body (RFC 9457, `application/problem+json`) with this service's
/// extension members.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ProblemDetails {
    /// `urn:countersign:problem:<code>`.
    #[serde(rename = "type")]
    #[schema(example = "urn:countersign:problem:stale_turn")]
    pub kind: String,
    /// A fixed sentence for the code.
    pub title: &'static str,
    /// The HTTP status.
    #[schema(example = 409)]
    pub status: u16,
    /// The stable code: a gate's outcome or one of this surface.
    #[schema(example = "stale_turn")]
    pub code: &'static str,
    /// For `malformed`: which field, e.g. `invalid_field:turn_digest`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "invalid_field:turn_digest")]
    pub reason: Option<String>,
    /// The run the request named, when it named one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<Uuid>,
    /// The decision id the outcome belongs to (a replay of it returns the same outcome).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_id: Option<Uuid>,
    /// `true` when this is the recorded outcome of an earlier request with the same id.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// Seconds after which a retry may succeed (also the `Retry-After` header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    pub fn new(code: ProblemCode) -> Problem {
        Problem {
            code,
            reason: None,
            run_id: None,
            decision_id: None,
            replayed: false,
            retry_after: match code {
                ProblemCode::Decision(DecisionOutcome::NotAuditable)
                | ProblemCode::Unavailable
                | ProblemCode::Timeout => Some(1),
                _ => None,
            },
        }
    }

    pub fn malformed(reason: impl Into<String>) -> Problem {
        Problem {
            reason: Some(reason.into()),
            ..Problem::new(ProblemCode::Malformed)
        }
    }

    pub fn with_run(mut self, run_id: Uuid) -> Problem {
        self.run_id = Some(run_id);
        self
    }

    pub fn with_retry_after(mut self, secs: u64) -> Problem {
        self.retry_after = Some(secs);
        self
    }

    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// The body it is answered with.
    pub fn details(&self) -> ProblemDetails {
        ProblemDetails {
            kind: format!("urn:countersign:problem:{}", self.code.code()),
            title: self.code.title(),
            status: self.code.status().as_u16(),
            code: self.code.code(),
            reason: self.reason.clone(),
            run_id: self.run_id,
            decision_id: self.decision_id,
            replayed: self.replayed,
            retry_after: self.retry_after,
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, axum::Json(self.details())).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"countersign\""),
            );
        }
        response
    }
}

/// The problems one route of `/v1` can answer, put together from the problems of the parts its
/// handler goes through (the caller's credential, the body, the gates, …), each declared next
/// to the part that answers it. The OpenAPI document lists exactly these
/// ([`problem_responses`]), grouped by status, and the tests hold every problem answered against
/// the document.
pub trait RouteProblems {
    fn codes() -> Vec<ProblemCode>;
}

/// The OpenAPI responses of a route's problems: for each status, a problem+json body whose
/// `code` is one of the route's codes of that status.
pub fn problem_responses(
    codes: &[ProblemCode],
) -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
    let mut by_status: BTreeMap<u16, Vec<&'static str>> = BTreeMap::new();
    for code in codes {
        let of_status = by_status.entry(code.status().as_u16()).or_default();
        if !of_status.contains(&code.code()) {
            of_status.push(code.code());
        }
    }
    by_status
        .into_iter()
        .map(|(status, codes)| {
            let description = codes
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let narrowed = ObjectBuilder::new()
                .property(
                    "code",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(codes.iter().copied())),
                )
                .property(
                    "status",
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .enum_values(Some([status])),
                );
            let schema = AllOfBuilder::new()
                .item(Ref::from_schema_name("ProblemDetails"))
                .item(narrowed);
            let response = ResponseBuilder::new()
                .description(description)
                .content(
                    PROBLEM_JSON,
                    ContentBuilder::new().schema(Some(schema)).build(),
                )
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// Declares a route's problems: a type for `#[utoipa::path(responses(…))]` whose responses are
/// the union of the parts' problems.
macro_rules! route_problems {
    ($(#[$doc:meta])* $name:ident = [$($part:expr),* $(,)?]) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name;

        impl $crate::problem::RouteProblems for $name {
            fn codes() -> Vec<$crate::problem::ProblemCode> {
                let mut codes = Vec::new();
                $(codes.extend_from_slice(&$part);)*
                codes
            }
        }

        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<
                String,
                utoipa::openapi::RefOr<utoipa::openapi::Response>,
            > {
                $crate::problem::problem_responses(
                    &<$name as $crate::problem::RouteProblems>::codes(),
                )
            }
        }
    };
}
pub(crate) use route_problems;

/// What every request can be answered, whatever its route: abandoned past the deadline
/// ([`crate::limits::deadline`]), or refused by the connection before any route
/// ([`crate::conn`]).
pub const EVERY_REQUEST: [ProblemCode; 4] = [
    ProblemCode::Timeout,
    ProblemCode::MalformedRequest,
    ProblemCode::UriTooLong,
    ProblemCode::HeadersTooLarge,
];

/// A failure to reach a dependency, logged with its message and answered with its class only.
pub(crate) fn unavailable(
    what: &'static str,
    code: &'static str,
    error: &dyn std::fmt::Display,
) -> Problem {
    tracing::warn!(what, error.code = code, error = %error, "request failed on a dependency");
    Problem::new(ProblemCode::Unavailable)
}

/// The title of a gated decision's refusal (see [`ProblemCode::title`]).
fn decision_title(outcome: DecisionOutcome) -> &'static str {
    use DecisionOutcome as D;
    match outcome {
        D::ConfigurationGone => {
            "The agent configuration does not exist or is not active. Nothing changed."
        }
        D::NotAwaitingApproval => {
            "The run is not waiting for approval (decided, cancelled or expired). Nothing changed."
        }
        D::StaleTurn => {
            "The card decided on is no longer the run's current card. Nothing changed: reload the card and decide on what it shows now."
        }
        D::AccessDenied => "The approver may not act on this run. Nothing changed.",
        D::SelfApprovalDenied => {
            "This configuration requires a second approver: the run's own user may not approve it. Nothing changed."
        }
        D::ApproverNotPermitted => {
            "The approver is not permitted to release every write of this turn. Nothing changed."
        }
        D::CallsNotOfTheCard => {
            "A decision call by call names every call of the card exactly once, by its index. Nothing changed."
        }
        D::EditNotOfTheCard => {
            "The edit names a call the card does not have, or one already written under an earlier card. Nothing changed."
        }
        D::EditChangesTool => {
            "An edit changes a call's arguments, never its tool. Nothing changed."
        }
        D::EditInvalidArguments => {
            "The new arguments do not fit the tool's argument schema. Nothing changed."
        }
        D::EditorApprovalDenied => {
            "This configuration requires a second approver: whoever edited the card may not approve it alone. Nothing changed."
        }
        D::NotAuditable => {
            "The decision could not be recorded, so nothing changed; send the same decision again."
        }
        D::NotInApproverGroups => {
            "This agent's cards are decided by its groups of approvers, and the approver is in none of them (nor holds a delegation from a member now). Nothing changed."
        }
        D::AlreadyVoted => {
            "The approver has voted on this card already. Nothing changed."
        }
        D::QuorumCallsDiffer => {
            "Approvals count together only when they approve the same calls, and this one approves others than the approvals before it. Nothing changed: decide as they did, or deny."
        }
        D::IdempotencyConflict => {
            "This id (or Idempotency-Key) was used before for another request: another run, card or body. Nothing changed; send a new id."
        }
        // Never wrapped: an accepted decision and a recorded vote are no problem.
        D::Accepted | D::ApprovalRecorded | D::DenialRecorded => ProblemCode::Unavailable.title(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_names_one_problem() {
        // Where two problems share a code (a refusal both gates give), they are one problem.
        let mut codes: BTreeMap<&str, ProblemCode> = BTreeMap::new();
        for code in ProblemCode::of_decision_gates()
            .into_iter()
            .chain(ProblemCode::of_request_gates())
            .chain(EVERY_REQUEST)
        {
            let first = *codes.entry(code.code()).or_insert(code);
            assert_eq!(
                (first.status(), first.title()),
                (code.status(), code.title())
            );
        }
        assert_eq!(
            codes["stale_turn"],
            ProblemCode::Decision(DecisionOutcome::StaleTurn)
        );
    }

    #[test]
    fn a_routes_problems_are_documented_by_status_with_exactly_their_codes() {
        let responses = problem_responses(&[
            ProblemCode::Decision(DecisionOutcome::StaleTurn),
            ProblemCode::Decision(DecisionOutcome::IdempotencyConflict),
            ProblemCode::Decision(DecisionOutcome::StaleTurn),
            ProblemCode::NotFound,
        ]);
        assert_eq!(responses.keys().collect::<Vec<_>>(), ["404", "409"]);
        let RefOr::T(conflict) = &responses["409"] else {
            panic!("an inline response")
        };
        let schema = serde_json::to_value(&conflict.content[PROBLEM_JSON].schema).unwrap();
        assert_eq!(
            schema["allOf"][1]["properties"]["code"]["enum"],
            serde_json::json!(["stale_turn", "idempotency_conflict"])
        );
        assert_eq!(conflict.description, "`stale_turn`, `idempotency_conflict`");
    }

    #[test]
    fn the_gates_problems_are_every_refusal_of_their_outcomes() {
        let decisions = ProblemCode::of_decision_gates();
        for code in [
            ProblemCode::Malformed,
            ProblemCode::UnauthenticatedProducer,
            ProblemCode::Decision(DecisionOutcome::IdempotencyConflict),
            ProblemCode::Decision(DecisionOutcome::NotAuditable),
        ] {
            assert!(decisions.contains(&code), "{code:?}");
        }
        assert_eq!(
            decisions.len(),
            DecisionOutcome::VARIANTS.len() - 3 + 2,
            "all but accepted and the recorded votes"
        );
        assert!(ProblemCode::of_request_gates()
            .contains(&ProblemCode::Request(RequestOutcome::IdempotencyConflict)));
    }

    #[test]
    fn every_gate_outcome_maps_to_the_status_a_user_expects() {
        let status = |outcome| {
            ProblemCode::of_decision(&DecisionCode::Gated(outcome)).map(|c| c.status().as_u16())
        };
        assert_eq!(
            status(DecisionOutcome::Accepted),
            None,
            "202, not a problem"
        );
        assert_eq!(status(DecisionOutcome::StaleTurn), Some(409));
        assert_eq!(status(DecisionOutcome::NotAwaitingApproval), Some(409));
        assert_eq!(status(DecisionOutcome::ConfigurationGone), Some(409));
        assert_eq!(status(DecisionOutcome::AccessDenied), Some(403));
        assert_eq!(status(DecisionOutcome::SelfApprovalDenied), Some(403));
        assert_eq!(status(DecisionOutcome::ApproverNotPermitted), Some(403));
        assert_eq!(status(DecisionOutcome::NotAuditable), Some(503));
        let unauthenticated = ProblemCode::of_decision(&DecisionCode::UnauthenticatedProducer);
        assert_eq!(unauthenticated.map(|c| c.status().as_u16()), Some(403));

        // A problem's code is the gate's own, and `not_auditable` says when to retry.
        let problem = Problem::new(ProblemCode::Decision(DecisionOutcome::NotAuditable)).details();
        assert_eq!(problem.code, DecisionOutcome::NotAuditable.as_str());
        assert_eq!(problem.retry_after, Some(1));
        assert_eq!(problem.kind, "urn:countersign:problem:not_auditable");
    }
}
