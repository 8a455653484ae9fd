use countersign_core::{DecisionMessage, RunId, SuspendedRunState, SuspensionSeq};
use countersign_store::{
    DecisionOutcome, DecisionRecord, NewDecision, RunEvent, RunStatus, SegmentKind, Store,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::*;

fn decision(run: RunId, st: &SuspendedRunState, outcome: DecisionOutcome) -> NewDecision {
    NewDecision {
        message: DecisionMessage {
            decision_id: Uuid::now_v7(),
            run_id: run,
            suspension_seq: st.suspension_seq,
            turn_digest: st.turn_digest(),
            approved: false,
            calls: vec![],
            edits: vec![],
            approver: "alice".into(),
            comment: Some("Keep the old description.".into()),
        },
        outcome,
        in_trail: true,
    }
}

async fn decision_rows(pool: &PgPool, id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM run_decisions WHERE decision_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The run's audit events about decisions (its suspension and cancel have their own).
async fn decision_events(store: &Store, run: RunId) -> Vec<RunEvent> {
    let mut events = store.events(run).await.unwrap();
    events.retain(|e| e.kind.starts_with("decision."));
    events
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_accepted_decision_releases_the_turn_with_its_audit_event(pool: PgPool) {
    let store = store(pool.clone());
    let (run, st) = waiting(&store).await;
    let d = decision(run, &st, DecisionOutcome::Accepted);
    assert_eq!(
        store.record_decision(&d).await.unwrap(),
        DecisionRecord::Recorded(DecisionOutcome::Accepted)
    );

    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.segment),
        (RunStatus::Queued, SegmentKind::Resume)
    );
    assert_eq!(row.dispatched_at, None);
    let events = decision_events(&store, run).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "decision.accepted");
    assert_eq!(
        events[0].payload["decision_id"],
        d.message.decision_id.to_string()
    );
    assert_eq!(events[0].payload["outcome"], "accepted");
    assert!(
        !events[0].payload.to_string().contains("Keep the old"),
        "the comment is not in the payload"
    );

    let accepted = store
        .accepted_decision(run, SuspensionSeq::FIRST)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(accepted.decision_id, d.message.decision_id);
    assert!(!accepted.approved);
    assert_eq!(accepted.approver, "alice");
    assert_eq!(
        accepted.comment.as_deref(),
        Some("Keep the old description.")
    );
    let raw: Vec<u8> =
        sqlx::query_scalar("SELECT comment FROM run_decisions WHERE decision_id = $1")
            .bind(d.message.decision_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!raw.windows(8).any(|w| w == b"Keep the"));
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_decision_replay_returns_the_recorded_outcome(pool: PgPool) {
    let store = store(pool.clone());
    let (run, st) = waiting(&store).await;
    let d = decision(run, &st, DecisionOutcome::Accepted);
    store.record_decision(&d).await.unwrap();
    let after_first = store.run(run).await.unwrap().unwrap();

    assert_eq!(
        store.record_decision(&d).await.unwrap(),
        DecisionRecord::Replayed(DecisionOutcome::Accepted)
    );
    assert_eq!(
        store.decision_outcome(d.message.decision_id).await.unwrap(),
        Some(DecisionOutcome::Accepted)
    );
    assert_eq!(store.run(run).await.unwrap().unwrap(), after_first);
    assert_eq!(decision_rows(&pool, d.message.decision_id).await, 1);
    assert_eq!(decision_events(&store, run).await.len(), 1);

    // A refused decision is recorded too, and its replay — whatever the gates would say now —
    // returns the refusal.
    let (run, st) = waiting(&store).await;
    let refused = decision(run, &st, DecisionOutcome::StaleTurn);
    assert_eq!(
        store.record_decision(&refused).await.unwrap(),
        DecisionRecord::Recorded(DecisionOutcome::StaleTurn)
    );
    assert_eq!(
        store.run(run).await.unwrap().unwrap().status,
        RunStatus::WaitingForApproval
    );
    let replay = NewDecision {
        outcome: DecisionOutcome::Accepted,
        ..refused.clone()
    };
    assert_eq!(
        store.record_decision(&replay).await.unwrap(),
        DecisionRecord::Replayed(DecisionOutcome::StaleTurn)
    );
    assert_eq!(
        store.run(run).await.unwrap().unwrap().status,
        RunStatus::WaitingForApproval,
        "the replay released nothing"
    );
    let events = decision_events(&store, run).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "decision.refused");
    assert_eq!(events[0].payload["outcome"], "stale_turn");
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_decision_whose_transition_loses_leaves_no_decision_row(pool: PgPool) {
    let store = store(pool.clone());

    // The run was cancelled before the decision arrived.
    let (run, st) = waiting(&store).await;
    assert!(store.cancel(run).await.unwrap());
    let d = decision(run, &st, DecisionOutcome::Accepted);
    assert_eq!(
        store.record_decision(&d).await.unwrap(),
        DecisionRecord::TransitionLost
    );
    assert_eq!(decision_rows(&pool, d.message.decision_id).await, 0);
    assert!(decision_events(&store, run).await.is_empty());
    assert_eq!(
        store.decision_outcome(d.message.decision_id).await.unwrap(),
        None
    );

    // The decision names an older card than the one the run now waits on.
    let (run, st) = waiting(&store).await;
    let stale = NewDecision {
        message: DecisionMessage {
            suspension_seq: SuspensionSeq::FIRST.next(),
            ..decision(run, &st, DecisionOutcome::Accepted).message
        },
        ..decision(run, &st, DecisionOutcome::Accepted)
    };
    assert_eq!(
        store.record_decision(&stale).await.unwrap(),
        DecisionRecord::TransitionLost
    );
    assert_eq!(decision_rows(&pool, stale.message.decision_id).await, 0);
    assert_eq!(
        store.run(run).await.unwrap().unwrap().status,
        RunStatus::WaitingForApproval
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_refused_decision_naming_an_unknown_run_is_recorded_for_replay(pool: PgPool) {
    let store = store(pool.clone());
    let st = state(SuspensionSeq::FIRST);
    let d = decision(RunId::new(), &st, DecisionOutcome::NotAwaitingApproval);
    assert_eq!(
        store.record_decision(&d).await.unwrap(),
        DecisionRecord::Recorded(DecisionOutcome::NotAwaitingApproval)
    );
    assert_eq!(
        store.record_decision(&d).await.unwrap(),
        DecisionRecord::Replayed(DecisionOutcome::NotAwaitingApproval)
    );
    assert_eq!(decision_rows(&pool, d.message.decision_id).await, 1);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_decision_call_by_call_is_sealed_replays_only_as_itself_and_its_resume_opens_it(
    pool: PgPool,
) {
    use countersign_core::{CallIndex, CallVerdict};
    let store = store(pool.clone());
    let (run, st) = waiting(&store).await;
    let verdicts = vec![CallVerdict {
        index: CallIndex::new(0),
        approved: false,
        message: Some("Not this description.".into()),
    }];
    let mut d = crate::support::accept(run, &st);
    d.message.approved = false;
    d.message.calls = verdicts.clone();
    assert_eq!(
        store.record_decision(&d).await.unwrap(),
        DecisionRecord::Recorded(DecisionOutcome::Accepted)
    );
    let (kind, sealed): (String, Vec<u8>) =
        sqlx::query_as("SELECT kind, detail FROM run_decisions WHERE decision_id = $1")
            .bind(d.message.decision_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(kind, "calls");
    assert!(
        !String::from_utf8_lossy(&sealed).contains("Not this description"),
        "the words of a verdict are sealed"
    );
    let events = decision_events(&store, run).await;
    assert_eq!(events[0].payload["kind"], "calls");
    assert_eq!(events[0].payload["denied_calls"], serde_json::json!([0]));
    assert!(!events[0]
        .payload
        .to_string()
        .contains("Not this description"));

    // The same id with other verdicts is another decision.
    let mut other = d.clone();
    other.message.calls[0].message = Some("Something else.".into());
    assert_eq!(
        store.record_decision(&other).await.unwrap(),
        DecisionRecord::Conflict
    );
    assert_eq!(
        store.record_decision(&d).await.unwrap(),
        DecisionRecord::Replayed(DecisionOutcome::Accepted)
    );

    let claimed = claim(&store, run, "worker-b").await;
    let opened = store
        .open_decision(
            run,
            claimed
                .inputs
                .decision
                .as_ref()
                .expect("a resume carries its decision"),
        )
        .unwrap();
    assert_eq!(opened.calls, verdicts);
    assert!(!opened.approves(CallIndex::new(0)));
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_edit_resumes_with_its_editor_and_the_card_it_issues_names_its_editors(pool: PgPool) {
    use countersign_core::{ArgumentsEdit, CallIndex, EditRecord};
    let store = store(pool.clone());
    let (run, st) = waiting(&store).await;
    let mut d = crate::support::accept(run, &st);
    d.message.approved = false;
    d.message.edits = vec![ArgumentsEdit {
        index: CallIndex::new(0),
        tool: None,
        arguments: serde_json::json!({"uid": 12, "description": "Shorter"})
            .as_object()
            .unwrap()
            .clone(),
    }];
    assert_eq!(
        store.record_decision(&d).await.unwrap(),
        DecisionRecord::Recorded(DecisionOutcome::Accepted)
    );
    let claimed = claim(&store, run, "worker-b").await;
    let opened = store
        .open_decision(run, claimed.inputs.decision.as_ref().unwrap())
        .unwrap();
    assert_eq!(opened.edits.len(), 1);
    assert_eq!(opened.edits[0].editor, "alice");
    assert_eq!(opened.edits[0].arguments["description"], "Shorter");

    // The card issued anew names who edited it, for the gates to read.
    let mut next = state(SuspensionSeq::FIRST.next());
    next.edits = vec![EditRecord {
        index: CallIndex::new(0),
        tool: "update_page_metadata".into(),
        editor: "alice".into(),
        before: serde_json::json!({"uid": 12, "description": "New words"}),
        after: serde_json::json!({"uid": 12, "description": "Shorter"}),
    }];
    assert!(store.suspend(&claimed.lease, &next, &[]).await.unwrap());
    let editors: Vec<String> = sqlx::query_scalar("SELECT card_editors FROM runs WHERE id = $1")
        .bind(run.as_uuid())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(editors, vec!["alice"]);
}
