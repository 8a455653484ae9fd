use countersign_content::refusals::PAGE_NOT_PERMITTED;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{text, user, Site};

const TOOL: &str = "update_page_metadata";

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn updating_page_metadata_previews_each_field_and_writes_it(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 12, "description": "A shorter welcome.", "title": "Home"});

    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(lines[0], "Page [12] \"Home\" — 2 field(s):");
    assert_eq!(lines[2], "title: unchanged (\"Home\")");
    insta::assert_snapshot!("update_page_metadata_preview", text(&lines));

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    insta::assert_snapshot!("update_page_metadata_output", out.content);
    assert_eq!(
        site.page_text(12, "description").await,
        "A shorter welcome."
    );
    assert_eq!(site.page_text(12, "title").await, "Home");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn every_page_the_user_may_not_edit_gets_the_same_neutral_refusal(pool: PgPool) {
    let site = Site::seeded(pool).await;
    // Outside the mounts, missing, deleted, below a deleted page, and an unknown user.
    let cases = [
        ("editor", 21),
        ("editor", 999),
        ("editor", 16),
        ("editor", 17),
        ("admin", 16),
        ("mallory", 12),
    ];
    for (user, uid) in cases {
        let args = json!({"uid": uid, "description": "Overwritten."});
        assert_eq!(
            site.preview(TOOL, user, args.clone()).await,
            vec![PAGE_NOT_PERMITTED.to_owned()],
            "{user} on {uid}"
        );
        let out = site.execute(TOOL, user, args).await;
        assert!(out.is_error);
        assert_eq!(out.content, PAGE_NOT_PERMITTED, "{user} on {uid}");
    }
    assert_eq!(
        site.count("SELECT count(*) FROM content.pages WHERE description = 'Overwritten.'")
            .await,
        0
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_page_in_a_language_the_user_may_not_use_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 40, "description": "Neu."});
    assert_eq!(
        site.preview(TOOL, "restricted", args.clone()).await,
        vec![PAGE_NOT_PERMITTED.to_owned()]
    );
    let out = site.execute(TOOL, "restricted", args.clone()).await;
    assert_eq!(out.content, PAGE_NOT_PERMITTED);
    assert_eq!(site.page_text(40, "description").await, "Willkommen.");

    // The editor may use German, so the same call goes through for them.
    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(site.page_text(40, "description").await, "Neu.");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_page_in_a_draft_workspace_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 18, "description": "Live now."});
    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(lines.len(), 1);
    assert!(lines[0].contains("workspace 1"), "{lines:?}");
    let out = site.execute(TOOL, "editor", args).await;
    assert!(out.is_error);
    assert_eq!(out.content, lines[0]);
    assert_eq!(site.page_text(18, "description").await, "A draft.");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_unknown_argument_refuses_the_whole_call(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 12, "description": "Half of it.", "slug": "/elsewhere"});
    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(lines.len(), 1);
    assert!(lines[0].contains("\"slug\""), "{lines:?}");
    let out = site.execute(TOOL, "editor", args).await;
    assert!(out.is_error);
    insta::assert_snapshot!("update_page_metadata_unknown_argument", out.content);
    assert_ne!(site.page_text(12, "description").await, "Half of it.");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_empty_title_is_refused_up_front_even_for_an_admin(pool: PgPool) {
    let site = Site::seeded(pool).await;
    for title in ["", "   "] {
        let args = json!({"uid": 12, "title": title, "subtitle": "Kept?"});
        let out = site.execute(TOOL, "admin", args).await;
        assert!(out.is_error);
        assert!(
            out.content.contains("\"title\" must not be empty"),
            "{}",
            out.content
        );
    }
    assert_eq!(site.page_text(12, "title").await, "Home");
    assert_eq!(site.page_text(12, "subtitle").await, "Start here");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_value_longer_than_its_cap_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let out = site
        .execute(TOOL, "editor", json!({"uid": 12, "title": "x".repeat(256)}))
        .await;
    assert!(out.is_error);
    assert!(out.content.contains("at most 255"), "{}", out.content);
    assert_eq!(site.page_text(12, "title").await, "Home");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn clearing_an_optional_field_is_written_and_verified(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 12, "subtitle": ""});
    assert_eq!(
        site.preview(TOOL, "editor", args.clone()).await[1],
        "subtitle: \"Start here\" → (empty)"
    );
    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(site.page_text(12, "subtitle").await, "");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_field_the_user_holds_no_grant_for_is_caught_by_the_read_back(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 12, "description": "Shorter.", "seo_title": "Home, better"});

    let lines = site.preview(TOOL, "restricted", args.clone()).await;
    insta::assert_snapshot!("update_page_metadata_ungranted_preview", text(&lines));

    let out = site.execute(TOOL, "restricted", args).await;
    assert!(
        out.is_error,
        "a skipped field must not be reported as success"
    );
    insta::assert_snapshot!("update_page_metadata_ungranted_output", out.content);
    // The write path skipped the field silently and wrote the rest, as the CMS does.
    assert_eq!(site.page_text(12, "description").await, "Shorter.");
    assert_eq!(
        site.page_text(12, "seo_title").await,
        "Home | countersign demo"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_same_seo_field_is_written_for_an_editor_holding_the_grant(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let out = site
        .execute(
            TOOL,
            "editor",
            json!({"uid": 12, "seo_title": "Home, better"}),
        )
        .await;
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(site.page_text(12, "seo_title").await, "Home, better");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_field_a_migration_renamed_is_refused_by_name_once_the_live_schema_is_read_again(
    pool: PgPool,
) {
    let site = Site::seeded(pool).await;
    // The writer has read the live columns: every field of its allow-list is there.
    let description = json!({"uid": 12, "description": "Still here."});
    assert_eq!(
        site.preview(TOOL, "editor", description.clone()).await[0],
        "Page [12] \"Home\" — 1 field(s):"
    );

    // A migration renames a column while the writer runs.
    site.exec("ALTER TABLE content.pages RENAME COLUMN twitter_title TO twitter_heading")
        .await;
    let args = json!({"uid": 12, "twitter_title": "Blindly?"});
    let first = site.previewer(TOOL).preview(&user("editor"), &args).await;
    assert!(
        first.is_err(),
        "the database says a column is missing: {first:?}"
    );

    // Read again, the live columns no longer have it: the field is refused by name.
    let refusal =
        "Field twitter_title is not a column of this installation's pages; nothing was changed.";
    assert_eq!(
        site.preview(TOOL, "editor", args.clone()).await,
        vec![refusal]
    );
    let out = site.execute(TOOL, "editor", args).await;
    assert!(out.is_error);
    assert_eq!(out.content, refusal);
    assert_eq!(
        site.count("SELECT count(*) FROM content.pages WHERE twitter_heading = 'Blindly?'")
            .await,
        0
    );
}
