//! The API against its own OpenAPI document, by schemathesis (PyPI, pinned in
//! `scripts/schemathesis.sh`, which `.ci/run` runs): generated requests to every operation of
//! the served document, as a caller with a valid token, against the real `countersign-api`
//! over a configured installation. It fails on any 5xx and on any answer the document does not
//! describe — a status, a content type, a header or a body that does not fit the schema — and
//! on a request the document calls invalid that the API accepts. Bounded in examples per
//! operation; the process is given a generous wall-clock guard on top.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use countersign_e2e::{demo_agent, free_port, http_get, workspace_file, Database, Installation};
use uuid::Uuid;

/// Where `scripts/schemathesis.sh` installs it, unless `SCHEMATHESIS` names another.
fn schemathesis() -> Option<PathBuf> {
    let path = std::env::var_os("SCHEMATHESIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_file("target/schemathesis/bin/schemathesis"));
    path.exists().then_some(path)
}

/// What schemathesis checks: no server error, every answer as the document describes it, and
/// invalid input refused.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
    response_headers_conformance,response_schema_conformance,negative_data_rejection,\
    unsupported_method,ignored_auth,missing_required_header";
/// Test cases per operation and phase.
const MAX_EXAMPLES: &str = "100";
/// A guard on the whole run, never a measure of it: the run ends by its examples long before.
const GUARD: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_generated_requests_only_as_its_openapi_document_says() {
    let Some(schemathesis) = schemathesis() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "schemathesis is not installed: scripts/schemathesis.sh installs it (.ci/run does)"
        );
        eprintln!("schemathesis is not installed (scripts/schemathesis.sh): not run here");
        return;
    };
    let db = Database::create("schemathesis").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    let token = install.countersign_ok(&["tokens", "create", "--for", "admin", "--label", "e2e"]);
    let token = token.trim();
    // Generated run requests name any acting user: past the producer gate, to the others.
    install.countersign_ok(&["producers", "allow", "http:admin", "acting-user", "*"]);

    let (api_port, ready_port) = (free_port(), free_port());
    let _api = install.spawn(
        "countersign-api",
        &[
            "--listen",
            &format!("127.0.0.1:{api_port}"),
            "--http-addr",
            &format!("127.0.0.1:{ready_port}"),
            // Generated requests come fast; the limiter is tested on its own.
            "--rate-per-minute",
            "1000000",
            "--rate-burst",
            "1000000",
        ],
    );
    // The whole suite shares two cores: the API may take a while to be ready.
    countersign_e2e::wait_until("the API is ready", Duration::from_secs(90), async || {
        http_get(ready_port, "/readyz")
            .is_some_and(|(s, _)| s.contains("200"))
            .then_some(())
    })
    .await;

    // Its example database in a directory of its own, not the working tree.
    let scratch = std::env::temp_dir().join(format!("countersign-schemathesis-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut run = Command::new(&schemathesis)
        .current_dir(&scratch)
        .args([
            "run",
            &format!("http://127.0.0.1:{api_port}/v1/openapi.json"),
            "--header",
            &format!("Authorization: Bearer {token}"),
            "--checks",
            CHECKS,
            "--max-examples",
            MAX_EXAMPLES,
            "--seed",
            "20261130",
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--generation-database",
            "none",
            "--no-color",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("schemathesis starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > GUARD {
            let _ = run.kill();
            panic!("schemathesis did not finish within {GUARD:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let output = run.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(
        status.success(),
        "schemathesis found answers the document does not describe:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains(" passed"), "no test case ran:\n{report}");
}
