//! The binding of an approval to what its approver was shown (ADR-184).
//!
//! Before any call of an approved turn executes, every pending call whose stored preview was
//! shown (present, not failed) is previewed again, bounded the same way, and compared line for
//! line. Only what was displayed counts, so the lines ARE the binding: no hash, no record
//! timestamp. Not compared, and carried over unchanged: calls with no preview (nothing was
//! shown), previews that failed at suspend (the approver was told they decided blind), and
//! calls no longer offered (they will not run).
//!
//! `bind` is the one comparison: the approval pipeline ([`crate::agent_loop`]) gathers what
//! every shown preview reads now — a local writer's plan under the turn's locks, a fresh
//! preview from a resource outside the store — and hands them here together.

use crate::ids::CallIndex;
use crate::preview::{self, Attempt, CallPreview, PREVIEW_VANISHED_LINE};

/// The result of re-previewing a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// Every shown preview still reads the same: the turn may execute.
    Unchanged,
    /// At least one shown preview moved: nothing may execute. `previews` are the current ones
    /// for the whole turn, `moved` the indexes whose preview changed, in order.
    Moved {
        previews: Vec<CallPreview>,
        moved: Vec<CallIndex>,
    },
}

/// What a shown preview reads now.
#[derive(Debug)]
pub(crate) enum Current {
    Attempt(Attempt),
    /// The tool no longer offers a preview.
    Vanished,
}

/// The binding of a turn, from each stored preview and what it reads now (`None`: not
/// compared, carried over unchanged). The previews of a moved binding are in call order.
pub(crate) fn bind<'a>(
    current: impl IntoIterator<Item = (&'a CallPreview, Option<Current>)>,
) -> Binding {
    let mut previews = Vec::new();
    let mut moved = Vec::new();
    for (stored, now) in current {
        let now = judge(stored, now);
        if !now.reads_as(stored) {
            moved.push(stored.index);
        }
        previews.push(now);
    }
    if moved.is_empty() {
        Binding::Unchanged
    } else {
        moved.sort();
        previews.sort_by_key(|p| p.index);
        Binding::Moved { previews, moved }
    }
}

/// The preview to store for `stored` given what it reads now.
fn judge(stored: &CallPreview, now: Option<Current>) -> CallPreview {
    match now {
        None => stored.clone(),
        Some(Current::Vanished) => failed(stored, PREVIEW_VANISHED_LINE.to_owned()),
        Some(Current::Attempt(Attempt::Lines(lines, forms))) => CallPreview {
            lines,
            forms,
            ..stored.clone()
        },
        Some(Current::Attempt(other)) => {
            tracing::warn!(
                tool = %stored.tool,
                index = %stored.index,
                code = other.code(),
                "re-preview failed at resume"
            );
            failed(stored, preview::failed_at_resume_line(other.code()))
        }
    }
}

fn failed(stored: &CallPreview, line: String) -> CallPreview {
    CallPreview {
        lines: vec![line],
        failed: true,
        forms: vec![],
        ..stored.clone()
    }
}
