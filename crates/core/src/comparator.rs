//! The binding of an approval to what its approver was shown (ADR-184).
//!
//! Before any call of an approved turn executes, every pending call whose stored preview was
//! shown (present, not failed) is previewed again, bounded the same way, and compared line for
//! line. Only what was displayed counts, so the lines ARE the binding: no hash, no record
//! timestamp. Not compared, and carried over unchanged: calls with no preview (nothing was
//! shown), previews that failed at suspend (the approver was told they decided blind), and
//! calls no longer offered (they will not run).
//!
//! `bind` is the one comparison: the approval pipeline ([`crate::approval`]) gathers what every
//! shown preview reads now — a local writer's plan in the turn's sequence, under its locks; a
//! fresh preview from a resource outside the store, after the calls before it on that resource —
//! and hands them here together.

use crate::ids::CallIndex;
use crate::preview::{self, Attempt, CallPreview, PREVIEW_VANISHED_LINE};

/// What a shown preview reads now.
#[derive(Debug)]
pub(crate) enum Current {
    /// A preview taken now; `alone` when it could not take the calls before it on its resource
    /// into account (see [`crate::CallPreview::alone`]).
    Attempt { attempt: Attempt, alone: bool },
    /// The tool no longer offers a preview.
    Vanished,
}

impl Current {
    pub(crate) fn of(attempt: Attempt) -> Current {
        Current::Attempt {
            attempt,
            alone: false,
        }
    }
}

/// The binding of a turn: the preview to store for each stored one, in call order, given what
/// it reads now (`None`: not compared, carried over unchanged), and the indexes whose preview
/// moved, in order. Nothing moved: the turn may execute.
pub(crate) fn bind<'a>(
    current: impl IntoIterator<Item = (&'a CallPreview, Option<Current>)>,
) -> (Vec<CallPreview>, Vec<CallIndex>) {
    let mut previews = Vec::new();
    let mut moved = Vec::new();
    for (stored, now) in current {
        let now = judge(stored, now);
        if !now.reads_as(stored) {
            moved.push(stored.index);
        }
        previews.push(now);
    }
    moved.sort();
    previews.sort_by_key(|p| p.index);
    (previews, moved)
}

/// The preview to store for `stored` given what it reads now.
fn judge(stored: &CallPreview, now: Option<Current>) -> CallPreview {
    match now {
        None => stored.clone(),
        Some(Current::Vanished) => failed(stored, PREVIEW_VANISHED_LINE.to_owned()),
        Some(Current::Attempt {
            attempt: Attempt::Lines(lines, forms, full),
            alone,
        }) => CallPreview {
            lines,
            forms,
            alone,
            full,
            ..stored.clone()
        },
        Some(Current::Attempt { attempt, .. }) => {
            tracing::warn!(
                tool = %stored.tool,
                index = %stored.index,
                code = attempt.code(),
                "re-preview failed at resume"
            );
            failed(stored, preview::failed_at_resume_line(attempt.code()))
        }
    }
}

fn failed(stored: &CallPreview, line: String) -> CallPreview {
    CallPreview {
        lines: vec![line],
        failed: true,
        forms: vec![],
        alone: false,
        full: vec![],
        ..stored.clone()
    }
}
