//! A RabbitMQ cluster the services fail over within: three nodes of the test's own
//! (`cs<pid><name>n<i>@localhost`, their own data directories, cookie and loopback ports; the
//! machine's broker untouched), the coordinator and a worker given all three in `AMQP_ADDR`.
//!
//! Runs are requested and approved through the cluster while the node the services are
//! connected to is stopped, and then — that node back — while the node holding the quorum
//! queues' leaders is stopped. Every run completes with its one write landed once, after its
//! approval; every event is published; both services are ready again within seconds of each
//! stop, not when the node returns. The test prints the recovery times.
//!
//! A second test runs the chaos suite (`make chaos`: approvals, killed workers, a colleague's
//! edits, the reaper) on its own cluster while the same two nodes stop in turn. A third stops
//! a node of its own (`SIGSTOP`) while a consumer starts on it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use countersign_e2e::{
    assert_written_once, count, free_port, http_get, page_agent, run_row, secs, wait_for_card,
    wait_for_status, Database, Installation, Process, TempDir, WRITABLE_PAGES,
};
use countersign_queue::{Broker, QueueConfig, Topology};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

const SBIN: &str = "/usr/lib/rabbitmq/bin";

/// One node of the test's cluster.
struct Node {
    name: String,
    port: u16,
}

/// Three RabbitMQ nodes clustered on loopback, stopped and removed on drop.
struct Cluster {
    home: PathBuf,
    nodes: Vec<Node>,
    _dir: TempDir,
    /// This binary's one-test-at-a-time lock, released after the nodes have stopped (fields
    /// drop after `Drop::drop`): two clusters starting at once, or a cluster beside the
    /// machine's broker restarting, take each other's ports and start-up time.
    _one: tokio::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    /// Starts the cluster `name` of `size` nodes once no other test of this binary runs; `None`
    /// (the test skipped) where the machine has no `rabbitmq-server`.
    async fn start(name: &str, size: usize) -> Option<Cluster> {
        if !Path::new(SBIN).join("rabbitmq-server").exists() {
            eprintln!("skipped: no rabbitmq-server at {SBIN} to start a cluster with");
            return None;
        }
        let one = crate::support::exclusive().await;
        let dir = TempDir::new();
        let home = dir.0.clone();
        std::fs::write(
            home.join(".erlang.cookie"),
            format!("cs{}", Uuid::now_v7().simple()),
        )
        .unwrap();
        std::fs::set_permissions(
            home.join(".erlang.cookie"),
            std::os::unix::fs::PermissionsExt::from_mode(0o400),
        )
        .unwrap();
        std::fs::write(home.join("enabled_plugins"), "[].").unwrap();
        let tag = std::process::id();
        let nodes: Vec<Node> = (1..=size)
            .map(|i| Node {
                name: format!("cs{tag}{name}n{i}@localhost"),
                port: free_port(),
            })
            .collect();
        for node in &nodes {
            start_node(&home, node);
        }
        let cluster = Cluster {
            home,
            nodes,
            _dir: dir,
            _one: one,
        };
        for node in &cluster.nodes {
            cluster.await_startup(node);
        }
        let first = cluster.nodes[0].name.clone();
        for node in &cluster.nodes[1..] {
            cluster.ctl(node, &["stop_app"]);
            cluster.ctl(node, &["join_cluster", &first]);
            cluster.ctl(node, &["start_app"]);
        }
        Some(cluster)
    }

    /// Waits until `node` runs: a node started detached is not known to epmd at once, and
    /// `await_startup` gives up on a node it cannot find.
    fn await_startup(&self, node: &Node) {
        let deadline = Instant::now() + secs(120);
        loop {
            let out = self.ctl_output(node, &["await_startup", "--timeout", "60"]);
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not start: {}",
                node.name,
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `rabbitmqctl -n NODE ARGS`, which must succeed.
    fn ctl(&self, node: &Node, args: &[&str]) -> String {
        let out = self.ctl_output(node, args);
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?} on {}: {}",
            node.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn ctl_output(&self, node: &Node, args: &[&str]) -> Output {
        Command::new(format!("{SBIN}/rabbitmqctl"))
            .args(["-q", "-n", &node.name])
            .args(args)
            .env("HOME", &self.home)
            .output()
            .expect("rabbitmqctl runs")
    }

    /// The operating-system process of `node`'s Erlang VM.
    fn pid(&self, node: &Node) -> String {
        let printed = self.ctl(node, &["eval", "os:getpid()."]);
        let pid = printed.trim().trim_matches('"').to_owned();
        assert!(
            !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit()),
            "{} printed no pid: {printed:?}",
            node.name
        );
        pid
    }

    /// `AMQP_ADDR` naming every node, first to last.
    fn addr(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("amqp://guest:guest@127.0.0.1:{}/%2f", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node holding the leader of the queue whose name ends with `queue`, by a running
    /// node's view; waits up to two minutes for the queue to be declared and to have a leader.
    fn leader_of(&self, asked: &Node, queue: &str) -> usize {
        let deadline = Instant::now() + secs(120);
        loop {
            let listed = self.ctl(
                asked,
                &["list_queues", "name", "leader", "--formatter", "json"],
            );
            let queues: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
            let leader = queues
                .iter()
                .find(|q| q["name"].as_str().is_some_and(|name| name.ends_with(queue)))
                .and_then(|q| q["leader"].as_str());
            if let Some(at) = leader.and_then(|l| self.nodes.iter().position(|n| n.name == l)) {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "no leader of {queue} in {listed}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            let _ = self.ctl_output(node, &["stop"]);
        }
    }
}

fn start_node(home: &Path, node: &Node) {
    let base = home.join(node.name.split('@').next().unwrap());
    for sub in ["mnesia", "log", "plugins"] {
        std::fs::create_dir_all(base.join(sub)).unwrap();
    }
    let config = base.join("rabbitmq.conf");
    std::fs::write(
        &config,
        format!(
            "listeners.tcp.local = 127.0.0.1:{}\nloopback_users = none\n",
            node.port
        ),
    )
    .unwrap();
    let status = Command::new(format!("{SBIN}/rabbitmq-server"))
        .arg("-detached")
        .env("HOME", home)
        .env("RABBITMQ_NODENAME", &node.name)
        .env("RABBITMQ_CONFIG_FILE", &config)
        .env("RABBITMQ_CONF_ENV_FILE", "/dev/null")
        .env("RABBITMQ_DIST_PORT", free_port().to_string())
        .env("RABBITMQ_MNESIA_BASE", base.join("mnesia"))
        .env("RABBITMQ_LOG_BASE", base.join("log"))
        .env(
            "RABBITMQ_ENABLED_PLUGINS_FILE",
            home.join("enabled_plugins"),
        )
        .env("RABBITMQ_PLUGINS_EXPAND_DIR", base.join("plugins"))
        .env("ERL_EPMD_ADDRESS", "127.0.0.1")
        .status()
        .expect("rabbitmq-server starts");
    assert!(
        status.success(),
        "rabbitmq-server -detached for {}",
        node.name
    );
}

/// One installation on the cluster: an agent per page, the coordinator and a worker.
struct Site {
    db: Database,
    install: Installation,
    conn: PgConnection,
    addr: String,
    ready: Vec<u16>,
    services: Vec<Process>,
    _dir: TempDir,
}

impl Site {
    async fn new(cluster: &Cluster) -> Site {
        let dir = TempDir::new();
        let db = Database::create("cluster").await;
        let install = Installation {
            database_url: db.url(),
            queue_prefix: format!("e2e-{}", Uuid::now_v7()),
        };
        let mut site = Site {
            conn: PgConnection::connect(&db.url()).await.unwrap(),
            db,
            install,
            addr: cluster.addr(),
            ready: vec![],
            services: vec![],
            _dir: dir,
        };
        site.countersign(&["migrate", "--with-content"]);
        site.countersign(&["seed-demo-site"]);
        for uid in WRITABLE_PAGES {
            let agent = page_agent(&site._dir, uid);
            site.countersign(&["agents", "put", &agent]);
        }
        site.countersign(&["producers", "allow", "guest", "acting-user", "*"]);
        site.countersign(&["producers", "allow", "guest", "approver", "*"]);
        for binary in ["countersign-coordinator", "countersign-worker"] {
            let port = free_port();
            let http = format!("127.0.0.1:{port}");
            let mut args = vec!["--http-addr", http.as_str()];
            if binary == "countersign-worker" {
                args.extend(["--poll-interval-secs", "1"]);
            }
            site.services.push(
                site.install
                    .spawn_env(binary, &args, &[("AMQP_ADDR", &site.addr)]),
            );
            site.ready.push(port);
        }
        site
    }

    /// `countersign ARGS` on the cluster, which must succeed; its stdout.
    fn countersign(&self, args: &[&str]) -> String {
        let out = self
            .install
            .command("countersign")
            .env("AMQP_ADDR", &self.addr)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "countersign {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn submit(&self, uid: i64) -> String {
        let out = self.countersign(&[
            "submit",
            "--agent",
            &format!("page-{uid}"),
            "--as",
            "editor",
            "Describe the page.",
        ]);
        out.split_whitespace().nth(1).unwrap().to_owned()
    }

    async fn approve(&mut self, run_id: &str) {
        wait_for_card(&mut self.conn, run_id, 1, secs(90)).await;
        let digest = run_row(&mut self.conn, run_id).await["turn_digest"]
            .as_str()
            .unwrap()
            .to_owned();
        let out = self.countersign(&[
            "decide",
            run_id,
            "--seq",
            "1",
            "--digest",
            &digest,
            "--as",
            "admin",
            "--approve",
        ]);
        assert!(out.contains("decision accepted"), "{out}");
    }

    /// How long until both services answer `/readyz` 200 again.
    async fn time_to_ready(&self, since: Instant) -> Duration {
        let deadline = since + secs(60);
        for port in &self.ready {
            while !http_get(*port, "/readyz").is_some_and(|(s, _)| s.contains("200")) {
                assert!(
                    Instant::now() < deadline,
                    "not ready on :{port} within 60 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        since.elapsed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_approved_and_written_once_while_the_connected_node_and_then_the_leaders_node_stop(
) {
    let Some(cluster) = Cluster::start("runs", 3).await else {
        return;
    };
    let mut site = Site::new(&cluster).await;
    site.time_to_ready(Instant::now()).await;

    // Two runs before any fault, waiting for approval.
    let mut runs: Vec<String> = WRITABLE_PAGES[..2]
        .iter()
        .map(|uid| site.submit(*uid))
        .collect();
    for run_id in &runs {
        wait_for_card(&mut site.conn, run_id, 1, secs(90)).await;
    }

    // The services connect to node 1 first: stop it. Approvals and new runs go on through
    // nodes 2 and 3.
    let stopped = Instant::now();
    cluster.ctl(&cluster.nodes[0], &["stop_app"]);
    let first = site.time_to_ready(stopped).await;
    println!("node 1 stopped: both services ready again after {first:?}");
    for run_id in &runs {
        site.approve(run_id).await;
    }
    runs.extend(WRITABLE_PAGES[2..4].iter().map(|uid| site.submit(*uid)));
    for run_id in &runs[2..4] {
        site.approve(run_id).await;
    }

    // Node 1 back; then the node leading the decisions queue stops, mid-run.
    cluster.ctl(&cluster.nodes[0], &["start_app"]);
    cluster.await_startup(&cluster.nodes[0]);
    let decisions = format!("{}.decisions", site.install.queue_prefix);
    let leader = cluster.leader_of(&cluster.nodes[1], &decisions);
    runs.extend(WRITABLE_PAGES[4..].iter().map(|uid| site.submit(*uid)));
    for run_id in &runs[4..] {
        wait_for_card(&mut site.conn, run_id, 1, secs(90)).await;
    }
    let stopped = Instant::now();
    cluster.ctl(&cluster.nodes[leader], &["stop_app"]);
    let second = site.time_to_ready(stopped).await;
    println!(
        "node {} (the decisions queue's leader) stopped: both services ready again after {second:?}",
        leader + 1
    );
    for run_id in &runs[4..] {
        site.approve(run_id).await;
    }

    // Every run completed with its one write, after its approval; nothing is left unpublished.
    for run_id in &runs {
        wait_for_status(&mut site.conn, run_id, "completed", secs(90)).await;
    }
    assert_written_once(&mut site.conn, runs.len()).await;
    let outbox = &mut site.conn;
    countersign_e2e::wait_until("every event published", secs(30), async || {
        (count(
            outbox,
            "SELECT count(*) FROM event_outbox WHERE published_at IS NULL",
        )
        .await
            == 0)
            .then_some(())
    })
    .await;
    println!("events lost 0: every outbox row published");
    assert!(
        first < secs(30) && second < secs(30),
        "{first:?} {second:?}"
    );

    drop(site.services);
    drop(site.conn);
    site.db.remove().await.unwrap();
}

/// `make chaos` on the cluster: its approvals, killed workers, colleague's edits and reaper,
/// with the services given all three nodes, while the node they connect to first (which also
/// leads the queues they declared) stops and comes back, and then the node leading the
/// decisions queue stops. The chaos run checks every write against the card it was approved
/// on and exits non-zero on any write lost, duplicated, unapproved or landed against unseen
/// state, or a run not completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chaos_suite_finds_nothing_lost_or_doubled_while_the_connected_node_and_then_the_leaders_node_stop(
) {
    let Some(cluster) = Cluster::start("chaos", 3).await else {
        return;
    };
    let dir = TempDir::new();
    let log = dir.0.join("chaos.log");
    let mut chaos = std::process::Command::new(countersign_e2e::binary("countersign-chaos"))
        .env("AMQP_ADDR", cluster.addr())
        .env("CHAOS_RUNS", "300")
        // Runs keep arriving for a minute, so both stops below land while runs are in flight,
        // however fast this machine finishes them.
        .env("CHAOS_SPREAD_SECS", "60")
        .env("CHAOS_DEADLINE_SECS", "400")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("countersign-chaos starts");
    let running = |chaos: &mut std::process::Child, when: &str| {
        assert!(
            chaos.try_wait().unwrap().is_none(),
            "the chaos run ended before {when}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };

    // Once the chaos run's services have declared their queues, and its runs are under way.
    cluster.leader_of(&cluster.nodes[1], ".decisions");
    tokio::time::sleep(Duration::from_secs(3)).await;
    running(&mut chaos, "node 1 stopped");
    cluster.ctl(&cluster.nodes[0], &["stop_app"]);
    println!("node 1 stopped");
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.ctl(&cluster.nodes[0], &["start_app"]);
    cluster.await_startup(&cluster.nodes[0]);
    running(&mut chaos, "the decisions queue's leader was looked up");
    let leader = cluster.leader_of(&cluster.nodes[2], ".decisions");
    running(&mut chaos, "the leader's node stopped");
    cluster.ctl(&cluster.nodes[leader], &["stop_app"]);
    println!("node {} (the decisions queue's leader) stopped", leader + 1);
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.ctl(&cluster.nodes[leader], &["start_app"]);

    let out = tokio::task::spawn_blocking(move || chaos.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    print!("{report}");
    if !out.status.success() {
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = logged.lines().rev().take(40).collect();
        eprintln!(
            "the chaos run's last log lines, newest first:\n{}",
            tail.join("\n")
        );
        panic!("the chaos run failed ({}): {report}", out.status);
    }
    assert!(
        report.contains("lost 0 duplicated 0 landed-against-unseen-state 0 unapproved 0"),
        "{report}"
    );
}

/// A node's process held stopped (`SIGSTOP`): its connections stay open and nothing on them is
/// answered, as when a node stalls or a partition swallows its answers. Continued on drop.
struct Mute(String);

impl Mute {
    fn new(pid: String) -> Mute {
        signal("-STOP", &pid);
        Mute(pid)
    }
}

impl Drop for Mute {
    fn drop(&mut self) {
        signal("-CONT", &self.0);
    }
}

fn signal(which: &str, pid: &str) {
    let status = Command::new("kill")
        .args([which, pid])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {which} {pid}");
}

/// A consumer started on a connection the broker stops answering fails within the publish
/// timeout (`consume_failed`) instead of waiting for the answer forever, which held a
/// coordinator's decisions unconsumed after a node went away mid-start; once the node answers
/// again, consuming again reconnects and gets the queue's messages. Cancelling a consumer on a
/// stopped node fails within the timeout too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_start_the_broker_does_not_answer_fails_within_the_publish_timeout_and_consuming_again_works_once_it_does(
) {
    let Some(cluster) = Cluster::start("mute", 1).await else {
        return;
    };
    let mut config = QueueConfig::new(
        cluster.addr(),
        Topology::new(format!("mute-{}", Uuid::now_v7())),
    );
    config.publish_timeout = Duration::from_secs(2);
    let broker = Broker::connect(config).await.expect("the node answers");
    let queue = broker.topology().decisions();

    {
        let _mute = Mute::new(cluster.pid(&cluster.nodes[0]));
        let started = Instant::now();
        let attempt = tokio::time::timeout(secs(60), broker.consume(&queue, 1))
            .await
            .expect("the consume waited on the stopped node for over 60 s");
        let error = attempt.expect_err("a consume nobody answers fails");
        assert_eq!(error.code(), "consume_failed");
        let took = started.elapsed();
        println!(
            "consume on a stopped node failed after {:.1} s (publish timeout 2 s)",
            took.as_secs_f64()
        );
        assert!(
            took < secs(10),
            "the consume failed after {took:?}, not within the 2 s timeout"
        );
    }

    let mut consumer = tokio::time::timeout(secs(60), broker.consume(&queue, 1))
        .await
        .expect("the consume returned")
        .expect("consuming again works once the node answers");
    broker
        .publish_to_queue(&queue, br#"{"after":"the stall"}"#, None)
        .await
        .expect("the node takes a message again");
    let delivery = tokio::time::timeout(secs(30), consumer.next())
        .await
        .expect("a delivery within 30 s")
        .expect("the consumer is open")
        .expect("a delivery");
    assert_eq!(delivery.body, br#"{"after":"the stall"}"#);
    delivery.ack().await.unwrap();

    // Stopping the consumer (a worker's shutdown) is bounded the same way.
    {
        let _mute = Mute::new(cluster.pid(&cluster.nodes[0]));
        let started = Instant::now();
        let cancelled = tokio::time::timeout(secs(60), consumer.cancel_untaken())
            .await
            .expect("the cancel waited on the stopped node for over 60 s");
        let error = cancelled.expect_err("a cancel nobody answers fails");
        assert_eq!(error.code(), "consume_failed");
        assert!(
            started.elapsed() < secs(10),
            "the cancel failed after {:?}, not within the 2 s timeout",
            started.elapsed()
        );
    }
    broker.delete_topology().await.unwrap();
}
