//! The reference content store's demo site in a test's own database, an agent, and the
//! worker's real segment runner over them: the tools and users assembled as every service
//! assembles them (`countersign_service::tools`), the model a script.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::{RunId, ToolPolicy};
use countersign_crypto::Keyring;
use countersign_model::ScriptedModel;
use countersign_store::{AgentConfig, NewRun, Store};
use countersign_worker::{Models, SegmentEnd, SegmentRunner};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

/// The lease time to live of the site's segments.
pub const TTL: Duration = Duration::from_secs(30);

/// An agent on the scripted model with the writers `enabled`, at most five turns, deciding
/// within the hour.
pub fn agent(name: &str, enabled: &[&str], four_eyes: bool) -> AgentConfig {
    AgentConfig {
        name: name.into(),
        active: true,
        model: json!({}),
        policy: ToolPolicy {
            enabled_tools: enabled.iter().map(|w| w.to_string()).collect(),
            ..Default::default()
        },
        max_iterations: 5,
        max_tool_calls_per_turn: countersign_core::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
        four_eyes,
        approval_deadline: Duration::from_secs(3600),
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct Site {
    pub pool: PgPool,
    pub store: Store,
    pub runner: SegmentRunner,
}

impl Site {
    /// The demo site seeded in `pool`'s database (migrated with the content store), `agent`
    /// configured, and a segment runner whose model follows `script`.
    pub async fn new(pool: PgPool, agent: &AgentConfig, script: &str) -> Site {
        countersign_content::seed_demo_site(&pool)
            .await
            .expect("the demo site is seeded");
        let store = Store::new(pool.clone(), Arc::new(Keyring::parse(crate::KEYS).unwrap()));
        store
            .upsert_agent(agent)
            .await
            .expect("the agent is stored");
        let tools = countersign_service::tools::tools(
            &store,
            &countersign_service::ToolSettings::default(),
        )
        .await
        .expect("the deployment's tools");
        let model = ScriptedModel::from_json(script).expect("a model script");
        let runner = SegmentRunner::new(store.clone(), tools, Models::Fixed(Arc::new(model)), TTL);
        Site {
            pool,
            store,
            runner,
        }
    }

    /// A run of `agent` acting as `acting_user`, created in the store (no coordinator), queued.
    pub async fn queued_run(&self, agent: &str, acting_user: &str) -> RunId {
        let run = NewRun {
            request_id: Uuid::now_v7(),
            agent: agent.into(),
            acting_user: acting_user.into(),
            prompt: "Improve page 12.".into(),
            inputs: None,
        };
        self.store.create_run(&run).await.unwrap().run_id
    }

    /// Claims the run as `owner` and runs its segment to its end.
    pub async fn claim_and_run(&self, run_id: RunId, owner: &str) -> SegmentEnd {
        let claim = self
            .store
            .claim(run_id, owner, TTL)
            .await
            .unwrap()
            .expect("claimable");
        self.runner.run(&claim).await.unwrap()
    }

    /// The whole run row as JSON — status, segment, suspension, sealed state (as hex), lease,
    /// deadlines and `updated_at` — to prove a refusal left it exactly as it was.
    pub async fn row(&self, run_id: RunId) -> Value {
        sqlx::query_scalar("SELECT to_jsonb(r) FROM runs r WHERE id = $1")
            .bind(run_id.as_uuid())
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// The number the `bigint` query `sql` returns (a `count(*)`, typically).
    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }
}
