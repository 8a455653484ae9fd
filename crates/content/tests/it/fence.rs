//! A writer writes only under a lease it still holds, and its write is journaled with it.

use std::time::Duration;

use countersign_content::refusals::NO_LEASE;
use countersign_core::{CallIndex, SuspensionSeq, ToolError};
use countersign_store::NewRun;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::Site;

const TOOL: &str = "update_page_metadata";

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_writer_without_a_lease_refuses_and_writes_nothing(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let out = site
        .execute_fenced(
            TOOL,
            "editor",
            json!({"uid": 12, "title": "Unleased"}),
            None,
        )
        .await
        .expect("a refusal, not an error");
    assert!(out.is_error);
    assert_eq!(out.content, NO_LEASE);
    assert_eq!(site.page_text(12, "title").await, "Home");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_writer_whose_fence_token_is_stale_writes_nothing(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let created = site
        .store
        .create_run(&NewRun {
            request_id: Uuid::now_v7(),
            agent: "seo-assistant".into(),
            acting_user: "editor".into(),
            prompt: "Retitle the home page.".into(),
            inputs: None,
        })
        .await
        .unwrap();
    let first = site
        .store
        .claim(created.run_id, "worker-1", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let seq = SuspensionSeq::new(1).unwrap();
    let stale = first.lease.fence_token(seq, CallIndex::new(0));
    // The segment stalls; its run is handed back and claimed again, which bumps the epoch.
    assert!(site
        .store
        .requeue_segment(&first.lease, Duration::ZERO)
        .await
        .unwrap());
    let second = site
        .store
        .claim(created.run_id, "worker-2", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("reclaimed");
    assert!(second.lease.epoch.get() > first.lease.epoch.get());

    let result = site
        .execute_fenced(
            TOOL,
            "editor",
            json!({"uid": 12, "title": "Zombie"}),
            Some(stale),
        )
        .await;
    assert!(matches!(result, Err(ToolError::FenceLost)), "{result:?}");
    assert_eq!(site.page_text(12, "title").await, "Home");
    assert!(site
        .store
        .journaled(created.run_id, seq, CallIndex::new(0))
        .await
        .unwrap()
        .is_none());

    // The current holder writes.
    let current = second.lease.fence_token(seq, CallIndex::new(0));
    let out = site
        .execute_fenced(
            TOOL,
            "editor",
            json!({"uid": 12, "title": "Current"}),
            Some(current),
        )
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(site.page_text(12, "title").await, "Current");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_write_is_journaled_with_its_result_and_cannot_run_twice(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let token = site.lease("editor").await;
    let out = site
        .execute_fenced(
            "attach_file_to_content_element",
            "editor",
            json!({"content_element": 5, "file": 7}),
            Some(token.clone()),
        )
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.content);
    let journaled = site
        .store
        .journaled(token.run_id, token.suspension_seq, token.call_index)
        .await
        .unwrap();
    assert_eq!(journaled, Some(out));

    // The same call again (a retried segment that did not check the journal) is rolled back
    // whole, so the relative write does not happen twice.
    let again = site
        .execute_fenced(
            "attach_file_to_content_element",
            "editor",
            json!({"content_element": 5, "file": 7}),
            Some(token),
        )
        .await;
    assert!(
        matches!(
            again,
            Err(ToolError::Unavailable {
                code: "already_journaled",
                ..
            })
        ),
        "{again:?}"
    );
    assert_eq!(
        site.count(
            "SELECT count(*) FROM content.file_references WHERE element = 5 AND NOT deleted"
        )
        .await,
        3
    );
}
