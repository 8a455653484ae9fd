use std::sync::Arc;
use std::time::Duration;

use countersign_core::{
    Effect, Message, PendingCall, RunId, SuspendedRunState, SuspensionSeq, TokenUsage,
};
use countersign_crypto::Keyring;
use countersign_queue::{parse_segment, Broker, Consumer, QueueConfig, Topology};
use countersign_reaper::{pass, PassSummary, ReaperConfig};
use countersign_store::{NewRun, RunStatus, Store, TerminationReason};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

const KEYS: &str = "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
const TTL: Duration = Duration::from_secs(30);
const REPUBLISH_AFTER: Duration = Duration::from_secs(10);
const RETENTION: Duration = Duration::from_secs(3600);

struct Harness {
    /// What the scenario's own transitions go through: another process than the reaper's.
    store: Store,
    /// The reaper's, with none of the scenario's events handed to it.
    reaper_store: Store,
    broker: Broker,
    config: ReaperConfig,
    events: Consumer,
    segments: Consumer,
}

async fn harness(pool: PgPool) -> Harness {
    let keyring = Arc::new(Keyring::parse(KEYS).unwrap());
    let store = Store::new(pool.clone(), keyring.clone());
    let reaper_store = Store::new(pool, keyring);
    let addr = std::env::var("AMQP_ADDR")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let topology = Topology::new(format!("test-reaper-{}", Uuid::now_v7()));
    let broker = Broker::connect(QueueConfig::new(addr, topology))
        .await
        .unwrap();
    let watch = broker.declare_private_queue().await.unwrap();
    broker.bind_events(&watch, "run.*").await.unwrap();
    let events = broker.consume(&watch, 10).await.unwrap();
    let segments = broker
        .consume(&broker.topology().segments(), 10)
        .await
        .unwrap();
    let config = ReaperConfig {
        max_requeues: 3,
        backoff: Duration::ZERO,
        dispatch_grace: Duration::ZERO,
        batch: 100,
        republish_after: REPUBLISH_AFTER,
        outbox_retention: RETENTION,
    };
    Harness {
        store,
        reaper_store,
        broker,
        config,
        events,
        segments,
    }
}

impl Harness {
    async fn running_run(&self) -> RunId {
        let run = self
            .store
            .create_run(&NewRun {
                request_id: Uuid::now_v7(),
                agent: "seo".into(),
                acting_user: "editor".into(),
                prompt: "Improve page 12.".into(),
                inputs: None,
            })
            .await
            .unwrap();
        self.store.mark_dispatched(run.run_id).await.unwrap();
        self.store
            .claim(run.run_id, "w1", TTL)
            .await
            .unwrap()
            .expect("claimable");
        self.outbox_relayed().await;
        run.run_id
    }

    /// Takes every outbox row out, as the relay of the process that wrote it would have once
    /// the broker confirmed it: what a pass publishes is then only what it is being tested for.
    async fn outbox_relayed(&self) {
        sqlx::query("DELETE FROM event_outbox WHERE published_at IS NULL")
            .execute(self.store.pool())
            .await
            .unwrap();
    }

    /// Ages the unpublished outbox rows by `by`, by the database clock.
    async fn age_unpublished_events(&self, by: Duration) {
        sqlx::query(
            "UPDATE event_outbox SET created_at = created_at - $1 * interval '1 millisecond'
             WHERE published_at IS NULL",
        )
        .bind(by.as_millis() as f64)
        .execute(self.store.pool())
        .await
        .unwrap();
    }

    async fn expire_lease(&self, run_id: RunId) {
        sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
            .bind(run_id.as_uuid())
            .execute(self.store.pool())
            .await
            .unwrap();
    }

    async fn pass(&self) -> PassSummary {
        pass(&self.reaper_store, &self.broker, &self.config)
            .await
            .unwrap()
    }

    async fn next_json(consumer: &mut Consumer) -> (Vec<u8>, Value) {
        let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("a message within 10 s")
            .expect("the consumer is open")
            .expect("a delivery");
        let body = delivery.body.clone();
        delivery.ack().await.unwrap();
        let value = serde_json::from_slice(&body).unwrap();
        (body, value)
    }

    async fn cleanup(self) {
        self.broker.delete_topology().await.unwrap();
    }
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_expired_lease_is_requeued_and_its_wake_up_published_once(pool: PgPool) {
    let mut h = harness(pool).await;
    let run_id = h.running_run().await;
    h.expire_lease(run_id).await;

    let summary = h.pass().await;
    assert_eq!(
        summary,
        PassSummary {
            requeued: 1,
            redispatched: 1,
            ..PassSummary::default()
        }
    );
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.requeue_count, 1);
    let (body, _) = Harness::next_json(&mut h.segments).await;
    assert_eq!(parse_segment(&body).unwrap(), run_id);

    assert_eq!(
        h.pass().await,
        PassSummary::default(),
        "a second pass finds nothing to do"
    );
    h.cleanup().await;
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_run_past_its_requeue_limit_fails_retries_exhausted_and_announces_it(pool: PgPool) {
    let mut h = harness(pool).await;
    let run_id = h.running_run().await;
    sqlx::query("UPDATE runs SET requeue_count = 3 WHERE id = $1")
        .bind(run_id.as_uuid())
        .execute(h.store.pool())
        .await
        .unwrap();
    h.expire_lease(run_id).await;

    assert_eq!(
        h.pass().await,
        PassSummary {
            retries_exhausted: 1,
            events_published: 1,
            ..PassSummary::default()
        }
    );
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        run.termination_reason,
        Some(TerminationReason::RetriesExhausted)
    );
    let (_, event) = Harness::next_json(&mut h.events).await;
    assert_eq!(event["event"], "run.failed");
    assert_eq!(event["run_id"], json!(run_id));
    assert_eq!(event["termination_reason"], "retries_exhausted");
    h.cleanup().await;
}

/// A running run that stamped call 0 as sent with a non-idempotent write, as the worker does
/// before it sends one.
async fn stamped_run(h: &Harness) -> countersign_core::RunId {
    let run_id = h.running_run().await;
    let run = h.store.run(run_id).await.unwrap().unwrap();
    let lease = countersign_store::Lease {
        run_id,
        owner: "w1".into(),
        epoch: run.lease_epoch,
    };
    assert!(h
        .store
        .renew_stamping(
            &lease,
            TTL,
            Some(countersign_store::SentCall {
                seq: countersign_core::SuspensionSeq::FIRST,
                index: countersign_core::CallIndex::new(0),
                effect: Effect::NonIdempotentWrite,
            }),
        )
        .await
        .unwrap());
    h.expire_lease(run_id).await;
    run_id
}

/// The call stamped as sent, as the run row keeps it.
async fn sent_call(h: &Harness, run_id: countersign_core::RunId) -> (Option<i32>, Option<i32>) {
    sqlx::query_as("SELECT sent_seq, sent_call FROM runs WHERE id = $1")
        .bind(run_id.as_uuid())
        .fetch_one(h.store.pool())
        .await
        .unwrap()
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_run_whose_write_may_have_landed_is_requeued_with_the_call_still_marked_in_doubt(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = stamped_run(&h).await;

    assert_eq!(
        h.pass().await,
        PassSummary {
            requeued: 1,
            redispatched: 1,
            ..PassSummary::default()
        }
    );
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(
        sent_call(&h, run_id).await,
        (Some(1), Some(0)),
        "the next segment resolves the call by its key before anything else"
    );
    h.cleanup().await;
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_run_whose_retries_are_spent_with_a_write_in_doubt_fails_outcome_unknown(pool: PgPool) {
    let mut h = harness(pool).await;
    let run_id = stamped_run(&h).await;
    sqlx::query("UPDATE runs SET requeue_count = 3 WHERE id = $1")
        .bind(run_id.as_uuid())
        .execute(h.store.pool())
        .await
        .unwrap();

    assert_eq!(
        h.pass().await,
        PassSummary {
            outcome_unknown: 1,
            events_published: 1,
            ..PassSummary::default()
        }
    );
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        run.termination_reason,
        Some(TerminationReason::OutcomeUnknown)
    );
    assert_eq!(run.error_code.as_deref(), Some("outcome_unknown"));
    assert_eq!(
        sent_call(&h, run_id).await,
        (Some(1), Some(0)),
        "the call in doubt stays named for an operator"
    );
    let (_, event) = Harness::next_json(&mut h.events).await;
    assert_eq!(event["termination_reason"], "outcome_unknown");
    h.cleanup().await;
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn an_approval_past_its_deadline_is_cancelled_and_announced(pool: PgPool) {
    let mut h = harness(pool).await;
    let run_id = h.running_run().await;
    let run = h.store.run(run_id).await.unwrap().unwrap();
    let lease = countersign_store::Lease {
        run_id,
        owner: "w1".into(),
        epoch: run.lease_epoch,
    };
    let state = SuspendedRunState {
        transcript: vec![Message::user("Improve page 12.")],
        pending_calls: vec![PendingCall {
            id: "c1".into(),
            tool: "update_page_metadata".into(),
            arguments: json!({"uid": 12, "description": "New"}),
        }],
        iterations: 1,
        tokens: TokenUsage::default(),
        offered_tools: vec!["update_page_metadata".into()],
        model_options: Default::default(),
        call_previews: vec![],
        stale_call_indexes: vec![],
        landed_calls: vec![],
        tool_identities: vec![],
        excluded_calls: vec![],
        edits: vec![],
        suspension_seq: SuspensionSeq::FIRST,
        captured_at: "2026-11-30T10:00:00Z".into(),
    };
    assert!(h.store.suspend(&lease, &state, &[]).await.unwrap());
    h.outbox_relayed().await;
    sqlx::query("UPDATE runs SET approval_deadline = now() - interval '1 second' WHERE id = $1")
        .bind(run_id.as_uuid())
        .execute(h.store.pool())
        .await
        .unwrap();

    assert_eq!(
        h.pass().await,
        PassSummary {
            approvals_expired: 1,
            events_published: 1,
            ..PassSummary::default()
        }
    );
    let run = h.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(
        run.termination_reason,
        Some(TerminationReason::ApprovalExpired)
    );
    let (_, event) = Harness::next_json(&mut h.events).await;
    assert_eq!(event["event"], "run.cancelled");
    assert_eq!(event["termination_reason"], "approval_expired");
    h.cleanup().await;
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn two_passes_at_once_reap_each_expired_run_once(pool: PgPool) {
    let h = harness(pool).await;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let run_id = h.running_run().await;
        h.expire_lease(run_id).await;
        runs.push(run_id);
    }
    let (a, b) = tokio::join!(h.pass(), h.pass());
    assert_eq!(a.requeued + b.requeued, 5, "{a} / {b}");
    for run_id in runs {
        assert_eq!(h.store.run(run_id).await.unwrap().unwrap().requeue_count, 1);
    }
    h.cleanup().await;
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn the_reaper_republishes_an_event_its_relay_left_unpublished(pool: PgPool) {
    let mut h = harness(pool).await;
    let run_id = h.running_run().await;
    // An operator's cancel commits its event; the process that would have relayed it is gone.
    assert!(h.store.cancel(run_id).await.unwrap());
    let row = h.store.outbox(run_id).await.unwrap().pop().unwrap();
    assert_eq!(row.kind, "run.cancelled");

    // Older than a relay's sweep age but younger than the grace: published by the pass, not
    // counted as republished.
    h.age_unpublished_events(countersign_service::relay::SWEEP_AFTER + Duration::from_secs(1))
        .await;
    let mut fresh = h.config.clone();
    fresh.republish_after = Duration::from_secs(3600);
    let summary = pass(&h.reaper_store, &h.broker, &fresh).await.unwrap();
    assert_eq!(summary.events_republished, 0);
    assert_eq!(summary.events_published, 1, "its own pass publishes it");
    let (_, event) = Harness::next_json(&mut h.events).await;
    assert_eq!(event["event_id"], json!(row.id));
    assert!(
        h.store.outbox(run_id).await.unwrap().is_empty(),
        "deleted once the broker confirmed it"
    );

    // Once more, as if that send had never been confirmed: unsent and older than the grace.
    sqlx::query("INSERT INTO event_outbox (id, run_id, kind, body) VALUES ($1, $2, $3, $4)")
        .bind(row.id)
        .bind(row.run_id)
        .bind(&row.kind)
        .bind(&row.body)
        .execute(h.store.pool())
        .await
        .unwrap();
    h.age_unpublished_events(REPUBLISH_AFTER * 2).await;
    assert_eq!(
        h.pass().await,
        PassSummary {
            events_republished: 1,
            ..PassSummary::default()
        }
    );
    let delivery = tokio::time::timeout(Duration::from_secs(10), h.events.next())
        .await
        .expect("a message within 10 s")
        .expect("the consumer is open")
        .expect("a delivery");
    let event: Value = serde_json::from_slice(&delivery.body).unwrap();
    let message_id = delivery.message_id.clone();
    delivery.ack().await.unwrap();
    assert_eq!(event, row.body, "the body as it was committed");
    assert_eq!(event["event"], "run.cancelled");
    assert_eq!(event["run_id"], json!(run_id));
    assert_eq!(event["termination_reason"], "cancelled");
    assert_eq!(event["event_id"], json!(row.id));
    assert_eq!(
        message_id,
        Some(row.id.to_string()),
        "the event id as message id"
    );

    assert!(
        h.store.outbox(run_id).await.unwrap().is_empty(),
        "deleted once the broker confirmed it"
    );
    assert_eq!(
        h.pass().await,
        PassSummary::default(),
        "a published event is not republished"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), h.events.next())
            .await
            .is_err(),
        "nothing more arrives"
    );
    assert!(
        format!("{}", PassSummary::default()).contains(" events_republished=0"),
        "the summary line names it"
    );
    h.cleanup().await;
}

/// Makes the run's outbox rows as old as `age`: created (their UUIDv7 ids too) and, when
/// `published`, published that long ago.
async fn age_outbox(h: &Harness, run_id: RunId, age: Duration, published: bool) {
    let at = std::time::SystemTime::now() - age;
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap();
    let ids: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM event_outbox WHERE run_id = $1")
        .bind(run_id.as_uuid())
        .fetch_all(h.store.pool())
        .await
        .unwrap();
    for id in ids {
        let old = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            since.as_secs(),
            since.subsec_nanos(),
        ));
        sqlx::query(
            "UPDATE event_outbox SET id = $2, body = body || jsonb_build_object('event_id', $2),
                 created_at = now() - $3 * interval '1 millisecond',
                 published_at = CASE WHEN $4 THEN now() - $3 * interval '1 millisecond' END
             WHERE id = $1",
        )
        .bind(id)
        .bind(old)
        .bind(age.as_millis() as f64)
        .bind(published)
        .execute(h.store.pool())
        .await
        .unwrap();
    }
}

/// The rows of `table` (`event_outbox`, `run_events`) about the run.
async fn rows_of(h: &Harness, table: &str, run_id: RunId) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table} WHERE run_id = $1"))
        .bind(run_id.as_uuid())
        .fetch_one(h.store.pool())
        .await
        .unwrap()
}

async fn outbox_rows(h: &Harness, run_id: RunId) -> i64 {
    rows_of(h, "event_outbox", run_id).await
}

async fn audit_rows(h: &Harness, run_id: RunId) -> i64 {
    rows_of(h, "run_events", run_id).await
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn published_events_past_the_retention_are_pruned_and_an_unpublished_one_never(pool: PgPool) {
    let h = harness(pool).await;
    let old = h.running_run().await;
    let recent = h.running_run().await;
    let unsent = h.running_run().await;
    for run in [old, recent, unsent] {
        assert!(h.store.cancel(run).await.unwrap());
    }
    // A relay deletes what it sent; one of the version before kept the row, marked.
    age_outbox(&h, old, RETENTION * 2, true).await;
    age_outbox(&h, recent, Duration::ZERO, true).await;
    // As old, but its cancel was never published (its relay died): the pass publishes it.
    age_outbox(&h, unsent, RETENTION * 2, false).await;
    let (old_rows, old_audit) = (outbox_rows(&h, old).await, audit_rows(&h, old).await);
    let (recent_rows, unsent_rows) = (outbox_rows(&h, recent).await, outbox_rows(&h, unsent).await);
    assert!(old_rows > 0 && recent_rows > 0 && unsent_rows > 0);

    let summary = h.pass().await;
    assert_eq!(summary.events_pruned, old_rows as u64, "{summary}");
    assert_eq!(summary.events_republished, unsent_rows as u64, "{summary}");
    assert_eq!(outbox_rows(&h, old).await, 0, "pruned");
    assert_eq!(
        audit_rows(&h, old).await,
        old_audit,
        "the audit trail stays"
    );
    assert_eq!(
        outbox_rows(&h, recent).await,
        recent_rows,
        "within the retention"
    );
    assert_eq!(
        outbox_rows(&h, unsent).await,
        0,
        "published now, and deleted once confirmed"
    );
    assert_eq!(h.pass().await.events_pruned, 0, "nothing left to prune");
    h.cleanup().await;
}
