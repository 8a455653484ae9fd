//! Faults injected into a running installation — a colleague's edit between approval and write,
//! a worker killed or stopped mid-turn, every database connection cut, one wake-up delivered
//! twice, a denial, an approval left to expire — and what must hold afterwards, read from the
//! content store and the journal: no approved write lost, none duplicated, none written
//! against a state the approver was not shown.
//!
//! Timing is made deterministic with advisory-lock gates: a trigger installed in the test
//! database makes a chosen statement of a service take a shared advisory lock that the test
//! holds, so the service stops exactly inside the transaction under test, where the test can
//! see it waiting (`pg_locks`, `pg_stat_activity`) before it acts and then lets it go on.

use std::time::{Duration, Instant};

use countersign_e2e::{
    approve_through_queue, chat_answer, count, counter_total, cut_connections, demo_script,
    fault_page, fault_page_model, fault_page_prompt, free_port, hold_gate, install_gate,
    messages_with_role, metrics, model_settings, publish_decision, publish_wake_up,
    referenced_files, release_gate, remove_gate, run_row, secs, seed_fault_pages, turn_digest,
    wait_for_card, wait_for_sql, wait_for_status, wait_until, waiting_at_gate,
    waiting_in_transaction, waiting_on_lock, Installation, ModelStub, Process, TempDir,
    MODEL_KEY_ENV, TURN_FENCE, TURN_GATE_WHEN,
};
use countersign_queue::parse_segment;
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use countersign_e2e::Database;

const PROMPT: &str = "Tighten the description of page 12 and add bicycle.png to its teaser.";
/// What the demo's model writes into page 12.
const NEW_DESCRIPTION: &str =
    "Bicycles for every road: repairs, rentals and advice from our workshop in the old town.";
/// How page 12's seeded description begins.
const OLD_DESCRIPTION: &str = "Welcome to the countersign demo site";
/// The teaser (element 5) images as seeded.
const SEEDED_TEASER: [&str; 2] = ["hero.jpg", "team.jpg"];
/// The teaser once the demo's turn is written.
const WRITTEN_TEASER: [&str; 3] = ["hero.jpg", "team.jpg", "bicycle.png"];

/// Gate of the turn transaction of a resume (see [`TURN_GATE_WHEN`]).
const TURN_GATE: i64 = 4242;
/// Gate of the coordinator's release of a turn (`waiting_for_approval` → `queued`).
const RELEASE_GATE: i64 = 4243;
const RELEASE_GATE_WHEN: &str = "OLD.status = 'waiting_for_approval' AND NEW.status = 'queued'";
/// Gate of a worker's claim of a resume segment.
const CLAIM_GATE: i64 = 4244;
const CLAIM_GATE_WHEN: &str =
    "OLD.status = 'queued' AND NEW.status = 'running' AND OLD.segment = 'resume'";
/// Gate of a run's settlement (`running` → `completed` or `failed`).
const SETTLE_GATE: i64 = 4245;
const SETTLE_GATE_WHEN: &str = "OLD.status = 'running' AND NEW.status IN ('completed', 'failed')";
const CLAIM: &str = r#"SELECT id AS "id!", lease_epoch AS "lease_epoch!", lease_expires_at"#;

/// One installation under test: its database, queues, agent file, a connection, and the
/// services started in the background (stopped before the database and queues go).
struct Site {
    db: Database,
    install: Installation,
    conn: PgConnection,
    dir: TempDir,
    services: Vec<Process>,
}

impl Site {
    async fn new(tag: &str, agent: &Value) -> Site {
        let db = Database::create(tag).await;
        let install = Installation {
            database_url: db.url(),
            queue_prefix: format!("e2e-{}", Uuid::now_v7()),
        };
        let dir = TempDir::new();
        install.configure(&dir.json("agent.json", agent));
        let conn = PgConnection::connect(&db.url()).await.unwrap();
        Site {
            db,
            install,
            conn,
            dir,
            services: Vec::new(),
        }
    }

    async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.db.url()).await.unwrap()
    }

    /// A colleague's open transaction holding `pages` `FOR UPDATE`, as an edit in plain SQL
    /// does; `COMMIT` on it lets them go.
    async fn colleague_holding(&self, pages: &[i64]) -> PgConnection {
        let mut colleague = self.connect().await;
        sqlx::query("BEGIN").execute(&mut colleague).await.unwrap();
        sqlx::query("SELECT uid FROM content.pages WHERE uid = ANY($1) FOR UPDATE")
            .bind(pages)
            .execute(&mut colleague)
            .await
            .unwrap();
        colleague
    }

    fn start_coordinator(&mut self) {
        let coordinator = self.install.spawn("countersign-coordinator", &[]);
        self.services.push(coordinator);
    }

    fn start_worker(&mut self, args: &[&str]) {
        let worker = self.worker(args);
        self.services.push(worker);
    }

    /// A worker the test keeps its hands on (to kill or stop it).
    fn worker(&self, args: &[&str]) -> Process {
        self.install
            .spawn_env("countersign-worker", args, &[(MODEL_KEY_ENV, "fake-key")])
    }

    /// Approves (or denies) card `seq` of the run through the queue, as `admin`, and checks the
    /// coordinator accepted it.
    fn decide(&self, run_id: &str, seq: i32, digest: &str, verdict: &[&str]) {
        let seq = seq.to_string();
        let mut args = vec![
            "decide", run_id, "--seq", &seq, "--digest", digest, "--as", "admin",
        ];
        args.extend_from_slice(verdict);
        let out = self.install.countersign_ok(&args);
        assert!(out.contains("decision accepted"), "{out}");
    }

    async fn approve_through_queue(&mut self, run_id: &str, seq: i32, digest: &str) {
        approve_through_queue(&self.install, &mut self.conn, run_id, seq, digest).await;
    }

    async fn digest(&mut self, run_id: &str) -> String {
        turn_digest(&mut self.conn, run_id).await
    }

    async fn finish(mut self) {
        self.services.clear();
        drop(self.conn);
        drop(self.dir);
        countersign_e2e::delete_topology(&self.install.queue_prefix).await;
        self.db.remove().await.unwrap();
    }
}

/// An agent configuration with the demo's two writers enabled and four eyes.
fn agent(model: Value, approval_deadline_secs: u64) -> Value {
    json!({
        "name": "seo-assistant",
        "model": model,
        "policy": {
            "allowed_groups": ["content", "editing"],
            "enabled_tools": ["update_page_metadata", "attach_file_to_content_element"]
        },
        "max_iterations": 8,
        "four_eyes": true,
        "approval_deadline_secs": approval_deadline_secs
    })
}

/// The demo's scripted model: read page 12, then propose its description and bicycle.png on
/// the teaser (element 5), then finish.
fn demo_model() -> Value {
    json!({"provider": "scripted", "script": demo_script()})
}

/// The journal and the audit trail of the run hold exactly the turn of suspension `seq`,
/// written once: one journal row per call (`calls` of them, nothing of another suspension),
/// all in one lease epoch, and one `tool_write` audit event per call, none an error. Returns
/// the epoch that wrote it.
async fn assert_written_once(conn: &mut PgConnection, run_id: &str, seq: i64, calls: i64) -> i64 {
    let journal: Vec<(i32, i32, i64)> = sqlx::query_as(
        "SELECT suspension_seq, call_index, lease_epoch FROM run_journal
         WHERE run_id = $1::uuid ORDER BY suspension_seq, call_index",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let keys: Vec<(i64, i64)> = journal
        .iter()
        .map(|(s, i, _)| (i64::from(*s), i64::from(*i)))
        .collect();
    let expected: Vec<(i64, i64)> = (0..calls).map(|i| (seq, i)).collect();
    assert_eq!(keys, expected, "run {run_id}: the journal of the turn");
    let epoch = journal[0].2;
    assert!(
        journal.iter().all(|(_, _, e)| *e == epoch),
        "run {run_id}: the turn was journaled by one segment: {journal:?}"
    );

    let writes: Vec<Value> = sqlx::query_scalar(
        "SELECT payload FROM run_events WHERE run_id = $1::uuid AND kind = 'tool_write'
         ORDER BY sequence",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        writes.len() as i64,
        calls,
        "run {run_id}: one tool_write event per write call: {writes:?}"
    );
    for (index, write) in writes.iter().enumerate() {
        assert_eq!(write["call_index"], index, "{write}");
        assert_eq!(write["suspension_seq"], seq, "{write}");
        assert_eq!(write["lease_epoch"], epoch, "{write}");
        assert_eq!(
            write["is_error"], false,
            "run {run_id}: a write failed: {write}"
        );
    }
    let accepted = count(
        conn,
        &format!(
            "SELECT count(*) FROM run_decisions WHERE run_id = '{run_id}'::uuid
             AND suspension_seq = {seq} AND outcome = 'accepted' AND approved"
        ),
    )
    .await;
    assert_eq!(accepted, 1, "run {run_id}: the turn was approved once");
    epoch
}

/// Nothing of the run's turn was written: no journal row, no `tool_write` event.
async fn assert_nothing_journaled(conn: &mut PgConnection, run_id: &str) {
    let journaled = count(
        conn,
        &format!("SELECT count(*) FROM run_journal WHERE run_id = '{run_id}'::uuid"),
    )
    .await;
    let writes = count(
        conn,
        &format!(
            "SELECT count(*) FROM run_events WHERE run_id = '{run_id}'::uuid AND kind = 'tool_write'"
        ),
    )
    .await;
    assert_eq!((journaled, writes), (0, 0), "run {run_id} wrote nothing");
}

async fn page_description(conn: &mut PgConnection, page: i64) -> String {
    sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = $1")
        .bind(page)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// The demo turn's effect on the content store: page 12's description and the teaser.
async fn assert_demo_site(conn: &mut PgConnection, written: bool, teaser: &[&str]) {
    let description = page_description(conn, 12).await;
    if written {
        assert_eq!(description, NEW_DESCRIPTION);
    } else {
        assert!(description.starts_with(OLD_DESCRIPTION), "{description}");
    }
    assert_eq!(referenced_files(conn, 5, "image").await, teaser);
}

/// The events of kind `kind` announced about the run, oldest first, as its audit trail records
/// them: each payload is the public event's fields but the run id. (The outbox keeps a row only
/// until the broker confirmed it; the audit row is written by the same statement.)
async fn announced(conn: &mut PgConnection, run_id: &str, kind: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT payload FROM run_events WHERE run_id = $1::uuid AND kind = $2 ORDER BY sequence",
    )
    .bind(run_id)
    .bind(kind)
    .fetch_all(conn)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_committed_while_the_approved_turn_waits_for_its_locks_re_suspends_the_turn_and_card_two_is_written_once_after_it(
) {
    let mut site = Site::new("faults_moved", &agent(demo_model(), 3600)).await;
    site.start_coordinator();
    site.start_worker(&["--poll-interval-secs", "1"]);
    let run = site.install.submit("seo-assistant", "editor", PROMPT);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;
    let digest = site.digest(&run).await;

    // A colleague attaches logo.svg to the teaser, as the demo's colleague does, in plain SQL
    // in a transaction still open when the approved turn starts: the turn's lock on the teaser
    // waits for it, inside the turn's transaction.
    let mut colleague = site.connect().await;
    sqlx::query("BEGIN").execute(&mut colleague).await.unwrap();
    sqlx::query(
        "INSERT INTO content.file_references (element, field, file, sorting)
         SELECT 5, 'image', 10, coalesce(max(sorting), 0) + 1
         FROM content.file_references WHERE element = 5 AND field = 'image'",
    )
    .execute(&mut colleague)
    .await
    .unwrap();
    site.approve_through_queue(&run, 1, &digest).await;
    wait_until(
        "the approved turn waits for its lock on the teaser",
        secs(30),
        async || {
            (waiting_in_transaction(&mut site.conn, "SELECT content.lock_rows").await == 1)
                .then_some(())
        },
    )
    .await;
    sqlx::query("COMMIT").execute(&mut colleague).await.unwrap();

    // The re-plan under the locks sees the colleague's reference: the attach moved, nothing
    // of the turn is written, and the run waits on card 2 with the moved index.
    wait_for_card(&mut site.conn, &run, 2, secs(30)).await;
    assert_demo_site(&mut site.conn, false, &["hero.jpg", "team.jpg", "logo.svg"]).await;
    assert_nothing_journaled(&mut site.conn, &run).await;
    let moved = announced(&mut site.conn, &run, "run.preview_moved").await;
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0]["suspension_seq"], 2);
    assert_eq!(moved[0]["stale_call_indexes"], json!([1]));
    assert_eq!(moved[0]["tools"], json!(["attach_file_to_content_element"]));
    let suspended = announced(&mut site.conn, &run, "run.suspended").await;
    assert_eq!(suspended.len(), 2, "{suspended:?}");
    assert_eq!(suspended[1]["suspension_seq"], 2);
    assert_eq!(suspended[1]["stale_call_indexes"], json!([1]));
    assert_eq!(suspended[1]["turn_digest"], digest.as_str(), "same calls");

    // Card 2 says where the reference lands now; approving it writes the turn once, there.
    let card = site.dir.0.join("card-2.json");
    let card = card.to_str().unwrap();
    site.install
        .countersign_ok(&["show", &run, "--as", "admin", "--save", card]);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(card).unwrap()).unwrap();
    let calls = &saved["cards"][0]["calls"];
    assert_eq!(saved["cards"][0]["suspension_seq"], 2, "{saved}");
    assert_eq!(
        (&calls[0]["moved"], &calls[1]["moved"]),
        (&json!(false), &json!(true))
    );
    assert!(
        calls[1]
            .to_string()
            .contains("field image: 3 reference(s) → 4, appended last"),
        "{saved}"
    );
    let decided = site.install.countersign_ok(&[
        "decide",
        &run,
        "--card",
        card,
        "--as",
        "admin",
        "--approve",
    ]);
    assert!(decided.contains("decision accepted"), "{decided}");
    wait_for_status(&mut site.conn, &run, "completed", secs(30)).await;

    assert_demo_site(
        &mut site.conn,
        true,
        &["hero.jpg", "team.jpg", "logo.svg", "bicycle.png"],
    )
    .await;
    assert_written_once(&mut site.conn, &run, 2, 2).await;
    assert_eq!(
        run_row(&mut site.conn, &run).await["termination_reason"],
        "completed"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_sql_error_in_a_preview_is_a_failed_line_naming_its_class_and_the_run_still_waits_for_its_card(
) {
    let mut site = Site::new("faults_sql_preview", &agent(demo_model(), 3600)).await;
    // A column every read of a page selects, renamed under the running installation: the same
    // error on every try, which no retry can cure.
    sqlx::raw_sql("ALTER TABLE content.pages RENAME COLUMN keywords TO keywords_moved")
        .execute(&mut site.conn)
        .await
        .unwrap();
    site.start_coordinator();
    site.start_worker(&["--poll-interval-secs", "1"]);
    let run = site.install.submit("seo-assistant", "editor", PROMPT);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;

    let card = site.dir.0.join("card-1.json");
    let card = card.to_str().unwrap();
    site.install
        .countersign_ok(&["show", &run, "--as", "admin", "--save", card]);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(card).unwrap()).unwrap();
    let calls = &saved["cards"][0]["calls"];
    assert_eq!(calls[0]["tool"], "update_page_metadata", "{saved}");
    assert_eq!(calls[0]["preview"]["kind"], "failed", "{saved}");
    assert_eq!(
        calls[0]["preview"]["lines"],
        json!([countersign_core::preview::failed_at_suspend_line(
            "database_schema_mismatch"
        )]),
        "the line names only the class: {saved}"
    );
    assert_eq!(
        calls[1]["preview"]["kind"], "shown",
        "the other call's preview is unaffected"
    );
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (&row["status"], &row["requeue_count"]),
        (&json!("waiting_for_approval"), &json!(0)),
        "suspended at once, never retried as if the error could pass: {row}"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_inside_its_turn_transaction_writes_nothing_and_the_rescuing_worker_writes_the_turn_once(
) {
    let mut site = Site::new("faults_kill", &agent(demo_model(), 3600)).await;
    site.start_coordinator();
    let mut doomed = site.worker(&["--lease-ttl-secs", "3", "--poll-interval-secs", "1"]);
    let run = site.install.submit("seo-assistant", "editor", PROMPT);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;
    let digest = site.digest(&run).await;

    install_gate(
        &mut site.conn,
        "turn",
        "runs",
        "UPDATE",
        TURN_GATE_WHEN,
        TURN_GATE,
    )
    .await;
    hold_gate(&mut site.conn, TURN_GATE).await;
    site.approve_through_queue(&run, 1, &digest).await;
    wait_until(
        "the turn transaction waits at the gate",
        secs(30),
        async || {
            (waiting_in_transaction(&mut site.conn, TURN_FENCE).await == 1
                && waiting_at_gate(&mut site.conn, TURN_GATE).await >= 1)
                .then_some(())
        },
    )
    .await;
    let doomed_epoch = run_row(&mut site.conn, &run).await["lease_epoch"]
        .as_i64()
        .unwrap();

    // Killed mid-transaction; its backend finishes the statement, finds no client, rolls back.
    doomed.sigkill();
    release_gate(&mut site.conn, TURN_GATE).await;
    remove_gate(&mut site.conn, "turn", "runs").await;
    wait_for_sql(
        &mut site.conn,
        "the killed worker's transaction is gone and its lease has expired",
        secs(30),
        &format!(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity
                                WHERE datname = current_database() AND pid <> pg_backend_pid()
                                  AND xact_start IS NOT NULL)
                AND (SELECT lease_expires_at < now() FROM runs WHERE id = '{run}'::uuid)"
        ),
    )
    .await;
    assert_demo_site(&mut site.conn, false, &SEEDED_TEASER).await;
    assert_nothing_journaled(&mut site.conn, &run).await;

    // The reaper hands the run on; a second worker resumes it and writes the turn once.
    let reaper = site
        .install
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
        summary.contains("requeued=1") && summary.contains("outcome_unknown=0"),
        "{summary}"
    );
    site.start_worker(&["--poll-interval-secs", "1"]);
    wait_for_status(&mut site.conn, &run, "completed", secs(30)).await;

    assert_demo_site(&mut site.conn, true, &WRITTEN_TEASER).await;
    let epoch = assert_written_once(&mut site.conn, &run, 1, 2).await;
    assert_eq!(epoch, doomed_epoch + 1, "written by the rescuer's lease");
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (&row["termination_reason"], &row["requeue_count"]),
        (&json!("completed"), &json!(1)),
        "{row}"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_turn_waiting_on_a_colleagues_lock_keeps_its_lease_and_every_other_of_its_worker_and_the_reaper_leaves_both_runs(
) {
    let mut site = Site::new("faults_busy_row", &agent(demo_model(), 3600)).await;
    // A second agent whose model never answers: its run holds a lease for as long as the test.
    let silent = ModelStub::silent();
    let mut patient = agent(model_settings(&silent), 3600);
    patient["name"] = json!("patient-assistant");
    site.install
        .configure(&site.dir.json("patient.json", &patient));
    site.start_coordinator();
    site.start_worker(&["--poll-interval-secs", "1", "--lease-ttl-secs", "3"]);
    let run = site.install.submit("seo-assistant", "editor", PROMPT);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;
    let digest = site.digest(&run).await;
    let other = site
        .install
        .submit("patient-assistant", "editor", "Take your time.");
    wait_for_status(&mut site.conn, &other, "running", secs(30)).await;

    // A colleague's transaction holds page 12, which the approved turn writes.
    let mut colleague = site.colleague_holding(&[12]).await;
    site.approve_through_queue(&run, 1, &digest).await;
    wait_until(
        "the approved turn waits on the colleague's lock inside its transaction",
        secs(30),
        async || (waiting_in_transaction(&mut site.conn, "").await == 1).then_some(()),
    )
    .await;

    // Three lease lifetimes go by with the turn waiting: it holds no run row, so the worker's
    // one heartbeat renews both leases, its own and the other run's, and neither expires.
    let held_since = Instant::now();
    while held_since.elapsed() < secs(10) {
        for id in [&run, &other] {
            let expired: bool =
                sqlx::query_scalar("SELECT lease_expires_at < now() FROM runs WHERE id = $1::uuid")
                    .bind(id)
                    .fetch_one(&mut site.conn)
                    .await
                    .unwrap();
            assert!(
                !expired,
                "the lease of {id} expired after {:?} behind the waiting turn",
                held_since.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(waiting_in_transaction(&mut site.conn, "").await, 1);

    // A reaper pass finds no lease expired and leaves both runs alone.
    let reaped = site
        .install
        .command("countersign-reaper")
        .args(["--backoff-secs", "0", "--dispatch-grace-secs", "0"])
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&reaped.stdout);
    assert!(reaped.status.success(), "{summary}");
    assert!(summary.contains("requeued=0"), "{summary}");

    // The colleague commits; the turn takes its locks, compares, writes.
    sqlx::query("COMMIT").execute(&mut colleague).await.unwrap();
    wait_for_status(&mut site.conn, &run, "completed", secs(30)).await;
    assert_demo_site(&mut site.conn, true, &WRITTEN_TEASER).await;
    assert_written_once(&mut site.conn, &run, 1, 2).await;
    for id in [&run, &other] {
        let row = run_row(&mut site.conn, id).await;
        assert_eq!(
            (&row["lease_epoch"], &row["requeue_count"]),
            (&json!(if id == &run { 2 } else { 1 }), &json!(0)),
            "one lease per segment, none rescued: {row}"
        );
    }
    assert_eq!(
        run_row(&mut site.conn, &other).await["status"],
        "running",
        "still in its model call, under its first lease"
    );
    site.finish().await;
}

/// A worker with a pool of two connections, whose approved turns hold one at most. Two approved
/// turns wait on a colleague's locks: the first inside its transaction, the second for the
/// turns' connection. Meanwhile a third run is claimed, runs its model and suspends on its card
/// through the other connection; once the colleague commits, both turns write once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_turns_waiting_on_a_colleagues_locks_leave_a_small_pool_to_the_other_runs() {
    let model = ModelStub::responding(fault_page_model);
    let mut site = Site::new("faults_small_pool", &agent(model_settings(&model), 3600)).await;
    seed_fault_pages(&mut site.conn, 3).await;
    site.start_coordinator();
    site.start_worker(&["--poll-interval-secs", "1", "--pool-size", "2"]);
    let held: Vec<String> = (1..=2)
        .map(|n| {
            let prompt = fault_page_prompt(fault_page(n));
            site.install.submit("seo-assistant", "editor", &prompt)
        })
        .collect();
    for run in &held {
        wait_for_card(&mut site.conn, run, 1, secs(30)).await;
    }

    // A colleague's transaction holds both pages the approved turns write.
    let mut colleague = site
        .colleague_holding(&[fault_page(1), fault_page(2)])
        .await;
    for run in &held {
        let digest = site.digest(run).await;
        site.approve_through_queue(run, 1, &digest).await;
    }
    wait_for_sql(
        &mut site.conn,
        "both approvals released their runs to the worker",
        secs(30),
        "SELECT count(*) = 2 FROM runs WHERE status = 'running' AND segment = 'resume'",
    )
    .await;
    wait_until(
        "one approved turn waits on the colleague's lock inside its transaction",
        secs(30),
        async || (waiting_in_transaction(&mut site.conn, "").await == 1).then_some(()),
    )
    .await;

    // The third run gets the pool's other connection for its claim, its reads and its
    // suspension, while both turns still wait.
    let third = site
        .install
        .submit("seo-assistant", "editor", &fault_page_prompt(fault_page(3)));
    wait_for_card(&mut site.conn, &third, 1, secs(30)).await;
    assert_eq!(
        waiting_in_transaction(&mut site.conn, "").await,
        1,
        "the second turn waits for the turns' connection, not inside a transaction"
    );
    for run in &held {
        assert_eq!(run_row(&mut site.conn, run).await["status"], "running");
    }

    sqlx::query("COMMIT").execute(&mut colleague).await.unwrap();
    for run in &held {
        wait_for_status(&mut site.conn, run, "completed", secs(30)).await;
        assert_written_once(&mut site.conn, run, 1, 2).await;
    }
    let digest = site.digest(&third).await;
    site.approve_through_queue(&third, 1, &digest).await;
    wait_for_status(&mut site.conn, &third, "completed", secs(30)).await;
    assert_written_once(&mut site.conn, &third, 1, 2).await;
    site.finish().await;
}

/// The fault pages: page 9000+n with teaser element 9100+n (no images), n = 1..=RUNS.
const RUNS: i64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_every_database_connection_while_ten_approvals_are_in_flight_loses_and_duplicates_no_write(
) {
    let model = ModelStub::responding(fault_page_model);
    let mut site = Site::new("faults_cut", &agent(model_settings(&model), 3600)).await;
    seed_fault_pages(&mut site.conn, RUNS).await;
    site.start_coordinator();
    site.start_worker(&["--poll-interval-secs", "1"]);
    site.start_worker(&["--poll-interval-secs", "1"]);
    let runs: Vec<(i64, String)> = (1..=RUNS)
        .map(|n| {
            let page = fault_page(n);
            let prompt = fault_page_prompt(page);
            (
                page,
                site.install.submit("seo-assistant", "editor", &prompt),
            )
        })
        .collect();
    wait_for_sql(
        &mut site.conn,
        "every run waits on card 1",
        secs(30),
        &format!(
            "SELECT count(*) = {RUNS} FROM runs
             WHERE status = 'waiting_for_approval' AND suspension_seq = 1"
        ),
    )
    .await;
    let mut digests = Vec::new();
    for (_, run) in &runs {
        digests.push(site.digest(run).await);
    }

    // Half the approvals get as far as their turn transactions; the other half are held in the
    // coordinator's transaction that releases the turn.
    install_gate(
        &mut site.conn,
        "turn",
        "runs",
        "UPDATE",
        TURN_GATE_WHEN,
        TURN_GATE,
    )
    .await;
    install_gate(
        &mut site.conn,
        "release",
        "runs",
        "UPDATE",
        RELEASE_GATE_WHEN,
        RELEASE_GATE,
    )
    .await;
    hold_gate(&mut site.conn, TURN_GATE).await;
    let broker = site.install.broker().await;
    let half = (RUNS / 2) as usize;
    for ((_, run), digest) in runs.iter().zip(&digests).take(half) {
        publish_decision(&broker, run, 1, digest, true, "admin").await;
    }
    wait_until(
        "five turn transactions wait at the gate",
        secs(30),
        async || (waiting_at_gate(&mut site.conn, TURN_GATE).await == half as i64).then_some(()),
    )
    .await;
    hold_gate(&mut site.conn, RELEASE_GATE).await;
    for ((_, run), digest) in runs.iter().zip(&digests).skip(half) {
        publish_decision(&broker, run, 1, digest, true, "admin").await;
    }
    // The coordinator gates decisions at once: each of the five is held in its own release.
    wait_until("five releases wait at the gate", secs(30), async || {
        (waiting_at_gate(&mut site.conn, RELEASE_GATE).await == half as i64).then_some(())
    })
    .await;

    // Every connection of every service to this database is cut.
    let cut = cut_connections(&mut site.conn).await;
    assert!(cut > half as i64, "only {cut} connections were cut");

    // The interrupted segments are run again under their leases and the interrupted decisions
    // gated again: they come back to the gates, not to the reaper or to a refusal.
    wait_until(
        "the interrupted work comes back to the gates",
        secs(20),
        async || {
            (waiting_at_gate(&mut site.conn, TURN_GATE).await == half as i64
                && waiting_at_gate(&mut site.conn, RELEASE_GATE).await == half as i64)
                .then_some(())
        },
    )
    .await;
    release_gate(&mut site.conn, RELEASE_GATE).await;
    release_gate(&mut site.conn, TURN_GATE).await;
    wait_for_sql(
        &mut site.conn,
        "every run completed",
        secs(45),
        &format!("SELECT count(*) = {RUNS} FROM runs WHERE status = 'completed'"),
    )
    .await;

    let outcomes: Vec<(String, i64)> = sqlx::query_as(
        "SELECT outcome, count(*) FROM run_decisions GROUP BY outcome ORDER BY outcome",
    )
    .fetch_all(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(
        outcomes,
        vec![("accepted".to_owned(), RUNS)],
        "no decision refused"
    );
    let requests = model.bodies();
    for (page, run) in &runs {
        let row = run_row(&mut site.conn, run).await;
        assert_eq!(row["termination_reason"], "completed", "{row}");
        assert_eq!(
            page_description(&mut site.conn, *page).await,
            format!("Fault page {page}, rewritten.")
        );
        assert_eq!(
            referenced_files(&mut site.conn, page + 100, "image").await,
            ["hero.jpg"],
            "page {page}'s teaser holds the approved reference once"
        );
        let epoch = assert_written_once(&mut site.conn, run, 1, 2).await;
        assert_eq!(
            (epoch, &row["lease_epoch"], &row["requeue_count"]),
            (2, &json!(2), &json!(0)),
            "written by the resume's own lease, retried in place, not rescued by the reaper: {row}"
        );
        // What the model was told the calls did: their journaled results, never an
        // infrastructure failure.
        let prompt = fault_page_prompt(*page);
        let told: Vec<Vec<String>> = requests
            .iter()
            .filter(|r| messages_with_role(r, "user").first() == Some(&prompt))
            .map(|r| messages_with_role(r, "tool"))
            .filter(|results| !results.is_empty())
            .collect();
        assert!(
            !told.is_empty(),
            "page {page}: the model never heard of its turn"
        );
        for results in &told {
            assert_eq!(results.len(), 2, "{results:?}");
            assert!(
                results[0].starts_with(&format!("Page [{page}] updated")),
                "{results:?}"
            );
            assert!(results[1].starts_with("Attached file [7]"), "{results:?}");
            assert!(
                results.iter().all(|r| !r.contains("failed (")),
                "an infrastructure error became a tool result: {results:?}"
            );
        }
    }
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_with_every_slot_busy_exits_within_its_grace_and_hands_both_runs_back_the_waiting_wake_up_as_a_fresh_message(
) {
    let model = ModelStub::silent();
    let mut site = Site::new("faults_term_full", &agent(model_settings(&model), 3600)).await;
    site.start_coordinator();
    let grace = Duration::from_secs(3);
    // One slot: the second run's wake-up waits in the worker for it.
    let mut worker = site.worker(&["--lease-ttl-secs", "3", "--concurrency", "1"]);
    let first = site
        .install
        .submit("seo-assistant", "editor", "Improve page 12.");
    wait_until("the segment waits on the model", secs(30), async || {
        (!model.requests().is_empty()).then_some(())
    })
    .await;
    let second = site
        .install
        .submit("seo-assistant", "editor", "Improve page 13.");
    all_dispatched(&mut site.conn, 1).await;
    // Time for the second wake-up to reach the worker.
    tokio::time::sleep(secs(1)).await;

    worker.sigterm();
    let status = worker
        .exit_within(grace + secs(5))
        .await
        .expect("the worker exits within its grace period and a few seconds");
    assert!(status.success(), "the worker exited with {status}");
    for run in [&first, &second] {
        let row = run_row(&mut site.conn, run).await;
        assert_eq!(
            (&row["status"], &row["requeue_count"], &row["lease_owner"]),
            (&json!("queued"), &json!(0), &Value::Null),
            "handed back or never taken, the retry budget untouched: {row}"
        );
    }
    assert_eq!(model.requests().len(), 1, "the second run never started");
    // Its wake-up is back in the queue as a fresh message: a restart does not count against
    // the delivery limit after which the quorum queue would dead-letter it.
    let broker = site.install.broker().await;
    let mut queue = broker
        .consume(&broker.topology().segments(), 8)
        .await
        .unwrap();
    let back = tokio::time::timeout(secs(10), queue.next())
        .await
        .expect("the second run's wake-up is in the queue")
        .unwrap()
        .unwrap();
    assert_eq!(
        parse_segment(&back.body).unwrap().to_string(),
        second,
        "the wake-up handed back"
    );
    assert_eq!(
        (back.redelivered, back.delivery_count()),
        (false, 0),
        "handed back as a fresh message"
    );
    back.ack().await.unwrap();
    assert!(
        tokio::time::timeout(secs(1), queue.next()).await.is_err(),
        "and only that one"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_with_sigterm_mid_segment_exits_zero_and_hands_the_run_back_without_spending_its_retry_budget(
) {
    let model = ModelStub::silent();
    let mut site = Site::new("faults_term", &agent(model_settings(&model), 3600)).await;
    site.start_coordinator();
    // A lease of 3 s is also the worker's shutdown grace.
    let grace = Duration::from_secs(3);
    let mut worker = site.worker(&["--lease-ttl-secs", "3", "--poll-interval-secs", "1"]);
    let run = site
        .install
        .submit("seo-assistant", "editor", "Improve page 12.");
    wait_until("the segment waits on the model", secs(30), async || {
        let row = run_row(&mut site.conn, &run).await;
        (row["status"] == "running" && !model.requests().is_empty()).then_some(())
    })
    .await;

    worker.sigterm();
    let asked = Instant::now();
    let status = worker
        .exit_within(grace + secs(5))
        .await
        .expect("the worker exits within its grace period and a few seconds");
    let took = asked.elapsed();
    assert!(status.success(), "the worker exited with {status}");
    assert!(
        took >= grace,
        "the worker waited its grace period first ({took:?})"
    );
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (
            &row["status"],
            &row["segment"],
            &row["requeue_count"],
            &row["lease_owner"],
            &row["lease_epoch"]
        ),
        (
            &json!("queued"),
            &json!("start"),
            &json!(0),
            &Value::Null,
            &json!(1)
        ),
        "handed back, the retry budget untouched: {row}"
    );

    // Another worker takes it up and completes it (the model answers now).
    let script = site.dir.json(
        "reads-and-finishes.json",
        &json!({"turns": [
            {"content": "Reading.", "tool_calls": [{"name": "read_page_metadata", "arguments": {"uid": 12}}]},
            {"content": "Page 12 reads well; nothing to change."}
        ]}),
    );
    let scripted = site.dir.json(
        "scripted.json",
        &agent(json!({"provider": "scripted", "script": script}), 3600),
    );
    site.install.countersign_ok(&["agents", "put", &scripted]);
    site.start_worker(&["--poll-interval-secs", "1"]);
    wait_for_status(&mut site.conn, &run, "completed", secs(30)).await;
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (
            &row["termination_reason"],
            &row["requeue_count"],
            &row["lease_epoch"]
        ),
        (&json!("completed"), &json!(0), &json!(2)),
        "{row}"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holding_two_leases_renews_them_with_one_statement_a_beat_and_shows_both_on_its_metrics(
) {
    let model = ModelStub::silent();
    let mut site = Site::new("faults_beat", &agent(model_settings(&model), 3600)).await;
    site.start_coordinator();
    let port = free_port();
    // A lease of 3 s is renewed every second.
    site.start_worker(&[
        "--lease-ttl-secs",
        "3",
        "--http-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    let runs = [
        site.install
            .submit("seo-assistant", "editor", "Improve page 12."),
        site.install
            .submit("seo-assistant", "editor", "Improve page 13."),
    ];
    wait_until("both segments wait on the model", secs(30), async || {
        (model.requests().len() == 2).then_some(())
    })
    .await;
    const BEATS: &str = "countersign_heartbeat_statements_total";
    // From the first beat on (a second after the first lease was taken).
    let before = wait_until("the first beat", secs(30), async || {
        let metrics = metrics(port).await;
        metrics
            .contains(BEATS)
            .then(|| counter_total(&metrics, BEATS))
    })
    .await;
    let first = lease_expiries(&mut site.conn, &runs).await;
    let since = Instant::now();
    // Three lease lifetimes: with no renewal both leases would have run out.
    tokio::time::sleep(secs(9)).await;
    let metrics = metrics(port).await;
    let elapsed = since.elapsed().as_secs_f64();
    assert_eq!(
        counter_total(&metrics, "countersign_leases_held"),
        2.0,
        "{metrics}"
    );
    // A beat a second at most, each one statement for both leases; one a lease would be two
    // a second.
    let beaten = counter_total(&metrics, BEATS) - before;
    assert!(
        beaten >= 1.0 && beaten <= elapsed + 1.0,
        "{beaten} renewal statements in {elapsed:.1} s for two leases renewed every second"
    );
    let now = lease_expiries(&mut site.conn, &runs).await;
    for (run, (was, is)) in runs.iter().zip(first.iter().zip(&now)) {
        assert!(is > was, "the lease of {run} was renewed: {was} → {is}");
        let row = run_row(&mut site.conn, run).await;
        assert_eq!(
            (&row["status"], &row["lease_epoch"]),
            (&json!("running"), &json!(1)),
            "still its first lease: {row}"
        );
    }
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_wake_ups_is_claimed_in_batched_statements_each_run_once() {
    const RUNS: usize = 24;
    let model = ModelStub::silent();
    let mut site = Site::new("faults_batch", &agent(model_settings(&model), 3600)).await;
    site.start_coordinator();
    let runs: Vec<String> = (0..RUNS)
        .map(|page| {
            site.install
                .submit("seo-assistant", "editor", &format!("Improve page {page}."))
        })
        .collect();
    // Every wake-up waits in the queue before the worker starts.
    all_dispatched(&mut site.conn, RUNS).await;
    let port = free_port();
    let slots = RUNS.to_string();
    // No polling: every claim answers a wake-up.
    site.start_worker(&[
        "--concurrency",
        &slots,
        "--poll-interval-secs",
        "3600",
        "--http-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    wait_until("every segment waits on the model", secs(30), async || {
        (model.requests().len() == RUNS).then_some(())
    })
    .await;
    let statements = counter_total(&metrics(port).await, "countersign_claim_statements_total");
    // The first wake-up may be claimed alone; those that arrive while a statement is in
    // flight go together in the next. One statement a wake-up would be 24.
    assert!(
        (1.0..=(RUNS / 2) as f64).contains(&statements),
        "{statements} claim statements for {RUNS} wake-ups delivered together"
    );
    for run in &runs {
        let row = run_row(&mut site.conn, run).await;
        assert_eq!(
            (&row["status"], &row["lease_epoch"]),
            (&json!("running"), &json!(1)),
            "claimed once: {row}"
        );
    }
    assert_eq!(model.requests().len(), RUNS, "one model call a run");
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_queued_behind_one_in_flight_are_written_together_and_a_lease_taken_meanwhile_writes_nothing(
) {
    const RUNS: usize = 4;
    let model = ModelStub::responding(|_| Some(chat_answer("Page 12 reads well.", &[])));
    let mut site = Site::new("faults_settle", &agent(model_settings(&model), 3600)).await;
    // Every settlement of a run waits at the gate while the test holds it.
    install_gate(
        &mut site.conn,
        "settle",
        "runs",
        "UPDATE",
        SETTLE_GATE_WHEN,
        SETTLE_GATE,
    )
    .await;
    hold_gate(&mut site.conn, SETTLE_GATE).await;
    site.start_coordinator();
    let port = free_port();
    site.start_worker(&[
        "--concurrency",
        &RUNS.to_string(),
        "--http-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    let runs: Vec<String> = (0..RUNS)
        .map(|page| {
            site.install
                .submit("seo-assistant", "editor", &format!("Review page {page}."))
        })
        .collect();
    wait_until("one settlement at the gate", secs(30), async || {
        (waiting_at_gate(&mut site.conn, SETTLE_GATE).await == 1).then_some(())
    })
    .await;
    wait_until("every run answered", secs(30), async || {
        (model.requests().len() == RUNS).then_some(())
    })
    .await;
    // The other three settle as soon as they have their answer, and queue behind the one in
    // flight: time for them to get there.
    tokio::time::sleep(secs(2)).await;
    // A run whose row no statement holds (not the one at the gate) gets a new lease, as the
    // reaper and another worker would give it.
    let taken: String = sqlx::query_scalar(
        "UPDATE runs SET lease_owner = 'another-worker', lease_epoch = lease_epoch + 1
         WHERE id = (SELECT id FROM runs WHERE status = 'running' LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING id::text",
    )
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    release_gate(&mut site.conn, SETTLE_GATE).await;
    for run in runs.iter().filter(|r| **r != taken) {
        wait_for_status(&mut site.conn, run, "completed", secs(30)).await;
    }
    let row = run_row(&mut site.conn, &taken).await;
    assert_eq!(
        (&row["status"], &row["lease_owner"]),
        (&json!("running"), &json!("another-worker")),
        "the settlement under the old lease wrote nothing: {row}"
    );
    assert_eq!(
        count(
            &mut site.conn,
            &format!(
                "SELECT count(*) FROM run_events WHERE run_id = '{taken}' AND kind = 'run.completed'"
            ),
        )
        .await,
        0,
        "nor announced anything"
    );
    let statements = counter_total(&metrics(port).await, "countersign_settle_statements_total");
    assert_eq!(
        statements, 2.0,
        "the one held at the gate, then one for the three queued behind it"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_whose_wake_ups_were_lost_are_claimed_by_the_poll_once_each_as_many_as_slots_are_free()
{
    const RUNS: usize = 12;
    const SLOTS: usize = 5;
    let model = ModelStub::silent();
    let mut site = Site::new("faults_poll", &agent(model_settings(&model), 3600)).await;
    site.start_coordinator();
    for page in 0..RUNS {
        site.install
            .submit("seo-assistant", "editor", &format!("Improve page {page}."));
    }
    all_dispatched(&mut site.conn, RUNS).await;
    // Every wake-up is taken off the queue and dropped, as by a consumer that acked them and
    // died: only the poll can find these runs now.
    let broker = site.install.broker().await;
    let mut taker = broker
        .consume(&broker.topology().segments(), RUNS as u16)
        .await
        .unwrap();
    for _ in 0..RUNS {
        let delivery = tokio::time::timeout(secs(10), taker.next())
            .await
            .expect("a wake-up")
            .expect("the consumer runs")
            .unwrap();
        delivery.ack().await.unwrap();
    }
    drop(taker);
    site.start_worker(&[
        "--concurrency",
        &SLOTS.to_string(),
        "--poll-interval-secs",
        "1",
    ]);
    wait_until("a segment in every slot", secs(30), async || {
        (model.requests().len() == SLOTS).then_some(())
    })
    .await;
    // Two more polls find no free slot.
    tokio::time::sleep(secs(2)).await;
    assert_eq!(model.requests().len(), SLOTS, "one model call a slot");
    let by_status: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT status, count(*), max(lease_epoch) FROM runs GROUP BY status ORDER BY status",
    )
    .fetch_all(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(
        by_status,
        [
            ("queued".to_owned(), (RUNS - SLOTS) as i64, 0),
            ("running".to_owned(), SLOTS as i64, 1)
        ],
        "as many claimed as slots are free, each once"
    );
    site.finish().await;
}

/// Waits until `runs` runs are queued and their wake-ups published.
async fn all_dispatched(conn: &mut PgConnection, runs: usize) {
    wait_for_sql(
        conn,
        "every run queued and dispatched",
        secs(30),
        &format!(
            "SELECT count(*) = {runs} FROM runs WHERE status = 'queued' AND dispatched_at IS NOT NULL"
        ),
    )
    .await;
}

/// The lease expiry of each run, in seconds since the epoch.
async fn lease_expiries(conn: &mut PgConnection, runs: &[String]) -> Vec<f64> {
    let mut expiries = Vec::new();
    for run in runs {
        let expiry: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM lease_expires_at)::float8 FROM runs WHERE id = $1::uuid",
        )
        .bind(run)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        expiries.push(expiry);
    }
    expiries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_resume_wake_up_delivered_to_two_workers_is_claimed_once_and_its_writes_land_once() {
    let mut site = Site::new("faults_twice", &agent(demo_model(), 3600)).await;
    site.start_coordinator();
    // One segment at a time each, and no polling: each claims only from a delivery.
    let only_deliveries = ["--concurrency", "1", "--poll-interval-secs", "3600"];
    let mut workers = [site.worker(&only_deliveries), site.worker(&only_deliveries)];
    let run = site.install.submit("seo-assistant", "editor", PROMPT);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;
    let digest = site.digest(&run).await;

    // Both claims of the resume are held at the gate until both workers have made theirs.
    install_gate(
        &mut site.conn,
        "claim",
        "runs",
        "UPDATE",
        CLAIM_GATE_WHEN,
        CLAIM_GATE,
    )
    .await;
    hold_gate(&mut site.conn, CLAIM_GATE).await;
    site.approve_through_queue(&run, 1, &digest).await;
    let broker = site.install.broker().await;
    publish_wake_up(&broker, &run).await;
    wait_until("both workers claim the run", secs(30), async || {
        (waiting_on_lock(&mut site.conn, CLAIM).await == 2).then_some(())
    })
    .await;
    release_gate(&mut site.conn, CLAIM_GATE).await;
    wait_for_status(&mut site.conn, &run, "completed", secs(30)).await;

    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        row["lease_epoch"], 2,
        "one claim for the start, one for the resume: {row}"
    );
    assert_demo_site(&mut site.conn, true, &WRITTEN_TEASER).await;
    assert_written_once(&mut site.conn, &run, 1, 2).await;

    // Both deliveries were settled, the lost claim's too: nothing is left on the queue.
    for worker in &mut workers {
        worker.sigterm();
        let status = worker
            .exit_within(secs(15))
            .await
            .expect("the worker stops");
        assert!(status.success(), "{status}");
    }
    let mut segments = broker
        .consume(&broker.topology().segments(), 10)
        .await
        .unwrap();
    let left = tokio::time::timeout(secs(2), segments.next()).await;
    assert!(left.is_err(), "a wake-up was left unsettled");
    drop(segments);
    site.finish().await;
}

/// A model that proposes the demo's turn on page 12 and, told of a denial, gives up.
fn proposing_model(request: &Value) -> Option<Value> {
    Some(match messages_with_role(request, "assistant").len() {
        0 => chat_answer(
            "I propose a tighter description and bicycle.png on the teaser.",
            &[
                (
                    "update_page_metadata",
                    json!({"uid": 12, "description": NEW_DESCRIPTION}),
                ),
                (
                    "attach_file_to_content_element",
                    json!({"content_element": 5, "file": 13, "field": "image"}),
                ),
            ],
        ),
        _ => chat_answer("Understood; I leave page 12 as it is.", &[]),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_with_a_comment_through_the_queue_reaches_the_model_and_writes_nothing() {
    let model = ModelStub::responding(proposing_model);
    let mut site = Site::new("faults_deny", &agent(model_settings(&model), 3600)).await;
    site.start_coordinator();
    site.start_worker(&["--poll-interval-secs", "1"]);
    let run = site.install.submit("seo-assistant", "editor", PROMPT);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;
    let digest = site.digest(&run).await;

    let comment = "Keep the old description; no new images this season.";
    site.decide(&run, 1, &digest, &["--deny", "--comment", comment]);
    wait_for_status(&mut site.conn, &run, "completed", secs(30)).await;

    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(row["termination_reason"], "approval_denied", "{row}");
    let requests = model.bodies();
    assert_eq!(
        requests.len(),
        2,
        "one call to propose, one after the denial"
    );
    assert_eq!(
        messages_with_role(&requests[1], "tool"),
        [
            format!("Error: tool \"update_page_metadata\" was denied by the operator. Comment: {comment}"),
            format!("Error: tool \"attach_file_to_content_element\" was denied by the operator. Comment: {comment}"),
        ]
    );
    assert_demo_site(&mut site.conn, false, &SEEDED_TEASER).await;
    let writes = count(
        &mut site.conn,
        &format!(
            "SELECT count(*) FROM run_events WHERE run_id = '{run}'::uuid AND kind = 'tool_write'"
        ),
    )
    .await;
    assert_eq!(writes, 0);
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_left_past_its_deadline_is_cancelled_approval_expired_by_the_reaper_and_a_late_approval_is_refused(
) {
    let mut site = Site::new("faults_expiry", &agent(demo_model(), 1)).await;
    site.start_coordinator();
    site.start_worker(&["--poll-interval-secs", "1"]);
    let run = site.install.submit("seo-assistant", "editor", PROMPT);
    wait_for_card(&mut site.conn, &run, 1, secs(30)).await;
    let digest = site.digest(&run).await;
    wait_for_sql(
        &mut site.conn,
        "the approval deadline passed by the database clock",
        secs(10),
        &format!("SELECT approval_deadline < now() FROM runs WHERE id = '{run}'::uuid"),
    )
    .await;

    let reaper = site.install.command("countersign-reaper").output().unwrap();
    let summary = String::from_utf8_lossy(&reaper.stdout);
    assert!(
        reaper.status.success(),
        "{}",
        String::from_utf8_lossy(&reaper.stderr)
    );
    assert!(summary.contains("approvals_expired=1"), "{summary}");
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (&row["status"], &row["termination_reason"]),
        (&json!("cancelled"), &json!("approval_expired")),
        "{row}"
    );
    assert_eq!(
        announced(&mut site.conn, &run, "run.cancelled").await.len(),
        1
    );

    // The approver who comes back to card 1 finds it expired; nothing is written.
    let late = site.install.countersign(&[
        "decide",
        &run,
        "--seq",
        "1",
        "--digest",
        &digest,
        "--as",
        "admin",
        "--approve",
    ]);
    let stderr = String::from_utf8_lossy(&late.stderr);
    assert_eq!(late.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not_awaiting_approval"), "{stderr}");
    assert_eq!(
        run_row(&mut site.conn, &run).await,
        row,
        "the run is untouched"
    );
    assert_demo_site(&mut site.conn, false, &SEEDED_TEASER).await;
    assert_nothing_journaled(&mut site.conn, &run).await;
    site.finish().await;
}
