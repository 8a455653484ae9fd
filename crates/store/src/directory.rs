//! The user directory kept in countersign's own database (migration 0011), for a deployment
//! whose tools work on a system that does not answer for its users the way the reference
//! content store does. `countersign users …` manages it; the gates, the worker and the surfaces
//! read it through [`UserDirectory`] like any other directory.
//!
//! A user is a name, an admin flag and a disabled flag; a user who is not an administrator may
//! approve the runs of the agents their approve grants name (`*` for every agent). A disabled
//! user is unknown to every question, as [`UserDirectory`] requires.

use async_trait::async_trait;
use countersign_core::{Approver, Approves, DirectoryError, Principal, UserDirectory};
use sqlx::PgPool;

use crate::StoreError;

/// One user of the table directory, as `countersign users list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryUser {
    pub name: String,
    pub admin: bool,
    pub disabled: bool,
    /// The agents whose runs the user may approve (`*` for every agent), sorted.
    pub approves: Vec<String>,
}

/// The table directory over `pool`.
#[derive(Debug, Clone)]
pub struct TableUsers {
    pool: PgPool,
}

impl TableUsers {
    pub fn new(pool: PgPool) -> Self {
        TableUsers { pool }
    }

    /// Adds `name`, or updates its admin flag if it exists; enables it either way.
    pub async fn put(&self, name: &str, admin: bool) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO directory_users (name, admin) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE
             SET admin = excluded.admin, disabled = false, updated_at = now()",
            name,
            admin,
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Disables (or enables again) `name`; false when there is no such user.
    pub async fn set_disabled(&self, name: &str, disabled: bool) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "UPDATE directory_users SET disabled = $2, updated_at = now() WHERE name = $1",
            name,
            disabled,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Lets `name` approve the runs of `agent` (`*`: every agent); false when there is no such
    /// user. Granting twice is one grant.
    pub async fn grant_approve(&self, name: &str, agent: &str) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "INSERT INTO directory_approve_grants (name, agent)
             SELECT name, $2 FROM directory_users WHERE name = $1
             ON CONFLICT DO NOTHING",
            name,
            agent,
        )
        .execute(&self.pool)
        .await?;
        // A grant that existed inserts nothing: the user is there all the same.
        Ok(done.rows_affected() == 1 || self.exists(name).await?)
    }

    /// Takes the grant back; false when there was none.
    pub async fn revoke_approve(&self, name: &str, agent: &str) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "DELETE FROM directory_approve_grants WHERE name = $1 AND agent = $2",
            name,
            agent,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Every user, by name.
    pub async fn list(&self) -> Result<Vec<DirectoryUser>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT u.name, u.admin, u.disabled,
                      coalesce(array_agg(g.agent ORDER BY g.agent)
                               FILTER (WHERE g.agent IS NOT NULL), '{}') AS "approves!"
               FROM directory_users u
               LEFT JOIN directory_approve_grants g ON g.name = u.name
               GROUP BY u.name ORDER BY u.name"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| DirectoryUser {
                name: r.name,
                admin: r.admin,
                disabled: r.disabled,
                approves: r.approves,
            })
            .collect())
    }

    /// Whether `name` is in the directory, enabled or not.
    async fn exists(&self, name: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM directory_users WHERE name = $1) AS "exists!""#,
            name
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// The enabled user `name` with their approve grants, in one statement.
    async fn approving(&self, name: &str) -> Result<Option<(bool, Vec<String>)>, DirectoryError> {
        let row = sqlx::query!(
            r#"SELECT u.admin,
                      coalesce(array_agg(g.agent) FILTER (WHERE g.agent IS NOT NULL), '{}')
                          AS "approves!"
               FROM directory_users u
               LEFT JOIN directory_approve_grants g ON g.name = u.name
               WHERE u.name = $1 AND NOT u.disabled
               GROUP BY u.name"#,
            name
        )
        .fetch_optional(&self.pool)
        .await
        .map_err(DirectoryError::database)?;
        Ok(row.map(|r| (r.admin, r.approves)))
    }
}

#[async_trait]
impl UserDirectory for TableUsers {
    async fn principal(&self, name: &str) -> Result<Option<Principal>, DirectoryError> {
        // Who the user is, without their grants: asked for every run request and segment.
        let admin = sqlx::query_scalar!(
            "SELECT admin FROM directory_users WHERE name = $1 AND NOT disabled",
            name
        )
        .fetch_optional(&self.pool)
        .await
        .map_err(DirectoryError::database)?;
        Ok(admin.map(|admin| Principal::new(name, admin)))
    }

    async fn approver(&self, name: &str) -> Result<Option<Approver>, DirectoryError> {
        Ok(self.approving(name).await?.map(|(admin, agents)| {
            Approver::new(Principal::new(name, admin), Approves::of(agents))
        }))
    }
}
