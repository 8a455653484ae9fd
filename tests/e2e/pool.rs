//! The services' connection pool (`countersign_service::pool_options`) against the real
//! PostgreSQL. A connection goes back into the pool after every statement, and is handed out
//! again unpinged when it was used within the last second; these show what a connection
//! brings back with it: a dropped transaction rolled back, an abandoned statement's rows
//! drained, and a dead connection never handed out twice.

use std::time::Duration;

use countersign_e2e::Database;
use countersign_service::pool_options;
use sqlx::PgPool;

/// A pool of one connection, so every statement after the first reuses it unless the pool
/// dropped it.
async fn one_connection(db: &Database) -> PgPool {
    pool_options(1)
        .connect_with(db.options().unwrap())
        .await
        .expect("the test database answers")
}

async fn backend(pool: &PgPool) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("the pooled connection answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_released_with_a_dropped_transaction_comes_back_rolled_back() {
    let db = Database::create("pool_rollback").await;
    let pool = one_connection(&db).await;
    sqlx::query("CREATE TABLE notes (body text)")
        .execute(&pool)
        .await
        .unwrap();
    let before = backend(&pool).await;

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO notes VALUES ('never committed')")
        .execute(&mut *tx)
        .await
        .unwrap();
    drop(tx);

    let (notes, in_transaction): (i64, bool) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM notes), pg_current_xact_id_if_assigned() IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(notes, 0, "the dropped transaction's insert was rolled back");
    assert!(
        !in_transaction,
        "the connection came back outside any transaction"
    );
    assert_eq!(
        backend(&pool).await,
        before,
        "the same connection was reused"
    );
    pool.close().await;
    db.remove().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_released_mid_statement_answers_its_next_statement_and_not_the_old_one() {
    let db = Database::create("pool_cancel").await;
    let pool = one_connection(&db).await;
    let before = backend(&pool).await;

    let abandoned = tokio::time::timeout(
        Duration::from_millis(100),
        sqlx::query_scalar::<_, i32>("SELECT 41 FROM pg_sleep(0.5)").fetch_one(&pool),
    )
    .await;
    assert!(abandoned.is_err(), "the slow statement was abandoned");

    let answer: i32 = sqlx::query_scalar("SELECT 42")
        .fetch_one(&pool)
        .await
        .expect("the next statement answers");
    assert_eq!(
        answer, 42,
        "the next statement got its own row, not the abandoned one's"
    );
    assert_eq!(
        backend(&pool).await,
        before,
        "the drained connection was reused"
    );
    pool.close().await;
    db.remove().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_server_went_away_is_not_handed_out_again() {
    let db = Database::create("pool_dead").await;
    let pool = one_connection(&db).await;
    let mut admin = db.connect().await;
    let terminate = "SELECT pg_terminate_backend($1)";

    // Terminated while idle for under a second (handed out unpinged): its statement fails,
    // and the pool does not hand the dead connection out again.
    let first = backend(&pool).await;
    let done: bool = sqlx::query_scalar(terminate)
        .bind(first)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(done, "the backend was terminated");
    let failed = sqlx::query_scalar::<_, i32>("SELECT 1")
        .fetch_one(&pool)
        .await;
    assert!(failed.is_err(), "a statement on the dead connection fails");
    let second = backend(&pool).await;
    assert_ne!(second, first, "the next statement ran on a new connection");

    // Terminated while idle for longer: pinged at its acquire and replaced, so no statement
    // fails.
    sqlx::query_scalar::<_, bool>(terminate)
        .bind(second)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let third = backend(&pool).await;
    assert_ne!(
        third, second,
        "the idle dead connection was replaced at its acquire"
    );
    pool.close().await;
    db.remove().await.unwrap();
}
