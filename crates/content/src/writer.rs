//! The errands every writer runs around its write, shared; the decisions, kept per writer.
//!
//! Shared here, because it only executes: validating the arguments before anything else;
//! refusing without a lease; opening the store's fenced transaction (which locks the run row
//! and verifies the lease) and committing the outcome together with its audit event and
//! journal row; producing the preview in a read-only snapshot; answering whether a viewer may
//! read a preview; turning a refusal into the tool's output or its single preview line.
//!
//! Kept per writer, in [`Writer`]: its arguments and their limits, which rows it locks, its
//! record checks and neutral refusal string, its preview lines, the write and what "it took"
//! means for its read-back.

use std::fmt;

use async_trait::async_trait;
use countersign_core::{
    Effect, ExecContext, Principal, Tool, ToolError, ToolOutput, ToolPreview, ToolSpec,
};
use countersign_store::{Store, StoreError};
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::access::User;
use crate::refusals::NO_LEASE;

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
}

/// The outcome of planning a call.
pub(crate) type Planned<P> = Result<P, Refusal>;

/// One writing tool's decisions.
///
/// `plan` runs every record check before any other refusal, so that a refusal other than
/// [`Refusal::NotPermitted`] is only ever given to a user who may see the records: the viewer
/// check relies on that order.
#[async_trait]
pub(crate) trait Writer: Send + Sync + 'static {
    type Args: Send + Sync;
    type Plan: Send + Sync;

    fn spec(&self) -> ToolSpec;

    /// Validates the arguments up front, all or nothing.
    fn parse(&self, args: &Value) -> Result<Self::Args, String>;

    /// The neutral refusal string for the records these arguments name.
    fn not_permitted(&self, args: &Self::Args) -> &'static str;

    /// Locks, inside the write transaction and before `plan` reads them, the rows whose state
    /// the write depends on (a relative write must not plan against a list another write is
    /// about to change).
    async fn lock(&self, _conn: &mut PgConnection, _args: &Self::Args) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Looks up and checks the records, and settles exactly what the call would write.
    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Self::Args,
    ) -> Result<Planned<Self::Plan>, sqlx::Error>;

    /// The preview lines of a plan: only what the call would write, values excerpted.
    fn preview(&self, plan: &Self::Plan) -> Vec<String>;

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
        let spec = writer.spec();
        debug_assert_eq!(spec.group, "editing");
        debug_assert!(spec.effect.is_write() && !spec.enabled_by_default);
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

    /// Everything `execute` does inside the fenced transaction, up to the commit.
    async fn outcome(
        &self,
        conn: &mut PgConnection,
        acting_user: &Principal,
        args: &W::Args,
    ) -> Result<ToolOutput, sqlx::Error> {
        self.writer.lock(conn, args).await?;
        let Some(user) = User::load(conn, &acting_user.name).await? else {
            return Ok(ToolOutput::error(self.writer.not_permitted(args)));
        };
        match self.writer.plan(conn, &user, args).await? {
            Ok(plan) => self.writer.apply(conn, &user, &plan).await,
            Err(refusal) => Ok(ToolOutput::error(self.refusal_text(args, refusal))),
        }
    }

    async fn preview_lines(
        &self,
        user: &Principal,
        args: &W::Args,
    ) -> Result<Vec<String>, sqlx::Error> {
        let mut tx = read_only_snapshot(self.store.pool()).await?;
        let lines = match User::load(&mut tx, &user.name).await? {
            None => vec![self.writer.not_permitted(args).to_owned()],
            Some(user) => match self.writer.plan(&mut tx, &user, args).await? {
                Ok(plan) => self.writer.preview(&plan),
                Err(refusal) => vec![self.refusal_text(args, refusal)],
            },
        };
        tx.rollback().await?;
        Ok(lines)
    }

    async fn viewer_may_read(
        &self,
        viewer: &Principal,
        args: &W::Args,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = read_only_snapshot(self.store.pool()).await?;
        let permitted = match User::load(&mut tx, &viewer.name).await? {
            None => false,
            Some(user) => !matches!(
                self.writer.plan(&mut tx, &user, args).await?,
                Err(Refusal::NotPermitted)
            ),
        };
        tx.rollback().await?;
        Ok(permitted)
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
        let output = match self.writer.parse(args) {
            Err(message) => ToolOutput::error(message),
            Ok(args) => self
                .outcome(write.conn(), &ctx.acting_user, &args)
                .await
                .map_err(database_error)?,
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
impl<W: Writer> ToolPreview for WriterTool<W> {
    async fn preview(
        &self,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<String>, ToolError> {
        match self.writer.parse(args) {
            Err(message) => Ok(vec![message]),
            Ok(args) => self
                .preview_lines(acting_user, &args)
                .await
                .map_err(database_error),
        }
    }

    async fn may_viewer_read_preview(&self, args: &Value, viewer: &Principal) -> bool {
        // Arguments that do not parse name no record the viewer could be checked against.
        let Ok(args) = self.writer.parse(args) else {
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

/// A transaction that sees one snapshot and cannot write: a preview reads several rows and
/// must describe one state of them.
pub(crate) async fn read_only_snapshot(
    pool: &PgPool,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

pub(crate) fn database_error(e: sqlx::Error) -> ToolError {
    ToolError::failed("database_error", e)
}

fn store_error(e: StoreError) -> ToolError {
    match e {
        StoreError::FenceLost => ToolError::FenceLost,
        other => ToolError::failed(other.code(), other),
    }
}

/// The group of every writer: a group of its own, so that a configuration granting the read-only
/// `content` group is not handed write capability by an upgrade.
pub(crate) const EDITING: &str = "editing";

/// A writer's spec: group `editing`, disabled by default, not admin-only.
pub(crate) fn writer_spec(
    name: &str,
    description: &str,
    effect: Effect,
    parameters: Value,
) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
        group: EDITING.to_owned(),
        effect,
        enabled_by_default: false,
        requires_admin: false,
    }
}
