//! The engine over hand-made facts: outcomes, rules, fail-closed paths and load refusals.

use countersign_core::{CallIndex, CallPreview, LineForm};

use crate::*;

const MARKETING: &str = r#"// policy: marketing-descriptions
// version: 3

// Rule 1: anything classed secret_adjacent is denied.
@message("Secret-adjacent data is not written by agents.")
permit (principal, action == Action::"deny", resource)
when { context.call.data_class == "secret_adjacent" };

// Rule 2: a description change of at most 160 characters by seo-assistant is approved.
permit (
  principal == Agent::"seo-assistant",
  action == Action::"approve",
  resource == Tool::"content.set_page_fields"
) when {
  context.call.preview.changed_fields == ["description"] &&
  context.call.preview.max_after_chars <= 160 &&
  context.call.subject_ids.contains("page:12")
};

// Rule 3: a write that removes anything is asked.
forbid (principal, action == Action::"approve", resource)
when { context.call.preview.removes };
"#;

fn change_preview(before: &str, after: &str) -> PreviewFacts {
    let preview = CallPreview {
        index: CallIndex::new(0),
        tool: "content.set_page_fields".into(),
        lines: vec![
            "Page [12] \"Shoes\"".into(),
            format!("description: \"{before}\" → \"{after}\""),
        ],
        failed: false,
        forms: vec![
            None,
            Some(LineForm::Change {
                before: before.into(),
                after: after.into(),
            }),
        ],
        alone: false,
        full: vec![],
    };
    PreviewFacts::of(&preview)
}

fn card(agent: &str, data_class: &str, preview: PreviewFacts) -> CardFacts {
    CardFacts {
        agent: agent.into(),
        acting_user: "editor".into(),
        request_kind: "run_request".into(),
        writes_in_turn: 1,
        writes_by_agent_last_hour: 0,
        tokens_used: 100,
        calls: vec![CallFacts {
            index: 0,
            tool: "content.set_page_fields".into(),
            effect: "idempotent_write".into(),
            group: "editing".into(),
            data_class: data_class.into(),
            args: vec![Arg {
                name: "page".into(),
                text: "12".into(),
            }],
            arg_names: vec!["page".into()],
            subject_ids: vec!["page:12".into()],
            preview,
        }],
    }
}

fn marketing() -> Policy {
    Policy::load(MARKETING).expect("the example loads")
}

#[test]
fn the_shipped_schema_parses() {
    let _ = schema();
}

#[test]
fn a_short_description_change_by_the_named_agent_is_approved_by_its_rule() {
    let facts = card(
        "seo-assistant",
        "editor_content",
        change_preview("Old", "New text"),
    );
    let e = marketing().evaluate(&facts);
    assert_eq!(e.outcome, Outcome::Approve);
    assert_eq!(e.rule, Some(2));
    assert_eq!(e.facts_digest, facts.digest());
}

#[test]
fn a_description_longer_than_the_rule_allows_is_asked() {
    let long = "x".repeat(161);
    let facts = card(
        "seo-assistant",
        "editor_content",
        change_preview("Old", &long),
    );
    let e = marketing().evaluate(&facts);
    assert_eq!(
        e.outcome,
        Outcome::Ask {
            reason: AskReason::NoRule
        }
    );
}

#[test]
fn another_agent_is_asked() {
    let facts = card("other", "editor_content", change_preview("Old", "New"));
    assert!(matches!(
        marketing().evaluate(&facts).outcome,
        Outcome::Ask { .. }
    ));
}

#[test]
fn a_cleared_value_counts_as_a_removal_and_is_asked() {
    let facts = card("seo-assistant", "editor_content", change_preview("Old", ""));
    assert!(facts.calls[0].preview.removes);
    assert!(matches!(
        marketing().evaluate(&facts).outcome,
        Outcome::Ask { .. }
    ));
}

#[test]
fn secret_adjacent_data_is_denied_with_the_rules_message() {
    let facts = card("seo-assistant", "secret_adjacent", change_preview("a", "b"));
    let e = marketing().evaluate(&facts);
    assert_eq!(
        e.outcome,
        Outcome::Deny {
            message: "Secret-adjacent data is not written by agents.".into()
        }
    );
    assert_eq!(e.rule, Some(1));
}

#[test]
fn a_card_without_writes_is_asked() {
    let mut facts = card("seo-assistant", "editor_content", change_preview("a", "b"));
    facts.calls.clear();
    let e = marketing().evaluate(&facts);
    assert_eq!(
        e.outcome,
        Outcome::Ask {
            reason: AskReason::NoWrites
        }
    );
}

#[test]
fn a_rule_that_errors_at_evaluation_asks_a_person() {
    // Long overflow is an evaluation error in Cedar; it validates.
    let source = r#"// policy: overflow
// version: 1
permit (principal, action == Action::"approve", resource)
when { context.tokens_used * 9223372036854775807 > 0 };
"#;
    let policy = Policy::load(source).expect("it validates");
    let facts = card("seo-assistant", "editor_content", change_preview("a", "b"));
    let e = policy.evaluate(&facts);
    assert_eq!(
        e.outcome,
        Outcome::Ask {
            reason: AskReason::EvaluationError
        }
    );
}

#[test]
fn a_rule_naming_an_attribute_the_schema_lacks_is_refused_naming_its_line() {
    let source = "// policy: broken\n// version: 1\n\npermit (principal, action == Action::\"approve\", resource)\nwhen { context.call.preview.colour == \"red\" };\n";
    let e = Policy::load(source).expect_err("it does not validate");
    assert_eq!(e.code(), "policy_invalid");
    assert!(e.line() == 4 || e.line() == 5, "line {}", e.line());
    assert!(e.to_string().starts_with(&format!("line {}:", e.line())));
}

#[test]
fn a_syntax_error_is_refused_naming_its_line() {
    let source = "// policy: broken\n// version: 1\npermit (principal, action, resource)\nwhen { context.call.tool == };\n";
    let e = Policy::load(source).expect_err("it does not parse");
    assert_eq!(e.code(), "policy_syntax");
    assert_eq!(e.line(), 4);
}

#[test]
fn a_file_without_its_header_is_refused() {
    let e = Policy::load("permit (principal, action, resource);").expect_err("no header");
    assert_eq!(e.code(), "policy_header");
}

#[test]
fn the_header_names_the_principal_and_the_mode() {
    let shadow = MARKETING.replace("// version: 3", "// version: 3\n// mode: shadow");
    let policy = Policy::load(&shadow).expect("loads");
    assert_eq!(policy.mode, Mode::Shadow);
    assert_eq!(policy.principal(), "policy:marketing-descriptions@3");
    assert_eq!(policy.rules(), 3);
}

#[test]
fn a_list_gaining_an_item_appended_last_is_seen_as_such() {
    let preview = CallPreview {
        index: CallIndex::new(0),
        tool: "content.attach_file".into(),
        lines: vec!["field image: 2 reference(s) → 3, appended last".into()],
        failed: false,
        forms: vec![Some(LineForm::List {
            items: vec!["a".into(), "b".into(), "c".into()],
            added: 2,
        })],
        alone: false,
        full: vec![],
    };
    let facts = PreviewFacts::of(&preview);
    assert_eq!(facts.list_items_gained, 1);
    assert!(facts.appended_last);
    assert!(!facts.removes);
}

#[test]
fn a_changed_file_is_read_again_and_a_broken_edit_keeps_the_last_good_version() {
    let dir = std::env::temp_dir().join(format!("policy-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("p.cedar");
    std::fs::write(&path, MARKETING).expect("write");
    let source = PolicySource::open(std::slice::from_ref(&path)).expect("loads");
    assert_eq!(source.current().0.policies[0].version, 3);

    let v4 = MARKETING.replace("// version: 3", "// version: 4");
    std::fs::write(&path, &v4).expect("write");
    bump(&path);
    assert_eq!(source.current().0.policies[0].version, 4);

    std::fs::write(&path, "// policy: x\n// version: 5\npermit (").expect("write");
    bump(&path);
    let (loaded, refusals) = source.current();
    assert_eq!(loaded.policies[0].version, 4);
    assert_eq!(refusals.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Moves the file's modification time on, whatever the file system's resolution.
fn bump(path: &std::path::Path) {
    let file = std::fs::File::options()
        .append(true)
        .open(path)
        .expect("open");
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    file.set_modified(later).expect("set time");
}

#[test]
fn the_facts_of_a_call_fit_the_shipped_schema() {
    let facts = card(
        "seo-assistant",
        "editor_content",
        change_preview("Old", "New"),
    );
    assert!(crate::engine::fits_schema(&facts, &facts.calls[0]));
}

#[test]
fn a_generated_grant_approves_the_same_tool_on_the_same_subject_and_nothing_else() {
    let facts = card(
        "seo-assistant",
        "editor_content",
        change_preview("Old", "New"),
    );
    grantable(&facts.calls[0]).expect("grantable");
    let source = grant_source("0123abcd", "seo-assistant", &facts.calls[0]);
    let grant = Policy::load(&source).expect("the generated policy validates");
    assert_eq!(grant.principal(), "policy:grant-0123abcd@1");
    assert_eq!(grant.evaluate(&facts).outcome, Outcome::Approve);

    let mut other = facts.clone();
    other.calls[0].subject_ids = vec!["page:13".into()];
    assert!(matches!(
        grant.evaluate(&other).outcome,
        Outcome::Ask { .. }
    ));
    let removing = card("seo-assistant", "editor_content", change_preview("Old", ""));
    assert!(matches!(
        grant.evaluate(&removing).outcome,
        Outcome::Ask { .. }
    ));
    assert_eq!(grantable(&removing.calls[0]), Err(GrantRefusal::Removes));
    let personal = card("seo-assistant", "personal_data", change_preview("a", "b"));
    assert_eq!(grantable(&personal.calls[0]), Err(GrantRefusal::DataClass));
}

const ROUTING: &str = r#"// policy: routing
// version: 1

// Rule 1: a short description change is approved.
permit (principal, action == Action::"approve", resource)
when { context.call.preview.max_after_chars <= 20 };

// Rule 2: any other description change waits for two of legal.
@approvers("legal:2")
permit (principal, action == Action::"ask", resource)
when { context.call.preview.changed_fields.contains("description") };

// Rule 3: and, from secret-adjacent data, one of security as well.
@approvers("security, legal:1")
permit (principal, action == Action::"ask", resource)
when { context.call.data_class == "secret_adjacent" };
"#;

#[test]
fn an_ask_rule_routes_the_card_to_the_groups_it_names_and_routes_add_up() {
    let policy = Policy::load(ROUTING).expect("loads");
    let short = card("any", "editor_content", change_preview("Old", "New"));
    assert_eq!(policy.evaluate(&short).outcome, Outcome::Approve);
    assert!(policy.evaluate(&short).route.is_empty());

    let long = card(
        "any",
        "editor_content",
        change_preview("Old", &"x".repeat(40)),
    );
    let e = policy.evaluate(&long);
    assert_eq!(
        e.outcome,
        Outcome::Ask {
            reason: AskReason::Routed
        }
    );
    assert_eq!(e.rule, Some(2));
    let route: Vec<(String, u32)> = e.route.iter().map(|r| (r.group.clone(), r.count)).collect();
    assert_eq!(route, [("legal".to_owned(), 2)]);

    let secret = card(
        "any",
        "secret_adjacent",
        change_preview("Old", &"x".repeat(40)),
    );
    let route: Vec<(String, u32)> = policy
        .evaluate(&secret)
        .route
        .iter()
        .map(|r| (r.group.clone(), r.count))
        .collect();
    assert_eq!(
        route,
        [("legal".to_owned(), 2), ("security".to_owned(), 1)],
        "the union, each group at its largest count"
    );
}

#[test]
fn an_approvers_annotation_that_names_no_group_is_refused_at_load_naming_its_line() {
    let bad = ROUTING.replace("@approvers(\"legal:2\")", "@approvers(\"legal:zero\")");
    match Policy::load(&bad) {
        Err(e) => {
            assert_eq!(e.code(), "policy_invalid");
            assert_eq!(e.line(), 9, "{e}");
        }
        Ok(_) => panic!("loaded"),
    }
}
