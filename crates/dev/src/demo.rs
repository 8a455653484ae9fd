//! `countersign-dev demo`: one run through the real services, start to finish, narrated and checked.
//!
//! The demo starts what an installation runs — `countersign-coordinator`, two
//! `countersign-worker`s and `countersign-reaper --every 1` — as separate processes over
//! RabbitMQ, against a throwaway database and queue prefix, and plays the operator and the
//! approvers with the `countersign` commands README documents: `submit` sends the run request
//! through the queue like any producer, `inbox --save` shows a card and keeps it, `decide --card`
//! sends the decision on exactly that card. Only the model is a stand-in: the deterministic
//! scripted one for the story, and the test kit's OpenAI-compatible stub for the worker that
//! dies holding a lease.
//!
//! Every step is checked in the database (the run row, its decisions, its audit events, the
//! content store) before the next one is told, and the demo fails loudly at the first step that
//! did not behave as narrated: `make demo` exiting 0 means the story happened.
//!
//! There is no in-process mode. It would tell the same story with fewer moving parts — which is
//! what the demo must not do, since the point is that the services, the queues and the crash
//! recovery are real — and a second copy of the story would drift from this one.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use countersign_core::RunId;
use countersign_crypto::{KeyId, Keyring};
use countersign_queue::Broker;
use countersign_store::{RunRecord, RunStatus, Store};
use countersign_testkit::{
    binary, free_port, process_runs, wait_until, Database, ModelStub, Process, Reply,
};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use crate::connect_broker;

const AGENT: &str = "seo-assistant";
const ACTING_USER: &str = "editor";
const APPROVER: &str = "admin";
/// A second approver, without rights on page 12: their card withholds the previews.
const SECOND_APPROVER: &str = "approver";
const PROMPT: &str = "Tighten the description of page 12 and add bicycle.png to its teaser.";
const SCRIPT: &str = include_str!("../../cli/demo/seo-assistant.json");

/// The agent whose model call hangs while a worker is killed.
const SUMMARISER: &str = "page-summariser";
const SUMMARY_PROMPT: &str = "Summarise page 12 for the newsletter.";
const SUMMARY: &str = "Page 12: bicycles for every road — repairs, rentals and advice.";
/// The variable the summariser's model settings name for their (stand-in) API key.
const MODEL_KEY_ENV: &str = "COUNTERSIGN_DEMO_MODEL_KEY";

const COORDINATOR: &str = "countersign-coordinator";
const WORKER: &str = "countersign-worker";
const REAPER: &str = "countersign-reaper";
const API: &str = "countersign-api";
/// Short, so that a dead worker's lease runs out within the demo; renewed every second.
const LEASE_TTL_SECS: &str = "3";
/// How long any one step may take before the demo calls it broken.
const STEP: Duration = Duration::from_secs(30);

const TEASER_IMAGES: &str = "SELECT count(*) FROM content.file_references
                             WHERE element = 5 AND field = 'image' AND NOT deleted";

pub async fn run(
    database_url: &str,
    amqp_addr: &str,
    queue_prefix: &str,
    database: &str,
    keep: bool,
) -> anyhow::Result<()> {
    ensure!(
        !database.is_empty()
            && database
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "the demo database name may hold only letters, digits and underscores"
    );
    ensure!(
        !queue_prefix.is_empty()
            && queue_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
        "the queue prefix may hold only letters, digits, '-', '_' and '.'"
    );
    let started = Instant::now();
    println!("countersign demo — an agent proposes, a human countersigns\n");
    let mut demo = Demo::prepare(database_url, amqp_addr, queue_prefix, database).await?;
    let result = tokio::select! {
        result = demo.story(keep) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    if result.is_ok() && keep {
        println!(
            "Every step behaved as told ({:.1} s).\n",
            started.elapsed().as_secs_f64()
        );
        return demo.keep_running();
    }
    demo.clean_up(result.is_ok(), started).await?;
    result
}

/// One demo: its database, its queues, its services, and what it learned along the way.
struct Demo {
    store: Store,
    pool: PgPool,
    db: Database,
    /// Connected once the services declared the queues.
    broker: Option<Broker>,
    amqp_addr: String,
    model: ModelStub,
    services: Services,
    prefix: String,
}

impl Demo {
    /// The demo's directory, database (migrated, the demo site seeded), queue prefix, model
    /// stand-in and environment; the queues a previous demo left are deleted.
    async fn prepare(
        database_url: &str,
        amqp_addr: &str,
        queue_prefix: &str,
        database: &str,
    ) -> anyhow::Result<Demo> {
        for name in ["countersign", COORDINATOR, WORKER, REAPER, API] {
            binary(name)?;
        }
        let (dir, leftover) = demo_dir(database)?;
        if let Some(prefix) = leftover {
            let broker = connect_broker(amqp_addr, &prefix).await?;
            broker
                .delete_topology()
                .await
                .context("deleting the queues a previous demo left")?;
            println!("(Deleted the queues {prefix}.* a previous demo left behind.)\n");
        }
        let db = Database::create_on(database_url, database).await?;
        let pool = db.migrated(&countersign_content::WITH_ENGINE, 4).await?;
        countersign_content::seed_demo_site(&pool)
            .await
            .context("seeding the demo site")?;
        let prefix = demo_prefix(queue_prefix);
        // Recorded so that the next demo deletes these queues if this one leaves them behind.
        std::fs::write(dir.join(QUEUES_FILE), &prefix).context("recording the queue prefix")?;
        // The summariser's provider: the first call is never answered (its worker is killed
        // waiting for it), the second is rate limited, every later one is answered.
        let model = ModelStub::replying(vec![
            Reply::chat(SUMMARY, &[]).held(),
            Reply::too_many_requests(1),
            Reply::chat(SUMMARY, &[]),
        ]);
        let env = Env::new(db.url(), amqp_addr, &prefix, &dir)?;
        Ok(Demo {
            // It opens no sealed value: a throwaway keyring.
            store: Store::new(pool.clone(), Arc::new(Keyring::ephemeral())),
            pool,
            db,
            broker: None,
            amqp_addr: amqp_addr.to_owned(),
            model,
            services: Services {
                dir,
                env,
                running: Vec::new(),
            },
            prefix,
        })
    }

    /// Stops the services and removes the database and the queues; the files too once every
    /// step behaved, else they stay for their logs.
    async fn clean_up(mut self, behaved: bool, started: Instant) -> anyhow::Result<()> {
        self.services.kill_all();
        self.pool.close().await;
        self.db.remove().await?;
        let broker = match self.broker.take() {
            Some(broker) => broker,
            None => connect_broker(&self.amqp_addr, &self.prefix).await?,
        };
        broker
            .delete_topology()
            .await
            .context("deleting the demo's queues")?;
        let dir = &self.services.dir;
        std::fs::remove_file(dir.join(QUEUES_FILE)).ok();
        if behaved {
            std::fs::remove_dir_all(dir).ok();
            println!(
                "\nThe demo database, queues and files are gone. Every step behaved as told ({:.1} s).",
                started.elapsed().as_secs_f64()
            );
        } else {
            eprintln!(
                "\nThe demo failed; the services' logs are in {}.",
                dir.display()
            );
        }
        Ok(())
    }
    /// The story, step by step; each step checks what it told before the next is told.
    async fn story(&mut self, keep: bool) -> anyhow::Result<()> {
        self.set_up().await?;
        let run_id = self.request().await?;
        let card_1 = self.first_card(run_id).await?;
        self.colleague_edits().await?;
        self.approve_first_card(run_id).await?;
        self.moved_card(run_id, &card_1).await?;
        self.stale_tab(run_id).await?;
        self.approve_current_card(run_id).await?;
        self.what_changed(run_id).await?;
        self.crash().await?;
        self.web_inbox().await?;
        if keep {
            return Ok(());
        }
        self.stop().await
    }

    /// The agents, the services and the broker user the demo's commands publish as.
    async fn set_up(&mut self) -> anyhow::Result<()> {
        self.configure()?;
        self.start_services().await?;
        let broker = connect_broker(&self.amqp_addr, &self.prefix).await?;
        let user = self.allow_producer(&broker)?;
        self.broker = Some(broker);
        println!(
            "Set up: database {} (migrated, demo site seeded) and queues {}.*;",
            self.db.name(),
            self.prefix
        );
        println!(
            "agents \"{AGENT}\" (scripted model, two writers, four eyes) and \"{SUMMARISER}\""
        );
        println!("(read-only, OpenAI-compatible model); the broker user \"{user}\" may name any acting user");
        println!("and approver.\n");
        Ok(())
    }

    /// Step 1: the request, through the queue.
    async fn request(&self) -> anyhow::Result<RunId> {
        println!(
            "1. A run request for agent \"{AGENT}\", acting as \"{ACTING_USER}\", goes through"
        );
        println!("   the queue like any producer's:");
        let run_id = self.submit(AGENT, PROMPT)?;
        let run = self.run_row(run_id).await?;
        ensure!(
            run.agent == AGENT && run.acting_user == ACTING_USER,
            "the run was recorded for agent {} acting as {}",
            run.agent,
            run.acting_user
        );
        println!("   → the coordinator gated the request and queued the run\n");
        Ok(run_id)
    }

    /// Step 2: the first segment suspends the write turn; the card as the approver sees it,
    /// and as a second approver without rights on the page does.
    async fn first_card(&self, run_id: RunId) -> anyhow::Result<Value> {
        println!(
            "2. A worker claims the run and runs the tool loop. The model reads page 12, then"
        );
        println!(
            "   proposes two writes in one turn. The whole turn suspends before either runs, and"
        );
        println!(
            "   each call's preview is produced as \"{ACTING_USER}\" and sealed with the run state."
        );
        let run = self.wait_for_card(run_id, 1).await?;
        ensure!(
            run.pending_tools == ["update_page_metadata", "attach_file_to_content_element"],
            "the suspended turn holds {:?}",
            run.pending_tools
        );
        self.expect_nothing_written(2).await?;
        println!("   → waiting for approval, suspension 1; nothing is written yet\n");
        self.show(&["inbox", "--as", APPROVER, "--save", "card-1.json"])?;
        let card_1 = self.card("card-1.json")?;
        ensure!(
            previews(&card_1, "shown") == 2
                && card_text(&card_1).contains("field image: 2 reference(s) → 3, appended last"),
            "the card does not show both previews: {card_1}"
        );
        self.countersign(&["inbox", "--as", SECOND_APPROVER, "--save", "tab.json"])?;
        let tab = self.card("tab.json")?;
        let withheld = previews(&tab, "withheld");
        ensure!(
            withheld > 0 && tab["suspension_seq"] == 1,
            "the second approver's card: {tab}"
        );
        println!(
            "   (\"{SECOND_APPROVER}\", who may approve but holds no rights on page 12, opens the same"
        );
        println!("    card in a tab of their own, with {withheld} preview(s) withheld.)\n");
        Ok(card_1)
    }

    /// Step 3: someone edits the target in the CMS.
    async fn colleague_edits(&self) -> anyhow::Result<()> {
        println!("3. Meanwhile a colleague attaches logo.svg to the same teaser in the CMS.");
        sqlx::query(
            "INSERT INTO content.file_references (element, field, file, sorting)
             SELECT 5, 'image', 10, coalesce(max(sorting), 0) + 1
             FROM content.file_references WHERE element = 5 AND field = 'image'",
        )
        .execute(&self.pool)
        .await?;
        ensure!(
            self.count(TEASER_IMAGES).await? == 3,
            "the colleague's edit"
        );
        println!(
            "   → the teaser's image field now holds one more reference than the card shows\n"
        );
        Ok(())
    }

    /// Step 4: the approval of the first card.
    async fn approve_first_card(&self, run_id: RunId) -> anyhow::Result<()> {
        println!("4. \"{APPROVER}\" approves the card they were shown, suspension 1:");
        self.decide(run_id, "card-1.json", APPROVER)?;
        ensure!(
            self.decisions(run_id).await? == ["accepted"],
            "the coordinator did not record the approval"
        );
        println!("   → decision accepted; the run is queued to resume\n");
        Ok(())
    }

    /// Step 5: the resume re-previews and finds the relative write moved.
    async fn moved_card(&self, run_id: RunId, card_1: &Value) -> anyhow::Result<()> {
        println!("5. A worker claims the resume and re-previews the whole turn before any write.");
        self.wait_for_card(run_id, 2).await?;
        self.expect_nothing_written(3).await?;
        ensure!(
            self.has_event(run_id, "run.preview_moved").await?,
            "no run.preview_moved event"
        );
        let inbox = ["inbox", "--as", APPROVER, "--save", "card-2.json"];
        let shown = self.countersign(&inbox)?;
        let card_2 = self.card("card-2.json")?;
        let moved: Vec<String> = card_2["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|call| call["moved"] == true)
            .map(|call| call["index"].to_string())
            .collect();
        ensure!(
            moved == ["1"] && card_2["turn_digest"] == card_1["turn_digest"],
            "the second card: {card_2}"
        );
        println!(
            "   The attach call's preview no longer reads as shown: nothing is written, and the run"
        );
        println!(
            "   re-suspends with the current previews. Moved call(s): [{}]",
            moved.join(", ")
        );
        println!("   → waiting for approval, suspension 2 (same calls, same digest, new card)\n");
        echo(&inbox, &shown);
        ensure!(
            card_text(&card_2).contains("field image: 3 reference(s) → 4, appended last"),
            "the second card does not show the current preview: {card_2}"
        );
        println!();
        Ok(())
    }

    /// Step 6: a stale tab's approval is refused and changes nothing.
    async fn stale_tab(&self, run_id: RunId) -> anyhow::Result<()> {
        println!("6. The second approver's tab still shows suspension 1, and they approve it:");
        let out = self.show_refused(&[
            "decide",
            &run_id.to_string(),
            "--card",
            "tab.json",
            "--as",
            SECOND_APPROVER,
            "--approve",
        ])?;
        ensure!(
            out.contains("decision refused: stale_turn"),
            "the stale tab's decision was not refused stale_turn: {out}"
        );
        ensure!(
            self.decisions(run_id).await? == ["accepted", "stale_turn"],
            "the refusal was not recorded"
        );
        let run = self.run_row(run_id).await?;
        ensure!(
            run.status == RunStatus::WaitingForApproval
                && run.suspension_seq.map(|s| s.get()) == Some(2),
            "the run moved: {:?}",
            run.status
        );
        println!("   → decision refused: stale_turn; the run stays waiting, untouched\n");
        Ok(())
    }

    /// Step 7: the approval of the current card executes the turn.
    async fn approve_current_card(&self, run_id: RunId) -> anyhow::Result<()> {
        println!("7. \"{APPROVER}\" approves the card they are shown now, suspension 2:");
        self.decide(run_id, "card-2.json", APPROVER)?;
        let run = self.wait_for_status(run_id, RunStatus::Completed).await?;
        ensure!(
            run.termination_reason.map(|r| r.as_str()) == Some("completed"),
            "the run ended {:?}",
            run.termination_reason
        );
        println!(
            "   A worker claims the resume (lease epoch {}): every preview reads as shown, so both",
            run.lease_epoch
        );
        println!(
            "   writes execute under the lease fence, each with its read-back, audit event and"
        );
        println!("   journal row in one transaction. The model is told the results and answers.");
        println!("   → run completed: completed\n");
        Ok(())
    }

    /// Step 8: what changed, read back from the content store.
    async fn what_changed(&self, run_id: RunId) -> anyhow::Result<()> {
        println!("8. What the run changed, read back from the content store:");
        let description: String =
            sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
                .fetch_one(&self.pool)
                .await?;
        let files = self.teaser_images().await?;
        let kinds = self.event_kinds(run_id).await?;
        ensure!(
            description.starts_with("Bicycles for every road")
                && files == ["hero.jpg", "team.jpg", "logo.svg", "bicycle.png"]
                && kinds.iter().filter(|k| *k == "tool_write").count() == 2,
            "the writes did not land as approved: {description:?}, {files:?}, {kinds:?}"
        );
        println!("   page 12 description: \"{description}\"");
        println!("   teaser images, in order: {}", files.join(", "));
        println!("   run events: {}\n", kinds.join(" → "));
        Ok(())
    }

    /// Step 10: the orderly stop.
    async fn stop(&mut self) -> anyhow::Result<()> {
        println!("10. Every service is sent SIGTERM, as systemd or Kubernetes would stop it:");
        for (name, pid, status) in self.services.stop_all().await? {
            ensure!(status.success(), "{name} (pid {pid}) exited {status}");
            println!("   {name} (pid {pid}) exited 0");
        }
        Ok(())
    }

    /// Step 9: the summariser's first model call hangs; its worker is SIGKILLed holding the
    /// lease; the reaper requeues the run once the lease ran out, and the other worker runs it.
    async fn crash(&mut self) -> anyhow::Result<()> {
        let (run_id, doomed) = self.kill_the_waiting_worker().await?;
        self.rescue(run_id, &doomed).await?;
        self.services.restart(&doomed)?;
        self.services.wait_ready(&doomed).await?;
        println!(
            "   A supervisor would start the dead worker again; the demo does: {doomed} (pid {}) is ready.\n",
            self.services.pid(&doomed)?
        );
        Ok(())
    }

    /// The summariser's run, its worker waiting on the model, SIGKILLed: the run and the
    /// worker's name.
    async fn kill_the_waiting_worker(&mut self) -> anyhow::Result<(RunId, String)> {
        println!(
            "9. A second agent, \"{SUMMARISER}\", calls an OpenAI-compatible endpoint (a stand-in"
        );
        println!(
            "   the demo serves on 127.0.0.1:{}), whose first answer never comes:",
            self.model.port()
        );
        let run_id = self.submit(SUMMARISER, SUMMARY_PROMPT)?;
        let (run, doomed) = self
            .wait_for("a worker waits on the model, holding the lease", || async {
                let run = self.run_row(run_id).await?;
                let waiting = run.status == RunStatus::Running && self.model.requests().len() == 1;
                Ok(waiting
                    .then(|| run.lease_owner.clone())
                    .flatten()
                    .map(|owner| (run, owner)))
            })
            .await?;
        ensure!(
            run.lease_epoch.get() == 1 && run.requeue_count == 0,
            "the first claim"
        );
        let pid = self.services.pid(&doomed)?;
        println!(
            "   → {doomed} (pid {pid}) holds the lease (epoch 1) and waits on the model, renewing"
        );
        println!("     the lease every second");
        println!("   $ kill -KILL {pid}");
        let status = self.services.kill(&doomed)?;
        ensure!(
            std::os::unix::process::ExitStatusExt::signal(&status) == Some(9),
            "{doomed} ended {status}"
        );
        let run = self.run_row(run_id).await?;
        ensure!(
            run.status == RunStatus::Running && run.lease_owner.as_deref() == Some(doomed.as_str()),
            "the dead worker's run was settled: {:?}",
            run.status
        );
        println!("   → {doomed} died settling nothing: the run still reads running, leased to it");
        Ok((run_id, doomed))
    }

    /// The reaper requeues the dead worker's run once its lease ran out; the other worker
    /// claims it and completes it, past a rate-limited model call.
    async fn rescue(&self, run_id: RunId, doomed: &str) -> anyhow::Result<()> {
        println!(
            "   The lease runs out by the database clock. The reaper's next pass requeues the run"
        );
        println!("   and publishes its wake-up again:");
        let (run, rescuer) = self
            .wait_for("another worker claims the requeued run", || async {
                let run = self.run_row(run_id).await?;
                let claimed = run.status == RunStatus::Running && run.lease_epoch.get() == 2;
                Ok(claimed
                    .then(|| run.lease_owner.clone())
                    .flatten()
                    .map(|owner| (run, owner)))
            })
            .await?;
        ensure!(
            rescuer != doomed && run.requeue_count == 1,
            "the run was taken up by {rescuer} after {} requeue(s)",
            run.requeue_count
        );
        // The pass prints its line once it is over, which may be after the claim it caused.
        // Its `redispatched` counts only wake-ups still unclaimed when the pass marked them.
        let pass = self
            .wait_for("a reaper pass reports the requeue", || async {
                Ok(self
                    .services
                    .log_lines(REAPER)?
                    .into_iter()
                    .find(|line| line.contains("requeued=1")))
            })
            .await?;
        println!("     {pass}");
        println!("   → {rescuer} claims it (lease epoch 2, requeue 1). The endpoint answers its first call");
        println!("     HTTP 429 with Retry-After: 1; the provider waits as asked and calls again.");
        let run = self.wait_for_status(run_id, RunStatus::Completed).await?;
        ensure!(
            run.termination_reason.map(|r| r.as_str()) == Some("completed")
                && run.lease_epoch.get() == 2
                && self.model.requests().len() == 3,
            "the rescued run ended {:?} at epoch {} after {} model call(s)",
            run.termination_reason,
            run.lease_epoch,
            self.model.requests().len()
        );
        println!(
            "   → run completed: completed (three model calls: one lost with the dead worker, one"
        );
        println!("     rate-limited, one answered)");
        Ok(())
    }

    /// The web inbox: `countersign-api` started like the other services, a token minted for
    /// the demo's approver, and where to sign in (usable until the services stop; with
    /// `--keep`, until they are stopped by hand).
    async fn web_inbox(&mut self) -> anyhow::Result<()> {
        let port = free_port();
        self.services
            .start("api", API, &["--listen", &format!("127.0.0.1:{port}")])?;
        self.services.wait_ready("api").await?;
        let token = countersign_api::tokens::create(&self.pool, APPROVER, Some("demo"), None)
            .await
            .context("minting the demo approver's token")?;
        println!();
        println!(
            "The HTTP API and the web inbox (countersign-api, pid {}):",
            self.services.pid("api")?
        );
        for line in countersign_api::inbox_hint(&format!("http://127.0.0.1:{port}"), &token).lines()
        {
            println!("   {line}");
        }
        println!();
        Ok(())
    }

    /// The demo's two agents, put as an operator puts them: `countersign agents put`, which
    /// checks their model settings with the workers' own parser.
    fn configure(&self) -> anyhow::Result<()> {
        let dir = &self.services.dir;
        let script = dir.join("seo-assistant.script.json");
        std::fs::write(&script, SCRIPT).context("writing the demo's model script")?;
        let stand_in = json!({
            "provider": "openai", "base_url": self.model.base_url, "model": "demo-summariser",
            "api_key_env": MODEL_KEY_ENV, "timeout_secs": 60,
            "retry": {"max_attempts": 3, "max_elapsed_secs": 20},
        });
        let writers = ["update_page_metadata", "attach_file_to_content_element"];
        for agent in [
            json!({"name": AGENT, "model": {"provider": "scripted", "script": script},
                   "policy": {"allowed_groups": ["content", "editing"], "enabled_tools": writers},
                   "max_iterations": 8, "four_eyes": true, "approval_deadline_secs": 86400}),
            json!({"name": SUMMARISER, "model": stand_in, "policy": {"allowed_groups": ["content"]},
                   "max_iterations": 8, "approval_deadline_secs": 86400}),
        ] {
            let file = dir.join(format!(
                "{}.agent.json",
                agent["name"].as_str().unwrap_or("")
            ));
            std::fs::write(&file, agent.to_string()).context("writing an agent file")?;
            self.countersign(&["agents", "put", &file.to_string_lossy()])?;
        }
        Ok(())
    }

    /// Lets the broker user of the demo's commands name any acting user and approver:
    /// `countersign producers allow`.
    fn allow_producer(&self, broker: &Broker) -> anyhow::Result<String> {
        let user = broker
            .user()
            .context("the broker connection names no user")?;
        for kind in ["acting-user", "approver"] {
            self.countersign(&["producers", "allow", &user, kind, "*"])?;
        }
        Ok(user)
    }

    async fn start_services(&mut self) -> anyhow::Result<()> {
        let workers = ["demo-worker-1", "demo-worker-2"];
        self.services.start("coordinator", COORDINATOR, &[])?;
        for worker in workers {
            self.services.start(
                worker,
                WORKER,
                &["--owner", worker, "--lease-ttl-secs", LEASE_TTL_SECS],
            )?;
        }
        self.services.start(
            "reaper",
            REAPER,
            &[
                "--every",
                "1",
                "--backoff-secs",
                "0",
                "--dispatch-grace-secs",
                "0",
            ],
        )?;
        println!("The services, each its own process, over RabbitMQ and PostgreSQL:");
        for name in ["coordinator", workers[0], workers[1], "reaper"] {
            self.services.wait_ready(name).await?;
            let service = self.services.get(name)?;
            println!(
                "   {name:<14} pid {:<7} ready on :{}/readyz   {}",
                service.process.pid(),
                service.port,
                shell_words(
                    &std::iter::once(service.binary)
                        .chain(service.args.iter().map(String::as_str))
                        .collect::<Vec<_>>()
                )
            );
        }
        println!();
        Ok(())
    }

    /// `countersign submit`: the run id the coordinator answered with.
    fn submit(&self, agent: &str, prompt: &str) -> anyhow::Result<RunId> {
        let out = self.show(&["submit", "--agent", agent, "--as", ACTING_USER, prompt])?;
        out.split_whitespace()
            .nth(1)
            .and_then(|id| RunId::from_str(id).ok())
            .with_context(|| format!("no run id in {out:?}"))
    }

    /// `countersign decide RUN --card FILE --as APPROVER --approve`, which must be accepted.
    fn decide(&self, run_id: RunId, card: &str, approver: &str) -> anyhow::Result<()> {
        let out = self.show(&[
            "decide",
            &run_id.to_string(),
            "--card",
            card,
            "--as",
            approver,
            "--approve",
        ])?;
        ensure!(out.contains("decision accepted"), "{out}");
        Ok(())
    }

    /// Runs `countersign ARGS` in the demo's directory with the services' environment; fails
    /// on a non-zero exit.
    fn countersign(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.countersign_output(args)?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(
            out.status.success(),
            "countersign {} failed ({}):\n{stdout}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(stdout)
    }

    fn countersign_output(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut command = self.services.command("countersign")?;
        command.args(args).output().context("running countersign")
    }

    /// [`Self::countersign`], printing the command line and what it printed.
    fn show(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.countersign(args)?;
        echo(args, &out);
        Ok(out)
    }

    /// Runs a command that must be refused (exit status 1), printing it and its error.
    fn show_refused(&self, args: &[&str]) -> anyhow::Result<String> {
        println!("   $ countersign {}", shell_words(args));
        let out = self.countersign_output(args)?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        ensure!(
            out.status.code() == Some(1),
            "countersign {} was not refused ({}): {}{stderr}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        print_indented(&stderr);
        Ok(stderr)
    }

    /// The one card in a card file `inbox --save` wrote.
    fn card(&self, name: &str) -> anyhow::Result<Value> {
        let text = std::fs::read_to_string(self.services.dir.join(name))
            .with_context(|| format!("reading {name}"))?;
        let file: Value = serde_json::from_str(&text)?;
        match file["cards"].as_array().map(Vec::as_slice) {
            Some([card]) => Ok(card.clone()),
            _ => bail!("{name} does not hold exactly one card: {file}"),
        }
    }

    async fn run_row(&self, run_id: RunId) -> anyhow::Result<RunRecord> {
        self.store.run(run_id).await?.context("the run vanished")
    }

    async fn wait_for_status(&self, run_id: RunId, status: RunStatus) -> anyhow::Result<RunRecord> {
        self.wait_for(&format!("the run is {}", status.as_str()), || async {
            let run = self.run_row(run_id).await?;
            ensure!(
                !run.status.is_terminal() || run.status == status,
                "the run ended {} ({:?}, {:?}) instead",
                run.status.as_str(),
                run.termination_reason,
                run.error_code
            );
            Ok((run.status == status).then_some(run))
        })
        .await
    }

    async fn wait_for_card(&self, run_id: RunId, seq: u32) -> anyhow::Result<RunRecord> {
        self.wait_for(&format!("the run waits on card {seq}"), || async {
            let run = self.run_row(run_id).await?;
            ensure!(
                !run.status.is_terminal(),
                "the run ended {} ({:?}, {:?})",
                run.status.as_str(),
                run.termination_reason,
                run.error_code
            );
            let waiting = run.status == RunStatus::WaitingForApproval
                && run.suspension_seq.map(|s| s.get()) == Some(seq);
            Ok(waiting.then_some(run))
        })
        .await
    }

    /// Polls `probe` until it yields a value; fails after [`STEP`], or when a service died.
    async fn wait_for<T>(
        &self,
        what: &str,
        mut probe: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
    ) -> anyhow::Result<T> {
        wait_until(what, STEP, async || {
            let value = probe().await?;
            if value.is_none() {
                self.services.all_alive()?;
            }
            Ok(value)
        })
        .await
    }

    async fn expect_nothing_written(&self, images: i64) -> anyhow::Result<()> {
        let description: String =
            sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
                .fetch_one(&self.pool)
                .await?;
        let teaser = self.count(TEASER_IMAGES).await?;
        ensure!(
            !description.starts_with("Bicycles for every road") && teaser == images,
            "something was written before its approval: {description:?}, {teaser} image(s)"
        );
        Ok(())
    }

    async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(sql).fetch_one(&self.pool).await?)
    }

    async fn teaser_images(&self) -> anyhow::Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT f.name FROM content.file_references r JOIN content.files f ON f.uid = r.file
             WHERE r.element = 5 AND r.field = 'image' AND NOT r.deleted ORDER BY r.sorting, r.uid",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// The outcomes of the run's recorded decisions, in order.
    async fn decisions(&self, run_id: RunId) -> anyhow::Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT outcome FROM run_decisions WHERE run_id = $1 ORDER BY created_at, decision_id",
        )
        .bind(run_id.as_uuid())
        .fetch_all(&self.pool)
        .await?)
    }

    async fn event_kinds(&self, run_id: RunId) -> anyhow::Result<Vec<String>> {
        Ok(self
            .store
            .events(run_id)
            .await?
            .into_iter()
            .map(|e| e.kind)
            .collect())
    }

    async fn has_event(&self, run_id: RunId, kind: &str) -> anyhow::Result<bool> {
        Ok(self.event_kinds(run_id).await?.iter().any(|k| k == kind))
    }

    /// `--keep`: the services go on; say how to reach and stop them.
    fn keep_running(mut self) -> anyhow::Result<()> {
        let pids = self.services.detach();
        let database = self.db.keep();
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        let dir = &self.services.dir;
        std::fs::write(dir.join("services.pid"), list.join("\n") + "\n")
            .context("writing services.pid")?;
        println!("The services keep running (--keep, KEEP=1), with the database and the queues:");
        println!("   logs:       {}/*.log", dir.display());
        // The URLs may carry passwords: they go to a file of the owner's, not to the terminal.
        std::fs::write(dir.join("demo.env"), self.services.env.shown())
            .context("writing demo.env")?;
        println!(
            "   look:       cd {} && (set -a; . ./demo.env; {} inbox --as {APPROVER})",
            dir.display(),
            binary("countersign")?.display()
        );
        println!("   stop them:  kill -TERM {}", list.join(" "));
        println!(
            "   clean up:   the next `make demo` replaces the database {} and deletes the queues {}.*",
            database, self.prefix
        );
        Ok(())
    }
}

/// The environment every process of the demo runs with: the demo's database, broker, queue
/// prefix and keyring.
struct Env {
    vars: Vec<(&'static str, String)>,
}

/// Variables of the caller's environment that would point a demo process elsewhere.
const CLEARED: [&str; 5] = [
    "COUNTERSIGN_HTTP_ADDR",
    "COUNTERSIGN_WORKER_ID",
    "COUNTERSIGN_MODEL_SCRIPT",
    "COUNTERSIGN_NO_DECLARE",
    "COUNTERSIGN_QUEUE_ARGUMENTS",
];

impl Env {
    fn new(database_url: String, amqp_addr: &str, prefix: &str, dir: &Path) -> anyhow::Result<Env> {
        let mut vars = vec![
            ("DATABASE_URL", database_url),
            ("AMQP_ADDR", amqp_addr.to_owned()),
            ("COUNTERSIGN_QUEUE_PREFIX", prefix.to_owned()),
            (MODEL_KEY_ENV, "demo-key-not-a-secret".to_owned()),
        ];
        let var = |name| countersign_service::settings::environment(name);
        let (keys, key_file) = (var("COUNTERSIGN_KEYS"), var("COUNTERSIGN_KEY_FILE"));
        if keys.is_some() || key_file.is_some() {
            // The caller's keyring, inherited by every process.
            Keyring::load(keys.as_deref(), key_file.as_deref().map(Path::new))
                .context("loading the keyring the environment names")?;
        } else {
            let path = dir.join("keys");
            let entry = Keyring::generate_entry(&KeyId::parse("demo")?);
            let mut options = std::fs::OpenOptions::new();
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options
                .write(true)
                .create_new(true)
                .open(&path)
                .context("writing the demo's key file")?;
            writeln!(file, "{entry}")?;
            vars.push(("COUNTERSIGN_KEY_FILE", path.display().to_string()));
        }
        Ok(Env { vars })
    }

    fn apply(&self, command: &mut Command) {
        for name in CLEARED {
            command.env_remove(name);
        }
        if self
            .vars
            .iter()
            .any(|(name, _)| *name == "COUNTERSIGN_KEY_FILE")
        {
            command.env_remove("COUNTERSIGN_KEYS");
        }
        for (name, value) in &self.vars {
            command.env(name, value);
        }
        // Refusals are expected and printed: their message, not a backtrace; plain logs.
        command
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .env("NO_COLOR", "1");
    }

    /// The variables a shell needs to talk to the kept demo, one `NAME=VALUE` line each.
    fn shown(&self) -> String {
        self.vars
            .iter()
            .filter(|(name, _)| *name != MODEL_KEY_ENV)
            .map(|(name, value)| format!("{name}={}\n", shell_word(value)))
            .collect()
    }
}

/// One service process.
struct Service {
    name: String,
    binary: &'static str,
    args: Vec<String>,
    port: u16,
    process: Process,
    log: PathBuf,
    /// SIGKILLed by the demo, until it is started again.
    killed: bool,
}

/// The demo's service processes, started in its directory (logs, card files, its key file)
/// with its environment. Those still running when it is dropped are killed, unless they were
/// detached to keep running.
struct Services {
    dir: PathBuf,
    env: Env,
    running: Vec<Service>,
}

impl Services {
    fn start(&mut self, name: &str, binary: &'static str, args: &[&str]) -> anyhow::Result<()> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let service = self.spawn(name, binary, args)?;
        self.running.push(service);
        Ok(())
    }

    fn get(&self, name: &str) -> anyhow::Result<&Service> {
        self.running
            .iter()
            .find(|s| s.name == name)
            .with_context(|| format!("no service {name}"))
    }

    fn get_mut(&mut self, name: &str) -> anyhow::Result<&mut Service> {
        self.running
            .iter_mut()
            .find(|s| s.name == name)
            .with_context(|| format!("no service {name}"))
    }

    fn pid(&self, name: &str) -> anyhow::Result<u32> {
        Ok(self.get(name)?.process.pid())
    }

    /// Waits until the service answers `/readyz` with 200. One that could not bind the port
    /// it was given (taken since it was found free) is started again on another.
    async fn wait_ready(&mut self, name: &str) -> anyhow::Result<()> {
        let mut rebinds = 0;
        loop {
            let service = self.get_mut(name)?;
            let Err(e) = service.process.wait_ready(service.port, STEP).await else {
                return Ok(());
            };
            let rebind = service.process.exited().is_some()
                && service
                    .process
                    .log_tail()
                    .contains("Address already in use");
            if !rebind || rebinds == 3 {
                return Err(e);
            }
            rebinds += 1;
            self.restart(name)?;
        }
    }

    /// Fails when a service is no longer running.
    fn all_alive(&self) -> anyhow::Result<()> {
        for service in self.running.iter().filter(|s| !s.killed) {
            ensure!(
                service.process.is_running(),
                "{} (pid {}) died:\n{}",
                service.name,
                service.process.pid(),
                service.process.log_tail()
            );
        }
        Ok(())
    }

    /// SIGKILL: the process dies at once, settling nothing.
    fn kill(&mut self, name: &str) -> anyhow::Result<ExitStatus> {
        let service = self.get_mut(name)?;
        service.killed = true;
        Ok(service.process.sigkill())
    }

    /// Starts a killed service again with the same arguments, as a supervisor would.
    fn restart(&mut self, name: &str) -> anyhow::Result<()> {
        let old = self.get_mut(name)?;
        let (binary, args) = (old.binary, old.args.clone());
        let new = self.spawn(name, binary, args)?;
        *self.get_mut(name)? = new;
        Ok(())
    }

    /// SIGTERM to every service, in order; their exit statuses.
    async fn stop_all(&mut self) -> anyhow::Result<Vec<(String, u32, ExitStatus)>> {
        let mut stopped = Vec::new();
        for mut service in std::mem::take(&mut self.running) {
            let pid = service.process.pid();
            let status = service.process.terminate(STEP).await?;
            stopped.push((service.name, pid, status));
        }
        Ok(stopped)
    }

    /// Lets the services run on after the demo; their pids.
    fn detach(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.running)
            .into_iter()
            .filter(|s| !s.killed)
            .map(|s| s.process.detach())
            .collect()
    }

    fn kill_all(&mut self) {
        self.running.clear();
    }

    fn spawn(
        &self,
        name: &str,
        binary: &'static str,
        args: Vec<String>,
    ) -> anyhow::Result<Service> {
        let port = free_port();
        let log = self.dir.join(format!("{name}.log"));
        let mut command = self.command(binary)?;
        command
            .args(&args)
            .args(["--http-addr", &format!("127.0.0.1:{port}")]);
        let process = Process::spawn_logged(name, &mut command, &log)?;
        Ok(Service {
            name: name.to_owned(),
            binary,
            args,
            port,
            process,
            log,
            killed: false,
        })
    }

    /// `binary`, to run in the demo's directory with its environment.
    fn command(&self, binary: &str) -> anyhow::Result<Command> {
        let mut command = Command::new(countersign_testkit::binary(binary)?);
        self.env.apply(&mut command);
        command.current_dir(&self.dir);
        Ok(command)
    }

    fn log_lines(&self, binary: &str) -> anyhow::Result<Vec<String>> {
        let service = self
            .running
            .iter()
            .find(|s| s.binary == binary)
            .with_context(|| format!("no {binary}"))?;
        let file = File::open(&service.log)?;
        Ok(BufReader::new(file).lines().map_while(Result::ok).collect())
    }
}

/// The demo's own queue prefix, under `base` (`--queue-prefix`): `BASE-demo-` and 12 hex
/// digits. Never `base` itself: the demo deletes its queues when it ends, and `base` may be
/// an installation's.
fn demo_prefix(base: &str) -> String {
    format!(
        "{base}{DEMO_MARK}{}",
        &Uuid::now_v7().simple().to_string()[20..]
    )
}

/// Whether `prefix` is one [`demo_prefix`] made: only such queues a demo deletes as its own.
fn is_demo_prefix(prefix: &str) -> bool {
    prefix.rsplit_once(DEMO_MARK).is_some_and(|(base, tail)| {
        !base.is_empty()
            // 8 digits in the demos of earlier releases.
            && (8..=12).contains(&tail.len())
            && tail
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

const DEMO_MARK: &str = "-demo-";

/// The file in the demo's directory naming its queue prefix.
const QUEUES_FILE: &str = "queues";

/// The demo's directory (logs, card files, the key file, a kept demo's pids), made afresh —
/// unless a demo kept with `--keep` still runs from it — and the queue prefix of a previous
/// demo whose queues may still exist.
fn demo_dir(database: &str) -> anyhow::Result<(PathBuf, Option<String>)> {
    let dir = std::env::temp_dir().join(format!("countersign-demo-{database}"));
    if let Ok(pids) = std::fs::read_to_string(dir.join("services.pid")) {
        let running: Vec<&str> = pids
            .split_whitespace()
            .filter(|pid| pid.parse().is_ok_and(process_runs))
            .collect();
        ensure!(
            running.is_empty(),
            "a demo kept with --keep still runs on database {database}: stop it with \
             `kill -TERM {}` first (or remove {} if those processes are not its services)",
            running.join(" "),
            dir.join("services.pid").display()
        );
    }
    let leftover = std::fs::read_to_string(dir.join(QUEUES_FILE))
        .ok()
        .map(|prefix| prefix.trim().to_owned())
        .filter(|prefix| is_demo_prefix(prefix));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    // Card files hold content: the directory is its owner's only.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    Ok((dir, leftover))
}

/// Prints a `countersign` command line and what it printed.
fn echo(args: &[&str], out: &str) {
    println!("   $ countersign {}", shell_words(args));
    print_indented(out);
}

fn print_indented(text: &str) {
    for line in text.lines() {
        println!("     {line}");
    }
}

/// `args` as a shell would need them typed.
fn shell_words(args: &[&str]) -> String {
    args.iter()
        .map(|a| shell_word(a))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// How many calls of a saved card show a preview of `kind` (`shown`, `withheld`, …).
fn previews(card: &Value, kind: &str) -> usize {
    card["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|call| call["preview"]["kind"] == kind)
        .count()
}

/// Every preview line of a saved card.
fn card_text(card: &Value) -> String {
    card["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|call| {
            call["preview"]["lines"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|line| line.as_str().map(str::to_owned))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_queues_are_its_own_under_the_prefix_it_was_given() {
        let prefix = demo_prefix("acme");
        assert!(prefix.starts_with("acme-demo-"), "{prefix}");
        assert!(is_demo_prefix(&prefix), "{prefix}");
        assert_ne!(prefix, demo_prefix("acme"), "a new one each time");
        for not_a_demo in ["acme", "countersign", "-demo-0123456789ab", "acme-demo-xyz"] {
            assert!(!is_demo_prefix(not_a_demo), "{not_a_demo}");
        }
        assert!(
            is_demo_prefix("countersign-demo-0123abcd"),
            "an earlier release's"
        );
    }

    #[test]
    fn a_printed_command_quotes_exactly_the_words_a_shell_would_split() {
        assert_eq!(
            shell_words(&["decide", "0193c1f2-0000", "--card", "card-1.json"]),
            "decide 0193c1f2-0000 --card card-1.json"
        );
        assert_eq!(
            shell_words(&["submit", "Tighten page 12.", "it's"]),
            r"submit 'Tighten page 12.' 'it'\''s'"
        );
        assert_eq!(shell_word(""), "''");
    }
}
