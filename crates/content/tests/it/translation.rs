use countersign_content::refusals::{ELEMENT_NOT_PERMITTED, PAGE_NOT_PERMITTED};
use serde_json::json;
use sqlx::{PgPool, Row};

use crate::support::{text, Site};

const TOOL: &str = "create_translation_draft";

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn translating_a_page_previews_the_copy_and_creates_it_hidden(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"table": "pages", "uid": 14, "language": 1});

    let lines = site.preview(TOOL, "editor", args.clone()).await;
    insta::assert_snapshot!("create_translation_draft_page_preview", text(&lines));

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    insta::assert_snapshot!("create_translation_draft_page_output", out.content);
    let row = sqlx::query(
        "SELECT pid, language, l10n_parent, hidden, title, description FROM content.pages
         WHERE uid = 101",
    )
    .fetch_one(&site.pool)
    .await
    .unwrap();
    assert_eq!(row.get::<i64, _>("pid"), 10);
    assert_eq!(row.get::<i32, _>("language"), 1);
    assert_eq!(row.get::<Option<i64>, _>("l10n_parent"), Some(14));
    assert!(row.get::<bool, _>("hidden"));
    assert_eq!(row.get::<String, _>("title"), "Products");
    assert_eq!(row.get::<String, _>("description"), "What we sell.");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_existing_translation_is_refused_unless_the_call_overwrites_it(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"table": "pages", "uid": 12, "language": 1});
    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(lines.len(), 1);
    insta::assert_snapshot!("create_translation_draft_existing", lines[0]);
    let out = site.execute(TOOL, "editor", args).await;
    assert!(out.is_error);
    assert_eq!(
        site.count("SELECT count(*) FROM content.pages WHERE uid = 40 AND NOT deleted")
            .await,
        1
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn overwriting_says_it_discards_the_existing_translation_and_does(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"table": "pages", "uid": 12, "language": 1, "overwrite": true});

    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert!(
        lines.contains(
            &"DISCARDS the existing translation page [40] \"Startseite\": it is marked deleted \
              and replaced by this copy"
                .to_owned()
        ),
        "{lines:?}"
    );
    insta::assert_snapshot!("create_translation_draft_overwrite_preview", text(&lines));

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(
        site.count("SELECT count(*) FROM content.pages WHERE uid = 40 AND deleted")
            .await,
        1
    );
    assert_eq!(
        site.count(
            "SELECT count(*) FROM content.pages
             WHERE l10n_parent = 12 AND language = 1 AND NOT deleted AND hidden
               AND title = 'Home' AND seo_title = 'Home | countersign demo'"
        )
        .await,
        1
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn translating_an_element_copies_its_references_and_discards_an_old_translation(
    pool: PgPool,
) {
    let site = Site::seeded(pool).await;
    let args = json!({"table": "content", "uid": 5, "language": 1});
    let lines = site.preview(TOOL, "editor", args.clone()).await;
    insta::assert_snapshot!("create_translation_draft_content_preview", text(&lines));
    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(
        site.count(
            "SELECT count(*) FROM content.file_references r
             JOIN content.elements e ON e.uid = r.element
             WHERE e.l10n_parent = 5 AND e.language = 1 AND e.hidden AND NOT r.deleted"
        )
        .await,
        2
    );

    let args = json!({"table": "content", "uid": 4, "language": 1, "overwrite": true});
    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert!(
        lines.iter().any(|l| l
            .starts_with("DISCARDS the existing translation content element [44] \"Willkommen\"")),
        "{lines:?}"
    );
    assert!(!site.execute(TOOL, "editor", args).await.is_error);
    assert_eq!(
        site.count("SELECT count(*) FROM content.elements WHERE uid = 44 AND deleted")
            .await,
        1
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_language_the_user_may_not_use_is_refused_with_the_neutral_string(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let cases = [
        (
            json!({"table": "pages", "uid": 14, "language": 1}),
            PAGE_NOT_PERMITTED,
        ),
        (
            json!({"table": "content", "uid": 6, "language": 1}),
            ELEMENT_NOT_PERMITTED,
        ),
    ];
    for (args, refusal) in cases {
        assert_eq!(
            site.preview(TOOL, "restricted", args.clone()).await,
            vec![refusal.to_owned()]
        );
        assert_eq!(
            site.execute(TOOL, "restricted", args).await.content,
            refusal
        );
    }
    assert_eq!(
        site.count("SELECT count(*) FROM content.pages WHERE language = 1")
            .await,
        2
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn translations_that_cannot_be_made_are_refused_with_the_reason(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let cases = [
        (
            "editor",
            json!({"table": "pages", "uid": 14, "language": 0}),
            "must not be 0",
        ),
        (
            "editor",
            json!({"table": "users", "uid": 1, "language": 1}),
            "pages, content",
        ),
        (
            "editor",
            json!({"table": "pages", "uid": 40, "language": 1}),
            "itself a translation",
        ),
        (
            "editor",
            json!({"table": "pages", "uid": 18, "language": 1}),
            "workspace 1",
        ),
        (
            "admin",
            json!({"table": "pages", "uid": 14, "language": 7}),
            "not configured",
        ),
        (
            "admin",
            json!({"table": "content", "uid": 9, "language": 1}),
            "Page [21] has no translation in German (language 1) yet",
        ),
    ];
    for (user, args, reason) in cases {
        let out = site.execute(TOOL, user, args.clone()).await;
        assert!(out.is_error, "{args}");
        assert!(out.content.contains(reason), "{args}: {}", out.content);
    }
    assert_eq!(site.count("SELECT count(*) FROM content.pages").await, 12);
    assert_eq!(site.count("SELECT count(*) FROM content.elements").await, 8);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_copied_field_the_user_holds_no_grant_for_is_caught_by_the_read_back(pool: PgPool) {
    let site = Site::seeded(pool).await;
    site.exec("UPDATE content.users SET allowed_languages = '{0,1}' WHERE name = 'restricted'")
        .await;
    let out = site
        .execute(
            TOOL,
            "restricted",
            json!({"table": "pages", "uid": 12, "language": 1, "overwrite": true}),
        )
        .await;
    assert!(out.is_error, "{}", out.content);
    assert!(out.content.contains("seo_title"), "{}", out.content);
}
