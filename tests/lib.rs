//! Black-box end-to-end tests of countersign: each test starts the real binaries as an
//! operator would, talks to them only through PostgreSQL, RabbitMQ, HTTP and their command
//! lines, and checks what they did.
//!
//! This crate must never reach into a library crate to fake a step a binary performs; the
//! queue crate is used only as any foreign producer or event consumer would use RabbitMQ.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

/// A fixed test keyring (32 zero bytes): these tests are about behaviour, not about keys.
pub const KEYS: &str = "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

/// The path of a binary built from this workspace, next to the running test executable.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    // target/<profile>/deps/e2e-<hash> → target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; `make test` builds it (`cargo build --workspace --bins`)",
        path.display()
    );
    path
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

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub fn amqp_addr() -> String {
    std::env::var("AMQP_ADDR")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
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

    /// Sets the installation up as an operator does: migrations, the demo site, the agent in
    /// `agent_file`, and the broker user `guest` allowed to name any acting user and approver.
    pub fn configure(&self, agent_file: &str) {
        self.countersign_ok(&["migrate"]);
        self.countersign_ok(&["seed-demo-site"]);
        self.countersign_ok(&["agents", "put", agent_file]);
        self.countersign_ok(&["producers", "allow", "guest", "acting-user", "*"]);
        self.countersign_ok(&["producers", "allow", "guest", "approver", "*"]);
    }

    /// Starts a long-running binary; it is killed when the guard drops.
    pub fn spawn(&self, binary_name: &str, args: &[&str]) -> Running {
        let child = self
            .command(binary_name)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the binary starts");
        Running(child)
    }
}

/// A running binary, killed on drop.
#[derive(Debug)]
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free port on the loopback interface.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET path` on 127.0.0.1:port: (status line, body); `None` while nothing listens.
pub fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// Deletes the queues and exchanges an installation under test declared.
pub async fn delete_topology(prefix: &str) {
    let config =
        countersign_queue::QueueConfig::new(amqp_addr(), countersign_queue::Topology::new(prefix));
    let broker = countersign_queue::Broker::connect(config)
        .await
        .expect("the broker answers");
    broker
        .delete_topology()
        .await
        .expect("the topology is deleted");
}
