//! `countersign-dev bench`: the approval cycle users pay for, through the real services, with the
//! figures that say where its time goes, against ceilings measured in the same run.
//!
//! One cycle is what a run with a write costs end to end: run request → the coordinator's gates
//! → a claim → a read turn → the write turn's preview → the sealed suspension → `run.suspended`
//! → the approval → its gates and transaction → the resume: the re-preview and the write in one
//! transaction → the model's answer → the settle → `run.completed`. Every cycle writes a page of
//! its own (the run request's `inputs` name it), so approvals do not move each other's previews.
//!
//! The coordinator and one worker run in this process — the same code the binaries run, over
//! RabbitMQ and PostgreSQL — so the process's own figures (CPU, RSS, SQL statements) are theirs.
//! PostgreSQL's and RabbitMQ's CPU is read from `/proc`; commits and WAL bytes from
//! `pg_stat_database` and `pg_stat_wal`, writing transactions from the transaction ids
//! assigned; statements are counted as sqlx issues them.
//!
//! The cycle part ends with the cycle's hops alone — its messages and statements with no work in
//! them — packed 16 in flight and spaced at the peak's rate, to tell what a cycle spends waking
//! processes from what it spends working.
//!
//! At the end every cycle is verified from the content store: each approved write landed once,
//! on its page, and nothing else changed; otherwise the bench exits non-zero.
//!
//! The long-segment part gives one `countersign-worker` process thousands of segments whose
//! model (an OpenAI-compatible stub in a process of its own) takes seconds to answer, and reports
//! throughput against the ideal N / latency — in the steady state of a backlog queued before
//! the worker starts, for its first wave, and with the runs requested at once — the
//! coordinator's intake, RSS, heartbeat statements per second and PostgreSQL connections.
//!
//! The scale part (`scale.rs`) drives the same cycle through worker and coordinator processes,
//! 1 to 4 of them, to show what a cycle costs as the services spread out.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use countersign_coordinator::{producers, Coordinator, ProducerKind};
use countersign_core::RunRequest;
use countersign_crypto::{KeyId, Keyring};
use countersign_model::ScriptedModel;
use countersign_queue::{Broker, Consumer, MessageProperties, QueueConfig, Topology};
use countersign_service::tools::Tools;
use countersign_store::{AgentConfig, Store};
use countersign_testkit::site::agent;
use countersign_testkit::{
    binary, counter_total, free_port, http_get, Database, ModelStub, Process, Reply,
};
use countersign_worker::service::WorkerConfig;
use countersign_worker::{Models, SegmentRunner};
use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::scale;

pub(crate) const SCRIPT: &str = include_str!("../bench-agent.json");
const AGENT: &str = "bench-agent";
/// The page every bench page is created under (inside the editor's page mount).
const PARENT_PAGE: i64 = 10;
/// Segments the worker runs at once in the cycle part.
pub(crate) const WORKER_CONCURRENCY: usize = 512;
/// The concurrencies of the closed-loop phases.
const PHASES: [usize; 3] = [1, 16, 256];

/// What the bench is asked to do.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Full cycles per measured phase.
    pub cycles: usize,
    /// Segments in flight in the long-segment part (0 skips it).
    pub long_segments: usize,
    /// How long the stub model takes per answer in the long-segment part.
    pub model_latency: Duration,
    /// Run the scale part only.
    pub only_scale: bool,
}

pub async fn run(database_url: &str, amqp_addr: &str, config: BenchConfig) -> anyhow::Result<()> {
    let name = format!("countersign_bench_{}", std::process::id());
    let db = Database::create_on(database_url, &name).await?;
    let result = bench(&db, amqp_addr, &config).await;
    db.remove().await?;
    result
}

async fn bench(db: &Database, amqp_addr: &str, config: &BenchConfig) -> anyhow::Result<()> {
    let bench = Bench::prepare(db, amqp_addr).await?;
    // Checked first, so a missing binary stops the bench before its first figure.
    let services = ServiceEnv::new(db, amqp_addr, &bench.queue_prefix, &bench.keys)?;
    let cycle_pages = match config.only_scale {
        true => 0,
        false => {
            PHASES
                .iter()
                .map(|&c| phase_cycles(c, config.cycles))
                .sum::<usize>()
                + config.cycles
                + crate::policy_bench::cycles(config.cycles)
        }
    };
    let mut pages = seed_pages(&bench.pool, cycle_pages + scale::pages(config.cycles)).await?;
    let scale_pages = pages.split_off(cycle_pages);
    let mut done = Vec::new();
    if !config.only_scale {
        done = cycle_part(&bench, pages, config).await?;
        if config.long_segments > 0 {
            long_segments(&bench, &services, config).await?;
        }
    }
    scale::run(&bench, &services, scale_pages, config.cycles, done).await?;
    bench.broker.delete_topology().await?;
    bench.pool.close().await;
    Ok(())
}

/// The cycle part: baselines, the closed and open loops through the coordinator and a worker
/// in this process, the ceilings, and the verification; the cycles it completed.
async fn cycle_part(
    bench: &Bench,
    pages: Vec<i64>,
    config: &BenchConfig,
) -> anyhow::Result<Vec<Cycle>> {
    println!(
        "countersign bench: the full approval cycle (request → suspend → approve → re-preview → write → completed),\n\
         coordinator and one worker ({WORKER_CONCURRENCY} segments at once) in this process, over RabbitMQ and PostgreSQL;\n\
         the two share {} connections (twice this machine's cores, as deployment.md sizes every service's pools together), \
         approved turns half of them at most",
        service_connections()
    );
    let amqp = amqp_round_trips(&bench.broker, 200).await?;
    let pg = update_commits(&bench.pool, 200).await?;
    println!(
        "baseline  RabbitMQ publish→consume round trip:  {}",
        amqp.summary()
    );
    println!(
        "baseline  PostgreSQL single-row UPDATE commit:  {}",
        pg.summary()
    );

    let stop = Arc::new(Notify::new());
    let (mut services, coordinator) = bench.start_services(&stop).await?;
    let mut driver = bench.driver(pages).await?;
    let pools = bench.pools();
    let peak = closed_loop_phases(&pools, &mut driver, config).await?;
    half_the_peak(&pools, &mut driver, config, &peak).await?;
    crate::policy_bench::auto_approved(
        &mut services,
        coordinator,
        &mut driver,
        &stop,
        config.cycles,
    )
    .await?;
    // The services stop first: the ceilings and the hops below have the machine to
    // themselves, and the public queues the hops pass through have no other consumer.
    stop.notify_waiters();
    while services.join_next().await.is_some() {}
    crate::policy_bench::remove_policy_file();
    let floor = amqp.percentile(50) + pg.percentile(50);
    print_ceilings(bench, floor, &peak).await?;
    print_hops(bench, &peak).await?;
    verify(&bench.pool, &driver.done).await?;
    println!(
        "verified  {} approved writes landed once each, on their own page; nothing else changed",
        driver.done.len()
    );
    driver.finish().await
}

/// What every part of the bench works on: its database, keys, queues and producer identity.
pub(crate) struct Bench {
    /// The bench's own pool: its setup, its ceilings and its verification.
    pub(crate) pool: PgPool,
    /// The pool the cycle part's coordinator and worker share, sized as `deployment.md` sizes
    /// every service's pools together: twice PostgreSQL's cores ([`service_connections`]).
    services: PgPool,
    /// Sealed with a key of this run's own, which the long-segment part's worker is given too.
    store: Store,
    keys: String,
    queue_prefix: String,
    broker: Broker,
    /// The broker user, as a producer's messages name it.
    as_producer: MessageProperties,
}

impl Bench {
    /// The database migrated and seeded, the bench's producer allowed, its agent configured,
    /// its queues declared.
    async fn prepare(db: &Database, amqp_addr: &str) -> anyhow::Result<Bench> {
        let pool = countersign_service::pool_options(16)
            .connect_with(db.options()?)
            .await?;
        let services = countersign_service::pool_options(service_connections())
            .connect_with(db.options()?)
            .await?;
        countersign_content::WITH_ENGINE.run(&pool).await?;
        countersign_content::seed_demo_site(&pool).await?;
        producers::allow(&pool, "guest", ProducerKind::ActingUser, "*").await?;
        producers::allow(&pool, "guest", ProducerKind::Approver, "*").await?;
        let keys = Keyring::generate_entry(&KeyId::parse("bench")?);
        let store = Store::new(pool.clone(), Arc::new(Keyring::parse(&keys)?));
        store
            .upsert_agent(&AgentConfig {
                model: json!({"provider": "scripted"}),
                ..agent(AGENT, &["update_page_metadata"], false)
            })
            .await?;
        let queue_prefix = format!("bench-{}", Uuid::now_v7());
        let topology = Topology::new(queue_prefix.clone());
        let broker = Broker::connect(QueueConfig::new(amqp_addr, topology)).await?;
        let user = broker.user().context("the broker connection has no user")?;
        let as_producer = MessageProperties {
            user_id: Some(user),
            ..MessageProperties::default()
        };
        Ok(Bench {
            pool,
            services,
            store,
            keys,
            queue_prefix,
            broker,
            as_producer,
        })
    }

    /// The bench's pool, then the services': every connection whose statistics the cycle
    /// part's counters read.
    fn pools(&self) -> [&PgPool; 2] {
        [&self.pool, &self.services]
    }

    /// The coordinator and one worker, in this process, until `stop` is notified.
    async fn start_services(
        &self,
        stop: &Arc<Notify>,
    ) -> anyhow::Result<(JoinSet<()>, Coordinator)> {
        let mut services = JoinSet::new();
        // Each service gets a store of its own, as in its own process: its relay wakes for its
        // own commits only. They share the connection pool, of which the worker's approved
        // turns hold half at most, as in `countersign-worker`.
        let keyring = Arc::new(Keyring::ephemeral());
        let service_store = || Store::new(self.services.clone(), keyring.clone());
        let worker_store = service_store().with_turn_limit(service_connections() / 2);
        let tools = tools(&worker_store).await?;
        let models = Models::Fixed(Arc::new(ScriptedModel::from_json(SCRIPT)?));
        let ttl = Duration::from_secs(30);
        let runner = SegmentRunner::new(worker_store, tools, models, ttl);
        let (registry, users) = (runner.registry.clone(), runner.users.clone());
        let coordinator = Coordinator::with_users(service_store(), registry, users);
        spawn_coordinator(&mut services, coordinator.clone(), &self.broker, stop);
        spawn_worker(
            &mut services,
            runner,
            &self.broker,
            stop,
            WORKER_CONCURRENCY,
        );
        Ok((services, coordinator))
    }

    /// The producer's side of the cycles, on the events of the bench's runs it acts on.
    pub(crate) async fn driver(&self, pages: Vec<i64>) -> anyhow::Result<Driver<'_>> {
        let watch = self.broker.declare_private_queue().await?;
        // Only what `Driver::handle` reads, as a producer binds what it waits for: every other
        // event would cost the broker a delivery and this process its parse.
        for kind in DRIVER_EVENTS {
            self.broker.bind_events(&watch, kind).await?;
        }
        let events = self.broker.consume(&watch, 1000).await?;
        Ok(Driver {
            broker: &self.broker,
            events,
            as_producer: self.as_producer.clone(),
            pages: pages.into_iter(),
            cycles: HashMap::new(),
            run_of: HashMap::new(),
            early: Vec::new(),
            done: Vec::new(),
            auto: false,
        })
    }
}

/// The deployment's tools and users over `store`, assembled as every service assembles them.
async fn tools(store: &Store) -> anyhow::Result<Tools> {
    countersign_service::tools::tools(store, &countersign_service::ToolSettings::default()).await
}

/// The connections the cycle part's services share: twice the cores of this machine, where
/// PostgreSQL runs too.
pub(crate) fn service_connections() -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    u32::try_from(cores * 2).unwrap_or(u32::MAX)
}

/// The peak phase: its concurrency, its rate and the CPU a cycle cost in it.
struct Peak {
    in_flight: usize,
    rate: f64,
    cpu: f64,
}

/// The closed-loop phases, one row each under the table's head; the peak among them.
async fn closed_loop_phases(
    pools: &[&PgPool],
    driver: &mut Driver<'_>,
    config: &BenchConfig,
) -> anyhow::Result<Peak> {
    println!();
    println!(
        "{:<28} {:>9} {:>26} {:>6} {:>6} {:>6} {:>8} {:>6} {:>8} {:>8} {:>8}",
        "phase",
        "cycles/s",
        "decision→write p50/p95/p99",
        "stmts",
        "commit",
        "writes",
        "WAL B",
        "pubs",
        "cpu self",
        "cpu pg",
        "cpu mq"
    );
    let mut peak: Option<Peak> = None;
    for in_flight in PHASES {
        let n = phase_cycles(in_flight, config.cycles);
        let before = Counters::read(pools).await?;
        reset_profile();
        let started = Instant::now();
        let cycles = driver.closed_loop(n, in_flight).await?;
        let elapsed = started.elapsed();
        let after = Counters::read(pools).await?;
        let rate = n as f64 / elapsed.as_secs_f64();
        let latency = write_latencies(pools[0], &cycles).await?;
        let name = format!("{in_flight} in flight, {n} cycles");
        let cpu = print_phase(&name, rate, &latency, &before, &after, n);
        print_profile(n);
        if peak.as_ref().is_none_or(|p| rate > p.rate) {
            peak = Some(Peak {
                in_flight,
                rate,
                cpu,
            });
        }
    }
    peak.context("no phase ran")
}

/// The open-loop phase at half the peak's rate, and what the peak says of the CPU.
async fn half_the_peak(
    pools: &[&PgPool],
    driver: &mut Driver<'_>,
    config: &BenchConfig,
    peak: &Peak,
) -> anyhow::Result<()> {
    let half = peak.rate / 2.0;
    let before = Counters::read(pools).await?;
    let started = Instant::now();
    let cycles = driver.open_loop(config.cycles, half).await?;
    let elapsed = started.elapsed();
    let after = Counters::read(pools).await?;
    let latency = write_latencies(pools[0], &cycles).await?;
    let _ = print_phase(
        &format!("half the peak, {half:.0}/s offered"),
        config.cycles as f64 / elapsed.as_secs_f64(),
        &latency,
        &before,
        &after,
        config.cycles,
    );
    println!(
        "peak at {} in flight; process RSS {:.0} MB",
        peak.in_flight,
        rss_bytes(std::process::id()) as f64 / 1e6
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    println!(
        "cpu-bound at the peak a cycle cost {:.1} ms of CPU (this process, PostgreSQL and RabbitMQ): {cores:.0} cores run at most {:.0} cycles/s of it; the peak kept {:.0} % of them busy",
        peak.cpu * 1000.0,
        cores / peak.cpu,
        peak.rate * peak.cpu / cores * 100.0,
    );
    Ok(())
}

/// The commit and publish ceilings of this machine, the floor of one cycle's latency, and a
/// cycle's CPU at the `peak` in bare commits' CPU: a figure of the code rather than of the
/// machine's speed that day, which moves both alike.
async fn print_ceilings(bench: &Bench, floor: Duration, peak: &Peak) -> anyhow::Result<()> {
    let ceilings_at = 16;
    let (commits, commit_cpu) =
        commit_ceiling(&bench.pool, ceilings_at, Duration::from_secs(3)).await?;
    let publishes = publish_ceiling(&bench.broker, 5000, 256).await?;
    println!(
        "ceiling   single-row commits/s with {ceilings_at} connections: {commits:.0} ({:.3} ms of CPU each, this process and PostgreSQL); confirmed publishes/s, 256 confirms in flight: {publishes:.0}",
        commit_cpu * 1000.0
    );
    println!(
        "relative  a cycle at the peak cost the CPU of {:.0} of those commits",
        peak.cpu / commit_cpu
    );
    println!(
        "floor     one broker round trip plus one commit: {:.2} ms",
        floor.as_secs_f64() * 1000.0
    );
    Ok(())
}

/// The CPU of the cycle's hops alone, 16 in flight and at the `peak`'s rate, against the
/// cycle's at the peak.
async fn print_hops(bench: &Bench, peak: &Peak) -> anyhow::Result<()> {
    let in_flight = 16;
    println!(
        "hops      a cycle's hops with no work in them: {} confirmed publishes, delivered and acked {} times; {HOP_STATEMENTS} single-row statements, {HOP_WRITES} of them commits that write",
        HOPS.len(),
        HOPS.iter().map(|h| h.delivered()).sum::<usize>(),
    );
    for (pace, name) in [
        (Pace::InFlight(in_flight), format!("{in_flight} in flight")),
        (
            Pace::Offered(peak.rate),
            format!("at the peak's rate, {:.0}/s offered", peak.rate),
        ),
    ] {
        let hops = cycle_hops(bench, pace, Duration::from_secs(3)).await?;
        println!(
            "          {name:<32} {:>5.0}/s: {:.1} ms of CPU each (this process {:.1}, PostgreSQL {:.1}, RabbitMQ {:.1}); the cycle at the peak cost {:.1} times that",
            hops.rate,
            hops.cpu.total() * 1000.0,
            hops.cpu.this * 1000.0,
            hops.cpu.postgres * 1000.0,
            hops.cpu.rabbitmq * 1000.0,
            peak.cpu / hops.cpu.total(),
        );
    }
    Ok(())
}

/// One message of a cycle: where it is published, and how many queues it reaches.
#[derive(Debug, Clone, Copy)]
enum Hop {
    /// To a public quorum queue (0: the run requests, 1: the decisions), as a producer.
    Public(usize),
    /// To the events exchange under `key`, reaching `delivered` queues.
    Event { key: &'static str, delivered: usize },
}

/// The routing key of the skeleton's events only the driver's (classic) queue takes.
const HOP_DRIVER_KEY: &str = "bench.hop";

/// A full cycle's messages, each confirmed, in order, as the broker's counters show them: the
/// run request; `run.accepted`, which reaches the segments queue (the worker's wake-up) and the
/// driver's queue; `run.suspended`, the driver's; the decision; `decision.accepted`, the
/// resume's wake-up, which the driver does not listen to; `run.completed`, the driver's. Four
/// deliveries from quorum queues, three from a classic one.
const HOPS: [Hop; 6] = [
    Hop::Public(0),
    Hop::Event {
        key: "run.accepted",
        delivered: 2,
    },
    Hop::Event {
        key: HOP_DRIVER_KEY,
        delivered: 1,
    },
    Hop::Public(1),
    Hop::Event {
        key: "decision.accepted",
        delivered: 1,
    },
    Hop::Event {
        key: HOP_DRIVER_KEY,
        delivered: 1,
    },
];

impl Hop {
    fn delivered(self) -> usize {
        match self {
            Hop::Public(_) => 1,
            Hop::Event { delivered, .. } => delivered,
        }
    }
}

/// `total` spread over the cycle's hops, the first ones taking what does not divide evenly:
/// hop `hop`'s share.
fn hop_share(total: usize, hop: usize) -> usize {
    total / HOPS.len() + usize::from(hop < total % HOPS.len())
}
/// Statements a full cycle issues (the `stmts` column at 16 in flight, rounded down).
const HOP_STATEMENTS: usize = 21;
/// Of those, transactions that write (the `writes` column, rounded down).
const HOP_WRITES: usize = 7;

/// What [`cycle_hops`] measured: skeleton cycles a second, and the CPU one cost.
struct Hops {
    rate: f64,
    /// Per skeleton cycle, seconds; `services` is 0.
    cpu: CpuTimes,
}

/// How [`cycle_hops`] paces its skeleton cycles.
#[derive(Debug, Clone, Copy)]
enum Pace {
    /// This many at once, each followed at once by the next.
    InFlight(usize),
    /// One started every `1 / rate` seconds, however many are in flight.
    Offered(f64),
}

/// Skeleton cycles in flight, by id: each is woken by the consumer that took its message.
type Wakers = Arc<std::sync::Mutex<HashMap<u64, UnboundedSender<()>>>>;

/// A cycle's hops with nothing in them, paced by `pace` for `period`: each skeleton cycle
/// passes a message through the broker as the full cycle does — confirmed, four through the
/// public quorum queues, three through a classic queue, one to the events exchange unrouted —
/// each consumed (where delivered) and acked by this process, which hands it back to the
/// cycle's task; and issues the full cycle's number of statements, each a single-row read or
/// a single-row `UPDATE` commit. What a cycle costs beyond this is the work done in its hops;
/// this is what the design's hops cost on this machine with none — at a given pace, since a
/// hop that wakes an idle process costs more than one that finds it busy.
/// Runs with the services stopped: it consumes the public queues itself.
async fn cycle_hops(bench: &Bench, pace: Pace, period: Duration) -> anyhow::Result<Hops> {
    let topology = bench.broker.topology();
    let queues = HopQueues {
        public: [topology.run_requests(), topology.decisions()],
        segments: topology.segments(),
        classic: bench.broker.declare_private_queue().await?,
    };
    for key in ["run.accepted", HOP_DRIVER_KEY] {
        bench.broker.bind_events(&queues.classic, key).await?;
    }
    let wakers: Wakers = Arc::default();
    let consumers = hop_consumers(&bench.broker, &queues, &wakers).await?;
    let skeleton = Skeleton {
        pool: bench.pool.clone(),
        broker: bench.broker.clone(),
        as_producer: bench.as_producer.clone(),
        queues,
        wakers,
    };
    let before = CpuTimes::now(&[]);
    let started = Instant::now();
    let cycles = skeleton.run_paced(pace, started + period).await?;
    let elapsed = started.elapsed();
    let after = CpuTimes::now(&[]);
    drop(consumers);
    let n = cycles.max(1) as f64;
    Ok(Hops {
        rate: n / elapsed.as_secs_f64(),
        cpu: CpuTimes {
            this: (after.this - before.this) / n,
            services: 0.0,
            postgres: (after.postgres - before.postgres) / n,
            rabbitmq: (after.rabbitmq - before.rabbitmq) / n,
        },
    })
}

/// What a skeleton cycle needs.
#[derive(Clone)]
struct Skeleton {
    pool: PgPool,
    broker: Broker,
    as_producer: MessageProperties,
    queues: HopQueues,
    wakers: Wakers,
}

impl Skeleton {
    /// Skeleton cycles at `pace` until `until`, each given the next id; how many were started,
    /// once every one of them ended.
    async fn run_paced(&self, pace: Pace, until: Instant) -> anyhow::Result<u64> {
        let ids = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        match pace {
            Pace::InFlight(n) => {
                for _ in 0..n {
                    let (skeleton, ids) = (self.clone(), ids.clone());
                    tasks.spawn(async move {
                        while Instant::now() < until {
                            skeleton.cycle(ids.fetch_add(1, Ordering::Relaxed)).await?;
                        }
                        Ok::<(), anyhow::Error>(())
                    });
                }
            }
            Pace::Offered(rate) => {
                let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1.0)));
                while Instant::now() < until {
                    ticks.tick().await;
                    let skeleton = self.clone();
                    let id = ids.fetch_add(1, Ordering::Relaxed);
                    tasks.spawn(async move { skeleton.cycle(id).await });
                }
            }
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        Ok(ids.load(Ordering::Relaxed))
    }

    /// Skeleton cycle `id`: its [`HOPS`], each with its statements, on a row of its own among
    /// 64.
    async fn cycle(&self, id: u64) -> anyhow::Result<()> {
        let (waker, mut woken) = tokio::sync::mpsc::unbounded_channel();
        self.lock_wakers().insert(id, waker);
        let passed = async {
            for (n, hop) in HOPS.into_iter().enumerate() {
                self.queues
                    .pass(&self.broker, &self.as_producer, hop, id)
                    .await?;
                for _ in 0..hop.delivered() {
                    woken.recv().await.context("a hop's consumer stopped")?;
                }
                hop_statements(&self.pool, n, (id % 64 + 1) as i32).await?;
            }
            Ok(())
        }
        .await;
        self.lock_wakers().remove(&id);
        passed
    }

    fn lock_wakers(&self) -> std::sync::MutexGuard<'_, HashMap<u64, UnboundedSender<()>>> {
        self.wakers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a skeleton cycle's messages go.
#[derive(Clone)]
struct HopQueues {
    /// The public quorum queues (their consumers, the services, stopped).
    public: [String; 2],
    /// The quorum queue the wake-up events reach (its consumer, the worker, stopped).
    segments: String,
    /// A classic queue of the bench's own, as the driver's events queue is, bound to
    /// `run.accepted` and [`HOP_DRIVER_KEY`].
    classic: String,
}

impl HopQueues {
    /// Publishes skeleton cycle `id`'s message of `hop`, confirmed; the consumers of
    /// [`hop_consumers`] wake the cycle once for each queue it reaches.
    async fn pass(
        &self,
        broker: &Broker,
        as_producer: &MessageProperties,
        hop: Hop,
        id: u64,
    ) -> anyhow::Result<()> {
        let body = json!({ "hop_cycle": id });
        match hop {
            Hop::Public(queue) => {
                let bytes = serde_json::to_vec(&body)?;
                broker
                    .publish_public(&self.public[queue], &bytes, as_producer)
                    .await?;
            }
            Hop::Event { key, .. } => {
                let event_id = Uuid::now_v7().to_string();
                broker.publish_event_body(key, &event_id, &body).await?;
            }
        }
        Ok(())
    }
}

/// A consumer of each of the hops' queues, acking every delivery and waking the skeleton cycle
/// its body names. The consumers stop when the returned set is dropped.
async fn hop_consumers(
    broker: &Broker,
    queues: &HopQueues,
    wakers: &Wakers,
) -> anyhow::Result<JoinSet<anyhow::Result<()>>> {
    let mut consumers = JoinSet::new();
    for queue in queues
        .public
        .iter()
        .chain([&queues.segments, &queues.classic])
    {
        let mut consumer = broker.consume(queue, 64).await?;
        let wakers = wakers.clone();
        consumers.spawn(async move {
            while let Some(delivery) = consumer.next().await {
                let delivery = delivery?;
                let id = serde_json::from_slice::<Value>(&delivery.body)
                    .ok()
                    .and_then(|body| body["hop_cycle"].as_u64());
                delivery.ack().await?;
                let waker = id.and_then(|id| {
                    let wakers = wakers.lock().unwrap_or_else(|p| p.into_inner());
                    wakers.get(&id).cloned()
                });
                if let Some(waker) = waker {
                    let _ = waker.send(());
                }
            }
            Ok(())
        });
    }
    Ok(consumers)
}

/// The statements of a skeleton cycle's `hop`, on its own `row`: the cycle's reads and its
/// single-row `UPDATE` commits spread over its hops.
async fn hop_statements(pool: &PgPool, hop: usize, row: i32) -> anyhow::Result<()> {
    for _ in 0..hop_share(HOP_STATEMENTS - HOP_WRITES, hop) {
        sqlx::query("SELECT n FROM bench_baseline WHERE id = $1")
            .bind(row)
            .fetch_one(pool)
            .await?;
    }
    for _ in 0..hop_share(HOP_WRITES, hop) {
        sqlx::query("UPDATE bench_baseline SET n = n + 1 WHERE id = $1")
            .bind(row)
            .execute(pool)
            .await?;
    }
    Ok(())
}

fn spawn_coordinator(
    services: &mut JoinSet<()>,
    coordinator: Coordinator,
    broker: &Broker,
    stop: &Arc<Notify>,
) {
    let (broker, stop) = (broker.clone(), stop.clone());
    services.spawn(async move {
        countersign_coordinator::service::run(
            coordinator,
            broker,
            async move { stop.notified().await },
        )
        .await
    });
}

/// Cycles a phase runs: enough for its concurrency to matter, at most what was asked.
fn phase_cycles(in_flight: usize, cycles: usize) -> usize {
    match in_flight {
        1 => cycles.min(50),
        n => cycles.max(n * 2),
    }
}

fn spawn_worker(
    services: &mut JoinSet<()>,
    runner: SegmentRunner,
    broker: &Broker,
    stop: &Arc<Notify>,
    concurrency: usize,
) {
    let config = WorkerConfig {
        owner: format!("bench-worker-{}", Uuid::now_v7()),
        concurrency,
        poll_interval: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(5),
    };
    let (broker, stop) = (broker.clone(), stop.clone());
    services.spawn(async move {
        countersign_worker::service::run(
            runner,
            broker,
            config,
            async move { stop.notified().await },
        )
        .await
    });
}

/// One bench page per cycle, a copy of the demo's home page.
async fn seed_pages(pool: &PgPool, n: usize) -> anyhow::Result<Vec<i64>> {
    let pages = sqlx::query_scalar(
        "INSERT INTO content.pages (pid, sorting, title, description)
         SELECT $1, 10000 + i, 'Bench page ' || i, 'Untouched.'
         FROM generate_series(1, $2::int) AS i
         RETURNING uid",
    )
    .bind(PARENT_PAGE)
    .bind(i32::try_from(n)?)
    .fetch_all(pool)
    .await?;
    Ok(pages)
}

/// The description cycle `page` writes.
fn description(page: i64) -> String {
    format!("Bench cycle wrote page {page}.")
}

/// One cycle as the producer sees it.
#[derive(Debug, Clone)]
pub(crate) struct Cycle {
    page: i64,
    run_id: Option<String>,
    decided_at: Option<DateTime<Utc>>,
}

/// The events the driver acts on: a run's id for its request, its card, its end, and what
/// stops the bench.
const DRIVER_EVENTS: [&str; 5] = [
    "run.accepted",
    "run.suspended",
    "run.completed",
    "run.failed",
    "decision.refused",
];

/// The producer's side: requests and decisions out, events in.
pub(crate) struct Driver<'a> {
    broker: &'a Broker,
    events: Consumer,
    as_producer: MessageProperties,
    pages: std::vec::IntoIter<i64>,
    /// request id → cycle
    cycles: HashMap<Uuid, Cycle>,
    /// run id → request id
    run_of: HashMap<String, Uuid>,
    /// Events about runs whose `run.accepted` was not read yet.
    early: Vec<Value>,
    /// Every completed cycle of the bench.
    pub(crate) done: Vec<Cycle>,
    /// Whether a policy approves the cards: the driver then decides nothing itself.
    pub(crate) auto: bool,
}

impl Driver<'_> {
    async fn request(&mut self) -> anyhow::Result<()> {
        let page = self.pages.next().context("the bench ran out of pages")?;
        let request = RunRequest {
            request_id: Uuid::now_v7(),
            agent: AGENT.into(),
            acting_user: "editor".into(),
            prompt: "Describe the bench page.".into(),
            inputs: json!({"page": page, "description": description(page)})
                .as_object()
                .cloned(),
        };
        self.cycles.insert(
            request.request_id,
            Cycle {
                page,
                run_id: None,
                decided_at: None,
            },
        );
        self.broker
            .publish_message(
                &self.broker.topology().run_requests(),
                &serde_json::to_vec(&request.to_json())?,
                &self.as_producer,
            )
            .await?;
        Ok(())
    }

    /// Handles one event; the completed cycle, if it completed one.
    async fn handle(&mut self, event: Value) -> anyhow::Result<Option<Cycle>> {
        let run_id = event["run_id"].as_str().unwrap_or_default().to_owned();
        match event["event"].as_str() {
            Some("run.accepted") => {
                let request_id = Uuid::parse_str(event["request_id"].as_str().unwrap_or_default())?;
                if let Some(cycle) = self.cycles.get_mut(&request_id) {
                    cycle.run_id = Some(run_id.clone());
                    self.run_of.insert(run_id.clone(), request_id);
                    let early: Vec<Value> = std::mem::take(&mut self.early);
                    let (mine, rest): (Vec<Value>, Vec<Value>) = early
                        .into_iter()
                        .partition(|e| e["run_id"] == run_id.as_str());
                    self.early = rest;
                    for e in mine {
                        if let Some(done) = Box::pin(self.handle(e)).await? {
                            return Ok(Some(done));
                        }
                    }
                }
                Ok(None)
            }
            Some("run.suspended") | Some("run.completed") if !self.run_of.contains_key(&run_id) => {
                self.early.push(event);
                Ok(None)
            }
            Some("run.suspended") if self.auto => Ok(None),
            Some("run.suspended") => {
                let decision = json!({
                    "type": "countersign.decision", "version": 1,
                    "decision_id": Uuid::now_v7(), "run_id": run_id,
                    "suspension_seq": event["suspension_seq"], "turn_digest": event["turn_digest"],
                    "approved": true, "approver": "approver",
                });
                let request = self.run_of[&run_id];
                if let Some(cycle) = self.cycles.get_mut(&request) {
                    cycle.decided_at = Some(Utc::now());
                }
                self.broker
                    .publish_message(
                        &self.broker.topology().decisions(),
                        &serde_json::to_vec(&decision)?,
                        &self.as_producer,
                    )
                    .await?;
                Ok(None)
            }
            Some("run.completed") => {
                let request = self.run_of[&run_id];
                let cycle = self
                    .cycles
                    .remove(&request)
                    .context("a cycle completed twice")?;
                self.done.push(cycle.clone());
                Ok(Some(cycle))
            }
            Some("run.failed") => bail!("a run failed: {event}"),
            Some("decision.refused") => bail!("a decision was refused: {event}"),
            _ => Ok(None),
        }
    }

    /// `n` cycles, keeping `in_flight` of them going.
    pub(crate) async fn closed_loop(
        &mut self,
        n: usize,
        in_flight: usize,
    ) -> anyhow::Result<Vec<Cycle>> {
        let mut started = 0;
        let mut finished = Vec::with_capacity(n);
        while started < n.min(in_flight) {
            self.request().await?;
            started += 1;
        }
        while finished.len() < n {
            let event = next_event(&mut self.events).await?;
            if let Some(cycle) = self.handle(event).await? {
                finished.push(cycle);
                if started < n {
                    self.request().await?;
                    started += 1;
                }
            }
        }
        Ok(finished)
    }

    /// Stops watching the events (a queue bound to them all would go on costing the broker a
    /// copy of every event); the cycles it completed.
    pub(crate) async fn finish(self) -> anyhow::Result<Vec<Cycle>> {
        self.events.cancel().await?;
        Ok(self.done)
    }

    /// `n` cycles, requested at `rate` per second whatever is in flight.
    async fn open_loop(&mut self, n: usize, rate: f64) -> anyhow::Result<Vec<Cycle>> {
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1.0)));
        let mut started = 0;
        let mut finished = Vec::with_capacity(n);
        while finished.len() < n {
            // Only the stream's `next` may be cancelled by the tick: it is cancel-safe, an
            // event half acknowledged would not be.
            let delivery = tokio::select! {
                _ = ticks.tick(), if started < n => {
                    self.request().await?;
                    started += 1;
                    continue;
                }
                delivery = self.events.next() => delivery,
                () = tokio::time::sleep(Duration::from_secs(60)) => {
                    bail!("no event for 60 s; the services stalled")
                }
            };
            let delivery = delivery.context("the event consumer closed")??;
            let event = serde_json::from_slice(&delivery.body)?;
            delivery.ack().await?;
            if let Some(cycle) = self.handle(event).await? {
                finished.push(cycle);
            }
        }
        Ok(finished)
    }
}

async fn next_event(events: &mut Consumer) -> anyhow::Result<Value> {
    let delivery = tokio::time::timeout(Duration::from_secs(60), events.next())
        .await
        .context("no event for 60 s; the services stalled")?
        .context("the event consumer closed")??;
    let event = serde_json::from_slice(&delivery.body)?;
    delivery.ack().await?;
    Ok(event)
}

/// Decision → write committed: from the approval's publish to the insert of the turn's journal
/// row, the last statement before the turn's commit (both clocks are this machine's).
async fn write_latencies(pool: &PgPool, cycles: &[Cycle]) -> anyhow::Result<Latencies> {
    let ids: Vec<Uuid> = cycles
        .iter()
        .filter_map(|c| c.run_id.as_deref().and_then(|r| Uuid::parse_str(r).ok()))
        .collect();
    let written: HashMap<Uuid, DateTime<Utc>> = sqlx::query_as(
        "SELECT run_id, max(created_at) FROM run_journal WHERE run_id = ANY($1) GROUP BY run_id",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    Ok(Latencies::new(
        cycles
            .iter()
            .filter_map(|c| {
                let run = Uuid::parse_str(c.run_id.as_deref()?).ok()?;
                let decided = c.decided_at?;
                (*written.get(&run)? - decided).to_std().ok()
            })
            .collect(),
    ))
}

/// Every cycle's page holds what its approval wrote, and every other page is untouched.
pub(crate) async fn verify(pool: &PgPool, done: &[Cycle]) -> anyhow::Result<()> {
    let written: HashSet<i64> = done.iter().map(|c| c.page).collect();
    let pages: Vec<(i64, String)> = sqlx::query_as(
        "SELECT uid, description FROM content.pages WHERE pid = $1 AND sorting > 10000",
    )
    .bind(PARENT_PAGE)
    .fetch_all(pool)
    .await?;
    let mut wrong = 0;
    for (uid, desc) in &pages {
        let expected = if written.contains(uid) {
            description(*uid)
        } else {
            "Untouched.".to_owned()
        };
        if *desc != expected {
            wrong += 1;
        }
    }
    let writes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM run_events WHERE kind = 'tool_write' AND payload->>'is_error' = 'false'",
    )
    .fetch_one(pool)
    .await?;
    if wrong > 0 || writes != done.len() as i64 {
        bail!(
            "verification failed: {wrong} page(s) do not hold what their approval wrote, \
             {writes} write(s) recorded for {} approved",
            done.len()
        );
    }
    Ok(())
}

/// Prints one phase's row; returns the CPU seconds a cycle cost the three processes.
fn print_phase(
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
struct Counters {
    statements: u64,
    /// `pg_stat_database.xact_commit`: every committed transaction, a read-only statement
    /// outside a transaction included.
    commits: i64,
    /// Transaction ids assigned (the next one, from `pg_current_snapshot()`): the transactions
    /// that wrote, each one a WAL flush at its commit.
    writes: i64,
    wal_bytes: i64,
    publishes: u64,
    cpu: CpuTimes,
}

impl Counters {
    /// The counters now, read through the first of `pools`, every connection of each of which
    /// has reported its statistics.
    async fn read(pools: &[&PgPool]) -> anyhow::Result<Counters> {
        // A backend reports its statistics when it goes idle, at most once a second: wait, then
        // have every connection of the pools run a statement so each one reports.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let mut conns = Vec::new();
        for pool in pools {
            while let Ok(Some(conn)) =
                tokio::time::timeout(Duration::from_millis(50), pool.acquire())
                    .await
                    .map(Result::ok)
            {
                conns.push(conn);
            }
        }
        let pool = pools[0];
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
            cpu: CpuTimes::now(&[]),
        })
    }
}

/// CPU seconds so far of this process, of the service processes the bench started,
/// PostgreSQL's and RabbitMQ's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuTimes {
    pub(crate) this: f64,
    /// The service processes together; 0 without any.
    pub(crate) services: f64,
    pub(crate) postgres: f64,
    pub(crate) rabbitmq: f64,
}

impl CpuTimes {
    /// Read while `services` run: an exited process's time is gone from `/proc`, and so is that
    /// of its PostgreSQL server processes.
    pub(crate) fn now(services: &[u32]) -> CpuTimes {
        CpuTimes {
            this: cpu_seconds(|pid, _| pid == std::process::id()),
            services: cpu_seconds(|pid, _| services.contains(&pid)),
            postgres: cpu_seconds(|_, comm| comm == "postgres"),
            rabbitmq: cpu_seconds(|_, comm| comm == "beam.smp"),
        }
    }

    /// The CPU seconds of all of them together.
    pub(crate) fn total(&self) -> f64 {
        self.this + self.services + self.postgres + self.rabbitmq
    }
}

/// SQL statements issued by this process, as sqlx logs them.
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

/// Tracing for the bench: the usual log lines, and a count of every statement sqlx issues.
pub fn init_tracing(logging: &countersign_service::Logging) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = countersign_service::telemetry::log_filter(logging);
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

fn reset_profile() {
    if let Some(profile) = PROFILE.get() {
        profile.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Prints the statements of a phase by kind, per cycle, and starts counting afresh.
fn print_profile(cycles: usize) {
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
fn rss_bytes(pid: u32) -> u64 {
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

async fn amqp_round_trips(broker: &Broker, n: usize) -> anyhow::Result<Latencies> {
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

async fn update_commits(pool: &PgPool, n: usize) -> anyhow::Result<Latencies> {
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

/// Single-row commits per second from `connections` connections at once, each on its own row,
/// and the CPU seconds one cost this process and PostgreSQL.
async fn commit_ceiling(
    pool: &PgPool,
    connections: usize,
    period: Duration,
) -> anyhow::Result<(f64, f64)> {
    let before = CpuTimes::now(&[]);
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
    let after = CpuTimes::now(&[]);
    let spent = (after.this - before.this) + (after.postgres - before.postgres);
    let total = total.max(1) as f64;
    Ok((total / period.as_secs_f64(), spent / total))
}

/// Confirmed publishes per second with `in_flight` confirms outstanding at once.
async fn publish_ceiling(broker: &Broker, n: usize, in_flight: usize) -> anyhow::Result<f64> {
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
async fn publish_pipelined(
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
struct Latencies(Vec<Duration>);

impl Latencies {
    fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Latencies(samples)
    }

    fn percentile(&self, p: usize) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p * self.0.len()).div_ceil(100).clamp(1, self.0.len());
        self.0[rank - 1]
    }

    fn summary(&self) -> String {
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

// The long-segment part: thousands of segments at once in one `countersign-worker` process,
// each waiting seconds for a model stub in a process of its own.

const LONG_AGENT: &str = "bench-long";
/// The `application_name` of the worker's connections, to count them.
pub(crate) const WORKER_APPLICATION: &str = "countersign-bench-worker";
/// The variable the long agent's model settings name for their (stand-in) API key.
const STUB_KEY_ENV: &str = "COUNTERSIGN_BENCH_STUB_KEY";
const LONG_LEASE_TTL_SECS: u64 = 6;

/// Thousands of segments at once in one `countersign-worker`, each waiting seconds for its
/// model.
async fn long_segments(
    bench: &Bench,
    processes: &ServiceEnv,
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
    let long_agent = AgentConfig {
        model,
        max_iterations: 2,
        ..agent(LONG_AGENT, &[], false)
    };
    bench.store.upsert_agent(&long_agent).await?;
    let stop = Arc::new(Notify::new());
    let mut services = JoinSet::new();
    let tools = tools(&bench.store).await?;
    let coordinator =
        Coordinator::with_users(bench.store.clone(), Arc::new(tools.registry), tools.users);
    spawn_coordinator(&mut services, coordinator, &bench.broker, &stop);
    let watch = bench.broker.declare_private_queue().await?;
    bench.broker.bind_events(&watch, "run.*").await?;
    let mut long = Long {
        bench,
        processes,
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
    // Its watch would go on costing the broker a copy of every later event.
    long.events.cancel().await?;
    stop.notify_waiters();
    while services.join_next().await.is_some() {}
    Ok(())
}

/// What the long-segment part works with.
struct Long<'a> {
    bench: &'a Bench,
    /// How it starts its worker processes.
    processes: &'a ServiceEnv,
    stub: StubProcess,
    /// Every `run.*` event of the bench's queues.
    events: Consumer,
    latency: Duration,
}

impl Long<'_> {
    /// A worker running `concurrency` segments at once, on short leases.
    async fn start_worker(&self, concurrency: usize) -> anyhow::Result<ServiceProcess> {
        let args = [
            "--concurrency".to_owned(),
            concurrency.to_string(),
            "--lease-ttl-secs".to_owned(),
            LONG_LEASE_TTL_SECS.to_string(),
            "--poll-interval-secs".to_owned(),
            "1".to_owned(),
        ];
        let worker = &self.processes.worker;
        self.processes
            .start(worker, WORKER_APPLICATION, &args)
            .await
    }

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
            per_run(before.cpu.services, after.cpu.services) * 1000.0,
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
        let process = self.start_worker(n).await?;
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
            per_run(smaller.before.cpu.services, smaller.after.cpu.services),
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
        let before = Counters::read(&[pool]).await?;
        // The worker's start-up (its connections, its topology check) is in its first wave.
        let started = Instant::now();
        let process = self.start_worker(n).await?;
        let seen = self.await_long_runs(&process, queued).await?;
        let elapsed = started.elapsed();
        let heartbeats = process.metric("countersign_heartbeat_statements_total")?;
        // CPU times now, while the worker and its server processes run (an exited process's
        // time is gone from /proc); the statistics once it stopped, as its server processes
        // report theirs when they exit (an idle one may wait ten seconds).
        let cpu = CpuTimes::now(&[process.pid()]);
        process.stop().await?;
        let after = Counters {
            cpu,
            ..Counters::read(&[pool]).await?
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
        worker: &ServiceProcess,
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

/// How the bench starts `countersign-worker` and `countersign-coordinator` (built beside this
/// binary): as an installation does, against the bench's database, queues and keys.
pub(crate) struct ServiceEnv {
    pub(crate) worker: PathBuf,
    pub(crate) coordinator: PathBuf,
    database: PgConnectOptions,
    amqp_addr: String,
    queue_prefix: String,
    keys: String,
}

impl ServiceEnv {
    fn new(
        db: &Database,
        amqp_addr: &str,
        queue_prefix: &str,
        keys: &str,
    ) -> anyhow::Result<ServiceEnv> {
        Ok(ServiceEnv {
            worker: binary("countersign-worker")?,
            coordinator: binary("countersign-coordinator")?,
            database: db.options()?,
            amqp_addr: amqp_addr.into(),
            queue_prefix: queue_prefix.into(),
            keys: keys.into(),
        })
    }

    /// `binary` with `args`, its connections named `application`, serving its metrics; returns
    /// once it answers on them.
    pub(crate) async fn start(
        &self,
        binary: &Path,
        application: &str,
        args: &[String],
    ) -> anyhow::Result<ServiceProcess> {
        use sqlx::ConnectOptions;
        let name = binary.file_name().unwrap_or_default().to_string_lossy();
        let mut url = self.database.to_url_lossy();
        url.query_pairs_mut()
            .append_pair("application_name", application);
        let port = free_port();
        let mut command = Command::new(binary);
        command
            .args(args)
            .args(["--http-addr", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", url.as_str())
            .env("AMQP_ADDR", &self.amqp_addr)
            .env("COUNTERSIGN_QUEUE_PREFIX", &self.queue_prefix)
            .env("COUNTERSIGN_KEYS", &self.keys)
            .env_remove("COUNTERSIGN_KEY_FILE")
            .env(STUB_KEY_ENV, "stub")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let mut process = Process::spawn(&name, &mut command)?;
        process
            .wait_for_http(port, "/healthz", Duration::from_secs(30))
            .await?;
        Ok(ServiceProcess {
            name: name.into_owned(),
            process,
            port,
        })
    }
}

/// A running service binary; killed if dropped before [`ServiceProcess::stop`].
pub(crate) struct ServiceProcess {
    name: String,
    process: Process,
    /// Where it serves its metrics.
    port: u16,
}

impl ServiceProcess {
    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The value of an unlabelled metric the process serves.
    fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let (_, body) = http_get(self.port, "/metrics")
            .with_context(|| format!("the {} /metrics", self.name))?;
        let served = body
            .lines()
            .any(|line| line.starts_with(&format!("{name} ")));
        anyhow::ensure!(served, "{} serves no {name}", self.name);
        Ok(counter_total(&body, name))
    }

    /// SIGTERM, as an installation stops it; waits for it to exit 0.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        let status = self.process.terminate(Duration::from_secs(30)).await?;
        anyhow::ensure!(status.success(), "{} exited {status}", self.name);
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
