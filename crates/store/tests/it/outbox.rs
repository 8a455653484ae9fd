//! The transactional outbox: every announced transition writes its event in its own
//! transaction, with the database's time, and the relay sends each row once it is confirmed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use countersign_core::{CallIndex, DecisionMessage, RunId, SuspensionSeq, TerminationReason};
use countersign_store::{
    DecisionOutcome, DecisionRecord, EventPublisher, HandedOff, NewDecision, OutboxEvent,
    RelayReport, RunCounters, RunStatus, Settlement, Store,
};
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::support::{new_run, queued, running, state, store, waiting};

/// Records what it is given; fails every publish from the `fail_from`-th on (0-based).
#[derive(Default)]
struct Recorder {
    sent: Mutex<Vec<OutboxEvent>>,
    fail_from: Option<usize>,
    calls: AtomicUsize,
}

impl Recorder {
    fn failing_from(n: usize) -> Self {
        Recorder {
            fail_from: Some(n),
            ..Recorder::default()
        }
    }

    fn kinds(&self) -> Vec<String> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.kind.clone())
            .collect()
    }
}

impl EventPublisher for Recorder {
    type Error = &'static str;

    async fn publish(&self, event: &OutboxEvent) -> Result<(), &'static str> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail_from.is_some_and(|from| n >= from) {
            return Err("publish_nacked");
        }
        self.sent.lock().unwrap().push(event.clone());
        Ok(())
    }
}

async fn relay(store: &Store, publisher: &Recorder) -> RelayReport<&'static str> {
    store
        .relay_batch(Duration::ZERO, 100, publisher)
        .await
        .expect("relay")
}

/// The kinds of the run's outbox rows still to be sent, oldest first.
async fn outbox(store: &Store, run: RunId) -> Vec<String> {
    store
        .outbox(run)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

/// Whether the run is recorded as dispatched.
async fn dispatched(pool: &PgPool, run: RunId) -> bool {
    sqlx::query_scalar("SELECT dispatched_at IS NOT NULL FROM runs WHERE id = $1")
        .bind(run.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The handed-off rows of `run`, oldest first.
fn rows_of(handed: &[HandedOff], run: RunId) -> Vec<&OutboxEvent> {
    handed
        .iter()
        .map(|h| &h.row)
        .filter(|e| e.run_id == Some(run.as_uuid()))
        .collect()
}

async fn unpublished(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM event_outbox WHERE published_at IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Makes every insert of a `run_events` row of `kind` fail, as a full disk or a refused audit
/// would: whatever its transaction wrote before must roll back with it.
async fn refuse_audit_rows(pool: &PgPool, kind: &str) {
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'audit refused'; END $$;
         CREATE TRIGGER refuse_audit BEFORE INSERT ON run_events
         FOR EACH ROW WHEN (NEW.kind = '{kind}') EXECUTE FUNCTION refuse_audit();"
    ))
    .execute(pool)
    .await
    .unwrap();
}

async fn allow_audit_rows(pool: &PgPool) {
    sqlx::raw_sql("DROP TRIGGER refuse_audit ON run_events; DROP FUNCTION refuse_audit();")
        .execute(pool)
        .await
        .unwrap();
}

fn at(event: &OutboxEvent) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(event.body["at"].as_str().expect("at is a string"))
        .expect("at is RFC 3339")
        .with_timezone(&Utc)
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_rolled_back_transition_leaves_no_outbox_row(pool: PgPool) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let before = unpublished(&pool).await;
    // A suspension after a moved preview writes `run.preview_moved` (audit row, then outbox
    // row) before `run.suspended`; refusing the second audit row fails the transaction after
    // the first outbox row was written.
    refuse_audit_rows(&pool, "run.suspended").await;
    let mut st = state(SuspensionSeq::FIRST.next());
    st.stale_call_indexes = vec![CallIndex::new(0)];

    assert!(store
        .suspend(&lease, &st, &["update_page_metadata"])
        .await
        .is_err());
    assert_eq!(outbox(&store, run).await, ["run.accepted"]);
    assert_eq!(
        unpublished(&pool).await,
        before,
        "no row of the suspension is left"
    );
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Running, "nor the transition");
    assert!(
        store.events(run).await.unwrap().is_empty(),
        "nor an audit row"
    );

    allow_audit_rows(&pool).await;
    assert!(store
        .suspend(&lease, &st, &["update_page_metadata"])
        .await
        .unwrap());
    assert_eq!(
        outbox(&store, run).await,
        ["run.accepted", "run.preview_moved", "run.suspended"]
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_committed_suspend_has_its_run_suspended_row_with_the_database_time(pool: PgPool) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let st = state(SuspensionSeq::FIRST);
    assert!(store.suspend(&lease, &st, &[]).await.unwrap());

    let rows = store.outbox(run).await.unwrap();
    let kinds: Vec<&str> = rows.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["run.accepted", "run.suspended"]);
    let suspended = &rows[1];
    assert_eq!(suspended.run_id, Some(run.as_uuid()));
    let mut body = suspended.body.clone();
    let at_text = body.as_object_mut().unwrap().remove("at").unwrap();
    assert_eq!(
        body,
        json!({
            "type": "countersign.event", "version": 1, "event": "run.suspended",
            "event_id": suspended.id,
            "run_id": run,
            "suspension_seq": 1,
            "turn_digest": st.turn_digest().as_str(),
            "stale_call_indexes": [],
            "failed_previews": 0,
        })
    );
    assert!(at_text.as_str().unwrap().ends_with('Z'), "UTC: {at_text}");

    // The database's time of the transition's own transaction: the run row's `updated_at`
    // to the microsecond, which no process clock would hit.
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::WaitingForApproval);
    assert_eq!(at(suspended), row.updated_at);
    assert_eq!(suspended.created_at, row.updated_at);

    // Its audit row is part of the same transaction.
    let audit = store.events(run).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].kind, "run.suspended");
    assert_eq!(audit[0].created_at, row.updated_at);
    assert_eq!(audit[0].payload["turn_digest"], st.turn_digest().as_str());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn relay_deletes_the_rows_it_sent_and_a_second_relay_publishes_nothing(pool: PgPool) {
    let store = store(pool.clone());
    let (run, st) = waiting(&store).await;
    assert!(store.cancel(run).await.unwrap());

    let first = Recorder::default();
    let report = relay(&store, &first).await;
    assert_eq!(
        report,
        RelayReport {
            published: 3,
            claimed: 3,
            error: None
        }
    );
    assert_eq!(
        first.kinds(),
        ["run.accepted", "run.suspended", "run.cancelled"],
        "oldest first"
    );
    let sent = first.sent.lock().unwrap().clone();
    assert_eq!(sent[1].body["turn_digest"], st.turn_digest().as_str());
    assert!(sent.iter().all(|e| e.body["event_id"] == json!(e.id)));
    assert_eq!(
        outbox(&store, run).await,
        Vec::<String>::new(),
        "sent, so gone"
    );
    let trail: Vec<String> = store
        .events(run)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(
        trail.ends_with(&["run.suspended".into(), "run.cancelled".into()]),
        "the audit trail keeps the record: {trail:?}"
    );

    let second = Recorder::default();
    assert_eq!(relay(&store, &second).await.published, 0);
    assert!(second.kinds().is_empty(), "nothing is sent twice");
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_failed_publish_leaves_its_row_and_the_rest_for_the_next_relay(pool: PgPool) {
    let store = store(pool.clone());
    let (run, _) = waiting(&store).await;
    assert!(store.cancel(run).await.unwrap());

    let flaky = Recorder::failing_from(1);
    let report = relay(&store, &flaky).await;
    assert_eq!(
        (report.published, report.error),
        (1, Some("publish_nacked"))
    );
    assert_eq!(
        outbox(&store, run).await,
        ["run.suspended", "run.cancelled"],
        "the sent row is gone, the failed one and the rest wait"
    );

    let next = Recorder::default();
    assert_eq!(relay(&store, &next).await.published, 2);
    assert_eq!(next.kinds(), ["run.suspended", "run.cancelled"]);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn handed_off_rows_the_broker_confirmed_leave_the_outbox_at_the_flush(pool: PgPool) {
    let store = store(pool.clone());
    let (run, _) = waiting(&store).await;
    let handed = store.take_handed_off();
    let ours = rows_of(&handed, run);
    assert_eq!(
        ours.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        ["run.accepted", "run.suspended"]
    );

    // Only the confirmed one is noted: the other stays for a sweep.
    store.note_published([ours[0]]);
    assert_eq!(
        store.pending_marks(),
        2,
        "the row, and its run's dispatch: run.accepted is the run's wake-up"
    );
    store.flush_marks().await.unwrap();
    assert_eq!(store.pending_marks(), 0);
    assert_eq!(outbox(&store, run).await, ["run.suspended"]);

    let sweep = Recorder::default();
    assert_eq!(relay(&store, &sweep).await.published, 1);
    assert_eq!(
        sweep.kinds(),
        ["run.suspended"],
        "nothing confirmed is sent again"
    );
    assert_eq!(unpublished(&pool).await, 0);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn rows_an_earlier_relay_marked_published_are_neither_sent_nor_kept_past_retention(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let (run, _) = waiting(&store).await;
    // A relay of the version before deletes-on-confirm marked what it sent.
    sqlx::query(
        "UPDATE event_outbox SET published_at = now() WHERE run_id = $1 AND kind = 'run.accepted'",
    )
    .bind(run.as_uuid())
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(outbox(&store, run).await, ["run.suspended"]);
    let sweep = Recorder::default();
    relay(&store, &sweep).await;
    assert_eq!(
        sweep.kinds(),
        ["run.suspended"],
        "a marked row is not sent again"
    );

    let marked = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM event_outbox WHERE run_id = $1")
            .bind(run.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(marked().await, 1, "kept within its retention");
    let pruned = store
        .prune_published_events(Duration::from_secs(3600), 100)
        .await
        .unwrap();
    assert_eq!((pruned, marked().await), (0, 1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pruned = store
        .prune_published_events(Duration::from_millis(5), 100)
        .await
        .unwrap();
    assert_eq!(
        (pruned, marked().await),
        (1, 0),
        "deleted past its retention"
    );
}

/// Holds its first publish until released, so a second relay runs while the first holds rows.
struct Holding {
    inner: Recorder,
    entered: Notify,
    release: Notify,
}

impl EventPublisher for Holding {
    type Error = &'static str;

    async fn publish(&self, event: &OutboxEvent) -> Result<(), &'static str> {
        if self.inner.calls.load(Ordering::SeqCst) == 0 {
            self.entered.notify_one();
            self.release.notified().await;
        }
        self.inner.publish(event).await
    }
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn two_relays_at_once_send_each_row_once(pool: PgPool) {
    let store = store(pool.clone());
    for _ in 0..3 {
        queued(&store).await;
    }
    let holding = Arc::new(Holding {
        inner: Recorder::default(),
        entered: Notify::new(),
        release: Notify::new(),
    });
    let (s1, h1) = (store.clone(), holding.clone());
    let first =
        tokio::spawn(async move { s1.relay_batch(Duration::ZERO, 100, &*h1).await.unwrap() });
    holding.entered.notified().await;

    // The first relay holds every row: the second skips them instead of waiting or sending.
    let other = Recorder::default();
    assert_eq!(relay(&store, &other).await.claimed, 0);
    holding.release.notify_one();
    assert_eq!(first.await.unwrap().published, 3);
    assert_eq!(relay(&store, &other).await.claimed, 0, "and none is left");
    assert!(other.kinds().is_empty());
    assert_eq!(holding.inner.kinds().len(), 3);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_relay_asked_for_older_rows_leaves_the_fresh_ones(pool: PgPool) {
    let store = store(pool.clone());
    queued(&store).await;
    let recorder = Recorder::default();
    let fresh = store
        .relay_batch(Duration::from_secs(60), 100, &recorder)
        .await
        .unwrap();
    assert_eq!(fresh.claimed, 0);
    sqlx::query("UPDATE event_outbox SET created_at = created_at - interval '2 minutes'")
        .execute(&pool)
        .await
        .unwrap();
    let old = store
        .relay_batch(Duration::from_secs(60), 100, &recorder)
        .await
        .unwrap();
    assert_eq!(old.published, 1);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn cancel_is_one_transaction(pool: PgPool) {
    let store = store(pool.clone());
    let (run, _) = waiting(&store).await;
    let before = store.run(run).await.unwrap().unwrap();
    let outbox_before = outbox(&store, run).await;

    // If its audit row cannot be written, nothing of the cancel is.
    refuse_audit_rows(&pool, "run.cancelled").await;
    assert!(store.cancel(run).await.is_err());
    assert_eq!(store.run(run).await.unwrap().unwrap(), before);
    assert_eq!(outbox(&store, run).await, outbox_before);
    allow_audit_rows(&pool).await;

    assert!(store.cancel(run).await.unwrap());
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Cancelled);
    assert_eq!(row.termination_reason, Some(TerminationReason::Cancelled));
    let audit = store.events(run).await.unwrap();
    let cancelled = audit.last().unwrap();
    assert_eq!(cancelled.kind, "run.cancelled");
    assert_eq!(
        cancelled.payload,
        json!({"termination_reason": "cancelled"})
    );
    let event = store.outbox(run).await.unwrap().pop().unwrap();
    assert_eq!(event.kind, "run.cancelled");
    assert_eq!(event.body["termination_reason"], "cancelled");
    // `now()` is the transaction's start: one instant for the transition, its audit row and
    // its outbox row means one transaction.
    assert_eq!(cancelled.created_at, row.updated_at);
    assert_eq!(event.created_at, row.updated_at);
    assert_eq!(at(&event), row.updated_at);

    // A cancel that loses announces nothing.
    assert!(!store.cancel(run).await.unwrap());
    assert_eq!(
        store.outbox(run).await.unwrap().len(),
        outbox_before.len() + 1
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn every_announced_transition_writes_exactly_its_event(pool: PgPool) {
    let store = store(pool.clone());
    let kinds = |run: RunId| {
        let store = store.clone();
        async move {
            store
                .outbox(run)
                .await
                .unwrap()
                .into_iter()
                .map(|e| (e.kind, e.body))
                .collect::<Vec<_>>()
        }
    };

    // A run request, once: a duplicate announces nothing.
    let request = new_run("Improve page 12.");
    let created = store.create_run(&request).await.unwrap();
    let again = store.create_run(&request).await.unwrap();
    assert!(!again.created);
    let run = created.run_id;
    let accepted = kinds(run).await;
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].0, "run.accepted");
    assert_eq!(accepted[0].1["request_id"], json!(request.request_id));
    assert_eq!(accepted[0].1["run_id"], json!(run));

    // A decision, once: a replay announces nothing.
    let lease = crate::support::claim(&store, run, "worker-a").await.lease;
    let st = state(SuspensionSeq::FIRST);
    assert!(store.suspend(&lease, &st, &[]).await.unwrap());
    let decision = NewDecision {
        message: DecisionMessage {
            comment: Some("fine".into()),
            ..crate::support::accept(run, &st).message
        },
        ..crate::support::accept(run, &st)
    };
    assert_eq!(
        store.record_decision(&decision).await.unwrap(),
        DecisionRecord::Recorded(DecisionOutcome::Accepted)
    );
    assert_eq!(
        store.record_decision(&decision).await.unwrap(),
        DecisionRecord::Replayed(DecisionOutcome::Accepted)
    );
    let after_decision = kinds(run).await;
    assert_eq!(after_decision.len(), 3);
    let (kind, body) = &after_decision[2];
    assert_eq!(kind, "decision.accepted");
    assert_eq!(body["decision_id"], json!(decision.message.decision_id));
    assert_eq!(body["outcome"], "accepted");
    assert!(body.get("comment").is_none() && body.get("approver").is_none());

    // A completed settle; its answer is sealed into the audit trail and never published.
    let resumed = crate::support::claim(&store, run, "worker-b").await.lease;
    let done = Settlement::completed(TerminationReason::Completed, RunCounters::default())
        .with_answer("The description now reads: Bicycles for every road.");
    assert!(store.settle(&resumed, &done).await.unwrap());
    let (kind, body) = kinds(run).await.pop().unwrap();
    assert_eq!(kind, "run.completed");
    assert_eq!(body["termination_reason"], "completed");
    assert!(!body.to_string().contains("Bicycles"));
    let audit = store.events(run).await.unwrap();
    let completed = audit.last().unwrap();
    assert_eq!(completed.kind, "run.completed");
    let answer = store.open_event_content(run, completed).unwrap().unwrap();
    assert!(String::from_utf8(answer).unwrap().contains("Bicycles"));

    // A failed settle carries its error code.
    let (failed, lease) = running(&store).await;
    let failure = Settlement::failed(
        TerminationReason::ProviderFailed,
        Some("provider_timeout"),
        None,
    );
    assert!(store.settle(&lease, &failure).await.unwrap());
    let (kind, body) = kinds(failed).await.pop().unwrap();
    assert_eq!(kind, "run.failed");
    assert_eq!(body["error_code"], "provider_timeout");

    // An expired approval.
    let (expired, _) = waiting(&store).await;
    sqlx::query("UPDATE runs SET approval_deadline = now() - interval '1 second' WHERE id = $1")
        .bind(expired.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    assert!(store
        .expire_approval(expired, SuspensionSeq::FIRST)
        .await
        .unwrap());
    let (kind, body) = kinds(expired).await.pop().unwrap();
    assert_eq!(kind, "run.cancelled");
    assert_eq!(body["termination_reason"], "approval_expired");
    assert_eq!(
        store.events(expired).await.unwrap().last().unwrap().kind,
        "run.cancelled"
    );

    // A refused decision about a run that does not exist is announced, with no trail to join.
    let ghost = RunId::new();
    let refused = NewDecision {
        message: DecisionMessage {
            decision_id: Uuid::now_v7(),
            run_id: ghost,
            ..decision.message
        },
        outcome: DecisionOutcome::NotAwaitingApproval,
        ..decision
    };
    store.record_decision(&refused).await.unwrap();
    let (kind, body) = kinds(ghost).await.pop().unwrap();
    assert_eq!(kind, "decision.refused");
    assert_eq!(body["outcome"], "not_awaiting_approval");
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn rows_claimed_by_a_relay_that_died_are_sent_once_its_claim_runs_out(pool: PgPool) {
    let store = store(pool.clone());
    let (run, _) = waiting(&store).await;
    // A relay claimed the rows and died before publishing them.
    sqlx::query("UPDATE event_outbox SET claimed_until = now() + interval '1 minute'")
        .execute(&pool)
        .await
        .unwrap();
    let blocked = Recorder::default();
    assert_eq!(relay(&store, &blocked).await.claimed, 0, "the claim holds");

    sqlx::query("UPDATE event_outbox SET claimed_until = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let next = Recorder::default();
    assert_eq!(relay(&store, &next).await.published, 2);
    assert_eq!(next.kinds(), ["run.accepted", "run.suspended"]);
    assert_eq!(outbox(&store, run).await, Vec::<String>::new());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_confirmed_wake_up_event_records_its_run_dispatched_and_no_other_event_does(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let run = queued(&store).await;
    let handed = store.take_handed_off();
    let accepted = rows_of(&handed, run);
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].kind, "run.accepted");
    assert_eq!(accepted[0].wakes(), Some(run.as_uuid()));

    // An event of the run that wakes nobody leaves it undispatched: the reaper would wake it.
    let cancelled = countersign_core::Event::new(
        countersign_core::EventName::RunCancelled,
        json!({"run_id": run}),
    );
    store.announce(Some(run), &cancelled).await.unwrap();
    let other = store.take_handed_off();
    assert_eq!(other[0].row.wakes(), None);
    store.note_published(other.iter().map(|h| &h.row));
    store.flush_marks().await.unwrap();
    assert!(!dispatched(&pool, run).await);

    store.note_published(accepted);
    store.flush_marks().await.unwrap();
    assert!(
        dispatched(&pool, run).await,
        "the confirmed run.accepted was the run's wake-up"
    );
    assert!(outbox(&store, run).await.is_empty());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_wake_up_mark_flushed_after_its_run_moved_on_leaves_the_later_segment_undispatched(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let run = queued(&store).await;
    let started = store.take_handed_off();

    // The start's wake-up is confirmed, but its mark waits while the run is claimed, suspended
    // and released for its resume.
    let lease = crate::support::claim(&store, run, "worker-a").await.lease;
    let st = state(SuspensionSeq::FIRST);
    assert!(store.suspend(&lease, &st, &[]).await.unwrap());
    assert_eq!(
        store
            .record_decision(&crate::support::accept(run, &st))
            .await
            .unwrap(),
        DecisionRecord::Recorded(DecisionOutcome::Accepted)
    );
    store.note_published(started.iter().map(|h| &h.row));
    store.flush_marks().await.unwrap();
    assert!(
        !dispatched(&pool, run).await,
        "the start's wake-up does not stand for the resume's"
    );

    // The resume's own wake-up does.
    let released = store.take_handed_off();
    let resume: Vec<&OutboxEvent> = rows_of(&released, run)
        .into_iter()
        .filter(|e| e.kind == "decision.accepted")
        .collect();
    assert_eq!(resume.len(), 1);
    store.note_published(resume);
    store.flush_marks().await.unwrap();
    assert!(dispatched(&pool, run).await);
}
