//! Two coordinators consuming the same queues, with duplicated run requests and decisions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use countersign_e2e::{
    consumers, count, counter_total, free_port, http_get, run_row, secs, wait_for_sql, wait_until,
};
use countersign_queue::{Broker, Consumer, MessageProperties};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::{assert_turn_written_once, exclusive, fault_page, Site};
use countersign_e2e::fault_page_prompt;

const SCENARIO: &str = "two coordinators on the same queues";
const RUNS: i64 = 20;
/// The run requests sent twice (same `request_id`), and the runs whose approval is sent twice
/// (same `decision_id`); each second copy right behind the first, so that the two copies are
/// likely taken by different coordinators at the same time.
const DUPLICATED_REQUESTS: [i64; 5] = [3, 7, 11, 15, 19];
const DUPLICATED_DECISIONS: [i64; 6] = [2, 5, 8, 13, 17, 20];
/// The events each run must be announced by once, whichever coordinator took its messages.
const ANNOUNCED_ONCE: [&str; 2] = ["run.accepted", "decision.accepted"];

/// Publishes `body` to `queue` as `guest`, the reply to go to `reply_to` under `correlation`.
async fn send(broker: &Broker, queue: &str, body: &Value, reply_to: &str, correlation: String) {
    broker
        .publish_message(
            queue,
            body.to_string().as_bytes(),
            &MessageProperties {
                user_id: Some("guest".to_owned()),
                reply_to: Some(reply_to.to_owned()),
                correlation_id: Some(correlation),
            },
        )
        .await
        .expect("the message is published");
}

/// The next `n` replies, by correlation id; fails the test after `within`.
async fn replies(
    consumer: &mut Consumer,
    n: usize,
    within: Duration,
    what: &str,
) -> BTreeMap<String, Value> {
    let started = Instant::now();
    let mut got = BTreeMap::new();
    while got.len() < n {
        let left = within.saturating_sub(started.elapsed());
        let delivery = tokio::time::timeout(left, consumer.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{SCENARIO}: {} of {n} replies to {what} within {within:?}: {got:?}",
                    got.len()
                )
            })
            .expect("the reply consumer is open")
            .expect("a delivery");
        let reply: Value = serde_json::from_slice(&delivery.body).unwrap();
        let correlation = delivery.correlation_id.clone().unwrap_or_default();
        delivery.ack().await.unwrap();
        let earlier = got.insert(correlation.clone(), reply);
        assert!(
            earlier.is_none(),
            "{SCENARIO}: a second reply to {correlation}"
        );
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_coordinators_on_the_same_queues_create_each_run_once_record_each_decision_once_answer_duplicates_as_replays_and_write_each_turn_once(
) {
    let _exclusive = exclusive().await;
    let mut site = Site::new("restart_two_coordinators", RUNS).await;
    let ports = [free_port(), free_port()];
    for port in ports {
        let http = format!("127.0.0.1:{port}");
        let coordinator = site
            .install
            .spawn("countersign-coordinator", &["--http-addr", &http]);
        site.services.push(coordinator);
    }
    site.start_worker(&["--poll-interval-secs", "1"]);
    site.start_worker(&["--poll-interval-secs", "1"]);
    let broker = site.install.broker().await;
    let run_requests = broker.topology().run_requests();
    let decisions_queue = broker.topology().decisions();
    wait_until(
        &format!("{SCENARIO}: both coordinators consume both public queues"),
        secs(30),
        async || {
            (consumers(&run_requests) == Some(2) && consumers(&decisions_queue) == Some(2))
                .then_some(())
        },
    )
    .await;
    let reply_to = broker.declare_private_queue().await.unwrap();
    let mut consumer = broker.consume(&reply_to, 50).await.unwrap();
    // What the coordinators announce, as a consumer of the events sees it.
    let watch = broker.declare_private_queue().await.unwrap();
    for kind in ANNOUNCED_ONCE {
        broker.bind_events(&watch, kind).await.unwrap();
    }
    let mut events = broker.consume(&watch, 200).await.unwrap();

    // Twenty run requests, five of them twice.
    let requests: Vec<Uuid> = (1..=RUNS).map(|_| Uuid::now_v7()).collect();
    for (n, request_id) in (1..=RUNS).zip(&requests) {
        let body = json!({
            "type": "countersign.run_request", "version": 1,
            "request_id": request_id, "agent": "seo-assistant", "acting_user": "editor",
            "prompt": fault_page_prompt(fault_page(n)),
        });
        let copies = if DUPLICATED_REQUESTS.contains(&n) {
            2
        } else {
            1
        };
        for copy in 1..=copies {
            send(
                &broker,
                &run_requests,
                &body,
                &reply_to,
                format!("request {n} copy {copy}"),
            )
            .await;
        }
    }
    let expected = RUNS as usize + DUPLICATED_REQUESTS.len();
    let answered = replies(&mut consumer, expected, secs(30), "the run requests").await;
    let mut runs: Vec<String> = Vec::new();
    for n in 1..=RUNS {
        let first = &answered[&format!("request {n} copy 1")];
        assert_eq!(
            (&first["event"], &first["request_id"]),
            (&json!("run.accepted"), &json!(requests[n as usize - 1])),
            "{SCENARIO}: request {n}: {first}"
        );
        let run_id = first["run_id"].as_str().expect("a run id").to_owned();
        if DUPLICATED_REQUESTS.contains(&n) {
            let second = &answered[&format!("request {n} copy 2")];
            assert_eq!(
                (&second["event"], &second["run_id"]),
                (&json!("run.accepted"), &json!(run_id)),
                "{SCENARIO}: the duplicate of request {n} is answered with the same run: {second}"
            );
        }
        runs.push(run_id);
    }
    let created = count(&mut site.conn, "SELECT count(*) FROM runs").await;
    assert_eq!(created, RUNS, "{SCENARIO}: one run per request id");

    wait_for_sql(
        &mut site.conn,
        &format!("{SCENARIO}: every run waits on card 1"),
        secs(45),
        &format!(
            "SELECT count(*) = {RUNS} FROM runs
             WHERE status = 'waiting_for_approval' AND suspension_seq = 1"
        ),
    )
    .await;

    // Twenty approvals, six of them twice.
    let mut decision_ids = Vec::new();
    for (n, run) in (1..=RUNS).zip(&runs) {
        let decision_id = Uuid::now_v7();
        decision_ids.push(decision_id);
        let digest = site.digest(run).await;
        let body = json!({
            "type": "countersign.decision", "version": 1,
            "decision_id": decision_id, "run_id": run,
            "suspension_seq": 1, "turn_digest": digest,
            "approved": true, "approver": "admin",
        });
        let copies = if DUPLICATED_DECISIONS.contains(&n) {
            2
        } else {
            1
        };
        for copy in 1..=copies {
            send(
                &broker,
                &decisions_queue,
                &body,
                &reply_to,
                format!("decision {n} copy {copy}"),
            )
            .await;
        }
    }
    let expected = RUNS as usize + DUPLICATED_DECISIONS.len();
    let answered = replies(&mut consumer, expected, secs(45), "the decisions").await;
    for (n, decision_id) in (1..=RUNS).zip(&decision_ids) {
        let copies = if DUPLICATED_DECISIONS.contains(&n) {
            2
        } else {
            1
        };
        for copy in 1..=copies {
            let reply = &answered[&format!("decision {n} copy {copy}")];
            assert_eq!(
                (&reply["event"], &reply["outcome"], &reply["decision_id"]),
                (
                    &json!("decision.accepted"),
                    &json!("accepted"),
                    &json!(decision_id)
                ),
                "{SCENARIO}: decision {n} copy {copy} is answered accepted (a duplicate as the \
                 replay of the recorded outcome, not as not_awaiting_approval): {reply}"
            );
        }
    }

    // Both coordinators took their share of both queues.
    let mut handled = Vec::new();
    for port in ports {
        let (status, metrics) =
            http_get(port, "/metrics").expect("the coordinator serves /metrics");
        assert!(status.contains("200"), "{SCENARIO}: {status}");
        handled.push((
            counter_total(&metrics, "countersign_run_requests_total"),
            counter_total(&metrics, "countersign_decisions_total"),
        ));
    }
    eprintln!("{SCENARIO}: (run requests, decisions) handled by each coordinator: {handled:?}");
    let sent = (
        (RUNS as usize + DUPLICATED_REQUESTS.len()) as f64,
        (RUNS as usize + DUPLICATED_DECISIONS.len()) as f64,
    );
    assert_eq!(
        (handled[0].0 + handled[1].0, handled[0].1 + handled[1].1),
        sent,
        "{SCENARIO}: every message was gated once: {handled:?}"
    );
    assert!(
        handled
            .iter()
            .all(|(requests, decisions)| *requests > 0.0 && *decisions > 0.0),
        "{SCENARIO}: both coordinators consumed both queues: {handled:?}"
    );

    wait_for_sql(
        &mut site.conn,
        &format!("{SCENARIO}: every run completed"),
        secs(45),
        &format!("SELECT count(*) = {RUNS} FROM runs WHERE status = 'completed'"),
    )
    .await;

    // Each decision recorded once, each announced once; each run claimed once per segment.
    let recorded: Vec<(Uuid, String, String)> = sqlx::query_as(
        "SELECT decision_id, run_id::text, outcome FROM run_decisions ORDER BY decision_id",
    )
    .fetch_all(&mut site.conn)
    .await
    .unwrap();
    let mut expected: Vec<(Uuid, String, String)> = decision_ids
        .iter()
        .zip(&runs)
        .map(|(d, r)| (*d, r.clone(), "accepted".to_owned()))
        .collect();
    expected.sort();
    assert_eq!(
        recorded, expected,
        "{SCENARIO}: each decision is recorded once, accepted"
    );
    wait_for_sql(
        &mut site.conn,
        &format!("{SCENARIO}: every event sent"),
        secs(30),
        "SELECT count(*) = 0 FROM event_outbox WHERE published_at IS NULL",
    )
    .await;
    // Delivery is at least once: a copy carries the event id of the one it copies.
    let mut announced: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    while let Ok(Some(Ok(delivery))) = tokio::time::timeout(secs(2), events.next()).await {
        let event: Value = serde_json::from_slice(&delivery.body).unwrap();
        announced
            .entry(event["event"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .insert(event["event_id"].as_str().unwrap_or_default().to_owned());
        delivery.ack().await.unwrap();
    }
    for kind in ANNOUNCED_ONCE {
        let distinct = announced.get(kind).map_or(0, |ids| ids.len());
        assert_eq!(
            distinct as i64, RUNS,
            "{SCENARIO}: {kind} announced once per run"
        );
    }
    let audited = count(
        &mut site.conn,
        "SELECT count(*) FROM run_events WHERE kind = 'decision.accepted'",
    )
    .await;
    assert_eq!(
        audited, RUNS,
        "{SCENARIO}: one decision audit event per run"
    );
    for (n, run) in (1..=RUNS).zip(&runs) {
        assert_turn_written_once(SCENARIO, &mut site.conn, &site.model, run, fault_page(n)).await;
        let row = run_row(&mut site.conn, run).await;
        assert_eq!(
            (&row["lease_epoch"], &row["requeue_count"]),
            (&json!(2), &json!(0)),
            "{SCENARIO}: run {n} was claimed once for its start and once for its resume: {row}"
        );
    }
    drop((consumer, events, broker));
    site.finish().await;
}
