//! Approvers as a team, through the real coordinator, worker and reaper: an agent wanting two
//! approvers of `legal` writes only after the second approval; a bounce (a new card) dismisses
//! the approvals given on the old one; one denial ends the card; a delegate decides within the
//! delegation's window and is refused outside it; an unanswered card is reminded and escalated
//! to a backup group at (shortened) times, and a member of that group decides it; an expiry is
//! an expiry, never a denial; a policy's `ask` routes a one-approver agent's card to two of
//! `legal`. From Slack: a signed press decides, a forged, replayed or stale
//! one does not, and the message shows content only for a channel an operator cleared for the
//! calls' data class.

use std::path::PathBuf;
use std::process::Command;

use countersign_e2e::{
    chat_answer, count, messages_with_role, model_settings, secs, wait_for_card, wait_for_sql,
    wait_for_status, workspace_file, ModelStub, Site,
};
use serde_json::{json, Value};
use sqlx::PgConnection;

const NEW_DESCRIPTION: &str = "Bicycles for every road: repairs, rentals and advice.";

/// One installation with approver groups `legal` (alice, bob, carol) and `backup` (dana), the
/// agent `team` configured with `approvers` and a card deadline of an hour, a coordinator, a
/// worker and, when asked, a reaper passing every second.
async fn start(tag: &str, model: &ModelStub, approvers: Value, reaper: bool) -> Site {
    start_with_deadline(tag, model, approvers, reaper, 3600).await
}

/// [`start`], with cards expiring `deadline` seconds after they are issued.
async fn start_with_deadline(
    tag: &str,
    model: &ModelStub,
    approvers: Value,
    reaper: bool,
    deadline: u64,
) -> Site {
    let mut site = with_groups(tag).await;
    site.configure(&team_agent(model, approvers, deadline));
    site.start_services(&[]);
    if reaper {
        site.start("countersign-reaper", &["--every", "1"], &[]);
    }
    site
}

/// An installation with the content store, the demo site, the approvers alice, bob, carol,
/// dana and erin, and the groups `legal` (alice, bob, carol) and `backup` (dana); nothing runs.
async fn with_groups(tag: &str) -> Site {
    let mut site = Site::create(tag).await;
    site.install.countersign_ok(&["migrate", "--with-content"]);
    site.install.countersign_ok(&["seed-demo-site"]);
    sqlx::query(
        "INSERT INTO content.users (name, grants, allowed_languages)
         SELECT n, '{agent_approve}', '{0}'
         FROM unnest(ARRAY['alice', 'bob', 'carol', 'dana', 'erin']) AS n",
    )
    .execute(&mut site.conn)
    .await
    .unwrap();
    for (group, members) in [
        ("legal", &["alice", "bob", "carol"][..]),
        ("backup", &["dana"]),
    ] {
        site.install
            .countersign_ok(&["groups", "create", group, "--by", "admin"]);
        for m in members {
            site.install
                .countersign_ok(&["groups", "add", group, m, "--by", "admin"]);
        }
    }
    site
}

/// The agent `team` (four-eyes, page metadata only) wanting `approvers` (none when null).
fn team_agent(model: &ModelStub, approvers: Value, deadline: u64) -> Value {
    let mut agent = json!({
        "name": "team",
        "model": model_settings(model),
        "policy": {
            "allowed_groups": ["content", "editing"],
            "enabled_tools": ["update_page_metadata"]
        },
        "max_iterations": 6,
        "four_eyes": true,
        "approval_deadline_secs": deadline,
    });
    if !approvers.is_null() {
        agent["approvers"] = approvers;
    }
    agent
}

async fn status(conn: &mut PgConnection, run: &str) -> String {
    sqlx::query_scalar("SELECT status FROM runs WHERE id = $1::uuid")
        .bind(run)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// How many events of `kind` the run has.
async fn events(conn: &mut PgConnection, run: &str, kind: &str) -> i64 {
    count(
        conn,
        &format!(
            "SELECT count(*) FROM run_events WHERE run_id = '{run}'::uuid AND kind = '{kind}'"
        ),
    )
    .await
}

/// Starts `countersign-api` with deciding from Slack on; its port.
async fn start_api(site: &mut Site, signing_secret: &str) -> u16 {
    site.start_api(&[("COUNTERSIGN_SLACK_SIGNING_SECRET", signing_secret)])
        .await
}

/// A model that proposes one description of page 12, then finishes.
fn proposing() -> ModelStub {
    ModelStub::responding(move |request| {
        Some(match messages_with_role(request, "assistant").len() {
            0 => chat_answer(
                "I propose this.",
                &[(
                    "update_page_metadata",
                    json!({"uid": 12, "description": NEW_DESCRIPTION}),
                )],
            ),
            _ => chat_answer("Done.", &[]),
        })
    })
}

fn two_of_legal() -> Value {
    json!({"require": [{"group": "legal", "count": 2}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_approvers_write_only_after_the_second_approval() {
    let model = proposing();
    let mut site = start("team_quorum", &model, two_of_legal(), false).await;
    let before = site.description(12).await;
    let run = site.install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    let (ok, out) = site.decide(&run, 1, "alice", &["--approve"]).await;
    assert!(ok && out.contains("approval recorded"), "{out}");
    assert_eq!(status(&mut site.conn, &run).await, "waiting_for_approval");
    assert_eq!(
        site.description(12).await,
        before,
        "one approval writes nothing"
    );

    // The same person twice is one vote; someone outside the groups has none.
    let (ok, out) = site.decide(&run, 1, "alice", &["--approve"]).await;
    assert!(!ok && out.contains("already_voted"), "{out}");
    let (ok, out) = site.decide(&run, 1, "erin", &["--approve"]).await;
    assert!(!ok && out.contains("not_in_approver_groups"), "{out}");
    assert_eq!(status(&mut site.conn, &run).await, "waiting_for_approval");

    let (ok, out) = site.decide(&run, 1, "bob", &["--approve"]).await;
    assert!(ok && out.contains("decision accepted"), "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    assert_eq!(
        site.outcomes(&run, 1).await,
        vec![
            "approval_recorded",
            "already_voted",
            "not_in_approver_groups",
            "accepted"
        ]
    );
    assert_eq!(
        events(&mut site.conn, &run, "card.approval_recorded").await,
        1
    );
    assert_eq!(events(&mut site.conn, &run, "decision.accepted").await, 1);
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounce_dismisses_the_approvals_given_on_the_old_card() {
    let model = proposing();
    let mut site = start("team_bounce", &model, two_of_legal(), false).await;
    let run = site.install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    // Alice and Bob release card 1, but a colleague changed the page in between: the preview
    // moved, the run bounces to card 2 and writes nothing.
    let (ok, out) = site.decide(&run, 1, "alice", &["--approve"]).await;
    assert!(ok && out.contains("approval recorded"), "{out}");
    sqlx::query("UPDATE content.pages SET description = 'Edited meanwhile.' WHERE uid = 12")
        .execute(&mut site.conn)
        .await
        .unwrap();
    let (ok, out) = site.decide(&run, 1, "bob", &["--approve"]).await;
    assert!(ok && out.contains("decision accepted"), "{out}");
    wait_for_card(&mut site.conn, &run, 2, secs(60)).await;
    assert_eq!(site.description(12).await, "Edited meanwhile.");

    // Card 2 starts with no approvals: Alice's vote on it is the first again.
    let (ok, out) = site.decide(&run, 2, "alice", &["--approve"]).await;
    assert!(ok && out.contains("approval recorded"), "{out}");
    assert_eq!(status(&mut site.conn, &run).await, "waiting_for_approval");
    let (ok, out) = site.decide(&run, 2, "carol", &["--approve"]).await;
    assert!(ok && out.contains("decision accepted"), "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    assert_eq!(
        site.outcomes(&run, 2).await,
        vec!["approval_recorded", "accepted"]
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_denial_ends_the_card_and_the_model_reads_it() {
    let model = proposing();
    let mut site = start("team_denial", &model, two_of_legal(), false).await;
    let before = site.description(12).await;
    let run = site.install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    let (ok, out) = site.decide(&run, 1, "alice", &["--approve"]).await;
    assert!(ok && out.contains("approval recorded"), "{out}");
    let (ok, out) = site
        .decide(
            &run,
            1,
            "bob",
            &["--deny", "--comment", "Not this wording."],
        )
        .await;
    assert!(ok && out.contains("decision accepted"), "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(
        site.description(12).await,
        before,
        "a denied card writes nothing"
    );
    let bodies = model.bodies();
    let told = messages_with_role(&bodies[1], "tool");
    assert!(
        told[0].contains("denied") && told[0].contains("Not this wording."),
        "{told:?}"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegate_decides_within_the_window_and_is_refused_outside_it() {
    let model = proposing();
    let one_of_legal = json!({"require": [{"group": "legal", "count": 1}]});
    let mut site = start("team_delegate", &model, one_of_legal, false).await;
    let run = site.install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    // Erin is in no group; Alice's cards go to Erin, but only from 2098.
    site.install.countersign_ok(&[
        "delegations",
        "add",
        "alice",
        "erin",
        "--from",
        "2098-01-01T00:00:00Z",
        "--until",
        "2099-01-01T00:00:00Z",
        "--by",
        "admin",
    ]);
    let (ok, out) = site.decide(&run, 1, "erin", &["--approve"]).await;
    assert!(!ok && out.contains("not_in_approver_groups"), "{out}");
    assert_eq!(status(&mut site.conn, &run).await, "waiting_for_approval");

    // From now on: Erin decides for Alice, and the audit names both.
    site.install.countersign_ok(&[
        "delegations",
        "add",
        "alice",
        "erin",
        "--until",
        "2099-01-01T00:00:00Z",
        "--by",
        "admin",
    ]);
    let (ok, out) = site.decide(&run, 1, "erin", &["--approve"]).await;
    assert!(ok && out.contains("decision accepted"), "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    let audit: Value = sqlx::query_scalar(
        "SELECT payload FROM run_events WHERE run_id = $1::uuid AND kind = 'decision.accepted'",
    )
    .bind(&run)
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(audit["approver"], "erin", "{audit}");
    assert_eq!(audit["on_behalf_of"], json!(["alice"]), "{audit}");
    let delegations = count(
        &mut site.conn,
        "SELECT count(*) FROM directory_audit WHERE action = 'delegation_created'
           AND subject->>'delegator' = 'alice' AND subject->>'delegate' = 'erin'
           AND actor = 'admin'",
    )
    .await;
    assert_eq!(delegations, 2, "both delegations audited with both names");
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_card_is_reminded_then_escalated_and_the_backup_group_decides_it() {
    let model = proposing();
    let approvers = json!({
        "require": [{"group": "legal", "count": 2}],
        "remind_after_secs": 2,
        "escalate_after_secs": 5,
        "escalate_to": "backup"
    });
    let mut site = start("team_escalate", &model, approvers, true).await;
    let run = site.install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    wait_for_sql(
        &mut site.conn,
        "the card is reminded",
        secs(30),
        &format!(
            "SELECT EXISTS (SELECT 1 FROM run_events WHERE run_id = '{run}'::uuid
                                   AND kind = 'card.reminded')"
        ),
    )
    .await;
    let escalated = format!(
        "SELECT EXISTS (SELECT 1 FROM card_alerts WHERE run_id = '{run}'::uuid
                               AND kind = 'escalated')"
    );
    let early = count(&mut site.conn, &format!("SELECT ({escalated})::int::int8")).await;
    if early == 0 {
        // Not yet escalated: the backup group may not decide.
        let (ok, out) = site.decide(&run, 1, "dana", &["--approve"]).await;
        assert!(!ok && out.contains("not_in_approver_groups"), "{out}");
    }
    wait_for_sql(
        &mut site.conn,
        "the card is escalated",
        secs(30),
        &escalated,
    )
    .await;
    assert_eq!(events(&mut site.conn, &run, "card.escalated").await, 1);
    assert_eq!(
        events(&mut site.conn, &run, "card.reminded").await,
        1,
        "once"
    );
    let audited = count(
        &mut site.conn,
        &format!(
            "SELECT count(*) FROM run_events WHERE run_id = '{run}'::uuid
               AND kind = 'card.escalated' AND payload->>'backup_group' = 'backup'"
        ),
    )
    .await;
    assert_eq!(audited, 1, "the escalation is audited");

    let (ok, out) = site.decide(&run, 1, "dana", &["--approve"]).await;
    assert!(ok && out.contains("decision accepted"), "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_is_told_as_an_expiry_never_as_a_denial() {
    let model = proposing();
    let approvers = json!({"require": [{"group": "legal", "count": 2}]});
    let mut site = start_with_deadline("team_expiry", &model, approvers, true, 3).await;
    let run = site.install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;
    let (ok, out) = site.decide(&run, 1, "alice", &["--approve"]).await;
    assert!(ok && out.contains("approval recorded"), "{out}");
    wait_for_status(&mut site.conn, &run, "cancelled", secs(60)).await;

    let reason: String =
        sqlx::query_scalar("SELECT termination_reason FROM runs WHERE id = $1::uuid")
            .bind(&run)
            .fetch_one(&mut site.conn)
            .await
            .unwrap();
    assert_eq!(reason, "approval_expired");
    assert_eq!(
        events(&mut site.conn, &run, "decision.accepted").await,
        0,
        "nobody decided"
    );
    let cancelled: Value = sqlx::query_scalar(
        "SELECT payload FROM run_events WHERE run_id = $1::uuid AND kind = 'run.cancelled'",
    )
    .bind(&run)
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(cancelled["termination_reason"], "approval_expired");
    assert_eq!(model.bodies().len(), 1, "the model is not told a denial");
    site.finish().await;
}

/// The Slack SDK's Python (scripts/slack-sdk.sh).
fn slack_python() -> PathBuf {
    let python = workspace_file("target/slack-sdk/bin/python");
    if !python.exists() {
        let installed = Command::new(workspace_file("scripts/slack-sdk.sh"))
            .status()
            .expect("scripts/slack-sdk.sh runs");
        assert!(installed.success(), "slack_sdk installs");
    }
    python
}

/// `tests/e2e/slack_client.py ARGS`: its JSON answer.
fn slack(args: &[&str]) -> Value {
    let out = Command::new(slack_python())
        .arg(workspace_file("tests/e2e/slack_client.py"))
        .args(args)
        .output()
        .expect("slack_client.py runs");
    assert!(
        out.status.success(),
        "slack_client.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_slack_press_decides_a_forged_or_replayed_one_does_not_and_a_stale_button_is_refused(
) {
    let model = proposing();
    let one_of_legal = json!({"require": [{"group": "legal", "count": 1}]});
    let mut site = start("team_slack", &model, one_of_legal, false).await;
    let port = start_api(&mut site, SIGNING_SECRET).await;
    let install = site.install.clone();
    install.countersign_ok(&["producers", "allow", "slack", "approver", "*"]);
    install.countersign_ok(&[
        "slack", "map", "T0TEAM", "U0ALICE", "alice", "--by", "admin",
    ]);
    let token = install
        .countersign_ok(&["tokens", "create", "--for", "alice", "--label", "e2e"])
        .trim()
        .to_owned();
    let run = install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    // The message shows no content by default: how many writes, where, and the buttons.
    let card1 = slack(&["message", &port.to_string(), &token, &run]);
    assert_eq!(
        card1["text"], "1 write on page 12 — open the card",
        "{card1}"
    );
    assert!(
        !card1["raw"].to_string().contains("Bicycles"),
        "no content in the message: {card1}"
    );
    assert_eq!(card1["previews"], json!([]), "{card1}");
    // A channel shows previews only once an operator cleared it for the calls' data class
    // (update_page_metadata's is editor_content), only those the token's user may see on the
    // card, and no more once the clearance is taken back.
    let admin = install
        .countersign_ok(&["tokens", "create", "--for", "admin", "--label", "e2e"])
        .trim()
        .to_owned();
    let for_channel = |token: &str, channel: &str| {
        slack(&["message", &port.to_string(), token, &run, "T0TEAM", channel])
    };
    assert_eq!(for_channel(&admin, "C0EDITORS")["previews"], json!([]));
    install.countersign_ok(&[
        "slack", "clear", "T0TEAM", "C0PUBLIC", "--class", "public", "--by", "admin",
    ]);
    install.countersign_ok(&[
        "slack",
        "clear",
        "T0TEAM",
        "C0EDITORS",
        "--class",
        "editor_content",
        "--by",
        "admin",
    ]);
    assert_eq!(
        for_channel(&admin, "C0PUBLIC")["previews"],
        json!([]),
        "public only"
    );
    let cleared = for_channel(&admin, "C0EDITORS");
    let previews = cleared["previews"].as_array().unwrap();
    assert_eq!(previews.len(), 1, "{cleared}");
    let preview = previews[0].as_str().unwrap();
    assert!(
        preview.starts_with("*Call 0* `update_page_metadata`") && preview.contains("Bicycles"),
        "{cleared}"
    );
    assert_eq!(
        cleared["buttons"], card1["buttons"],
        "the same card, the same buttons"
    );
    // Alice may decide but not read page 12: her card withholds the preview, so does the
    // message for her, cleared channel or not.
    assert_eq!(
        for_channel(&token, "C0EDITORS")["previews"],
        json!([]),
        "withheld for alice"
    );
    install.countersign_ok(&["slack", "unclear", "T0TEAM", "C0EDITORS", "--by", "admin"]);
    assert_eq!(
        for_channel(&admin, "C0EDITORS")["previews"],
        json!([]),
        "uncleared"
    );
    let audited = count(
        &mut site.conn,
        "SELECT count(*) FROM directory_audit
         WHERE action IN ('slack_channel_cleared', 'slack_channel_uncleared') AND actor = 'admin'",
    )
    .await;
    assert_eq!(audited, 3, "two clearances and one taken back, audited");
    let approve1 = card1["buttons"]["countersign_approve"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(approve1.starts_with(&format!("{run}:1:")), "{approve1}");

    let press = |secret: &str, user: &str, value: &str, age: &str| {
        slack(&[
            "press",
            &port.to_string(),
            secret,
            "T0TEAM",
            user,
            "countersign_approve",
            value,
            age,
        ])
    };
    // Forged (another secret) and replayed (outside the five minutes): refused, nothing decided.
    let forged = press("not-the-secret", "U0ALICE", &approve1, "0");
    assert_eq!(forged["status"], 401, "{forged}");
    let replayed = press(SIGNING_SECRET, "U0ALICE", &approve1, "600");
    assert_eq!(replayed["status"], 401, "{replayed}");
    // A Slack user nobody mapped decides nothing.
    let unmapped = press(SIGNING_SECRET, "U0MALLORY", &approve1, "0");
    assert_eq!(unmapped["body"]["outcome"], "unmapped", "{unmapped}");
    assert_eq!(site.outcomes(&run, 1).await, Vec::<String>::new());

    // A colleague edits the page; Alice's signed press releases card 1, which bounces.
    sqlx::query("UPDATE content.pages SET description = 'Edited meanwhile.' WHERE uid = 12")
        .execute(&mut site.conn)
        .await
        .unwrap();
    let pressed = press(SIGNING_SECRET, "U0ALICE", &approve1, "0");
    assert_eq!(pressed["status"], 200, "{pressed}");
    assert_eq!(pressed["body"]["outcome"], "accepted", "{pressed}");
    wait_for_card(&mut site.conn, &run, 2, secs(60)).await;

    // The card-1 button is stale now: refused `stale_turn`, and the message says so.
    let stale = press(SIGNING_SECRET, "U0ALICE", &approve1, "0");
    assert_eq!(stale["body"]["outcome"], "stale_turn", "{stale}");
    assert_eq!(stale["body"]["replace_original"], true, "{stale}");

    let card2 = slack(&["message", &port.to_string(), &token, &run]);
    let approve2 = card2["buttons"]["countersign_approve"]
        .as_str()
        .unwrap()
        .to_owned();
    let pressed = press(SIGNING_SECRET, "U0ALICE", &approve2, "0");
    assert_eq!(pressed["body"]["outcome"], "accepted", "{pressed}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    let approver: String = sqlx::query_scalar(
        "SELECT approver FROM run_decisions WHERE run_id = $1::uuid AND suspension_seq = 2
           AND outcome = 'accepted'",
    )
    .bind(&run)
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(approver, "alice", "the mapped directory user decided");
    site.finish().await;
}

/// The web inbox page `path` as the holder of `token` sees it: its runs with their quorum cells.
fn inbox_rows(port: u16, token: &str, path: &str) -> Vec<(String, String)> {
    let out = Command::new("python3")
        .arg(workspace_file("tests/e2e/inbox_client.py"))
        .args([&port.to_string(), token, path])
        .output()
        .expect("inbox_client.py runs");
    assert!(
        out.status.success(),
        "inbox_client.py {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_owned(),
                r["quorum"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Leaves description changes of `team` to two approvers of `legal`.
const ROUTING: &str = r#"// policy: route-descriptions
// version: 1

@approvers("legal:2")
permit (
  principal == Agent::"team",
  action == Action::"ask",
  resource == Tool::"update_page_metadata"
) when { context.call.preview.changed_fields.contains("description") };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_ask_routes_a_card_of_a_one_approver_agent_to_two_of_legal() {
    let model = proposing();
    let mut site = with_groups("team_routed").await;
    site.configure(&team_agent(&model, Value::Null, 3600));
    let file = site.dir.0.join("routing.cedar");
    std::fs::write(&file, ROUTING).unwrap();
    site.start_services(&["--policy-file", file.to_str().unwrap()]);
    let before = site.description(12).await;
    let run = site.install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;
    wait_for_sql(
        &mut site.conn,
        "the policy routed the card",
        secs(30),
        &format!(
            "SELECT EXISTS (SELECT 1 FROM policy_evaluations
                            WHERE run_id = '{run}' AND outcome = 'ask' AND reason = 'routed')"
        ),
    )
    .await;
    let routed: Value = sqlx::query_scalar(
        "SELECT requirements FROM card_routes WHERE run_id = $1::uuid AND suspension_seq = 1",
    )
    .bind(&run)
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(routed, json!([{"group": "legal", "count": 2}]));

    // The agent wants one approver; the routed card wants two of legal.
    let (ok, out) = site.decide(&run, 1, "erin", &["--approve"]).await;
    assert!(!ok && out.contains("not_in_approver_groups"), "{out}");
    let (ok, out) = site.decide(&run, 1, "alice", &["--approve"]).await;
    assert!(ok && out.contains("approval recorded"), "{out}");
    assert_eq!(status(&mut site.conn, &run).await, "waiting_for_approval");
    assert_eq!(
        site.description(12).await,
        before,
        "nothing written after one"
    );
    let (ok, out) = site.decide(&run, 1, "bob", &["--approve"]).await;
    assert!(ok, "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_lists_cards_waiting_on_me_and_on_my_groups_with_their_quorum() {
    let model = proposing();
    let mut site = start("team_inbox", &model, two_of_legal(), false).await;
    let port = start_api(&mut site, SIGNING_SECRET).await;
    let (alice, erin) = (site.token("alice"), site.token("erin"));
    let run = site.install.submit("team", "editor", "Describe page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;

    let waiting = "0 of 2 approvals; waiting for 2 of legal".to_owned();
    assert_eq!(
        inbox_rows(port, &alice, "/inbox?waiting=me"),
        vec![(run.clone(), waiting.clone())]
    );
    let (ok, out) = site.decide(&run, 1, "alice", &["--approve"]).await;
    assert!(ok && out.contains("approval recorded"), "{out}");

    // Alice voted: the card no longer waits on her, but still on her group.
    assert_eq!(inbox_rows(port, &alice, "/inbox?waiting=me"), vec![]);
    let one = "1 of 2 approvals — alice; waiting for one of legal".to_owned();
    assert_eq!(
        inbox_rows(port, &alice, "/inbox?waiting=groups"),
        vec![(run.clone(), one.clone())]
    );
    // Erin may decide on the agent's runs but is in none of its groups.
    assert_eq!(inbox_rows(port, &erin, "/inbox?waiting=groups"), vec![]);
    assert_eq!(inbox_rows(port, &erin, "/inbox"), vec![(run.clone(), one)]);

    // The API's inbox filters alike.
    let api_runs = |token: &str, query: &str| -> Vec<String> {
        let (status, page) =
            countersign_e2e::http_get_json(port, &format!("/v1/inbox{query}"), token);
        assert_eq!(status, 200, "{page}");
        page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(api_runs(&alice, "?waiting=me"), Vec::<String>::new());
    assert_eq!(api_runs(&alice, "?waiting=groups"), vec![run.clone()]);
    assert_eq!(api_runs(&erin, "?waiting=groups"), Vec::<String>::new());
    assert_eq!(api_runs(&erin, "?waiting=me"), Vec::<String>::new());
    assert_eq!(api_runs(&erin, ""), vec![run.clone()]);
    let bob = site.token("bob");
    assert_eq!(api_runs(&bob, "?waiting=me"), vec![run.clone()]);
    let (status, refused) = countersign_e2e::http_get_json(port, "/v1/inbox?waiting=nobody", &bob);
    assert_eq!((status, &refused["code"]), (400, &json!("invalid_query")));
    site.finish().await;
}
