//! The card of a waiting run, as its viewer may see it — built as the CLI builds it, from the
//! run's sealed state, so the suspension number and digest it carries are those of the
//! previews on it, never the row's of a moment later.

use countersign_core::card::{build_card, ApprovalCard, CardCall, CardPreview};
use countersign_core::model::Role;
use countersign_core::{RunId, SuspendedRunState};
use countersign_store::{DecisionOutcome, RunRecord, RunStatus, WaitingRun};

use crate::problem::{unavailable, Problem, ProblemCode};
use crate::queries::Access;
use crate::AppState;

/// What [`card_for`] can answer.
pub const CARD_PROBLEMS: [ProblemCode; 4] = [
    ProblemCode::NotFound,
    ProblemCode::Decision(DecisionOutcome::NotAwaitingApproval),
    ProblemCode::StateUnreadable,
    ProblemCode::Unavailable,
];

/// The card of `run` for the viewer `access` describes: `not_found` when that viewer may not
/// decide on it, `not_awaiting_approval` when it waits for nothing, `state_unreadable` when its
/// state does not open.
pub async fn card_for(
    state: &AppState,
    run: &RunRecord,
    access: &Access,
) -> Result<ApprovalCard, Problem> {
    if !access.may_decide(run) {
        return Err(Problem::new(ProblemCode::NotFound).with_run(run.id.as_uuid()));
    }
    if run.status != RunStatus::WaitingForApproval {
        return Err(
            Problem::new(ProblemCode::Decision(DecisionOutcome::NotAwaitingApproval))
                .with_run(run.id.as_uuid()),
        );
    }
    let viewer = state
        .coordinator
        .users
        .principal(&access.user)
        .await
        .map_err(|e| unavailable("users", e.code(), &e))?;
    let bytes = match state.coordinator.store.load_state(run.id).await {
        Ok(bytes) => bytes,
        Err(e) if e.is_unreadable() => return Err(unreadable(run.id, e.code(), &e)),
        Err(e) => return Err(unavailable("state", e.code(), &e)),
    };
    let parsed =
        SuspendedRunState::from_bytes(&bytes).map_err(|e| unreadable(run.id, e.code(), &e))?;
    Ok(build_card(&parsed, &state.coordinator.registry, viewer.as_ref()).await)
}

fn unreadable(run_id: RunId, code: &'static str, e: &dyn std::fmt::Display) -> Problem {
    tracing::warn!(run.id = %run_id, error.code = code, error = %e, "card not built");
    Problem::new(ProblemCode::StateUnreadable).with_run(run_id.as_uuid())
}

/// How many characters of the request an inbox row shows.
pub const REQUEST_CHARS: usize = 160;
/// How many characters of a call's one-line summary an inbox row shows.
pub const SUMMARY_CHARS: usize = 160;

/// What an inbox row says of a waiting run beyond its facts: what the run was asked to do and
/// one line per pending call, as its viewer may see them (a withheld preview stays withheld).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Glimpse {
    /// The request's prompt, cut to [`REQUEST_CHARS`]; empty when the state does not open.
    pub request: String,
    /// One line per call of the card, cut to [`SUMMARY_CHARS`].
    pub calls: Vec<String>,
}

/// The glimpse of each of `runs` for `viewer`, in order. A run whose state does not open (or
/// moved on meanwhile) has an empty glimpse: the row still lists it, and its page says why.
pub async fn glimpses(state: &AppState, runs: &[WaitingRun], viewer: &str) -> Vec<Glimpse> {
    let principal = match state.coordinator.users.principal(viewer).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error.code = e.code(), error = %e, "inbox glimpses not built");
            return vec![Glimpse::default(); runs.len()];
        }
    };
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        let parsed = match state.coordinator.store.load_state(run.run_id).await {
            Ok(bytes) => SuspendedRunState::from_bytes(&bytes).ok(),
            Err(e) => {
                tracing::debug!(run.id = %run.run_id, error.code = e.code(), "no glimpse");
                None
            }
        };
        let Some(parsed) = parsed else {
            out.push(Glimpse::default());
            continue;
        };
        let card = build_card(&parsed, &state.coordinator.registry, principal.as_ref()).await;
        out.push(Glimpse {
            request: cut(request_of(&parsed), REQUEST_CHARS),
            calls: card
                .calls
                .iter()
                .map(|c| cut(&summary(c), SUMMARY_CHARS))
                .collect(),
        });
    }
    out
}

/// The request the run was started with: the transcript's first user message.
fn request_of(state: &SuspendedRunState) -> &str {
    state
        .transcript
        .iter()
        .find(|m| m.role == Role::User)
        .map_or("", |m| m.content.as_str())
}

/// One line for a call: its tool and its preview's first two lines, or why there is none.
fn summary(call: &CardCall) -> String {
    let what = match &call.preview {
        // The heading line (what the call touches) and the first line of what it does.
        CardPreview::Shown { lines, .. } => lines
            .iter()
            .take(2)
            .map(|l| l.trim())
            .collect::<Vec<_>>()
            .join(" "),
        CardPreview::Failed { .. } => "preview failed".to_owned(),
        CardPreview::Withheld { .. } => "preview withheld".to_owned(),
        CardPreview::None => "no preview".to_owned(),
    };
    let state = if call.landed {
        " (written)"
    } else if call.excluded {
        " (left out)"
    } else {
        ""
    };
    format!("{}{state}: {}", call.tool, what.replace(['\n', '\r'], " "))
}

/// `text` cut to `max` characters, an ellipsis marking the cut.
fn cut(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", kept.trim_end())
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn a_long_text_is_cut_with_an_ellipsis_and_a_short_one_is_kept() {
        assert_eq!(cut("  short  ", 10), "short");
        assert_eq!(cut("abcdefghijk", 5), "abcd…");
        assert_eq!(cut("ééééééé", 4).chars().count(), 4);
    }
}
