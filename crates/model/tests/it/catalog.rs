use std::path::PathBuf;
use std::sync::Arc;

use countersign_core::Message;
use countersign_model::ModelConfigError;
use serde_json::json;

use crate::support::{answering, ask, catalog_with, completion};

const SCRIPT: &str = r#"{"turns": [{"content": "Scripted hello."}]}"#;

/// A script file of this test's own, removed when dropped.
struct ScriptFile(PathBuf);

impl ScriptFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "countersign-model-{}-{name}.json",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        ScriptFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ScriptFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn code(result: Result<Arc<dyn countersign_core::Model>, ModelConfigError>) -> &'static str {
    result.unwrap_err().code()
}

#[tokio::test]
async fn a_scripted_provider_plays_the_script_its_settings_name() {
    let script = ScriptFile::new("named", SCRIPT);
    let model = catalog_with(&[])
        .model_for(&json!({"provider": "scripted", "script": script.path()}))
        .unwrap();
    let answer = ask(&*model, &[Message::user("go")]).await.unwrap();
    assert_eq!(answer.content, "Scripted hello.");
}

#[tokio::test]
async fn a_scripted_provider_without_a_script_plays_the_default_one() {
    let script = ScriptFile::new("default", SCRIPT);
    let catalog = catalog_with(&[]).with_default_script(script.path());
    let model = catalog.model_for(&json!({"provider": "scripted"})).unwrap();
    let answer = ask(&*model, &[Message::user("go")]).await.unwrap();
    assert_eq!(answer.content, "Scripted hello.");

    assert_eq!(
        code(catalog_with(&[]).model_for(&json!({"provider": "scripted"}))),
        "invalid_settings"
    );
}

#[test]
fn a_missing_or_invalid_script_is_script_unreadable() {
    let missing = std::env::temp_dir().join("countersign-model-no-such-script.json");
    assert_eq!(
        code(catalog_with(&[]).model_for(&json!({"provider": "scripted", "script": missing}))),
        "script_unreadable"
    );
    let broken = ScriptFile::new("broken", r#"{"turns": "#);
    assert_eq!(
        code(
            catalog_with(&[]).model_for(&json!({"provider": "scripted", "script": broken.path()}))
        ),
        "script_unreadable"
    );
}

#[tokio::test]
async fn an_openai_provider_sends_the_key_from_the_variable_its_settings_name() {
    let endpoint = answering(&completion(json!({"content": "Hello."})));
    let model = catalog_with(&[("COUNTERSIGN_MODEL_IT_KEY_SET", "sk-from-the-environment")])
        .model_for(&json!({
            "provider": "openai",
            "base_url": endpoint.base_url,
            "model": "small-model",
            "api_key_env": "COUNTERSIGN_MODEL_IT_KEY_SET",
            "timeout_secs": 5,
        }))
        .unwrap();

    let answer = ask(&*model, &[Message::user("go")]).await.unwrap();

    assert_eq!(answer.content, "Hello.");
    let sent = &endpoint.requests()[0];
    assert_eq!(
        sent.authorization.as_deref(),
        Some("Bearer sk-from-the-environment")
    );
    assert_eq!(sent.body["model"], "small-model");
}

#[test]
fn an_openai_provider_whose_variable_is_unset_or_empty_is_missing_api_key() {
    for variable in [
        "COUNTERSIGN_MODEL_IT_KEY_UNSET",
        "COUNTERSIGN_MODEL_IT_KEY_EMPTY",
    ] {
        let err = catalog_with(&[("COUNTERSIGN_MODEL_IT_KEY_EMPTY", "  ")])
            .model_for(&json!({
                "provider": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "model": "small-model",
                "api_key_env": variable,
            }))
            .unwrap_err();
        assert_eq!(err.code(), "missing_api_key");
        assert!(err.to_string().contains(variable), "{err}");
    }
}

#[test]
fn a_missing_or_unknown_provider_is_unknown_provider() {
    let catalog = catalog_with(&[]);
    assert_eq!(
        code(catalog.model_for(&json!({"model": "x"}))),
        "unknown_provider"
    );
    assert_eq!(
        code(catalog.model_for(&json!({"provider": "oracle"}))),
        "unknown_provider"
    );
}

#[test]
fn malformed_openai_settings_are_invalid_settings() {
    let base = json!({
        "provider": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "small-model",
        "api_key_env": "COUNTERSIGN_MODEL_IT_KEY_INVALID",
    });
    let with = |field: &str, value: serde_json::Value| {
        let mut settings = base.clone();
        settings[field] = value;
        settings
    };
    let without = |field: &str| {
        let mut settings = base.clone();
        settings.as_object_mut().unwrap().remove(field);
        settings
    };
    let catalog = catalog_with(&[("COUNTERSIGN_MODEL_IT_KEY_INVALID", "sk-x")]);
    for settings in [
        json!("openai"),
        json!({"provider": 7}),
        without("base_url"),
        without("model"),
        without("api_key_env"),
        with("base_url", json!("not a url")),
        with("base_url", json!("http://user:pw@127.0.0.1:9/v1")),
        with("timeout_secs", json!(0)),
        with("timeout_secs", json!("60")),
        with("api_key", json!("sk-stored-in-settings")),
    ] {
        let err = catalog.model_for(&settings).unwrap_err();
        assert_eq!(err.code(), "invalid_settings", "{settings}: {err}");
        assert!(!err.to_string().contains("sk-"), "{err}");
    }
}

#[test]
fn equal_provider_settings_share_one_provider() {
    let settings = |model: &str, prompt: &str| {
        json!({
            "provider": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "model": model,
            "api_key_env": "COUNTERSIGN_MODEL_IT_KEY_CACHE",
            "system_prompt": prompt,
            "options": {"temperature": 0.1},
        })
    };
    let catalog = catalog_with(&[("COUNTERSIGN_MODEL_IT_KEY_CACHE", "sk-cache")]);

    let first = catalog
        .model_for(&settings("small", "You edit pages."))
        .unwrap();
    let again = catalog
        .model_for(&settings("small", "You edit pages."))
        .unwrap();
    let other_prompt = catalog
        .model_for(&settings("small", "You review pages."))
        .unwrap();
    let other_model = catalog
        .model_for(&settings("large", "You edit pages."))
        .unwrap();

    assert!(Arc::ptr_eq(&first, &again));
    assert!(
        Arc::ptr_eq(&first, &other_prompt),
        "the prompt is not a provider setting"
    );
    assert!(!Arc::ptr_eq(&first, &other_model));
}

#[test]
fn retry_settings_out_of_bounds_or_unknown_are_invalid_settings() {
    let catalog = catalog_with(&[("COUNTERSIGN_MODEL_IT_KEY_RETRY_BAD", "sk-x")]);
    for retry in [
        json!(5),
        json!({"max_attempts": 0}),
        json!({"max_attempts": 11}),
        json!({"max_attempts": 2.5}),
        json!({"max_elapsed_secs": 0}),
        json!({"max_elapsed_secs": 601}),
        json!({"max_elapsed_secs": "60"}),
        json!({"max_attempt": 4}),
    ] {
        let settings = json!({
            "provider": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "small-model",
            "api_key_env": "COUNTERSIGN_MODEL_IT_KEY_RETRY_BAD",
            "retry": retry,
        });
        let err = catalog.model_for(&settings).unwrap_err();
        assert_eq!(err.code(), "invalid_settings", "{retry}: {err}");
        assert!(err.to_string().contains("retry"), "{err}");
        assert_eq!(
            catalog.check(&settings).unwrap_err().code(),
            "invalid_settings",
            "check refuses what model_for refuses: {retry}"
        );
    }
}

#[test]
fn a_check_refuses_what_a_worker_would_refuse_with_a_message_that_says_what_to_fix() {
    let catalog = catalog_with(&[]);
    let refused = |settings: serde_json::Value| catalog.check(&settings).unwrap_err();

    let err = refused(json!({"provider": "oracle"}));
    assert_eq!(err.code(), "unknown_provider");
    assert!(
        err.to_string().contains("\"oracle\"") && err.to_string().contains("\"openai\""),
        "{err}"
    );
    let err = refused(json!({}));
    assert_eq!(err.code(), "unknown_provider");
    assert!(err.to_string().contains("\"scripted\""), "{err}");

    let err = refused(json!({
        "provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
    }));
    assert_eq!(err.code(), "invalid_settings");
    assert!(err.to_string().contains("api_key_env is missing"), "{err}");

    let err = refused(json!({
        "provider": "openai", "base_url": "127.0.0.1:9/v1", "model": "m", "api_key_env": "K",
    }));
    assert_eq!(
        err.code(),
        "invalid_settings",
        "a base URL a worker cannot use: {err}"
    );

    let broken = ScriptFile::new("check-broken", r#"{"turns": 3}"#);
    let err = refused(json!({"provider": "scripted", "script": broken.path()}));
    assert_eq!(err.code(), "script_unreadable");
}

#[test]
fn a_check_notes_what_only_the_workers_environment_can_settle() {
    let catalog = catalog_with(&[("COUNTERSIGN_MODEL_IT_KEY_CHECK_SET", "sk-set")]);

    let check = catalog
        .check(&json!({
            "provider": "openai", "base_url": "https://api.example.test/v1", "model": "m",
            "api_key_env": "COUNTERSIGN_MODEL_IT_KEY_CHECK_UNSET",
        }))
        .expect("an unset variable is not an error where the agent is stored");
    assert_eq!(check.provider, "openai");
    assert_eq!(check.notes.len(), 1, "{:?}", check.notes);
    assert!(
        check.notes[0].contains("COUNTERSIGN_MODEL_IT_KEY_CHECK_UNSET is not set here"),
        "{:?}",
        check.notes
    );

    let check = catalog
        .check(&json!({
            "provider": "openai_compatible", "base_url": "http://127.0.0.1:9/v1", "model": "m",
            "api_key_env": "COUNTERSIGN_MODEL_IT_KEY_CHECK_SET",
        }))
        .unwrap();
    assert_eq!((check.provider, check.notes.len()), ("openai", 0));

    let check = catalog.check(&json!({"provider": "scripted"})).unwrap();
    assert_eq!(check.provider, "scripted");
    assert!(
        check.notes[0].contains("--model-script"),
        "{:?}",
        check.notes
    );

    let missing = std::env::temp_dir().join("countersign-model-check-no-such-script.json");
    let check = catalog
        .check(&json!({"provider": "scripted", "script": missing}))
        .unwrap();
    assert!(
        check.notes[0].contains("cannot be read here"),
        "{:?}",
        check.notes
    );

    let script = ScriptFile::new("check-good", SCRIPT);
    let check = catalog
        .check(&json!({"provider": "scripted", "script": script.path()}))
        .unwrap();
    assert!(check.notes.is_empty(), "{:?}", check.notes);
    let check = catalog_with(&[])
        .with_default_script(script.path())
        .check(&json!({"provider": "scripted"}))
        .unwrap();
    assert!(
        check.notes.is_empty(),
        "a default script settles it: {:?}",
        check.notes
    );
}

fn openai(extra: serde_json::Value) -> serde_json::Value {
    let mut settings = json!({
        "provider": "openai",
        "base_url": "https://api.example.test/v1",
        "model": "m",
        "api_key_env": "COUNTERSIGN_TEST_UNSET_KEY",
    });
    settings
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    settings
}

#[test]
fn a_provider_outside_the_installation_is_sent_public_data_and_editor_content_unless_its_settings_say_more(
) {
    use countersign_core::{DataClass, DataClasses};
    let catalog = catalog_with(&[]);
    assert_eq!(
        catalog.data_classes(&openai(json!({}))).unwrap(),
        DataClasses::external_default()
    );
    assert_eq!(
        catalog
            .data_classes(&openai(
                json!({"data_classes": ["editor_content", "secret_adjacent"]})
            ))
            .unwrap(),
        DataClasses::of([DataClass::EditorContent, DataClass::SecretAdjacent])
    );
    assert_eq!(
        catalog
            .data_classes(&json!({"provider": "scripted", "script": "/nowhere"}))
            .unwrap(),
        DataClasses::all(),
        "the scripted provider runs inside the installation"
    );
}

#[test]
fn a_data_class_the_settings_name_that_is_not_one_is_refused_before_any_run_meets_it() {
    let catalog = catalog_with(&[]);
    for bad in [
        json!(["EDITOR_CONTENT"]),
        json!("editor_content"),
        json!([1]),
    ] {
        let settings = openai(json!({ "data_classes": bad }));
        let e = catalog.data_classes(&settings).unwrap_err();
        assert_eq!(e.code(), "invalid_settings", "{bad}");
        assert!(e.to_string().contains("data_classes"), "{e}");
        assert!(
            catalog.check(&settings).is_err(),
            "agents put refuses it too"
        );
    }
}
