//! The content store's schema comes with its own migrator, beside the engine's in the same
//! migrations table: either may run again, in either order, on a database that has both.

use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn the_engine_and_the_content_store_migrate_apart_and_each_tolerates_the_others_versions(
    pool: PgPool,
) {
    countersign_store::MIGRATOR.run(&pool).await.unwrap();
    assert!(!countersign_content::is_installed(&pool).await.unwrap());

    countersign_content::MIGRATOR.run(&pool).await.unwrap();
    assert!(countersign_content::is_installed(&pool).await.unwrap());

    // Each migrator finds the other's versions applied, and applies nothing more.
    countersign_store::MIGRATOR.run(&pool).await.unwrap();
    countersign_content::MIGRATOR.run(&pool).await.unwrap();
    countersign_content::WITH_ENGINE.run(&pool).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        applied as usize,
        countersign_content::WITH_ENGINE.iter().count()
    );
}

#[test]
fn no_version_is_both_the_engines_and_the_content_stores() {
    let engine: Vec<i64> = countersign_store::MIGRATOR
        .iter()
        .map(|m| m.version)
        .collect();
    for m in countersign_content::MIGRATOR.iter() {
        assert!(
            !engine.contains(&m.version),
            "version {} is in both",
            m.version
        );
    }
}
