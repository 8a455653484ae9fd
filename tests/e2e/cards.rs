//! `countersign decide` decides on the card its approver was shown — a card file saved by
//! `inbox --save` / `show --save`, or the `--seq` and `--digest` they print — and never on the
//! run's current card: a card the run has moved past is refused `stale_turn` and the run is
//! left exactly as it was.

use std::path::PathBuf;
use std::time::Duration;

use countersign_e2e::{demo_agent, demo_script, Installation};
use serde_json::Value;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use countersign_e2e::Database;

const PROMPT: &str = "Tighten the description of page 12 and add bicycle.png to its teaser.";
const TEASER_IMAGES: &str =
    "SELECT count(*) FROM content.file_references WHERE element = 5 AND field = 'image' AND NOT deleted";

/// The `--seq` and `--digest` that `inbox` or `show --as` printed for the card of `run_id`.
pub fn printed_card(output: &str, run_id: &str) -> (String, String) {
    let line = output
        .lines()
        .find(|l| l.contains("decide on this card:") && l.contains(run_id))
        .unwrap_or_else(|| panic!("no card of {run_id} in:\n{output}"));
    let after = |flag: &str| -> String {
        line.split_once(flag)
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no {flag} in {line:?}"))
            .to_owned()
    };
    (after("--seq "), after("--digest "))
}

/// A card file path of this test, removed when dropped.
struct CardFile(PathBuf);

impl CardFile {
    fn new(who: &str) -> CardFile {
        CardFile(
            std::env::temp_dir().join(format!("countersign-e2e-{}-{who}.json", Uuid::now_v7())),
        )
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temp path")
    }

    fn read(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(&self.0).unwrap()).unwrap()
    }
}

impl Drop for CardFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn row(conn: &mut PgConnection, run_id: &str) -> Value {
    sqlx::query_scalar("SELECT to_jsonb(r) FROM runs r WHERE id = $1::uuid")
        .bind(run_id)
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(conn).await.unwrap()
}

/// Waits until the run waits for approval on suspension `seq`.
async fn wait_for_card(conn: &mut PgConnection, run_id: &str, seq: i32) {
    for _ in 0..600 {
        let (status, current): (String, Option<i32>) =
            sqlx::query_as("SELECT status, suspension_seq FROM runs WHERE id = $1::uuid")
                .bind(run_id)
                .fetch_one(&mut *conn)
                .await
                .unwrap();
        if status == "waiting_for_approval" && current == Some(seq) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run {run_id} did not reach suspension {seq} within 60 s");
}

async fn wait_for_status(conn: &mut PgConnection, run_id: &str, wanted: &str) {
    for _ in 0..600 {
        let status: String = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1::uuid")
            .bind(run_id)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        if status == wanted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run {run_id} did not become {wanted} within 60 s");
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn saved_card_of<'a>(file: &'a Value, run_id: &str) -> &'a Value {
    file["cards"]
        .as_array()
        .expect("a list of cards")
        .iter()
        .find(|c| c["run_id"] == run_id)
        .unwrap_or_else(|| panic!("no card of {run_id} in {file}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_card_the_run_has_moved_past_is_refused_stale_turn_and_the_run_is_untouched() {
    let db = Database::create("cards").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    let script = demo_script();
    let _coordinator = install.spawn("countersign-coordinator", &[]);
    let _worker = install.spawn(
        "countersign-worker",
        &["--model-script", &script, "--poll-interval-secs", "1"],
    );
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();

    let submitted = install.countersign_ok(&[
        "submit",
        "--agent",
        "seo-assistant",
        "--as",
        "editor",
        PROMPT,
    ]);
    let run_id = submitted
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no run id in {submitted:?}"))
        .to_owned();
    wait_for_card(&mut conn, &run_id, 1).await;

    // Two approvers look at card 1 and keep what they were shown.
    let admin_card = CardFile::new("admin");
    let approver_card = CardFile::new("approver");
    let inbox = install.countersign_ok(&["inbox", "--as", "admin", "--save", admin_card.path()]);
    let (seq, digest) = printed_card(&inbox, &run_id);
    assert_eq!(seq, "1");
    assert_eq!(digest.len(), 64, "the digest is printed in full: {inbox}");
    let saved = admin_card.read();
    let card1 = saved_card_of(&saved, &run_id);
    assert_eq!(card1["suspension_seq"], 1);
    assert_eq!(card1["turn_digest"], digest.as_str());
    assert!(
        saved
            .to_string()
            .contains("2 reference(s) → 3, appended last"),
        "the previews as shown: {saved}"
    );
    install.countersign_ok(&["inbox", "--as", "approver", "--save", approver_card.path()]);

    // A colleague attaches another image to the teaser; the admin approves card 1, and the
    // worker, re-previewing before any write, finds the attach call moved: nothing is written
    // and the run waits again on card 2 (same calls, same digest, new previews).
    sqlx::query(
        "INSERT INTO content.file_references (element, field, file, sorting)
         SELECT 5, 'image', 10, coalesce(max(sorting), 0) + 1
         FROM content.file_references WHERE element = 5 AND field = 'image'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    install.countersign_ok(&[
        "decide",
        &run_id,
        "--card",
        admin_card.path(),
        "--as",
        "admin",
        "--approve",
    ]);
    wait_for_card(&mut conn, &run_id, 2).await;
    assert_eq!(count(&mut conn, TEASER_IMAGES).await, 3, "nothing written");
    let before = row(&mut conn, &run_id).await;
    assert_eq!(
        before["turn_digest"],
        digest.as_str(),
        "the calls did not change"
    );

    // The second approver's card 1 is refused, by file or by number and digest alike.
    let stale = install.countersign(&[
        "decide",
        &run_id,
        "--card",
        approver_card.path(),
        "--as",
        "approver",
        "--approve",
    ]);
    assert_eq!(stale.status.code(), Some(1), "{}", stderr(&stale));
    assert!(
        stderr(&stale).contains("decision refused: stale_turn"),
        "{}",
        stderr(&stale)
    );
    let stale = install.approve_card(&run_id, 1, &digest, "approver");
    assert_eq!(stale.status.code(), Some(1), "{}", stderr(&stale));
    assert!(stderr(&stale).contains("stale_turn"), "{}", stderr(&stale));
    assert_eq!(
        row(&mut conn, &run_id).await,
        before,
        "the run is untouched"
    );
    assert_eq!(count(&mut conn, TEASER_IMAGES).await, 3);
    let shown = install.countersign_ok(&["show", &run_id]);
    assert_eq!(
        shown.matches("\"outcome\":\"stale_turn\"").count(),
        2,
        "both refusals are on the trail: {shown}"
    );

    // A decision that names no card is a usage error; nothing is sent.
    for (args, missing) in [
        (
            vec!["decide", &run_id, "--as", "approver", "--approve"],
            "--card",
        ),
        (
            vec![
                "decide",
                &run_id,
                "--seq",
                "2",
                "--as",
                "approver",
                "--approve",
            ],
            "--digest",
        ),
    ] {
        let out = install.countersign(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(missing), "{}", stderr(&out));
    }
    assert_eq!(row(&mut conn, &run_id).await, before);

    // The current card, shown and saved, releases the turn, and it is written.
    let admin_card2 = CardFile::new("admin-2");
    let shown = install.countersign_ok(&[
        "show",
        &run_id,
        "--as",
        "admin",
        "--save",
        admin_card2.path(),
    ]);
    assert!(
        shown.contains("3 reference(s) → 4, appended last"),
        "{shown}"
    );
    assert_eq!(
        printed_card(&shown, &run_id),
        ("2".to_owned(), digest.clone())
    );
    assert_eq!(
        saved_card_of(&admin_card2.read(), &run_id)["suspension_seq"],
        2
    );
    let decided = install.countersign_ok(&[
        "decide",
        &run_id,
        "--card",
        admin_card2.path(),
        "--as",
        "admin",
        "--approve",
    ]);
    assert!(decided.contains("decision accepted"), "{decided}");
    wait_for_status(&mut conn, &run_id, "completed").await;
    assert_eq!(count(&mut conn, TEASER_IMAGES).await, 4);

    // A card file without this run's card names nothing.
    let elsewhere = install.countersign(&[
        "decide",
        "0193c1f2-0000-7000-8000-000000000000",
        "--card",
        admin_card2.path(),
        "--as",
        "admin",
        "--deny",
    ]);
    assert_eq!(elsewhere.status.code(), Some(1));
    assert!(
        stderr(&elsewhere).contains("holds no card of run"),
        "{}",
        stderr(&elsewhere)
    );

    drop(conn);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_saves_no_card_for_a_run_that_does_not_wait_for_approval() {
    let db = Database::create("nocard").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    install.configure(&demo_agent());
    let _coordinator = install.spawn("countersign-coordinator", &[]);
    // No worker: the run stays queued.
    let submitted = install.countersign_ok(&[
        "submit",
        "--agent",
        "seo-assistant",
        "--as",
        "editor",
        PROMPT,
    ]);
    let run_id = submitted.split_whitespace().nth(1).unwrap().to_owned();
    let file = CardFile::new("queued");
    let out = install.countersign(&["show", &run_id, "--as", "admin", "--save", file.path()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no card to save"), "{}", stderr(&out));
    assert!(!file.0.exists(), "a refused --save writes nothing");

    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}
