//! Plain-text rendering for a terminal: an approval card as a terminal approver reads it, and
//! every text that comes from a tool, a server, a model or a record made inert.
//!
//! A terminal obeys what it is sent: an escape sequence in a preview line can clear the screen,
//! move the cursor up and overwrite the line an approval binds to, retitle the window; a
//! bidirectional override can make a line read backwards. So nothing the command line prints
//! from outside reaches the terminal as control: [`inert`] writes each such character as its
//! escape (`\u{1b}`), visibly, and leaves everything else as it is.

use std::borrow::Cow;
use std::fmt::Write;

use countersign_core::card::{ApprovalCard, CardPreview, NONE_NOTICE};

/// `text` as a terminal shows it without obeying it: every control character (C0 — line breaks
/// and tabs included —, DEL, C1) and every bidirectional control or line separator is written as
/// its escape, `\u{1b}`; everything else as it is.
pub fn inert(text: &str) -> Cow<'_, str> {
    if !text.chars().any(obeyed) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if obeyed(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `columns`, each made inert, separated by tabs.
pub fn columns(columns: &[String]) -> String {
    let cells: Vec<Cow<'_, str>> = columns.iter().map(|c| inert(c)).collect();
    cells.join("\t")
}

/// Whether a terminal may act on `c` rather than show it.
fn obeyed(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Arabic letter mark, left-to-right and right-to-left marks.
            '\u{061c}' | '\u{200e}' | '\u{200f}'
            // Embeddings, overrides and their pop.
            | '\u{202a}'..='\u{202e}'
            // Isolates and their pop.
            | '\u{2066}'..='\u{2069}'
            // Line and paragraph separators.
            | '\u{2028}' | '\u{2029}'
        )
}

/// An error as the command reports it: its message and each cause, one a line, inert (a
/// message may quote what a server sent).
pub fn error(e: &anyhow::Error) -> String {
    let mut out = format!("Error: {}\n", inert(&e.to_string()));
    let causes: Vec<String> = e.chain().skip(1).map(ToString::to_string).collect();
    if !causes.is_empty() {
        out.push_str("\nCaused by:\n");
        for (i, cause) in causes.iter().enumerate() {
            let _ = writeln!(out, "    {i}: {}", inert(cause));
        }
    }
    out
}

pub fn card(card: &ApprovalCard) -> String {
    card_with(card, false)
}

/// The notices of one call of a card: written before, previewed alone, left out, edited.
fn call_notices(out: &mut String, call: &countersign_core::card::CardCall) {
    if call.landed {
        let _ = writeln!(out, "  │     {}", countersign_core::card::LANDED_NOTICE);
    }
    if call.alone {
        let _ = writeln!(out, "  │     {}", countersign_core::card::ALONE_NOTICE);
    }
    if call.excluded {
        let _ = writeln!(out, "  │     {}", countersign_core::card::EXCLUDED_NOTICE);
    }
    if let Some(edit) = &call.edit {
        let _ = writeln!(
            out,
            "  │     ✎ edited by {}: {}",
            inert(&edit.editor),
            countersign_core::card::EDITED_NOTICE
        );
        let _ = writeln!(
            out,
            "  │     arguments before: {}",
            inert(&edit.before.to_string())
        );
    }
}

/// The preview of one call of a card: its lines (all of them when `whole`), or the notice of
/// why there are none.
fn call_preview(out: &mut String, preview: &CardPreview, whole: bool) {
    match preview {
        CardPreview::Shown { lines, full, .. } => {
            let shown = if whole && !full.is_empty() {
                full
            } else {
                lines
            };
            for line in shown {
                let _ = writeln!(out, "  │     {}", inert(line));
            }
            if !whole && !full.is_empty() {
                let _ = writeln!(
                    out,
                    "  │     (the whole preview, {} lines, binds the approval: show it with --full)",
                    full.len()
                );
            }
        }
        CardPreview::Failed { notice, lines } => {
            let _ = writeln!(out, "  │     {notice}");
            for line in lines {
                let _ = writeln!(out, "  │     ({})", inert(line));
            }
        }
        CardPreview::Withheld { notice } => {
            let _ = writeln!(out, "  │     {notice}");
        }
        CardPreview::None => {
            let _ = writeln!(out, "  │     {NONE_NOTICE}");
        }
    }
}

/// The card, each long preview shown whole when `whole` (else its bounded lines and how to see
/// the rest).
pub fn card_with(card: &ApprovalCard, whole: bool) -> String {
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
        let _ = writeln!(out, "  │ call {} · {}{mark}", call.index, inert(&call.tool));
        call_notices(&mut out, call);
        let _ = writeln!(
            out,
            "  │     arguments: {}",
            inert(&call.arguments.to_string())
        );
        call_preview(&mut out, &call.preview, whole);
    }
    let _ = writeln!(
        out,
        "  └ {} Captured at {}.",
        card.caption,
        inert(&card.captured_at)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_and_its_causes_are_reported_inert_one_a_line() {
        let e = anyhow::anyhow!("tool \u{1b}[31mx\nforged").context("discovering the servers");
        assert_eq!(
            error(&e),
            "Error: discovering the servers\n\nCaused by:\n    0: tool \\u{1b}[31mx\\u{a}forged\n"
        );
    }

    #[test]
    fn control_and_bidirectional_characters_are_shown_as_escapes_and_the_rest_as_it_is() {
        let hostile =
            "ok\u{1b}[2K\u{1b}]0;pwned\u{7}\r\u{8}\0\u{7f}\u{9b}2J\u{202e}gnp.exe\u{2066}\n\ttab";
        assert_eq!(
            inert(hostile),
            "ok\\u{1b}[2K\\u{1b}]0;pwned\\u{7}\\u{d}\\u{8}\\u{0}\\u{7f}\\u{9b}2J\\u{202e}gnp.exe\\u{2066}\\u{a}\\u{9}tab"
        );
        let plain = "page \"home\": «Öffnungszeiten» → 9–17 ✓ 日本";
        assert!(
            matches!(inert(plain), Cow::Borrowed(_)),
            "nothing to make inert"
        );
        assert_eq!(inert(plain), plain);
    }
}
