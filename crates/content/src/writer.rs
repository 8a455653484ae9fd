//! The errands every writer runs around its write, shared; the decisions, kept per writer.
//!
//! Shared here, because it only executes: validating the arguments before anything else;
//! refusing without a lease; taking part in a turn's one transaction (the [`LocalWriter`]
//! contract: name the read set, lock it in the global order, plan, apply); producing the preview in a read-only snapshot; answering
//! whether a viewer may read a preview; turning a refusal into the tool's output or its single
//! preview line.
//!
//! Kept per writer, in [`Writer`]: its arguments and their limits, what it reads and writes (its
//! read set, named by its `content.read_set_<tool>` function), its record
//! checks and neutral refusal string, its preview lines, the write and what "it took" means for
//! its read-back.
//!
//! A database error is never the call's result: [`countersign_store::classify`] says whether
//! it is transient (the segment is retried) or persistent (a failed preview line; at resume the
//! turn re-suspends; in a write the run fails with its code).

use std::fmt;

use async_trait::async_trait;
use countersign_core::{
    Effect, ExecContext, LocalWriter, LockMode, LockSubject, PlannedWrite, PreviewLine, Principal,
    Tool, ToolError, ToolOutput, ToolPreview, ToolSpec,
};
use countersign_store::{classify, FencedWrite, Store, StoreError};
use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::access::User;
use crate::args::{self, Arguments};
use crate::refusals::{draft_workspace, NO_LEASE};

/// Why a call will not be carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A record check failed (or the user is unknown): the tool's neutral refusal string.
    NotPermitted,
    /// The records are visible to the user, and the call cannot be carried out on them.
    Invalid(String),
}

impl Refusal {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Refusal::Invalid(message.into())
    }

    /// The refusal of a record of `kind` that is a draft version in `workspace`, not live.
    pub(crate) fn draft(kind: &str, uid: i64, workspace: i32) -> Self {
        Refusal::Invalid(draft_workspace(kind, uid, workspace))
    }
}

/// The outcome of planning a call.
pub(crate) type Planned<P> = Result<P, Refusal>;

/// A row of the content store a call reads or writes, with how a turn locks it: one row of a
/// writer's read set (`content.read_set_<tool>`, crates/content/migrations/10003_ordered_read_sets.sql).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Row {
    /// The table, in the one global order: pages 0, elements 1, files 2, file references 3, file
    /// metadata 4, storages 5, languages 6, reference field extensions 7, users 8, file mounts 9,
    /// field guards 10 — parents before children.
    pub rank: i16,
    pub id: i64,
    /// 1 `FOR KEY SHARE`, 2 `FOR SHARE`, 3 `FOR UPDATE`.
    pub mode: i16,
}

/// The lock space of the content store's rows.
const SPACE: &str = "content";

impl Row {
    fn lock_subject(self) -> Option<LockSubject> {
        let mode = match self.mode {
            1 => LockMode::KeyShare,
            2 => LockMode::Share,
            3 => LockMode::Update,
            _ => return None,
        };
        Some(LockSubject {
            space: SPACE,
            rank: u8::try_from(self.rank).ok()?,
            id: self.id,
            mode,
        })
    }

    fn of(s: &LockSubject) -> Option<Self> {
        (s.space == SPACE).then_some(Row {
            rank: i16::from(s.rank),
            id: s.id,
            mode: match s.mode {
                LockMode::KeyShare => 1,
                LockMode::Share => 2,
                LockMode::Update => 3,
            },
        })
    }
}

/// The rows a read set names, as lock subjects; a row of a rank or mode that is none is an
/// error of the read set's function, never silently skipped.
fn lock_subjects(rows: Vec<Row>) -> Result<Vec<LockSubject>, ToolError> {
    rows.into_iter()
        .map(|r| {
            r.lock_subject().ok_or_else(|| ToolError::Broken {
                code: "read_set_invalid",
                detail: format!("{r:?} is no row of the content store's read sets"),
            })
        })
        .collect()
}

/// Locks `rows`, sorted in the global order, each in its mode, in one statement.
async fn lock_rows(conn: &mut PgConnection, rows: &[Row]) -> Result<(), sqlx::Error> {
    let ranks: Vec<i16> = rows.iter().map(|r| r.rank).collect();
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let modes: Vec<i16> = rows.iter().map(|r| r.mode).collect();
    execute!(
        conn,
        r#"SELECT content.lock_rows($1, $2, $3) AS "locked!""#,
        &ranks,
        &ids,
        &modes
    )
}

/// One writing tool's decisions.
///
/// `plan` runs every record check before any other refusal, so that a refusal other than
/// [`Refusal::NotPermitted`] is only ever given to a user who may see the records: the viewer
/// check relies on that order.
#[async_trait]
pub(crate) trait Writer: Clone + Send + Sync + 'static {
    /// The arguments: parsed up front, all or nothing, by [`args::parse`]; the spec's
    /// `parameters` are their derived schema.
    type Args: Arguments;
    type Plan: Send + Sync + 'static;

    const NAME: &'static str;
    /// What the model is told the tool does.
    const DESCRIPTION: &'static str;
    const EFFECT: Effect;
    /// The neutral refusal string for the records the writer writes.
    const NOT_PERMITTED: &'static str;
    /// Whether `plan` reads with exactly one statement, whatever the arguments and the records:
    /// a preview then needs no snapshot transaction around it ([`ReadScope`]). A plan that may
    /// take a second statement leaves this `false`.
    const PLAN_IS_ONE_STATEMENT: bool = false;

    /// The neutral refusal string for the records these arguments name: a writer of records of
    /// two kinds tells them apart here.
    fn not_permitted(&self, _args: &Self::Args) -> &'static str {
        Self::NOT_PERMITTED
    }

    /// The call's read set as `user_name` acts: every row `plan` reads and `apply` writes, each
    /// with the mode it must be locked in (its `content.read_set_<tool>` function; see
    /// `crates/content/README.md`). Read without locks: the turn locks the read sets of all its
    /// calls in the global order, then reads them again to check nothing joined in between.
    async fn read_set(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &Self::Args,
    ) -> Result<Vec<Row>, sqlx::Error>;

    /// Looks up and checks the records, and settles exactly what the call would write.
    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Self::Args,
    ) -> Result<Planned<Self::Plan>, sqlx::Error>;

    /// The preview lines of a plan: only what the call would write, values excerpted; a line
    /// may carry its structured form ([`countersign_core::LineForm`]) for the card.
    fn preview(&self, plan: &Self::Plan) -> Vec<PreviewLine>;

    /// Writes through the [`crate::datahandler::DataHandler`], reads the rows back, and
    /// reports any value that did not take as an error output.
    async fn apply(
        &self,
        conn: &mut PgConnection,
        user: &User,
        plan: &Self::Plan,
    ) -> Result<ToolOutput, sqlx::Error>;
}

/// A [`Writer`] as a [`Tool`] with a [`ToolPreview`].
pub(crate) struct WriterTool<W> {
    writer: W,
    spec: ToolSpec,
    store: Store,
}

impl<W: Writer> WriterTool<W> {
    pub(crate) fn new(writer: W, store: Store) -> Self {
        debug_assert!(W::EFFECT.is_write());
        // Disabled by default: an agent configuration enables each writer.
        let spec = ToolSpec {
            name: W::NAME.to_owned(),
            description: W::DESCRIPTION.to_owned(),
            parameters: args::parameters::<W::Args>(),
            group: EDITING.to_owned(),
            data_class: crate::data_class_of(EDITING),
            effect: W::EFFECT,
            enabled_by_default: false,
            requires_admin: false,
        };
        WriterTool {
            writer,
            spec,
            store,
        }
    }

    fn refusal_text(&self, args: &W::Args, refusal: Refusal) -> String {
        match refusal {
            Refusal::NotPermitted => self.writer.not_permitted(args).to_owned(),
            Refusal::Invalid(message) => message,
        }
    }

    /// Everything `execute` does inside the fenced transaction, up to the commit: the same
    /// locks, plan and write as a call of an approved turn.
    async fn outcome(
        &self,
        conn: &mut PgConnection,
        acting_user: &Principal,
        args: &W::Args,
    ) -> Result<ToolOutput, ToolError> {
        let subjects = self.subjects_of(conn, &acting_user.name, args).await?;
        let mut rows: Vec<Row> = subjects.iter().filter_map(Row::of).collect();
        rows.sort_by_key(|r| (r.rank, r.id, std::cmp::Reverse(r.mode)));
        rows.dedup_by_key(|r| (r.rank, r.id));
        lock_rows(conn, &rows).await.map_err(database_error)?;
        let again = self.subjects_of(conn, &acting_user.name, args).await?;
        if again.iter().filter_map(Row::of).any(|r| {
            !rows
                .iter()
                .any(|l| (l.rank, l.id) == (r.rank, r.id) && l.mode >= r.mode)
        }) {
            return Err(ToolError::unavailable(
                "read_set_moved",
                "the call's read set grew as it was locked",
            ));
        }
        match self
            .planned(conn, acting_user, args)
            .await
            .map_err(database_error)?
        {
            Ok((user, plan)) => self
                .writer
                .apply(conn, &user, &plan)
                .await
                .map_err(database_error),
            Err(text) => Ok(ToolOutput::error(text)),
        }
    }

    /// The call's read set as lock subjects.
    async fn subjects_of(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &W::Args,
    ) -> Result<Vec<LockSubject>, ToolError> {
        let rows = self
            .writer
            .read_set(conn, user_name, args)
            .await
            .map_err(database_error)?;
        lock_subjects(rows)
    }

    /// The plan of a call as `acting_user`, or the text of its refusal, under the turn's locks.
    /// The acting user is read again here, locked, not taken from the segment's copy: a right
    /// taken away a moment ago must not carry a write.
    async fn planned(
        &self,
        conn: &mut PgConnection,
        acting_user: &Principal,
        args: &W::Args,
    ) -> Result<Result<(User, W::Plan), String>, sqlx::Error> {
        let Some(user) = User::load(conn, &acting_user.name).await? else {
            return Ok(Err(self.writer.not_permitted(args).to_owned()));
        };
        Ok(match self.writer.plan(conn, &user, args).await? {
            Ok(plan) => Ok((user, plan)),
            Err(refusal) => Err(self.refusal_text(args, refusal)),
        })
    }

    /// The plan of a call as `principal` in a read-only snapshot ([`ReadScope`]); `None` when
    /// `principal` is no user of the content store. A principal its directory attached no
    /// profile to is read first, apart from the records, as a segment reads its acting user.
    async fn plan_in_snapshot(
        &self,
        principal: &Principal,
        args: &W::Args,
    ) -> Result<Option<Planned<W::Plan>>, sqlx::Error> {
        let mut scope = ReadScope::open(self.store.pool(), W::PLAN_IS_ONE_STATEMENT).await?;
        let planned = match User::of(scope.conn(), principal).await? {
            None => None,
            Some(user) => Some(self.writer.plan(scope.conn(), &user, args).await?),
        };
        scope.close().await?;
        Ok(planned)
    }

    async fn preview_lines(
        &self,
        user: &Principal,
        args: &W::Args,
    ) -> Result<Vec<PreviewLine>, sqlx::Error> {
        Ok(match self.plan_in_snapshot(user, args).await? {
            None => vec![PreviewLine::from(self.writer.not_permitted(args))],
            Some(Ok(plan)) => self.writer.preview(&plan),
            Some(Err(refusal)) => vec![PreviewLine::from(self.refusal_text(args, refusal))],
        })
    }

    async fn viewer_may_read(
        &self,
        viewer: &Principal,
        args: &W::Args,
    ) -> Result<bool, sqlx::Error> {
        let planned = self.plan_in_snapshot(viewer, args).await?;
        Ok(!matches!(planned, None | Some(Err(Refusal::NotPermitted))))
    }
}

impl<W> fmt::Debug for WriterTool<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterTool")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<W: Writer> Tool for WriterTool<W> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let Some(token) = &ctx.fence else {
            return Ok(ToolOutput::error(NO_LEASE));
        };
        let mut write = self.store.fenced_write(token).await.map_err(store_error)?;
        // Every outcome under a held lease — a refusal included — is committed with its audit
        // event and journal row, so a retried segment reuses it instead of deciding again.
        let output = match args::parse::<W::Args>(args) {
            Err(message) => ToolOutput::error(message),
            Ok(args) => self.outcome(write.conn(), &ctx.acting_user, &args).await?,
        };
        write
            .commit(&self.spec.name, self.spec.effect, &output)
            .await
            .map_err(store_error)?;
        Ok(output)
    }

    fn previewer(&self) -> Option<&dyn ToolPreview> {
        Some(self)
    }
}

#[async_trait]
impl<W: Writer> LocalWriter<FencedWrite> for WriterTool<W> {
    async fn subjects(
        &self,
        tx: &mut FencedWrite,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<LockSubject>, ToolError> {
        // Arguments that do not parse name no rows: the plan refuses the call.
        let Ok(args) = args::parse::<W::Args>(args) else {
            return Ok(vec![]);
        };
        self.subjects_of(tx.conn(), &acting_user.name, &args).await
    }

    async fn lock(&self, tx: &mut FencedWrite, subjects: &[LockSubject]) -> Result<(), ToolError> {
        let rows = subjects
            .iter()
            .map(|s| {
                Row::of(s).ok_or_else(|| {
                    ToolError::unavailable(
                        "foreign_lock_subject",
                        format!("{s:?} is not a content store row"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        lock_rows(tx.conn(), &rows).await.map_err(database_error)
    }

    async fn savepoint(&self, tx: &mut FencedWrite) -> Result<(), ToolError> {
        execute!(tx.conn(), "SAVEPOINT countersign_call").map_err(database_error)
    }

    async fn rollback_to_savepoint(&self, tx: &mut FencedWrite) -> Result<(), ToolError> {
        execute!(tx.conn(), "ROLLBACK TO SAVEPOINT countersign_call").map_err(database_error)
    }

    async fn plan(
        &self,
        tx: &mut FencedWrite,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Box<dyn PlannedWrite<FencedWrite>>, ToolError> {
        let args = match args::parse::<W::Args>(args) {
            Ok(args) => args,
            Err(message) => return Ok(Box::new(Refused(message))),
        };
        let planned = self
            .planned(tx.conn(), acting_user, &args)
            .await
            .map_err(database_error)?;
        Ok(match planned {
            Ok((user, plan)) => Box::new(WriterPlan {
                writer: self.writer.clone(),
                user,
                plan,
            }),
            Err(text) => Box::new(Refused(text)),
        })
    }
}

/// A call the turn will carry out, settled under the turn's locks.
struct WriterPlan<W: Writer> {
    writer: W,
    user: User,
    plan: W::Plan,
}

#[async_trait]
impl<W: Writer> PlannedWrite<FencedWrite> for WriterPlan<W> {
    fn preview(&self) -> Vec<PreviewLine> {
        self.writer.preview(&self.plan)
    }

    async fn apply(self: Box<Self>, tx: &mut FencedWrite) -> Result<ToolOutput, ToolError> {
        self.writer
            .apply(tx.conn(), &self.user, &self.plan)
            .await
            .map_err(database_error)
    }
}

/// A call the turn will refuse: its preview is its refusal line, its result the refusal.
struct Refused(String);

#[async_trait]
impl PlannedWrite<FencedWrite> for Refused {
    fn preview(&self) -> Vec<PreviewLine> {
        vec![PreviewLine::from(self.0.as_str())]
    }

    async fn apply(self: Box<Self>, _tx: &mut FencedWrite) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::error(self.0))
    }
}

#[async_trait]
impl<W: Writer> ToolPreview for WriterTool<W> {
    async fn preview(
        &self,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<String>, ToolError> {
        let lines = self.preview_with_forms(acting_user, args).await?;
        Ok(countersign_core::preview::texts(&lines))
    }

    async fn preview_with_forms(
        &self,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<PreviewLine>, ToolError> {
        match args::parse::<W::Args>(args) {
            Err(message) => Ok(vec![PreviewLine::from(message)]),
            Ok(args) => self
                .preview_lines(acting_user, &args)
                .await
                .map_err(database_error),
        }
    }

    async fn may_viewer_read_preview(&self, args: &Value, viewer: &Principal) -> bool {
        // Arguments that do not parse name no record the viewer could be checked against.
        let Ok(args) = args::parse::<W::Args>(args) else {
            return false;
        };
        match self.viewer_may_read(viewer, &args).await {
            Ok(permitted) => permitted,
            Err(e) => {
                tracing::warn!(tool = %self.spec.name, error = %e, "viewer check failed; preview withheld");
                false
            }
        }
    }
}

/// Where a read-only plan or read runs. Several statements must see one state of the store, so
/// they run in a `REPEATABLE READ, READ ONLY` transaction; one statement sees one snapshot by
/// itself, so a plan or read of exactly one statement runs on a pooled connection, without the
/// transaction's two round trips (its `BEGIN` and its `ROLLBACK`).
pub(crate) enum ReadScope {
    Statement(PoolConnection<Postgres>),
    Snapshot(Transaction<'static, Postgres>),
}

impl ReadScope {
    /// A pooled connection when the reads are `one_statement`, a read-only snapshot otherwise.
    pub(crate) async fn open(pool: &PgPool, one_statement: bool) -> Result<Self, sqlx::Error> {
        Ok(if one_statement {
            ReadScope::Statement(pool.acquire().await?)
        } else {
            // One round trip: the snapshot's mode is part of its BEGIN.
            ReadScope::Snapshot(
                pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    .await?,
            )
        })
    }

    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        match self {
            ReadScope::Statement(conn) => conn,
            ReadScope::Snapshot(tx) => tx,
        }
    }

    /// Ends the snapshot (nothing was written); a pooled connection goes back to the pool.
    pub(crate) async fn close(self) -> Result<(), sqlx::Error> {
        match self {
            ReadScope::Statement(_) => Ok(()),
            ReadScope::Snapshot(tx) => tx.rollback().await,
        }
    }
}

/// A database error of a writer: an infrastructure failure, transient or persistent as
/// [`classify`] says, never the call's result.
pub(crate) fn database_error(e: sqlx::Error) -> ToolError {
    let (fault, code) = classify(&e);
    ToolError::infrastructure(fault, code, e)
}

fn store_error(e: StoreError) -> ToolError {
    match e {
        StoreError::FenceLost => ToolError::FenceLost,
        other => ToolError::infrastructure(other.fault(), other.code(), other),
    }
}

/// The group of every writer: a group of its own, so that a configuration granting the read-only
/// `content` group is not handed write capability by an upgrade.
const EDITING: &str = "editing";
