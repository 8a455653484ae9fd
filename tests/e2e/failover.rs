//! PostgreSQL failover under the fence: a primary and a streaming replica of the test's own
//! (`initdb`, `pg_basebackup`, `pg_ctl` on loopback ports; the machine's server untouched),
//! and in front of them a TCP proxy — the one address the services are given — that the
//! failover switches to the promoted replica, as a virtual IP, HAProxy or PgBouncer does in a
//! deployment. The primary dies as a crashed host does (`pg_ctl stop -m immediate`: no
//! shutdown checkpoint, every client cut).
//!
//! With synchronous replication, approvals accepted and writes held inside their transactions
//! when the primary dies, and one more approval sent while there is no primary: every run
//! completes with its one write landed once, after its approval, and every event the broker
//! carried (each published only after its transaction committed) announces a change the
//! promoted database holds.
//!
//! With asynchronous replication and the replica cut off first: what committed on the primary
//! after the replica's last byte is lost — an accepted approval, the write it led to, its
//! journal row and the events already published about them, all together. The run waits on
//! the same card again, and approved again it writes once.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use countersign_e2e::{
    assert_written_once, count, free_port, hold_gate, http_get, install_gate, page_agent, run_row,
    secs, turn_digest, wait_for_card, wait_for_sql, wait_for_status, wait_until, waiting_at_gate,
    Installation, Process, TempDir, PAGE_DESCRIPTION, WRITABLE_PAGES,
};
use countersign_queue::Broker;
use sqlx::{Connection, PgConnection};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use uuid::Uuid;

/// The advisory lock that holds the page writes in flight.
const GATE: i64 = 7_262_011;

/// The newest PostgreSQL server binaries on the machine (`/usr/lib/postgresql/<major>/bin`).
fn server_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_basebackup").exists())
        .collect();
    dirs.sort_by_key(|bin| {
        bin.parent()
            .and_then(|major| major.file_name()?.to_str()?.parse::<u32>().ok())
    });
    dirs.pop()
}

/// How the replica follows the primary.
#[derive(Clone, Copy, PartialEq)]
enum Replication {
    /// A commit returns once the replica has flushed it (`synchronous_standby_names`).
    Synchronous,
    /// A commit returns at once; the replica streams through a proxy the test can cut.
    Asynchronous,
}

/// A primary and its streaming replica in one directory, stopped on drop.
struct Pair {
    bin: PathBuf,
    dir: TempDir,
    primary: u16,
    replica: u16,
    /// What the replica streams the primary's WAL through.
    stream: Proxy,
}

impl Pair {
    /// Starts the primary, takes the replica from it with `pg_basebackup`, and starts the
    /// replica streaming from it, synchronous or not.
    async fn start(bin: PathBuf, replication: Replication) -> Pair {
        let dir = TempDir::new();
        if is_root() {
            // The server refuses to run as root; its directories belong to `postgres`.
            run(Command::new("chown").args(["postgres:postgres", path(&dir.0)]));
        }
        let primary = free_port();
        let pair = Pair {
            bin,
            dir,
            primary,
            replica: free_port(),
            stream: Proxy::start(primary).await,
        };
        let primary = pair.data("primary");
        pair.pg(
            "initdb",
            &[
                "-D",
                path(&primary),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        append(
            &primary.join("postgresql.conf"),
            &format!(
                "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
                 wal_level = replica\nmax_wal_senders = 4\nshared_buffers = 32MB\n",
                pair.primary,
                path(&pair.dir.0),
            ),
        );
        pair.start_server("primary");
        let replica = pair.data("replica");
        pair.pg(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &pair.primary.to_string(),
                "-U",
                "postgres",
                "-D",
                path(&replica),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        );
        // The walreceiver names itself by `cluster_name`, which the primary's
        // `synchronous_standby_names` refers to; it streams through the proxy.
        append(
            &replica.join("postgresql.conf"),
            &format!("port = {}\ncluster_name = 'replica'\n", pair.replica),
        );
        append(
            &replica.join("postgresql.auto.conf"),
            &format!(
                "primary_conninfo = 'host=127.0.0.1 port={} user=postgres'\n",
                pair.stream.port
            ),
        );
        pair.start_server("replica");
        if replication == Replication::Asynchronous {
            pair.wait_streaming("async");
            return pair;
        }
        // Set on the primary only (after the base backup), so the promoted replica does not
        // wait for a standby of its own.
        pair.psql(
            pair.primary,
            "ALTER SYSTEM SET synchronous_standby_names = 'replica'",
        );
        pair.psql(pair.primary, "SELECT pg_reload_conf()");
        pair.wait_streaming("sync");
        pair
    }

    /// Waits until the replica streams from the primary with `sync_state`.
    fn wait_streaming(&self, sync_state: &str) {
        let deadline = Instant::now() + secs(60);
        while self.psql(
            self.primary,
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'replica'",
        ) != sync_state
        {
            assert!(
                Instant::now() < deadline,
                "the replica never streamed {sync_state}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the replica has replayed everything the primary has written so far.
    fn wait_caught_up(&self) {
        let lsn = self.psql(self.primary, "SELECT pg_current_wal_lsn()");
        let deadline = Instant::now() + secs(60);
        while self.psql(
            self.replica,
            &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
        ) != "t"
        {
            assert!(Instant::now() < deadline, "the replica never caught up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Cuts the replica off the primary: its stream is closed and cannot be opened again.
    fn cut_replica_off(&self) {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let nowhere = closed.local_addr().unwrap().port();
        drop(closed);
        self.stream.switch(nowhere);
        let deadline = Instant::now() + secs(30);
        while !self
            .psql(
                self.primary,
                "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'replica'",
            )
            .eq("0")
        {
            assert!(Instant::now() < deadline, "the replica still streams");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn data(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    fn start_server(&self, name: &str) {
        let log = self.dir.0.join(format!("{name}.log"));
        self.pg(
            "pg_ctl",
            &[
                "-D",
                path(&self.data(name)),
                "-l",
                path(&log),
                "-w",
                "start",
            ],
        );
    }

    /// The primary dies as a crashed host does: no shutdown checkpoint, every client cut.
    fn kill_primary(&self) {
        self.pg(
            "pg_ctl",
            &["-D", path(&self.data("primary")), "-m", "immediate", "stop"],
        );
    }

    /// Promotes the replica and waits until it takes writes.
    fn promote_replica(&self) {
        self.pg(
            "pg_ctl",
            &["-D", path(&self.data("replica")), "-w", "promote"],
        );
    }

    /// `psql -tA -c SQL` on `port`: the answer, trimmed.
    fn psql(&self, port: u16, sql: &str) -> String {
        let out = run(Command::new("psql").args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-tA",
            "-c",
            sql,
        ]));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs a server binary as the user that owns the data directories; it must succeed.
    fn pg(&self, binary: &str, args: &[&str]) {
        run(self.pg_command(binary).args(args).current_dir(&self.dir.0));
    }

    fn pg_command(&self, binary: &str) -> Command {
        let program = self.bin.join(binary);
        if !is_root() {
            return Command::new(program);
        }
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for name in ["primary", "replica"] {
            let data = self.data(name);
            if data.join("postmaster.pid").exists() {
                let _ = self
                    .pg_command("pg_ctl")
                    .args(["-D", path(&data), "-m", "immediate", "stop"])
                    .output();
            }
        }
    }
}

fn is_root() -> bool {
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

fn append(file: &Path, text: &str) {
    let mut conf = std::fs::read_to_string(file).unwrap();
    conf.push_str(text);
    std::fs::write(file, conf).unwrap();
}

/// Runs `cmd` to completion, failing the test with its stderr unless it succeeds.
fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A TCP proxy on a port of its own that forwards every connection to the current target;
/// switching the target cuts the connections to the old one.
struct Proxy {
    port: u16,
    target: Arc<AtomicU16>,
    switched: watch::Sender<u16>,
}

impl Proxy {
    async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let (switched, _) = watch::channel(target.load(Ordering::SeqCst));
        let proxy = Proxy {
            port,
            target: target.clone(),
            switched: switched.clone(),
        };
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut switch = switched.subscribe();
                let to = target.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", to)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = switch.changed() => {}
                    }
                });
            }
        });
        proxy
    }

    fn switch(&self, to: u16) {
        self.target.store(to, Ordering::SeqCst);
        self.switched.send_replace(to);
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

/// One installation on the pair, reached through the proxy: a page agent per writable page,
/// the coordinator, a worker and a looping reaper, and a watch on every event.
struct Site {
    pair: Pair,
    proxy: Proxy,
    install: Installation,
    broker: Broker,
    /// Every event the broker carried, by its id.
    carried: Arc<Mutex<BTreeMap<String, serde_json::Value>>>,
    ready: Vec<u16>,
    services: Vec<Process>,
    _files: TempDir,
}

impl Site {
    /// `None` (the test skipped) where the machine has no PostgreSQL server binaries.
    async fn start(replication: Replication) -> Option<Site> {
        let Some(bin) = server_bin_dir() else {
            eprintln!("skipped: no PostgreSQL server binaries under /usr/lib/postgresql");
            return None;
        };
        let pair = Pair::start(bin, replication).await;
        let proxy = Proxy::start(pair.primary).await;
        let install = Installation {
            database_url: proxy.url(),
            queue_prefix: format!("e2e-{}", Uuid::now_v7()),
        };
        let files = TempDir::new();
        install.countersign_ok(&["migrate", "--with-content"]);
        install.countersign_ok(&["seed-demo-site"]);
        for uid in WRITABLE_PAGES {
            install.countersign_ok(&["agents", "put", &page_agent(&files, uid)]);
        }
        install.countersign_ok(&["producers", "allow", "guest", "acting-user", "*"]);
        install.countersign_ok(&["producers", "allow", "guest", "approver", "*"]);
        let broker = install.broker().await;
        let carried = watch_events(&broker).await;
        let mut site = Site {
            pair,
            proxy,
            install,
            broker,
            carried,
            ready: vec![],
            services: vec![],
            _files: files,
        };
        for (binary, extra) in [
            ("countersign-coordinator", vec![]),
            ("countersign-worker", vec!["--poll-interval-secs", "1"]),
            ("countersign-reaper", vec!["--every", "1"]),
        ] {
            let port = free_port();
            let http = format!("127.0.0.1:{port}");
            let mut args = vec!["--http-addr", http.as_str()];
            args.extend(extra);
            site.services.push(site.install.spawn(binary, &args));
            site.ready.push(port);
        }
        site.time_to_ready(Instant::now()).await;
        Some(site)
    }

    async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.install.database_url)
            .await
            .unwrap()
    }

    /// How long since `since` until every service answers `/readyz` 200.
    async fn time_to_ready(&self, since: Instant) -> Duration {
        for port in &self.ready {
            wait_until(&format!("ready on :{port}"), secs(90), async || {
                http_get(*port, "/readyz")
                    .is_some_and(|(s, _)| s.contains("200"))
                    .then_some(())
            })
            .await;
        }
        since.elapsed()
    }

    /// Requests a run of the agent of page `uid` and waits for its first card.
    async fn card(&self, conn: &mut PgConnection, uid: i64) -> String {
        let run_id = self
            .install
            .submit(&format!("page-{uid}"), "editor", "Describe the page.");
        wait_for_card(conn, &run_id, 1, secs(90)).await;
        run_id
    }

    /// Approves card 1 of `run_id` as `admin`; the coordinator must accept it.
    fn approve(&self, run_id: &str, digest: &str) {
        let out = self.install.approve_card(run_id, 1, digest, "admin");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("decision accepted"),
            "{out:?}"
        );
    }

    /// The primary dies; after `outage` the replica is promoted and the proxy switched to
    /// it. Prints the failover's times.
    async fn fail_over(&self, outage: Duration) {
        self.pair.kill_primary();
        let failed = Instant::now();
        tokio::time::sleep(outage).await;
        self.pair.promote_replica();
        self.proxy.switch(self.pair.replica);
        let switched = failed.elapsed();
        let recovered = self.time_to_ready(failed).await;
        println!(
            "primary killed; replica promoted and the proxy switched after {switched:?}; every service ready {recovered:?} after the crash"
        );
    }

    /// How many distinct events the broker carried, and how many of them announce a change
    /// the database now has no record of. An event is the record of its transition, so each is
    /// looked up by what that transition wrote in the same transaction: the run for
    /// `run.accepted`, the decision row for a decision event, and otherwise the run's audit row
    /// of the event's kind stamped with the event's `at` (one instant for a transaction's rows).
    /// The outbox row itself is gone once the broker confirmed it.
    async fn events_missing(&self, conn: &mut PgConnection) -> (i64, i64) {
        let carried: Vec<serde_json::Value> =
            self.carried.lock().unwrap().values().cloned().collect();
        let kept: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jsonb_array_elements($1::jsonb) AS e(body)
             WHERE CASE
                 WHEN e.body ->> 'event' = 'run.accepted' THEN
                     EXISTS (SELECT 1 FROM runs r WHERE r.id = (e.body ->> 'run_id')::uuid)
                 WHEN e.body ->> 'event' LIKE 'decision.%' THEN
                     EXISTS (SELECT 1 FROM run_decisions d
                             WHERE d.decision_id = (e.body ->> 'decision_id')::uuid)
                 ELSE
                     EXISTS (SELECT 1 FROM run_events a
                             WHERE a.run_id = (e.body ->> 'run_id')::uuid
                               AND a.kind = e.body ->> 'event'
                               AND a.created_at = (e.body ->> 'at')::timestamptz)
             END",
        )
        .bind(serde_json::Value::Array(carried.clone()))
        .fetch_one(conn)
        .await
        .unwrap();
        let carried = carried.len() as i64;
        println!(
            "events carried by the broker {carried} · missing from the promoted primary {}",
            carried - kept
        );
        (carried, carried - kept)
    }

    async fn finish(self, conn: PgConnection) {
        drop(conn);
        drop(self.services);
        self.broker.delete_topology().await.unwrap();
    }
}

/// Every event the broker carries on `broker`'s topology, by its id, collected as they come.
async fn watch_events(broker: &Broker) -> Arc<Mutex<BTreeMap<String, serde_json::Value>>> {
    let watch = broker.declare_private_queue().await.unwrap();
    broker.bind_events(&watch, "#").await.unwrap();
    let mut events = broker.consume(&watch, 100).await.unwrap();
    let carried = Arc::new(Mutex::new(BTreeMap::new()));
    let seen = carried.clone();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = events.next().await {
            let event: serde_json::Value = serde_json::from_slice(&delivery.body).unwrap();
            if let Some(id) = event["event_id"].as_str() {
                seen.lock().unwrap().insert(id.to_owned(), event.clone());
            }
            let _ = delivery.ack().await;
        }
    });
    carried
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_in_flight_survive_a_primary_crash_and_a_promoted_synchronous_replica() {
    let Some(site) = Site::start(Replication::Synchronous).await else {
        return;
    };
    let mut conn = site.connect().await;
    let mut runs = vec![];
    let mut digests = vec![];
    for uid in &WRITABLE_PAGES[..4] {
        let run_id = site.card(&mut conn, *uid).await;
        digests.push(turn_digest(&mut conn, &run_id).await);
        runs.push(run_id);
    }

    // Three approvals are accepted, and their resumes are held inside their write
    // transactions (a gate on the page update, closed by a session on the primary) when the
    // primary dies: the approvals are committed, the writes are not.
    let mut gate = PgConnection::connect(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        site.pair.primary
    ))
    .await
    .unwrap();
    install_gate(
        &mut gate,
        "describe",
        "content.pages",
        "UPDATE",
        &format!("NEW.description = '{PAGE_DESCRIPTION}'"),
        GATE,
    )
    .await;
    hold_gate(&mut gate, GATE).await;
    for (run_id, digest) in runs[..3].iter().zip(&digests) {
        site.approve(run_id, digest);
    }
    wait_until("three writes held at the gate", secs(60), async || {
        (waiting_at_gate(&mut gate, GATE).await == 3).then_some(())
    })
    .await;
    drop(conn);

    // The fourth approval is sent while there is no primary; it waits in its quorum queue.
    let late = tokio::task::spawn_blocking({
        let install = site.install.clone();
        let (run_id, digest) = (runs[3].clone(), digests[3].clone());
        move || {
            std::thread::sleep(Duration::from_millis(500));
            install.approve_card(&run_id, 1, &digest, "admin")
        }
    });
    site.fail_over(Duration::from_secs(2)).await;
    drop(gate);
    let out = late.await.unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("decision accepted"),
        "the approval sent during the failover: {out:?}"
    );

    // Two runs requested and approved on the new primary.
    let mut conn = site.connect().await;
    for uid in &WRITABLE_PAGES[4..] {
        let run_id = site.card(&mut conn, *uid).await;
        site.approve(&run_id, &turn_digest(&mut conn, &run_id).await);
        runs.push(run_id);
    }
    for run_id in &runs {
        wait_for_status(&mut conn, run_id, "completed", secs(120)).await;
    }
    assert_written_once(&mut conn, runs.len()).await;
    wait_for_sql(
        &mut conn,
        "every event published",
        secs(60),
        "SELECT count(*) = 0 FROM event_outbox WHERE published_at IS NULL",
    )
    .await;
    let (carried, missing) = site.events_missing(&mut conn).await;
    assert!(carried > 0, "the broker carried events");
    assert_eq!(missing, 0, "every published event survived the failover");
    site.finish(conn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_replica_loses_an_approval_with_its_write_and_the_run_approved_again_writes_once(
) {
    let Some(site) = Site::start(Replication::Asynchronous).await else {
        return;
    };
    let mut conn = site.connect().await;
    let mut runs = vec![];
    for uid in &WRITABLE_PAGES[..3] {
        runs.push(site.card(&mut conn, *uid).await);
    }
    let lost = runs[0].clone();
    let digest = turn_digest(&mut conn, &lost).await;

    // The replica has the three cards; then it is cut off, and one run is approved, written
    // and completed on the primary alone.
    site.pair.wait_caught_up();
    site.pair.cut_replica_off();
    site.approve(&lost, &digest);
    wait_for_status(&mut conn, &lost, "completed", secs(90)).await;
    let lost_epoch = count(
        &mut conn,
        &format!("SELECT lease_epoch FROM run_journal WHERE run_id = '{lost}'::uuid"),
    )
    .await;
    drop(conn);
    site.fail_over(Duration::ZERO).await;

    // What the primary committed alone is gone, together: the run waits on the same card,
    // nothing of its approval, write or journal is left, and the events already published
    // about them name what the database no longer has.
    let mut conn = site.connect().await;
    let row = run_row(&mut conn, &lost).await;
    assert_eq!(
        (row["status"].as_str(), row["suspension_seq"].as_i64()),
        (Some("waiting_for_approval"), Some(1)),
        "{row}"
    );
    let left = count(
        &mut conn,
        &format!(
            "SELECT (SELECT count(*) FROM run_decisions WHERE run_id = '{lost}'::uuid)
                  + (SELECT count(*) FROM run_journal WHERE run_id = '{lost}'::uuid)
                  + (SELECT count(*) FROM content.pages WHERE description = '{PAGE_DESCRIPTION}')"
        ),
    )
    .await;
    assert_eq!(
        left, 0,
        "the approval, its journal row and its write went together"
    );
    let (_, missing) = site.events_missing(&mut conn).await;
    assert!(
        missing > 0,
        "the events published about the lost approval and write"
    );

    // Approved again, on the same card, it writes once; so do the others.
    for run_id in &runs {
        site.approve(run_id, &turn_digest(&mut conn, run_id).await);
    }
    for run_id in &runs {
        wait_for_status(&mut conn, run_id, "completed", secs(120)).await;
    }
    assert_written_once(&mut conn, runs.len()).await;
    // The write of the lost timeline went out under its epoch; the promoted server's claims
    // hand out epochs past it, so a tool server that fences by the highest epoch it saw takes
    // the run's calls again.
    let epoch = count(
        &mut conn,
        &format!("SELECT lease_epoch FROM run_journal WHERE run_id = '{lost}'::uuid"),
    )
    .await;
    assert!(
        epoch > lost_epoch,
        "the write after the failover carries epoch {epoch}, not past the lost timeline's {lost_epoch}"
    );
    site.finish(conn).await;
}
