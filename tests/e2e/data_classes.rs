//! Data classes: a tool whose data the agent's model provider may not be sent is not offered
//! to that provider — its description never reaches the model, nor its results — and
//! `countersign agents check` says which tools are withheld and why.

use countersign_e2e::{
    chat_answer, model_settings, secs, wait_for_status, Database, Installation, ModelStub, TempDir,
    MODEL_KEY_ENV,
};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// An agent of every group, on `model`.
fn agent(name: &str, model: Value) -> Value {
    json!({
        "name": name,
        "model": model,
        "policy": {},
        "max_iterations": 2,
        "four_eyes": false,
        "approval_deadline_secs": 3600
    })
}

/// The names of the tools one model request offered.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_outside_the_installation_is_offered_only_the_tools_whose_data_it_may_be_sent() {
    let endpoint = ModelStub::responding(|_| Some(chat_answer("Nothing to change.", &[])));
    let db = Database::create("data_classes").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let dir = TempDir::new();
    let external = agent("external", model_settings(&endpoint));
    let mut trusted_model = model_settings(&endpoint);
    trusted_model["data_classes"] = json!(["public", "editor_content", "secret_adjacent"]);
    let trusted = agent("trusted", trusted_model);
    install.configure(&dir.json("external.json", &external));
    install.countersign_ok(&["agents", "put", &dir.json("trusted.json", &trusted)]);
    let _coordinator = install.spawn("countersign-coordinator", &[]);
    let _worker = install.spawn_env("countersign-worker", &[], &[(MODEL_KEY_ENV, "fake-key")]);
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();

    // An administrator's runs, so that the admin-only structure reader passes every other rule.
    for name in ["external", "trusted"] {
        let run = install.submit(name, "admin", "Look around.");
        wait_for_status(&mut conn, &run, "completed", secs(60)).await;
    }
    let requests = endpoint.bodies();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let (to_external, to_trusted) = (offered(&requests[0]), offered(&requests[1]));
    assert!(
        to_external.contains(&"search_pages".to_owned()),
        "editor content goes out: {to_external:?}"
    );
    assert!(
        !to_external.contains(&"read_fal_asset_meta".to_owned()),
        "secret-adjacent data does not: {to_external:?}"
    );
    assert!(
        to_trusted.contains(&"read_fal_asset_meta".to_owned()),
        "unless the provider's settings say it may: {to_trusted:?}"
    );

    let check = install.countersign_ok(&["agents", "check", "external", "--as", "admin"]);
    assert!(
        check.contains("provider openai, which may be sent: public, editor_content"),
        "{check}"
    );
    assert!(
        check.contains(
            "withheld  read_fal_asset_meta (structure, secret_adjacent): its data \
             (secret_adjacent) may not be sent to the agent's model provider"
        ),
        "{check}"
    );
    assert!(
        check.contains("offered   search_pages (content, editor_content)"),
        "{check}"
    );
    assert!(
        check.contains(
            "withheld  update_page_metadata (editing, editor_content): disabled by default"
        ),
        "the other rules are named too: {check}"
    );

    // The scripted provider runs inside the installation: it may be sent every class.
    let local = agent(
        "local",
        json!({"provider": "scripted", "script": "/nowhere.json"}),
    );
    install.countersign_ok(&["agents", "put", &dir.json("local.json", &local)]);
    let check = install.countersign_ok(&["agents", "check", "local", "--as", "admin"]);
    assert!(
        check.contains("offered   read_fal_asset_meta (structure, secret_adjacent)"),
        "{check}"
    );
    drop(conn);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
