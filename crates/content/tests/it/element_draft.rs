use countersign_content::refusals::PAGE_NOT_PERMITTED;
use serde_json::json;
use sqlx::{PgPool, Row};

use crate::support::{text, Site};

const TOOL: &str = "create_content_element_draft";

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn creating_an_element_draft_previews_it_and_creates_it_hidden(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({
        "page": 12, "header": "Spring sale", "bodytext": "Everything must go.",
        "after_content_uid": 5
    });

    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(
        lines.last().unwrap(),
        "visibility: hidden — a human must unhide it before anyone sees it"
    );
    insta::assert_snapshot!("create_content_element_draft_preview", text(&lines));

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    insta::assert_snapshot!("create_content_element_draft_output", out.content);
    let row = sqlx::query(
        "SELECT pid, ctype, header, bodytext, colpos, hidden, language FROM content.elements
         WHERE uid = 101",
    )
    .fetch_one(&site.pool)
    .await
    .unwrap();
    assert_eq!(row.get::<i64, _>("pid"), 12);
    assert_eq!(row.get::<String, _>("ctype"), "text");
    assert_eq!(row.get::<String, _>("header"), "Spring sale");
    assert_eq!(row.get::<String, _>("bodytext"), "Everything must go.");
    assert!(row.get::<bool, _>("hidden"));
    assert_eq!(row.get::<i32, _>("language"), 0);
    let order: Vec<i64> = sqlx::query_scalar(
        "SELECT uid FROM content.elements
         WHERE pid = 12 AND colpos = 0 AND language = 0 AND workspace = 0 AND NOT deleted
         ORDER BY sorting, uid",
    )
    .fetch_all(&site.pool)
    .await
    .unwrap();
    assert_eq!(order, vec![4, 5, 101]);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn without_a_neighbour_the_draft_goes_to_the_top_of_the_column(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let lines = site
        .preview(
            TOOL,
            "editor",
            json!({"page": 13, "header": "Intro", "type": "header"}),
        )
        .await;
    assert_eq!(lines[1], "type: header");
    assert_eq!(lines[3], "bodytext: (empty)");
    assert_eq!(lines[4], "position: column 0, 1 of 2, at the top");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_element_draft_on_a_page_the_user_may_not_edit_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    for (user, page) in [
        ("editor", 21),
        ("editor", 16),
        ("approver", 12),
        ("nobody", 12),
    ] {
        let args = json!({"page": page, "header": "Hello"});
        assert_eq!(
            site.preview(TOOL, user, args.clone()).await,
            vec![PAGE_NOT_PERMITTED.to_owned()],
            "{user} on {page}"
        );
        assert_eq!(
            site.execute(TOOL, user, args).await.content,
            PAGE_NOT_PERMITTED
        );
    }
    assert_eq!(site.count("SELECT count(*) FROM content.elements").await, 8);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn element_drafts_that_cannot_be_created_are_refused_with_the_reason(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let cases = [
        (
            json!({"page": 12, "header": ""}),
            "\"header\" must not be empty",
        ),
        (json!({"page": 12}), "\"header\" is required"),
        (
            json!({"page": 12, "header": "x", "type": "html"}),
            "must be one of",
        ),
        (
            json!({"page": 12, "header": "x", "hidden": false}),
            "\"hidden\"",
        ),
        (json!({"page": 40, "header": "Hallo"}), "is a translation"),
        (json!({"page": 18, "header": "x"}), "workspace 1"),
        (
            json!({"page": 12, "header": "x", "after_content_uid": 8}),
            "is not in column 0 of page [12]",
        ),
    ];
    for (args, reason) in cases {
        let out = site.execute(TOOL, "editor", args.clone()).await;
        assert!(out.is_error, "{args}");
        assert!(out.content.contains(reason), "{args}: {}", out.content);
    }
    assert_eq!(site.count("SELECT count(*) FROM content.elements").await, 8);
}
