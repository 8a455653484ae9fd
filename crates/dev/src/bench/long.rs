//! The long-segment part: thousands of segments at once in one `countersign-worker` process,
//! each waiting seconds for a model stub in a process of its own.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use countersign_coordinator::Coordinator;
use countersign_core::RunRequest;
use countersign_queue::{Broker, Consumer, MessageProperties};
use countersign_testkit::{binary, free_port, http_get, Database, ModelStub, Process, Reply};
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::figures::{publish_pipelined, rss_bytes, Counters, CpuTimes};
use super::{agent, next_event, spawn_coordinator, Bench, BenchConfig};

const LONG_AGENT: &str = "bench-long";
/// The `application_name` of the worker's connections, to count them.
const WORKER_APPLICATION: &str = "countersign-bench-worker";
/// The variable the long agent's model settings name for their (stand-in) API key.
const STUB_KEY_ENV: &str = "COUNTERSIGN_BENCH_STUB_KEY";
const LONG_LEASE_TTL_SECS: u64 = 6;

/// Thousands of segments at once in one `countersign-worker`, each waiting seconds for its
/// model.
pub(super) async fn long_segments(
    bench: &Bench,
    worker: &WorkerEnv,
    config: &BenchConfig,
) -> anyhow::Result<()> {
    let n = config.long_segments;
    // The stub runs in a process of its own, as the worker does: each process's figures are
    // its own.
    let stub = StubProcess::start(config.model_latency).await?;
    let model = json!({
        "provider": "openai", "base_url": format!("http://127.0.0.1:{}/v1", stub.port),
        "model": "stub", "api_key_env": STUB_KEY_ENV,
        "timeout_secs": 120,
    });
    let long_agent = agent(LONG_AGENT, model, vec![], 2);
    bench.store.upsert_agent(&long_agent).await?;
    let stop = Arc::new(Notify::new());
    let mut services = JoinSet::new();
    let tools = bench.tools().await?;
    let coordinator =
        Coordinator::with_users(bench.store.clone(), Arc::new(tools.registry), tools.users);
    spawn_coordinator(&mut services, coordinator, &bench.broker, &stop);
    let watch = bench.broker.declare_private_queue().await?;
    bench.broker.bind_events(&watch, "run.*").await?;
    let mut long = Long {
        bench,
        worker,
        stub,
        events: bench.broker.consume(&watch, 1000).await?,
        latency: config.model_latency,
    };
    println!();
    println!(
        "long segments: {n} runs in flight in one countersign-worker process (--concurrency {n}, its default pool), \
         the model answering in {:.1} s",
        long.latency.as_secs_f64()
    );
    // The worker alone first, on a backlog queued before it starts.
    let backlog = long.backlog(n).await?;
    long.print_backlog(&backlog, n);
    long.requested_at_once(n).await?;
    // For scale: the same backlog with a quarter as many in flight, where the cores are not
    // the bound.
    if n / 4 > 0 {
        let smaller = long.backlog(n / 4).await?;
        long.print_quarter(&smaller, n / 4);
    }
    stop.notify_waiters();
    while services.join_next().await.is_some() {}
    Ok(())
}

/// What the long-segment part works with.
struct Long<'a> {
    bench: &'a Bench,
    worker: &'a WorkerEnv,
    stub: StubProcess,
    /// Every `run.*` event of the bench's queues.
    events: Consumer,
    latency: Duration,
}

impl Long<'_> {
    /// The ideal rate with `n` in flight: N / latency.
    fn ideal(&self, n: usize) -> f64 {
        n as f64 / self.latency.as_secs_f64()
    }

    fn print_backlog(&self, backlog: &Backlog, n: usize) {
        let ideal = self.ideal(n);
        let per_run = |a: f64, b: f64| (b - a) / backlog.queued as f64;
        let (before, after) = (&backlog.before, &backlog.after);
        let first_wave = n as f64 / (backlog.seen.completed[n - 1] - backlog.started).as_secs_f64();
        println!(
            "  steady state:       {:.0} runs/s against the ideal {ideal:.0} (N / latency): {:.0} % — completions {n} to {}, \
             {:.1} s, of {} runs queued before the worker started; {} model calls in flight midway",
            backlog.steady,
            100.0 * backlog.steady / ideal,
            2 * n,
            backlog.window.as_secs_f64(),
            backlog.queued,
            backlog.seen.midway_calls
        );
        println!(
            "  first wave:         {first_wave:.0} runs/s ({:.0} %) — the first {n} completions, {:.1} s from the worker's start \
             (the ramp: every run claimed and sent to the model before the first answers)",
            100.0 * first_wave / ideal,
            (backlog.seen.completed[n - 1] - backlog.started).as_secs_f64()
        );
        println!(
            "  per run: {:.1} commits ({:.1} that wrote), CPU {:.2} ms the worker, {:.2} ms PostgreSQL, {:.2} ms RabbitMQ \
             (the stub's and the bench's own processes not counted); {} runs in {:.1} s",
            per_run(before.commits as f64, after.commits as f64),
            per_run(before.writes as f64, after.writes as f64),
            per_run(before.cpu.worker, after.cpu.worker) * 1000.0,
            per_run(before.cpu.postgres, after.cpu.postgres) * 1000.0,
            per_run(before.cpu.rabbitmq, after.cpu.rabbitmq) * 1000.0,
            backlog.queued,
            backlog.elapsed.as_secs_f64()
        );
        println!(
            "  worker RSS {:.0} MB at most; heartbeat statements {:.2}/s (lease ttl {LONG_LEASE_TTL_SECS} s); \
             PostgreSQL connections the worker used: {} at most",
            backlog.seen.rss as f64 / 1e6,
            backlog.heartbeats / backlog.elapsed.as_secs_f64(),
            backlog.seen.connections
        );
        println!(
            "  intake:             {:.0} runs/s — the coordinator (in the bench's process) accepted the {} requests, published \
             with 256 confirms in flight, in {:.1} s, before the worker started",
            backlog.queued as f64 / backlog.intake.as_secs_f64(),
            backlog.queued,
            backlog.intake.as_secs_f64()
        );
    }

    /// End to end: the runs are requested at once, so the coordinator's gates (in this
    /// process) and the claims run while the first segments wait on the model.
    async fn requested_at_once(&mut self, n: usize) -> anyhow::Result<()> {
        let process = self.worker.start(n).await?;
        let started = Instant::now();
        request_long_runs(&self.bench.broker, &self.bench.as_producer, n).await?;
        let seen = self.await_long_runs(&process, n).await?;
        let elapsed = started.elapsed();
        process.stop().await?;
        let rate = n as f64 / elapsed.as_secs_f64();
        let ideal = self.ideal(n);
        println!(
            "  requested at once:  {rate:.0} runs/s against the ideal {ideal:.0}: {:.0} % — {n} runs in {:.1} s; \
             at most {} model calls in flight; worker RSS {:.0} MB",
            100.0 * rate / ideal,
            elapsed.as_secs_f64(),
            seen.peak_calls,
            seen.rss as f64 / 1e6
        );
        Ok(())
    }

    fn print_quarter(&self, smaller: &Backlog, quarter: usize) {
        let ideal = self.ideal(quarter);
        let per_run = |a: f64, b: f64| (b - a) / smaller.queued as f64 * 1000.0;
        println!(
            "  a quarter in flight: steady state {:.0} runs/s against the ideal {ideal:.0}: {:.0} % ({quarter} in flight, \
             completions {quarter} to {}); per run CPU {:.2} ms the worker, {:.2} ms PostgreSQL, {:.2} ms RabbitMQ; \
             worker RSS {:.0} MB",
            smaller.steady,
            100.0 * smaller.steady / ideal,
            2 * quarter,
            per_run(smaller.before.cpu.worker, smaller.after.cpu.worker),
            per_run(smaller.before.cpu.postgres, smaller.after.cpu.postgres),
            per_run(smaller.before.cpu.rabbitmq, smaller.after.cpu.rabbitmq),
            smaller.seen.rss as f64 / 1e6
        );
    }

    /// Three times `n` runs queued before a worker with `n` slots starts, and its steady
    /// state.
    async fn backlog(&mut self, n: usize) -> anyhow::Result<Backlog> {
        let pool = &self.bench.pool;
        let queued = 3 * n;
        let requested = Instant::now();
        request_long_runs(&self.bench.broker, &self.bench.as_producer, queued).await?;
        let mut accepted = 0;
        while accepted < queued {
            if next_event(&mut self.events).await?["event"] == "run.accepted" {
                accepted += 1;
            }
        }
        let intake = requested.elapsed();
        let before = Counters::read(pool).await?;
        // The worker's start-up (its connections, its topology check) is in its first wave.
        let started = Instant::now();
        let process = self.worker.start(n).await?;
        let seen = self.await_long_runs(&process, queued).await?;
        let elapsed = started.elapsed();
        let heartbeats = process.metric("countersign_heartbeat_statements_total")?;
        // CPU times now, while the worker and its server processes run (an exited process's
        // time is gone from /proc); the statistics once it stopped, as its server processes
        // report theirs when they exit (an idle one may wait ten seconds).
        let cpu = CpuTimes::now(Some(process.pid()));
        process.stop().await?;
        let after = Counters {
            cpu,
            ..Counters::read(pool).await?
        };
        let window = seen.completed[2 * n - 1] - seen.completed[n - 1];
        Ok(Backlog {
            queued,
            intake,
            started,
            elapsed,
            steady: n as f64 / window.as_secs_f64(),
            window,
            seen,
            before,
            after,
            heartbeats,
        })
    }

    /// Waits for `n` runs to complete, sampling the model calls in flight, the worker's RSS
    /// and the database connections it holds every hundred completions.
    async fn await_long_runs(
        &mut self,
        worker: &WorkerProcess,
        n: usize,
    ) -> anyhow::Result<LongRuns> {
        let mut seen = LongRuns {
            peak_calls: 0,
            midway_calls: 0,
            rss: 0,
            connections: 0,
            completed: Vec::with_capacity(n),
        };
        while seen.completed.len() < n {
            let event = next_event(&mut self.events).await?;
            match event["event"].as_str() {
                Some("run.completed") => seen.completed.push(Instant::now()),
                Some("run.failed") => bail!("a long run failed: {event}"),
                _ => continue,
            }
            let completed = seen.completed.len();
            if completed == n / 2 {
                seen.midway_calls = self.stub.in_flight()?;
            }
            if completed.is_multiple_of(100) {
                seen.rss = seen.rss.max(rss_bytes(worker.pid()));
                seen.peak_calls = seen.peak_calls.max(self.stub.in_flight()?);
                let used = worker_connections(&self.bench.pool).await?;
                seen.connections = seen.connections.max(used);
            }
        }
        Ok(seen)
    }
}

/// The PostgreSQL connections the worker process holds now.
async fn worker_connections(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1",
    )
    .bind(WORKER_APPLICATION)
    .fetch_one(pool)
    .await?)
}

/// Three times `n` runs queued before a worker with `n` slots starts, and its steady state:
/// the rate between the `n`-th completion (the first wave is through) and the `2n`-th (about
/// when the last queued run is taken), while every completion frees a slot the backlog fills
/// at once.
struct Backlog {
    queued: usize,
    /// From the first request's publish to the last `run.accepted`, before the worker starts.
    intake: Duration,
    started: Instant,
    /// From the worker's start to the last completion.
    elapsed: Duration,
    steady: f64,
    window: Duration,
    seen: LongRuns,
    before: Counters,
    after: Counters,
    /// The worker's lease renewal statements, from its start to the last completion.
    heartbeats: f64,
}

/// Requests `n` runs of the long agent through the queue, as a producer sending a burst does:
/// 256 confirms in flight, so the requests reach the coordinator as fast as the broker takes
/// them rather than at the pace of one confirm after another.
async fn request_long_runs(
    broker: &Broker,
    as_producer: &MessageProperties,
    n: usize,
) -> anyhow::Result<()> {
    let requests = (0..n).map(|_| {
        let request = RunRequest {
            request_id: Uuid::now_v7(),
            agent: LONG_AGENT.into(),
            acting_user: "editor".into(),
            prompt: "Say done.".into(),
            inputs: None,
        };
        request.to_json().to_string().into_bytes()
    });
    publish_pipelined(
        broker,
        &broker.topology().run_requests(),
        requests,
        as_producer,
        256,
    )
    .await
}

/// What was seen while long runs completed.
struct LongRuns {
    peak_calls: u64,
    /// Model calls in flight at the middle completion.
    midway_calls: u64,
    rss: u64,
    connections: i64,
    /// When each run's `run.completed` arrived, in order.
    completed: Vec<Instant>,
}

/// How the long-segment part starts `countersign-worker`: as an installation does, against the
/// bench's database, queues and keys.
pub(super) struct WorkerEnv {
    binary: std::path::PathBuf,
    /// The bench database, with the worker's connections named [`WORKER_APPLICATION`].
    database_url: String,
    amqp_addr: String,
    queue_prefix: String,
    keys: String,
}

impl WorkerEnv {
    pub(super) fn new(
        db: &Database,
        amqp_addr: &str,
        queue_prefix: &str,
        keys: &str,
    ) -> anyhow::Result<WorkerEnv> {
        use sqlx::ConnectOptions;
        let binary = binary("countersign-worker")?;
        let mut url = db.options()?.to_url_lossy();
        url.query_pairs_mut()
            .append_pair("application_name", WORKER_APPLICATION);
        Ok(WorkerEnv {
            binary,
            database_url: url.to_string(),
            amqp_addr: amqp_addr.into(),
            queue_prefix: queue_prefix.into(),
            keys: keys.into(),
        })
    }

    /// A worker running `concurrency` segments at once, serving its metrics; returns once it
    /// answers on them.
    async fn start(&self, concurrency: usize) -> anyhow::Result<WorkerProcess> {
        let port = free_port();
        let mut command = Command::new(&self.binary);
        command
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--lease-ttl-secs", &LONG_LEASE_TTL_SECS.to_string()])
            .args(["--poll-interval-secs", "1"])
            .args(["--http-addr", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", &self.database_url)
            .env("AMQP_ADDR", &self.amqp_addr)
            .env("COUNTERSIGN_QUEUE_PREFIX", &self.queue_prefix)
            .env("COUNTERSIGN_KEYS", &self.keys)
            .env_remove("COUNTERSIGN_KEY_FILE")
            .env(STUB_KEY_ENV, "stub")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let mut process = Process::spawn("countersign-worker", &mut command)?;
        process
            .wait_for_http(port, "/healthz", Duration::from_secs(30))
            .await?;
        Ok(WorkerProcess { process, port })
    }
}

/// A running `countersign-worker`; killed if dropped before [`WorkerProcess::stop`].
struct WorkerProcess {
    process: Process,
    /// Where it serves its metrics.
    port: u16,
}

impl WorkerProcess {
    fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The value of an unlabelled metric the worker serves.
    fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let (_, body) = http_get(self.port, "/metrics").context("the worker's /metrics")?;
        body.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .with_context(|| format!("the worker serves no {name}"))?
            .trim()
            .parse()
            .with_context(|| format!("reading {name}"))
    }

    /// SIGTERM, as an installation stops it; waits for it to exit 0.
    async fn stop(mut self) -> anyhow::Result<()> {
        let status = self.process.terminate(Duration::from_secs(30)).await?;
        anyhow::ensure!(status.success(), "countersign-worker exited {status}");
        Ok(())
    }
}

/// The model stub's process (`countersign-dev bench-model-stub`), killed when dropped.
struct StubProcess {
    _process: Process,
    port: u16,
}

impl StubProcess {
    async fn start(latency: Duration) -> anyhow::Result<StubProcess> {
        use std::io::BufRead;
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["bench-model-stub", "--latency-ms"])
            .arg(latency.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = command.spawn().context("starting the model stub")?;
        let stdout = child.stdout.take().context("the stub's stdout")?;
        let process = Process::from(child);
        // One line, written as soon as it listens.
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
        })
        .await??;
        let port = line
            .trim()
            .strip_prefix("listening on 127.0.0.1:")
            .with_context(|| format!("the stub said {line:?}"))?
            .parse()?;
        Ok(StubProcess {
            _process: process,
            port,
        })
    }

    /// The model calls the stub is answering now.
    fn in_flight(&self) -> anyhow::Result<u64> {
        let (_, body) = http_get(self.port, "/in-flight").context("the stub's /in-flight")?;
        Ok(body.trim().parse()?)
    }
}

/// Serves the stub (`countersign-dev bench-model-stub`): the test kit's OpenAI-compatible
/// stub answering "Done." after `latency`, and `GET /in-flight`; prints where it listens, and
/// stops when its stdin closes (when the bench that started it ends).
pub async fn serve_model_stub(latency: Duration) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let stub = ModelStub::replying(vec![Reply::chat("Done.", &[]).after(latency)]);
    println!("listening on 127.0.0.1:{}", stub.port());
    std::io::stdout().flush()?;
    tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new())).await??;
    Ok(())
}
