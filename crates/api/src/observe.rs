//! What an operator sees of each HTTP request: a span, and its count and latency.
//!
//! Every request is served inside an `http_request` span (kind server) whose parent is the W3C
//! trace context the request carries (`traceparent`, `tracestate`), so a client's trace goes on
//! through the gates this surface runs (`run_request_gates`, `decision_gates`) and into the
//! segment wake-ups it publishes, whose headers carry the current span's context to the
//! worker. The span names the method, the route template and the status; never a path's ids,
//! a query or a body.
//!
//! `countersign_http_requests_total{method,route,status}` and
//! `countersign_http_request_duration_seconds{method,route}` label a request by its route
//! template (`/v1/runs/{run_id}`), never its path, so that the series stay few; a path no
//! route matches is `unmatched`. The series of every route are registered at zero when the
//! process starts ([`register_metrics`]): the histogram for each route, the counter for each
//! status the OpenAPI document lists.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use tracing::field::Empty;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use utoipa::OpenApi;

const REQUESTS: &str = "countersign_http_requests_total";
const DURATION: &str = "countersign_http_request_duration_seconds";

/// The route label of a path that no route matched.
pub const UNMATCHED: &str = "unmatched";

/// The web inbox's routes, with their methods (those of `/v1` are the OpenAPI document's).
pub const WEB_ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/inbox"),
    ("GET", "/inbox/sign-in"),
    ("POST", "/inbox/sign-in"),
    ("POST", "/inbox/sign-out"),
    ("GET", "/inbox/runs/{run_id}"),
    ("POST", "/inbox/runs/{run_id}/decide"),
    ("GET", "/inbox/static/inbox.css"),
];

/// Serves `request` inside its span, and counts and times it.
pub(crate) async fn observe(request: Request, next: Next) -> Response {
    let method = method_label(request.method());
    let route = route_of(&request);
    let span = tracing::info_span!(
        "http_request",
        otel.kind = "server",
        otel.name = %format!("{method} {route}"),
        http.request.method = method,
        http.route = %route,
        http.response.status_code = Empty,
        otel.status_code = Empty,
    );
    let _ = span.set_parent(countersign_service::telemetry::http_parent(
        request.headers(),
    ));
    let started = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
    metrics::counter!(REQUESTS, "method" => method, "route" => route.clone(), "status" => status.as_str().to_owned())
        .increment(1);
    metrics::histogram!(DURATION, "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

/// The methods a label may name; any other is `other`.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
    KNOWN
        .into_iter()
        .find(|m| *m == method.as_str())
        .unwrap_or("other")
}

/// The template of the route that matched; [`UNMATCHED`] for a fallback (whose catch-all the
/// router may name with a private parameter).
fn route_of(request: &Request) -> String {
    match request.extensions().get::<MatchedPath>() {
        Some(path) if !path.as_str().contains("__private__") => path.as_str().to_owned(),
        _ => UNMATCHED.to_owned(),
    }
}

/// Every route this surface serves, with its method and the statuses known for it: those the
/// OpenAPI document lists for `/v1`, none for the inbox's pages.
pub fn routes() -> Vec<(&'static str, String, Vec<String>)> {
    let document = crate::openapi::ApiDoc::openapi();
    let mut routes = Vec::new();
    for (path, item) in &document.paths.paths {
        let operations = [
            ("GET", &item.get),
            ("HEAD", &item.head),
            ("POST", &item.post),
            ("PUT", &item.put),
            ("PATCH", &item.patch),
            ("DELETE", &item.delete),
            ("OPTIONS", &item.options),
        ];
        for (method, operation) in operations {
            if let Some(operation) = operation {
                let statuses = operation.responses.responses.keys().cloned().collect();
                routes.push((method, path.clone(), statuses));
            }
        }
    }
    routes.extend(
        WEB_ROUTES
            .iter()
            .map(|(method, route)| (*method, (*route).to_owned(), Vec::new())),
    );
    routes
}

/// Registers, at zero, the series of every route (see the module's documentation), and those
/// of the gates this surface runs.
pub fn register_metrics() {
    for (method, route, statuses) in routes() {
        for status in statuses {
            let _ = metrics::counter!(REQUESTS, "method" => method, "route" => route.clone(), "status" => status);
        }
        let _ = metrics::histogram!(DURATION, "method" => method, "route" => route);
    }
    countersign_coordinator::service::register_gate_metrics();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_the_document_and_the_inbox_is_known_with_its_statuses() {
        let routes = routes();
        let find = |method: &str, route: &str| {
            routes
                .iter()
                .find(|(m, r, _)| *m == method && r == route)
                .unwrap_or_else(|| panic!("{method} {route} in {routes:?}"))
        };
        let (_, _, statuses) = find("POST", "/v1/runs/{run_id}/decisions");
        assert!(statuses.iter().any(|s| s == "202"), "{statuses:?}");
        find("GET", "/v1/openapi.json");
        find("POST", "/inbox/runs/{run_id}/decide");
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::from_bytes(b"BREW").unwrap()), "other");
    }
}
