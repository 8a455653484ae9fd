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
        Ok(EventName::RunSuspended) => suspended(p, &card),
        Ok(EventName::RunPreviewMoved) => moved(p, &card),
        Ok(EventName::DecisionAccepted) => accepted(p, &card),
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
        // An expiry is told as an expiry: nobody decided, nobody denied.
        Ok(EventName::RunCancelled)
            if text("termination_reason").as_deref()
                == Some(TerminationReason::ApprovalExpired.as_str()) =>
        {
            format!("Expired — {}", ended(TerminationReason::ApprovalExpired))
        }
        Ok(EventName::RunCancelled) => "Cancelled".to_owned(),
        Ok(EventName::CardApprovalRecorded | EventName::CardDenialRecorded) => vote(p, &card),
        Ok(EventName::CardReminded) => format!("Approvers reminded{card}"),
        Ok(EventName::CardEscalated) => {
            let to = text("backup_group").map_or_else(String::new, |g| format!(" to {g}"));
            format!("Escalated{to}{card}")
        }
        // Announced about a tool, never recorded on a run.
        Ok(EventName::ToolWithheld) => event.kind.clone(),
        Err(_) if event.kind == "tool_write" => written(p, &card),
        Err(_) if event.kind == POLICY_EVALUATED => evaluated(p, &card),
        Err(_) => event.kind.clone(),
    }
}

/// A suspension in words, with how many of its previews failed.
fn suspended(p: &Value, card: &str) -> String {
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

/// A decision that released the card, in words: an edit, a decision call by call, or one on
/// the whole turn (by a person or a policy).
fn accepted(p: &Value, card: &str) -> String {
    let text = |key: &str| p.get(key).and_then(Value::as_str).map(str::to_owned);
    if text("kind").as_deref() == Some("edit") {
        let calls = indexes(p, "edited_calls");
        let who = text("approver").map_or_else(String::new, |w| format!(" by {w}"));
        return format!("Arguments of call{calls} edited{who}{card}; the card is issued anew");
    }
    if text("kind").as_deref() == Some("calls") {
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
        return s;
    }
    let verb = match p.get("approved").and_then(Value::as_bool) {
        Some(false) => "Denied",
        _ => "Approved",
    };
    let comment = if p.get("has_comment").and_then(Value::as_bool) == Some(true) {
        ", with a comment"
    } else {
        ""
    };
    match by_policy(p).or_else(|| text("approver")) {
        Some(who) => format!("{verb} by {who}{card}{comment}"),
        None => format!("{verb}{card}{comment}"),
    }
}

/// A vote recorded under a quorum, in words, with whom it was cast for.
fn vote(p: &Value, card: &str) -> String {
    let text = |key: &str| p.get(key).and_then(Value::as_str).map(str::to_owned);
    let verb = match p.get("approved").and_then(Value::as_bool) {
        Some(false) => "Denial",
        _ => "Approval",
    };
    let who = text("approver").map_or_else(String::new, |w| format!(" by {w}"));
    let behalf = p
        .get("on_behalf_of")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .map(|a| {
            let names: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
            format!(" for {}", names.join(", "))
        })
        .unwrap_or_default();
    format!("{verb} recorded{who}{behalf}{card}; waiting for the other approvers")
}

/// The audit event of a policy's evaluation of a card.
const POLICY_EVALUATED: &str = "policy_evaluated";

/// The policy that made a decision, in words, when one did (its audit event names it).
fn by_policy(p: &Value) -> Option<String> {
    let policy = p.get("policy").filter(|v| v.is_object())?;
    Some(policy_named(policy, "policy"))
}

/// `policy marketing-descriptions v3, rule 2`, from a payload naming the policy under `key`.
fn policy_named(p: &Value, key: &str) -> String {
    let name = p.get(key).and_then(Value::as_str).unwrap_or("?");
    let mut s = format!("policy {name}");
    if let Some(v) = p.get("version").and_then(Value::as_u64) {
        s.push_str(&format!(" v{v}"));
    }
    if let Some(rule) = p.get("rule").and_then(Value::as_u64) {
        s.push_str(&format!(", rule {rule}"));
    }
    s
}

/// A policy's evaluation: what a shadowed one would have done, or that an enforced one asked a
/// person (an enforced approval or denial has its own decision sentence).
fn evaluated(p: &Value, card: &str) -> String {
    let named = policy_named(p, "policy");
    let outcome = p.get("outcome").and_then(Value::as_str).unwrap_or("ask");
    let shadow = p.get("mode").and_then(Value::as_str) == Some("shadow");
    let reason = p
        .get("reason")
        .and_then(Value::as_str)
        .map_or_else(String::new, |r| format!(" ({})", r.replace('_', " ")));
    match (shadow, outcome) {
        (true, "approve") => format!("A policy would have approved this: {named}{card}"),
        (true, "deny") => format!("A policy would have denied this: {named}{card}"),
        (true, _) => format!("A policy would have asked a person: {named}{reason}{card}"),
        (false, "approve") => format!("Approval by {named}{card}"),
        (false, "deny") => format!("Denial by {named}{card}"),
        (false, _) => format!("Left to a person by {named}{reason}{card}"),
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
        Ok(D::NotInApproverGroups) => "the approver is in none of the groups that decide the card",
        Ok(D::AlreadyVoted) => "the approver had voted on this card already",
        Ok(D::QuorumCallsDiffer) => "it approved other calls than the approvals before it",
        Ok(D::ApprovalRecorded | D::DenialRecorded) => "it was recorded as a vote",
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

    #[test]
    fn a_policys_decision_and_evaluations_read_as_which_policy_and_rule() {
        assert_eq!(
            said(
                "decision.accepted",
                json!({"suspension_seq": 1, "approver": "policy:marketing-descriptions@3",
                       "approved": true,
                       "policy": {"policy": "marketing-descriptions", "version": 3, "rule": 2,
                                  "facts_digest": "ab", "mode": "enforce"}})
            ),
            "Approved by policy marketing-descriptions v3, rule 2 — card 1"
        );
        assert_eq!(
            said(
                "policy_evaluated",
                json!({"suspension_seq": 2, "policy": "marketing-descriptions", "version": 3,
                       "mode": "shadow", "outcome": "approve", "rule": 2})
            ),
            "A policy would have approved this: policy marketing-descriptions v3, rule 2 — card 2"
        );
        assert_eq!(
            said(
                "policy_evaluated",
                json!({"suspension_seq": 1, "policy": "overflowing", "version": 1,
                       "mode": "enforce", "outcome": "ask", "reason": "evaluation_error"})
            ),
            "Left to a person by policy overflowing v1 (evaluation error) — card 1"
        );
    }

    #[test]
    fn votes_reminders_escalations_and_an_expiry_read_as_what_they_were() {
        assert_eq!(
            said(
                "card.approval_recorded",
                json!({"suspension_seq": 1, "approver": "erin", "approved": true,
                       "on_behalf_of": ["alice"]})
            ),
            "Approval recorded by erin for alice — card 1; waiting for the other approvers"
        );
        assert_eq!(
            said("card.reminded", json!({"suspension_seq": 2})),
            "Approvers reminded — card 2"
        );
        assert_eq!(
            said(
                "card.escalated",
                json!({"suspension_seq": 2, "backup_group": "backup"})
            ),
            "Escalated to backup — card 2"
        );
        let expired = said(
            "run.cancelled",
            json!({"termination_reason": "approval_expired"}),
        );
        assert_eq!(expired, "Expired — nobody decided before the deadline");
        assert!(!expired.contains("enied"), "an expiry is no denial");
    }
}
