//! The bounds every stored preview obeys, whatever a tool returns.

use countersign_core::preview::{
    bound_lines, failed_at_resume_line, failed_at_suspend_line, MAX_LINES, MAX_LINE_CHARS,
};
use proptest::prelude::*;

fn has_whitespace_run(line: &str) -> bool {
    let chars: Vec<char> = line.chars().collect();
    chars
        .windows(2)
        .any(|w| w[0].is_whitespace() && w[1].is_whitespace())
}

proptest! {
    #[test]
    fn bounded_lines_never_exceed_21_lines_of_500_characters_without_whitespace_runs(
        lines in prop::collection::vec("(?s)[ \t\n\u{a0}a-zé…\u{3000}]{0,700}", 0..40)
    ) {
        let bounded = bound_lines(&lines);
        prop_assert!(bounded.len() <= MAX_LINES + 1);
        for line in &bounded {
            prop_assert!(line.chars().count() <= MAX_LINE_CHARS);
            prop_assert!(!line.is_empty());
            prop_assert!(!has_whitespace_run(line), "whitespace run in {line:?}");
            prop_assert_eq!(line.trim(), line.as_str());
        }
        let kept = lines.iter().filter(|l| !l.trim().is_empty()).count();
        if kept > MAX_LINES {
            let marker = format!("… and {} more line(s), not shown.", kept - MAX_LINES);
            prop_assert_eq!(bounded.last(), Some(&marker));
        } else {
            prop_assert_eq!(bounded.len(), kept);
        }
    }

    #[test]
    fn bounding_is_idempotent(lines in prop::collection::vec("[ a-z\n]{0,600}", 0..20)) {
        let once = bound_lines(&lines);
        prop_assert_eq!(bound_lines(&once), once);
    }
}

#[test]
fn failure_lines_read_as_written() {
    insta::assert_snapshot!(
        [
            failed_at_suspend_line("database_error"),
            countersign_core::preview::EMPTY_PREVIEW_LINE.to_owned(),
            failed_at_resume_line("panic"),
            countersign_core::preview::PREVIEW_VANISHED_LINE.to_owned(),
        ]
        .join("\n"),
        @r"
    The preview for this call failed (database_error), so it shows nothing about what the call would do.
    The tool produced no preview for this call.
    The preview for this call failed (panic), so what it would do now cannot be compared with what you were shown.
    This tool is no longer available, so what the call would do now cannot be compared with what you were shown.
    "
    );
}
