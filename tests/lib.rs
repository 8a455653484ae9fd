//! Black-box end-to-end tests of countersign: each test starts the real binaries as an
//! operator would, talks to them only through PostgreSQL, RabbitMQ, HTTP and their command
//! lines, and checks what they did.
//!
//! This crate must never reach into a library crate to fake a step a binary performs; the
//! queue crate is used only as any foreign producer or event consumer would use RabbitMQ.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

pub use countersign_testkit::{
    amqp_addr, chat_answer, counter_total, database_url, free_port, http_get, messages_with_role,
    Database, Link, ModelStub, Process, Proxy, KEYS,
};
pub use site::Site;

mod site;

/// The path of a binary built from this workspace, beside the test executable's directory.
pub fn binary(name: &str) -> PathBuf {
    countersign_testkit::binary(name).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The agent configuration the demo, the services and the tests share.
pub fn demo_agent() -> String {
    workspace_file("deploy/agents/seo-assistant.json")
        .to_string_lossy()
        .into_owned()
}

/// The script of the demo's scripted model.
pub fn demo_script() -> String {
    workspace_file("crates/cli/demo/seo-assistant.json")
        .to_string_lossy()
        .into_owned()
}

/// A file of the workspace, by its path from the workspace root.
pub fn workspace_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// The environment one installation under test shares.
#[derive(Debug, Clone)]
pub struct Installation {
    pub database_url: String,
    pub queue_prefix: String,
}

impl Installation {
    pub fn command(&self, binary_name: &str) -> Command {
        let mut cmd = Command::new(binary(binary_name));
        cmd.env("DATABASE_URL", &self.database_url)
            .env("AMQP_ADDR", amqp_addr())
            .env("COUNTERSIGN_QUEUE_PREFIX", &self.queue_prefix)
            .env("COUNTERSIGN_KEYS", KEYS)
            .env_remove("COUNTERSIGN_KEY_FILE")
            .env("RUST_LOG", "warn");
        cmd
    }

    /// Runs `countersign ARGS` to completion.
    pub fn countersign(&self, args: &[&str]) -> Output {
        self.command("countersign")
            .args(args)
            .output()
            .expect("countersign starts")
    }

    /// Runs `countersign ARGS` and returns its stdout, failing the test on a non-zero exit.
    pub fn countersign_ok(&self, args: &[&str]) -> String {
        let out = self.countersign(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "countersign {args:?} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Sets the installation up as an operator does: migrations (with the content store), the
    /// demo site, the agent in `agent_file`, and the broker user `guest` allowed to name any
    /// acting user and approver.
    pub fn configure(&self, agent_file: &str) {
        self.countersign_ok(&["migrate", "--with-content"]);
        self.countersign_ok(&["seed-demo-site"]);
        self.countersign_ok(&["agents", "put", agent_file]);
        self.countersign_ok(&["producers", "allow", "guest", "acting-user", "*"]);
        self.countersign_ok(&["producers", "allow", "guest", "approver", "*"]);
    }

    /// Starts a long-running binary with extra environment variables; killed when dropped.
    pub fn spawn_env(&self, binary_name: &str, args: &[&str], env: &[(&str, &str)]) -> Process {
        let mut cmd = self.command(binary_name);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        Process::spawn(binary_name, &mut cmd).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `countersign decide RUN_ID --seq SEQ --digest DIGEST --as APPROVER --approve`, to
    /// completion: an approval of the card those values name.
    pub fn approve_card(&self, run_id: &str, seq: i32, digest: &str, approver: &str) -> Output {
        let seq = seq.to_string();
        self.countersign(&[
            "decide",
            run_id,
            "--seq",
            &seq,
            "--digest",
            digest,
            "--as",
            approver,
            "--approve",
        ])
    }

    /// `countersign submit` through the queue; the new run's id.
    pub fn submit(&self, agent: &str, acting_user: &str, prompt: &str) -> String {
        let out = self.countersign_ok(&["submit", "--agent", agent, "--as", acting_user, prompt]);
        out.split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("no run id in {out:?}"))
            .to_owned()
    }

    /// A broker connection on this installation's topology, as a foreign producer has one.
    pub async fn broker(&self) -> countersign_queue::Broker {
        countersign_queue::Broker::connect(countersign_queue::QueueConfig::new(
            amqp_addr(),
            countersign_queue::Topology::new(&self.queue_prefix),
        ))
        .await
        .expect("the broker answers")
    }

    /// Starts a long-running binary; it is killed when the guard drops.
    pub fn spawn(&self, binary_name: &str, args: &[&str]) -> Process {
        self.spawn_env(binary_name, args, &[])
    }
}

/// Deletes the queues and exchanges an installation under test declared.
pub async fn delete_topology(prefix: &str) {
    let install = Installation {
        database_url: String::new(),
        queue_prefix: prefix.to_owned(),
    };
    let broker = install.broker().await;
    broker
        .delete_topology()
        .await
        .expect("the topology is deleted");
}

// ---------------------------------------------------------------------------------------------
// Fault injection and observation: processes, the database, what the model stub was asked.
// ---------------------------------------------------------------------------------------------

/// Test seconds, for deadlines.
pub fn secs(n: u64) -> std::time::Duration {
    std::time::Duration::from_secs(n)
}

/// Polls `probe` until it yields a value, failing the test after `within`.
pub async fn wait_until<T>(
    what: &str,
    within: std::time::Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    countersign_testkit::wait_until(what, within, async || Ok(probe().await))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until the boolean query `sql` holds in the database `conn` is connected to.
pub async fn wait_for_sql(
    conn: &mut sqlx::PgConnection,
    what: &str,
    within: std::time::Duration,
    sql: &str,
) {
    wait_until(what, within, async || {
        let held: bool = sqlx::query_scalar(sql)
            .fetch_one(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        held.then_some(())
    })
    .await;
}

/// The `bigint` the query `sql` returns (a `count(*)`, typically).
pub async fn count(conn: &mut sqlx::PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The names of the files a content element's `field` references (not deleted), in order.
pub async fn referenced_files(
    conn: &mut sqlx::PgConnection,
    element: i64,
    field: &str,
) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT f.name FROM content.file_references r JOIN content.files f ON f.uid = r.file
         WHERE r.element = $1 AND r.field = $2 AND NOT r.deleted
         ORDER BY r.sorting, r.uid",
    )
    .bind(element)
    .bind(field)
    .fetch_all(conn)
    .await
    .expect("the references read")
}

/// The run row as JSON.
pub async fn run_row(conn: &mut sqlx::PgConnection, run_id: &str) -> serde_json::Value {
    sqlx::query_scalar("SELECT to_jsonb(r) - 'state' - 'request' FROM runs r WHERE id = $1::uuid")
        .bind(run_id)
        .fetch_one(conn)
        .await
        .expect("the run exists")
}

/// Waits until the run's status is `status` (and, for `waiting_for_approval`, any suspension).
pub async fn wait_for_status(
    conn: &mut sqlx::PgConnection,
    run_id: &str,
    status: &str,
    within: std::time::Duration,
) {
    let sql = format!("SELECT status = '{status}' FROM runs WHERE id = '{run_id}'::uuid");
    wait_for_sql(conn, &format!("run {run_id} is {status}"), within, &sql).await;
}

/// Waits until the run waits for approval on suspension `seq`.
pub async fn wait_for_card(
    conn: &mut sqlx::PgConnection,
    run_id: &str,
    seq: i32,
    within: std::time::Duration,
) {
    let sql = format!(
        "SELECT status = 'waiting_for_approval' AND suspension_seq = {seq}
         FROM runs WHERE id = '{run_id}'::uuid"
    );
    wait_for_sql(
        conn,
        &format!("run {run_id} waits on card {seq}"),
        within,
        &sql,
    )
    .await;
}

/// An advisory-lock gate: a trigger on `table` whose function takes the shared transaction
/// advisory lock `key` for every row matching `when`, so that whoever holds `key` exclusively
/// (with [`hold_gate`]) stops those statements exactly there, inside their transactions.
pub async fn install_gate(
    conn: &mut sqlx::PgConnection,
    name: &str,
    table: &str,
    event: &str,
    when: &str,
    key: i64,
) {
    for sql in [
        format!(
            "CREATE FUNCTION e2e_gate_{name}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_advisory_xact_lock_shared({key}); RETURN NEW; END $$"
        ),
        format!(
            "CREATE TRIGGER e2e_gate_{name} BEFORE {event} ON {table}
             FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION e2e_gate_{name}()"
        ),
    ] {
        sqlx::query(&sql)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Removes a gate [`install_gate`] installed.
pub async fn remove_gate(conn: &mut sqlx::PgConnection, name: &str, table: &str) {
    for sql in [
        format!("DROP TRIGGER e2e_gate_{name} ON {table}"),
        format!("DROP FUNCTION e2e_gate_{name}()"),
    ] {
        sqlx::query(&sql)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Closes the gate `key` on this connection: the gated statements wait from now on.
pub async fn hold_gate(conn: &mut sqlx::PgConnection, key: i64) {
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(conn)
        .await
        .expect("the advisory lock is taken");
}

/// Opens the gate `key` again: the waiting statements go on.
pub async fn release_gate(conn: &mut sqlx::PgConnection, key: i64) {
    let released: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .fetch_one(conn)
        .await
        .expect("the advisory lock is released");
    assert!(released, "the gate {key} was not held");
}

/// How many other backends of this database wait for the advisory lock `key`.
pub async fn waiting_at_gate(conn: &mut sqlx::PgConnection, key: i64) -> i64 {
    at_gate(conn, key, false).await
}

/// Terminates the backends of this database that wait for the advisory lock `key` (statements
/// held at a gate whose client is gone), so that what they were about to do never happens;
/// returns how many were cut.
pub async fn cut_waiting_at_gate(conn: &mut sqlx::PgConnection, key: i64) -> i64 {
    at_gate(conn, key, true).await
}

/// The other backends of this database waiting for the advisory lock `key`, counted, and
/// terminated when `cut`.
async fn at_gate(conn: &mut sqlx::PgConnection, key: i64, cut: bool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE CASE WHEN $2 THEN pg_terminate_backend(l.pid) ELSE true END)
         FROM pg_locks l
         WHERE l.locktype = 'advisory' AND NOT l.granted AND l.classid = 0 AND l.objid = $1
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.pid <> pg_backend_pid()",
    )
    .bind(key)
    .bind(cut)
    .fetch_one(conn)
    .await
    .expect("pg_locks reads")
}

/// The backends of this database (not this one) waiting for a lock while they run a statement
/// that starts with `statement` (whitespace collapsed).
pub async fn waiting_on_lock(conn: &mut sqlx::PgConnection, statement: &str) -> i64 {
    waiting(conn, statement, false).await
}

/// [`waiting_on_lock`], counting only backends inside an explicit transaction (one that began
/// before the waiting statement did).
pub async fn waiting_in_transaction(conn: &mut sqlx::PgConnection, statement: &str) -> i64 {
    waiting(conn, statement, true).await
}

async fn waiting(conn: &mut sqlx::PgConnection, statement: &str, in_transaction: bool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND state = 'active' AND wait_event_type = 'Lock'
           AND (NOT $2 OR xact_start < query_start)
           AND regexp_replace(query, '\\s+', ' ', 'g') LIKE $1 || '%'",
    )
    .bind(statement)
    .bind(in_transaction)
    .fetch_one(conn)
    .await
    .expect("pg_stat_activity reads")
}

/// Terminates every other connection to this database, as a failing network or a restarted
/// pooler would; returns how many were cut.
pub async fn cut_connections(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(conn)
    .await
    .expect("the backends are terminated")
}

/// Publishes a decision on `countersign.decisions` as the broker user `guest`, the way any
/// producer does, without waiting for its outcome; returns its `decision_id`.
pub async fn publish_decision(
    broker: &countersign_queue::Broker,
    run_id: &str,
    suspension_seq: i64,
    turn_digest: &str,
    approved: bool,
    approver: &str,
) -> String {
    let decision_id = uuid::Uuid::now_v7().to_string();
    let body = serde_json::json!({
        "type": "countersign.decision", "version": 1,
        "decision_id": decision_id, "run_id": run_id,
        "suspension_seq": suspension_seq, "turn_digest": turn_digest,
        "approved": approved, "approver": approver,
    });
    broker
        .publish_to_queue(
            &broker.topology().decisions(),
            body.to_string().as_bytes(),
            Some("guest"),
        )
        .await
        .expect("the decision is published");
    decision_id
}

/// Publishes a segment wake-up for `run_id`, as the coordinator and the reaper do.
pub async fn publish_wake_up(broker: &countersign_queue::Broker, run_id: &str) {
    let body = serde_json::json!({"type": "countersign.segment", "version": 1, "run_id": run_id});
    broker
        .publish_to_queue(
            &broker.topology().segments(),
            body.to_string().as_bytes(),
            None,
        )
        .await
        .expect("the wake-up is published");
}

/// A directory of this test's files, removed when dropped.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("countersign-e2e-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        TempDir(dir)
    }

    /// Writes `value` as JSON to `name` in the directory; its path.
    pub fn json(&self, name: &str, value: &serde_json::Value) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, value.to_string()).expect("the file is written");
        path.to_str().expect("a UTF-8 temp path").to_owned()
    }
}

impl Default for TempDir {
    fn default() -> Self {
        TempDir::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The environment variable the fake model's agents name for their (fake) API key.
pub const MODEL_KEY_ENV: &str = "COUNTERSIGN_E2E_MODEL_KEY";

/// The agent configuration's `model` settings that point at `stub`.
pub fn model_settings(stub: &ModelStub) -> serde_json::Value {
    serde_json::json!({
        "provider": "openai",
        "base_url": stub.base_url,
        "model": "fake",
        "api_key_env": MODEL_KEY_ENV,
        "timeout_secs": 600,
    })
}

// ---------------------------------------------------------------------------------------------
// The services themselves restarted: PostgreSQL and RabbitMQ stopped and started under a test,
// and the guard that brings them back whatever the test did.
// ---------------------------------------------------------------------------------------------

/// Whether an executable is a test process a restart must not land under: an e2e, restarts or
/// `it` test binary (`<name>-<16 hex digits>`, as cargo names them) or the chaos run. It is
/// matched on the executable, never on command lines: those of PostgreSQL backends, brokers
/// and the shells that started this run carry arbitrary text.
fn is_test_executable(file_name: &str) -> bool {
    if file_name == "countersign-chaos" {
        return true;
    }
    file_name.rsplit_once('-').is_some_and(|(name, hash)| {
        matches!(name, "e2e" | "it" | "restarts")
            && hash.len() == 16
            && hash.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// The running test processes (e2e, restarts and `it` test binaries, the chaos run) that are
/// not this process or its descendants, as `pid executable`. Zombies have no executable and
/// are not counted.
pub fn other_tests() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(exe) = std::fs::read_link(entry.path().join("exe")) else {
            continue;
        };
        // A binary rebuilt while it runs reads `<path> (deleted)`.
        let is_test = exe
            .file_name()
            .and_then(|name| name.to_str())
            .map(|name| name.trim_end_matches(" (deleted)"))
            .is_some_and(is_test_executable);
        if is_test && !descends_from(pid, me) {
            found.push(format!("{pid} {}", exe.display()));
        }
    }
    found.sort();
    found
}

/// Whether `pid` is `ancestor` or one of its descendants, by the parent links in /proc.
fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            return false;
        };
        if ppid <= 1 {
            return false;
        }
        pid = ppid;
    }
    false
}

/// Waits, 20 s at a time and at most `within`, until no other test process runs; fails the
/// test (naming them) rather than restart a service under someone else's test.
pub async fn wait_for_other_tests(within: std::time::Duration) {
    let started = std::time::Instant::now();
    loop {
        let others = other_tests();
        if others.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < within,
            "other tests still run after {within:?}; not restarting a shared service under them:\n{}",
            others.join("\n")
        );
        eprintln!(
            "restarts: waiting for {} other test process(es) to finish before restarting a service",
            others.len()
        );
        tokio::time::sleep(std::time::Duration::from_secs(20)).await;
    }
}

/// Runs a service-control command to completion; its status and output, for the failure text.
fn control(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {args:?} did not start: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?} exited with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The PostgreSQL cluster version on this machine (the first under /etc/postgresql).
fn postgres_version() -> String {
    let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql lists the clusters")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    versions.sort();
    versions.into_iter().next().expect("a PostgreSQL cluster")
}

fn postgres_ready() -> bool {
    Command::new("pg_isready")
        .args(["-q", "-h", "127.0.0.1", "-p", "5432"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Polls `pg_isready` until PostgreSQL accepts connections, at most `within`.
fn wait_for_postgres(within: std::time::Duration) -> Result<(), String> {
    let started = std::time::Instant::now();
    while !postgres_ready() {
        if started.elapsed() >= within {
            return Err(format!("PostgreSQL not ready after {within:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(())
}

/// Restarts the PostgreSQL cluster (every connection dies with it, advisory locks included)
/// and waits until it accepts connections again.
pub fn restart_postgres() {
    let version = postgres_version();
    control(
        "pg_ctlcluster",
        &["--skip-systemctl-redirect", &version, "main", "restart"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    wait_for_postgres(std::time::Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
}

/// Stops the RabbitMQ application (the node stays up; every connection is closed).
pub fn stop_broker() {
    control("rabbitmqctl", &["-q", "stop_app"]).unwrap_or_else(|e| panic!("{e}"));
}

/// Starts the RabbitMQ application again and waits until it has started.
pub fn start_broker() {
    control("rabbitmqctl", &["-q", "start_app"]).unwrap_or_else(|e| panic!("{e}"));
    control("timeout", &["120", "rabbitmqctl", "-q", "await_startup"])
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Brings PostgreSQL and RabbitMQ up, as `scripts/services.sh` does, waiting until they answer:
/// `pg_isready`, then `rabbitmqctl start_app` (harmless when it runs) and `await_startup`.
/// Errors are collected, not raised: this runs in a drop guard.
pub fn restore_services() -> Result<(), String> {
    let mut errors = Vec::new();
    if !postgres_ready() {
        let version = postgres_version();
        // `start` fails on a cluster that is starting already; the wait decides.
        let _ = control(
            "pg_ctlcluster",
            &["--skip-systemctl-redirect", &version, "main", "start"],
        );
        if let Err(e) = wait_for_postgres(std::time::Duration::from_secs(60)) {
            errors.push(e);
        }
    }
    if control("timeout", &["20", "rabbitmqctl", "-q", "status"]).is_err() {
        let _ = control("rabbitmq-server", &["-detached"]);
    }
    let _ = control("timeout", &["60", "rabbitmqctl", "-q", "start_app"]);
    if let Err(e) = control("timeout", &["120", "rabbitmqctl", "-q", "await_startup"]) {
        errors.push(e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// Brings PostgreSQL and RabbitMQ back up when dropped — when the test ends, and when it panics
/// with a service stopped.
#[derive(Debug, Default)]
pub struct ServicesRestored;

impl Drop for ServicesRestored {
    fn drop(&mut self) {
        if let Err(e) = restore_services() {
            eprintln!("restarts: the services could not be restored:\n{e}");
            if !std::thread::panicking() {
                panic!("the services could not be restored:\n{e}");
            }
        }
    }
}

/// How many consumers the broker counts on `queue` (`rabbitmqctl list_queues`); `None` when
/// the queue is not listed or the broker does not answer.
pub fn consumers(queue: &str) -> Option<u32> {
    let out = Command::new("timeout")
        .args([
            "20",
            "rabbitmqctl",
            "list_queues",
            "-q",
            "--no-table-headers",
            "name",
            "consumers",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let (name, consumers) = line.split_once('\t')?;
            (name == queue).then(|| consumers.trim().parse().ok())?
        })
}

/// `/metrics` of the process serving on 127.0.0.1:`port`, once it answers.
pub async fn metrics(port: u16) -> String {
    wait_until(
        &format!("/metrics answers on {port}"),
        secs(30),
        async || http_get(port, "/metrics").map(|(_, body)| body),
    )
    .await
}

/// The `WHEN` of a gate on the turn transaction of a resume: the turn's fence, the lease
/// renewal `UPDATE runs … WHERE … status = 'running' …` of a resumed run that journals the turn
/// in the same statement (the heartbeat's renewal matches too).
pub const TURN_GATE_WHEN: &str =
    "OLD.status = 'running' AND NEW.status = 'running' AND OLD.segment = 'resume'";
/// How the turn's fence statement begins: the comment naming `journal_guarded` (the guarded
/// lease renewal, then the journal rows and audit events), so its SQL may change.
pub const TURN_FENCE: &str = "/* journal_guarded */";

/// A fault page: page `9000 + n` with the teaser element `9100 + n`, which has no images.
pub fn fault_page(n: i64) -> i64 {
    9000 + n
}

/// The prompt that asks [`fault_page_model`] to edit `page`.
pub fn fault_page_prompt(page: i64) -> String {
    format!("Edit fault page {page}.")
}

/// Adds fault pages 1..=`pages` (see [`fault_page`]) to a seeded demo site.
pub async fn seed_fault_pages(conn: &mut sqlx::PgConnection, pages: i64) {
    for sql in [
        "INSERT INTO content.pages (uid, pid, sorting, title, description)
         SELECT 9000 + n, 10, 4000 + n, 'Fault page ' || n, 'Before ' || n
         FROM generate_series(1, $1::int) n",
        "INSERT INTO content.elements (uid, pid, ctype, header, sorting)
         SELECT 9100 + n, 9000 + n, 'textpic', 'Fault teaser ' || n, 256
         FROM generate_series(1, $1::int) n",
    ] {
        sqlx::query(sql)
            .bind(pages as i32)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
}

/// A model for the fault pages: the prompt names the page; the first turn proposes its new
/// description and hero.jpg (file 7) on its teaser, the second finishes.
pub fn fault_page_model(request: &serde_json::Value) -> Option<serde_json::Value> {
    let prompt = messages_with_role(request, "user").into_iter().next()?;
    let page: Option<i64> = prompt
        .strip_prefix("Edit fault page ")
        .and_then(|rest| rest.trim_end_matches('.').parse().ok());
    let Some(page) = page else {
        return Some(chat_answer("I cannot tell which page to edit.", &[]));
    };
    Some(match messages_with_role(request, "assistant").len() {
        0 => chat_answer(
            "I propose a new description and the hero image on the teaser.",
            &[
                (
                    "update_page_metadata",
                    serde_json::json!({"uid": page, "description": format!("Fault page {page}, rewritten.")}),
                ),
                (
                    "attach_file_to_content_element",
                    serde_json::json!({"content_element": page + 100, "file": 7, "field": "image",
                           "alternative": format!("Hero of page {page}")}),
                ),
            ],
        ),
        _ => chat_answer("Done.", &[]),
    })
}

/// Six live pages of the demo site that `editor` may write, one [`page_agent`] each. The first
/// three are leaves, none on another's rootline: writes to them do not wait for each other.
pub const WRITABLE_PAGES: [i64; 6] = [12, 13, 15, 10, 14, 40];

/// The description the [`page_agent`]s propose.
pub const PAGE_DESCRIPTION: &str = "Bicycles for every road.";

/// Writes to `dir` the agent `page-UID`, whose scripted model proposes [`PAGE_DESCRIPTION`] for
/// page `uid` (one write, four-eyes) and then finishes; the agent file's path.
pub fn page_agent(dir: &TempDir, uid: i64) -> String {
    let script = dir.json(
        &format!("script-{uid}.json"),
        &serde_json::json!({"turns": [
            {"content": "A description.", "tool_calls": [
                {"name": "update_page_metadata",
                 "arguments": {"uid": uid, "description": PAGE_DESCRIPTION}}]},
            {"content": "Done."}]}),
    );
    dir.json(
        &format!("agent-{uid}.json"),
        &serde_json::json!({
            "name": format!("page-{uid}"),
            "model": {"provider": "scripted", "script": script},
            "policy": {"allowed_groups": ["content", "editing"],
                       "enabled_tools": ["update_page_metadata"]},
            "max_iterations": 4, "four_eyes": true, "approval_deadline_secs": 3600
        }),
    )
}

/// Asserts that each of the `runs` [`page_agent`] runs in the database wrote its page once,
/// after its approval: one `tool_write` event and one journal row per run, none before a
/// `decision.accepted`, and every page described. Prints the tally.
pub async fn assert_written_once(conn: &mut sqlx::PgConnection, runs: usize) {
    let writes = count(
        conn,
        "SELECT count(*) FROM run_events WHERE kind = 'tool_write'",
    )
    .await;
    let journaled = count(conn, "SELECT count(*) FROM run_journal").await;
    let unapproved = count(
        conn,
        "SELECT count(*) FROM run_events w WHERE w.kind = 'tool_write' AND NOT EXISTS (
             SELECT 1 FROM run_events d WHERE d.run_id = w.run_id
             AND d.kind = 'decision.accepted' AND d.sequence < w.sequence)",
    )
    .await;
    let described = count(
        conn,
        &format!("SELECT count(*) FROM content.pages WHERE description = '{PAGE_DESCRIPTION}'"),
    )
    .await;
    let expected = runs as i64;
    println!(
        "runs {runs} · writes {writes} (journaled {journaled}, lost {}, duplicated {}) · unapproved {unapproved} · pages described {described}",
        (expected - journaled).max(0),
        (writes - expected).max(0),
    );
    assert_eq!(
        (writes, journaled, unapproved, described),
        (expected, expected, 0, expected),
        "one write per run, none lost, none duplicated, none unapproved"
    );
}

/// `POST path` on 127.0.0.1:`port` with a JSON body and a bearer token: (status, body, or
/// `null` when the body is not JSON).
pub fn http_post_json(
    port: u16,
    path: &str,
    token: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    http_json(port, "POST", path, token, Some(body))
}

/// `GET path` on 127.0.0.1:`port` with a bearer token: (status, body, or `null` when the body
/// is not JSON).
pub fn http_get_json(port: u16, path: &str, token: &str) -> (u16, serde_json::Value) {
    http_json(port, "GET", path, token, None)
}

/// One request with a bearer token (and a JSON body, when given) over a connection of its
/// own: (status, body, or `null` when the body is not JSON).
fn http_json(
    port: u16,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let body = body.map(ToString::to_string).unwrap_or_default();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the API listens");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

/// The turn digest of the run's current card.
pub async fn turn_digest(conn: &mut sqlx::PgConnection, run_id: &str) -> String {
    run_row(conn, run_id).await["turn_digest"]
        .as_str()
        .expect("a turn digest")
        .to_owned()
}

/// Approves card `seq` through the queue as `admin` and waits until the coordinator has
/// recorded it accepted. Unlike `countersign decide`, it does not wait for the coordinator's
/// reply, which comes after the coordinator has recorded the dispatch on the run row — a
/// statement a gated claim or turn transaction can hold up.
pub async fn approve_through_queue(
    install: &Installation,
    conn: &mut sqlx::PgConnection,
    run_id: &str,
    seq: i32,
    digest: &str,
) {
    let broker = install.broker().await;
    publish_decision(&broker, run_id, seq.into(), digest, true, "admin").await;
    let accepted = format!(
        "SELECT EXISTS (SELECT 1 FROM run_decisions WHERE run_id = '{run_id}'::uuid
                        AND suspension_seq = {seq} AND outcome = 'accepted')"
    );
    wait_for_sql(conn, "the approval is accepted", secs(30), &accepted).await;
}

/// The run's suspended state, opened with the tests' keyring.
pub async fn sealed_state(database_url: &str, run_id: &str) -> serde_json::Value {
    let pool = sqlx::PgPool::connect(database_url).await.unwrap();
    let keys = countersign_crypto::Keyring::parse(KEYS).unwrap();
    let store = countersign_store::Store::new(pool.clone(), std::sync::Arc::new(keys));
    let bytes = store
        .load_state(countersign_core::RunId::parse(run_id).unwrap())
        .await
        .unwrap();
    pool.close().await;
    serde_json::from_slice(&bytes).unwrap()
}

/// How many `tool_write` audit events the run has: one for every write that landed.
pub async fn tool_writes(conn: &mut sqlx::PgConnection, run_id: &str) -> i64 {
    count(
        conn,
        &format!("SELECT count(*) FROM run_events WHERE run_id = '{run_id}'::uuid AND kind = 'tool_write'"),
    )
    .await
}

/// The lines of call `index`'s preview among a sealed state's `call_previews`; the preview
/// must not have failed.
pub fn preview_lines(previews: &[serde_json::Value], index: usize) -> Vec<String> {
    let preview = previews
        .iter()
        .find(|p| p["index"] == index)
        .unwrap_or_else(|| panic!("no preview of call {index}: {previews:?}"));
    assert_eq!(preview["failed"], false, "{preview}");
    preview["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_owned())
        .collect()
}
