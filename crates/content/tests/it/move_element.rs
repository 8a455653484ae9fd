use countersign_content::refusals::ELEMENT_NOT_PERMITTED;
use serde_json::json;
use sqlx::{PgPool, Row};

use crate::support::{text, Site};

const TOOL: &str = "move_content_element";

/// The live default-language elements of one column, top to bottom.
async fn column(site: &Site, page: i64, colpos: i32) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT uid FROM content.elements
         WHERE pid = $1 AND colpos = $2 AND language = 0 AND workspace = 0 AND NOT deleted
         ORDER BY sorting, uid",
    )
    .bind(page)
    .bind(colpos)
    .fetch_all(&site.pool)
    .await
    .expect("column")
}

async fn place(site: &Site, uid: i64) -> (i64, i32, i32) {
    let row = sqlx::query("SELECT pid, colpos, sorting FROM content.elements WHERE uid = $1")
        .bind(uid)
        .fetch_one(&site.pool)
        .await
        .expect("element");
    (row.get(0), row.get(1), row.get(2))
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn moving_an_element_previews_both_ends_and_lands_where_it_said(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 5, "target_page": 13, "after_content_uid": 8});

    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(
        lines[1],
        "from: page [12] \"Home\", column 0, position 2 of 2"
    );
    assert_eq!(
        lines[2],
        "to: page [13] \"About us\", column 0, position 2 of 2, after content element [8] \"Our story\""
    );
    insta::assert_snapshot!("move_content_element_preview", text(&lines));

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    insta::assert_snapshot!("move_content_element_output", out.content);
    assert_eq!(column(&site, 13, 0).await, vec![8, 5]);
    assert_eq!(column(&site, 12, 0).await, vec![4]);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_moved_element_takes_its_translations_along(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 4, "target_page": 13, "column": 1});
    let lines = site.preview(TOOL, "editor", args.clone()).await;
    assert_eq!(
        lines[2],
        "to: page [13] \"About us\", column 1, position 1 of 1, at the top"
    );
    assert_eq!(lines[3], "translations: 1 move with it");

    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    let (pid, colpos, sorting) = place(&site, 4).await;
    assert_eq!((pid, colpos), (13, 1));
    assert_eq!(place(&site, 44).await, (pid, colpos, sorting));
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn moving_twice_to_the_same_place_changes_nothing_the_second_time(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let args = json!({"uid": 4, "target_page": 12, "after_content_uid": 5});
    assert!(!site.execute(TOOL, "editor", args.clone()).await.is_error);
    let first = (column(&site, 12, 0).await, place(&site, 4).await);
    assert_eq!(first.0, vec![5, 4]);
    let out = site.execute(TOOL, "editor", args).await;
    assert!(!out.is_error, "{}", out.content);
    assert_eq!((column(&site, 12, 0).await, place(&site, 4).await), first);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_element_or_target_the_user_may_not_edit_is_refused_with_the_neutral_string(
    pool: PgPool,
) {
    let site = Site::seeded(pool).await;
    let cases = [
        // target outside the mounts, element outside the mounts, deleted element, missing
        // target, a neighbour outside the mounts, a German element for a user without German
        ("editor", json!({"uid": 5, "target_page": 21})),
        ("editor", json!({"uid": 9, "target_page": 12})),
        ("editor", json!({"uid": 7, "target_page": 13})),
        ("editor", json!({"uid": 5, "target_page": 999})),
        (
            "editor",
            json!({"uid": 5, "target_page": 12, "after_content_uid": 9}),
        ),
        ("restricted", json!({"uid": 44, "target_page": 13})),
    ];
    for (user, args) in cases {
        assert_eq!(
            site.preview(TOOL, user, args.clone()).await,
            vec![ELEMENT_NOT_PERMITTED.to_owned()],
            "{user}: {args}"
        );
        assert_eq!(
            site.execute(TOOL, user, args).await.content,
            ELEMENT_NOT_PERMITTED
        );
    }
    assert_eq!(place(&site, 5).await, (12, 0, 256));
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn moves_that_cannot_be_carried_out_are_refused_with_the_reason(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let cases = [
        (json!({"uid": 44, "target_page": 13}), "is a translation"),
        (json!({"uid": 5, "target_page": 40}), "is a translation"),
        (json!({"uid": 11, "target_page": 13}), "workspace 1"),
        (
            json!({"uid": 5, "target_page": 12, "after_content_uid": 6}),
            "is not in column 0 of page [12]",
        ),
        (
            json!({"uid": 5, "target_page": 12, "after_content_uid": 5}),
            "after itself",
        ),
        (
            json!({"uid": 5, "target_page": 12, "column": 100}),
            "from 0 to 99",
        ),
        (
            json!({"uid": 5, "target_page": 12, "position": 1}),
            "\"position\"",
        ),
    ];
    for (args, reason) in cases {
        let out = site.execute(TOOL, "editor", args.clone()).await;
        assert!(out.is_error, "{args}");
        assert!(out.content.contains(reason), "{args}: {}", out.content);
    }
    assert_eq!(place(&site, 5).await, (12, 0, 256));
    assert_eq!(place(&site, 44).await.0, 12);
}
