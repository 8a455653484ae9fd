//! Fixtures shared by the test modules.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::{
    CallIndex, CallPreview, DecisionMessage, Effect, Message, PendingCall, RunId,
    SuspendedRunState, SuspensionSeq, TokenUsage,
};
use countersign_crypto::{KeyId, Keyring};
use countersign_store::{Claim, DecisionOutcome, Lease, NewDecision, NewRun, SentCall, Store};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

pub const TTL: Duration = Duration::from_secs(30);

/// A keyring entry `id:BASE64` with a fresh random key.
pub fn key_entry(id: &str) -> String {
    Keyring::generate_entry(&KeyId::parse(id).expect("key id"))
}

pub fn keyring(spec: &str) -> Arc<Keyring> {
    Arc::new(Keyring::parse(spec).expect("keyring"))
}

/// The stamp of the first call of the first turn, about to be sent with `effect`.
pub fn sent(effect: Effect) -> SentCall {
    SentCall {
        seq: SuspensionSeq::FIRST,
        index: CallIndex::new(0),
        effect,
    }
}

pub fn store(pool: PgPool) -> Store {
    Store::new(pool, keyring(&key_entry("k1")))
}

pub fn new_run(prompt: &str) -> NewRun {
    NewRun {
        request_id: Uuid::now_v7(),
        agent: "seo-assistant".into(),
        acting_user: "editor".into(),
        prompt: prompt.into(),
        inputs: None,
    }
}

pub async fn queued(store: &Store) -> RunId {
    store
        .create_run(&new_run("Tighten the description of page 12."))
        .await
        .expect("create run")
        .run_id
}

pub async fn claim(store: &Store, run: RunId, owner: &str) -> Claim {
    store
        .claim(run, owner, TTL)
        .await
        .expect("claim")
        .expect("claim wins")
}

/// A run in `running`, claimed by `worker-a`.
pub async fn running(store: &Store) -> (RunId, Lease) {
    let run = queued(store).await;
    let lease = claim(store, run, "worker-a").await.lease;
    (run, lease)
}

/// The suspended state of a turn with one write call.
pub fn state(seq: SuspensionSeq) -> SuspendedRunState {
    SuspendedRunState {
        transcript: vec![Message::user("Tighten the description of page 12.")],
        pending_calls: vec![PendingCall {
            id: "c1".into(),
            tool: "update_page_metadata".into(),
            arguments: json!({"uid": 12, "description": "New words"}),
        }],
        iterations: 2,
        tokens: TokenUsage {
            prompt: 120,
            completion: 30,
        },
        offered_tools: vec!["update_page_metadata".into()],
        model_options: Default::default(),
        call_previews: vec![CallPreview {
            index: CallIndex::new(0),
            tool: "update_page_metadata".into(),
            lines: vec!["field description: \"Old\" → \"New words\"".into()],
            failed: false,
            forms: vec![],
            alone: false,
            full: vec![],
        }],
        stale_call_indexes: vec![],
        landed_calls: vec![],
        tool_identities: vec![],
        excluded_calls: vec![],
        edits: vec![],
        suspension_seq: seq,
        captured_at: "2026-11-30T10:00:00Z".into(),
    }
}

/// An approval of `st`, the card `run` waits on, by `alice`.
pub fn accept(run: RunId, st: &SuspendedRunState) -> NewDecision {
    NewDecision {
        message: DecisionMessage {
            decision_id: Uuid::now_v7(),
            run_id: run,
            suspension_seq: st.suspension_seq,
            turn_digest: st.turn_digest(),
            approved: true,
            calls: vec![],
            edits: vec![],
            approver: "alice".into(),
            comment: None,
        },
        outcome: DecisionOutcome::Accepted,
        in_trail: true,
    }
}

/// A run in `waiting_for_approval` on its first suspension.
pub async fn waiting(store: &Store) -> (RunId, SuspendedRunState) {
    let (run, lease) = running(store).await;
    let st = state(SuspensionSeq::FIRST);
    assert!(store.suspend(&lease, &st, &[]).await.expect("suspend"));
    (run, st)
}

/// Moves the run's lease expiry into the past by the database clock.
pub async fn expire_lease(pool: &PgPool, run: RunId) {
    sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(run.as_uuid())
        .execute(pool)
        .await
        .expect("expire lease");
}

pub async fn count(pool: &PgPool, sql: &str, run: RunId) -> i64 {
    sqlx::query_scalar(sql)
        .bind(run.as_uuid())
        .fetch_one(pool)
        .await
        .expect("count")
}

pub async fn event_count(pool: &PgPool, run: RunId) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM run_events WHERE run_id = $1",
        run,
    )
    .await
}

pub async fn journal_count(pool: &PgPool, run: RunId) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM run_journal WHERE run_id = $1",
        run,
    )
    .await
}
