//! Remote tools end to end: the reference tool server (`examples/remote-wiki`, Python) with the
//! real coordinator, worker and reaper, configured through `COUNTERSIGN_TOOL_SERVERS`.
//!
//! - The run suspends with the wiki's previews; a colleague's edit of the page moves the
//!   relative writer's preview and bounces the approval with nothing written; the approval of
//!   the new card writes each call exactly once, under its idempotency key.
//! - A turn that mixes a write to the content store with the wiki's writes is one unit: with
//!   nothing moved both land and both are audited; a local preview moved after the approval
//!   writes nothing; a wiki that finds its preview moved at the write rolls the local write
//!   back, and the run re-suspends with the call that had landed marked as done.
//! - A worker SIGKILLed while a call is in flight: the reaper requeues the run, another worker
//!   asks the wiki what became of the call's key, and the wiki writes it once — or, from a wiki
//!   that cannot say, a non-idempotent write fails the run `outcome_unknown`, never sent again.
//!
//! - `countersign tools add`, `list` and `check` against the wiki and a second server whose
//!   previews move by themselves or run past the bounds, named in a tool servers file.
//!
//! The operator trusts the wiki's declarations (`trust_declarations`), as a deployment that runs
//! its own wiki would: the effects, groups and classes these tests rely on are the wiki's.
//!
//! The wiki's `--hold-file` holds every execute while the file exists, so the test knows the
//! call is in flight at the server when it kills the worker. Tests of the one-phase path run
//! the wiki as a version 1 server (`--protocol 1`); the others take its writes in two phases.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use countersign_e2e::preview_lines as lines;
use countersign_e2e::{
    count, run_row, secs, wait_for_card, wait_for_sql, wait_for_status, wait_until, workspace_file,
    Installation, Process, TempDir,
};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use countersign_e2e::Database;

pub(crate) const SECRET: &str = "e2e-wiki-secret";

/// `COUNTERSIGN_TOOL_SERVERS` naming the wiki at `url`, whose declarations the operator trusts.
pub(crate) fn trusted_wiki(url: &str) -> String {
    format!("wiki={url} trust_declarations")
}

/// The wiki server on a free loopback port with its state file in `dir`; killed on drop.
pub(crate) struct WikiServer {
    child: Child,
    pub(crate) url: String,
    state: PathBuf,
    hold: PathBuf,
    hold_after: PathBuf,
    hold_prepare: PathBuf,
}

impl WikiServer {
    /// The wiki with `pages`, speaking the newest protocol unless `args` say otherwise.
    pub(crate) fn start(dir: &TempDir, pages: &Value, args: &[&str]) -> WikiServer {
        let state = dir.0.join("wiki.json");
        let hold = dir.0.join("hold");
        let hold_after = dir.0.join("hold-after");
        let hold_prepare = dir.0.join("hold-prepare");
        std::fs::write(&state, json!({ "pages": pages }).to_string()).unwrap();
        let mut child = Command::new("python3")
            .arg(workspace_file("examples/remote-wiki/wiki_server.py"))
            .args(["--port", "0", "--state"])
            .arg(&state)
            .arg("--hold-file")
            .arg(&hold)
            .arg("--hold-after-file")
            .arg(&hold_after)
            .arg("--hold-prepare-file")
            .arg(&hold_prepare)
            .args(args)
            .env("WIKI_SECRET", SECRET)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the wiki server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the wiki says where it listens: {line:?}"))
            .to_owned();
        WikiServer {
            child,
            url,
            state,
            hold,
            hold_after,
            hold_prepare,
        }
    }

    /// What the wiki holds now, from its state file (rewritten atomically on every change).
    pub(crate) fn state(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(&self.state).unwrap()).unwrap()
    }

    /// From now on every execute waits at the server until [`release`](Self::release).
    fn hold_executes(&self) {
        std::fs::write(&self.hold, "").unwrap();
    }

    fn release(&self) {
        std::fs::remove_file(&self.hold).unwrap();
    }

    /// How many executes have arrived while held.
    fn held_executes(&self) -> usize {
        std::fs::read_to_string(self.hold.with_extension("waiting"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// From now on every execute does its work, records it, and then waits before it answers
    /// until [`release_answers`](Self::release_answers).
    fn hold_answers(&self) {
        std::fs::write(&self.hold_after, "").unwrap();
    }

    fn release_answers(&self) {
        std::fs::remove_file(&self.hold_after).unwrap();
    }

    /// How many executes have done their work and wait to answer.
    fn held_answers(&self) -> usize {
        std::fs::read_to_string(self.hold_after.with_extension("waiting"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// From now on every prepare waits at the server until [`release_prepares`](Self::release_prepares).
    fn hold_prepares(&self) {
        std::fs::write(&self.hold_prepare, "").unwrap();
    }

    fn release_prepares(&self) {
        std::fs::remove_file(&self.hold_prepare).unwrap();
    }

    /// How many prepares have arrived while held.
    fn held_prepares(&self) -> usize {
        std::fs::read_to_string(self.hold_prepare.with_extension("waiting"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// A colleague's edit through the wiki's own editing surface.
    fn put_page(&self, page: &str, text: &str) {
        let address = self.url.strip_prefix("http://").unwrap();
        let body = json!({ "text": text }).to_string();
        let mut stream = TcpStream::connect(address).unwrap();
        write!(
            stream,
            "PUT /pages/{page} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {SECRET}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

impl Drop for WikiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run as a version 1 server: every write is one execute.
const ONE_PHASE: &[&str] = &["--protocol", "1"];

/// One installation with the wiki's writers and the content store's `update_page_metadata`,
/// with an agent that proposes `calls` in one turn and then finishes.
struct Site {
    db: Database,
    install: Installation,
    conn: PgConnection,
    wiki: WikiServer,
    env: Vec<(&'static str, String)>,
    _dir: TempDir,
}

impl Site {
    async fn new(tag: &str, pages: Value, calls: Value, wiki_args: &[&str]) -> Site {
        let dir = TempDir::new();
        let wiki = WikiServer::start(&dir, &pages, wiki_args);
        let script = dir.json(
            "script.json",
            &json!({ "turns": [
                { "content": "I will edit the wiki.", "tool_calls": calls },
                { "content": "Done." } ] }),
        );
        let agent = dir.json(
            "agent.json",
            &json!({
                "name": "wiki-assistant",
                "model": { "provider": "scripted", "script": script },
                "policy": { "allowed_groups": ["content", "editing"],
                            "enabled_tools": ["set_page", "append_line", "update_page_metadata"] },
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
        install.configure(&agent);
        let conn = PgConnection::connect(&db.url()).await.unwrap();
        let env = vec![
            ("COUNTERSIGN_TOOL_SERVERS", trusted_wiki(&wiki.url)),
            ("COUNTERSIGN_TOOL_SECRET_WIKI", SECRET.to_owned()),
        ];
        Site {
            db,
            install,
            conn,
            wiki,
            env,
            _dir: dir,
        }
    }

    /// A coordinator or worker that knows the wiki's tools.
    fn spawn(&self, binary: &str, args: &[&str]) -> Process {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.install.spawn_env(binary, args, &env)
    }

    fn submit(&self) -> String {
        self.install
            .submit("wiki-assistant", "editor", "Describe us on the wiki.")
    }

    async fn digest(&mut self, run_id: &str) -> String {
        run_row(&mut self.conn, run_id).await["turn_digest"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn approve(&self, run_id: &str, seq: i32, digest: &str) {
        let out = self.install.approve_card(run_id, seq, digest, "admin");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("decision accepted"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A coordinator and a worker with a short lease (to be killed while the approved call is
    /// in flight), a run on card 1, and that card's digest.
    async fn suspended_with_doomed_worker(&mut self) -> (Process, Process, String, String) {
        let coordinator = self.spawn("countersign-coordinator", &[]);
        let doomed = self.spawn("countersign-worker", &["--lease-ttl-secs", "3"]);
        let run_id = self.submit();
        wait_for_card(&mut self.conn, &run_id, 1, secs(60)).await;
        let digest = self.digest(&run_id).await;
        (coordinator, doomed, run_id, digest)
    }

    /// The call previews and stale indexes of the run's current card, from its sealed state.
    async fn card(&self, run_id: &str) -> (Vec<Value>, Value) {
        let state = self.sealed_state(run_id).await;
        let previews = state["call_previews"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (previews, state["stale_call_indexes"].clone())
    }

    /// The indexes of the calls the run's current card shows as written already.
    async fn landed(&self, run_id: &str) -> Vec<u64> {
        self.sealed_state(run_id).await["landed_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["index"].as_u64().unwrap())
            .collect()
    }

    /// The run's suspended state, opened.
    async fn sealed_state(&self, run_id: &str) -> Value {
        countersign_e2e::sealed_state(&self.db.url(), run_id).await
    }

    /// How many `tool_write` audit events the run has: one for every write that landed.
    async fn tool_writes(&mut self, run_id: &str) -> i64 {
        countersign_e2e::tool_writes(&mut self.conn, run_id).await
    }

    /// A colleague's edit of the content store in plain SQL, on a connection of its own.
    async fn colleague_sql(&self, sql: &str) {
        let mut conn = PgConnection::connect(&self.db.url()).await.unwrap();
        sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
    }

    /// Page 12's description, as the content store holds it.
    async fn description(&mut self) -> String {
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
            .fetch_one(&mut self.conn)
            .await
            .unwrap()
    }

    async fn journal(&mut self, run_id: &str) -> Vec<(i32, i32, i64)> {
        sqlx::query_as(
            "SELECT suspension_seq, call_index, lease_epoch FROM run_journal
             WHERE run_id = $1::uuid ORDER BY suspension_seq, call_index",
        )
        .bind(run_id)
        .fetch_all(&mut self.conn)
        .await
        .unwrap()
    }

    /// Waits until the run's lease has run out by the database clock.
    async fn wait_for_expired_lease(&mut self, run_id: &str) {
        let sql = format!("SELECT lease_expires_at < now() FROM runs WHERE id = '{run_id}'::uuid");
        wait_for_sql(&mut self.conn, "the lease expired", secs(30), &sql).await;
    }

    /// Once the killed worker's lease has run out: one reaper pass, which requeues the run (its
    /// next segment resolves the call in doubt by its key), and a worker that takes it again.
    async fn requeue_to_a_rescuer(&mut self, run_id: &str) -> Process {
        self.wait_for_expired_lease(run_id).await;
        let summary = self.reap();
        assert!(
            summary.contains("requeued=1") && summary.contains("outcome_unknown=0"),
            "{summary}"
        );
        self.spawn("countersign-worker", &["--poll-interval-secs", "1"])
    }

    /// One reaper pass without backoff; its summary line.
    fn reap(&self) -> String {
        let out = self
            .install
            .command("countersign-reaper")
            .args(["--backoff-secs", "0", "--dispatch-grace-secs", "0"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    async fn finish(self, services: Vec<Process>) {
        drop(services);
        drop(self.conn);
        drop(self.wiki);
        countersign_e2e::delete_topology(&self.install.queue_prefix).await;
        self.db.remove().await.unwrap();
    }
}

/// One absolute write: the page `about`, which does not exist yet, set to one line.
fn set_about() -> Value {
    json!([{ "name": "set_page", "arguments": { "page": "about", "text": "We repair bicycles." } }])
}

async fn wait_for_held_executes(wiki: &WikiServer, n: usize) {
    wait_until(
        &format!("{n} execute(s) held at the wiki"),
        secs(60),
        async || (wiki.held_executes() >= n).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn a_remote_turn_suspends_with_its_previews_bounces_on_a_moved_append_and_writes_once_on_reapproval(
) {
    let mut site = Site::new(
        "remote_tools",
        json!({ "home": ["Welcome.", "Opening hours: 9-17"] }),
        json!([
            { "name": "set_page", "arguments": { "page": "about", "text": "We repair bicycles." } },
            { "name": "append_line", "arguments": { "page": "home", "line": "Closed on Sundays." } }
        ]),
        &[],
    )
    .await;
    let services = vec![
        site.spawn("countersign-coordinator", &[]),
        site.spawn("countersign-worker", &[]),
    ];

    // The run suspends on card 1 with the wiki's own previews of both calls.
    let run_id = site.submit();
    wait_for_card(&mut site.conn, &run_id, 1, secs(60)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(
        lines(&previews, 0),
        vec![
            "page \"about\"",
            "text: (new page) → \"We repair bicycles.\""
        ]
    );
    assert_eq!(
        lines(&previews, 1),
        vec![
            "page \"home\"",
            "lines: 2 line(s) → 3, appended last: \"Closed on Sundays.\""
        ]
    );
    assert_eq!(stale, json!([]));
    let digest = site.digest(&run_id).await;

    // A colleague adds a line to home; the approval of card 1 finds the append moved, writes
    // nothing, and the run waits on card 2 with the current previews and the moved index.
    site.wiki.put_page(
        "home",
        "Welcome.\nOpening hours: 9-17\nNew: e-bike rentals.",
    );
    site.approve(&run_id, 1, &digest);
    wait_for_card(&mut site.conn, &run_id, 2, secs(60)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(stale, json!([1]));
    assert_eq!(
        lines(&previews, 1)[1],
        "lines: 3 line(s) → 4, appended last: \"Closed on Sundays.\""
    );
    let state = site.wiki.state();
    assert_eq!(state["applied"], json!([]), "nothing executed: {state}");
    assert!(state["pages"].get("about").is_none(), "{state}");
    assert!(site.journal(&run_id).await.is_empty());

    // The approval of card 2 writes each call once, under the key of its call of card 2.
    site.approve(&run_id, 2, &digest);
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    let state = site.wiki.state();
    assert_eq!(
        state["applied"],
        json!([format!("{run_id}:2:0"), format!("{run_id}:2:1")]),
        "{state}"
    );
    assert_eq!(state["pages"]["about"], json!(["We repair bicycles."]));
    assert_eq!(
        state["pages"]["home"],
        json!([
            "Welcome.",
            "Opening hours: 9-17",
            "New: e-bike rentals.",
            "Closed on Sundays."
        ])
    );
    let journal: Vec<(i32, i32)> = site
        .journal(&run_id)
        .await
        .into_iter()
        .map(|(s, i, _)| (s, i))
        .collect();
    assert_eq!(journal, vec![(2, 0), (2, 1)]);
    assert_eq!(
        run_row(&mut site.conn, &run_id).await["pending_effect"],
        Value::Null,
        "the stamp is cleared with the journal"
    );
    site.finish(services).await;
}

#[tokio::test]
async fn an_idempotent_remote_call_in_flight_when_its_worker_is_killed_is_sent_again_under_its_key_and_written_once(
) {
    let mut site = Site::new("remote_kill_idem", json!({}), set_about(), ONE_PHASE).await;
    let (coordinator, mut doomed, run_id, digest) = site.suspended_with_doomed_worker().await;

    // The approved call reaches the wiki and is held there; its worker dies with it in flight.
    site.wiki.hold_executes();
    site.approve(&run_id, 1, &digest);
    wait_for_held_executes(&site.wiki, 1).await;
    assert_eq!(
        run_row(&mut site.conn, &run_id).await["pending_effect"],
        "idempotent_write",
        "the call was stamped before it was sent"
    );
    doomed.sigkill();

    // The reaper requeues, and another worker sends the call that was sent again under the
    // same key, while the dead worker's request is still at the wiki.
    let rescuer = site.requeue_to_a_rescuer(&run_id).await;
    wait_for_held_executes(&site.wiki, 2).await;

    // Both requests go on: the wiki does the work once and answers the other from its record.
    site.wiki.release();
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    let state = site.wiki.state();
    assert_eq!(
        state["applied"],
        json!([format!("{run_id}:1:0")]),
        "{state}"
    );
    assert_eq!(state["pages"]["about"], json!(["We repair bicycles."]));
    let journal = site.journal(&run_id).await;
    assert_eq!(journal.len(), 1, "{journal:?}");
    assert_eq!((journal[0].0, journal[0].1), (1, 0));
    assert_eq!(
        journal[0].2,
        run_row(&mut site.conn, &run_id).await["lease_epoch"]
            .as_i64()
            .unwrap(),
        "journaled by the rescuing segment"
    );
    site.finish(vec![coordinator, rescuer]).await;
}

#[tokio::test]
async fn an_idempotent_remote_call_that_landed_before_its_worker_was_killed_is_answered_from_its_key_without_a_new_card(
) {
    let mut site = Site::new("remote_landed", json!({}), set_about(), ONE_PHASE).await;
    let (coordinator, mut doomed, run_id, digest) = site.suspended_with_doomed_worker().await;

    // The wiki writes the approved call and records its key; the answer never reaches the
    // worker, which dies first. A preview now would read the call's own write
    // (`"We repair bicycles." → …` where the approver saw `(new page) → …`).
    site.wiki.hold_answers();
    site.approve(&run_id, 1, &digest);
    wait_until("the wiki wrote the call", secs(60), async || {
        (site.wiki.held_answers() >= 1).then_some(())
    })
    .await;
    let key = format!("{run_id}:1:0");
    assert_eq!(site.wiki.state()["applied"], json!([key]));
    let row = run_row(&mut site.conn, &run_id).await;
    assert_eq!(
        (row["sent_seq"].clone(), row["sent_call"].clone()),
        (json!(1), json!(0)),
        "the call was stamped as sent before it went"
    );
    doomed.sigkill();
    site.wiki.release_answers();

    // The retry asks the wiki what became of the sent call's key instead of comparing its
    // preview: the wiki answers from its record, and the run completes on the card that was
    // approved.
    let rescuer = site.requeue_to_a_rescuer(&run_id).await;
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    let row = run_row(&mut site.conn, &run_id).await;
    assert_eq!(row["suspension_seq"], 1, "no new card: {row}");
    assert_eq!(
        row["sent_call"],
        Value::Null,
        "cleared with its journal row"
    );
    let state = site.wiki.state();
    assert_eq!(state["applied"], json!([key]), "written once: {state}");
    assert_eq!(state["pages"]["about"], json!(["We repair bicycles."]));
    let journal = site.journal(&run_id).await;
    assert_eq!(journal.len(), 1, "{journal:?}");
    let moved = count(
        &mut site.conn,
        &format!("SELECT count(*) FROM run_events WHERE run_id = '{run_id}'::uuid AND kind = 'run.preview_moved'"),
    )
    .await;
    assert_eq!(moved, 0);
    site.finish(vec![coordinator, rescuer]).await;
}

#[tokio::test]
async fn a_sent_call_whose_page_a_colleague_edited_before_it_landed_is_refused_at_the_wiki_and_the_run_re_suspends(
) {
    let mut site = Site::new("remote_moved_in_flight", json!({}), set_about(), ONE_PHASE).await;
    let (coordinator, mut doomed, run_id, digest) = site.suspended_with_doomed_worker().await;

    // The approved call is held at the wiki before it does anything; its worker dies, and a
    // colleague creates the page the approver was shown as new.
    site.wiki.hold_executes();
    site.approve(&run_id, 1, &digest);
    wait_for_held_executes(&site.wiki, 1).await;
    doomed.sigkill();
    site.wiki.put_page("about", "We sell bicycles.");

    // The held request goes on: the wiki compares the preview it was sent with its own, under
    // the lock of the write, refuses it and records the refusal under the key.
    site.wiki.release();
    let key = format!("{run_id}:1:0");
    let wiki = &site.wiki;
    wait_until("the wiki refused the call", secs(30), async || {
        (wiki.state()["keys"][&key]["moved"] == true).then_some(())
    })
    .await;

    // The retry asks the wiki what became of the key, learns that it moved, and the run waits
    // on card 2 with the call marked and the wiki's current preview; nothing was written.
    let rescuer = site.requeue_to_a_rescuer(&run_id).await;
    wait_for_card(&mut site.conn, &run_id, 2, secs(60)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(stale, json!([0]));
    assert_eq!(
        lines(&previews, 0)[1],
        "text: \"We sell bicycles.\" → \"We repair bicycles.\""
    );
    let state = site.wiki.state();
    assert_eq!(
        state["pages"]["about"],
        json!(["We sell bicycles."]),
        "{state}"
    );
    assert_eq!(state["applied"], json!([]), "{state}");
    assert_eq!(site.tool_writes(&run_id).await, 0);
    site.finish(vec![coordinator, rescuer]).await;
}

/// One append to `home`, on a wiki started with `wiki_args`.
async fn appending_site(tag: &str, wiki_args: &[&str]) -> Site {
    Site::new(
        tag,
        json!({ "home": ["Welcome."] }),
        json!([{ "name": "append_line", "arguments": { "page": "home", "line": "Closed on Sundays." } }]),
        wiki_args,
    )
    .await
}

#[tokio::test]
async fn a_non_idempotent_remote_call_in_flight_when_its_worker_is_killed_is_resolved_by_its_key_and_written_once(
) {
    let mut site = appending_site("remote_kill_nonidem", ONE_PHASE).await;
    let (coordinator, mut doomed, run_id, digest) = site.suspended_with_doomed_worker().await;

    site.wiki.hold_executes();
    site.approve(&run_id, 1, &digest);
    wait_for_held_executes(&site.wiki, 1).await;
    assert_eq!(
        run_row(&mut site.conn, &run_id).await["pending_effect"],
        "non_idempotent_write"
    );
    doomed.sigkill();

    // Whether the append landed is unknown to countersign, so the next worker asks the wiki
    // about its key before anything else: the wiki has not seen it yet (the dead worker's
    // request still waits there), so the call is sent again under the same key.
    let rescuer = site.requeue_to_a_rescuer(&run_id).await;
    wait_for_held_executes(&site.wiki, 2).await;

    // Both requests go on: the wiki does the work once and answers the other from its record.
    site.wiki.release();
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    let state = site.wiki.state();
    assert_eq!(
        state["applied"],
        json!([format!("{run_id}:1:0")]),
        "{state}"
    );
    assert_eq!(
        state["pages"]["home"],
        json!(["Welcome.", "Closed on Sundays."])
    );
    assert_eq!(site.journal(&run_id).await.len(), 1);
    assert_eq!(
        site.tool_writes(&run_id).await,
        1,
        "audited with its journal row"
    );
    site.finish(vec![coordinator, rescuer]).await;
}

#[tokio::test]
async fn a_non_idempotent_remote_call_in_doubt_on_a_server_that_cannot_say_fails_the_run_outcome_unknown(
) {
    let mut site = appending_site(
        "remote_kill_unknown",
        &["--protocol", "1", "--no-call-status"],
    )
    .await;
    let (coordinator, mut doomed, run_id, digest) = site.suspended_with_doomed_worker().await;

    site.wiki.hold_executes();
    site.approve(&run_id, 1, &digest);
    wait_for_held_executes(&site.wiki, 1).await;
    doomed.sigkill();

    // The next worker asks the wiki about the key; the wiki cannot say, so the append may have
    // landed and may not: the run fails `outcome_unknown`, naming the call, and nothing sends
    // the append again — nor tells the model it failed.
    let rescuer = site.requeue_to_a_rescuer(&run_id).await;
    wait_for_status(&mut site.conn, &run_id, "failed", secs(60)).await;
    let row = run_row(&mut site.conn, &run_id).await;
    assert_eq!(
        (
            row["termination_reason"].as_str(),
            row["error_code"].as_str()
        ),
        (Some("outcome_unknown"), Some("outcome_unknown")),
        "{row}"
    );
    assert_eq!(
        (row["sent_seq"].clone(), row["sent_call"].clone()),
        (json!(1), json!(0)),
        "the call in doubt stays named"
    );
    let shown = site.install.countersign(&["show", &run_id]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("sent and not journaled: call 0 (append_line) of card 1")
            && shown.contains("it may have landed"),
        "{shown}"
    );

    // The dead worker's request still lands, once, under its key.
    site.wiki.release();
    let wiki = &site.wiki;
    let state = wait_until("the held append lands", secs(30), async || {
        let state = wiki.state();
        (state["applied"] == json!([format!("{run_id}:1:0")])).then_some(state)
    })
    .await;
    assert_eq!(
        state["pages"]["home"],
        json!(["Welcome.", "Closed on Sundays."])
    );
    assert_eq!(site.wiki.held_executes(), 1, "no second execute was sent");
    assert!(
        site.journal(&run_id).await.is_empty(),
        "no result was made up"
    );
    site.finish(vec![coordinator, rescuer]).await;
}

#[tokio::test]
async fn a_two_phase_turn_whose_second_write_moved_at_the_wiki_writes_nothing_at_all_and_re_suspends(
) {
    let mut site = Site::new(
        "two_phase_moved",
        json!({ "home": ["Welcome."] }),
        json!([
            { "name": "set_page", "arguments": { "page": "about", "text": "We repair bicycles." } },
            { "name": "append_line", "arguments": { "page": "home", "line": "Closed on Sundays." } }
        ]),
        &[],
    )
    .await;
    let services = vec![
        site.spawn("countersign-coordinator", &[]),
        site.spawn("countersign-worker", &[]),
    ];
    let run_id = site.submit();
    wait_for_card(&mut site.conn, &run_id, 1, secs(60)).await;
    let digest = site.digest(&run_id).await;

    // Both previews compared equal; the first prepare is held at the wiki, and a colleague adds
    // a line to home before the second prepare compares it.
    site.wiki.hold_prepares();
    site.approve(&run_id, 1, &digest);
    let wiki = &site.wiki;
    wait_until("the first prepare is held", secs(60), async || {
        (wiki.held_prepares() >= 1).then_some(())
    })
    .await;
    site.wiki.put_page("home", "Welcome.\nNew: e-bike rentals.");
    site.wiki.release_prepares();

    // The second prepare finds its preview moved: the first change, held and never visible, is
    // aborted, and the run waits on card 2 with nothing written anywhere.
    wait_for_card(&mut site.conn, &run_id, 2, secs(60)).await;
    let (_, stale) = site.card(&run_id).await;
    assert_eq!(stale, json!([1]));
    assert!(site.landed(&run_id).await.is_empty(), "nothing landed");
    let state = site.wiki.state();
    assert!(state["pages"].get("about").is_none(), "{state}");
    assert_eq!(
        state["held"],
        json!({}),
        "the held change was aborted: {state}"
    );
    assert!(
        state["applied"].as_array().is_none_or(Vec::is_empty),
        "{state}"
    );
    assert_eq!(site.tool_writes(&run_id).await, 0);

    // Approved again, both land, each once.
    site.approve(&run_id, 2, &digest);
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    let state = site.wiki.state();
    assert_eq!(
        state["applied"],
        json!([format!("{run_id}:2:0"), format!("{run_id}:2:1")]),
        "{state}"
    );
    assert_eq!(
        state["pages"]["home"],
        json!(["Welcome.", "New: e-bike rentals.", "Closed on Sundays."])
    );
    assert_eq!(site.tool_writes(&run_id).await, 2);
    site.finish(services).await;
}

/// A local write (page 12's description) and the wiki's writes in one turn.
fn mixed(wiki_calls: Value) -> Value {
    let mut calls = vec![json!({ "name": "update_page_metadata",
                                 "arguments": { "uid": 12, "description": "Bicycles for every road." } })];
    calls.extend(wiki_calls.as_array().unwrap().iter().cloned());
    Value::Array(calls)
}

fn append_home() -> Value {
    json!([{ "name": "append_line", "arguments": { "page": "home", "line": "Closed on Sundays." } }])
}

#[tokio::test]
async fn a_mixed_turn_with_nothing_moved_writes_the_local_and_the_remote_call_once_and_audits_both()
{
    let mut site = Site::new(
        "mixed_clean",
        json!({ "home": ["Welcome."] }),
        mixed(append_home()),
        &[],
    )
    .await;
    let services = vec![
        site.spawn("countersign-coordinator", &[]),
        site.spawn("countersign-worker", &[]),
    ];
    let run_id = site.submit();
    wait_for_card(&mut site.conn, &run_id, 1, secs(60)).await;
    let digest = site.digest(&run_id).await;

    site.approve(&run_id, 1, &digest);
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    assert_eq!(site.description().await, "Bicycles for every road.");
    let state = site.wiki.state();
    assert_eq!(
        state["applied"],
        json!([format!("{run_id}:1:1")]),
        "{state}"
    );
    assert_eq!(
        state["pages"]["home"],
        json!(["Welcome.", "Closed on Sundays."])
    );
    let journal: Vec<(i32, i32)> = site
        .journal(&run_id)
        .await
        .into_iter()
        .map(|(s, i, _)| (s, i))
        .collect();
    assert_eq!(journal, vec![(1, 0), (1, 1)]);
    assert_eq!(
        site.tool_writes(&run_id).await,
        2,
        "the remote write is audited too"
    );
    site.finish(services).await;
}

#[tokio::test]
async fn a_mixed_turn_whose_local_preview_moved_after_the_approval_writes_nothing_anywhere_and_re_suspends(
) {
    let mut site = Site::new(
        "mixed_local_moved",
        json!({ "home": ["Welcome."] }),
        mixed(append_home()),
        &[],
    )
    .await;
    let services = vec![
        site.spawn("countersign-coordinator", &[]),
        site.spawn("countersign-worker", &[]),
    ];
    let run_id = site.submit();
    wait_for_card(&mut site.conn, &run_id, 1, secs(60)).await;
    let digest = site.digest(&run_id).await;

    // A colleague rewrites the description in plain SQL after the approver saw it.
    site.colleague_sql(
        "UPDATE content.pages SET description = 'A colleague''s words.' WHERE uid = 12",
    )
    .await;
    site.approve(&run_id, 1, &digest);
    wait_for_card(&mut site.conn, &run_id, 2, secs(60)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(stale, json!([0]));
    assert!(
        lines(&previews, 0)[1].starts_with("description: \"A colleague's words.\" →"),
        "{previews:?}"
    );
    assert_eq!(site.description().await, "A colleague's words.");
    // The wiki's write was prepared before the store's rows were locked (no lock of the store
    // waits on a tool server), and aborted when the local preview was found moved: nothing was
    // applied, recorded or left held.
    let state = site.wiki.state();
    let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(|o| o.is_empty());
    assert!(
        state["applied"].as_array().is_none_or(Vec::is_empty)
            && empty(&state["keys"])
            && empty(&state["held"]),
        "nothing written at the wiki: {state}"
    );
    assert!(site.journal(&run_id).await.is_empty());
    assert_eq!(site.tool_writes(&run_id).await, 0);

    // The approval of card 2 writes both, once.
    site.approve(&run_id, 2, &digest);
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    assert_eq!(site.description().await, "Bicycles for every road.");
    assert_eq!(
        site.wiki.state()["applied"],
        json!([format!("{run_id}:2:1")])
    );
    assert_eq!(site.tool_writes(&run_id).await, 2);
    site.finish(services).await;
}

#[tokio::test]
async fn a_mixed_turn_whose_wiki_finds_a_preview_moved_at_the_write_rolls_the_local_write_back_and_re_suspends(
) {
    let mut site = Site::new(
        "mixed_remote_moved",
        json!({ "home": ["Welcome."] }),
        mixed(json!([
            { "name": "set_page", "arguments": { "page": "about", "text": "We repair bicycles." } },
            { "name": "append_line", "arguments": { "page": "home", "line": "Closed on Sundays." } }
        ])),
        ONE_PHASE,
    )
    .await;
    let services = vec![
        site.spawn("countersign-coordinator", &[]),
        site.spawn("countersign-worker", &[]),
    ];
    let run_id = site.submit();
    wait_for_card(&mut site.conn, &run_id, 1, secs(60)).await;
    let digest = site.digest(&run_id).await;

    // Every call compared equal; the local write is applied and waits for the commit while the
    // wiki's first write is held at the wiki. Meanwhile a colleague adds a line to home.
    site.wiki.hold_executes();
    site.approve(&run_id, 1, &digest);
    wait_for_held_executes(&site.wiki, 1).await;
    site.wiki.put_page("home", "Welcome.\nNew: e-bike rentals.");
    site.wiki.release();

    // `set_page` lands; `append_line` is refused at the wiki as moved: the local write rolls
    // back, and the run waits on card 2 with the append marked and `set_page` shown as done.
    wait_for_card(&mut site.conn, &run_id, 2, secs(60)).await;
    let (previews, stale) = site.card(&run_id).await;
    assert_eq!(stale, json!([2]));
    assert_eq!(
        lines(&previews, 2)[1],
        "lines: 2 line(s) → 3, appended last: \"Closed on Sundays.\""
    );
    assert_eq!(site.landed(&run_id).await, vec![1]);
    assert_ne!(
        site.description().await,
        "Bicycles for every road.",
        "rolled back"
    );
    let state = site.wiki.state();
    assert_eq!(
        state["applied"],
        json!([format!("{run_id}:1:1")]),
        "{state}"
    );
    assert_eq!(
        site.tool_writes(&run_id).await,
        1,
        "the write that landed is audited"
    );

    // Approving card 2 writes the local call and the append; `set_page` is not sent again.
    site.approve(&run_id, 2, &digest);
    wait_for_status(&mut site.conn, &run_id, "completed", secs(60)).await;
    assert_eq!(site.description().await, "Bicycles for every road.");
    let state = site.wiki.state();
    assert_eq!(
        state["applied"],
        json!([format!("{run_id}:1:1"), format!("{run_id}:2:2")]),
        "{state}"
    );
    assert_eq!(
        state["pages"]["home"],
        json!(["Welcome.", "New: e-bike rentals.", "Closed on Sundays."])
    );
    assert_eq!(site.tool_writes(&run_id).await, 3);
    site.finish(services).await;
}

/// A tool server whose previews are unfit to be countersigned: `stamp_page` puts the time in
/// its preview, `long_page` answers 25 lines. It speaks just enough of the protocol for that.
const UNFIT_SERVER: &str = r#"
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def tool(name):
    return {"name": name, "description": "", "parameters": {"type": "object"}, "group": "editing",
            "effect": "idempotent_write", "enabled_by_default": False, "requires_admin": False,
            "previews": True}

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({"protocol": 1, "tools": [tool("stamp_page"), tool("long_page")]})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.endswith("/may-view"):
            return self.reply({"allowed": False})
        if self.path == "/tools/stamp_page/preview":
            return self.reply({"lines": ['page "home"', "checked at %d" % time.time_ns()]})
        self.reply({"lines": ["line %d" % i for i in range(25)]})

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print("listening on http://127.0.0.1:%d" % server.server_address[1], flush=True)
server.serve_forever()
"#;

/// `countersign ARGS` with `env`: (exit status, stdout, stderr).
fn countersign_with(
    install: &Installation,
    env: &[(&str, String)],
    args: &[&str],
) -> (bool, String, String) {
    let out = install
        .command("countersign")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env_remove("COUNTERSIGN_TOOL_SERVERS_CA_FILE")
        .args(args)
        .output()
        .expect("countersign starts");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn tools_check_passes_the_wikis_previews_and_fails_one_that_moves_by_itself_or_runs_past_the_bounds(
) {
    let dir = TempDir::new();
    let wiki = WikiServer::start(&dir, &json!({ "home": ["Welcome."] }), &[]);
    let mut child = Command::new("python3")
        .args(["-c", UNFIT_SERVER])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the unfit server");
    let stdout = child.stdout.take().unwrap();
    let mut unfit = Process::from(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let unfit_url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let db = Database::create("tools_check").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.countersign_ok(&["migrate", "--with-content"]);
    install.countersign_ok(&["seed-demo-site"]);

    // The unfit server goes into a servers file, as an operator adds one; the wiki stays in
    // COUNTERSIGN_TOOL_SERVERS.
    let file = dir.0.join("tool-servers");
    let file_arg = file.to_str().unwrap();
    let (ok, out, _) = countersign_with(
        &install,
        &[],
        &[
            "tools",
            "add",
            "unfit",
            &unfit_url,
            "trust_declarations",
            "--tool-servers-file",
            file_arg,
        ],
    );
    assert!(ok && out.contains("added to"), "{out}");
    for (name, url, code) in [
        ("unfit", unfit_url.as_str(), "duplicate_server"),
        ("other", "ftp://127.0.0.1:1", "invalid_url"),
        ("other", "https://user:pw@127.0.0.1:1", "invalid_url"),
    ] {
        let (ok, _, err) = countersign_with(
            &install,
            &[],
            &["tools", "add", name, url, "--tool-servers-file", file_arg],
        );
        assert!(!ok && err.contains(code), "{name} {url}: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("unfit {unfit_url} trust_declarations\n"),
        "only the first entry was written"
    );
    let env = vec![
        ("COUNTERSIGN_TOOL_SERVERS", trusted_wiki(&wiki.url)),
        ("COUNTERSIGN_TOOL_SECRET_WIKI", SECRET.to_owned()),
        ("COUNTERSIGN_TOOL_SERVERS_FILE", file_arg.to_owned()),
        ("COUNTERSIGN_TOOL_SECRET_UNFIT", "unused".to_owned()),
    ];

    // Every tool, with where it comes from.
    let (ok, out, err) = countersign_with(&install, &env, &["tools", "list"]);
    assert!(ok, "{err}");
    for expected in [
        "set_page\tserver wiki\tidempotent_write\tediting\teditor_content\tdisabled\tpreviews\teffect decided by the server (trusted)",
        "read_page\tserver wiki\tread_only\tcontent\teditor_content\tenabled\tno preview\teffect decided by the server (trusted)",
        "stamp_page\tserver unfit\tidempotent_write\tediting\tsecret_adjacent\tdisabled\tpreviews\teffect decided by the server (trusted)",
        "update_page_metadata\tbuilt-in\tidempotent_write\tediting\teditor_content\tdisabled\tpreviews\tbuilt in",
    ] {
        assert!(out.lines().any(|l| l == expected), "{expected} in\n{out}");
    }

    // The wiki's relative writer: the same twice, within the bounds, and the editor may see it.
    let (ok, out, err) = countersign_with(
        &install,
        &env,
        &[
            "tools",
            "check",
            "append_line",
            "--args",
            r#"{"page": "home", "line": "Closed on Sundays."}"#,
            "--as",
            "editor",
        ],
    );
    assert!(ok, "{out}\n{err}");
    for expected in [
        "tool append_line · server wiki · non_idempotent_write · group editing · effect decided by the server (trusted)",
        "   2  lines: 1 line(s) → 2, appended last: \"Closed on Sundays.\"",
        "preview 2: the same, line for line",
        "may-view for editor: allowed — a card shows editor this preview",
    ] {
        assert!(out.lines().any(|l| l == expected), "{expected} in\n{out}");
    }
    assert_eq!(
        wiki.state(),
        json!({ "pages": { "home": ["Welcome."] } }),
        "a check executes nothing"
    );

    // A built-in writer, each preview on a connection of its own.
    let (ok, out, err) = countersign_with(
        &install,
        &env,
        &[
            "tools",
            "check",
            "update_page_metadata",
            "--args",
            r#"{"uid": 12, "description": "Bicycle repairs"}"#,
            "--as",
            "editor",
        ],
    );
    assert!(ok && out.contains("preview 2: the same"), "{out}\n{err}");

    // A preview with the time in it differs line by line, and the check fails.
    let (ok, out, err) = countersign_with(
        &install,
        &env,
        &[
            "tools",
            "check",
            "stamp_page",
            "--args",
            "{}",
            "--as",
            "editor",
        ],
    );
    assert!(!ok, "{out}");
    assert!(err.contains("the two previews differ"), "{err}");
    let diff: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("the previews differ"))
        .skip(1)
        .take(3)
        .collect();
    assert!(
        diff.len() == 3
            && diff[0].starts_with("  -  2  checked at ")
            && diff[1].starts_with("  +  2  checked at ")
            && diff[2].starts_with("bounds of preview 1:"),
        "only line 2 differs: {out}"
    );
    assert!(out.contains("may-view for editor: withheld"), "{out}");

    // 25 lines: deterministic, but past the bounds.
    let (ok, out, err) = countersign_with(
        &install,
        &env,
        &[
            "tools",
            "check",
            "long_page",
            "--args",
            "{}",
            "--as",
            "editor",
        ],
    );
    assert!(!ok, "{out}");
    assert!(out.contains("preview 2: the same, line for line"), "{out}");
    assert!(
        err.contains("exceeds the bounds (25 lines, over 20"),
        "{err}"
    );

    // An unknown user is refused before anything is previewed.
    let (ok, _, err) = countersign_with(
        &install,
        &env,
        &[
            "tools", "check", "set_page", "--args", "{}", "--as", "nobody",
        ],
    );
    assert!(!ok && err.contains("no user nobody"), "{err}");

    unfit.sigkill();
    drop(wiki);
    db.remove().await.unwrap();
}

#[tokio::test]
async fn a_deployment_without_the_content_store_runs_on_remote_tools_and_its_own_user_directory() {
    let dir = TempDir::new();
    let wiki = WikiServer::start(&dir, &json!({ "home": ["Welcome."] }), &[]);
    let script = dir.json(
        "script.json",
        &json!({ "turns": [
            { "content": "I will edit the wiki.", "tool_calls": [
                { "name": "append_line", "arguments": { "page": "home", "line": "Open on Sundays." } }
            ] },
            { "content": "Done." } ] }),
    );
    let agent = dir.json(
        "agent.json",
        &json!({
            "name": "wiki-assistant",
            "model": { "provider": "scripted", "script": script },
            "policy": { "allowed_groups": ["content", "editing"],
                        "enabled_tools": ["append_line"] },
            "max_iterations": 4,
            "four_eyes": true,
            "approval_deadline_secs": 3600
        }),
    );
    let db = Database::create("no_content_store").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };

    // The engine's migrations only: no `content` schema.
    install.countersign_ok(&["migrate"]);
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();
    let schemas = "SELECT count(*) FROM pg_namespace WHERE nspname = 'content'";
    assert_eq!(count(&mut conn, schemas).await, 0);

    // A service left with the content store on refuses to start, and says what to do.
    let wiki_env = [
        ("COUNTERSIGN_TOOL_SERVERS", trusted_wiki(&wiki.url)),
        ("COUNTERSIGN_TOOL_SECRET_WIKI", SECRET.to_owned()),
    ];
    let out = install
        .command("countersign-worker")
        .envs(wiki_env.iter().map(|(k, v)| (*k, v.as_str())))
        .env_remove("COUNTERSIGN_CONTENT_STORE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("countersign migrate --with-content")
            && stderr.contains("COUNTERSIGN_CONTENT_STORE=off"),
        "{stderr}"
    );

    // There is no demo site to seed.
    let out = install.countersign(&["seed-demo-site"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("migrate --with-content"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The operator keeps the users in the table directory instead.
    for args in [
        &["users", "add", "editor"][..],
        &["users", "add", "reviewer"],
        &["users", "grant", "reviewer", "wiki-assistant"],
        &["users", "add", "bystander"],
        &["users", "grant", "bystander", "another-agent"],
        &["agents", "put", &agent],
        &["producers", "allow", "guest", "acting-user", "*"],
        &["producers", "allow", "guest", "approver", "*"],
    ] {
        install.countersign_ok(args);
    }
    assert_eq!(
        install.countersign_ok(&["users", "list"]),
        "bystander\tuser\tanother-agent\neditor\tuser\t-\nreviewer\tuser\twiki-assistant\n"
    );
    let mut env = wiki_env.to_vec();
    env.push(("COUNTERSIGN_CONTENT_STORE", "off".to_owned()));
    let (ok, tools, err) = countersign_with(&install, &env, &["tools", "list"]);
    assert!(ok, "{err}");
    assert!(
        tools.contains("append_line") && tools.contains("set_page"),
        "{tools}"
    );
    assert!(
        !tools.contains("update_page_metadata"),
        "no content store tool: {tools}"
    );

    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let services = vec![
        install.spawn_env("countersign-coordinator", &[], &env_ref),
        install.spawn_env("countersign-worker", &[], &env_ref),
    ];

    // A name the directory does not know may not be a run's acting user.
    let out = install.countersign(&[
        "submit",
        "--agent",
        "wiki-assistant",
        "--as",
        "mallory",
        "Hi.",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown_acting_user"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run_id = install.submit("wiki-assistant", "editor", "Tell visitors about Sundays.");
    wait_for_card(&mut conn, &run_id, 1, secs(60)).await;
    let digest = run_row(&mut conn, &run_id).await["turn_digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let decide = |approver: &str| install.approve_card(&run_id, 1, &digest, approver);
    // The bystander's grant names another agent; the editor may not release their own run's
    // writes under four-eyes. Both leave the run waiting.
    for (approver, code) in [
        ("bystander", "access_denied"),
        ("editor", "self_approval_denied"),
    ] {
        let out = decide(approver);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(code),
            "{approver}: {stderr}"
        );
    }
    assert_eq!(
        run_row(&mut conn, &run_id).await["status"],
        "waiting_for_approval"
    );
    assert_eq!(wiki.state()["pages"]["home"], json!(["Welcome."]));

    // The reviewer's grant names this agent: the write lands, once.
    let out = decide("reviewer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for_status(&mut conn, &run_id, "completed", secs(60)).await;
    assert_eq!(
        wiki.state()["pages"]["home"],
        json!(["Welcome.", "Open on Sundays."])
    );
    assert_eq!(
        count(&mut conn, schemas).await,
        0,
        "still no content schema"
    );

    drop(services);
    drop(conn);
    drop(wiki);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
