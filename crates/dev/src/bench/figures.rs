//! The figures: what a phase cost (statements, commits, WAL, publishes, CPU), the baselines
//! and ceilings of this machine, and latency percentiles.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use countersign_queue::{Broker, MessageProperties};
use sqlx::PgPool;

/// Prints one phase's row; returns the CPU seconds a cycle cost the three processes.
pub(super) fn print_phase(
    name: &str,
    rate: f64,
    latency: &Latencies,
    before: &Counters,
    after: &Counters,
    cycles: usize,
) -> f64 {
    let per = |a: f64, b: f64| (b - a) / cycles as f64;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{:<28} {:>9.1} {:>26} {:>6.1} {:>6.1} {:>6.1} {:>8.0} {:>6.1} {:>7.1}ms {:>7.1}ms {:>7.1}ms",
        name,
        rate,
        format!(
            "{:.1} / {:.1} / {:.1} ms",
            ms(latency.percentile(50)),
            ms(latency.percentile(95)),
            ms(latency.percentile(99))
        ),
        per(before.statements as f64, after.statements as f64),
        per(before.commits as f64, after.commits as f64),
        per(before.writes as f64, after.writes as f64),
        per(before.wal_bytes as f64, after.wal_bytes as f64),
        per(before.publishes as f64, after.publishes as f64),
        per(before.cpu.this, after.cpu.this) * 1000.0,
        per(before.cpu.postgres, after.cpu.postgres) * 1000.0,
        per(before.cpu.rabbitmq, after.cpu.rabbitmq) * 1000.0,
    );
    per(before.cpu.total(), after.cpu.total())
}

/// Counters read before and after a phase.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counters {
    pub(super) statements: u64,
    /// `pg_stat_database.xact_commit`: every committed transaction, a read-only statement
    /// outside a transaction included.
    pub(super) commits: i64,
    /// Transaction ids assigned (the next one, from `pg_current_snapshot()`): the transactions
    /// that wrote, each one a WAL flush at its commit.
    pub(super) writes: i64,
    pub(super) wal_bytes: i64,
    pub(super) publishes: u64,
    pub(super) cpu: CpuTimes,
}

impl Counters {
    pub(super) async fn read(pool: &PgPool) -> anyhow::Result<Counters> {
        // A backend reports its statistics when it goes idle, at most once a second: wait, then
        // have every connection of the pool run a statement so each one reports.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let mut conns = Vec::new();
        while let Ok(Some(conn)) = tokio::time::timeout(Duration::from_millis(50), pool.acquire())
            .await
            .map(Result::ok)
        {
            conns.push(conn);
        }
        for conn in &mut conns {
            sqlx::query("SELECT 1").execute(&mut **conn).await?;
        }
        drop(conns);
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(pool)
            .await?;
        let (commits, writes, wal_bytes): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
                    pg_snapshot_xmax(pg_current_snapshot())::text::int8,
                    (SELECT wal_bytes::int8 FROM pg_stat_wal)",
        )
        .fetch_one(pool)
        .await?;
        Ok(Counters {
            statements: STATEMENTS.load(Ordering::Relaxed),
            commits,
            writes,
            wal_bytes,
            publishes: countersign_queue::published_total(),
            cpu: CpuTimes::now(None),
        })
    }
}

/// CPU seconds so far of this process, a worker process, PostgreSQL's and RabbitMQ's.
#[derive(Debug, Clone, Copy)]
pub(super) struct CpuTimes {
    pub(super) this: f64,
    /// 0 without a worker process.
    pub(super) worker: f64,
    pub(super) postgres: f64,
    pub(super) rabbitmq: f64,
}

impl CpuTimes {
    pub(super) fn now(worker: Option<u32>) -> CpuTimes {
        CpuTimes {
            this: cpu_seconds(|pid, _| pid == std::process::id()),
            worker: worker.map_or(0.0, |worker| cpu_seconds(|pid, _| pid == worker)),
            postgres: cpu_seconds(|_, comm| comm == "postgres"),
            rabbitmq: cpu_seconds(|_, comm| comm == "beam.smp"),
        }
    }

    /// The CPU seconds of all of them together.
    pub(super) fn total(&self) -> f64 {
        self.this + self.worker + self.postgres + self.rabbitmq
    }
}

/// SQL statements issued by this process, as sqlx logs them.
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

/// Tracing for the bench: the usual log lines, and a count of every statement sqlx issues.
pub fn init_tracing(verbose: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = countersign_service::telemetry::log_filter(verbose);
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let statements = StatementCounter.with_filter(
        tracing_subscriber::filter::Targets::new()
            .with_target("sqlx::query", tracing::Level::TRACE),
    );
    tracing_subscriber::registry()
        .with(log)
        .with(statements)
        .init();
    if std::env::var_os("COUNTERSIGN_BENCH_PROFILE").is_some() {
        let _ = PROFILE.set(Default::default());
    }
}

struct StatementCounter;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StatementCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
        let mut text = StatementText(String::new());
        event.record(&mut text);
        if let Some(profile) = PROFILE.get() {
            let key: String = text.0.split_whitespace().collect::<Vec<_>>().join(" ");
            let key: String = key.chars().take(90).collect();
            *profile
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(key)
                .or_default() += 1;
        }
    }
}

/// Statements by their first words, when `COUNTERSIGN_BENCH_PROFILE` is set.
static PROFILE: std::sync::OnceLock<std::sync::Mutex<HashMap<String, u64>>> =
    std::sync::OnceLock::new();

/// The statement a sqlx log event is about.
struct StatementText(String);

impl tracing::field::Visit for StatementText {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "db.statement" || (field.name() == "summary" && self.0.is_empty()) {
            self.0 = value.to_owned();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "db.statement" || (field.name() == "summary" && self.0.is_empty()) {
            self.0 = format!("{value:?}");
        }
    }
}

pub(super) fn reset_profile() {
    if let Some(profile) = PROFILE.get() {
        profile.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Prints the statements of a phase by kind, per cycle, and starts counting afresh.
pub(super) fn print_profile(cycles: usize) {
    let Some(profile) = PROFILE.get() else { return };
    let mut counts: Vec<(String, u64)> = profile
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .collect();
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    for (statement, n) in counts.iter().take(40) {
        println!("    {:>6.2}  {statement}", *n as f64 / cycles as f64);
    }
}

/// CPU seconds (user + system) of the processes `matches` picks by pid and command, from
/// `/proc`.
fn cpu_seconds(matches: impl Fn(u32, &str) -> bool) -> f64 {
    proc_stats()
        .filter(|(pid, comm, _)| matches(*pid, comm))
        .map(|(_, _, ticks)| ticks)
        .sum::<u64>() as f64
        / CLOCK_TICKS
}

/// `sysconf(_SC_CLK_TCK)` on Linux.
const CLOCK_TICKS: f64 = 100.0;

/// (pid, command, utime + stime) of every process.
fn proc_stats() -> impl Iterator<Item = (u32, String, u64)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (head, tail) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_owned();
            let fields: Vec<&str> = tail.split_whitespace().collect();
            // After the command: state is field 3; utime and stime are fields 14 and 15.
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((pid, comm, utime + stime))
        })
}

/// The resident set of process `pid`, from `/proc`; 0 when it cannot be read.
pub(super) fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

pub(super) async fn amqp_round_trips(broker: &Broker, n: usize) -> anyhow::Result<Latencies> {
    let queue = broker.declare_private_queue().await?;
    let mut consumer = broker.consume(&queue, 1).await?;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        broker
            .publish_message(&queue, b"{}", &MessageProperties::default())
            .await?;
        let delivery = consumer
            .next()
            .await
            .context("the baseline consumer closed")??;
        delivery.ack().await?;
        samples.push(t.elapsed());
    }
    Ok(Latencies::new(samples))
}

pub(super) async fn update_commits(pool: &PgPool, n: usize) -> anyhow::Result<Latencies> {
    sqlx::query("CREATE TABLE bench_baseline (id int PRIMARY KEY, n bigint NOT NULL)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT INTO bench_baseline SELECT i, 0 FROM generate_series(1, 64) AS i")
        .execute(pool)
        .await?;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        sqlx::query("UPDATE bench_baseline SET n = n + 1 WHERE id = 1")
            .execute(pool)
            .await?;
        samples.push(t.elapsed());
    }
    Ok(Latencies::new(samples))
}

/// Single-row commits per second from `connections` connections at once, each on its own row.
pub(super) async fn commit_ceiling(
    pool: &PgPool,
    connections: usize,
    period: Duration,
) -> anyhow::Result<f64> {
    let until = Instant::now() + period;
    let mut tasks = tokio::task::JoinSet::new();
    for id in 1..=connections.min(64) as i32 {
        let pool = pool.clone();
        tasks.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                sqlx::query("UPDATE bench_baseline SET n = n + 1 WHERE id = $1")
                    .bind(id)
                    .execute(&pool)
                    .await?;
                n += 1;
            }
            Ok::<u64, sqlx::Error>(n)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done??;
    }
    Ok(total as f64 / period.as_secs_f64())
}

/// Confirmed publishes per second with `in_flight` confirms outstanding at once.
pub(super) async fn publish_ceiling(
    broker: &Broker,
    n: usize,
    in_flight: usize,
) -> anyhow::Result<f64> {
    let queue = broker.declare_private_queue().await?;
    let bodies = (0..n).map(|i| format!("{{\"n\":{i}}}").into_bytes());
    let started = Instant::now();
    publish_pipelined(
        broker,
        &queue,
        bodies,
        &MessageProperties::default(),
        in_flight,
    )
    .await?;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Publishes every body to `queue` with up to `in_flight` confirms awaited at once, as a
/// producer sending a burst does; returns once the broker confirmed them all.
pub(super) async fn publish_pipelined(
    broker: &Broker,
    queue: &str,
    bodies: impl Iterator<Item = Vec<u8>>,
    properties: &MessageProperties,
    in_flight: usize,
) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for body in bodies {
        if tasks.len() >= in_flight {
            tasks
                .join_next()
                .await
                .context("a publish task vanished")???;
        }
        let (broker, queue, properties) = (broker.clone(), queue.to_owned(), properties.clone());
        tasks.spawn(async move { broker.publish_message(&queue, &body, &properties).await });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// Sorted latency samples.
pub(super) struct Latencies(Vec<Duration>);

impl Latencies {
    pub(super) fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Latencies(samples)
    }

    pub(super) fn percentile(&self, p: usize) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p * self.0.len()).div_ceil(100).clamp(1, self.0.len());
        self.0[rank - 1]
    }

    pub(super) fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        format!(
            "p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
            ms(self.percentile(50)),
            ms(self.percentile(95)),
            ms(self.percentile(99)),
            ms(self.0.last().copied().unwrap_or_default())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l = Latencies::new((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!(l.percentile(50), Duration::from_millis(50));
        assert_eq!(l.percentile(99), Duration::from_millis(99));
        assert_eq!(l.percentile(100), Duration::from_millis(100));
        assert_eq!(Latencies::new(vec![]).percentile(50), Duration::ZERO);
    }
}
