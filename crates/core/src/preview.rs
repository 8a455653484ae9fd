//! Previews: producing them at suspend, bounding them before they are stored, and the lines
//! that stand in for a preview that failed.
//!
//! A preview is model-triggered output stored in an encrypted column and re-read on every
//! resume, so it is bounded before it is persisted. A failed preview is a line, never a blank:
//! an approver must be able to tell "this tool has no preview" from "this preview broke".
//! Only the error's code reaches the line; the error itself goes to the log.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::Poll;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::errors::HookError;
use crate::ids::CallIndex;
use crate::tool::{EarlierCall, Principal, ToolError, ToolPreview};

/// At most this many lines of a preview are stored; one more line says how many were cut.
pub const MAX_LINES: usize = 20;
/// Each stored line is cut to this many characters.
pub const MAX_LINE_CHARS: usize = 500;
/// Values quoted in a preview line are excerpted to this many characters.
pub const EXCERPT_CHARS: usize = 120;
/// The most text a whole preview may hold, in bytes of its lines once whitespace is collapsed:
/// a preview that says more fails (`preview_too_large`). The approval binds to the whole of it,
/// not only to the lines the card shows.
pub const MAX_PREVIEW_BYTES: usize = 256 * 1024;

/// The stored preview of one pending call.
///
/// `lines` are what an approval binds to and what the comparator compares; `forms` are only
/// another way of showing some of them (see [`LineForm`]), never compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallPreview {
    pub index: CallIndex,
    pub tool: String,
    pub lines: Vec<String>,
    pub failed: bool,
    /// For each line, the structured form the tool gave with it, if any; empty when it gave
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forms: Vec<Option<LineForm>>,
    /// The call comes after other calls of its turn on the same resource, and its tool could
    /// not be told about them: the lines are its preview as if it ran alone, and the card says
    /// so. Never compared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alone: bool,
    /// The whole preview, each line's whitespace collapsed, when the bounds cut `lines` (more
    /// than [`MAX_LINES`] lines, or a line of more than [`MAX_LINE_CHARS`] characters); empty
    /// when `lines` is all of it. Compared with `lines`: the approval binds to the whole preview.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub full: Vec<String>,
}

impl CallPreview {
    /// Whether `other` reads as this one: the same lines and the same whole preview, failed or
    /// not. Forms do not count.
    pub fn reads_as(&self, other: &CallPreview) -> bool {
        self.lines == other.lines && self.full == other.full && self.failed == other.failed
    }

    /// The whole preview: [`full`](Self::full) when the bounds cut the lines, else the lines.
    pub fn whole(&self) -> &[String] {
        if self.full.is_empty() {
            &self.lines
        } else {
            &self.full
        }
    }

    /// The form of line `i`, if the tool gave one.
    pub fn form(&self, i: usize) -> Option<&LineForm> {
        self.forms.get(i).and_then(Option::as_ref)
    }
}

/// What a line of a preview says, structured, for a card to render in its place — made from
/// the same plan as the line's text, so the two cannot drift. Bounded as the lines are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LineForm {
    /// A value replaced by another: a card may show their word diff.
    Change { before: String, after: String },
    /// An ordered list into which the call adds the item at `added`.
    List { items: Vec<String>, added: usize },
}

impl LineForm {
    /// The form with each value cut to [`MAX_LINE_CHARS`] and a list to [`MAX_LINES`] items
    /// around the added one; `None` when a list's `added` is not one of its items.
    fn bounded(self) -> Option<LineForm> {
        let cut = |s: String| cut_chars(&s, MAX_LINE_CHARS);
        match self {
            LineForm::Change { before, after } => Some(LineForm::Change {
                before: cut(before),
                after: cut(after),
            }),
            LineForm::List { items, added } if added < items.len() => {
                let skip = (added + 1).saturating_sub(MAX_LINES);
                Some(LineForm::List {
                    items: items
                        .into_iter()
                        .skip(skip)
                        .take(MAX_LINES)
                        .map(cut)
                        .collect(),
                    added: added - skip,
                })
            }
            LineForm::List { .. } => None,
        }
    }
}

/// One line of a preview as a tool makes it: its text and, optionally, its structured form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewLine {
    pub text: String,
    pub form: Option<LineForm>,
}

impl PreviewLine {
    pub fn with_form(text: impl Into<String>, form: LineForm) -> PreviewLine {
        PreviewLine {
            text: text.into(),
            form: Some(form),
        }
    }
}

impl From<String> for PreviewLine {
    fn from(text: String) -> PreviewLine {
        PreviewLine { text, form: None }
    }
}

impl From<&str> for PreviewLine {
    fn from(text: &str) -> PreviewLine {
        PreviewLine::from(text.to_owned())
    }
}

/// The texts of `lines`.
pub fn texts(lines: &[PreviewLine]) -> Vec<String> {
    lines.iter().map(|l| l.text.clone()).collect()
}

/// The line stored when a preview fails at suspend.
pub fn failed_at_suspend_line(code: &str) -> String {
    format!("The preview for this call failed ({code}), so it shows nothing about what the call would do.")
}

/// The line stored when a preview panics at suspend.
pub fn panicked_at_suspend_line() -> String {
    failed_at_suspend_line(Attempt::Panic.code())
}

/// The line stored when a preview returns nothing.
pub const EMPTY_PREVIEW_LINE: &str = "The tool produced no preview for this call.";

/// The line stored when a re-preview fails at resume where something was shown.
pub fn failed_at_resume_line(code: &str) -> String {
    format!(
        "The preview for this call failed ({code}), so what it would do now cannot be compared with what you were shown."
    )
}

/// The line stored when the tool no longer offers a preview at resume.
pub const PREVIEW_VANISHED_LINE: &str =
    "This tool is no longer available, so what the call would do now cannot be compared with what you were shown.";

/// Bounds preview lines for storage: whitespace runs collapse to one space, lines are trimmed,
/// blank lines dropped, each line cut to [`MAX_LINE_CHARS`] characters, and only the first
/// [`MAX_LINES`] kept, followed by `… and N more line(s), not shown.` when more were given.
pub fn bound_lines<S: AsRef<str>>(lines: &[S]) -> Vec<String> {
    let cleaned: Vec<String> = lines
        .iter()
        .map(|l| collapse_whitespace(l.as_ref()))
        .filter(|l| !l.is_empty())
        .map(|l| cut_chars(&l, MAX_LINE_CHARS).trim_end().to_owned())
        .collect();
    let extra = cleaned.len().saturating_sub(MAX_LINES);
    let mut out: Vec<String> = cleaned.into_iter().take(MAX_LINES).collect();
    if extra > 0 {
        out.push(format!("… and {extra} more line(s), not shown."));
    }
    out
}

/// [`bound_lines`] of a tool's lines, each line's form kept with it (and bounded) through the
/// dropping of empty lines; the forms are empty when the tool gave none.
pub fn bound_preview(lines: Vec<PreviewLine>) -> (Vec<String>, Vec<Option<LineForm>>) {
    let kept: Vec<PreviewLine> = lines
        .into_iter()
        .filter(|l| !collapse_whitespace(&l.text).is_empty())
        .collect();
    let bounded = bound_lines(&texts(&kept));
    let forms: Vec<Option<LineForm>> = kept
        .into_iter()
        .take(MAX_LINES)
        .map(|l| l.form.and_then(LineForm::bounded))
        .collect();
    if forms.iter().all(Option::is_none) {
        return (bounded, vec![]);
    }
    let mut forms = forms;
    forms.resize(bounded.len(), None);
    (bounded, forms)
}

/// The whole of a tool's lines as the binding holds them: whitespace runs collapsed to one
/// space, lines trimmed, blank lines dropped — nothing cut.
pub fn whole_lines<S: AsRef<str>>(lines: &[S]) -> Vec<String> {
    lines
        .iter()
        .map(|l| collapse_whitespace(l.as_ref()))
        .filter(|l| !l.is_empty())
        .collect()
}

/// One space for every run of whitespace, none at either end.
pub fn collapse_whitespace(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn cut_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((byte, _)) => s[..byte].to_owned(),
        None => s.to_owned(),
    }
}

/// A value as a preview shows it: `(empty)`, or quoted and excerpted to [`EXCERPT_CHARS`]
/// characters with `…` when longer. Whitespace is collapsed so a value stays on its line.
pub fn quote_excerpt(value: &str) -> String {
    let v = collapse_whitespace(value);
    if v.is_empty() {
        return "(empty)".to_owned();
    }
    if v.chars().count() > EXCERPT_CHARS {
        format!("\"{}…\"", cut_chars(&v, EXCERPT_CHARS))
    } else {
        format!("\"{v}\"")
    }
}

/// What became of one attempt to preview a call.
#[derive(Debug, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Attempt {
    /// The bounded lines, their forms (empty when the tool gave none), and the whole preview
    /// when the bounds cut the lines (empty otherwise).
    #[strum(serialize = "ok")]
    Lines(Vec<String>, Vec<Option<LineForm>>, Vec<String>),
    #[strum(serialize = "empty_preview")]
    Empty,
    Error(ToolError),
    Panic,
}

impl Attempt {
    /// The attempt of a plan's raw lines: bounded, and `Empty` when nothing is left.
    pub(crate) fn of_lines(lines: Vec<PreviewLine>) -> Attempt {
        let whole = whole_lines(&texts(&lines));
        let bytes: usize = whole.iter().map(|l| l.len() + 1).sum();
        if bytes > MAX_PREVIEW_BYTES {
            return Attempt::Error(ToolError::failed(
                "preview_too_large",
                format!("{bytes} bytes of preview, more than {MAX_PREVIEW_BYTES}"),
            ));
        }
        let (bounded, forms) = bound_preview(lines);
        if bounded.is_empty() {
            return Attempt::Empty;
        }
        let full = if whole == bounded { Vec::new() } else { whole };
        Attempt::Lines(bounded, forms, full)
    }

    /// The attempt of a plan that failed: its code, and nothing else of it.
    pub(crate) fn failed(e: &ToolError) -> Attempt {
        Attempt::Error(ToolError::failed(e.code(), "the plan failed"))
    }

    /// The interruption a transient failure stands for: it says nothing about the call, so it
    /// must never become a failed preview line. A persistent one is the preview's failure.
    pub(crate) fn interruption(&self) -> Result<(), HookError> {
        match self {
            Attempt::Error(e) if e.interrupts() => Err(HookError::from_tool(e)),
            _ => Ok(()),
        }
    }

    pub(crate) fn code(&self) -> &'static str {
        match self {
            Attempt::Error(e) => e.code(),
            other => other.into(),
        }
    }
}

/// Runs a preview, turning a panic into [`Attempt::Panic`] and bounding the lines.
pub(crate) async fn attempt(
    previewer: &dyn ToolPreview,
    user: &Principal,
    args: &Value,
) -> Attempt {
    attempt_of(previewer.preview_with_forms(user, args)).await
}

/// Runs a preview of a call after `before`, the calls of its turn on the same resource that
/// come first ([`ToolPreview::preview_after`]), as [`attempt`] does.
pub(crate) async fn attempt_after(
    previewer: &dyn ToolPreview,
    user: &Principal,
    args: &Value,
    before: &[EarlierCall],
) -> Attempt {
    attempt_of(previewer.preview_after(user, args, before)).await
}

async fn attempt_of(preview: BoxFuture<'_, Result<Vec<PreviewLine>, ToolError>>) -> Attempt {
    match catch_unwind(preview).await {
        Ok(Ok(lines)) => Attempt::of_lines(lines),
        Ok(Err(e)) => Attempt::Error(e),
        Err(_) => Attempt::Panic,
    }
}

/// The preview stored at suspend for one call.
pub(crate) fn at_suspend(index: CallIndex, tool: &str, attempt: Attempt) -> CallPreview {
    let (lines, failed, forms, full) = match attempt {
        Attempt::Lines(lines, forms, full) => (lines, false, forms, full),
        Attempt::Empty => {
            tracing::warn!(tool, %index, "preview returned no lines");
            (vec![EMPTY_PREVIEW_LINE.to_owned()], true, vec![], vec![])
        }
        Attempt::Error(e) => {
            tracing::warn!(tool, %index, code = e.code(), error = %e, "preview failed at suspend");
            (vec![failed_at_suspend_line(e.code())], true, vec![], vec![])
        }
        Attempt::Panic => {
            tracing::error!(tool, %index, "preview panicked at suspend");
            (vec![panicked_at_suspend_line()], true, vec![], vec![])
        }
    };
    CallPreview {
        index,
        tool: tool.to_owned(),
        lines,
        failed,
        forms,
        alone: false,
        full,
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub(crate) async fn catch_unwind<T>(mut fut: BoxFuture<'_, T>) -> Result<T, Box<dyn Any + Send>> {
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await
}

/// A preview that gave different lines for the same state.
#[derive(Debug, thiserror::Error)]
#[error("preview is not deterministic: {first:?} then {second:?}")]
pub struct NonDeterministic {
    pub first: Vec<String>,
    pub second: Vec<String>,
}

/// Calls `preview` twice on the same state and reports whether the lines are equal. A tool
/// whose preview is not deterministic stales every approval it is part of; run this in the
/// tool's tests.
pub async fn check_deterministic(
    previewer: &dyn ToolPreview,
    user: &Principal,
    args: &Value,
) -> Result<Vec<String>, NonDeterministic> {
    let first = previewer
        .preview(user, args)
        .await
        .map_err(|e| NonDeterministic {
            first: vec![format!("error: {}", e.code())],
            second: vec![],
        })?;
    let second = previewer
        .preview(user, args)
        .await
        .map_err(|e| NonDeterministic {
            first: first.clone(),
            second: vec![format!("error: {}", e.code())],
        })?;
    if first == second {
        Ok(first)
    } else {
        Err(NonDeterministic { first, second })
    }
}

/// [`check_deterministic`] as an assertion, for tests.
pub async fn assert_deterministic(previewer: &dyn ToolPreview, user: &Principal, args: &Value) {
    if let Err(e) = check_deterministic(previewer, user, args).await {
        panic!("{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preview_attempt_has_the_code_it_always_had() {
        let attempts = [
            (Attempt::Lines(vec!["a".into()], vec![None], vec![]), "ok"),
            (Attempt::Empty, "empty_preview"),
            (
                Attempt::Error(ToolError::failed("row_gone", "d")),
                "row_gone",
            ),
            (Attempt::Error(ToolError::Moved), "preview_moved"),
            (Attempt::Panic, "panic"),
        ];
        for (attempt, code) in attempts {
            assert_eq!(attempt.code(), code, "{attempt:?}");
        }
    }

    #[test]
    fn lines_past_twenty_are_cut_and_counted() {
        let lines: Vec<String> = (0..23).map(|i| format!("line {i}")).collect();
        let b = bound_lines(&lines);
        assert_eq!(b.len(), 21);
        assert_eq!(b[19], "line 19");
        assert_eq!(b[20], "… and 3 more line(s), not shown.");
    }

    #[test]
    fn twenty_lines_are_kept_without_a_marker() {
        let lines: Vec<String> = (0..20).map(|i| format!("line {i}")).collect();
        assert_eq!(bound_lines(&lines), lines);
    }

    #[test]
    fn whitespace_collapses_and_lines_are_trimmed() {
        assert_eq!(
            bound_lines(&["  a \t\n b  ", "   "]),
            vec!["a b".to_owned()]
        );
    }

    #[test]
    fn a_line_is_cut_to_500_characters() {
        let long = "é".repeat(700);
        let b = bound_lines(&[long]);
        assert_eq!(b[0].chars().count(), 500);
    }

    #[test]
    fn an_excerpt_is_quoted_cut_at_120_and_marked() {
        assert_eq!(quote_excerpt(""), "(empty)");
        assert_eq!(quote_excerpt("  "), "(empty)");
        assert_eq!(quote_excerpt("Home"), "\"Home\"");
        let long = "x".repeat(121);
        assert_eq!(quote_excerpt(&long), format!("\"{}…\"", "x".repeat(120)));
        assert_eq!(
            quote_excerpt(&"x".repeat(120)),
            format!("\"{}\"", "x".repeat(120))
        );
    }

    fn change(before: &str, after: &str) -> LineForm {
        LineForm::Change {
            before: before.into(),
            after: after.into(),
        }
    }

    #[test]
    fn a_lines_form_stays_with_it_when_empty_lines_are_dropped_and_is_bounded() {
        let lines = vec![
            PreviewLine::from("   "),
            PreviewLine::from("Page [12]"),
            PreviewLine::with_form("description: a → b", change(&"é".repeat(700), "b")),
        ];
        let (texts, forms) = bound_preview(lines);
        assert_eq!(texts, vec!["Page [12]", "description: a → b"]);
        assert_eq!(forms.len(), 2);
        assert_eq!(forms[0], None);
        let Some(LineForm::Change { before, .. }) = &forms[1] else {
            panic!("{forms:?}")
        };
        assert_eq!(before.chars().count(), MAX_LINE_CHARS);
    }

    #[test]
    fn lines_without_forms_store_no_forms_and_a_list_keeps_its_added_item_in_bounds() {
        let (_, forms) = bound_preview(vec![PreviewLine::from("a"), PreviewLine::from("b")]);
        assert!(forms.is_empty());
        let items: Vec<String> = (0..30).map(|i| format!("[{i}] f{i}.jpg")).collect();
        let (_, forms) = bound_preview(vec![PreviewLine::with_form(
            "field image: 29 reference(s) → 30, appended last",
            LineForm::List { items, added: 29 },
        )]);
        let Some(LineForm::List { items, added }) = &forms[0] else {
            panic!("{forms:?}")
        };
        assert_eq!(items.len(), MAX_LINES);
        assert_eq!(items[*added], "[29] f29.jpg");
        let (_, forms) = bound_preview(vec![PreviewLine::with_form(
            "x",
            LineForm::List {
                items: vec!["a".into()],
                added: 3,
            },
        )]);
        assert!(
            forms.is_empty(),
            "a list whose added item is missing is no form"
        );
    }

    #[test]
    fn two_previews_read_alike_whatever_their_forms() {
        let preview = |forms| CallPreview {
            index: CallIndex::new(0),
            tool: "t".into(),
            lines: vec!["a → b".into()],
            failed: false,
            forms,
            alone: false,
            full: vec![],
        };
        assert!(preview(vec![]).reads_as(&preview(vec![Some(change("a", "b"))])));
        let mut other = preview(vec![]);
        other.lines[0] = "a → c".into();
        assert!(!preview(vec![]).reads_as(&other));
    }
}
