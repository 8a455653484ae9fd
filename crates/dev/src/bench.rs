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
//! At the end every cycle is verified from the content store: each approved write landed once,
//! on its page, and nothing else changed; otherwise the bench exits non-zero.
//!
//! The long-segment part gives one `countersign-worker` process thousands of segments whose
//! model (an OpenAI-compatible stub in a process of its own) takes seconds to answer, and reports
//! throughput against the ideal N / latency — in the steady state of a backlog queued before
//! the worker starts, for its first wave, and with the runs requested at once — the
//! coordinator's intake, RSS, heartbeat statements per second and PostgreSQL connections.

mod figures;
mod long;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use countersign_coordinator::{producers, Coordinator, ProducerKind};
use countersign_core::{RunRequest, ToolPolicy};
use countersign_crypto::{KeyId, Keyring};
use countersign_model::ScriptedModel;
use countersign_queue::{Broker, Consumer, MessageProperties, QueueConfig, Topology};
use countersign_service::tools::Tools;
use countersign_store::{AgentConfig, Store};
use countersign_testkit::Database;
use countersign_worker::service::WorkerConfig;
use countersign_worker::{Models, SegmentRunner};
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use uuid::Uuid;

pub use figures::init_tracing;
use figures::{
    amqp_round_trips, commit_ceiling, print_phase, print_profile, publish_ceiling, reset_profile,
    rss_bytes, update_commits, Counters, Latencies,
};
pub use long::serve_model_stub;

const SCRIPT: &str = include_str!("../bench-agent.json");
const AGENT: &str = "bench-agent";
/// The page every bench page is created under (inside the editor's page mount).
const PARENT_PAGE: i64 = 10;
/// Segments the worker runs at once in the cycle part.
const WORKER_CONCURRENCY: usize = 512;
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
    // Checked first, so a missing worker binary stops the bench before its first figure.
    let worker = match config.long_segments {
        0 => None,
        _ => Some(long::WorkerEnv::new(
            db,
            amqp_addr,
            &bench.queue_prefix,
            &bench.keys,
        )?),
    };
    let total: usize = PHASES
        .iter()
        .map(|&c| phase_cycles(c, config.cycles))
        .sum::<usize>()
        + config.cycles;
    let pages = seed_pages(&bench.pool, total).await?;
    println!(
        "countersign bench: the full approval cycle (request → suspend → approve → re-preview → write → completed),\n\
         coordinator and one worker ({WORKER_CONCURRENCY} segments at once) in this process, over RabbitMQ and PostgreSQL"
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
    let mut services = bench.start_services(&stop).await?;
    let mut driver = bench.driver(pages).await?;
    let peak = closed_loop_phases(&bench.pool, &mut driver, config).await?;
    half_the_peak(&bench.pool, &mut driver, config, &peak).await?;
    let floor = amqp.percentile(50) + pg.percentile(50);
    print_ceilings(&bench, floor).await?;
    verify(&bench.pool, &driver.done).await?;
    println!(
        "verified  {} approved writes landed once each, on their own page; nothing else changed",
        driver.done.len()
    );
    stop.notify_waiters();
    while services.join_next().await.is_some() {}

    if let Some(worker) = &worker {
        long::long_segments(&bench, worker, config).await?;
    }
    bench.broker.delete_topology().await?;
    bench.pool.close().await;
    Ok(())
}

/// What every part of the bench works on: its database, keys, queues and producer identity.
struct Bench {
    /// The services' pool, as the binaries configure it.
    pool: PgPool,
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
        countersign_content::WITH_ENGINE.run(&pool).await?;
        countersign_content::seed_demo_site(&pool).await?;
        producers::allow(&pool, "guest", ProducerKind::ActingUser, "*").await?;
        producers::allow(&pool, "guest", ProducerKind::Approver, "*").await?;
        let keys = Keyring::generate_entry(&KeyId::parse("bench")?);
        let store = Store::new(pool.clone(), Arc::new(Keyring::parse(&keys)?));
        store
            .upsert_agent(&agent(
                AGENT,
                json!({"provider": "scripted"}),
                vec!["update_page_metadata".into()],
                5,
            ))
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
            store,
            keys,
            queue_prefix,
            broker,
            as_producer,
        })
    }

    /// The deployment's tools and users, assembled as every service assembles them.
    async fn tools(&self) -> anyhow::Result<Tools> {
        countersign_service::tools::tools(&self.store).await
    }

    /// The coordinator and one worker, in this process, until `stop` is notified.
    async fn start_services(&self, stop: &Arc<Notify>) -> anyhow::Result<JoinSet<()>> {
        let Tools {
            registry,
            local,
            users,
            ..
        } = self.tools().await?;
        let (registry, local) = (Arc::new(registry), Arc::new(local));
        let mut services = JoinSet::new();
        // Each service gets a store of its own, as in its own process: its relay wakes for its
        // own commits only. They share the connection pool.
        let keyring = Arc::new(Keyring::ephemeral());
        let service_store = || Store::new(self.pool.clone(), keyring.clone());
        let coordinator = Coordinator::with_users(service_store(), registry.clone(), users.clone());
        spawn_coordinator(&mut services, coordinator, &self.broker, stop);
        let runner = SegmentRunner {
            store: service_store(),
            registry,
            local,
            models: Models::Fixed(Arc::new(ScriptedModel::from_json(SCRIPT)?)),
            users,
            lease_ttl: Duration::from_secs(30),
            heartbeat: Default::default(),
            settler: Default::default(),
        };
        spawn_worker(
            &mut services,
            runner,
            &self.broker,
            stop,
            WORKER_CONCURRENCY,
        );
        Ok(services)
    }

    /// The producer's side of the cycles, on every event of the bench's queues.
    async fn driver(&self, pages: Vec<i64>) -> anyhow::Result<Driver<'_>> {
        let watch = self.broker.declare_private_queue().await?;
        self.broker.bind_events(&watch, "#").await?;
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
        })
    }
}

/// An agent of the bench: no allow-list, the writers `enabled`, no second approver.
fn agent(name: &str, model: Value, enabled: Vec<String>, max_iterations: u32) -> AgentConfig {
    AgentConfig {
        name: name.into(),
        active: true,
        model,
        policy: ToolPolicy {
            enabled_tools: enabled,
            ..ToolPolicy::default()
        },
        max_iterations,
        max_tool_calls_per_turn: countersign_core::agent_loop::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
        four_eyes: false,
        approval_deadline: Duration::from_secs(3600),
    }
}

/// The peak phase: its concurrency, its rate and the CPU a cycle cost in it.
struct Peak {
    in_flight: usize,
    rate: f64,
    cpu: f64,
}

/// The closed-loop phases, one row each under the table's head; the peak among them.
async fn closed_loop_phases(
    pool: &PgPool,
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
        let before = Counters::read(pool).await?;
        reset_profile();
        let started = Instant::now();
        let cycles = driver.closed_loop(n, in_flight).await?;
        let elapsed = started.elapsed();
        let after = Counters::read(pool).await?;
        let rate = n as f64 / elapsed.as_secs_f64();
        let latency = write_latencies(pool, &cycles).await?;
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
    pool: &PgPool,
    driver: &mut Driver<'_>,
    config: &BenchConfig,
    peak: &Peak,
) -> anyhow::Result<()> {
    let half = peak.rate / 2.0;
    let before = Counters::read(pool).await?;
    let started = Instant::now();
    let cycles = driver.open_loop(config.cycles, half).await?;
    let elapsed = started.elapsed();
    let after = Counters::read(pool).await?;
    let latency = write_latencies(pool, &cycles).await?;
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

/// The commit and publish ceilings of this machine, and the floor of one cycle's latency.
async fn print_ceilings(bench: &Bench, floor: Duration) -> anyhow::Result<()> {
    let ceilings_at = 16;
    let commits = commit_ceiling(&bench.pool, ceilings_at, Duration::from_secs(3)).await?;
    let publishes = publish_ceiling(&bench.broker, 5000, 256).await?;
    println!(
        "ceiling   single-row commits/s with {ceilings_at} connections: {commits:.0}; confirmed publishes/s, 256 confirms in flight: {publishes:.0}"
    );
    println!(
        "floor     one broker round trip plus one commit: {:.2} ms",
        floor.as_secs_f64() * 1000.0
    );
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
struct Cycle {
    page: i64,
    run_id: Option<String>,
    decided_at: Option<DateTime<Utc>>,
}

/// The producer's side: requests and decisions out, events in.
struct Driver<'a> {
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
    done: Vec<Cycle>,
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
    async fn closed_loop(&mut self, n: usize, in_flight: usize) -> anyhow::Result<Vec<Cycle>> {
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
async fn verify(pool: &PgPool, done: &[Cycle]) -> anyhow::Result<()> {
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
