//! `countersign healthcheck URL`, which compose runs in each service's container (the image
//! has no shell): exit 0 only when the service's `/readyz` answers 200, non-zero for another
//! status, a closed port, or a port that never answers.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use countersign_e2e::{binary, free_port, http_get, Database, Installation};
use uuid::Uuid;

/// Within this, what must happen has happened; never a statement about speed.
const GUARD: Duration = Duration::from_secs(60);

fn healthcheck(args: &[&str]) -> Output {
    Command::new(binary("countersign"))
        .arg("healthcheck")
        .args(args)
        // Whatever the container's environment holds, the check reads none of it.
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_ADDR")
        .output()
        .expect("countersign starts")
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn the_healthcheck_passes_on_a_ready_service_and_fails_on_anything_else() {
    let db = Database::create("healthcheck").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.countersign_ok(&["migrate"]);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let reaper = install.spawn(
        "countersign-reaper",
        &["--every", "3600", "--http-addr", &addr],
    );
    let deadline = Instant::now() + GUARD;
    while !http_get(port, "/readyz").is_some_and(|(status, _)| status.contains("200")) {
        assert!(
            Instant::now() < deadline,
            "the reaper was not ready within {GUARD:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let ready = healthcheck(&[&format!("http://{addr}/readyz")]);
    assert!(ready.status.success(), "{}", said(&ready));
    assert!(said(&ready).contains("ready"), "{}", said(&ready));

    let missing = healthcheck(&[&format!("http://{addr}/no-such-path")]);
    assert!(!missing.status.success());
    assert!(said(&missing).contains("404"), "{}", said(&missing));
    drop(reaper);

    // Nothing listens there any more.
    let closed = healthcheck(&[&format!("http://{addr}/readyz")]);
    assert!(!closed.status.success());
    assert!(
        said(&closed).contains("cannot be reached"),
        "{}",
        said(&closed)
    );

    // A port that takes the connection and never answers: the timeout ends the check.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let hung = healthcheck(&[
        "--timeout-secs",
        "1",
        &format!("http://127.0.0.1:{silent_port}/readyz"),
    ]);
    assert!(!hung.status.success());
    assert!(said(&hung).contains("did not answer"), "{}", said(&hung));
    drop(silent);

    let https = healthcheck(&["https://127.0.0.1:1/readyz"]);
    assert!(!https.status.success());
    assert!(said(&https).contains("not an http://"), "{}", said(&https));

    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
