//! What the loop refuses at its boundaries: model output it cannot trust, calls that were never
//! on a card, states too large to store, and infrastructure failures posing as tool results.

use countersign_core::agent_loop;
use countersign_core::state::MAX_STATE_BYTES;
use countersign_core::told::{
    not_offered_at_suspend_result, too_many_calls_result, unnamed_call_result,
};
use countersign_core::{Decision, Interruption, Outcome, TerminationReason};
use countersign_core::{Message, Role, SuspendedRunState};
use serde_json::json;

use crate::support::{final_answer, turn, Fixture, PreviewMode, TestModel};

const T0: &str = "2026-11-30T10:00:00Z";

fn tool_results(transcript: &[Message]) -> Vec<String> {
    transcript
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.clone())
        .collect()
}

fn suspended(outcome: Outcome) -> SuspendedRunState {
    match outcome {
        Outcome::Suspended { state, .. } => state,
        other => panic!("expected a suspension, got {other:?}"),
    }
}

#[tokio::test]
async fn a_turn_with_a_call_that_names_no_tool_is_refused_whole_and_nothing_is_stored() {
    let f = Fixture::new();
    let model = TestModel::new(vec![
        turn(&[
            ("", json!({"key": "teaser"})),
            ("append", json!({"key": "teaser", "item": "hero.jpg"})),
        ]),
        final_answer("Sorry."),
    ]);
    let outcome = agent_loop::start(f.segment(&model, T0), "attach", None).await;
    assert!(
        matches!(outcome, Outcome::Completed { .. }),
        "no suspension with a nameless call in it: {outcome:?}"
    );
    assert!(f.world.executed_tools().is_empty());
    assert_eq!(
        tool_results(&model.last_transcript()),
        vec![unnamed_call_result(), unnamed_call_result()]
    );
}

#[tokio::test]
async fn a_turn_with_more_calls_than_the_agent_allows_is_refused_whole() {
    let mut f = Fixture::new();
    f.agent.max_tool_calls_per_turn = 2;
    let calls: Vec<_> = (0..3)
        .map(|i| {
            (
                "append",
                json!({"key": "teaser", "item": format!("{i}.jpg")}),
            )
        })
        .collect();
    let model = TestModel::new(vec![turn(&calls), final_answer("Fewer, then.")]);
    let outcome = agent_loop::start(f.segment(&model, T0), "attach three", None).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert!(f.world.executed_tools().is_empty());
    assert_eq!(
        tool_results(&model.last_transcript()),
        vec![too_many_calls_result("append", 2); 3]
    );
}

#[tokio::test]
async fn a_call_whose_tool_was_not_offered_at_suspend_never_executes() {
    let mut f = Fixture::new();
    // append2 is not offered when the turn suspends ...
    f.agent.policy.enabled_tools = vec!["append".into()];
    let model = TestModel::new(vec![
        turn(&[
            ("append", json!({"key": "teaser", "item": "hero.jpg"})),
            ("append2", json!({"key": "gallery", "item": "logo.png"})),
        ]),
        final_answer("Done."),
    ]);
    let state = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    assert_eq!(state.offered_tools, vec!["append", "read"]);

    // ... and is offered by the time it resumes: it still does not run.
    f.agent.policy.enabled_tools = vec!["append".into(), "append2".into()];
    let decision = Decision {
        approved: true,
        comment: None,
        ..Decision::default()
    };
    let outcome = agent_loop::resume(f.segment(&model, T0), state, &decision).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(f.world.executed_tools(), vec!["append"]);
    assert_eq!(f.world.get("gallery"), Vec::<String>::new());
    assert_eq!(
        tool_results(&model.last_transcript())[1],
        not_offered_at_suspend_result("append2")
    );
}

#[tokio::test]
async fn a_preview_that_cannot_reach_its_store_interrupts_the_suspension_instead_of_failing_the_line(
) {
    let f = Fixture::new();
    f.append.set_mode(PreviewMode::Unavailable);
    let model = TestModel::new(vec![turn(&[(
        "append",
        json!({"key": "teaser", "item": "hero.jpg"}),
    )])]);
    let outcome = agent_loop::start(f.segment(&model, T0), "attach", None).await;
    assert_eq!(
        outcome,
        Outcome::Interrupted(Interruption::Unavailable("database_error"))
    );
}

#[tokio::test]
async fn a_re_preview_that_cannot_reach_its_store_interrupts_the_resume_and_writes_nothing() {
    let f = Fixture::new();
    let model = TestModel::new(vec![
        turn(&[("append", json!({"key": "teaser", "item": "hero.jpg"}))]),
        final_answer("Done."),
    ]);
    let state = suspended(agent_loop::start(f.segment(&model, T0), "attach", None).await);
    f.append.set_mode(PreviewMode::Unavailable);
    let decision = Decision {
        approved: true,
        comment: None,
        ..Decision::default()
    };
    let outcome = agent_loop::resume(f.segment(&model, T0), state, &decision).await;
    assert_eq!(
        outcome,
        Outcome::Interrupted(Interruption::Unavailable("database_error"))
    );
    assert!(f.world.executed_tools().is_empty());
}

#[tokio::test]
async fn a_suspended_state_too_large_to_store_fails_the_run_suspend_failed() {
    let f = Fixture::new();
    let huge = "x".repeat(MAX_STATE_BYTES);
    let model = TestModel::new(vec![turn(&[(
        "append",
        json!({"key": "teaser", "item": huge}),
    )])]);
    match agent_loop::start(f.segment(&model, T0), "attach", None).await {
        Outcome::Failed { reason, code, .. } => {
            assert_eq!(reason, TerminationReason::SuspendFailed);
            assert_eq!(code, "state_too_large");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(f.world.executed_tools().is_empty());
}
