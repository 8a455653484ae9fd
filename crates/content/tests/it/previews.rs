//! What every writer's preview promises: the same lines for the same state, nothing about a
//! record the acting user may not read, and a card withheld from a viewer without rights.

use countersign_content::refusals::{
    ASSET_NOT_PERMITTED, ELEMENT_NOT_PERMITTED, ELEMENT_OR_FILE_NOT_PERMITTED, PAGE_NOT_PERMITTED,
};
use countersign_content::{READER_NAMES, WRITER_NAMES};
use countersign_core::preview::assert_deterministic;
use countersign_core::Effect;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::support::{user, Site};

/// One call per writer that the editor may make on the demo site.
fn permitted_calls() -> Vec<(&'static str, Value)> {
    vec![
        (
            "attach_file_to_content_element",
            json!({"content_element": 5, "file": 7, "alternative": "A red bicycle"}),
        ),
        (
            "create_content_element_draft",
            json!({"page": 12, "header": "Spring sale", "after_content_uid": 5}),
        ),
        (
            "create_page_draft",
            json!({"parent": 14, "title": "E-bikes", "after_page_uid": 15}),
        ),
        (
            "create_translation_draft",
            json!({"table": "content", "uid": 4, "language": 1, "overwrite": true}),
        ),
        (
            "move_content_element",
            json!({"uid": 5, "target_page": 13, "after_content_uid": 8}),
        ),
        (
            "set_file_alternative_text",
            json!({"uid": 7, "alternative": "A red bicycle"}),
        ),
        (
            "update_page_metadata",
            json!({"uid": 12, "description": "Shorter.", "title": "Home"}),
        ),
    ]
}

/// One call per writer naming a record outside the editor's rights, the secret it must not
/// show, and the refusal it must show instead.
fn forbidden_calls() -> Vec<(&'static str, Value, &'static str, &'static str)> {
    vec![
        (
            "attach_file_to_content_element",
            json!({"content_element": 5, "file": 11}),
            "payroll",
            ELEMENT_OR_FILE_NOT_PERMITTED,
        ),
        (
            "create_content_element_draft",
            json!({"page": 21, "header": "x"}),
            "Staff",
            PAGE_NOT_PERMITTED,
        ),
        (
            "create_page_draft",
            json!({"parent": 20, "title": "x"}),
            "Intranet",
            PAGE_NOT_PERMITTED,
        ),
        (
            "create_translation_draft",
            json!({"table": "content", "uid": 9, "language": 1}),
            "Staff",
            ELEMENT_NOT_PERMITTED,
        ),
        (
            "move_content_element",
            json!({"uid": 9, "target_page": 12}),
            "Staff",
            ELEMENT_NOT_PERMITTED,
        ),
        (
            "set_file_alternative_text",
            json!({"uid": 11, "alternative": "x"}),
            "payroll",
            ASSET_NOT_PERMITTED,
        ),
        (
            "update_page_metadata",
            json!({"uid": 21, "description": "x"}),
            "Staff",
            PAGE_NOT_PERMITTED,
        ),
    ]
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_content_store_offers_five_readers_and_seven_disabled_writers(pool: PgPool) {
    let site = Site::seeded(pool).await;
    for name in READER_NAMES {
        let spec = site.tool(name).spec();
        assert_eq!(spec.effect, Effect::ReadOnly, "{name}");
        assert!(spec.enabled_by_default, "{name}");
        assert!(site.tool(name).previewer().is_none(), "{name}");
    }
    for name in WRITER_NAMES {
        let spec = site.tool(name).spec();
        assert_eq!(spec.group, "editing", "{name}");
        assert!(spec.effect.is_write(), "{name}");
        assert!(!spec.enabled_by_default, "{name}");
        assert!(!spec.requires_admin, "{name}");
        assert!(site.tool(name).previewer().is_some(), "{name}");
    }
    let effect = |name: &str| site.tool(name).spec().effect;
    assert_eq!(effect("update_page_metadata"), Effect::IdempotentWrite);
    assert_eq!(effect("set_file_alternative_text"), Effect::IdempotentWrite);
    assert_eq!(effect("move_content_element"), Effect::IdempotentWrite);
    assert_eq!(
        effect("attach_file_to_content_element"),
        Effect::NonIdempotentWrite
    );
    assert_eq!(
        effect("create_content_element_draft"),
        Effect::NonIdempotentWrite
    );
    assert_eq!(effect("create_page_draft"), Effect::NonIdempotentWrite);
    assert_eq!(
        effect("create_translation_draft"),
        Effect::NonIdempotentWrite
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn every_writers_preview_is_the_same_twice_on_the_same_state(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let calls = permitted_calls().into_iter().chain(
        forbidden_calls()
            .into_iter()
            .map(|(tool, args, _, _)| (tool, args)),
    );
    for (tool, args) in calls {
        for who in ["editor", "restricted", "admin", "nobody"] {
            assert_deterministic(site.previewer(tool), &user(who), &args).await;
        }
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_preview_never_shows_a_record_the_acting_user_cannot_read(pool: PgPool) {
    let site = Site::seeded(pool).await;
    for (tool, args, secret, refusal) in forbidden_calls() {
        let lines = site.preview(tool, "editor", args.clone()).await;
        assert_eq!(lines, vec![refusal.to_owned()], "{tool}");
        assert!(!lines.iter().any(|l| l.contains(secret)), "{tool}");
        // The admin may read it, and the same call then shows the record.
        let lines = site.preview(tool, "admin", args).await;
        assert_ne!(lines, vec![refusal.to_owned()], "{tool}");
    }
    // A user with no rights at all sees the refusal for every permitted call too.
    for (tool, args) in permitted_calls() {
        let lines = site.preview(tool, "approver", args).await;
        assert_eq!(lines.len(), 1, "{tool}: {lines:?}");
        assert!(lines[0].contains("not permitted"), "{tool}: {lines:?}");
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_viewer_without_rights_on_the_record_may_not_read_the_preview(pool: PgPool) {
    let site = Site::seeded(pool).await;
    for (tool, args) in permitted_calls() {
        assert!(site.may_view(tool, "editor", args.clone()).await, "{tool}");
        assert!(site.may_view(tool, "admin", args.clone()).await, "{tool}");
        // The approver holds agent_approve, which decides nothing about records.
        assert!(
            !site.may_view(tool, "approver", args.clone()).await,
            "{tool}"
        );
        assert!(!site.may_view(tool, "mallory", args).await, "{tool}");
    }
    for (tool, args, _, _) in forbidden_calls() {
        assert!(!site.may_view(tool, "editor", args).await, "{tool}");
    }
    // The same record check: a German translation needs German.
    let german = json!({"table": "pages", "uid": 14, "language": 1});
    assert!(
        site.may_view("create_translation_draft", "editor", german.clone())
            .await
    );
    assert!(
        !site
            .may_view("create_translation_draft", "restricted", german)
            .await
    );
    // Arguments that name no record are withheld rather than guessed at.
    assert!(
        !site
            .may_view("update_page_metadata", "admin", json!({"uid": "twelve"}))
            .await
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_refusal_that_needs_rights_to_see_is_readable_by_a_viewer_with_them(pool: PgPool) {
    let site = Site::seeded(pool).await;
    // The preview is a refusal (an existing translation), but not a permission refusal: an
    // editor who may see the page may read it, a viewer who may not, may not.
    let args = json!({"table": "pages", "uid": 12, "language": 1});
    let lines = site
        .preview("create_translation_draft", "editor", args.clone())
        .await;
    assert!(lines[0].contains("already has a translation"), "{lines:?}");
    assert!(
        site.may_view("create_translation_draft", "editor", args.clone())
            .await
    );
    assert!(
        !site
            .may_view("create_translation_draft", "approver", args)
            .await
    );
}
