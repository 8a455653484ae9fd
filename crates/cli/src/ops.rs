//! Operator commands: agent configurations, producer grants, the demo site, and the
//! submit / inbox / decide round trip through the real queues.
//!
//! `submit` and `decide` are queue producers like any other: they publish the public
//! messages as the AMQP user of their connection (which the broker validates), and wait for
//! the coordinator's reply on a private queue.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use countersign_coordinator::{producers, ProducerKind};
use countersign_core::card::build_card;
use countersign_core::{
    DecisionMessage, Principal, RunRequest, SuspendedRunState, ToolPolicy, ToolRegistry,
    UserDirectory,
};
use countersign_crypto::Keyring;
use countersign_queue::{Broker, MessageProperties, QueueConfig, Topology};
use countersign_store::{AgentConfig, Store};
use serde::Deserialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::render;

/// An agent configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    name: String,
    #[serde(default = "yes")]
    active: bool,
    #[serde(default)]
    model: Value,
    #[serde(default)]
    policy: ToolPolicy,
    max_iterations: u32,
    #[serde(default)]
    four_eyes: bool,
    approval_deadline_secs: u64,
}

fn yes() -> bool {
    true
}

/// A store for commands that open no sealed value: a key that lives only in this process
/// will do.
pub fn store_without_keys(pool: PgPool) -> Store {
    Store::new(pool, Arc::new(Keyring::ephemeral()))
}

pub async fn put_agent(store: &Store, path: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file: AgentFile = serde_json::from_str(&text).context("the agent file is not valid")?;
    let model = if file.model.is_null() {
        Value::Object(Default::default())
    } else {
        file.model
    };
    store
        .upsert_agent(&AgentConfig {
            name: file.name.clone(),
            active: file.active,
            model,
            policy: file.policy,
            max_iterations: file.max_iterations,
            four_eyes: file.four_eyes,
            approval_deadline: Duration::from_secs(file.approval_deadline_secs),
        })
        .await?;
    println!("agent {} stored", file.name);
    Ok(())
}

pub async fn list_agents(store: &Store) -> anyhow::Result<()> {
    for agent in store.agents().await? {
        let c = agent.config;
        println!(
            "{}\tactive={}\tfour_eyes={}\tmax_iterations={}\tenabled={}",
            c.name,
            c.active,
            c.four_eyes,
            c.max_iterations,
            c.policy.enabled_tools.join(",")
        );
    }
    Ok(())
}

pub fn producer_kind(kind: &str) -> anyhow::Result<ProducerKind> {
    ProducerKind::parse(&kind.replace('-', "_"))
        .with_context(|| format!("unknown kind {kind:?}: approver or acting-user"))
}

pub async fn allow_producer(
    pool: &PgPool,
    user: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<()> {
    producers::allow(pool, user, producer_kind(kind)?, name).await?;
    println!("{user} may assert {kind} {name}");
    Ok(())
}

pub async fn revoke_producer(
    pool: &PgPool,
    user: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<()> {
    let revoked = producers::revoke(pool, user, producer_kind(kind)?, name).await?;
    println!("{}", if revoked { "revoked" } else { "no such grant" });
    Ok(())
}

pub async fn list_producers(pool: &PgPool) -> anyhow::Result<()> {
    for g in producers::list(pool).await? {
        println!("{}\t{}\t{}", g.amqp_user, g.kind.as_str(), g.name);
    }
    Ok(())
}

pub async fn connect_broker(addr: &str, prefix: &str) -> anyhow::Result<Broker> {
    Broker::connect(QueueConfig::new(addr, Topology::new(prefix)))
        .await
        .context("connecting to RabbitMQ (AMQP_ADDR)")
}

/// Publishes `body` to `queue` as the connection's user and waits for the coordinator's reply.
async fn publish_and_wait(
    broker: &Broker,
    queue: &str,
    body: &Value,
    wait: Duration,
) -> anyhow::Result<Value> {
    let reply_to = broker.declare_private_queue().await?;
    let mut replies = broker.consume(&reply_to, 1).await?;
    let correlation_id = Uuid::now_v7().to_string();
    let properties = MessageProperties {
        user_id: broker.user(),
        reply_to: Some(reply_to),
        correlation_id: Some(correlation_id.clone()),
    };
    broker
        .publish_message(queue, &serde_json::to_vec(body)?, &properties)
        .await?;
    let delivery = tokio::time::timeout(wait, replies.next())
        .await
        .context("no reply from the coordinator in time; is countersign-coordinator running?")?
        .context("the reply queue closed")??;
    let reply: Value = serde_json::from_slice(&delivery.body).context("the reply is not JSON")?;
    delivery.ack().await?;
    Ok(reply)
}

pub async fn submit(
    broker: &Broker,
    agent: &str,
    acting_user: &str,
    prompt: &str,
    wait: Duration,
) -> anyhow::Result<()> {
    let request = RunRequest {
        request_id: Uuid::now_v7(),
        agent: agent.into(),
        acting_user: acting_user.into(),
        prompt: prompt.into(),
    };
    let reply = publish_and_wait(
        broker,
        &broker.topology().run_requests(),
        &request.to_json(),
        wait,
    )
    .await?;
    match reply.get("run_id").and_then(Value::as_str) {
        Some(run_id) if reply["event"] == "run.accepted" => println!("run {run_id} accepted"),
        _ => bail!(
            "run request refused: {}",
            reply["outcome"].as_str().unwrap_or("unknown")
        ),
    }
    Ok(())
}

pub async fn inbox(
    store: &Store,
    registry: &ToolRegistry,
    users: &dyn UserDirectory,
    viewer: &str,
) -> anyhow::Result<()> {
    let viewer: Option<Principal> = users.principal(viewer).await?;
    let waiting = store.inbox(100).await?;
    if waiting.is_empty() {
        println!("no run is waiting for approval");
    }
    for run in waiting {
        println!(
            "run {} · agent {} · acting as {} · decide by {}",
            run.run_id,
            run.agent,
            run.acting_user,
            run.approval_deadline.to_rfc3339()
        );
        let state = match store
            .load_state(run.run_id)
            .await
            .map(|b| SuspendedRunState::from_bytes(&b))
        {
            Ok(Ok(state)) => state,
            _ => {
                println!(
                    "  (the suspended state cannot be read with this keyring: state_unreadable)"
                );
                continue;
            }
        };
        print!(
            "{}",
            render::card(&build_card(&state, registry, viewer.as_ref()).await)
        );
    }
    Ok(())
}

pub async fn decide(
    store: &Store,
    broker: &Broker,
    run_id: countersign_core::RunId,
    approver: &str,
    approved: bool,
    comment: Option<String>,
    wait: Duration,
) -> anyhow::Result<()> {
    let run = store.run(run_id).await?.context("no such run")?;
    let (Some(suspension_seq), Some(turn_digest)) = (run.suspension_seq, run.turn_digest) else {
        bail!("run {run_id} has no card to decide on");
    };
    let decision = DecisionMessage {
        decision_id: Uuid::now_v7(),
        run_id,
        suspension_seq,
        turn_digest,
        approved,
        approver: approver.into(),
        comment,
    };
    let reply = publish_and_wait(
        broker,
        &broker.topology().decisions(),
        &decision.to_json(),
        wait,
    )
    .await?;
    let outcome = reply["outcome"].as_str().unwrap_or("unknown");
    if reply["event"] == "decision.accepted" {
        println!("decision accepted (suspension {suspension_seq})");
        Ok(())
    } else {
        bail!("decision refused: {outcome}")
    }
}

/// A run as an operator reads it: its row (no content) and its audit trail (codes only).
pub async fn show_run(store: &Store, run_id: countersign_core::RunId) -> anyhow::Result<()> {
    let run = store.run(run_id).await?.context("no such run")?;
    println!("run {run_id}");
    println!("  agent {} · acting as {}", run.agent, run.acting_user);
    println!(
        "  status {} · segment {}",
        run.status.as_str(),
        run.segment.as_str()
    );
    if let Some(seq) = run.suspension_seq {
        let digest = run.turn_digest.as_ref().map_or("", |d| d.as_str());
        println!("  suspension {seq} · turn {digest}");
    }
    if let Some(reason) = run.termination_reason {
        println!(
            "  termination {} · error {}",
            reason.as_str(),
            run.error_code.as_deref().unwrap_or("-")
        );
    }
    println!(
        "  lease epoch {} · requeues {} · iterations {} · tokens {}/{}",
        run.lease_epoch,
        run.requeue_count,
        run.counters.iterations,
        run.counters.prompt_tokens,
        run.counters.completion_tokens
    );
    for event in store.events(run_id).await? {
        println!(
            "  {:>3} {} {} {}",
            event.sequence,
            event.created_at.to_rfc3339(),
            event.kind,
            event.payload
        );
    }
    Ok(())
}

/// Cancels a run that has not ended, records and announces it. A running segment loses its
/// lease at its next heartbeat or fence and writes nothing more.
pub async fn cancel(
    store: &Store,
    broker: &Broker,
    run_id: countersign_core::RunId,
) -> anyhow::Result<()> {
    if !store.cancel(run_id).await? {
        bail!("run {run_id} does not exist or has already ended");
    }
    let fields = serde_json::json!({"run_id": run_id, "termination_reason": "cancelled"});
    store
        .append_event(
            run_id,
            &countersign_store::NewEvent::new("run.cancelled", fields.clone()),
        )
        .await?;
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    broker
        .publish_event(&countersign_core::Event::new("run.cancelled", fields), &at)
        .await?;
    println!("run {run_id} cancelled");
    Ok(())
}
