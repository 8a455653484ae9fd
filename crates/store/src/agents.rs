//! Agent configurations: which tools an agent is offered, how far it may loop, who must
//! approve, and how long an approval may wait.
//!
//! Runs name their agent in plain text, without a foreign key: deleting or deactivating a
//! configuration must not delete the history of its runs. A resume re-reads the live
//! configuration (a decision on a run whose configuration is gone is refused), so nothing here
//! is copied into a run.

use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::ToolPolicy;
use serde_json::Value;

use crate::{Store, StoreError};

/// One agent configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub name: String,
    pub active: bool,
    /// Provider, model and options as a JSON object. Names the environment variables holding
    /// credentials; never a credential itself.
    pub model: Value,
    pub policy: ToolPolicy,
    pub max_iterations: u32,
    /// A model turn proposing more tool calls than this is refused whole (1–256).
    pub max_tool_calls_per_turn: u32,
    /// An approval by the run's initiator is refused: a second person must approve.
    pub four_eyes: bool,
    /// How long a suspended run may wait for a decision before the reaper expires it. Stored
    /// in whole seconds.
    pub approval_deadline: Duration,
}

/// A stored configuration with its timestamps.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredAgent {
    pub config: AgentConfig,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// An agent configuration as every statement reads it: the row of the view `agent_settings`
/// (its columns in this order), selected whole — alone, or joined to the run it configures.
#[derive(Debug, sqlx::Type)]
#[sqlx(type_name = "agent_settings")]
pub(crate) struct AgentColumns {
    name: String,
    active: bool,
    model: Value,
    allowed_groups: Vec<String>,
    allowed_tools: Vec<String>,
    enabled_tools: Vec<String>,
    max_iterations: i32,
    max_tool_calls_per_turn: i32,
    four_eyes: bool,
    approval_deadline_seconds: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<AgentColumns> for StoredAgent {
    fn from(r: AgentColumns) -> Self {
        StoredAgent {
            config: AgentConfig {
                name: r.name,
                active: r.active,
                model: r.model,
                policy: ToolPolicy {
                    allowed_tools: r.allowed_tools,
                    allowed_groups: r.allowed_groups,
                    enabled_tools: r.enabled_tools,
                },
                // The schema keeps both positive.
                max_iterations: u32::try_from(r.max_iterations).unwrap_or(1),
                max_tool_calls_per_turn: u32::try_from(r.max_tool_calls_per_turn).unwrap_or(1),
                four_eyes: r.four_eyes,
                approval_deadline: Duration::from_secs(
                    u64::try_from(r.approval_deadline_seconds).unwrap_or(1),
                ),
            },
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

impl Store {
    /// Creates the configuration or replaces every field of the existing one.
    pub async fn upsert_agent(&self, agent: &AgentConfig) -> Result<(), StoreError> {
        let deadline = i64::try_from(agent.approval_deadline.as_secs().max(1)).unwrap_or(i64::MAX);
        sqlx::query!(
            r#"INSERT INTO agents (name, active, model, allowed_groups, allowed_tools, enabled_tools,
                                   max_iterations, four_eyes, approval_deadline_seconds,
                                   max_tool_calls_per_turn)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
               ON CONFLICT (name) DO UPDATE SET
                   active = excluded.active, model = excluded.model,
                   allowed_groups = excluded.allowed_groups,
                   allowed_tools = excluded.allowed_tools,
                   enabled_tools = excluded.enabled_tools,
                   max_iterations = excluded.max_iterations, four_eyes = excluded.four_eyes,
                   approval_deadline_seconds = excluded.approval_deadline_seconds,
                   max_tool_calls_per_turn = excluded.max_tool_calls_per_turn,
                   updated_at = now()"#,
            agent.name,
            agent.active,
            agent.model,
            &agent.policy.allowed_groups,
            &agent.policy.allowed_tools,
            &agent.policy.enabled_tools,
            i32::try_from(agent.max_iterations).unwrap_or(i32::MAX),
            agent.four_eyes,
            deadline,
            i32::try_from(agent.max_tool_calls_per_turn.clamp(1, 256)).unwrap_or(256),
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The configuration named `name`, active or not.
    pub async fn agent(&self, name: &str) -> Result<Option<StoredAgent>, StoreError> {
        let row = sqlx::query_scalar!(
            r#"SELECT s AS "s!: AgentColumns" FROM agent_settings s WHERE s.name = $1"#,
            name,
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(StoredAgent::from))
    }

    /// All configurations, by name.
    pub async fn agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        let rows = sqlx::query_scalar!(
            r#"SELECT s AS "s!: AgentColumns" FROM agent_settings s ORDER BY s.name"#,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(StoredAgent::from).collect())
    }

    /// Activates or deactivates a configuration; `false` when it does not exist.
    pub async fn set_agent_active(&self, name: &str, active: bool) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "UPDATE agents SET active = $2, updated_at = now() WHERE name = $1",
            name,
            active,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes a configuration; its runs are kept. `false` when it did not exist.
    pub async fn delete_agent(&self, name: &str) -> Result<bool, StoreError> {
        let done = sqlx::query!("DELETE FROM agents WHERE name = $1", name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
