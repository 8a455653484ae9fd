//! Tools from MCP servers end to end: the example notes server (`examples/mcp/notes_server.py`,
//! the official `mcp` SDK for Python, pinned by `scripts/mcp-example.sh`), started over stdio
//! by each binary from the file `COUNTERSIGN_MCP_SERVERS_FILE` names — or run by the test over
//! streamable HTTP, behind a bearer secret — with the real coordinator, worker and reaper.
//!
//! - One turn of a built-in write, a remote wiki write and two MCP writes suspends with every
//!   preview; a colleague's change of the notes file bounces the approval with the MCP call
//!   marked moved and nothing written anywhere; the re-approval writes each call exactly once,
//!   the MCP writes under their idempotency keys, all audited.
//! - The server killed while a write is in flight (after it applied, before it answered): the
//!   worker starts it again and sends the idempotent `set_note` again under its key, which the
//!   server answers from its record — written once; the non-idempotent `append_to_note` is an
//!   unknown outcome, never sent again nor reported failed.
//! - A tool annotated read-only runs without a card; one without annotations is gated and
//!   decided without a preview.
//! - `countersign tools list` and `tools check` see the MCP tools; `check` passes the example's
//!   previews and fails a server whose preview reads the clock.
//! - Over streamable HTTP: the same turn suspends, bounces on a colleague's change and writes
//!   once; the server restarted while the run waits and again after it applied a write, down
//!   for a while (every session is gone with it): new sessions are opened, the reaper requeues
//!   the segment that gave up, and the idempotent write lands once; a wrong or missing secret
//!   keeps the binaries from starting, naming the server, and the secret is never printed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use countersign_e2e::preview_lines as lines;
use countersign_e2e::{
    run_row, secs, wait_for_card, wait_for_status, wait_until, workspace_file, Database,
    Installation, Process, TempDir,
};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::remote_tools::{WikiServer, SECRET};

/// The example's Python, with the pinned `mcp` SDK (scripts/mcp-example.sh).
pub(crate) fn mcp_python() -> PathBuf {
    let python = workspace_file("target/mcp-example/bin/python");
    if !python.exists() {
        let installed = Command::new(workspace_file("scripts/mcp-example.sh"))
            .status()
            .expect("scripts/mcp-example.sh runs");
        assert!(installed.success(), "the MCP SDK could not be installed");
    }
    python
}

/// The bearer secret the notes server over HTTP requires.
const NOTES_TOKEN: &str = "notes-bearer-4f1c9a";

/// How the binaries reach the notes server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Each binary starts it as a child process.
    Stdio,
    /// The test runs it, and the binaries reach it over streamable HTTP with the secret.
    Http,
}

/// The notes server run by the test over streamable HTTP, on a port that stays its own across
/// restarts.
struct HttpNotes {
    child: Child,
    port: u16,
    file: PathBuf,
    slow: PathBuf,
}

impl HttpNotes {
    /// The server on `port` (0: one it picks), once it listens.
    fn start(file: &Path, slow: &Path, port: u16) -> HttpNotes {
        let mut child = Command::new(mcp_python())
            .arg(workspace_file("examples/mcp/notes_server.py"))
            .args(["--http", &format!("127.0.0.1:{port}")])
            .env("NOTES_FILE", file)
            .env("NOTES_SLOW_FILE", slow)
            .env("NOTES_TOKEN", NOTES_TOKEN)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the example's python runs the notes server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening on http://127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the notes server says where it listens: {line:?}"));
        HttpNotes {
            child,
            port,
            file: file.to_owned(),
            slow: slow.to_owned(),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Kills the server, as a crash does, and starts it again on the same port after `down`:
    /// every session it knew is gone.
    fn restart(&mut self, down: std::time::Duration) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::thread::sleep(down);
        *self = HttpNotes::start(&self.file, &self.slow, self.port);
    }
}

impl Drop for HttpNotes {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The notes the example server keeps, in a file of the test's own, the server when the test
/// runs it, and the MCP servers file that names it.
struct Notes {
    file: PathBuf,
    slow: PathBuf,
    servers_file: PathBuf,
    http: Option<HttpNotes>,
}

impl Notes {
    fn new(dir: &TempDir, notes: &Value, over: Over) -> Notes {
        let file = dir.0.join("notes.json");
        let slow = dir.0.join("slow");
        std::fs::write(&file, json!({ "notes": notes, "applied": {} }).to_string()).unwrap();
        let python = mcp_python();
        let http = (over == Over::Http).then(|| HttpNotes::start(&file, &slow, 0));
        let servers = match &http {
            // The operator trusts the example's annotations: the effects these tests rely on
            // are the server's own.
            Some(http) => json!({
                "notes": { "url": http.url(), "data_class": "editor_content",
                           "trust_annotations": true }
            }),
            None => json!({
                "notes": {
                    "command": [python, workspace_file("examples/mcp/notes_server.py")],
                    "env": { "NOTES_FILE": file, "NOTES_SLOW_FILE": slow },
                    "data_class": "editor_content",
                    "trust_annotations": true
                },
                "unfit": {
                    "command": [python, workspace_file("tests/e2e/mcp_unfit_server.py")],
                    "data_class": "public",
                    "trust_annotations": true
                }
            }),
        };
        let servers_file = PathBuf::from(dir.json("mcp-servers.json", &servers));
        Notes {
            file,
            slow,
            servers_file,
            http,
        }
    }

    /// The server the test runs over HTTP, killed and started again on its port after `down`.
    fn restart(&mut self, down: std::time::Duration) {
        self.http
            .as_mut()
            .expect("the test runs the server")
            .restart(down);
    }

    /// What the server holds now (its file is replaced atomically on every change).
    fn state(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(&self.file).unwrap()).unwrap()
    }

    /// A colleague's edit of the notes, straight in the file, taking none of countersign's
    /// locks.
    fn colleague_sets(&self, name: &str, text: &str) {
        let mut state = self.state();
        state["notes"][name] = json!(text);
        let tmp = self.file.with_extension("colleague");
        std::fs::write(&tmp, state.to_string()).unwrap();
        std::fs::rename(&tmp, &self.file).unwrap();
    }

    /// From now on a write waits 30 seconds after it applied, before it answers.
    fn slow_writes(&self) {
        std::fs::write(&self.slow, "").unwrap();
    }

    fn fast_writes(&self) {
        std::fs::remove_file(&self.slow).unwrap();
    }
}

/// One installation whose agent proposes `turns` of calls, with the notes server, and — when
/// `wiki` — the remote wiki, besides the content store.
struct Site {
    db: Database,
    install: Installation,
    conn: PgConnection,
    notes: Notes,
    wiki: Option<WikiServer>,
    env: Vec<(&'static str, String)>,
    _dir: TempDir,
}

impl Site {
    async fn new(tag: &str, notes: Value, turns: Vec<Value>, wiki: bool) -> Site {
        Site::build(tag, notes, turns, wiki, Over::Stdio).await
    }

    /// A site whose notes server the test runs over streamable HTTP, the binaries given its
    /// secret.
    async fn over_http(tag: &str, notes: Value, turns: Vec<Value>) -> Site {
        Site::build(tag, notes, turns, false, Over::Http).await
    }

    async fn build(tag: &str, notes: Value, turns: Vec<Value>, wiki: bool, over: Over) -> Site {
        let dir = TempDir::new();
        let notes = Notes::new(&dir, &notes, over);
        let wiki = wiki.then(|| WikiServer::start(&dir, &json!({ "home": ["Welcome."] }), &[]));
        let mut script: Vec<Value> = turns
            .into_iter()
            .map(|calls| json!({ "content": "Working on the notes.", "tool_calls": calls }))
            .collect();
        script.push(json!({ "content": "Done." }));
        let script = dir.json("script.json", &json!({ "turns": script }));
        let agent = dir.json(
            "agent.json",
            &json!({
                "name": "notes-assistant",
                "model": { "provider": "scripted", "script": script },
                "policy": { "allowed_groups": ["mcp_notes", "content", "editing"],
                            "enabled_tools": ["set_note", "append_to_note", "count_visit",
                                              "set_page", "update_page_metadata"] },
                "max_iterations": 6,
                "four_eyes": false,
                "approval_deadline_secs": 3600
            }),
        );
        let db = Database::create(tag).await;
        let install = Installation {
            database_url: db.url(),
            queue_prefix: format!("e2e-{}", Uuid::now_v7()),
        };
        let mut env = vec![(
            "COUNTERSIGN_MCP_SERVERS_FILE",
            notes.servers_file.to_string_lossy().into_owned(),
        )];
        if over == Over::Http {
            env.push(("COUNTERSIGN_TOOL_SECRET_NOTES", NOTES_TOKEN.to_owned()));
        }
        if let Some(wiki) = &wiki {
            env.push((
                "COUNTERSIGN_TOOL_SERVERS",
                crate::remote_tools::trusted_wiki(&wiki.url),
            ));
            env.push(("COUNTERSIGN_TOOL_SECRET_WIKI", SECRET.to_owned()));
        }
        let site = Site {
            conn: PgConnection::connect(&db.url()).await.unwrap(),
            db,
            install,
            notes,
            wiki,
            env,
            _dir: dir,
        };
        site.countersign_ok(&["migrate", "--with-content"]);
        site.countersign_ok(&["seed-demo-site"]);
        site.countersign_ok(&["agents", "put", &agent]);
        site.countersign_ok(&["producers", "allow", "guest", "acting-user", "*"]);
        site.countersign_ok(&["producers", "allow", "guest", "approver", "*"]);
        site
    }

    fn spawn(&self, binary: &str, args: &[&str]) -> Process {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.install.spawn_env(binary, args, &env)
    }

    /// `countersign ARGS` with the site's tool configuration: success, stdout, stderr.
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

    fn submit(&self) -> String {
        let out = self.countersign_ok(&[
            "submit",
            "--agent",
            "notes-assistant",
            "--as",
            "editor",
            "Keep the notes.",
        ]);
        out.split_whitespace().nth(1).unwrap().to_owned()
    }

    async fn digest(&mut self, run_id: &str) -> String {
        run_row(&mut self.conn, run_id).await["turn_digest"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn approve(&self, run_id: &str, seq: i32, digest: &str) {
        let seq = seq.to_string();
        let out = self.countersign_ok(&[
            "decide",
            run_id,
            "--seq",
            &seq,
            "--digest",
            digest,
            "--as",
            "admin",
            "--approve",
        ]);
        assert!(out.contains("decision accepted"), "{out}");
    }

    /// The call previews and stale indexes of the run's current card, from its sealed state.
    async fn card(&self, run_id: &str) -> (Vec<Value>, Value) {
        let state = countersign_e2e::sealed_state(&self.db.url(), run_id).await;
        let previews = state["call_previews"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (previews, state["stale_call_indexes"].clone())
    }

    async fn tool_writes(&mut self, run_id: &str) -> i64 {
        countersign_e2e::tool_writes(&mut self.conn, run_id).await
    }

    async fn finish(self, services: Vec<Process>) {
        drop(services);
        drop(self.conn);
        drop(self.wiki);
        countersign_e2e::delete_topology(&self.install.queue_prefix).await;
        self.db.remove().await.unwrap();
    }
}

fn set_hours() -> Value {
    json!({ "name": "set_note", "arguments": { "name": "hours", "text": "9-17" } })
}

fn append_log() -> Value {
    json!({ "name": "append_to_note", "arguments": { "name": "log", "line": "Opened." } })
}

/// The process ids of the notes servers `parent` started.
fn notes_servers(parent: &Process) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-P", &parent.pid().to_string(), "-f", "notes_server.py"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn an_mcp_turn_with_built_in_and_remote_writes_suspends_bounces_on_a_colleagues_change_and_writes_once(
) {
    let mut site = Site::new(
        "mcp_turn",
        json!({ "hours": "9-18", "log": "Started." }),
        vec![json!([
            { "name": "update_page_metadata",
              "arguments": { "uid": 12, "description": "Bicycles for every road." } },
            { "name": "set_page", "arguments": { "page": "about", "text": "We repair bicycles." } },
            set_hours(),
            append_log()
        ])],
        true,
    )
    .await;
    let services = vec![
        site.spawn("countersign-coordinator", &[]),
        site.spawn("countersign-worker", &[]),
    ];

    // The run suspends on card 1 with the notes server's own previews of its two calls.
    let run_id = site.submit();
    wait_for_card(&mut site.conn, &run_id, 1, secs(90)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(lines(&previews, 2), vec![r#"note hours: "9-18" → "9-17""#]);
    assert_eq!(
        lines(&previews, 3),
        vec![r#"note log: 1 line(s) → 2, appended last: "Opened.""#]
    );
    assert_eq!(stale, json!([]));
    let digest = site.digest(&run_id).await;

    // A colleague changes the hours in the notes file; the approval of card 1 finds set_note's
    // preview moved, writes nothing anywhere, and the run waits on card 2 with it marked.
    site.notes.colleague_sets("hours", "8-18");
    site.approve(&run_id, 1, &digest);
    wait_for_card(&mut site.conn, &run_id, 2, secs(60)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(stale, json!([2]));
    assert_eq!(lines(&previews, 2), vec![r#"note hours: "8-18" → "9-17""#]);
    let notes = site.notes.state();
    assert_eq!(notes["applied"], json!({}), "{notes}");
    assert_eq!(notes["notes"]["log"], "Started.", "{notes}");
    let wiki = site.wiki.as_ref().unwrap().state();
    assert!(wiki["pages"].get("about").is_none(), "{wiki}");
    assert_eq!(site.tool_writes(&run_id).await, 0);

    // The approval of card 2 writes each call once; set_note under the key of its call.
    site.approve(&run_id, 2, &digest);
    wait_for_status(&mut site.conn, &run_id, "completed", secs(90)).await;
    let notes = site.notes.state();
    assert_eq!(notes["notes"]["hours"], "9-17", "{notes}");
    assert_eq!(notes["notes"]["log"], "Started.\nOpened.", "{notes}");
    assert_eq!(
        notes["applied"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec![&format!("{run_id}:2:2")],
        "{notes}"
    );
    let wiki = site.wiki.as_ref().unwrap().state();
    assert_eq!(wiki["pages"]["about"], json!(["We repair bicycles."]));
    let description: String =
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
            .fetch_one(&mut site.conn)
            .await
            .unwrap();
    assert_eq!(description, "Bicycles for every road.");
    assert_eq!(site.tool_writes(&run_id).await, 4, "every write is audited");
    site.finish(services).await;
}

/// A site whose run proposes `call`, waiting on card 1 with its digest, and its services (the
/// worker second).
async fn waiting_on(tag: &str, call: Value, over: Over) -> (Site, Vec<Process>, String, String) {
    let mut site = Site::build(
        tag,
        json!({ "hours": "9-18", "log": "Started." }),
        vec![json!([call])],
        false,
        over,
    )
    .await;
    let mut services = vec![site.spawn("countersign-coordinator", &[])];
    if over == Over::Stdio {
        services.push(site.spawn("countersign-worker", &["--poll-interval-secs", "1"]));
    } else {
        // A server the test runs may be down for longer than a segment retries in process:
        // then the segment is left to the reaper, which requeues the run once its (short)
        // lease has expired.
        services.push(site.spawn(
            "countersign-worker",
            &["--poll-interval-secs", "1", "--lease-ttl-secs", "6"],
        ));
        services.push(site.spawn(
            "countersign-reaper",
            &[
                "--every",
                "1",
                "--backoff-secs",
                "0",
                "--dispatch-grace-secs",
                "0",
            ],
        ));
    }
    let run_id = site.submit();
    wait_for_card(&mut site.conn, &run_id, 1, secs(90)).await;
    let digest = site.digest(&run_id).await;
    (site, services, run_id, digest)
}

/// Approves card 1 with writes slowed, waits until the server applied the write, and kills the
/// worker's MCP server before it answers.
async fn kill_the_server_after_it_applied(
    site: &Site,
    worker: &Process,
    run_id: &str,
    digest: &str,
    applied: impl Fn(&Value) -> bool,
) {
    site.notes.slow_writes();
    site.approve(run_id, 1, digest);
    let notes = &site.notes;
    wait_until("the server applied the write", secs(60), async || {
        applied(&notes.state()).then_some(())
    })
    .await;
    let servers = notes_servers(worker);
    assert_eq!(
        servers.len(),
        1,
        "the worker runs one notes server: {servers:?}"
    );
    let killed = Command::new("kill")
        .arg("-9")
        .args(servers.iter().map(u32::to_string))
        .status()
        .unwrap();
    assert!(killed.success());
    site.notes.fast_writes();
}

#[tokio::test]
async fn an_mcp_server_killed_mid_write_is_started_again_and_the_idempotent_write_lands_once() {
    let (mut site, services, run_id, digest) =
        waiting_on("mcp_kill_idem", set_hours(), Over::Stdio).await;
    let key = format!("{run_id}:1:0");
    kill_the_server_after_it_applied(&site, &services[1], &run_id, &digest, |notes| {
        notes["applied"].get(&key).is_some()
    })
    .await;

    // The lost answer interrupts the segment; its retry starts the server again and sends the
    // call again under its key, which the server answers from its record.
    wait_for_status(&mut site.conn, &run_id, "completed", secs(90)).await;
    let notes = site.notes.state();
    assert_eq!(notes["notes"]["hours"], "9-17");
    assert_eq!(
        notes["applied"].as_object().unwrap().len(),
        1,
        "applied once: {notes}"
    );
    assert_eq!(site.tool_writes(&run_id).await, 1);
    assert_eq!(
        notes_servers(&services[1]).len(),
        1,
        "the server runs again"
    );
    site.finish(services).await;
}

#[tokio::test]
async fn an_append_whose_answer_was_lost_with_its_mcp_server_is_an_unknown_outcome_never_sent_again(
) {
    let (mut site, services, run_id, digest) =
        waiting_on("mcp_kill_append", append_log(), Over::Stdio).await;
    kill_the_server_after_it_applied(&site, &services[1], &run_id, &digest, |notes| {
        notes["notes"]["log"] == "Started.\nOpened."
    })
    .await;

    wait_for_status(&mut site.conn, &run_id, "failed", secs(90)).await;
    let row = run_row(&mut site.conn, &run_id).await;
    assert_eq!(
        (
            row["termination_reason"].as_str(),
            row["error_code"].as_str()
        ),
        (Some("outcome_unknown"), Some("outcome_unknown")),
        "{row}"
    );
    // Nothing sent the append again, and no result was made up for it.
    tokio::time::sleep(secs(2)).await;
    assert_eq!(site.notes.state()["notes"]["log"], "Started.\nOpened.");
    assert_eq!(site.tool_writes(&run_id).await, 0);
    site.finish(services).await;
}

#[tokio::test]
async fn a_read_only_mcp_tool_runs_without_a_card_and_one_without_annotations_is_gated_without_a_preview(
) {
    let mut site = Site::new(
        "mcp_gates",
        json!({ "hours": "9-18" }),
        vec![
            json!([{ "name": "read_note", "arguments": { "name": "hours" } }]),
            json!([{ "name": "count_visit", "arguments": { "name": "hours" } }]),
        ],
        false,
    )
    .await;
    let services = vec![
        site.spawn("countersign-coordinator", &[]),
        site.spawn("countersign-worker", &[]),
    ];
    let run_id = site.submit();

    // The read ran on its own; the first card is the unannotated call's, with no preview.
    wait_for_card(&mut site.conn, &run_id, 1, secs(90)).await;
    let (previews, _) = site.card(&run_id).await;
    assert_eq!(previews, Vec::<Value>::new(), "count_visit has no preview");
    let shown = site.countersign_ok(&["show", &run_id, "--as", "admin"]);
    assert!(
        shown.contains("call 0 · count_visit")
            && shown.contains("This tool has no preview; the arguments are all there is."),
        "{shown}"
    );
    assert!(
        !shown.contains("read_note"),
        "the read is not on the card: {shown}"
    );
    assert!(
        site.notes.state().get("visits").is_none(),
        "nothing counted before the approval"
    );

    let digest = site.digest(&run_id).await;
    site.approve(&run_id, 1, &digest);
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    assert_eq!(site.notes.state()["visits"]["hours"], 1);
    site.finish(services).await;
}

#[tokio::test]
async fn tools_list_and_check_see_mcp_tools_and_check_fails_a_preview_that_reads_the_clock() {
    let site = Site::new("mcp_tools_check", json!({ "hours": "9-18" }), vec![], false).await;

    let listed = site.countersign_ok(&["tools", "list"]);
    let trusted = "effect decided by the server (trusted)";
    for (tool, effect, previews, decided) in [
        ("read_note", "read_only", "no preview", trusted),
        ("set_note", "idempotent_write", "previews", trusted),
        (
            "append_to_note",
            "non_idempotent_write",
            "previews",
            trusted,
        ),
        // No annotations: nothing to trust, so it fails closed.
        (
            "count_visit",
            "non_idempotent_write",
            "no preview",
            "effect decided by nobody (fail closed)",
        ),
        ("stamp", "idempotent_write", "previews", trusted),
    ] {
        let line = listed
            .lines()
            .find(|l| l.starts_with(&format!("{tool}\t")))
            .unwrap_or_else(|| panic!("{tool} is listed: {listed}"));
        let fields: Vec<&str> = line.split('\t').collect();
        assert!(
            fields[1].starts_with("MCP server")
                && fields[2] == effect
                && fields[6] == previews
                && fields[7] == decided,
            "{line}"
        );
    }

    let out = site.countersign_ok(&[
        "tools",
        "check",
        "set_note",
        "--args",
        r#"{"name": "hours", "text": "9-17"}"#,
        "--as",
        "editor",
    ]);
    assert!(
        out.contains("MCP server notes") && out.contains("ok: the preview is deterministic"),
        "{out}"
    );
    let (ok, out, err) = site.countersign(&[
        "tools",
        "check",
        "stamp",
        "--args",
        r#"{"name": "hours"}"#,
        "--as",
        "editor",
    ]);
    assert!(!ok, "{out}");
    assert!(err.contains("tools check stamp"), "{err}");
    site.finish(vec![]).await;
}

#[tokio::test]
async fn an_mcp_turn_over_streamable_http_suspends_bounces_on_a_colleagues_change_and_writes_once()
{
    let mut site = Site::over_http(
        "mcp_http_turn",
        json!({ "hours": "9-18", "log": "Started." }),
        vec![json!([set_hours(), append_log()])],
    )
    .await;
    let services = vec![
        site.spawn("countersign-coordinator", &[]),
        site.spawn("countersign-worker", &[]),
    ];

    // The run suspends on card 1 with the server's own previews, asked for over HTTP.
    let run_id = site.submit();
    wait_for_card(&mut site.conn, &run_id, 1, secs(90)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(lines(&previews, 0), vec![r#"note hours: "9-18" → "9-17""#]);
    assert_eq!(
        lines(&previews, 1),
        vec![r#"note log: 1 line(s) → 2, appended last: "Opened.""#]
    );
    assert_eq!(stale, json!([]));
    let digest = site.digest(&run_id).await;

    // A colleague's change of the hours bounces the approval: nothing is written, and card 2
    // marks set_note moved.
    site.notes.colleague_sets("hours", "8-18");
    site.approve(&run_id, 1, &digest);
    wait_for_card(&mut site.conn, &run_id, 2, secs(60)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(stale, json!([0]));
    assert_eq!(lines(&previews, 0), vec![r#"note hours: "8-18" → "9-17""#]);
    let notes = site.notes.state();
    assert_eq!(notes["applied"], json!({}), "{notes}");
    assert_eq!(notes["notes"]["log"], "Started.", "{notes}");
    assert_eq!(site.tool_writes(&run_id).await, 0);

    // The re-approval writes each call once, set_note under the key of its call.
    site.approve(&run_id, 2, &digest);
    wait_for_status(&mut site.conn, &run_id, "completed", secs(90)).await;
    let notes = site.notes.state();
    assert_eq!(notes["notes"]["hours"], "9-17", "{notes}");
    assert_eq!(notes["notes"]["log"], "Started.\nOpened.", "{notes}");
    assert_eq!(
        notes["applied"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec![&format!("{run_id}:2:0")],
        "{notes}"
    );
    assert_eq!(site.tool_writes(&run_id).await, 2, "every write is audited");
    site.finish(services).await;
}

#[tokio::test]
async fn an_http_mcp_server_restarted_while_the_run_waits_and_mid_write_gets_new_sessions_and_the_write_lands_once(
) {
    let (mut site, services, run_id, digest) =
        waiting_on("mcp_http_restart", set_hours(), Over::Http).await;

    // Restarted while the run waits: the sessions of the worker and the coordinator are gone
    // with it, and the approval's previews go through new ones.
    site.notes.restart(secs(0));
    let key = format!("{run_id}:1:0");
    site.notes.slow_writes();
    site.approve(&run_id, 1, &digest);
    let notes = &site.notes;
    wait_until("the server applied the write", secs(60), async || {
        notes.state()["applied"].get(&key).map(|_| ())
    })
    .await;

    // Killed after it applied the write and before it answered, and down for longer than the
    // segment retries in process: the lost answer, then the refused connections, leave the
    // segment to the reaper, whose requeue sends the call again under its key in a new session,
    // and the server answers from its record.
    site.notes.fast_writes();
    site.notes.restart(secs(4));
    wait_for_status(&mut site.conn, &run_id, "completed", secs(90)).await;
    let notes = site.notes.state();
    assert_eq!(notes["notes"]["hours"], "9-17");
    assert_eq!(
        notes["applied"].as_object().unwrap().len(),
        1,
        "applied once: {notes}"
    );
    assert_eq!(site.tool_writes(&run_id).await, 1);
    site.finish(services).await;
}

#[tokio::test]
async fn a_wrong_or_missing_secret_of_an_http_mcp_server_keeps_the_binaries_from_starting_and_is_never_shown(
) {
    const WRONG: &str = "not-the-notes-secret-77d2";
    let mut site = Site::over_http("mcp_http_secret", json!({ "hours": "9-18" }), vec![]).await;
    assert!(site.countersign_ok(&["tools", "list"]).contains("set_note"));

    for (value, says) in [
        (
            Some(WRONG),
            "discovery at MCP server notes failed (mcp_unauthorized)",
        ),
        (
            None,
            "the secret of MCP server notes is not set (variable COUNTERSIGN_TOOL_SECRET_NOTES)",
        ),
    ] {
        site.env
            .retain(|(k, _)| *k != "COUNTERSIGN_TOOL_SECRET_NOTES");
        if let Some(value) = value {
            site.env
                .push(("COUNTERSIGN_TOOL_SECRET_NOTES", value.to_owned()));
        }
        let (ok, out, err) = site.countersign(&["tools", "list"]);
        assert!(!ok, "{out}");
        assert!(err.contains(says), "{err}");
        let worker = site
            .install
            .command("countersign-worker")
            .envs(site.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        let worker_err = String::from_utf8_lossy(&worker.stderr);
        assert!(!worker.status.success(), "{worker_err}");
        assert!(worker_err.contains(says), "{worker_err}");
        for shown in [&out, &err, &worker_err.to_string()] {
            assert!(
                !shown.contains(WRONG) && !shown.contains(NOTES_TOKEN),
                "{shown}"
            );
        }
    }
    site.finish(vec![]).await;
}
