use std::time::Duration;

use countersign_core::ToolPolicy;
use countersign_store::{AgentConfig, RunStatus};
use serde_json::json;
use sqlx::PgPool;

use crate::support::*;

fn config() -> AgentConfig {
    AgentConfig {
        name: "seo-assistant".into(),
        active: true,
        model: json!({"provider": "openai_compatible", "model": "small", "api_key_env": "MODEL_KEY"}),
        policy: ToolPolicy {
            allowed_tools: vec![],
            allowed_groups: vec!["content".into(), "editing".into()],
            enabled_tools: vec!["update_page_metadata".into()],
        },
        max_iterations: 12,
        max_tool_calls_per_turn: countersign_core::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
        four_eyes: true,
        approval_deadline: Duration::from_secs(2 * 86_400),
    }
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_agent_configuration_round_trips_and_an_upsert_replaces_it(pool: PgPool) {
    let store = store(pool);
    assert!(store.agent("seo-assistant").await.unwrap().is_none());
    store.upsert_agent(&config()).await.unwrap();
    let stored = store.agent("seo-assistant").await.unwrap().unwrap();
    assert_eq!(stored.config, config());

    let changed = AgentConfig {
        four_eyes: false,
        max_iterations: 3,
        policy: ToolPolicy::default(),
        ..config()
    };
    store.upsert_agent(&changed).await.unwrap();
    let stored = store.agent("seo-assistant").await.unwrap().unwrap();
    assert_eq!(stored.config, changed);
    assert!(stored.updated_at >= stored.created_at);

    assert!(store
        .set_agent_active("seo-assistant", false)
        .await
        .unwrap());
    assert!(
        !store
            .agent("seo-assistant")
            .await
            .unwrap()
            .unwrap()
            .config
            .active
    );
    assert!(!store.set_agent_active("nobody", false).await.unwrap());
    assert_eq!(store.agents().await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn deleting_an_agent_configuration_keeps_its_runs(pool: PgPool) {
    let store = store(pool);
    store.upsert_agent(&config()).await.unwrap();
    let (run, _) = waiting(&store).await;
    assert!(store.delete_agent("seo-assistant").await.unwrap());
    assert!(!store.delete_agent("seo-assistant").await.unwrap());
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.agent, "seo-assistant");
    assert_eq!(row.status, RunStatus::WaitingForApproval);
}
