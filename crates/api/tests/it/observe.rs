//! Each request is counted and timed under the template of the route that served it, never its
//! path; a path no route serves is `unmatched`.

use axum::http::Method;
use countersign_core::RunId;
use sqlx::PgPool;

use crate::support::harness;

/// The count of `countersign_http_request_duration_seconds` for `method` and `route`.
fn requests(rendered: &str, method: &str, route: &str) -> u64 {
    let series = format!(
        "countersign_http_request_duration_seconds_count{{method=\"{method}\",route=\"{route}\"}} "
    );
    rendered
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn every_route_is_measured_by_its_template_and_a_path_of_none_as_unmatched(pool: PgPool) {
    let metrics = countersign_service::install_metrics().unwrap();
    let h = harness(pool).await;
    let run = RunId::new().to_string();
    let routes = countersign_api::observe::routes();
    for (method, route, _) in &routes {
        let path = route.replace("{run_id}", &run);
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        h.send(method, &path, &[], None).await;
    }
    for path in [
        "/v1/no-such-thing",
        "/elsewhere",
        &format!("/inbox/runs/{run}/x"),
    ] {
        let reply = h.send(Method::GET, path, &[], None).await;
        assert_eq!(reply.status, 404, "{path}");
    }

    let rendered = metrics.render();
    for (method, route, _) in &routes {
        assert!(
            requests(&rendered, method, route) >= 1,
            "{method} {route} is measured under its template:\n{rendered}"
        );
    }
    assert!(requests(&rendered, "GET", countersign_api::observe::UNMATCHED) >= 3);
    assert!(
        !rendered.contains(&run),
        "no path's id becomes a label:\n{rendered}"
    );
    h.finish().await;
}
