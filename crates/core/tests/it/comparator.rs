//! The comparison an approved turn makes before anything writes: what binds and what does not.

use countersign_core::agent_loop;
use countersign_core::{CallIndex, SuspendedRunState, Tool};
use countersign_core::{Decision, Outcome};
use serde_json::json;

use crate::support::{final_answer, turn, Fixture, PreviewMode, TestModel};

fn model() -> TestModel {
    TestModel::new(vec![
        turn(&[
            ("append", json!({"key": "k1", "item": "x"})),
            ("append2", json!({"key": "k2", "item": "y"})),
        ]),
        final_answer("done"),
    ])
}

async fn suspended(f: &Fixture) -> SuspendedRunState {
    match agent_loop::start(f.segment(&model(), "t"), "go", None).await {
        Outcome::Suspended { state, .. } => state,
        other => panic!("{other:?}"),
    }
}

/// The approval of `state`'s turn, run through the loop.
async fn approved(f: &Fixture, state: SuspendedRunState) -> Outcome {
    let decision = Decision {
        approved: true,
        comment: None,
        ..Decision::default()
    };
    agent_loop::resume(f.segment(&model(), "t2"), state, &decision).await
}

#[tokio::test]
async fn equal_previews_bind_as_unchanged_and_the_turn_runs() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    assert!(matches!(
        approved(&f, state).await,
        Outcome::Completed { .. }
    ));
    assert_eq!(f.world.executed_tools(), vec!["append", "append2"]);
}

#[tokio::test]
async fn a_change_to_state_no_preview_showed_does_not_bind() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    f.world.set("unrelated", &["a", "b"]);
    assert!(matches!(
        approved(&f, state).await,
        Outcome::Completed { .. }
    ));
}

#[tokio::test]
async fn moved_previews_report_every_moved_index_and_keep_the_unmoved_ones() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    f.world.set("k1", &["a"]);
    f.world.set("k2", &["b"]);
    let Outcome::Suspended { state: both, .. } = approved(&f, state.clone()).await else {
        panic!("both previews moved");
    };
    assert_eq!(
        both.stale_call_indexes,
        vec![CallIndex::new(0), CallIndex::new(1)]
    );
    assert_eq!(
        both.call_previews[0].lines[0],
        "list k1: 1 item(s) → 2, appended last"
    );
    assert_eq!(
        both.call_previews[1].lines[0],
        "list k2: 1 item(s) → 2, appended last"
    );

    f.world.set("k2", &[]);
    let Outcome::Suspended { state: one, .. } = approved(&f, state.clone()).await else {
        panic!("the first preview moved");
    };
    assert_eq!(one.stale_call_indexes, vec![CallIndex::new(0)]);
    assert_eq!(
        one.call_previews[1], state.call_previews[1],
        "an unmoved preview is carried as it was"
    );
    assert!(f.world.executed_tools().is_empty(), "nothing was written");
}

#[tokio::test]
async fn a_panicking_re_preview_counts_as_moved() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    f.append2.set_mode(PreviewMode::Panics);
    let Outcome::Suspended { state, .. } = approved(&f, state).await else {
        panic!("the panicking preview moved");
    };
    assert_eq!(state.stale_call_indexes, vec![CallIndex::new(1)]);
    assert!(state.call_previews[1].failed);
    assert!(state.call_previews[1].lines[0].contains("(panic)"));
    assert!(f.world.executed_tools().is_empty());
}

#[tokio::test]
async fn a_change_anywhere_in_a_long_preview_binds_though_the_card_shows_twenty_lines() {
    let f = Fixture::new();
    f.append.set_mode(PreviewMode::Long);
    let items: Vec<String> = (0..3000).map(|i| format!("v{i}")).collect();
    let refs: Vec<&str> = items.iter().map(String::as_str).collect();
    f.world.set("k1", &refs);
    let state = suspended(&f).await;
    let shown = &state.call_previews[0];
    assert_eq!(
        shown.lines.len(),
        21,
        "twenty lines and the count of the rest"
    );
    assert_eq!(shown.lines[20], "… and 2981 more line(s), not shown.");
    assert_eq!(shown.full.len(), 3001, "the whole preview is kept");

    // A line far past the twenty the card shows changes: the approval bounces.
    let mut changed = refs.clone();
    changed[2999] = "changed";
    f.world.set("k1", &changed);
    let Outcome::Suspended { state: moved, .. } = approved(&f, state.clone()).await else {
        panic!("a change past the shown lines bounces");
    };
    assert_eq!(moved.stale_call_indexes, vec![CallIndex::new(0)]);
    assert_eq!(
        moved.call_previews[0].lines, shown.lines,
        "the shown lines read the same"
    );
    assert_eq!(moved.call_previews[0].full[3000], "item 2999: changed");

    // So does one more line at the end, which the count of the rest would not show either way.
    let mut grown = refs.clone();
    grown.push("v3000");
    f.world.set("k1", &grown);
    assert!(matches!(
        approved(&f, moved).await,
        Outcome::Suspended { .. }
    ));
    assert!(f.world.executed_tools().is_empty(), "nothing was written");
}

#[tokio::test]
async fn a_preview_longer_than_the_limit_fails_naming_its_code() {
    let f = Fixture::new();
    f.append.set_mode(PreviewMode::Long);
    let long = "x".repeat(1000);
    let items: Vec<&str> = (0..300).map(|_| long.as_str()).collect();
    f.world.set("k1", &items);
    let state = suspended(&f).await;
    assert!(state.call_previews[0].failed);
    assert!(
        state.call_previews[0].lines[0].contains("(preview_too_large)"),
        "{:?}",
        state.call_previews[0].lines
    );
}

#[tokio::test]
async fn a_call_whose_tool_changed_since_its_card_bounces_with_nothing_written() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    *f.append2.revision.lock().unwrap() += 1;
    let Outcome::Suspended { state: card2, .. } = approved(&f, state).await else {
        panic!("the changed tool bounces the card");
    };
    assert_eq!(card2.stale_call_indexes, vec![CallIndex::new(1)]);
    assert!(f.world.executed_tools().is_empty(), "nothing was written");
    assert_eq!(
        card2.identity_of(CallIndex::new(1)),
        Some(f.append2.identity().as_str()),
        "the new card is made with the tool as it is now"
    );
    assert!(matches!(
        approved(&f, card2).await,
        Outcome::Completed { .. }
    ));
}
