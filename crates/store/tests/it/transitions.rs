use std::sync::Arc;
use std::time::Duration;

use countersign_core::RunId;
use countersign_core::{Approves, CallIndex, Effect, SuspensionSeq, ToolOutput};
use countersign_store::Store;
use countersign_store::{
    DecisionOutcome, DecisionRecord, NewDecision, RunCounters, RunStatus, SegmentKind, Settlement,
    StoreError, TerminationReason,
};
use sqlx::PgPool;
use tokio::sync::Barrier;

use crate::support::*;

/// Runs `a` and `b` released together by a barrier and returns both results.
async fn race<A, B, TA, TB>(a: A, b: B) -> (TA, TB)
where
    A: std::future::Future<Output = TA> + Send + 'static,
    B: std::future::Future<Output = TB> + Send + 'static,
    TA: Send + 'static,
    TB: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(2));
    let (ba, bb) = (barrier.clone(), barrier);
    let ta = tokio::spawn(async move {
        ba.wait().await;
        a.await
    });
    let tb = tokio::spawn(async move {
        bb.wait().await;
        b.await
    });
    (ta.await.expect("task a"), tb.await.expect("task b"))
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn two_claimers_released_by_a_barrier_exactly_one_wins(pool: PgPool) {
    let store = store(pool);
    let run = queued(&store).await;
    let (s1, s2) = (store.clone(), store.clone());
    let (a, b) = race(
        async move { s1.claim(run, "worker-a", TTL).await.expect("claim a") },
        async move { s2.claim(run, "worker-b", TTL).await.expect("claim b") },
    )
    .await;

    let winners: Vec<_> = [a, b].into_iter().flatten().collect();
    assert_eq!(winners.len(), 1, "exactly one claimer wins");
    let won = &winners[0];
    assert_eq!(won.lease.epoch.get(), 1);
    assert_eq!(won.segment, SegmentKind::Start);
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Running);
    assert_eq!(row.lease_owner.as_deref(), Some(won.lease.owner.as_str()));
    assert_eq!(row.lease_epoch, won.lease.epoch);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_batched_claim_wins_each_free_run_once_and_skips_a_running_run_and_a_held_row(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let free = [queued(&store).await, queued(&store).await];
    let (taken, _) = running(&store).await;
    let (resumed, st) = waiting(&store).await;
    store.record_decision(&accept(resumed, &st)).await.unwrap();
    let held = queued(&store).await;
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(held.as_uuid())
        .execute(&mut *holder)
        .await
        .unwrap();

    // The first free run is asked for twice, as two wake-ups for one run would.
    let asked = [free[0], taken, held, free[1], resumed, free[0]];
    let answers = tokio::time::timeout(
        Duration::from_secs(10),
        store.claim_many(&asked, "worker-b", TTL),
    )
    .await
    .expect("the batch does not wait for the held row")
    .unwrap();
    assert_eq!(
        answers.iter().map(Option::is_some).collect::<Vec<_>>(),
        [true, false, false, true, true, false],
        "each free run once, in the order asked, and nothing else"
    );
    let won: Vec<_> = asked
        .iter()
        .zip(&answers)
        .filter_map(|(id, claim)| Some((id, claim.as_ref()?)))
        .collect();
    for (id, claim) in won {
        let claim = claim.as_ref().expect("a readable claim");
        assert_eq!(
            (claim.lease.run_id, claim.lease.owner.as_str()),
            (*id, "worker-b")
        );
        let row = store.run(*id).await.unwrap().unwrap();
        assert_eq!(
            (row.status, row.lease_owner.as_deref(), row.lease_epoch),
            (RunStatus::Running, Some("worker-b"), claim.lease.epoch)
        );
        if *id == resumed {
            // What a resume starts from comes with its claim, as with a claim alone.
            assert_eq!(
                (claim.segment, claim.suspension_seq, claim.lease.epoch.get()),
                (SegmentKind::Resume, Some(SuspensionSeq::FIRST), 2)
            );
            assert!(claim.inputs.state.is_some());
            assert!(claim.inputs.decision.as_ref().is_some_and(|d| d.approved));
        } else {
            assert_eq!(
                (claim.segment, claim.lease.epoch.get()),
                (SegmentKind::Start, 1)
            );
            assert!(claim.inputs.request.is_some());
        }
    }
    let still = store.run(taken).await.unwrap().unwrap();
    assert_eq!(
        (still.lease_owner.as_deref(), still.lease_epoch.get()),
        (Some("worker-a"), 1),
        "the running run keeps its lease"
    );
    let skipped = store.run(held).await.unwrap().unwrap();
    assert_eq!(
        skipped.status,
        RunStatus::Queued,
        "the held row was skipped"
    );
    holder.commit().await.unwrap();
    assert_eq!(claim(&store, held, "worker-b").await.lease.epoch.get(), 1);
}

/// What a settlement left of a run: its row's outcome, its last audit event (the answer
/// opened) and its last outbox body, without the ids and the time, which differ between runs.
async fn settled(store: &Store, pool: &PgPool, run: RunId) -> serde_json::Value {
    let row = store.run(run).await.unwrap().unwrap();
    let audit = store.events(run).await.unwrap().pop().unwrap();
    let answer = store
        .open_event_content(run, &audit)
        .unwrap()
        .map(|a| String::from_utf8(a).unwrap());
    let (kind, mut body): (String, serde_json::Value) = sqlx::query_as(
        "SELECT kind, body FROM event_outbox WHERE run_id = $1 ORDER BY created_at DESC LIMIT 1",
    )
    .bind(run.as_uuid())
    .fetch_one(pool)
    .await
    .unwrap();
    for id in ["run_id", "event_id", "at"] {
        body.as_object_mut().unwrap().remove(id);
    }
    serde_json::json!({
        "status": row.status.as_str(), "reason": row.termination_reason.map(|r| r.as_str()),
        "error_code": row.error_code, "lease": row.lease_owner, "expires": row.lease_expires_at,
        "iterations": row.counters.iterations, "tokens": row.counters.prompt_tokens
            + row.counters.completion_tokens,
        "audit": [audit.sequence, audit.kind, audit.payload, answer],
        "outbox": [kind, body],
    })
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_batched_settlement_writes_each_run_as_a_settlement_alone_and_only_under_its_lease(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let counters = RunCounters {
        iterations: 3,
        prompt_tokens: 120,
        completion_tokens: 30,
    };
    let done = Settlement::completed(TerminationReason::Completed, counters)
        .with_answer("The description now reads: Bicycles for every road.");
    let failure = Settlement::failed(
        TerminationReason::ProviderFailed,
        Some("provider_timeout"),
        None,
    );
    // Each settlement twice: once alone, once in the batch.
    let (alone_done, lease) = running(&store).await;
    assert!(store.settle(&lease, &done).await.unwrap());
    let (alone_failed, lease) = running(&store).await;
    assert!(store.settle(&lease, &failure).await.unwrap());
    let (batch_done, done_lease) = running(&store).await;
    let (batch_failed, failed_lease) = running(&store).await;
    // A lease the reaper took back, claimed again by the same owner name: only the epoch
    // tells the two apart.
    let (moved, stale) = running(&store).await;
    expire_lease(&pool, moved).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert!(store
        .reaper_requeue(&seen, 3, Duration::ZERO)
        .await
        .unwrap());
    let current = claim(&store, moved, &stale.owner).await.lease;
    // A status that ends nothing.
    let (unsettled, unsettled_lease) = running(&store).await;
    let bogus = Settlement {
        status: RunStatus::Queued,
        ..failure.clone()
    };

    let written = store
        .settle_many(&[
            (&done_lease, &done),
            (&stale, &failure),
            (&failed_lease, &failure),
            (&unsettled_lease, &bogus),
        ])
        .await
        .unwrap();
    assert_eq!(written, [true, false, true, false]);
    assert_eq!(
        settled(&store, &pool, batch_done).await,
        settled(&store, &pool, alone_done).await
    );
    assert_eq!(
        settled(&store, &pool, batch_failed).await,
        settled(&store, &pool, alone_failed).await
    );
    let kept = store.run(moved).await.unwrap().unwrap();
    assert_eq!(
        (kept.status, kept.lease_owner.as_deref(), kept.lease_epoch),
        (
            RunStatus::Running,
            Some(current.owner.as_str()),
            current.epoch
        ),
        "the stale lease wrote nothing"
    );
    assert_eq!(
        store.run(unsettled).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    for run in [moved, unsettled] {
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM event_outbox WHERE run_id = $1 AND kind IN ('run.completed', 'run.failed')",
                run,
            )
            .await,
            0,
            "no event for a settlement that was not written"
        );
    }
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn every_transition_wins_once_and_loses_when_repeated(pool: PgPool) {
    let store = store(pool);
    let run = queued(&store).await;

    // queued → running
    let first = claim(&store, run, "worker-a").await;
    assert!(store.claim(run, "worker-b", TTL).await.unwrap().is_none());
    assert!(store.renew(&first.lease, TTL).await.unwrap());

    // running → waiting_for_approval
    let st = state(SuspensionSeq::FIRST);
    assert!(store.suspend(&first.lease, &st, &[]).await.unwrap());
    assert!(!store.suspend(&first.lease, &st, &[]).await.unwrap());
    assert!(!store.renew(&first.lease, TTL).await.unwrap());

    // waiting_for_approval → queued/resume
    let decision = accept(run, &st);
    assert_eq!(
        store.record_decision(&decision).await.unwrap(),
        DecisionRecord::Recorded(DecisionOutcome::Accepted)
    );
    let rival = accept(run, &st);
    assert_eq!(
        store.record_decision(&rival).await.unwrap(),
        DecisionRecord::TransitionLost
    );

    // queued/resume → running, then handed back and claimed again
    let resume = claim(&store, run, "worker-b").await;
    assert_eq!(resume.segment, SegmentKind::Resume);
    assert_eq!(resume.suspension_seq, Some(SuspensionSeq::FIRST));
    assert_eq!(resume.lease.epoch.get(), 2);
    assert!(store
        .requeue_segment(&resume.lease, Duration::ZERO)
        .await
        .unwrap());
    assert!(!store
        .requeue_segment(&resume.lease, Duration::ZERO)
        .await
        .unwrap());
    let resume = claim(&store, run, "worker-b").await;
    assert_eq!(resume.segment, SegmentKind::Resume);
    assert_eq!(resume.lease.epoch.get(), 3);

    // running → completed
    let done = Settlement::completed(TerminationReason::Completed, RunCounters::default());
    assert!(store.settle(&resume.lease, &done).await.unwrap());
    assert!(!store.settle(&resume.lease, &done).await.unwrap());
    assert!(
        !store.cancel(run).await.unwrap(),
        "a terminal run cannot be cancelled"
    );

    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Completed);
    assert_eq!(row.termination_reason, Some(TerminationReason::Completed));
    assert_eq!(row.lease_owner, None);

    // any non-terminal → cancelled
    let other = queued(&store).await;
    assert!(store.cancel(other).await.unwrap());
    assert!(!store.cancel(other).await.unwrap());
    assert!(store.claim(other, "worker-a", TTL).await.unwrap().is_none());
    let row = store.run(other).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Cancelled);
    assert_eq!(row.termination_reason, Some(TerminationReason::Cancelled));
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn each_transition_raced_against_a_rival_has_exactly_one_winner(pool: PgPool) {
    let store = store(pool.clone());

    // suspend against settle, by the same lease
    let (_, lease) = running(&store).await;
    let (s1, s2, l1, l2) = (store.clone(), store.clone(), lease.clone(), lease);
    let (a, b) = race(
        async move {
            s1.suspend(&l1, &state(SuspensionSeq::FIRST), &[])
                .await
                .unwrap()
        },
        async move {
            let failed = Settlement::failed(TerminationReason::ProviderFailed, None, None);
            s2.settle(&l2, &failed).await.unwrap()
        },
    )
    .await;
    assert!(a ^ b, "suspend {a}, settle {b}");

    // a heartbeat against the reaper's requeue of the expired lease
    let (run, lease) = running(&store).await;
    expire_lease(&pool, run).await;
    let expired = store.expired_leases(10).await.unwrap();
    let seen = expired.into_iter().find(|e| e.run_id == run).unwrap();
    let (s1, s2) = (store.clone(), store.clone());
    let (a, b) = race(
        async move { s1.renew(&lease, TTL).await.unwrap() },
        async move { s2.reaper_requeue(&seen, 3, Duration::ZERO).await.unwrap() },
    )
    .await;
    assert!(a ^ b, "renew {a}, requeue {b}");

    // two decisions on one turn
    let (run, st) = waiting(&store).await;
    let (s1, s2, d1, d2) = (
        store.clone(),
        store.clone(),
        accept(run, &st),
        accept(run, &st),
    );
    let (a, b) = race(
        async move { s1.record_decision(&d1).await.unwrap() },
        async move { s2.record_decision(&d2).await.unwrap() },
    )
    .await;
    let recorded = [a, b]
        .iter()
        .filter(|r| **r == DecisionRecord::Recorded(DecisionOutcome::Accepted))
        .count();
    let lost = [a, b]
        .iter()
        .filter(|r| **r == DecisionRecord::TransitionLost)
        .count();
    assert_eq!((recorded, lost), (1, 1), "{a:?} {b:?}");
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM run_decisions WHERE run_id = $1",
            run
        )
        .await,
        1
    );

    // a decision against the approval deadline
    let (run, st) = waiting(&store).await;
    sqlx::query("UPDATE runs SET approval_deadline = now() - interval '1 second' WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    let (s1, s2, d1) = (store.clone(), store.clone(), accept(run, &st));
    let (a, b) = race(
        async move { s1.record_decision(&d1).await.unwrap() },
        async move { s2.expire_approval(run, SuspensionSeq::FIRST).await.unwrap() },
    )
    .await;
    let decided = a == DecisionRecord::Recorded(DecisionOutcome::Accepted);
    assert!(decided ^ b, "decision {a:?}, expiry {b}");

    // two operators cancelling
    let run = queued(&store).await;
    let (s1, s2) = (store.clone(), store.clone());
    let (a, b) = race(async move { s1.cancel(run).await.unwrap() }, async move {
        s2.cancel(run).await.unwrap()
    })
    .await;
    assert!(a ^ b, "cancel {a}, cancel {b}");
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_segment_holding_an_old_epoch_can_neither_suspend_settle_renew_nor_write(pool: PgPool) {
    let store = store(pool.clone());
    let (run, old) = running(&store).await;
    expire_lease(&pool, run).await;
    let seen = store.expired_leases(10).await.unwrap().remove(0);
    assert!(store
        .reaper_requeue(&seen, 3, Duration::ZERO)
        .await
        .unwrap());
    // The same owner name claims again: only the epoch tells the two segments apart.
    let current = claim(&store, run, &old.owner).await.lease;
    assert_eq!(current.epoch.get(), old.epoch.get() + 1);
    let before = store.run(run).await.unwrap().unwrap();

    assert!(!store.renew(&old, TTL).await.unwrap());
    assert!(!store
        .suspend(&old, &state(SuspensionSeq::FIRST), &[])
        .await
        .unwrap());
    let failed = Settlement::failed(TerminationReason::ProviderFailed, None, None);
    assert!(!store.settle(&old, &failed).await.unwrap());
    assert!(!store.requeue_segment(&old, Duration::ZERO).await.unwrap());
    let token = old.fence_token(SuspensionSeq::FIRST, CallIndex::new(0));
    assert!(matches!(
        store.fenced_write(&token).await,
        Err(StoreError::FenceLost)
    ));

    assert_eq!(
        store.run(run).await.unwrap().unwrap(),
        before,
        "nothing changed"
    );
    assert_eq!(event_count(&pool, run).await, 0);
    assert_eq!(journal_count(&pool, run).await, 0);
    // The current holder is unaffected.
    assert!(store.renew(&current, TTL).await.unwrap());
    let write = store
        .fenced_write(&current.fence_token(SuspensionSeq::FIRST, CallIndex::new(0)))
        .await
        .unwrap();
    write
        .commit(
            "update_page_metadata",
            countersign_core::Effect::IdempotentWrite,
            &ToolOutput::ok("done"),
        )
        .await
        .unwrap();
    assert_eq!(journal_count(&pool, run).await, 1);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_duplicate_request_id_returns_the_existing_run_and_another_request_under_it_conflicts(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let request = new_run("first prompt");
    let first = store.create_run(&request).await.unwrap();
    assert!(first.created);
    let second = store.create_run(&request).await.unwrap();
    assert_eq!(second.run_id, first.run_id);
    assert!(!second.created);

    // The same id with another prompt, or other inputs, creates nothing and names no run.
    let prompt = countersign_store::NewRun {
        prompt: "another prompt".into(),
        ..request.clone()
    };
    let inputs = countersign_store::NewRun {
        inputs: Some(serde_json::Map::from_iter([("page".into(), 12.into())])),
        ..request.clone()
    };
    for other in [prompt, inputs] {
        assert!(matches!(
            store.create_run(&other).await,
            Err(countersign_store::StoreError::IdempotencyConflict)
        ));
    }
    assert_eq!(
        store.load_prompt(first.run_id).await.unwrap(),
        "first prompt"
    );

    // Another producer's same id is another request.
    let theirs = store
        .create_run_for("portal", &request, None)
        .await
        .unwrap();
    assert!(theirs.created);
    assert_ne!(theirs.run_id, first.run_id);
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE request_id = $1")
        .bind(request.request_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 2);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_run_is_claimed_only_once_available_by_the_database_clock(pool: PgPool) {
    let store = store(pool.clone());
    let run = queued(&store).await;
    sqlx::query("UPDATE runs SET available_at = now() + interval '1 hour' WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    assert!(store.claim(run, "worker-a", TTL).await.unwrap().is_none());
    assert!(store
        .claim_next("worker-a", TTL, 8)
        .await
        .unwrap()
        .is_empty());
    sqlx::query("UPDATE runs SET available_at = now() - interval '1 second' WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    let mut claimed = store.claim_next("worker-a", TTL, 8).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let claimed = claimed.pop().unwrap().unwrap();
    assert_eq!(claimed.lease.run_id, run);
    let ttl_ms: f64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM lease_expires_at - updated_at) * 1000)::float8 FROM runs WHERE id = $1",
    )
    .bind(run.as_uuid())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(ttl_ms, TTL.as_millis() as f64, "expiry is now() + ttl");
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn the_poll_claims_up_to_its_limit_the_runs_available_longest_and_skips_a_held_row(
    pool: PgPool,
) {
    let store = store(pool.clone());
    let mut runs = Vec::new();
    for _ in 0..4 {
        runs.push(queued(&store).await);
    }
    // Available in the order 3, 0, 1, 2; the oldest is held by another transaction.
    for (run, ago) in runs.iter().zip([30, 20, 10, 40]) {
        sqlx::query(
            "UPDATE runs SET available_at = now() - $2 * interval '1 second' WHERE id = $1",
        )
        .bind(run.as_uuid())
        .bind(f64::from(ago))
        .execute(&pool)
        .await
        .unwrap();
    }
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(runs[3].as_uuid())
        .execute(&mut *holder)
        .await
        .unwrap();
    let ids = |claims: Vec<Result<countersign_store::Claim, StoreError>>| -> Vec<RunId> {
        let mut ids: Vec<_> = claims
            .into_iter()
            .map(|c| c.unwrap().lease.run_id)
            .collect();
        ids.sort();
        ids
    };
    let first = ids(store.claim_next("worker-a", TTL, 2).await.unwrap());
    let mut expected = vec![runs[0], runs[1]];
    expected.sort();
    assert_eq!(first, expected, "the two available longest that are free");
    let second = ids(store.claim_next("worker-a", TTL, 2).await.unwrap());
    assert_eq!(second, [runs[2]], "then the one left free");
    holder.commit().await.unwrap();
    assert_eq!(
        ids(store.claim_next("worker-a", TTL, 2).await.unwrap()),
        [runs[3]]
    );
    assert!(store
        .claim_next("worker-a", TTL, 2)
        .await
        .unwrap()
        .is_empty());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn suspend_stores_the_sealed_state_digest_tool_names_and_the_agent_deadline(pool: PgPool) {
    let store = store(pool.clone());
    store
        .upsert_agent(&countersign_store::AgentConfig {
            name: "seo-assistant".into(),
            active: true,
            model: serde_json::json!({"provider": "scripted"}),
            policy: Default::default(),
            max_iterations: 8,
            max_tool_calls_per_turn: countersign_core::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            four_eyes: false,
            approval_deadline: Duration::from_secs(3600),
        })
        .await
        .unwrap();
    let (run, st) = waiting(&store).await;
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::WaitingForApproval);
    assert_eq!(row.suspension_seq, Some(SuspensionSeq::FIRST));
    assert_eq!(row.turn_digest, Some(st.turn_digest()));
    assert_eq!(row.pending_tools, vec!["update_page_metadata".to_string()]);
    assert_eq!(row.lease_owner, None);
    assert_eq!(row.lease_expires_at, None);
    assert_eq!(
        row.counters,
        RunCounters {
            iterations: 2,
            prompt_tokens: 120,
            completion_tokens: 30
        }
    );
    let deadline_s: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM approval_deadline - updated_at)::float8 FROM runs WHERE id = $1",
    )
    .bind(run.as_uuid())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(deadline_s, 3600.0);

    let raw: Vec<u8> = sqlx::query_scalar("SELECT state FROM runs WHERE id = $1")
        .bind(run.as_uuid())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        !raw.windows(9).any(|w| w == b"New words"),
        "the state is not stored in clear"
    );
    let opened = store.load_state(run).await.unwrap();
    let back = countersign_core::SuspendedRunState::from_bytes(&opened).unwrap();
    assert_eq!(back, st);

    let inbox = store
        .inbox("", &Approves::Every, None, 10, None)
        .await
        .unwrap()
        .runs;
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].run_id, run);
    assert_eq!(inbox[0].turn_digest, st.turn_digest());
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn the_schema_refuses_an_error_message_where_a_code_belongs(pool: PgPool) {
    let store = store(pool.clone());
    let (run, lease) = running(&store).await;
    let leaky = Settlement::failed(
        TerminationReason::ProviderFailed,
        Some("connection refused: password=hunter2"),
        None,
    );
    let err = store.settle(&lease, &leaky).await.unwrap_err();
    assert_eq!(err.code(), "database_constraint_violation");
    assert_eq!(
        store.run(run).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let coded = Settlement::failed(
        TerminationReason::ProviderFailed,
        Some("provider_timeout"),
        Some(RunCounters {
            iterations: 3,
            ..Default::default()
        }),
    );
    assert!(store.settle(&lease, &coded).await.unwrap());
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Failed);
    assert_eq!(row.error_code.as_deref(), Some("provider_timeout"));
    assert_eq!(row.counters.iterations, 3);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn every_termination_reason_and_decision_outcome_fits_the_schema(pool: PgPool) {
    let store = store(pool.clone());
    let reasons = [
        TerminationReason::Completed,
        TerminationReason::MaxIterations,
        TerminationReason::ApprovalDenied,
        TerminationReason::ApprovalExpired,
        TerminationReason::ProviderFailed,
        TerminationReason::StateUnreadable,
        TerminationReason::RetriesExhausted,
        TerminationReason::NotRetryable,
        TerminationReason::SuspendFailed,
        TerminationReason::Cancelled,
    ];
    for reason in reasons {
        let (run, lease) = running(&store).await;
        let settlement = Settlement::failed(reason, Some("some_code"), None);
        assert!(store.settle(&lease, &settlement).await.unwrap());
        let row = store.run(run).await.unwrap().unwrap();
        assert_eq!(row.termination_reason, Some(reason));
        assert_eq!(reason.as_str().parse(), Ok(reason));
    }

    // `accepted` last: it releases the run the refusals leave waiting.
    let outcomes = <DecisionOutcome as strum::VariantArray>::VARIANTS
        .iter()
        .copied();
    assert_eq!(outcomes.clone().last(), Some(DecisionOutcome::Accepted));
    let (run, st) = waiting(&store).await;
    for outcome in outcomes {
        let d = NewDecision {
            outcome,
            ..accept(run, &st)
        };
        assert_eq!(
            store.record_decision(&d).await.unwrap(),
            DecisionRecord::Recorded(outcome)
        );
        assert_eq!(
            store.decision_outcome(d.message.decision_id).await.unwrap(),
            Some(outcome)
        );
        assert_eq!(outcome.as_str().parse(), Ok(outcome));
    }

    // A status that does not end a run is not a settlement.
    let (run, lease) = running(&store).await;
    let bogus = Settlement {
        status: RunStatus::Queued,
        ..Settlement::completed(TerminationReason::Completed, RunCounters::default())
    };
    assert!(!store.settle(&lease, &bogus).await.unwrap());
    assert_eq!(
        store.run(run).await.unwrap().unwrap().status,
        RunStatus::Running
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_run_request_s_inputs_are_sealed_with_its_prompt_and_read_back(pool: PgPool) {
    let store = store(pool.clone());
    let request = countersign_store::NewRun {
        inputs: serde_json::json!({"page": 12, "file": "hero.jpg"})
            .as_object()
            .cloned(),
        ..new_run("Attach the file to the page.")
    };
    let run = store.create_run(&request).await.unwrap().run_id;
    let loaded = store.load_request(run).await.unwrap();
    assert_eq!(loaded.prompt, "Attach the file to the page.");
    assert_eq!(loaded.inputs, request.inputs);
    let sealed: Vec<u8> = sqlx::query_scalar("SELECT request FROM runs WHERE id = $1")
        .bind(run.as_uuid())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&sealed).contains("hero.jpg"),
        "the inputs are sealed"
    );
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_hand_written_statement_that_breaks_a_run_invariant_is_refused_naming_it(pool: PgPool) {
    let store = store(pool.clone());
    let run = queued(&store).await;
    let before = store.run(run).await.unwrap().unwrap();
    let breaks = [
        ("status = 'paused'", "runs_status_check"),
        ("error_code = 'Provider timed out'", "runs_error_code_check"),
        ("status = 'running'", "runs_lease_iff_running"),
        ("status = 'completed'", "runs_reason_iff_terminal"),
        (
            "status = 'waiting_for_approval', suspension_seq = 1",
            "runs_waiting_has_state",
        ),
        ("segment = 'resume'", "runs_resume_has_state"),
        ("sent_seq = 1", "runs_sent_call"),
        ("iterations = -1", "runs_iterations_check"),
    ];
    for (set, invariant) in breaks {
        let refused = sqlx::query(&format!("UPDATE runs SET {set} WHERE id = $1"))
            .bind(run.as_uuid())
            .execute(&pool)
            .await
            .expect_err(set);
        let refused = refused.as_database_error().expect("a database error");
        assert_eq!(refused.code().as_deref(), Some("23514"), "{set}");
        assert_eq!(refused.constraint(), Some(invariant), "{set}");
    }
    assert_eq!(store.run(run).await.unwrap().unwrap(), before);

    // A change that keeps every invariant passes, and the constraint covers the rows already
    // there.
    sqlx::query("UPDATE runs SET iterations = 1, error_code = 'provider_timeout' WHERE id = $1")
        .bind(run.as_uuid())
        .execute(&pool)
        .await
        .expect("a valid row");
    let validated: bool = sqlx::query_scalar(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'runs_lifecycle'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(validated);
}

#[sqlx::test(migrator = "countersign_store::MIGRATOR")]
async fn a_run_that_stops_running_gives_up_its_lease_whoever_stops_it_and_keeps_its_sent_call(
    pool: PgPool,
) {
    let store = store(pool.clone());
    // The store's own transitions: a requeue by the worker, a cancellation.
    let (run, lease) = running(&store).await;
    assert!(store
        .renew_stamping(&lease, TTL, Some(sent(Effect::NonIdempotentWrite)))
        .await
        .unwrap());
    assert!(store.requeue_segment(&lease, Duration::ZERO).await.unwrap());
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Queued);
    assert_eq!(
        (row.lease_owner, row.pending_effect),
        (None, None),
        "requeued"
    );
    let sent_call: Option<i32> = sqlx::query_scalar("SELECT sent_call FROM runs WHERE id = $1")
        .bind(run.as_uuid())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(sent_call.is_some(), "the call in doubt stays named");

    let (run, lease) = running(&store).await;
    assert!(store
        .renew_stamping(&lease, TTL, Some(sent(Effect::IdempotentWrite)))
        .await
        .unwrap());
    assert!(store.cancel(run).await.unwrap());
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Cancelled);
    assert_eq!(
        (row.lease_owner, row.pending_effect),
        (None, None),
        "cancelled"
    );

    // A colleague's plain UPDATE that names only the status: the lease goes with it, where
    // before such a statement was refused by `runs_lease_iff_running`.
    let (run, lease) = running(&store).await;
    assert!(store
        .renew_stamping(&lease, TTL, Some(sent(Effect::NonIdempotentWrite)))
        .await
        .unwrap());
    sqlx::query(
        "UPDATE runs SET status = 'failed', termination_reason = 'cancelled' WHERE id = $1",
    )
    .bind(run.as_uuid())
    .execute(&pool)
    .await
    .expect("a run stopped by hand keeps every invariant");
    let row = store.run(run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Failed);
    assert_eq!(
        (row.lease_owner, row.lease_expires_at, row.pending_effect),
        (None, None, None),
        "stopped by hand"
    );
    assert!(
        !store.renew(&lease, TTL).await.unwrap(),
        "the old holder's lease is gone"
    );
}
