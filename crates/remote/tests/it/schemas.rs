//! The published JSON Schemas (`docs/remote-tools/`) against what the client sends and the
//! reference server answers: every required key present, no key the schema does not name, each
//! top-level value of the declared JSON type. A shallow check, but it catches a field renamed
//! on one side only.

use std::path::PathBuf;
use std::time::Duration;

use countersign_core::Principal;
use serde_json::{json, Value};

use crate::client::{fenced, serve, tool, tools};

fn schema(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/remote-tools")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Whether `value` fits `schema` at the top level (and one level into arrays of objects).
fn conforms(schema: &Value, value: &Value) -> Result<(), String> {
    if let Some(expected) = schema.get("const") {
        return (expected == value)
            .then_some(())
            .ok_or(format!("{value} is not {expected}"));
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return options
            .contains(value)
            .then_some(())
            .ok_or(format!("{value} is not one of {options:?}"));
    }
    if let Some(declared) = schema.get("type") {
        let types: Vec<&str> = match declared {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let actual = type_of(value);
        let fits = types.contains(&actual) || (actual == "integer" && types.contains(&"number"));
        if !fits {
            return Err(format!("{value} is {actual}, not {types:?}"));
        }
    }
    if let (Some(object), Some(properties)) = (
        value.as_object(),
        schema.get("properties").and_then(Value::as_object),
    ) {
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap();
            if !object.contains_key(key) {
                return Err(format!("required `{key}` missing from {value}"));
            }
        }
        for (key, v) in object {
            let Some(sub) = properties.get(key) else {
                return Err(format!("`{key}` is not in the schema"));
            };
            conforms(sub, v).map_err(|e| format!("{key}: {e}"))?;
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for item in array {
            conforms(items, item)?;
        }
    }
    Ok(())
}

#[test]
fn every_published_schema_is_a_draft_2020_12_json_schema() {
    for name in [
        "discovery-response.json",
        "preview-request.json",
        "preview-response.json",
        "may-view-request.json",
        "may-view-response.json",
        "execute-request.json",
        "execute-response.json",
        "error-response.json",
        "prepare-response.json",
        "commit-request.json",
        "commit-response.json",
        "abort-request.json",
        "abort-response.json",
        "call-status-response.json",
    ] {
        assert_eq!(
            schema(name)["$schema"],
            "https://json-schema.org/draft/2020-12/schema",
            "{name}"
        );
    }
}

#[test]
fn the_schema_check_refuses_a_missing_required_key_and_an_unknown_one() {
    let s = schema("may-view-response.json");
    assert!(conforms(&s, &json!({"allowed": true})).is_ok());
    assert!(conforms(&s, &json!({})).is_err());
    assert!(conforms(&s, &json!({"allowed": "yes"})).is_err());
    assert!(conforms(&s, &json!({"allowed": true, "other": 1})).is_err());
}

#[tokio::test]
async fn the_requests_the_client_sends_fit_the_published_schemas() {
    let (url, canned) = serve(200, "{}", Duration::ZERO).await;
    let tools = tools(&url).await;
    let t = tool(&tools, "absolute");
    let args = json!({"page": "home"});
    let previewer = t.previewer().unwrap();
    let _ = previewer
        .preview(&Principal::new("editor", false), &args)
        .await;
    let _ = previewer
        .may_viewer_read_preview(&args, &Principal::new("alice", true))
        .await;
    let _ = t.execute(&fenced(), &args).await;
    let ext = t.external().unwrap();
    let _ = ext.prepare(&fenced(), &args).await;
    let _ = ext.commit(&fenced(), &args).await;
    let _ = ext.abort(&fenced(), &args).await;
    let bodies = canned.bodies.lock().unwrap().clone();
    let bodies: Vec<_> = bodies
        .into_iter()
        .filter(|(p, _)| !p.starts_with("/calls/"))
        .collect();
    assert_eq!(bodies.len(), 6, "{bodies:?}");
    for (path, body) in bodies {
        let name = match path.rsplit('/').next().unwrap() {
            "preview" => "preview-request.json",
            "may-view" => "may-view-request.json",
            // A prepare's request is an execute's.
            "execute" | "prepare" => "execute-request.json",
            "commit" => "commit-request.json",
            "abort" => "abort-request.json",
            other => panic!("unexpected request {other}"),
        };
        conforms(&schema(name), &body).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn the_reference_servers_answers_fit_the_published_schemas() {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/remote-wiki/wiki_server.py");
    // The server's message builders, called in-process: discovery, a preview, may-view, execute.
    let program = r#"
import json, os, sys, tempfile, importlib.util
spec = importlib.util.spec_from_file_location("wiki", sys.argv[1])
wiki = importlib.util.module_from_spec(spec); spec.loader.exec_module(wiki)
w = wiki.Wiki(os.path.join(tempfile.mkdtemp(), "w.json"))
w.state["pages"]["home"] = ["one"]
user = {"name": "editor", "admin": False}
args = {"page": "home", "line": "two"}
w.lock.acquire()  # as the server's handler holds it around every call
shown = w.preview("append_line", user, args)
answers = {
  "discovery": {"protocol": 2, "two_phase": True, "data_classes": wiki.DATA_CLASSES,
                "tools": wiki.TOOLS},
  "preview": {"lines": shown},
  "may_view": {"allowed": w.may_view("append_line", user, args)},
  "execute": w.execute("append_line", user, args, "r:1:0", 1)[1],
  "unseen": w.status("r:1:1"),
  "prepare": w.prepare("append_line", user, args, "r:1:1", 1, w.preview("append_line", user, args))[1],
  "prepared": w.status("r:1:1"),
  "commit": w.commit("r:1:1", 1)[1],
  "answered": w.status("r:1:1"),
  "moved": w.prepare("append_line", user, args, "r:1:2", 1, shown)[1],
  "abort": w.abort("r:1:3")[1],
}
print(json.dumps(answers))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", program])
        .arg(script)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (key, name) in [
        ("discovery", "discovery-response.json"),
        ("preview", "preview-response.json"),
        ("may_view", "may-view-response.json"),
        ("execute", "execute-response.json"),
        ("unseen", "call-status-response.json"),
        ("prepare", "prepare-response.json"),
        ("prepared", "call-status-response.json"),
        ("commit", "commit-response.json"),
        ("answered", "call-status-response.json"),
        ("moved", "prepare-response.json"),
        ("abort", "abort-response.json"),
    ] {
        conforms(&schema(name), &answers[key]).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
