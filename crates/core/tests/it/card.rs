//! The approval card, and its read gate.

use countersign_core::agent_loop;
use countersign_core::card::{build_card, CardPreview, WITHHELD_NOTICE};
use countersign_core::Outcome;
use countersign_core::{Principal, SuspendedRunState, ToolRegistry};
use serde_json::json;

use crate::support::{final_answer, turn, Fixture, PreviewMode, TestModel};

async fn suspended_turn(f: &Fixture) -> SuspendedRunState {
    let model = TestModel::new(vec![
        turn(&[
            ("read", json!({"key": "teaser"})),
            ("append", json!({"key": "teaser", "item": "hero.jpg"})),
            ("append2", json!({"key": "vault", "item": "key.pem"})),
        ]),
        final_answer("done"),
    ]);
    match agent_loop::start(f.segment(&model, "2026-11-30T10:00:00Z"), "attach", None).await {
        Outcome::Suspended { state, .. } => state,
        other => panic!("expected a suspension, got {other:?}"),
    }
}

#[tokio::test]
async fn a_card_shows_each_call_with_its_preview_and_binding() {
    let f = Fixture::new();
    f.world.set("teaser", &["a.jpg", "b.jpg"]);
    f.world.secret_keys.lock().unwrap().push("vault".into());
    let mut state = suspended_turn(&f).await;
    state.stale_call_indexes = vec![countersign_core::CallIndex::new(1)];

    let card = build_card(
        &state,
        &f.registry,
        Some(&Principal::new("approver", false)),
    )
    .await;
    // Keys sorted: the order a JSON map keeps is no part of the card.
    insta::with_settings!({sort_maps => true}, {
        insta::assert_json_snapshot!(card);
    });
}

#[tokio::test]
async fn a_failed_preview_is_shown_as_deciding_without_one() {
    let f = Fixture::new();
    f.append.set_mode(PreviewMode::Panics);
    let state = suspended_turn(&f).await;
    let card = build_card(&state, &f.registry, Some(&Principal::new("admin", true))).await;
    match &card.calls[1].preview {
        CardPreview::Failed { notice, .. } => {
            assert_eq!(*notice, "No preview — you are deciding without one")
        }
        other => panic!("expected a failed preview, got {other:?}"),
    }
    assert!(card.moved_notice.is_none());
}

#[tokio::test]
async fn the_read_gate_fails_closed_without_a_viewer_or_a_registered_previewing_tool() {
    let f = Fixture::new();
    let state = suspended_turn(&f).await;
    let withheld = CardPreview::Withheld {
        notice: WITHHELD_NOTICE,
    };

    let no_viewer = build_card(&state, &f.registry, None).await;
    assert_eq!(no_viewer.calls[1].preview, withheld);

    let unregistered = build_card(
        &state,
        &ToolRegistry::new(),
        Some(&Principal::new("admin", true)),
    )
    .await;
    assert_eq!(unregistered.calls[1].preview, withheld);

    f.append.set_mode(PreviewMode::None);
    let no_contract = build_card(&state, &f.registry, Some(&Principal::new("admin", true))).await;
    assert_eq!(no_contract.calls[1].preview, withheld);

    let admin = Principal::new("admin", true);
    f.append.set_mode(PreviewMode::Real);
    let shown = build_card(&state, &f.registry, Some(&admin)).await;
    assert!(matches!(shown.calls[1].preview, CardPreview::Shown { .. }));
    assert_eq!(
        shown.calls[0].preview,
        CardPreview::None,
        "a read-only tool has no preview"
    );
    assert_eq!(shown.turn_digest, state.turn_digest());
}
