//! The scale part of `countersign-dev bench`: the full approval cycle, driven from this process
//! as in the cycle part, through `countersign-worker` and `countersign-coordinator` processes
//! started as an installation starts them — 1, 2 and 4 workers with one coordinator, then two
//! coordinators — against the same PostgreSQL and RabbitMQ.
//!
//! Its question is what a cycle costs as the services spread over processes: each row prints the
//! rate at a fixed number of cycles in flight and the CPU a cycle cost, split between the
//! service processes, this process (the producer's side only: the in-process services of the
//! cycle part are stopped by then), PostgreSQL and RabbitMQ. Were processes to cost something
//! per cycle (more connections, more consumers, runs claimed across workers), the CPU per cycle
//! would grow with them; `docs/performance.md` turns the rows into a capacity model. Every cycle
//! is verified as the cycle part's are.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::bench::{
    verify, Bench, CpuTimes, Cycle, Driver, ServiceEnv, ServiceProcess, SCRIPT, WORKER_APPLICATION,
    WORKER_CONCURRENCY,
};

/// Cycles in flight in every configuration: fixed, so the rows compare processes, not loads; at
/// 64 a single worker is busy, and four still get 16 each.
const IN_FLIGHT: usize = 64;
/// The configurations, as (workers, coordinators).
const CONFIGURATIONS: [(usize, usize); 5] = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)];
/// The connections each service process of a row may hold (`--pool-size`): the row's share of
/// twice this machine's cores, as `deployment.md` sizes every service's pools together, and at
/// least the two a pool has.
fn pool_size(workers: usize, coordinators: usize) -> usize {
    let together = crate::bench::service_connections() as usize;
    (together / (workers + coordinators)).max(2)
}
const COORDINATOR_APPLICATION: &str = "countersign-bench-coordinator";

/// Measured cycles per configuration: three fifths of `--runs`, at least twice the in-flight.
fn cycles(runs: usize) -> usize {
    (runs * 3 / 5).max(2 * IN_FLIGHT)
}

/// Cycles run before a configuration is measured: enough for every connection of every worker
/// to have run each of a cycle's statements past PostgreSQL's five custom plans of a prepared
/// statement, after which it plans it once for the connection's life. Measured without it, a
/// row would charge that start-up, which grows with the connections, to its cycles.
fn warm_up(workers: usize, coordinators: usize) -> usize {
    (8 * pool_size(workers, coordinators) * (workers + coordinators)).max(IN_FLIGHT)
}

/// The pages the scale part writes, one per cycle, the warm-ups included.
pub(crate) fn pages(runs: usize) -> usize {
    CONFIGURATIONS
        .iter()
        .map(|&(workers, coordinators)| cycles(runs) + warm_up(workers, coordinators))
        .sum()
}

/// Runs every configuration and prints its row; then verifies the cycles of the scale part with
/// those completed before it (`earlier`).
pub(crate) async fn run(
    bench: &Bench,
    services: &ServiceEnv,
    pages: Vec<i64>,
    runs: usize,
    earlier: Vec<Cycle>,
) -> anyhow::Result<()> {
    let script = ScriptFile::write()?;
    let mut driver = bench.driver(pages).await?;
    let n = cycles(runs);
    println!();
    println!(
        "scale: the same cycle through countersign-worker ({WORKER_CONCURRENCY} segments at once) \
         and countersign-coordinator processes,\n\
         their pools together twice this machine's cores ({} connections, at least 2 a process), \
         {IN_FLIGHT} in flight (fixed), {n} cycles per row after a warm-up; CPU per cycle",
        crate::bench::service_connections()
    );
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "processes", "cycles/s", "services", "driver", "pg", "mq", "total", "busy"
    );
    for (workers, coordinators) in CONFIGURATIONS {
        let started = start(services, &script, workers, coordinators).await?;
        let row = measure(&mut driver, &started, warm_up(workers, coordinators), n).await;
        for process in started {
            process.stop().await?;
        }
        row?.print(workers, coordinators);
    }
    let scaled = driver.done.len();
    let mut done = driver.finish().await?;
    done.extend(earlier);
    verify(&bench.pool, &done).await?;
    println!(
        "verified  {scaled} approved writes of the scale part landed once each, on their own page \
         ({} in the whole bench); nothing else changed",
        done.len()
    );
    Ok(())
}

/// The coordinators, then the workers, each ready.
async fn start(
    services: &ServiceEnv,
    script: &ScriptFile,
    workers: usize,
    coordinators: usize,
) -> anyhow::Result<Vec<ServiceProcess>> {
    let mut started = Vec::new();
    let pool = pool_size(workers, coordinators).to_string();
    for _ in 0..coordinators {
        let coordinator = &services.coordinator;
        started.push(
            services
                .start(
                    coordinator,
                    COORDINATOR_APPLICATION,
                    &["--pool-size".to_owned(), pool.clone()],
                )
                .await?,
        );
    }
    let args = [
        "--concurrency".to_owned(),
        WORKER_CONCURRENCY.to_string(),
        "--pool-size".to_owned(),
        pool,
        "--poll-interval-secs".to_owned(),
        "1".to_owned(),
        "--model-script".to_owned(),
        script.0.display().to_string(),
    ];
    for _ in 0..workers {
        let worker = &services.worker;
        started.push(services.start(worker, WORKER_APPLICATION, &args).await?);
    }
    Ok(started)
}

/// One configuration: `warm_up` cycles (the processes' connections and prepared statements,
/// [`warm_up`]), then `n` cycles measured.
async fn measure(
    driver: &mut Driver<'_>,
    processes: &[ServiceProcess],
    warm_up: usize,
    n: usize,
) -> anyhow::Result<Row> {
    driver.closed_loop(warm_up, IN_FLIGHT).await?;
    let pids: Vec<u32> = processes.iter().map(ServiceProcess::pid).collect();
    let before = CpuTimes::now(&pids);
    let started = Instant::now();
    driver.closed_loop(n, IN_FLIGHT).await?;
    let elapsed = started.elapsed();
    Ok(Row {
        cycles: n,
        elapsed,
        before,
        after: CpuTimes::now(&pids),
    })
}

/// What one configuration measured.
struct Row {
    cycles: usize,
    elapsed: Duration,
    before: CpuTimes,
    after: CpuTimes,
}

impl Row {
    fn print(&self, workers: usize, coordinators: usize) {
        let (before, after) = (&self.before, &self.after);
        let ms = |a: f64, b: f64| format!("{:.1}ms", (b - a) / self.cycles as f64 * 1000.0);
        let rate = self.cycles as f64 / self.elapsed.as_secs_f64();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let busy = (after.total() - before.total()) / self.elapsed.as_secs_f64() / cores;
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        println!(
            "{:<28} {rate:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>4.0} %",
            format!(
                "{workers} worker{}, {coordinators} coordinator{}",
                plural(workers),
                plural(coordinators)
            ),
            ms(before.services, after.services),
            ms(before.this, after.this),
            ms(before.postgres, after.postgres),
            ms(before.rabbitmq, after.rabbitmq),
            ms(before.total(), after.total()),
            busy * 100.0
        );
    }
}

/// The bench agent's script in a file, for the workers' `--model-script`; removed when dropped.
struct ScriptFile(PathBuf);

impl ScriptFile {
    fn write() -> anyhow::Result<ScriptFile> {
        let path = std::env::temp_dir().join(format!(
            "countersign-bench-{}-script.json",
            std::process::id()
        ));
        std::fs::write(&path, SCRIPT)?;
        Ok(ScriptFile(path))
    }
}

impl Drop for ScriptFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
