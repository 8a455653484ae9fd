//! Run requests: created once, refused with nothing created.

use countersign_coordinator::producers::{self, ProducerKind};
use countersign_coordinator::{Dispatch, RequestOutcome, RequestVerdict, SegmentKind};
use countersign_store::RunStatus;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{bytes, harness, request, Harness, AGENT, INBOX, PORTAL};

async fn take(h: &Harness, body: &serde_json::Value, producer: Option<&str>) -> RequestVerdict {
    h.coordinator
        .take_run_request(&bytes(body), producer)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_run_request_creates_one_queued_run_and_asks_for_its_start_segment(pool: PgPool) {
    let h = harness(pool).await;
    let r = request("editor", AGENT);
    let v = take(&h, &r, Some(PORTAL)).await;

    assert_eq!(v.outcome, RequestOutcome::Accepted);
    assert!(v.created);
    let run_id = v.run_id.unwrap();
    assert_eq!(
        v.dispatch,
        Some(Dispatch {
            run_id,
            segment: SegmentKind::Start
        })
    );
    let event = v.event.as_ref().unwrap();
    assert_eq!(event.name, "run.accepted");
    assert_eq!(
        serde_json::Value::Object(event.fields.clone()),
        json!({"request_id": r["request_id"], "run_id": run_id})
    );
    assert_eq!(v.reply.as_ref(), Some(event));
    let reply = String::from_utf8(v.reply_body("2026-11-30T10:00:00Z").unwrap()).unwrap();
    assert!(
        !reply.contains("Improve page"),
        "the prompt never leaves: {reply}"
    );

    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.segment, countersign_store::SegmentKind::Start);
    assert_eq!(run.acting_user, "editor");
    assert_eq!(
        h.store.load_prompt(run_id).await.unwrap(),
        "Improve page 12."
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_duplicate_request_id_returns_the_same_run_and_dispatches_nothing(pool: PgPool) {
    let h = harness(pool).await;
    let r = request("editor", AGENT);
    let first = take(&h, &r, Some(PORTAL)).await;
    let row = h.row(first.run_id.unwrap()).await;

    let again = take(&h, &r, Some(PORTAL)).await;
    assert_eq!(again.outcome, RequestOutcome::Accepted);
    assert!(!again.created);
    assert_eq!(again.run_id, first.run_id);
    assert_eq!(again.dispatch, None);
    assert_eq!(again.event, first.event, "the first copy's event");
    assert_eq!(h.runs().await, 1);
    let announced = h.store.outbox(first.run_id.unwrap()).await.unwrap();
    assert_eq!(
        announced
            .iter()
            .map(|e| e.kind.as_str())
            .collect::<Vec<_>>(),
        ["run.accepted"],
        "announced once, with the run; the duplicate adds nothing to the outbox"
    );
    assert_eq!(announced[0].body["request_id"], r["request_id"]);
    assert_eq!(h.row(first.run_id.unwrap()).await, row);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_run_request_without_an_allowed_producer_is_refused_and_creates_nothing(pool: PgPool) {
    let h = harness(pool).await;
    // No broker user; a decision producer; and the portal, which may start runs as `editor`
    // and `admin` but not as `approver`.
    for (producer, acting_user) in [
        (None, "editor"),
        (Some(""), "editor"),
        (Some(INBOX), "editor"),
        (Some(PORTAL), "approver"),
    ] {
        let v = take(&h, &request(acting_user, AGENT), producer).await;
        assert_eq!(v.outcome, RequestOutcome::UnauthenticatedProducer);
        assert_eq!(v.outcome.code(), "unauthenticated_producer");
        assert!(!v.created);
        assert_eq!(v.run_id, None);
        assert_eq!(v.dispatch, None);
        assert_eq!(v.event, None, "not published on the events exchange");
        assert_eq!(v.reply, None, "and not answered");
        assert_eq!(v.dead_letter_reason(), None);
    }
    assert_eq!(h.runs().await, 0);
    assert!(h.announced_refusals().await.is_empty());
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_run_request_for_an_unknown_or_disabled_acting_user_is_refused_and_creates_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    countersign_coordinator::producers::allow(
        &h.pool,
        "scheduler",
        countersign_coordinator::ProducerKind::ActingUser,
        countersign_coordinator::producers::ANY,
    )
    .await
    .unwrap();
    sqlx::query("UPDATE content.users SET disabled = true WHERE name = 'restricted'")
        .execute(&h.pool)
        .await
        .unwrap();
    for acting_user in ["nobody", "restricted"] {
        let r = request(acting_user, AGENT);
        let v = take(&h, &r, Some("scheduler")).await;
        assert_eq!(v.outcome, RequestOutcome::UnknownActingUser);
        assert_eq!(v.dispatch, None);
        let event = v.event.as_ref().expect("published");
        assert_eq!(event.name, "run.refused");
        assert_eq!(
            serde_json::Value::Object(event.fields.clone()),
            json!({"request_id": r["request_id"], "outcome": "unknown_acting_user"})
        );
        assert_eq!(v.reply.as_ref(), Some(event), "the producer is answered");
    }
    assert_eq!(h.runs().await, 0);
    let announced = h.announced_refusals().await;
    assert_eq!(
        announced.len(),
        2,
        "each refusal is in the outbox: {announced:?}"
    );
    assert!(announced
        .iter()
        .all(|body| body["outcome"] == "unknown_acting_user" && body["event_id"].is_string()));
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_run_request_for_an_inactive_or_missing_agent_is_refused_and_creates_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    h.store.set_agent_active(AGENT, false).await.unwrap();
    let r = request("editor", AGENT);
    for body in [&r, &request("editor", "no-such-agent")] {
        let v = take(&h, body, Some(PORTAL)).await;
        assert_eq!(v.outcome, RequestOutcome::ConfigurationGone);
        assert_eq!(v.dispatch, None);
        assert_eq!(v.event.as_ref().unwrap().name, "run.refused");
        assert_eq!(
            v.event.as_ref().unwrap().fields["outcome"],
            "configuration_gone"
        );
    }
    assert_eq!(h.runs().await, 0);

    // The refusal created nothing, so the same request id goes through once the agent is back.
    h.store.set_agent_active(AGENT, true).await.unwrap();
    let v = take(&h, &r, Some(PORTAL)).await;
    assert_eq!(v.outcome, RequestOutcome::Accepted);
    assert!(v.created);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_malformed_run_request_is_dead_lettered_with_its_reason_even_from_nobody(pool: PgPool) {
    let h = harness(pool).await;
    let mut r = request("editor", AGENT);
    r["prompt"] = json!("   ");
    for producer in [Some(PORTAL), None] {
        let v = take(&h, &r, producer).await;
        assert_eq!(v.outcome, RequestOutcome::Malformed);
        assert_eq!(v.dead_letter_reason(), Some("invalid_field:prompt"));
        assert_eq!(v.request_id, None);
        assert_eq!(v.event, None);
        assert_eq!(v.dispatch, None);
        assert_eq!(v.reply, None, "a malformed message is not answered");
    }
    let v = h
        .coordinator
        .take_run_request(b"{not json", Some(PORTAL))
        .await
        .unwrap();
    assert_eq!(v.dead_letter_reason(), Some("not_a_json_object"));
    assert_eq!(h.runs().await, 0);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_request_for_an_unknown_user_from_a_producer_not_allowed_to_name_it_is_unauthenticated(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let v = take(&h, &request("nobody", AGENT), Some(PORTAL)).await;
    assert_eq!(
        v.outcome,
        RequestOutcome::UnauthenticatedProducer,
        "the producer learns nothing about which users exist"
    );
    assert_eq!(h.runs().await, 0);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_request_refused_by_two_gates_gets_the_first_gates_verdict(pool: PgPool) {
    let h = harness(pool).await;
    h.store.set_agent_active(AGENT, false).await.unwrap();
    // The portal may not name `approver`, and the agent is inactive: the grant comes first.
    let v = take(&h, &request("approver", AGENT), Some(PORTAL)).await;
    assert_eq!(v.outcome, RequestOutcome::UnauthenticatedProducer);
    assert_eq!(v.event, None);
    // A user the directory does not know, for an inactive agent: the directory comes first.
    let v = take(&h, &request("nobody-at-all", AGENT), Some(PORTAL)).await;
    assert_eq!(v.outcome, RequestOutcome::UnauthenticatedProducer);
    producers::allow(&h.pool, PORTAL, ProducerKind::ActingUser, "nobody-at-all")
        .await
        .unwrap();
    let v = take(&h, &request("nobody-at-all", AGENT), Some(PORTAL)).await;
    assert_eq!(v.outcome, RequestOutcome::UnknownActingUser);
    assert_eq!(h.runs().await, 0);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_duplicate_request_after_its_agent_was_deactivated_is_refused_and_its_run_kept(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let r = request("editor", AGENT);
    let first = take(&h, &r, Some(PORTAL)).await;
    assert_eq!(first.outcome, RequestOutcome::Accepted);
    h.store.set_agent_active(AGENT, false).await.unwrap();
    let again = take(&h, &r, Some(PORTAL)).await;
    assert_eq!(again.outcome, RequestOutcome::ConfigurationGone);
    assert_eq!(again.run_id, None);
    assert_eq!(h.runs().await, 1);
}
