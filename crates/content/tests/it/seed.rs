use countersign_content::{lookup_user, seed_demo_site, ContentUsers, AGENT_APPROVE};
use countersign_core::{Principal, UserDirectory};
use sqlx::PgPool;

use crate::support::Site;

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn seeding_twice_changes_nothing(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let tables = [
        "users",
        "file_mounts",
        "pages",
        "elements",
        "files",
        "file_metadata",
        "file_references",
    ];
    let mut before = Vec::new();
    for t in tables {
        before.push(
            site.count(&format!("SELECT count(*) FROM content.{t}"))
                .await,
        );
    }
    seed_demo_site(&site.pool).await.expect("second seed");
    for (t, n) in tables.iter().zip(before) {
        assert_eq!(
            site.count(&format!("SELECT count(*) FROM content.{t}"))
                .await,
            n,
            "{t}"
        );
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_demo_users_are_an_admin_an_editor_an_approver_and_a_restricted_editor(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let admin = lookup_user(&site.pool, "admin").await.unwrap().unwrap();
    assert!(admin.admin);
    let editor = lookup_user(&site.pool, "editor").await.unwrap().unwrap();
    assert!(!editor.admin && !editor.page_mounts.is_empty() && !editor.file_mounts.is_empty());
    assert!(editor.holds_field_grant("pages", "seo_title"));
    let approver = lookup_user(&site.pool, "approver").await.unwrap().unwrap();
    assert!(approver.has_grant(AGENT_APPROVE) && !approver.admin);
    let restricted = lookup_user(&site.pool, "restricted")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(restricted.page_mounts, editor.page_mounts);
    assert!(!restricted.holds_field_grant("pages", "seo_title"));
    assert!(lookup_user(&site.pool, "mallory").await.unwrap().is_none());
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_user_directory_answers_with_the_stored_admin_flag(pool: PgPool) {
    let site = Site::seeded(pool).await;
    site.exec("INSERT INTO content.users (name, disabled) VALUES ('former', true)")
        .await;
    let directory = ContentUsers::new(site.pool.clone());
    assert_eq!(
        directory.principal("admin").await.unwrap(),
        Some(Principal::new("admin", true))
    );
    assert_eq!(
        directory.principal("editor").await.unwrap(),
        Some(Principal::new("editor", false))
    );
    assert_eq!(directory.principal("mallory").await.unwrap(), None);
    assert_eq!(directory.principal("former").await.unwrap(), None);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_user_directory_lets_admins_and_holders_of_agent_approve_approve_runs(pool: PgPool) {
    let site = Site::seeded(pool).await;
    site.exec(
        "INSERT INTO content.users (name, grants, disabled) VALUES ('former', '{agent_approve}', true)",
    )
    .await;
    let directory = ContentUsers::new(site.pool.clone());
    for (name, admin, may_approve) in [
        ("admin", true, true),
        ("approver", false, true),
        ("editor", false, false),
        ("restricted", false, false),
    ] {
        let approver = directory.approver(name).await.unwrap().expect(name);
        assert_eq!(approver.principal(), &Principal::new(name, admin), "{name}");
        // The content store's grant is not scoped: it covers every agent's runs.
        for agent in ["assistant", "another-agent"] {
            assert_eq!(
                approver.may_approve_runs_of(agent),
                may_approve,
                "{name} {agent}"
            );
        }
    }
    assert_eq!(directory.approver("mallory").await.unwrap(), None);
    assert_eq!(
        directory.approver("former").await.unwrap(),
        None,
        "a disabled user approves nothing, granted or not"
    );
}
