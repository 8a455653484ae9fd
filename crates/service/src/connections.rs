//! The connection flags every service takes, and the readiness they give.

use std::time::Duration;

use async_trait::async_trait;
use countersign_queue::{Broker, Declare, QueueConfig, QueueError, Topology};
use std::str::FromStr;

use countersign_store::Vitals;
use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;

use crate::{Readiness, SessionLimits};

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
    /// The AMQP heartbeat asked for, in seconds (0: the broker's). The process and the broker
    /// each take a connection silent for two heartbeats as dead: the process turns unready and
    /// connects again, the broker hands what it had delivered to the other consumers.
    #[arg(long, env = "COUNTERSIGN_AMQP_HEARTBEAT_SECS", default_value_t = countersign_queue::DEFAULT_HEARTBEAT_SECS)]
    pub amqp_heartbeat_secs: u16,
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

    /// How this process connects to the broker and treats its topology.
    pub fn queue_config(&self) -> QueueConfig {
        let mut config = QueueConfig::new(&self.amqp_addr, Topology::new(&self.queue_prefix));
        config.heartbeat = self.amqp_heartbeat_secs;
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

/// How long `/readyz` may take to answer, whatever the dependencies do: a probe that has not
/// answered by then is a dependency that is not there.
pub const READY_WITHIN: Duration = Duration::from_millis(800);

impl Connections {
    /// A pool of at most `max` connections for the service `name`, every session under
    /// `limits` ([`crate::pool`]).
    pub async fn pool(
        &self,
        name: &str,
        max: u32,
        limits: &SessionLimits,
    ) -> Result<PgPool, sqlx::Error> {
        let options = PgConnectOptions::from_str(&self.database_url)?;
        crate::pool::connect(options, name, max, limits).await
    }

    /// The connection `/readyz` asks PostgreSQL on: a pool of one of its own, so that a probe
    /// never waits behind the service's busy pool. Connects lazily: a process is not held at
    /// its start by its probe.
    pub fn probe(&self, name: &str, limits: &SessionLimits) -> Result<PgPool, sqlx::Error> {
        let options = PgConnectOptions::from_str(&self.database_url)?;
        let limits = SessionLimits {
            acquire: READY_WITHIN,
            ..*limits
        };
        Ok(crate::pool::pool_options_within(1, &limits)
            .connect_lazy_with(limits.connect_options(options, &format!("{name} readiness"))))
    }
}

/// Ready while the process can do its work: PostgreSQL answers its probe, the broker
/// connection is open, and its own statements are not failing one after another
/// ([`Vitals`]); answered within [`READY_WITHIN`] whatever they do. A process that turns
/// unready needs no restart: it is ready again once they answer.
#[derive(Debug, Clone)]
pub struct Ready {
    /// A pool of its own ([`Connections::probe`]).
    pub probe: PgPool,
    pub broker: Broker,
    pub vitals: Vitals,
}

#[async_trait]
impl Readiness for Ready {
    async fn ready(&self) -> bool {
        let asked = async {
            self.broker.is_healthy().await
                && !self.vitals.failing()
                && sqlx::query("SELECT 1").execute(&self.probe).await.is_ok()
        };
        tokio::time::timeout(READY_WITHIN, asked)
            .await
            .unwrap_or(false)
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
}
