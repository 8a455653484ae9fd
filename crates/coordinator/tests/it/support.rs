//! A seeded store, the agent `seo`, a real worker to suspend runs, and the coordinator.

use std::time::Duration;

use countersign_coordinator::producers::{self, ProducerKind, ANY};
use countersign_coordinator::{Coordinator, DecisionVerdict, RequestOutcome};
use countersign_core::{RunId, SuspensionSeq, TurnDigest};
use countersign_store::{AgentConfig, RunStatus};
use countersign_testkit::site::Site;
use countersign_testkit::wait_until;
use countersign_worker::SegmentEnd;
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

pub const AGENT: &str = "seo";
pub const WRITERS: [&str; 2] = ["update_page_metadata", "attach_file_to_content_element"];
/// The broker user of the approval inbox: may assert any approver.
pub const INBOX: &str = "inbox";
/// The broker user of a kiosk that may assert only the approver `approver`.
pub const KIOSK: &str = "kiosk";
/// The broker user of the editorial portal: may start runs as `editor` and `admin`.
pub const PORTAL: &str = "portal";
/// The broker user of the editor's desk: may assert any approver and start runs as `editor`,
/// so it may follow `editor`'s runs whoever decides on them.
pub const DESK: &str = "desk";

const SCRIPT: &str = r#"{"turns": [
  {"tool_calls": [
    {"name": "update_page_metadata", "arguments": {"uid": 12, "description": "Bicycles for every road."}},
    {"name": "attach_file_to_content_element", "arguments": {"content_element": 5, "file": 13, "field": "image"}}
  ]},
  {"content": "Done."}
]}"#;

/// The demo site, the agent, the worker's segment runner, and the coordinator over them.
pub struct Harness {
    pub site: Site,
    pub coordinator: Coordinator,
}

impl std::ops::Deref for Harness {
    type Target = Site;

    fn deref(&self) -> &Site {
        &self.site
    }
}

/// The agent as the harness configures it, before a test changes it.
pub fn agent(four_eyes: bool) -> AgentConfig {
    countersign_testkit::site::agent(AGENT, &WRITERS, four_eyes)
}

pub async fn harness(pool: PgPool) -> Harness {
    let site = Site::new(pool, &agent(false), SCRIPT).await;
    for (user, kind, name) in [
        (INBOX, ProducerKind::Approver, ANY),
        (KIOSK, ProducerKind::Approver, "approver"),
        (PORTAL, ProducerKind::ActingUser, "editor"),
        (PORTAL, ProducerKind::ActingUser, "admin"),
        (DESK, ProducerKind::Approver, ANY),
        (DESK, ProducerKind::ActingUser, "editor"),
    ] {
        producers::allow(&site.pool, user, kind, name)
            .await
            .unwrap();
    }
    let (registry, users) = (site.runner.registry.clone(), site.runner.users.clone());
    Harness {
        coordinator: Coordinator::with_users(site.store.clone(), registry, users),
        site,
    }
}

/// The card a decision names.
#[derive(Debug, Clone)]
pub struct Card {
    pub run_id: RunId,
    pub seq: SuspensionSeq,
    pub digest: TurnDigest,
}

impl Card {
    /// A decision on this card, as a producer would send it.
    pub fn decision(&self, approved: bool, approver: &str) -> Value {
        json!({
            "type": "countersign.decision", "version": 1,
            "decision_id": Uuid::now_v7(),
            "run_id": self.run_id,
            "suspension_seq": self.seq.get(),
            "turn_digest": self.digest.as_str(),
            "approved": approved,
            "approver": approver,
        })
    }
}

pub fn bytes(v: &Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

pub fn request(acting_user: &str, agent: &str) -> Value {
    json!({
        "type": "countersign.run_request", "version": 1,
        "request_id": Uuid::now_v7(),
        "agent": agent,
        "acting_user": acting_user,
        "prompt": "Improve page 12.",
    })
}

impl Harness {
    /// A run requested through the coordinator, still queued for its start segment.
    pub async fn queued_run(&self, acting_user: &str) -> RunId {
        let verdict = self
            .coordinator
            .take_run_request(&bytes(&request(acting_user, AGENT)), Some(PORTAL))
            .await
            .unwrap();
        assert_eq!(verdict.outcome, RequestOutcome::Accepted);
        verdict.run_id.unwrap()
    }

    /// A run of the script acting as `acting_user`, suspended on its write turn by the worker.
    pub async fn suspended_run(&self, acting_user: &str) -> Card {
        let run_id = self.queued_run(acting_user).await;
        assert_eq!(
            self.claim_and_run(run_id, "w1").await,
            SegmentEnd::Suspended {
                suspension_seq: 1,
                moved: 0
            }
        );
        self.card(run_id).await
    }

    /// The run's current card.
    pub async fn card(&self, run_id: RunId) -> Card {
        let run = self.store.run(run_id).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::WaitingForApproval);
        Card {
            run_id,
            seq: run.suspension_seq.unwrap(),
            digest: run.turn_digest.unwrap(),
        }
    }

    /// Sends a decision from `producer`.
    pub async fn decide(&self, decision: &Value, producer: Option<&str>) -> DecisionVerdict {
        self.coordinator
            .take_decision(&bytes(decision), producer)
            .await
            .unwrap()
    }

    /// `(decision_id, outcome)` of every decision recorded for the run, oldest first.
    pub async fn decisions(&self, run_id: RunId) -> Vec<(Uuid, String)> {
        sqlx::query_as(
            "SELECT decision_id, outcome FROM run_decisions WHERE run_id = $1 ORDER BY created_at, decision_id",
        )
        .bind(run_id.as_uuid())
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// The kinds of the run's audit events that concern decisions.
    pub async fn decision_events(&self, run_id: RunId) -> Vec<(String, Value)> {
        self.store
            .events(run_id)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind.starts_with("decision."))
            .map(|e| (e.kind, e.payload))
            .collect()
    }

    /// The kinds of the outbox events about decisions on the run, oldest first.
    pub async fn announced_decisions(&self, run_id: RunId) -> Vec<String> {
        self.store
            .outbox(run_id)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind.starts_with("decision."))
            .map(|e| e.kind)
            .collect()
    }

    /// The bodies of every `run.refused` in the outbox (they name no run), oldest first.
    pub async fn announced_refusals(&self) -> Vec<Value> {
        sqlx::query_scalar(
            "SELECT body FROM event_outbox WHERE kind = 'run.refused' ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// Locks the run row as a concurrent writer would, until the returned transaction ends.
    pub async fn lock_run(&self, run_id: RunId) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::query("SELECT id FROM runs WHERE id = $1 FOR UPDATE")
            .bind(run_id.as_uuid())
            .execute(&mut *tx)
            .await
            .unwrap();
        tx
    }

    /// Waits until `n` statements of this database are blocked on a lock: the deciders have
    /// passed their gates and queue behind the held run row. Fails after thirty seconds.
    pub async fn wait_for_lock_waiters(&self, n: i64) {
        let what = format!("{n} deciders wait on the run row");
        let sql = "SELECT count(*) >= $1 FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
        wait_until(&what, Duration::from_secs(30), async || {
            let all: bool = sqlx::query_scalar(sql)
                .bind(n)
                .fetch_one(&self.pool)
                .await?;
            Ok(all.then_some(()))
        })
        .await
        .unwrap();
    }

    pub async fn runs(&self) -> i64 {
        self.count("SELECT count(*) FROM runs").await
    }

    pub async fn teaser_images(&self) -> i64 {
        self.count(
            "SELECT count(*) FROM content.file_references WHERE element = 5 AND field = 'image' AND NOT deleted",
        )
        .await
    }
}

/// Asserts a refusal that records nothing and publishes nothing.
pub fn assert_unrecorded(v: &DecisionVerdict, code: &str) {
    assert_eq!(v.outcome.code(), code);
    assert!(v.dispatch.is_none(), "nothing is dispatched");
    assert!(
        v.event.is_none(),
        "nothing is published on the events exchange"
    );
    assert!(!v.replayed);
}

/// Asserts a recorded refusal of `d`: its code, no dispatch, and the `decision.refused` event.
pub fn assert_refused(v: &DecisionVerdict, d: &Value, code: &str) {
    assert_eq!(v.outcome.code(), code);
    assert!(v.dispatch.is_none(), "a refusal dispatches nothing");
    let event = v.event.as_ref().expect("a refusal is published");
    assert_eq!(event.name, "decision.refused");
    assert_eq!(event.fields["outcome"], code);
    assert_eq!(event.fields["decision_id"], d["decision_id"]);
    assert_eq!(event.fields["run_id"], d["run_id"]);
    assert_eq!(
        v.reply.as_ref(),
        Some(event),
        "the producer's reply says the same"
    );
}
