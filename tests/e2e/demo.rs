use std::process::Command;

use countersign_e2e::{binary, database_url};

#[test]
fn the_demo_bounces_a_moved_preview_and_writes_only_after_the_second_approval() {
    let database = format!("countersign_e2e_demo_{}", std::process::id());
    let out = Command::new(binary("countersign"))
        .args(["demo", "--database", &database])
        .env("DATABASE_URL", database_url())
        .env_remove("COUNTERSIGN_KEYS")
        .env_remove("COUNTERSIGN_KEY_FILE")
        .output()
        .expect("countersign starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");

    for expected in [
        "→ waiting for approval, suspension 1",
        "field image: 2 reference(s) → 3, appended last",
        "Moved call(s): [1]",
        "field image: 3 reference(s) → 4, appended last",
        "→ decision refused: stale_turn",
        "→ run completed: completed",
        "teaser images, in order: hero.jpg, team.jpg, logo.svg, bicycle.png",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    // The description was written once, after the approval of the current card.
    assert!(
        stdout.contains("page 12 description: \"Bicycles for every road"),
        "{stdout}"
    );
}
