//! `make chaos`: many approved runs through the real services while workers are killed and
//! restarted or paused (SIGSTOP) for longer than their lease and continued, a colleague keeps
//! editing the same content element, and the reaper runs on a short period. At the end every approved write is checked against the card its approval was
//! made on, from the content store itself.
//!
//! The demo site's teaser (content element 5) is copied into one teaser per ten runs. Each run
//! has an agent of its own whose scripted model attaches `bicycle.png` to one of them with an
//! alternative text naming the run, so every reference in the content store can be traced to
//! the run that wrote it; runs that share a teaser compete for it, and the colleague edits
//! teasers at random. The approver reads each card as the
//! `countersign inbox` does (the run's sealed state, opened with the installation's key) and
//! approves the digest and suspension number of that card; what the card said the attach
//! would do (`N reference(s) → N+1`) is kept. A reference landed against unseen state is one
//! whose position is not the `N+1` of the last card approved for its run.
//!
//! Prints runs, writes expected / landed / lost / duplicated / landed against unseen state, and
//! exits non-zero unless the last four are 0 and every run completed.
//!
//! Environment: `CHAOS_RUNS` (default 200), `CHAOS_WORKERS` (default 3), `CHAOS_DEADLINE_SECS`
//! (default 600), `CHAOS_SPREAD_SECS` (default 0: every run requested at the start; otherwise
//! the requests are spread evenly over that many seconds, so runs are still arriving and in
//! flight for at least that long, whatever the machine's speed), plus `DATABASE_URL` and
//! `AMQP_ADDR` as for the tests.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_core::{RunId, SuspendedRunState};
use countersign_crypto::Keyring;
use countersign_e2e::{amqp_addr, Database, Installation, Process, KEYS};
use countersign_queue::{Broker, QueueConfig, Topology};
use countersign_store::Store;
use rand::Rng;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

/// The line of the attach preview that says where the reference lands.
const LANDS: &str = "field image: ";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn alternative(i: usize) -> String {
    format!("chaos run {i}")
}

/// What an approver keeps of the card they approved.
#[derive(Debug, Clone, Copy)]
struct Approved {
    seq: u32,
    /// The position the card said the reference would take.
    lands_at: i64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let runs = env_number("CHAOS_RUNS", 200) as usize;
    let workers = env_number("CHAOS_WORKERS", 3).max(2) as usize;
    let deadline = Duration::from_secs(env_number("CHAOS_DEADLINE_SECS", 600));
    let spread = Duration::from_secs(env_number("CHAOS_SPREAD_SECS", 0));
    match chaos(runs, workers, deadline, spread).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn chaos(
    runs: usize,
    workers: usize,
    deadline: Duration,
    spread: Duration,
) -> anyhow::Result<bool> {
    let db = Database::create("chaos").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("chaos-{}", Uuid::now_v7()),
    };
    let outcome = drive(&install, runs, workers, deadline, spread).await;
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
    outcome
}

async fn drive(
    install: &Installation,
    runs: usize,
    workers: usize,
    deadline: Duration,
    spread: Duration,
) -> anyhow::Result<bool> {
    let scripts = tempdir()?;
    install.countersign_ok(&["migrate", "--with-content"]);
    install.countersign_ok(&["seed-demo-site"]);
    install.countersign_ok(&["producers", "allow", "guest", "acting-user", "*"]);
    install.countersign_ok(&["producers", "allow", "guest", "approver", "*"]);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&install.database_url)
        .await?;
    let mut teasers = Vec::new();
    for _ in 0..runs.div_ceil(10).max(2) {
        let uid: i64 = sqlx::query_scalar(
            "INSERT INTO content.elements (pid, ctype, header, bodytext, colpos, sorting, language)
             SELECT pid, ctype, header, bodytext, colpos, sorting + 1, language
             FROM content.elements WHERE uid = 5 RETURNING uid",
        )
        .fetch_one(&pool)
        .await?;
        teasers.push(uid);
    }
    for i in 0..runs {
        let script = scripts.join(format!("run-{i}.json"));
        std::fs::write(
            &script,
            serde_json::to_vec(&json!({"turns": [
                {"content": "Attaching.", "tool_calls": [{
                    "name": "attach_file_to_content_element",
                    "arguments": {"content_element": teasers[i % teasers.len()], "file": 13,
                                  "field": "image",
                                  "alternative": alternative(i)}
                }]},
                {"content": "Attached."}
            ]}))?,
        )?;
        sqlx::query(
            "INSERT INTO agents (name, active, model, allowed_groups, allowed_tools, enabled_tools,
                                 max_iterations, four_eyes, approval_deadline_seconds)
             VALUES ($1, true, $2, '{}', '{}', '{attach_file_to_content_element}', 4, false, 3600)",
        )
        .bind(format!("chaos-{i}"))
        .bind(json!({"provider": "scripted", "script": script}))
        .execute(&pool)
        .await?;
    }
    let store = Store::new(pool.clone(), Arc::new(Keyring::parse(KEYS)?));

    let _coordinator = install.spawn("countersign-coordinator", &[]);
    let worker_args = ["--lease-ttl-secs", "3", "--poll-interval-secs", "1"];
    let mut fleet: Vec<Process> = (0..workers)
        .map(|_| install.spawn("countersign-worker", &worker_args))
        .collect();
    let _reaper = install.spawn(
        "countersign-reaper",
        &[
            "--every",
            "1",
            "--max-requeues",
            "1000",
            "--backoff-secs",
            "0",
            "--dispatch-grace-secs",
            "2",
            "--republish-after-secs",
            "2",
        ],
    );

    let broker = Broker::connect(QueueConfig::new(
        amqp_addr(),
        Topology::new(&install.queue_prefix),
    ))
    .await?;
    let mut run_ids = BTreeMap::new();
    let mut requests = Vec::with_capacity(runs);
    for i in 0..runs {
        let request_id = Uuid::now_v7();
        requests.push(serde_json::to_vec(&json!({
            "type": "countersign.run_request", "version": 1,
            "request_id": request_id, "agent": format!("chaos-{i}"),
            "acting_user": "editor", "prompt": format!("Attach the bicycle, run {i}."),
        }))?);
        run_ids.insert(request_id, i);
    }
    let mut requested = 0;

    let colleague = tokio::spawn(colleague(pool.clone(), teasers.clone()));
    let started = Instant::now();
    let mut approved: BTreeMap<RunId, Approved> = BTreeMap::new();
    let mut index: BTreeMap<RunId, usize> = BTreeMap::new();
    let (mut kills, mut pauses, mut approvals) = (0usize, 0usize, 0usize);
    // Workers paused, and when each goes on.
    let mut paused: BTreeMap<usize, Instant> = BTreeMap::new();
    let mut next_kill = Instant::now() + Duration::from_secs(2);
    let finished = loop {
        if started.elapsed() > deadline {
            break false;
        }
        let due = if spread.is_zero() {
            runs
        } else {
            let share = started.elapsed().as_secs_f64() / spread.as_secs_f64();
            ((share * runs as f64).ceil() as usize).clamp(1, runs)
        };
        for body in &requests[requested..due] {
            publish(&broker, &broker.topology().run_requests(), body).await?;
        }
        requested = due;
        // Learn the run ids the coordinator created.
        if index.len() < runs {
            let rows: Vec<(Uuid, Uuid)> = sqlx::query_as("SELECT id, request_id FROM runs")
                .fetch_all(&pool)
                .await?;
            for (id, request) in rows {
                if let Some(&i) = run_ids.get(&request) {
                    index.insert(RunId::from_uuid(id)?, i);
                }
            }
        }
        // Approve every card not approved yet, as it reads now.
        let waiting: Vec<(Uuid, i32, String)> = sqlx::query_as(
            "SELECT id, suspension_seq, turn_digest FROM runs WHERE status = 'waiting_for_approval'",
        )
        .fetch_all(&pool)
        .await?;
        for (id, seq, digest) in waiting {
            let run_id = RunId::from_uuid(id)?;
            let seq = seq as u32;
            if approved.get(&run_id).is_some_and(|a| a.seq >= seq) {
                continue;
            }
            let Ok(bytes) = store.load_state(run_id).await else {
                continue;
            };
            let state = SuspendedRunState::from_bytes(&bytes)?;
            if state.suspension_seq.get() != seq || state.turn_digest().as_str() != digest {
                continue; // re-suspended between the two reads
            }
            let Some(lands_at) = lands_at(&state) else {
                anyhow::bail!("run {run_id}: the card shows no position for the attach");
            };
            let body = serde_json::to_vec(&json!({
                "type": "countersign.decision", "version": 1,
                "decision_id": Uuid::now_v7(), "run_id": run_id, "suspension_seq": seq,
                "turn_digest": digest, "approved": true, "approver": "admin",
            }))?;
            publish(&broker, &broker.topology().decisions(), &body).await?;
            approved.insert(run_id, Approved { seq, lands_at });
            approvals += 1;
        }
        // Now and then a worker is killed and a new one started in its place, or it is paused
        // for one to three of its leases and then goes on.
        paused.retain(|&worker, until| {
            let paused_on = Instant::now() < *until;
            if !paused_on {
                fleet[worker].sigcont();
            }
            paused_on
        });
        if Instant::now() >= next_kill {
            let victim = rand::thread_rng().gen_range(0..fleet.len());
            if let std::collections::btree_map::Entry::Vacant(free) = paused.entry(victim) {
                if rand::thread_rng().gen_bool(0.5) {
                    fleet[victim].sigkill();
                    fleet[victim] = install.spawn("countersign-worker", &worker_args);
                    kills += 1;
                } else {
                    fleet[victim].sigstop();
                    let pause = Duration::from_millis(rand::thread_rng().gen_range(3000..9000));
                    free.insert(Instant::now() + pause);
                    pauses += 1;
                }
            }
            next_kill =
                Instant::now() + Duration::from_millis(rand::thread_rng().gen_range(1500..4000));
        }
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled')",
        )
        .fetch_one(&pool)
        .await?;
        if index.len() == runs && open == 0 {
            break true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    colleague.abort();
    for worker in paused.keys() {
        fleet[*worker].sigcont();
    }
    drop(fleet);

    let report = verify(&pool, &teasers, &index, &approved).await?;
    let statuses: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM runs GROUP BY status ORDER BY status")
            .fetch_all(&pool)
            .await?;
    println!(
        "chaos: {runs} runs in {:.1} s, {approvals} approvals, {kills} workers killed, {pauses} paused; runs by status: {}",
        started.elapsed().as_secs_f64(),
        statuses
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "chaos: writes expected {} landed {} lost {} duplicated {} landed-against-unseen-state {} unapproved {}",
        report.expected, report.landed, report.lost, report.duplicated, report.unseen, report.unapproved
    );
    let completed = statuses
        .iter()
        .find(|(s, _)| s == "completed")
        .map_or(0, |(_, n)| *n);
    let clean =
        report.lost == 0 && report.duplicated == 0 && report.unseen == 0 && report.unapproved == 0;
    if !finished || completed != runs as i64 {
        eprintln!("chaos: not every run completed before the deadline");
    }
    Ok(clean && finished && completed == runs as i64)
}

/// Publishes `body` to `queue` as `guest`, as a producer does: a publish whose broker node went
/// away is sent again (run requests and decisions carry their ids, so a repeat is a replay),
/// for up to a minute.
async fn publish(broker: &Broker, queue: &str, body: &[u8]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match broker.publish_to_queue(queue, body, Some("guest")).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                eprintln!("chaos: publishing failed, sending again: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The position the card's attach preview says the new reference takes.
fn lands_at(state: &SuspendedRunState) -> Option<i64> {
    let line = state
        .call_previews
        .iter()
        .flat_map(|p| p.lines.iter())
        .find(|l| l.starts_with(LANDS))?;
    // "field image: 2 reference(s) → 3, appended last"
    let after = line.split('→').nth(1)?;
    after.trim().split(',').next()?.trim().parse().ok()
}

#[derive(Debug, Default)]
struct Report {
    expected: usize,
    landed: usize,
    lost: usize,
    duplicated: usize,
    unseen: usize,
    unapproved: usize,
}

async fn verify(
    pool: &PgPool,
    teasers: &[i64],
    index: &BTreeMap<RunId, usize>,
    approved: &BTreeMap<RunId, Approved>,
) -> anyhow::Result<Report> {
    // Every reference of every teaser, in the order the content store keeps them.
    let mut positions: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for teaser in teasers {
        let refs: Vec<(String,)> = sqlx::query_as(
            "SELECT alternative FROM content.file_references
             WHERE element = $1 AND field = 'image' AND NOT deleted ORDER BY sorting, uid",
        )
        .bind(teaser)
        .fetch_all(pool)
        .await?;
        for (position, (alt,)) in refs.iter().enumerate() {
            positions
                .entry(alt.clone())
                .or_default()
                .push(position as i64 + 1);
        }
    }
    let completed: BTreeSet<Uuid> =
        sqlx::query_scalar("SELECT id FROM runs WHERE status = 'completed'")
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let mut report = Report::default();
    for (run_id, &i) in index {
        let landed = positions.remove(&alternative(i)).unwrap_or_default();
        let approval = approved.get(run_id);
        if completed.contains(&run_id.as_uuid()) {
            report.expected += 1;
        }
        report.landed += landed.len();
        match (approval, landed.as_slice()) {
            (_, []) if completed.contains(&run_id.as_uuid()) => report.lost += 1,
            (_, []) => {}
            (None, _) => report.unapproved += landed.len(),
            (Some(a), [at]) => {
                if *at != a.lands_at {
                    eprintln!(
                        "chaos: run {run_id} landed at {at}, its approved card said {}",
                        a.lands_at
                    );
                    report.unseen += 1;
                }
            }
            (Some(_), more) => report.duplicated += more.len() - 1,
        }
    }
    Ok(report)
}

/// A colleague attaching a logo to a teaser every few hundred milliseconds, locking the
/// element first as the CMS does before it changes an element's references.
async fn colleague(pool: PgPool, teasers: Vec<i64>) {
    loop {
        let teaser = teasers[rand::thread_rng().gen_range(0..teasers.len())];
        let edit = async {
            let mut tx = pool.begin().await?;
            sqlx::query("SELECT uid FROM content.elements WHERE uid = $1 FOR UPDATE")
                .bind(teaser)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO content.file_references (element, field, file, sorting, alternative)
                 SELECT $1, 'image', 7, coalesce(max(sorting), 0) + 1, 'colleague'
                 FROM content.file_references WHERE element = $1 AND field = 'image'",
            )
            .bind(teaser)
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        };
        if let Err(e) = edit.await {
            eprintln!("chaos: the colleague's edit failed: {e}");
        }
        let pause = rand::thread_rng().gen_range(200..800);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

fn tempdir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("countersign-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
