use countersign_core::{
    CallIndex, DecisionMessage, Effect, SuspendedRunState, SuspensionSeq, ToolOutput,
};
use countersign_store::{
    DecisionOutcome, DecisionRecord, NewDecision, NewEvent, Store, StoreError,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::*;

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn state_sealed_for_one_run_does_not_open_as_another_s(pool: PgPool) {
    let store = store(pool.clone());
    let (a, _) = waiting(&store).await;
    let (b, _) = waiting(&store).await;
    sqlx::query("UPDATE runs SET state = (SELECT state FROM runs WHERE id = $1) WHERE id = $2")
        .bind(a.as_uuid())
        .bind(b.as_uuid())
        .execute(&pool)
        .await
        .unwrap();

    let err = store.load_state(b).await.unwrap_err();
    assert!(matches!(err, StoreError::Crypto(_)));
    assert_eq!(err.code(), "state_unreadable");
    assert!(
        store.load_state(a).await.is_ok(),
        "the original still opens"
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_state_under_a_key_the_keyring_lacks_is_state_unreadable(pool: PgPool) {
    let store = store(pool.clone());
    let (run, _) = waiting(&store).await;
    let stranger = Store::new(pool, keyring(&key_entry("k1")));
    let err = stranger.load_state(run).await.unwrap_err();
    assert_eq!(err.code(), "state_unreadable");

    let (never_suspended, _) = running(&store).await;
    let err = store.load_state(never_suspended).await.unwrap_err();
    assert!(matches!(err, StoreError::NoState(id) if id == never_suspended));
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn rotation_then_retiring_the_old_key_still_opens_everything(pool: PgPool) {
    let old_entry = key_entry("k1");
    let new_entry = key_entry("k2");
    let before = Store::new(pool.clone(), keyring(&old_entry));

    // Something in every sealed column, for three runs, so batches of two span them.
    let mut runs = Vec::new();
    for i in 0..3 {
        let run = before
            .create_run(&new_run(&format!("prompt {i}")))
            .await
            .unwrap()
            .run_id;
        let lease = claim(&before, run, "worker-a").await.lease;
        let event = NewEvent {
            content: Some(b"sealed event content"),
            ..NewEvent::new("tool_read", serde_json::json!({}))
        };
        before.append_event(run, &event).await.unwrap();
        before
            .record_effect(
                &lease,
                SuspensionSeq::FIRST,
                CallIndex::new(0),
                "notify",
                Effect::IdempotentWrite,
                &ToolOutput::ok(format!("journal {i}")),
            )
            .await
            .unwrap();
        let st = state(SuspensionSeq::FIRST);
        assert!(before.suspend(&lease, &st, &[]).await.unwrap());
        let decision = NewDecision {
            message: DecisionMessage {
                decision_id: Uuid::now_v7(),
                run_id: run,
                suspension_seq: SuspensionSeq::FIRST,
                turn_digest: st.turn_digest(),
                approved: true,
                // One decision call by call: its verdicts are sealed too.
                calls: verdicts(i),
                edits: vec![],
                approver: "alice".into(),
                comment: Some(format!("comment {i}")),
            },
            outcome: DecisionOutcome::Accepted,
            in_trail: true,
        };
        assert_eq!(
            before.record_decision(&decision).await.unwrap(),
            DecisionRecord::Recorded(DecisionOutcome::Accepted)
        );
        runs.push((run, st));
    }

    before
        .add_webhook(
            "https://hooks.example/a",
            &["run.suspended".to_owned()],
            None,
            "whsec_c2VjcmV0",
        )
        .await
        .unwrap();

    let rotating = Store::new(pool.clone(), keyring(&format!("{new_entry},{old_entry}")));
    let report = rotating.rotate_keys(2).await.unwrap();
    let by_column: Vec<(&str, u64, u64)> = report
        .columns
        .iter()
        .map(|c| (c.column, c.examined, c.resealed))
        .collect();
    assert_eq!(
        by_column,
        vec![
            ("runs.state", 3, 3),
            ("runs.request", 3, 3),
            // per run: the sealed read event and the audit event of the journaled write (the
            // decision event has no content)
            ("run_events.sealed", 6, 6),
            ("run_decisions.comment", 3, 3),
            ("run_decisions.detail", 1, 1),
            ("run_journal.result", 3, 3),
            ("webhook_endpoints.secret", 1, 1),
        ]
    );
    assert_eq!(report.unreadable(), 0);
    assert!(report.batches >= 10, "two batches per column at least");
    let again = rotating.rotate_keys(2).await.unwrap();
    assert_eq!(
        again.resealed(),
        0,
        "a second rotation has nothing left to do"
    );

    let after = Store::new(pool.clone(), keyring(&new_entry));
    for (i, (run, st)) in runs.iter().enumerate() {
        let state = SuspendedRunState::from_bytes(&after.load_state(*run).await.unwrap()).unwrap();
        assert_eq!(&state, st);
        assert_eq!(
            after.load_prompt(*run).await.unwrap(),
            format!("prompt {i}")
        );
        let events = after.events(*run).await.unwrap();
        let content = after.open_event_content(*run, &events[0]).unwrap().unwrap();
        assert_eq!(content, b"sealed event content");
        let decision = after
            .accepted_decision(*run, SuspensionSeq::FIRST)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(decision.comment, Some(format!("comment {i}")));
        assert_eq!(decision.calls, verdicts(i));
        assert_eq!(
            after
                .journaled(*run, SuspensionSeq::FIRST, CallIndex::new(0))
                .await
                .unwrap(),
            Some(ToolOutput::ok(format!("journal {i}")))
        );
    }
    // The endpoint's secret signs its deliveries under the new key alone.
    let event = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO event_outbox (id, kind, body) \
         VALUES ($1, 'run.suspended', jsonb_build_object('event_id', $1::text, 'event', 'run.suspended'))",
    )
    .bind(event)
    .execute(&pool)
    .await
    .unwrap();
    let due = after
        .claim_webhook_deliveries(10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].event_id, event);
    assert_eq!(
        secrecy::ExposeSecret::expose_secret(&due[0].secret),
        "whsec_c2VjcmV0"
    );
    // And the retired key alone no longer opens anything.
    let retired = Store::new(pool, keyring(&old_entry));
    let err = retired.load_state(runs[0].0).await.unwrap_err();
    assert_eq!(err.code(), "state_unreadable");
}

/// The verdicts of the `i`th decision: call by call for the second, none for the others.
fn verdicts(i: usize) -> Vec<countersign_core::CallVerdict> {
    if i != 1 {
        return vec![];
    }
    vec![countersign_core::CallVerdict {
        index: CallIndex::new(0),
        approved: true,
        message: None,
    }]
}
