//! The seven writers. Each is a narrow change to exactly one subject, in the live workspace,
//! with a preview an approver can read and a read-back that catches a write that did not take.

pub(crate) mod attach_file;
pub(crate) mod element_draft;
pub(crate) mod file_alternative;
pub(crate) mod move_element;
pub(crate) mod page_draft;
pub(crate) mod page_metadata;
pub(crate) mod translation;

use countersign_core::preview::quote_excerpt;
use countersign_core::{LineForm, PreviewLine, ToolOutput};

use crate::records::Named;
use crate::refusals::named;

/// Preview lines that are text only.
pub(crate) fn text_lines(lines: Vec<String>) -> Vec<PreviewLine> {
    lines.into_iter().map(PreviewLine::from).collect()
}

/// The preview line of a field set from `old` to `new` (`field: "old" → "new"`), with the pair
/// as its form for a card's word diff; `ungranted` when the acting user may not write it.
pub(crate) fn change_line(field: &str, old: &str, new: &str, ungranted: bool) -> PreviewLine {
    if old == new {
        return PreviewLine::from(format!("{field}: unchanged ({})", quote_excerpt(old)));
    }
    let text = format!("{field}: {} → {}", quote_excerpt(old), quote_excerpt(new));
    let text = if ungranted {
        format!("{text} — will not be stored: the acting user holds no grant for this field")
    } else {
        text
    };
    PreviewLine::with_form(
        text,
        LineForm::Change {
            before: old.to_owned(),
            after: new.to_owned(),
        },
    )
}

/// What a read-back found: which written values hold what was requested, and which do not.
#[derive(Debug, Default)]
pub(crate) struct ReadBack {
    took: Vec<String>,
    missed: Vec<String>,
}

impl ReadBack {
    /// Records whether `name` holds its requested value.
    pub(crate) fn field(&mut self, name: &str, ok: bool) {
        if ok {
            self.took.push(name.to_owned());
        } else {
            self.missed.push(name.to_owned());
        }
    }

    pub(crate) fn took(&self) -> &[String] {
        &self.took
    }

    /// `success` when everything took; otherwise an error output naming what did not — never
    /// a success, because a human approved a specific change and must not be told it happened
    /// when it did not.
    pub(crate) fn output(self, success: String, subject: &str, cause: &str) -> ToolOutput {
        if self.missed.is_empty() {
            return ToolOutput::ok(success);
        }
        let held = if self.took.is_empty() {
            "Nothing else was confirmed.".to_owned()
        } else {
            format!("Confirmed as requested: {}.", self.took.join(", "))
        };
        ToolOutput::error(format!(
            "{subject} was NOT written as requested: the read-back found that {} does not hold \
             the requested value ({cause}). {held}",
            self.missed.join(", ")
        ))
    }
}

/// Where a new or moved record lands in an ordered list (a column, a page's subpages).
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    /// The list as it is now, without the record, in order.
    existing: Vec<i64>,
    /// The record it lands after; `None` at the top.
    after: Option<Named>,
    index: usize,
}

impl Slot {
    /// The slot after the record `after` of `list`, or at the top; `None` when `after` is not
    /// in the list.
    pub(crate) fn after(list: Vec<Named>, after: Option<i64>) -> Option<Slot> {
        let index = match after {
            None => 0,
            Some(uid) => list.iter().position(|e| e.uid == uid)? + 1,
        };
        Some(Slot {
            existing: uids(&list),
            after: index.checked_sub(1).map(|i| list[i].clone()),
            index,
        })
    }

    /// The list with `uid` in this slot.
    pub(crate) fn order(&self, uid: i64) -> Vec<i64> {
        let mut order = self.existing.clone();
        order.insert(self.index, uid);
        order
    }

    /// Where the record lands, as a preview or an output says it: `1 of 3, at the top` or
    /// `3 of 3, after content element [5] "Teaser"`, for records of `kind`.
    pub(crate) fn place(&self, kind: &str) -> String {
        let (position, total) = (self.index + 1, self.existing.len() + 1);
        match &self.after {
            None => format!("{position} of {total}, at the top"),
            Some(a) => format!(
                "{position} of {total}, after {}",
                named(kind, a.uid, &a.label)
            ),
        }
    }
}

/// The uids of a list of records, in its order.
pub(crate) fn uids(list: &[Named]) -> Vec<i64> {
    list.iter().map(|r| r.uid).collect()
}
