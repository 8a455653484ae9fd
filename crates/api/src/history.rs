//! A run's audit trail in words, for the inbox: each event as a sentence an editor reads at a
//! glance (`Approved by admin — card 1`), with its actor when the event names one.
//!
//! The sentence is made from the event's kind and its payload of ids, codes and counts only —
//! nothing of the run's content is in either — so it can say no more than the API's codes do;
//! the codes stay in the API and in the page's `data-kind`. An event this version does not
//! know reads as its kind, never as an error.

use countersign_core::{EventName, TerminationReason};
use countersign_store::{DecisionOutcome, RunEvent};
use serde_json::Value;

/// `event` in words, naming its actor when the event names one (the approver of a decision).
pub fn tell(event: &RunEvent) -> String {
    let p = &event.payload;
    let text = |key: &str| p.get(key).and_then(Value::as_str).map(str::to_owned);
    let card = p
        .get("suspension_seq")
        .and_then(Value::as_u64)
        .map(|seq| format!(" — card {seq}"))
        .unwrap_or_default();
    match event.kind.parse::<EventName>() {
        Ok(EventName::RunAccepted) => "Run requested".to_owned(),
        Ok(EventName::RunRefused) => "Run request refused".to_owned(),
        Ok(EventName::RunSuspended) => {
            let failed = p
                .get("failed_previews")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let mut s = format!("Suspended for approval{card}");
            if failed > 0 {
                s.push_str(&format!(
                    " ({failed} preview{} failed)",
                    if failed == 1 { "" } else { "s" }
                ));
            }
            s
        }
        Ok(EventName::RunPreviewMoved) => moved(p, &card),
        Ok(EventName::DecisionAccepted) if text("kind").as_deref() == Some("edit") => {
            let calls = indexes(p, "edited_calls");
            let who = text("approver").map_or_else(String::new, |w| format!(" by {w}"));
            format!("Arguments of call{calls} edited{who}{card}; the card is issued anew")
        }
        Ok(EventName::DecisionAccepted) if text("kind").as_deref() == Some("calls") => {
            let who = text("approver").map_or_else(String::new, |w| format!(" by {w}"));
            let approved = indexes(p, "approved_calls");
            let denied = indexes(p, "denied_calls");
            let mut s = format!("Decided call by call{who}{card}");
            if !approved.is_empty() {
                s.push_str(&format!(": approved call{approved}"));
            }
            if !denied.is_empty() {
                s.push_str(&format!(
                    "{} denied call{denied}",
                    if approved.is_empty() { ":" } else { ";" }
                ));
            }
            s
        }
        Ok(EventName::DecisionAccepted) => {
            let verb = match p.get("approved").and_then(Value::as_bool) {
                Some(false) => "Denied",
                _ => "Approved",
            };
            let comment = if p.get("has_comment").and_then(Value::as_bool) == Some(true) {
                ", with a comment"
            } else {
                ""
            };
            match text("approver") {
                Some(who) => format!("{verb} by {who}{card}{comment}"),
                None => format!("{verb}{card}{comment}"),
            }
        }
        Ok(EventName::DecisionRefused) => {
            let why = text("outcome").map_or_else(String::new, |o| format!(": {}", refusal(&o)));
            format!("A decision was refused{card}{why}")
        }
        Ok(EventName::RunCompleted) => "Completed".to_owned(),
        Ok(EventName::RunFailed) => {
            let reason = text("termination_reason")
                .and_then(|r| r.parse::<TerminationReason>().ok())
                .map_or("for a reason this version does not know", ended);
            format!("Failed — {reason}")
        }
        Ok(EventName::RunCancelled) => "Cancelled".to_owned(),
        // Announced about a tool, never recorded on a run.
        Ok(EventName::ToolWithheld) => event.kind.clone(),
        Err(_) if event.kind == "tool_write" => written(p, &card),
        Err(_) => event.kind.clone(),
    }
}

/// The call indexes of the payload's array `key`, as `s 0, 2` (or ` 1` for one); empty when
/// there are none.
fn indexes(p: &Value, key: &str) -> String {
    let calls: Vec<String> = p
        .get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|i| i.to_string())
                .collect()
        })
        .unwrap_or_default();
    match calls.as_slice() {
        [] => String::new(),
        [one] => format!(" {one}"),
        many => format!("s {}", many.join(", ")),
    }
}

fn moved(p: &Value, card: &str) -> String {
    let calls: Vec<String> = p
        .get("stale_call_indexes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|i| i.to_string())
                .collect()
        })
        .unwrap_or_default();
    let subject = match calls.as_slice() {
        [] => "A preview".to_owned(),
        [one] => format!("The preview of call {one}"),
        many => format!("The previews of calls {}", many.join(", ")),
    };
    format!("{subject} moved; nothing written{card}")
}

fn written(p: &Value, card: &str) -> String {
    let tool = p.get("tool").and_then(Value::as_str).unwrap_or("a tool");
    let call = p
        .get("call_index")
        .and_then(Value::as_u64)
        .map(|i| format!(", call {i}"))
        .unwrap_or_default();
    if p.get("is_error").and_then(Value::as_bool) == Some(true) {
        format!("Refused by the tool: {tool}{card}{call}")
    } else {
        format!("Written: {tool}{card}{call}")
    }
}

/// Why a decision was refused, for an editor.
fn refusal(outcome: &str) -> &'static str {
    use DecisionOutcome as D;
    match outcome.parse::<DecisionOutcome>() {
        Ok(D::StaleTurn) => "the card it was made on was out of date",
        Ok(D::NotAwaitingApproval) => "the run was not waiting for a decision",
        Ok(D::AccessDenied | D::ApproverNotPermitted) => "the approver may not decide on this run",
        Ok(D::SelfApprovalDenied) => "a run may not be approved by the user it acts as",
        Ok(D::IdempotencyConflict) => "its decision id was taken by another decision",
        Ok(D::ConfigurationGone) => "the agent's configuration is gone",
        Ok(D::CallsNotOfTheCard) => "it did not decide each call of the card once",
        Ok(D::EditNotOfTheCard) => {
            "it edited a call the card does not have, or one already written"
        }
        Ok(D::EditChangesTool) => "an edit may not change which tool a call runs",
        Ok(D::EditInvalidArguments) => "the new arguments do not fit the tool",
        Ok(D::EditorApprovalDenied) => "whoever edited the card may not approve it alone",
        Ok(D::NotAuditable) => "it could not be recorded",
        Ok(D::Accepted) | Err(_) => "it did not pass the coordinator's checks",
    }
}

/// How a run ended, for an editor.
fn ended(reason: TerminationReason) -> &'static str {
    match reason {
        TerminationReason::Completed => "completed",
        TerminationReason::MaxIterations => "the agent took more turns than it may",
        TerminationReason::ApprovalDenied => "the approval was denied",
        TerminationReason::ApprovalExpired => "nobody decided before the deadline",
        TerminationReason::ProviderFailed => "the model provider failed",
        TerminationReason::StateUnreadable => "the run's stored state does not open",
        TerminationReason::RetriesExhausted => "it was retried as often as it may be",
        TerminationReason::NotRetryable => "a failure that retrying cannot mend",
        TerminationReason::SuspendFailed => "its card could not be made",
        TerminationReason::Cancelled => "it was cancelled",
        TerminationReason::OutcomeUnknown => {
            "a write was sent and no answer came back: it may have landed"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, payload: Value) -> RunEvent {
        RunEvent {
            sequence: 1,
            kind: kind.to_owned(),
            round: None,
            duration_ms: None,
            payload,
            sealed: None,
            created_at: chrono::Utc::now(),
        }
    }

    fn said(kind: &str, payload: Value) -> String {
        tell(&event(kind, payload))
    }

    #[test]
    fn a_decision_call_by_call_and_an_edit_read_as_what_they_did() {
        assert_eq!(
            said(
                "decision.accepted",
                json!({"suspension_seq": 1, "approver": "admin", "approved": true, "kind": "calls",
                       "approved_calls": [0, 2], "denied_calls": [1]})
            ),
            "Decided call by call by admin — card 1: approved calls 0, 2; denied call 1"
        );
        assert_eq!(
            said(
                "decision.accepted",
                json!({"suspension_seq": 2, "approver": "approver", "approved": false,
                       "kind": "edit", "edited_calls": [0]})
            ),
            "Arguments of call 0 edited by approver — card 2; the card is issued anew"
        );
        assert_eq!(
            said(
                "decision.refused",
                json!({"suspension_seq": 2, "outcome": "editor_approval_denied"})
            ),
            "A decision was refused — card 2: whoever edited the card may not approve it alone"
        );
    }

    #[test]
    fn each_event_of_a_bounced_and_approved_run_reads_as_a_sentence() {
        assert_eq!(
            said(
                "run.suspended",
                json!({"suspension_seq": 1, "failed_previews": 0})
            ),
            "Suspended for approval — card 1"
        );
        assert_eq!(
            said(
                "decision.accepted",
                json!({"approved": true, "approver": "admin", "suspension_seq": 1})
            ),
            "Approved by admin — card 1"
        );
        assert_eq!(
            said(
                "run.preview_moved",
                json!({"suspension_seq": 2, "stale_call_indexes": [1]})
            ),
            "The preview of call 1 moved; nothing written — card 2"
        );
        assert_eq!(
            said(
                "tool_write",
                json!({"tool": "update_page_metadata", "call_index": 0, "suspension_seq": 2, "is_error": false})
            ),
            "Written: update_page_metadata — card 2, call 0"
        );
        assert_eq!(
            said(
                "decision.refused",
                json!({"outcome": "stale_turn", "suspension_seq": 1})
            ),
            "A decision was refused — card 1: the card it was made on was out of date"
        );
        assert_eq!(said("run.completed", json!({})), "Completed");
    }

    #[test]
    fn a_denial_a_failure_and_an_unknown_event_read_without_codes() {
        assert_eq!(
            said(
                "decision.accepted",
                json!({"approved": false, "approver": "ana", "suspension_seq": 3, "has_comment": true})
            ),
            "Denied by ana — card 3, with a comment"
        );
        assert_eq!(
            said(
                "run.failed",
                json!({"termination_reason": "outcome_unknown"})
            ),
            "Failed — a write was sent and no answer came back: it may have landed"
        );
        assert_eq!(said("lease.moved", json!({})), "lease.moved");
    }
}
