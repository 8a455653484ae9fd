//! One installation under test as most end-to-end tests set it up: a database and a queue
//! prefix of its own, an agent, the services started for it, and a connection to look with.

use serde_json::Value;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::{free_port, turn_digest, Database, Installation, Process, TempDir, MODEL_KEY_ENV};

/// A database, a queue prefix, a folder for the site's files, and the services started for it;
/// [`Site::finish`] stops the services and removes the rest.
#[derive(Debug)]
pub struct Site {
    pub db: Database,
    pub install: Installation,
    pub conn: PgConnection,
    pub dir: TempDir,
    /// The coordinator's HTTP port (`/metrics`, `/ready`) once [`Site::start_services`] ran.
    pub coordinator_port: Option<u16>,
    services: Vec<Process>,
}

impl Site {
    /// A new database named for `tag` (not migrated yet) and a queue prefix of its own; nothing
    /// runs.
    pub async fn create(tag: &str) -> Site {
        let db = Database::create(tag).await;
        let install = Installation {
            database_url: db.url(),
            queue_prefix: format!("e2e-{}", Uuid::now_v7()),
        };
        let conn = PgConnection::connect(&db.url()).await.unwrap();
        Site {
            db,
            install,
            conn,
            dir: TempDir::new(),
            coordinator_port: None,
            services: Vec::new(),
        }
    }

    /// Sets the installation up with `agent` as an operator does ([`Installation::configure`]).
    pub fn configure(&self, agent: &Value) {
        self.install.configure(&self.dir.json("agent.json", agent));
    }

    /// Starts `binary` with `args` and `env`; it stops when the site finishes.
    pub fn start(&mut self, binary: &str, args: &[&str], env: &[(&str, &str)]) {
        self.services
            .push(self.install.spawn_env(binary, args, env));
    }

    /// Starts a coordinator with `coordinator_args` (its HTTP port in `coordinator_port`) and a
    /// worker polling every second with the model stub's key.
    pub fn start_services(&mut self, coordinator_args: &[&str]) {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        self.start(
            "countersign-coordinator",
            coordinator_args,
            &[("COUNTERSIGN_HTTP_ADDR", &addr)],
        );
        self.coordinator_port = Some(port);
        self.start(
            "countersign-worker",
            &["--poll-interval-secs", "1"],
            &[(MODEL_KEY_ENV, "fake-key")],
        );
    }

    /// Starts `countersign-api` with `env`, and waits until it answers; its port.
    pub async fn start_api(&mut self, env: &[(&str, &str)]) -> u16 {
        let port = free_port();
        let ready = free_port();
        self.start(
            "countersign-api",
            &[
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--http-addr",
                &format!("127.0.0.1:{ready}"),
            ],
            env,
        );
        let answered = crate::wait_until("the API answers", crate::secs(90), async || {
            crate::http_get(port, "/inbox/sign-in").map(|_| true)
        })
        .await;
        assert!(answered, "countersign-api answers");
        port
    }

    /// A bearer token for `user` (`countersign tokens create`).
    pub fn token(&self, user: &str) -> String {
        self.install
            .countersign_ok(&["tokens", "create", "--for", user, "--label", "e2e"])
            .trim()
            .to_owned()
    }

    /// `countersign decide RUN --seq SEQ --digest (the current one) --as APPROVER ARGS`: whether
    /// it succeeded, and what it printed.
    pub async fn decide(
        &mut self,
        run: &str,
        seq: i32,
        approver: &str,
        args: &[&str],
    ) -> (bool, String) {
        let digest = turn_digest(&mut self.conn, run).await;
        let seq = seq.to_string();
        let mut argv = vec![
            "decide", run, "--seq", &seq, "--digest", &digest, "--as", approver,
        ];
        argv.extend_from_slice(args);
        let out = self.install.countersign(&argv);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// The outcomes recorded for the run's decisions on card `seq`, oldest first.
    pub async fn outcomes(&mut self, run: &str, seq: i32) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT outcome FROM run_decisions WHERE run_id = $1::uuid AND suspension_seq = $2
             ORDER BY created_at, decision_id",
        )
        .bind(run)
        .bind(seq)
        .fetch_all(&mut self.conn)
        .await
        .unwrap()
    }

    /// The run's decisions, oldest first: (card, approver, outcome).
    pub async fn decisions(&mut self, run: &str) -> Vec<(i32, String, String)> {
        sqlx::query_as(
            "SELECT suspension_seq, approver, outcome FROM run_decisions
             WHERE run_id = $1::uuid ORDER BY created_at, decision_id",
        )
        .bind(run)
        .fetch_all(&mut self.conn)
        .await
        .unwrap()
    }

    /// The description of the demo site's page `uid`.
    pub async fn description(&mut self, uid: i64) -> String {
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = $1")
            .bind(uid)
            .fetch_one(&mut self.conn)
            .await
            .unwrap()
    }

    /// Stops the services, then removes the queues, the database and the folder.
    pub async fn finish(self) {
        drop(self.services);
        drop(self.conn);
        crate::delete_topology(&self.install.queue_prefix).await;
        self.db.remove().await.unwrap();
        drop(self.dir);
    }
}
