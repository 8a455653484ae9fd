//! `countersign-dev`: the demo, which tells one run's story through the real services, and the
//! bench, which measures what the approval cycle costs through them.
//!
//! Neither is part of what an installation runs: they live here, out of the operator's
//! `countersign`, with the test kit's throwaway database, model stub and processes. They
//! assemble what they run the way the services do — the tool registry and users from
//! `countersign_service::tools`, the services' own `run` functions — so what they show and
//! measure is what ships. They must never print what a sealed value holds beyond what the demo
//! narrates from its own throwaway database.

use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use countersign_queue::{Broker, QueueConfig, Topology};

pub mod bench;
mod demo;
mod policy_bench;
mod scale;

#[derive(Debug, Parser)]
#[command(
    name = "countersign-dev",
    version,
    about = "countersign's demo and bench, through the real services."
)]
pub struct Cli {
    #[command(flatten)]
    pub endpoints: countersign_service::Endpoints,
    #[command(flatten)]
    pub logging: countersign_service::Logging,
    /// Log at debug level.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the coordinator, two workers and the reaper (built next to this executable) over
    /// RabbitMQ in a throwaway database and queue prefix (`QUEUE_PREFIX-demo-` and 12 hex
    /// digits, under --queue-prefix), drives a run through them as an operator and its
    /// approvers would, narrating and checking each step.
    Demo {
        /// The database the demo creates (and drops first if it exists).
        #[arg(long, default_value = "countersign_demo")]
        database: String,
        /// Keep the services running afterwards, with the database and the queues, to look
        /// around; the demo prints how to stop them.
        #[arg(long)]
        keep: bool,
    },
    /// Times runs through an in-process coordinator and worker against baselines, then long
    /// segments in a `countersign-worker` process beside this one, then the same cycle through
    /// 1, 2 and 4 worker and 1 and 2 coordinator processes (the scale part), in a throwaway
    /// database, and prints the figures.
    Bench {
        /// Full approval cycles per measured phase.
        #[arg(long, default_value_t = 500)]
        runs: usize,
        /// Segments in flight in the long-segment part (0 skips it).
        #[arg(long, default_value_t = 2000)]
        long: usize,
        /// How long the stub model of the long-segment part takes to answer, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        model_latency_ms: u64,
        /// Run the scale part only (its cycles per configuration still follow --runs).
        #[arg(long)]
        only_scale: bool,
    },
    /// The bench's model stub, in a process of its own (started by `bench`): an
    /// OpenAI-compatible endpoint that answers after the latency; exits when its stdin closes.
    #[command(hide = true)]
    BenchModelStub {
        #[arg(long)]
        latency_ms: u64,
    },
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo { database, keep } => {
            demo::run(
                &cli.endpoints.database_url,
                &cli.endpoints.amqp_addr,
                &cli.endpoints.queue_prefix,
                &database,
                keep,
            )
            .await
        }
        Command::Bench {
            runs,
            long,
            model_latency_ms,
            only_scale,
        } => {
            let config = bench::BenchConfig {
                cycles: runs,
                long_segments: long,
                model_latency: Duration::from_millis(model_latency_ms),
                only_scale,
            };
            bench::run(
                &cli.endpoints.database_url,
                &cli.endpoints.amqp_addr,
                config,
            )
            .await
        }
        Command::BenchModelStub { latency_ms } => {
            bench::serve_model_stub(Duration::from_millis(latency_ms)).await
        }
    }
}

async fn connect_broker(addr: &str, prefix: &str) -> anyhow::Result<Broker> {
    Broker::connect(QueueConfig::new(addr, Topology::new(prefix)))
        .await
        .context("connecting to RabbitMQ (AMQP_ADDR)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }
}
