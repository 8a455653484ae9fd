//! Decisions call by call and edits before approving, through the real coordinator and worker:
//! approving calls 0 and 2 and denying call 1 writes exactly 0 and 2, as their lines said, and
//! the model reads the denial in the approver's words; a subset whose lines read otherwise
//! without the denied call comes back on a new card and writes nothing; an edit issues the card
//! anew with the edit marked, and only another approver's approval of that card writes the
//! edited call — while an edit that names another tool or breaks the tool's schema is refused
//! by name and leaves the run waiting, untouched.

use countersign_e2e::{
    approve_through_queue, chat_answer, count, messages_with_role, model_settings,
    referenced_files, run_row, sealed_state, secs, tool_writes, turn_digest, wait_for_card,
    wait_for_status, ModelStub, Site, TempDir,
};
use serde_json::{json, Value};
use sqlx::PgConnection;
use uuid::Uuid;

const NEW_DESCRIPTION: &str = "Bicycles for every road: repairs, rentals and advice.";
const EDITED_DESCRIPTION: &str = "Repairs and rentals in the old town.";
const DENIAL: &str = "Keep the alternative text: it was reviewed last week.";

/// One installation with the agent `by-call` (four-eyes, acting user `editor`), a coordinator
/// and a worker.
async fn start(tag: &str, model: &ModelStub) -> Site {
    let mut site = Site::create(tag).await;
    site.configure(&json!({
        "name": "by-call",
        "model": model_settings(model),
        "policy": {
            "allowed_groups": ["content", "editing"],
            "enabled_tools": ["update_page_metadata", "attach_file_to_content_element",
                              "set_file_alternative_text"]
        },
        "max_iterations": 6,
        "four_eyes": true,
        "approval_deadline_secs": 3600
    }));
    site.start_services(&[]);
    site
}

/// The alternative text of file `file` in the default language, live.
async fn alternative_text(conn: &mut PgConnection, file: i64) -> String {
    sqlx::query_scalar(
        "SELECT alternative FROM content.file_metadata
         WHERE file = $1 AND language = 0 AND workspace = 0",
    )
    .bind(file)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A model that proposes `calls` in its first turn and finishes on the next.
fn proposing(calls: Vec<(&'static str, Value)>) -> ModelStub {
    ModelStub::responding(move |request| {
        Some(match messages_with_role(request, "assistant").len() {
            0 => chat_answer("I propose these changes.", &calls),
            _ => chat_answer("Done.", &[]),
        })
    })
}

/// What the model was told of each call of the turn it proposed: the tool messages of its
/// second request.
fn told(model: &ModelStub) -> Vec<String> {
    let requests = model.bodies();
    assert!(
        requests.len() >= 2,
        "the model was asked again: {requests:?}"
    );
    messages_with_role(&requests[1], "tool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_calls_0_and_2_and_denying_1_writes_0_and_2_as_shown_and_the_model_reads_the_denial(
) {
    let model = proposing(vec![
        (
            "update_page_metadata",
            json!({"uid": 12, "description": NEW_DESCRIPTION}),
        ),
        (
            "set_file_alternative_text",
            json!({"uid": 7, "alternative": "A bicycle"}),
        ),
        (
            "attach_file_to_content_element",
            json!({"content_element": 5, "file": 13, "field": "image"}),
        ),
    ]);
    let mut site = start("by_call", &model).await;
    let alternative = alternative_text(&mut site.conn, 7).await;
    let run = site
        .install
        .submit("by-call", "editor", "Three changes, please.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    let denial = format!("1=deny:{DENIAL}");
    let (ok, out) = site
        .decide(
            &run,
            1,
            "admin",
            &[
                "--call",
                "0=approve",
                "--call",
                &denial,
                "--call",
                "2=approve",
            ],
        )
        .await;
    assert!(ok && out.contains("decision accepted"), "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;

    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    assert_eq!(
        alternative_text(&mut site.conn, 7).await,
        alternative,
        "the denied call wrote nothing"
    );
    assert_eq!(
        referenced_files(&mut site.conn, 5, "image").await,
        vec!["hero.jpg", "team.jpg", "bicycle.png"],
        "appended last, as its line said"
    );
    assert_eq!(tool_writes(&mut site.conn, &run).await, 2);
    let told = told(&model);
    assert_eq!(told.len(), 3, "{told:?}");
    assert_eq!(
        told[1],
        format!("Error: tool \"set_file_alternative_text\" was denied by the operator. Comment: {DENIAL}")
    );
    assert!(
        !told[0].starts_with("Error") && !told[2].starts_with("Error"),
        "{told:?}"
    );
    let kind: String = sqlx::query_scalar(
        "SELECT kind FROM run_decisions WHERE run_id = $1::uuid AND outcome = 'accepted'",
    )
    .bind(&run)
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(kind, "calls");
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subset_that_reads_otherwise_without_the_denied_call_comes_back_and_writes_nothing() {
    // Two references appended to one field: the second's line counts the first.
    let model = proposing(vec![
        (
            "attach_file_to_content_element",
            json!({"content_element": 5, "file": 13, "field": "image"}),
        ),
        (
            "attach_file_to_content_element",
            json!({"content_element": 5, "file": 10, "field": "image"}),
        ),
    ]);
    let mut site = start("by_call_moved", &model).await;
    let run = site.install.submit("by-call", "editor", "Two images.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    let (ok, out) = site
        .decide(
            &run,
            1,
            "admin",
            &["--call", "0=deny:Not the bicycle.", "--call", "1=approve"],
        )
        .await;
    assert!(ok, "{out}");
    wait_for_card(&mut site.conn, &run, 2, secs(60)).await;
    assert_eq!(
        referenced_files(&mut site.conn, 5, "image").await,
        vec!["hero.jpg", "team.jpg"],
        "nothing of the subset was written"
    );
    assert_eq!(tool_writes(&mut site.conn, &run).await, 0);
    let state = sealed_state(&site.db.url(), &run).await;
    assert_eq!(state["stale_call_indexes"], json!([1]), "{state}");
    assert_eq!(state["excluded_calls"], json!([0]), "{state}");
    let moved = count(
        &mut site.conn,
        &format!("SELECT count(*) FROM run_events WHERE run_id = '{run}'::uuid AND kind = 'run.preview_moved'"),
    )
    .await;
    assert_eq!(moved, 1, "the bounce is audited");

    // The same verdict on the card that shows the subset as it would land goes through.
    let (ok, out) = site
        .decide(
            &run,
            2,
            "admin",
            &["--call", "0=deny:Not the bicycle.", "--call", "1=approve"],
        )
        .await;
    assert!(ok, "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(
        referenced_files(&mut site.conn, 5, "image").await,
        vec!["hero.jpg", "team.jpg", "logo.svg"]
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_re_issues_the_card_marked_and_only_another_approvers_approval_writes_it() {
    let model = proposing(vec![
        (
            "update_page_metadata",
            json!({"uid": 12, "description": NEW_DESCRIPTION}),
        ),
        (
            "attach_file_to_content_element",
            json!({"content_element": 5, "file": 13, "field": "image"}),
        ),
    ]);
    let mut site = start("by_call_edit", &model).await;
    let run = site.install.submit("by-call", "editor", "Tighten page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;
    let digest = turn_digest(&mut site.conn, &run).await;
    let dir = TempDir::new();

    // An edit that breaks the tool's schema is refused by name; so is one that names another
    // tool. The run waits on card 1, untouched.
    let bad = dir.json("bad.json", &json!({"uid": "twelve", "description": "x"}));
    let (ok, out) = site
        .decide(&run, 1, "approver", &["--edit", "0", &bad])
        .await;
    assert!(!ok && out.contains("edit_invalid_arguments"), "{out}");
    let broker = site.install.broker().await;
    let other_tool = json!({
        "type": "countersign.decision", "version": 2,
        "decision_id": Uuid::now_v7(), "run_id": run, "suspension_seq": 1,
        "turn_digest": digest, "approver": "approver",
        "edits": [{"index": 0, "tool": "attach_file_to_content_element",
                   "arguments": {"content_element": 5, "file": 10, "field": "image"}}],
    });
    broker
        .publish_to_queue(
            &broker.topology().decisions(),
            other_tool.to_string().as_bytes(),
            Some("guest"),
        )
        .await
        .unwrap();
    countersign_e2e::wait_for_sql(
        &mut site.conn,
        "the edit naming another tool is refused",
        secs(30),
        &format!(
            "SELECT EXISTS (SELECT 1 FROM run_decisions WHERE run_id = '{run}'::uuid
                                 AND outcome = 'edit_changes_tool')"
        ),
    )
    .await;
    assert_eq!(
        site.outcomes(&run, 1).await,
        vec!["edit_invalid_arguments", "edit_changes_tool"]
    );
    let row = run_row(&mut site.conn, &run).await;
    assert_eq!(
        (row["status"].as_str(), row["suspension_seq"].as_i64()),
        (Some("waiting_for_approval"), Some(1))
    );
    assert_eq!(
        turn_digest(&mut site.conn, &run).await,
        digest,
        "the card is untouched"
    );

    // A valid edit: the card is issued anew, previewed with the new arguments, marked.
    let edited = dir.json(
        "edit.json",
        &json!({"uid": 12, "description": EDITED_DESCRIPTION}),
    );
    let (ok, out) = site
        .decide(&run, 1, "approver", &["--edit", "0", &edited])
        .await;
    assert!(ok && out.contains("edit accepted"), "{out}");
    wait_for_card(&mut site.conn, &run, 2, secs(60)).await;
    let state = sealed_state(&site.db.url(), &run).await;
    assert_eq!(
        state["pending_calls"][0]["arguments"]["description"],
        EDITED_DESCRIPTION
    );
    assert_eq!(state["edits"][0]["editor"], "approver", "{state}");
    assert_eq!(state["edits"][0]["before"]["description"], NEW_DESCRIPTION);
    assert_eq!(state["stale_call_indexes"], json!([0]));
    let line = state["call_previews"][0]["lines"].to_string();
    assert!(
        line.contains(EDITED_DESCRIPTION),
        "previewed with the edit: {line}"
    );
    assert!(
        site.description(12).await.starts_with("Welcome"),
        "an edit writes nothing"
    );

    // Under four-eyes the editor alone may not approve the card of their edit.
    let (ok, out) = site.decide(&run, 2, "approver", &["--approve"]).await;
    assert!(!ok && out.contains("editor_approval_denied"), "{out}");
    assert_eq!(
        run_row(&mut site.conn, &run).await["status"],
        "waiting_for_approval"
    );

    // Another approver's approval — a version-1 whole-turn decision over the queue — writes it.
    let digest = turn_digest(&mut site.conn, &run).await;
    approve_through_queue(&site.install, &mut site.conn, &run, 2, &digest).await;
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(site.description(12).await, EDITED_DESCRIPTION);
    assert_eq!(
        referenced_files(&mut site.conn, 5, "image").await,
        vec!["hero.jpg", "team.jpg", "bicycle.png"]
    );
    let told = told(&model);
    assert!(
        told[0].starts_with(
            "Note: approver changed the arguments of this call before it ran; it ran with"
        ) && told[0].contains(EDITED_DESCRIPTION),
        "the model is told the call as it ran: {told:?}"
    );
    site.finish().await;
}
