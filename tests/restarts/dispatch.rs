//! A coordinator killed between recording an approval and dispatching it.
//!
//! The coordinator commits the decision (and the run's release) with its `decision.accepted` in
//! the outbox, answers and acks the decision; its relay publishes the event, which the segments
//! queue takes as the run's wake-up, and records the dispatch with its next flush of marks
//! (`UPDATE runs SET dispatched_at = now() WHERE id = ANY(…) AND status = 'queued'`, after the
//! confirmed row's delete). Nothing it runs in PostgreSQL lies between the commit and the
//! publish, so the test holds it at the statement right after the publish, kills it there, cuts
//! the held statement so it never lands, and takes the published wake-up off the queue before
//! any worker consumes it (no worker runs meanwhile): what is left is exactly a coordinator that
//! died before its publish — a recorded approval and a queued run never dispatched — whose
//! decision may or may not have been acked.

use countersign_e2e::{
    count, cut_waiting_at_gate, hold_gate, install_gate, release_gate, remove_gate, run_row, secs,
    wait_for_card, wait_for_sql, wait_for_status, wait_until, waiting_at_gate,
};
use countersign_queue::MessageProperties;
use serde_json::{json, Value};

use crate::support::{assert_turn_written_once, exclusive, fault_page, Site};

const SCENARIO: &str = "coordinator killed between decision and dispatch";

/// Gate of the coordinator's record of a dispatch, the statement after its publish.
const DISPATCH_GATE: i64 = 4253;
const DISPATCH_GATE_WHEN: &str = "OLD.status = 'queued' AND NEW.status = 'queued'
     AND OLD.segment = 'resume' AND OLD.dispatched_at IS NULL AND NEW.dispatched_at IS NOT NULL";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_between_recording_an_approval_and_dispatching_it_is_covered_by_the_reapers_lost_dispatch_scan_and_the_turn_is_written_once(
) {
    let _exclusive = exclusive().await;
    let mut site = Site::new("restart_dispatch", 1).await;
    let mut coordinator = site.coordinator();
    // No polling: a worker claims only what a delivery wakes it for.
    let only_deliveries = ["--poll-interval-secs", "3600"];
    let mut first = site.worker(&only_deliveries);
    let page = fault_page(1);
    let run = site.submit(page);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;
    let digest = site.digest(&run).await;
    first.sigterm();
    let stopped = first.exit_within(secs(15)).await;
    assert!(
        stopped.is_some_and(|s| s.success()),
        "{SCENARIO}: the first worker stops: {stopped:?}"
    );

    // The approval goes in with a reply queue; the coordinator is held after its publish.
    install_gate(
        &mut site.conn,
        "dispatch",
        "runs",
        "UPDATE",
        DISPATCH_GATE_WHEN,
        DISPATCH_GATE,
    )
    .await;
    hold_gate(&mut site.conn, DISPATCH_GATE).await;
    let broker = site.install.broker().await;
    let reply_to = broker.declare_private_queue().await.unwrap();
    let mut replies = broker.consume(&reply_to, 10).await.unwrap();
    let decision_id = uuid::Uuid::now_v7().to_string();
    let decision = json!({
        "type": "countersign.decision", "version": 1,
        "decision_id": decision_id, "run_id": run,
        "suspension_seq": 1, "turn_digest": digest,
        "approved": true, "approver": "admin",
    });
    broker
        .publish_message(
            &broker.topology().decisions(),
            decision.to_string().as_bytes(),
            &MessageProperties {
                user_id: Some("guest".to_owned()),
                reply_to: Some(reply_to.clone()),
                correlation_id: Some("the-approval".to_owned()),
            },
        )
        .await
        .unwrap();
    wait_until(
        &format!("{SCENARIO}: the coordinator recorded the approval and waits at the gate"),
        secs(30),
        async || {
            let recorded = count(
                &mut site.conn,
                &format!(
                    "SELECT count(*) FROM run_decisions WHERE run_id = '{run}'::uuid
                     AND outcome = 'accepted'"
                ),
            )
            .await;
            (recorded == 1 && waiting_at_gate(&mut site.conn, DISPATCH_GATE).await == 1)
                .then_some(())
        },
    )
    .await;

    coordinator.sigkill();
    let cut = cut_waiting_at_gate(&mut site.conn, DISPATCH_GATE).await;
    assert_eq!(
        cut, 1,
        "{SCENARIO}: the killed coordinator's record of the dispatch is cut"
    );
    release_gate(&mut site.conn, DISPATCH_GATE).await;
    remove_gate(&mut site.conn, "dispatch", "runs").await;

    // The wake-up it had published is taken off the queue unconsumed, as if it never left.
    let segments = broker.topology().segments();
    let mut wake_ups = broker.consume(&segments, 10).await.unwrap();
    let lost = match tokio::time::timeout(secs(30), wake_ups.next()).await {
        Ok(next) => next
            .expect("the segments consumer is open")
            .expect("a delivery"),
        Err(_) => {
            // What the failure needs to be understood: where the event is, if anywhere.
            let outbox: Vec<String> = sqlx::query_scalar(
                "SELECT kind FROM event_outbox WHERE run_id = $1::text::uuid ORDER BY created_at",
            )
            .bind(&run)
            .fetch_all(&mut site.conn)
            .await
            .unwrap_or_default();
            let row = run_row(&mut site.conn, &run).await;
            let ready = broker.message_count(&segments).await;
            let bindings = std::process::Command::new("rabbitmqctl")
                .args([
                    "list_bindings",
                    "-q",
                    "source_name",
                    "destination_name",
                    "routing_key",
                ])
                .output()
                .map(|out| {
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .filter(|l| l.contains(&broker.topology().prefix))
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            panic!(
                "{SCENARIO}: the coordinator published the wake-up before it was killed; \
                 none on the queue within 30 s: outbox {outbox:?}, ready {ready:?}, \
                 bindings {bindings:?}, run {row}"
            )
        }
    };
    let body: Value = serde_json::from_slice(&lost.body).unwrap();
    assert_eq!(
        (&body["event"], &body["run_id"]),
        (&json!("decision.accepted"), &json!(run)),
        "{SCENARIO}: the wake-up is the decision's event: {body}"
    );
    lost.ack().await.unwrap();
    let more = tokio::time::timeout(secs(1), wake_ups.next()).await;
    assert!(more.is_err(), "{SCENARIO}: one wake-up was published");
    drop(wake_ups);
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (&row["status"], &row["segment"], &row["dispatched_at"]),
        (&json!("queued"), &json!("resume"), &Value::Null),
        "{SCENARIO}: the run is released and was never dispatched: {row}"
    );

    // The approval is answered with its recorded outcome — by the killed coordinator if it got
    // that far, or else by the one started again, as a replay of the redelivered approval — and
    // nothing is recorded or dispatched again.
    site.start_coordinator();
    let reply = tokio::time::timeout(secs(30), replies.next())
        .await
        .unwrap_or_else(|_| panic!("{SCENARIO}: the redelivered approval is answered"))
        .expect("the reply consumer is open")
        .expect("a delivery");
    let answer: Value = serde_json::from_slice(&reply.body).unwrap();
    reply.ack().await.unwrap();
    assert_eq!(
        (&answer["event"], &answer["outcome"], &answer["decision_id"]),
        (
            &json!("decision.accepted"),
            &json!("accepted"),
            &json!(decision_id)
        ),
        "{SCENARIO}: the replay answers the recorded outcome: {answer}"
    );
    let decisions = count(
        &mut site.conn,
        &format!("SELECT count(*) FROM run_decisions WHERE run_id = '{run}'::uuid"),
    )
    .await;
    assert_eq!(decisions, 1, "{SCENARIO}: the approval is recorded once");
    assert_eq!(
        broker.message_count(&segments).await.unwrap(),
        0,
        "{SCENARIO}: the replay dispatched nothing"
    );

    // The reaper's lost-dispatch scan publishes the wake-up again; a worker that only listens
    // to deliveries completes the run.
    wait_for_sql(
        &mut site.conn,
        &format!("{SCENARIO}: the run has waited past the dispatch grace"),
        secs(10),
        &format!(
            "SELECT available_at <= now() - interval '1 second' FROM runs WHERE id = '{run}'::uuid"
        ),
    )
    .await;
    let reaper = site
        .install
        .command("countersign-reaper")
        .args(["--dispatch-grace-secs", "1"])
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&reaper.stdout);
    assert!(
        reaper.status.success(),
        "{SCENARIO}: the reaper pass: {}",
        String::from_utf8_lossy(&reaper.stderr)
    );
    assert!(
        summary.contains("redispatched=1"),
        "{SCENARIO}: the lost dispatch is published again: {summary}"
    );
    site.start_worker(&only_deliveries);
    wait_for_status(&mut site.conn, &run, "completed", secs(30)).await;

    assert_turn_written_once(SCENARIO, &mut site.conn, &site.model, &run, page).await;
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (&row["lease_epoch"], &row["requeue_count"]),
        (&json!(2), &json!(0)),
        "{SCENARIO}: one claim for the start, one for the resume: {row}"
    );
    drop((replies, broker));
    site.finish().await;
}
