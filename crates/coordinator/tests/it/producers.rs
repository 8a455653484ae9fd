use countersign_coordinator::producers::{self, ProducerKind, ANY};
use countersign_coordinator::ProducerError;
use sqlx::PgPool;

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_grant_lets_its_amqp_user_assert_that_name_and_no_other(pool: PgPool) {
    assert!(
        producers::allow(&pool, "inbox-ui", ProducerKind::Approver, "alice")
            .await
            .unwrap()
    );
    assert!(
        !producers::allow(&pool, "inbox-ui", ProducerKind::Approver, "alice")
            .await
            .unwrap(),
        "a second allow of the same grant adds nothing"
    );
    let may = |user: &'static str, kind, name: &'static str| {
        let pool = pool.clone();
        async move {
            producers::may_assert(&pool, user, kind, name)
                .await
                .unwrap()
        }
    };
    assert!(may("inbox-ui", ProducerKind::Approver, "alice").await);
    assert!(!may("inbox-ui", ProducerKind::Approver, "bob").await);
    assert!(
        !may("inbox-ui", ProducerKind::ActingUser, "alice").await,
        "an approver grant does not let the producer start runs as that user"
    );
    assert!(!may("other-app", ProducerKind::Approver, "alice").await);
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_wildcard_grant_covers_every_name_of_its_kind_until_it_is_revoked(pool: PgPool) {
    producers::allow(&pool, "scheduler", ProducerKind::ActingUser, ANY)
        .await
        .unwrap();
    assert!(
        producers::may_assert(&pool, "scheduler", ProducerKind::ActingUser, "admin")
            .await
            .unwrap()
    );
    assert!(
        !producers::may_assert(&pool, "scheduler", ProducerKind::Approver, "admin")
            .await
            .unwrap()
    );
    assert!(
        !producers::revoke(&pool, "scheduler", ProducerKind::ActingUser, "admin")
            .await
            .unwrap(),
        "revoking a name that was never granted removes nothing, not the wildcard"
    );
    assert!(
        producers::revoke(&pool, "scheduler", ProducerKind::ActingUser, ANY)
            .await
            .unwrap()
    );
    assert!(
        !producers::may_assert(&pool, "scheduler", ProducerKind::ActingUser, "admin")
            .await
            .unwrap()
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn the_list_holds_every_grant_in_order(pool: PgPool) {
    producers::allow(&pool, "b-app", ProducerKind::Approver, "alice")
        .await
        .unwrap();
    producers::allow(&pool, "a-app", ProducerKind::ActingUser, "editor")
        .await
        .unwrap();
    producers::allow(&pool, "a-app", ProducerKind::Approver, ANY)
        .await
        .unwrap();
    let listed: Vec<(String, ProducerKind, String)> = producers::list(&pool)
        .await
        .unwrap()
        .into_iter()
        .map(|g| (g.amqp_user, g.kind, g.name))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("a-app".into(), ProducerKind::ActingUser, "editor".into()),
            ("a-app".into(), ProducerKind::Approver, ANY.into()),
            ("b-app".into(), ProducerKind::Approver, "alice".into()),
        ]
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_empty_or_padded_name_is_refused_before_it_is_stored(pool: PgPool) {
    for (user, name) in [
        ("", "alice"),
        ("app", ""),
        (" app", "alice"),
        ("app", "alice "),
    ] {
        let err = producers::allow(&pool, user, ProducerKind::Approver, name)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ProducerError::InvalidName(_)),
            "{user:?} {name:?}"
        );
        assert_eq!(err.code(), "invalid_name");
    }
    assert!(producers::list(&pool).await.unwrap().is_empty());
}
