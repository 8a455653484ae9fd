//! The coordinator over RabbitMQ: one consumer for run requests, one for decisions.
//!
//! Each delivery is handed to the gates with the broker-validated `user_id`; the verdict says
//! what to publish. A delivery is acked only after the verdict's effects are durable: the
//! decision or run is committed with its event in the outbox, the reply published. Malformed
//! and unauthenticated messages are dead-lettered with their reason and get no reply; nothing
//! is dropped. A delivery whose gates the store could not answer (an outage, a lost or silent
//! connection, a timeout) is held and gated again once it answers ([`HOLD_AT_MOST`]), not
//! requeued against its delivery limit; one whose gates fail in a way that would recur is
//! dead-lettered with the error's code. Every message ends in an outcome (its event, and its
//! reply) or a dead letter with its reason.
//!
//! The events themselves leave through the outbox relay this service runs beside its
//! consumers: woken by each commit that wrote an event, polling as the fallback. The event of
//! a run handed to the workers (`run.accepted`, `decision.accepted`) is also its segment
//! wake-up: the segments queue is bound to it, so no second message is published for it.
//!
//! Each delivery is gated inside a span (`run_request`, `decision`) whose parent is the trace
//! context its producer sent; the span names the run (`run.id`) and the outcome, and the gates
//! run in a child of it (`run_request_gates`, `decision_gates`), which the relay publishes the
//! gates' events inside, so the wake-up carries the producer's trace on to the worker. Beside the
//! consumers, the backlog gauges — runs waiting for approval, the oldest wait, approvals about
//! to expire, expired leases, dead letters, the work queues' depth — are refreshed from one
//! query and four passive declares every [`BACKLOG_INTERVAL`].

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use chrono::{SecondsFormat, Utc};
use countersign_core::{DatabaseCode, Event, RunId};
use countersign_queue::{Broker, Delivery};
use countersign_service::relay::{self, RelayConfig};
use serde_json::Value;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::{Coordinator, DecisionCode, DecisionVerdict, RequestOutcome, RequestVerdict};

/// Deliveries each consumer may hold unacknowledged beyond those it is gating, so that it has
/// credit to spare whenever it waits for the next one.
const PREFETCH: u16 = 8;
/// How long a consumer with credit to spare may get nothing while its queue holds messages
/// ready before it consumes again (`Consumer::watch_ready`): requests and decisions have no
/// other way in, so a consumer the broker or the client lost must not stay lost.
const DEAF_AFTER: Duration = Duration::from_secs(10);
/// Run requests gated at once: each waits on the database, not the CPU, and no two of them
/// touch the same run.
const REQUESTS_AT_ONCE: u16 = 64;
/// Decisions gated at once. Two decisions on one run may race, as they do across several
/// coordinators: the release is one guarded transaction, so one wins and the other is recorded
/// `not_awaiting_approval`; a replay racing its original is settled by the decision id.
const DECISIONS_AT_ONCE: u16 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inbox {
    RunRequests,
    Decisions,
}

/// Consumes both public queues, and relays the outbox, until `shutdown` resolves; then
/// publishes what the last verdicts announced.
pub async fn run(coordinator: Coordinator, broker: Broker, shutdown: impl Future<Output = ()>) {
    register_metrics(&broker);
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(relay::run(
        coordinator.store.clone(),
        broker.clone(),
        RelayConfig::default(),
        async move {
            let _ = relay_stopped.await;
        },
    ));
    let requests = consume(coordinator.clone(), broker.clone(), Inbox::RunRequests);
    let backlog = watch_backlog(coordinator.clone(), broker.clone());
    let decisions = consume(coordinator, broker, Inbox::Decisions);
    tokio::select! {
        () = shutdown => {}
        () = requests => {}
        () = decisions => {}
        () = backlog => {}
    }
    let _ = stop_relay.send(());
    if let Err(e) = relay.await {
        tracing::warn!(error = %e, "the outbox relay stopped abnormally");
    }
}

async fn consume(coordinator: Coordinator, broker: Broker, inbox: Inbox) {
    let queue = match inbox {
        Inbox::RunRequests => broker.topology().run_requests(),
        Inbox::Decisions => broker.topology().decisions(),
    };
    loop {
        let at_once = match inbox {
            Inbox::RunRequests => REQUESTS_AT_ONCE,
            Inbox::Decisions => DECISIONS_AT_ONCE,
        };
        let mut consumer = match broker.consume(&queue, at_once + PREFETCH).await {
            Ok(consumer) => consumer.watch_ready(DEAF_AFTER),
            Err(e) => {
                tracing::warn!(queue, code = e.code(), error = %e, "cannot consume; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        let mut in_flight = tokio::task::JoinSet::new();
        while let Some(next) = consumer.next().await {
            match next {
                Ok(delivery) => {
                    while in_flight.len() >= usize::from(at_once) {
                        in_flight.join_next().await;
                    }
                    let (coordinator, broker) = (coordinator.clone(), broker.clone());
                    in_flight.spawn(async move {
                        handle(&coordinator, &broker, inbox, delivery).await;
                    });
                }
                Err(e) => tracing::warn!(queue, code = e.code(), error = %e, "consumer failed"),
            }
            while in_flight.try_join_next().is_some() {}
        }
        while in_flight.join_next().await.is_some() {}
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What a verdict asks the transport to do.
struct Effects {
    /// The run the message concerns, when it names or created one.
    run_id: Option<RunId>,
    counter: &'static str,
    outcome: &'static str,
    dead_letter: Option<String>,
    /// An event no transaction announced (a `not_auditable` decision), for the run it names.
    unannounced: Option<(RunId, Event)>,
    /// `None` for a producer that was not authenticated: no reply.
    reply: Option<Event>,
    /// A decision accepted now (not a replay): how long its run waited is recorded.
    /// How long the run waited for the approval that released it now.
    approval_wait: Option<f64>,
}

impl From<RequestVerdict> for Effects {
    fn from(v: RequestVerdict) -> Effects {
        let unauthenticated = v.outcome == RequestOutcome::UnauthenticatedProducer;
        Effects {
            run_id: v.run_id,
            counter: "countersign_run_requests_total",
            outcome: v.outcome.code(),
            dead_letter: dead_letter_reason(
                v.dead_letter_reason(),
                unauthenticated,
                v.outcome.code(),
            ),
            unannounced: None,
            reply: v.reply,
            approval_wait: None,
        }
    }
}

impl From<DecisionVerdict> for Effects {
    fn from(v: DecisionVerdict) -> Effects {
        let unauthenticated = v.outcome == DecisionCode::UnauthenticatedProducer;
        Effects {
            run_id: v.run_id,
            counter: "countersign_decisions_total",
            outcome: v.outcome.code(),
            dead_letter: dead_letter_reason(
                v.dead_letter_reason(),
                unauthenticated,
                v.outcome.code(),
            ),
            approval_wait: v.approval_wait,
            unannounced: v.run_id.zip(v.unannounced().cloned()),
            reply: v.reply,
        }
    }
}

/// Malformed messages carry their parse reason; a message from a producer that may not
/// assert the identity it names is kept too, for the operator to see who sent it.
fn dead_letter_reason(
    malformed: Option<&str>,
    unauthenticated: bool,
    outcome: &'static str,
) -> Option<String> {
    malformed
        .map(str::to_owned)
        .or_else(|| unauthenticated.then(|| outcome.to_owned()))
}

/// How long a consumer holds a message whose gates the store could not answer before it sends
/// it back to its queue (which counts the attempt against the message's delivery limit). A
/// database outage shorter than this costs a held message no delivery: it is gated again, in
/// place, once the store answers.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(600);

/// Waits, with a growing pause of at most four seconds, until the store answers (within its
/// deadline) or [`STORE_WAIT`] has passed: the pause before a held message is gated again.
const STORE_WAIT: Duration = Duration::from_secs(30);

async fn wait_for_store(coordinator: &Coordinator) {
    let pauses = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(4))
        .with_total_delay(Some(STORE_WAIT))
        .without_max_times()
        .build();
    let store = &coordinator.store;
    for pause in pauses {
        tokio::time::sleep(pause).await;
        let ping = async {
            sqlx::query("SELECT 1").execute(store.pool()).await?;
            Ok(())
        };
        if store.within(ping).await.is_ok() {
            return;
        }
    }
}

/// What became of a delivery's gates.
enum Gated {
    /// They ran: what to publish and how to settle the delivery.
    Ran(Box<Effects>),
    /// The store did not answer for [`HOLD_AT_MOST`]: back to the queue.
    Requeue,
    /// They failed in a way that would recur: dead-lettered with this code as its reason.
    Failed(&'static str),
}

/// Runs the gates of `delivery`, each attempt within three of the store's deadlines. A store
/// that does not answer (an outage, a lost or silent connection, a timeout, a lock held by a
/// paused process) holds the delivery here and gates it again once the store answers, for up
/// to [`HOLD_AT_MOST`]: the delivery is not requeued, and its delivery limit is not spent, for
/// a failure that says nothing about the message. Nothing a failed attempt did stands in the
/// way of the next: a decision recorded by an attempt whose answer was lost is replayed.
async fn run_gates(coordinator: &Coordinator, inbox: Inbox, delivery: &Delivery) -> Gated {
    let producer = delivery.user_id.as_deref();
    let held_since = tokio::time::Instant::now();
    let within = coordinator.store.deadline() * 3;
    loop {
        let attempt = async {
            match inbox {
                Inbox::RunRequests => coordinator
                    .take_run_request(&delivery.body, producer)
                    .await
                    .map(Effects::from),
                Inbox::Decisions => coordinator
                    .take_decision(&delivery.body, producer)
                    .await
                    .map(Effects::from),
            }
        };
        let code = match tokio::time::timeout(within, attempt).await {
            Ok(Ok(effects)) => return Gated::Ran(Box::new(effects)),
            Ok(Err(e)) if !e.is_transient() => {
                tracing::error!(code = e.code(), error = %e, "gates failed; message dead-lettered");
                return Gated::Failed(e.code());
            }
            Ok(Err(e)) => {
                tracing::warn!(code = e.code(), error = %e, "gates could not run; message held until the store answers");
                e.code()
            }
            Err(_) => {
                tracing::warn!(
                    ?within,
                    "gates not answered in time; message held until the store answers"
                );
                DatabaseCode::Timeout.as_str()
            }
        };
        coordinator.store.vitals().failed();
        if held_since.elapsed() >= HOLD_AT_MOST {
            tracing::warn!(code, held = ?held_since.elapsed(), "store unavailable for too long; message requeued");
            return Gated::Requeue;
        }
        wait_for_store(coordinator).await;
    }
}

/// Announces the event nothing recorded (a `not_auditable` decision, an `idempotency_conflict`)
/// before its delivery is settled, holding it while the store does not answer as the gates do:
/// `false` when it could not be announced, and the delivery must go back to its queue, where its
/// redelivery is gated (and announced) afresh — it was never recorded.
async fn announce_unrecorded(coordinator: &Coordinator, run_id: RunId, event: &Event) -> bool {
    let held_since = tokio::time::Instant::now();
    loop {
        let store = &coordinator.store;
        match store.within(store.announce(Some(run_id), event)).await {
            Ok(_) => return true,
            Err(e) if !e.is_transient() || held_since.elapsed() >= HOLD_AT_MOST => {
                tracing::error!(run.id = %run_id, event = event.name.as_str(), code = e.code(), error = %e, "event not announced; message requeued");
                return false;
            }
            Err(e) => {
                tracing::warn!(run.id = %run_id, event = event.name.as_str(), code = e.code(), error = %e, "event not announced yet; held until the store answers");
                wait_for_store(coordinator).await;
            }
        }
    }
}

/// Gates one delivery inside a span that continues its producer's trace.
async fn handle(coordinator: &Coordinator, broker: &Broker, inbox: Inbox, delivery: Delivery) {
    let span = match inbox {
        Inbox::RunRequests => tracing::info_span!(
            "run_request",
            otel.kind = "consumer",
            run.id = tracing::field::Empty,
            outcome = tracing::field::Empty
        ),
        Inbox::Decisions => tracing::info_span!(
            "decision",
            otel.kind = "consumer",
            run.id = tracing::field::Empty,
            outcome = tracing::field::Empty
        ),
    };
    let _ = span.set_parent(delivery.trace_context());
    gate(coordinator, broker, inbox, delivery)
        .instrument(span)
        .await;
}

async fn gate(coordinator: &Coordinator, broker: &Broker, inbox: Inbox, delivery: Delivery) {
    let effects = match run_gates(coordinator, inbox, &delivery).await {
        Gated::Ran(effects) => *effects,
        Gated::Requeue => {
            if let Err(e) = delivery.requeue().await {
                tracing::warn!(code = e.code(), error = %e, "requeue failed");
            }
            return;
        }
        Gated::Failed(code) => {
            if let Err(e) = delivery.dead_letter(broker, code).await {
                tracing::warn!(code = e.code(), error = %e, "could not dead-letter a message whose gates failed; it will be redelivered");
            }
            return;
        }
    };
    metrics::counter!(effects.counter, "outcome" => effects.outcome).increment(1);
    let span = tracing::Span::current();
    span.record("outcome", effects.outcome);
    if let Some(run_id) = effects.run_id {
        span.record("run.id", tracing::field::display(run_id));
    }
    if let Some(waited) = effects.approval_wait {
        metrics::histogram!("countersign_approval_wait_seconds").record(waited.max(0.0));
    }
    let at = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);

    if let Some((run_id, event)) = &effects.unannounced {
        // Nothing recorded this outcome, so nothing announced it: the outbox gets it now, or
        // the message goes back to be gated again. It never ends unheard of.
        if !announce_unrecorded(coordinator, *run_id, event).await {
            if let Err(e) = delivery.requeue().await {
                tracing::warn!(code = e.code(), error = %e, "requeue failed");
            }
            return;
        }
    }
    // Only an authenticated producer is answered: `reply_to` names any queue, and the reply is
    // published as this service's user.
    if let (Some(reply_to), Some(reply)) = (delivery.reply_to.as_deref(), &effects.reply) {
        let body: Value = reply.to_json(&at);
        if let Err(e) = broker
            .publish_reply(reply_to, delivery.correlation_id.as_deref(), &body)
            .await
        {
            tracing::warn!(code = e.code(), error = %e, "reply not published");
        }
    }
    let settled = match effects.dead_letter {
        Some(reason) => delivery.dead_letter(broker, &reason).await,
        None => delivery.ack().await,
    };
    if let Err(e) = settled {
        tracing::warn!(code = e.code(), error = %e, "delivery not settled; it will be redelivered and replayed");
    }
}

/// How often the backlog gauges are refreshed.
pub const BACKLOG_INTERVAL: Duration = Duration::from_secs(15);
/// An approval whose deadline is this close counts as about to expire.
pub const EXPIRING_WITHIN: Duration = Duration::from_secs(3600);

/// Registers, at zero, the series of the gates, whichever door runs them: every outcome of a
/// run request and of a decision, and the approval wait.
pub fn register_gate_metrics() {
    for outcome in <crate::RequestOutcome as strum::VariantArray>::VARIANTS {
        let _ = metrics::counter!("countersign_run_requests_total", "outcome" => outcome.code());
    }
    for outcome in crate::DecisionCode::all() {
        let _ = metrics::counter!("countersign_decisions_total", "outcome" => outcome.code());
    }
    let _ = metrics::histogram!("countersign_approval_wait_seconds");
}

/// Registers, at zero, every series this service serves: the gates', the waits of the two
/// queues it consumes, and the backlog gauges (until their first refresh).
fn register_metrics(broker: &Broker) {
    register_gate_metrics();
    let topology = broker.topology();
    for queue in [topology.run_requests(), topology.decisions()] {
        if let Some(label) = topology.queue_label(&queue) {
            let _ = metrics::histogram!("countersign_queue_wait_seconds", "queue" => label);
        }
    }
    for gauge in [
        "countersign_runs_waiting_for_approval",
        "countersign_oldest_approval_wait_seconds",
        "countersign_approvals_expiring_soon",
        "countersign_expired_leases",
        "countersign_dead_letter_messages",
    ] {
        let _ = metrics::gauge!(gauge);
    }
    for queue in topology.work_queues() {
        if let Some(label) = topology.queue_label(&queue) {
            let _ = metrics::gauge!("countersign_queue_messages", "queue" => label);
        }
    }
}

/// Refreshes the backlog gauges every [`BACKLOG_INTERVAL`], until dropped.
async fn watch_backlog(coordinator: Coordinator, broker: Broker) {
    let mut every = tokio::time::interval(BACKLOG_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        refresh_backlog(&coordinator, &broker).await;
    }
}

/// Sets `countersign_runs_waiting_for_approval`, `countersign_oldest_approval_wait_seconds`,
/// `countersign_approvals_expiring_soon`, `countersign_expired_leases`,
/// `countersign_dead_letter_messages` and `countersign_queue_messages{queue}` (the work queues'
/// ready messages, by a passive declare each). A gauge whose source does not answer keeps its
/// last value (`/readyz` says why).
pub async fn refresh_backlog(coordinator: &Coordinator, broker: &Broker) {
    let store = &coordinator.store;
    match store.within(store.backlog(EXPIRING_WITHIN)).await {
        Ok(b) => {
            metrics::gauge!("countersign_runs_waiting_for_approval")
                .set(b.waiting_for_approval as f64);
            metrics::gauge!("countersign_oldest_approval_wait_seconds").set(b.oldest_waiting_secs);
            metrics::gauge!("countersign_approvals_expiring_soon").set(b.expiring as f64);
            metrics::gauge!("countersign_expired_leases").set(b.expired_leases as f64);
        }
        Err(e) => tracing::warn!(code = e.code(), error = %e, "backlog not measured"),
    }
    match broker
        .message_count(&broker.topology().dead_letters())
        .await
    {
        Ok(n) => metrics::gauge!("countersign_dead_letter_messages").set(f64::from(n)),
        Err(e) => tracing::warn!(code = e.code(), error = %e, "dead letters not counted"),
    }
    let topology = broker.topology();
    for queue in topology.work_queues() {
        let Some(label) = topology.queue_label(&queue) else {
            continue;
        };
        match broker.message_count(&queue).await {
            Ok(n) => {
                metrics::gauge!("countersign_queue_messages", "queue" => label).set(f64::from(n))
            }
            Err(e) => {
                tracing::warn!(queue = label, code = e.code(), error = %e, "queue depth not measured")
            }
        }
    }
}
