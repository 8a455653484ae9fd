//! The OpenAPI document: generated from the code, committed, served — and the three agree.

use serde_json::Value;
use sqlx::PgPool;

use crate::support::harness;

fn committed_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json")
}

/// Fails when the committed `crates/api/openapi.json` is not what the code generates. Run
/// with `UPDATE_OPENAPI=1` to rewrite it after changing the API.
#[test]
fn the_committed_openapi_document_is_the_one_the_code_generates() {
    let generated = countersign_api::openapi::document();
    let path = committed_path();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the code: run `UPDATE_OPENAPI=1 cargo test -p countersign-api --test it openapi` and commit it",
        path.display()
    );
}

#[test]
fn the_openapi_document_is_version_3_1_and_describes_every_route_with_its_problems() {
    let doc: Value = serde_json::from_str(&countersign_api::openapi::document()).unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    for (path, method) in [
        ("/v1/runs", "post"),
        ("/v1/runs/{run_id}", "get"),
        ("/v1/inbox", "get"),
        ("/v1/runs/{run_id}/card", "get"),
        ("/v1/runs/{run_id}/decisions", "post"),
        ("/v1/openapi.json", "get"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{method} {path}");
    }
    let decide = &doc["paths"]["/v1/runs/{run_id}/decisions"]["post"]["responses"];
    for status in ["202", "403", "409", "422", "503"] {
        assert!(decide[status].is_object(), "decisions answer {status}");
    }
    assert!(
        decide["409"]["content"]["application/problem+json"].is_object(),
        "{}",
        decide["409"]
    );
    let decision = &doc["components"]["schemas"]["NewDecision"];
    let required: Vec<&str> = decision["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for field in ["suspension_seq", "turn_digest"] {
        assert!(required.contains(&field), "{field} is required: {decision}");
    }
    // A decision call by call or an edit may leave `approved` out; a whole-turn one sends it.
    assert!(!required.contains(&"approved"), "{decision}");
    for field in ["approved", "calls", "edits"] {
        assert!(
            decision["properties"][field].is_object(),
            "{field} is described: {decision}"
        );
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_served_openapi_document_is_the_generated_one(pool: PgPool) {
    let h = harness(pool).await;
    let served = h
        .send(axum::http::Method::GET, "/v1/openapi.json", &[], None)
        .await;
    assert_eq!(served.status, 200);
    assert_eq!(served.header("content-type"), Some("application/json"));
    assert_eq!(served.text(), countersign_api::openapi::document());
    h.finish().await;
}
