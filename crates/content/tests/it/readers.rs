use countersign_content::refusals::{
    ASSET_NOT_PERMITTED, ELEMENT_NOT_PERMITTED, ELEMENT_OR_FILE_NOT_PERMITTED, PAGE_NOT_PERMITTED,
};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::support::Site;

fn parse(content: &str) -> Value {
    serde_json::from_str(content).expect("reader output is JSON")
}

fn uids(list: &Value) -> Vec<i64> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|v| v["uid"].as_i64().expect("uid"))
        .collect()
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn read_page_metadata_returns_the_descriptive_fields_and_translations(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let out = site
        .read("read_page_metadata", "editor", json!({"uid": 12}))
        .await;
    assert!(!out.is_error, "{}", out.content);
    let page = parse(&out.content);
    assert_eq!(page["title"], "Home");
    assert_eq!(page["seo_title"], "Home | countersign demo");
    assert_eq!(page["translations"], json!([{"uid": 40, "language": 1}]));

    // The restricted editor may not use German, so the translation is not listed.
    let out = site
        .read("read_page_metadata", "restricted", json!({"uid": 12}))
        .await;
    assert_eq!(parse(&out.content)["translations"], json!([]));
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_reader_and_the_writers_of_the_same_records_refuse_with_the_same_string(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let pairs = [
        (
            ("read_page_metadata", json!({"uid": 21})),
            ("update_page_metadata", json!({"uid": 21, "title": "x"})),
            PAGE_NOT_PERMITTED,
        ),
        (
            ("read_fal_asset_meta", json!({"uid": 11})),
            (
                "set_file_alternative_text",
                json!({"uid": 11, "alternative": "x"}),
            ),
            ASSET_NOT_PERMITTED,
        ),
        (
            ("list_content_elements", json!({"page": 21})),
            ("move_content_element", json!({"uid": 9, "target_page": 12})),
            ELEMENT_NOT_PERMITTED,
        ),
    ];
    for ((reader, read_args), (writer, write_args), refusal) in pairs {
        let read = site.read(reader, "editor", read_args).await;
        let write = site.execute(writer, "editor", write_args).await;
        assert!(read.is_error && write.is_error);
        assert_eq!(read.content, refusal, "{reader}");
        assert_eq!(write.content, refusal, "{writer}");
    }
    let attach = site
        .execute(
            "attach_file_to_content_element",
            "editor",
            json!({"content_element": 9, "file": 11}),
        )
        .await;
    assert_eq!(attach.content, ELEMENT_OR_FILE_NOT_PERMITTED);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn search_pages_lists_only_pages_the_user_may_edit(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let search = |user: &'static str, query: &'static str| {
        let site = &site;
        async move {
            let out = site
                .read("search_pages", user, json!({"query": query}))
                .await;
            assert!(!out.is_error, "{}", out.content);
            uids(&parse(&out.content)["pages"])
        }
    };
    // "e" is in nearly every title: deleted, draft and foreign-tree pages must not show.
    assert_eq!(
        search("editor", "e").await,
        vec![10, 12, 13, 14, 15, 40, 41]
    );
    assert_eq!(search("restricted", "e").await, vec![10, 12, 13, 14, 15]);
    assert_eq!(search("admin", "staff").await, vec![21]);
    assert_eq!(search("editor", "staff").await, Vec::<i64>::new());
    assert_eq!(search("approver", "e").await, Vec::<i64>::new());
    // Pattern characters are taken literally.
    assert_eq!(search("admin", "%").await, Vec::<i64>::new());
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn list_content_elements_lists_columns_in_order_and_hides_files_outside_the_mounts(
    pool: PgPool,
) {
    let site = Site::seeded(pool).await;
    // A document reference the restricted editor (images only) may not see the file of.
    site.exec(
        "INSERT INTO content.file_references (element, field, file, sorting) VALUES (5, 'assets', 9, 1)",
    )
    .await;
    let out = site
        .read("list_content_elements", "restricted", json!({"page": 12}))
        .await;
    assert!(!out.is_error, "{}", out.content);
    let list = parse(&out.content);
    let elements = &list["elements"];
    assert_eq!(uids(elements), vec![4, 5, 6]);
    assert_eq!(elements[1]["position"], 2);
    assert_eq!(elements[2]["column"], 1);
    assert_eq!(elements[2]["position"], 1);
    let refs = elements[1]["references"].as_array().unwrap();
    assert_eq!(refs.len(), 3);
    assert_eq!(
        refs[0],
        json!({"field": "assets", "file": 9, "accessible": false})
    );
    assert_eq!(refs[1]["name"], "hero.jpg");

    let out = site
        .read(
            "list_content_elements",
            "editor",
            json!({"page": 12, "language": 1}),
        )
        .await;
    assert_eq!(uids(&parse(&out.content)["elements"]), vec![44]);
    let out = site
        .read(
            "list_content_elements",
            "restricted",
            json!({"page": 12, "language": 1}),
        )
        .await;
    assert_eq!(out.content, ELEMENT_NOT_PERMITTED);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn read_fal_asset_meta_is_for_admins_only(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let spec = site.tool("read_fal_asset_meta").spec().clone();
    assert!(spec.requires_admin);
    assert_eq!(spec.group, "structure");

    let out = site
        .read("read_fal_asset_meta", "admin", json!({"uid": 7}))
        .await;
    assert!(!out.is_error, "{}", out.content);
    let file = parse(&out.content);
    assert_eq!(file["identifier"], "/images/hero.jpg");
    assert_eq!(file["metadata"]["title"], "Hero");
    assert_eq!(file["references"], 1);

    // Even a file inside the editor's mounts: the stored admin flag decides.
    let out = site
        .read("read_fal_asset_meta", "editor", json!({"uid": 7}))
        .await;
    assert_eq!(out.content, ASSET_NOT_PERMITTED);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn search_fal_files_lists_only_files_inside_the_mounts(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let search = |user: &'static str, args: Value| {
        let site = &site;
        async move {
            let out = site.read("search_fal_files", user, args).await;
            assert!(!out.is_error, "{}", out.content);
            uids(&parse(&out.content)["files"])
        }
    };
    assert_eq!(
        search("admin", json!({"extension": "pdf"})).await,
        vec![9, 11]
    );
    assert_eq!(search("editor", json!({"extension": "PDF"})).await, vec![9]);
    assert_eq!(search("editor", json!({"query": "hero"})).await, vec![7]);
    assert_eq!(
        search("restricted", json!({"query": "o"})).await,
        vec![7, 8, 10]
    );
    let out = site.read("search_fal_files", "editor", json!({})).await;
    assert!(out.is_error);
}
