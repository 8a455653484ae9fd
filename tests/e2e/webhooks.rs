//! Approvers hear of cards through signed webhooks: an endpoint added with `countersign webhooks
//! add` receives the events it names from the coordinator, verified by the Standard Webhooks
//! reference library (`standardwebhooks`, from PyPI, in `tests/e2e/webhook_receiver.py`),
//! retried after a 500, deduplicable by `webhook-id`, carrying ids, codes and the card's link
//! and none of the run's content; `webhooks deliveries` shows each attempt. An `https://`
//! receiver under an internal certificate authority is refused at the handshake until the
//! coordinator trusts that CA (`--webhooks-ca-file`).

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
    start_receiver_with(secret, port, log, &[]).await
}

/// [`start_receiver`] with more arguments: a certificate and its key serve HTTPS.
async fn start_receiver_with(secret: &str, port: u16, log: &Path, tls: &[PathBuf]) -> Receiver {
    let child = Command::new(verifier_python())
        .arg(workspace_file("tests/e2e/webhook_receiver.py"))
        .args([secret, &port.to_string(), &log.to_string_lossy()])
        .args(tls)
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

/// A database of its own named `name`, an installation on it with the demo agent, and a
/// directory for the receiver's log.
async fn site(name: &str) -> (Database, Installation, TempDir) {
    let db = Database::create(name).await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    (db, install, TempDir::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_webhook_is_verified_retried_after_a_500_deduplicable_and_carries_no_content() {
    let (db, install, dir) = site("webhooks").await;
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

/// The test certificate authority and the certificate it signed for `localhost` and
/// `127.0.0.1` (`crates/remote/tests/it/tls/make-certificates.sh`).
fn test_certificates() -> (PathBuf, PathBuf, PathBuf) {
    let dir = workspace_file("crates/remote/tests/it/tls");
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_receiver_under_an_internal_ca_is_refused_at_the_handshake_until_the_coordinator_trusts_that_ca(
) {
    let (db, install, dir) = site("webhooks_tls").await;
    let log = dir.0.join("received.jsonl");
    let (ca, certificate, key) = test_certificates();

    // A CA file that holds no certificate stops the coordinator before it starts anything.
    let not_pem = dir.0.join("not-a-ca.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let refused = install
        .command("countersign-coordinator")
        .arg("--webhooks-ca-file")
        .arg(&not_pem)
        .output()
        .expect("countersign-coordinator starts");
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("ca_file_unusable"), "{said}");

    let port = free_port();
    let url = format!("https://localhost:{port}/countersign");
    let secret = install
        .countersign_ok(&["webhooks", "add", &url, "--events", "run.suspended"])
        .trim()
        .to_owned();
    let _receiver = start_receiver_with(&secret, port, &log, &[certificate, key]).await;

    // Trusting the public roots only, the coordinator refuses the receiver's certificate: each
    // attempt is recorded `tls_failed`, and nothing reaches the receiver.
    let script = demo_script();
    let mut coordinator = install.spawn("countersign-coordinator", &["--webhook-retry-secs", "1"]);
    let _worker = install.spawn("countersign-worker", &["--model-script", &script]);
    let run_id = install.submit("seo-assistant", "editor", "Improve page 12.");
    let mut conn = db.connect().await;
    wait_for_status(&mut conn, &run_id, "waiting_for_approval", secs(60)).await;
    let shown = wait_until(
        "an attempt refused at the handshake",
        Duration::from_secs(60),
        async || {
            let shown = install.countersign_ok(&["webhooks", "deliveries", &url]);
            shown.contains("last tls_failed").then_some(shown)
        },
    )
    .await;
    assert!(!shown.contains("delivered"), "{shown}");
    assert!(received(&log).is_empty(), "{:#?}", received(&log));
    coordinator.terminate(secs(30)).await.unwrap();

    // Given the CA, the same delivery goes through: the receiver's 500, then its 204.
    let _coordinator = install.spawn(
        "countersign-coordinator",
        &[
            "--webhook-retry-secs",
            "1",
            "--webhooks-ca-file",
            &ca.to_string_lossy(),
        ],
    );
    let entries = wait_until(
        "the delivery over HTTPS",
        Duration::from_secs(120),
        async || {
            let entries = received(&log);
            entries
                .iter()
                .any(|e| e["status"] == 204)
                .then_some(entries)
        },
    )
    .await;
    assert!(
        entries.iter().all(|e| e["verified"] == true),
        "{entries:#?}"
    );
    let body: Value = serde_json::from_str(entries[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["event"], "run.suspended");
    assert_eq!(body["run_id"], run_id.as_str());
    let shown = install.countersign_ok(&["webhooks", "deliveries", &url]);
    assert!(
        shown.contains("HTTP 204") && shown.trim_end().ends_with("delivered"),
        "{shown}"
    );

    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
