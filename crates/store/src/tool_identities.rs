//! What each tool from outside — a remote tool server's, an MCP server's — was accepted as
//! (`tool_identities`, migration 0030), so that every process holds its servers' listings to the
//! same facts.
//!
//! A process that lists a server pins each tool it lists ([`Store::pin_tool`]): the first
//! listing of a tool is recorded as accepted (the operator named its server); a listing whose
//! identity differs from the accepted one is the tool's pending change, recorded and announced
//! once (`tool.withheld`, in the same transaction), and the process withholds the tool until an
//! operator accepts the change ([`Store::accept_tool`]).

use chrono::{DateTime, Utc};
use countersign_core::{Event, EventName};
use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::{outbox, OutboxEvent, Store, StoreError};

/// What a listing of a tool is, measured against what was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned {
    /// The listing is what was accepted (or the first listing, now accepted).
    Accepted,
    /// The listing differs from what was accepted: the tool is withheld until an operator
    /// accepts the change. `announced`: this call recorded the change and announced it.
    Withheld {
        accepted_identity: String,
        announced: bool,
    },
}

/// A tool's recorded facts: what was accepted, and a change waiting for an operator.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolIdentity {
    pub tool: String,
    pub server: String,
    pub identity: String,
    pub facts: Value,
    pub accepted_at: DateTime<Utc>,
    /// Who accepted it; `None`: recorded at its first listing.
    pub accepted_by: Option<String>,
    pub pending: Option<PendingChange>,
}

/// What a server lists a tool as now, where that differs from what was accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingChange {
    pub server: String,
    pub identity: String,
    pub facts: Value,
    pub since: DateTime<Utc>,
}

/// One listing of a tool: where it comes from, its identity and the facts it is the digest of.
#[derive(Debug, Clone, Copy)]
pub struct Listing<'a> {
    pub tool: &'a str,
    /// `remote:<name>` or `mcp:<name>`.
    pub server: &'a str,
    pub identity: &'a str,
    pub facts: &'a Value,
}

impl Store {
    /// Pins `listing`: records it when the tool was never listed, and says whether it is what
    /// was accepted. A differing listing is recorded as the tool's pending change and announced
    /// (`tool.withheld`) in the same transaction, once per change: two processes that find the
    /// same change announce it once. A listing equal to the accepted facts again clears a
    /// pending change (the server went back).
    pub async fn pin_tool(&self, listing: Listing<'_>) -> Result<Pinned, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query!(
            r#"INSERT INTO tool_identities (tool, server, identity, facts)
               VALUES ($1, $2, $3, $4)
               ON CONFLICT (tool) DO NOTHING"#,
            listing.tool,
            listing.server,
            listing.identity,
            listing.facts,
        )
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query!(
            r#"SELECT identity, pending_identity FROM tool_identities WHERE tool = $1 FOR UPDATE"#,
            listing.tool,
        )
        .fetch_one(&mut *tx)
        .await?;
        if row.identity == listing.identity {
            if row.pending_identity.is_some() {
                sqlx::query!(
                    r#"UPDATE tool_identities
                       SET pending_identity = NULL, pending_server = NULL, pending_facts = NULL,
                           pending_since = NULL
                       WHERE tool = $1"#,
                    listing.tool,
                )
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            return Ok(Pinned::Accepted);
        }
        let announced = row.pending_identity.as_deref() != Some(listing.identity);
        let mut handed = Vec::new();
        if announced {
            handed.push(withhold(&mut tx, &listing, &row.identity).await?);
        }
        tx.commit().await?;
        self.hand_off(handed);
        Ok(Pinned::Withheld {
            accepted_identity: row.identity,
            announced,
        })
    }

    /// Every pinned tool, by name.
    pub async fn tool_identities(&self) -> Result<Vec<ToolIdentity>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT tool, server, identity, facts, accepted_at, accepted_by,
                      pending_identity, pending_server, pending_facts, pending_since
               FROM tool_identities ORDER BY tool"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let pending = match (
                    r.pending_identity,
                    r.pending_server,
                    r.pending_facts,
                    r.pending_since,
                ) {
                    (Some(identity), Some(server), Some(facts), Some(since)) => {
                        Some(PendingChange {
                            server,
                            identity,
                            facts,
                            since,
                        })
                    }
                    _ => None,
                };
                ToolIdentity {
                    tool: r.tool,
                    server: r.server,
                    identity: r.identity,
                    facts: r.facts,
                    accepted_at: r.accepted_at,
                    accepted_by: r.accepted_by,
                    pending,
                }
            })
            .collect())
    }

    /// Accepts the pending change of `tool` whose identity is `identity`, as `by`: it becomes
    /// what the tool is accepted as. `false` when the tool has no pending change of that
    /// identity (none, or another since): nothing changed.
    pub async fn accept_tool(
        &self,
        tool: &str,
        identity: &str,
        by: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            r#"UPDATE tool_identities
               SET identity = pending_identity, server = pending_server, facts = pending_facts,
                   accepted_at = now(), accepted_by = $3,
                   pending_identity = NULL, pending_server = NULL, pending_facts = NULL,
                   pending_since = NULL
               WHERE tool = $1 AND pending_identity = $2"#,
            tool,
            identity,
            by,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}

/// Keeps `listing` pending beside the accepted identity and announces `tool.withheld`, in the
/// caller's transaction.
async fn withhold(
    tx: &mut PgConnection,
    listing: &Listing<'_>,
    accepted_identity: &str,
) -> Result<OutboxEvent, StoreError> {
    sqlx::query!(
        r#"UPDATE tool_identities
                   SET pending_identity = $2, pending_server = $3, pending_facts = $4,
                       pending_since = now()
                   WHERE tool = $1"#,
        listing.tool,
        listing.identity,
        listing.server,
        listing.facts,
    )
    .execute(&mut *tx)
    .await?;
    let event = Event::new(
        EventName::ToolWithheld,
        json!({
            "tool": listing.tool,
            "server": listing.server,
            "identity": listing.identity,
            "accepted_identity": accepted_identity,
        }),
    );
    outbox::append(tx, None, &event).await
}
