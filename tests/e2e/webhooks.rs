//! Approvers hear of cards through signed webhooks: an endpoint added with `countersign webhooks
//! add` receives the events it names from the coordinator, verified by the Standard Webhooks
//! reference library (`standardwebhooks`, from PyPI, in `tests/e2e/webhook_receiver.py`),
//! retried after a 500, deduplicable by `webhook-id`, carrying ids, codes and the card's link
//! and none of the run's content; `webhooks deliveries` shows each attempt.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use countersign_e2e::{
    demo_agent, demo_script, free_port, secs, turn_digest, wait_for_status, wait_until,
    workspace_file, Database, Installation, TempDir,
};
use serde_json::Value;
use uuid::Uuid;

/// The receiver's Python, with the pinned `standardwebhooks` (scripts/webhook-verifier.sh).
fn verifier_python() -> PathBuf {
    let python = workspace_file("target/webhook-verifier/bin/python");
    if !python.exists() {
        let installed = Command::new(workspace_file("scripts/webhook-verifier.sh"))
            .status()
            .expect("scripts/webhook-verifier.sh runs");
        assert!(
            installed.success(),
            "the webhook verifier could not be installed"
        );
    }
    python
}

/// The receiver process, killed when dropped.
struct Receiver(Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the receiver with `secret` on `port`; returns once it listens.
async fn start_receiver(secret: &str, port: u16, log: &Path) -> Receiver {
    let child = Command::new(verifier_python())
        .arg(workspace_file("tests/e2e/webhook_receiver.py"))
        .args([secret, &port.to_string(), &log.to_string_lossy()])
        .stdout(Stdio::null())
        .spawn()
        .expect("the receiver starts");
    let receiver = Receiver(child);
    let ready = log.with_extension("jsonl.ready");
    wait_until(
        "the receiver to listen",
        Duration::from_secs(30),
        async || ready.exists().then_some(()),
    )
    .await;
    receiver
}

/// The receiver's log: one entry per request it answered.
fn received(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_webhook_is_verified_retried_after_a_500_deduplicable_and_carries_no_content() {
    let db = Database::create("webhooks").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    let dir = TempDir::new();
    let log = dir.0.join("received.jsonl");

    let refused = install.countersign(&[
        "webhooks",
        "add",
        "http://127.0.0.1:9/x",
        "--events",
        "run.nothing",
    ]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unknown_event"));
    // The secret is shown once, when the endpoint is added; the receiver starts with it.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/countersign");
    let secret = install
        .countersign_ok(&[
            "webhooks",
            "add",
            &url,
            "--events",
            "run.suspended,run.completed",
            "--agent",
            "seo-assistant",
        ])
        .trim()
        .to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let _receiver = start_receiver(&secret, port, &log).await;
    let listed = install.countersign_ok(&["webhooks", "list"]);
    assert!(
        listed.contains(&url) && !listed.contains("whsec_"),
        "{listed}"
    );

    let script = demo_script();
    let _coordinator = install.spawn(
        "countersign-coordinator",
        &[
            "--webhook-retry-secs",
            "1",
            "--inbox-url",
            "https://countersign.example/inbox",
        ],
    );
    let _worker = install.spawn("countersign-worker", &["--model-script", &script]);
    let run_id = install.submit("seo-assistant", "editor", "Improve page 12.");
    let mut conn = db.connect().await;
    wait_for_status(&mut conn, &run_id, "waiting_for_approval", secs(60)).await;
    let digest = turn_digest(&mut conn, &run_id).await;
    let approved = install.approve_card(&run_id, 1, &digest, "approver");
    assert!(approved.status.success(), "{approved:?}");
    wait_for_status(&mut conn, &run_id, "completed", secs(60)).await;

    // Each event twice: a 500, then the retry the receiver takes.
    let entries = wait_until(
        "both deliveries, retried",
        Duration::from_secs(60),
        async || {
            let entries = received(&log);
            let taken = entries.iter().filter(|e| e["status"] == 204).count();
            (taken >= 2).then_some(entries)
        },
    )
    .await;
    assert!(
        entries.iter().all(|e| e["verified"] == true),
        "{entries:#?}"
    );
    let mut by_id: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for e in &entries {
        by_id
            .entry(e["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(e);
    }
    assert_eq!(by_id.len(), 2, "one webhook-id per event: {entries:#?}");
    let mut kinds = BTreeSet::new();
    for (id, attempts) in &by_id {
        let statuses: Vec<&Value> = attempts.iter().map(|e| &e["status"]).collect();
        assert_eq!(statuses, [500, 204], "{id}: {attempts:#?}");
        let bodies: BTreeSet<&str> = attempts
            .iter()
            .map(|e| e["body"].as_str().unwrap())
            .collect();
        let body: Value = serde_json::from_str(bodies.iter().next().unwrap()).unwrap();
        assert_eq!(body["event_id"], id.as_str(), "webhook-id is the event id");
        assert_eq!(body["run_id"], run_id.as_str());
        assert_eq!(
            body["inbox_url"],
            format!("https://countersign.example/inbox/runs/{run_id}")
        );
        kinds.insert(body["event"].as_str().unwrap().to_owned());
        for content in [
            "Improve page 12",
            "Bicycles for every road",
            "red city bicycle",
        ] {
            for b in &bodies {
                assert!(!b.contains(content), "{content:?} in {b}");
            }
        }
    }
    assert_eq!(
        kinds,
        BTreeSet::from(["run.completed".to_owned(), "run.suspended".to_owned()])
    );

    let shown = install.countersign_ok(&["webhooks", "deliveries", &url]);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "{shown}");
    for line in lines {
        assert!(
            line.contains("attempts 2") && line.contains("HTTP 204"),
            "{line}"
        );
        assert!(line.ends_with("delivered"), "{line}");
    }

    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
