//! RabbitMQ restarted while an approved turn is held inside its transaction.

use std::time::Instant;

use countersign_e2e::{
    hold_gate, install_gate, release_gate, remove_gate, secs, start_broker, stop_broker,
    wait_for_card, wait_for_other_tests, wait_for_sql, wait_for_status, wait_until,
    waiting_at_gate, waiting_in_transaction, ServicesRestored,
};
use uuid::Uuid;

use crate::support::{
    assert_turn_written_once, exclusive, fault_page, Site, TURN_FENCE, TURN_GATE, TURN_GATE_WHEN,
};

const SCENARIO: &str = "broker restarted mid-run";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_restarted_while_an_approved_turn_is_in_flight_the_run_completes_once_and_the_events_committed_meanwhile_are_published_after_it_returns(
) {
    let _exclusive = exclusive().await;
    let _restored = ServicesRestored;
    let mut site = Site::new("restart_broker", 2).await;
    site.start_coordinator();
    // No polling: after the restart, the worker claims only what a delivery wakes it for.
    site.start_worker(&["--poll-interval-secs", "3600"]);
    let (page, later_page) = (fault_page(1), fault_page(2));
    let run = site.submit(page);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;
    let digest = site.digest(&run).await;

    wait_for_other_tests(secs(300)).await;
    install_gate(
        &mut site.conn,
        "turn",
        "runs",
        "UPDATE",
        TURN_GATE_WHEN,
        TURN_GATE,
    )
    .await;
    hold_gate(&mut site.conn, TURN_GATE).await;
    site.approve_through_queue(&run, 1, &digest).await;
    wait_until(
        &format!("{SCENARIO}: the turn transaction waits at the gate"),
        secs(30),
        async || {
            (waiting_in_transaction(&mut site.conn, TURN_FENCE).await == 1
                && waiting_at_gate(&mut site.conn, TURN_GATE).await >= 1)
                .then_some(())
        },
    )
    .await;
    // Everything announced so far has left, so what follows was committed with the broker down.
    let unpublished = format!(
        "SELECT NOT EXISTS (SELECT 1 FROM event_outbox
                            WHERE run_id = '{run}'::uuid AND published_at IS NULL)"
    );
    wait_for_sql(
        &mut site.conn,
        &format!("{SCENARIO}: the events before the outage are published"),
        secs(30),
        &unpublished,
    )
    .await;
    let before: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM event_outbox WHERE run_id = $1::uuid")
            .bind(&run)
            .fetch_all(&mut site.conn)
            .await
            .unwrap();

    // The broker goes; the turn goes on and the run completes while it is away.
    let outage = Instant::now();
    stop_broker();
    release_gate(&mut site.conn, TURN_GATE).await;
    wait_for_status(&mut site.conn, &run, "completed", secs(30)).await;
    // A relay deletes a row once the broker confirmed it: the rows left are the unsent ones.
    let meanwhile: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT id, kind FROM event_outbox
         WHERE run_id = $1::uuid AND published_at IS NULL AND NOT id = ANY($2)
         ORDER BY created_at, id",
    )
    .bind(&run)
    .bind(&before)
    .fetch_all(&mut site.conn)
    .await
    .unwrap();
    start_broker();
    let outage = outage.elapsed();
    eprintln!("{SCENARIO}: the broker was down for {outage:?}");
    assert!(
        meanwhile.iter().any(|(_, kind)| kind == "run.completed"),
        "{SCENARIO}: run.completed was committed, and not sent, while the broker was down: \
         {meanwhile:?}"
    );

    // The outbox publishes them once the broker is back.
    wait_for_sql(
        &mut site.conn,
        &format!("{SCENARIO}: the events committed during the outage are published after it"),
        secs(45),
        &unpublished,
    )
    .await;
    remove_gate(&mut site.conn, "turn", "runs").await;
    assert_turn_written_once(SCENARIO, &mut site.conn, &site.model, &run, page).await;

    // The services reconnected: a run requested now is taken by the coordinator, woken in the
    // worker by a delivery (it does not poll), approved through the queue, and written once.
    let later = site.submit(later_page);
    wait_for_card(&mut site.conn, &later, 1, secs(45)).await;
    site.decide(&later).await;
    wait_for_status(&mut site.conn, &later, "completed", secs(30)).await;
    assert_turn_written_once(
        &format!("{SCENARIO} (the run after it)"),
        &mut site.conn,
        &site.model,
        &later,
        later_page,
    )
    .await;
    site.finish().await;
}
