//! The gates only a decision call by call or an edit can fail: what it names must be a call of
//! the card, an edit keeps its call's tool and fits that tool's schema, the approver may
//! release (or craft) each write it approves (or edits), and under four-eyes whoever edited a
//! card does not approve it alone.
//!
//! They read the card's facts the store keeps in clear beside the sealed state: the tool of
//! each call, the calls that landed under an earlier card of the turn, and who edited it.

use countersign_core::{ArgumentsEdit, CallIndex, DecisionMessage, ToolRegistry, ToolSpec};
use countersign_store::DecisionOutcome;

/// What the gates read of the card decided on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CardCalls<'a> {
    /// The tool of each call, in call order.
    pub tools: &'a [String],
    /// The calls that landed under an earlier card of the turn.
    pub landed: &'a [CallIndex],
    /// Who changed the arguments of a call of the card.
    pub editors: &'a [String],
}

/// The refusal of `d` by the gates of its calls and edits, if any. `permits` says whether the
/// approver may release a write of the tool `spec` describes; `four_eyes`, whether the agent
/// wants a second person.
pub(crate) fn refusal(
    d: &DecisionMessage,
    card: CardCalls<'_>,
    registry: &ToolRegistry,
    permits: impl Fn(&ToolSpec) -> bool,
    four_eyes: bool,
) -> Option<DecisionOutcome> {
    let n = card.tools.len();

    // A verdict per call: each call of the card once, none that it does not have.
    if !d.calls.is_empty() {
        let mut named: Vec<usize> = d.calls.iter().map(|c| c.index.get()).collect();
        named.sort_unstable();
        if named != (0..n).collect::<Vec<_>>() {
            return Some(DecisionOutcome::CallsNotOfTheCard);
        }
    }

    if let Some(refused) = d
        .edits
        .iter()
        .find_map(|edit| edit_refusal(d, edit, card, registry, &permits))
    {
        return Some(refused);
    }

    if d.approved && d.edits.is_empty() {
        return release_refusal(d, card, registry, &permits, four_eyes);
    }
    None
}

/// The refusal of one `edit` of `d`, if any: it must name a call of the card still to run,
/// keep its tool, fit the tool's schema, and be a write the approver may craft.
fn edit_refusal(
    d: &DecisionMessage,
    edit: &ArgumentsEdit,
    card: CardCalls<'_>,
    registry: &ToolRegistry,
    permits: &impl Fn(&ToolSpec) -> bool,
) -> Option<DecisionOutcome> {
    let i = edit.index;
    let Some(tool) = card.tools.get(i.get()) else {
        return Some(DecisionOutcome::EditNotOfTheCard);
    };
    if card.landed.contains(&i) {
        return Some(DecisionOutcome::EditNotOfTheCard);
    }
    if edit.tool.as_ref().is_some_and(|named| named != tool) {
        return Some(DecisionOutcome::EditChangesTool);
    }
    // A tool the registry does not know: nobody may craft its arguments.
    let Some(spec) = registry.get(tool).map(|t| t.spec().clone()) else {
        return Some(DecisionOutcome::ApproverNotPermitted);
    };
    let arguments = serde_json::Value::Object(edit.arguments.clone());
    if let Err(e) = spec.check_arguments(&arguments) {
        // The details quote the arguments: the log may have them, the record may not.
        tracing::info!(
            run.id = %d.run_id,
            decision.id = %d.decision_id,
            call.index = %i,
            tool = %tool,
            error = %e,
            "edit refused: its arguments do not fit the tool"
        );
        return Some(DecisionOutcome::EditInvalidArguments);
    }
    if spec.effect.is_write() && !permits(&spec) {
        return Some(DecisionOutcome::ApproverNotPermitted);
    }
    None
}

/// The refusal of an approval `d` that edits nothing, if any: under four-eyes its approver
/// did not edit the card, and they may release each write it lets run.
fn release_refusal(
    d: &DecisionMessage,
    card: CardCalls<'_>,
    registry: &ToolRegistry,
    permits: &impl Fn(&ToolSpec) -> bool,
    four_eyes: bool,
) -> Option<DecisionOutcome> {
    if four_eyes && card.editors.contains(&d.approver) {
        return Some(DecisionOutcome::EditorApprovalDenied);
    }
    // The approver may release each write the decision lets run. An unknown tool counts as
    // a non-idempotent write, and nobody is permitted to release it.
    let released = card
        .tools
        .iter()
        .enumerate()
        .filter(|(i, _)| approves(d, CallIndex::new(*i)))
        .all(|(_, name)| match registry.get(name) {
            None => false,
            Some(tool) => {
                let spec = tool.spec();
                !spec.effect.is_write() || permits(spec)
            }
        });
    (!released).then_some(DecisionOutcome::ApproverNotPermitted)
}

/// Whether `d` lets call `index` run: the whole turn approved, or this call approved.
fn approves(d: &DecisionMessage, index: CallIndex) -> bool {
    if d.calls.is_empty() {
        return d.approved;
    }
    d.calls.iter().any(|c| c.index == index && c.approved)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;
    use countersign_core::{
        ArgumentsEdit, CallVerdict, DataClass, Effect, ExecContext, RunId, SuspensionSeq, Tool,
        ToolError, ToolOutput, TurnDigest,
    };
    use serde_json::json;
    use uuid::Uuid;

    use super::*;

    #[derive(Debug)]
    struct Named(ToolSpec);

    #[async_trait]
    impl Tool for Named {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }

        async fn execute(
            &self,
            _: &ExecContext,
            _: &serde_json::Value,
        ) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::ok("done"))
        }
    }

    fn registry() -> ToolRegistry {
        let mut registry = ToolRegistry::new();
        for (name, effect, parameters) in [
            (
                "update_page",
                Effect::NonIdempotentWrite,
                json!({"type": "object", "required": ["uid"],
                       "properties": {"uid": {"type": "integer"}, "title": {"type": "string"}},
                       "additionalProperties": false}),
            ),
            (
                "delete_page",
                Effect::NonIdempotentWrite,
                json!({"type": "object"}),
            ),
            ("read_page", Effect::ReadOnly, json!({"type": "object"})),
        ] {
            registry.register(Arc::new(Named(ToolSpec {
                name: name.into(),
                description: String::new(),
                parameters,
                group: "editing".into(),
                data_class: DataClass::EditorContent,
                effect,
                enabled_by_default: false,
                requires_admin: false,
            })));
        }
        registry
    }

    fn decision() -> DecisionMessage {
        DecisionMessage {
            run_id: RunId::new(),
            suspension_seq: SuspensionSeq::FIRST,
            turn_digest: TurnDigest::parse(&"a".repeat(64)).unwrap(),
            approved: true,
            comment: None,
            calls: vec![],
            edits: vec![],
            decision_id: Uuid::now_v7(),
            approver: "alice".into(),
        }
    }

    fn verdict(index: usize, approved: bool) -> CallVerdict {
        CallVerdict {
            index: CallIndex::new(index),
            approved,
            message: None,
        }
    }

    fn edit(index: usize, tool: Option<&str>, arguments: serde_json::Value) -> ArgumentsEdit {
        ArgumentsEdit {
            index: CallIndex::new(index),
            tool: tool.map(str::to_owned),
            arguments: arguments.as_object().unwrap().clone(),
        }
    }

    const TOOLS: [&str; 3] = ["update_page", "read_page", "delete_page"];

    fn gate(
        d: &DecisionMessage,
        landed: &[CallIndex],
        editors: &[&str],
        may_delete: bool,
    ) -> Option<DecisionOutcome> {
        let tools: Vec<String> = TOOLS.iter().map(|t| (*t).to_owned()).collect();
        let editors: Vec<String> = editors.iter().map(|e| (*e).to_owned()).collect();
        let card = CardCalls {
            tools: &tools,
            landed,
            editors: &editors,
        };
        refusal(
            d,
            card,
            &registry(),
            |spec| may_delete || spec.name != "delete_page",
            true,
        )
    }

    #[test]
    fn a_verdict_per_call_must_name_each_call_of_the_card_once() {
        let mut d = decision();
        d.calls = vec![verdict(0, true), verdict(1, false), verdict(2, false)];
        assert_eq!(gate(&d, &[], &[], false), None);
        d.calls.pop();
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::CallsNotOfTheCard)
        );
        d.calls = vec![verdict(0, true), verdict(1, true), verdict(3, false)];
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::CallsNotOfTheCard)
        );
    }

    #[test]
    fn only_the_writes_approved_need_the_approvers_permission() {
        let mut d = decision();
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::ApproverNotPermitted),
            "the whole turn releases delete_page"
        );
        d.calls = vec![verdict(0, true), verdict(1, true), verdict(2, false)];
        assert_eq!(
            gate(&d, &[], &[], false),
            None,
            "denying it needs no permission"
        );
        d.calls[2].approved = true;
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::ApproverNotPermitted)
        );
        assert_eq!(gate(&d, &[], &[], true), None);
    }

    #[test]
    fn an_edit_keeps_its_calls_tool_fits_its_schema_and_names_a_call_still_to_run() {
        let mut d = decision();
        d.approved = false;
        d.edits = vec![edit(
            0,
            Some("update_page"),
            json!({"uid": 12, "title": "Shop"}),
        )];
        assert_eq!(gate(&d, &[], &[], false), None);
        d.edits = vec![edit(0, None, json!({"uid": 12}))];
        assert_eq!(
            gate(&d, &[], &[], false),
            None,
            "naming the tool is optional"
        );
        d.edits = vec![edit(0, Some("delete_page"), json!({"uid": 12}))];
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::EditChangesTool)
        );
        d.edits = vec![edit(0, None, json!({"uid": "twelve"}))];
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::EditInvalidArguments)
        );
        d.edits = vec![edit(0, None, json!({"uid": 12, "extra": true}))];
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::EditInvalidArguments)
        );
        d.edits = vec![edit(3, None, json!({}))];
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::EditNotOfTheCard)
        );
        d.edits = vec![edit(0, None, json!({"uid": 12}))];
        assert_eq!(
            gate(&d, &[CallIndex::new(0)], &[], false),
            Some(DecisionOutcome::EditNotOfTheCard),
            "a call that landed is not edited"
        );
        d.edits = vec![edit(2, None, json!({"uid": 12}))];
        assert_eq!(
            gate(&d, &[], &[], false),
            Some(DecisionOutcome::ApproverNotPermitted),
            "whoever may not release a write may not craft it"
        );
    }

    #[test]
    fn under_four_eyes_whoever_edited_the_card_does_not_approve_it_alone() {
        let d = decision();
        assert_eq!(
            gate(&d, &[], &["alice"], true),
            Some(DecisionOutcome::EditorApprovalDenied)
        );
        assert_eq!(gate(&d, &[], &["bob"], true), None);
        let mut deny = decision();
        deny.approved = false;
        assert_eq!(
            gate(&deny, &[], &["alice"], true),
            None,
            "a denial is theirs to make"
        );
        let tools: Vec<String> = TOOLS.iter().map(|t| (*t).to_owned()).collect();
        let editors = vec!["alice".to_owned()];
        let card = CardCalls {
            tools: &tools,
            landed: &[],
            editors: &editors,
        };
        assert_eq!(
            refusal(&d, card, &registry(), |_| true, false),
            None,
            "without four-eyes"
        );
    }
}
