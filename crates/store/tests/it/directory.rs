//! The table directory: who it knows, who it has disabled, and whose runs each user may approve.

use countersign_core::{Approves, Principal, UserDirectory};
use countersign_store::{DirectoryUser, TableUsers};
use sqlx::PgPool;

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_user_is_known_until_disabled_and_known_again_once_enabled(pool: PgPool) {
    let users = TableUsers::new(pool);
    assert_eq!(users.principal("editor").await.unwrap(), None);

    users.put("editor", false).await.unwrap();
    assert_eq!(
        users.principal("editor").await.unwrap(),
        Some(Principal::new("editor", false))
    );

    assert!(users.set_disabled("editor", true).await.unwrap());
    assert_eq!(users.principal("editor").await.unwrap(), None);
    assert_eq!(users.approver("editor").await.unwrap(), None);

    assert!(users.set_disabled("editor", false).await.unwrap());
    assert!(users.principal("editor").await.unwrap().is_some());
    assert!(
        !users.set_disabled("nobody", true).await.unwrap(),
        "no such user"
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn approve_grants_name_agents_or_every_agent_and_an_administrator_needs_none(pool: PgPool) {
    let users = TableUsers::new(pool);
    users.put("reviewer", false).await.unwrap();
    users.put("chief", true).await.unwrap();

    let reviewer = users.approver("reviewer").await.unwrap().unwrap();
    assert!(!reviewer.may_approve_runs_of("wiki-assistant"));

    assert!(users
        .grant_approve("reviewer", "wiki-assistant")
        .await
        .unwrap());
    assert!(
        users
            .grant_approve("reviewer", "wiki-assistant")
            .await
            .unwrap(),
        "granting twice is one grant"
    );
    let reviewer = users.approver("reviewer").await.unwrap().unwrap();
    assert!(reviewer.may_approve_runs_of("wiki-assistant"));
    assert!(!reviewer.may_approve_runs_of("catalogue"));

    assert!(users.grant_approve("reviewer", "*").await.unwrap());
    let reviewer = users.approver("reviewer").await.unwrap().unwrap();
    assert_eq!(reviewer.approves(), Approves::Every);

    let chief = users.approver("chief").await.unwrap().unwrap();
    assert_eq!(chief.principal(), &Principal::new("chief", true));
    assert!(chief.may_approve_runs_of("catalogue"));

    assert!(
        !users.grant_approve("nobody", "*").await.unwrap(),
        "no such user"
    );
    assert!(users.revoke_approve("reviewer", "*").await.unwrap());
    assert!(
        !users.revoke_approve("reviewer", "*").await.unwrap(),
        "gone already"
    );
    let reviewer = users.approver("reviewer").await.unwrap().unwrap();
    assert!(!reviewer.may_approve_runs_of("catalogue"));
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn adding_an_existing_user_updates_the_admin_flag_enables_them_and_keeps_their_grants(
    pool: PgPool,
) {
    let users = TableUsers::new(pool);
    users.put("reviewer", true).await.unwrap();
    users
        .grant_approve("reviewer", "wiki-assistant")
        .await
        .unwrap();
    users.set_disabled("reviewer", true).await.unwrap();
    users.put("reviewer", false).await.unwrap();
    users.put("auditor", false).await.unwrap();
    assert_eq!(
        users.list().await.unwrap(),
        vec![
            DirectoryUser {
                name: "auditor".into(),
                admin: false,
                disabled: false,
                approves: vec![],
            },
            DirectoryUser {
                name: "reviewer".into(),
                admin: false,
                disabled: false,
                approves: vec!["wiki-assistant".into()],
            },
        ]
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_blank_user_name_or_a_malformed_agent_name_is_refused_by_the_schema(pool: PgPool) {
    let users = TableUsers::new(pool);
    assert!(users.put(" ", false).await.is_err());
    users.put("reviewer", false).await.unwrap();
    assert!(users.grant_approve("reviewer", "no spaces").await.is_err());
    assert!(users.list().await.unwrap()[0].approves.is_empty());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn the_engine_migrator_installs_no_content_schema(pool: PgPool) {
    let content: Option<String> = sqlx::query_scalar("SELECT to_regnamespace('content')::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(content, None);
}
