use countersign_content::refusals::ASSET_NOT_PERMITTED;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{text, Site};

const TOOL: &str = "set_file_alternative_text";

async fn alternative(site: &Site, metadata_uid: i64) -> String {
    sqlx::query_scalar("SELECT alternative FROM content.file_metadata WHERE uid = $1")
        .bind(metadata_uid)
        .fetch_one(&site.pool)
        .await
        .expect("metadata row")
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn setting_an_alternative_text_previews_the_change_and_writes_the_default_language(
    pool: PgPool,
) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 7, "alternative": "A red bicycle"});

    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(
        lines,
        vec![
            "File [7] \"hero.jpg\" — alternative text (default language):".to_owned(),
            "alternative: (empty) → \"A red bicycle\"".to_owned(),
        ]
    );
    insta::assert_snapshot!("set_file_alternative_text_preview", text(&lines));

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    insta::assert_snapshot!("set_file_alternative_text_output", out.content);
    assert_eq!(alternative(&site, 1).await, "A red bicycle");
    // The German metadata record is another row and stays as it was.
    assert_eq!(alternative(&site, 2).await, "Ein rotes Fahrrad");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_file_without_a_metadata_record_is_refused_and_none_is_created(pool: PgPool) {
    let site = Site::seeded(pool).await;
    // logo.svg has no metadata at all; bicycle.png only a draft version in workspace 1.
    for uid in [10, 13] {
        let args = json!({"uid": uid, "alternative": "Logo"});
        let lines = site.preview(TOOL, "editor", args.clone()).await;
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("never creates one"), "{lines:?}");
        let out = site.execute(TOOL, "editor", args).await;
        assert!(out.is_error);
        assert_eq!(out.content, lines[0]);
    }
    assert_eq!(
        site.count("SELECT count(*) FROM content.file_metadata WHERE file IN (10, 13)")
            .await,
        1
    );
    assert_eq!(alternative(&site, 7).await, "A draft alternative text");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_file_outside_the_users_file_mounts_is_refused_with_the_neutral_string(pool: PgPool) {
    let site = Site::seeded(pool).await;
    // payroll.pdf is outside every mount; intro.mp4 is in a storage the restricted editor has
    // no mount in; 999 does not exist.
    for (user, uid) in [
        ("editor", 11),
        ("restricted", 12),
        ("editor", 999),
        ("nobody", 7),
    ] {
        let args = json!({"uid": uid, "alternative": "Leaked?"});
        assert_eq!(
            site.preview(TOOL, user, args.clone()).await,
            vec![ASSET_NOT_PERMITTED.to_owned()],
            "{user} on {uid}"
        );
        assert_eq!(
            site.execute(TOOL, user, args).await.content,
            ASSET_NOT_PERMITTED
        );
    }
    assert_eq!(
        site.count("SELECT count(*) FROM content.file_metadata WHERE alternative = 'Leaked?'")
            .await,
        0
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_user_without_the_default_language_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    site.exec("UPDATE content.users SET allowed_languages = '{1}' WHERE name = 'editor'")
        .await;
    let args = json!({"uid": 7, "alternative": "A red bicycle"});
    assert_eq!(
        site.preview(TOOL, "editor", args.clone()).await,
        vec![ASSET_NOT_PERMITTED.to_owned()]
    );
    assert_eq!(
        site.execute(TOOL, "editor", args).await.content,
        ASSET_NOT_PERMITTED
    );
    assert_eq!(alternative(&site, 1).await, "");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_language_argument_refuses_the_whole_call(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let out = site
        .execute(
            TOOL,
            "editor",
            json!({"uid": 7, "alternative": "Ein Fahrrad", "language": 1}),
        )
        .await;
    assert!(out.is_error);
    assert!(out.content.contains("\"language\""), "{}", out.content);
    assert_eq!(alternative(&site, 1).await, "");
    assert_eq!(alternative(&site, 2).await, "Ein rotes Fahrrad");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_missing_alternative_argument_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let out = site.execute(TOOL, "editor", json!({"uid": 7})).await;
    assert!(out.is_error);
    assert!(
        out.content.contains("\"alternative\" is required"),
        "{}",
        out.content
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_alternative_text_marked_as_an_exclude_field_is_caught_by_the_read_back(pool: PgPool) {
    let site = Site::seeded(pool).await;
    // One row of configuration away: the field becomes an exclude field nobody but the admin
    // holds a grant for.
    site.exec(
        "INSERT INTO content.exclude_fields (table_name, field) VALUES ('file_metadata', 'alternative')",
    )
    .await;
    let args = json!({"uid": 7, "alternative": "A red bicycle"});
    let lines = site.preview(TOOL, "restricted", args.clone()).await;
    assert!(lines[1].contains("will not be stored"), "{lines:?}");

    let out = site.execute(TOOL, "restricted", args.clone()).await;
    assert!(
        out.is_error,
        "a skipped field must not be reported as success"
    );
    assert!(out.content.contains("NOT written"), "{}", out.content);
    assert_eq!(alternative(&site, 1).await, "");

    let out = site.execute(TOOL, "admin", args).await;
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(alternative(&site, 1).await, "A red bicycle");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn clearing_an_alternative_text_is_a_write_that_is_verified(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 8, "alternative": ""});
    assert_eq!(
        site.preview(TOOL, "editor", args.clone()).await[1],
        "alternative: \"The team in front of the shop\" → (empty)"
    );
    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(alternative(&site, 3).await, "");
}
