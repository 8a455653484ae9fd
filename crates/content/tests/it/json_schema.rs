//! A JSON Schema checker for the subset the tools' derived parameters use, so the schema
//! tests need no validator crate (the maintained ones bring a regex engine of their own, an
//! HTTP client for remote references, and twenty-odd crates more).
//!
//! The subset: `type` (a name or a list of names), `properties`, `required`,
//! `additionalProperties: false`, `minimum`, `maximum`, `minLength`, `maxLength`, `pattern`,
//! `enum`, `anyOf`, `oneOf`, and the annotations `description` and `default`. Any other
//! keyword panics: a checker that skipped what it does not understand would pass a schema
//! stricter than it checked, and the tests would say the schema and the parser agree when they
//! do not.

use std::cmp::Ordering;

use regex::Regex;
use serde_json::{Map, Number, Value};

/// Whether `instance` is valid under `schema`; the error says where and why not.
pub fn validate(schema: &Value, instance: &Value) -> Result<(), String> {
    check(schema, instance, "")
}

fn check(schema: &Value, instance: &Value, at: &str) -> Result<(), String> {
    let schema = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return Err(format!("{at}: the schema `false` admits nothing")),
        Value::Object(schema) => schema,
        other => panic!("{at}: a schema is an object or a boolean, not {other}"),
    };
    for (keyword, value) in schema {
        match keyword.as_str() {
            "description" | "default" => {}
            "type" => check_type(value, instance, at)?,
            "properties" => check_properties(value, instance, at)?,
            "required" => check_required(value, instance, at)?,
            "additionalProperties" => check_additional(value, schema, instance, at)?,
            "minimum" => check_bound(value, instance, at, true)?,
            "maximum" => check_bound(value, instance, at, false)?,
            "minLength" => check_length(value, instance, at, |len, bound| len >= bound)?,
            "maxLength" => check_length(value, instance, at, |len, bound| len <= bound)?,
            "pattern" => check_pattern(value, instance, at)?,
            "enum" => check_enum(value, instance, at)?,
            "anyOf" => check_any_of(value, instance, at)?,
            "oneOf" => check_one_of(value, instance, at)?,
            other => panic!("{at}: the schema checker does not understand the keyword {other:?}"),
        }
    }
    Ok(())
}

/// The JSON type names `instance` has: an integer-valued number is also an `integer`, as
/// JSON Schema has it (`12.0` is one).
fn types_of(instance: &Value) -> &'static [&'static str] {
    match instance {
        Value::Null => &["null"],
        Value::Bool(_) => &["boolean"],
        Value::Number(n) if is_integral(n) => &["integer", "number"],
        Value::Number(_) => &["number"],
        Value::String(_) => &["string"],
        Value::Array(_) => &["array"],
        Value::Object(_) => &["object"],
    }
}

fn is_integral(n: &Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
}

fn check_type(value: &Value, instance: &Value, at: &str) -> Result<(), String> {
    let allowed: Vec<&str> = match value {
        Value::String(name) => vec![name.as_str()],
        Value::Array(names) => names
            .iter()
            .map(|n| {
                n.as_str()
                    .unwrap_or_else(|| panic!("{at}: a type name: {n}"))
            })
            .collect(),
        other => panic!("{at}: `type` is a name or a list of names, not {other}"),
    };
    for name in &allowed {
        let known = [
            "null", "boolean", "integer", "number", "string", "array", "object",
        ];
        assert!(known.contains(name), "{at}: unknown type {name:?}");
    }
    if types_of(instance).iter().any(|t| allowed.contains(t)) {
        Ok(())
    } else {
        Err(format!("{at}: {instance} is not of type {allowed:?}"))
    }
}

fn object_keyword<'a>(value: &'a Value, keyword: &str, at: &str) -> &'a Map<String, Value> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("{at}: `{keyword}` is an object"))
}

fn check_properties(value: &Value, instance: &Value, at: &str) -> Result<(), String> {
    let properties = object_keyword(value, "properties", at);
    let Some(object) = instance.as_object() else {
        return Ok(());
    };
    for (name, subschema) in properties {
        if let Some(v) = object.get(name) {
            check(subschema, v, &format!("{at}/{name}"))?;
        }
    }
    Ok(())
}

fn check_required(value: &Value, instance: &Value, at: &str) -> Result<(), String> {
    let required = value
        .as_array()
        .unwrap_or_else(|| panic!("{at}: `required` is a list"));
    let Some(object) = instance.as_object() else {
        return Ok(());
    };
    for name in required {
        let name = name
            .as_str()
            .unwrap_or_else(|| panic!("{at}: `required` names properties"));
        if !object.contains_key(name) {
            return Err(format!("{at}: {name:?} is required"));
        }
    }
    Ok(())
}

fn check_additional(
    value: &Value,
    schema: &Map<String, Value>,
    instance: &Value,
    at: &str,
) -> Result<(), String> {
    assert_eq!(
        value,
        &Value::Bool(false),
        "{at}: only `additionalProperties: false` is understood"
    );
    let Some(object) = instance.as_object() else {
        return Ok(());
    };
    let properties = schema
        .get("properties")
        .map(|p| object_keyword(p, "properties", at));
    for name in object.keys() {
        if !properties.is_some_and(|p| p.contains_key(name)) {
            return Err(format!("{at}: {name:?} is not an allowed property"));
        }
    }
    Ok(())
}

/// A number exactly, where it is an integer (`i64`, `u64` or an integral `f64`); otherwise
/// `None`, and it is compared as an `f64`.
fn exact(n: &Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i.into());
    }
    if let Some(u) = n.as_u64() {
        return Some(u.into());
    }
    // 2^100: far beyond anything here, and every integral f64 below it fits an i128.
    n.as_f64()
        .filter(|f| f.fract() == 0.0 && f.abs() < 1.267_650_600_228_229_4e30)
        .map(|f| f as i128)
}

/// `minimum` (`at_least`) or `maximum`.
fn check_bound(value: &Value, instance: &Value, at: &str, at_least: bool) -> Result<(), String> {
    let bound = value
        .as_number()
        .unwrap_or_else(|| panic!("{at}: a bound is a number"));
    let Some(n) = instance.as_number() else {
        return Ok(());
    };
    // Integers exactly: 2^63 - 1 and 2^63 are one f64.
    let order = match (exact(n), exact(bound)) {
        (Some(a), Some(b)) => a.cmp(&b),
        _ => n
            .as_f64()
            .partial_cmp(&bound.as_f64())
            .expect("JSON numbers are ordered"),
    };
    let (ok, words) = if at_least {
        (order != Ordering::Less, "at least")
    } else {
        (order != Ordering::Greater, "at most")
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{at}: {n} is not {words} {bound}"))
    }
}

fn check_length(
    value: &Value,
    instance: &Value,
    at: &str,
    holds: fn(usize, usize) -> bool,
) -> Result<(), String> {
    let bound = value
        .as_u64()
        .unwrap_or_else(|| panic!("{at}: a length bound is a non-negative integer"))
        as usize;
    let Some(s) = instance.as_str() else {
        return Ok(());
    };
    // JSON Schema counts characters (code points), not bytes.
    let len = s.chars().count();
    if holds(len, bound) {
        Ok(())
    } else {
        Err(format!(
            "{at}: a string of {len} characters (bound {bound})"
        ))
    }
}

fn check_pattern(value: &Value, instance: &Value, at: &str) -> Result<(), String> {
    let pattern = value
        .as_str()
        .unwrap_or_else(|| panic!("{at}: a pattern is a string"));
    let regex = Regex::new(pattern).unwrap_or_else(|e| panic!("{at}: pattern {pattern:?}: {e}"));
    let Some(s) = instance.as_str() else {
        return Ok(());
    };
    // A pattern is not anchored: it matches anywhere in the string.
    if regex.is_match(s) {
        Ok(())
    } else {
        Err(format!("{at}: {s:?} does not match {pattern:?}"))
    }
}

fn check_enum(value: &Value, instance: &Value, at: &str) -> Result<(), String> {
    let choices = value
        .as_array()
        .unwrap_or_else(|| panic!("{at}: `enum` is a list"));
    if choices.contains(instance) {
        Ok(())
    } else {
        Err(format!("{at}: {instance} is not one of {value}"))
    }
}

fn subschemas<'a>(value: &'a Value, keyword: &str, at: &str) -> &'a [Value] {
    let list = value
        .as_array()
        .unwrap_or_else(|| panic!("{at}: `{keyword}` is a list"));
    assert!(!list.is_empty(), "{at}: `{keyword}` is not empty");
    list
}

fn check_any_of(value: &Value, instance: &Value, at: &str) -> Result<(), String> {
    let list = subschemas(value, "anyOf", at);
    if list.iter().any(|s| check(s, instance, at).is_ok()) {
        Ok(())
    } else {
        Err(format!("{at}: {instance} holds under no schema of anyOf"))
    }
}

fn check_one_of(value: &Value, instance: &Value, at: &str) -> Result<(), String> {
    let list = subschemas(value, "oneOf", at);
    let valid = list
        .iter()
        .filter(|s| check(s, instance, at).is_ok())
        .count();
    if valid == 1 {
        Ok(())
    } else {
        Err(format!(
            "{at}: {valid} schemas of oneOf hold, not exactly 1"
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::validate;

    #[test]
    fn the_checker_holds_an_object_to_its_properties() {
        let schema = json!({
            "type": "object",
            "properties": {
                "id": {"type": ["integer", "string"], "minimum": 1, "maximum": i64::MAX,
                       "pattern": "^[0-9]+$", "maxLength": 3},
                "word": {"type": ["string", "null"], "enum": ["a", "b", null]},
                "text": {"type": "string", "minLength": 1, "maxLength": 2},
            },
            "required": ["id"],
            "additionalProperties": false,
        });
        for valid in [
            json!({"id": 1}),
            json!({"id": 1.0}),
            json!({"id": "123"}),
            json!({"id": i64::MAX, "word": null, "text": "éé"}),
            json!({"id": 5, "word": "b"}),
        ] {
            assert_eq!(validate(&schema, &valid), Ok(()), "{valid}");
        }
        for invalid in [
            json!({}),
            json!([]),
            json!({"id": 0}),
            json!({"id": 1.5}),
            json!({"id": 9_223_372_036_854_775_808u64}),
            json!({"id": "1234"}),
            json!({"id": "x1"}),
            json!({"id": true}),
            json!({"id": 1, "word": "c"}),
            json!({"id": 1, "text": ""}),
            json!({"id": 1, "text": "abc"}),
            json!({"id": 1, "other": 1}),
        ] {
            assert!(validate(&schema, &invalid).is_err(), "{invalid}");
        }
    }

    #[test]
    fn any_of_needs_one_and_one_of_exactly_one() {
        let any = json!({"anyOf": [{"type": "integer"}, {"type": "number"}]});
        let one = json!({"oneOf": [{"type": "integer"}, {"type": "number"}]});
        assert!(validate(&any, &json!(1)).is_ok());
        assert!(validate(&one, &json!(1)).is_err());
        assert!(validate(&one, &json!(1.5)).is_ok());
        assert!(validate(&any, &json!("x")).is_err());
    }

    #[test]
    #[should_panic(expected = "does not understand the keyword \"format\"")]
    fn a_keyword_the_checker_does_not_understand_fails_the_test() {
        let _ = validate(&json!({"type": "string", "format": "email"}), &json!("x"));
    }

    #[test]
    #[should_panic(expected = "does not understand the keyword \"$ref\"")]
    fn a_reference_fails_the_test_too() {
        let _ = validate(&json!({"$ref": "#/$defs/Uid"}), &json!(1));
    }
}
