//! The comparator on its own: what binds and what does not.

use countersign_core::agent_loop::{self, Outcome};
use countersign_core::comparator::{compare, Binding};
use countersign_core::{CallIndex, SuspendedRunState};
use serde_json::json;

use crate::support::{final_answer, turn, Fixture, PreviewMode, TestModel};

async fn suspended(f: &Fixture) -> SuspendedRunState {
    let model = TestModel::new(vec![
        turn(&[
            ("append", json!({"key": "k1", "item": "x"})),
            ("append2", json!({"key": "k2", "item": "y"})),
        ]),
        final_answer("done"),
    ]);
    match agent_loop::start(f.segment(&model, "t"), "go", None).await {
        Outcome::Suspended { state, .. } => state,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn equal_previews_bind_as_unchanged() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    let offered = f.agent.policy.offered(&f.registry, &f.user);
    assert_eq!(
        compare(&state, &offered, &f.user)
            .await
            .expect("no infrastructure failure"),
        Binding::Unchanged
    );
}

#[tokio::test]
async fn a_change_to_state_no_preview_showed_does_not_bind() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    f.world.set("unrelated", &["a", "b"]);
    let offered = f.agent.policy.offered(&f.registry, &f.user);
    assert_eq!(
        compare(&state, &offered, &f.user)
            .await
            .expect("no infrastructure failure"),
        Binding::Unchanged
    );
}

#[tokio::test]
async fn moved_previews_report_every_moved_index_and_keep_the_unmoved_ones() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    f.world.set("k1", &["a"]);
    f.world.set("k2", &["b"]);
    let offered = f.agent.policy.offered(&f.registry, &f.user);
    match compare(&state, &offered, &f.user)
        .await
        .expect("no infrastructure failure")
    {
        Binding::Moved { previews, moved } => {
            assert_eq!(moved, vec![CallIndex::new(0), CallIndex::new(1)]);
            assert_eq!(
                previews[0].lines[0],
                "list k1: 1 item(s) → 2, appended last"
            );
            assert_eq!(
                previews[1].lines[0],
                "list k2: 1 item(s) → 2, appended last"
            );
        }
        other => panic!("{other:?}"),
    }

    f.world.set("k2", &[]);
    match compare(&state, &offered, &f.user)
        .await
        .expect("no infrastructure failure")
    {
        Binding::Moved { previews, moved } => {
            assert_eq!(moved, vec![CallIndex::new(0)]);
            assert_eq!(
                previews[1], state.call_previews[1],
                "an unmoved preview is carried as it was"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_panicking_re_preview_counts_as_moved() {
    let f = Fixture::new();
    let state = suspended(&f).await;
    f.append2.set_mode(PreviewMode::Panics);
    let offered = f.agent.policy.offered(&f.registry, &f.user);
    match compare(&state, &offered, &f.user)
        .await
        .expect("no infrastructure failure")
    {
        Binding::Moved { previews, moved } => {
            assert_eq!(moved, vec![CallIndex::new(1)]);
            assert!(previews[1].failed);
            assert!(previews[1].lines[0].contains("(panic)"));
        }
        other => panic!("{other:?}"),
    }
}
