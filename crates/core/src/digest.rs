//! The turn digest: what a decision binds to.
//!
//! # Canonical form
//!
//! The digest is the SHA-256, written as 64 lowercase hex characters, of the UTF-8 bytes of
//! the canonical JSON of the turn's pending calls: a JSON array, in call order, of objects
//! with exactly the keys `arguments`, `id` and `tool`. Canonical JSON here means:
//!
//! - object keys sorted by their UTF-8 bytes, at every depth;
//! - no whitespace outside strings;
//! - strings escaped minimally: `"` as `\"`, `\` as `\\`, the control characters U+0008,
//!   U+0009, U+000A, U+000C and U+000D as `\b`, `\t`, `\n`, `\f` and `\r`, every other
//!   control character below U+0020 as `\u00XX` (lowercase hex), everything else literal;
//! - integers in plain decimal; other numbers as the shortest representation that reads back
//!   to the same double (`1.5`, `1e+20`), as serde_json prints them.
//!
//! Example: the calls `[{"id":"c1","tool":"update_page_metadata","arguments":{"uid":12,
//! "description":"New"}}]` are hashed as the bytes of
//! `[{"arguments":{"description":"New","uid":12},"id":"c1","tool":"update_page_metadata"}]`.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ids::TurnDigest;

/// One pending call as the digest reads it: its id, its tool and its arguments.
#[derive(Debug, Clone, Copy)]
pub struct DigestedCall<'a> {
    pub id: &'a str,
    pub tool: &'a str,
    pub arguments: &'a Value,
}

/// The digest of a turn's pending calls, in call order.
pub fn turn_digest<'a>(calls: impl IntoIterator<Item = DigestedCall<'a>>) -> TurnDigest {
    let mut out = String::from("[");
    for (i, call) in calls.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"arguments\":");
        write_canonical(call.arguments, &mut out);
        out.push_str(",\"id\":");
        write_string(call.id, &mut out);
        out.push_str(",\"tool\":");
        write_string(call.tool, &mut out);
        out.push('}');
    }
    out.push(']');
    TurnDigest::from_bytes(&Sha256::digest(out.as_bytes()))
}

/// The canonical JSON text of `value` (see the module documentation).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sorted here, not by the map type: a dependency enabling serde_json's
            // `preserve_order` feature must not change the digest.
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, tool: &str, arguments: Value) -> (String, String, Value) {
        (id.into(), tool.into(), arguments)
    }

    fn digest(calls: &[(String, String, Value)]) -> TurnDigest {
        turn_digest(calls.iter().map(|(id, tool, arguments)| DigestedCall {
            id,
            tool,
            arguments,
        }))
    }

    #[test]
    fn the_canonical_form_sorts_keys_and_drops_whitespace() {
        let v = json!({"b": [1, {"z": null, "a": true}], "a": "x\"y\n\u{1}"});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"x\"y\n\u0001","b":[1,{"a":true,"z":null}]}"#
        );
    }

    #[test]
    fn the_digest_matches_the_documented_example() {
        let calls = [call(
            "c1",
            "update_page_metadata",
            json!({"uid": 12, "description": "New"}),
        )];
        let text = r#"[{"arguments":{"description":"New","uid":12},"id":"c1","tool":"update_page_metadata"}]"#;
        let expected = hex::encode(Sha256::digest(text.as_bytes()));
        assert_eq!(digest(&calls).as_str(), expected);
    }

    #[test]
    fn the_digest_changes_with_any_argument_and_with_call_order() {
        let a = call("c1", "t", json!({"x": 1}));
        let b = call("c2", "t", json!({"x": 2}));
        let base = digest(&[a.clone(), b.clone()]);
        assert_ne!(base, digest(&[b.clone(), a.clone()]));
        assert_ne!(base, digest(&[a.clone(), call("c2", "t", json!({"x": 3}))]));
        assert_eq!(base, digest(&[a, b]));
    }
}
