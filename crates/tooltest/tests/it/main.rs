//! The kit on a real tool: a writer of the reference content store, in a throwaway database
//! with the demo site, run as an approved turn runs it; and its preview checked as `countersign
//! tools check` checks it. A tool whose preview changes by itself fails the check.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use countersign_core::{
    DataClass, Effect, ExecContext, Principal, SuspensionSeq, Tool, ToolError, ToolOutput,
    ToolPreview, ToolSpec,
};
use countersign_testkit::site::{agent, Site, TTL};
use countersign_tooltest::{check_preview, plan_and_apply};
use serde_json::{json, Value};
use sqlx::PgPool;

async fn site(pool: PgPool) -> Site {
    Site::new(
        pool,
        &agent("seo-assistant", &[], false),
        r#"{"turns": []}"#,
    )
    .await
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_content_writer_keeps_its_contract_in_a_turn_of_its_own(pool: PgPool) {
    let site = site(pool).await;
    let run = site.queued_run("seo-assistant", "editor").await;
    let lease = site
        .store
        .claim(run, "worker-1", TTL)
        .await
        .unwrap()
        .expect("claimable")
        .lease;
    let mut tx = site
        .store
        .begin_turn(&lease, SuspensionSeq::FIRST)
        .await
        .unwrap();
    let tool = "update_page_metadata";
    let writer = site.runner.local.get(tool).expect("a local writer");
    let previewer = site.runner.registry.get(tool).unwrap().previewer().unwrap();
    let editor = Principal::new("editor", false);
    let args = json!({"uid": 13, "description": "Who we are, since 1998."});

    let run = plan_and_apply(writer, previewer, &mut tx, &editor, &args)
        .await
        .expect("the call runs");
    run.assert_kept();
    assert!(!run.subjects.is_empty(), "it names its read set");
    assert!(
        run.preview
            .iter()
            .any(|l| l.contains("\"Who we are.\" → \"Who we are, since 1998.\"")),
        "{:?}",
        run.preview
    );
    assert!(!run.output.is_error, "{:?}", run.output);
    let written: String = sqlx::query_scalar(
        "SELECT description FROM content.pages WHERE uid = 13 AND workspace = 0",
    )
    .fetch_one(tx.conn())
    .await
    .unwrap();
    assert_eq!(
        written, "Who we are, since 1998.",
        "applied in the turn's transaction"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_content_writers_preview_passes_the_check_tools_check_runs(pool: PgPool) {
    let site = site(pool).await;
    let tool = Arc::clone(
        site.runner
            .registry
            .get("attach_file_to_content_element")
            .unwrap(),
    );
    let args = json!({"content_element": 5, "file": 13, "field": "image"});
    let check = check_preview(
        Arc::clone(&tool),
        tool,
        &Principal::new("editor", false),
        &args,
    )
    .await;
    check.assert_fit();
    assert!(
        check
            .lines
            .contains(&"preview 2: the same, line for line".to_owned()),
        "{check:?}"
    );
}

/// A tool whose preview counts how often it was asked: it never reads the same twice.
#[derive(Debug)]
struct Drifting {
    spec: ToolSpec,
    asked: AtomicU32,
}

#[async_trait]
impl Tool for Drifting {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, _ctx: &ExecContext, _args: &Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::ok("done"))
    }

    fn previewer(&self) -> Option<&dyn ToolPreview> {
        Some(self)
    }
}

#[async_trait]
impl ToolPreview for Drifting {
    async fn preview(&self, _user: &Principal, _args: &Value) -> Result<Vec<String>, ToolError> {
        let n = self.asked.fetch_add(1, Ordering::SeqCst);
        Ok(vec![format!("asked {n} time(s) before")])
    }

    async fn may_viewer_read_preview(&self, _args: &Value, _viewer: &Principal) -> bool {
        true
    }
}

#[tokio::test]
async fn a_preview_that_changes_by_itself_fails_the_check_line_by_line() {
    let tool: Arc<dyn Tool> = Arc::new(Drifting {
        spec: ToolSpec {
            name: "drifting".into(),
            description: "Counts its previews.".into(),
            parameters: json!({"type": "object"}),
            group: "test".into(),
            data_class: DataClass::Public,
            effect: Effect::NonIdempotentWrite,
            enabled_by_default: false,
            requires_admin: false,
        },
        asked: AtomicU32::new(0),
    });
    let check = check_preview(
        Arc::clone(&tool),
        tool,
        &Principal::new("editor", false),
        &json!({}),
    )
    .await;
    assert!(!check.passed());
    assert_eq!(
        check.problems,
        vec!["the two previews differ: every approval of this call would bounce".to_owned()]
    );
    assert!(check
        .lines
        .contains(&"  -  1  asked 0 time(s) before".to_owned()));
}
