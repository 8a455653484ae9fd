//! The service binaries as processes: found where cargo built them, started with their output
//! in a log, awaited until `/readyz` answers, stopped with SIGTERM as systemd or Kubernetes
//! stops them, or with SIGKILL as a crash does, paused with SIGSTOP and continued with SIGCONT
//! as a long pause of the process (a stopped container, a suspended VM) does. A process still running when its value goes
//! is killed, unless it was detached to run on.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};

/// The path of `name`, a binary of this workspace, where cargo built it: beside the running
/// executable, or one directory up from a test executable (`target/<profile>/deps/`).
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running executable")?;
    let here = exe.parent().context("the executable has no directory")?;
    let candidates = [Some(here), here.parent()];
    let found = candidates.into_iter().flatten().map(|dir| dir.join(name));
    let path = found.clone().find(|path| path.is_file());
    path.with_context(|| {
        format!(
            "{} is not built: build the workspace's binaries as this one was built \
             (`cargo build [--release] --workspace --bins`; `make test`, `make demo` and \
             `make bench` do)",
            here.join(name).display()
        )
    })
}

/// A free port on the loopback interface (free when asked: bind it soon).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET path` on 127.0.0.1:`port`, over a connection of its own: (status line, body); `None`
/// while nothing answers there.
pub fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// The sum of a Prometheus counter's samples (every label set) in a `/metrics` body.
pub fn counter_total(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Polls `probe` every 20 ms until it yields a value, or fails; fails once `within` has passed
/// without one, saying what it waited for.
pub async fn wait_until<T>(
    what: &str,
    within: Duration,
    mut probe: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        ensure!(
            started.elapsed() < within,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` exists and is not a zombie (dead, its status not yet collected).
pub fn process_runs(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which is in parentheses and may hold anything.
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// A started binary; see the module documentation.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    log: Option<PathBuf>,
    detached: bool,
}

impl From<Child> for Process {
    /// A child started elsewhere, killed when the value goes.
    fn from(child: Child) -> Process {
        Process::new(format!("process {}", child.id()), child, None)
    }
}

impl Process {
    fn new(name: String, child: Child, log: Option<PathBuf>) -> Process {
        Process {
            name,
            child,
            log,
            detached: false,
        }
    }

    /// Starts `command`, its output going where the command says.
    pub fn spawn(name: &str, command: &mut Command) -> anyhow::Result<Process> {
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Process::new(name.to_owned(), child, None))
    }

    /// Starts `command` with no input, its output (both streams) appended to `log`, whose last
    /// lines the failures this value reports quote.
    pub fn spawn_logged(name: &str, command: &mut Command, log: &Path) -> anyhow::Result<Process> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let mut process = Process::spawn(name, command)?;
        process.log = Some(log.to_owned());
        Ok(process)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it runs still (a zombie does not).
    pub fn is_running(&self) -> bool {
        process_runs(self.pid())
    }

    /// Its exit status, once it exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL: the process dies at once, settling nothing; its exit status.
    ///
    /// # Panics
    /// When the signal cannot be sent to this child or its status collected.
    pub fn sigkill(&mut self) -> ExitStatus {
        self.child.kill().expect("SIGKILL is delivered");
        self.child.wait().expect("the killed child is reaped")
    }

    /// SIGTERM: the orderly stop, not waited for.
    ///
    /// # Panics
    /// When `kill` cannot be run or the signal cannot be delivered.
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// SIGSTOP: the process is frozen where it stands — a long pause, a stopped container, a
    /// suspended VM — its sockets open and its kernel still acknowledging what arrives.
    ///
    /// # Panics
    /// When `kill` cannot be run or the signal cannot be delivered.
    pub fn sigstop(&self) {
        self.signal("STOP");
    }

    /// SIGCONT: a process stopped with [`Process::sigstop`] goes on from where it stood.
    ///
    /// # Panics
    /// When `kill` cannot be run or the signal cannot be delivered.
    pub fn sigcont(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .expect("kill starts");
        assert!(
            sent.success(),
            "SIG{name} was not delivered to {}",
            self.name
        );
    }

    /// Whether the process is stopped (by SIGSTOP), by its state in /proc.
    pub fn is_stopped(&self) -> bool {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    }

    /// Waits up to `within` for the process to exit; `None` if it is still running.
    pub async fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        wait_until("it exits", within, async || Ok(self.exited()))
            .await
            .ok()
    }

    /// SIGTERM, then its exit status; SIGKILL and an error if it has not exited within
    /// `within`.
    pub async fn terminate(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        self.sigterm();
        match self.exit_within(within).await {
            Some(status) => Ok(status),
            None => {
                self.sigkill();
                bail!("{} (pid {}) did not stop on SIGTERM", self.name, self.pid())
            }
        }
    }

    /// Waits until `GET path` on 127.0.0.1:`port` answers 200; fails, quoting its log, when
    /// the process exits first or does not answer within `within`.
    pub async fn wait_for_http(
        &mut self,
        port: u16,
        path: &str,
        within: Duration,
    ) -> anyhow::Result<()> {
        let what = format!("{} is ready", self.name);
        let ready = wait_until(&what, within, async || {
            if let Some(status) = self.exited() {
                bail!("{} exited {status} before it was ready", self.name);
            }
            let answer = http_get(port, path);
            Ok(answer
                .is_some_and(|(status, _)| status.contains(" 200"))
                .then_some(()))
        })
        .await;
        ready.map_err(|e| anyhow::anyhow!("{e}:\n{}", self.log_tail()))
    }

    /// [`Process::wait_for_http`] on `/readyz`.
    pub async fn wait_ready(&mut self, port: u16, within: Duration) -> anyhow::Result<()> {
        self.wait_for_http(port, "/readyz", within).await
    }

    /// The last 20 lines of its log (nothing without one), for a failure message.
    pub fn log_tail(&self) -> String {
        let text = self
            .log
            .as_ref()
            .and_then(|log| std::fs::read_to_string(log).ok())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Lets the process run on after this value goes; its pid.
    pub fn detach(mut self) -> u32 {
        self.detached = true;
        self.pid()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.detached && self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
