//! Idempotency over HTTP: a decision id or `Idempotency-Key` is bound to the run, card and
//! body it first came with, a request id to its caller and its request; anything else naming
//! it is `409 idempotency_conflict` and changes nothing.

use serde_json::{json, Value};
use sqlx::PgPool;

use crate::support::{decision_on, harness, Harness, AGENT};

const RUNS: &str = "SELECT count(*) FROM runs";

/// Two runs of `editor`, both waiting, and the admin's token and cards of them.
async fn two_waiting_runs(h: &Harness) -> (String, [(String, Value); 2]) {
    let admin = h.token("admin").await;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let run_id = h.suspended_run().await.to_string();
        let card = h
            .get(&admin, &format!("/v1/runs/{run_id}/card"))
            .await
            .json();
        runs.push((run_id, card));
    }
    let runs: [(String, Value); 2] = runs.try_into().unwrap();
    (admin, runs)
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_key_or_id_sent_again_for_another_run_is_a_conflict_and_leaves_that_run_waiting(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let (admin, [(a, card_a), (b, card_b)]) = two_waiting_runs(&h).await;
    let b_id = countersign_core::RunId::parse(&b).unwrap();
    let before = h.row(b_id).await;

    // Deny run A with the key K, then send K for run B.
    let key = [("idempotency-key", "deny-nightly")];
    let denied = h
        .post(
            &admin,
            &format!("/v1/runs/{a}/decisions"),
            &decision_on(&card_a, false),
            &key,
        )
        .await;
    assert_eq!(denied.status, 202, "{}", denied.text());
    let decision_id = denied.json()["decision_id"].clone();
    let conflict = h
        .post(
            &admin,
            &format!("/v1/runs/{b}/decisions"),
            &decision_on(&card_b, false),
            &key,
        )
        .await;
    let problem = conflict.problem(409, "idempotency_conflict");
    assert_eq!(problem["run_id"], b.as_str());
    assert!(problem.get("replayed").is_none(), "{problem}");

    // A's decision id in the body, for run B: the same.
    let mut by_id = decision_on(&card_b, false);
    by_id["decision_id"] = decision_id;
    h.post(&admin, &format!("/v1/runs/{b}/decisions"), &by_id, &[])
        .await
        .problem(409, "idempotency_conflict");

    assert_eq!(
        h.row(b_id).await,
        before,
        "run B still waits, exactly as it was"
    );
    let trail = h.get(&admin, &format!("/v1/runs/{b}")).await.json();
    assert!(
        !trail["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"].as_str().unwrap().starts_with("decision.")),
        "{trail}"
    );
    // The key still replays run A's denial.
    let replay = h
        .post(
            &admin,
            &format!("/v1/runs/{a}/decisions"),
            &decision_on(&card_a, false),
            &key,
        )
        .await;
    assert_eq!(replay.status, 202, "{}", replay.text());
    assert_eq!(replay.json()["replayed"], true);
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_key_sent_again_with_another_body_is_a_conflict(pool: PgPool) {
    let h = harness(pool).await;
    let (admin, [(a, card), _]) = two_waiting_runs(&h).await;
    let path = format!("/v1/runs/{a}/decisions");
    let key = [("idempotency-key", "k-1")];
    let mut first = decision_on(&card, false);
    first["comment"] = json!("Not this image.");
    assert_eq!(h.post(&admin, &path, &first, &key).await.status, 202);

    let mut approved = first.clone();
    approved["approved"] = json!(true);
    let mut comment = first.clone();
    comment["comment"] = json!("Another comment.");
    let mut card_seq = first.clone();
    card_seq["suspension_seq"] = json!(2);
    for other in [approved, comment, card_seq] {
        h.post(&admin, &path, &other, &key)
            .await
            .problem(409, "idempotency_conflict");
    }
    // Another approver with the same key is another producer's key: no replay of admin's.
    let approver = h.token("approver").await;
    h.post(&approver, &path, &first, &key)
        .await
        .problem(409, "not_awaiting_approval");
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_request_id_is_the_callers_own_and_a_key_sent_again_with_another_body_is_a_conflict(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let editor = h.token("editor").await;
    let admin = h.token("admin").await;
    let request_id = uuid::Uuid::now_v7();
    let body = json!({"agent": AGENT, "prompt": "Improve page 12.", "request_id": request_id});
    let editors = h.post(&editor, "/v1/runs", &body, &[]).await;
    assert_eq!(editors.status, 202, "{}", editors.text());

    // The admin sending the editor's request id gets a run of its own, not the editor's.
    let admins = h.post(&admin, "/v1/runs", &body, &[]).await;
    assert_eq!(admins.status, 202, "{}", admins.text());
    assert_ne!(admins.json()["run_id"], editors.json()["run_id"]);
    assert_eq!(admins.json()["created"], true);

    // The same key with another prompt creates nothing and names no run.
    let key = [("idempotency-key", "nightly")];
    let first = json!({"agent": AGENT, "prompt": "Improve page 12."});
    assert_eq!(h.post(&editor, "/v1/runs", &first, &key).await.status, 202);
    let runs = h.count(RUNS).await;
    let other = json!({"agent": AGENT, "prompt": "Delete page 12."});
    let problem = h
        .post(&editor, "/v1/runs", &other, &key)
        .await
        .problem(409, "idempotency_conflict");
    assert!(problem.get("run_id").is_none(), "{problem}");
    let mut body_id = first.clone();
    body_id["request_id"] = json!(request_id);
    body_id["prompt"] = json!("Delete page 12.");
    h.post(&editor, "/v1/runs", &body_id, &[])
        .await
        .problem(409, "idempotency_conflict");
    assert_eq!(h.count(RUNS).await, runs, "nothing was created");
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_on_a_run_the_caller_may_not_see_is_answered_as_for_a_missing_run_and_joins_no_trail(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    let admin = h.token("admin").await;
    let card = h
        .get(&admin, &format!("/v1/runs/{run_id}/card"))
        .await
        .json();
    let restricted = h.token("restricted").await;
    let events = h.get(&admin, &format!("/v1/runs/{run_id}")).await.json()["events"].clone();
    let before = h.row(run_id).await;

    let mut stale = decision_on(&card, true);
    stale["turn_digest"] = json!("f".repeat(64));
    let missing = countersign_core::RunId::new();
    let answers = [
        (run_id.to_string(), decision_on(&card, true)),
        (run_id.to_string(), stale),
        (missing.to_string(), decision_on(&card, true)),
    ];
    let mut bodies = Vec::new();
    for (run, body) in answers {
        let reply = h
            .post(
                &restricted,
                &format!("/v1/runs/{run}/decisions"),
                &body,
                &[],
            )
            .await;
        let mut problem = reply.problem(409, "not_awaiting_approval");
        for id in ["run_id", "decision_id"] {
            problem.as_object_mut().unwrap().remove(id);
        }
        bodies.push(problem);
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{bodies:?}");
    assert_eq!(h.row(run_id).await, before);
    assert_eq!(
        h.get(&admin, &format!("/v1/runs/{run_id}")).await.json()["events"],
        events,
        "the run's history shows nothing of them"
    );
    h.finish().await;
}
