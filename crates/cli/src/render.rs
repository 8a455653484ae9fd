//! Plain-text rendering of an approval card, as a terminal approver reads it.

use std::fmt::Write;

use countersign_core::card::{ApprovalCard, CardPreview};

pub fn card(card: &ApprovalCard) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  ┌ approval card — suspension {}, turn {}",
        card.suspension_seq,
        card.turn_digest.as_str()
    );
    if let Some(notice) = card.moved_notice {
        let _ = writeln!(out, "  │ ⚠ {notice}");
    }
    for call in &card.calls {
        let mark = match (call.moved, call.landed) {
            (true, _) => "  ⚠ moved",
            (false, true) => "  ✓ written",
            (false, false) => "",
        };
        let _ = writeln!(out, "  │ call {} · {}{mark}", call.index, call.tool);
        if call.landed {
            let _ = writeln!(out, "  │     {}", countersign_core::card::LANDED_NOTICE);
        }
        if call.alone {
            let _ = writeln!(out, "  │     {}", countersign_core::card::ALONE_NOTICE);
        }
        let _ = writeln!(out, "  │     arguments: {}", call.arguments);
        match &call.preview {
            CardPreview::Shown { lines, .. } => {
                for line in lines {
                    let _ = writeln!(out, "  │     {line}");
                }
            }
            CardPreview::Failed { notice, lines } => {
                let _ = writeln!(out, "  │     {notice}");
                for line in lines {
                    let _ = writeln!(out, "  │     ({line})");
                }
            }
            CardPreview::Withheld { notice } => {
                let _ = writeln!(out, "  │     {notice}");
            }
            CardPreview::None => {
                let _ = writeln!(out, "  │     (no preview for this tool)");
            }
        }
    }
    let _ = writeln!(
        out,
        "  └ {} Captured at {}.",
        card.caption, card.captured_at
    );
    out
}
