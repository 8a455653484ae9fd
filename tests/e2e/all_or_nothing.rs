//! All or nothing to the last commit, under faults at every step boundary of an approved turn.
//!
//! The turn writes one row of the content store and makes two appends on the reference wiki,
//! which takes writes in two phases: prepare 1, prepare 2, the store's write (locked, applied,
//! compared), the holds checked, the commit point (the store's commit, with the debt of the two
//! wiki commits), commit 1, commit 2. At each boundary the worker is stopped by the wiki or by a
//! colleague's lock, and one fault strikes:
//!
//! - **killed**: the worker is SIGKILLed; the reaper requeues the run and a second worker takes
//!   it over;
//! - **lease lost**: the worker is SIGSTOPped until the reaper has requeued the run and a second
//!   worker has claimed it, then continued — a zombie whose writes the fence must refuse;
//! - **server down**: the wiki is killed (the request in flight dies with it) and started again
//!   two seconds later from its state file;
//! - **hold ran out**: before the commit point, a wiki that holds a change for two seconds at
//!   most, paused past that — the hold is gone; after it, a wiki whose own default hold is two
//!   seconds, paused past that — the hold countersign asked for outlives the pause.
//!
//! Every cell must end with the whole turn landed (each write audited once) or nothing landed,
//! the run waiting on a new card or failed with a named code — never part of it. The test prints
//! the matrix.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use countersign_e2e::{
    approve_through_queue, count, free_port, run_row, secs, turn_digest, wait_for_card, wait_until,
    waiting_in_transaction, workspace_file, Installation, Process, TempDir,
};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use countersign_e2e::Database;

use crate::remote_tools::trusted_wiki;

const SECRET: &str = "e2e-matrix-secret";
const NEW_DESCRIPTION: &str = "Bicycles for every road.";
const LEASE_TTL_SECS: &str = "2";

/// Where the worker is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    AfterPrepare1,
    AfterPrepares,
    AfterLocalWrite,
    PastTheCommit,
    AfterCommit1,
}

impl Point {
    const ALL: [Point; 5] = [
        Point::AfterPrepare1,
        Point::AfterPrepares,
        Point::AfterLocalWrite,
        Point::PastTheCommit,
        Point::AfterCommit1,
    ];

    fn name(self) -> &'static str {
        match self {
            Point::AfterPrepare1 => "after prepare 1 of 2",
            Point::AfterPrepares => "after both prepares (store locks)",
            Point::AfterLocalWrite => "after the store's write",
            Point::PastTheCommit => "after the commit point",
            Point::AfterCommit1 => "after wiki commit 1 of 2",
        }
    }

    fn before_commit_point(self) -> bool {
        matches!(
            self,
            Point::AfterPrepare1 | Point::AfterPrepares | Point::AfterLocalWrite
        )
    }
}

/// What strikes there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Killed,
    LeaseLost,
    ServerDown,
    HoldRanOut,
}

impl Fault {
    const ALL: [Fault; 4] = [
        Fault::Killed,
        Fault::LeaseLost,
        Fault::ServerDown,
        Fault::HoldRanOut,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::Killed => "killed",
            Fault::LeaseLost => "lease lost",
            Fault::ServerDown => "server down",
            Fault::HoldRanOut => "hold ran out",
        }
    }
}

/// How a cell ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    Whole,
    ReSuspended,
    Failed(String),
    /// Part of the turn landed: what the test must never see.
    Part(String),
}

impl Ended {
    fn cell(&self) -> String {
        match self {
            Ended::Whole => "whole".into(),
            Ended::ReSuspended => "nothing, card 2".into(),
            Ended::Failed(code) => format!("nothing, failed {code}"),
            Ended::Part(what) => format!("PART: {what}"),
        }
    }
}

/// The wiki on a fixed port, restartable from its state file.
struct Wiki {
    dir: PathBuf,
    port: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl Wiki {
    fn start(dir: &Path, args: &[&str]) -> Wiki {
        std::fs::write(
            dir.join("wiki.json"),
            json!({"pages": {"home": ["Welcome."]}}).to_string(),
        )
        .unwrap();
        let mut wiki = Wiki {
            dir: dir.to_owned(),
            port: free_port(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            child: None,
        };
        wiki.run();
        wiki
    }

    fn run(&mut self) {
        let dir = &self.dir;
        let mut child = Command::new("python3")
            .arg(workspace_file("examples/remote-wiki/wiki_server.py"))
            .args(["--port", &self.port.to_string(), "--state"])
            .arg(dir.join("wiki.json"))
            .arg("--hold-file")
            .arg(dir.join("hold"))
            .arg("--hold-after-file")
            .arg(dir.join("hold-after"))
            .arg("--hold-prepare-file")
            .arg(dir.join("hold-prepare"))
            .arg("--hold-status-file")
            .arg(dir.join("hold-status"))
            .args(&self.args)
            .env("WIKI_SECRET", SECRET)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the wiki server");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert!(line.starts_with("listening on "), "{line:?}");
        self.child = Some(child);
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Holds the calls `file` stops, after letting `pass` of them through.
    fn hold(&self, file: &str, pass: usize) {
        std::fs::write(self.dir.join(file), pass.to_string()).unwrap();
    }

    fn release(&self, file: &str) {
        let _ = std::fs::remove_file(self.dir.join(file));
    }

    fn waiting(&self, file: &str) -> usize {
        std::fs::read_to_string(self.dir.join(format!("{file}.waiting")))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn home(&self) -> Value {
        let state: Value =
            serde_json::from_str(&std::fs::read_to_string(self.dir.join("wiki.json")).unwrap())
                .unwrap();
        state["pages"]["home"].clone()
    }
}

impl Drop for Wiki {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The wiki's hold file that stops the worker at `point`, and how many calls pass it first.
fn hold_of(point: Point) -> Option<(&'static str, usize)> {
    match point {
        Point::AfterPrepare1 => Some(("hold-prepare", 1)),
        Point::AfterPrepares => None,
        Point::AfterLocalWrite => Some(("hold-status", 0)),
        Point::PastTheCommit => Some(("hold", 0)),
        Point::AfterCommit1 => Some(("hold-after", 0)),
    }
}

fn signal(process: &Process, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &process.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal}");
}

/// One cell of the matrix, from a fresh installation.
async fn cell(point: Point, fault: Fault) -> Ended {
    let dir = TempDir::new();
    let hold_args: &[&str] = match (fault, point.before_commit_point()) {
        (Fault::HoldRanOut, true) => &["--max-hold", "2"],
        (Fault::HoldRanOut, false) => &["--hold-ttl", "2"],
        _ => &[],
    };
    let mut wiki = Wiki::start(&dir.0, hold_args);
    let script = dir.json(
        "script.json",
        &json!({"turns": [
            {"content": "Three writes.", "tool_calls": [
                {"name": "update_page_metadata",
                 "arguments": {"uid": 12, "description": NEW_DESCRIPTION}},
                {"name": "append_line", "arguments": {"page": "home", "line": "x"}},
                {"name": "append_line", "arguments": {"page": "home", "line": "y"}}]},
            {"content": "Done."}]}),
    );
    let agent = dir.json(
        "agent.json",
        &json!({
            "name": "matrix", "model": {"provider": "scripted", "script": script},
            "policy": {"allowed_groups": ["content", "editing"],
                       "enabled_tools": ["update_page_metadata", "append_line"]},
            "max_iterations": 4, "four_eyes": false, "approval_deadline_secs": 3600
        }),
    );
    let db = Database::create(&format!("matrix_{point:?}_{fault:?}").to_lowercase()).await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&agent);
    let env = [
        ("COUNTERSIGN_TOOL_SERVERS", trusted_wiki(&wiki.url())),
        ("COUNTERSIGN_TOOL_SECRET_WIKI", SECRET.to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let worker_args = [
        "--lease-ttl-secs",
        LEASE_TTL_SECS,
        "--poll-interval-secs",
        "1",
    ];
    let _coordinator = install.spawn_env("countersign-coordinator", &[], &env);
    let _reaper = install.spawn_env("countersign-reaper", &["--every", "1"], &env);
    let mut first = install.spawn_env("countersign-worker", &worker_args, &env);
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();

    let run_id = install.submit("matrix", "editor", "Describe us twice.");
    wait_for_card(&mut conn, &run_id, 1, secs(60)).await;
    // Stop the worker at `point`.
    let mut colleague = None;
    match hold_of(point) {
        Some((file, pass)) => wiki.hold(file, pass),
        None => {
            let mut c = PgConnection::connect(&db.url()).await.unwrap();
            sqlx::raw_sql("BEGIN; SELECT uid FROM content.pages WHERE uid = 12 FOR UPDATE")
                .execute(&mut c)
                .await
                .unwrap();
            colleague = Some(c);
        }
    }
    let digest = turn_digest(&mut conn, &run_id).await;
    approve_through_queue(&install, &mut conn, &run_id, 1, &digest).await;
    wait_until(
        "the worker stopped at the step boundary",
        secs(60),
        async || {
            let there = match hold_of(point) {
                Some((file, _)) => wiki.waiting(file) >= 1,
                None => waiting_in_transaction(&mut conn, "SELECT content.lock_rows").await >= 1,
            };
            there.then_some(())
        },
    )
    .await;

    // The fault.
    let mut second = None;
    match fault {
        Fault::Killed => {
            first.sigkill();
            second = Some(install.spawn_env("countersign-worker", &worker_args, &env));
        }
        Fault::LeaseLost => {
            signal(&first, "-STOP");
            let epoch = run_row(&mut conn, &run_id).await["lease_epoch"].clone();
            second = Some(install.spawn_env("countersign-worker", &worker_args, &env));
            wait_until("another worker holds the run", secs(60), async || {
                let row = run_row(&mut conn, &run_id).await;
                (row["lease_epoch"] != epoch && row["status"] == "running").then_some(())
            })
            .await;
        }
        Fault::ServerDown => {
            wiki.kill();
            if let Some((file, _)) = hold_of(point) {
                wiki.release(file);
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            wiki.run();
        }
        Fault::HoldRanOut => tokio::time::sleep(Duration::from_secs(3)).await,
    }
    if let Some((file, _)) = hold_of(point) {
        wiki.release(file);
    }
    if let Some(mut c) = colleague.take() {
        sqlx::raw_sql("ROLLBACK").execute(&mut c).await.unwrap();
    }
    if fault == Fault::LeaseLost {
        signal(&first, "-CONT");
    }

    let ended = settled(&mut conn, &run_id).await;
    let ended = judge(&mut conn, &run_id, &wiki, ended).await;
    drop(second);
    drop(first);
    ended
}

/// Waits until the run completes, fails or waits on card 2; its status.
async fn settled(conn: &mut PgConnection, run_id: &str) -> (String, Value) {
    wait_until("the run settles", secs(90), async || {
        let row = run_row(conn, run_id).await;
        let status = row["status"].as_str().unwrap_or_default().to_owned();
        let done = matches!(status.as_str(), "completed" | "failed")
            || (status == "waiting_for_approval" && row["suspension_seq"] == 2);
        done.then_some((status, row))
    })
    .await
}

/// What landed, and whether that is all or nothing.
async fn judge(
    conn: &mut PgConnection,
    run_id: &str,
    wiki: &Wiki,
    (status, row): (String, Value),
) -> Ended {
    let description: String =
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    let local = description == NEW_DESCRIPTION;
    let home = wiki.home();
    let remote = match home.as_array().map(Vec::len) {
        Some(1) => 0,
        Some(n) => n - 1,
        None => 0,
    };
    let writes = count(
        conn,
        &format!("SELECT count(*) FROM run_events WHERE run_id = '{run_id}'::uuid AND kind = 'tool_write'"),
    )
    .await;
    let whole = local && home == json!(["Welcome.", "x", "y"]) && writes == 3;
    let nothing = !local && remote == 0 && writes == 0;
    match status.as_str() {
        "completed" if whole => Ended::Whole,
        "waiting_for_approval" if nothing => Ended::ReSuspended,
        "failed" if nothing => Ended::Failed(
            row["error_code"]
                .as_str()
                .or(row["termination_reason"].as_str())
                .unwrap_or("?")
                .to_owned(),
        ),
        _ => Ended::Part(format!(
            "{status}: store written {local}, wiki {home}, {writes} audited write(s)"
        )),
    }
}

async fn maybe(cell_of: Option<(Point, Fault)>) -> Option<Ended> {
    match cell_of {
        Some((point, fault)) => Some(cell(point, fault).await),
        None => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_lands_whole_or_not_at_all_whatever_strikes_at_any_step() {
    let cells: Vec<(Point, Fault)> = Point::ALL
        .iter()
        .flat_map(|p| Fault::ALL.iter().map(move |f| (*p, *f)))
        .collect();
    let mut ended = Vec::new();
    // Four cells at once: each is an installation of its own.
    for chunk in cells.chunks(4) {
        let at = |k: usize| chunk.get(k).copied();
        let (a, b, c, d) = tokio::join!(maybe(at(0)), maybe(at(1)), maybe(at(2)), maybe(at(3)));
        ended.extend([a, b, c, d].into_iter().flatten());
    }
    let mut table = format!("{:<36}", "");
    for f in Fault::ALL {
        table.push_str(&format!("│ {:<18}", f.name()));
    }
    for p in Point::ALL {
        table.push_str(&format!("\n{:<36}", p.name()));
        for f in Fault::ALL {
            let i = cells.iter().position(|c| *c == (p, f)).unwrap();
            table.push_str(&format!("│ {:<18}", ended[i].cell()));
        }
    }
    println!("{table}");
    let parts: Vec<_> = cells
        .iter()
        .zip(&ended)
        .filter(|(_, e)| matches!(e, Ended::Part(_)))
        .collect();
    assert!(
        parts.is_empty(),
        "part of a turn landed:\n{table}\n{parts:?}"
    );
}
