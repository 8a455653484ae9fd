//! The preview contract, checked: what `countersign tools check` holds a tool's preview to,
//! as a function a tool's own tests call.
//!
//! A preview that changes by itself bounces every approval of its tool, because the comparator
//! holds the lines an approver was shown against a fresh preview just before the call runs; a
//! preview longer than the bounds is cut before it is stored, so the approver sees less than
//! the tool said. [`check_preview`] previews a call twice and [`judge`]s the two: the same line
//! for line, neither failed, interrupted nor panicked, and every line within the bounds
//! ([`bound_lines`]).

use std::sync::Arc;

use countersign_core::preview::{
    bound_lines, collapse_whitespace, failed_at_suspend_line, panicked_at_suspend_line,
    EMPTY_PREVIEW_LINE, MAX_LINES, MAX_LINE_CHARS,
};
use countersign_core::{Principal, Tool, ToolError};
use serde_json::Value;

/// Previews the call of `first` with `args` as `user`, then of `second` (the same tool, built
/// again — e.g. on a connection of its own — or `first` again), and judges the two.
pub async fn check_preview(
    first: Arc<dyn Tool>,
    second: Arc<dyn Tool>,
    user: &Principal,
    args: &Value,
) -> PreviewCheck {
    let previews = [
        attempt(first, user, args).await,
        attempt(second, user, args).await,
    ];
    judge(&previews)
}

/// What one preview of a check gave.
#[derive(Debug)]
pub enum Attempt {
    Lines(Vec<String>),
    Failed(ToolError),
    Panicked,
}

/// Previews in a task of its own, so a panic is reported as the suspension reports it.
pub async fn attempt(tool: Arc<dyn Tool>, user: &Principal, args: &Value) -> Attempt {
    let (user, args) = (user.clone(), args.clone());
    let task = tokio::spawn(async move {
        match tool.previewer() {
            Some(previewer) => previewer.preview(&user, &args).await,
            None => Err(ToolError::failed(
                "no_preview",
                "the tool offers no preview",
            )),
        }
    });
    match task.await {
        Ok(Ok(lines)) => Attempt::Lines(lines),
        Ok(Err(e)) => Attempt::Failed(e),
        Err(_) => Attempt::Panicked,
    }
}

/// The report of a check: what to print, and what makes it fail.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PreviewCheck {
    /// The report, line by line, as `countersign tools check` prints it.
    pub lines: Vec<String>,
    /// Why the preview is not fit to be countersigned; empty when it is.
    pub problems: Vec<String>,
    /// The bounds change what the card shows of a preview.
    pub reshaped: bool,
}

impl PreviewCheck {
    /// Whether the preview is fit: deterministic, within the bounds, not failed.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    /// Panics with the whole report unless the preview is fit: for a tool's own tests.
    #[track_caller]
    pub fn assert_fit(&self) {
        assert!(
            self.passed(),
            "the preview is not fit to be countersigned: {}\n{}",
            self.problems.join("; "),
            self.lines.join("\n")
        );
    }
}

/// Judges two previews of the same call as `countersign tools check` does: the same line for
/// line, neither failed nor panicked, and within the bounds the suspension applies.
pub fn judge(previews: &[Attempt; 2]) -> PreviewCheck {
    let mut report = PreviewCheck::default();
    for (n, attempt) in previews.iter().enumerate().map(|(i, a)| (i + 1, a)) {
        let same_as_first = n == 2
            && matches!((&previews[0], attempt), (Attempt::Lines(a), Attempt::Lines(b)) if a == b);
        read_attempt(&mut report, n, attempt, same_as_first);
    }
    compare(&mut report, previews);
    let mut checked: Vec<&Vec<String>> = Vec::new();
    for (n, attempt) in previews.iter().enumerate().map(|(i, a)| (i + 1, a)) {
        if let Attempt::Lines(lines) = attempt {
            if checked.contains(&lines) {
                continue;
            }
            checked.push(lines);
            bounds(&mut report, n, lines);
        }
    }
    report
}

/// What preview `n` says, and its problem if it failed or panicked; a second preview the same
/// as the first is said to be so rather than shown again.
fn read_attempt(report: &mut PreviewCheck, n: usize, attempt: &Attempt, same_as_first: bool) {
    match attempt {
        Attempt::Lines(_) if same_as_first => {
            report
                .lines
                .push("preview 2: the same, line for line".to_owned());
        }
        Attempt::Lines(lines) => {
            report
                .lines
                .push(format!("preview {n}: {} line(s)", lines.len()));
            report.lines.extend(numbered(lines));
        }
        Attempt::Failed(e) if e.interrupts() => {
            report.lines.push(format!(
                "preview {n}: interrupted ({}): the infrastructure under the tool failed; a segment would stop and be retried, with no card",
                e.code()
            ));
            report
                .problems
                .push(format!("preview {n} was interrupted ({})", e.code()));
        }
        Attempt::Failed(e) => {
            report.lines.push(format!(
                "preview {n}: failed ({}); the card would show: {}",
                e.code(),
                failed_at_suspend_line(e.code())
            ));
            report
                .problems
                .push(format!("preview {n} failed ({})", e.code()));
        }
        Attempt::Panicked => {
            report.lines.push(format!(
                "preview {n}: panicked; the card would show: {}",
                panicked_at_suspend_line()
            ));
            report.problems.push(format!("preview {n} panicked"));
        }
    }
}

/// The two previews against each other: lines that differ, or failures that differ.
fn compare(report: &mut PreviewCheck, previews: &[Attempt; 2]) {
    match previews {
        [Attempt::Lines(a), Attempt::Lines(b)] if a != b => {
            report
                .lines
                .push("the previews differ, line by line (- preview 1, + preview 2):".to_owned());
            report.lines.extend(differences(a, b));
            report.problems.push(
                "the two previews differ: every approval of this call would bounce".to_owned(),
            );
        }
        [Attempt::Failed(a), Attempt::Failed(b)] if a.code() != b.code() => {
            report
                .problems
                .push("the two previews failed differently".to_owned());
        }
        _ => {}
    }
}

/// `  N  line` for each line.
pub fn numbered(lines: &[String]) -> impl Iterator<Item = String> + '_ {
    lines
        .iter()
        .enumerate()
        .map(|(i, line)| format!("  {:>2}  {line}", i + 1))
}

/// The lines at which `a` and `b` differ: each as it reads in `a` (`-`) and in `b` (`+`).
fn differences(a: &[String], b: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..a.len().max(b.len()) {
        let (left, right) = (a.get(i), b.get(i));
        if left == right {
            continue;
        }
        let shown = |line: Option<&String>| line.map_or("(no line)".to_owned(), Clone::clone);
        out.push(format!("  - {:>2}  {}", i + 1, shown(left)));
        out.push(format!("  + {:>2}  {}", i + 1, shown(right)));
    }
    out
}

/// Holds preview `n`'s lines to the bounds the suspension applies ([`bound_lines`]): more lines
/// than [`MAX_LINES`], a line longer than [`MAX_LINE_CHARS`] or nothing left are problems;
/// whitespace the card collapses and blank lines it drops are noted.
fn bounds(report: &mut PreviewCheck, n: usize, lines: &[String]) {
    let bounded = bound_lines(lines);
    let mut notes = Vec::new();
    let mut over = Vec::new();
    for (i, line) in lines.iter().enumerate().map(|(i, l)| (i + 1, l)) {
        let collapsed = collapse_whitespace(line);
        let chars = collapsed.chars().count();
        if collapsed.is_empty() {
            notes.push(format!("line {i} is blank: the card drops it"));
        } else if collapsed != *line {
            notes.push(format!(
                "line {i} has whitespace the card collapses to single spaces"
            ));
        }
        if chars > MAX_LINE_CHARS {
            over.push(format!(
                "line {i} has {chars} characters, over {MAX_LINE_CHARS}: the card cuts it"
            ));
        }
    }
    let kept = lines
        .iter()
        .filter(|l| !collapse_whitespace(l).is_empty())
        .count();
    if kept > MAX_LINES {
        over.push(format!(
            "{kept} lines, over {MAX_LINES}: the card shows the first {MAX_LINES} and says how many more"
        ));
    }
    if bounded.is_empty() {
        over.push(format!(
            "no line is left: the card would show \"{EMPTY_PREVIEW_LINE}\" and count the preview failed"
        ));
    }
    if over.is_empty() && notes.is_empty() {
        report.lines.push(format!(
            "bounds of preview {n}: every line fits (at most {MAX_LINES} lines of at most {MAX_LINE_CHARS} characters)"
        ));
        return;
    }
    for line in notes.iter().chain(&over) {
        report.lines.push(format!("bounds of preview {n}: {line}"));
    }
    if !bounded.is_empty() && bounded != lines {
        report.reshaped = true;
        report
            .lines
            .push(format!("preview {n} as the card shows it:"));
        report.lines.extend(numbered(&bounded));
    }
    report.problems.extend(
        over.into_iter()
            .map(|o| format!("preview {n} exceeds the bounds ({o})")),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(lines: &[&str]) -> Attempt {
        Attempt::Lines(lines.iter().map(|l| (*l).to_owned()).collect())
    }

    #[test]
    fn two_equal_previews_within_the_bounds_pass() {
        let r = judge(&[
            lines(&["page \"home\"", "a → b"]),
            lines(&["page \"home\"", "a → b"]),
        ]);
        assert!(r.passed() && !r.reshaped, "{r:?}");
        assert!(r
            .lines
            .contains(&"preview 2: the same, line for line".to_owned()));
    }

    #[test]
    fn previews_that_differ_are_reported_line_by_line_and_fail() {
        let r = judge(&[
            lines(&["page \"home\"", "at 10:00:01"]),
            lines(&["page \"home\"", "at 10:00:02", "extra"]),
        ]);
        assert_eq!(r.problems.len(), 1, "{r:?}");
        let diff: Vec<&str> = r
            .lines
            .iter()
            .skip_while(|l| !l.starts_with("the previews differ"))
            .skip(1)
            .take(4)
            .map(String::as_str)
            .collect();
        assert_eq!(
            diff,
            vec![
                "  -  2  at 10:00:01",
                "  +  2  at 10:00:02",
                "  -  3  (no line)",
                "  +  3  extra"
            ]
        );
    }

    #[test]
    fn lines_over_the_bounds_fail_and_whitespace_the_card_collapses_is_only_noted() {
        let long = "x".repeat(MAX_LINE_CHARS + 1);
        let r = judge(&[lines(&[&long]), lines(&[&long])]);
        assert_eq!(r.problems.len(), 1, "{r:?}");
        assert!(r.problems[0].contains("501 characters"), "{r:?}");

        let many: Vec<String> = (0..=MAX_LINES).map(|i| format!("line {i}")).collect();
        let r = judge(&[Attempt::Lines(many.clone()), Attempt::Lines(many)]);
        assert!(r.problems[0].contains("21 lines, over 20"), "{r:?}");

        let r = judge(&[lines(&["a  b", " "]), lines(&["a  b", " "])]);
        assert!(r.passed() && r.reshaped, "{r:?}");
        assert!(r.lines.iter().any(|l| l.contains("collapses")), "{r:?}");
        assert!(
            r.lines.iter().any(|l| l.contains("line 2 is blank")),
            "{r:?}"
        );
        assert!(
            r.lines.iter().any(|l| l == "   1  a b"),
            "shown as the card shows it: {r:?}"
        );

        let r = judge(&[lines(&[]), lines(&[])]);
        assert!(r.problems[0].contains("no line is left"), "{r:?}");
    }

    #[test]
    #[should_panic(expected = "the two previews differ")]
    fn assert_fit_fails_a_tools_test_with_the_problem() {
        judge(&[lines(&["a"]), lines(&["b"])]).assert_fit();
    }

    #[test]
    fn a_failed_or_panicked_preview_fails_the_check_with_its_code() {
        let r = judge(&[
            Attempt::Failed(ToolError::failed("remote_timeout", "slow")),
            Attempt::Panicked,
        ]);
        assert_eq!(
            r.problems,
            vec!["preview 1 failed (remote_timeout)", "preview 2 panicked"]
        );
        assert!(r.lines[0].contains(&failed_at_suspend_line("remote_timeout")));
        let r = judge(&[
            Attempt::Failed(ToolError::unavailable("database_error", "gone")),
            lines(&["x"]),
        ]);
        assert_eq!(
            r.problems,
            vec!["preview 1 was interrupted (database_error)"]
        );
    }
}
