//! `countersign-dev demo`: the story through the real services, as `make demo` runs it.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use countersign_e2e::{amqp_addr, binary, database_url};
use sqlx::{Connection, PgConnection};

/// Runs `countersign-dev demo --database DATABASE ARGS` with a fresh key, as a clone would.
async fn demo(database: &str, args: &[&str]) -> (Output, String) {
    let mut command = Command::new(binary("countersign-dev"));
    command
        .args(["demo", "--database", database])
        .args(args)
        .env("DATABASE_URL", database_url())
        .env("AMQP_ADDR", amqp_addr())
        .env("RUST_BACKTRACE", "0")
        .env_remove("COUNTERSIGN_KEYS")
        .env_remove("COUNTERSIGN_KEY_FILE");
    let out =
        tokio::task::spawn_blocking(move || command.output().expect("countersign-dev starts"))
            .await
            .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out, stdout)
}

async fn database_exists(name: &str) -> bool {
    let mut conn = PgConnection::connect(&database_url()).await.unwrap();
    sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_bounces_a_moved_preview_survives_a_killed_worker_and_stops_its_services_cleanly()
{
    let database = format!("countersign_e2e_demo_{}", std::process::id());
    let started = Instant::now();
    let (_, stdout) = demo(&database, &[]).await;

    let mut at = 0;
    for expected in [
        // The services, each a process of its own.
        "coordinator    pid",
        "demo-worker-1  pid",
        "demo-worker-2  pid",
        "reaper         pid",
        // The request through the queue, and the card.
        "$ countersign submit --agent seo-assistant --as editor",
        "→ waiting for approval, suspension 1; nothing is written yet",
        "$ countersign inbox --as admin --save card-1.json",
        "field image: 2 reference(s) → 3, appended last",
        "with 2 preview(s) withheld",
        // The colleague's edit bounces the approval of the card that no longer holds.
        "a colleague attaches logo.svg",
        "$ countersign decide",
        "decision accepted: run",
        "Moved call(s): [1]",
        "field image: 3 reference(s) → 4, appended last",
        // The stale tab, then the current card.
        "--card tab.json --as approver --approve",
        "decision refused: stale_turn",
        "→ decision refused: stale_turn; the run stays waiting, untouched",
        "--card card-2.json --as admin --approve",
        "→ run completed: completed",
        "page 12 description: \"Bicycles for every road",
        "teaser images, in order: hero.jpg, team.jpg, logo.svg, bicycle.png",
        "tool_write → tool_write → run.completed",
        // A worker dies holding a lease; the reaper hands its run to the other one.
        "holds the lease (epoch 1) and waits on the model",
        "$ kill -KILL",
        "died settling nothing",
        "reaper pass: requeued=1",
        "claims it (lease epoch 2, requeue 1)",
        "→ run completed: completed (three model calls",
        // The web inbox over the same installation, with a token for the approver.
        "The web inbox: http://127.0.0.1:",
        "sign in as admin with the token",
        // The orderly stop.
        "coordinator (pid",
        "Every step behaved as told",
    ] {
        let found = stdout[at..]
            .find(expected)
            .unwrap_or_else(|| panic!("missing {expected:?} (in order) in:\n{stdout}"));
        at += found + expected.len();
    }
    assert_eq!(
        stdout.matches(") exited 0").count(),
        5,
        "the coordinator, both workers, the reaper and the API stop on SIGTERM with status 0:\n{stdout}"
    );
    let (doomed, rescuer) = (
        stdout
            .split("holds the lease")
            .next()
            .and_then(|s| s.rsplit("→ ").next())
            .and_then(|s| s.split_whitespace().next())
            .unwrap(),
        stdout
            .split(" claims it (lease epoch 2")
            .next()
            .and_then(|s| s.rsplit("→ ").next())
            .unwrap(),
    );
    assert_ne!(doomed, rescuer, "the other worker took the run:\n{stdout}");

    assert!(
        !database_exists(&database).await,
        "the demo database is dropped"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the demo took {:?}",
        started.elapsed()
    );
}

/// The processes a kept demo leaves behind, stopped when the test ends however it ends.
struct Kept(Vec<String>);

impl Kept {
    fn running(&self) -> Vec<&str> {
        self.0
            .iter()
            .map(String::as_str)
            .filter(|pid| {
                // Gone, or a zombie nobody reaped yet: either way not running.
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                !stat.is_empty()
                    && !stat
                        .rsplit_once(") ")
                        .is_some_and(|(_, s)| s.starts_with('Z'))
            })
            .collect()
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        let running: Vec<String> = self.running().into_iter().map(str::to_owned).collect();
        if !running.is_empty() {
            let _ = Command::new("kill").arg("-TERM").args(&running).status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_demo_leaves_its_services_running_and_says_how_to_stop_them() {
    let database = format!("countersign_e2e_kept_demo_{}", std::process::id());
    let base = format!("e2e-kept-{}", std::process::id());
    let (_, stdout) = demo(&database, &["--keep", "--queue-prefix", &base]).await;

    let stop = stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("stop them:  kill -TERM "))
        .unwrap_or_else(|| panic!("no stop command in:\n{stdout}"));
    let kept = Kept(stop.split_whitespace().map(str::to_owned).collect());
    assert_eq!(kept.0.len(), 5, "{stdout}");
    assert_eq!(
        kept.running().len(),
        5,
        "the coordinator, both workers, the reaper and the API run on"
    );
    assert!(database_exists(&database).await, "the database is kept");
    let prefix = stdout
        .split(" and queues ")
        .nth(1)
        .and_then(|s| s.split(".*").next())
        .expect("the queue prefix is shown")
        .to_owned();
    // Its own queues, under the prefix it was given, which its services use.
    assert!(
        prefix.starts_with(&format!("{base}-demo-")),
        "{prefix} is not under --queue-prefix {base}"
    );
    let segments = format!("{prefix}.segments");
    assert!(
        countersign_e2e::consumers(&segments).is_some_and(|n| n >= 1),
        "its workers consume {segments}"
    );

    // What the demo said to type.
    let status = Command::new("kill")
        .arg("-TERM")
        .args(&kept.0)
        .status()
        .unwrap();
    assert!(status.success());
    let asked = Instant::now();
    while !kept.running().is_empty() {
        assert!(
            asked.elapsed() < Duration::from_secs(20),
            "still running after SIGTERM: {:?}",
            kept.running()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    countersign_e2e::delete_topology(&prefix).await;
    let mut conn = PgConnection::connect(&database_url()).await.unwrap();
    sqlx::query(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .execute(&mut conn)
        .await
        .unwrap();
    let _ =
        std::fs::remove_dir_all(std::env::temp_dir().join(format!("countersign-demo-{database}")));
}
