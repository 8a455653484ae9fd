//! The long-running worker: wake-ups from the segments queue, a polling fallback, and a
//! bounded number of segments at a time.
//!
//! A delivery only says "look at this run": the claim decides, and the delivery is acked as
//! soon as the claim committed or lost, so a long segment never holds a delivery open past the
//! broker's consumer timeout. A lost wake-up costs at most one poll interval: every interval
//! the worker claims the oldest available runs itself, one for each slot free at that moment.
//!
//! Beside the segments runs the outbox relay, woken by each commit that announced an event,
//! so `run.suspended` and the rest leave right after their transitions; it stops last, after
//! the segments, and publishes what they committed before the process exits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::{ModelError, TerminationReason};
use countersign_queue::{parse_segment, Broker, Delivery};
use countersign_service::relay::{self, RelayConfig};
use countersign_store::{Claim, SegmentKind};
use tokio::sync::{oneshot, watch, AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::claimer::Claimer;
use crate::segment::{SegmentEnd, SegmentRunner};
use crate::wake_ups::{Standing, WakeUps};

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The lease owner this process claims as; unique per process.
    pub owner: String,
    /// Segments run at once; also the consumer's prefetch.
    pub concurrency: usize,
    /// How often the worker looks for available runs without a wake-up.
    pub poll_interval: Duration,
    /// How long shutdown waits for running segments to end on their own before it hands their
    /// runs back to the queue.
    pub shutdown_grace: Duration,
}

/// Runs until `shutdown` resolves, then waits up to the grace period for running segments.
pub async fn run(
    runner: SegmentRunner,
    broker: Broker,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
) {
    register_metrics(&runner);
    let prefetch = u16::try_from(config.concurrency.max(1)).unwrap_or(u16::MAX);
    // Flipped once the grace period is over, or once the broker has been lost for long: every
    // segment still running hands its run back.
    let (release, released) = watch::channel(false);
    let claimer = Claimer::start(runner.store.clone(), config.owner.clone(), runner.lease_ttl);
    let mut standing = Standing::new(
        broker.clone(),
        runner.store.vitals().clone(),
        runner.lease_ttl / 3,
    );
    let mut slots = Slots::new(runner, config.concurrency, released);
    let mut wake_ups = WakeUps::new(broker.clone(), prefetch, DEAF_AFTER);
    // The wake-up taken when the shutdown came, while it waited for a slot.
    let mut held = None;
    let mut poll = poll_timer(config.poll_interval);
    let mut look = standing_timer();
    tokio::pin!(shutdown);
    let (stop_relay, relay) = spawn_relay(&slots.runner, &broker);

    loop {
        // A segment that ended keeps its task's memory until it is joined, and with a backlog
        // the loop spends its time waiting for a slot in the wake-up branch: reap every
        // finished one on each turn, not one per turn.
        while slots.running.try_join_next().is_some() {}
        // While its broker or its database fails, the worker takes no wake-up: they wait in
        // its prefetch, and the poll of the workers that can claim finds their runs.
        let claiming = standing.may_claim().await;
        wake_ups.tend().await;
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = slots.running.join_next(), if !slots.running.is_empty() => {}
            _ = look.tick() => standing.check(slots.running.len(), &release).await,
            _ = poll.tick(), if claiming => slots.claim_polled(&config.owner).await,
            delivery = wake_ups.next(), if claiming => {
                // With every slot busy the wait for one may be long (a segment waits on its
                // model): a shutdown meanwhile hands the wake-up back and stops.
                let Some(permit) = free_slot(&slots.free, shutdown.as_mut()).await else {
                    held = Some(delivery);
                    break;
                };
                let Ok(permit) = permit else { break };
                slots.start_woken(&claimer, &broker, delivery, permit);
            }
        }
    }

    stop_consuming(&broker, wake_ups.take(), held).await;
    slots.drain(config.shutdown_grace, release).await;
    end_relay(stop_relay, relay).await;
}

/// How often the worker looks at its broker connection ([`Standing::check`]).
const STANDING_EVERY: Duration = Duration::from_secs(1);

/// The worker's poll for available runs. The first look comes one interval after the start:
/// the wake-ups waiting for this worker fill its slots first.
fn poll_timer(poll_interval: Duration) -> tokio::time::Interval {
    tokio::time::interval_at(tokio::time::Instant::now() + poll_interval, poll_interval)
}

/// The worker's look at its broker connection, every [`STANDING_EVERY`].
fn standing_timer() -> tokio::time::Interval {
    let mut look = tokio::time::interval(STANDING_EVERY);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    look
}

/// A free slot for a woken segment, once one frees; `None` when `shutdown` comes first.
async fn free_slot(
    free: &Arc<Semaphore>,
    shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<Result<OwnedSemaphorePermit, AcquireError>> {
    tokio::select! {
        permit = free.clone().acquire_owned() => Some(permit),
        () = shutdown => None,
    }
}

/// Stops the outbox relay spawned by [`spawn_relay`] and waits for it to publish what the
/// segments committed.
async fn end_relay(stop_relay: oneshot::Sender<()>, relay: tokio::task::JoinHandle<()>) {
    let _ = stop_relay.send(());
    if let Err(e) = relay.await {
        tracing::warn!(error = %e, "the outbox relay stopped abnormally");
    }
}

/// The outbox relay beside the segments, until the sender it returns is used or dropped.
fn spawn_relay(
    runner: &SegmentRunner,
    broker: &Broker,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let relay = tokio::spawn(relay::run(
        runner.store.clone(),
        broker.clone(),
        RelayConfig::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    (stop, relay)
}

/// The worker's segment slots: the permits free, the segments running in the others, and the
/// signal that releases them at the end of the shutdown grace.
struct Slots {
    free: Arc<Semaphore>,
    running: JoinSet<()>,
    released: watch::Receiver<bool>,
    runner: SegmentRunner,
}

impl Slots {
    /// `concurrency` free slots (at least one) for the segments of `runner`.
    fn new(runner: SegmentRunner, concurrency: usize, released: watch::Receiver<bool>) -> Slots {
        Slots {
            free: Arc::new(Semaphore::new(concurrency.max(1))),
            running: JoinSet::new(),
            released,
            runner,
        }
    }

    /// Claims the oldest available runs, as many as slots are free now, not while slots keep
    /// freeing: under a backlog that would claim one statement after another in this loop the
    /// runs whose wake-ups are on their way, starve the wake-ups (which claim in parallel), and
    /// make each of them lose a claim.
    async fn claim_polled(&mut self, owner: &str) {
        let mut free = self.free.available_permits();
        while free > 0 {
            let permits: Vec<_> = (0..free.min(POLL_BATCH))
                .map_while(|_| self.free.clone().try_acquire_owned().ok())
                .collect();
            let asked = permits.len();
            let store = &self.runner.store;
            let claims = match store
                .within(store.claim_next(owner, self.runner.lease_ttl, asked))
                .await
            {
                Ok(claims) => claims,
                Err(e) => {
                    tracing::warn!(code = e.code(), error = %e, "poll claim failed");
                    return;
                }
            };
            let taken = claims.len();
            // A slot each; the permits left over go back with the vector.
            for (claim, permit) in claims.into_iter().zip(permits) {
                match claim {
                    Ok(claim) => {
                        let segment =
                            run_claimed(self.runner.clone(), claim, permit, self.released.clone());
                        self.running
                            .spawn(segment.instrument(tracing::Span::none()));
                    }
                    Err(e) => {
                        tracing::warn!(code = e.code(), error = %e, "a run claimed by the poll is unreadable; its lease will expire")
                    }
                }
            }
            if taken < asked || asked == 0 {
                return;
            }
            free -= asked;
        }
    }

    /// Claims the run `delivery` wakes up in a task of its own holding `permit` (wake-ups for
    /// many runs are claimed at once), then runs its segment there. The producer's trace goes
    /// on: the wake-up's context is the parent of the claim and of the segment it starts.
    fn start_woken(
        &mut self,
        claimer: &Claimer,
        broker: &Broker,
        delivery: Delivery,
        permit: OwnedSemaphorePermit,
    ) {
        let woken = tracing::info_span!(
            "wake_up",
            otel.kind = "consumer",
            run.id = tracing::field::Empty
        );
        let _ = woken.set_parent(delivery.trace_context());
        let (runner, broker, claimer) = (self.runner.clone(), broker.clone(), claimer.clone());
        let released = self.released.clone();
        self.running.spawn(async move {
            let taken = take(&claimer, &broker, delivery)
                .instrument(woken.clone())
                .await;
            if let Some(claim) = taken {
                woken.record("run.id", tracing::field::display(claim.lease.run_id));
                run_claimed(runner, claim, permit, released)
                    .instrument(woken)
                    .await;
            }
        });
    }

    /// Waits up to `grace` for the running segments to end, then releases the rest, which
    /// hand their runs back; abandons those that do not within [`RELEASE_TIMEOUT`].
    async fn drain(mut self, grace: Duration, release: watch::Sender<bool>) {
        tracing::info!(
            running = self.running.len(),
            "shutting down; waiting for running segments"
        );
        let drained = tokio::time::timeout(grace, async {
            while self.running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_ok() {
            return;
        }
        tracing::info!(
            running = self.running.len(),
            "grace period over; handing the remaining runs back"
        );
        let _ = release.send(true);
        let handed_back = tokio::time::timeout(RELEASE_TIMEOUT, async {
            while self.running.join_next().await.is_some() {}
        })
        .await;
        if handed_back.is_err() {
            tracing::warn!(
                abandoned = self.running.len(),
                "segments abandoned at shutdown; their leases will expire"
            );
            self.running.abort_all();
        }
    }
}

/// No more wake-ups for this worker: those it holds and has not taken (and `held`, taken while
/// it waited for a slot) go back to the queue, for the other workers, now rather than when its
/// connection closes, and as fresh messages. The consumer stops first: a fresh copy must not
/// come back to it.
async fn stop_consuming(
    broker: &Broker,
    consumer: Option<countersign_queue::Consumer>,
    mut held: Option<Delivery>,
) {
    if let Some(consumer) = consumer {
        match consumer.cancel_untaken().await {
            Ok(untaken) => {
                let handed_back = untaken.len() + usize::from(held.is_some());
                for delivery in held.take().into_iter().chain(untaken) {
                    hand_back(broker, delivery).await;
                }
                tracing::info!(handed_back, "stopped consuming wake-ups");
            }
            Err(e) => {
                tracing::warn!(code = e.code(), error = %e, "could not cancel the consumer; its wake-ups return when the connection closes")
            }
        }
    }
    // No consumer, or it could not be cancelled: back as it is.
    if let Some(delivery) = held {
        requeue(delivery).await;
    }
}

/// The most runs one statement of the poll claims.
const POLL_BATCH: usize = 64;

/// How long the wake-up consumer may get nothing while the queue holds wake-ups ready before it
/// consumes again (`Consumer::watch_ready`): the poll would find the runs, but every one of them
/// up to a poll interval late for as long as the lost consumer lasted. Its prefetch is the
/// worker's concurrency and a wake-up is settled once its claim is, so a waiting consumer has
/// credit to spare unless every slot's claim is still waiting on the database; then consuming
/// again costs a channel and a log line.
const DEAF_AFTER: Duration = Duration::from_secs(10);

/// How long handing the remaining runs back at shutdown may take.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// Gives a wake-up this worker will not take back to the queue as a fresh message, then acks
/// the one it holds: requeued, it would count as a failed delivery, and a few restarts of
/// busy workers would have the quorum queue dead-letter a wake-up nothing was wrong with. If
/// the fresh one cannot be published, it is requeued as it is.
///
/// The fresh one goes through the segments exchange, not the default exchange: the worker's
/// least-privilege user may write to that exchange, which reaches the segments queue only,
/// and not to `amq.default`, which reaches every queue.
async fn hand_back(broker: &Broker, delivery: Delivery) {
    let fresh = match parse_segment(&delivery.body) {
        Ok(run_id) => broker.publish_segment(run_id).await,
        // Whoever takes a malformed one dead-letters it with its reason.
        Err(_) => return requeue(delivery).await,
    };
    match fresh {
        Ok(()) => {
            // Should the ack fail, the old one returns too: one more wake-up, claimed once.
            if let Err(e) = delivery.ack().await {
                tracing::warn!(code = e.code(), error = %e, "could not ack a wake-up handed back");
            }
        }
        Err(e) => {
            tracing::warn!(code = e.code(), error = %e, "could not publish a wake-up to hand back; requeuing it");
            requeue(delivery).await;
        }
    }
}

async fn requeue(delivery: Delivery) {
    if let Err(e) = delivery.requeue().await {
        tracing::warn!(code = e.code(), error = %e, "could not hand a wake-up back; it returns when the connection closes");
    }
}

/// Claims the run a wake-up names, then acks it: won or lost, the row is the truth.
async fn take(claimer: &Claimer, broker: &Broker, delivery: Delivery) -> Option<Claim> {
    let run_id = match parse_segment(&delivery.body) {
        Ok(run_id) => run_id,
        Err(e) => {
            if let Err(e) = delivery.dead_letter(broker, &e.reason()).await {
                tracing::warn!(code = e.code(), error = %e, "could not dead-letter a malformed wake-up");
            }
            return None;
        }
    };
    match claimer.claim(run_id).await {
        Ok(claim) => {
            if let Err(e) = delivery.ack().await {
                tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "ack failed");
            }
            claim
        }
        // The database did not answer: the run stays queued, and the poll of whichever worker
        // can reach the database claims it. Requeued, the wake-up would come straight back to
        // fail again, and a few seconds of outage would spend its delivery limit and
        // dead-letter it.
        Err(e) if e.is_transient() => {
            tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "claim failed; the run is left to the poll");
            if let Err(e) = delivery.ack().await {
                tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "ack failed");
            }
            None
        }
        Err(e) => {
            tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "claim failed; wake-up requeued");
            if let Err(e) = delivery.requeue().await {
                tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "requeue failed");
            }
            None
        }
    }
}

/// Runs the segment of a won claim in its slot, until it ends or the worker releases it.
async fn run_claimed(
    runner: SegmentRunner,
    claim: Claim,
    permit: OwnedSemaphorePermit,
    mut released: watch::Receiver<bool>,
) {
    let _permit = permit;
    let run_id = claim.lease.run_id;
    if claim.requeue_count > 0 {
        // The reaper requeued this segment after its lease expired: counted here, by the worker
        // that picks it up, so the expiries show wherever the reaper runs (a CronJob serves no
        // metrics).
        metrics::counter!("countersign_expired_lease_claims_total").increment(1);
    }
    let release = async move {
        // A closed channel means the worker is gone: release as well.
        let _ = released.wait_for(|r| *r).await;
    };
    let started = std::time::Instant::now();
    match runner.run_until(&claim, release).await {
        Ok(end) => {
            tracing::info!(run.id = %run_id, ?end, "segment ended");
            observe(&claim, &end, started.elapsed());
        }
        Err(e) => {
            tracing::warn!(run.id = %run_id, code = e.code(), error = %e, "segment stopped on a store error")
        }
    }
}

/// The termination reasons a worker ends a run with, by status (the reaper's are its own).
const RUN_ENDS: [(&str, &[TerminationReason]); 2] = [
    (
        "completed",
        &[
            TerminationReason::Completed,
            TerminationReason::ApprovalDenied,
        ],
    ),
    (
        "failed",
        &[
            TerminationReason::MaxIterations,
            TerminationReason::ProviderFailed,
            TerminationReason::StateUnreadable,
            TerminationReason::NotRetryable,
            TerminationReason::SuspendFailed,
            TerminationReason::OutcomeUnknown,
        ],
    ),
];

/// Registers, at zero, every series a worker serves, for the label values it knows: each
/// segment kind and end, each provider and outcome of a model call, each way a run ends, each
/// tool with a preview.
fn register_metrics(runner: &SegmentRunner) {
    for segment in [SegmentKind::Start, SegmentKind::Resume] {
        for &end in <SegmentEnd as strum::VariantNames>::VARIANTS {
            let _ = metrics::histogram!("countersign_segment_duration_seconds", "segment" => segment.as_str(), "end" => end);
        }
    }
    for provider in crate::segment::PROVIDER_LABELS {
        for &outcome in ["ok"]
            .iter()
            .chain(<ModelError as strum::VariantNames>::VARIANTS)
        {
            let _ = metrics::histogram!("countersign_model_call_duration_seconds", "provider" => provider, "outcome" => outcome);
        }
    }
    for (status, reasons) in RUN_ENDS {
        for reason in reasons {
            let _ = metrics::counter!("countersign_runs_total", "status" => status, "reason" => reason.as_str());
        }
    }
    for tool in runner.registry.iter().filter(|t| t.previewer().is_some()) {
        let name = tool.spec().name.clone();
        let _ = metrics::counter!("countersign_preview_failures_total", "tool" => name.clone());
        let _ = metrics::counter!("countersign_preview_moves_total", "tool" => name);
    }
    let _ = metrics::histogram!("countersign_queue_wait_seconds", "queue" => "segments");
    let _ = metrics::histogram!("countersign_decision_to_write_seconds");
    let _ = metrics::gauge!("countersign_leases_held");
    for counter in [
        "countersign_suspensions_total",
        "countersign_leases_lost_total",
        "countersign_expired_lease_claims_total",
        "countersign_heartbeat_statements_total",
        "countersign_claim_statements_total",
        "countersign_settle_statements_total",
    ] {
        let _ = metrics::counter!(counter);
    }
}

/// Records the segment's duration. (How long after its approval a turn's writes landed is
/// recorded by the segment's hooks as each commits.)
fn observe(claim: &Claim, end: &SegmentEnd, took: Duration) {
    let segment = claim.segment.as_str();
    let ended: &'static str = end.into();
    metrics::histogram!(
        "countersign_segment_duration_seconds",
        "segment" => segment,
        "end" => ended
    )
    .record(took.as_secs_f64());
}
