//! The JSON Schemas (draft 2020-12) of the public messages, as foreign
//! producers and consumers read them (also served as files under `crates/queue/schemas/`).
//!
//! The parsers in `countersign_core::messages` are the truth; these schemas describe
//! them. The tests below keep the two from drifting: every example in a schema must
//! satisfy the schema and parse with the core parser, and every `required`, length,
//! bound and pattern in a schema must be one the parser enforces.

/// `countersign.run_request`, queue `<prefix>.run-requests`.
pub const RUN_REQUEST_V1: &str = include_str!("../schemas/run_request.v1.json");
/// `countersign.decision`, queue `<prefix>.decisions`.
pub const DECISION_V1: &str = include_str!("../schemas/decision.v1.json");
/// `countersign.decision` version 2 (call by call, or edits), queue `<prefix>.decisions`.
pub const DECISION_V2: &str = include_str!("../schemas/decision.v2.json");
/// `countersign.event`, topic exchange `<prefix>.events`.
pub const EVENT_V1: &str = include_str!("../schemas/event.v1.json");

#[cfg(test)]
mod tests {
    //! A checker for exactly the JSON Schema keywords these schemas use, so the examples
    //! are checked without a validator dependency. A keyword or pattern it does not know
    //! fails the test rather than being skipped.

    use countersign_core::{DecisionMessage, Event, EventName, MessageError, RunRequest};
    use serde_json::{json, Map, Value};

    use super::*;

    type Parser = fn(&[u8]) -> Result<(), MessageError>;

    fn parse_run_request(body: &[u8]) -> Result<(), MessageError> {
        RunRequest::parse(body).map(drop)
    }

    fn parse_decision(body: &[u8]) -> Result<(), MessageError> {
        DecisionMessage::parse(body).map(drop)
    }

    fn load(text: &str) -> Value {
        let schema: Value = serde_json::from_str(text).expect("a schema is JSON");
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        schema
    }

    fn message_schemas() -> [(&'static str, Value, Parser); 2] {
        [
            ("run_request", load(RUN_REQUEST_V1), parse_run_request),
            ("decision", load(DECISION_V1), parse_decision),
        ]
    }

    const UUID: &str =
        "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    const UUID_V7: &str =
        "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    const DIGEST: &str = "^[0-9a-f]{64}$";
    const NAME: &str = r"^[^\s\u0000-\u001F\u007F-\u009F](?:[^\u0000-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F])?$";
    const NOT_BLANK: &str = r"\S";
    const EVENT_NAME: &str = r"^[a-z]+\.[a-z_]+$";

    /// What each pattern means, and strings it must refuse.
    fn pattern(p: &str) -> (fn(&str) -> bool, &'static [&'static str]) {
        match p {
            UUID => (
                |s| uuid_shape(s, false),
                &["not-a-uuid", "0193c1f2-7a3b-7c4d-8e5f-0123456789a", ""],
            ),
            UUID_V7 => (
                |s| uuid_shape(s, true),
                &["67e55044-10b1-426f-9247-bb680e5fe0c8", "not-a-uuid"],
            ),
            DIGEST => (
                |s| s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                &[
                    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                    "gggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggg",
                ],
            ),
            NAME => (
                |s| {
                    let blank = |c: char| c.is_whitespace() || c == '\u{feff}';
                    !s.is_empty()
                        && !s.starts_with(blank)
                        && !s.ends_with(blank)
                        && !s.chars().any(char::is_control)
                },
                &[" padded", "padded ", "tab\there", "new\nline", "bell\u{7}"],
            ),
            NOT_BLANK => (|s| s.chars().any(|c| !c.is_whitespace()), &["   ", "\n\t"]),
            EVENT_NAME => (
                |s| {
                    s.split_once('.').is_some_and(|(a, b)| {
                        !a.is_empty()
                            && !b.is_empty()
                            && a.bytes().all(|c| c.is_ascii_lowercase())
                            && b.bytes().all(|c| c.is_ascii_lowercase() || c == b'_')
                    })
                },
                &["Run.completed", "run", "run.", "run.completed.now"],
            ),
            other => panic!("pattern {other:?} is not known to the checker"),
        }
    }

    fn uuid_shape(s: &str, v7: bool) -> bool {
        let groups: Vec<&str> = s.split('-').collect();
        groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
            && groups
                .iter()
                .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
            && (!v7 || groups[2].starts_with('7'))
    }

    fn type_matches(t: &str, v: &Value) -> bool {
        match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            other => panic!("type {other:?} is not known to the checker"),
        }
    }

    fn number(v: &Value) -> f64 {
        v.as_f64().expect("a numeric bound")
    }

    /// Checks `value` against `schema`; the error names the first keyword that failed.
    fn check(schema: &Value, value: &Value) -> Result<(), String> {
        let schema = schema.as_object().expect("a schema is an object");
        for (keyword, arg) in schema {
            let ok = match keyword.as_str() {
                "$schema" | "$id" | "title" | "description" | "examples" | "format" => true,
                "type" => match arg {
                    Value::String(t) => type_matches(t, value),
                    Value::Array(ts) => ts
                        .iter()
                        .any(|t| type_matches(t.as_str().expect("a type name"), value)),
                    _ => panic!("type must be a string or an array"),
                },
                "const" => value == arg,
                "enum" => arg.as_array().expect("enum values").contains(value),
                "required" => arg
                    .as_array()
                    .expect("required names")
                    .iter()
                    .all(|k| value.get(k.as_str().expect("a name")).is_some()),
                "properties" => {
                    for (k, sub) in arg.as_object().expect("properties") {
                        if let Some(v) = value.get(k) {
                            check(sub, v).map_err(|e| format!("{k}: {e}"))?;
                        }
                    }
                    true
                }
                "additionalProperties" => {
                    assert_eq!(arg, &json!(true), "unknown fields must stay allowed");
                    true
                }
                "minLength" => value
                    .as_str()
                    .is_none_or(|s| s.chars().count() as u64 >= arg.as_u64().expect("a length")),
                "maxLength" => value
                    .as_str()
                    .is_none_or(|s| s.chars().count() as u64 <= arg.as_u64().expect("a length")),
                "minimum" => !value.is_number() || number(value) >= number(arg),
                "maximum" => !value.is_number() || number(value) <= number(arg),
                "pattern" => value
                    .as_str()
                    .is_none_or(|s| pattern(arg.as_str().expect("a pattern")).0(s)),
                "items" => {
                    for item in value.as_array().into_iter().flatten() {
                        check(arg, item)?;
                    }
                    true
                }
                "not" => check(arg, value).is_err(),
                other => panic!("keyword {other:?} is not known to the checker"),
            };
            if !ok {
                return Err(keyword.clone());
            }
        }
        Ok(())
    }

    fn examples(schema: &Value) -> &Vec<Value> {
        let examples = schema["examples"].as_array().expect("examples");
        assert!(!examples.is_empty());
        examples
    }

    fn properties(schema: &Value) -> &Map<String, Value> {
        schema["properties"].as_object().expect("properties")
    }

    fn with(example: &Value, field: &str, value: Value) -> Value {
        let mut v = example.clone();
        v[field] = value;
        v
    }

    fn body(v: &Value) -> Vec<u8> {
        v.to_string().into_bytes()
    }

    #[test]
    fn every_example_satisfies_its_schema_and_parses_with_the_core_parser() {
        for (name, schema, parse) in message_schemas() {
            for example in examples(&schema) {
                assert_eq!(check(&schema, example), Ok(()), "{name}: {example}");
                assert_eq!(parse(&body(example)), Ok(()), "{name}: {example}");
            }
        }
    }

    #[test]
    fn a_schema_requires_exactly_the_fields_the_parser_requires() {
        for (name, schema, parse) in message_schemas() {
            let required: Vec<&str> = schema["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            let example = &examples(&schema)[0];
            for field in properties(&schema).keys() {
                let mut v = example.clone();
                v.as_object_mut().unwrap().remove(field);
                let parsed = parse(&body(&v));
                if required.contains(&field.as_str()) {
                    let field: &'static str = Box::leak(field.clone().into_boxed_str());
                    assert_eq!(parsed, Err(MessageError::Missing(field)), "{name}");
                    assert!(check(&schema, &v).is_err(), "{name}: {field}");
                } else {
                    assert_eq!(parsed, Ok(()), "{name}: {field} is optional");
                    assert_eq!(check(&schema, &v), Ok(()), "{name}: {field}");
                }
            }
            for field in &required {
                assert!(properties(&schema).contains_key(*field), "{name}: {field}");
            }
        }
    }

    #[test]
    fn every_bound_and_pattern_in_a_schema_is_enforced_by_the_parser() {
        for (name, schema, parse) in message_schemas() {
            let example = &examples(&schema)[0];
            for (field, sub) in properties(&schema) {
                let refused = |v: Value| {
                    let m = with(example, field, v);
                    assert!(
                        check(&schema, &m).is_err(),
                        "{name}.{field}: schema took {m}"
                    );
                    assert!(parse(&body(&m)).is_err(), "{name}.{field}: parser took {m}");
                };
                let accepted = |v: Value| {
                    let m = with(example, field, v);
                    assert_eq!(check(&schema, &m), Ok(()), "{name}.{field}: {m}");
                    assert_eq!(parse(&body(&m)), Ok(()), "{name}.{field}: {m}");
                };
                refused(json!([]));
                if let Some(max) = sub["maxLength"].as_u64() {
                    accepted(json!("x".repeat(max as usize)));
                    refused(json!("x".repeat(max as usize + 1)));
                }
                if let Some(min) = sub["minLength"].as_u64() {
                    refused(json!("x".repeat(min as usize - 1)));
                }
                if let Some(min) = sub["minimum"].as_u64() {
                    accepted(json!(min));
                    refused(json!(min as i64 - 1));
                }
                if let Some(max) = sub["maximum"].as_u64() {
                    accepted(json!(max));
                    refused(json!(max + 1));
                }
                if let Some(p) = sub["pattern"].as_str() {
                    let (_, counterexamples) = pattern(p);
                    for bad in counterexamples {
                        refused(json!(bad));
                    }
                }
                if let Some(forbidden) = sub.get("not").and_then(|n| n.get("const")) {
                    refused(forbidden.clone());
                }
                if let Some(c) = sub.get("const") {
                    accepted(c.clone());
                    refused(json!("something else"));
                }
            }
        }
    }

    #[test]
    fn every_pattern_refuses_its_counterexamples() {
        for p in [UUID, UUID_V7, DIGEST, NAME, NOT_BLANK, EVENT_NAME] {
            let (matches, counterexamples) = pattern(p);
            for bad in counterexamples {
                assert!(!matches(bad), "{p} took {bad:?}");
            }
        }
        assert!(pattern(UUID_V7).0("0193C1F2-7A3B-7C4D-8E5F-0123456789AB"));
        assert!(pattern(NAME).0("Jane Doe"));
        assert!(pattern(NAME).0("x"));
        assert!(pattern(EVENT_NAME).0("run.preview_moved"));
    }

    #[test]
    fn every_event_example_is_what_the_core_event_type_publishes() {
        let schema = load(EVENT_V1);
        let required: Vec<Value> = schema["required"].as_array().unwrap().clone();
        // What the store's outbox publishes: the core body plus the event's id.
        let mut bare =
            Event::new(EventName::RunCompleted, json!({})).to_json("2026-11-30T10:00:00Z");
        bare["event_id"] = json!("0193c1f4-0a1b-7c2d-8e3f-000000000009");
        let mut written: Vec<&String> = bare.as_object().unwrap().keys().collect();
        written.sort();
        let mut required_names: Vec<&str> = required.iter().map(|v| v.as_str().unwrap()).collect();
        required_names.sort_unstable();
        assert!(
            written.iter().map(|s| s.as_str()).eq(required_names),
            "an event always carries exactly the required fields"
        );
        assert_eq!(check(&schema, &bare), Ok(()));
        for example in examples(&schema) {
            assert_eq!(check(&schema, example), Ok(()), "{example}");
            let mut fields = example.as_object().unwrap().clone();
            let at = fields.remove("at").unwrap();
            let name = fields.remove("event").unwrap();
            fields.remove("type");
            fields.remove("version");
            let name: EventName = name.as_str().unwrap().parse().unwrap();
            let rebuilt = Event::new(name, Value::Object(fields)).to_json(at.as_str().unwrap());
            assert_eq!(&rebuilt, example);
        }
        for (field, forbidden) in [("prompt", "p"), ("arguments", "{}"), ("lines", "[]")] {
            assert!(
                !properties(&schema).contains_key(field),
                "events never describe {field} ({forbidden})"
            );
        }
    }
}

#[cfg(test)]
mod decision_v2 {
    //! The version-2 decision's schema, checked with a JSON Schema validator (boon, as the
    //! tool schemas are): its examples satisfy it and parse; what it refuses, the parser
    //! refuses too, and the other way round.

    use countersign_core::DecisionMessage;
    use serde_json::{json, Value};

    use super::DECISION_V2;

    fn schema() -> boon::Schemas {
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        let doc: Value = serde_json::from_str(DECISION_V2).expect("the schema is JSON");
        compiler
            .add_resource("urn:countersign:schema:decision:v2", doc)
            .expect("the schema is a resource");
        compiler
            .compile("urn:countersign:schema:decision:v2", &mut schemas)
            .expect("the schema compiles");
        schemas
    }

    fn examples() -> Vec<Value> {
        let doc: Value = serde_json::from_str(DECISION_V2).unwrap();
        doc["examples"].as_array().unwrap().clone()
    }

    /// Whether the schema takes `v`, and whether the parser does.
    fn verdicts(v: &Value) -> (bool, bool) {
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        let doc: Value = serde_json::from_str(DECISION_V2).unwrap();
        compiler.add_resource("urn:s", doc).unwrap();
        let index = compiler.compile("urn:s", &mut schemas).unwrap();
        let schema_ok = schemas.validate(v, index).is_ok();
        let parser_ok = DecisionMessage::parse(v.to_string().as_bytes()).is_ok();
        (schema_ok, parser_ok)
    }

    #[test]
    fn every_example_satisfies_the_schema_and_parses_as_version_2_or_the_whole_turn() {
        let _ = schema();
        for example in examples() {
            assert_eq!(verdicts(&example), (true, true), "{example}");
            let parsed = DecisionMessage::parse(example.to_string().as_bytes()).unwrap();
            let by_call = example.get("calls").is_some() || example.get("edits").is_some();
            assert_eq!(parsed.version(), if by_call { 2 } else { 1 }, "{example}");
        }
    }

    #[test]
    fn what_the_schema_refuses_the_parser_refuses() {
        let [by_call, edit, whole]: [Value; 3] = examples().try_into().unwrap();
        let mut cases: Vec<Value> = Vec::new();
        let mut with = |base: &Value, field: &str, value: Value| {
            let mut v = base.clone();
            v[field] = value;
            cases.push(v);
        };
        with(&by_call, "calls", json!([]));
        with(&by_call, "calls", json!([{"index": 0}]));
        with(&by_call, "calls", json!([{"index": -1, "approved": true}]));
        with(&by_call, "calls", json!([{"index": 0, "approved": "yes"}]));
        with(
            &by_call,
            "calls",
            json!([{"index": 0, "approved": false, "message": "x".repeat(4097)}]),
        );
        with(&by_call, "edits", edit["edits"].clone());
        with(&edit, "edits", json!([]));
        with(&edit, "edits", json!([{"index": 1}]));
        with(&edit, "edits", json!([{"index": 1, "arguments": [1, 2]}]));
        with(
            &edit,
            "edits",
            json!([{"index": 1, "tool": "", "arguments": {}}]),
        );
        with(&whole, "version", json!(3));
        let mut neither = whole.clone();
        neither.as_object_mut().unwrap().remove("approved");
        cases.push(neither);
        for case in &cases {
            assert_eq!(verdicts(case), (false, false), "{case}");
        }
    }
}
