//! One test per decision gate, each proving its outcome and that the run row is exactly as it
//! was; then the order of the gates, where a message fails two of them.

use std::sync::Arc;

use async_trait::async_trait;
use countersign_coordinator::{Coordinator, DecisionCode, DecisionOutcome};
use countersign_core::{
    ExecContext, Tool, ToolError, ToolOutput, ToolPolicy, ToolRegistry, ToolSpec,
};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    agent, assert_refused, assert_unrecorded, bytes, harness, Harness, AGENT, DESK, INBOX, KIOSK,
    PORTAL, WRITERS,
};

// 1. schema

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_malformed_decision_is_dead_lettered_with_its_reason_and_records_nothing(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;
    let mut d = card.decision(true, "admin");
    d.as_object_mut().unwrap().remove("turn_digest");

    let v = h.decide(&d, Some(INBOX)).await;
    assert_unrecorded(&v, "malformed");
    assert_eq!(v.outcome, DecisionCode::Malformed);
    assert_eq!(v.dead_letter_reason(), Some("missing_field:turn_digest"));
    assert_eq!(v.reply, None, "a malformed message is not answered");
    assert_eq!(h.row(card.run_id).await, before);
    assert!(h.decisions(card.run_id).await.is_empty());
    assert!(h.decision_events(card.run_id).await.is_empty());
}

// 2. producer

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_without_a_broker_validated_user_is_unauthenticated_and_records_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;
    let d = card.decision(true, "admin");

    for producer in [None, Some("")] {
        let v = h.decide(&d, producer).await;
        assert_unrecorded(&v, "unauthenticated_producer");
        assert_eq!(v.dead_letter_reason(), None);
        assert_eq!(v.reply, None, "an unauthenticated producer is not answered");
    }
    assert_eq!(h.row(card.run_id).await, before);
    assert!(h.decisions(card.run_id).await.is_empty());
    assert!(h.decision_events(card.run_id).await.is_empty());
    assert!(h.announced_decisions(card.run_id).await.is_empty());

    // The decision id was not burnt: the real approver's copy still goes through.
    let v = h.decide(&d, Some(INBOX)).await;
    assert!(v.is_accepted());
    assert!(!v.replayed);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_producer_not_allowed_to_assert_the_approver_is_unauthenticated(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;

    // The kiosk may speak for `approver` only; the portal only starts runs.
    for (producer, approver) in [(KIOSK, "admin"), (PORTAL, "editor"), ("stranger", "admin")] {
        let v = h
            .decide(&card.decision(true, approver), Some(producer))
            .await;
        assert_unrecorded(&v, "unauthenticated_producer");
    }
    assert_eq!(h.row(card.run_id).await, before);
    assert!(h.decisions(card.run_id).await.is_empty());

    let v = h
        .decide(&card.decision(true, "approver"), Some(KIOSK))
        .await;
    assert!(v.is_accepted(), "{:?}", v.outcome);
}

// 3. replay

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_replayed_decision_returns_its_first_outcome_and_dispatches_nothing(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let d = card.decision(true, "approver");
    let first = h.decide(&d, Some(INBOX)).await;
    assert!(first.is_accepted());
    assert!(first.dispatch.is_some());
    let after_first = h.row(card.run_id).await;

    let again = h.decide(&d, Some(INBOX)).await;
    assert_eq!(
        again.outcome,
        DecisionCode::Gated(DecisionOutcome::Accepted)
    );
    assert!(again.replayed);
    assert_eq!(again.dispatch, None, "no second dispatch");
    assert_eq!(again.event, first.event, "the recorded event");
    assert_eq!(again.unannounced(), None, "already announced");
    assert_eq!(h.row(card.run_id).await, after_first);
    assert_eq!(h.decisions(card.run_id).await.len(), 1);
    assert_eq!(h.decision_events(card.run_id).await.len(), 1);
    assert_eq!(
        h.announced_decisions(card.run_id).await,
        ["decision.accepted"],
        "announced once, with the record; the replay adds nothing to the outbox"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_replayed_refusal_returns_the_recorded_refusal_although_the_facts_changed(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let d = card.decision(true, "restricted");
    assert_refused(&h.decide(&d, Some(DESK)).await, &d, "access_denied");

    // `restricted` is given the grant afterwards; the replay is still what was recorded.
    sqlx::query("UPDATE content.users SET grants = '{agent_approve}' WHERE name = 'restricted'")
        .execute(&h.pool)
        .await
        .unwrap();
    let before = h.row(card.run_id).await;
    let again = h.decide(&d, Some(DESK)).await;
    assert_refused(&again, &d, "access_denied");
    assert!(again.replayed);
    assert_eq!(h.row(card.run_id).await, before);
    assert_eq!(h.decisions(card.run_id).await.len(), 1);

    // A new decision by the same approver is gated on today's facts.
    assert!(h
        .decide(&card.decision(true, "restricted"), Some(DESK))
        .await
        .is_accepted());
}

// 4. run waiting

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_on_a_run_that_is_not_waiting_is_refused_and_leaves_it_as_it_was(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let queued = h.queued_run("editor").await;
    let before = h.row(queued).await;
    let d = json!({
        "type": "countersign.decision", "version": 1,
        "decision_id": Uuid::now_v7(), "run_id": queued, "suspension_seq": 1,
        "turn_digest": card.digest.as_str(), "approved": true, "approver": "admin",
    });

    let v = h.decide(&d, Some(INBOX)).await;
    assert_refused(&v, &d, "not_awaiting_approval");
    assert_eq!(v.run_id, Some(queued));
    assert_eq!(h.row(queued).await, before);
    assert_eq!(
        h.decisions(queued).await,
        vec![(
            d["decision_id"].as_str().unwrap().parse().unwrap(),
            "not_awaiting_approval".to_string()
        )]
    );
    assert_eq!(h.decision_events(queued).await.len(), 1);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_on_a_run_that_does_not_exist_is_not_awaiting_approval(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let mut d = card.decision(true, "admin");
    d["run_id"] = json!(countersign_core::RunId::new());
    let v = h.decide(&d, Some(INBOX)).await;
    assert_refused(&v, &d, "not_awaiting_approval");
    let again = h.decide(&d, Some(INBOX)).await;
    assert!(again.replayed, "recorded, so a replay agrees");
}

// 5. same turn, same card

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approval_naming_other_calls_is_a_stale_turn_and_leaves_the_run_as_it_was(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;
    let mut d = card.decision(true, "admin");
    d["turn_digest"] = json!("0".repeat(64));

    assert_refused(&h.decide(&d, Some(INBOX)).await, &d, "stale_turn");
    assert_eq!(h.row(card.run_id).await, before);
    assert_eq!(h.decisions(card.run_id).await.len(), 1);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_on_the_card_before_a_preview_moved_is_stale_although_the_calls_are_the_same(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let first = h.suspended_run("editor").await;
    assert!(h
        .decide(&first.decision(true, "approver"), Some(INBOX))
        .await
        .is_accepted());
    // Someone edits the page the card showed; the resume re-suspends with a new card.
    sqlx::query("UPDATE content.pages SET description = 'Edited by hand.' WHERE uid = 12")
        .execute(&h.pool)
        .await
        .unwrap();
    assert_eq!(
        h.claim_and_run(first.run_id, "w2").await,
        countersign_worker::SegmentEnd::Suspended {
            suspension_seq: 2,
            moved: 1
        }
    );
    let second = h.card(first.run_id).await;
    assert_eq!(second.digest, first.digest, "the calls did not change");
    let before = h.row(first.run_id).await;

    // A second approver's tab still shows card 1: approval and denial alike are stale.
    for approved in [true, false] {
        let d = first.decision(approved, "admin");
        assert_refused(&h.decide(&d, Some(INBOX)).await, &d, "stale_turn");
    }
    assert_eq!(h.row(first.run_id).await, before);

    assert!(h
        .decide(&second.decision(true, "admin"), Some(INBOX))
        .await
        .is_accepted());
}

// 6. approver's access

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approver_who_is_not_admin_granted_or_the_owner_is_access_denied(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;

    // `restricted` exists without the grant; `nobody` does not exist; `editor`'s account is
    // disabled for the second round although it owns the run.
    for approver in ["restricted", "nobody"] {
        let d = card.decision(true, approver);
        assert_refused(&h.decide(&d, Some(DESK)).await, &d, "access_denied");
    }
    sqlx::query("UPDATE content.users SET disabled = true WHERE name = 'editor'")
        .execute(&h.pool)
        .await
        .unwrap();
    let d = card.decision(false, "editor");
    assert_refused(&h.decide(&d, Some(DESK)).await, &d, "access_denied");

    assert_eq!(h.row(card.run_id).await, before);
    assert_eq!(h.decisions(card.run_id).await.len(), 3);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_runs_own_acting_user_may_decide_without_admin_or_grant(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    assert!(h
        .decide(&card.decision(true, "editor"), Some(INBOX))
        .await
        .is_accepted());
}

// 7. configuration

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_on_a_run_whose_configuration_is_inactive_or_gone_is_refused(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;

    h.store.set_agent_active(AGENT, false).await.unwrap();
    let d = card.decision(true, "admin");
    assert_refused(&h.decide(&d, Some(INBOX)).await, &d, "configuration_gone");

    h.store.delete_agent(AGENT).await.unwrap();
    let d = card.decision(false, "admin");
    assert_refused(&h.decide(&d, Some(INBOX)).await, &d, "configuration_gone");

    assert_eq!(h.row(card.run_id).await, before);
    assert_eq!(h.decisions(card.run_id).await.len(), 2);
}

// 8. four-eyes

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn under_four_eyes_the_initiator_may_not_approve_their_own_run(pool: PgPool) {
    let h = harness(pool).await;
    h.store.upsert_agent(&agent(true)).await.unwrap();
    let card = h.suspended_run("editor").await;
    let before = h.row(card.run_id).await;

    let d = card.decision(true, "editor");
    assert_refused(&h.decide(&d, Some(INBOX)).await, &d, "self_approval_denied");
    assert_eq!(h.row(card.run_id).await, before);

    assert!(
        h.decide(&card.decision(true, "approver"), Some(INBOX))
            .await
            .is_accepted(),
        "a second person may"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn under_four_eyes_an_admin_is_not_exempt_from_approving_their_own_run(pool: PgPool) {
    let h = harness(pool).await;
    h.store.upsert_agent(&agent(true)).await.unwrap();
    let card = h.suspended_run("admin").await;
    let before = h.row(card.run_id).await;

    let d = card.decision(true, "admin");
    assert_refused(&h.decide(&d, Some(INBOX)).await, &d, "self_approval_denied");
    assert_eq!(h.row(card.run_id).await, before);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn under_four_eyes_the_initiator_may_still_deny_their_own_run(pool: PgPool) {
    let h = harness(pool).await;
    h.store.upsert_agent(&agent(true)).await.unwrap();
    let card = h.suspended_run("editor").await;
    let v = h.decide(&card.decision(false, "editor"), Some(INBOX)).await;
    assert!(v.is_accepted(), "{:?}", v.outcome);
}

// 9. the approver's tool permissions

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approval_of_a_writer_the_agent_no_longer_enables_is_not_permitted(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let mut config = agent(false);
    config.policy.enabled_tools = vec![WRITERS[0].into()];
    h.store.upsert_agent(&config).await.unwrap();
    let before = h.row(card.run_id).await;

    let d = card.decision(true, "admin");
    assert_refused(
        &h.decide(&d, Some(INBOX)).await,
        &d,
        "approver_not_permitted",
    );
    assert_eq!(h.row(card.run_id).await, before);

    let v = h.decide(&card.decision(false, "admin"), Some(INBOX)).await;
    assert!(v.is_accepted(), "a denial releases nothing to execute");
}

/// A writer whose spec demands an admin, wrapping the content store's real one.
#[derive(Debug)]
struct AdminOnly {
    inner: Arc<dyn Tool>,
    spec: ToolSpec,
}

#[async_trait]
impl Tool for AdminOnly {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError> {
        self.inner.execute(ctx, args).await
    }
}

/// The coordinator of `h` with a registry built by `change` from the content store's tools.
fn coordinator_with(h: &Harness, change: impl FnOnce(&mut ToolRegistry)) -> Coordinator {
    let mut registry = ToolRegistry::new();
    countersign_content::register(&mut registry, &mut Default::default(), h.store.clone());
    change(&mut registry);
    Coordinator::with_users(
        h.store.clone(),
        Arc::new(registry),
        h.coordinator.users.clone(),
    )
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_admin_only_writer_may_be_released_by_an_admin_but_not_by_a_granted_approver(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let coordinator = coordinator_with(&h, |registry| {
        let inner = registry.get(WRITERS[1]).unwrap().clone();
        let spec = ToolSpec {
            requires_admin: true,
            ..inner.spec().clone()
        };
        registry.register(Arc::new(AdminOnly { inner, spec }));
    });
    let before = h.row(card.run_id).await;

    let d = card.decision(true, "approver");
    let v = coordinator
        .take_decision(&bytes(&d), Some(INBOX))
        .await
        .unwrap();
    assert_refused(&v, &d, "approver_not_permitted");
    assert_eq!(h.row(card.run_id).await, before);

    let v = coordinator
        .take_decision(&bytes(&card.decision(true, "admin")), Some(INBOX))
        .await
        .unwrap();
    assert!(v.is_accepted(), "{:?}", v.outcome);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_pending_tool_the_registry_does_not_know_is_released_by_nobody(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    // A coordinator whose registry lacks one of the pending writers.
    let mut registry = ToolRegistry::new();
    for tool in countersign_content::tools(h.store.clone()) {
        if tool.spec().name != WRITERS[0] {
            registry.register(tool);
        }
    }
    let coordinator = Coordinator::with_users(
        h.store.clone(),
        Arc::new(registry),
        h.coordinator.users.clone(),
    );
    let before = h.row(card.run_id).await;

    let d = card.decision(true, "admin");
    let v = coordinator
        .take_decision(&bytes(&d), Some(INBOX))
        .await
        .unwrap();
    assert_refused(&v, &d, "approver_not_permitted");
    assert_eq!(h.row(card.run_id).await, before);
}

// 10. the transaction

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approval_that_cannot_be_recorded_is_not_auditable_and_the_run_stays_waiting(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    sqlx::raw_sql(
        r#"CREATE FUNCTION refuse_decisions() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'decision log unavailable'; END $$;
           CREATE TRIGGER refuse_decisions BEFORE INSERT ON run_decisions
               FOR EACH ROW EXECUTE FUNCTION refuse_decisions();"#,
    )
    .execute(&h.pool)
    .await
    .unwrap();
    let before = h.row(card.run_id).await;

    let d = card.decision(true, "admin");
    let v = h.decide(&d, Some(INBOX)).await;
    assert_refused(&v, &d, "not_auditable");
    assert_eq!(
        h.row(card.run_id).await,
        before,
        "the released transition rolled back with the record"
    );
    assert!(h.decisions(card.run_id).await.is_empty());
    assert!(h.decision_events(card.run_id).await.is_empty());

    // Not recorded, so the redelivery is gated afresh once the log is back.
    sqlx::query("DROP TRIGGER refuse_decisions ON run_decisions")
        .execute(&h.pool)
        .await
        .unwrap();
    let again = h.decide(&d, Some(INBOX)).await;
    assert!(again.is_accepted());
    assert!(!again.replayed);
}

// The order of the gates.

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_malformed_decision_from_an_unauthenticated_producer_is_malformed(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let mut d = card.decision(true, "admin");
    d["approved"] = json!("yes");
    let v = h.decide(&d, None).await;
    assert_eq!(v.dead_letter_reason(), Some("invalid_field:approved"));
    assert_unrecorded(&v, "malformed");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_unauthenticated_replay_of_a_recorded_decision_learns_nothing(pool: PgPool) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let d = card.decision(true, "admin");
    assert!(h.decide(&d, Some(INBOX)).await.is_accepted());
    let v = h.decide(&d, Some("stranger")).await;
    assert_unrecorded(&v, "unauthenticated_producer");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_second_decision_on_a_released_card_is_not_awaiting_approval_rather_than_stale(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    assert!(h
        .decide(&card.decision(true, "admin"), Some(INBOX))
        .await
        .is_accepted());
    let before = h.row(card.run_id).await;
    let mut d = card.decision(true, "admin");
    d["suspension_seq"] = json!(7);
    assert_refused(
        &h.decide(&d, Some(INBOX)).await,
        &d,
        "not_awaiting_approval",
    );
    assert_eq!(h.row(card.run_id).await, before);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_stale_decision_by_someone_without_access_on_a_run_the_producer_follows_is_stale(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    let mut d = card.decision(true, "restricted");
    d["turn_digest"] = json!("f".repeat(64));
    assert_refused(&h.decide(&d, Some(DESK)).await, &d, "stale_turn");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_without_access_on_a_gone_configuration_the_producer_follows_is_access_denied(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let card = h.suspended_run("editor").await;
    h.store.delete_agent(AGENT).await.unwrap();
    let d = card.decision(true, "restricted");
    assert_refused(&h.decide(&d, Some(DESK)).await, &d, "access_denied");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_self_approval_on_an_inactive_four_eyes_configuration_is_configuration_gone(
    pool: PgPool,
) {
    let h = harness(pool).await;
    h.store.upsert_agent(&agent(true)).await.unwrap();
    let card = h.suspended_run("editor").await;
    h.store.set_agent_active(AGENT, false).await.unwrap();
    let d = card.decision(true, "editor");
    assert_refused(&h.decide(&d, Some(INBOX)).await, &d, "configuration_gone");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_self_approval_of_a_writer_no_longer_enabled_is_self_approval_denied(pool: PgPool) {
    let h = harness(pool).await;
    let mut config = agent(true);
    h.store.upsert_agent(&config).await.unwrap();
    let card = h.suspended_run("editor").await;
    config.policy = ToolPolicy::default();
    h.store.upsert_agent(&config).await.unwrap();
    let d = card.decision(true, "editor");
    assert_refused(&h.decide(&d, Some(INBOX)).await, &d, "self_approval_denied");
}
