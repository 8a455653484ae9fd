//! The inbox, the card and decisions over HTTP: every gate's outcome, mapped to its status.

use countersign_store::{RunStatus, SegmentKind};
use countersign_worker::SegmentEnd;
use serde_json::{json, Value};
use sqlx::PgPool;

use std::sync::Arc;

use countersign_store::TableUsers;

use crate::support::{config, decision_on, harness, harness_with_users, AGENT, DESCRIPTION};

const TEASER_IMAGES: &str =
    "SELECT count(*) FROM content.file_references WHERE element = 5 AND field = 'image' AND NOT deleted";

fn preview_kinds(card: &Value) -> Vec<String> {
    card["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["preview"]["kind"].as_str().unwrap().to_owned())
        .collect()
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_directory_grant_for_one_agent_shows_that_agents_runs_and_no_other(pool: PgPool) {
    let users = TableUsers::new(pool.clone());
    for (name, agent) in [
        ("editor", None),
        ("reviewer", Some(AGENT)),
        ("other-reviewer", Some("another-agent")),
    ] {
        users.put(name, false).await.unwrap();
        if let Some(agent) = agent {
            users.grant_approve(name, agent).await.unwrap();
        }
    }
    let h = harness_with_users(pool, config(), Arc::new(users)).await;
    let run_id = h.suspended_run().await.to_string();

    let reviewer = h.token("reviewer").await;
    let listed = h.get(&reviewer, "/v1/inbox").await.json()["runs"].clone();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["run_id"], run_id.as_str());
    let card = h.get(&reviewer, &format!("/v1/runs/{run_id}/card")).await;
    assert_eq!(card.status, 200, "{}", card.text());

    let other = h.token("other-reviewer").await;
    assert_eq!(h.get(&other, "/v1/inbox").await.json()["runs"], json!([]));
    h.get(&other, &format!("/v1/runs/{run_id}/card"))
        .await
        .problem(404, "not_found");
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_inbox_lists_the_runs_a_caller_may_decide_on_one_page_at_a_time(pool: PgPool) {
    let h = harness(pool).await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(h.suspended_run().await.to_string());
    }
    let admin = h.token("admin").await;

    let first = h.get(&admin, "/v1/inbox?limit=2").await;
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["runs"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = h
        .get(&admin, &format!("/v1/inbox?limit=2&cursor={cursor}"))
        .await
        .json();
    assert_eq!(second["runs"].as_array().unwrap().len(), 1);
    assert!(second.get("next_cursor").is_none(), "the last page");
    let mut listed: Vec<String> = first["runs"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["runs"].as_array().unwrap())
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    runs.sort();
    assert_eq!(listed, runs, "every waiting run, each once");
    let entry = &first["runs"][0];
    assert_eq!(entry["suspension_seq"], 1);
    assert_eq!(entry["turn_digest"].as_str().unwrap().len(), 64);
    assert_eq!(
        entry["pending_tools"],
        json!(["update_page_metadata", "attach_file_to_content_element"])
    );

    // The runs' own user sees them; a user who may decide on none sees none.
    let editor = h.token("editor").await;
    assert_eq!(
        h.get(&editor, "/v1/inbox").await.json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let restricted = h.token("restricted").await;
    assert_eq!(
        h.get(&restricted, "/v1/inbox").await.json()["runs"],
        json!([])
    );

    h.get(&admin, "/v1/inbox?limit=0")
        .await
        .problem(400, "invalid_query");
    h.get(&admin, "/v1/inbox?cursor=garbage")
        .await
        .problem(400, "invalid_query");
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_card_shows_its_previews_to_a_reader_and_withholds_them_from_an_approver_without_rights(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    let path = format!("/v1/runs/{run_id}/card");

    let admin = h.get(&h.token("admin").await, &path).await;
    assert_eq!(admin.status, 200, "{}", admin.text());
    let card = admin.json();
    assert_eq!(card["suspension_seq"], 1);
    assert_eq!(card["turn_digest"].as_str().unwrap().len(), 64);
    assert_eq!(card["viewer"], "admin");
    assert_eq!(
        card["caption"],
        "Captured when the run paused — the target may have changed since."
    );
    assert_eq!(preview_kinds(&card), ["shown", "shown"]);
    let lines = card["calls"][1]["preview"]["lines"].to_string();
    assert!(
        lines.contains("field image: 2 reference(s) → 3, appended last"),
        "{lines}"
    );
    assert!(
        card["calls"][0]["preview"]["lines"]
            .to_string()
            .contains("for</b> every road"),
        "a preview is data, passed on as it is: {card}"
    );
    assert!(card.get("moved_notice").is_none());

    // `approver` holds agent_approve but may not read page 12 or its teaser.
    let approver = h.get(&h.token("approver").await, &path).await.json();
    assert_eq!(preview_kinds(&approver), ["withheld", "withheld"]);
    assert_eq!(
        approver["calls"][0]["preview"]["notice"],
        "Preview withheld — you may not read the record this call would change."
    );
    assert!(!approver.to_string().contains("reference(s)"), "{approver}");

    h.get(&h.token("restricted").await, &path)
        .await
        .problem(404, "not_found");
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approval_of_the_current_card_is_accepted_and_a_replay_of_it_changes_nothing_more(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    let admin = h.token("admin").await;
    let card = h
        .get(&admin, &format!("/v1/runs/{run_id}/card"))
        .await
        .json();
    let path = format!("/v1/runs/{run_id}/decisions");

    let accepted = h
        .post(
            &admin,
            &path,
            &decision_on(&card, true),
            &[("idempotency-key", "approve-1")],
        )
        .await;
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let body = accepted.json();
    assert_eq!(body["outcome"], "accepted");
    assert_eq!(body["replayed"], false);
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.segment),
        (RunStatus::Queued, SegmentKind::Resume)
    );
    // Its `decision.accepted` is the resume's wake-up: once the relay has it confirmed, the run
    // is dispatched.
    assert!(h.relay_wake_ups().await.ends_with(&[run_id]));
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert!(
        run.dispatched_at.is_some(),
        "the resume wake-up was published and confirmed"
    );
    let row = h.row(run_id).await;

    let replay = h
        .post(
            &admin,
            &path,
            &decision_on(&card, true),
            &[("idempotency-key", "approve-1")],
        )
        .await;
    assert_eq!(replay.status, 202, "{}", replay.text());
    assert_eq!(replay.json()["replayed"], true);
    assert_eq!(replay.json()["decision_id"], body["decision_id"]);
    assert_eq!(h.row(run_id).await, row, "a replay changes nothing");

    // The worker resumes and writes what the card showed.
    assert!(matches!(
        h.claim_and_run(run_id).await,
        SegmentEnd::Completed(_)
    ));
    assert_eq!(h.count(TEASER_IMAGES).await, 3);
    let description: String =
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(description, DESCRIPTION);
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_on_a_card_the_run_moved_past_is_refused_stale_turn_409_and_changes_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    let admin = h.token("admin").await;
    let approver = h.token("approver").await;
    let card1 = h
        .get(&admin, &format!("/v1/runs/{run_id}/card"))
        .await
        .json();
    let path = format!("/v1/runs/{run_id}/decisions");

    // A colleague's edit moves the attach call's preview; the approval of card 1 bounces.
    h.colleague_attaches_an_image().await;
    assert_eq!(
        h.post(&admin, &path, &decision_on(&card1, true), &[])
            .await
            .status,
        202
    );
    assert_eq!(
        h.claim_and_run(run_id).await,
        SegmentEnd::Suspended {
            suspension_seq: 2,
            moved: 1
        }
    );
    assert_eq!(h.count(TEASER_IMAGES).await, 3, "nothing written");

    // A second approver's tab still shows card 1: refused, by approval and denial alike.
    let before = h.row(run_id).await;
    for approved in [true, false] {
        let stale = h
            .post(&approver, &path, &decision_on(&card1, approved), &[])
            .await;
        let problem = stale.problem(409, "stale_turn");
        assert_eq!(problem["run_id"], run_id.to_string());
        assert!(problem["decision_id"].is_string());
    }
    assert_eq!(h.row(run_id).await, before, "the run is untouched");

    // The current card shows the moved mark and the notice.
    let card2 = h
        .get(&admin, &format!("/v1/runs/{run_id}/card"))
        .await
        .json();
    assert_eq!(card2["suspension_seq"], 2);
    assert_eq!(card2["turn_digest"], card1["turn_digest"], "the same calls");
    assert_eq!(card2["calls"][1]["moved"], true);
    assert_eq!(card2["calls"][0]["moved"], false);
    assert!(card2["moved_notice"]
        .as_str()
        .unwrap()
        .contains("nothing was written"));
    assert!(card2["calls"][1]["preview"]["lines"]
        .to_string()
        .contains("3 reference(s) → 4"));
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn refusals_by_the_gates_are_mapped_to_403_409_and_422_and_change_nothing(pool: PgPool) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    let editor = h.token("editor").await;
    let restricted = h.token("restricted").await;
    let admin = h.token("admin").await;
    let card = h
        .get(&admin, &format!("/v1/runs/{run_id}/card"))
        .await
        .json();
    let path = format!("/v1/runs/{run_id}/decisions");
    let before = h.row(run_id).await;

    // Four-eyes: the run's own user may not approve it.
    h.post(&editor, &path, &decision_on(&card, true), &[])
        .await
        .problem(403, "self_approval_denied");
    // A user who may not see the run is told what a run that does not exist would tell.
    h.post(&restricted, &path, &decision_on(&card, true), &[])
        .await
        .problem(409, "not_awaiting_approval");
    // A body that names no card.
    let problem = h
        .post(&admin, &path, &json!({"approved": true}), &[])
        .await
        .problem(422, "malformed");
    assert_eq!(problem["reason"], "missing_field:suspension_seq");
    let problem = h
        .post(
            &admin,
            &path,
            &json!({"approved": true, "suspension_seq": 1, "turn_digest": "abc"}),
            &[],
        )
        .await
        .problem(422, "malformed");
    assert_eq!(problem["reason"], "invalid_field:turn_digest");
    let problem = h
        .post(
            &admin,
            &path,
            &json!({"approved": "yes", "suspension_seq": 1, "turn_digest": card["turn_digest"]}),
            &[],
        )
        .await
        .problem(422, "malformed");
    assert_eq!(problem["reason"], "invalid_field:approved");
    assert_eq!(h.row(run_id).await, before, "no refusal changed the run");

    // A token whose producer grant to assert its own user as approver was revoked.
    countersign_coordinator::producers::revoke(
        &h.pool,
        "http:admin",
        countersign_coordinator::ProducerKind::Approver,
        "admin",
    )
    .await
    .unwrap();
    h.post(&admin, &path, &decision_on(&card, true), &[])
        .await
        .problem(403, "unauthenticated_producer");
    assert_eq!(h.row(run_id).await, before);

    // Once the run is decided, it waits for nothing.
    let approver = h.token("approver").await;
    assert_eq!(
        h.post(&approver, &path, &decision_on(&card, false), &[])
            .await
            .status,
        202
    );
    h.post(&approver, &path, &decision_on(&card, false), &[])
        .await
        .problem(409, "not_awaiting_approval");
    h.get(&approver, &format!("/v1/runs/{run_id}/card"))
        .await
        .problem(409, "not_awaiting_approval");
    h.finish().await;
}
