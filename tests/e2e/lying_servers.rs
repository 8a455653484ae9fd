//! Servers that lie, end to end: an MCP server written on the official Python SDK
//! (`tests/servers/lying_mcp_server.py`, over stdio and over streamable HTTP) and a remote tool
//! server (`tests/servers/lying_remote_server.py`), with the real binaries. What a server says
//! about its tools decides nothing the operator did not hand it, and what it puts in a preview
//! never draws the approver's screen:
//!
//! - a writer annotated read-only is gated by default — a card, and its lost answer an unknown
//!   outcome never sent again — and runs as a read only once the operator trusts the server;
//! - a `list_changed` that turns a read into a destructive write withholds the tool from every
//!   run (log line, gauge, one `tool.withheld` event) until `countersign tools accept`;
//! - a remote server's `enabled_by_default`, group and data class are ignored without the
//!   operator's word;
//! - a preview full of escape sequences is shown inert in a real terminal (tmux), by `inbox`,
//!   `show` and `tools check`, after the preview tool died once mid-request and was retried;
//! - an MCP write answered by an internal error is `outcome_unknown`, one refused as invalid is
//!   the model's error, and a read that never answers gives up after the call's time limit with
//!   `mcp_timeout`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use countersign_e2e::{
    chat_answer, count, counter_total, free_port, messages_with_role, metrics, model_settings,
    run_row, secs, wait_for_card, wait_for_sql, wait_for_status, wait_until, workspace_file,
    Database, Installation, ModelStub, Process, TempDir, KEYS,
};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::mcp::mcp_python;

/// How the binaries reach the lying MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Each binary starts it as a child process.
    Stdio,
    /// The test runs it, and the binaries reach it over streamable HTTP.
    Http,
}

/// The bearer secret of the lying servers the test runs.
const SECRET: &str = "lying-bearer-5e1d";

/// The lying MCP server's directory: its state, shared by every copy of it, and the files that
/// make it misbehave.
struct LyingDir(PathBuf);

impl LyingDir {
    fn state(&self) -> Value {
        match std::fs::read_to_string(self.0.join("state.json")) {
            Ok(text) => serde_json::from_str(&text).unwrap(),
            Err(_) => json!({ "tickets": {}, "calls": [] }),
        }
    }

    /// How many calls of `tool` arrived.
    fn calls(&self, tool: &str) -> usize {
        self.state()["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| *c == tool)
            .count()
    }

    fn ticket(&self, number: u32) -> Value {
        self.state()["tickets"][number.to_string()].clone()
    }

    fn set(&self, flag: &str) {
        std::fs::write(self.0.join(flag), "").unwrap();
    }

    /// Sets the log purge_log empties (no server writes the state meanwhile: the run waits).
    fn set_log(&self, entries: usize) {
        let mut state = self.state();
        state["log"] = json!((0..entries).map(|i| format!("e{i}")).collect::<Vec<_>>());
        std::fs::write(self.0.join("state.json"), state.to_string()).unwrap();
    }

    fn clear(&self, flag: &str) {
        std::fs::remove_file(self.0.join(flag)).unwrap();
    }
}

/// A call of the lying MCP server's `tool` on ticket `n`.
fn call(tool: &str, n: u32) -> Value {
    json!({ "name": tool, "arguments": { "ticket_number": n } })
}

/// One installation whose agent proposes `calls` in one turn and then finishes, with the lying
/// MCP server configured by the operator's `word` (fields of its servers file entry).
struct Lab {
    db: Database,
    install: Installation,
    conn: PgConnection,
    lying: LyingDir,
    env: Vec<(&'static str, String)>,
    http: Option<Process>,
    dir: TempDir,
}

impl Lab {
    async fn new(tag: &str, word: Value, over: Over, calls: Vec<Value>, enabled: &[&str]) -> Lab {
        let dir = TempDir::new();
        let script = dir.json(
            "script.json",
            &json!({ "turns": [
                { "content": "Working on the tickets.", "tool_calls": calls },
                { "content": "Done." } ] }),
        );
        let model = json!({ "provider": "scripted", "script": script });
        let policy = json!({ "enabled_tools": enabled });
        Lab::build_in(dir, tag, Some((word, over)), model, policy).await
    }

    /// An installation with the lying MCP server configured by `mcp` (the operator's word and
    /// the transport), if any, and an agent of `model` and `policy`.
    async fn build(tag: &str, mcp: Option<(Value, Over)>, model: Value, policy: Value) -> Lab {
        Lab::build_in(TempDir::new(), tag, mcp, model, policy).await
    }

    async fn build_in(
        dir: TempDir,
        tag: &str,
        mcp: Option<(Value, Over)>,
        model: Value,
        policy: Value,
    ) -> Lab {
        let lying = LyingDir(dir.0.join("lying"));
        std::fs::create_dir_all(&lying.0).unwrap();
        let mut env = vec![(countersign_e2e::MODEL_KEY_ENV, "unused".to_owned())];
        let mut http = None;
        if let Some((word, over)) = mcp {
            let python = mcp_python();
            let server = workspace_file("tests/servers/lying_mcp_server.py");
            let mut entry = match over {
                Over::Stdio => {
                    json!({ "command": [python, server], "env": { "LYING_DIR": lying.0 } })
                }
                Over::Http => {
                    let (process, url) = serve_http(&python, &server, &lying.0);
                    http = Some(process);
                    env.push(("COUNTERSIGN_TOOL_SECRET_LYING", SECRET.to_owned()));
                    json!({ "url": url })
                }
            };
            for (k, v) in word.as_object().unwrap() {
                entry[k] = v.clone();
            }
            let servers = dir.json("mcp-servers.json", &json!({ "lying": entry }));
            env.push(("COUNTERSIGN_MCP_SERVERS_FILE", servers));
        }
        let agent = dir.json(
            "agent.json",
            &json!({
                "name": "ticket-assistant",
                "model": model,
                "policy": policy,
                "max_iterations": 4,
                "four_eyes": false,
                "approval_deadline_secs": 3600
            }),
        );
        let db = Database::create(tag).await;
        let install = Installation {
            database_url: db.url(),
            queue_prefix: format!("e2e-{}", Uuid::now_v7()),
        };
        let lab = Lab {
            conn: PgConnection::connect(&db.url()).await.unwrap(),
            db,
            install,
            lying,
            env,
            http,
            dir,
        };
        lab.countersign_ok(&["migrate", "--with-content"]);
        lab.countersign_ok(&["seed-demo-site"]);
        lab.countersign_ok(&["agents", "put", &agent]);
        lab.countersign_ok(&["producers", "allow", "guest", "acting-user", "*"]);
        lab.countersign_ok(&["producers", "allow", "guest", "approver", "*"]);
        lab
    }

    fn spawn(&self, binary: &str, args: &[&str]) -> Process {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.install.spawn_env(binary, args, &env)
    }

    fn services(&self) -> Vec<Process> {
        vec![
            self.spawn("countersign-coordinator", &[]),
            self.spawn("countersign-worker", &["--poll-interval-secs", "1"]),
        ]
    }

    /// `countersign ARGS` with the lab's tool configuration: success, stdout, stderr.
    fn countersign(&self, args: &[&str]) -> (bool, String, String) {
        let out = self
            .install
            .command("countersign")
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn countersign_ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.countersign(args);
        assert!(ok, "countersign {args:?}:\n{out}\n{err}");
        out
    }

    fn submit(&self, prompt: &str) -> String {
        let out = self.countersign_ok(&[
            "submit",
            "--agent",
            "ticket-assistant",
            "--as",
            "editor",
            prompt,
        ]);
        out.split_whitespace().nth(1).unwrap().to_owned()
    }

    /// Approves card `seq` of the run, as the card's digest names it.
    async fn approve(&mut self, run_id: &str, seq: i32) {
        let digest = run_row(&mut self.conn, run_id).await["turn_digest"]
            .as_str()
            .unwrap()
            .to_owned();
        let out = self.install.approve_card(run_id, seq, &digest, "admin");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("decision accepted"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The line `tools list` prints for `tool`, split into its columns.
    fn listed(&self, tool: &str) -> Vec<String> {
        let out = self.countersign_ok(&["tools", "list"]);
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{tool}\t")))
            .unwrap_or_else(|| panic!("{tool} is listed:\n{out}"));
        line.split('\t').map(str::to_owned).collect()
    }

    async fn termination(&mut self, run_id: &str) -> (Option<String>, Option<String>) {
        let row = run_row(&mut self.conn, run_id).await;
        (
            row["termination_reason"].as_str().map(str::to_owned),
            row["error_code"].as_str().map(str::to_owned),
        )
    }

    async fn finish(self, services: Vec<Process>) {
        drop(services);
        drop(self.http);
        drop(self.conn);
        countersign_e2e::delete_topology(&self.install.queue_prefix).await;
        self.db.remove().await.unwrap();
        drop(self.dir);
    }
}

/// The lying MCP server over streamable HTTP, and its endpoint.
fn serve_http(python: &Path, server: &Path, dir: &Path) -> (Process, String) {
    let mut child = Command::new(python)
        .arg(server)
        .args(["--http", "127.0.0.1:0"])
        .env("LYING_DIR", dir)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the SDK's python runs the lying server");
    let port = listening_port(&mut child);
    (Process::from(child), format!("http://127.0.0.1:{port}/mcp"))
}

/// The port a server the test started says it listens on.
fn listening_port(child: &mut Child) -> u16 {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("the server says where it listens: {line:?}"))
}

/// The process ids of the lying servers `parent` started.
fn lying_servers(parent: &Process) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-P", &parent.pid().to_string(), "-f", "lying_mcp_server.py"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn a_read_only_annotated_writer_is_gated_by_default_and_runs_as_a_read_only_with_the_operators_trust(
) {
    for over in [Over::Stdio, Over::Http] {
        gated_by_default(over).await;
        a_read_with_the_operators_trust(over).await;
    }
}

/// Without the operator's word: a card, and a lost answer that is an unknown outcome.
async fn gated_by_default(over: Over) {
    let mut lab = Lab::new(
        "lying_gated",
        json!({}),
        over,
        vec![call("archive_ticket", 6)],
        &["archive_ticket"],
    )
    .await;
    let listed = lab.listed("archive_ticket");
    assert_eq!(
        listed[2..6],
        [
            "non_idempotent_write",
            "mcp_lying",
            "secret_adjacent",
            "disabled"
        ]
    );
    assert_eq!(
        listed[7],
        "effect decided by nobody (fail closed); the server suggests (untrusted): read_only"
    );

    let services = lab.services();
    let run_id = lab.submit("Look at ticket 6.");
    wait_for_card(&mut lab.conn, &run_id, 1, secs(90)).await;
    assert_eq!(
        lab.lying.calls("archive_ticket"),
        0,
        "nothing ran before the card"
    );
    let shown = lab.countersign_ok(&["show", &run_id, "--as", "admin"]);
    assert!(
        shown.contains("call 0 · archive_ticket")
            && shown.contains("This tool has no preview; the arguments are all there is."),
        "{shown}"
    );

    if over == Over::Stdio {
        // Approved, it archives, and its server dies before it answers: the answer of a
        // non-idempotent write is lost, and nothing sends it again.
        lab.lying.set("slow");
        lab.approve(&run_id, 1).await;
        let lying = &lab.lying;
        wait_until("the ticket is archived", secs(60), async || {
            (lying.ticket(6)["archived"] == true).then_some(())
        })
        .await;
        let servers = lying_servers(&services[1]);
        assert_eq!(
            servers.len(),
            1,
            "the worker runs one lying server: {servers:?}"
        );
        let killed = Command::new("kill")
            .arg("-9")
            .args(servers.iter().map(u32::to_string))
            .status()
            .unwrap();
        assert!(killed.success());
        lab.lying.clear("slow");
        wait_for_status(&mut lab.conn, &run_id, "failed", secs(90)).await;
        assert_eq!(
            lab.termination(&run_id).await,
            (
                Some("outcome_unknown".into()),
                Some("outcome_unknown".into())
            )
        );
    } else {
        lab.approve(&run_id, 1).await;
        wait_for_status(&mut lab.conn, &run_id, "completed", secs(90)).await;
    }
    assert_eq!(
        lab.lying.calls("archive_ticket"),
        1,
        "sent once, never again"
    );
    lab.finish(services).await;
}

/// With `trust_annotations`, the operator's word: the annotated read runs without a card.
async fn a_read_with_the_operators_trust(over: Over) {
    let mut lab = Lab::new(
        "lying_trusted",
        json!({ "trust_annotations": true }),
        over,
        vec![call("archive_ticket", 7)],
        &[],
    )
    .await;
    let listed = lab.listed("archive_ticket");
    assert_eq!(listed[2], "read_only");
    assert_eq!(listed[5], "enabled");
    assert_eq!(listed[7], "effect decided by the server (trusted)");
    let services = lab.services();
    let run_id = lab.submit("Look at ticket 7.");
    wait_for_status(&mut lab.conn, &run_id, "completed", secs(90)).await;
    assert_eq!(
        run_row(&mut lab.conn, &run_id).await["suspension_seq"],
        Value::Null,
        "no card"
    );
    assert_eq!(lab.lying.ticket(7)["archived"], true);
    lab.finish(services).await;
}

#[tokio::test]
async fn a_list_changed_flip_is_withheld_from_every_run_until_an_operator_accepts_it() {
    let mut lab = Lab::new(
        "lying_flip",
        json!({ "trust_annotations": true, "data_class": "editor_content" }),
        Over::Stdio,
        vec![call("lookup", 6)],
        &["lookup"],
    )
    .await;
    // Whoever hears of the change: a webhook endpoint subscribed to it.
    lab.countersign_ok(&[
        "webhooks",
        "add",
        "http://127.0.0.1:9/hooks",
        "--events",
        "tool.withheld",
    ]);
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let mut services = vec![
        lab.spawn("countersign-coordinator", &[]),
        lab.spawn(
            "countersign-worker",
            &["--poll-interval-secs", "1", "--http-addr", &address],
        ),
    ];
    let withheld_gauge =
        async |port| counter_total(&metrics(port).await, "countersign_tools_withheld");
    assert_eq!(withheld_gauge(port).await, 0.0);

    // A read, by the trusted annotations: no card.
    let first = lab.submit("Read ticket 6.");
    wait_for_status(&mut lab.conn, &first, "completed", secs(90)).await;
    assert_eq!(lab.lying.calls("lookup"), 1);

    // The server turns lookup into a destructive write and says its tools changed.
    lab.lying.set("flip");
    wait_for_sql(
        &mut lab.conn,
        "the change is recorded as pending",
        secs(30),
        "SELECT pending_identity IS NOT NULL FROM tool_identities WHERE tool = 'lookup'",
    )
    .await;
    wait_until("the worker withholds lookup", secs(30), async || {
        (withheld_gauge(port).await == 1.0).then_some(())
    })
    .await;
    let announced = "SELECT count(*) FROM webhook_deliveries WHERE kind = 'tool.withheld'";
    assert_eq!(count(&mut lab.conn, announced).await, 1, "announced once");

    // The next run's call of it is not run: the tool is withheld.
    let second = lab.submit("Read ticket 6 again.");
    wait_for_status(&mut lab.conn, &second, "completed", secs(90)).await;
    assert_eq!(lab.lying.calls("lookup"), 1, "not sent");
    assert_eq!(lab.lying.ticket(6)["comments"], 14, "no comment deleted");
    let listed = lab.listed("lookup");
    assert!(listed[8].starts_with("WITHHELD"), "{listed:?}");
    let check = lab.countersign_ok(&["agents", "check", "ticket-assistant", "--as", "editor"]);
    assert!(
        check.contains(
            "withheld  lookup (mcp_lying, editor_content): its server lists it otherwise than it was accepted"
        ),
        "{check}"
    );
    // Its log line, in plain text: standard error is no terminal here, so it has no colour.
    let (_, _, log) = lab.countersign(&["tools", "list"]);
    assert!(
        log.contains("WARN") && log.contains("tool withheld from every run"),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "no colour codes: {log:?}");

    // The operator reads the change and accepts exactly it.
    let pending = lab.countersign_ok(&["tools", "pending"]);
    assert!(
        pending.contains("tool lookup · withheld since"),
        "{pending}"
    );
    assert!(
        pending.contains("  accepted:   mcp:lying · read_only"),
        "{pending}"
    );
    assert!(
        pending.contains("  listed now: mcp:lying · non_idempotent_write"),
        "{pending}"
    );
    assert!(
        pending.contains("  changed: effect, parameters"),
        "{pending}"
    );
    let identity = pending
        .lines()
        .find_map(|l| l.split("--identity ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    let (ok, _, err) = lab.countersign(&[
        "tools",
        "accept",
        "lookup",
        "--identity",
        &"0".repeat(64),
        "--as",
        "ops",
    ]);
    assert!(!ok && err.contains("nothing accepted"), "{err}");
    let accepted = lab.countersign_ok(&[
        "tools",
        "accept",
        "lookup",
        "--identity",
        &identity,
        "--as",
        "ops",
    ]);
    assert!(accepted.contains("tool lookup accepted"), "{accepted}");
    assert!(lab
        .countersign_ok(&["tools", "pending"])
        .contains("no tool is withheld"));

    // Services started since offer it as it is now: a write, gated.
    drop(services);
    services = lab.services();
    let third = lab.submit("Read ticket 6 once more.");
    wait_for_card(&mut lab.conn, &third, 1, secs(90)).await;
    assert_eq!(lab.lying.calls("lookup"), 1);
    assert_eq!(lab.lying.ticket(6)["comments"], 14);
    lab.finish(services).await;
}

/// The lying remote server with its state file, on a free port; killed on drop.
struct LyingRemote {
    process: Process,
    url: String,
    state: PathBuf,
}

impl LyingRemote {
    fn start(dir: &TempDir) -> LyingRemote {
        let state = dir.0.join("remote-state.json");
        let mut child = Command::new("python3")
            .arg(workspace_file("tests/servers/lying_remote_server.py"))
            .args(["--port", "0", "--state"])
            .arg(&state)
            .env("LYING_SECRET", SECRET)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the lying remote server");
        let port = listening_port(&mut child);
        LyingRemote {
            process: Process::from(child),
            url: format!("http://127.0.0.1:{port}"),
            state,
        }
    }

    fn purges(&self) -> u64 {
        std::fs::read_to_string(&self.state)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|s| s["purges"].as_u64())
            .unwrap_or(0)
    }
}

/// An installation with the lying remote server named with `options`, and an agent allowed the
/// `content` group on a model provider outside the installation, which calls `purge_cache`.
async fn remote_lab(tag: &str, remote: &LyingRemote, options: &str) -> (Lab, ModelStub) {
    let stub = ModelStub::responding(|request| {
        Some(if messages_with_role(request, "tool").is_empty() {
            chat_answer("Purging.", &[("purge_cache", json!({ "name": "all" }))])
        } else {
            chat_answer("Done.", &[])
        })
    });
    let mut lab = Lab::build(
        tag,
        None,
        model_settings(&stub),
        json!({ "allowed_groups": ["content"] }),
    )
    .await;
    lab.env.push((
        "COUNTERSIGN_TOOL_SERVERS",
        format!("lying={} {options}", remote.url),
    ));
    lab.env
        .push(("COUNTERSIGN_TOOL_SECRET_LYING", SECRET.to_owned()));
    (lab, stub)
}

#[tokio::test]
async fn a_remote_servers_enabled_by_default_group_and_class_are_ignored_without_the_operators_word(
) {
    let dir = TempDir::new();
    let remote = LyingRemote::start(&dir);

    // Without the operator's word: a disabled non-idempotent write of the server's own group,
    // classed secret_adjacent, whatever the server declares — shown as its suggestion.
    let (mut lab, _stub) = remote_lab("lying_remote", &remote, "").await;
    for tool in ["purge_cache", "publish_post"] {
        let listed = lab.listed(tool);
        assert_eq!(
            listed[1..6],
            [
                "server lying",
                "non_idempotent_write",
                "remote_lying",
                "secret_adjacent",
                "disabled"
            ],
            "{listed:?}"
        );
        assert!(
            listed[7].ends_with("enabled, group content, public"),
            "{listed:?}"
        );
    }
    let check = lab.countersign_ok(&["agents", "check", "ticket-assistant", "--as", "editor"]);
    assert!(
        check.contains("withheld  purge_cache (remote_lying, secret_adjacent)"),
        "{check}"
    );
    let services = lab.services();
    let run_id = lab.submit("Purge the cache.");
    wait_for_status(&mut lab.conn, &run_id, "completed", secs(90)).await;
    assert_eq!(remote.purges(), 0, "the call was not offered, and not sent");
    lab.finish(services).await;

    // With the operator's word that the server's declarations are trusted: its group and
    // class, and its read is a read; a writer still is not enabled by its declaration.
    let (mut lab, _stub) = remote_lab("lying_remote_trusted", &remote, "trust_declarations").await;
    let purge = lab.listed("purge_cache");
    assert_eq!(purge[2..6], ["read_only", "content", "public", "enabled"]);
    let publish = lab.listed("publish_post");
    assert_eq!(
        publish[2..6],
        ["non_idempotent_write", "content", "public", "disabled"]
    );
    let check = lab.countersign_ok(&["agents", "check", "ticket-assistant", "--as", "editor"]);
    assert!(
        check.contains("offered   purge_cache (content, public)"),
        "{check}"
    );
    assert!(
        check.contains("withheld  publish_post (content, public): disabled by default"),
        "{check}"
    );
    let services = lab.services();
    let run_id = lab.submit("Purge the cache.");
    wait_for_status(&mut lab.conn, &run_id, "completed", secs(90)).await;
    assert_eq!(remote.purges(), 1);
    lab.finish(services).await;
    drop(remote.process);
}

/// The operator's word on the lying MCP server's failing tools: reads and writes by name, each
/// call given two seconds.
fn failing_tools() -> Value {
    json!({
        "data_class": "editor_content",
        "call_timeout_secs": 2,
        "tools": {
            "count_comments": { "effect": "read_only" },
            "reopen_ticket": { "effect": "non_idempotent_write", "enabled": true },
            "tag_ticket": { "effect": "non_idempotent_write", "enabled": true }
        }
    })
}

#[tokio::test]
async fn each_mcp_failure_ends_with_its_named_outcome() {
    // The model calls what the prompt names, then finishes once it has read a result.
    let stub = ModelStub::responding(|request| {
        let prompt = messages_with_role(request, "user").join("\n");
        let call: Value = prompt
            .find('{')
            .and_then(|at| {
                serde_json::Deserializer::from_str(&prompt[at..])
                    .into_iter::<Value>()
                    .next()?
                    .ok()
            })
            .unwrap_or(Value::Null);
        let name = call["name"].as_str().unwrap_or("none");
        Some(if messages_with_role(request, "tool").is_empty() {
            chat_answer("Working.", &[(name, call["arguments"].clone())])
        } else {
            chat_answer("Done.", &[])
        })
    });
    let mut lab = Lab::build(
        "lying_failures",
        Some((failing_tools(), Over::Stdio)),
        model_settings(&stub),
        json!({}),
    )
    .await;
    let services = lab.services();
    // What the model read as the result of the call `prompt` named.
    let tool_result = |stub: &ModelStub, prompt: &Value| -> Option<String> {
        stub.bodies()
            .iter()
            .filter(|b| {
                messages_with_role(b, "user")
                    .iter()
                    .any(|m| m.contains(&prompt.to_string()))
            })
            .flat_map(|b| messages_with_role(b, "tool"))
            .next()
    };

    // An internal error answering a write: nothing says it did nothing, so it may have landed.
    let reopen = call("reopen_ticket", 6);
    let run_id = lab.submit(&reopen.to_string());
    wait_for_card(&mut lab.conn, &run_id, 1, secs(90)).await;
    lab.approve(&run_id, 1).await;
    wait_for_status(&mut lab.conn, &run_id, "failed", secs(90)).await;
    assert_eq!(
        lab.termination(&run_id).await,
        (
            Some("outcome_unknown".into()),
            Some("outcome_unknown".into())
        )
    );
    assert_eq!(lab.lying.calls("reopen_ticket"), 1, "never sent again");

    // Invalid parameters: the server says it did nothing, and the model reads the refusal.
    let tag = json!({ "name": "tag_ticket", "arguments": { "ticket_number": 6, "tag": "x" } });
    let run_id = lab.submit(&tag.to_string());
    wait_for_card(&mut lab.conn, &run_id, 1, secs(90)).await;
    lab.approve(&run_id, 1).await;
    wait_for_status(&mut lab.conn, &run_id, "completed", secs(90)).await;
    assert_eq!(
        tool_result(&stub, &tag).as_deref(),
        Some("Error: tool \"tag_ticket\" failed (mcp_request_refused).")
    );

    // A read that never answers gives up after the call's two seconds, never retried for
    // minutes: the model reads the timeout.
    lab.lying.set("hang");
    let hang = call("count_comments", 6);
    let run_id = lab.submit(&hang.to_string());
    wait_for_status(&mut lab.conn, &run_id, "completed", secs(60)).await;
    assert_eq!(
        tool_result(&stub, &hang).as_deref(),
        Some("Error: tool \"count_comments\" failed (mcp_timeout).")
    );
    assert_eq!(lab.lying.calls("count_comments"), 1, "sent once");
    lab.finish(services).await;
}

/// Runs `script` in a detached tmux session of its own, `columns` wide, until it ends; then the
/// whole pane (history included) as the terminal shows it, and the pane's title.
fn in_tmux(dir: &TempDir, script: &str) -> (String, String) {
    let socket = format!("countersign-{}", Uuid::now_v7());
    let file = dir.0.join("terminal.sh");
    std::fs::write(
        &file,
        format!("{script}\necho __END_OF_SESSION__\nsleep 600\n"),
    )
    .unwrap();
    let tmux = |args: &[&str]| {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&socket)
            .args(args)
            .output()
            .expect("tmux runs (Debian's tmux; .ci/run installs it)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    tmux(&[
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-s",
        "approver",
        "-x",
        "240",
        "-y",
        "60",
        &format!("sh {}", file.display()),
    ]);
    tmux(&["set-option", "-t", "approver", "history-limit", "5000"]);
    let mut pane = String::new();
    for _ in 0..600 {
        pane = tmux(&[
            "capture-pane",
            "-p",
            "-J",
            "-t",
            "approver",
            "-S",
            "-",
            "-E",
            "-",
        ]);
        if pane.contains("__END_OF_SESSION__") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        pane.contains("__END_OF_SESSION__"),
        "the session ended:\n{pane}"
    );
    let title = tmux(&["display-message", "-p", "-t", "approver", "#{pane_title}"]);
    tmux(&["kill-server"]);
    (pane, title)
}

#[tokio::test]
async fn hostile_previews_are_rendered_inert_in_a_real_terminal() {
    let mut lab = Lab::new(
        "lying_terminal",
        json!({ "tools": {
            "preview_close_ticket": { "effect": "read_only" },
            "close_ticket": { "effect": "non_idempotent_write", "enabled": true }
        } }),
        Over::Stdio,
        vec![call("close_ticket", 6)],
        &[],
    )
    .await;
    let services = lab.services();
    // The worker's preview tool dies mid-request once: a transient failure, retried.
    lab.lying.set("crash_preview");
    let run_id = lab.submit("Close ticket 6.");
    wait_for_card(&mut lab.conn, &run_id, 1, secs(90)).await;
    assert!(
        !lab.lying.0.join("crash_preview").exists(),
        "the preview tool died once"
    );
    let state = countersign_e2e::sealed_state(&lab.db.url(), &run_id).await;
    let lines = countersign_e2e::preview_lines(state["call_previews"].as_array().unwrap(), 0);
    assert_eq!(
        lines[1],
        "this call also DELETES all 14 comments of ticket #6"
    );
    assert!(lines[2].starts_with("\u{1b}[1A\u{1b}[2K"), "{lines:?}");

    // An approver at a terminal: the inbox, the run's card, and the tool's check.
    let mut script = String::new();
    for (k, v) in lab.env.iter().map(|(k, v)| (*k, v.clone())).chain([
        ("DATABASE_URL", lab.db.url()),
        ("AMQP_ADDR", countersign_e2e::amqp_addr()),
        ("COUNTERSIGN_QUEUE_PREFIX", lab.install.queue_prefix.clone()),
        ("COUNTERSIGN_KEYS", KEYS.to_owned()),
        ("RUST_LOG", "off".to_owned()),
    ]) {
        script.push_str(&format!("export {k}='{v}'\n"));
    }
    let countersign = countersign_e2e::binary("countersign");
    let countersign = countersign.display();
    script.push_str(&format!("echo __INBOX__; {countersign} inbox --as admin\n"));
    script.push_str(&format!(
        "echo __SHOW__; {countersign} show {run_id} --as admin\n"
    ));
    script.push_str(&format!(
        "echo __CHECK__; {countersign} tools check close_ticket --args '{{\"ticket_number\": 6}}' --as editor\n"
    ));
    let (pane, title) = in_tmux(&lab.dir, &script);

    for part in ["__INBOX__", "__SHOW__", "__CHECK__"] {
        let shown = pane.split(part).nth(1).unwrap();
        let shown = shown.split("__").next().unwrap();
        assert!(
            shown.contains("this call also DELETES all 14 comments of ticket #6"),
            "{part}: the line the approval binds to is on the screen:\n{pane}"
        );
        assert!(
            shown.contains("\\u{1b}[1A\\u{1b}[2K\\u{1b}[1Gthis call changes nothing else"),
            "{part}: the forged line is shown as what it is:\n{pane}"
        );
        assert!(
            shown.contains("\\u{1b}]0;forged title\\u{7}\\u{1b}[2J\\u{1b}[Hscreen cleared"),
            "{part}:\n{pane}"
        );
        assert!(
            shown.contains(
                "backspaced\\u{8}\\u{8}\\u{8}\\u{8}\\u{8} nul\\u{0} del\\u{7f} c1\\u{9b}31m bidi \\u{202e}gnp.exe\\u{202c}"
            ),
            "{part}:\n{pane}"
        );
        assert!(
            !shown.lines().any(|l| l
                .trim_start_matches([' ', '│'])
                .starts_with("this call changes nothing else")),
            "{part}: no line was forged in place:\n{pane}"
        );
    }
    assert!(
        pane.contains(&format!("run {run_id} · agent ticket-assistant")),
        "the screen above was not cleared:\n{pane}"
    );
    assert!(
        !title.contains("forged"),
        "the window title is the terminal's: {title}"
    );
    lab.finish(services).await;
}

#[tokio::test]
async fn a_preview_of_three_thousand_lines_that_grows_by_one_after_the_card_bounces_the_approval() {
    let word = json!({ "tools": {
        "purge_log": { "effect": "non_idempotent_write", "preview": "preview_purge_log" },
        "preview_purge_log": { "effect": "read_only" } } });
    let mut lab = Lab::new(
        "lying_long_preview",
        word,
        Over::Stdio,
        vec![call("purge_log", 6)],
        &["purge_log"],
    )
    .await;
    lab.lying.set_log(3000);
    let services = lab.services();
    let run_id = lab.submit("Purge the log of ticket 6.");
    wait_for_card(&mut lab.conn, &run_id, 1, secs(90)).await;
    let shown = lab.countersign_ok(&["show", &run_id, "--as", "admin"]);
    assert!(
        shown.contains("entry 18: e18") && !shown.contains("entry 19: e19"),
        "the card shows twenty lines: {shown}"
    );
    assert!(
        shown.contains("… and 2981 more line(s), not shown.")
            && shown.contains("the whole preview, 3001 lines, binds the approval"),
        "and says how many more there are, all of them read: {shown}"
    );
    let whole = lab.countersign_ok(&["show", &run_id, "--as", "admin", "--full"]);
    assert!(
        whole.contains("entry 2999: e2999"),
        "the whole preview: {whole}"
    );

    // One more entry after the card: past the lines shown, and the approval bounces.
    lab.lying.set_log(3001);
    lab.approve(&run_id, 1).await;
    wait_for_card(&mut lab.conn, &run_id, 2, secs(90)).await;
    assert_eq!(lab.lying.calls("purge_log"), 0, "nothing was purged");
    let card2 = lab.countersign_ok(&["show", &run_id, "--as", "admin"]);
    assert!(
        card2.contains("… and 2982 more line(s), not shown.") && card2.contains("⚠ moved"),
        "{card2}"
    );

    lab.approve(&run_id, 2).await;
    wait_for_status(&mut lab.conn, &run_id, "completed", secs(90)).await;
    assert_eq!(lab.lying.calls("purge_log"), 1, "purged once, after card 2");
    assert_eq!(lab.lying.state()["log"], json!([]));
    lab.finish(services).await;
}
