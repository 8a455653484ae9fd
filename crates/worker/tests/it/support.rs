//! The seeded demo site, an agent whose script proposes one write turn, and the worker's real
//! segment runner over them.

use std::sync::Arc;
use std::time::Duration;

use countersign_content::{seed_demo_site, ContentUsers};
use countersign_core::{
    DecisionMessage, LocalWriters, RunId, SuspendedRunState, ToolPolicy, ToolRegistry,
};
use countersign_crypto::Keyring;
use countersign_model::ScriptedModel;
use countersign_store::{
    AgentConfig, DecisionOutcome, DecisionRecord, FencedWrite, NewDecision, NewRun, Store,
};
use countersign_worker::{SegmentEnd, SegmentRunner};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const KEYS: &str = "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
pub const TTL: Duration = Duration::from_secs(30);
/// The agent every harness configures.
pub const AGENT: &str = "seo";

pub struct Harness {
    pub store: Store,
    pub runner: SegmentRunner,
    pub registry: Arc<ToolRegistry>,
    pub local: Arc<LocalWriters<FencedWrite>>,
}

impl Harness {
    /// The demo site in `pool`'s database, and an agent that follows `script` with the writers
    /// `enabled`.
    pub async fn new(pool: PgPool, script: &str, enabled: &[&str]) -> Harness {
        seed_demo_site(&pool).await.unwrap();
        let store = Store::new(pool.clone(), Arc::new(Keyring::parse(KEYS).unwrap()));
        store
            .upsert_agent(&AgentConfig {
                name: AGENT.into(),
                active: true,
                model: json!({}),
                policy: ToolPolicy {
                    enabled_tools: enabled.iter().map(|w| w.to_string()).collect(),
                    ..Default::default()
                },
                max_iterations: 5,
                max_tool_calls_per_turn:
                    countersign_core::agent_loop::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
                four_eyes: false,
                approval_deadline: Duration::from_secs(3600),
            })
            .await
            .unwrap();
        let mut registry = ToolRegistry::new();
        let mut local = LocalWriters::new();
        countersign_content::register(&mut registry, &mut local, store.clone());
        let (registry, local) = (Arc::new(registry), Arc::new(local));
        let runner = SegmentRunner {
            store: store.clone(),
            registry: registry.clone(),
            local: local.clone(),
            models: countersign_worker::Models::Fixed(Arc::new(
                ScriptedModel::from_json(script).unwrap(),
            )),
            users: Arc::new(ContentUsers::new(pool)),
            lease_ttl: TTL,
            heartbeat: Default::default(),
            settler: Default::default(),
        };
        Harness {
            store,
            runner,
            registry,
            local,
        }
    }

    /// A run of the script, suspended on its write turn.
    pub async fn suspended_run(&self) -> RunId {
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
    pub async fn new_run(&self) -> RunId {
        let run = self
            .store
            .create_run(&NewRun {
                request_id: Uuid::now_v7(),
                agent: AGENT.into(),
                acting_user: "editor".into(),
                prompt: "Improve page 12.".into(),
                inputs: None,
            })
            .await
            .unwrap();
        run.run_id
    }

    pub async fn claim_and_run(&self, run_id: RunId, owner: &str) -> SegmentEnd {
        let claim = self
            .store
            .claim(run_id, owner, TTL)
            .await
            .unwrap()
            .expect("claimable");
        self.runner.run(&claim).await.unwrap()
    }

    /// The run's suspended state, opened.
    pub async fn state(&self, run_id: RunId) -> SuspendedRunState {
        SuspendedRunState::from_bytes(&self.store.load_state(run_id).await.unwrap()).unwrap()
    }

    /// Records an accepted approval of the run's current card.
    pub async fn approve(&self, run_id: RunId) {
        let state = self.state(run_id).await;
        let record = self
            .store
            .record_decision(&NewDecision {
                message: DecisionMessage {
                    decision_id: Uuid::now_v7(),
                    run_id,
                    suspension_seq: state.suspension_seq,
                    turn_digest: state.turn_digest(),
                    approved: true,
                    approver: "admin".into(),
                    comment: None,
                },
                outcome: DecisionOutcome::Accepted,
                in_trail: true,
            })
            .await
            .unwrap();
        assert_eq!(record, DecisionRecord::Recorded(DecisionOutcome::Accepted));
    }

    pub async fn tool_writes(&self, run_id: RunId) -> usize {
        self.store
            .events(run_id)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.kind == "tool_write")
            .count()
    }
}
