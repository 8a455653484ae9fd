//! Lock coverage: for every writer of the content store and every kind of row its re-plan
//! reads, a colleague changes that row in plain SQL — at READ COMMITTED, on a connection of its
//! own, taking none of countersign's locks — at the one moment that matters: the approved turn
//! has locked, re-planned and compared, and is about to write ([`SegmentHooks::applying`]).
//!
//! The change must wait for the turn's commit (it is seen waiting on a lock the turn holds),
//! or the turn must re-suspend with the call marked moved. A change that lands in between
//! would let the approved write land against a state nobody was shown, and fails the writer's
//! test, naming the row. [`COVERAGE`] lists the rows mutated for each writer, and a writer of
//! the content store without an entry fails [`every_writer_of_the_content_store_has_lock_coverage`].

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use countersign_content::WRITER_NAMES;
use countersign_core::agent_loop;
use countersign_core::{AgentConfig, Decision, HookError, Outcome, Segment, SegmentHooks};
use countersign_core::{
    CallIndex, Effect, FenceToken, JournalEntry, LocalWriter, PendingCall, SuspensionSeq,
    ToolOutput, ToolPolicy, TurnRecord, UserDirectory,
};
use countersign_model::ScriptedModel;
use countersign_store::FencedWrite;
use countersign_worker::StoreHooks;
use serde_json::Value;
use sqlx::PgPool;
use tokio::task::JoinHandle;

use crate::support::{Harness, TTL};

/// A colleague's change of one kind of row a writer's re-plan reads.
struct Mutation {
    /// The row, in words.
    row: &'static str,
    /// What the state needs before the run starts, beyond the demo site.
    setup: &'static str,
    /// The colleague's statement.
    sql: &'static str,
}

const fn change(row: &'static str, sql: &'static str) -> Mutation {
    Mutation {
        row,
        setup: "",
        sql,
    }
}

/// One writer's call on the demo site, and every kind of row its re-plan reads.
struct Coverage {
    writer: &'static str,
    arguments: &'static str,
    mutations: &'static [Mutation],
}

const USER_MOUNTS: Mutation = change(
    "the acting user's page mounts",
    "UPDATE content.users SET page_mounts = '{}' WHERE name = 'editor'",
);
const USER_DISABLED: Mutation = change(
    "the acting user, disabled",
    "UPDATE content.users SET disabled = true WHERE name = 'editor'",
);
const USER_FILE_MOUNTS: Mutation = change(
    "the acting user's file mounts",
    "DELETE FROM content.file_mounts WHERE user_uid = 2",
);
const USER_LANGUAGES: Mutation = change(
    "the acting user's languages",
    "UPDATE content.users SET allowed_languages = '{}' WHERE name = 'editor'",
);

/// Every writer, and what is mutated for it.
const COVERAGE: &[Coverage] = &[
    Coverage {
        writer: "update_page_metadata",
        arguments: r#"{"uid": 12, "description": "Bicycles for every road."}"#,
        mutations: &[
            change(
                "the page's field the call writes",
                "UPDATE content.pages SET description = 'A colleague''s words.' WHERE uid = 12",
            ),
            change(
                "the page's title, which names it",
                "UPDATE content.pages SET title = 'Start' WHERE uid = 12",
            ),
            change(
                "a page on its rootline, soft-deleted",
                "UPDATE content.pages SET deleted = true WHERE uid = 10",
            ),
            change(
                "a page on its rootline, moved",
                "UPDATE content.pages SET pid = 20 WHERE uid = 10",
            ),
            USER_MOUNTS,
            USER_DISABLED,
            change(
                "an exclude field added for the field the call writes",
                "INSERT INTO content.exclude_fields (table_name, field) VALUES ('pages', 'description')",
            ),
        ],
    },
    Coverage {
        writer: "set_file_alternative_text",
        arguments: r#"{"uid": 7, "alternative": "A red bicycle against a wall"}"#,
        mutations: &[
            change(
                "the metadata row the call writes",
                "UPDATE content.file_metadata SET alternative = 'Bike' WHERE uid = 1",
            ),
            change(
                "the metadata row, moved out of the live workspace",
                "UPDATE content.file_metadata SET workspace = 1 WHERE uid = 1",
            ),
            change(
                "another metadata row of the file, deleted",
                "DELETE FROM content.file_metadata WHERE uid = 2",
            ),
            change(
                "the file's name, which names it",
                "UPDATE content.files SET name = 'hero-old.jpg' WHERE uid = 7",
            ),
            change(
                "the file's storage",
                "UPDATE content.storages SET name = 'files' WHERE uid = 1",
            ),
            USER_FILE_MOUNTS,
            USER_LANGUAGES,
            change(
                "an exclude field added for the field the call writes",
                "INSERT INTO content.exclude_fields (table_name, field) VALUES ('file_metadata', 'alternative')",
            ),
        ],
    },
    Coverage {
        writer: "attach_file_to_content_element",
        arguments: r#"{"content_element": 5, "file": 13, "field": "image"}"#,
        mutations: &[
            change(
                "a soft-deleted reference of the field, restored",
                "UPDATE content.file_references SET deleted = false WHERE uid = 3",
            ),
            change(
                "a live reference of the field, soft-deleted",
                "UPDATE content.file_references SET deleted = true WHERE uid = 2",
            ),
            change(
                "a reference of the field, re-sorted",
                "UPDATE content.file_references SET sorting = 10 WHERE uid = 1",
            ),
            change(
                "a new reference of the field",
                "INSERT INTO content.file_references (element, field, file, sorting) VALUES (5, 'image', 10, 4)",
            ),
            change(
                "a reference of another element, moved to it",
                "UPDATE content.file_references SET element = 5 WHERE uid = 4",
            ),
            change(
                "the element's header, which names it",
                "UPDATE content.elements SET header = 'Spring teaser' WHERE uid = 5",
            ),
            change(
                "the file's name",
                "UPDATE content.files SET name = 'bike.png' WHERE uid = 13",
            ),
            change(
                "an extension the field accepts, removed",
                "DELETE FROM content.reference_field_extensions WHERE field = 'image' AND extension = 'png'",
            ),
            change(
                "the element's page, soft-deleted",
                "UPDATE content.pages SET deleted = true WHERE uid = 12",
            ),
            USER_FILE_MOUNTS,
        ],
    },
    Coverage {
        writer: "move_content_element",
        arguments: r#"{"uid": 4, "target_page": 13, "after_content_uid": 8}"#,
        mutations: &[
            Mutation {
                row: "an element of the target column, re-sorted",
                setup: TARGET_NEIGHBOUR,
                sql: "UPDATE content.elements SET sorting = 100 WHERE uid = 50",
            },
            Mutation {
                row: "an element of the target column, soft-deleted",
                setup: TARGET_NEIGHBOUR,
                sql: "UPDATE content.elements SET deleted = true WHERE uid = 50",
            },
            change(
                "a soft-deleted element of the source column, restored",
                "UPDATE content.elements SET deleted = false WHERE uid = 7",
            ),
            change(
                "a new element in the target column",
                "INSERT INTO content.elements (pid, ctype, header, colpos, sorting) VALUES (13, 'text', 'New', 0, 300)",
            ),
            change(
                "an element of another page, moved into the target column",
                "UPDATE content.elements SET pid = 13, sorting = 300 WHERE uid = 9",
            ),
            change(
                "a new translation of the element",
                "INSERT INTO content.elements (pid, ctype, header, colpos, sorting, language, l10n_parent) VALUES (12, 'text', 'Bienvenue', 0, 128, 1, 4)",
            ),
            change(
                "the target page's title, which names it",
                "UPDATE content.pages SET title = 'About' WHERE uid = 13",
            ),
            change(
                "the neighbour's header, which names where it lands",
                "UPDATE content.elements SET header = 'Our history' WHERE uid = 8",
            ),
            USER_MOUNTS,
        ],
    },
    Coverage {
        writer: "create_page_draft",
        arguments: r#"{"parent": 10, "title": "Spring", "after_page_uid": 13}"#,
        mutations: &[
            change(
                "a new page below the parent",
                "INSERT INTO content.pages (pid, sorting, title) VALUES (10, 600, 'A colleague''s page')",
            ),
            change(
                "a subpage, re-sorted",
                "UPDATE content.pages SET sorting = 100 WHERE uid = 14",
            ),
            change(
                "a soft-deleted subpage, restored",
                "UPDATE content.pages SET deleted = false WHERE uid = 16",
            ),
            change(
                "a page moved below the parent",
                "UPDATE content.pages SET pid = 10 WHERE uid = 15",
            ),
            change(
                "the neighbour, moved away",
                "UPDATE content.pages SET pid = 14 WHERE uid = 13",
            ),
            change(
                "the parent's title, which names it",
                "UPDATE content.pages SET title = 'Demo' WHERE uid = 10",
            ),
            USER_MOUNTS,
        ],
    },
    Coverage {
        writer: "create_content_element_draft",
        arguments: r#"{"page": 12, "header": "Spring", "column": 0, "after_content_uid": 5}"#,
        mutations: &[
            change(
                "a new element in the column",
                "INSERT INTO content.elements (pid, ctype, header, colpos, sorting) VALUES (12, 'text', 'A colleague''s', 0, 300)",
            ),
            change(
                "a soft-deleted element of the column, restored",
                "UPDATE content.elements SET deleted = false WHERE uid = 7",
            ),
            change(
                "an element of the column, re-sorted",
                "UPDATE content.elements SET sorting = 999 WHERE uid = 4",
            ),
            change(
                "an element of another column, moved into it",
                "UPDATE content.elements SET colpos = 0 WHERE uid = 6",
            ),
            change(
                "an element of another page, moved onto it",
                "UPDATE content.elements SET pid = 12 WHERE uid = 8",
            ),
            change(
                "the page's title, which names it",
                "UPDATE content.pages SET title = 'Start' WHERE uid = 12",
            ),
            USER_DISABLED,
        ],
    },
    Coverage {
        writer: "create_translation_draft",
        arguments: r#"{"table": "pages", "uid": 14, "language": 1}"#,
        mutations: &[
            change(
                "a new translation of the page in the language",
                "INSERT INTO content.pages (pid, sorting, language, l10n_parent, title) VALUES (10, 768, 1, 14, 'Produkte')",
            ),
            Mutation {
                row: "a soft-deleted translation of the page, restored",
                setup: "INSERT INTO content.pages (uid, pid, sorting, language, l10n_parent, title, deleted) VALUES (60, 10, 768, 1, 14, 'Alt', true)",
                sql: "UPDATE content.pages SET deleted = false WHERE uid = 60",
            },
            change(
                "a field of the page the call copies",
                "UPDATE content.pages SET description = 'Everything we sell.' WHERE uid = 14",
            ),
            change(
                "the language's title, which names it",
                "UPDATE content.languages SET title = 'Deutsch' WHERE uid = 1",
            ),
            USER_LANGUAGES,
        ],
    },
];

/// A second element in the target column of the move: `[8] Our story`, then `[50] Our team`.
const TARGET_NEIGHBOUR: &str = "INSERT INTO content.elements (uid, pid, ctype, header, colpos, sorting) VALUES (50, 13, 'text', 'Our team', 0, 512)";

/// The translation of a content element, whose read set differs from a page's.
const ELEMENT_TRANSLATION: Coverage = Coverage {
    writer: "create_translation_draft",
    arguments: r#"{"table": "content", "uid": 8, "language": 1}"#,
    mutations: &[
        change(
            "a new reference of the element, copied with it",
            "INSERT INTO content.file_references (element, field, file, sorting) VALUES (8, 'image', 7, 2)",
        ),
        change(
            "a reference of the element, soft-deleted",
            "UPDATE content.file_references SET deleted = true WHERE uid = 4",
        ),
        change(
            "the translation of the element's page, soft-deleted",
            "UPDATE content.pages SET deleted = true WHERE uid = 41",
        ),
        change(
            "a new translation of the element in the language",
            "INSERT INTO content.elements (pid, ctype, header, colpos, sorting, language, l10n_parent) VALUES (13, 'textpic', 'Unsere Geschichte', 0, 256, 1, 8)",
        ),
        change(
            "the element's body text, which the call copies",
            "UPDATE content.elements SET bodytext = 'It began with two bicycles.' WHERE uid = 8",
        ),
        USER_LANGUAGES,
    ],
};

/// The content store's tables, parents before children.
const CONTENT_TABLES: [&str; 12] = [
    "languages",
    "users",
    "storages",
    "file_mounts",
    "field_guards",
    "exclude_fields",
    "pages",
    "elements",
    "files",
    "file_metadata",
    "reference_field_extensions",
    "file_references",
];

/// Keeps a copy of the content store, so that every mutation starts from the same site.
async fn keep_site(pool: &PgPool) {
    sqlx::raw_sql("CREATE SCHEMA kept")
        .execute(pool)
        .await
        .unwrap();
    for table in CONTENT_TABLES {
        sqlx::raw_sql(&format!(
            "CREATE TABLE kept.{table} AS TABLE content.{table}"
        ))
        .execute(pool)
        .await
        .unwrap();
    }
}

/// Puts the content store back as [`keep_site`] kept it.
async fn restore_site(pool: &PgPool) {
    let all: Vec<String> = CONTENT_TABLES
        .iter()
        .map(|t| format!("content.{t}"))
        .collect();
    let mut sql = format!("TRUNCATE {};", all.join(", "));
    for table in CONTENT_TABLES {
        sql.push_str(&format!(
            "INSERT INTO content.{table} SELECT * FROM kept.{table};"
        ));
    }
    sqlx::raw_sql(&sql).execute(pool).await.unwrap();
}

/// What became of the colleague's change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// It waited on a lock the turn holds.
    Waited,
    /// It committed while the turn was about to write.
    Landed,
}

/// The worker's hooks, and a colleague who runs `sql` the moment the turn is about to write.
struct Colleague {
    inner: StoreHooks,
    pool: PgPool,
    sql: &'static str,
    seen: Mutex<Option<Seen>>,
    change: Mutex<Option<JoinHandle<Result<(), sqlx::Error>>>>,
}

impl Colleague {
    /// Runs the change on a connection of its own, and waits until it either waits on a lock
    /// or is done: the database says which, no clock does.
    async fn change_now(&self) -> (Seen, JoinHandle<Result<(), sqlx::Error>>) {
        let (pid_sender, pid) = tokio::sync::oneshot::channel();
        let (pool, sql) = (self.pool.clone(), self.sql);
        let change = tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            let conn: &mut sqlx::PgConnection = &mut conn;
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *conn)
                .await?;
            let _ = pid_sender.send(pid);
            sqlx::query(sql).execute(&mut *conn).await?;
            Ok(())
        });
        let pid = pid.await.expect("the colleague connected");
        loop {
            if change.is_finished() {
                return (Seen::Landed, change);
            }
            let waiting: bool = sqlx::query_scalar("SELECT cardinality(pg_blocking_pids($1)) > 0")
                .bind(pid)
                .fetch_one(&self.pool)
                .await
                .unwrap();
            if waiting {
                return (Seen::Waited, change);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

#[async_trait]
impl SegmentHooks for Colleague {
    type Transaction = FencedWrite;

    async fn turn_record(&self, seq: SuspensionSeq) -> Result<TurnRecord, HookError> {
        self.inner.turn_record(seq).await
    }

    async fn begin_turn(&self, seq: SuspensionSeq) -> Result<FencedWrite, HookError> {
        self.inner.begin_turn(seq).await
    }

    fn local(&self, tool: &str) -> Option<&dyn LocalWriter<FencedWrite>> {
        self.inner.local(tool)
    }

    async fn applying(&self, _seq: SuspensionSeq) {
        let (seen, change) = self.change_now().await;
        *self.seen.lock().unwrap() = Some(seen);
        *self.change.lock().unwrap() = Some(change);
    }

    async fn commit_turn(
        &self,
        turn: FencedWrite,
        seq: SuspensionSeq,
        entries: &[JournalEntry<'_>],
        owed: &[CallIndex],
    ) -> Result<(), HookError> {
        self.inner.commit_turn(turn, seq, entries, owed).await
    }

    async fn rollback_turn(&self, turn: FencedWrite) {
        self.inner.rollback_turn(turn).await
    }

    async fn fence(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        effect: Effect,
    ) -> Result<FenceToken, HookError> {
        self.inner.fence(seq, index, effect).await
    }

    async fn record(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        call: &PendingCall,
        effect: Effect,
        output: &ToolOutput,
    ) -> Result<(), HookError> {
        self.inner.record(seq, index, call, effect, output).await
    }

    fn token(&self, seq: SuspensionSeq, index: CallIndex) -> FenceToken {
        self.inner.token(seq, index)
    }

    fn lease_lost(&self) -> bool {
        self.inner.lease_lost()
    }
}

fn script(writer: &str, arguments: &str) -> String {
    format!(
        r#"{{"turns": [{{"tool_calls": [{{"name": "{writer}", "arguments": {arguments}}}]}}, {{"content": "Done."}}]}}"#
    )
}

/// Runs the approved call of `coverage` with the colleague's `mutation`; `Err` says what went
/// wrong in words.
async fn covered(
    pool: &PgPool,
    h: &Harness,
    coverage: &Coverage,
    mutation: &Mutation,
) -> Result<(), String> {
    restore_site(pool).await;
    if !mutation.setup.is_empty() {
        sqlx::raw_sql(mutation.setup).execute(pool).await.unwrap();
    }
    let run_id = h.suspended_run().await;
    let card = h.state(run_id).await;
    if card.call_previews[0].failed {
        return Err(format!(
            "the card shows no preview: {:?}",
            card.call_previews[0].lines
        ));
    }
    h.approve(run_id).await;

    let claim = h.store.claim(run_id, "w-turn", TTL).await.unwrap().unwrap();
    let hooks = Colleague {
        inner: StoreHooks::new(
            h.store.clone(),
            h.runner.local.clone(),
            claim.lease.clone(),
            TTL,
        ),
        pool: pool.clone(),
        sql: mutation.sql,
        seen: Mutex::new(None),
        change: Mutex::new(None),
    };
    let users = countersign_content::ContentUsers::new(pool.clone());
    let user = users.principal("editor").await.unwrap().unwrap();
    let agent = AgentConfig {
        name: "seo".into(),
        policy: ToolPolicy {
            enabled_tools: WRITER_NAMES.iter().map(|w| w.to_string()).collect(),
            ..Default::default()
        },
        max_iterations: 5,
        ..Default::default()
    };
    let model = ScriptedModel::from_json(&script(coverage.writer, coverage.arguments)).unwrap();
    let seg = Segment {
        model: &model,
        registry: &h.runner.registry,
        agent: &agent,
        acting_user: &user,
        hooks: &hooks,
        captured_at: "2026-12-02T00:00:00Z",
    };
    let decision = Decision {
        approved: true,
        comment: None,
        ..Decision::default()
    };
    let outcome = agent_loop::resume(seg, card, &decision).await;
    let change = hooks.change.lock().unwrap().take();
    if let Some(change) = change {
        tokio::time::timeout(Duration::from_secs(30), change)
            .await
            .map_err(|_| "the change still waits after the turn ended".to_owned())?
            .unwrap()
            .map_err(|e| format!("the change failed: {e}"))?;
    }
    let seen = *hooks.seen.lock().unwrap();
    match (seen, &outcome) {
        (Some(Seen::Waited), Outcome::Completed { .. }) => {
            let written = h
                .store
                .journaled(
                    run_id,
                    countersign_core::SuspensionSeq::FIRST,
                    CallIndex::new(0),
                )
                .await
                .unwrap()
                .expect("journaled");
            if written.is_error {
                return Err(format!(
                    "the approved write did not happen: {}",
                    written.content
                ));
            }
            Ok(())
        }
        (_, Outcome::Suspended { state, .. }) if !state.stale_call_indexes.is_empty() => Ok(()),
        (Some(Seen::Landed), _) => Err(
            "the change landed between re-plan and write, without waiting for the turn".to_owned(),
        ),
        (seen, outcome) => Err(format!("{seen:?} and then {outcome:?}")),
    }
}

/// Every mutation of `coverage`, each against the site as it was seeded.
async fn check(pool: PgPool, coverage: &Coverage) {
    let h = Harness::new(
        pool.clone(),
        &script(coverage.writer, coverage.arguments),
        &WRITER_NAMES,
    )
    .await;
    keep_site(&pool).await;
    let mut uncovered = Vec::new();
    for mutation in coverage.mutations {
        if let Err(why) = covered(&pool, &h, coverage, mutation).await {
            uncovered.push(format!("{} — {}: {why}", mutation.row, mutation.sql));
        }
    }
    assert!(
        uncovered.is_empty(),
        "{}: rows its preview reads changed under an approved turn:\n{}",
        coverage.writer,
        uncovered.join("\n")
    );
}

fn coverage_of(writer: &str) -> &'static Coverage {
    COVERAGE
        .iter()
        .find(|c| c.writer == writer)
        .unwrap_or_else(|| panic!("no lock coverage for {writer}"))
}

#[test]
fn every_writer_of_the_content_store_has_lock_coverage() {
    let mut covered: Vec<&str> = COVERAGE.iter().map(|c| c.writer).collect();
    covered.sort();
    let mut writers = WRITER_NAMES.to_vec();
    writers.sort();
    assert_eq!(covered, writers, "a writer without lock coverage");
    for c in COVERAGE {
        assert!(c.mutations.len() >= 5, "{}: too few rows covered", c.writer);
        serde_json::from_str::<Value>(c.arguments).unwrap();
    }
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn update_page_metadata_holds_what_its_preview_read_until_it_commits(pool: PgPool) {
    check(pool, coverage_of("update_page_metadata")).await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn set_file_alternative_text_holds_what_its_preview_read_until_it_commits(pool: PgPool) {
    check(pool, coverage_of("set_file_alternative_text")).await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn attach_file_to_content_element_holds_what_its_preview_read_until_it_commits(pool: PgPool) {
    check(pool, coverage_of("attach_file_to_content_element")).await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn move_content_element_holds_what_its_preview_read_until_it_commits(pool: PgPool) {
    check(pool, coverage_of("move_content_element")).await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn create_page_draft_holds_what_its_preview_read_until_it_commits(pool: PgPool) {
    check(pool, coverage_of("create_page_draft")).await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn create_content_element_draft_holds_what_its_preview_read_until_it_commits(pool: PgPool) {
    check(pool, coverage_of("create_content_element_draft")).await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn create_translation_draft_of_a_page_holds_what_its_preview_read_until_it_commits(
    pool: PgPool,
) {
    check(pool, coverage_of("create_translation_draft")).await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn create_translation_draft_of_an_element_holds_what_its_preview_read_until_it_commits(
    pool: PgPool,
) {
    check(pool, &ELEMENT_TRANSLATION).await;
}
