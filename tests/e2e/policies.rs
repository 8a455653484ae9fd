//! Policies through the real coordinator and worker: an approval by a policy writes exactly as
//! a person's does (journal, audit, fence), and is bound to the card it saw — a preview that
//! moved before the write re-suspends the run and the policy sees the new card; a denial reaches
//! the model in the rule's words; a broken file stops the coordinator naming its line; a rule
//! that fails at evaluation leaves the card to a person, and so does a turn that bounced three
//! times; a shadowed policy is recorded and counted and changes nothing.

use countersign_e2e::{
    chat_answer, count, hold_gate, http_get, install_gate, messages_with_role, model_settings,
    release_gate, secs, tool_writes, wait_for_card, wait_for_sql, wait_for_status, wait_until,
    waiting_at_gate, Installation, ModelStub, Site, TempDir,
};
use serde_json::json;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use countersign_e2e::Database;

const NEW_DESCRIPTION: &str = "Bicycles for every road: repairs, rentals and advice.";
const DENIAL: &str = "Descriptions of this page are written by people.";

/// Approves a description change of at most 160 characters on page 12 by the agent `policed`.
const APPROVING: &str = r#"// policy: marketing-descriptions
// version: 3

// Rule 1: anything classed secret_adjacent is denied.
@message("Secret-adjacent data is not written by agents.")
permit (principal, action == Action::"deny", resource)
when { context.call.data_class == "secret_adjacent" };

// Rule 2: a short description change on page 12.
permit (
  principal == Agent::"policed",
  action == Action::"approve",
  resource == Tool::"update_page_metadata"
) when {
  context.call.preview.changed_fields == ["description"] &&
  context.call.preview.max_after_chars <= 160 &&
  context.call.subject_ids.contains("uid:12") &&
  !context.call.preview.removes
};
"#;

/// One installation with the agent `policed` (acting user `editor`), a coordinator with
/// `policy` loaded (none when `None`) and a worker.
async fn start(tag: &str, model: &ModelStub, policy: Option<&str>) -> Site {
    let mut site = Site::create(tag).await;
    site.configure(&json!({
        "name": "policed",
        "model": model_settings(model),
        "policy": {
            "allowed_groups": ["content", "editing"],
            "enabled_tools": ["update_page_metadata"]
        },
        "max_iterations": 6,
        "approval_deadline_secs": 3600
    }));
    let policy_file = site.dir.0.join("policy.cedar");
    let mut args = Vec::new();
    if let Some(policy) = policy {
        std::fs::write(&policy_file, policy).unwrap();
        args = vec!["--policy-file", policy_file.to_str().unwrap()];
    }
    site.start_services(&args);
    site
}

/// The policy evaluations of the run: (card, mode, outcome, reason, rule, decided).
async fn evaluations(
    conn: &mut PgConnection,
    run: &str,
) -> Vec<(i32, String, String, Option<String>, Option<i32>, bool)> {
    sqlx::query_as(
        "SELECT suspension_seq, mode, outcome, reason, rule, decision_id IS NOT NULL
         FROM policy_evaluations WHERE run_id = $1::uuid ORDER BY suspension_seq, policy_id",
    )
    .bind(run)
    .fetch_all(conn)
    .await
    .unwrap()
}

/// Waits until the run's first card is up and the coordinator has kept its facts for policies
/// (it looked at the card: any policy evaluated it).
async fn wait_for_policy_card(conn: &mut PgConnection, run: &str) {
    wait_for_card(conn, run, 1, secs(60)).await;
    wait_for_sql(
        conn,
        "the card's facts are kept",
        secs(30),
        &format!("SELECT EXISTS (SELECT 1 FROM policy_cards WHERE run_id = '{run}')"),
    )
    .await;
}

/// A model that proposes a new description for page 12, then finishes.
fn proposing(description: &'static str) -> ModelStub {
    ModelStub::responding(move |request| {
        Some(match messages_with_role(request, "assistant").len() {
            0 => chat_answer(
                "I propose this.",
                &[(
                    "update_page_metadata",
                    json!({"uid": 12, "description": description}),
                )],
            ),
            _ => chat_answer("Done.", &[]),
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_a_policy_approves_writes_as_a_person_approved_one() {
    let model = proposing(NEW_DESCRIPTION);
    let mut site = start("policy_approves", &model, Some(APPROVING)).await;
    let run = site.install.submit("policed", "editor", "Tighten page 12.");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;

    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    assert_eq!(
        tool_writes(&mut site.conn, &run).await,
        1,
        "one tool_write audit event"
    );
    let journal = count(
        &mut site.conn,
        &format!("SELECT count(*) FROM run_journal WHERE run_id = '{run}' AND suspension_seq = 1"),
    )
    .await;
    assert_eq!(journal, 1, "the write is journaled under card 1");
    assert_eq!(
        site.decisions(&run).await,
        vec![(
            1,
            "policy:marketing-descriptions@3".to_owned(),
            "accepted".to_owned()
        )]
    );
    let audited: serde_json::Value = sqlx::query_scalar(
        "SELECT payload FROM run_events WHERE run_id = $1::uuid AND kind = 'decision.accepted'",
    )
    .bind(&run)
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(audited["approver"], "policy:marketing-descriptions@3");
    assert_eq!(audited["policy"]["policy"], "marketing-descriptions");
    assert_eq!(audited["policy"]["rule"], 2);
    assert_eq!(
        audited["policy"]["facts_digest"].as_str().unwrap().len(),
        64
    );
    assert_eq!(
        evaluations(&mut site.conn, &run).await,
        vec![(1, "enforce".into(), "approve".into(), None, Some(2), true)]
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_approval_whose_preview_moved_re_suspends_and_the_policy_sees_the_new_card() {
    let model = proposing(NEW_DESCRIPTION);
    let mut site = start("policy_moved", &model, Some(APPROVING)).await;
    // The release of the first card waits at this gate until the page has changed.
    let key = 4343;
    install_gate(
        &mut site.conn,
        "release",
        "runs",
        "UPDATE",
        "OLD.status = 'waiting_for_approval' AND NEW.status = 'queued' AND OLD.suspension_seq = 1",
        key,
    )
    .await;
    let mut holder = PgConnection::connect(&site.db.url()).await.unwrap();
    hold_gate(&mut holder, key).await;
    let run = site.install.submit("policed", "editor", "Tighten page 12.");
    wait_until(
        "the policy's release waits at the gate",
        secs(60),
        async || (waiting_at_gate(&mut site.conn, key).await == 1).then_some(()),
    )
    .await;
    sqlx::query("UPDATE content.pages SET description = 'Changed by a colleague.' WHERE uid = 12")
        .execute(&mut site.conn)
        .await
        .unwrap();
    release_gate(&mut holder, key).await;

    wait_for_status(&mut site.conn, &run, "completed", secs(90)).await;
    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    let decisions = site.decisions(&run).await;
    assert_eq!(
        decisions,
        vec![
            (
                1,
                "policy:marketing-descriptions@3".to_owned(),
                "accepted".to_owned()
            ),
            (
                2,
                "policy:marketing-descriptions@3".to_owned(),
                "accepted".to_owned()
            ),
        ],
        "card 1 bounced on the moved preview; the policy decided card 2 afresh"
    );
    let evaluated: Vec<i32> = evaluations(&mut site.conn, &run)
        .await
        .iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(evaluated, vec![1, 2]);
    let journal_seqs: Vec<i32> =
        sqlx::query_scalar("SELECT suspension_seq FROM run_journal WHERE run_id = $1::uuid")
            .bind(&run)
            .fetch_all(&mut site.conn)
            .await
            .unwrap();
    assert_eq!(
        journal_seqs,
        vec![2],
        "nothing was written under the moved card"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_three_bounces_of_one_turn_a_person_decides_not_the_policy() {
    let model = proposing(NEW_DESCRIPTION);
    let mut site = start("policy_loop_guard", &model, Some(APPROVING)).await;
    // Every release of a card waits at this gate until a colleague has changed the page, so
    // each approval the policy gives bounces on a moved preview.
    let key = 4344;
    install_gate(
        &mut site.conn,
        "release",
        "runs",
        "UPDATE",
        "OLD.status = 'waiting_for_approval' AND NEW.status = 'queued'",
        key,
    )
    .await;
    let mut holder = PgConnection::connect(&site.db.url()).await.unwrap();
    hold_gate(&mut holder, key).await;
    let run = site.install.submit("policed", "editor", "Tighten page 12.");
    // Three accepted approvals of one turn, the coordinator's limit (`policies::BOUNCE_LIMIT`).
    for bounce in 1..=3 {
        wait_until(
            "the policy's release waits at the gate",
            secs(60),
            async || (waiting_at_gate(&mut site.conn, key).await == 1).then_some(()),
        )
        .await;
        sqlx::query("UPDATE content.pages SET description = $1 WHERE uid = 12")
            .bind(format!("Changed by a colleague, {bounce}."))
            .execute(&mut site.conn)
            .await
            .unwrap();
        release_gate(&mut holder, key).await;
        hold_gate(&mut holder, key).await;
    }

    // Card 4: the policy would approve it again, but the turn bounced three times.
    wait_for_card(&mut site.conn, &run, 4, secs(90)).await;
    wait_for_sql(
        &mut site.conn,
        "the policy looked at card 4",
        secs(30),
        &format!(
            "SELECT EXISTS (SELECT 1 FROM policy_evaluations
                            WHERE run_id = '{run}' AND suspension_seq = 4)"
        ),
    )
    .await;
    let evaluated = evaluations(&mut site.conn, &run).await;
    assert_eq!(
        evaluated.last().unwrap(),
        &(
            4,
            "enforce".into(),
            "ask".into(),
            Some("loop_guard".into()),
            Some(2),
            false
        ),
        "{evaluated:?}"
    );
    assert_eq!(
        site.decisions(&run).await.len(),
        3,
        "cards 1 to 3 were the policy's, card 4 is nobody's yet"
    );
    assert_eq!(site.description(12).await, "Changed by a colleague, 3.");

    // A person decides card 4, and it writes.
    release_gate(&mut holder, key).await;
    let (approved, out) = site.decide(&run, 4, "admin", &["--approve"]).await;
    assert!(approved, "{out}");
    wait_for_status(&mut site.conn, &run, "completed", secs(90)).await;
    assert_eq!(site.description(12).await, NEW_DESCRIPTION);
    assert_eq!(
        site.decisions(&run).await.last().unwrap(),
        &(4, "admin".to_owned(), "accepted".to_owned())
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_denial_reaches_the_model_in_the_rules_words() {
    let model = proposing(NEW_DESCRIPTION);
    let denying = format!(
        "// policy: no-descriptions\n// version: 1\n\n@message(\"{DENIAL}\")\npermit (principal, action == Action::\"deny\", resource == Tool::\"update_page_metadata\");\n"
    );
    let mut site = start("policy_denies", &model, Some(&denying)).await;
    let before = site.description(12).await;
    let run = site.install.submit("policed", "editor", "Tighten page 12.");
    wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;

    assert_eq!(site.description(12).await, before, "nothing written");
    let requests = model.bodies();
    assert!(requests.len() >= 2, "the model was asked again");
    let told = messages_with_role(&requests[1], "tool");
    assert!(
        told.iter()
            .any(|t| t.contains(DENIAL) && t.contains("denied")),
        "{told:?}"
    );
    assert_eq!(
        site.decisions(&run).await,
        vec![(
            1,
            "policy:no-descriptions@1".to_owned(),
            "accepted".to_owned()
        )]
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_that_does_not_validate_stops_the_coordinator_naming_its_line() {
    let db = Database::create("policy_broken").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let dir = TempDir::new();
    let file = dir.0.join("broken.cedar");
    std::fs::write(
        &file,
        "// policy: broken\n// version: 1\n\npermit (principal, action == Action::\"approve\", resource)\nwhen { context.call.preview.colour == \"red\" };\n",
    )
    .unwrap();
    let out = install
        .command("countersign-coordinator")
        .args(["--policy-file", file.to_str().unwrap()])
        .output()
        .expect("the coordinator starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(stderr.contains("policy_invalid"), "{stderr}");
    assert!(
        stderr.contains("line 4") || stderr.contains("line 5"),
        "names the line: {stderr}"
    );
    db.remove().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_fails_at_evaluation_leaves_the_card_to_a_person() {
    let model = proposing(NEW_DESCRIPTION);
    // Valid, but the multiplication overflows on every card: an evaluation error.
    let failing = "// policy: overflowing\n// version: 1\npermit (principal, action == Action::\"approve\", resource)\nwhen { context.tokens_used * 9223372036854775807 > 1 };\n";
    let mut site = start("policy_fails", &model, Some(failing)).await;
    let before = site.description(12).await;
    let run = site.install.submit("policed", "editor", "Tighten page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;
    wait_for_sql(
        &mut site.conn,
        "the policy evaluated the card",
        secs(30),
        &format!("SELECT EXISTS (SELECT 1 FROM policy_evaluations WHERE run_id = '{run}')"),
    )
    .await;
    assert_eq!(
        evaluations(&mut site.conn, &run).await,
        vec![(
            1,
            "enforce".into(),
            "ask".into(),
            Some("evaluation_error".into()),
            None,
            false
        )]
    );
    assert!(site.decisions(&run).await.is_empty());
    assert_eq!(site.description(12).await, before);
    wait_for_card(&mut site.conn, &run, 1, secs(1)).await;
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadowed_policy_is_recorded_and_counted_and_changes_nothing() {
    let model = proposing(NEW_DESCRIPTION);
    let shadow = APPROVING.replace("// version: 3", "// version: 3\n// mode: shadow");
    let mut site = start("policy_shadow", &model, Some(&shadow)).await;
    let before = site.description(12).await;
    let run = site.install.submit("policed", "editor", "Tighten page 12.");
    wait_for_card(&mut site.conn, &run, 1, secs(60)).await;
    wait_for_sql(
        &mut site.conn,
        "the shadowed policy evaluated the card",
        secs(30),
        &format!("SELECT EXISTS (SELECT 1 FROM policy_evaluations WHERE run_id = '{run}')"),
    )
    .await;
    assert_eq!(
        evaluations(&mut site.conn, &run).await,
        vec![(1, "shadow".into(), "approve".into(), None, Some(2), false)]
    );
    assert!(site.decisions(&run).await.is_empty(), "no decision made");
    assert_eq!(site.description(12).await, before, "nothing written");
    let audited: serde_json::Value = sqlx::query_scalar(
        "SELECT payload FROM run_events WHERE run_id = $1::uuid AND kind = 'policy_evaluated'",
    )
    .bind(&run)
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    assert_eq!(audited["mode"], "shadow", "in the run's trail: {audited}");
    assert_eq!(audited["outcome"], "approve");
    let card = site
        .install
        .countersign_ok(&["show", &run, "--as", "admin"]);
    assert!(
        card.contains("policy marketing-descriptions v3 (shadow) would have approved this, rule 2"),
        "shown on the card: {card}"
    );
    let metrics = http_get(site.coordinator_port.unwrap(), "/metrics")
        .expect("metrics")
        .1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("countersign_policy_decisions_total")
                && l.contains("policy=\"marketing-descriptions\"")
                && l.contains("outcome=\"approve\"")
                && l.contains("mode=\"shadow\"")),
        "{metrics}"
    );
    wait_for_card(&mut site.conn, &run, 1, secs(1)).await;
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_over_the_cards_people_decided_prints_the_agreement_table_and_the_misses() {
    let model = proposing(NEW_DESCRIPTION);
    let mut site = start("policy_replay", &model, None).await;
    let mut runs = Vec::new();
    // The denial first: it writes nothing, so both cards show the same change.
    for approve in [false, true] {
        let run = site.install.submit("policed", "editor", "Tighten page 12.");
        wait_for_policy_card(&mut site.conn, &run).await;
        let verdict = if approve { "--approve" } else { "--deny" };
        let (decided, out) = site.decide(&run, 1, "admin", &[verdict]).await;
        assert!(decided, "{out}");
        wait_for_status(&mut site.conn, &run, "completed", secs(60)).await;
        runs.push(run);
    }
    let file = site.dir.0.join("replayed.cedar");
    std::fs::write(&file, APPROVING).unwrap();
    let out = site.install.countersign_ok(&[
        "policies",
        "replay",
        file.to_str().unwrap(),
        "--since",
        "30d",
    ]);
    assert!(out.contains("over 2 card(s)"), "{out}");
    let approve_row = out
        .lines()
        .find(|l| l.starts_with("would approve"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(
        approve_row.split('\t').collect::<Vec<_>>(),
        vec!["would approve", "1", "1", "0"],
        "{out}"
    );
    assert!(
        out.contains("agreement: 1 of 2; would have got wrong: 1"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "run {} card 1: would approve, people denied",
            runs[0]
        )),
        "{out}"
    );
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standing_grant_approves_the_next_matching_card_and_stops_at_revocation_or_expiry() {
    let model = proposing(NEW_DESCRIPTION);
    let mut site = start("policy_grant", &model, None).await;
    // A person approves the first card and grants the same tool on the same page for 8 hours.
    let first = site.install.submit("policed", "editor", "Tighten page 12.");
    wait_for_policy_card(&mut site.conn, &first).await;
    let (approved, out) = site.decide(&first, 1, "admin", &["--approve"]).await;
    assert!(approved, "{out}");
    let granted = site.install.countersign_ok(&[
        "policies", "grant", &first, "--seq", "1", "--as", "admin", "--hours", "8",
    ]);
    let grant_id = granted.split_whitespace().nth(1).unwrap().to_owned();
    let policy = granted
        .split("(policy ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap()
        .to_owned();
    wait_for_status(&mut site.conn, &first, "completed", secs(60)).await;
    let audited = count(
        &mut site.conn,
        &format!(
            "SELECT count(*) FROM run_events WHERE run_id = '{first}'
             AND kind = 'policy_grant_created' AND payload->>'granted_by' = 'admin'"
        ),
    )
    .await;
    assert_eq!(audited, 1, "the grant is audited with who gave it");

    // The next matching card is approved by the grant's generated policy.
    let second = site
        .install
        .submit("policed", "editor", "Tighten page 12 again.");
    wait_for_status(&mut site.conn, &second, "completed", secs(60)).await;
    assert_eq!(
        site.decisions(&second).await,
        vec![(1, format!("policy:{policy}@1"), "accepted".to_owned())]
    );

    // Revoked: the next card waits for a person.
    site.install
        .countersign_ok(&["policies", "revoke", &grant_id, "--as", "admin"]);
    let third = site.install.submit("policed", "editor", "Once more.");
    wait_for_policy_card(&mut site.conn, &third).await;
    assert!(
        site.decisions(&third).await.is_empty(),
        "no decision after revocation"
    );

    // Granted again, then expired (by the database clock): the next card waits too.
    site.install.countersign_ok(&[
        "policies", "grant", &third, "--seq", "1", "--as", "admin", "--hours", "1",
    ]);
    let (approved, out) = site.decide(&third, 1, "admin", &["--approve"]).await;
    assert!(approved, "{out}");
    wait_for_status(&mut site.conn, &third, "completed", secs(60)).await;
    sqlx::query(
        "UPDATE policy_grants SET granted_at = now() - interval '2 hours',
                                  expires_at = now() - interval '1 hour'
         WHERE revoked_at IS NULL",
    )
    .execute(&mut site.conn)
    .await
    .unwrap();
    let fourth = site.install.submit("policed", "editor", "And again.");
    wait_for_policy_card(&mut site.conn, &fourth).await;
    assert!(
        site.decisions(&fourth).await.is_empty(),
        "no decision after expiry"
    );
    let listed = site.install.countersign_ok(&["policies", "grants"]);
    assert!(
        listed.contains("revoked by admin") && listed.contains("expired"),
        "{listed}"
    );
    site.finish().await;
}

/// `tests/e2e/inbox_client.py PORT TOKEN /inbox/runs/RUN --approve-with-grant`: whether the
/// card offered the approval with a grant and, when it did, the outcome page's code and grant
/// sentence.
fn approve_with_grant_in_the_inbox(port: u16, token: &str, run: &str) -> serde_json::Value {
    let out = std::process::Command::new("python3")
        .arg(countersign_e2e::workspace_file("tests/e2e/inbox_client.py"))
        .args([
            &port.to_string(),
            token,
            &format!("/inbox/runs/{run}"),
            "--approve-with-grant",
        ])
        .output()
        .expect("inbox_client.py runs");
    assert!(
        out.status.success(),
        "inbox_client.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_from_the_inbox_card_approves_it_and_the_next_matching_card_writes_unasked() {
    let model = proposing(NEW_DESCRIPTION);
    let mut site = start("policy_grant_inbox", &model, None).await;
    let port = site.start_api(&[]).await;
    let token = site.token("admin");
    let first = site.install.submit("policed", "editor", "Tighten page 12.");
    wait_for_policy_card(&mut site.conn, &first).await;

    let pressed = approve_with_grant_in_the_inbox(port, &token, &first);
    assert_eq!(pressed["offered"], true, "{pressed}");
    assert_eq!(pressed["status"], 200, "{pressed}");
    assert_eq!(pressed["outcome"], "accepted", "{pressed}");
    let sentence = pressed["grant"].as_str().unwrap_or_default();
    assert!(
        sentence.starts_with("Standing grant given for 8 hours: update_page_metadata on uid:12"),
        "{pressed}"
    );
    wait_for_status(&mut site.conn, &first, "completed", secs(60)).await;
    let (by, hours): (String, f64) = sqlx::query_as(
        "SELECT granted_by, extract(epoch FROM expires_at - granted_at)::float8 / 3600
         FROM policy_grants",
    )
    .fetch_one(&mut site.conn)
    .await
    .unwrap();
    assert_eq!((by.as_str(), hours.round()), ("admin", 8.0));

    // The next matching card is the grant's to approve.
    let second = site
        .install
        .submit("policed", "editor", "Tighten page 12 again.");
    wait_for_status(&mut site.conn, &second, "completed", secs(60)).await;
    let decided = site.decisions(&second).await;
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert!(decided[0].1.starts_with("policy:grant-"), "{decided:?}");
    site.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_is_refused_for_a_call_that_removes_content_by_the_cli_and_the_api_and_never_offered(
) {
    let model = proposing("");
    let mut site = start("policy_grant_removes", &model, None).await;
    let run = site
        .install
        .submit("policed", "editor", "Clear page 12's description.");
    wait_for_policy_card(&mut site.conn, &run).await;
    let out = site
        .install
        .countersign(&["policies", "grant", &run, "--seq", "1", "--as", "admin"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused");
    assert!(stderr.contains("grant_removes"), "{stderr}");
    // Neither the API gives it nor the inbox card offers it.
    let port = site.start_api(&[]).await;
    let token = site.token("admin");
    let (status, body) = countersign_e2e::http_post_json(
        port,
        &format!("/v1/runs/{run}/grants"),
        &token,
        &json!({"suspension_seq": 1, "hours": 8}),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "grant_refused", "{body}");
    assert_eq!(body["reason"], "grant_removes", "{body}");
    let pressed = approve_with_grant_in_the_inbox(port, &token, &run);
    assert_eq!(pressed["offered"], false, "{pressed}");
    let grants = count(&mut site.conn, "SELECT count(*) FROM policy_grants").await;
    assert_eq!(grants, 0);
    site.finish().await;
}
