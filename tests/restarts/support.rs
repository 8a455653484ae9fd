//! The installation every scenario of this target starts: its own database and queue prefix, the
//! demo site with fault pages, a fake model endpoint, and the checks each scenario ends with.

use countersign_e2e::{
    approve_through_queue, count, fault_page_model, fault_page_prompt, messages_with_role,
    model_settings, referenced_files, run_row, seed_fault_pages, turn_digest, Database,
    Installation, ModelStub, Process, TempDir, MODEL_KEY_ENV,
};
pub use countersign_e2e::{fault_page, TURN_FENCE, TURN_GATE_WHEN};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// These tests restart the services every test of this binary talks to (and kill the
/// coordinators): one at a time.
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held for the whole of a test: no other test of this binary runs meanwhile.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    EXCLUSIVE.lock().await
}

/// Gate of the turn transaction of a resume (see [`TURN_GATE_WHEN`]).
pub const TURN_GATE: i64 = 4252;

/// One installation under test. Its services are killed when it drops; [`Site::finish`] also
/// removes its database and queues.
#[derive(Debug)]
pub struct Site {
    pub db: Database,
    pub install: Installation,
    pub conn: PgConnection,
    pub model: ModelStub,
    pub services: Vec<Process>,
    _dir: TempDir,
}

impl Site {
    /// Creates the installation with `pages` fault pages and the agent `seo-assistant` (the two
    /// writers enabled, four eyes) on the fake model.
    pub async fn new(tag: &str, pages: i64) -> Site {
        let model = ModelStub::responding(fault_page_model);
        let db = Database::create(tag).await;
        let install = Installation {
            database_url: db.url(),
            queue_prefix: format!("e2e-restarts-{}", Uuid::now_v7()),
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

    /// A new connection of the test (after PostgreSQL restarted, the old one is dead).
    pub async fn reconnect(&mut self) {
        self.conn = PgConnection::connect(&self.db.url()).await.unwrap();
    }

    /// A coordinator the test keeps its hands on.
    pub fn coordinator(&self) -> Process {
        self.install.spawn("countersign-coordinator", &[])
    }

    pub fn start_coordinator(&mut self) {
        let coordinator = self.coordinator();
        self.services.push(coordinator);
    }

    /// A worker the test keeps its hands on.
    pub fn worker(&self, args: &[&str]) -> Process {
        self.install
            .spawn_env("countersign-worker", args, &[(MODEL_KEY_ENV, "fake-key")])
    }

    pub fn start_worker(&mut self, args: &[&str]) {
        let worker = self.worker(args);
        self.services.push(worker);
    }

    /// `countersign submit` of the fault page's prompt: the run id.
    pub fn submit(&self, page: i64) -> String {
        self.install
            .submit("seo-assistant", "editor", &fault_page_prompt(page))
    }

    pub async fn digest(&mut self, run_id: &str) -> String {
        turn_digest(&mut self.conn, run_id).await
    }

    /// Approves card `seq` through the queue as `admin` and waits until it is recorded.
    pub async fn approve_through_queue(&mut self, run_id: &str, seq: i32, digest: &str) {
        approve_through_queue(&self.install, &mut self.conn, run_id, seq, digest).await;
    }

    /// Approves card 1 with `countersign decide` (which waits for the coordinator's reply).
    pub async fn decide(&mut self, run_id: &str) {
        let digest = self.digest(run_id).await;
        let out = self.install.approve_card(run_id, 1, &digest, "admin");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("decision accepted"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub async fn finish(mut self) {
        self.services.clear();
        drop(self.conn);
        countersign_e2e::delete_topology(&self.install.queue_prefix).await;
        self.db.remove().await.unwrap();
    }
}

/// What must hold of a fault page's run once it completed: the approved turn (suspension 1,
/// both calls) is in the content store once, journaled once by one lease epoch, audited by one
/// `tool_write` event per call (none an error), released by one accepted decision, and the
/// model was told the calls' results — never an infrastructure failure. Returns the epoch that
/// wrote the turn. `scenario` names the scenario in every failure message.
pub async fn assert_turn_written_once(
    scenario: &str,
    conn: &mut PgConnection,
    model: &ModelStub,
    run_id: &str,
    page: i64,
) -> i64 {
    let row = run_row(conn, run_id).await;
    assert_eq!(
        (&row["status"], &row["termination_reason"]),
        (&json!("completed"), &json!("completed")),
        "{scenario}: run {run_id} completed: {row}"
    );

    // The content store: the description once, the reference once (lost 0, duplicated 0).
    let description: String =
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = $1")
            .bind(page)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(
        description,
        format!("Fault page {page}, rewritten."),
        "{scenario}: page {page}'s approved description landed"
    );
    assert_eq!(
        referenced_files(conn, page + 100, "image").await,
        ["hero.jpg"],
        "{scenario}: page {page}'s teaser holds the approved reference exactly once"
    );

    // The journal: one row per call of the approved turn, one segment's.
    let journal: Vec<(i32, i32, i64)> = sqlx::query_as(
        "SELECT suspension_seq, call_index, lease_epoch FROM run_journal
         WHERE run_id = $1::uuid ORDER BY suspension_seq, call_index",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let keys: Vec<(i32, i32)> = journal.iter().map(|(s, i, _)| (*s, *i)).collect();
    assert_eq!(
        keys,
        [(1, 0), (1, 1)],
        "{scenario}: run {run_id}: the journal holds the approved turn once"
    );
    let epoch = journal[0].2;
    assert!(
        journal.iter().all(|(_, _, e)| *e == epoch),
        "{scenario}: run {run_id}: the turn was journaled by one segment: {journal:?}"
    );

    // The audit trail: one successful tool_write per call, by that segment.
    let writes: Vec<Value> = sqlx::query_scalar(
        "SELECT payload FROM run_events WHERE run_id = $1::uuid AND kind = 'tool_write'
         ORDER BY sequence",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        writes.len(),
        2,
        "{scenario}: run {run_id}: one tool_write event per write call: {writes:?}"
    );
    for (index, write) in writes.iter().enumerate() {
        assert_eq!(
            (
                &write["call_index"],
                &write["suspension_seq"],
                &write["lease_epoch"],
                &write["is_error"]
            ),
            (&json!(index), &json!(1), &json!(epoch), &json!(false)),
            "{scenario}: run {run_id}: the write of call {index}: {write}"
        );
    }

    let accepted = count(
        conn,
        &format!(
            "SELECT count(*) FROM run_decisions WHERE run_id = '{run_id}'::uuid
             AND suspension_seq = 1 AND outcome = 'accepted' AND approved"
        ),
    )
    .await;
    assert_eq!(accepted, 1, "{scenario}: run {run_id}: approved once");

    // What the model was told the calls did: their results, never an infrastructure failure.
    let prompt = fault_page_prompt(page);
    let told: Vec<Vec<String>> = model
        .bodies()
        .iter()
        .filter(|r| messages_with_role(r, "user").first() == Some(&prompt))
        .map(|r| messages_with_role(r, "tool"))
        .filter(|results| !results.is_empty())
        .collect();
    assert!(
        !told.is_empty(),
        "{scenario}: page {page}: the model never heard of its turn"
    );
    for results in &told {
        assert_eq!(results.len(), 2, "{scenario}: {results:?}");
        assert!(
            results[0].starts_with(&format!("Page [{page}] updated"))
                && results[1].starts_with("Attached file [7]"),
            "{scenario}: page {page}: the model was told the writes landed: {results:?}"
        );
        assert!(
            results.iter().all(|r| !r.contains("failed (")),
            "{scenario}: an infrastructure error became a tool result: {results:?}"
        );
    }
    epoch
}
