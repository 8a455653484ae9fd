use std::sync::Arc;
use std::time::Duration;

use countersign_core::{
    CallIndex, ExecContext, Interruption, Principal, RunId, SuspendedRunState, SuspensionSeq,
};
use countersign_model::ScriptedModel;
use countersign_store::{RunStatus, Store, TerminationReason};
use countersign_worker::SegmentEnd;

use crate::support::{Harness, TTL};
use serde_json::json;
use sqlx::PgPool;

const NEW_DESCRIPTION: &str = "Bicycles for every road.";

const SCRIPT: &str = r#"{"turns": [
  {"tool_calls": [
    {"name": "update_page_metadata", "arguments": {"uid": 12, "description": "Bicycles for every road."}},
    {"name": "attach_file_to_content_element", "arguments": {"content_element": 5, "file": 13, "field": "image"}}
  ]},
  {"content": "Done."}
]}"#;

async fn harness(pool: PgPool) -> Harness {
    Harness::new(
        pool,
        SCRIPT,
        &["update_page_metadata", "attach_file_to_content_element"],
    )
    .await
}

impl Harness {
    async fn description(&self) -> String {
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }

    async fn teaser_images(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM content.file_references WHERE element = 5 AND field = 'image' AND NOT deleted",
        )
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approved_turn_writes_each_call_once_and_completes(pool: PgPool) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    assert_eq!(
        h.teaser_images().await,
        2,
        "nothing is written before the approval"
    );

    h.approve(run_id).await;
    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(end, SegmentEnd::Completed(TerminationReason::Completed));
    assert_eq!(h.description().await, NEW_DESCRIPTION);
    assert_eq!(h.teaser_images().await, 3);
    assert_eq!(h.tool_writes(run_id).await, 2);
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.termination_reason, Some(TerminationReason::Completed));
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_retry_that_finds_part_of_a_turn_journaled_reuses_it_and_writes_only_the_rest(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;

    // A first worker claims the resume, executes call 0 alone under its fence (as a turn with
    // an external call does, call by call), and dies.
    let first = h.store.claim(run_id, "w-dead", TTL).await.unwrap().unwrap();
    let token = first
        .lease
        .fence_token(SuspensionSeq::FIRST, CallIndex::new(0));
    let ctx = ExecContext {
        acting_user: Principal::new("editor", false),
        fence: Some(token),
        shown_preview: None,
        before: Vec::new(),
    };
    let out = h
        .runner
        .registry
        .get("update_page_metadata")
        .unwrap()
        .execute(&ctx, &json!({"uid": 12, "description": NEW_DESCRIPTION}))
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.content);

    // Its lease expires; the reaper requeues the resume and another worker takes it.
    sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(run_id.as_uuid())
        .execute(h.store.pool())
        .await
        .unwrap();
    let expired = h.store.expired_leases(10).await.unwrap();
    assert_eq!(expired.len(), 1);
    h.store
        .reap_expired(&expired[0], 3, Duration::ZERO)
        .await
        .unwrap();

    // Call 0's own write moved its preview; comparing the whole turn now would bounce it, so
    // the retry reuses call 0's result and compares only call 1, in its write transaction.
    let end = h.claim_and_run(run_id, "w3").await;
    assert_eq!(end, SegmentEnd::Completed(TerminationReason::Completed));
    assert_eq!(
        h.tool_writes(run_id).await,
        2,
        "one write per call, across both attempts"
    );
    assert_eq!(h.teaser_images().await, 3);
    assert_eq!(h.description().await, NEW_DESCRIPTION);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_segment_whose_lease_was_taken_over_writes_nothing(pool: PgPool) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;

    let zombie = h.store.claim(run_id, "w-slow", TTL).await.unwrap().unwrap();
    sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(run_id.as_uuid())
        .execute(h.store.pool())
        .await
        .unwrap();
    let expired = h.store.expired_leases(10).await.unwrap();
    h.store
        .reap_expired(&expired[0], 3, Duration::ZERO)
        .await
        .unwrap();
    let _successor = h.store.claim(run_id, "w-new", TTL).await.unwrap().unwrap();

    // The slow worker wakes up holding the old epoch.
    let end = h.runner.run(&zombie).await.unwrap();
    assert_eq!(end, SegmentEnd::Interrupted(Interruption::LeaseLost));
    assert_eq!(h.teaser_images().await, 2);
    assert_ne!(h.description().await, NEW_DESCRIPTION);
    assert_eq!(h.tool_writes(run_id).await, 0);
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(
        run.lease_owner.as_deref(),
        Some("w-new"),
        "the successor's lease is untouched"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_state_that_no_longer_opens_fails_the_run_with_state_unreadable(pool: PgPool) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;
    sqlx::query(
        "UPDATE runs SET state = set_byte(state, 80, get_byte(state, 80) # 1) WHERE id = $1",
    )
    .bind(run_id.as_uuid())
    .execute(h.store.pool())
    .await
    .unwrap();

    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(end, SegmentEnd::Failed(TerminationReason::StateUnreadable));
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error_code.as_deref(), Some("state_unreadable"));
    assert_eq!(h.teaser_images().await, 2);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_deactivated_configuration_fails_the_run_without_running_it(pool: PgPool) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;
    h.store.set_agent_active("seo", false).await.unwrap();

    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(end, SegmentEnd::Failed(TerminationReason::NotRetryable));
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.error_code.as_deref(), Some("configuration_gone"));
    assert_eq!(h.teaser_images().await, 2);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_agent_whose_model_settings_name_no_usable_model_fails_provider_failed(pool: PgPool) {
    let mut h = harness(pool).await;
    h.runner.models = countersign_worker::Models::PerAgent(Arc::new(
        countersign_model::ModelCatalog::new(|_| None),
    ));
    let mut agent = h.store.agent("seo").await.unwrap().unwrap().config;
    agent.model = json!({
        "provider": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "any",
        "api_key_env": "COUNTERSIGN_TEST_KEY_THAT_IS_NEVER_SET"
    });
    h.store.upsert_agent(&agent).await.unwrap();
    let run_id = h.new_run().await;

    let end = h.claim_and_run(run_id, "w1").await;
    assert_eq!(end, SegmentEnd::Failed(TerminationReason::ProviderFailed));
    let row = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(row.error_code.as_deref(), Some("missing_api_key"));
}

async fn journal_rows(store: &Store, run_id: RunId) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM run_journal WHERE run_id = $1")
        .bind(run_id.as_uuid())
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// A colleague's reference on element 5, as the CMS would add it.
async fn colleague_attaches(store: &Store) {
    sqlx::query(
        "INSERT INTO content.file_references (element, field, file, sorting) VALUES (5, 'image', 7, 999)",
    )
    .execute(store.pool())
    .await
    .unwrap();
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_approval_whose_preview_moved_writes_no_call_of_the_turn(pool: PgPool) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;
    colleague_attaches(&h.store).await;

    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(
        end,
        SegmentEnd::Suspended {
            suspension_seq: 2,
            moved: 1
        }
    );
    // Call 0's preview did not move, and it is not written either: the turn is one unit.
    assert_ne!(h.description().await, NEW_DESCRIPTION);
    assert_eq!(h.teaser_images().await, 3, "only the colleague's reference");
    assert_eq!(journal_rows(&h.store, run_id).await, 0);
    assert_eq!(h.tool_writes(run_id).await, 0);
    let state = SuspendedRunState::from_bytes(&h.store.load_state(run_id).await.unwrap()).unwrap();
    assert_eq!(state.stale_call_indexes, vec![CallIndex::new(1)]);
    assert!(state.call_previews[1]
        .lines
        .iter()
        .any(|l| l.contains("3 reference(s) → 4")));

    // The bounce is announced with the re-suspension: the moved calls, then the new card.
    let announced = h.store.outbox(run_id).await.unwrap();
    let tail: Vec<&str> = announced
        .iter()
        .rev()
        .take(2)
        .rev()
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(tail, ["run.preview_moved", "run.suspended"]);
    let moved = &announced[announced.len() - 2].body;
    assert_eq!(moved["stale_call_indexes"], json!([1]));
    assert_eq!(moved["tools"], json!(["attach_file_to_content_element"]));
    let card = &announced[announced.len() - 1].body;
    assert_eq!(card["suspension_seq"], 2);
    assert_eq!(card["stale_call_indexes"], json!([1]));
    assert_eq!(
        card["at"], moved["at"],
        "one transaction, one database instant"
    );
}

/// Makes the next `n` inserts into the content store's references fail as a serialization
/// failure would: an infrastructure error in the middle of an approved turn.
async fn fail_reference_inserts(store: &Store, n: i32) {
    for statement in [
        "CREATE TABLE IF NOT EXISTS public.fault_budget (n int NOT NULL)".to_owned(),
        "DELETE FROM public.fault_budget".to_owned(),
        format!("INSERT INTO public.fault_budget VALUES ({n})"),
        r#"CREATE OR REPLACE FUNCTION public.fault_reference_insert() RETURNS trigger AS $$
           BEGIN
             -- A failure that is counted in a table would roll its own count back; a sequence
             -- is not transactional, so it counts every attempt.
             IF nextval('public.fault_attempts') <= (SELECT n FROM public.fault_budget) THEN
               RAISE EXCEPTION 'injected' USING ERRCODE = '40001';
             END IF;
             RETURN NEW;
           END $$ LANGUAGE plpgsql"#
            .to_owned(),
        "CREATE SEQUENCE IF NOT EXISTS public.fault_attempts".to_owned(),
        "SELECT setval('public.fault_attempts', 1, false)".to_owned(),
        "DROP TRIGGER IF EXISTS fault ON content.file_references".to_owned(),
        "CREATE TRIGGER fault BEFORE INSERT ON content.file_references FOR EACH ROW EXECUTE FUNCTION public.fault_reference_insert()".to_owned(),
    ] {
        sqlx::query(&statement).execute(store.pool()).await.unwrap();
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_transient_store_error_inside_the_turn_rolls_it_back_and_the_retry_writes_it_once(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;
    // The first attempt writes call 0, then call 1 fails: call 0 must not survive it.
    fail_reference_inserts(&h.store, 1).await;

    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(end, SegmentEnd::Completed(TerminationReason::Completed));
    assert_eq!(h.description().await, NEW_DESCRIPTION);
    assert_eq!(h.teaser_images().await, 3);
    assert_eq!(h.tool_writes(run_id).await, 2, "one audit event per call");
    assert_eq!(journal_rows(&h.store, run_id).await, 2);
    for i in 0..2 {
        let result = h
            .store
            .journaled(run_id, SuspensionSeq::FIRST, CallIndex::new(i))
            .await
            .unwrap()
            .unwrap();
        assert!(!result.is_error, "call {i}: {}", result.content);
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_conflict_that_keeps_recurring_interrupts_the_turn_leaves_it_to_the_reaper_and_records_no_result(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;
    fail_reference_inserts(&h.store, 1_000).await;

    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(
        end,
        SegmentEnd::Interrupted(Interruption::Unavailable("database_conflict"))
    );
    assert_ne!(h.description().await, NEW_DESCRIPTION, "call 0 rolled back");
    assert_eq!(h.teaser_images().await, 2);
    assert_eq!(
        journal_rows(&h.store, run_id).await,
        0,
        "no error journaled as a result"
    );
    assert_eq!(h.tool_writes(run_id).await, 0);
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(
        run.status,
        RunStatus::Running,
        "left for the reaper to retry"
    );
}

/// A script whose one write turn sets page 12's description.
const DESCRIBE: &str = r#"{"turns": [
  {"tool_calls": [{"name": "update_page_metadata", "arguments": {"uid": 12, "description": "Bicycles for every road."}}]},
  {"content": "Done."}
]}"#;

/// A column every page read selects, renamed: what a schema migrated under a running
/// installation does to its queries — a persistent error, the same on every retry.
async fn break_page_reads(store: &Store) {
    sqlx::raw_sql("ALTER TABLE content.pages RENAME COLUMN keywords TO keywords_moved")
        .execute(store.pool())
        .await
        .unwrap();
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_persistent_sql_error_in_a_preview_is_a_failed_line_naming_its_class_and_the_run_still_suspends(
    pool: PgPool,
) {
    let h = Harness::new(pool, DESCRIBE, &["update_page_metadata"]).await;
    break_page_reads(&h.store).await;
    let run_id = h.suspended_run().await;
    let card = h.state(run_id).await;
    assert!(card.call_previews[0].failed);
    assert_eq!(
        card.call_previews[0].lines,
        vec![countersign_core::preview::failed_at_suspend_line(
            "database_schema_mismatch"
        )]
    );
    let row = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::WaitingForApproval);
    assert_eq!(
        row.requeue_count, 0,
        "never retried as if it were transient"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_persistent_sql_error_when_the_turn_is_planned_again_refuses_it_and_writes_nothing(
    pool: PgPool,
) {
    let h = Harness::new(pool, DESCRIBE, &["update_page_metadata"]).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;
    break_page_reads(&h.store).await;

    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(
        end,
        SegmentEnd::Suspended {
            suspension_seq: 2,
            moved: 1
        }
    );
    let card = h.state(run_id).await;
    assert_eq!(card.stale_call_indexes, vec![CallIndex::new(0)]);
    assert_eq!(
        card.call_previews[0].lines,
        vec![countersign_core::preview::failed_at_resume_line(
            "database_schema_mismatch"
        )]
    );
    assert_eq!(h.tool_writes(run_id).await, 0);
    assert_eq!(journal_rows(&h.store, run_id).await, 0);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_persistent_sql_error_in_a_write_fails_the_run_with_its_code_and_keeps_nothing(
    pool: PgPool,
) {
    let h = Harness::new(pool, DESCRIBE, &["update_page_metadata"]).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;
    // A site's own rule refuses the write itself; the plan and its preview are fine.
    sqlx::raw_sql(
        r#"CREATE FUNCTION public.refuse_page_writes() RETURNS trigger AS $$
           BEGIN RAISE EXCEPTION 'pages are frozen'; END $$ LANGUAGE plpgsql;
           CREATE TRIGGER frozen BEFORE UPDATE ON content.pages
               FOR EACH ROW EXECUTE FUNCTION public.refuse_page_writes();"#,
    )
    .execute(h.store.pool())
    .await
    .unwrap();

    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(end, SegmentEnd::Failed(TerminationReason::NotRetryable));
    let row = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(row.error_code.as_deref(), Some("database_refused"));
    assert_eq!(row.requeue_count, 0);
    assert_eq!(journal_rows(&h.store, run_id).await, 0);
    assert_eq!(h.tool_writes(run_id).await, 0);
}

/// `notify {message}`: a non-idempotent write that acts outside the store, like a webhook.
/// It records the run's `pending_effect` as it sees it while it runs, and its fence token.
#[derive(Debug)]
struct Notify {
    spec: countersign_core::ToolSpec,
    pool: PgPool,
    seen: std::sync::Mutex<Vec<(Option<String>, String)>>,
    hang: bool,
    started: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl countersign_core::Tool for Notify {
    fn spec(&self) -> &countersign_core::ToolSpec {
        &self.spec
    }

    async fn execute(
        &self,
        ctx: &ExecContext,
        _args: &serde_json::Value,
    ) -> Result<countersign_core::ToolOutput, countersign_core::ToolError> {
        let token = ctx
            .fence
            .clone()
            .expect("an external write gets its fence token");
        let stamp: Option<String> =
            sqlx::query_scalar("SELECT pending_effect FROM runs WHERE id = $1")
                .bind(token.run_id.as_uuid())
                .fetch_one(&self.pool)
                .await
                .unwrap();
        self.seen
            .lock()
            .unwrap()
            .push((stamp, token.idempotency_key()));
        self.started.notify_one();
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok(countersign_core::ToolOutput::ok("sent"))
    }
}

const NOTIFY_SCRIPT: &str = r#"{"turns": [
  {"tool_calls": [{"name": "notify", "arguments": {"message": "Page 12 is ready."}}]},
  {"content": "Done."}
]}"#;

async fn external_harness(pool: PgPool, hang: bool) -> (Harness, Arc<Notify>) {
    let mut h = harness(pool.clone()).await;
    let notify = Arc::new(Notify {
        spec: countersign_core::ToolSpec {
            name: "notify".into(),
            description: "Sends a message.".into(),
            parameters: json!({"type": "object"}),
            group: "editing".into(),
            data_class: countersign_core::DataClass::EditorContent,
            effect: countersign_core::Effect::NonIdempotentWrite,
            enabled_by_default: false,
            requires_admin: false,
        },
        pool: pool.clone(),
        seen: Default::default(),
        hang,
        started: Default::default(),
    });
    let mut registry = (*h.runner.registry).clone();
    registry.register(notify.clone());
    h.runner.registry = Arc::new(registry);
    h.runner.models = countersign_worker::Models::Fixed(Arc::new(
        ScriptedModel::from_json(NOTIFY_SCRIPT).unwrap(),
    ));
    let mut agent = h.store.agent("seo").await.unwrap().unwrap().config;
    agent.policy.enabled_tools.push("notify".into());
    h.store.upsert_agent(&agent).await.unwrap();
    (h, notify)
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_external_write_is_stamped_before_it_runs_and_the_stamp_clears_with_its_journal_row(
    pool: PgPool,
) {
    let (h, notify) = external_harness(pool, false).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;

    let end = h.claim_and_run(run_id, "w2").await;
    assert_eq!(end, SegmentEnd::Completed(TerminationReason::Completed));
    let seen = notify.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(
            Some("non_idempotent_write".to_owned()),
            format!("{run_id}:1:0")
        )]
    );
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.pending_effect, None);
    assert_eq!(journal_rows(&h.store, run_id).await, 1);
    assert_eq!(
        h.tool_writes(run_id).await,
        1,
        "the external write is audited with its journal row"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_run_that_dies_during_a_non_idempotent_write_its_tool_cannot_resolve_fails_outcome_unknown(
    pool: PgPool,
) {
    let (h, notify) = external_harness(pool, true).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;

    let claim = h.store.claim(run_id, "w-dies", TTL).await.unwrap().unwrap();
    let runner = h.runner.clone();
    let segment = tokio::spawn(async move { runner.run(&claim).await });
    notify.started.notified().await;
    segment.abort(); // the worker dies during the effect

    sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(run_id.as_uuid())
        .execute(h.store.pool())
        .await
        .unwrap();
    let expired = h.store.expired_leases(10).await.unwrap();
    assert_eq!(
        h.store
            .reap_expired(&expired[0], 3, Duration::ZERO)
            .await
            .unwrap(),
        countersign_store::ReapOutcome::Requeued,
        "the next segment asks what became of the call"
    );
    // `notify` cannot be asked about a key: the write may have landed, and nobody can say.
    let end = h.claim_and_run(run_id, "w3").await;
    assert_eq!(end, SegmentEnd::Failed(TerminationReason::OutcomeUnknown));
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        run.termination_reason,
        Some(TerminationReason::OutcomeUnknown)
    );
    assert_eq!(notify.seen.lock().unwrap().len(), 1, "never sent twice");
    assert_eq!(
        journal_rows(&h.store, run_id).await,
        0,
        "no result was made up"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_segment_released_at_shutdown_is_requeued_without_spending_its_retry_budget(
    pool: PgPool,
) {
    let (h, notify) = external_harness(pool, false).await;
    let run_id = h.new_run().await;
    let claim = h
        .store
        .claim(run_id, "w-stopping", TTL)
        .await
        .unwrap()
        .unwrap();
    let end = h
        .runner
        .run_until(&claim, std::future::ready(()))
        .await
        .unwrap();
    assert_eq!(end, SegmentEnd::Released);
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.requeue_count, 0);
    assert!(notify.seen.lock().unwrap().is_empty());
}

/// A model that never answers, like a provider that hangs.
#[derive(Debug)]
struct Hanging;

#[async_trait::async_trait]
impl countersign_core::Model for Hanging {
    async fn complete(
        &self,
        _request: countersign_core::ModelRequest<'_>,
    ) -> Result<countersign_core::ModelResponse, countersign_core::ModelError> {
        std::future::pending().await
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_lost_lease_cancels_the_model_call_in_flight(pool: PgPool) {
    let mut h = harness(pool).await;
    h.runner.models = countersign_worker::Models::Fixed(Arc::new(Hanging));
    h.runner.lease_ttl = Duration::from_secs(3);
    let run_id = h.new_run().await;
    let claim = h
        .store
        .claim(run_id, "w-slow", h.runner.lease_ttl)
        .await
        .unwrap()
        .unwrap();
    let runner = h.runner.clone();
    let segment = tokio::spawn(async move { runner.run(&claim).await });

    // Another worker takes the run over; the next heartbeat finds the lease gone.
    sqlx::query(
        "UPDATE runs SET lease_owner = 'w-other', lease_epoch = lease_epoch + 1 WHERE id = $1",
    )
    .bind(run_id.as_uuid())
    .execute(h.store.pool())
    .await
    .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(20), segment)
        .await
        .expect("the segment stops instead of waiting for the model")
        .unwrap()
        .unwrap();
    assert_eq!(end, SegmentEnd::Interrupted(Interruption::LeaseLost));
}
