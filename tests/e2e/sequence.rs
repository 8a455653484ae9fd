//! A turn is one sequence, through the real binaries: every call of a turn is previewed against
//! the state the calls before it leave, so the lines of a card compose, and the writes land
//! exactly where those lines said.
//!
//! One installation, one run per pair of writes that can touch the same subject, each run its
//! own agent proposing the pair in one turn: two attaches to one field, two moves into one
//! column, an alternative text set twice, a page's title and then a draft below it, and two
//! appends to one page of the reference tool server (which previews a call after the calls of
//! its turn before it). A second wiki that cannot do that marks its second call's line as
//! computed alone.

use countersign_e2e::{
    approve_through_queue, preview_lines, sealed_state, secs, tool_writes, turn_digest,
    wait_for_card, wait_for_sql, wait_for_status, Installation, Process, TempDir,
};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::remote_tools::{trusted_wiki, WikiServer, SECRET};
use countersign_e2e::Database;

/// One pair of calls proposed in one turn by an agent of its own.
struct Pair {
    agent: &'static str,
    calls: Value,
    /// For each call, a line its card must show.
    lines: [&'static str; 2],
}

fn pairs() -> Vec<Pair> {
    vec![
        Pair {
            agent: "seq-attach",
            calls: json!([
                {"name": "attach_file_to_content_element",
                 "arguments": {"content_element": 5, "file": 13, "field": "image"}},
                {"name": "attach_file_to_content_element",
                 "arguments": {"content_element": 5, "file": 10, "field": "image"}}]),
            lines: [
                "field image: 2 reference(s) → 3, appended last",
                "field image: 3 reference(s) → 4, appended last",
            ],
        },
        Pair {
            agent: "seq-move",
            calls: json!([
                {"name": "move_content_element",
                 "arguments": {"uid": 4, "target_page": 13, "column": 0}},
                {"name": "move_content_element",
                 "arguments": {"uid": 6, "target_page": 13, "column": 0, "after_content_uid": 4}}]),
            lines: [
                "to: page [13] \"About us\", column 0, position 1 of 2, at the top",
                "to: page [13] \"About us\", column 0, position 2 of 3, after content element [4] \"Welcome\"",
            ],
        },
        Pair {
            agent: "seq-alt",
            calls: json!([
                {"name": "set_file_alternative_text",
                 "arguments": {"uid": 7, "alternative": "A red bicycle against a wall"}},
                {"name": "set_file_alternative_text",
                 "arguments": {"uid": 7, "alternative": "A red bicycle in the old town"}}]),
            lines: [
                "alternative: (empty) → \"A red bicycle against a wall\"",
                "alternative: \"A red bicycle against a wall\" → \"A red bicycle in the old town\"",
            ],
        },
        Pair {
            agent: "seq-draft",
            calls: json!([
                {"name": "update_page_metadata", "arguments": {"uid": 14, "title": "Shop"}},
                {"name": "create_page_draft",
                 "arguments": {"parent": 14, "title": "Helmets", "after_page_uid": 15}}]),
            lines: [
                "title: \"Products\" → \"Shop\"",
                "under page [14] \"Shop\"",
            ],
        },
        Pair {
            agent: "seq-wiki",
            calls: json!([
                {"name": "append_line", "arguments": {"page": "home", "line": "three"}},
                {"name": "append_line", "arguments": {"page": "home", "line": "four"}}]),
            lines: [
                "lines: 2 line(s) → 3, appended last: \"three\"",
                "lines: 3 line(s) → 4, appended last: \"four\"",
            ],
        },
    ]
}

/// Writes the agent of `pair` (every writer enabled, no four-eyes) and its script into `dir`.
fn agent_file(dir: &TempDir, agent: &str, calls: &Value) -> String {
    let script = dir.json(
        &format!("{agent}-script.json"),
        &json!({"turns": [
            {"content": "Both at once.", "tool_calls": calls},
            {"content": "Done."}]}),
    );
    dir.json(
        &format!("{agent}.json"),
        &json!({
            "name": agent,
            "model": {"provider": "scripted", "script": script},
            "policy": {"allowed_groups": ["content", "editing"],
                       "enabled_tools": ["attach_file_to_content_element", "move_content_element",
                                         "set_file_alternative_text", "update_page_metadata",
                                         "create_page_draft", "append_line"]},
            "max_iterations": 4, "four_eyes": false, "approval_deadline_secs": 3600
        }),
    )
}

/// The line of `lines` that contains `wanted`, or a panic naming the card.
fn assert_line(lines: &[String], wanted: &str, what: &str) {
    assert!(
        lines.iter().any(|l| l.contains(wanted)),
        "{what}: no line {wanted:?} on the card, which reads {lines:#?}"
    );
}

async fn rows(conn: &mut PgConnection, sql: &str) -> Vec<i64> {
    sqlx::query_scalar(sql).fetch_all(conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lines_of_a_card_compose_and_every_write_lands_where_its_line_said() {
    let dir = TempDir::new();
    let wiki = WikiServer::start(&dir, &json!({"home": ["one", "two"]}), &[]);
    let db = Database::create("sequence").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let pairs = pairs();
    install.configure(&agent_file(&dir, pairs[0].agent, &pairs[0].calls));
    for pair in &pairs[1..] {
        install.countersign_ok(&["agents", "put", &agent_file(&dir, pair.agent, &pair.calls)]);
    }
    let env = [
        ("COUNTERSIGN_TOOL_SERVERS", trusted_wiki(&wiki.url)),
        ("COUNTERSIGN_TOOL_SECRET_WIKI", SECRET.to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let _services: Vec<Process> = vec![
        install.spawn_env("countersign-coordinator", &[], &env),
        install.spawn_env("countersign-worker", &["--poll-interval-secs", "1"], &env),
    ];
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();

    let runs: Vec<String> = pairs
        .iter()
        .map(|p| install.submit(p.agent, "editor", "Make both changes."))
        .collect();
    for (pair, run_id) in pairs.iter().zip(&runs) {
        wait_for_card(&mut conn, run_id, 1, secs(60)).await;
        let state = sealed_state(&db.url(), run_id).await;
        let previews = state["call_previews"].as_array().unwrap().clone();
        for (index, wanted) in pair.lines.iter().enumerate() {
            let lines = preview_lines(&previews, index);
            assert_line(&lines, wanted, &format!("{} call {index}", pair.agent));
        }
        assert!(
            previews.iter().all(|p| p.get("alone").is_none()),
            "{}: every line was computed after the calls before it: {previews:?}",
            pair.agent
        );
    }
    for run_id in &runs {
        let digest = turn_digest(&mut conn, run_id).await;
        approve_through_queue(&install, &mut conn, run_id, 1, &digest).await;
    }
    for (pair, run_id) in pairs.iter().zip(&runs) {
        wait_for_status(&mut conn, run_id, "completed", secs(90)).await;
        assert_eq!(
            tool_writes(&mut conn, run_id).await,
            2,
            "{}: both writes landed, each audited once",
            pair.agent
        );
    }

    // Each write landed where its line said.
    assert_eq!(
        rows(
            &mut conn,
            "SELECT file FROM content.file_references
             WHERE element = 5 AND field = 'image' AND NOT deleted ORDER BY sorting, uid"
        )
        .await,
        vec![7, 8, 13, 10],
        "bicycle.png third, logo.svg fourth"
    );
    assert_eq!(
        rows(
            &mut conn,
            "SELECT uid FROM content.elements
             WHERE pid = 13 AND colpos = 0 AND language = 0 AND workspace = 0 AND NOT deleted
             ORDER BY sorting, uid"
        )
        .await,
        vec![4, 6, 8],
        "Welcome at the top, Opening hours after it, Our story after both"
    );
    let alternative: String = sqlx::query_scalar(
        "SELECT alternative FROM content.file_metadata WHERE file = 7 AND language = 0 AND workspace = 0",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(alternative, "A red bicycle in the old town");
    let (title, drafts): (String, Vec<String>) = sqlx::query_as(
        "SELECT p.title, array(SELECT c.title FROM content.pages c
                               WHERE c.pid = 14 AND NOT c.deleted ORDER BY c.sorting, c.uid)
         FROM content.pages p WHERE p.uid = 14",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (title.as_str(), drafts),
        ("Shop", vec!["Bicycles".to_owned(), "Helmets".to_owned()])
    );
    assert_eq!(
        wiki.state()["pages"]["home"],
        json!(["one", "two", "three", "four"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_preview_a_call_after_the_ones_before_it_has_its_line_marked_alone() {
    let dir = TempDir::new();
    let wiki = WikiServer::start(
        &dir,
        &json!({"home": ["one", "two"]}),
        &["--no-turn-sequence"],
    );
    let db = Database::create("sequence_alone").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let calls = json!([
        {"name": "append_line", "arguments": {"page": "home", "line": "three"}},
        {"name": "append_line", "arguments": {"page": "home", "line": "four"}},
        {"name": "update_page_metadata", "arguments": {"uid": 13, "description": "Us."}}]);
    install.configure(&agent_file(&dir, "seq-alone", &calls));
    let env = [
        ("COUNTERSIGN_TOOL_SERVERS", trusted_wiki(&wiki.url)),
        ("COUNTERSIGN_TOOL_SECRET_WIKI", SECRET.to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let _services: Vec<Process> = vec![
        install.spawn_env("countersign-coordinator", &[], &env),
        install.spawn_env("countersign-worker", &["--poll-interval-secs", "1"], &env),
    ];
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();

    let run_id = install.submit("seq-alone", "editor", "Append twice.");
    wait_for_card(&mut conn, &run_id, 1, secs(60)).await;
    let state = sealed_state(&db.url(), &run_id).await;
    let previews = state["call_previews"].as_array().unwrap().clone();
    let alone: Vec<bool> = (0..3)
        .map(|i| {
            previews.iter().find(|p| p["index"] == i).unwrap()["alone"]
                .as_bool()
                .unwrap_or(false)
        })
        .collect();
    assert_eq!(
        alone,
        vec![false, true, false],
        "only the second append comes after another call on its server: {previews:?}"
    );
    assert_line(
        &preview_lines(&previews, 1),
        "lines: 2 line(s) → 3, appended last: \"four\"",
        "the second append, previewed alone",
    );
    let card = install.countersign_ok(&["show", &run_id, "--as", "admin"]);
    assert!(
        card.contains("as if it ran alone"),
        "the card tells the approver: {card}"
    );
    wait_for_sql(
        &mut conn,
        "the run waits",
        secs(5),
        &format!("SELECT status = 'waiting_for_approval' FROM runs WHERE id = '{run_id}'::uuid"),
    )
    .await;
}
