//! A decision on a suspended turn as the loop reads it, once the coordinator gated it: the
//! whole turn, call by call, or new arguments for some calls.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::CallIndex;
use crate::messages::CallVerdict;

/// A decision on a suspended turn, already gated by the coordinator: on the whole turn
/// (`approved`), call by call (`calls`), or an edit of some calls' arguments (`edits`), which
/// issues the card again instead of running anything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    pub approved: bool,
    /// The comment the model reads with a denial of the whole turn.
    pub comment: Option<String>,
    /// What the approver decided of each call, when they decided call by call; empty for a
    /// decision on the whole turn. A call the list does not approve is denied.
    pub calls: Vec<CallVerdict>,
    /// Calls whose arguments an approver changed: the turn is previewed again with them and
    /// its card issued anew, to be decided like any card.
    pub edits: Vec<CallEdit>,
}

impl Decision {
    /// Whether call `index` is to run: approved on its own, or as part of an approved turn.
    pub fn approves(&self, index: CallIndex) -> bool {
        if self.calls.is_empty() {
            return self.approved;
        }
        self.calls.iter().any(|c| c.index == index && c.approved)
    }

    /// What the model is told of call `index` denied, by the approver's words.
    pub fn denial_of(&self, index: CallIndex) -> Option<&str> {
        if self.calls.is_empty() {
            return self.comment.as_deref();
        }
        self.calls
            .iter()
            .find(|c| c.index == index)
            .and_then(|c| c.message.as_deref())
    }

    /// Whether anything of the turn is to run.
    pub fn approves_any(&self, calls: usize) -> bool {
        (0..calls).any(|i| self.approves(CallIndex::new(i)))
    }
}

/// New arguments for one call of the turn, from an approver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallEdit {
    pub index: CallIndex,
    pub arguments: Value,
    /// Who changed them.
    pub editor: String,
}
