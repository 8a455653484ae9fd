//! Every registered tool's schema — the `parameters` its spec shows the model, derived from the
//! struct its arguments parse into — held to its parser on the same examples: what the schema
//! admits the parser accepts, and what the schema refuses the parser refuses, in its own words.
//!
//! The parser is reached the way a model reaches it, through the tool: as a user the content
//! store does not know, a call whose arguments parse is refused with the tool's neutral string,
//! and one whose arguments do not is refused with what was wrong with them.

use std::collections::BTreeMap;

use countersign_content::refusals::{
    ASSET_NOT_PERMITTED, ELEMENT_NOT_PERMITTED, ELEMENT_OR_FILE_NOT_PERMITTED, PAGE_NOT_PERMITTED,
};
use countersign_core::{ExecContext, Principal, Tool, ToolRegistry};
use serde_json::{json, Map, Value};
use sqlx::PgPool;

use crate::json_schema::validate;
use crate::support::Site;

/// One tool's examples. Besides these, every tool is also tried with calls derived from
/// `complete` for each of its properties (see [`derived`]).
struct Examples {
    tool: &'static str,
    /// A call that names every argument: accepted.
    complete: Value,
    /// Calls the schema admits and the parser accepts.
    accepted: Vec<Value>,
    /// Calls the schema refuses and the parser refuses.
    refused: Vec<Value>,
    /// Calls the schema admits and the parser refuses by a rule no schema states (a NUL
    /// character; a rule across arguments), with words of the refusal.
    beyond_schema: Vec<(Value, &'static str)>,
}

/// A string of `n` times `c`.
fn chars(c: char, n: usize) -> String {
    std::iter::repeat_n(c, n).collect()
}

fn examples() -> Vec<Examples> {
    vec![
        Examples {
            tool: "read_page_metadata",
            complete: json!({"uid": 12}),
            accepted: vec![json!({"uid": "12"}), json!({"uid": 12.0})],
            refused: vec![
                json!({"uid": 0}),
                json!({"uid": "twelve"}),
                json!({"uid": 12, "language": 1}),
            ],
            beyond_schema: vec![],
        },
        Examples {
            tool: "search_pages",
            complete: json!({"query": "home", "limit": 20}),
            accepted: vec![
                json!({"query": chars('é', 200)}),
                json!({"query": "x", "limit": 1}),
                json!({"query": "x", "limit": 50}),
            ],
            refused: vec![
                json!({"query": ""}),
                json!({"query": " \t"}),
                json!({"query": chars('x', 201)}),
                json!({"query": "x", "limit": 0}),
                json!({"query": "x", "limit": 51}),
                json!({"query": "x", "limit": "5"}),
            ],
            beyond_schema: vec![(json!({"query": "a\u{0}b"}), "NUL")],
        },
        Examples {
            tool: "list_content_elements",
            complete: json!({"page": 12, "language": 1}),
            accepted: vec![
                json!({"page": "12", "language": 0}),
                json!({"page": 12, "language": i32::MAX}),
            ],
            refused: vec![
                json!({"page": 12, "language": -1}),
                json!({"page": 12, "language": i64::from(i32::MAX) + 1}),
                json!({"page": 12, "language": "1"}),
                json!({"page": 12, "column": 0}),
            ],
            beyond_schema: vec![],
        },
        Examples {
            tool: "read_fal_asset_meta",
            complete: json!({"uid": 7}),
            accepted: vec![json!({"uid": "7"})],
            refused: vec![json!({"uid": -7}), json!({"uid": [7]}), json!({"file": 7})],
            beyond_schema: vec![],
        },
        Examples {
            tool: "search_fal_files",
            complete: json!({"query": "hero", "extension": "jpg", "limit": 5}),
            accepted: vec![
                json!({"query": "hero"}),
                json!({"extension": "pdf"}),
                json!({"extension": chars('x', 16), "limit": null}),
            ],
            refused: vec![
                json!({"extension": ""}),
                json!({"extension": chars('x', 17)}),
                json!({"query": " "}),
                json!({"query": "x", "limit": 51}),
                json!({"query": "x", "storage": 1}),
            ],
            beyond_schema: vec![
                (json!({}), "Give a \"query\", an \"extension\", or both."),
                (json!({"limit": 5}), "Give a \"query\""),
                (
                    json!({"query": null, "extension": null}),
                    "Give a \"query\"",
                ),
                (json!({"extension": "p\u{0}f"}), "NUL"),
            ],
        },
        Examples {
            tool: "attach_file_to_content_element",
            complete: json!({
                "content_element": 5, "file": 7, "field": "image",
                "title": "Spring", "alternative": "A red bicycle", "description": "Red.",
            }),
            accepted: vec![
                json!({"content_element": "5", "file": "7", "field": "assets"}),
                json!({"content_element": 5, "file": 7, "field": "media", "title": ""}),
                json!({"content_element": 5, "file": 7, "title": chars('x', 255)}),
                json!({"content_element": 5, "file": 7, "description": chars('x', 2000)}),
            ],
            refused: vec![
                json!({"content_element": 5, "file": 7, "field": "html"}),
                json!({"content_element": 5, "file": 7, "field": "Image"}),
                json!({"content_element": 5, "file": 7, "title": chars('x', 256)}),
                json!({"content_element": 5, "file": 7, "alternative": chars('x', 1001)}),
                json!({"content_element": 5, "file": 0}),
                json!({"element": 5, "file": 7}),
            ],
            beyond_schema: vec![(
                json!({"content_element": 5, "file": 7, "alternative": "\u{0}"}),
                "NUL",
            )],
        },
        Examples {
            tool: "create_content_element_draft",
            complete: json!({
                "page": 12, "type": "text", "header": "Spring sale",
                "bodytext": "Everything must go.", "column": 0, "after_content_uid": 5,
            }),
            accepted: vec![
                json!({"page": 12, "header": "x", "type": "textpic"}),
                json!({"page": 12, "header": "x", "type": "textmedia", "bodytext": ""}),
                json!({"page": 12, "header": "x", "type": "header", "column": 99}),
                json!({"page": 12, "header": chars('x', 255), "type": "bullets"}),
                json!({"page": 12, "header": "x", "bodytext": chars('x', 20_000)}),
            ],
            refused: vec![
                json!({"page": 12, "header": "x", "type": "html"}),
                json!({"page": 12, "header": ""}),
                json!({"page": 12, "header": " \n"}),
                json!({"page": 12, "header": chars('x', 256)}),
                json!({"page": 12, "header": "x", "bodytext": chars('x', 20_001)}),
                json!({"page": 12, "header": "x", "column": 100}),
                json!({"page": 12, "header": "x", "hidden": false}),
            ],
            beyond_schema: vec![(json!({"page": 12, "header": "\u{0}"}), "NUL")],
        },
        Examples {
            tool: "create_page_draft",
            complete: json!({
                "parent": 14, "title": "E-bikes", "nav_title": "Electric", "after_page_uid": 15,
            }),
            accepted: vec![
                json!({"parent": 14, "title": "x", "nav_title": ""}),
                json!({"parent": "14", "title": chars('x', 255), "after_page_uid": "15"}),
            ],
            refused: vec![
                json!({"parent": 14, "title": " "}),
                json!({"parent": 14, "title": "x", "nav_title": chars('x', 256)}),
                json!({"parent": 14, "title": "x", "doktype": 254}),
                json!({"parent": 14, "title": "x", "slug": "/x"}),
                json!({"parent": 14, "title": "x", "after_page_uid": "first"}),
            ],
            beyond_schema: vec![(
                json!({"parent": 14, "title": "x", "nav_title": "\u{0}"}),
                "NUL",
            )],
        },
        Examples {
            tool: "create_translation_draft",
            complete: json!({"table": "pages", "uid": 14, "language": 1, "overwrite": false}),
            accepted: vec![
                json!({"table": "content", "uid": 5, "language": 9999, "overwrite": true}),
                json!({"table": "pages", "uid": "14", "language": 1.0}),
            ],
            refused: vec![
                json!({"table": "pages", "uid": 14, "language": 0}),
                json!({"table": "pages", "uid": 14, "language": 10_000}),
                json!({"table": "pages", "uid": 14, "language": "1"}),
                json!({"table": "users", "uid": 1, "language": 1}),
                json!({"table": "pages", "uid": 14, "language": 1, "overwrite": "true"}),
                json!({"table": "pages", "uid": 14, "language": 1, "overwrite": 1}),
            ],
            beyond_schema: vec![],
        },
        Examples {
            tool: "move_content_element",
            complete: json!({"uid": 5, "target_page": 13, "column": 0, "after_content_uid": 8}),
            accepted: vec![
                json!({"uid": 5, "target_page": 13, "column": 99}),
                json!({"uid": 5, "target_page": 13, "after_content_uid": "8"}),
            ],
            refused: vec![
                json!({"uid": 5, "target_page": 13, "column": 100}),
                json!({"uid": 5, "target_page": 13, "column": -1}),
                json!({"uid": 5, "target_page": 13, "column": "1"}),
                json!({"uid": 5, "target_page": 13, "column": 1.5}),
                json!({"uid": 5, "target_page": 13, "after_content_uid": 0}),
                json!({"uid": 5, "page": 13}),
            ],
            beyond_schema: vec![],
        },
        Examples {
            tool: "set_file_alternative_text",
            complete: json!({"uid": 7, "alternative": "A red bicycle"}),
            accepted: vec![
                json!({"uid": 7, "alternative": ""}),
                json!({"uid": "7", "alternative": chars('é', 1000)}),
            ],
            refused: vec![
                json!({"uid": 7, "alternative": chars('x', 1001)}),
                json!({"uid": 7, "alternative": "Ein Fahrrad", "language": 1}),
            ],
            beyond_schema: vec![(json!({"uid": 7, "alternative": "\u{0}"}), "NUL")],
        },
        Examples {
            tool: "update_page_metadata",
            complete: json!({
                "uid": 12, "title": "Home", "subtitle": "Start here", "nav_title": "Home",
                "abstract": "A", "description": "D", "keywords": "k", "seo_title": "S",
                "og_title": "O", "og_description": "OD", "twitter_title": "T",
                "twitter_description": "TD",
            }),
            accepted: vec![
                json!({"uid": "12", "title": "x"}),
                json!({"uid": "007", "subtitle": ""}),
                json!({"uid": 12.0, "description": chars('é', 2000)}),
                json!({"uid": i64::MAX, "title": chars('x', 255)}),
                json!({"uid": chars('9', 18), "keywords": "k"}),
                json!({"uid": 12, "title": null, "subtitle": ""}),
            ],
            refused: vec![
                json!([{"uid": 12, "title": "x"}]),
                json!("uid=12"),
                json!({"uid": 0, "title": "x"}),
                json!({"uid": -1, "title": "x"}),
                json!({"uid": 1.5, "title": "x"}),
                json!({"uid": "1e2", "title": "x"}),
                json!({"uid": " 12", "title": "x"}),
                json!({"uid": "0", "title": "x"}),
                json!({"uid": "", "title": "x"}),
                json!({"uid": chars('1', 19), "title": "x"}),
                json!({"uid": 9_223_372_036_854_775_808u64, "title": "x"}),
                json!({"uid": 12, "title": ""}),
                json!({"uid": 12, "title": "   "}),
                json!({"uid": 12, "title": chars('x', 256)}),
                json!({"uid": 12, "description": chars('x', 2001)}),
                json!({"uid": 12, "description": "x", "slug": "/x"}),
            ],
            beyond_schema: vec![
                (json!({"uid": 12}), "No field to set"),
                (json!({"uid": 12, "title": null}), "No field to set"),
                (json!({"uid": 12, "title": "a\u{0}b"}), "NUL"),
            ],
        },
    ]
}

/// A value of a type the schema of a property does not admit.
fn wrong_type(property: &Value) -> Value {
    let types_only = json!({"type": property["type"]});
    [
        json!(true),
        json!(7),
        json!(1.5),
        json!("x"),
        json!([]),
        json!({}),
    ]
    .into_iter()
    .find(|v| validate(&types_only, v).is_err())
    .expect("some type is not admitted")
}

fn with(call: &Value, name: &str, value: Option<Value>) -> Value {
    let mut object = call.as_object().expect("a call is an object").clone();
    match value {
        Some(v) => object.insert(name.to_owned(), v),
        None => object.remove(name),
    };
    Value::Object(object)
}

/// A call derived from the complete one, and what it must be refused with (`None`: accepted).
type Derived = (Value, Option<String>);

/// For a complete call: one with an unknown argument; for each property, one with a value of a
/// type it does not admit; for each required property, one without it and one with `null`;
/// for each optional property, one without it and one with `null` (`null` counts as absent).
fn derived(schema: &Value, complete: &Value) -> Vec<Derived> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let properties = schema["properties"].as_object().expect("properties");
    let mut calls = vec![(
        with(complete, "unexpected", Some(json!(1))),
        Some("Unknown argument(s) \"unexpected\"; the whole call was refused.".to_owned()),
    )];
    for (name, property) in properties {
        calls.push((
            with(complete, name, Some(wrong_type(property))),
            Some(format!("The argument \"{name}\" ")),
        ));
        if required.contains(&name.as_str()) {
            let refusal = format!("The argument \"{name}\" is required.");
            calls.push((with(complete, name, None), Some(refusal.clone())));
            calls.push((with(complete, name, Some(Value::Null)), Some(refusal)));
        } else {
            calls.push((with(complete, name, None), None));
            calls.push((with(complete, name, Some(Value::Null)), None));
        }
    }
    calls
}

/// The parser's verdict, through the tool: `Ok` when the call went past its arguments to the
/// user check (refused with a neutral string), the refusal otherwise.
async fn parsed(tool: &dyn Tool, args: &Value) -> Result<(), String> {
    let nobody = Principal::new("nobody", false);
    let said = match tool.previewer() {
        Some(previewer) => previewer
            .preview(&nobody, args)
            .await
            .expect("preview")
            .join("\n"),
        None => {
            let ctx = ExecContext {
                acting_user: nobody,
                fence: None,
                shown_preview: None,
                before: Vec::new(),
            };
            tool.execute(&ctx, args).await.expect("read").content
        }
    };
    let neutral = [
        PAGE_NOT_PERMITTED,
        ASSET_NOT_PERMITTED,
        ELEMENT_NOT_PERMITTED,
        ELEMENT_OR_FILE_NOT_PERMITTED,
    ];
    if neutral.contains(&said.as_str()) {
        Ok(())
    } else {
        Err(said)
    }
}

/// A refusal of arguments speaks of them in the tool's words; serde's (`` missing field `x` ``,
/// `invalid type: …, expected …`) never reach the model.
fn assert_in_own_words(tool: &str, args: &Value, refusal: &str) {
    let own = [
        "The argument \"",
        "Unknown argument(s) ",
        "The arguments must be",
    ];
    assert!(
        own.iter().any(|start| refusal.starts_with(start))
            && !refusal.contains('`')
            && !refusal.contains("invalid type"),
        "{tool} {args}: {refusal}"
    );
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn every_tools_derived_schema_and_its_parser_agree_on_every_example(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let mut registry = ToolRegistry::new();
    countersign_content::register(&mut registry, &mut Default::default(), site.store.clone());
    let examples = examples();

    let mut registered: Vec<&str> = registry.iter().map(|t| t.spec().name.as_str()).collect();
    let mut exemplified: Vec<&str> = examples.iter().map(|e| e.tool).collect();
    registered.sort_unstable();
    exemplified.sort_unstable();
    assert_eq!(
        registered, exemplified,
        "every registered tool has examples"
    );

    let mut checked = 0;
    for example in &examples {
        let tool = registry.get(example.tool).expect("registered").as_ref();
        let schema = &tool.spec().parameters;
        let name = example.tool;

        let mut calls: Vec<Derived> = vec![(example.complete.clone(), None)];
        calls.extend(example.accepted.iter().map(|a| (a.clone(), None)));
        calls.extend(
            example
                .refused
                .iter()
                .map(|r| (r.clone(), Some(String::new()))),
        );
        calls.extend(derived(schema, &example.complete));
        for (args, refusal) in &calls {
            let valid = validate(schema, args);
            let verdict = parsed(tool, args).await;
            match refusal {
                None => {
                    assert_eq!(valid, Ok(()), "{name}: the schema admits {args}");
                    assert_eq!(verdict, Ok(()), "{name}: the parser accepts {args}");
                }
                Some(start) => {
                    assert!(valid.is_err(), "{name}: the schema refuses {args}");
                    let refusal = verdict.expect_err(&format!("{name}: the parser refuses {args}"));
                    assert!(refusal.starts_with(start), "{name} {args}: {refusal}");
                    assert_in_own_words(name, args, &refusal);
                }
            }
            checked += 1;
        }
        for (args, words) in &example.beyond_schema {
            assert_eq!(
                validate(schema, args),
                Ok(()),
                "{name}: the schema cannot say {words:?} of {args}"
            );
            let refusal = parsed(tool, args)
                .await
                .expect_err(&format!("{name}: the parser refuses {args}"));
            assert!(refusal.contains(words), "{name} {args}: {refusal}");
            checked += 1;
        }
    }
    assert!(checked >= 250, "{checked} calls checked");
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn every_tools_parameters_are_a_plain_object_schema_as_the_snapshot_shows(pool: PgPool) {
    let site = Site::seeded(pool).await;
    let mut registry = ToolRegistry::new();
    countersign_content::register(&mut registry, &mut Default::default(), site.store.clone());
    let mut all = BTreeMap::new();
    for tool in registry.iter() {
        let spec = tool.spec();
        let schema = spec.parameters.as_object().expect("an object schema");
        // What every provider accepts as a function's parameters: an object, no top-level
        // `anyOf`/`oneOf`/`allOf`, no references, unknown arguments refused.
        let keys: Vec<&str> = schema.keys().map(String::as_str).collect();
        for key in &keys {
            assert!(
                ["type", "properties", "required", "additionalProperties"].contains(key),
                "{}: {key}",
                spec.name
            );
        }
        assert_eq!(schema["type"], "object", "{}", spec.name);
        assert_eq!(schema["additionalProperties"], false, "{}", spec.name);
        all.insert(spec.name.clone(), Value::Object(schema.clone()));
    }
    assert_eq!(all.len(), 12);
    // Keys sorted: the order a map keeps is no part of a schema.
    insta::with_settings!({sort_maps => true}, {
        insta::assert_json_snapshot!("tool_parameters", Value::Object(Map::from_iter(all)));
    });
}
