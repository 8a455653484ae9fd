use countersign_content::refusals::PAGE_NOT_PERMITTED;
use serde_json::json;
use sqlx::{PgPool, Row};

use crate::support::{text, Site};

const TOOL: &str = "create_page_draft";

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn creating_a_page_draft_previews_it_and_creates_a_hidden_standard_page(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({
        "parent": 14, "title": "E-bikes", "nav_title": "Electric", "after_page_uid": 15
    });

    let lines = site.preview(TOOL, "editor", args.clone()).await;
    insta::assert_snapshot!("create_page_draft_preview", text(&lines));

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    insta::assert_snapshot!("create_page_draft_output", out.content);
    let row = sqlx::query(
        "SELECT pid, title, nav_title, hidden, doktype, language, workspace
         FROM content.pages WHERE uid = 101",
    )
    .fetch_one(&site.pool)
    .await
    .unwrap();
    assert_eq!(row.get::<i64, _>("pid"), 14);
    assert_eq!(row.get::<String, _>("title"), "E-bikes");
    assert_eq!(row.get::<String, _>("nav_title"), "Electric");
    assert!(row.get::<bool, _>("hidden"));
    assert_eq!(row.get::<i32, _>("doktype"), 1);
    assert_eq!(row.get::<i32, _>("language"), 0);
    assert_eq!(row.get::<i32, _>("workspace"), 0);
    let order: Vec<i64> = sqlx::query_scalar(
        "SELECT uid FROM content.pages WHERE pid = 14 AND NOT deleted ORDER BY sorting, uid",
    )
    .fetch_all(&site.pool)
    .await
    .unwrap();
    assert_eq!(order, vec![15, 101]);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_page_draft_placed_after_no_sibling_comes_first(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let lines = site
        .preview(TOOL, "editor", json!({"parent": 10, "title": "News"}))
        .await;
    assert_eq!(lines[2], "navigation title: (empty)");
    // Subpages of 10: Home, About us, Products (the deleted and the draft page do not count).
    assert_eq!(lines[3], "position: 1 of 4, at the top");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_page_draft_below_a_page_the_user_may_not_edit_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    for (user, parent) in [
        ("editor", 20),
        ("editor", 16),
        ("editor", 999),
        ("approver", 12),
    ] {
        let args = json!({"parent": parent, "title": "Secret"});
        assert_eq!(
            site.preview(TOOL, user, args.clone()).await,
            vec![PAGE_NOT_PERMITTED.to_owned()],
            "{user} below {parent}"
        );
        assert_eq!(
            site.execute(TOOL, user, args).await.content,
            PAGE_NOT_PERMITTED
        );
    }
    assert_eq!(
        site.count("SELECT count(*) FROM content.pages WHERE title = 'Secret'")
            .await,
        0
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn page_drafts_that_cannot_be_created_are_refused_with_the_reason(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let cases = [
        (
            json!({"parent": 12, "title": " "}),
            "\"title\" must not be empty",
        ),
        (
            json!({"parent": 12, "title": "x", "slug": "/x"}),
            "\"slug\"",
        ),
        (
            json!({"parent": 12, "title": "x", "doktype": 254}),
            "\"doktype\"",
        ),
        (json!({"parent": 40, "title": "x"}), "is a translation"),
        (json!({"parent": 18, "title": "x"}), "workspace 1"),
        (
            json!({"parent": 14, "title": "x", "after_page_uid": 13}),
            "is not a live subpage of page [14]",
        ),
    ];
    for (args, reason) in cases {
        let out = site.execute(TOOL, "editor", args.clone()).await;
        assert!(out.is_error, "{args}");
        assert!(out.content.contains(reason), "{args}: {}", out.content);
    }
    assert_eq!(site.count("SELECT count(*) FROM content.pages").await, 12);
}
