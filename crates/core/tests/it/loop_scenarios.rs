//! The tool loop end to end, with in-memory tools.

use std::sync::atomic::Ordering;

use countersign_core::agent_loop;
use countersign_core::preview::{
    failed_at_resume_line, failed_at_suspend_line, EMPTY_PREVIEW_LINE, PREVIEW_VANISHED_LINE,
};
use countersign_core::{CallIndex, Role, SuspendedRunState, ToolOutput};
use countersign_core::{Decision, Interruption, Outcome, TerminationReason};
use serde_json::json;

use crate::support::{final_answer, turn, Fixture, PreviewMode, TestModel};

const T0: &str = "2026-11-30T10:00:00Z";
const T1: &str = "2026-11-30T11:00:00Z";

fn approve() -> Decision {
    Decision {
        approved: true,
        comment: None,
        ..Decision::default()
    }
}

fn suspended(outcome: Outcome) -> (SuspendedRunState, Vec<(CallIndex, String)>) {
    match outcome {
        Outcome::Suspended { state, moved } => (state, moved),
        other => panic!("expected a suspension, got {other:?}"),
    }
}

fn two_appends_model() -> TestModel {
    TestModel::new(vec![
        turn(&[
            ("append", json!({"key": "teaser", "item": "hero.jpg"})),
            ("append2", json!({"key": "gallery", "item": "logo.png"})),
        ]),
        final_answer("Attached both."),
    ])
}

#[tokio::test]
async fn a_mixed_read_and_write_turn_suspends_before_the_read_runs() {
    let f = Fixture::new();
    f.world.set("teaser", &["a.jpg", "b.jpg"]);
    let model = TestModel::new(vec![turn(&[
        ("read", json!({"key": "teaser"})),
        ("append", json!({"key": "teaser", "item": "hero.jpg"})),
    ])]);
    let (state, moved) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);

    assert!(
        f.world.executed_tools().is_empty(),
        "no call of the turn may run before approval"
    );
    assert!(moved.is_empty());
    assert_eq!(state.pending_calls.len(), 2);
    assert_eq!(state.suspension_seq.get(), 1);
    assert_eq!(state.captured_at, T0);
    // Only the writer has a preview; the reader has no preview contract.
    assert_eq!(state.call_previews.len(), 1);
    assert_eq!(state.call_previews[0].index, CallIndex::new(1));
    assert_eq!(
        state.call_previews[0].lines,
        vec![
            "list teaser: 2 item(s) → 3, appended last",
            "item: \"hero.jpg\""
        ]
    );
    assert!(!state.call_previews[0].failed);
}

#[tokio::test]
async fn a_turn_of_reads_runs_and_the_loop_continues_until_the_model_answers() {
    let f = Fixture::new();
    f.world.set("teaser", &["a.jpg"]);
    let model = TestModel::new(vec![
        turn(&[("read", json!({"key": "teaser"}))]),
        final_answer("It holds a.jpg."),
    ]);
    match agent_loop::start(f.segment(&model, T0), "what is in teaser?", None).await {
        Outcome::Completed {
            reason,
            transcript,
            iterations,
            tokens,
        } => {
            assert_eq!(reason, TerminationReason::Completed);
            assert_eq!(iterations, 2);
            assert_eq!(tokens.prompt, 10);
            let result = &transcript[2];
            assert_eq!(
                (result.role, result.content.as_str()),
                (Role::Tool, "a.jpg")
            );
        }
        other => panic!("expected completion, got {other:?}"),
    }
    assert_eq!(f.world.executed_tools(), vec!["read"]);
}

#[tokio::test]
async fn writers_disabled_for_the_agent_are_neither_offered_nor_run() {
    let mut f = Fixture::new();
    f.agent.policy.enabled_tools.clear();
    let model = TestModel::new(vec![
        turn(&[("append", json!({"key": "teaser", "item": "x"}))]),
        final_answer("Could not."),
    ]);
    let outcome = agent_loop::start(f.segment(&model, T0), "attach", None).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(model.offered.lock().unwrap()[0], vec!["read"]);
    assert!(f.world.executed_tools().is_empty());
    assert_eq!(
        model.last_transcript()[2].content,
        "Error: tool \"append\" is not available."
    );
}

#[tokio::test]
async fn a_failing_preview_still_suspends_with_one_line_naming_only_the_code() {
    for (mode, line) in [
        (
            PreviewMode::Errors,
            failed_at_suspend_line("database_error"),
        ),
        (PreviewMode::Panics, failed_at_suspend_line("panic")),
        (PreviewMode::Empty, EMPTY_PREVIEW_LINE.to_owned()),
    ] {
        let f = Fixture::new();
        f.append.set_mode(mode);
        let model = two_appends_model();
        let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
        let p = state
            .preview_of(CallIndex::new(0))
            .expect("a failed preview is stored");
        assert!(p.failed, "{mode:?}");
        assert_eq!(p.lines, vec![line], "{mode:?}");
        assert!(
            !p.lines[0].contains("secret@db"),
            "the error text must not reach the line"
        );
        assert!(!state.preview_of(CallIndex::new(1)).unwrap().failed);
    }
}

#[tokio::test]
async fn an_approval_with_every_preview_unchanged_executes_each_call_once_in_order() {
    let f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);

    let outcome = agent_loop::resume(f.segment(&model, T1), state, &approve()).await;
    assert!(
        matches!(
            outcome,
            Outcome::Completed {
                reason: TerminationReason::Completed,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(f.world.executed_tools(), vec!["append", "append2"]);
    assert_eq!(f.world.get("teaser"), vec!["hero.jpg"]);
    assert_eq!(
        f.hooks.fences.load(Ordering::SeqCst),
        2,
        "every write is fenced"
    );
    assert_eq!(
        f.hooks.journal.lock().unwrap().len(),
        2,
        "every call is journaled"
    );
    let sent = model.last_transcript();
    assert_eq!(sent[2].content, "teaser now has 1 item(s)");
    assert_eq!(sent[3].content, "gallery now has 1 item(s)");
}

#[tokio::test]
async fn a_moved_preview_executes_nothing_and_re_suspends_with_the_moved_index() {
    let f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    let digest = state.turn_digest();

    // Someone else appends to the gallery between the card and the approval.
    f.world.set("gallery", &["other.png"]);
    let (next, moved) =
        suspended(agent_loop::resume(f.segment(&model, T1), state, &approve()).await);

    assert!(
        f.world.executed_tools().is_empty(),
        "no call of the turn may run"
    );
    assert_eq!(f.world.get("teaser"), Vec::<String>::new());
    assert_eq!(moved, vec![(CallIndex::new(1), "append2".to_owned())]);
    assert_eq!(next.stale_call_indexes, vec![CallIndex::new(1)]);
    assert_eq!(next.suspension_seq.get(), 2);
    assert_eq!(next.captured_at, T1);
    assert_eq!(
        next.turn_digest(),
        digest,
        "the calls, and so the digest, are unchanged"
    );
    assert_eq!(
        next.preview_of(CallIndex::new(1)).unwrap().lines[0],
        "list gallery: 1 item(s) → 2, appended last"
    );
    assert!(
        next.call_previews
            .iter()
            .all(|p| !p.lines.iter().any(|l| l.contains("moved"))),
        "the moved marker is a field, never a preview line"
    );

    // The approver decides again on the current card, and now the turn executes.
    let outcome = agent_loop::resume(f.segment(&model, T1), next, &approve()).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(f.world.get("gallery"), vec!["other.png", "logo.png"]);
}

#[tokio::test]
async fn a_re_preview_that_fails_where_something_was_shown_counts_as_moved() {
    let f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    f.append.set_mode(PreviewMode::Errors);
    let (next, moved) =
        suspended(agent_loop::resume(f.segment(&model, T1), state, &approve()).await);
    assert_eq!(moved, vec![(CallIndex::new(0), "append".to_owned())]);
    let p = next.preview_of(CallIndex::new(0)).unwrap();
    assert_eq!(p.lines, vec![failed_at_resume_line("database_error")]);
    assert!(p.failed);
    assert!(f.world.executed_tools().is_empty());
}

#[tokio::test]
async fn a_tool_that_no_longer_offers_a_preview_counts_as_moved() {
    let f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    f.append2.set_mode(PreviewMode::None);
    let (next, moved) =
        suspended(agent_loop::resume(f.segment(&model, T1), state, &approve()).await);
    assert_eq!(moved, vec![(CallIndex::new(1), "append2".to_owned())]);
    assert_eq!(
        next.preview_of(CallIndex::new(1)).unwrap().lines,
        vec![PREVIEW_VANISHED_LINE]
    );
    assert!(f.world.executed_tools().is_empty());
}

#[tokio::test]
async fn a_preview_that_failed_at_suspend_does_not_bind_the_approval() {
    let f = Fixture::new();
    f.append.set_mode(PreviewMode::Errors);
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    // The preview now works and would read differently from the failure line: not compared.
    f.append.set_mode(PreviewMode::Real);
    let outcome = agent_loop::resume(f.segment(&model, T1), state, &approve()).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(f.world.executed_tools(), vec!["append", "append2"]);
}

#[tokio::test]
async fn a_call_no_longer_offered_is_not_executed_and_its_preview_is_not_compared() {
    let mut f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    f.world.set("gallery", &["moved.png"]);
    f.agent.policy.enabled_tools = vec!["append".into()];

    let outcome = agent_loop::resume(f.segment(&model, T1), state, &approve()).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(f.world.executed_tools(), vec!["append"]);
    assert_eq!(
        model.last_transcript()[3].content,
        "Error: tool \"append2\" is no longer permitted and was not executed."
    );
}

#[tokio::test]
async fn a_retried_resume_skips_journaled_calls_and_reuses_their_results() {
    let f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);

    // A first attempt executed call 0 and journaled it, then its worker died.
    f.world.set("teaser", &["hero.jpg"]);
    f.hooks
        .journal
        .lock()
        .unwrap()
        .insert((1, 0), ToolOutput::ok("teaser now has 1 item(s)"));

    // Call 0's own write moved its preview (0 → 1 items); the comparator must not run again.
    let outcome = agent_loop::resume(f.segment(&model, T1), state, &approve()).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(
        f.world.executed_tools(),
        vec!["append2"],
        "the journaled call is not run again"
    );
    assert_eq!(f.world.get("teaser"), vec!["hero.jpg"]);
    assert_eq!(
        model.last_transcript()[2].content,
        "teaser now has 1 item(s)"
    );
}

#[tokio::test]
async fn a_denial_reaches_the_model_and_the_run_ends_as_approval_denied() {
    let f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    let decision = Decision {
        approved: false,
        comment: Some("Not this image.".into()),
        ..Decision::default()
    };

    match agent_loop::resume(f.segment(&model, T1), state, &decision).await {
        Outcome::Completed { reason, .. } => assert_eq!(reason, TerminationReason::ApprovalDenied),
        other => panic!("expected completion, got {other:?}"),
    }
    assert!(f.world.executed_tools().is_empty());
    let sent = model.last_transcript();
    assert_eq!(
        sent[2].content,
        "Error: tool \"append\" was denied by the operator. Comment: Not this image."
    );
    assert!(sent[2].is_error);
    assert_eq!(
        sent[3].content,
        "Error: tool \"append2\" was denied by the operator. Comment: Not this image."
    );
}

#[tokio::test]
async fn a_lost_lease_stops_the_segment_before_the_write() {
    let f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    f.hooks.lease_lost.store(true, Ordering::SeqCst);
    let outcome = agent_loop::resume(f.segment(&model, T1), state, &approve()).await;
    assert_eq!(outcome, Outcome::Interrupted(Interruption::LeaseLost));
    assert!(f.world.executed_tools().is_empty());
    assert!(f.hooks.journal.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_loop_fails_the_run_at_max_iterations() {
    let mut f = Fixture::new();
    f.agent.max_iterations = 2;
    let read = || turn(&[("read", json!({"key": "k"}))]);
    let model = TestModel::new(vec![read(), read(), read()]);
    match agent_loop::start(f.segment(&model, T0), "loop", None).await {
        Outcome::Failed {
            reason, iterations, ..
        } => {
            assert_eq!(reason, TerminationReason::MaxIterations);
            assert_eq!(iterations, 2);
        }
        other => panic!("expected failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_provider_failure_fails_the_run_with_its_code() {
    let f = Fixture::new();
    let model = TestModel::new(vec![]);
    match agent_loop::start(f.segment(&model, T0), "hello", None).await {
        Outcome::Failed { reason, code, .. } => {
            assert_eq!(reason, TerminationReason::ProviderFailed);
            assert_eq!(code, "provider_invalid_response");
        }
        other => panic!("expected failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_turn_with_arguments_that_are_not_an_object_is_refused_whole() {
    let f = Fixture::new();
    let model = TestModel::new(vec![
        turn(&[("read", json!({"key": "k"})), ("append", json!("teaser"))]),
        final_answer("Sorry."),
    ]);
    let outcome = agent_loop::start(f.segment(&model, T0), "attach", None).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert!(f.world.executed_tools().is_empty());
    assert!(model.last_transcript()[3]
        .content
        .contains("are not a JSON object"));
}

#[tokio::test]
async fn a_suspension_survives_the_round_trip_through_its_stored_form() {
    let f = Fixture::new();
    let model = two_appends_model();
    let (state, _) = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    let stored = SuspendedRunState::from_bytes(&state.to_bytes()).expect("own state reads back");
    assert_eq!(stored, state);
    let outcome = agent_loop::resume(f.segment(&model, T1), stored, &approve()).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
}
