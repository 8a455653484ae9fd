//! The coordinator, the worker and the reaper as an operator runs them: configured with the
//! `countersign` command, fed through RabbitMQ, observed through events, HTTP and the
//! database.

use std::time::Duration;

use countersign_e2e::{
    amqp_addr, demo_agent, demo_script, free_port, http_get, Database, Installation,
};
use countersign_queue::{Broker, Consumer, MessageProperties, QueueConfig, Topology};
use serde_json::Value;
use uuid::Uuid;

const PROMPT: &str = "Tighten the description of page 12 and add bicycle.png to its teaser.";
const TEASER_IMAGES: &str =
    "SELECT count(*) FROM content.file_references WHERE element = 5 AND field = 'image' AND NOT deleted";

/// Waits for the next event named `name` about `run_id`, skipping others.
async fn next_event(events: &mut Consumer, name: &str, run_id: &str) -> Value {
    loop {
        let delivery = tokio::time::timeout(Duration::from_secs(60), events.next())
            .await
            .unwrap_or_else(|_| panic!("no {name} event within 60 s"))
            .expect("the event consumer is open")
            .expect("a delivery");
        let event: Value = serde_json::from_slice(&delivery.body).unwrap();
        delivery.ack().await.unwrap();
        if event["event"] == name && event["run_id"] == run_id {
            return event;
        }
    }
}

/// The first answer on `port`; within a minute, as the whole suite shares two cores.
async fn wait_http(port: u16, path: &str) -> (String, String) {
    for _ in 0..600 {
        if let Some(answer) = http_get(port, path) {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing answered on port {port} within 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_requested_through_the_queue_is_approved_through_the_queue_and_writes() {
    let db = Database::create("services").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };

    // Configure the installation the way an operator does.
    install.configure(&demo_agent());

    let broker = Broker::connect(QueueConfig::new(
        amqp_addr(),
        Topology::new(&install.queue_prefix),
    ))
    .await
    .unwrap();
    let watch = broker.declare_private_queue().await.unwrap();
    broker.bind_events(&watch, "#").await.unwrap();
    let mut events = broker.consume(&watch, 50).await.unwrap();

    let coordinator_port = free_port();
    let worker_port = free_port();
    let script = demo_script();
    let coordinator = install.spawn(
        "countersign-coordinator",
        &["--http-addr", &format!("127.0.0.1:{coordinator_port}")],
    );
    let worker = install.spawn(
        "countersign-worker",
        &[
            "--model-script",
            &script,
            "--http-addr",
            &format!("127.0.0.1:{worker_port}"),
            "--poll-interval-secs",
            "1",
        ],
    );
    let (status, _) = wait_http(worker_port, "/healthz").await;
    assert!(status.contains("200"), "{status}");
    let (status, _) = wait_http(coordinator_port, "/readyz").await;
    assert!(status.contains("200"), "{status}");

    // A run request through the queue; the coordinator answers on the reply queue.
    let submitted = install.countersign_ok(&[
        "submit",
        "--agent",
        "seo-assistant",
        "--as",
        "editor",
        PROMPT,
    ]);
    let run_id = submitted
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no run id in {submitted:?}"))
        .to_owned();
    next_event(&mut events, "run.accepted", &run_id).await;
    let suspended = next_event(&mut events, "run.suspended", &run_id).await;
    assert_eq!(suspended["suspension_seq"], 1);
    assert!(suspended.get("prompt").is_none() && suspended.get("arguments").is_none());

    // The card, as an admin sees it; nothing is written yet.
    let inbox = install.countersign_ok(&["inbox", "--as", "admin"]);
    assert!(inbox.contains(&run_id), "{inbox}");
    let (seq, digest) = crate::cards::printed_card(&inbox, &run_id);
    assert!(
        inbox.contains("field image: 2 reference(s) → 3, appended last"),
        "{inbox}"
    );
    let mut conn = db.connect().await;
    let before: i64 = sqlx::query_scalar(TEASER_IMAGES)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(before, 2);

    // Four eyes: the run's own acting user may not approve it.
    let own = install.countersign(&[
        "decide",
        &run_id,
        "--seq",
        &seq,
        "--digest",
        &digest,
        "--as",
        "editor",
        "--approve",
    ]);
    assert!(!own.status.success());
    assert!(String::from_utf8_lossy(&own.stderr).contains("self_approval_denied"));
    let refused = next_event(&mut events, "decision.refused", &run_id).await;
    assert_eq!(refused["outcome"], "self_approval_denied");

    // An approver holding agent_approve releases the turn; the worker writes and completes.
    let card = std::env::temp_dir().join(format!("countersign-e2e-{run_id}-approver.json"));
    let card = card.to_str().unwrap();
    install.countersign_ok(&["inbox", "--as", "approver", "--save", card]);
    install.countersign_ok(&[
        "decide",
        &run_id,
        "--card",
        card,
        "--as",
        "approver",
        "--approve",
    ]);
    let _ = std::fs::remove_file(card);
    next_event(&mut events, "decision.accepted", &run_id).await;
    let completed = next_event(&mut events, "run.completed", &run_id).await;
    assert_eq!(completed["termination_reason"], "completed");
    let after: i64 = sqlx::query_scalar(TEASER_IMAGES)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(after, 3);
    let description: String =
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(
        description.starts_with("Bicycles for every road"),
        "{description}"
    );

    let (_, metrics) = wait_http(worker_port, "/metrics").await;
    assert!(
        metrics.contains("countersign_runs_total{status=\"completed\",reason=\"completed\"} 1"),
        "{metrics}"
    );
    let (_, metrics) = wait_http(coordinator_port, "/metrics").await;
    assert!(
        metrics.contains("countersign_decisions_total{outcome=\"self_approval_denied\"} 1"),
        "{metrics}"
    );

    // A malformed message is dead-lettered with its reason, not dropped.
    let mut dead = broker
        .consume(&broker.topology().dead_letters(), 10)
        .await
        .unwrap();
    let properties = MessageProperties {
        user_id: Some("guest".into()),
        ..MessageProperties::default()
    };
    broker
        .publish_message(
            &broker.topology().decisions(),
            br#"{"type":"countersign.decision","version":1}"#,
            &properties,
        )
        .await
        .unwrap();
    let poison = tokio::time::timeout(Duration::from_secs(30), dead.next())
        .await
        .expect("the malformed decision reaches dead-letters")
        .unwrap()
        .unwrap();
    assert_eq!(
        poison.dead_letter_reason().as_deref(),
        Some("missing_field:run_id")
    );
    poison.ack().await.unwrap();

    // The reaper finds nothing to repair and says so.
    let reaper = install.command("countersign-reaper").output().unwrap();
    assert!(
        reaper.status.success(),
        "{}",
        String::from_utf8_lossy(&reaper.stderr)
    );
    assert!(String::from_utf8_lossy(&reaper.stdout).starts_with("reaper pass: requeued=0"));

    drop(conn);
    // The services stop first: one still running would declare the topology again.
    drop((coordinator, worker));
    broker.delete_topology().await.unwrap();
    db.remove().await.unwrap();
}

#[test]
fn the_reaper_exits_non_zero_when_postgres_cannot_be_reached() {
    let install = Installation {
        database_url: "postgres://postgres@127.0.0.1:1/none".into(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let out = install.command("countersign-reaper").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PostgreSQL unreachable"));
}

/// The API binds its listener before anything reports ready: with its address taken it exits
/// non-zero, and its `/readyz` address never took a connection — an orchestrator never routes to an API that
/// cannot serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_never_ready_when_its_address_is_taken() {
    let db = Database::create("api_taken").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.countersign_ok(&["migrate", "--with-content"]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let http = free_port();
    let mut api = install.spawn(
        "countersign-api",
        &[
            "--listen",
            &listen,
            "--http-addr",
            &format!("127.0.0.1:{http}"),
        ],
    );
    // Asked as often as a connection allows: the window to catch is the start-up's.
    let mut answered = false;
    let status = loop {
        answered |= std::net::TcpStream::connect(("127.0.0.1", http)).is_ok();
        if let Some(status) = api.exited() {
            break status;
        }
    };
    assert!(!status.success(), "{status:?}");
    assert!(!answered, "/readyz answered before the API could listen");
    drop(taken);
    db.remove().await.unwrap();
}
