//! The seeded demo site, an agent whose script proposes one write turn, and the worker's real
//! segment runner over them.

use countersign_core::{DecisionMessage, RunId, SuspendedRunState};
use countersign_store::{DecisionOutcome, DecisionRecord, NewDecision};
pub use countersign_testkit::site::TTL;
use countersign_testkit::site::{agent, Site};
use countersign_worker::SegmentEnd;
use sqlx::PgPool;
use uuid::Uuid;

/// The agent every harness configures.
pub const AGENT: &str = "seo";

/// The site; a test may change its runner (its registry, model, lease time to live).
pub struct Harness(Site);

impl std::ops::Deref for Harness {
    type Target = Site;

    fn deref(&self) -> &Site {
        &self.0
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Site {
        &mut self.0
    }
}

impl Harness {
    /// The demo site in `pool`'s database, and an agent that follows `script` with the writers
    /// `enabled`.
    pub async fn new(pool: PgPool, script: &str, enabled: &[&str]) -> Harness {
        Harness(Site::new(pool, &agent(AGENT, enabled, false), script).await)
    }

    /// A run of the script, suspended on its write turn.
    pub async fn suspended_run(&self) -> RunId {
        let run_id = self.new_run().await;
        let end = self.claim_and_run(run_id, "w1").await;
        assert_eq!(
            end,
            SegmentEnd::Suspended {
                suspension_seq: 1,
                moved: 0
            }
        );
        run_id
    }

    /// A queued run of the script, acting as `editor`.
    pub async fn new_run(&self) -> RunId {
        self.queued_run(AGENT, "editor").await
    }

    /// The run's suspended state, opened.
    pub async fn state(&self, run_id: RunId) -> SuspendedRunState {
        SuspendedRunState::from_bytes(&self.store.load_state(run_id).await.unwrap()).unwrap()
    }

    /// Records an accepted approval of the run's current card.
    pub async fn approve(&self, run_id: RunId) {
        let state = self.state(run_id).await;
        let record = self
            .store
            .record_decision(&NewDecision {
                message: DecisionMessage {
                    decision_id: Uuid::now_v7(),
                    run_id,
                    suspension_seq: state.suspension_seq,
                    turn_digest: state.turn_digest(),
                    approved: true,
                    calls: vec![],
                    edits: vec![],
                    approver: "admin".into(),
                    comment: None,
                },
                outcome: DecisionOutcome::Accepted,
                in_trail: true,
            })
            .await
            .unwrap();
        assert_eq!(record, DecisionRecord::Recorded(DecisionOutcome::Accepted));
    }

    pub async fn tool_writes(&self, run_id: RunId) -> usize {
        self.store
            .events(run_id)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.kind == "tool_write")
            .count()
    }
}
