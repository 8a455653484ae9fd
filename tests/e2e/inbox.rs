//! The web inbox in a real browser: Chromium driven through chromedriver (both from the
//! system's packages, started here on free ports), against the real coordinator, worker and
//! `countersign-api`, configured with the `countersign` command as an operator would.
//!
//! One story, two approvers: the admin signs in and sees the card with both previews (one of
//! them carrying `<script>`, shown as text); the `approver`, who may not read the page, sees
//! them withheld and keeps that tab open; a colleague's edit moves a preview, so the admin's
//! approval bounces and the run comes back on a new card; the approver's stale tab approves and
//! is refused `stale_turn` with the advice to reload; the admin approves the current card and
//! the writes land. The card after the bounce shows the rewritten description as before and after, and
//! the image field as its list with the new reference marked; the inbox marks the card as back;
//! the history reads as sentences. A second approver decides a queue of three cards with the
//! keyboard alone, and axe-core checks each kind of page. A third edits one call of a card and
//! decides the re-issued card call by call, after reading in the inbox what the run was asked
//! and a line per call, a rewrite as before and after, and the page as if every call were
//! accepted. Screenshots go to `target/e2e-artefacts/` (with `UPDATE_SCREENSHOTS=1`, also over
//! the pictures in `docs/`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use countersign_e2e::{free_port, http_get, http_post_json, workspace_file, Installation};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use countersign_e2e::Database;

const TEASER_IMAGES: &str =
    "SELECT count(*) FROM content.file_references WHERE element = 5 AND field = 'image' AND NOT deleted";
/// What the scripted model proposes for page 12: markup the inbox must show as text.
const DESCRIPTION: &str =
    "Bicycles for every road <script>alert(\"pwned\")</script> — repairs and rentals.";

/// Where the screenshots of this test are kept.
fn artefacts() -> PathBuf {
    let dir = workspace_file("target/e2e-artefacts");
    std::fs::create_dir_all(&dir).expect("the artefact directory");
    dir
}

/// chromedriver on a free port, in a process group of its own: on drop the group is killed,
/// so the Chromium processes it started go with it even when the test failed half-way.
struct Chromedriver {
    process: std::process::Child,
    url: String,
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let group = format!("-{}", self.process.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.process.wait();
    }
}

impl Chromedriver {
    async fn start() -> Chromedriver {
        let port = free_port();
        let mut command = Command::new("chromedriver");
        command
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let process = command.spawn().expect(
            "chromedriver starts (`apt-get install -y chromium chromium-driver`; .ci/run does)",
        );
        let driver = Chromedriver {
            process,
            url: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..100 {
            if status_is_ok(port) {
                return driver;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not answer on port {port}");
    }

    /// A fresh headless Chromium with a profile of its own.
    async fn browser(&self, profile: &std::path::Path) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                    "--window-size=1280,1100",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

/// Whether chromedriver's `/status` answers 200. (It keeps connections open whatever the
/// request asks, so this reads the status line only, with a timeout.)
fn status_is_ok(port: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(
        stream,
        "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

async fn run_state(conn: &mut PgConnection, run_id: &str) -> (String, Option<i32>) {
    sqlx::query_as("SELECT status, suspension_seq FROM runs WHERE id = $1::uuid")
        .bind(run_id)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Waits until the run is `status` (on suspension `seq`, when given).
async fn wait_for(conn: &mut PgConnection, run_id: &str, status: &str, seq: Option<i32>) {
    for _ in 0..600 {
        let (now, current) = run_state(conn, run_id).await;
        if now == status && (seq.is_none() || current == seq) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run {run_id} did not become {status} {seq:?} within 60 s");
}

async fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(conn).await.unwrap()
}

/// Saves what `browser` shows as `name` under the artefacts; with `UPDATE_SCREENSHOTS=1`, the
/// pictures the documentation shows (`docs/NAME`, when it exists) are replaced by it too.
async fn screenshot(browser: &Client, name: &str) {
    let png = browser.screenshot().await.expect("a screenshot");
    std::fs::write(artefacts().join(name), &png).expect("the screenshot is saved");
    let documented = workspace_file(&format!("docs/{name}"));
    if std::env::var_os("UPDATE_SCREENSHOTS").is_some() && documented.exists() {
        std::fs::write(documented, png).expect("the documentation's picture is replaced");
    }
}

/// The text of the element `css` selects, waiting for it to appear (after a click that
/// navigates, the next page).
async fn text_of(browser: &Client, css: &str) -> String {
    browser
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .text()
        .await
        .unwrap()
}

async fn all_texts(browser: &Client, css: &str) -> Vec<String> {
    let mut texts = Vec::new();
    for element in browser.find_all(Locator::Css(css)).await.unwrap() {
        texts.push(element.text().await.unwrap());
    }
    texts
}

/// Signs `browser` in with `token` on the sign-in page.
async fn sign_in(browser: &Client, base: &str, token: &str) {
    browser.goto(&format!("{base}/inbox")).await.unwrap();
    assert!(
        browser
            .current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/inbox/sign-in"),
        "an unsigned browser is sent to sign in"
    );
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    browser
        .find(Locator::Css("#sign-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css("#signed-in-as"))
        .await
        .expect("signed in");
}

/// Opens the run's page from the inbox list.
async fn open_run_from_inbox(browser: &Client, base: &str, run_id: &str) {
    browser.goto(&format!("{base}/inbox")).await.unwrap();
    browser
        .find(Locator::Css(&format!(
            "tr[data-run-id='{run_id}'] a.run-link"
        )))
        .await
        .unwrap_or_else(|e| panic!("run {run_id} is not in the inbox: {e}"))
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css("#card"))
        .await
        .expect("the card");
}

async fn click(browser: &Client, css: &str) {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .click()
        .await
        .unwrap();
}

/// The coordinator, a worker and `countersign-api` of `install`, once the API answers on its
/// own port: that port, and the processes (stopped when dropped). A free port can be taken by
/// another test between its choice and the API's bind, so an API that exits is started again
/// on other ports.
async fn start_services(install: &Installation) -> (u16, Vec<countersign_e2e::Process>) {
    let mut services = vec![
        install.spawn("countersign-coordinator", &[]),
        install.spawn("countersign-worker", &["--poll-interval-secs", "1"]),
    ];
    for _ in 0..3 {
        let api_port = free_port();
        let ready_port = free_port();
        let mut api = install.spawn(
            "countersign-api",
            &[
                "--listen",
                &format!("127.0.0.1:{api_port}"),
                "--http-addr",
                &format!("127.0.0.1:{ready_port}"),
            ],
        );
        // The whole suite shares two cores: the API may take a while to answer.
        let answered =
            countersign_e2e::wait_until("the API answers", Duration::from_secs(90), async || {
                if api.exited().is_some() {
                    return Some(false);
                }
                http_get(api_port, "/inbox/sign-in").map(|_| true)
            })
            .await;
        if answered {
            services.push(api);
            return (api_port, services);
        }
    }
    panic!("countersign-api did not start on three pairs of free ports");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvers_decide_in_a_real_browser_and_a_stale_tab_is_refused_until_it_reloads() {
    let db = Database::create("inbox").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let scratch = std::env::temp_dir().join(format!("countersign-e2e-inbox-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&scratch).unwrap();

    // An agent whose scripted model proposes a description with markup in it.
    let script = scratch.join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "read_page_metadata", "arguments": {"uid": 12}}]},
            {"content": "I propose a description and the hero image on the teaser.",
             "tool_calls": [
                {"name": "update_page_metadata", "arguments": {"uid": 12, "description": DESCRIPTION}},
                {"name": "attach_file_to_content_element",
                 "arguments": {"content_element": 5, "file": 13, "field": "image"}}
             ]},
            {"content": "Done."}
        ]})
        .to_string(),
    )
    .unwrap();
    let agent = scratch.join("agent.json");
    std::fs::write(
        &agent,
        json!({
            "name": "seo-assistant", "active": true,
            "model": {"provider": "scripted", "script": script},
            "policy": {"allowed_groups": ["content", "editing"],
                       "enabled_tools": ["update_page_metadata", "attach_file_to_content_element"]},
            "max_iterations": 8, "four_eyes": true, "approval_deadline_secs": 86400
        })
        .to_string(),
    )
    .unwrap();
    install.configure(agent.to_str().unwrap());

    // Tokens, issued as an operator would; the secret is the one line on stdout.
    let token = |user: &str| -> String {
        let out = install.countersign_ok(&["tokens", "create", "--for", user, "--label", "e2e"]);
        out.trim().to_owned()
    };
    let (editor, admin, approver) = (token("editor"), token("admin"), token("approver"));
    assert!(admin.starts_with("cst_"), "{admin}");
    let listed = install.countersign_ok(&["tokens", "list"]);
    assert_eq!(listed.lines().count(), 3, "{listed}");
    assert!(
        !listed.contains(&admin[4..]),
        "the list shows no secret: {listed}"
    );

    let (api_port, _services) = start_services(&install).await;
    let base = format!("http://127.0.0.1:{api_port}");

    // The editor's run request, through the API.
    let (status, created) = http_post_json(
        api_port,
        "/v1/runs",
        &editor,
        &json!({"agent": "seo-assistant", "prompt": "Tighten page 12 and add bicycle.png to its teaser."}),
    );
    assert_eq!(status, 202, "{created}");
    let run_id = created["run_id"].as_str().unwrap().to_owned();
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();
    wait_for(&mut conn, &run_id, "waiting_for_approval", Some(1)).await;

    let driver = Chromedriver::start().await;

    // The admin: the inbox, then the card with both previews.
    let admin_browser = driver.browser(&scratch.join("profile-admin")).await;
    sign_in(&admin_browser, &base, &admin).await;
    assert_eq!(text_of(&admin_browser, "#signed-in-as").await, "admin");
    let row = text_of(&admin_browser, &format!("tr[data-run-id='{run_id}']")).await;
    assert!(
        row.contains("seo-assistant") && row.contains("editor"),
        "{row}"
    );
    assert!(
        text_of(
            &admin_browser,
            &format!("tr[data-run-id='{run_id}'] td.age")
        )
        .await
        .ends_with(" s"),
        "its age"
    );
    screenshot(&admin_browser, "inbox.png").await;

    open_run_from_inbox(&admin_browser, &base, &run_id).await;
    let previews = all_texts(&admin_browser, "#card ul.preview-lines").await;
    assert_eq!(previews.len(), 2, "both previews are shown: {previews:?}");
    assert!(
        previews[0].contains("<script>alert(\"pwned\")</script>"),
        "{previews:?}"
    );
    assert!(
        previews[1].contains("field image: 2 reference(s) → 3, appended last"),
        "{previews:?}"
    );
    assert!(
        admin_browser
            .find_all(Locator::Css("#card script"))
            .await
            .unwrap()
            .is_empty(),
        "the markup in a preview is text, not an element"
    );
    assert!(text_of(&admin_browser, "#caption")
        .await
        .starts_with("Captured when the run paused — the target may have changed since."));
    assert_eq!(text_of(&admin_browser, "#suspension-seq").await, "1");
    screenshot(&admin_browser, "card.png").await;

    // The approver may decide but not read page 12: the previews are withheld. This tab stays
    // on card 1.
    let approver_browser = driver.browser(&scratch.join("profile-approver")).await;
    sign_in(&approver_browser, &base, &approver).await;
    open_run_from_inbox(&approver_browser, &base, &run_id).await;
    let withheld = all_texts(&approver_browser, "#card p.notice.withheld").await;
    assert_eq!(withheld.len(), 2, "{withheld:?}");
    assert!(withheld[0].starts_with("Preview withheld"), "{withheld:?}");
    assert!(approver_browser
        .find_all(Locator::Css("#card ul.preview-lines"))
        .await
        .unwrap()
        .is_empty());
    screenshot(&approver_browser, "card-withheld.png").await;

    // A colleague attaches another image; the admin approves card 1 and the re-preview bounces.
    sqlx::query(
        "INSERT INTO content.file_references (element, field, file, sorting)
         SELECT 5, 'image', 10, coalesce(max(sorting), 0) + 1
         FROM content.file_references WHERE element = 5 AND field = 'image'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    click(&admin_browser, "#approve").await;
    assert_eq!(text_of(&admin_browser, "#outcome-code").await, "accepted");
    wait_for(&mut conn, &run_id, "waiting_for_approval", Some(2)).await;
    assert_eq!(count(&mut conn, TEASER_IMAGES).await, 3, "nothing written");

    // The approver's stale tab approves card 1: refused, told to reload; nothing changes.
    let before: Value = sqlx::query_scalar("SELECT to_jsonb(r) FROM runs r WHERE id = $1::uuid")
        .bind(&run_id)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    click(&approver_browser, "#approve").await;
    assert_eq!(
        text_of(&approver_browser, "#outcome-code").await,
        "stale_turn"
    );
    assert!(text_of(&approver_browser, "#reload-hint")
        .await
        .contains("Reload the card"));
    screenshot(&approver_browser, "stale.png").await;
    let after: Value = sqlx::query_scalar("SELECT to_jsonb(r) FROM runs r WHERE id = $1::uuid")
        .bind(&run_id)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(after, before, "the stale approval changed nothing");

    // Reloading shows card 2, still withheld for the approver.
    click(&approver_browser, "#reload").await;
    approver_browser
        .wait()
        .for_element(Locator::Css("#card"))
        .await
        .unwrap();
    assert_eq!(text_of(&approver_browser, "#suspension-seq").await, "2");

    // The inbox says the card is back, and how long is left to decide.
    admin_browser.goto(&format!("{base}/inbox")).await.unwrap();
    let row = text_of(&admin_browser, &format!("tr[data-run-id='{run_id}']")).await;
    assert!(row.contains("↺ back 1×"), "{row}");
    assert!(
        text_of(
            &admin_browser,
            &format!("tr[data-run-id='{run_id}'] td.deadline")
        )
        .await
        .ends_with(" left"),
        "{row}"
    );

    // The admin's current card: the moved call marked, the notice, the new preview.
    open_run_from_inbox(&admin_browser, &base, &run_id).await;
    assert!(text_of(&admin_browser, "#moved-notice")
        .await
        .contains("nothing was written"));
    let moved = admin_browser
        .find_all(Locator::Css("#card article.call.moved"))
        .await
        .unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!(
        moved[0].attr("data-index").await.unwrap().as_deref(),
        Some("1")
    );
    assert!(moved[0]
        .text()
        .await
        .unwrap()
        .contains("3 reference(s) → 4, appended last"));
    // The description, rewritten almost entirely, reads as before and after blocks (a word
    // diff of two unrelated texts would interleave them); the image field as its list of
    // references with the new one marked.
    assert!(text_of(
        &admin_browser,
        "#card article[data-index='0'] div.rewritten p.before"
    )
    .await
    .starts_with("Welcome to the countersign demo site"),);
    assert!(text_of(
        &admin_browser,
        "#card article[data-index='0'] div.rewritten p.after"
    )
    .await
    .starts_with("Bicycles for every road"),);
    let items = all_texts(
        &admin_browser,
        "#card article[data-index='1'] ol.preview-list li",
    )
    .await;
    assert_eq!(
        items.len(),
        4,
        "three references and the new one: {items:?}"
    );
    let added = text_of(
        &admin_browser,
        "#card article[data-index='1'] ol.preview-list li.added",
    )
    .await;
    assert!(
        added.starts_with("[13] ") && added.ends_with("new"),
        "{added}"
    );
    assert_eq!(items[3], added, "appended last");
    screenshot(&admin_browser, "card-moved.png").await;

    click(&admin_browser, "#approve").await;
    assert_eq!(text_of(&admin_browser, "#outcome-code").await, "accepted");
    wait_for(&mut conn, &run_id, "completed", None).await;
    assert_eq!(
        count(&mut conn, TEASER_IMAGES).await,
        4,
        "the approved write landed"
    );
    let description: String =
        sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = 12")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(description, DESCRIPTION);

    // The run's history, on its page, in words: no codes, no content.
    click(&admin_browser, "#back-to-run").await;
    admin_browser
        .wait()
        .for_element(Locator::Css("#history"))
        .await
        .unwrap();
    assert_eq!(text_of(&admin_browser, "#status").await, "completed");
    let history = text_of(&admin_browser, "#history").await;
    for sentence in [
        "Suspended for approval — card 1",
        "The preview of call 1 moved; nothing written — card 2",
        "Approved by admin — card 2",
        "Written: update_page_metadata — card 2, call 0",
        "Written: attach_file_to_content_element — card 2, call 1",
        "the card it was made on was out of date",
        "Completed",
    ] {
        assert!(history.contains(sentence), "{sentence} in {history}");
    }
    for code in ["run.suspended", "stale_turn", "turn_digest"] {
        assert!(!history.contains(code), "{code} in {history}");
    }
    assert!(
        !history.contains("pwned"),
        "no content in the history: {history}"
    );

    // Revoking the approver's token ends the browser session signed in with it.
    let listed = install.countersign_ok(&["tokens", "list"]);
    let approver_token = listed
        .lines()
        .find(|l| l.split('\t').nth(1) == Some("approver"))
        .and_then(|l| l.split('\t').next())
        .unwrap_or_else(|| panic!("no approver token in {listed}"))
        .to_owned();
    install.countersign_ok(&["tokens", "revoke", &approver_token]);
    approver_browser
        .goto(&format!("{base}/inbox"))
        .await
        .unwrap();
    assert!(
        approver_browser
            .current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/inbox/sign-in"),
        "a revoked token's session is over"
    );
    assert!(install
        .countersign_ok(&["tokens", "list"])
        .lines()
        .any(|l| l.starts_with(&approver_token) && l.contains("\trevoked ")));

    admin_browser.close().await.unwrap();
    approver_browser.close().await.unwrap();
    drop(conn);
    let _ = std::fs::remove_dir_all(&scratch);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}

/// axe-core's source (scripts/axe-core.sh installs it, pinned, under target/).
fn axe_source() -> String {
    let file = workspace_file("target/axe-core/node_modules/axe-core/axe.min.js");
    if !file.exists() {
        let installed = Command::new(workspace_file("scripts/axe-core.sh"))
            .status()
            .expect("scripts/axe-core.sh runs");
        assert!(installed.success(), "axe-core could not be installed");
    }
    std::fs::read_to_string(file).expect("axe-core's source")
}

/// Runs axe-core's WCAG 2.1 A/AA and best-practice rules on the page `browser` shows and fails
/// the test, naming each, on any serious or critical violation.
async fn assert_accessible(browser: &Client, page: &str) {
    browser
        .execute(&axe_source(), vec![])
        .await
        .expect("axe-core loads");
    let result = browser
        .execute_async(
            r#"const done = arguments[arguments.length - 1];
               axe.run(document, {runOnly: {type: "tag",
                   values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]}})
                  .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact,
                      nodes: v.nodes.map(n => n.target.join(" "))}))),
                        e => done({error: String(e)}));"#,
            vec![],
        )
        .await
        .expect("axe-core runs");
    let violations = result
        .as_array()
        .unwrap_or_else(|| panic!("axe-core on {page}: {result}"));
    let serious: Vec<&Value> = violations
        .iter()
        .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
        .collect();
    assert!(serious.is_empty(), "axe-core on {page}: {serious:#?}");
}

/// Presses `key` on the page, as a person would with nothing focused.
async fn press(browser: &Client, key: &str) {
    browser
        .find(Locator::Css("body"))
        .await
        .unwrap()
        .send_keys(key)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_decides_a_queue_of_three_cards_with_the_keyboard_alone() {
    let db = Database::create("inbox_keys").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let scratch = std::env::temp_dir().join(format!("countersign-e2e-keys-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&scratch).unwrap();
    // Three agents, each proposing a description for a page of its own, so that one card's
    // write does not move another's preview.
    let agents: Vec<PathBuf> = [12, 13, 14]
        .into_iter()
        .map(|uid| {
            let script = scratch.join(format!("script-{uid}.json"));
            std::fs::write(
                &script,
                json!({"turns": [
                    {"content": "A shorter description.", "tool_calls": [
                        {"name": "update_page_metadata",
                         "arguments": {"uid": uid, "description": "Bicycles for every road."}}]},
                    {"content": "Done."}
                ]})
                .to_string(),
            )
            .unwrap();
            let agent = scratch.join(format!("agent-{uid}.json"));
            std::fs::write(
                &agent,
                json!({
                    "name": format!("seo-{uid}"), "active": true,
                    "model": {"provider": "scripted", "script": script},
                    "policy": {"allowed_groups": ["content", "editing"],
                               "enabled_tools": ["update_page_metadata"]},
                    "max_iterations": 4, "four_eyes": true, "approval_deadline_secs": 86400
                })
                .to_string(),
            )
            .unwrap();
            agent
        })
        .collect();
    install.configure(agents[0].to_str().unwrap());
    for agent in &agents[1..] {
        install.countersign_ok(&["agents", "put", agent.to_str().unwrap()]);
    }
    let admin = install
        .countersign_ok(&["tokens", "create", "--for", "admin", "--label", "e2e"])
        .trim()
        .to_owned();
    let (api_port, _services) = start_services(&install).await;
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();
    let runs: Vec<String> = [12, 13, 14]
        .into_iter()
        .map(|uid| install.submit(&format!("seo-{uid}"), "editor", "Tighten the page."))
        .collect();
    for run_id in &runs {
        wait_for(&mut conn, run_id, "waiting_for_approval", Some(1)).await;
    }
    let base = format!("http://127.0.0.1:{api_port}");
    let driver = Chromedriver::start().await;
    let browser = driver.browser(&scratch.join("profile-keys")).await;
    browser
        .goto(&format!("{base}/inbox/sign-in"))
        .await
        .unwrap();
    assert_accessible(&browser, "the sign-in page").await;
    sign_in(&browser, &base, &admin).await;
    assert_accessible(&browser, "the inbox").await;

    // The inbox lists the three soonest deadline first; the agent filter narrows it to one.
    assert_eq!(
        all_texts(&browser, "#inbox-runs tr.inbox-run").await.len(),
        3
    );
    browser
        .goto(&format!("{base}/inbox?agent=seo-13"))
        .await
        .unwrap();
    let rows = all_texts(&browser, "#inbox-runs tr.inbox-run").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].contains("seo-13"), "{rows:?}");
    click(&browser, "#all-agents").await;
    browser
        .wait()
        .for_element(Locator::Css("#agent-filter"))
        .await
        .unwrap();

    // `?` opens the list of keys; `j` opens the first card; on each card `a` approves and, on
    // the outcome page, `j` goes on to the next waiting card.
    press(&browser, "?").await;
    assert_eq!(
        browser
            .find(Locator::Css("#shortcuts"))
            .await
            .unwrap()
            .attr("open")
            .await
            .unwrap()
            .as_deref(),
        Some("true"),
        "`?` shows the shortcuts"
    );
    press(&browser, "j").await;
    let mut decided = Vec::new();
    for n in 0..3 {
        browser
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css("#card"))
            .await
            .unwrap_or_else(|e| panic!("card {n}: {e}"));
        if n == 0 {
            assert_accessible(&browser, "a card").await;
        }
        let path = browser.current_url().await.unwrap().path().to_owned();
        decided.push(path.rsplit('/').next().unwrap().to_owned());
        press(&browser, "a").await;
        assert_eq!(text_of(&browser, "#outcome-code").await, "accepted");
        if n == 0 {
            assert_accessible(&browser, "a decision's outcome").await;
        }
        if n < 2 {
            press(&browser, "j").await;
        }
    }
    decided.sort();
    let mut expected = runs.clone();
    expected.sort();
    assert_eq!(decided, expected, "each waiting card was decided once");
    for run_id in &runs {
        wait_for(&mut conn, run_id, "completed", None).await;
    }
    assert!(
        browser.find(Locator::Css("#next-card")).await.is_err(),
        "no card is left waiting"
    );

    browser.close().await.unwrap();
    drop(conn);
    let _ = std::fs::remove_dir_all(&scratch);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}

/// Page 12's description, rewritten almost entirely: the card shows it as before and after.
const REWRITE: &str = "Cargo trikes delivered anywhere in town within hours.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_edits_a_call_and_decides_call_by_call_in_a_real_browser() {
    let db = Database::create("inbox_calls").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: format!("e2e-{}", Uuid::now_v7()),
    };
    let scratch = std::env::temp_dir().join(format!("countersign-e2e-calls-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&scratch).unwrap();
    let script = scratch.join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"content": "Three changes.", "tool_calls": [
                {"name": "update_page_metadata", "arguments": {"uid": 12, "description": REWRITE}},
                {"name": "update_page_metadata",
                 "arguments": {"uid": 13, "description": "Who we are and what we make."}},
                {"name": "attach_file_to_content_element",
                 "arguments": {"content_element": 5, "file": 13, "field": "image"}}
            ]},
            {"content": "Done."}
        ]})
        .to_string(),
    )
    .unwrap();
    let agent = scratch.join("agent.json");
    std::fs::write(
        &agent,
        json!({
            "name": "site-editor", "active": true,
            "model": {"provider": "scripted", "script": script},
            "policy": {"allowed_groups": ["content", "editing"],
                       "enabled_tools": ["update_page_metadata", "attach_file_to_content_element"]},
            "max_iterations": 4, "four_eyes": false, "approval_deadline_secs": 86400
        })
        .to_string(),
    )
    .unwrap();
    install.configure(agent.to_str().unwrap());
    let admin = install
        .countersign_ok(&["tokens", "create", "--for", "admin", "--label", "e2e"])
        .trim()
        .to_owned();
    let (api_port, _services) = start_services(&install).await;
    let mut conn = PgConnection::connect(&db.url()).await.unwrap();
    let prompt = "Freshen the home and about pages, and add the bicycle to the teaser.";
    let run_id = install.submit("site-editor", "editor", prompt);
    wait_for(&mut conn, &run_id, "waiting_for_approval", Some(1)).await;

    let base = format!("http://127.0.0.1:{api_port}");
    let driver = Chromedriver::start().await;
    let browser = driver.browser(&scratch.join("profile-calls")).await;
    sign_in(&browser, &base, &admin).await;

    // The inbox row says what the run was asked and one line per call.
    let row = format!("tr[data-run-id='{run_id}']");
    assert_eq!(
        text_of(&browser, &format!("{row} p.request")).await,
        format!("“{prompt}”")
    );
    let summaries = all_texts(&browser, &format!("{row} ul.call-summary li")).await;
    assert_eq!(summaries.len(), 3, "{summaries:?}");
    assert!(
        summaries[0].starts_with("update_page_metadata: Page [12]")
            && summaries[2].contains("image: 2 reference(s) → 3"),
        "{summaries:?}"
    );
    assert_accessible(&browser, "the inbox with requests and call lines").await;

    // The card: the rewrite as two blocks, the small change as a word diff, and the page as if
    // every call were accepted.
    open_run_from_inbox(&browser, &base, &run_id).await;
    screenshot(&browser, "card-calls.png").await;
    let rewritten = all_texts(
        &browser,
        "article.call[data-index='0'] div.rewritten p.after",
    )
    .await;
    assert_eq!(rewritten, vec![REWRITE.to_owned()]);
    let inserted = all_texts(&browser, "article.call[data-index='1'] p.diff ins").await;
    assert!(
        inserted.len() == 1 && inserted[0].ends_with("and what we make."),
        "a small change stays a word diff: {inserted:?}"
    );
    click(&browser, "#as-accepted > summary").await;
    assert_eq!(
        all_texts(
            &browser,
            "#as-accepted section.accepted[data-index='0'] p.accepted-text"
        )
        .await,
        vec![REWRITE.to_owned()]
    );
    assert_eq!(
        all_texts(
            &browser,
            "#as-accepted section.accepted[data-index='2'] ol.accepted-list li"
        )
        .await
        .len(),
        3,
        "the teaser's images as they would stand"
    );
    click(&browser, "#by-call > summary").await;
    click(&browser, "#edit-1 > summary").await;
    assert_accessible(&browser, "a card with its forms call by call open").await;

    // An edit of call 1 re-issues the card, marked as the admin's edit; nothing is written.
    let textarea = browser
        .find(Locator::Css("#edit-1-arguments"))
        .await
        .unwrap();
    textarea.clear().await.unwrap();
    textarea
        .send_keys(r#"{"uid": 13, "description": "Who we are, since 1998."}"#)
        .await
        .unwrap();
    click(&browser, "#edit-1-submit").await;
    assert_eq!(text_of(&browser, "#outcome-code").await, "accepted");
    wait_for(&mut conn, &run_id, "waiting_for_approval", Some(2)).await;
    assert_eq!(description(&mut conn, 13).await, "Who we are.");
    open_run_from_inbox(&browser, &base, &run_id).await;
    assert_eq!(text_of(&browser, "#suspension-seq").await, "2");
    assert_eq!(
        text_of(
            &browser,
            "article.call[data-index='1'] .notice.edited strong.editor"
        )
        .await,
        "admin"
    );
    assert!(
        text_of(&browser, "article.call[data-index='1'] ul.preview-lines")
            .await
            .contains("Who we are, since 1998."),
        "the edited call is previewed"
    );

    // Call by call: 0 and 1 approved, 2 denied with a message for the agent.
    click(&browser, "#by-call > summary").await;
    click(&browser, "#call-2-deny").await;
    browser
        .find(Locator::Css("#message-2"))
        .await
        .unwrap()
        .send_keys("Not on the teaser.")
        .await
        .unwrap();
    assert_accessible(&browser, "the re-issued card with an edit").await;
    click(&browser, "#decide-calls").await;
    assert_eq!(text_of(&browser, "#outcome-code").await, "accepted");
    assert_accessible(&browser, "the outcome of a decision call by call").await;
    wait_for(&mut conn, &run_id, "completed", None).await;
    assert_eq!(description(&mut conn, 12).await, REWRITE);
    assert_eq!(description(&mut conn, 13).await, "Who we are, since 1998.");
    assert_eq!(
        count(&mut conn, TEASER_IMAGES).await,
        2,
        "call 2 was denied"
    );

    // The same decision over the API: a second run, only its image approved.
    let second = install.submit("site-editor", "editor", prompt);
    wait_for(&mut conn, &second, "waiting_for_approval", Some(1)).await;
    let (seq, digest): (i32, String) =
        sqlx::query_as("SELECT suspension_seq, turn_digest FROM runs WHERE id = $1::uuid")
            .bind(&second)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    let (status, body) = http_post_json(
        api_port,
        &format!("/v1/runs/{second}/decisions"),
        &admin,
        &json!({"suspension_seq": seq, "turn_digest": digest, "calls": [
            {"index": 0, "approved": false, "message": "Keep it."},
            {"index": 1, "approved": false},
            {"index": 2, "approved": true}
        ]}),
    );
    assert_eq!(status, 202, "{body}");
    wait_for(&mut conn, &second, "completed", None).await;
    assert_eq!(count(&mut conn, TEASER_IMAGES).await, 3, "only call 2 ran");
    assert_eq!(description(&mut conn, 13).await, "Who we are, since 1998.");

    browser.close().await.unwrap();
    drop(conn);
    let _ = std::fs::remove_dir_all(&scratch);
    countersign_e2e::delete_topology(&install.queue_prefix).await;
    db.remove().await.unwrap();
}

async fn description(conn: &mut PgConnection, uid: i32) -> String {
    sqlx::query_scalar("SELECT description FROM content.pages WHERE uid = $1 AND workspace = 0")
        .bind(uid)
        .fetch_one(conn)
        .await
        .unwrap()
}
