//! The PostgreSQL pool every service runs on: what keeps each connection in it clean, and what
//! bounds every wait on it.
//!
//! **No connection goes back into the pool inside a transaction.** sqlx rolls back a
//! `Transaction` dropped after its `BEGIN` was answered: the drop queues a `ROLLBACK`, which the
//! pool's return path flushes. But the depth it rolls back is counted only once the answer to
//! `BEGIN` has been read, so a future dropped while its `BEGIN` is in flight (a segment dropped
//! on a lost lease, a timeout, a shutdown, a `select!` another branch won) queues nothing; the
//! return path's `Sync` round trip reads the answer, and the connection goes back to the pool
//! inside the transaction. Whatever draws it next runs inside that transaction: its own `BEGIN`
//! only warns, `SET TRANSACTION` fails, its statements never commit and keep their row locks
//! until the session ends, and after the first error every statement fails with "current
//! transaction is aborted". So every connection is checked on its way back into the pool, and
//! again when it is drawn after a second idle ([`RECENTLY_USED`]): one statement answers whether
//! the session is inside a transaction block. A connection that is, or that does not answer
//! within [`CHECK_WITHIN`], is closed — the server rolls back what it held — counted in
//! `countersign_db_connections_discarded_total{reason}` and logged with its server process id.
//!
//! **Every wait has a deadline** ([`SessionLimits`]): the server ends a statement, a lock wait
//! and an idle transaction of the session after limits chosen against the lease's time to live,
//! and drops a client that stopped answering (TCP keepalive and `tcp_user_timeout` on its end);
//! the services bound their own waits on the pool (the acquire timeout, and their callers'
//! deadlines, [`SessionLimits::call`]). A process that is paused or cut off cannot hold locks
//! for longer than that: its session is ended, its transaction rolled back, and the run it held
//! is rescued when its lease expires.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Row};

/// How long a connection back in the pool is handed out again without a check first.
pub const RECENTLY_USED: Duration = Duration::from_secs(1);

/// How long the check of a connection may take before the connection counts as dead.
pub const CHECK_WITHIN: Duration = Duration::from_secs(2);

/// The lease time to live the limits of a service without one are chosen against: the worker's
/// default (`--lease-ttl-secs`).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// Whether the session is outside any transaction block, and its server process; sent as a
/// simple query (one protocol message, whose receipt is the statement's start).
///
/// Outside a transaction block every statement is a transaction of its own, so the start of
/// the transaction is the start of this statement; inside one, the transaction began with an
/// earlier message (its `BEGIN`). A transaction that wrote or locked anything also has an id.
/// A session in a failed transaction block answers with an error (SQLSTATE 25P02).
const OUTSIDE_TRANSACTION: &str = "SELECT pg_backend_pid(), \
     transaction_timestamp() = statement_timestamp() \
     AND pg_current_xact_id_if_assigned() IS NULL";

/// How long a service's sessions may wait, set on each of its connections as it connects;
/// chosen against the lease's time to live `L` ([`SessionLimits::for_lease`]), so that a
/// process that pauses or loses its network gives up its locks and its connections before its
/// leases expire and their runs are handed to another worker. See `docs/operations.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// `statement_timeout`: no statement outlives a lease.
    pub statement: Duration,
    /// `lock_timeout`: a statement gives up a lock another session holds this long. An approved
    /// turn, which may wait on a colleague's lock for as long as the colleague holds it, sets its
    /// own ([`SessionLimits::turn_lock`]).
    pub lock: Duration,
    /// How long an approved turn's statements may wait on a lock: a colleague's edit of the
    /// same content in another application.
    pub turn_lock: Duration,
    /// `idle_in_transaction_session_timeout`: a session that opened a transaction and sent
    /// nothing for this long (its process paused, or cut off) is ended and its transaction
    /// rolled back, releasing its locks before its lease runs out.
    pub idle_in_transaction: Duration,
    /// `tcp_keepalives_idle`: the server probes a silent client after this long.
    pub keepalive_idle: Duration,
    /// `tcp_keepalives_interval`: between unanswered probes.
    pub keepalive_interval: Duration,
    /// `tcp_keepalives_count`: unanswered probes before the server drops the client.
    pub keepalive_count: u32,
    /// `tcp_user_timeout`: how long data the server sent may stay unacknowledged.
    pub user_timeout: Duration,
    /// How long the pool waits for a connection (from the pool, or a new one) before it fails.
    pub acquire: Duration,
    /// The deadline of one call of a service's loop on the database (a heartbeat's renewal, a
    /// claim, a relay step): a third of the lease, so that a renewal that was not answered is
    /// tried twice more before the lease runs out.
    pub call: Duration,
}

impl SessionLimits {
    /// The limits of a service whose leases (or whose workers' leases) live `ttl`.
    pub fn for_lease(ttl: Duration) -> SessionLimits {
        let clamp = |d: Duration, low: u64, high: u64| {
            d.clamp(Duration::from_secs(low), Duration::from_secs(high))
        };
        let third = ttl / 3;
        SessionLimits {
            statement: clamp(ttl, 5, 60),
            lock: clamp(third, 1, 10),
            turn_lock: clamp(ttl * 2, 60, 600),
            idle_in_transaction: clamp(ttl / 2, 2, 60),
            keepalive_idle: clamp(third, 1, 10),
            keepalive_interval: clamp(third / 3, 1, 5),
            keepalive_count: 3,
            user_timeout: clamp(ttl, 5, 60),
            acquire: clamp(third, 2, 10),
            call: clamp(third, 1, 10),
        }
    }

    /// The server settings of every session: the limits above, as `options`.
    pub fn server_settings(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| d.as_millis().to_string();
        vec![
            ("statement_timeout", ms(self.statement)),
            ("lock_timeout", ms(self.lock)),
            (
                "idle_in_transaction_session_timeout",
                ms(self.idle_in_transaction),
            ),
            (
                "tcp_keepalives_idle",
                self.keepalive_idle.as_secs().to_string(),
            ),
            (
                "tcp_keepalives_interval",
                self.keepalive_interval.as_secs().to_string(),
            ),
            ("tcp_keepalives_count", self.keepalive_count.to_string()),
            ("tcp_user_timeout", ms(self.user_timeout)),
        ]
    }

    /// `options` with the session settings and `name` as the application name, so that
    /// `pg_stat_activity` tells the services' sessions apart.
    pub fn connect_options(&self, options: PgConnectOptions, name: &str) -> PgConnectOptions {
        options
            .application_name(name)
            .options(self.server_settings())
    }

    /// The statement that opens an approved turn's transaction: `BEGIN`, with the turn's own
    /// lock and statement limits for the transaction (`SET LOCAL`), in one round trip.
    pub fn turn_begin(&self) -> String {
        let ms = self.turn_lock.as_millis();
        format!(
            "BEGIN; SET LOCAL lock_timeout = {ms}; SET LOCAL statement_timeout = {}",
            ms + self.statement.as_millis()
        )
    }
}

impl Default for SessionLimits {
    /// The limits chosen against [`DEFAULT_LEASE_TTL`].
    fn default() -> Self {
        SessionLimits::for_lease(DEFAULT_LEASE_TTL)
    }
}

/// Why a connection was closed rather than handed out: the `reason` label of
/// `countersign_db_connections_discarded_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Discarded {
    /// Inside a transaction block that nothing will end.
    InTransaction,
    /// Inside a failed transaction block: every statement would fail.
    AbortedTransaction,
    /// It did not answer the check in time (the server or the network is silent).
    Unanswered,
    /// The check failed (the connection was closed or broken).
    Broken,
}

impl Discarded {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Registers `countersign_db_connections_discarded_total` at zero for every reason.
pub fn register_metrics() {
    for reason in <Discarded as strum::VariantArray>::VARIANTS {
        let _ = metrics::counter!("countersign_db_connections_discarded_total", "reason" => reason.as_str());
    }
}

/// Checks `conn`: `None` when it is outside any transaction and answers, otherwise why it must
/// be closed (counted and logged here). `when` says where it was checked, for the log.
pub async fn check(conn: &mut PgConnection, when: &'static str) -> Option<Discarded> {
    // A bare string goes as a simple query: one message, so one receipt time.
    let asked = async {
        let row = sqlx::Executor::fetch_one(&mut *conn, OUTSIDE_TRANSACTION).await?;
        Ok::<_, sqlx::Error>((row.try_get::<i32, _>(0)?, row.try_get::<bool, _>(1)?))
    };
    let (discarded, backend) = match tokio::time::timeout(CHECK_WITHIN, asked).await {
        Ok(Ok((_, true))) => return None,
        Ok(Ok((pid, false))) => (Discarded::InTransaction, Some(pid)),
        Ok(Err(sqlx::Error::Database(e))) if e.code().as_deref() == Some("25P02") => {
            (Discarded::AbortedTransaction, None)
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, when, "a pooled connection failed its check");
            (Discarded::Broken, None)
        }
        Err(_) => (Discarded::Unanswered, None),
    };
    metrics::counter!("countersign_db_connections_discarded_total", "reason" => discarded.as_str())
        .increment(1);
    match discarded {
        Discarded::InTransaction | Discarded::AbortedTransaction => tracing::warn!(
            reason = discarded.as_str(),
            backend,
            when,
            "a pooled connection was inside a transaction; closed, its transaction rolled back"
        ),
        Discarded::Unanswered | Discarded::Broken => tracing::info!(
            reason = discarded.as_str(),
            when,
            "a pooled connection did not answer its check; closed"
        ),
    }
    Some(discarded)
}

/// The pool's options: at most `max` connections, acquired within the default limits, each
/// checked on its way back into the pool and, after a second idle, on its way out (see the
/// module documentation).
///
/// A connection handed out again within [`RECENTLY_USED`] of its release goes out unchecked: it
/// was checked on its way back, and checking it again would be one more round trip (and a
/// wake-up of the server) for every statement a busy service sends. One idle longer is checked
/// first, which also finds a connection whose server restarted or whose network was cut.
pub fn pool_options(max: u32) -> PgPoolOptions {
    pool_options_within(max, &SessionLimits::default())
}

/// [`pool_options`], acquiring within `limits.acquire`.
pub fn pool_options_within(max: u32, limits: &SessionLimits) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(limits.acquire)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                Ok(meta.idle_for < RECENTLY_USED || check(conn, "drawn").await.is_none())
            })
        })
        .after_release(|conn, _| {
            Box::pin(async move {
                match check(conn, "released").await {
                    None => Ok(true),
                    // Closing it gracefully would wait on the silent connection again.
                    Some(Discarded::Unanswered) => Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the connection did not answer its check in time; closed",
                    ))),
                    Some(_) => Ok(false),
                }
            })
        })
}

/// A pool of at most `max` connections to `options`, as the service `name`, under `limits`.
pub async fn connect(
    options: PgConnectOptions,
    name: &str,
    max: u32,
    limits: &SessionLimits,
) -> Result<PgPool, sqlx::Error> {
    pool_options_within(max, limits)
        .connect_with(limits.connect_options(options, name))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn database_url() -> String {
        std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
    }

    fn options() -> PgConnectOptions {
        PgConnectOptions::from_str(&database_url()).unwrap()
    }

    async fn pool(max: u32) -> PgPool {
        connect(options(), "pool-test", max, &SessionLimits::default())
            .await
            .unwrap()
    }

    async fn admin() -> PgPool {
        PgPool::connect(&database_url()).await.unwrap()
    }

    /// The server process behind the pool's one connection.
    async fn backend(pool: &PgPool) -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(pool)
            .await
            .expect("the pooled connection answers")
    }

    /// The state of server process `pid` (`idle`, `idle in transaction`, …), or `None` once it
    /// is gone.
    async fn state(admin: &PgPool, pid: i32) -> Option<String> {
        sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_optional(admin)
            .await
            .unwrap()
            .flatten()
    }

    /// Drops a `BEGIN` of `pool` while its answer is in flight: the moment a segment dropped on
    /// a lost lease, a timeout or a shutdown can hit. (The transaction's first statement sleeps,
    /// so the answer is in flight long enough to drop it there every time; the path through sqlx
    /// is a plain `BEGIN`'s.)
    async fn drop_a_begin_in_flight(pool: &PgPool, admin: &PgPool, pid: i32) {
        let mut begin = Box::pin(pool.begin_with("BEGIN; SELECT pg_sleep(0.3)"));
        let started = std::time::Instant::now();
        while state(admin, pid).await.as_deref() != Some("active") {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the server never ran the BEGIN"
            );
            // Polled only until the server runs it: its answer is never read.
            let pending = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(begin.as_mut(), cx).is_pending())
            })
            .await;
            assert!(pending, "the BEGIN is still waiting for its answer");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(begin);
    }

    /// Whether the next statement on `pool` runs inside a transaction block, and where.
    async fn next_statement(pool: &PgPool) -> (i32, bool) {
        let row = sqlx::Executor::fetch_one(pool, OUTSIDE_TRANSACTION)
            .await
            .unwrap();
        (row.get(0), !row.get::<bool, _>(1))
    }

    #[tokio::test]
    async fn a_plain_sqlx_pool_hands_out_a_connection_whose_begin_was_dropped_in_flight_inside_that_transaction(
    ) {
        // Why the pool checks its connections: sqlx's own return path does not see this.
        let plain = PgPoolOptions::new()
            .max_connections(1)
            .connect(&database_url())
            .await
            .unwrap();
        let admin = admin().await;
        let pid = backend(&plain).await;
        drop_a_begin_in_flight(&plain, &admin, pid).await;

        let (again, inside) = next_statement(&plain).await;
        assert_eq!(again, pid, "the same connection was handed out");
        assert!(
            inside,
            "and its next statement ran inside the dropped BEGIN's transaction"
        );
    }

    #[tokio::test]
    async fn a_connection_whose_begin_was_dropped_in_flight_is_closed_and_its_transaction_rolled_back(
    ) {
        let pool = pool(1).await;
        let admin = admin().await;
        let pid = backend(&pool).await;
        drop_a_begin_in_flight(&pool, &admin, pid).await;

        let (next, inside) = next_statement(&pool).await;
        assert_ne!(next, pid, "a fresh connection");
        assert!(!inside, "outside any transaction");
        let started = std::time::Instant::now();
        while state(&admin, pid).await.is_some() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the server process of the discarded connection ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_connection_left_inside_a_failed_transaction_is_closed_and_the_next_statement_succeeds(
    ) {
        let pool = pool(1).await;
        let mut conn = pool.acquire().await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        // Outside sqlx's bookkeeping: a transaction opened and failed by hand.
        sqlx::raw_sql("BEGIN; SELECT 1/0")
            .execute(&mut *conn)
            .await
            .expect_err("division by zero");
        drop(conn);

        let next: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("the next statement runs on a clean connection");
        assert_ne!(next, pid);
    }

    #[tokio::test]
    async fn a_connection_released_with_a_dropped_transaction_comes_back_rolled_back_and_is_kept() {
        let pool = pool(1).await;
        // A table of this connection's session: it is there only if the connection is reused.
        sqlx::query("CREATE TEMP TABLE notes (body text)")
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
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_window_is_checked_and_replaced_when_the_server_dropped_it()
    {
        let pool = pool(1).await;
        let cut = backend(&pool).await;
        let admin = admin().await;
        let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
            .bind(cut)
            .fetch_one(&admin)
            .await
            .unwrap();
        assert!(terminated);
        tokio::time::sleep(RECENTLY_USED + Duration::from_millis(200)).await;
        assert_ne!(
            backend(&pool).await,
            cut,
            "the dead connection was replaced"
        );
    }

    #[tokio::test]
    async fn a_connection_released_mid_statement_answers_its_next_statement_and_not_the_old_one() {
        let pool = pool(1).await;
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
        assert_eq!(answer, 42, "its own row, not the abandoned one's");
        assert_eq!(
            backend(&pool).await,
            before,
            "the drained connection was kept"
        );
    }

    #[tokio::test]
    async fn every_session_carries_the_limits_and_the_service_name() {
        let limits = SessionLimits::for_lease(Duration::from_secs(30));
        let pool = connect(options(), "countersign-test", 1, &limits)
            .await
            .unwrap();
        let settings: (String, String, String, String, String, String) = sqlx::query_as(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),
                    current_setting('idle_in_transaction_session_timeout'),
                    current_setting('tcp_user_timeout'), current_setting('tcp_keepalives_count'),
                    current_setting('application_name')",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            settings,
            (
                "30s".to_owned(),
                "10s".to_owned(),
                "15s".to_owned(),
                "30000".to_owned(),
                "3".to_owned(),
                "countersign-test".to_owned()
            )
        );
    }

    #[tokio::test]
    async fn a_turn_transaction_takes_its_own_lock_limit_and_leaves_the_sessions_afterwards() {
        let limits = SessionLimits::for_lease(Duration::from_secs(30));
        let pool = connect(options(), "countersign-test", 1, &limits)
            .await
            .unwrap();
        let mut tx = pool.begin_with(limits.turn_begin()).await.unwrap();
        let inside: String = sqlx::query_scalar("SELECT current_setting('lock_timeout')")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let after: String = sqlx::query_scalar("SELECT current_setting('lock_timeout')")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!((inside.as_str(), after.as_str()), ("1min", "10s"));
    }

    #[tokio::test]
    async fn a_session_idle_inside_its_transaction_past_the_limit_is_ended_by_the_server() {
        let limits = SessionLimits {
            idle_in_transaction: Duration::from_millis(300),
            ..SessionLimits::default()
        };
        let pool = connect(options(), "countersign-test", 1, &limits)
            .await
            .unwrap();
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        let after = sqlx::query("SELECT 1").execute(&mut *tx).await;
        assert!(after.is_err(), "the session was ended: {after:?}");
    }

    #[test]
    fn the_limits_follow_the_lease_within_their_bounds() {
        let default = SessionLimits::default();
        assert_eq!(default.statement, Duration::from_secs(30));
        assert_eq!(default.lock, Duration::from_secs(10));
        assert_eq!(default.idle_in_transaction, Duration::from_secs(15));
        assert_eq!(default.call, Duration::from_secs(10));
        let short = SessionLimits::for_lease(Duration::from_secs(3));
        assert_eq!(short.statement, Duration::from_secs(5));
        assert_eq!(short.lock, Duration::from_secs(1));
        assert_eq!(short.idle_in_transaction, Duration::from_secs(2));
        assert_eq!(short.turn_lock, Duration::from_secs(60));
        assert!(short.idle_in_transaction < Duration::from_secs(3));
    }
}
