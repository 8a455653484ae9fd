use countersign_content::refusals::ELEMENT_OR_FILE_NOT_PERMITTED;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{text, Site};

const TOOL: &str = "attach_file_to_content_element";

async fn image_files(site: &Site, element: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT file FROM content.file_references
         WHERE element = $1 AND field = 'image' AND NOT deleted ORDER BY sorting, uid",
    )
    .bind(element)
    .fetch_all(&site.pool)
    .await
    .expect("references")
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn attaching_a_file_previews_the_count_and_appends_it_last(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({
        "content_element": 5, "file": 7,
        "title": "Spring", "alternative": "A red bicycle"
    });

    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(lines[0], "Content element [5] \"Teaser\" on page [12]");
    assert_eq!(lines[1], "field image: 2 reference(s) → 3, appended last");
    assert_eq!(lines[2], "file [7] \"hero.jpg\" (/images/hero.jpg)");
    insta::assert_snapshot!("attach_file_preview", text(&lines));

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    insta::assert_snapshot!("attach_file_output", out.content);
    assert_eq!(image_files(&site, 5).await, vec![7, 8, 7]);
    assert_eq!(
        site.count(
            "SELECT count(*) FROM content.file_references
             WHERE element = 5 AND sorting = 4 AND title = 'Spring'
               AND alternative = 'A red bicycle' AND description = ''"
        )
        .await,
        1
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_concurrent_attach_between_preview_and_resume_moves_the_preview(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"content_element": 5, "file": 8});
    let shown = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(shown[1], "field image: 2 reference(s) → 3, appended last");

    // Another run attaches a file to the same field while the first one waits for approval.
    let other = site
        .execute(TOOL, "admin", json!({"content_element": 5, "file": 10}))
        .await;
    assert!(!other.is_error, "{}", other.content);

    let now = site.preview(TOOL, "editor", args).await;
    assert_eq!(now[1], "field image: 3 reference(s) → 4, appended last");
    assert_ne!(shown, now, "the approver must see that the operand moved");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_file_whose_extension_the_field_does_not_accept_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"content_element": 5, "file": 9, "field": "image"});
    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(lines.len(), 1);
    insta::assert_snapshot!("attach_file_disallowed_extension", lines[0]);
    let out = site.execute(TOOL, "editor", args).await;
    assert!(out.is_error);
    assert_eq!(out.content, lines[0]);
    assert_eq!(image_files(&site, 5).await, vec![7, 8]);

    // The assets field accepts documents.
    let out = site
        .execute(
            TOOL,
            "editor",
            json!({"content_element": 5, "file": 9, "field": "assets"}),
        )
        .await;
    assert!(!out.is_error, "{}", out.content);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_element_or_file_the_user_may_not_use_is_refused_with_one_neutral_string(pool: PgPool) {
    let site = Site::seeded(pool).await;
    // A file outside the mounts, an element outside the mounts, a deleted element, a missing
    // file, and a German element for a user without German.
    let cases = [
        ("editor", 5, 11),
        ("editor", 9, 7),
        ("editor", 7, 7),
        ("editor", 5, 999),
        ("restricted", 44, 7),
    ];
    for (user, element, file) in cases {
        let args = json!({"content_element": element, "file": file});
        assert_eq!(
            site.preview(TOOL, user, args.clone()).await,
            vec![ELEMENT_OR_FILE_NOT_PERMITTED.to_owned()],
            "{user}: {element} + {file}"
        );
        assert_eq!(
            site.execute(TOOL, user, args).await.content,
            ELEMENT_OR_FILE_NOT_PERMITTED
        );
    }
    assert_eq!(
        site.count("SELECT count(*) FROM content.file_references")
            .await,
        4
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_element_in_a_draft_workspace_is_refused(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let out = site
        .execute(TOOL, "editor", json!({"content_element": 11, "file": 7}))
        .await;
    assert!(out.is_error);
    assert!(out.content.contains("workspace 1"), "{}", out.content);
    assert_eq!(
        site.count("SELECT count(*) FROM content.file_references")
            .await,
        4
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_unknown_reference_field_refuses_the_whole_call(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let out = site
        .execute(
            TOOL,
            "editor",
            json!({"content_element": 5, "file": 7, "field": "gallery"}),
        )
        .await;
    assert!(out.is_error);
    assert!(
        out.content.contains("image, assets, media"),
        "{}",
        out.content
    );
    assert_eq!(
        site.count("SELECT count(*) FROM content.file_references")
            .await,
        4
    );
}
