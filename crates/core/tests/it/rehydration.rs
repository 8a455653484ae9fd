//! Reading stored state: tolerant of what older or corrupted documents hold, strict about
//! what it cannot understand.

use countersign_core::{CallIndex, StateError, SuspendedRunState};
use proptest::prelude::*;
use serde_json::{json, Value};

fn call(id: &str, tool: &str) -> Value {
    json!({"id": id, "tool": tool, "arguments": {"uid": 1}})
}

fn preview(index: Value, tool: &str) -> Value {
    json!({"index": index, "tool": tool, "lines": [format!("line of {tool}")], "failed": false})
}

fn doc(calls: Vec<Value>, previews: Value, stale: Value) -> Value {
    json!({
        "v": 1,
        "transcript": [{"role": "user", "content": "go"}],
        "pending_calls": calls,
        "iterations": 3,
        "tokens": {"prompt": 5, "completion": 1},
        "offered_tools": ["a", "b"],
        "model_options": {},
        "call_previews": previews,
        "stale_call_indexes": stale,
        "suspension_seq": 2,
        "captured_at": "2026-11-30T10:00:00Z"
    })
}

fn read(v: Value) -> SuspendedRunState {
    SuspendedRunState::from_json(&v).expect("readable")
}

fn indexed(state: &SuspendedRunState) -> Vec<(usize, String)> {
    state
        .call_previews
        .iter()
        .map(|p| (p.index.get(), p.tool.clone()))
        .collect()
}

#[test]
fn missing_previews_and_stale_indexes_read_as_none() {
    let mut v = doc(vec![call("c0", "a")], json!([]), json!([]));
    let o = v.as_object_mut().unwrap();
    o.remove("call_previews");
    o.remove("stale_call_indexes");
    o.remove("iterations");
    o.remove("tokens");
    let s = read(v);
    assert!(s.call_previews.is_empty());
    assert!(s.stale_call_indexes.is_empty());
    assert_eq!(s.iterations, 0);
    assert_eq!(s.pending_calls.len(), 1);
}

#[test]
fn malformed_previews_and_stale_indexes_read_as_none() {
    let s = read(doc(vec![call("c0", "a")], json!("oops"), json!({"0": 1})));
    assert!(s.call_previews.is_empty());
    assert!(s.stale_call_indexes.is_empty());
}

#[test]
fn unusable_calls_are_dropped_and_stored_indexes_follow_the_survivors() {
    let calls = vec![
        json!("not an object"),
        call("c1", "a"),
        json!({"id": "c2", "arguments": {}}),
        json!({"id": "c3", "tool": "b", "arguments": [1]}),
        call("c4", "b"),
    ];
    let previews = json!([
        preview(json!(1), "a"),
        preview(json!(4), "b"),
        preview(json!(3), "b")
    ]);
    let s = read(doc(calls, previews, json!([4, 0, 1])));
    let ids: Vec<&str> = s.pending_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, vec!["c1", "c4"]);
    // 1 → 0 and 4 → 1; the preview of dropped call 3 is dropped, never clamped onto call 4.
    assert_eq!(indexed(&s), vec![(0, "a".into()), (1, "b".into())]);
    // Stale 4 → 1, 1 → 0; stale 0 (a dropped call) is dropped.
    assert_eq!(
        s.stale_call_indexes,
        vec![CallIndex::new(0), CallIndex::new(1)]
    );
}

#[test]
fn an_index_is_a_non_negative_integer_or_a_string_of_digits() {
    let calls = vec![call("c0", "a"), call("c1", "a"), call("c2", "a")];
    let accepted = read(doc(
        calls.clone(),
        json!([preview(json!("2"), "a")]),
        json!(["1"]),
    ));
    assert_eq!(indexed(&accepted), vec![(2, "a".into())]);
    assert_eq!(accepted.stale_call_indexes, vec![CallIndex::new(1)]);
    for bad in [
        json!(0.9),
        json!("1e2"),
        json!(" 0"),
        json!(true),
        json!(null),
        json!(-1),
        json!(""),
    ] {
        let s = read(doc(
            calls.clone(),
            json!([preview(bad.clone(), "a")]),
            json!([bad.clone()]),
        ));
        assert!(
            s.call_previews.is_empty(),
            "{bad} accepted as a preview index"
        );
        assert!(
            s.stale_call_indexes.is_empty(),
            "{bad} accepted as a stale index"
        );
    }
}

#[test]
fn a_preview_naming_another_tool_than_the_call_at_its_index_is_dropped() {
    let s = read(doc(
        vec![call("c0", "a"), call("c1", "b")],
        json!([preview(json!(0), "b"), preview(json!(1), "b")]),
        json!([]),
    ));
    assert_eq!(indexed(&s), vec![(1, "b".into())]);
}

#[test]
fn a_state_newer_than_the_code_is_refused_with_state_unreadable() {
    let mut v = doc(vec![], json!([]), json!([]));
    v["v"] = json!(2);
    let err = SuspendedRunState::from_json(&v).unwrap_err();
    assert_eq!(err, StateError::NewerVersion(2));
    assert_eq!(err.code(), "state_unreadable");
}

#[test]
fn a_state_without_its_required_fields_is_refused() {
    for field in ["v", "transcript", "pending_calls", "suspension_seq"] {
        let mut v = doc(vec![], json!([]), json!([]));
        v.as_object_mut().unwrap().remove(field);
        let err = SuspendedRunState::from_json(&v).unwrap_err();
        assert_eq!(err.code(), "state_unreadable", "{field}");
    }
    assert_eq!(
        SuspendedRunState::from_bytes(b"\x00garbage").unwrap_err(),
        StateError::NotJson
    );
    assert_eq!(
        SuspendedRunState::from_bytes(b"[]").unwrap_err(),
        StateError::NotAnObject
    );
}

// ---- properties -------------------------------------------------------------------------

const TOOLS: [&str; 3] = ["a", "b", "c"];

/// A stored pending-call entry: usable or one of the unusable shapes.
fn raw_call() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (0..3usize, "[a-z0-9]{1,4}").prop_map(|(t, id)| call(&id, TOOLS[t])),
        1 => Just(json!(null)),
        1 => Just(json!("call")),
        1 => Just(json!({"id": "x", "arguments": {}})),
        1 => Just(json!({"id": "x", "tool": "a", "arguments": "uid=1"})),
        1 => Just(json!({"id": 7, "tool": "a", "arguments": {}})),
    ]
}

fn raw_index() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0..10u64).prop_map(|n| json!(n)),
        2 => (0..10u64).prop_map(|n| json!(n.to_string())),
        1 => Just(json!(0.9)),
        1 => Just(json!("1e2")),
        1 => Just(json!(" 0")),
        1 => Just(json!(true)),
        1 => Just(json!(null)),
        1 => Just(json!(-3)),
    ]
}

fn raw_preview() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (raw_index(), 0..3usize).prop_map(|(i, t)| preview(i, TOOLS[t])),
        1 => Just(json!({"index": 0})),
        1 => Just(json!(42)),
    ]
}

/// The reference model of index parsing and translation, written independently of the code.
fn reference(calls: &[Value], previews: &[Value]) -> Vec<(usize, String)> {
    let usable = |c: &Value| {
        c.get("id").is_some_and(Value::is_string)
            && c.get("tool")
                .and_then(Value::as_str)
                .is_some_and(|t| !t.is_empty())
            && c.get("arguments").is_some_and(Value::is_object)
    };
    let parse = |v: &Value| -> Option<usize> {
        match v {
            Value::Number(n) => n.as_u64().map(|n| n as usize),
            Value::String(s) if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) => {
                s.parse().ok()
            }
            _ => None,
        }
    };
    let mut out: Vec<(usize, String)> = Vec::new();
    for p in previews {
        let (Some(old), Some(tool)) = (
            p.get("index").and_then(parse),
            p.get("tool").and_then(Value::as_str),
        ) else {
            continue;
        };
        if p.get("lines").is_none() || old >= calls.len() || !usable(&calls[old]) {
            continue;
        }
        let new = calls[..old].iter().filter(|c| usable(c)).count();
        if calls[old]["tool"] == tool && !out.iter().any(|(i, _)| *i == new) {
            out.push((new, tool.to_owned()));
        }
    }
    out
}

proptest! {
    #[test]
    fn translation_matches_the_reference_model_and_every_preview_points_at_its_own_tool(
        calls in prop::collection::vec(raw_call(), 0..8),
        previews in prop::collection::vec(raw_preview(), 0..8),
        stale in prop::collection::vec(raw_index(), 0..6),
    ) {
        let s = SuspendedRunState::from_json(&doc(calls.clone(), json!(previews.clone()), json!(stale))).unwrap();
        for p in &s.call_previews {
            prop_assert!(p.index.get() < s.pending_calls.len());
            prop_assert_eq!(&s.pending_calls[p.index.get()].tool, &p.tool);
        }
        for i in &s.stale_call_indexes {
            prop_assert!(i.get() < s.pending_calls.len());
        }
        prop_assert_eq!(indexed(&s), reference(&calls, &previews));
    }

    #[test]
    fn any_corruption_of_a_valid_stored_state_reads_without_panicking(
        calls in prop::collection::vec(raw_call(), 0..5),
        previews in prop::collection::vec(raw_preview(), 0..5),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = serde_json::to_vec(&doc(calls, json!(previews), json!([0]))).unwrap();
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if let Ok(s) = SuspendedRunState::from_bytes(&bytes) {
            for p in &s.call_previews {
                prop_assert_eq!(&s.pending_calls[p.index.get()].tool, &p.tool);
            }
        }
    }
}

fn with_landed(landed: Value) -> Value {
    let mut v = doc(vec![call("c0", "a"), call("c1", "b")], json!([]), json!([]));
    v["landed_calls"] = landed;
    v
}

fn landed(index: Value, tool: &str) -> Value {
    json!({"index": index, "tool": tool, "output": {"content": "done", "is_error": false}})
}

#[test]
fn a_landed_call_that_reads_is_kept_in_call_order() {
    let s = read(with_landed(json!([
        landed(json!(1), "b"),
        landed(json!("0"), "a")
    ])));
    let indexes: Vec<usize> = s.landed_calls.iter().map(|c| c.index.get()).collect();
    assert_eq!(indexes, vec![0, 1]);
    assert!(read(with_landed(Value::Null)).landed_calls.is_empty());
}

#[test]
fn a_landed_call_that_cannot_be_read_makes_the_state_unreadable_instead_of_undone() {
    // Dropping any of these would make a write that happened look undone, and send it again
    // under a key no resource could deduplicate.
    for bad in [
        json!("not a list"),
        json!([{"index": 0, "tool": "a"}]),
        json!([landed(json!(0.9), "a")]),
        json!([landed(json!(0), "b")]),
        json!([landed(json!(5), "a")]),
        json!([landed(json!(0), "a"), landed(json!(0), "a")]),
        json!(["landed"]),
    ] {
        assert_eq!(
            SuspendedRunState::from_json(&with_landed(bad.clone())),
            Err(StateError::Malformed("landed_calls")),
            "{bad}"
        );
    }
}
