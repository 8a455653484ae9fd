//! `POST /v1/runs` and `GET /v1/runs/{id}`: the run-request gates over HTTP.

use countersign_store::{RunStatus, SegmentKind};
use serde_json::json;
use sqlx::PgPool;

use crate::support::{harness, AGENT};

const RUNS: &str = "SELECT count(*) FROM runs";

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_run_request_creates_one_queued_run_and_a_repeated_idempotency_key_creates_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let editor = h.token("editor").await;
    let body = json!({"agent": AGENT, "prompt": "Improve page 12."});

    let first = h
        .post(
            &editor,
            "/v1/runs",
            &body,
            &[("idempotency-key", "nightly-2026-11-30")],
        )
        .await;
    assert_eq!(first.status, 202, "{}", first.text());
    let created = first.json();
    assert_eq!(created["created"], true);
    let run_id = created["run_id"].as_str().unwrap().to_owned();
    assert_eq!(
        first.header("location"),
        Some(format!("/v1/runs/{run_id}").as_str())
    );

    let again = h
        .post(
            &editor,
            "/v1/runs",
            &body,
            &[("idempotency-key", "nightly-2026-11-30")],
        )
        .await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["run_id"], run_id.as_str());
    assert_eq!(again.json()["created"], false);
    assert_eq!(h.count(RUNS).await, 1, "the duplicate created nothing");

    // The run is queued for its start segment, acting as the token's user.
    let run = h
        .store
        .run(countersign_core::RunId::parse(&run_id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (run.status, run.segment),
        (RunStatus::Queued, SegmentKind::Start)
    );
    assert_eq!(run.acting_user, "editor");
    // Its `run.accepted` is its wake-up: once the relay has it confirmed, the run is dispatched.
    assert_eq!(h.relay_wake_ups().await, [run.id]);
    let run = h.store.run(run.id).await.unwrap().unwrap();
    assert!(
        run.dispatched_at.is_some(),
        "its wake-up was published and confirmed"
    );

    // A request id in the body deduplicates the same way; both at once is refused.
    let request_id = uuid::Uuid::now_v7();
    let with_id = json!({"agent": AGENT, "prompt": "x", "request_id": request_id});
    assert_eq!(h.post(&editor, "/v1/runs", &with_id, &[]).await.status, 202);
    assert_eq!(h.post(&editor, "/v1/runs", &with_id, &[]).await.status, 200);
    h.post(&editor, "/v1/runs", &with_id, &[("idempotency-key", "k")])
        .await
        .problem(422, "conflicting_idempotency");
    assert_eq!(h.count(RUNS).await, 2);
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_run_as_another_user_needs_a_producer_grant_and_without_one_creates_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let editor = h.token("editor").await;
    let as_admin = json!({"agent": AGENT, "prompt": "x", "acting_user": "admin"});

    h.post(&editor, "/v1/runs", &as_admin, &[])
        .await
        .problem(403, "unauthenticated_producer");
    assert_eq!(h.count(RUNS).await, 0);

    // The registry is the queues' own: a grant for the token's producer lets it through.
    countersign_coordinator::producers::allow(
        &h.pool,
        "http:editor",
        countersign_coordinator::ProducerKind::ActingUser,
        "admin",
    )
    .await
    .unwrap();
    let reply = h.post(&editor, "/v1/runs", &as_admin, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text());
    assert_eq!(h.count(RUNS).await, 1);
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn bad_run_requests_are_refused_with_a_named_problem_and_create_nothing(pool: PgPool) {
    let h = harness(pool).await;
    let editor = h.token("editor").await;

    // Gate 1's own reasons.
    let problem = h
        .post(&editor, "/v1/runs", &json!({"prompt": "x"}), &[])
        .await
        .problem(422, "malformed");
    assert_eq!(problem["reason"], "missing_field:agent");
    let problem = h
        .post(
            &editor,
            "/v1/runs",
            &json!({"agent": 7, "prompt": "x"}),
            &[],
        )
        .await
        .problem(422, "malformed");
    assert_eq!(problem["reason"], "invalid_field:agent");
    let problem = h
        .post(
            &editor,
            "/v1/runs",
            &json!({"agent": AGENT, "prompt": "x".repeat(40_000)}),
            &[],
        )
        .await
        .problem(422, "malformed");
    assert_eq!(problem["reason"], "invalid_field:prompt");

    // The gates after the schema.
    h.post(
        &editor,
        "/v1/runs",
        &json!({"agent": "nobody", "prompt": "x"}),
        &[],
    )
    .await
    .problem(409, "configuration_gone");
    let ghost = h.token("ghost").await;
    h.post(
        &ghost,
        "/v1/runs",
        &json!({"agent": AGENT, "prompt": "x"}),
        &[],
    )
    .await
    .problem(422, "unknown_acting_user");

    // The transport's.
    let auth = format!("Bearer {editor}");
    let not_json = h
        .send(
            axum::http::Method::POST,
            "/v1/runs",
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            Some(b"{not json".to_vec()),
        )
        .await;
    not_json.problem(400, "not_a_json_object");
    let form = h
        .send(
            axum::http::Method::POST,
            "/v1/runs",
            &[
                ("authorization", &auth),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            Some(b"agent=seo&prompt=x".to_vec()),
        )
        .await;
    form.problem(415, "unsupported_media_type");
    let huge = h
        .post(
            &editor,
            "/v1/runs",
            &json!({"agent": AGENT, "prompt": "x".repeat(70_000)}),
            &[],
        )
        .await;
    huge.problem(413, "body_too_large");

    assert_eq!(h.count(RUNS).await, 0, "nothing was created");
    let problems = [not_json.text(), form.text(), huge.text()].join("\n");
    assert!(
        !problems.contains("expected") && !problems.contains("line 1"),
        "no parser message reaches a caller: {problems}"
    );
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_run_is_shown_with_its_codes_to_whoever_may_follow_it_and_to_nobody_else(pool: PgPool) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    let editor = h.token("editor").await;
    let path = format!("/v1/runs/{run_id}");

    let own = h.get(&editor, &path).await;
    assert_eq!(own.status, 200, "{}", own.text());
    let run = own.json();
    assert_eq!(run["status"], "waiting_for_approval");
    assert_eq!(run["acting_user"], "editor");
    assert_eq!(run["suspension_seq"], 1);
    assert_eq!(run["turn_digest"].as_str().unwrap().len(), 64);
    let kinds: Vec<&str> = run["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"run.suspended"), "{kinds:?}");
    assert!(
        !own.text().contains("every road"),
        "no arguments or previews: {}",
        own.text()
    );
    assert!(
        !own.text().contains("Improve page 12"),
        "no content: {}",
        own.text()
    );

    // An approver may decide on it, so may see it; a stranger may not even learn it exists.
    assert_eq!(h.get(&h.token("approver").await, &path).await.status, 200);
    let restricted = h.token("restricted").await;
    h.get(&restricted, &path).await.problem(404, "not_found");
    // A path that names no run names nothing: not a UUID, or a UUID that is not a run id.
    h.get(&restricted, "/v1/runs/not-a-run")
        .await
        .problem(404, "not_found");
    h.get(
        &restricted,
        "/v1/runs/6f1c1a4e-2b3d-4c5e-8f70-0123456789ab/card",
    )
    .await
    .problem(404, "not_found");
    h.get(&restricted, "/v1/nothing-here")
        .await
        .problem(404, "not_found");
    h.send(axum::http::Method::DELETE, &path, &[], None)
        .await
        .problem(405, "method_not_allowed");
    h.finish().await;
}
