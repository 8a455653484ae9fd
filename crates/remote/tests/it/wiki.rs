//! The client against the reference tool server, `examples/remote-wiki` (needs `python3`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use countersign_core::preview::assert_deterministic;
use countersign_core::{
    CallIndex, CallStatus, Effect, ExecContext, FenceToken, LeaseEpoch, Prepared, Principal, RunId,
    SuspensionSeq, Tool, ToolError,
};
use countersign_remote::{Limits, RemoteToolServer, Trust};
use secrecy::SecretString;
use serde_json::json;

use crate::client::trusting;
use crate::tls::{test_ca, tls_file};

const SECRET: &str = "wiki-test-secret";

/// A running wiki server on a free loopback port, killed when dropped.
struct Wiki {
    child: Child,
    url: String,
    /// Taken out by a restart, so the state outlives the process.
    dir: Option<TempDir>,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Drop for Wiki {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/remote-wiki/wiki_server.py")
}

impl Wiki {
    fn start() -> Wiki {
        let dir = std::env::temp_dir().join(format!("remote-wiki-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        Self::start_in(TempDir(dir))
    }

    fn start_in(dir: TempDir) -> Wiki {
        Self::start_with(dir, &[])
    }

    /// Over https://, with the test certificate of 127.0.0.1.
    fn start_tls() -> Wiki {
        let dir = std::env::temp_dir().join(format!("remote-wiki-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (tls_file("server.pem"), tls_file("server.key"));
        let args = [
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ];
        Self::start_with(TempDir(dir), &args)
    }

    fn start_with(dir: TempDir, args: &[&str]) -> Wiki {
        let mut child = Command::new("python3")
            .arg(server_script())
            .args(["--port", "0", "--state"])
            .arg(dir.0.join("wiki.json"))
            .args(args)
            .env("WIKI_SECRET", SECRET)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the wiki server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .expect("the server says where it listens")
            .to_owned();
        Wiki {
            child,
            url,
            dir: Some(dir),
        }
    }

    /// Stops the server and starts it again on the same state file.
    fn restart(mut self) -> Wiki {
        let dir = self.dir.take().expect("a running wiki has its directory");
        drop(self);
        Self::start_in(dir)
    }

    /// The wiki's tools as an operator who trusts its declarations has them.
    async fn tools(&self, secret: &str) -> Vec<Arc<dyn Tool>> {
        self.tools_with(secret, trusting()).await
    }

    async fn tools_with(
        &self,
        secret: &str,
        word: countersign_remote::OperatorWord,
    ) -> Vec<Arc<dyn Tool>> {
        RemoteToolServer::with_secret(
            "wiki",
            &self.url,
            &SecretString::from(secret),
            Limits::default(),
        )
        .unwrap()
        .with_word(word)
        .discover_tools()
        .await
        .unwrap()
    }

    fn put(&self, page: &str, text: &str) {
        let status = Command::new("python3")
            .args([
                "-c",
                PUT,
                &format!("{}/pages/{page}", self.url),
                SECRET,
                text,
            ])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

const PUT: &str = r#"
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], data=json.dumps({"text": sys.argv[3]}).encode(), method="PUT",
                             headers={"Authorization": "Bearer " + sys.argv[2]})
urllib.request.urlopen(req).read()
"#;

fn find<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> &'a dyn Tool {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .unwrap()
        .as_ref()
}

fn editor() -> Principal {
    Principal::new("editor", false)
}

fn ctx(run: RunId, epoch: i64, call: usize) -> ExecContext {
    ExecContext {
        acting_user: editor(),
        fence: Some(FenceToken {
            run_id: run,
            lease_owner: "w".into(),
            lease_epoch: LeaseEpoch::new(epoch).unwrap(),
            suspension_seq: SuspensionSeq::new(1).unwrap(),
            call_index: CallIndex::new(call),
        }),
        shown_preview: None,
        before: Vec::new(),
    }
}

async fn read(tools: &[Arc<dyn Tool>], page: &str) -> String {
    let ctx = ExecContext {
        acting_user: editor(),
        fence: None,
        shown_preview: None,
        before: Vec::new(),
    };
    find(tools, "read_page")
        .execute(&ctx, &json!({"page": page}))
        .await
        .unwrap()
        .content
}

#[tokio::test]
async fn without_the_operators_word_each_wiki_tool_is_a_disabled_non_idempotent_write_of_its_own_group(
) {
    let wiki = Wiki::start();
    let tools = wiki
        .tools_with(SECRET, countersign_remote::OperatorWord::default())
        .await;
    assert_eq!(tools.len(), 3);
    for tool in &tools {
        let s = tool.spec();
        assert_eq!(
            (
                s.effect,
                s.enabled_by_default,
                s.group.as_str(),
                s.data_class
            ),
            (
                Effect::NonIdempotentWrite,
                false,
                "remote_wiki",
                countersign_core::DataClass::SecretAdjacent
            ),
            "{}",
            s.name
        );
    }
    let word = countersign_remote::OperatorWord::parse(&[
        "read_page.effect=read_only",
        "set_page.effect=idempotent_write",
        "data_class=editor_content",
    ])
    .unwrap();
    let tools = wiki.tools_with(SECRET, word).await;
    let read = find(&tools, "read_page").spec();
    assert_eq!(
        (read.effect, read.enabled_by_default),
        (Effect::ReadOnly, true)
    );
    let set = find(&tools, "set_page").spec();
    assert_eq!(
        (set.effect, set.enabled_by_default, set.data_class),
        (
            Effect::IdempotentWrite,
            false,
            countersign_core::DataClass::EditorContent
        )
    );
}

#[tokio::test]
async fn discovery_registers_each_wiki_tool_with_its_declared_effect_and_preview() {
    let wiki = Wiki::start();
    let tools = wiki.tools(SECRET).await;
    let mut found: Vec<(String, Effect, bool, bool)> = tools
        .iter()
        .map(|t| {
            let s = t.spec();
            (
                s.name.clone(),
                s.effect,
                s.enabled_by_default,
                t.previewer().is_some(),
            )
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found,
        vec![
            (
                "append_line".into(),
                Effect::NonIdempotentWrite,
                false,
                true
            ),
            ("read_page".into(), Effect::ReadOnly, true, false),
            ("set_page".into(), Effect::IdempotentWrite, false, true),
        ]
    );
}

#[tokio::test]
async fn a_wrong_secret_fails_discovery_as_remote_unauthorized() {
    let wiki = Wiki::start();
    let e = RemoteToolServer::with_secret(
        "wiki",
        &wiki.url,
        &SecretString::from("wrong"),
        Limits::default(),
    )
    .unwrap()
    .discover_tools()
    .await
    .unwrap_err();
    assert_eq!(e.code(), "remote_unauthorized");
}

#[tokio::test]
async fn the_wiki_previews_are_deterministic_and_show_what_the_call_would_write() {
    let wiki = Wiki::start();
    wiki.put("home", "one\ntwo");
    let tools = wiki.tools(SECRET).await;
    let append = json!({"page": "home", "line": "three"});
    let previewer = find(&tools, "append_line").previewer().unwrap();
    assert_deterministic(previewer, &editor(), &append).await;
    assert_eq!(
        previewer.preview(&editor(), &append).await.unwrap(),
        vec![
            "page \"home\"",
            "lines: 2 line(s) → 3, appended last: \"three\""
        ]
    );
    let set = json!({"page": "home", "text": "new"});
    assert_eq!(
        find(&tools, "set_page")
            .previewer()
            .unwrap()
            .preview(&editor(), &set)
            .await
            .unwrap(),
        vec!["page \"home\"", "text: \"one two\" → \"new\""]
    );
}

#[tokio::test]
async fn a_page_the_acting_user_may_not_edit_previews_as_the_neutral_refusal_line() {
    let wiki = Wiki::start();
    wiki.put("private/salaries", "x");
    let tools = wiki.tools(SECRET).await;
    let args = json!({"page": "private/salaries", "line": "y"});
    let previewer = find(&tools, "append_line").previewer().unwrap();
    assert_eq!(
        previewer.preview(&editor(), &args).await.unwrap(),
        vec!["The page does not exist or you may not edit it."]
    );
    assert!(!previewer.may_viewer_read_preview(&args, &editor()).await);
    assert!(
        previewer
            .may_viewer_read_preview(&args, &Principal::new("admin", true))
            .await
    );
}

#[tokio::test]
async fn an_append_sent_twice_with_one_idempotency_key_is_written_once_even_across_a_restart() {
    let wiki = Wiki::start();
    wiki.put("home", "one");
    let tools = wiki.tools(SECRET).await;
    let run = RunId::new();
    let args = json!({"page": "home", "line": "two"});
    let first = find(&tools, "append_line")
        .execute(&ctx(run, 1, 0), &args)
        .await
        .unwrap();
    let wiki = wiki.restart();
    let tools = wiki.tools(SECRET).await;
    let again = find(&tools, "append_line")
        .execute(&ctx(run, 2, 0), &args)
        .await
        .unwrap();
    assert_eq!(first, again, "the recorded answer is returned again");
    assert_eq!(read(&tools, "home").await, "one\ntwo");
}

#[tokio::test]
async fn an_execute_from_an_older_epoch_than_one_the_wiki_has_seen_is_a_lost_lease() {
    let wiki = Wiki::start();
    wiki.put("home", "one");
    let tools = wiki.tools(SECRET).await;
    let run = RunId::new();
    let append = find(&tools, "append_line");
    append
        .execute(&ctx(run, 5, 0), &json!({"page": "home", "line": "two"}))
        .await
        .unwrap();
    let zombie = append
        .execute(&ctx(run, 4, 1), &json!({"page": "home", "line": "zombie"}))
        .await
        .unwrap_err();
    assert_eq!(zombie.code(), "fence_lost");
    assert_eq!(read(&tools, "home").await, "one\ntwo");
}

#[tokio::test]
async fn a_write_whose_shown_preview_no_longer_reads_the_same_is_refused_at_the_wiki_and_told_as_moved(
) {
    let wiki = Wiki::start();
    wiki.put("home", "one");
    let tools = wiki.tools(SECRET).await;
    let append = find(&tools, "append_line");
    let args = json!({"page": "home", "line": "two"});
    let shown = append
        .previewer()
        .unwrap()
        .preview(&editor(), &args)
        .await
        .unwrap();

    // A colleague adds a line: the approver's `1 line(s) → 2` now reads `2 line(s) → 3`.
    wiki.put("home", "one\nzero");
    let run = RunId::new();
    let mut sent = ctx(run, 1, 0);
    sent.shown_preview = Some(shown.clone());
    let out = append.execute(&sent, &args).await.unwrap_err();
    assert!(matches!(out, ToolError::Moved), "{out:?}");
    assert_eq!(read(&tools, "home").await, "one\nzero", "nothing written");
    // The refusal is the key's recorded answer: sent again, it is refused again.
    assert!(matches!(
        append.execute(&sent, &args).await,
        Err(ToolError::Moved)
    ));

    // The same preview, still current, is written (whitespace aside, as countersign bounds it).
    let current = append
        .previewer()
        .unwrap()
        .preview(&editor(), &args)
        .await
        .unwrap();
    let mut fresh = ctx(run, 1, 1);
    fresh.shown_preview = Some(current.iter().map(|l| format!("  {l} ")).collect());
    let out = append.execute(&fresh, &args).await.unwrap();
    assert!(!out.is_error, "{out:?}");
    assert_eq!(read(&tools, "home").await, "one\nzero\ntwo");
}

#[tokio::test]
async fn a_refused_execute_is_an_error_result_naming_the_neutral_refusal() {
    let wiki = Wiki::start();
    let tools = wiki.tools(SECRET).await;
    let out = find(&tools, "append_line")
        .execute(
            &ctx(RunId::new(), 1, 0),
            &json!({"page": "missing", "line": "x", "extra": 1}),
        )
        .await
        .unwrap();
    assert!(out.is_error);
    assert_eq!(
        out.content,
        "The page does not exist or you may not edit it."
    );
}

#[tokio::test]
async fn the_wiki_over_https_is_discovered_previewed_and_written_when_its_ca_is_trusted_and_refused_otherwise(
) {
    let wiki = Wiki::start_tls();
    assert!(wiki.url.starts_with("https://127.0.0.1:"), "{}", wiki.url);
    let secret = SecretString::from(SECRET);
    let tools =
        RemoteToolServer::with_trust("wiki", &wiki.url, &secret, Limits::default(), &test_ca())
            .unwrap()
            .with_word(trusting())
            .discover_tools()
            .await
            .unwrap();
    let set = json!({"page": "about", "text": "We repair bicycles."});
    let previewer = find(&tools, "set_page").previewer().unwrap();
    assert_deterministic(previewer, &editor(), &set).await;
    assert!(previewer.may_viewer_read_preview(&set, &editor()).await);
    let out = find(&tools, "set_page")
        .execute(&ctx(RunId::new(), 1, 0), &set)
        .await
        .unwrap();
    assert!(!out.is_error, "{out:?}");
    assert_eq!(read(&tools, "about").await, "We repair bicycles.");

    let public = Trust::new(None).unwrap();
    let e = RemoteToolServer::with_trust("wiki", &wiki.url, &secret, Limits::default(), &public)
        .unwrap()
        .discover_tools()
        .await
        .unwrap_err();
    assert_eq!(e.code(), "remote_tls");
}

#[tokio::test]
async fn a_prepared_write_is_held_unseen_until_its_commit_and_the_wiki_says_what_became_of_its_key()
{
    let wiki = Wiki::start();
    wiki.put("home", "one");
    let tools = wiki.tools(SECRET).await;
    let append = find(&tools, "append_line");
    let ext = append.external().expect("a writer is an external write");
    assert!(ext.two_phase(), "the wiki speaks version 2");
    let args = json!({"page": "home", "line": "two"});
    let run = RunId::new();
    let mut call = ctx(run, 1, 0);
    call.shown_preview = Some(
        append
            .previewer()
            .unwrap()
            .preview(&editor(), &args)
            .await
            .unwrap(),
    );

    assert_eq!(ext.status(&call).await.unwrap(), CallStatus::Unseen);
    assert_eq!(ext.prepare(&call, &args).await.unwrap(), Prepared::Held);
    assert_eq!(read(&tools, "home").await, "one", "held, not visible");
    assert_eq!(ext.status(&call).await.unwrap(), CallStatus::Prepared);
    assert_eq!(
        ext.prepare(&call, &args).await.unwrap(),
        Prepared::Held,
        "idempotent"
    );

    let out = ext.commit(&call, &args).await.unwrap();
    assert!(!out.is_error, "{out:?}");
    assert_eq!(read(&tools, "home").await, "one\ntwo");
    assert_eq!(
        ext.status(&call).await.unwrap(),
        CallStatus::Answered(out.clone())
    );
    assert_eq!(
        ext.commit(&call, &args).await.unwrap(),
        out,
        "answered from its record"
    );
}

#[tokio::test]
async fn a_prepare_whose_shown_preview_moved_holds_nothing_and_an_abort_drops_a_held_change() {
    let wiki = Wiki::start();
    wiki.put("home", "one");
    let tools = wiki.tools(SECRET).await;
    let append = find(&tools, "append_line");
    let ext = append.external().unwrap();
    let args = json!({"page": "home", "line": "two"});
    let shown = append
        .previewer()
        .unwrap()
        .preview(&editor(), &args)
        .await
        .unwrap();
    let run = RunId::new();

    // The approver's `1 line(s) → 2` reads `2 line(s) → 3` now.
    let mut first = ctx(run, 1, 0);
    first.shown_preview = Some(shown.clone());
    wiki.put("home", "one\nzero");
    assert_eq!(ext.prepare(&first, &args).await.unwrap(), Prepared::Moved);
    assert_eq!(ext.status(&first).await.unwrap(), CallStatus::Moved);

    // A change held and aborted never becomes visible, and its key is unseen again.
    let mut second = ctx(run, 1, 1);
    second.shown_preview = Some(
        append
            .previewer()
            .unwrap()
            .preview(&editor(), &args)
            .await
            .unwrap(),
    );
    assert_eq!(ext.prepare(&second, &args).await.unwrap(), Prepared::Held);
    ext.abort(&second, &args).await.unwrap();
    assert_eq!(ext.status(&second).await.unwrap(), CallStatus::Unseen);
    assert_eq!(read(&tools, "home").await, "one\nzero");
}

#[tokio::test]
async fn a_version_1_wiki_takes_writes_in_one_phase_and_a_wiki_that_cannot_say_is_unsupported() {
    let dir = std::env::temp_dir().join(format!("remote-wiki-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let wiki = Wiki::start_with(TempDir(dir), &["--protocol", "1", "--no-call-status"]);
    let tools = wiki.tools(SECRET).await;
    let ext = find(&tools, "append_line").external().unwrap();
    assert!(!ext.two_phase());
    let e = ext.status(&ctx(RunId::new(), 1, 0)).await.unwrap_err();
    assert_eq!(e.code(), "unsupported");
}

#[tokio::test]
async fn the_wikis_tools_carry_the_data_class_it_declares_for_their_groups() {
    let wiki = Wiki::start();
    let tools = wiki.tools(SECRET).await;
    for tool in &tools {
        assert_eq!(
            tool.spec().data_class,
            countersign_core::DataClass::EditorContent,
            "{}",
            tool.spec().name
        );
    }
}
