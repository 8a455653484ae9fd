//! The binding of an approval to what its approver was shown (ADR-184).
//!
//! Before any call of an approved turn executes, every pending call whose stored preview was
//! shown (present, not failed) is previewed again, bounded the same way, and compared line for
//! line. Only what was displayed counts, so the lines ARE the binding: no hash, no record
//! timestamp. Not compared, and carried over unchanged: calls with no preview (nothing was
//! shown), previews that failed at suspend (the approver was told they decided blind), and
//! calls no longer offered (they will not run).

use crate::ids::CallIndex;
use crate::preview::{self, Attempt, CallPreview, PREVIEW_VANISHED_LINE};
use crate::state::SuspendedRunState;
use crate::tool::{OfferedTools, Principal};

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

/// Re-previews the turn of `state` as `acting_user` against the live `offered` tools.
pub async fn compare(
    state: &SuspendedRunState,
    offered: &OfferedTools,
    acting_user: &Principal,
) -> Binding {
    let mut previews = Vec::with_capacity(state.call_previews.len());
    let mut moved = Vec::new();

    for stored in &state.call_previews {
        let Some(call) = state.pending_calls.get(stored.index.get()) else {
            continue;
        };
        let current = match (stored.failed, offered.get(&call.tool)) {
            (true, _) | (false, None) => stored.clone(),
            (false, Some(tool)) => match tool.previewer() {
                None => failed(stored, PREVIEW_VANISHED_LINE.to_owned()),
                Some(previewer) => {
                    match preview::attempt(previewer, acting_user, &call.arguments).await {
                        Attempt::Lines(lines) => CallPreview {
                            lines,
                            ..stored.clone()
                        },
                        other => {
                            tracing::warn!(
                                tool = %call.tool,
                                index = %stored.index,
                                code = other.code(),
                                "re-preview failed at resume"
                            );
                            failed(stored, preview::failed_at_resume_line(other.code()))
                        }
                    }
                }
            },
        };
        if current != *stored {
            moved.push(stored.index);
        }
        previews.push(current);
    }

    if moved.is_empty() {
        Binding::Unchanged
    } else {
        moved.sort();
        previews.sort_by_key(|p| p.index);
        Binding::Moved { previews, moved }
    }
}

fn failed(stored: &CallPreview, line: String) -> CallPreview {
    CallPreview {
        lines: vec![line],
        failed: true,
        ..stored.clone()
    }
}
