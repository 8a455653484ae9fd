//! What an operator does to a run from the command line: look at it, cancel it.

use std::time::Duration;

use countersign_e2e::{demo_agent, demo_script, Installation};
use uuid::Uuid;

use countersign_e2e::Database;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiting_run_refuses_every_later_decision() {
    let db = Database::create("operator").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    let script = demo_script();
    let _coordinator = install.spawn("countersign-coordinator", &[]);
    let _worker = install.spawn("countersign-worker", &["--model-script", &script]);

    let submitted = install.countersign_ok(&[
        "submit",
        "--agent",
        "seo-assistant",
        "--as",
        "editor",
        "Improve page 12.",
    ]);
    let run_id = submitted
        .split_whitespace()
        .nth(1)
        .expect("a run id")
        .to_owned();
    let mut shown = String::new();
    for _ in 0..300 {
        shown = install.countersign_ok(&["show", &run_id]);
        if shown.contains("status waiting_for_approval") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(shown.contains("status waiting_for_approval"), "{shown}");
    assert!(shown.contains("suspension 1"), "{shown}");
    let digest = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("suspension 1 · turn "))
        .unwrap_or_else(|| panic!("no turn digest in {shown}"))
        .to_owned();
    assert!(shown.contains("run.suspended"), "{shown}");
    assert!(
        !shown.contains("Improve page 12."),
        "the prompt is content and is not shown: {shown}"
    );

    assert!(install
        .countersign_ok(&["cancel", &run_id])
        .contains("cancelled"));
    let shown = install.countersign_ok(&["show", &run_id]);
    assert!(shown.contains("status cancelled"), "{shown}");
    assert!(shown.contains("termination cancelled"), "{shown}");
    assert!(shown.contains("run.cancelled"), "{shown}");

    // The card `show` printed before the cancel.
    let late = install.approve_card(&run_id, 1, &digest, "approver");
    assert!(!late.status.success());
    assert!(String::from_utf8_lossy(&late.stderr).contains("not_awaiting_approval"));
    let again = install.countersign(&["cancel", &run_id]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already ended"));

    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
