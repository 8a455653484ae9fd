//! The acting user a segment reads once: its directory attaches it to the principal, and the
//! tools check against it instead of reading it again.

use countersign_content::ContentUsers;
use countersign_core::{Principal, UserDirectory};
use serde_json::json;
use sqlx::PgPool;

use crate::support::Site;

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_principal_from_the_directory_is_checked_against_the_user_as_read_and_any_other_is_read_afresh(
    pool: PgPool,
) {
    let site = Site::seeded(pool.clone()).await;
    let call = json!({"uid": 12, "description": "Shorter."});
    let read = ContentUsers::new(pool.clone())
        .principal("editor")
        .await
        .unwrap()
        .expect("the editor exists");
    let previewer = site.previewer("update_page_metadata");
    let permitted = previewer.preview(&read, &call).await.unwrap();
    assert!(
        permitted.iter().any(|l| l.contains("Shorter.")),
        "the editor may edit page 12: {permitted:?}"
    );

    // The editor loses the page mount after the directory read them.
    sqlx::query("UPDATE content.users SET page_mounts = '{}' WHERE name = 'editor'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        previewer.preview(&read, &call).await.unwrap(),
        permitted,
        "the principal carries the user as its directory read them"
    );
    let refused = previewer
        .preview(&Principal::new("editor", false), &call)
        .await
        .unwrap();
    assert_ne!(refused, permitted, "a bare principal is read afresh");
    assert!(
        !refused.iter().any(|l| l.contains("Shorter.")),
        "read afresh, the editor may no longer edit page 12: {refused:?}"
    );

    // A profile is only ever the user it was read for.
    let renamed = Principal {
        name: "approver".into(),
        ..read.clone()
    };
    assert_eq!(
        previewer.preview(&renamed, &call).await.unwrap(),
        site.preview("update_page_metadata", "approver", call.clone())
            .await,
        "a principal naming another user than its profile is read afresh"
    );
}
