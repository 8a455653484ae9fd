//! Services stop cleanly on SIGTERM, once their `/readyz` said they were up.

use std::process::Command;
use std::time::{Duration, Instant};

use countersign_e2e::{demo_script, free_port, http_get, Installation};
use uuid::Uuid;

use countersign_e2e::Database;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_the_coordinator_and_a_looping_reaper_exit_zero_on_sigterm() {
    let db = Database::create("shutdown").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.countersign_ok(&["migrate", "--with-content"]);
    let script = demo_script();

    for (binary, args) in [
        ("countersign-worker", vec!["--model-script", &script]),
        ("countersign-coordinator", vec![]),
        ("countersign-reaper", vec!["--every", "60"]),
    ] {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut child = install
            .command(binary)
            .args(&args)
            .args(["--http-addr", &addr])
            .spawn()
            .unwrap();
        let up = Instant::now();
        while http_get(port, "/readyz").is_none_or(|(status, _)| !status.contains("200")) {
            assert!(
                up.elapsed() < Duration::from_secs(30),
                "{binary} never became ready"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let term = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(term.success());
        let asked = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(20),
                "{binary} did not stop on SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(status.success(), "{binary} exited with {status}");
    }

    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
