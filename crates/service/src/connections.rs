//! The connection flags every service takes, and the readiness they give.

use std::time::Duration;

use async_trait::async_trait;
use countersign_queue::{Broker, Declare, QueueConfig, QueueError, Topology};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::Readiness;

/// What every service reads, with its environment fallback: `--database-url`, `--amqp-addr`,
/// `--queue-prefix`, how the broker's topology is declared (`--no-declare`,
/// `--queue-arguments`), where traces go, how it logs and where it serves `/metrics`,
/// `/healthz` and `/readyz`.
#[derive(Debug, Clone, clap::Args)]
pub struct Connections {
    /// PostgreSQL, the source of truth.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// RabbitMQ: an `amqp://` address, or the addresses of a cluster's nodes separated by
    /// commas, tried in turn when a connection is lost.
    #[arg(
        long,
        env = "AMQP_ADDR",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_addr: String,
    /// Prefix of every queue and exchange name.
    #[arg(long, env = "COUNTERSIGN_QUEUE_PREFIX", default_value = "countersign")]
    pub queue_prefix: String,
    /// Declare no queue or exchange, only check that they exist: the broker's definitions
    /// (deploy/rabbitmq/definitions.json) made them. Needs no configure permission, so the
    /// process can run as a least-privilege AMQP user.
    #[arg(
        long,
        env = "COUNTERSIGN_NO_DECLARE",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_declare: bool,
    /// Where a work queue this process creates gets its dead-lettering and delivery limit:
    /// `inline` as queue arguments, `policy` from the broker's policies. Queues that exist
    /// are left as they are.
    #[arg(
        long,
        env = "COUNTERSIGN_QUEUE_ARGUMENTS",
        value_enum,
        default_value_t = QueueArguments::Inline
    )]
    pub queue_arguments: QueueArguments,
    /// Where to send traces: an OpenTelemetry collector's OTLP/HTTP base URL (protobuf;
    /// `/v1/traces` is appended), e.g. http://otel-collector:4318. No traces when unset.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Where to serve /metrics, /healthz and /readyz (e.g. 0.0.0.0:9464); none when unset.
    #[arg(long, env = "COUNTERSIGN_HTTP_ADDR")]
    pub http_addr: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub logging: crate::Logging,
}

/// `--database-url`, `--amqp-addr` and `--queue-prefix` of the command lines that act on an
/// installation from outside it (`countersign`, `countersign-dev`): the environment's values,
/// else the local services; given anywhere on the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct Endpoints {
    /// PostgreSQL, the source of truth.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        global = true
    )]
    pub database_url: String,
    /// RabbitMQ, for the commands that talk to the queues: an `amqp://` address, or a
    /// cluster's, separated by commas.
    #[arg(
        long,
        env = "AMQP_ADDR",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        global = true
    )]
    pub amqp_addr: String,
    /// Prefix of every queue and exchange name.
    #[arg(
        long,
        env = "COUNTERSIGN_QUEUE_PREFIX",
        default_value = "countersign",
        global = true
    )]
    pub queue_prefix: String,
}

/// Where the work queues' dead-lettering and delivery limit come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueArguments {
    /// Queue arguments, fixed when the queue is created.
    Inline,
    /// The broker's policies, which can change without the queue being declared again.
    Policy,
}

impl Connections {
    /// Installs logs, and traces when `--otlp-endpoint` is set, as the service `name`.
    pub fn init_telemetry(
        &self,
        name: &'static str,
    ) -> Result<crate::Telemetry, crate::TelemetryError> {
        crate::init_telemetry(name, &self.logging, self.otlp_endpoint.as_deref())
    }

    /// A pool of at most `max` connections ([`pool_options`]).
    pub async fn pool(&self, max: u32) -> Result<PgPool, sqlx::Error> {
        pool_options(max).connect(&self.database_url).await
    }

    /// How this process connects to the broker and treats its topology.
    pub fn queue_config(&self) -> QueueConfig {
        let mut config = QueueConfig::new(&self.amqp_addr, Topology::new(&self.queue_prefix));
        config.declare = match (self.no_declare, self.queue_arguments) {
            (true, _) => Declare::Nothing,
            (false, QueueArguments::Inline) => Declare::WithArguments,
            (false, QueueArguments::Policy) => Declare::WithoutArguments,
        };
        config
    }

    /// The broker, with the topology declared as the flags say (or only checked).
    pub async fn broker(&self) -> Result<Broker, QueueError> {
        Broker::connect(self.queue_config()).await
    }
}

/// How long a connection back in the pool is handed out again without a ping first.
const RECENTLY_USED: Duration = Duration::from_secs(1);

/// The pool every service runs on: at most `max` connections; an acquire fails after ten
/// seconds without one.
///
/// A connection is pinged on its way back into the pool (sqlx always does), so one handed out
/// again within a second of that goes out as it is; one idle longer is pinged first, and
/// dropped for a fresh one if the server does not answer (it restarted, or a proxy cut it).
/// Pinging on every acquire too would be one more round trip, and a wake-up of the server,
/// for every statement a busy service sends.
pub fn pool_options(max: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                use sqlx::Connection;
                Ok(meta.idle_for < RECENTLY_USED || conn.ping().await.is_ok())
            })
        })
}

/// Ready while PostgreSQL answers and the broker connection is open.
#[derive(Debug, Clone)]
pub struct Ready {
    pub pool: PgPool,
    pub broker: Broker,
}

#[async_trait]
impl Readiness for Ready {
    async fn ready(&self) -> bool {
        self.broker.is_healthy().await && sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Args {
        #[command(flatten)]
        connections: Connections,
    }

    fn declare(args: &[&str]) -> Declare {
        let args = Args::try_parse_from(
            ["service", "--database-url", "postgres://h/db"]
                .iter()
                .chain(args),
        )
        .unwrap();
        args.connections.queue_config().declare
    }

    #[test]
    fn a_service_declares_what_is_missing_with_arguments_unless_told_otherwise() {
        assert_eq!(declare(&[]), Declare::WithArguments);
        assert_eq!(
            declare(&["--queue-arguments", "policy"]),
            Declare::WithoutArguments
        );
        assert_eq!(declare(&["--no-declare"]), Declare::Nothing);
        assert_eq!(
            declare(&["--no-declare", "--queue-arguments", "policy"]),
            Declare::Nothing
        );
    }

    fn database_url() -> String {
        std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
    }

    /// The server process behind the pool's one connection, and the connection it was cut
    /// from by another session.
    async fn cut_the_connection(pool: &PgPool) -> i32 {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(pool)
            .await
            .unwrap();
        let admin = PgPool::connect(&database_url()).await.unwrap();
        let cut: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
            .bind(pid)
            .fetch_one(&admin)
            .await
            .unwrap();
        assert!(cut, "backend {pid} terminated");
        admin.close().await;
        pid
    }

    /// The server process behind the pool's one connection.
    async fn backend(pool: &PgPool) -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(pool)
            .await
            .expect("the pooled connection answers")
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_window_is_pinged_and_replaced_when_the_server_dropped_it() {
        let pool = pool_options(1).connect(&database_url()).await.unwrap();
        let cut = cut_the_connection(&pool).await;
        tokio::time::sleep(RECENTLY_USED + Duration::from_millis(200)).await;
        // The dead connection was pinged, dropped and replaced.
        assert_ne!(backend(&pool).await, cut);
    }

    #[tokio::test]
    async fn a_connection_used_within_the_window_goes_out_unpinged_and_a_dead_one_is_used_once() {
        let pool = pool_options(1).connect(&database_url()).await.unwrap();
        let cut = cut_the_connection(&pool).await;
        // No ping: the statement meets the cut connection, which the pool then drops.
        let first = sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await;
        assert!(first.is_err(), "went out unpinged: {first:?}");
        assert_ne!(backend(&pool).await, cut, "a fresh connection");
    }

    #[tokio::test]
    async fn a_connection_released_with_a_dropped_transaction_comes_back_rolled_back() {
        let pool = pool_options(1).connect(&database_url()).await.unwrap();
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
    async fn a_connection_released_mid_statement_answers_its_next_statement_and_not_the_old_one() {
        let pool = pool_options(1).connect(&database_url()).await.unwrap();
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
    }
}
