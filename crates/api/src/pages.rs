//! The inbox's HTML, as maud templates.
//!
//! Every string that comes from a model, a tool, the content store or a user — previews,
//! arguments, names, comments, event payloads — is spliced with maud's `(…)`, which escapes
//! it; nothing here uses `PreEscaped`. A preview is untrusted text: `<script>` in one is shown
//! as those characters. The pages carry no script; the Content-Security-Policy forbids any.

use chrono::{DateTime, Utc};
use countersign_core::card::{ApprovalCard, CardPreview};
use countersign_store::{DecisionOutcome, RunEvent, RunRecord, RunStatus, WaitingRun};
use maud::{html, Markup, DOCTYPE};

use crate::problem::{Problem, ProblemCode};
use crate::v1::DecisionAccepted;

/// The stylesheet, served at [`STYLESHEET_PATH`].
pub const STYLESHEET: &str = include_str!("../static/inbox.css");
pub const STYLESHEET_PATH: &str = "/inbox/static/inbox.css";

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

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// The list of waiting runs.
pub fn inbox(
    viewer: Viewer<'_>,
    entries: &[WaitingRun],
    next: Option<&str>,
    now: DateTime<Utc>,
) -> Markup {
    layout(
        "Inbox",
        Some(viewer),
        html! {
            h1 { "Waiting for your decision" }
            @if entries.is_empty() {
                p #inbox-empty { "No run is waiting for a decision you may make." }
            } @else {
                table #inbox-runs {
                    thead { tr {
                        th { "Run" } th { "Agent" } th { "Acting as" } th { "Waiting" }
                        th { "Decide by" } th { "Proposed calls" }
                    } }
                    tbody {
                        @for e in entries {
                            tr.inbox-run data-run-id=(e.run_id) {
                                td { a.run-link href={ "/inbox/runs/" (e.run_id) } {
                                    code { (short(&e.run_id.to_string())) }
                                } }
                                td.agent { (e.agent) }
                                td { (e.acting_user) }
                                td.age title=(when(e.waiting_since)) { (age(e.waiting_since, now)) }
                                td { (when(e.approval_deadline)) }
                                td { (e.pending_tools.join(", ")) }
                            }
                        }
                    }
                }
                @if let Some(cursor) = next {
                    p { a #next-page href={ "/inbox?cursor=" (cursor) } { "Next page →" } }
                }
            }
        },
    )
}

fn short(id: &str) -> &str {
    id.get(..13).unwrap_or(id)
}

/// A run: its card and the decision form when it waits, and its history.
pub fn run_page(
    viewer: Viewer<'_>,
    run: &RunRecord,
    card: Option<&ApprovalCard>,
    decision_id: &str,
    events: &[RunEvent],
) -> Markup {
    layout(
        "Run",
        Some(viewer),
        html! {
            p.back { a href="/inbox" { "← Inbox" } }
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
                (card_section(card))
                (decision_form(viewer, run, card, decision_id))
            } @else if run.status == RunStatus::WaitingForApproval {
                p.error { "This run's card cannot be shown (its state does not open)." }
            }
            (history(events))
        },
    )
}

fn card_section(card: &ApprovalCard) -> Markup {
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
                article.call.moved[call.moved].landed[call.landed] data-index=(call.index) data-tool=(call.tool) {
                    h3 {
                        "Call " (call.index) " · " code { (call.tool) }
                        @if call.moved { " " span.moved-mark { "⚠ moved" } }
                        @if call.landed { " " span.landed-mark { "✓ written" } }
                    }
                    @if call.landed {
                        p.notice.landed { (countersign_core::card::LANDED_NOTICE) }
                    }
                    @match &call.preview {
                        CardPreview::Shown { lines } => {
                            ul.preview-lines { @for line in lines { li { (line) } } }
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
                            p.notice.none { "This tool has no preview; the arguments are all there is." }
                        }
                    }
                    details.arguments {
                        summary { "Arguments" }
                        pre { (serde_json::to_string_pretty(&call.arguments).unwrap_or_default()) }
                    }
                }
            }
            p.caption #caption { (card.caption) " Captured at " (card.captured_at) "." }
        }
    }
}

fn decision_form(
    viewer: Viewer<'_>,
    run: &RunRecord,
    card: &ApprovalCard,
    decision_id: &str,
) -> Markup {
    html! {
        form.card-form #decide method="post" action={ "/inbox/runs/" (run.id) "/decide" } {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="decision_id" value=(decision_id);
            input type="hidden" name="suspension_seq" value=(card.suspension_seq);
            input type="hidden" name="turn_digest" value=(card.turn_digest);
            label for="comment" { "Comment (optional; shown to the agent on a denial)" }
            textarea #comment name="comment" maxlength="4096" rows="3" {}
            div.buttons {
                button.approve #approve type="submit" name="approved" value="true" {
                    "Approve suspension " (card.suspension_seq)
                }
                button.deny #deny type="submit" name="approved" value="false" { "Deny" }
            }
            p.hint {
                "You decide on exactly this card. If the run has moved on since it was shown, the "
                "decision is refused and nothing changes."
            }
        }
    }
}

fn history(events: &[RunEvent]) -> Markup {
    html! {
        section #history {
            h2 { "History" }
            table {
                thead { tr { th { "#" } th { "When" } th { "Event" } th { "Details (codes only)" } } }
                tbody {
                    @for e in events {
                        tr.event data-kind=(e.kind) {
                            td { (e.sequence) }
                            td { (when(e.created_at)) }
                            td { code { (e.kind) } }
                            td.payload { (e.payload.to_string()) }
                        }
                    }
                }
            }
        }
    }
}

/// What became of a decision made in the inbox.
pub fn outcome(
    viewer: Viewer<'_>,
    run_id: &str,
    result: &Result<DecisionAccepted, Problem>,
    approved: bool,
) -> Markup {
    let (heading, code, explanation): (&str, &str, String) = match result {
        Ok(accepted) => (
            "Decision accepted",
            accepted.outcome,
            if approved {
                "The turn is released: the writes run only if every preview still reads as you saw it; otherwise the run comes back with the moved calls marked.".to_owned()
            } else {
                "The turn is released as denied: none of its calls runs, and the agent is told."
                    .to_owned()
            },
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
        },
    )
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
