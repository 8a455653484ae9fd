use std::sync::Arc;
use std::time::Duration;

use countersign_content::{seed_demo_site, ContentUsers};
use countersign_core::{
    CallIndex, ExecContext, Principal, RunId, SuspendedRunState, SuspensionSeq, ToolPolicy,
    ToolRegistry,
};
use countersign_crypto::Keyring;
use countersign_model::ScriptedModel;
use countersign_store::{
    AgentConfig, DecisionOutcome, DecisionRecord, NewDecision, NewRun, RunStatus, Store,
    TerminationReason,
};
use countersign_worker::{SegmentEnd, SegmentRunner};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const KEYS: &str = "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
const TTL: Duration = Duration::from_secs(30);
const NEW_DESCRIPTION: &str = "Bicycles for every road.";

const SCRIPT: &str = r#"{"turns": [
  {"tool_calls": [
    {"name": "update_page_metadata", "arguments": {"uid": 12, "description": "Bicycles for every road."}},
    {"name": "attach_file_to_content_element", "arguments": {"content_element": 5, "file": 13, "field": "image"}}
  ]},
  {"content": "Done."}
]}"#;

struct Harness {
    store: Store,
    runner: SegmentRunner,
    registry: Arc<ToolRegistry>,
}

async fn harness(pool: PgPool) -> Harness {
    seed_demo_site(&pool).await.unwrap();
    let store = Store::new(pool.clone(), Arc::new(Keyring::parse(KEYS).unwrap()));
    store
        .upsert_agent(&AgentConfig {
            name: "seo".into(),
            active: true,
            model: json!({}),
            policy: ToolPolicy {
                enabled_tools: vec![
                    "update_page_metadata".into(),
                    "attach_file_to_content_element".into(),
                ],
                ..Default::default()
            },
            max_iterations: 5,
            four_eyes: false,
            approval_deadline: Duration::from_secs(3600),
        })
        .await
        .unwrap();
    let mut registry = ToolRegistry::new();
    countersign_content::register(&mut registry, store.clone());
    let registry = Arc::new(registry);
    let runner = SegmentRunner {
        store: store.clone(),
        registry: registry.clone(),
        models: countersign_worker::Models::Fixed(Arc::new(
            ScriptedModel::from_json(SCRIPT).unwrap(),
        )),
        users: Arc::new(ContentUsers::new(pool)),
        lease_ttl: TTL,
        events: None,
    };
    Harness {
        store,
        runner,
        registry,
    }
}

impl Harness {
    /// A run of the script, suspended on its write turn.
    async fn suspended_run(&self) -> RunId {
        let run_id = self.new_run().await;
        let end = self.claim_and_run(run_id, "w1").await;
        assert_eq!(
            end,
            SegmentEnd::Suspended {
                suspension_seq: 1,
                moved: 0
            }
        );
        run_id
    }

    /// A queued run of the script, acting as `editor`.
    async fn new_run(&self) -> RunId {
        let run = self
            .store
            .create_run(&NewRun {
                request_id: Uuid::now_v7(),
                agent: "seo".into(),
                acting_user: "editor".into(),
                prompt: "Improve page 12.".into(),
            })
            .await
            .unwrap();
        run.run_id
    }

    async fn claim_and_run(&self, run_id: RunId, owner: &str) -> SegmentEnd {
        let claim = self
            .store
            .claim(run_id, owner, TTL)
            .await
            .unwrap()
            .expect("claimable");
        self.runner.run(&claim).await.unwrap()
    }

    async fn approve(&self, run_id: RunId) {
        let state =
            SuspendedRunState::from_bytes(&self.store.load_state(run_id).await.unwrap()).unwrap();
        let record = self
            .store
            .record_decision(&NewDecision {
                decision_id: Uuid::now_v7(),
                run_id,
                suspension_seq: state.suspension_seq,
                turn_digest: state.turn_digest(),
                approved: true,
                approver: "admin".into(),
                comment: None,
                outcome: DecisionOutcome::Accepted,
            })
            .await
            .unwrap();
        assert_eq!(record, DecisionRecord::Recorded(DecisionOutcome::Accepted));
    }

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

    async fn tool_writes(&self, run_id: RunId) -> usize {
        self.store
            .events(run_id)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.kind == "tool_write")
            .count()
    }
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
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

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_resume_retried_after_a_crash_skips_the_journaled_write_and_does_not_re_compare(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    h.approve(run_id).await;

    // A first worker claims the resume, executes call 0 under its fence, and dies.
    let first = h.store.claim(run_id, "w-dead", TTL).await.unwrap().unwrap();
    let token = first
        .lease
        .fence_token(SuspensionSeq::FIRST, CallIndex::new(0));
    let ctx = ExecContext {
        acting_user: Principal::new("editor", false),
        fence: Some(token),
    };
    let out = h
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

    // Call 0's own write moved its preview; a comparator run now would bounce the turn.
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

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
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
    assert_eq!(end, SegmentEnd::Interrupted("lease_lost"));
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

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
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

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
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

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_agent_whose_model_settings_name_no_usable_model_fails_provider_failed(pool: PgPool) {
    let mut h = harness(pool).await;
    h.runner.models =
        countersign_worker::Models::PerAgent(Arc::new(countersign_model::ModelCatalog::new()));
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
