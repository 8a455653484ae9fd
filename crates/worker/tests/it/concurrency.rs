//! Every pair of the content store's writers, on shared pages, run against each other at once
//! many times — and against a colleague who keeps editing the site root's title in plain SQL.
//!
//! Each turn locks its whole read set in the one global order before it plans, and nothing it
//! writes takes a lock it does not hold: so no two turns ever deadlock, whatever they touch. A
//! turn holds the pages above what it writes only FOR KEY SHARE, so the colleague, whose edit no
//! preview reads, never waits for a turn at all: the colleague's statement runs with a
//! `lock_timeout` of one millisecond, and a single wait would fail it.
//!
//! `CONCURRENCY_ROUNDS` sets how many times each pair runs (a handful in `make test`, 1,000 in
//! `make chaos`); the test prints what it saw.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use countersign_core::sequence::{self, LocalCall};
use countersign_core::{LocalWriters, PendingCall, Principal, SuspensionSeq};
use countersign_store::{FencedWrite, Lease, Store};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::support::Harness;

/// One writer's call on the demo site, on pages and files it shares with the others.
fn calls() -> Vec<(&'static str, Value)> {
    vec![
        (
            "update_page_metadata",
            json!({"uid": 12, "description": "Bicycles."}),
        ),
        (
            "set_file_alternative_text",
            json!({"uid": 7, "alternative": "A bicycle"}),
        ),
        (
            "attach_file_to_content_element",
            json!({"content_element": 5, "file": 7, "field": "image"}),
        ),
        (
            "move_content_element",
            json!({"uid": 4, "target_page": 13, "column": 0}),
        ),
        (
            "create_page_draft",
            json!({"parent": 12, "title": "Spring"}),
        ),
        (
            "create_content_element_draft",
            json!({"page": 12, "header": "Spring", "column": 0, "after_content_uid": 5}),
        ),
        (
            "create_translation_draft",
            json!({"table": "content", "uid": 5, "language": 1}),
        ),
    ]
}

fn rounds() -> usize {
    std::env::var("CONCURRENCY_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(8)
}

/// One turn of `call` under `lease`: its read set locked, planned and applied in sequence, then
/// rolled back. `Err` names what went wrong.
async fn turn(
    store: &Store,
    local: &LocalWriters<FencedWrite>,
    lease: &Lease,
    call: &PendingCall,
) -> Result<(), String> {
    let user = Principal::new("editor", false);
    let writer = local.get(&call.tool).expect("a local writer");
    let mut tx = store
        .begin_turn(lease, SuspensionSeq::FIRST)
        .await
        .map_err(|e| format!("begin: {e}"))?;
    let calls = [LocalCall {
        index: countersign_core::CallIndex::new(0),
        call,
        writer,
    }];
    let done = sequence::local(&mut tx, &user, &calls).await;
    tx.rollback().await.map_err(|e| format!("rollback: {e}"))?;
    let sequenced = done.map_err(|e| format!("{} interrupted: {e}", call.tool))?;
    match &sequenced[0].result {
        Ok(output) if !output.is_error => Ok(()),
        Ok(output) => Err(format!("{} refused: {}", call.tool, output.content)),
        Err(e) => Err(format!("{} failed: {e}", call.tool)),
    }
}

async fn deadlocks(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The colleague: edits the site root's title, with a lock timeout of one millisecond, until
/// `stop`; counts the edits and the ones that had to wait.
async fn colleague(
    pool: PgPool,
    stop: Arc<AtomicBool>,
    edits: Arc<AtomicU64>,
    waits: Arc<AtomicU64>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SET LOCAL lock_timeout = '1ms'")
            .execute(&mut *tx)
            .await
            .unwrap();
        let edited = sqlx::query("UPDATE content.pages SET title = $1 WHERE uid = 10")
            .bind(format!("countersign demo {n}"))
            .execute(&mut *tx)
            .await;
        match edited {
            Ok(_) => {
                tx.commit().await.unwrap();
                edits.fetch_add(1, Ordering::SeqCst);
            }
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
                waits.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => panic!("the colleague's edit failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn every_pair_of_writers_on_shared_pages_never_deadlocks_and_never_makes_the_root_wait(
    pool: PgPool,
) {
    let h = Harness::new(pool.clone(), r#"{"turns": [{"content": "-"}]}"#, &[]).await;
    let store = h.store.clone();
    let local = h.runner.local.clone();
    let mut leases = Vec::new();
    for owner in ["a", "b"] {
        let run_id = h.new_run().await;
        let claim = store
            .claim(run_id, owner, Duration::from_secs(3600))
            .await
            .unwrap()
            .expect("claimable");
        leases.push(claim.lease);
    }
    let calls: Vec<PendingCall> = calls()
        .into_iter()
        .map(|(tool, arguments)| PendingCall {
            id: tool.into(),
            tool: tool.into(),
            arguments,
        })
        .collect();
    // Every call alone first: each is carried out, not refused, on the demo site.
    for call in &calls {
        turn(&store, &local, &leases[0], call).await.unwrap();
    }

    let stop = Arc::new(AtomicBool::new(false));
    let (edits, waits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let colleague = tokio::spawn(colleague(
        pool.clone(),
        stop.clone(),
        edits.clone(),
        waits.clone(),
    ));
    let before = deadlocks(&pool).await;
    let rounds = rounds();
    let mut turns = 0;
    for (i, a) in calls.iter().enumerate() {
        for b in &calls[i..] {
            for _ in 0..rounds {
                let (one, two) = tokio::join!(
                    turn(&store, &local, &leases[0], a),
                    turn(&store, &local, &leases[1], b)
                );
                one.unwrap();
                two.unwrap();
                turns += 2;
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    colleague.await.unwrap();
    let deadlocks = deadlocks(&pool).await - before;
    let (edits, waits) = (edits.load(Ordering::SeqCst), waits.load(Ordering::SeqCst));
    println!(
        "pairs {} × {rounds} rounds: {turns} turns, deadlocks {deadlocks}; the colleague's edits of the root {edits}, waits {waits}",
        calls.len() * (calls.len() + 1) / 2
    );
    assert_eq!(deadlocks, 0, "no two turns deadlock");
    assert!(
        edits > 0,
        "the colleague edited the root while the turns ran"
    );
    assert_eq!(waits, 0, "the colleague never waited for a turn");
}
