//! The inbox's HTML, as maud templates.
//!
//! Every string that comes from a model, a tool, the content store or a user — previews,
//! arguments, names, comments, event payloads — is spliced with maud's `(…)`, which escapes
//! it; nothing here uses `PreEscaped`. A preview is untrusted text: `<script>` in one is shown
//! as those characters. The pages carry no inline script, and the Content-Security-Policy
//! forbids any: the one script is the keyboard shortcuts' file, which only clicks or focuses
//! the page's own links and buttons.
//!
//! A preview line a tool gave a structured form is shown in that form — a word diff of a
//! field's before and after, marked with `<del>` and `<ins>` rather than colour alone, or a
//! list with the new item marked — above the line's text, which the approval binds to.

use chrono::{DateTime, Utc};
use countersign_coordinator::grants::GivenGrant;
use countersign_core::card::{ApprovalCard, CardCall, CardPreview};
use countersign_core::{LineForm, RunId};
use countersign_store::{DecisionOutcome, RunEvent, RunRecord, RunStatus, Waiting, WaitingRun};
use maud::{html, Markup, DOCTYPE};
use similar::{ChangeTag, TextDiff};
use uuid::Uuid;

use crate::cards::Glimpse;
use crate::problem::{Problem, ProblemCode};
use crate::v1::DecisionAccepted;

/// The stylesheet, served at [`STYLESHEET_PATH`].
pub const STYLESHEET: &str = include_str!("../static/inbox.css");
pub const STYLESHEET_PATH: &str = "/inbox/static/inbox.css";
/// The keyboard shortcuts, served at [`SCRIPT_PATH`]: they only click or focus what the page
/// has, so every page works the same without them.
pub const SCRIPT: &str = include_str!("../static/inbox.js");
pub const SCRIPT_PATH: &str = "/inbox/static/inbox.js";

/// Who is looking, for the header.
#[derive(Debug, Clone, Copy)]
pub struct Viewer<'a> {
    pub user: &'a str,
    pub csrf: &'a str,
    /// Signed in through the proxy: no sign-out of ours.
    pub proxied: bool,
}

fn layout(title: &str, viewer: Option<Viewer<'_>>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · countersign" }
                link rel="stylesheet" href=(STYLESHEET_PATH);
                script src=(SCRIPT_PATH) defer {}
            }
            body {
                header.top {
                    a.brand href="/inbox" { "countersign" }
                    span.tagline { "every write an agent proposes, countersigned" }
                    @if let Some(v) = viewer {
                        span.who {
                            "Signed in as " strong #signed-in-as { (v.user) }
                            @if !v.proxied {
                                form.inline method="post" action="/inbox/sign-out" {
                                    input type="hidden" name="csrf" value=(v.csrf);
                                    button.link type="submit" #sign-out { "Sign out" }
                                }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The sign-in page; `failed` after a token that did not sign in. Its form carries `csrf`, the
/// token of the browser's sign-in cookie.
pub fn sign_in(failed: bool, proxy_header: Option<&str>, csrf: &str) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in to the inbox" }
            @if failed {
                p.error #sign-in-error role="alert" {
                    "That token did not sign you in: it is unknown, revoked or expired."
                }
            }
            form.card-form method="post" action="/inbox/sign-in" {
                input type="hidden" name="csrf" value=(csrf);
                label for="token" { "Your API token" }
                input #token type="password" name="token" autocomplete="off" required
                    placeholder="cst_…" maxlength="100";
                button #sign-in type="submit" { "Sign in" }
            }
            p.hint {
                "An operator issues a token with "
                code { "countersign tokens create --for YOUR_NAME" }
                ". It is shown once; the inbox keeps only a session cookie."
            }
            @if let Some(header) = proxy_header {
                p.hint {
                    "Behind your organisation's sign-in, the proxy signs you in (header "
                    code { (header) } ")."
                }
            }
        },
    )
}

/// A short age: `12 s`, `4 min`, `3 h`, `2 d`.
pub fn age(since: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (now - since).num_seconds().max(0);
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    }
}

/// How long is left before `deadline`: `3 h left`, or `overdue`.
fn left(deadline: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if deadline <= now {
        "overdue".to_owned()
    } else {
        format!("{} left", age(now, deadline))
    }
}

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// Which waiting runs a page of the inbox lists.
#[derive(Debug, Clone, Copy)]
pub struct Listed<'a> {
    /// Of this agent only.
    pub agent: Option<&'a str>,
    /// Waiting on the viewer, on their groups, or every run they may see.
    pub waiting: Waiting,
}

/// "All · Waiting on me · Waiting on my groups", the current one unlinked.
fn waiting_nav(current: Waiting) -> Markup {
    let choices = [
        (Waiting::Any, "/inbox", "All", "waiting-any"),
        (
            Waiting::OnMe,
            "/inbox?waiting=me",
            "Waiting on me",
            "waiting-on-me",
        ),
        (
            Waiting::OnMyGroups,
            "/inbox?waiting=groups",
            "Waiting on my groups",
            "waiting-on-my-groups",
        ),
    ];
    html! {
        nav.waiting aria-label="Which cards" {
            @for (i, (w, href, label, id)) in choices.into_iter().enumerate() {
                @if i > 0 { " · " }
                @if w == current {
                    strong #(id) aria-current="page" { (label) }
                } @else {
                    a #(id) href=(href) { (label) }
                }
            }
        }
    }
}

/// The list of waiting runs, soonest deadline first; of `listed.agent` only, when given.
pub fn inbox(
    viewer: Viewer<'_>,
    entries: &[WaitingRun],
    glimpses: &[Glimpse],
    listed: Listed<'_>,
    next: Option<&str>,
    now: DateTime<Utc>,
) -> Markup {
    let agent = listed.agent;
    layout(
        "Inbox",
        Some(viewer),
        html! {
            h1 { "Waiting for your decision" }
            (waiting_nav(listed.waiting))
            (queue_nav(Queue { prev: None, next: entries.first().map(|e| e.run_id) }))
            form.filter #agent-filter method="get" action="/inbox" {
                label for="agent" { "Agent" }
                input #agent type="text" name="agent" value=[agent] maxlength="200"
                    placeholder="every agent";
                button type="submit" { "Filter" }
                @if agent.is_some() {
                    " " a #all-agents href="/inbox" { "Show every agent" }
                }
            }
            @if entries.is_empty() {
                p #inbox-empty { "No run is waiting for a decision you may make." }
            } @else {
                table #inbox-runs {
                    thead { tr {
                        th { "Run" } th { "Agent" } th { "Acting as" } th { "Waiting" }
                        th { "Time left" } th { "Asked, and the proposed calls" } th { "Approvals" }
                    } }
                    tbody {
                        @for (e, glimpse) in entries.iter().zip(glimpses.iter().chain(std::iter::repeat(&Glimpse::default()))) {
                            (inbox_row(e, glimpse, now))
                        }
                    }
                }
                @if let Some(cursor) = next {
                    p { a #next-page href={ "/inbox?cursor=" (cursor) @if let Some(a) = agent { "&agent=" (query_value(a)) } } { "Next page →" } }
                }
            }
        },
    )
}

/// One waiting run of the inbox, with its `glimpse`: the request and the proposed calls.
fn inbox_row(e: &WaitingRun, glimpse: &Glimpse, now: DateTime<Utc>) -> Markup {
    html! {
        tr.inbox-run.bounced[e.bounces > 0] data-run-id=(e.run_id) {
            td {
                a.run-link href={ "/inbox/runs/" (e.run_id) } {
                    code { (short(&e.run_id.to_string())) }
                }
                @if e.bounces > 0 {
                    " " span.bounce-mark title="An approval found a preview moved and nothing was written; the card came back" {
                        "↺ back " (e.bounces) "×"
                    }
                }
            }
            td.agent { a href={ "/inbox?agent=" (e.agent) } { (e.agent) } }
            td { (e.acting_user) }
            td.age title=(when(e.waiting_since)) { (age(e.waiting_since, now)) }
            td.deadline.overdue[e.approval_deadline <= now] title=(when(e.approval_deadline)) {
                (left(e.approval_deadline, now))
            }
            td.glimpse {
                @if !glimpse.request.is_empty() {
                    p.request { "“" (glimpse.request) "”" }
                }
                @if glimpse.calls.is_empty() {
                    (e.pending_tools.join(", "))
                } @else {
                    ul.call-summary {
                        @for line in &glimpse.calls { li { (line) } }
                    }
                }
            }
            td.quorum { @if let Some(q) = &e.quorum { (q) } }
        }
    }
}

/// `value` percent-encoded for a query string: what an agent's name may hold passes as it is.
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn short(id: &str) -> &str {
    id.get(..13).unwrap_or(id)
}

/// The waiting cards next to the one shown, in inbox order.
#[derive(Debug, Clone, Copy, Default)]
pub struct Queue {
    pub prev: Option<RunId>,
    pub next: Option<RunId>,
}

/// Links to the previous and next waiting cards (the `k` and `j` keys), and the list of keys.
fn queue_nav(queue: Queue) -> Markup {
    html! {
        nav.queue aria-label="Waiting cards" {
            @if let Some(prev) = queue.prev {
                a #prev-card rel="prev" href={ "/inbox/runs/" (prev) } { "← Previous card" }
            }
            @if let Some(next) = queue.next {
                a #next-card rel="next" href={ "/inbox/runs/" (next) } { "Next card →" }
            }
            (shortcuts())
        }
    }
}

fn shortcuts() -> Markup {
    html! {
        details #shortcuts.shortcuts {
            summary { "Keyboard shortcuts" }
            dl {
                dt { kbd { "a" } } dd { "approve this card" }
                dt { kbd { "d" } } dd { "deny: write a comment if you like, then Enter" }
                dt { kbd { "c" } } dd { "decide call by call: open the choices, Tab through them" }
                dt { kbd { "j" } } dd { "next waiting card" }
                dt { kbd { "k" } } dd { "previous waiting card" }
                dt { kbd { "?" } } dd { "show or hide this list" }
            }
        }
    }
}

/// A run: its card and the decision form when it waits, and its history.
pub fn run_page(
    viewer: Viewer<'_>,
    run: &RunRecord,
    card: Option<&ApprovalCard>,
    decision_id: &str,
    events: &[RunEvent],
    queue: Queue,
    offer_grant: bool,
) -> Markup {
    layout(
        "Run",
        Some(viewer),
        html! {
            p.back { a href="/inbox" { "← Inbox" } }
            (queue_nav(queue))
            h1 { "Run " code { (run.id) } }
            dl.facts {
                dt { "Agent" } dd #agent { (run.agent) }
                dt { "Acting as" } dd { (run.acting_user) }
                dt { "Status" } dd #status { (run.status.as_str()) }
                @if let Some(reason) = run.termination_reason {
                    dt { "Ended" } dd { (reason.as_str()) }
                }
                @if let Some(sent) = run.sent_call.filter(|_| run.status.is_terminal()) {
                    dt { "In doubt" } dd #in-doubt {
                        "Call " (sent.index) " of card " (sent.suspension_seq)
                        " was sent to its tool server and no answer came back, so nobody knows whether it was written. Ask the tool server about it before running it again."
                    }
                }
                @if let Some(deadline) = run.approval_deadline.filter(|_| run.status == RunStatus::WaitingForApproval) {
                    dt { "Decide by" } dd { (when(deadline)) }
                }
            }
            @if let Some(card) = card {
                (card_section(card, Some(Deciding { viewer, run, card })))
                (decision_form(viewer, run, card, decision_id, offer_grant))
            } @else if run.status == RunStatus::WaitingForApproval {
                p.error { "This run's card cannot be shown (its state does not open)." }
            }
            (history(events))
        },
    )
}

/// What a card's forms post with: the viewer's CSRF token, the run, the card decided on.
#[derive(Clone, Copy)]
struct Deciding<'a> {
    viewer: Viewer<'a>,
    run: &'a RunRecord,
    card: &'a ApprovalCard,
}

/// The card; with `deciding`, each call that has not landed gets its form to edit its
/// arguments.
fn card_section(card: &ApprovalCard, deciding: Option<Deciding<'_>>) -> Markup {
    html! {
        section #card.card data-suspension-seq=(card.suspension_seq) {
            h2 { "Approval card" }
            p.card-id {
                "Suspension " strong #suspension-seq { (card.suspension_seq) }
                " · turn " code #turn-digest { (card.turn_digest) }
            }
            @if let Some(notice) = card.moved_notice {
                p.notice.moved #moved-notice role="alert" { "⚠ " (notice) }
            }
            @for call in &card.calls {
                (call_article(call, deciding))
            }
            (as_if_accepted(card))
            p.caption #caption { (card.caption) " Captured at " (card.captured_at) "." }
        }
    }
}

/// One call of the card: its marks and notices, its preview and arguments, and with
/// `deciding` the form to edit them unless it landed.
fn call_article(call: &CardCall, deciding: Option<Deciding<'_>>) -> Markup {
    html! {
        article.call.moved[call.moved].landed[call.landed] data-index=(call.index) data-tool=(call.tool) {
            h3 {
                "Call " (call.index) " · " code { (call.tool) }
                @if call.moved { " " span.moved-mark { "⚠ moved" } }
                @if call.landed { " " span.landed-mark { "✓ written" } }
            }
            @if call.landed {
                p.notice.landed { (countersign_core::card::LANDED_NOTICE) }
            }
            @if call.alone {
                p.notice.alone { (countersign_core::card::ALONE_NOTICE) }
            }
            @if call.excluded {
                p.notice.excluded { (countersign_core::card::EXCLUDED_NOTICE) }
            }
            @if let Some(edit) = &call.edit {
                div.notice.edited {
                    p { "✎ Edited by " strong.editor { (edit.editor) } ". " (countersign_core::card::EDITED_NOTICE) }
                    div.arguments-change {
                        div { h4 { "Arguments the model proposed" } pre.before { (pretty(&edit.before)) } }
                        div { h4 { "Arguments now" } pre.after { (pretty(&call.arguments)) } }
                    }
                }
            }
            (call_preview(&call.preview))
            details.arguments {
                summary { "Arguments" }
                pre { (pretty(&call.arguments)) }
            }
            @if let Some(deciding) = deciding.filter(|_| !call.landed) {
                (edit_form(deciding, call))
            }
        }
    }
}

/// What the card shows of a call's preview: its lines (and the whole of it when they were
/// cut), or the notice of why there are none.
fn call_preview(preview: &CardPreview) -> Markup {
    html! {
        @match preview {
            CardPreview::Shown { lines, forms, full } => {
                ul.preview-lines {
                    @for (i, line) in lines.iter().enumerate() {
                        li {
                            @match forms.get(i).and_then(Option::as_ref) {
                                Some(form) => (shown_form(line, form)),
                                None => (line),
                            }
                        }
                    }
                }
                @if !full.is_empty() {
                    details.full-preview {
                        summary { "The whole preview (" (full.len()) " lines) — the approval binds to all of it" }
                        ol.preview-lines.full { @for line in full { li { (line) } } }
                    }
                }
            }
            CardPreview::Failed { notice, lines } => {
                p.notice.failed { (notice) }
                @if !lines.is_empty() {
                    ul.preview-lines.failed { @for line in lines { li { (line) } } }
                }
            }
            CardPreview::Withheld { notice } => {
                p.notice.withheld { (notice) }
            }
            CardPreview::None => {
                p.notice.none { (countersign_core::card::NONE_NOTICE) }
            }
        }
    }
}

fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// The form that gives one call new arguments: the card is issued anew with them, previewed as
/// the run's acting user, and nothing runs until it is approved.
fn edit_form(d: Deciding<'_>, call: &CardCall) -> Markup {
    let id = format!("edit-{}", call.index);
    html! {
        details.edit #(id) {
            summary { "Edit the arguments of call " (call.index) }
            form.edit-form method="post" action={ "/inbox/runs/" (d.run.id) "/decide" } {
                input type="hidden" name="csrf" value=(d.viewer.csrf);
                // An edit is a decision of its own: its own id, so it never replays another.
                input type="hidden" name="decision_id" value=(Uuid::now_v7());
                input type="hidden" name="suspension_seq" value=(d.card.suspension_seq);
                input type="hidden" name="turn_digest" value=(d.card.turn_digest);
                input type="hidden" name="edit_index" value=(call.index);
                input type="hidden" name="edit_tool" value=(call.tool);
                label for={ (id) "-arguments" } {
                    "New arguments for " code { (call.tool) } " (a JSON object; checked against the tool's schema)"
                }
                textarea.arguments-input id={ (id) "-arguments" } name="arguments" rows="6" spellcheck="false" {
                    (pretty(&call.arguments))
                }
                p.hint {
                    "The card is issued anew with these arguments, previewed as the run's acting user and marked as your edit. Nothing is written until someone approves that card."
                }
                button.edit type="submit" id={ (id) "-submit" } { "Preview with these arguments" }
            }
        }
    }
}

/// A preview line with its structured form: the form as the card shows it, then the line's
/// text, which is what the approval binds to.
fn shown_form(line: &str, form: &LineForm) -> Markup {
    html! {
        @match form {
            LineForm::Change { before, after } if rewritten(before, after) => {
                div.rewritten aria-label="Rewritten almost entirely: the text before and after" {
                    div { h4 { "Before" } p.before { (before) } }
                    div { h4 { "After" } p.after { (after) } }
                }
            }
            LineForm::Change { before, after } => {
                p.diff aria-label="Changes, word by word: deletions struck through, insertions underlined" {
                    @for (tag, words) in word_diff(before, after) {
                        @match tag {
                            ChangeTag::Equal => span { (words) },
                            ChangeTag::Delete => del title="removed" { (words) },
                            ChangeTag::Insert => ins title="added" { (words) },
                        }
                    }
                }
            }
            LineForm::List { items, added } => {
                ol.preview-list {
                    @for (i, item) in items.iter().enumerate() {
                        @if i == *added {
                            li.added { ins { (item) } " " span.new-mark { "new" } }
                        } @else {
                            li { (item) }
                        }
                    }
                }
            }
        }
        span.as-text { (line) }
    }
}

/// Whether `after` keeps so little of `before` that a word diff would interleave two texts: less
/// than [`REWRITE_RATIO`] of their words in common. Such a change is shown as two blocks.
fn rewritten(before: &str, after: &str) -> bool {
    !before.trim().is_empty()
        && !after.trim().is_empty()
        && TextDiff::from_words(before, after).ratio() < REWRITE_RATIO
}

/// Below this share of words in common, a change is a rewrite ([`rewritten`]).
const REWRITE_RATIO: f32 = 0.4;

/// The card's fields as they would read once every call still to run is accepted: each
/// change's new text and each list as it would stand, without the marks of a difference.
fn as_if_accepted(card: &ApprovalCard) -> Markup {
    let results: Vec<(&CardCall, Vec<&LineForm>)> = card
        .calls
        .iter()
        .filter(|c| !c.excluded)
        .filter_map(|c| match &c.preview {
            CardPreview::Shown { forms, .. } => {
                let forms: Vec<&LineForm> = forms.iter().flatten().collect();
                (!forms.is_empty()).then_some((c, forms))
            }
            _ => None,
        })
        .collect();
    html! {
        @if !results.is_empty() {
            details #as-accepted.as-accepted {
                summary { "Show as if every call were accepted" }
                @for (call, forms) in results {
                    section.accepted data-index=(call.index) {
                        h3 { "Call " (call.index) " · " code { (call.tool) } }
                        @for form in forms {
                            @match form {
                                LineForm::Change { after, .. } => p.accepted-text { (after) },
                                LineForm::List { items, .. } => ol.accepted-list { @for item in items { li { (item) } } },
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The word-level difference of `before` and `after`, runs of one kind merged.
fn word_diff(before: &str, after: &str) -> Vec<(ChangeTag, String)> {
    let diff = TextDiff::from_words(before, after);
    let mut runs: Vec<(ChangeTag, String)> = Vec::new();
    for change in diff.iter_all_changes() {
        match runs.last_mut() {
            Some((tag, text)) if *tag == change.tag() => text.push_str(change.value()),
            _ => runs.push((change.tag(), change.value().to_owned())),
        }
    }
    runs
}

/// The card's forms; with `offer_grant`, the approval that also gives a standing grant (offered
/// only when every call may be granted: see [`crate::grants`]).
fn decision_form(
    viewer: Viewer<'_>,
    run: &RunRecord,
    card: &ApprovalCard,
    decision_id: &str,
    offer_grant: bool,
) -> Markup {
    html! {
        form.card-form #decide method="post" action={ "/inbox/runs/" (run.id) "/decide" } {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="decision_id" value=(decision_id);
            input type="hidden" name="suspension_seq" value=(card.suspension_seq);
            input type="hidden" name="turn_digest" value=(card.turn_digest);
            label for="comment" { "Comment (optional; shown to the agent on a denial)" }
            textarea #comment name="comment" maxlength="4096" rows="3" {}
            p.hint #deny-hint hidden { "Enter denies this card with the comment; Shift+Enter starts a new line; Escape leaves the comment." }
            div.buttons {
                button.approve #approve type="submit" name="approved" value="true" {
                    "Approve suspension " (card.suspension_seq)
                }
                button.deny #deny type="submit" name="approved" value="false" { "Deny" }
                @if offer_grant {
                    button.approve #approve-grant type="submit" name="approved" value="grant" {
                        "Approve, and approve the same for 8 hours"
                    }
                }
            }
            @if offer_grant {
                p.hint #grant-hint {
                    "The second approval also lets this agent's calls of the same tool on the same subject through without asking for 8 hours, as long as they remove nothing and stay within editor content (a standing grant, revoked with "
                    code { "countersign policies revoke" }
                    ")."
                }
            }
            @if card.calls.len() > 1 {
                (by_call_form(card))
            }
            p.hint {
                "You decide on exactly this card. If the run has moved on since it was shown, the "
                "decision is refused and nothing changes."
            }
        }
    }
}

/// The part of the card's form that decides call by call, for a card of more than one call.
fn by_call_form(card: &ApprovalCard) -> Markup {
    html! {
        details #by-call.by-call {
            summary { "Decide call by call" }
            p.hint {
                "The approved calls run as a turn of their own, previewed again without the denied ones. If any of them would then do something other than the card shows, nothing is written and the card comes back."
            }
            @for call in &card.calls {
                fieldset.call-verdict data-index=(call.index) {
                    legend { "Call " (call.index) " · " code { (call.tool) } }
                    @if call.landed {
                        p.hint { "Already written under an earlier card." }
                        input type="hidden" name={ "call-" (call.index) } value="approve";
                    } @else {
                        label { input type="radio" name={ "call-" (call.index) } value="approve" checked id={ "call-" (call.index) "-approve" }; " Approve" }
                        label { input type="radio" name={ "call-" (call.index) } value="deny" id={ "call-" (call.index) "-deny" }; " Deny" }
                        label for={ "message-" (call.index) } { "If denied, what the agent is told (optional)" }
                        input type="text" id={ "message-" (call.index) } name={ "message-" (call.index) } maxlength="4096";
                    }
                }
            }
            button.approve #decide-calls type="submit" name="by_call" value="true" {
                "Decide suspension " (card.suspension_seq) " call by call"
            }
        }
    }
}

fn history(events: &[RunEvent]) -> Markup {
    html! {
        section #history {
            h2 { "History" }
            ol.history {
                @for e in events {
                    li.event data-kind=(e.kind) data-sequence=(e.sequence) {
                        time datetime=(e.created_at.to_rfc3339()) { (when(e.created_at)) }
                        " "
                        span.sentence { (crate::history::tell(e)) }
                    }
                }
            }
        }
    }
}

/// Which of a card's forms a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedAs {
    /// The whole turn, approved or denied.
    Turn { approved: bool },
    /// The whole turn approved, with a standing grant for 8 hours.
    ApprovedWithGrant,
    /// Call by call.
    ByCall,
    /// New arguments for a call.
    Edit,
}

/// What became of a decision made in the inbox.
pub fn outcome(
    viewer: Viewer<'_>,
    run_id: &str,
    result: &Result<DecisionAccepted, Problem>,
    decided: DecidedAs,
    next: Option<RunId>,
    granted: Option<&Result<Vec<GivenGrant>, Problem>>,
) -> Markup {
    let (heading, code, explanation): (&str, &str, String) = match result {
        Ok(accepted) => (
            "Decision accepted",
            accepted.outcome,
            released_as(decided).to_owned(),
        ),
        Err(problem) => (
            "Decision refused",
            problem.code.code(),
            problem.code.title().to_owned(),
        ),
    };
    let stale =
        matches!(result, Err(p) if p.code == ProblemCode::Decision(DecisionOutcome::StaleTurn));
    layout(
        heading,
        Some(viewer),
        html! {
            p.back { a href="/inbox" { "← Inbox" } }
            section #outcome.outcome.accepted[result.is_ok()].refused[result.is_err()] {
                h1 { (heading) }
                p { "Outcome: " code #outcome-code { (code) } }
                p #outcome-explanation { (explanation) }
                (grant_outcome(granted))
                @if stale {
                    p #reload-hint role="alert" {
                        "This card is out of date: the run has moved on since this page was loaded. "
                        a #reload href={ "/inbox/runs/" (run_id) } { "Reload the card" }
                        " and decide on what it shows now."
                    }
                } @else {
                    p { a #back-to-run href={ "/inbox/runs/" (run_id) } { "Back to the run" } }
                }
            }
            (queue_nav(Queue { prev: None, next }))
        },
    )
}

/// What an accepted decision made with the form `decided` does to the turn.
fn released_as(decided: DecidedAs) -> &'static str {
    match decided {
        DecidedAs::Turn { approved: true } | DecidedAs::ApprovedWithGrant => "The turn is released: the writes run only if every preview still reads as you saw it; otherwise the run comes back with the moved calls marked.",
        DecidedAs::Turn { approved: false } => "The turn is released as denied: none of its calls runs, and the agent is told.",
        DecidedAs::ByCall => "The turn is released call by call: the approved calls run only if each still reads as you saw it without the denied ones; otherwise the run comes back with the moved calls marked. The agent is told of each denial.",
        DecidedAs::Edit => "The card is being issued anew with the new arguments: reload the run to see it previewed, marked as your edit. Nothing is written until someone approves it.",
    }
}

/// What became of the standing grant an approval asked for, if it asked for one.
fn grant_outcome(granted: Option<&Result<Vec<GivenGrant>, Problem>>) -> Markup {
    html! {
        @match granted {
            Some(Ok(grants)) => {
                p #grant-outcome {
                    "Standing grant given for 8 hours: "
                    @for (i, g) in grants.iter().enumerate() {
                        @if i > 0 { "; " }
                        code { (g.tool) } " on " (g.subjects.join(", "))
                        " (policy " code { (g.policy) } ")"
                    }
                    "."
                }
            }
            Some(Err(problem)) => {
                p #grant-outcome.error {
                    "No standing grant was given: " code { (problem.reason.as_deref().unwrap_or(problem.code.code())) } "."
                }
            }
            None => {}
        }
    }
}

/// A page for a problem of the inbox itself (not found, unavailable, …).
pub fn problem(viewer: Option<Viewer<'_>>, problem: &Problem) -> Markup {
    layout(
        "Problem",
        viewer,
        html! {
            p.back { a href="/inbox" { "← Inbox" } }
            h1 { "Something is in the way" }
            p { "Code: " code #problem-code { (problem.code.code()) } }
            p { (problem.code.title()) }
        },
    )
}
