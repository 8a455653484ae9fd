//! Pauses and silence: a worker frozen (SIGSTOP) inside its transactions, and a service whose
//! network to PostgreSQL or RabbitMQ goes silent (a proxy that drops everything, closing
//! nothing). What must hold: the frozen or cut-off process gives up its locks and its leases
//! within the lease's time to live, its runs complete elsewhere, the others' work goes on, it
//! turns unready while it cannot work and ready again once it can, without a restart, and it
//! comes back whole — no connection of its pool left inside a transaction, its late writes
//! refused by the fence.
//!
//! `make test` runs the short versions (silences of `SILENCE_SECS`, 20 s by default); `make
//! chaos` runs them again with `COUNTERSIGN_E2E_SILENCE_SECS=60`.

use std::time::{Duration, Instant};

use countersign_e2e::{
    amqp_addr, approve_through_queue, chat_answer, count, counter_total, fault_page,
    fault_page_model, fault_page_prompt, free_port, hold_gate, http_get, install_gate,
    messages_with_role, metrics, model_settings, referenced_files, release_gate, run_row, secs,
    seed_fault_pages, turn_digest, wait_for_card, wait_for_sql, wait_for_status, wait_until,
    waiting_at_gate, Database, Installation, ModelStub, Process, Proxy, TempDir, MODEL_KEY_ENV,
    TURN_GATE_WHEN,
};
use countersign_testkit::Reply;
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// The lease the workers of these tests hold: renewed every 2 s; their sessions' idle
/// transactions are ended after 3 s.
const TTL: u64 = 6;
const TTL_ARG: &str = "6";

/// How long a silence lasts: `COUNTERSIGN_E2E_SILENCE_SECS`, 20 s by default.
fn silence() -> Duration {
    let secs = std::env::var("COUNTERSIGN_E2E_SILENCE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

/// The prompt of a run whose first model call is held until the test releases it: a run whose
/// worker holds its lease for as long as the test wants.
fn held_prompt(page: i64) -> String {
    format!("Hold {}", fault_page_prompt(page))
}

/// The fault pages' model ([`fault_page_model`]); a run asked with [`held_prompt`] waits for its
/// first answer until [`ModelStub::release`].
fn silence_model(request: &Value) -> Reply {
    let prompt = messages_with_role(request, "user")
        .into_iter()
        .next()
        .unwrap_or_default();
    let held = prompt.starts_with("Hold ");
    let asked: Value = serde_json::from_str(&request.to_string().replace("Hold Edit", "Edit"))
        .expect("the request, as JSON");
    let answer = fault_page_model(&asked)
        .unwrap_or_else(|| chat_answer("I cannot tell which page to edit.", &[]));
    let first = messages_with_role(request, "assistant").is_empty();
    let reply = Reply::new(200, &answer.to_string());
    if held && first {
        reply.held()
    } else {
        reply
    }
}

/// One installation under test, with fault pages, a fake model, and its services.
struct Site {
    db: Database,
    install: Installation,
    conn: PgConnection,
    model: ModelStub,
    services: Vec<Process>,
    _dir: TempDir,
}

/// A service started with `/metrics` and `/readyz` on a port of its own.
struct Served {
    process: Process,
    port: u16,
}

impl Served {
    /// Waits until `/readyz` says `ready` (200, or anything else), within `within`; how long
    /// it took. `/readyz` must answer every time, within its second.
    async fn wait_readiness(&self, what: &str, ready: bool, within: Duration) -> Duration {
        let started = Instant::now();
        wait_until(what, within, async || {
            let asked = Instant::now();
            let answer = http_get(self.port, "/readyz");
            let (status, _) = answer.unwrap_or_else(|| panic!("{what}: /readyz answered nothing"));
            assert!(
                asked.elapsed() < Duration::from_secs(2),
                "{what}: /readyz took {:?}",
                asked.elapsed()
            );
            (status.contains(" 200") == ready).then_some(())
        })
        .await;
        started.elapsed()
    }

    async fn counter(&self, name: &str) -> f64 {
        counter_total(&metrics(self.port).await, name)
    }
}

impl Site {
    async fn new(tag: &str, pages: i64) -> Site {
        let model = ModelStub::serve(|seen| silence_model(&seen[seen.len() - 1].body));
        let db = Database::create(tag).await;
        let install = Installation {
            database_url: db.url(),
            queue_prefix: format!("e2e-silence-{}", Uuid::now_v7()),
        };
        let dir = TempDir::new();
        let agent = json!({
            "name": "seo-assistant",
            "model": model_settings(&model),
            "policy": {
                "allowed_groups": ["content", "editing"],
                "enabled_tools": ["update_page_metadata", "attach_file_to_content_element"]
            },
            "max_iterations": 8,
            "four_eyes": true,
            "approval_deadline_secs": 3600
        });
        install.configure(&dir.json("agent.json", &agent));
        let mut conn = PgConnection::connect(&db.url()).await.unwrap();
        seed_fault_pages(&mut conn, pages).await;
        Site {
            db,
            install,
            conn,
            model,
            services: Vec::new(),
            _dir: dir,
        }
    }

    /// Starts `binary` with `args`, serving on a port of its own, with `env` besides the
    /// installation's; waits until it is ready.
    async fn serve(&self, binary: &str, args: &[&str], env: &[(&str, &str)]) -> Served {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut all = args.to_vec();
        all.extend(["--http-addr", &addr]);
        let mut env = env.to_vec();
        env.push((MODEL_KEY_ENV, "fake-key"));
        let mut process = self.install.spawn_env(binary, &all, &env);
        process
            .wait_ready(port, secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        Served { process, port }
    }

    /// A worker on the short lease, polling every second.
    async fn worker(&self, env: &[(&str, &str)]) -> Served {
        let args = ["--lease-ttl-secs", TTL_ARG, "--poll-interval-secs", "1"];
        self.serve("countersign-worker", &args, env).await
    }

    fn start_coordinator(&mut self) {
        let coordinator = self.install.spawn("countersign-coordinator", &[]);
        self.services.push(coordinator);
    }

    /// A reaper passing every second, requeueing at once.
    async fn reaper(&self) -> Served {
        let args = [
            "--every",
            "1",
            "--backoff-secs",
            "0",
            "--dispatch-grace-secs",
            "1",
        ];
        self.serve("countersign-reaper", &args, &[]).await
    }

    fn submit(&self, prompt: &str) -> String {
        self.install.submit("seo-assistant", "editor", prompt)
    }

    /// Approves card 1 of the run through the queue, once it waits on it.
    async fn approve(&mut self, run_id: &str) {
        wait_for_card(&mut self.conn, run_id, 1, secs(60)).await;
        let digest = turn_digest(&mut self.conn, run_id).await;
        approve_through_queue(&self.install, &mut self.conn, run_id, 1, &digest).await;
    }

    /// The run of fault page `page`, submitted, approved and completed within `within`.
    async fn run_through(&mut self, page: i64, within: Duration) -> String {
        let run = self.submit(&fault_page_prompt(page));
        self.approve(&run).await;
        wait_for_status(&mut self.conn, &run, "completed", within).await;
        run
    }

    async fn finish(mut self) {
        self.services.clear();
        drop(self.conn);
        countersign_e2e::delete_topology(&self.install.queue_prefix).await;
        self.db.remove().await.unwrap();
    }
}

/// The run of fault page `page` completed with its approved turn written once, by one lease
/// epoch; returns that epoch.
async fn assert_written_once(conn: &mut PgConnection, run_id: &str, page: i64) -> i64 {
    let row = run_row(conn, run_id).await;
    assert_eq!(
        (&row["status"], &row["termination_reason"]),
        (&json!("completed"), &json!("completed")),
        "{row}"
    );
    let description: String =
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = $1")
            .bind(page)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(description, format!("Fault page {page}, rewritten."));
    assert_eq!(
        referenced_files(conn, page + 100, "image").await,
        ["hero.jpg"],
        "the approved reference, once"
    );
    let journal: Vec<(i32, i32, i64)> = sqlx::query_as(
        "SELECT suspension_seq, call_index, lease_epoch FROM run_journal
         WHERE run_id = $1::uuid ORDER BY suspension_seq, call_index",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let keys: Vec<(i32, i32)> = journal.iter().map(|(s, i, _)| (*s, *i)).collect();
    assert_eq!(keys, [(1, 0), (1, 1)], "the turn journaled once");
    assert!(
        journal.iter().all(|(_, _, e)| *e == journal[0].2),
        "one segment wrote the turn: {journal:?}"
    );
    let writes = count(
        conn,
        &format!(
            "SELECT count(*) FROM run_events WHERE run_id = '{run_id}'::uuid AND kind = 'tool_write'"
        ),
    )
    .await;
    assert_eq!(writes, 2, "one tool_write per call");
    journal[0].2
}

/// Sessions of `application` inside a transaction that has sent nothing for a second or more.
async fn idle_in_transaction(conn: &mut PgConnection, application: &str) -> i64 {
    count(
        conn,
        &format!(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = '{application}'
               AND state LIKE 'idle in transaction%' AND state_change < now() - interval '1 second'"
        ),
    )
    .await
}

/// The reaper's passes so far, and how many ended within a second.
async fn reaper_passes(reaper: &Served) -> (f64, f64) {
    let body = metrics(reaper.port).await;
    let within_a_second = body
        .lines()
        .find(|l| l.starts_with("countersign_reaper_pass_duration_seconds_bucket{le=\"1\"}"))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or(0.0);
    (
        counter_total(&body, "countersign_reaper_pass_duration_seconds_count"),
        within_a_second,
    )
}

/// Gate of the approved turn's write of a page: the content store's `UPDATE` of its
/// description, inside the turn transaction, with the page locked.
const APPLY_GATE: i64 = 4270;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_inside_its_approved_turn_is_rescued_within_its_lease_while_other_runs_complete_and_comes_back_working_with_its_late_write_refused(
) {
    let mut site = Site::new("silence_pause", 6).await;
    site.start_coordinator();
    let reaper = site.reaper().await;
    let paused = site.worker(&[]).await;
    let (page, others, afterwards) = (fault_page(1), [fault_page(2), fault_page(3)], fault_page(4));
    let run = site.submit(&fault_page_prompt(page));
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;
    let digest = turn_digest(&mut site.conn, &run).await;

    // The approved turn stops at its write of the page: the page locked, the write not yet made.
    let described =
        format!("NEW.uid = {page} AND NEW.description = 'Fault page {page}, rewritten.'");
    install_gate(
        &mut site.conn,
        "apply",
        "content.pages",
        "UPDATE",
        &described,
        APPLY_GATE,
    )
    .await;
    hold_gate(&mut site.conn, APPLY_GATE).await;
    approve_through_queue(&site.install, &mut site.conn, &run, 1, &digest).await;
    wait_until(
        "the approved turn waits at its write",
        secs(30),
        async || (waiting_at_gate(&mut site.conn, APPLY_GATE).await == 1).then_some(()),
    )
    .await;
    let paused_epoch = run_row(&mut site.conn, &run).await["lease_epoch"]
        .as_i64()
        .unwrap();

    // Frozen inside the turn; the write goes through on the server, and the transaction stays
    // open with the page locked, as a stopped container's would.
    paused.process.sigstop();
    let pause = Instant::now();
    release_gate(&mut site.conn, APPLY_GATE).await;
    let rescuer = site.worker(&[]).await;

    // Other runs go on meanwhile.
    let mut unrelated = Vec::new();
    for other in others {
        unrelated.push((other, site.submit(&fault_page_prompt(other))));
    }
    for (_, other) in &unrelated {
        site.approve(other).await;
    }

    // The frozen session is ended, its lease expires, the rescuer writes the turn.
    wait_for_status(&mut site.conn, &run, "completed", secs(TTL + 10)).await;
    let rescued_after = pause.elapsed();
    for (other, id) in &unrelated {
        wait_for_status(&mut site.conn, id, "completed", secs(30)).await;
        assert_written_once(&mut site.conn, id, *other).await;
    }
    assert!(
        paused.process.is_stopped(),
        "all of it happened during the pause"
    );
    let epoch = assert_written_once(&mut site.conn, &run, page).await;
    assert!(epoch > paused_epoch, "the rescuer's lease wrote the turn");
    let (passes, quick) = reaper_passes(&reaper).await;
    assert!(passes >= 1.0);
    assert_eq!(quick, passes, "every reaper pass ended within a second");
    println!("rescued {rescued_after:?} after the pause; reaper passes {passes}, all under 1 s");

    // The paused worker goes on after 15 s: its lease is gone, its write refused.
    let left = Duration::from_secs(15).saturating_sub(pause.elapsed());
    tokio::time::sleep(left).await;
    paused.process.sigcont();
    paused
        .wait_readiness("the continued worker is ready", true, secs(30))
        .await;
    wait_until(
        "the continued worker learns its lease is lost",
        secs(30),
        async || (paused.counter("countersign_leases_lost_total").await >= 1.0).then_some(()),
    )
    .await;
    assert_eq!(assert_written_once(&mut site.conn, &run, page).await, epoch);
    assert_eq!(
        idle_in_transaction(&mut site.conn, "countersign-worker").await,
        0
    );

    // And it works: alone now, it claims, runs, suspends, relays and writes a run.
    drop(rescuer);
    let later = site.run_through(afterwards, secs(60)).await;
    assert_written_once(&mut site.conn, &later, afterwards).await;
    site.finish().await;
}

/// Where inside its work a worker is paused: a gate on a statement of one of its transactions.
struct Point {
    name: &'static str,
    /// The gated table, the trigger's event and its `WHEN`; for a read, the event is `LOCK`:
    /// the test holds the table locked, and the read waits for it.
    table: &'static str,
    event: &'static str,
    when: String,
    /// Whether the run reaches it only once approved.
    after_approval: bool,
}

/// The transactions a worker opens, each gated at a statement inside it, for the run of `page`.
fn points(page: i64) -> Vec<Point> {
    let runs = |when: &str| when.to_owned();
    vec![
        Point {
            name: "claim",
            table: "runs",
            event: "UPDATE",
            when: runs("OLD.status = 'queued' AND NEW.status = 'running'"),
            after_approval: false,
        },
        Point {
            // The start segment previews the turn's reference of a file on the page's teaser
            // in a read-only snapshot transaction: its read of the element waits for the test's
            // lock of the table.
            name: "segment start (a preview's snapshot)",
            table: "content.elements",
            event: "LOCK",
            when: format!("uid = {}", page + 100),
            after_approval: false,
        },
        Point {
            name: "suspension",
            table: "runs",
            event: "UPDATE",
            when: runs("OLD.status = 'running' AND NEW.status = 'waiting_for_approval'"),
            after_approval: false,
        },
        Point {
            name: "approved turn (its fence)",
            table: "runs",
            event: "UPDATE",
            when: runs(TURN_GATE_WHEN),
            after_approval: true,
        },
        Point {
            name: "settle",
            table: "runs",
            event: "UPDATE",
            when: runs("OLD.status = 'running' AND NEW.status IN ('completed', 'failed')"),
            after_approval: true,
        },
        Point {
            name: "relay (the delete of what the broker confirmed)",
            table: "event_outbox",
            event: "DELETE",
            when: "OLD.kind = 'run.completed'".to_owned(),
            after_approval: true,
        },
    ]
}

/// Installs a gate (see `countersign_e2e::install_gate`) that also serves a `DELETE`; for a
/// `LOCK` point, nothing (the gate is the table's lock, [`hold_point`]).
async fn install_point(conn: &mut PgConnection, point: &Point, key: i64) {
    let gate = if point.event == "LOCK" {
        None
    } else {
        Some(format!(
            "CREATE TRIGGER e2e_pause BEFORE {} ON {} FOR EACH ROW WHEN ({}) \
             EXECUTE FUNCTION e2e_pause()",
            point.event, point.table, point.when
        ))
    };
    for sql in [
        "DROP TRIGGER IF EXISTS e2e_pause ON runs".to_owned(),
        "DROP TRIGGER IF EXISTS e2e_pause ON content.pages".to_owned(),
        "DROP TRIGGER IF EXISTS e2e_pause ON event_outbox".to_owned(),
        format!(
            "CREATE OR REPLACE FUNCTION e2e_pause() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_advisory_xact_lock_shared({key});
             IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END $$"
        ),
    ]
    .into_iter()
    .chain(gate)
    {
        sqlx::query(&sql)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Closes the point's gate on `conn`: the advisory lock of its trigger, or the table's lock in
/// a transaction of the test's.
async fn hold_point(conn: &mut PgConnection, point: &Point, key: i64) {
    if point.event == "LOCK" {
        sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
        sqlx::query(&format!(
            "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            point.table
        ))
        .execute(&mut *conn)
        .await
        .unwrap();
    } else {
        hold_gate(conn, key).await;
    }
}

/// Opens the point's gate again.
async fn release_point(conn: &mut PgConnection, point: &Point, key: i64) {
    if point.event == "LOCK" {
        sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    } else {
        release_gate(conn, key).await;
    }
}

/// How many sessions of the worker wait at the point: at its gate, or for the table's lock
/// inside a transaction.
async fn waiting_at_point(conn: &mut PgConnection, point: &Point, key: i64) -> i64 {
    if point.event == "LOCK" {
        count(
            conn,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'countersign-worker'
               AND wait_event_type = 'Lock' AND xact_start < query_start",
        )
        .await
    } else {
        waiting_at_gate(conn, key).await
    }
}

/// Gate of the pauses inside each kind of transaction.
const PAUSE_GATE: i64 = 4271;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_inside_each_kind_of_transaction_it_opens_comes_back_fully_working_and_every_run_is_written_once(
) {
    let mut site = Site::new("silence_points", 7).await;
    site.start_coordinator();
    let _reaper = site.reaper().await;
    let worker = site.worker(&[]).await;
    for n in 0..points(0).len() {
        let page = fault_page(n as i64 + 1);
        let point = &points(page)[n];
        install_point(&mut site.conn, point, PAUSE_GATE).await;
        // The test's own connection for the gate: a table lock holds its transaction open.
        let mut gate = PgConnection::connect(&site.db.url()).await.unwrap();
        hold_point(&mut gate, point, PAUSE_GATE).await;
        let run = site.submit(&fault_page_prompt(page));
        if point.after_approval {
            site.approve(&run).await;
        }
        wait_until(
            &format!("the worker waits inside its {}", point.name),
            secs(60),
            async || (waiting_at_point(&mut site.conn, point, PAUSE_GATE).await >= 1).then_some(()),
        )
        .await;

        // Frozen there past its sessions' idle limit and its lease, by the database clock.
        worker.process.sigstop();
        let stopped: String = sqlx::query_scalar("SELECT now()::text")
            .fetch_one(&mut site.conn)
            .await
            .unwrap();
        release_point(&mut gate, point, PAUSE_GATE).await;
        wait_for_sql(
            &mut site.conn,
            &format!("{}: the pause outlasts the lease", point.name),
            secs(60),
            &format!(
                "SELECT now() > '{stopped}'::timestamptz + interval '{} seconds'",
                TTL + 1
            ),
        )
        .await;
        worker.process.sigcont();

        if !point.after_approval {
            site.approve(&run).await;
        }
        wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
        assert_written_once(&mut site.conn, &run, page).await;
        worker
            .wait_readiness(
                &format!("{}: the worker is ready", point.name),
                true,
                secs(30),
            )
            .await;
        assert_eq!(
            idle_in_transaction(&mut site.conn, "countersign-worker").await,
            0,
            "{}: no session of the worker is left inside a transaction",
            point.name
        );
        println!("paused inside the {}: the run completed once", point.name);
    }
    for sql in [
        "DROP TRIGGER IF EXISTS e2e_pause ON event_outbox",
        "DROP FUNCTION e2e_pause()",
    ] {
        sqlx::query(sql).execute(&mut site.conn).await.unwrap();
    }
    // Fully working: a run of its own, claimed, suspended, relayed, approved and written.
    let last = site.run_through(fault_page(7), secs(60)).await;
    assert_written_once(&mut site.conn, &last, fault_page(7)).await;
    let discarded = worker
        .counter("countersign_db_connections_discarded_total")
        .await;
    println!("connections the worker's pools closed instead of handing out: {discarded}");
    site.finish().await;
}

/// The run of `page` is held in its first model call by the worker `holder`, which owns its
/// lease: it is `running`, and the model has its request.
async fn held_by(site: &mut Site, page: i64) -> String {
    let run = site.submit(&held_prompt(page));
    wait_for_status(&mut site.conn, &run, "running", secs(60)).await;
    wait_until(
        "the model holds the run's first call",
        secs(30),
        async || (site.model.in_flight() >= 1).then_some(()),
    )
    .await;
    run
}

/// A worker cut off from `what` by a blackhole at `proxy` for [`silence`]: it turns unready
/// within the lease, its held run is taken over by `rescuer` — after `requeues` requeues: 0 when
/// it handed the run back, 1 when its lease had to expire — and completes there; it is ready
/// again after the heal without a restart, and then runs a run alone.
async fn worker_cut_off(
    mut site: Site,
    what: &str,
    proxy: &Proxy,
    (cut, rescuer): (Served, Served),
    run: String,
    requeues: i64,
) {
    let (held_page, later_page) = (fault_page(1), fault_page(2));
    let epoch = run_row(&mut site.conn, &run).await["lease_epoch"]
        .as_i64()
        .unwrap();
    proxy.blackhole();
    let silent = Instant::now();
    let unready = cut
        .wait_readiness(
            &format!("cut off from {what}, the worker is unready"),
            false,
            secs(TTL),
        )
        .await;
    wait_for_sql(
        &mut site.conn,
        &format!("cut off from {what}, the worker's run is taken over"),
        secs(TTL + 10),
        &format!(
            "SELECT status = 'running' AND lease_epoch > {epoch} FROM runs WHERE id = '{run}'::uuid"
        ),
    )
    .await;
    let taken_over = silent.elapsed();
    assert_eq!(
        run_row(&mut site.conn, &run).await["requeue_count"],
        json!(requeues),
        "requeues of the run when it was taken over"
    );
    site.model.release();
    site.approve(&run).await;
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    let completed = silent.elapsed();
    assert!(
        proxy_silent_still(&silent),
        "the run completed while the worker was cut off"
    );
    assert_written_once(&mut site.conn, &run, held_page).await;

    tokio::time::sleep(silence().saturating_sub(silent.elapsed())).await;
    proxy.pass();
    let healed = cut
        .wait_readiness(
            &format!("healed from {what}, the worker is ready"),
            true,
            secs(60),
        )
        .await;
    println!(
        "cut off from {what} for {:?}: unready after {unready:?}, its run taken over after {taken_over:?} and completed after {completed:?}, ready {healed:?} after the heal",
        silence()
    );
    drop(rescuer);
    let later = site.run_through(later_page, secs(60)).await;
    assert_written_once(&mut site.conn, &later, later_page).await;
    assert_eq!(
        idle_in_transaction(&mut site.conn, "countersign-worker").await,
        0
    );
    drop(cut);
    site.finish().await;
}

/// Whether the silence begun at `since` is still going on (it lasts [`silence`]).
fn proxy_silent_still(since: &Instant) -> bool {
    since.elapsed() < silence()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_postgresql_goes_unready_within_its_lease_its_run_completes_elsewhere_and_it_is_ready_again_after_the_heal(
) {
    let mut site = Site::new("silence_worker_pg", 2).await;
    site.start_coordinator();
    site.services.push(site.reaper().await.process);
    let proxy = Proxy::to(&site.db.url());
    let through = proxy.address_for(&site.db.url());
    let cut = site.worker(&[("DATABASE_URL", &through)]).await;
    let run = held_by(&mut site, fault_page(1)).await;
    let rescuer = site.worker(&[]).await;
    worker_cut_off(site, "PostgreSQL", &proxy, (cut, rescuer), run, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_rabbitmq_goes_unready_within_its_lease_hands_its_run_back_and_is_ready_again_after_the_heal(
) {
    let mut site = Site::new("silence_worker_amqp", 2).await;
    site.start_coordinator();
    site.services.push(site.reaper().await.process);
    let proxy = Proxy::to(&amqp_addr());
    let through = proxy.address_for(&amqp_addr());
    let cut = site
        .worker(&[
            ("AMQP_ADDR", &through),
            ("COUNTERSIGN_AMQP_HEARTBEAT_SECS", "2"),
        ])
        .await;
    let run = held_by(&mut site, fault_page(1)).await;
    let rescuer = site.worker(&[]).await;
    worker_cut_off(site, "RabbitMQ", &proxy, (cut, rescuer), run, 0).await;
}

/// Publishes approvals of `runs`' cards as `admin`; their decision ids.
async fn approve_all(site: &mut Site, runs: &[String]) -> Vec<String> {
    let broker = site.install.broker().await;
    let mut ids = Vec::new();
    for run in runs {
        wait_for_card(&mut site.conn, run, 1, secs(120)).await;
        let digest = turn_digest(&mut site.conn, run).await;
        ids.push(countersign_e2e::publish_decision(&broker, run, 1, &digest, true, "admin").await);
    }
    ids
}

/// Every decision of `ids` ended in an outcome on record (accepted, with its event), none in
/// the dead-letter queue.
async fn assert_every_decision_answered(site: &mut Site, ids: &[String]) {
    let answered = count(
        &mut site.conn,
        &format!(
            "SELECT count(*) FROM run_decisions WHERE outcome = 'accepted' AND decision_id::text IN ({})",
            ids.iter().map(|i| format!("'{i}'")).collect::<Vec<_>>().join(",")
        ),
    )
    .await;
    let announced = count(
        &mut site.conn,
        "SELECT count(*) FROM run_events WHERE kind = 'decision.accepted'",
    )
    .await;
    assert_eq!((answered, announced), (ids.len() as i64, ids.len() as i64));
    let broker = site.install.broker().await;
    let dead = broker
        .message_count(&broker.topology().dead_letters())
        .await
        .unwrap();
    assert_eq!(dead, 0, "nothing was dead-lettered");
}

/// A coordinator cut off from `what`, beside another: unready within the lease, every decision
/// published meanwhile answered, ready again after the heal.
async fn coordinator_cut_off(mut site: Site, what: &str, proxy: &Proxy, cut: Served) {
    let pages: Vec<i64> = (1..=6).map(fault_page).collect();
    let runs: Vec<String> = pages
        .iter()
        .map(|p| site.submit(&fault_page_prompt(*p)))
        .collect();
    for run in &runs {
        wait_for_card(&mut site.conn, run, 1, secs(120)).await;
    }
    // The approvals go out as the link goes silent: the broker hands some of them to the cut
    // coordinator, which holds them (cut off from PostgreSQL) or never hears of them (cut off
    // from RabbitMQ, until the broker takes them back).
    proxy.blackhole();
    let silent = Instant::now();
    let ids = approve_all(&mut site, &runs).await;
    let unready = cut
        .wait_readiness(
            &format!("cut off from {what}, the coordinator is unready"),
            false,
            secs(TTL),
        )
        .await;
    tokio::time::sleep(silence().saturating_sub(silent.elapsed())).await;
    proxy.pass();
    let healed = cut
        .wait_readiness(
            &format!("healed from {what}, the coordinator is ready"),
            true,
            secs(60),
        )
        .await;
    for (run, page) in runs.iter().zip(&pages) {
        wait_for_status(&mut site.conn, run, "completed", secs(120)).await;
        assert_written_once(&mut site.conn, run, *page).await;
    }
    assert_every_decision_answered(&mut site, &ids).await;
    let gated_by_it = cut.counter("countersign_decisions_total").await;
    println!(
        "coordinator cut off from {what} for {:?}: unready after {unready:?}, ready {healed:?} after the heal, {} decisions answered, {gated_by_it} of them by it",
        silence(),
        ids.len()
    );
    drop(cut);
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_cut_off_from_postgresql_goes_unready_holds_its_decisions_and_answers_every_one_after_the_heal(
) {
    let mut site = Site::new("silence_coordinator_pg", 6).await;
    site.start_coordinator();
    site.services.push(site.reaper().await.process);
    site.services.push(site.worker(&[]).await.process);
    let proxy = Proxy::to(&site.db.url());
    let through = proxy.address_for(&site.db.url());
    let cut = site
        .serve(
            "countersign-coordinator",
            &[],
            &[("DATABASE_URL", &through)],
        )
        .await;
    coordinator_cut_off(site, "PostgreSQL", &proxy, cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_cut_off_from_rabbitmq_goes_unready_the_broker_hands_its_decisions_to_the_other_and_every_one_is_answered(
) {
    let mut site = Site::new("silence_coordinator_amqp", 6).await;
    site.start_coordinator();
    site.services.push(site.reaper().await.process);
    site.services.push(site.worker(&[]).await.process);
    let proxy = Proxy::to(&amqp_addr());
    let through = proxy.address_for(&amqp_addr());
    let cut = site
        .serve(
            "countersign-coordinator",
            &[],
            &[
                ("AMQP_ADDR", &through),
                ("COUNTERSIGN_AMQP_HEARTBEAT_SECS", "2"),
            ],
        )
        .await;
    coordinator_cut_off(site, "RabbitMQ", &proxy, cut).await;
}

/// Terminates every connection of the services to this database (not the test's own), as a
/// failing network or a restarted pooler would; how many were cut.
async fn cut_services(conn: &mut PgConnection) -> i64 {
    count(
        conn,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name LIKE 'countersign-%'",
    )
    .await
}

/// Approvals gated while every connection of the services is cut, again and again.
const APPROVALS: i64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_approvals_gated_while_every_connection_is_cut_over_and_over_are_each_answered_and_written_once(
) {
    let mut site = Site::new("silence_cuts", APPROVALS).await;
    site.start_coordinator();
    site.start_coordinator();
    site.services.push(site.reaper().await.process);
    site.services.push(site.worker(&[]).await.process);
    site.services.push(site.worker(&[]).await.process);
    let pages: Vec<i64> = (1..=APPROVALS).map(fault_page).collect();
    let runs: Vec<String> = pages
        .iter()
        .map(|p| site.submit(&fault_page_prompt(*p)))
        .collect();
    wait_for_sql(
        &mut site.conn,
        "every run waits on card 1",
        secs(240),
        &format!(
            "SELECT count(*) = {APPROVALS} FROM runs
             WHERE status = 'waiting_for_approval' AND suspension_seq = 1"
        ),
    )
    .await;

    // A cutter terminates every service connection while the approvals are gated and written.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let url = site.db.url();
    let cutter = tokio::spawn(async move {
        let mut admin = PgConnection::connect(&url).await.unwrap();
        let mut passes = 0;
        let mut cut = 0;
        loop {
            cut += cut_services(&mut admin).await;
            passes += 1;
            tokio::select! {
                _ = &mut stopped => return (passes, cut),
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    });
    let ids = approve_all(&mut site, &runs).await;
    wait_for_sql(
        &mut site.conn,
        "every approved run completed",
        secs(300),
        &format!("SELECT count(*) = {APPROVALS} FROM runs WHERE status = 'completed'"),
    )
    .await;
    let _ = stop.send(());
    let (passes, cut) = cutter.await.unwrap();
    for (run, page) in runs.iter().zip(&pages) {
        assert_written_once(&mut site.conn, run, *page).await;
    }
    assert_every_decision_answered(&mut site, &ids).await;
    println!("{APPROVALS} approvals answered and written once under {passes} passes cutting {cut} connections");
    site.finish().await;
}
