//! The approval card: what an approver is shown for a suspended turn.
//!
//! A preview is produced under the run's acting user and read by an approver, who is not
//! always the same person, so it is authorised twice: at production by the tool, and here,
//! at reading, by asking the tool whether this viewer may read it. That gate fails closed on
//! every branch the card cannot resolve — no viewer, a tool no longer registered, a tool
//! without the preview contract — because the stored preview outlives the registration that
//! produced it.

use serde::Serialize;
use serde_json::Value;

use crate::ids::{CallIndex, SuspensionSeq, TurnDigest};
use crate::preview::CallPreview;
use crate::state::{PendingCall, SuspendedRunState};
use crate::tool::{Principal, ToolRegistry};

/// Shown under every card: the previews are a snapshot of the pause.
pub const CAPTION: &str = "Captured when the run paused — the target may have changed since.";
/// Shown for a call whose preview failed.
pub const NO_PREVIEW_NOTICE: &str = "No preview — you are deciding without one";
/// Shown for a call whose tool offers no preview ([`CardPreview::None`]), on every surface.
pub const NONE_NOTICE: &str = "This tool has no preview; the arguments are all there is.";
/// Shown for a call whose preview this viewer may not read.
pub const WITHHELD_NOTICE: &str =
    "Preview withheld — you may not read the record this call would change.";
/// Shown for a call that landed under an earlier card of the same turn.
pub const LANDED_NOTICE: &str =
    "Already written — this call was carried out under an earlier card of this turn and will not run again.";
/// Shown for a call whose preview was computed as if it ran alone: it comes after other calls of
/// its turn on the same tool server, which cannot preview a call after the ones before it.
pub const ALONE_NOTICE: &str = "Computed as if it ran alone: this call comes after other calls of the turn on the same tool server, which cannot preview it after them, so what it does may differ from these lines.";
/// Shown for a call whose arguments a person changed: the card was issued anew with them.
pub const EDITED_NOTICE: &str = "Arguments changed by a person before approval: the call runs with the new arguments, not the ones the model proposed.";
/// Shown for a call the last card's decision denied on its own.
pub const EXCLUDED_NOTICE: &str = "Denied on the last card: the other calls were previewed without this call. Deny it again for them to run as shown.";
/// Shown when the card follows an approval that found a preview moved.
pub const MOVED_NOTICE: &str = "What the marked call(s) would do changed after the last card was shown, so nothing was written. Review the current preview and decide again.";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalCard {
    pub suspension_seq: SuspensionSeq,
    pub turn_digest: TurnDigest,
    pub captured_at: String,
    pub caption: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_notice: Option<&'static str>,
    pub calls: Vec<CardCall>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CardCall {
    pub index: CallIndex,
    pub tool: String,
    pub arguments: Value,
    pub preview: CardPreview,
    /// This call's preview changed since the previous card.
    pub moved: bool,
    /// This call was carried out under an earlier card of the turn ([`LANDED_NOTICE`]): deciding
    /// this card does not run it again.
    pub landed: bool,
    /// Its preview was computed as if it ran alone ([`ALONE_NOTICE`]).
    pub alone: bool,
    /// Its arguments were changed by a person ([`EDITED_NOTICE`]): who, and from what.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edit: Option<CardEdit>,
    /// The last card's decision denied it on its own ([`EXCLUDED_NOTICE`]): the other calls'
    /// previews were taken without it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub excluded: bool,
}

/// A person's change of a call's arguments, as a card shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CardEdit {
    pub editor: String,
    pub before: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CardPreview {
    Shown {
        lines: Vec<String>,
        /// For each line, the structured form its tool gave with it, if any (empty: none).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        forms: Vec<Option<crate::LineForm>>,
        /// The whole preview, when the bounds cut `lines` (empty otherwise): what the approval
        /// binds to, to be read beside the card.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        full: Vec<String>,
    },
    Failed {
        notice: &'static str,
        lines: Vec<String>,
    },
    Withheld {
        notice: &'static str,
    },
    /// The tool has no preview; the arguments are all there is.
    None,
}

/// Builds the card of `state` for `viewer`.
pub async fn build_card(
    state: &SuspendedRunState,
    registry: &ToolRegistry,
    viewer: Option<&Principal>,
) -> ApprovalCard {
    let mut calls = Vec::with_capacity(state.pending_calls.len());
    for (i, call) in state.pending_calls.iter().enumerate() {
        let index = CallIndex::new(i);
        let preview = card_preview(state.preview_of(index), call, registry, viewer).await;
        calls.push(CardCall {
            index,
            tool: call.tool.clone(),
            arguments: call.arguments.clone(),
            preview,
            moved: state.stale_call_indexes.contains(&index),
            landed: state.landed(index).is_some(),
            alone: state.preview_of(index).is_some_and(|p| p.alone),
            edit: state.edit_of(index).map(|e| CardEdit {
                editor: e.editor.clone(),
                before: e.before.clone(),
            }),
            excluded: state.excluded_calls.contains(&index),
        });
    }
    ApprovalCard {
        suspension_seq: state.suspension_seq,
        turn_digest: state.turn_digest(),
        captured_at: state.captured_at.clone(),
        caption: CAPTION,
        moved_notice: (!state.stale_call_indexes.is_empty()).then_some(MOVED_NOTICE),
        calls,
    }
}

/// What the card shows of `call`'s stored preview to `viewer`: the lines only when the tool
/// lets the viewer read them.
async fn card_preview(
    preview: Option<&CallPreview>,
    call: &PendingCall,
    registry: &ToolRegistry,
    viewer: Option<&Principal>,
) -> CardPreview {
    match preview {
        None => CardPreview::None,
        Some(p) if p.failed => CardPreview::Failed {
            notice: NO_PREVIEW_NOTICE,
            lines: p.lines.clone(),
        },
        Some(p) => {
            let previewer = registry.get(&call.tool).and_then(|t| t.previewer());
            let may_read = match (viewer, previewer) {
                (Some(viewer), Some(previewer)) => {
                    previewer
                        .may_viewer_read_preview(&call.arguments, viewer)
                        .await
                }
                _ => false,
            };
            if may_read {
                CardPreview::Shown {
                    lines: p.lines.clone(),
                    forms: p.forms.clone(),
                    full: p.full.clone(),
                }
            } else {
                CardPreview::Withheld {
                    notice: WITHHELD_NOTICE,
                }
            }
        }
    }
}
