//! Decisions that pass every gate: what they change, what they dispatch, and a race between two.

use std::sync::Arc;

use countersign_coordinator::{
    DecisionCode, DecisionOutcome, DecisionVerdict, Dispatch, SegmentKind,
};
use countersign_store::{RunStatus, TerminationReason};
use countersign_worker::SegmentEnd;
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::Barrier;

use crate::support::{bytes, harness, Card, Harness, INBOX};

/// The comment's marker word holds letters no id, digest or timestamp can contain, so
/// finding it in a reply means the comment leaked, never that an id happened to match.
const MARKER: &str = "quokka";
const COMMENT: &str = "Fine by me, but mind the quokka ticket.";

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_accepted_approval_moves_the_run_to_its_resume_segment_with_one_decision_and_one_audit_event(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;
    let mut d = card.decision(true, "approver");
    d["comment"] = json!(COMMENT);

    let v = h.decide(&d, Some(INBOX)).await;
    assert_eq!(v.outcome, DecisionCode::Gated(DecisionOutcome::Accepted));
    assert!(!v.replayed);
    assert_eq!(v.run_id, Some(card.run_id));
    assert_eq!(
        v.dispatch,
        Some(Dispatch {
            run_id: card.run_id,
            segment: SegmentKind::Resume
        })
    );
    let event = v.event.as_ref().unwrap();
    assert_eq!(event.name, "decision.accepted");
    assert_eq!(
        serde_json::Value::Object(event.fields.clone()),
        json!({"decision_id": d["decision_id"], "run_id": d["run_id"], "outcome": "accepted"})
    );
    let reply = String::from_utf8(v.reply_body("2026-11-30T10:00:00Z").unwrap()).unwrap();
    assert!(!reply.contains(MARKER), "the comment never leaves: {reply}");
    assert!(reply.contains("\"event\":\"decision.accepted\""));

    let after = h.row(card.run_id).await;
    assert_eq!(after["status"], "queued");
    assert_eq!(after["segment"], "resume");
    assert_eq!(after["suspension_seq"], before["suspension_seq"]);
    assert_eq!(after["turn_digest"], before["turn_digest"]);
    assert_eq!(
        after["state"], before["state"],
        "the state stays for the resume"
    );
    assert_eq!(after["dispatched_at"], serde_json::Value::Null);
    assert_eq!(
        h.decisions(card.run_id).await,
        vec![(
            d["decision_id"].as_str().unwrap().parse().unwrap(),
            "accepted".to_string()
        )]
    );
    let events = h.decision_events(card.run_id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "decision.accepted");
    assert_eq!(events[0].1["approver"], "approver");
    assert_eq!(events[0].1["has_comment"], true);

    // The relay publishes the decision's event, which is the resume's wake-up: once the broker
    // confirmed it, the run is recorded as dispatched.
    let store = &h.coordinator.store;
    let handed = store.take_handed_off();
    let woken: Vec<_> = handed.iter().filter_map(|h| h.row.wakes()).collect();
    assert_eq!(woken.last(), Some(&card.run_id.as_uuid()), "{handed:?}");
    store.note_published(handed.iter().map(|h| &h.row));
    store.flush_marks().await.unwrap();
    assert_ne!(
        h.row(card.run_id).await["dispatched_at"],
        serde_json::Value::Null
    );

    // The worker resumes the turn and writes it, as the acting user.
    assert_eq!(
        h.claim_and_run(card.run_id, "w2").await,
        SegmentEnd::Completed(TerminationReason::Completed)
    );
    assert_eq!(h.teaser_images().await, 3);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_denial_is_accepted_and_resumes_the_run_so_the_model_is_told(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let d = card.decision(false, "approver");

    let v = h.decide(&d, Some(INBOX)).await;
    assert!(v.is_accepted(), "{:?}", v.outcome);
    assert_eq!(v.dispatch.map(|d| d.segment), Some(SegmentKind::Resume));
    assert_eq!(v.event.as_ref().unwrap().name, "decision.accepted");
    let run = h.store.run(card.run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.segment, countersign_store::SegmentKind::Resume);
    assert_eq!(h.decisions(card.run_id).await.len(), 1);

    // The model reads the denial as the calls' results and ends.
    assert_eq!(
        h.claim_and_run(card.run_id, "w2").await,
        SegmentEnd::Completed(TerminationReason::ApprovalDenied)
    );
    assert_eq!(h.teaser_images().await, 2, "nothing denied was written");
}

/// Two decisions on one card, released together by a barrier. When `hold` is set, the run row
/// is held locked until both have passed their gates and wait in the release itself, so the
/// loser must lose the guarded transition rather than an earlier read.
async fn race(h: &Harness, card: &Card, hold: bool) -> Vec<DecisionVerdict> {
    let lock = if hold {
        Some(h.lock_run(card.run_id).await)
    } else {
        None
    };
    let barrier = Arc::new(Barrier::new(2));
    let racers: Vec<_> = [(true, "admin"), (false, "approver")]
        .into_iter()
        .map(|(approved, approver)| {
            let coordinator = h.coordinator.clone();
            let barrier = barrier.clone();
            let body = bytes(&card.decision(approved, approver));
            tokio::spawn(async move {
                barrier.wait().await;
                coordinator.take_decision(&body, Some(INBOX)).await.unwrap()
            })
        })
        .collect();
    if let Some(lock) = lock {
        h.wait_for_lock_waiters(2).await;
        lock.rollback().await.unwrap();
    }
    let mut verdicts = Vec::new();
    for racer in racers {
        verdicts.push(racer.await.unwrap());
    }
    verdicts
}

/// Exactly one verdict released the turn; returns the loser.
async fn assert_released_once(
    h: &Harness,
    card: &Card,
    verdicts: &[DecisionVerdict],
) -> DecisionVerdict {
    let accepted = verdicts.iter().filter(|v| v.is_accepted()).count();
    assert_eq!(accepted, 1, "{verdicts:?}");
    let loser = verdicts.iter().find(|v| !v.is_accepted()).unwrap().clone();
    assert_eq!(loser.dispatch, None);
    assert_eq!(
        verdicts.iter().filter(|v| v.dispatch.is_some()).count(),
        1,
        "one resume segment"
    );

    let run = h.store.run(card.run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.segment, countersign_store::SegmentKind::Resume);
    let decisions = h.decisions(card.run_id).await;
    assert_eq!(decisions.iter().filter(|(_, o)| o == "accepted").count(), 1);
    assert_eq!(
        decisions.len(),
        2,
        "the loser is recorded too: {decisions:?}"
    );
    let accepted_events = h
        .decision_events(card.run_id)
        .await
        .into_iter()
        .filter(|(kind, _)| kind == "decision.accepted")
        .count();
    assert_eq!(accepted_events, 1);

    // The loser's replay agrees with what it was told.
    assert_eq!(
        h.store
            .decision_outcome(loser.decision_id.unwrap())
            .await
            .unwrap()
            .map(|o| o.as_str()),
        Some(loser.outcome.code())
    );
    loser
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn two_decisions_raced_on_one_card_release_it_exactly_once(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let verdicts = race(&h, &card, false).await;
    let loser = assert_released_once(&h, &card, &verdicts).await;
    assert!(
        matches!(loser.outcome.code(), "not_awaiting_approval" | "stale_turn"),
        "{:?}",
        loser.outcome
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn two_decisions_that_both_passed_their_gates_release_the_card_once(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let verdicts = race(&h, &card, true).await;
    let loser = assert_released_once(&h, &card, &verdicts).await;
    assert_eq!(
        loser.outcome,
        DecisionCode::Gated(DecisionOutcome::NotAwaitingApproval)
    );
    assert!(!loser.replayed);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approval_whose_run_was_cancelled_after_its_gates_is_not_awaiting_approval(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let mut lock = h.lock_run(card.run_id).await;
    let decider = {
        let coordinator = h.coordinator.clone();
        let body = bytes(&card.decision(true, "admin"));
        tokio::spawn(async move { coordinator.take_decision(&body, Some(INBOX)).await.unwrap() })
    };
    // The decision passed its gates and waits on the run; an operator cancels the run.
    h.wait_for_lock_waiters(1).await;
    sqlx::query(
        "UPDATE runs SET status = 'cancelled', termination_reason = 'cancelled', updated_at = now()
         WHERE id = $1",
    )
    .bind(card.run_id.as_uuid())
    .execute(&mut *lock)
    .await
    .unwrap();
    lock.commit().await.unwrap();
    let cancelled = h.row(card.run_id).await;

    let v = decider.await.unwrap();
    assert_eq!(
        v.outcome,
        DecisionCode::Gated(DecisionOutcome::NotAwaitingApproval)
    );
    assert_eq!(v.dispatch, None);
    assert_eq!(v.event.as_ref().unwrap().name, "decision.refused");
    assert_eq!(h.row(card.run_id).await, cancelled);
    assert_eq!(
        h.decisions(card.run_id).await,
        vec![(v.decision_id.unwrap(), "not_awaiting_approval".to_string())]
    );
}
