//! A seeded demo site, its tools, and leases to write under.

use std::sync::Arc;

use countersign_core::{
    CallIndex, ExecContext, FenceToken, Principal, SuspensionSeq, Tool, ToolError, ToolOutput,
    ToolPreview,
};
use countersign_testkit::site::{agent, TTL};
use serde_json::Value;
use sqlx::{PgPool, Row};

/// The demo site, and the tools as the services register them.
pub struct Site(countersign_testkit::site::Site);

impl std::ops::Deref for Site {
    type Target = countersign_testkit::site::Site;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// A principal by name; the content store decides what the name may do.
pub fn user(name: &str) -> Principal {
    Principal::new(name, name == "admin")
}

impl Site {
    /// The demo site in this test's own database.
    pub async fn seeded(pool: PgPool) -> Site {
        let agent = agent("seo-assistant", &[], false);
        Site(countersign_testkit::site::Site::new(pool, &agent, r#"{"turns": []}"#).await)
    }

    pub fn tool(&self, name: &str) -> &Arc<dyn Tool> {
        self.runner
            .registry
            .get(name)
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    pub fn previewer(&self, name: &str) -> &dyn ToolPreview {
        self.tool(name)
            .previewer()
            .unwrap_or_else(|| panic!("{name} has no preview"))
    }

    pub async fn preview(&self, tool: &str, acting_user: &str, args: Value) -> Vec<String> {
        self.previewer(tool)
            .preview(&user(acting_user), &args)
            .await
            .expect("preview")
    }

    pub async fn may_view(&self, tool: &str, viewer: &str, args: Value) -> bool {
        self.previewer(tool)
            .may_viewer_read_preview(&args, &user(viewer))
            .await
    }

    /// A run acting as `acting_user`, claimed by a worker: the fence token of its first call.
    pub async fn lease(&self, acting_user: &str) -> FenceToken {
        let run_id = self.queued_run("seo-assistant", acting_user).await;
        let claim = self
            .store
            .claim(run_id, "worker-1", TTL)
            .await
            .expect("claim");
        let lease = claim.expect("the new run is claimable").lease;
        lease.fence_token(SuspensionSeq::new(1).unwrap(), CallIndex::new(0))
    }

    /// Executes a call with the given fence (or none).
    pub async fn execute_fenced(
        &self,
        tool: &str,
        acting_user: &str,
        args: Value,
        fence: Option<FenceToken>,
    ) -> Result<ToolOutput, ToolError> {
        let ctx = ExecContext {
            acting_user: user(acting_user),
            fence,
            shown_preview: None,
            before: Vec::new(),
        };
        self.tool(tool).execute(&ctx, &args).await
    }

    /// Executes a write under a fresh lease, as a resumed segment would.
    pub async fn execute(&self, tool: &str, acting_user: &str, args: Value) -> ToolOutput {
        let fence = self.lease(acting_user).await;
        self.execute_fenced(tool, acting_user, args, Some(fence))
            .await
            .expect("execute")
    }

    /// Runs a reader (no lease needed).
    pub async fn read(&self, tool: &str, acting_user: &str, args: Value) -> ToolOutput {
        self.execute_fenced(tool, acting_user, args, None)
            .await
            .expect("read")
    }

    pub async fn page_text(&self, uid: i64, field: &str) -> String {
        sqlx::query(&format!("SELECT {field} FROM content.pages WHERE uid = $1"))
            .bind(uid)
            .fetch_one(&self.pool)
            .await
            .expect("page row")
            .get(0)
    }

    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql).execute(&self.pool).await.expect("sql");
    }
}

/// The lines as one text, one line each, for snapshots.
pub fn text(lines: &[String]) -> String {
    lines.join("\n")
}
