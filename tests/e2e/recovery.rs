//! A worker that dies holding a lease: the reaper hands its run to another worker.

use std::net::TcpListener;
use std::time::Duration;

use countersign_e2e::{demo_script, Installation};
use serde_json::json;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use countersign_e2e::Database;

/// A model endpoint that accepts connections and never answers: a segment calling it holds
/// its lease until its worker dies.
fn silent_endpoint() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

fn agent_file(dir: &std::path::Path, name: &str, model: serde_json::Value) -> String {
    let path = dir.join(name);
    let agent = json!({
        "name": "seo-assistant",
        "model": model,
        "policy": {"enabled_tools": ["update_page_metadata", "attach_file_to_content_element"]},
        "max_iterations": 8,
        "approval_deadline_secs": 3600
    });
    std::fs::write(&path, agent.to_string()).unwrap();
    path.to_str().unwrap().to_owned()
}

async fn run_row(conn: &mut PgConnection) -> (String, i32, i64, bool) {
    sqlx::query_as(
        "SELECT status, requeue_count, lease_epoch, coalesce(lease_expires_at < now(), false) FROM runs",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_worker_died_is_requeued_by_the_reaper_and_taken_up_by_another_worker() {
    let db = Database::create("recovery").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let dir = std::env::temp_dir().join(format!("countersign-e2e-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = silent_endpoint();
    let hanging = agent_file(
        &dir,
        "hanging.json",
        json!({"provider": "openai", "base_url": format!("http://127.0.0.1:{port}/v1"),
               "model": "any", "api_key_env": "COUNTERSIGN_E2E_MODEL_KEY", "timeout_secs": 600}),
    );
    let scripted = agent_file(&dir, "scripted.json", json!({"provider": "scripted"}));
    install.configure(&hanging);
    let script = demo_script();
    let script = script.as_str();

    let _coordinator = install.spawn("countersign-coordinator", &[]);
    let mut doomed = install.command("countersign-worker");
    doomed
        .args(["--model-script", script, "--lease-ttl-secs", "3"])
        .env("COUNTERSIGN_E2E_MODEL_KEY", "not-a-real-key")
        .stdout(std::process::Stdio::null());
    let doomed = countersign_e2e::Process::from(doomed.spawn().unwrap());
    install.countersign_ok(&[
        "submit",
        "--agent",
        "seo-assistant",
        "--as",
        "editor",
        "Improve page 12.",
    ]);

    // The worker claims the run and waits on the silent model, renewing its lease.
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();
    let mut row = run_row(&mut conn).await;
    for _ in 0..300 {
        if row.0 == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        row = run_row(&mut conn).await;
    }
    assert_eq!((row.0.as_str(), row.1, row.2), ("running", 0, 1), "{row:?}");

    // It dies without settling; its lease runs out by the database clock.
    drop(doomed);
    for _ in 0..300 {
        if run_row(&mut conn).await.3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(run_row(&mut conn).await.3, "the lease never expired");

    // The reaper requeues the run and publishes its wake-up again.
    install.countersign_ok(&["agents", "put", &scripted]);
    let reaper = install
        .command("countersign-reaper")
        .args(["--backoff-secs", "0", "--dispatch-grace-secs", "0"])
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&reaper.stdout);
    assert!(
        reaper.status.success(),
        "{}",
        String::from_utf8_lossy(&reaper.stderr)
    );
    assert!(
        summary.contains("requeued=1") && summary.contains("redispatched=1"),
        "{summary}"
    );

    // Another worker takes it from the wake-up and runs it to its approval card.
    let _rescuer = install.spawn("countersign-worker", &["--model-script", script]);
    for _ in 0..300 {
        if run_row(&mut conn).await.0 == "waiting_for_approval" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let row = run_row(&mut conn).await;
    assert_eq!(
        (row.0.as_str(), row.1, row.2),
        ("waiting_for_approval", 1, 2),
        "{row:?}"
    );

    drop(conn);
    std::fs::remove_dir_all(&dir).unwrap();
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
