//! `countersign bench`: runs through the real services, timed, against baselines measured in
//! the same run.
//!
//! It starts a coordinator and workers in this process (the same code the binaries run),
//! against a throwaway database and its own queue prefix, and sends run requests through
//! RabbitMQ as a producer would. Two paths are timed from the producer's side, by the events
//! the services publish:
//!
//! - request → `run.suspended`: the coordinator's gates and dispatch, a claim, one read-only
//!   turn, the write turn's preview, the sealed suspension;
//! - decision → `run.completed`: the decision's gates and transaction, the resume segment, the
//!   model's answer, the settle. The decisions are denials: every run proposes a write to the
//!   same page, so approving them all would move each other's previews — the binding doing
//!   its job — and time the bounce instead of the path.
//!
//! The baselines are what one step of those paths costs at least on this machine: a RabbitMQ
//! publish → consume round trip, and a single-row PostgreSQL `UPDATE` commit.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use countersign_coordinator::{producers, Coordinator, ProducerKind};
use countersign_core::{
    DecisionMessage, RunId, RunRequest, SuspensionSeq, ToolPolicy, ToolRegistry, TurnDigest,
};
use countersign_crypto::Keyring;
use countersign_model::ScriptedModel;
use countersign_queue::{Broker, MessageProperties, QueueConfig, Topology};
use countersign_store::{AgentConfig, Store};
use countersign_worker::service::WorkerConfig;
use countersign_worker::{Models, SegmentRunner};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use tokio::sync::Notify;
use uuid::Uuid;

const SCRIPT: &str = include_str!("../demo/bench-agent.json");
const AGENT: &str = "bench-agent";

pub async fn run(
    database_url: &str,
    amqp_addr: &str,
    runs: usize,
    workers: usize,
) -> anyhow::Result<()> {
    let server = PgConnectOptions::from_str(database_url).context("parsing DATABASE_URL")?;
    let database = format!("countersign_bench_{}", std::process::id());
    let mut admin = PgConnection::connect_with(&server)
        .await
        .context("connecting to PostgreSQL")?;
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&mut admin)
        .await?;
    let result = bench(
        &server.clone().database(&database),
        amqp_addr,
        runs,
        workers,
    )
    .await;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    result
}

async fn bench(
    db: &PgConnectOptions,
    amqp_addr: &str,
    runs: usize,
    workers: usize,
) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(db.clone())
        .await?;
    countersign_store::MIGRATOR.run(&pool).await?;
    countersign_content::seed_demo_site(&pool).await?;
    producers::allow(&pool, "guest", ProducerKind::ActingUser, "*").await?;
    producers::allow(&pool, "guest", ProducerKind::Approver, "*").await?;
    let store = Store::new(pool.clone(), Arc::new(Keyring::ephemeral()));
    store
        .upsert_agent(&AgentConfig {
            name: AGENT.into(),
            active: true,
            model: json!({"provider": "scripted"}),
            policy: ToolPolicy {
                enabled_tools: vec!["update_page_metadata".into()],
                ..ToolPolicy::default()
            },
            max_iterations: 5,
            max_tool_calls_per_turn: countersign_core::agent_loop::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            four_eyes: false,
            approval_deadline: Duration::from_secs(3600),
        })
        .await?;
    let broker = Broker::connect(QueueConfig::new(
        amqp_addr,
        Topology::new(format!("bench-{}", Uuid::now_v7())),
    ))
    .await?;
    let user = broker.user().context("the broker connection has no user")?;

    println!("countersign bench: {runs} runs, {workers} worker(s) × 4 segments, coordinator and workers in process");
    let amqp = amqp_round_trips(&broker, 200).await?;
    let pg = update_commits(&pool, 200).await?;
    println!(
        "baseline  RabbitMQ publish→consume round trip:   {}",
        amqp.summary()
    );
    println!(
        "baseline  PostgreSQL single-row UPDATE commit:   {}",
        pg.summary()
    );

    let stop = Arc::new(Notify::new());
    let mut registry = ToolRegistry::new();
    countersign_content::register(&mut registry, store.clone());
    let registry = Arc::new(registry);
    let mut services = tokio::task::JoinSet::new();
    {
        let coordinator = Coordinator::new(store.clone(), registry.clone());
        let (broker, stop) = (broker.clone(), stop.clone());
        services.spawn(async move {
            countersign_coordinator::service::run(coordinator, broker, async move {
                stop.notified().await
            })
            .await
        });
    }
    for n in 0..workers.max(1) {
        let runner = SegmentRunner {
            store: store.clone(),
            registry: registry.clone(),
            models: Models::Fixed(Arc::new(ScriptedModel::from_json(SCRIPT)?)),
            users: Arc::new(countersign_content::ContentUsers::new(pool.clone())),
            lease_ttl: Duration::from_secs(30),
        };
        let config = WorkerConfig {
            owner: format!("bench-worker-{n}"),
            concurrency: 4,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
        };
        let (broker, stop) = (broker.clone(), stop.clone());
        services.spawn(async move {
            countersign_worker::service::run(runner, broker, config, async move {
                stop.notified().await
            })
            .await
        });
    }

    let watch = broker.declare_private_queue().await?;
    broker.bind_events(&watch, "#").await?;
    let events = broker.consume(&watch, 500).await?;
    let as_producer = MessageProperties {
        user_id: Some(user),
        ..MessageProperties::default()
    };

    let mut flow = Flow {
        broker: &broker,
        events,
        as_producer: as_producer.clone(),
        run_of: HashMap::new(),
        early: HashMap::new(),
    };

    // One run at a time: the path's own latency, nothing queued in front of it.
    let alone = runs.clamp(1, 20);
    let mut solo = Vec::with_capacity(alone);
    for _ in 0..alone {
        let sent = flow.request().await?;
        let done = flow.suspensions(1).await?;
        solo.extend(done.values().map(|(at, _)| *at - sent.1));
    }
    let solo = Latencies::new(solo);

    // All at once: throughput, and latency under load.
    let mut sent: HashMap<Uuid, Instant> = HashMap::new();
    let started = Instant::now();
    for _ in 0..runs {
        let (request_id, at) = flow.request().await?;
        sent.insert(request_id, at);
    }
    let suspended = flow.suspensions(runs).await?;
    let suspend_window = started.elapsed();
    let to_suspend = Latencies::new(
        suspended
            .iter()
            .map(|(run, (at, _))| *at - sent[&flow.run_of[run]])
            .collect(),
    );
    let mut events = flow.events;

    // Decisions → completions.
    let mut decided: HashMap<String, Instant> = HashMap::new();
    let started = Instant::now();
    for (run, (_, event)) in &suspended {
        let decision = DecisionMessage {
            decision_id: Uuid::now_v7(),
            run_id: RunId::parse(run)?,
            suspension_seq: SuspensionSeq::new(u32::try_from(
                event["suspension_seq"].as_u64().unwrap_or(0),
            )?)?,
            turn_digest: TurnDigest::parse(event["turn_digest"].as_str().unwrap_or_default())?,
            approved: false,
            approver: "approver".into(),
            comment: Some("Not now.".into()),
        };
        decided.insert(run.clone(), Instant::now());
        broker
            .publish_message(
                &broker.topology().decisions(),
                &serde_json::to_vec(&decision.to_json())?,
                &as_producer,
            )
            .await?;
    }
    let mut completed: HashMap<String, Instant> = HashMap::new();
    while completed.len() < runs {
        let (at, event) = next_event(&mut events).await?;
        let run_id = event["run_id"].as_str().unwrap_or_default().to_owned();
        match event["event"].as_str() {
            Some("run.completed") if decided.contains_key(&run_id) => {
                completed.insert(run_id, at);
            }
            Some("run.failed") => bail!("a run failed: {event}"),
            Some("decision.refused") => bail!("a decision was refused: {event}"),
            _ => {}
        }
    }
    let complete_window = started.elapsed();
    let to_complete = Latencies::new(
        completed
            .iter()
            .map(|(run, at)| *at - decided[run])
            .collect(),
    );

    println!(
        "request→run.suspended, one at a time:        latency {}",
        solo.summary()
    );
    println!(
        "request→run.suspended:   {:>7.1} runs/s  ({runs} in {:.2} s)   latency {}",
        runs as f64 / suspend_window.as_secs_f64(),
        suspend_window.as_secs_f64(),
        to_suspend.summary()
    );
    println!(
        "decision→run.completed:  {:>7.1} runs/s  ({runs} in {:.2} s)   latency {}",
        runs as f64 / complete_window.as_secs_f64(),
        complete_window.as_secs_f64(),
        to_complete.summary()
    );
    let floor = amqp.percentile(50) + pg.percentile(50);
    println!(
        "p50 request→suspended, one at a time, is {:.1}× one broker round trip plus one commit ({:.2} ms)",
        solo.percentile(50).as_secs_f64() / floor.as_secs_f64(),
        floor.as_secs_f64() * 1000.0
    );

    stop.notify_waiters();
    while services.join_next().await.is_some() {}
    broker.delete_topology().await?;
    pool.close().await;
    Ok(())
}

/// The producer's side of the bench: requests out, events in.
struct Flow<'a> {
    broker: &'a Broker,
    events: countersign_queue::Consumer,
    as_producer: MessageProperties,
    /// run id → the request that created it.
    run_of: HashMap<String, Uuid>,
    /// Suspensions announced before their run's `run.accepted` was read.
    early: HashMap<String, (Instant, Value)>,
}

impl Flow<'_> {
    async fn request(&mut self) -> anyhow::Result<(Uuid, Instant)> {
        let request = RunRequest {
            request_id: Uuid::now_v7(),
            agent: AGENT.into(),
            acting_user: "editor".into(),
            prompt: "Tighten the description of page 12.".into(),
        };
        let at = Instant::now();
        let body = serde_json::to_vec(&request.to_json())?;
        self.broker
            .publish_message(
                &self.broker.topology().run_requests(),
                &body,
                &self.as_producer,
            )
            .await?;
        Ok((request.request_id, at))
    }

    /// Waits for `n` suspensions of runs requested by this flow.
    async fn suspensions(&mut self, n: usize) -> anyhow::Result<HashMap<String, (Instant, Value)>> {
        let mut suspended = HashMap::new();
        while suspended.len() < n {
            let (at, event) = next_event(&mut self.events).await?;
            let run_id = event["run_id"].as_str().unwrap_or_default().to_owned();
            match event["event"].as_str() {
                Some("run.accepted") => {
                    let request_id =
                        Uuid::parse_str(event["request_id"].as_str().unwrap_or_default())?;
                    self.run_of.insert(run_id.clone(), request_id);
                    if let Some(seen) = self.early.remove(&run_id) {
                        suspended.insert(run_id, seen);
                    }
                }
                Some("run.suspended") if self.run_of.contains_key(&run_id) => {
                    suspended.insert(run_id, (at, event));
                }
                Some("run.suspended") => {
                    self.early.insert(run_id, (at, event));
                }
                Some("run.failed") => bail!("a run failed: {event}"),
                _ => {}
            }
        }
        Ok(suspended)
    }
}

async fn next_event(events: &mut countersign_queue::Consumer) -> anyhow::Result<(Instant, Value)> {
    let delivery = tokio::time::timeout(Duration::from_secs(60), events.next())
        .await
        .context("no event for 60 s; the services stalled")?
        .context("the event consumer closed")??;
    let at = Instant::now();
    let event = serde_json::from_slice(&delivery.body)?;
    delivery.ack().await?;
    Ok((at, event))
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

async fn update_commits(pool: &sqlx::PgPool, n: usize) -> anyhow::Result<Latencies> {
    sqlx::query("CREATE TABLE bench_baseline (id int PRIMARY KEY, n bigint NOT NULL)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT INTO bench_baseline VALUES (1, 0)")
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
