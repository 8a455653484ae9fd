//! PostgreSQL restarted while an approved turn is held inside its transaction.

use std::time::Instant;

use countersign_e2e::{
    hold_gate, install_gate, remove_gate, restart_postgres, run_row, secs, wait_for_card,
    wait_for_other_tests, wait_for_status, wait_until, waiting_at_gate, waiting_in_transaction,
    ServicesRestored,
};
use serde_json::json;

use crate::support::{
    assert_turn_written_once, exclusive, fault_page, Site, TURN_FENCE, TURN_GATE, TURN_GATE_WHEN,
};

const SCENARIO: &str = "PostgreSQL restarted mid-segment";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_restarted_inside_an_approved_turn_the_run_completes_with_every_write_once_and_no_infrastructure_error_told_to_the_model(
) {
    let _exclusive = exclusive().await;
    let _restored = ServicesRestored;
    let mut site = Site::new("restart_postgres", 1).await;
    site.start_coordinator();
    site.start_worker(&["--poll-interval-secs", "1"]);
    let page = fault_page(1);
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
    let held = run_row(&mut site.conn, &run).await;

    // Every connection dies with the cluster, the gate's with them: the turn transaction rolls
    // back and the gate is open when the server is back.
    let outage = Instant::now();
    restart_postgres();
    eprintln!(
        "{SCENARIO}: PostgreSQL was restarted in {:?}",
        outage.elapsed()
    );
    site.reconnect().await;
    wait_for_status(&mut site.conn, &run, "completed", secs(45)).await;
    remove_gate(&mut site.conn, "turn", "runs").await;

    let epoch = assert_turn_written_once(SCENARIO, &mut site.conn, &site.model, &run, page).await;
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (json!(epoch), &row["lease_epoch"], &row["requeue_count"]),
        (held["lease_epoch"].clone(), &held["lease_epoch"], &json!(0)),
        "{SCENARIO}: written by the resume's own lease, retried in place, not rescued by the reaper: {row}"
    );
    site.finish().await;
}
